"""Helpers of the spectral-sharding chapter's pages (notebooks/spectral/*.ipynb).

Korzhenkov & Louizos, "On Sampling Strategies for Spectral Model Sharding" (Table 1, Fig. 3, Sec. 4.2, Sec. 5,
Algorithm 2), and PriSM (Niu et al.; Fig. 5, 8, 9, Table 5): the per-run and per-seed numbers the pages' tables and
scorecards compare. Every function takes what it reads as arguments; none reads a notebook's globals.
"""
from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch

from subfl import sampling
from subfl.experiments.runner import ModelFactory, RunResult, prepare_data
from subfl.models.factorized import layer_specs
from subfl.methods.spectral import term_design
from subfl.sampling import analysis

from ..final_analyses import final_analysis, spectra_from_value
from ..spectral_shakespeare import last_evaluations_mean
from ..store import run_experiment as stored_run

_NAN = float("nan")


def algorithm2_rows(lam: np.ndarray, n: int, clients: int, label: str) -> list[dict[str, Any]]:
    """Algorithm 2 run as printed and with Eq. (27)'s sign on line 30: each returned design's E‖W−Ŵ‖² against
    Theorem 3.2's closed-form optimum for spectrum ``lam``, ``n`` kept terms and ``clients`` clients (one row per
    line-30 variant)."""
    closed = analysis.check_collective_optimum(lam, n, clients)["closed_form"]
    out = []
    for line30 in analysis.ALGORITHM2_LINE30:
        pi, w, _, (t, u) = analysis.algorithm2_collective(lam, n, clients, line30)
        found = sampling.expected_discrepancy(lam, pi, np.where(pi > 0, w, 1.0), clients)
        out.append({"spectrum": label, "n": n, "line 30": line30, "t": t, "u": u, "E‖W−Ŵ‖²": found,
                    "Theorem 3.2 optimum": closed, "excess over the optimum": found / closed - 1})
    return out


def mean_sd_label(values: Sequence[float], digits: int = 3) -> str:
    """``"mean ± sd"`` of per-seed values (sample standard deviation; the mean alone for one value). A NaN value is
    a diverged run: the label then names them, ``"diverged (2 of 3 seeds)"``, instead of printing NaN."""
    if not values:
        raise ValueError("values must hold at least one per-seed value, got none")
    diverged = sum(1 for v in values if v != v)
    if diverged:
        return f"diverged ({diverged} of {len(values)} seed{'s' if len(values) > 1 else ''})"
    mean = float(np.mean(values))
    return f"{mean:.{digits}f}" + (f" ± {float(np.std(values, ddof=1)):.{digits}f}" if len(values) > 1 else "")


def best_by_mean(per_seed: Mapping[tuple[str, str], Sequence[float]], split: str, candidates: Sequence[str]) -> str:
    """The candidate method whose per-seed values on ``split`` have the highest mean (Fig. 3's "best exploring
    strategy"); ``per_seed`` maps ``(split, method)`` to one value per seed. Ties go to the first candidate."""
    if not candidates:
        raise ValueError("candidates must name at least one method, got none")
    return max(candidates, key=lambda m: float(np.mean(per_seed[split, m])))


def lead_per_seed(per_seed: Mapping[tuple[str, str], Sequence[float]], split: str, leader: str,
                  rivals: Sequence[str]) -> list[float]:
    """``leader``'s value minus that of the best of ``rivals`` by mean (:func:`best_by_mean`), seed by seed (Fig. 3:
    top-n's lead over the best exploring strategy). The two lists must pair the same seeds."""
    rival = best_by_mean(per_seed, split, rivals)
    ours, theirs = per_seed[split, leader], per_seed[split, rival]
    if len(ours) != len(theirs):
        raise ValueError(f"{leader} has {len(ours)} seeds and {rival} {len(theirs)} on split {split}; "
                         "accepted: the same seeds for both")
    return [float(a) - float(b) for a, b in zip(ours, theirs)]


def find_run(runs: Iterable[RunResult], method: str, seed: int) -> RunResult:
    """The run of ``method`` with ``seed`` among ``runs`` (Table 1's cells are read per method and seed)."""
    return next(r for r in runs if r.config.method == method and r.config.seed == seed)


def final_percent(run: RunResult, chance: float) -> float:
    """Final accuracy in percent (Table 1, Fig. 3); a diverged run (NaN final accuracy) counts at ``chance``."""
    value = run.final()
    return chance if run.diverged or math.isnan(value) else 100 * value


def early_percent(run: RunResult, early: int, chance: float) -> float:
    """Accuracy in percent at the run's first evaluation at or after round ``early`` (Sec. 5's slower learning
    curve); ``chance`` if the run has none there or it is NaN."""
    curve = run.curve()
    curve = curve[curve["round"] >= early]
    return chance if curve.empty or math.isnan(curve["value"].iloc[0]) else 100 * float(curve["value"].iloc[0])


def first_evaluation_round(runs: Iterable[RunResult], early: int) -> int:
    """The first accuracy evaluation round at or after ``early`` among ``runs`` (Fig. 3's early comparison);
    ``early`` itself if none has one."""
    rounds = [r for run in runs for r in run.curve()["round"] if r >= early]
    return int(min(rounds)) if rounds else early


def accuracy_at_round(run: RunResult, at: int, chance: float) -> float:
    """Accuracy in percent at round ``at`` exactly (Fig. 3: top-n learns early, then overfits); ``chance`` if the
    run has no value there or it is NaN."""
    curve = run.curve().set_index("round")["value"]
    return 100 * float(curve[at]) if at in curve.index and not math.isnan(curve[at]) else chance


def round_diagnostic(run: RunResult, metric: str, how: str = "mean") -> float:
    """A sampling diagnostic logged by the run (ANME, Sec. 4.2.2; PriSM's coverage, Fig. 9; effective rank, Fig. 8),
    averaged over layers each round, then summarised over rounds by ``how`` (mean, min, max, first, middle, last);
    NaN if the run logged none."""
    h = run.history
    per_round = h[h.metric == metric].groupby("round").value.mean()
    if per_round.empty:
        return math.nan
    summaries = {"mean": per_round.mean, "min": per_round.min, "max": per_round.max,
                 "first": lambda: per_round.iloc[0], "middle": lambda: per_round.iloc[len(per_round) // 2],
                 "last": lambda: per_round.iloc[-1]}
    if how not in summaries:
        raise ValueError(f"how={how!r} is not valid; accepted: {', '.join(summaries)}")
    return summaries[how]()


def training_loss_checkpoints(runs: Sequence[RunResult], parts: int = 4,
                              metric: str = "train_set_loss") -> tuple[list[int], list[list[float]]]:
    """Fig. 2 (App. A): the global model's ``metric`` on the training images it is scored on
    (``train_eval_samples``), at ``parts`` evenly spaced evaluation rounds (the last evaluated round included):
    ``(rounds, values)`` with ``values[k]`` the per-run values at ``rounds[k]``. Diverged runs are left out; the
    runs must share their evaluation rounds; a run that logged no ``metric`` raises ``ValueError``."""
    if parts < 2:
        raise ValueError(f"parts={parts!r} is not valid; accepted: an int >= 2 (a trend needs two points)")
    finished = [r for r in runs if not r.diverged]
    frames = []
    for r in finished:
        h = r.history
        rows = h[(h.metric == metric) & (h.group == "global")].set_index("round").value
        if rows.empty:
            raise ValueError(f"run {r.config.label()} logged no {metric!r}; set its train_eval_samples")
        frames.append(rows)
    if not frames:
        return [], []
    evaluated = sorted(frames[0].index)
    if any(sorted(f.index) != evaluated for f in frames):
        raise ValueError("the runs evaluated at different rounds; accepted: runs of one schedule")
    picks = sorted({evaluated[math.ceil(len(evaluated) * k / parts) - 1] for k in range(1, parts + 1)})
    return picks, [[float(f[rnd]) for f in frames] for rnd in picks]


def seedwise_best(values: Mapping[str, Sequence[float]], *methods: str) -> list[float]:
    """Per seed, the largest value among ``methods`` (e.g. the better of top-n and PriSM, Table 1's caption)."""
    return [max(per_seed) for per_seed in zip(*(values[m] for m in methods))]


def seedwise_worst(values: Mapping[str, Sequence[float]], *methods: str) -> list[float]:
    """Per seed, the smallest value among ``methods`` (e.g. the weaker of Unbiased and Collective, Sec. 4.2.1)."""
    return [min(per_seed) for per_seed in zip(*(values[m] for m in methods))]


def nan_max(values: Iterable[float]) -> float:
    """The largest of ``values``, NaN if any is NaN (a diverged seed leaves the comparison undecided)."""
    values = list(values)
    return _NAN if any(v != v for v in values) else max(values)


def nan_min(values: Iterable[float]) -> float:
    """The smallest of ``values``, NaN if any is NaN (a diverged seed leaves the comparison undecided)."""
    values = list(values)
    return _NAN if any(v != v for v in values) else min(values)


def finite_mean(values: Iterable[float]) -> float:
    """Mean of the non-NaN ``values``, −∞ if there are none (ranks strategies with a diverged seed last)."""
    finite = [v for v in values if v == v]
    return sum(finite) / len(finite) if finite else -float("inf")


def chance_mean(values: Sequence[float], chance: float) -> float:
    """Mean of ``values`` with each NaN (a diverged seed) counted at ``chance``, as the scorecard's rule counts it."""
    return sum(chance if v != v else v for v in values) / len(values)


def seed_final_labels(runs: Iterable[RunResult]) -> pd.DataFrame:
    """One row per run: method, lr, seed and its final accuracy to 4 digits, or the round it diverged in (Table 1's
    per-seed cells)."""
    return pd.DataFrame([{"method": r.config.method, "lr": r.config.lr, "seed": r.config.seed,
                          "final accuracy": f"{r.final():.4f}" if not r.diverged
                          else f"diverged in round {r.summary['diverged_at_round']}"} for r in runs])


def seed_accuracies(curves: pd.DataFrame, method: str, seeds: Sequence[int], end: int, eval_every: int) -> list[float]:
    """Each seed's accuracy (%) as the mean of its last five evaluations up to round ``end`` (Table 1's and Table 2's
    Shakespeare cells); NaN for a seed without a curve (diverged)."""
    means = last_evaluations_mean(curves, end, eval_every)
    return [100 * float(means.get((method, s), _NAN)) for s in seeds]


def seed_metric_means(runs: Iterable[RunResult], method: str, seeds: Sequence[int], metric: str = "anme") -> list[float]:
    """Each seed's ``metric`` averaged over all its logged rows (ANME over rounds and keep-ratio groups, Sec. 4.2.2);
    NaN for a diverged or missing run."""
    by_seed = {r.config.seed: _NAN if r.diverged else float(r.history.loc[r.history["metric"] == metric, "value"].mean())
               for r in runs if r.config.method == method}
    return [by_seed.get(s, _NAN) for s in seeds]


@functools.lru_cache(maxsize=32)
def _decomposed_terms(model_fields: str, data_root: str | None) -> tuple[tuple[str, int], ...]:
    from subfl.experiments import ExperimentConfig

    config = ExperimentConfig.from_dict(json.loads(model_fields))
    dataset, _, _ = prepare_data(config, data_root)
    return tuple((name, spec.num_terms) for name, spec in layer_specs(ModelFactory(config, dataset)()).items())


def decomposed_terms(run: RunResult, data_root: str | None = None) -> dict[str, int]:
    """``N = min(n, m)``, the number of SVD terms, of each decomposed layer of the run's model, from its config (the
    architecture alone: no weights needed). The spectral methods decompose these layers at full rank, so this is
    the length of each layer's singular values in their server state."""
    fields = {**run.config.to_dict(), "seed": 0, "method": "fedavg", "heterogeneity": "1.0", "method_options": {}}
    return dict(_decomposed_terms(json.dumps(fields, sort_keys=True, default=list), data_root))


def effective_rank_share(run: RunResult, at: int, data_root: str | None = None) -> float:
    """The server model's effective rank / N at round ``at``, mean over its decomposed layers (PriSM Fig. 8); NaN
    past a divergence. Each layer's N from :func:`decomposed_terms`."""
    terms = decomposed_terms(run, data_root)
    ranks = run.history[(run.history["metric"] == "effective_rank") & (run.history["round"] == at)]
    return float((ranks["value"] / ranks["group"].map(terms)).mean())


# ---- PriSM's sampling ablation (Sec. 4.5, Table 5) ----------------------------------------------------------------
PRISM_SAMPLING_TABLE = "PriSM's sampling distribution (PriSM Table 5)"
"""The ablations page's table of PriSM's sampling distributions (a key of the catalog's ``SPECTRAL_ABLATIONS``)."""

FINAL_SPECTRA = ("final_spectra", {})
"""The :mod:`subfl_book.final_analyses` request :func:`final_layer_spectra` reads (request it with the runs)."""


def final_layer_spectra(results: Iterable[RunResult]) -> dict[str, np.ndarray]:
    """Each decomposed layer's singular values in the final global model of the first run among ``results`` that
    did not diverge (the record's ``final_spectra`` analysis, computed from the run's final weights when it was
    recorded); ``{}`` if every run diverged."""
    for run in results:
        if not run.diverged:
            recorded = stored_run(run.config, analyses=[FINAL_SPECTRA])
            value = final_analysis(recorded, FINAL_SPECTRA[0], **FINAL_SPECTRA[1])
            return {layer: np.asarray(lam, dtype=np.float64) for layer, lam in spectra_from_value(value).items()}
    return {}


def sampling_distribution_rows(spectra: Mapping[str, np.ndarray], keep_ratio: float,
                               label: str) -> list[dict[str, Any]]:
    """PriSM Sec. 4.5: what each of Table 5's three sampling distributions does with a layer's spectrum. One row
    per layer of ``spectra``: its size ``N`` and singular-value range, and, for uniform sampling (κ = 0), the
    softmax of the singular values and Eq. (2) with the default κ — each drawn as PriSM draws, ``⌈N r⌉`` terms
    without replacement — the largest inclusion probability π (Wallenius means, Fog's approximation, as the
    library's designs use them) and the expected share of the layer's ``‖W‖_F²`` a sub-model keeps,
    ``Σ π_i λ_i² / Σ λ_i²`` (the terms are orthogonal). ``label`` names the run the spectra come from."""
    arms = {"uniform": {"kappa": 0.0}, "softmax": {"weighting": "softmax"}, "Eq. (2)": {}}
    rows = []
    for layer, lam in spectra.items():
        lam = np.asarray(lam, dtype=np.float64)
        energy = float(np.sum(lam**2))
        row: dict[str, Any] = {"run": label, "layer": layer, "N": lam.size, "λ min": float(lam.min()),
                               "λ max": float(lam.max())}
        for arm, options in arms.items():
            pi = term_design("prism", lam, keep_ratio, **options).pi
            row[f"{arm}: π max"] = float(pi.max())
            row[f"{arm}: kept share of ‖W‖²"] = float(pi @ lam**2) / energy if energy > 0 else _NAN
        rows.append(row)
    return rows


def term_gradient_scales(model: torch.nn.Module, layer: str, indices: Sequence[int], omegas: Sequence[float], *,
                         inputs: torch.Tensor, targets: torch.Tensor, tau: float = 10.0) -> pd.DataFrame:
    """Sec. 3.3: in a sub-model computing ``Ŵ = U'_S diag(ω_S) V'_S`` the gradients of each term carry its multiplier,
    ``∂L/∂u'_i = ω_i (∂L/∂Ŵ) v'_i`` and ``∂L/∂v'_i = ω_i (∂L/∂Ŵ)ᵀ u'_i``, so ``ω_i`` scales the term's learning rate.

    Builds the library's sub-model of ``model`` (terms ``indices`` of ``layer`` with ``omegas``), takes the gradients
    of the cross-entropy on ``(inputs, targets)``, and the gradient ``G = ∂L/∂Ŵ`` of a dense copy whose ``layer``
    holds ``Ŵ``, all in float64. One row per term: ``omega``; ``scale``, ``‖∂L/∂u'_i‖ / ‖G v'_i‖`` (the multiplier the gradient
    carries); ``relative error`` of both gradients against ``ω_i G v'_i`` and ``ω_i Gᵀ u'_i``; ``scale with ClipLR``,
    the same ratio after :func:`subfl.methods.spectral.clip_gradients` with ``tau`` (``ω_i min(1, τ/ω_i)``).
    """
    import copy

    from subfl.methods.spectral import clip_gradients
    from subfl.models.factorized import build_submodel, decompose, dense_weight, factorized_modules, layer_specs

    model = copy.deepcopy(model).double()  # float64 throughout, so the identity is checked to ~1e-12
    inputs = inputs.double() if inputs.is_floating_point() else inputs
    omega = torch.as_tensor(omegas, dtype=torch.float64)
    sub = build_submodel(model, decompose(model, [layer]), {layer: list(indices)}, {layer: omega})
    f = factorized_modules(sub)[layer]
    torch.nn.functional.cross_entropy(sub(inputs), targets).backward()
    dense = copy.deepcopy(model)
    target_layer = dense.get_submodule(layer)
    with torch.no_grad():
        target_layer.weight.copy_(dense_weight(f.u.detach() * omega, f.v.detach(), layer_specs(model, [layer])[layer]))
    dense.zero_grad()
    torch.nn.functional.cross_entropy(dense(inputs), targets).backward()
    g = target_layer.weight.grad.double().reshape(target_layer.weight.shape[0], -1)
    u, v = f.u.detach().double(), f.v.detach().double().reshape(f.rank, -1)
    free_u, free_v = g @ v.T, (u.T @ g)  # the ω-free factors G v'_i (columns) and Gᵀ u'_i (rows)
    grad_u, grad_v = f.u.grad.double().clone(), f.v.grad.double().reshape(f.rank, -1).clone()
    clip_gradients(sub, tau)()
    clipped_u = f.u.grad.double()
    w = omega.double()
    rows = []
    for i in range(f.rank):
        norm = float(free_u[:, i].norm())
        err_u = float((grad_u[:, i] - w[i] * free_u[:, i]).norm() / (w[i] * norm))
        err_v = float((grad_v[i] - w[i] * free_v[i]).norm() / (w[i] * free_v[i].norm()))
        rows.append({"term": int(indices[i]), "omega": float(w[i]), "scale": float(grad_u[:, i].norm()) / norm,
                     "relative error": max(err_u, err_v),
                     "scale with ClipLR": float(clipped_u[:, i].norm()) / norm})
    return pd.DataFrame(rows)


def schatten_solver_rows(spectra: Mapping[str, np.ndarray], keep_ratios: Sequence[float], ps: Sequence[float], *,
                         tolerance: float = 1e-6) -> pd.DataFrame:
    """App. A's remark that the Schatten-p marginals became hard to optimise numerically above p = 4: for each
    spectrum, keep ratio and ``p``, the generic optimiser (:func:`subfl.sampling.schatten_inclusion` with
    ``method="slsqp"``) against the library's exact KKT solution (``method="kkt"``). Columns: ``spectrum``,
    ``keep ratio``, ``p``, ``n``, ``SLSQP converged``, ``SLSQP excess`` (its objective over the KKT one, minus 1;
    NaN when it failed) and ``SLSQP optimal`` (converged, and within ``tolerance`` of the exact objective)."""
    from subfl.sampling.inclusion import schatten_discrepancy, schatten_inclusion

    rows = []
    for label, lam in spectra.items():
        for r in keep_ratios:
            n = sampling.keep_count(len(lam), r)
            for p in ps:
                exact = schatten_discrepancy(lam, schatten_inclusion(lam, n, p), p)
                try:
                    generic = schatten_discrepancy(lam, schatten_inclusion(lam, n, p, method="slsqp"), p)
                    converged, excess = True, generic / exact - 1.0
                except RuntimeError:
                    converged, excess = False, _NAN
                rows.append({"spectrum": label, "keep ratio": r, "p": p, "n": n, "SLSQP converged": converged,
                             "SLSQP excess": excess, "SLSQP optimal": converged and excess <= tolerance})
    return pd.DataFrame(rows)


def sampler_round_milliseconds(pi: np.ndarray, clients: int, rng: np.random.Generator, *, repeats: int = 20
                               ) -> dict[str, float]:
    """App. A's speed comparison of the samplers, as one server round pays it: ``clients`` samples with the marginals
    ``pi``. Conditional Poisson sampling calibrates its design once per round (the marginals change every round),
    then draws; Brewer's method and the minimum-support design draw directly. Median wall time in milliseconds over
    ``repeats`` rounds (after one warm-up), and the calibration and one CPS draw alone."""
    import statistics
    import timeit

    def median_ms(fn) -> float:
        fn()  # warm-up
        return 1e3 * statistics.median(timeit.repeat(fn, number=1, repeat=repeats))

    design = sampling.cps_design(pi)
    return {"CPS (calibration + draws)": median_ms(lambda: [d.sample(rng) for d in [sampling.cps_design(pi)]
                                                           for _ in range(clients)]),
            "Brewer": median_ms(lambda: [sampling.sample_brewer(pi, rng) for _ in range(clients)]),
            "minimum support": median_ms(lambda: [sampling.sample_min_support(pi, rng) for _ in range(clients)]),
            "CPS calibration alone": median_ms(lambda: sampling.cps_design(pi)),
            "one CPS draw alone": median_ms(lambda: design.sample(rng))}
