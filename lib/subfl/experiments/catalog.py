"""Named experiments shared by several chapters (so two notebooks never drift apart on one setting)."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .config import ExperimentConfig, make_config
from ..models.registry import model_spec
from .runner import RunResult, run_seeds

# CIFAR-10 reference at the cpu scale: the FedAvg CNN at full width (a narrowed ResNet-18 is ~15× slower per
# image on 2 cores), 20 clients of 1 000 images, 10 per round, 2 local epochs, 40 rounds.
_CIFAR10_CPU = dict(num_clients=20, clients_per_round=10, rounds=40, local_epochs=2, eval_every=2)


def fedavg_reference(dataset: str, partition: str = "iid", alpha: float | None = None, *, scale: str = "cpu",
                     seed: int = 0) -> ExperimentConfig:
    """The full-model FedAvg reference of chapter "The federated setting" for ``fmnist`` or ``cifar10``."""
    if dataset == "fmnist":
        model = dict(model="cnn")
    elif dataset == "cifar10":
        model = dict(model="cnn", width=1.0, **(_CIFAR10_CPU if scale == "cpu" else {}))
    else:
        raise ValueError(f"dataset={dataset!r} has no FedAvg reference; accepted: fmnist, cifar10")
    if scale == "ci":
        model["width"] = 0.25
    return make_config("fedavg", dataset, partition=partition, alpha=alpha, scale=scale, seed=seed, **model)


# ---- FLANC chapter ---------------------------------------------------------------------------------------
FLANC_SETTINGS = {
    "static": "uniform:0.25,0.5,0.75,1.0",           # Fig. 3: every client keeps one of four widths
    "dynamic": "dynamic:uniform:0.25,0.5,0.75,1.0",  # Table 1: a client's width is re-drawn every round
    "A25": "1.0:0.25,0.25:0.75",                     # Figs. 1, 4: 25 % type-A (1.0x), 75 % type-B (0.25x)
    "A75": "1.0:0.75,0.25:0.25",                     # Fig. 4: 75 % type-A, 25 % type-B
    "full": "1.0",                                   # the full-model FedAvg reference
}
"""Heterogeneity spec of each capacity setting of the FLANC chapter."""

FLANC_PARTITIONS = {"iid": dict(partition="iid"), "classes": dict(partition="k_classes", classes_per_client=3),
                    "roles": dict(partition="natural")}
"""The FLANC chapter's data splits: iid and non-iid with 3 classes per client (images); one client per
(play, role) for Shakespeare."""

# On the 3-classes split at the cpu scale FLANC diverged in round 2 at lr 0.02 (a client's loss became NaN;
# measured), so every method runs that split at lr 0.01 — the released FLANC code's learning rate.
_FLANC_CPU_PARTITION = {"classes": dict(lr=0.01)}

# HeteroFL's scaler multiplies every hidden layer's output by 1/p in training; it assumes a normalisation layer
# follows. FLANC's CNN (and the FedAvg CNN, the CIFAR-10 model at the cpu scale) has none, so the factors compound (4 × 4 × 4 at p = 1/4): at the cpu scale HeteroFL and
# FedRolex with the scaler produced a non-finite loss in round 4 with one torch thread, and HeteroFL ended
# below its scaler-free run with two (measured; the chapter shows it). The chapter runs them without it.
FLANC_METHOD_DEFAULTS = {"heterofl": {"scaler": False}, "fedrolex": {"scaler": False}}

# Fashion-MNIST at the cpu scale: FLANC's CNN at width 0.25 (the four sub-models have 4/8/8 … 16/32/32
# channels); evaluation every 5 rounds (and at the last) because every width's model is evaluated.
# Shakespeare at the cpu scale: the character LSTM at width 0.25 (hidden 64 at p = 1, 16 at p = 1/4), the first
# 100 roles of the file with 80-character windows every 20 characters (20,332 train windows; 2,000 test windows
# drawn from the roles' last 10 %), one client per role, 10 per round, at most 20 local steps of 32 windows, plain
# SGD. The lr comes from a 10-round probe of full-model FedAvg (test accuracy at round 10: lr 0.5 → 0.294,
# 1.0 → 0.315, 2.0 → 0.324; measured): 1.0, the larger values gaining little.
_SHAKESPEARE_CPU = dict(model="char_rnn", width=0.25, eval_every=5, num_clients=100, clients_per_round=10,
                        rounds=30, local_epochs=1, local_steps=20, lr=1.0, momentum=0.0, max_test_samples=2000,
                        dataset_options=dict(stride=20, max_users=100))
# CIFAR-10 at the cpu scale: chapter 1's reference model and sizes (the FedAvg CNN at full width, 20 clients,
# 10 per round, 2 local epochs, 40 rounds, cosine lr 0.02) instead of ResNet-18, which at width 0.25 trains
# ~40 images/s on 2 cores against ~1,500 for the CNN; evaluation every 5 rounds (every width is evaluated).
_FLANC_CPU = {"fmnist": dict(model="flanc_cnn", width=0.25, eval_every=5),
              "cifar10": dict(model="cnn", width=1.0, **{**_CIFAR10_CPU, "eval_every": 5}),
              "shakespeare": _SHAKESPEARE_CPU}
_FLANC_PAPER_MODEL = {"cifar10": "resnet18"}
_FLANC_DATASET_SPLITS = {"fmnist": ("iid", "classes"), "cifar10": ("iid", "classes"), "shakespeare": ("roles",)}


def flanc_config(method: str, setting: str = "static", partition: str = "iid", *, dataset: str = "fmnist",
                 scale: str = "cpu", seed: int = 0, **method_options) -> ExperimentConfig:
    """One run of the FLANC chapter: ``method`` under capacity ``setting`` (:data:`FLANC_SETTINGS`) on split
    ``partition`` (:data:`FLANC_PARTITIONS`). ``method_options`` go to the method (e.g. ``ortho_lambda=0``;
    :data:`FLANC_METHOD_DEFAULTS` first, on the norm-free CNN).

    Models: FLANC's CNN on Fashion-MNIST, the FedAvg CNN on CIFAR-10 (ResNet-18 at the ``paper`` scale), the
    character LSTM on Shakespeare (split ``roles``: one client per role) (``paper`` scale: full width)."""
    if setting not in FLANC_SETTINGS:
        raise ValueError(f"setting={setting!r} is not valid; accepted: {', '.join(FLANC_SETTINGS)}")
    if partition not in FLANC_PARTITIONS:
        raise ValueError(f"partition={partition!r} is not valid; accepted: {', '.join(FLANC_PARTITIONS)}")
    if dataset not in _FLANC_CPU:
        raise ValueError(f"dataset={dataset!r} has no FLANC setting; accepted: {', '.join(_FLANC_CPU)}")
    if partition not in _FLANC_DATASET_SPLITS[dataset]:
        raise ValueError(f"partition={partition!r} is not a split of {dataset!r}; accepted: "
                         f"{', '.join(_FLANC_DATASET_SPLITS[dataset])}")
    sizes = ({**_FLANC_CPU[dataset], **_FLANC_CPU_PARTITION.get(partition, {})} if scale == "cpu"
             else {"model": _FLANC_PAPER_MODEL.get(dataset, _FLANC_CPU[dataset]["model"])} if scale == "paper"
             else {"model": _FLANC_CPU[dataset]["model"]})  # the ci preset is already at width 0.25
    if dataset == "shakespeare" and scale == "ci":
        sizes.update(num_clients=4, max_train_samples=None, local_steps=3,
                     dataset_options=dict(stride=80, max_users=4))
    norm_free = model_spec(sizes["model"]).default_norm == "none"
    options = {**(FLANC_METHOD_DEFAULTS.get(method, {}) if norm_free else {}),
               **method_options}
    return make_config(method, dataset, scale=scale, seed=seed, heterogeneity=FLANC_SETTINGS[setting],
                       method_options=options, **FLANC_PARTITIONS[partition], **sizes)


FLANC_METHODS = ("heterofl", "fjord", "fedrolex", "flanc")
"""The methods of the FLANC chapter's comparisons (FedRolex is beyond the paper)."""


def flanc_runs(setting: str, partition: str = "iid", *, methods: Sequence[str] = FLANC_METHODS,
               seeds: Sequence[int] = (0,), dataset: str = "fmnist", scale: str = "cpu",
               data_root: str | Path | None = None, **method_options) -> list[RunResult]:
    """Every ``method`` × ``seed`` of one FLANC-chapter setting (:func:`flanc_config`), run or read from the cache."""
    return [r for m in methods for r in run_seeds(flanc_config(m, setting, partition, dataset=dataset, scale=scale,
                                                               **method_options), seeds, data_root=data_root)]



# ---- Spectral sharding and PriSM chapters -------------------------------------------------------------------
SPECTRAL_KEEP = {"r0.1": "0.1", "r0.2": "0.2", "mixed": "0.2:0.6,0.4:0.4", "r1": "1.0"}
"""Keep-ratio settings of spectral sharding's Table 1 (homogeneous r = 0.1 / 0.2; 60 % of the clients at 0.2 and
40 % at 0.4, PriSM's Table 3 mix; r = 1) as heterogeneity specs."""

SPECTRAL_METHODS = ("fedavg", "origdrop", "topn", "prism", "prism+wallenius", "prism+wallenius+cliplr",
                    "unbiased+cliplr", "collective+cliplr")
"""Table 1's rows at the cpu scale: the full-model reference, PriSM's two baselines (OrigDrop; OrthDrop = topn),
PriSM, PriSM + Wallenius (without and with the clipped learning rate), and spectral sharding's two optimal designs
with the clipped learning rate."""

# CIFAR-10 at the cpu scale: exactly the chapter-1 reference setting (the FedAvg CNN at full width, 20 clients of
# 1 000 images, 10 per round, 2 local epochs, 40 rounds, SGD lr 0.02 with momentum 0.9, cosine schedule), so the
# FedAvg row is chapter 1's run. At that lr the ω-scaled sub-models (unbiased, collective, PriSM + Wallenius)
# diverge in round 1 (term i trains with an effective step ∝ ω_i² · lr, and ω_i ≈ 1/r here is below the
# clipping threshold τ = 10) and PriSM in round 4 (measured, seed 0); the chapter runs every row at
# :data:`SPECTRAL_LOW_LR` as well.
SPECTRAL_LOW_LR = 0.005
"""The second learning rate of the spectral training table (for the strategies that diverge at 0.02)."""


def spectral_config(method: str, keep: str = "r0.2", partition: str = "dirichlet", alpha: float | None = 0.1, *,
                    scale: str = "cpu", seed: int = 0, lr: float | None = None, **method_options) -> ExperimentConfig:
    """One run of the spectral-sharding / PriSM training tables: ``method`` (e.g. one of :data:`SPECTRAL_METHODS`)
    at keep-ratio setting ``keep`` (:data:`SPECTRAL_KEEP`; ``fedavg`` always trains the full model) on CIFAR-10,
    in chapter 1's reference setting; ``lr`` replaces its learning rate."""
    if keep not in SPECTRAL_KEEP:
        raise ValueError(f"keep={keep!r} is not valid; accepted: {', '.join(SPECTRAL_KEEP)}")
    base = fedavg_reference("cifar10", partition, alpha if partition != "iid" else None, scale=scale, seed=seed)
    changes = {} if lr is None else {"lr": lr}
    if method == "fedavg" and not method_options:
        return base.replace(**changes)
    return base.replace(method=method, heterogeneity=SPECTRAL_KEEP[keep], method_options=method_options, **changes)


SPECTRAL_LOW_LR_METHODS = SPECTRAL_METHODS
"""The rows the spectral training table also runs at :data:`SPECTRAL_LOW_LR`: all of them, so that every strategy
is compared at one learning rate at which none diverges."""


def spectral_runs(keep: str = "r0.2", *, seeds: Sequence[int] = (0, 1), scale: str = "cpu",
                  methods: Sequence[str] = SPECTRAL_METHODS, low_lr_methods: Sequence[str] = SPECTRAL_LOW_LR_METHODS,
                  data_root: str | Path | None = None) -> list[RunResult]:
    """Every run of the spectral training table for one keep-ratio setting: ``methods`` at chapter 1's learning
    rate and ``low_lr_methods`` at :data:`SPECTRAL_LOW_LR`, for every seed (run or read from the cache)."""
    configs = [spectral_config(m, keep, scale=scale) for m in methods]
    configs += [spectral_config(m, keep, scale=scale, lr=SPECTRAL_LOW_LR) for m in low_lr_methods]
    return [r for cfg in configs for r in run_seeds(cfg, seeds, data_root=data_root)]
