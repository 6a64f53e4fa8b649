"""Spectral sharding's Shakespeare setting (Table 1): next-character prediction with a 3-block transformer.

Korzhenkov & Louizos ("On Sampling Strategies for Spectral Model Sharding", Table 1) train a three-block transformer
on Shakespeare and compare the sampling strategies there as on CIFAR-10; the caption of their Table 1 says the
Unbiased and Collective strategies beat top-n and PriSM on every dataset **except Shakespeare, where the gap is not
significant**. The paper's setting (Sec. 4.1, App. A): 715 natural clients, 10 per round, 2 local epochs, 1,500
rounds, SGD with momentum 0.9 and lr 0.1 with cosine annealing, batch 10, three GPT-2 blocks (widths not given),
τ = 10. The book departs from it (:func:`spectral_shakespeare_config`):

* data — :func:`~subfl.data.load_dataset` ``"shakespeare"``: LEAF-style lines by speaking role, one client per role
  (``partition="natural"``), 80-character windows; at the ``cpu`` size the first 100 roles with a window every 20
  characters (the FLANC chapter's Shakespeare sizes), 2,000 test windows;
* model — :func:`~subfl.models.transformers.tiny_gpt`: 3 pre-LN blocks, embedding 96, 3 heads, a causal language
  model trained on every position of a window and scored on the character after it. The decomposed layers are the
  blocks' linear maps (query, key, value, output projection, both MLP maps) except the first block's query map,
  which stays dense with the head because the library keeps the first and last Linear / Conv layers of a network
  dense (:func:`~subfl.models.factorized.decomposable_layers`; a transformer's first layer is an embedding);
* training — **Adam** (lr 0.003, gradient norm clipped at 1), a fixed number of local steps per round, no
  learning-rate schedule, for every method. With SGD the transformer learns slowly: trained centrally on the same
  windows, batch 32, SGD with momentum 0.9 at lr 0.1 reached 0.40 next-character accuracy after 1,200 steps and
  Adam at lr 0.003 0.50; federated (pilot runs of 10 clients × 20 local steps per round), SGD left full-model FedAvg
  at 0.29 after 10 rounds at lr 0.3, 0.23 after 20 rounds at lr 0.5 and 0.29 after 20 rounds at lr 0.05 with momentum
  0.9, where Adam at lr 0.003 with 5 clients × 50 steps reached 0.41 after 10 rounds.

Because every client optimises with Adam, the ``+cliplr`` modification (gradients of term ``i`` scaled by
``min(1, τ/ω_i)``, an SGD learning-rate clip) is not used here: a constant per-parameter gradient factor cancels in
Adam's update ``m / (√v + ε)`` (up to ``ε`` and the shared gradient-norm clip); the Unbiased and Collective designs run
as ``unbiased`` and ``collective``.

Sizes per scale (:data:`SPECTRAL_SHAKESPEARE_SIZES`): ``ci`` seconds; ``cpu`` as above, 100 clients, 5 per round,
30 rounds of 50 local steps of 32 windows; ``paper`` every role and window, the ``paper`` preset's 100 clients and
200 rounds (our choice, not the paper's stated sizes).
"""
from __future__ import annotations

from collections.abc import Iterable
from types import MappingProxyType

import pandas as pd

from .analysis import mean_std_labels
from .store import run_seeds
from subfl.experiments.config import ExperimentConfig, make_config
from subfl.experiments.runner import RunResult

SPECTRAL_SHAKESPEARE_TRAINING = MappingProxyType(dict(optimizer="adam", lr=0.003, grad_clip=1.0, momentum=0.0,
                                                      local_epochs=1, lr_schedule="constant"))
"""Local training of every method in the Shakespeare setting (all scales)."""

FULL_MODEL_METHODS = ("fedavg", "nosharding")
"""Methods whose every client trains the whole model: dense FedAvg and the factorized model unsharded (r = 1)."""

SPECTRAL_SHAKESPEARE_SIZES = MappingProxyType({
    "ci": MappingProxyType(dict(num_clients=4, clients_per_round=2, rounds=2, local_steps=3, max_train_samples=None,
                                dataset_options=dict(stride=80, max_users=4))),
    "cpu": MappingProxyType(dict(num_clients=100, clients_per_round=5, rounds=30, local_steps=50, width=1.0,
                                 eval_every=2, max_test_samples=2000,
                                 dataset_options=dict(stride=20, max_users=100))),
    "paper": MappingProxyType(dict(local_steps=50)),
})
"""Sizes of the Shakespeare setting per scale (on top of the scale's common preset)."""


def spectral_shakespeare_config(method: str, keep: str = "0.2", *, scale: str = "cpu", seed: int = 0,
                                **overrides) -> ExperimentConfig:
    """The Shakespeare experiment of ``method`` with every client at keep ratio ``keep`` (``keep`` is ignored by
    :data:`FULL_MODEL_METHODS`, whose clients train every parameter: their profiles say keep 1). ``overrides``: any
    config field (``method_options={...}``, ``rounds=...``), applied last."""
    if scale not in SPECTRAL_SHAKESPEARE_SIZES:
        raise ValueError(f"scale={scale!r} is not valid; accepted: {', '.join(SPECTRAL_SHAKESPEARE_SIZES)}")
    fields = {**SPECTRAL_SHAKESPEARE_TRAINING, **SPECTRAL_SHAKESPEARE_SIZES[scale],
              "heterogeneity": "1.0" if method in FULL_MODEL_METHODS else keep, **overrides}
    return make_config(method, "shakespeare", model="tiny_gpt", partition="natural", scale=scale, seed=seed,
                       **fields)


RECORDED_ROUNDS_MULTIPLE = 2
"""The Shakespeare runs are recorded at twice the setting's rounds (60 at ``cpu``): the longer-training page reads them
whole and the Shakespeare page their first half (:func:`shakespeare_runs`), so the two pages share one set of runs
instead of computing the first 30 rounds twice."""


def shakespeare_runs(config: ExperimentConfig, seeds: Iterable[int], *, data_root=None) -> list[RunResult]:
    """One run of ``config`` per seed, read as the first ``config.rounds`` rounds of the recorded run of
    :data:`RECORDED_ROUNDS_MULTIPLE` × as many rounds (:meth:`~subfl.experiments.runner.RunResult.first_rounds`:
    with the setting's constant learning rate the shorter run repeats them bit for bit)."""
    longer = config.replace(rounds=RECORDED_ROUNDS_MULTIPLE * config.rounds)
    return [run.first_rounds(config.rounds) for run in run_seeds(longer, seeds, data_root=data_root)]


def last_evaluations_mean(curves: pd.DataFrame, end: int, eval_every: int, evaluations: int = 5) -> pd.Series:
    """Each run's mean over its last ``evaluations`` evaluations up to round ``end`` (rounds
    ``end - evaluations·eval_every + 1 … end``), indexed by (method, seed). ``curves``: a
    :func:`~subfl.experiments.history_frame` with fields ``method`` and ``seed``. The Shakespeare curves move by a
    few points between evaluations, so the pages compare these means rather than the final round."""
    window = curves[(curves["round"] > end - evaluations * eval_every) & (curves["round"] <= end)]
    return window.groupby(["method", "seed"])["value"].mean()


def seed_summary(curves: pd.DataFrame, end: int, eval_every: int, methods: list[str] | tuple[str, ...],
                 evaluations: int = 5) -> pd.DataFrame:
    """Mean and standard deviation over the seeds of :func:`last_evaluations_mean` up to round ``end``, one row per
    method in the order of ``methods`` (NaN for a method without runs in ``curves``, e.g. all diverged)."""
    means = last_evaluations_mean(curves, end, eval_every, evaluations)
    return means.groupby("method").agg(["mean", "std"]).reindex(list(methods))


def length_comparison(curves: pd.DataFrame, ends: tuple[int, int], eval_every: int,
                      methods: list[str] | tuple[str, ...], reference: str = "topn") -> pd.DataFrame:
    """The longer-training table (Table 2's question): per method, the last-five-evaluation accuracy (mean ± sd over
    the seeds, :func:`seed_summary`) up to each round of ``ends`` = (shorter run's last round, longer run's last
    round), the gap to ``reference`` at each in points, the change between them in points, and the best evaluation of
    the seed-mean curve with its round. Rows in the order of ``methods``."""
    if len(ends) != 2 or ends[0] >= ends[1]:
        raise ValueError(f"ends={ends!r} is not valid; accepted: two rounds (shorter, longer), the first smaller")
    if reference not in methods:
        raise ValueError(f"reference={reference!r} is not valid; accepted: one of methods {list(methods)}")
    late = {end: seed_summary(curves, end, eval_every, methods) for end in ends}
    mean_curves = curves.groupby(["round", "method"])["value"].mean().unstack("method")   # one column per method
    columns = {f"last five to round {end}": pd.Series(mean_std_labels(frame), index=list(methods))
               for end, frame in late.items()}
    columns.update({f"gap to {reference}, round {end} (points)":
                    (100 * (frame["mean"] - frame.loc[reference, "mean"])).round(1) for end, frame in late.items()})
    columns[f"change, round {ends[0]}→{ends[1]} (points)"] = (100 * (late[ends[1]]["mean"]
                                                                      - late[ends[0]]["mean"])).round(1)
    columns["best seed-mean evaluation"] = mean_curves.max().reindex(list(methods)).round(4)
    columns["at round"] = mean_curves.idxmax().reindex(list(methods)).astype("Int64")
    return pd.DataFrame(columns)


__all__ = ["FULL_MODEL_METHODS", "SPECTRAL_SHAKESPEARE_SIZES",
           "SPECTRAL_SHAKESPEARE_TRAINING", "last_evaluations_mean", "length_comparison", "seed_summary",
           "spectral_shakespeare_config"]
