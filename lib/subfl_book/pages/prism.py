"""Helpers of the PriSM chapter (notebooks/prism): per-seed accuracies and drops, kernel coverage, the scorecard
rows the pages share, the seeded model factory of the memory-efficient page's numerical checks, and the costs page's
comparison of Table 1's PriSM block with the narrowed sub-model (:mod:`subfl.costs.narrow_submodel`).

Niu et al., "Overcoming Resource Constraints in Federated Learning: Large Models Can Be Trained with only Weak
Clients" (TMLR 2023); the heterogeneous page also scores Korzhenkov & Louizos, "On Sampling Strategies for Spectral
Model Sharding" (Table 1).
"""
from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any

import torch

from subfl.experiments.config import ExperimentConfig
from subfl.experiments.runner import RunResult
from subfl.models import build_model

from ..scorecard import Scorecard
from ..verdict import Band, Verdict


def covered_fraction(result: RunResult, how: str = "mean") -> float:
    """The share of each decomposed layer's terms trained by at least one client in a round (``covered_fraction``
    in the run history), ``"mean"`` or ``"worst"`` (minimum) over the rounds and layers: PriSM's kernel coverage
    of Fig. 9, Sec. 4.5 and the abstract's "nearly all" kernels."""
    if how not in ("mean", "worst"):
        raise ValueError(f"how must be 'mean' or 'worst', not {how!r}")
    values = result.history[result.history["metric"] == "covered_fraction"]["value"]
    return values.mean() if how == "mean" else values.min()


def seed_drops(reference: Sequence[float], values: Sequence[float]) -> list[float]:
    """Per seed, ``reference`` minus ``values`` (points when both are in %; NaN where either diverged): a
    method's drop below the full model (Figs. 5 and 11) or a variant's loss against plain PriSM (abstract)."""
    return [ref - value for ref, value in zip(reference, values)]


def best_of(acc: Mapping[Hashable, Sequence[float]], candidates: Iterable[Hashable], *, chance: float) -> Hashable:
    """The candidate with the highest mean accuracy over the seeds, a diverged seed counted at ``chance`` as the
    verdict rule counts it (candidates absent from ``acc`` are skipped; the first wins a tie): the "best rival"
    that PriSM's Fig. 5, Sec. 4.3 and conclusion compare it with."""
    present = [c for c in candidates if c in acc]
    if not present:
        raise ValueError("none of the candidates has accuracies")
    return max(present, key=lambda c: Band.of(acc[c], chance).mean)


def accuracy_order(card: Scorecard, claim: str, against: str, acc: Mapping[Hashable, Sequence[float]],
                   configs: Mapping[Hashable, ExperimentConfig], first: Hashable, second: Hashable, *, setting: str,
                   chance: float) -> Verdict:
    """Scores the paper's ordering of two table cells (``claim`` vs ``against``, e.g. Table 3's α = 0.1 row or
    spectral sharding's Table 1) against our final accuracies of ``first`` and ``second`` (per seed, in %)."""
    return card.order(claim, against, acc[first], acc[second], chance=chance, config=configs[first],
                      note=f"{first} vs {second}, {setting} (final accuracy, %)")


def stated_accuracy_order(card: Scorecard, claim: str, acc: Mapping[Hashable, Sequence[float]],
                          configs: Mapping[Hashable, ExperimentConfig], first: Hashable, second: Hashable, *,
                          what: str, setting: str, chance: float, paper_setting: str | None = None) -> Verdict:
    """Scores an ordering the paper states in words (e.g. Sec. 4.3, Fig. 5: ``first`` above ``second``) against our
    final accuracies of the two methods (per seed, in %). ``setting`` describes ours in the row; ``paper_setting``
    is the register's setting the row names its departures against (default: the page's, for its own paper's
    claims; see :meth:`Scorecard.defaults`)."""
    return card.stated_order(claim, acc[first], acc[second], chance=chance, config=configs[first],
                             what=f"{what}, {setting} (final accuracy, %)", setting=paper_setting)


def stated_accuracy_best(card: Scorecard, claim: str, acc: Mapping[Hashable, Sequence[float]],
                         configs: Mapping[Hashable, ExperimentConfig], first: Hashable, rivals: Iterable[Hashable], *,
                         what: str, setting: str, chance: float,
                         names: Mapping[Hashable, str] | None = None, paper_setting: str | None = None) -> Verdict:
    """Scores a claim that ``first`` is the most accurate of it and ``rivals`` (Fig. 5, Fig. 7, Sec. 4.3, the
    conclusion) against every rival's final accuracies (per seed, in %; rivals absent from ``acc`` are skipped),
    :meth:`Scorecard.stated_best`. ``names``: how the row names each rival (default: its method name);
    ``paper_setting`` as in :func:`stated_accuracy_order`."""
    names = names or {}
    present = {names.get(m, str(m)): acc[m] for m in rivals if m in acc}
    if not present:
        raise ValueError("none of the rivals has accuracies")
    return card.stated_best(claim, acc[first], present, chance=chance, config=configs[first],
                            what=f"{what}, {setting} (final accuracy, %)", setting=paper_setting)


def prism_drop_bound(card: Scorecard, claim: str, acc: Mapping[str, Sequence[float]],
                     configs: Mapping[str, ExperimentConfig], *, setting: str, reading: str,
                     limit: float = 2.0) -> Verdict:
    """Scores PriSM's drop below full-model FedAvg (per seed, in points; ``acc`` in % by method) as at most
    ``limit``: the abstract's and conclusion's "about 2 points" at 0.2×, Sec. 1's "marginal", Fig. 5's
    "comparable to full-model training"."""
    drops = seed_drops(acc["fedavg"], acc["prism"])   # NaN if a run diverged
    return card.bound(claim, drops, at_most=True, limit=limit, config=configs["prism"],
                      note=f"PriSM's drop below FedAvg, {setting} (points; {reading})")


def seeded_model_fn(config: ExperimentConfig, *, seed: int = 0, num_classes: int = 10,
                    input_shape: tuple[int, ...] = (3, 32, 32)) -> Callable[..., torch.nn.Module]:
    """A ``ServerContext.model_fn`` building ``config``'s model (at its width unless given one) from the global
    torch seed ``seed``, so every call gives the same weights; it carries ``width`` as the runner's factory does.
    Serves the memory-efficient page's numerical checks of Sec. 3.2.1 and Eq. (5)."""

    def model_fn(width: float | None = None, **_: Any) -> torch.nn.Module:
        torch.manual_seed(seed)
        return build_model(config.model, num_classes=num_classes, input_shape=input_shape,
                           width=config.width if width is None else width)

    model_fn.width = config.width
    return model_fn


# --------------------------------------------------------------------------------------------------
# the costs page: Table 1's PriSM block against the narrowed sub-model (subfl.costs.narrow_submodel)
# --------------------------------------------------------------------------------------------------
def table1_column(keep_ratio: float | None) -> str:
    """The register's column label of a keep ratio in Table 1 (``"full"``, ``"0.8x"``, ...)."""
    return "full" if keep_ratio is None else f"{keep_ratio:g}x"


def _paper_pair(register, block: str, metric: str, keep_ratio: float | None) -> tuple[float, float]:
    """Table 1's printed (absolute, % of full) for one cell; the full column is (value, 100)."""
    value = register.claim(f"t1-{block}-{metric}-{table1_column(keep_ratio)}").value
    return (float(value[0]), float(value[1])) if isinstance(value, list) else (float(value), 100.0)


def table1_prism_comparison(register, keep_ratios: Sequence[float], *, narrow: Mapping[float | None, Mapping],
                            unrounded: Mapping[float | None, Mapping], plain: Mapping[float | None, Mapping],
                            narrow_memory: Mapping[float | None, float], plain_memory: Mapping[float | None, float],
                            batch_size: int):
    """Table 1's PriSM and OrthDrop rows beside our narrowed sub-model and the library's plain sub-model.

    ``narrow`` / ``plain``: per keep ratio (``None``: the dense model) the analytic costs of the full-width
    ResNet-18 (:func:`subfl.costs.narrow_submodel.narrow_analytic_costs` with ``r = ⌈p·N⌉``,
    :func:`subfl.costs.submodels.analytic_costs`); ``unrounded``: the narrowed sub-model's costs with
    ``r = p·N`` unrounded; ``*_memory``: activation memory relative to the dense model (this run's width and
    batch). Parameters in M, MACs in G at a batch of ``batch_size`` (per-sample MACs × ``batch_size``), each
    with its % of the dense model. Returns one row per (metric, keep ratio).
    """
    import pandas as pd

    dense_n, dense_u, dense_p = narrow[None], unrounded[None], plain[None]
    rows = []
    for r in [None, *keep_ratios]:
        label = "Full" if r is None else f"{r:g}×"
        prism = {m: _paper_pair(register, "prism", m, r) for m in ("params", "macs", "mem")}
        orth = {m: _paper_pair(register, "orthdrop", m, r) for m in ("params", "macs", "mem")}
        for key, name, unit, absolute in (("params", "params (M)", "params", lambda v: v / 1e6),
                                          ("macs", f"G MACs (batch {batch_size})", "MACs",
                                           lambda v: v * batch_size / 1e9)):
            rows.append({"metric": name, "Table 1": label, "paper PriSM": prism[key][0],
                         "ours: narrow, all layers": absolute(narrow[r][key]),
                         "ours: narrow, decomposed layers, r = p·N": absolute(unrounded[r][f"{key}_decomposed"]),
                         "library plain sub-model": absolute(plain[r][key]), "paper OrthDrop": orth[key][0]})
            rows.append({"metric": f"{unit} (% of full)", "Table 1": label, "paper PriSM": prism[key][1],
                         "ours: narrow, all layers": 100 * narrow[r][key] / dense_n[key],
                         "ours: narrow, decomposed layers, r = p·N":
                             100 * unrounded[r][f"{key}_decomposed"] / dense_u[f"{key}_decomposed"],
                         "library plain sub-model": 100 * plain[r][key] / dense_p[key], "paper OrthDrop": orth[key][1]})
        rows.append({"metric": "activation memory (% of full)", "Table 1": label, "paper PriSM": prism["mem"][1],
                     "ours: narrow, all layers": 100 * narrow_memory[r],
                     "ours: narrow, decomposed layers, r = p·N": float("nan"),
                     "library plain sub-model": 100 * plain_memory[r], "paper OrthDrop": orth["mem"][1]})
    order = ["params (M)", "params (% of full)", f"G MACs (batch {batch_size})", "MACs (% of full)",
             "activation memory (% of full)"]
    table = pd.DataFrame(rows)
    table["metric"] = pd.Categorical(table["metric"], categories=order, ordered=True)
    return table.sort_values(["metric"], kind="stable").set_index(["metric", "Table 1"])


def score_table1_prism(card: Scorecard, keep_ratios: Sequence[float], *, narrow: Mapping[float | None, Mapping],
                       unrounded: Mapping[float | None, Mapping], plain: Mapping[float | None, Mapping],
                       narrow_memory: Mapping[float | None, float], plain_memory: Mapping[float | None, float],
                       batch_size: int, width: float, batch: int) -> None:
    """Scores Table 1's PriSM block (0.8×–0.2×) against the narrowed sub-model
    (:mod:`subfl.costs.narrow_submodel`).

    Arguments as for :func:`table1_prism_comparison`. Parameters: the decomposed layers with ``r = p·N``
    unrounded (Sec. 4.2), the count that reproduces the printed column (the full model's decomposed layers hold
    10.99 M); MACs: the built sub-model's convolutions and classifier (``r = ⌈p·N⌉``) per sample × ``batch_size``
    and as % of the dense model; activation memory: % of the dense model's (width ``width``, batch ``batch``).
    Also Table 1's caption at the smallest keep ratio, Sec. 4.2's ordering against the plain (FedHM-shaped)
    sub-model at every keep ratio, and Sec. 1's "about 5 %" on the built 0.2× sub-model's parameters.
    """
    dense_n, dense_u = narrow[None], unrounded[None]
    for r in keep_ratios:
        column = table1_column(r)
        card.exact(f"t1-prism-params-{column}", unrounded[r]["params_decomposed"] / 1e6, index=0,
                   note=f"PriSM {r:g}×: parameters (M) of the narrowed sub-model's decomposed layers (Conv_V, "
                        f"Conv_U), r = {r:g}·N unrounded")
        card.exact(f"t1-prism-params-{column}", 100 * unrounded[r]["params_decomposed"] / dense_u["params_decomposed"],
                   index=1, note=f"PriSM {r:g}×: the same, % of the dense model's decomposed layers (10.99 M)")
        card.exact(f"t1-prism-macs-{column}", narrow[r]["macs"] * batch_size / 1e9, index=0,
                   note=f"PriSM {r:g}×: G MACs of the narrowed sub-model (r = ⌈{r:g}·N⌉, 32×32 inputs), "
                        f"per-sample MACs × {batch_size}")
        card.exact(f"t1-prism-macs-{column}", 100 * narrow[r]["macs"] / dense_n["macs"], index=1,
                   note=f"PriSM {r:g}×: MACs of the narrowed sub-model, % of the dense model")
        card.exact(f"t1-prism-mem-{column}", 100 * narrow_memory[r], index=1,
                   note=f"PriSM {r:g}×: activation memory of one training step of the narrowed sub-model, % of the "
                        f"dense model's (width {width:g}, batch {batch})")
    small = min(keep_ratios)
    for what, ratio in (("parameters", narrow[small]["params"] / dense_n["params"]),
                        ("MACs", narrow[small]["macs"] / dense_n["macs"]),
                        ("activation memory", narrow_memory[small])):
        card.bound("t1-caption-prism-cuts-all-costs", ratio, at_most=True, limit=1.0, analytic=True,
                   note=f"{what} of the narrowed {small:g}× sub-model / the dense model's (below 1: a cut)")
    for r in keep_ratios:
        for what, ours, theirs in (("parameters", narrow[r]["params"], plain[r]["params"]),
                                   ("MACs per sample", narrow[r]["macs"], plain[r]["macs"]),
                                   ("activation memory (relative to dense)", narrow_memory[r], plain_memory[r])):
            card.stated_order("sec4.2-prism-cheaper-than-fedhm", float(ours), float(theirs), analytic=True,
                              higher_is_better=False,
                              what=f"{what}: narrowed vs plain (FedHM-shaped) {r:g}× ResNet-18 sub-model")
    if 0.2 in narrow:
        card.exact("sec1-r0.2-is-5pct-of-model", 100 * narrow[0.2]["params"] / dense_n["params"],
                   note="parameters of the narrowed 0.2× sub-model (every layer, r = ⌈0.2·N⌉), % of the dense "
                        "model")
