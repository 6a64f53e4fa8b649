"""The FLANC chapter (Mei et al., NeurIPS 2022): per-seed values and comparisons behind the scorecards of
``notebooks/flanc/capacity.ipynb`` and ``notebooks/flanc/datasets.ipynb`` (Table 1, Figs. 1, 3 and 4, Secs. 1,
3.1, 3.2 and 5).

Accuracies are in percent (per seed, averaged over the compared width models), perplexities as they are; a
diverged run's final value is NaN (:meth:`~subfl.experiments.runner.RunResult.final`). "Lead" always means how far
FLANC is *ahead*: accuracy points above the rival, or perplexity below it.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from subfl.experiments.config import ExperimentConfig
from subfl.experiments.runner import RunResult
from subfl.fl.profiles import parse_heterogeneity
from subfl_book.scorecard import Scorecard
from subfl_book.verdict import Verdict

CHANCE = 10.0  # % top-1 accuracy of a 10-class task (Fashion-MNIST, CIFAR-10)
WIDTHS = (0.25, 0.5, 0.75, 1.0)  # the paper's capacity levels p (Sec. 2.1, Fig. 3, Table 1)
TWO = (0.25, 1.0)  # the models of the two-device-type settings (Figs. 1 and 4)
BASELINES = ("heterofl", "fjord")  # the slicing baselines FLANC is compared with throughout the paper
NAME = {"heterofl": "HeteroFL", "fjord": "FjORD", "flanc": "FLANC"}


def _sign(metric: str) -> float:
    """+1 where higher is better (accuracy), −1 where lower is (perplexity)."""
    return 1.0 if metric == "accuracy" else -1.0


def by_seed(results: Sequence[RunResult], method: str, widths: Sequence[float] = WIDTHS,
            metric: str = "accuracy") -> dict[int, float]:
    """{seed: ``method``'s final ``metric`` averaged over its models of ``widths``} (accuracy in %; NaN where the
    run diverged): the per-seed cells of Table 1 and the bars of Figs. 1, 3 and 4."""
    factor = 100.0 if metric == "accuracy" else 1.0
    return {r.config.seed: factor * float(np.mean([r.final(metric, f"{w:g}") for w in widths]))
            for r in results if r.config.method == method}


def values(results: Sequence[RunResult], method: str, widths: Sequence[float] = WIDTHS,
           metric: str = "accuracy") -> list[float]:
    """``method``'s per-seed final ``metric`` over ``widths`` (as :func:`by_seed`, seed order): one method's side
    of a Table 1 cell or a Fig. 1/3/4 comparison."""
    return list(by_seed(results, method, widths, metric).values())


def lead(results: Sequence[RunResult], rival: str, widths: Sequence[float] = WIDTHS,
         metric: str = "accuracy") -> list[float]:
    """Per seed: how far FLANC is ahead of ``rival`` over ``widths`` (accuracy points above it; perplexity below
    it) — FLANC's margin of Sec. 3.1 and Fig. 4b."""
    ours, theirs = by_seed(results, "flanc", widths, metric), by_seed(results, rival, widths, metric)
    return [_sign(metric) * (ours[s] - theirs[s]) for s in ours]


def score(results: Sequence[RunResult], method: str, widths: Sequence[float] = WIDTHS,
          metric: str = "accuracy") -> float:
    """``method``'s mean ``metric`` over its non-diverged seeds, signed so that higher is better (−inf if every
    seed diverged): the ranking key that picks the better baseline of Sec. 3.1's comparisons."""
    finite = [v for v in values(results, method, widths, metric) if np.isfinite(v)]
    return _sign(metric) * float(np.mean(finite)) if finite else -np.inf


def better(results: Sequence[RunResult], widths: Sequence[float] = WIDTHS, metric: str = "accuracy",
           baselines: Sequence[str] = BASELINES) -> str:
    """The baseline (HeteroFL or FjORD) with the better mean ``metric`` over ``widths``, diverged seeds left out:
    the rival of "FLANC beats both baselines" (Sec. 3.1, Fig. 3, Abstract); the first one on a tie."""
    scores = {m: score(results, m, widths, metric) for m in baselines}
    return max(scores, key=scores.get)


def smallest_lead(results: Sequence[RunResult], widths: Sequence[float] = WIDTHS, metric: str = "accuracy",
                  baselines: Sequence[str] = BASELINES) -> list[float]:
    """Per seed: FLANC's smallest lead over every baseline across its models of ``widths`` (NaN if one diverged);
    ≥ 0 means ahead in every entry (Sec. 3.1: "outperforms ... in every entry")."""
    leads = [lead(results, b, (w,), metric) for w in widths for b in baselines]
    return [float(np.min(column)) for column in zip(*leads)]


def cfg_of(results: Sequence[RunResult], method: str = "flanc") -> ExperimentConfig:
    """The configuration of ``method``'s first run in ``results`` (the setting a scorecard row reports)."""
    return next(r.config for r in results if r.config.method == method)


def share(config: ExperimentConfig, level: float) -> float:
    """% of the clients of a static (two-device-type) setting whose width is ``level``: the device mix of Fig. 1
    and Sec. 3.2 (25 % / 75 % type-A), computed as the engine draws it."""
    levels = parse_heterogeneity(config.heterogeneity).static_levels(config.num_clients, config.seed)
    return 100 * float(np.mean(levels == level))


def versus_better(card: Scorecard, claim: str, results: Sequence[RunResult], widths: Sequence[float], what: str,
                  *, metric: str = "accuracy", chance: float = CHANCE) -> Verdict:
    """Adds to ``card`` the row of ``claim``: FLANC's per-seed ``metric`` over ``widths`` against the better
    baseline's (:func:`better`) — the paper's "FLANC ahead of HeteroFL and FjORD" (Fig. 3, Sec. 3.1, Abstract,
    Sec. 5). ``chance`` applies to accuracy only; perplexity is judged lower-is-better without it."""
    rival, accuracy = better(results, widths, metric), metric == "accuracy"
    return card.stated_order(claim, values(results, "flanc", widths, metric), values(results, rival, widths, metric),
                             chance=chance if accuracy else None, higher_is_better=accuracy,
                             config=cfg_of(results), what=f"FLANC vs {NAME[rival]} (the better baseline), {what}")
