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
                  *, metric: str = "accuracy", chance: float = CHANCE, setting: str | None = None) -> Verdict:
    """Adds to ``card`` the row of ``claim``: FLANC's per-seed ``metric`` over ``widths`` against the better
    baseline's (:func:`better`) — the paper's "FLANC ahead of HeteroFL and FjORD" (Fig. 3, Sec. 3.1, Abstract,
    Sec. 5). ``chance`` applies to accuracy only; perplexity is judged lower-is-better without it. ``setting``: the
    register's setting the row names its departures against (:meth:`Scorecard.stated_order`)."""
    rival, accuracy = better(results, widths, metric), metric == "accuracy"
    return card.stated_order(claim, values(results, "flanc", widths, metric), values(results, rival, widths, metric),
                             chance=chance if accuracy else None, higher_is_better=accuracy,
                             config=cfg_of(results), what=f"FLANC vs {NAME[rival]} (the better baseline), {what}",
                             setting=setting)


# ---- Table 1's communication column: which construction reproduces it (notebooks/flanc/communication.ipynb) ----
def communication_candidates(model: str = "resnet18", num_classes: int = 10):
    """FLANC's per-round payload (parameters, one direction) at widths ¼, ½, ¾, 1 and its average under each
    candidate construction of :func:`subfl.costs.flanc_payload.candidates`, in Table 1's unit (M for ResNet-18, K
    for the CNN, three decimals / one decimal), with ``agree`` (how many of the five round to the printed value)
    and ``matches`` (all five do). The first row is Table 1 itself."""
    import pandas as pd

    from subfl.costs import flanc_payload as fp

    unit, digits = (1e6, 3) if model == "resnet18" else (1e3, 1)
    keys = ("w0.25", "w0.5", "w0.75", "w1", "avg")
    paper = {"construction": "Table 1 (printed)", **{k: v / unit for k, v in zip(keys, fp.TABLE1_FLANC[model])},
             "agree": 5, "matches": True}
    rows = [paper] + [{**r, **{k: round(r[k] / unit, digits) for k in keys}}
                      for r in fp.candidate_table(model, num_classes)]
    return pd.DataFrame(rows).set_index("construction")


def communication_grid_matches(model: str = "resnet18", num_classes: int = 10):
    """Of every combination of :func:`subfl.costs.flanc_payload.grid` (432), the ones whose five values all round to
    Table 1's FLANC column, one row per distinct payload: its values, ``constructions`` (how many combinations give
    it) and ``for example`` (the first of them). Returns ``(table, n_combinations, n_distinct_payloads)``."""
    import pandas as pd

    from subfl.costs import flanc_payload as fp

    rows = fp.grid(model, num_classes)
    keys = ("w0.25", "w0.5", "w0.75", "w1", "avg")
    distinct = {tuple(r[k] for k in keys) for r in rows}
    groups: dict[tuple, list[str]] = {}
    for r in rows:
        if r["matches"]:
            groups.setdefault(tuple(r[k] for k in keys), []).append(r["construction"])
    table = pd.DataFrame([{**dict(zip(keys, v)), "constructions": len(names), "for example": names[0]}
                          for v, names in groups.items()])
    return table, len(rows), len(distinct)


def table1_communication(model: str = "resnet18", num_classes: int = 10):
    """Per width (index ¼, ½, ¾, 1): ``dense`` (the p-width model) and ``sent`` (a FLANC client's payload) under the
    construction that reproduces Table 1's FLANC column: ResNet-18 with ``R₁`` per residual block
    (:func:`~subfl.methods.flanc.flanc_parameter_counts` with ``r1_scope="block"``, the library's ResNet-18); the
    CNN with its head at 64 channels for every width (:data:`subfl.costs.flanc_payload.RELEASED`, the library's
    FlancCNN scales its head)."""
    import pandas as pd

    from subfl.costs import flanc_payload as fp
    from subfl.methods.flanc import flanc_parameter_counts

    if model == "resnet18":
        rows = flanc_parameter_counts("resnet18", num_classes=num_classes, r1_scope="block")
    else:
        rows = fp.payload(fp.flanc_cnn_family(num_classes=num_classes, input_layer="fixed"), fp.RELEASED)
    return pd.DataFrame(rows).set_index("width")[["dense", "sent"]]


def table1_note(card, how: dict, claim: str, library: float | None = None) -> str:
    """A Table 1 scorecard row's note: the claim, the construction our count used (``how[table] = (rule, the
    library's own construction, unit letter, unit)``, ``table`` the claim id up to its width) and, given
    ``library``, what the library's own construction gives."""
    rule, other, letter, unit = how[claim.split("-w")[0].split("-avg")[0]]
    extra = "" if library is None else f"; {other} gives {library / unit:.3g}{letter}"
    return f"{card.register.claim(claim).statement} — computed with {rule}{extra}"
