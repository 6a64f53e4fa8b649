"""Named experiments shared by several chapters (so two notebooks never drift apart on one setting)."""
from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from torch import nn

from subfl.models.registry import model_spec
from subfl.experiments.config import ExperimentConfig, make_config
from subfl.experiments.runner import RunResult

from .store import run_seeds

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
(play, role) for Shakespeare, or iid (every window equally likely on any client, the paper's IID Shakespeare,
Sec. 4.1)."""

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
_FLANC_DATASET_SPLITS = {"fmnist": ("iid", "classes"), "cifar10": ("iid", "classes"), "shakespeare": ("roles", "iid")}


_FLANC_PAPER_SETTINGS = {"fmnist": "fmnist-cnn", "cifar10": "cifar10-resnet18", "shakespeare": "shakespeare-rnn"}


def flanc_paper_setting(dataset: str, setting: str = "static") -> str:
    """The FLANC register's setting (``book/claims/flanc.yml``) of the experiment that our runs of ``dataset`` under
    capacity ``setting`` ("static" or "dynamic") repeat: a scorecard row names its departures against it
    (:meth:`subfl_book.scorecard.Scorecard.defaults`)."""
    if dataset not in _FLANC_PAPER_SETTINGS:
        raise ValueError(f"dataset={dataset!r} has no FLANC setting; accepted: {', '.join(_FLANC_PAPER_SETTINGS)}")
    if setting not in ("static", "dynamic"):
        raise ValueError(f"setting={setting!r} is not one of the paper's capacity settings; accepted: static, dynamic")
    return f"{_FLANC_PAPER_SETTINGS[dataset]}-{setting}"


def flanc_config(method: str, setting: str = "static", partition: str = "iid", *, dataset: str = "fmnist",
                 scale: str = "cpu", seed: int = 0, lr: float | None = None, **method_options) -> ExperimentConfig:
    """One run of the FLANC chapter: ``method`` under capacity ``setting`` (:data:`FLANC_SETTINGS`) on split
    ``partition`` (:data:`FLANC_PARTITIONS`). ``method_options`` go to the method (e.g. ``ortho_lambda=0``;
    :data:`FLANC_METHOD_DEFAULTS` first, on the norm-free CNN); ``lr`` replaces the setting's learning rate.

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
    if lr is not None:
        sizes["lr"] = lr
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
    """Every ``method`` × ``seed`` of one FLANC-chapter setting (:func:`flanc_config`), run or read from the store."""
    return [r for m in methods for r in run_seeds(flanc_config(m, setting, partition, dataset=dataset, scale=scale,
                                                               **method_options), seeds, data_root=data_root)]



# ---- CAFF chapter ----------------------------------------------------------------------------------------
CAFF_FIG1_SCHEMES = ("layers", "lora")
"""The two finetuning schemes of CAFF's Fig. 1: ``layers`` — every device trains the last ``t`` blocks of ``F_l``
(plus the final LayerNorm and the head; method ``caff``, option ``trained_layers``); ``lora`` — every device trains
LoRA adapters of one rank ``r`` on every block (method ``hetlora`` with ``ranks = (r,)``)."""

CAFF_FIG1_LORA_RANKS = (24, 12, 3)
"""The LoRA ranks of Fig. 1 (and Fig. 5)."""

CAFF_FIG1_TRAINED = {
    "ci": {3: (1, 3)},
    "cpu": {3: (1, 2, 3), 6: (1, 3, 6), 9: (1, 3, 9)},
    "paper": {l: tuple(range(1, l + 1)) for l in (3, 6, 9)},
}
"""Per scale, the trained last blocks ``t`` drawn for each depth ``l`` (``paper``: every ``t``, as the figure does).
At the ``cpu`` scale three points per depth: ``t = 1``, the cheapest configuration (its activations are the same at
every depth: only the last block, the head and the loss keep tensors), ``t = l``, training every block (the top of
each curve, the memory LoRA is compared with), and ``t = 3`` (``t = 2`` for ``l = 3``), so that ``F_3^3``, ``F_6^3``
and ``F_9^3`` train the same number of blocks on deeper frozen bases — the points that say whether a deeper
pretrained model is worth its frozen weights at equal trained depth."""

# Fig. 1 at the cpu scale: the first 100 roles of >= 1,000 tokens of Shakespeare (373,002 tokens; one client per role,
# 107 / 327 / 2,465 training windows min / median / max), 64-token windows every 8 tokens (41,239 train windows; 2,000
# of the 4,633 windows of the roles' last 10 % as the test set; roles of fewer tokens gave clients of 1-9 windows),
# 5 clients per round, 5 local AdamW steps of 16 windows, 20 rounds (500 client steps in all), evaluation every 10
# rounds. Measured with one thread on the busy 2-core machine (other runs on both cores): a 20-round run of F_3^3
# with four evaluations took 96 s (65 s training, 24 s evaluating), LoRA r = 12 on F_3 81 s (48 s + 26 s); two
# rounds of the most expensive configurations on F_9 took 0.24 s per step and 15.7 s per evaluation (LoRA r = 24)
# and 0.19 s and 9.7 s (F_9^9), i.e. about 2.6 and 2.0 single-core minutes for 20 rounds with two evaluations. The
# 18 runs of Fig. 1 at seed 0: about 30-35 single-core minutes.
# Learning rate (constant, AdamW, no weight decay), 20-round probes, test perplexity (pretrained F_3 before
# finetuning: 132.6): F_3^3 at 3e-4: 117.1, 113.4, 110.2, 108.8 at rounds 5, 10, 15, 20 (still falling); at 1e-3:
# 112.4, 109.8, 111.3, 114.1 (no gain after round 10); at 3e-3 worse every round (145.5 at round 20 on all roles).
# LoRA r = 12 on F_3 at 3e-4: 122.8, 119.1, 115.7, 114.0; at 1e-3 (all 100 first roles, pretrained 126.3): 112.1,
# 110.8, 111.2, 115.2; at 3e-3: 148.4. One learning rate for every configuration, 3e-4, the one at which layer
# finetuning keeps improving; LoRA learns more slowly at it (at 1e-3 it is faster early, then drifts) — a lr sweep
# per scheme is the first thing to add at the paper scale.
_CAFF_FIG1_SIZES = {
    "ci": dict(num_clients=4, clients_per_round=2, rounds=2, local_steps=2, batch_size=4, eval_every=1,
               max_train_samples=None, max_test_samples=64, lr=3e-4,
               dataset_options=dict(seq_len=32, stride=16, max_users=4)),
    "cpu": dict(num_clients=100, clients_per_round=5, rounds=20, local_steps=5, batch_size=16, eval_every=10,
                max_test_samples=2000, lr=3e-4, dataset_options=dict(seq_len=64, stride=8, max_users=100,
                                                                      min_tokens=1000)),
    # our sizes, not the paper's: Sec. 4.1 gives 100 devices, 10 per round, 75 rounds, batch 32 with 8 mini-batches
    # per round on Shakespeare, lr 1e-4 decayed (to 1e-6), weight decay 0.1 on Shakespeare
    "paper": dict(num_clients=100, clients_per_round=10, rounds=100, local_steps=20, batch_size=16, eval_every=10,
                  max_test_samples=5000, lr=3e-4, device="cuda",
                  dataset_options=dict(seq_len=256, stride=32, max_users=100, min_tokens=1000)),
}


def caff_fig1_depths(scale: str = "cpu") -> tuple[int, ...]:
    """The depths ``l`` of Fig. 1 at ``scale`` (those of :data:`CAFF_FIG1_TRAINED`; each has pretrained weights)."""
    if scale not in CAFF_FIG1_TRAINED:
        raise ValueError(f"scale={scale!r} is not valid; accepted: {', '.join(CAFF_FIG1_TRAINED)}")
    return tuple(CAFF_FIG1_TRAINED[scale])


def caff_fig1_config(scheme: str, layers: int, trained_or_rank: int, *, scale: str = "cpu",
                     seed: int = 0) -> ExperimentConfig:
    """One point of CAFF's Fig. 1: federated finetuning of the pretrained ``layers``-block language model on
    Shakespeare (``shakespeare_tokens``, one client per role) where every device trains the same configuration —
    ``scheme="layers"``: the last ``trained_or_rank = t`` blocks (``F_l^t``, method ``caff``); ``scheme="lora"``:
    LoRA of rank ``trained_or_rank = r`` on every block (method ``hetlora``). Pretrained weights and tokenizer: the
    language-model family of :mod:`subfl.pretraining` at the same scale. Sizes: ``_CAFF_FIG1_SIZES``."""
    if scheme not in CAFF_FIG1_SCHEMES:
        raise ValueError(f"scheme={scheme!r} is not valid; accepted: {', '.join(CAFF_FIG1_SCHEMES)}")
    depths = caff_fig1_depths(scale)
    if isinstance(layers, bool) or not isinstance(layers, int) or layers not in depths:
        raise ValueError(f"layers={layers!r} is not valid at scale {scale!r}; accepted: "
                         f"{', '.join(map(str, depths))} (the depths with pretrained weights)")
    if isinstance(trained_or_rank, bool) or not isinstance(trained_or_rank, int) or trained_or_rank < 1 or (
            scheme == "layers" and trained_or_rank > layers):
        accepted = f"an int in 1..{layers} (trained last blocks)" if scheme == "layers" else \
            f"an int >= 1 (LoRA rank; Fig. 1 uses {', '.join(map(str, CAFF_FIG1_LORA_RANKS))})"
        raise ValueError(f"trained_or_rank={trained_or_rank!r} is not valid for scheme={scheme!r}; accepted: {accepted}")
    from subfl.pretraining import preset as pretrain_preset  # the tokenizer of the pretrained family

    pretraining = pretrain_preset("lm", scale)
    sizes = dict(_CAFF_FIG1_SIZES[scale])
    data = dict(sizes.pop("dataset_options"), vocab_size=pretraining.vocab_size,
                tokenizer_max_chars=pretraining.tokenizer_max_chars)
    if scheme == "layers":
        method, options = "caff", dict(architecture=layers, layers=(layers,), trained_layers=trained_or_rank)
    else:
        method, options = "hetlora", dict(architecture=layers, ranks=(trained_or_rank,))
    return make_config(method, "shakespeare_tokens", "tiny_gpt", "natural", scale=scale, seed=seed, width=1.0,
                       optimizer="adamw", weight_decay=0.0, local_epochs=1, lr_schedule="constant",
                       method_options=dict(pretrained=scale, **options), dataset_options=data, **sizes)


def caff_fig1_configs(*, scale: str = "cpu", seed: int = 0) -> list[ExperimentConfig]:
    """Every point of Fig. 1 at ``scale``: per depth of :data:`CAFF_FIG1_TRAINED`, layer finetuning at each of its
    ``t``, then LoRA at each rank of :data:`CAFF_FIG1_LORA_RANKS` (``ci``: rank 3 only)."""
    ranks = (3,) if scale == "ci" else CAFF_FIG1_LORA_RANKS
    return [caff_fig1_config(scheme, l, k, scale=scale, seed=seed) for l in caff_fig1_depths(scale)
            for scheme, values in (("layers", CAFF_FIG1_TRAINED[scale][l]), ("lora", ranks)) for k in values]


def caff_fig1_runs(*, seeds: Sequence[int] = (0,), scale: str = "cpu",
                   data_root: str | Path | None = None) -> list[RunResult]:
    """Every run of Fig. 1 (:func:`caff_fig1_configs`) for every seed, run or read from the store."""
    return [r for cfg in caff_fig1_configs(scale=scale) for r in run_seeds(cfg, seeds, data_root=data_root)]


# ---- CAFF tasks: Shakespeare (tiny GPT) and CIFAR-10 (tiny ViT) -----------------------------------------------
CAFF_TASKS = ("shakespeare", "cifar10")
"""The downstream tasks of CAFF's Tables 1–2 the book runs: next-token prediction on Shakespeare with the pretrained
tiny language models (Fig. 1's setting, :func:`caff_fig1_config`) and image classification on CIFAR-10's classes
5–9 (``cifar10_downstream``, the classes the ViTs were not pretrained on) with the pretrained tiny ViTs. CIFAR-100,
the paper's third task, is not available offline."""

# CIFAR-10 at the cpu scale: the 20k-train / 10k-test JPEG subset's classes 5-9 (dog, frog, horse, ship, truck;
# 10,000 training images, 2,000 of the 5,000 test images scored), Dirichlet alpha = 0.1 over the five classes across
# 20 devices, so that each weak group holds a visibly different class mix (with 100 devices the two halves' class
# probabilities differed by at most ~0.15 and the weak-device F1 could not tell them apart); 5 devices per round,
# 8 local AdamW steps of 16 images, 20 rounds, lr 3e-4 constant. Probes with the earlier, weaker F_3 (seed 0, F_3^3,
# accuracy at rounds 5/10/15/20): 100 devices x 5 steps 0.195/0.326/0.380/0.461; 20 devices x 5 steps
# 0.161/0.298/0.426/0.472; 20 x 10 steps 0.263/0.450/0.514/0.472; 20 x 5 steps at lr 1e-3 0.282/0.426/0.482/0.416.
_CAFF_VIT_SIZES = {
    "ci": dict(num_clients=4, clients_per_round=2, rounds=2, local_steps=2, batch_size=4, eval_every=1,
               max_train_samples=200, max_test_samples=64, lr=3e-4),
    "cpu": dict(num_clients=20, clients_per_round=5, rounds=20, local_steps=8, batch_size=16, eval_every=5,
                max_train_samples=None, max_test_samples=2000, lr=3e-4),
    "paper": dict(num_clients=100, clients_per_round=10, rounds=100, local_steps=20, batch_size=16, eval_every=10,
                  max_train_samples=None, max_test_samples=5000, lr=3e-4, device="cuda"),
}


def _check_task(task: str) -> None:
    if task not in CAFF_TASKS:
        raise ValueError(f"task={task!r} is not valid; accepted: {', '.join(CAFF_TASKS)}")


def caff_task_config(task: str, layers: int, *, scale: str = "cpu", seed: int = 0,
                     trained_layers: int = 1) -> ExperimentConfig:
    """The finetuning setting of one task with the pretrained ``F_layers``, every device training its last
    ``trained_layers`` blocks (method ``caff``, ``F_l^t``, no budgets; ``trained_layers = layers`` is full
    finetuning, the reference; the tables replace the method and its options): ``shakespeare`` — Fig. 1's
    (:func:`caff_fig1_config`); ``cifar10`` — the ViT family on ``cifar10_downstream`` with the sizes of
    ``_CAFF_VIT_SIZES`` (Dirichlet α = 0.1)."""
    _check_task(task)
    if task == "shakespeare":
        return caff_fig1_config("layers", layers, trained_layers, scale=scale, seed=seed)
    depths = caff_fig1_depths(scale)
    if isinstance(layers, bool) or not isinstance(layers, int) or layers not in depths:
        raise ValueError(f"layers={layers!r} is not valid at scale {scale!r}; accepted: "
                         f"{', '.join(map(str, depths))} (the depths with pretrained weights)")
    if isinstance(trained_layers, bool) or not isinstance(trained_layers, int) or not 1 <= trained_layers <= layers:
        raise ValueError(f"trained_layers={trained_layers!r} is not valid for F_{layers}; accepted: an int in "
                         f"1..{layers}")
    options = dict(pretrained=scale, architecture=layers, layers=(layers,), trained_layers=trained_layers)
    return make_config("caff", "cifar10_downstream", "tiny_vit", "dirichlet", scale=scale, seed=seed, alpha=0.1,
                       width=1.0, optimizer="adamw", weight_decay=0.0, local_epochs=1, lr_schedule="constant",
                       method_options=options, **_CAFF_VIT_SIZES[scale])


# ---- CAFF Table 1: homogeneous constraints --------------------------------------------------------------------
CAFF_TABLE1_METHODS = ("caff", "hetlora", "fedhm", "fedrolex-ft")
"""The methods of CAFF's Table 1: CAFF, HetLoRA, FedHM and FedRolex (``fedrolex-ft``: FedRolex's rolling width
window on the pretrained transformer, heads kept whole, the width chosen from the budgets —
:mod:`subfl.methods.width_finetuning`)."""

CAFF_TABLE1_LEVELS = {
    "ci": {"memory_mb": (1e6,), "upload_mb": (1e6,), "gflops": (1e6,)},
    "cpu": {"memory_mb": (25.0, 40.0, 65.0), "upload_mb": (1.3, 2.2, 3.5), "gflops": (4.0, 5.3, 6.6)},
}
"""Per scale, the three levels of each constraint of Table 1 on Shakespeare — peak training memory (MB), upload per
round (MB), GFLOPs per mini-batch — every device having the same budget and the two other constraints unset. The
paper's levels fit its models (context 256, vocabulary of OpenWebText's tokenizer); ours are scaled to the book's
family (vocabulary 2,048, 64-token windows, mini-batch 16) so that the level admits from 1 to 6 trained blocks for
CAFF (measured: memory ``F_9^1`` 24.9 MB, ``F_6^3`` 38.9 MB, ``F_9^6`` 63.2 MB; upload 1.23 / 2.13 / 3.47 MB for
t = 1 / 3 / 6; compute ``F_3^3`` 3.51, ``F_6^5`` 5.30, ``F_9^6`` 6.57 GFLOPs) and the low levels exclude some
baselines. At ``ci`` one unconstrained level (a smoke test)."""

CAFF_TABLE1_VIT_LEVELS = {
    "ci": {"memory_mb": (1e6,), "upload_mb": (1e6,), "gflops": (1e6,)},
    "cpu": {"memory_mb": (36.0, 70.0, 130.0), "upload_mb": (1.8, 5.4, 10.7), "gflops": (9.0, 16.0, 21.0)},
}
"""The same for CIFAR-10 with the tiny ViTs (embedding 192, 65 tokens, mini-batch 16), chosen from their measured
costs (:func:`caff_resource_tables`) by the same rule — from one to six trained blocks for CAFF (memory ``F_9^1``
35.8 MB, ``F_6^3`` 66.8 MB, ``F_9^6`` 126.6 MB; upload 1.78 / 5.34 / 10.68 MB for t = 1 / 3 / 6; compute ``F_3^3``
8.85, ``F_6^5`` 15.70, ``F_9^6`` 20.59 GFLOPs); at 36 MB LoRA (≥ 46 MB) fits no depth."""


def caff_table1_levels(scale: str = "cpu", task: str = "shakespeare") -> dict[str, tuple[float, ...]]:
    """Table 1's levels of each constraint for ``task`` at ``scale``."""
    _check_task(task)
    levels = CAFF_TABLE1_LEVELS if task == "shakespeare" else CAFF_TABLE1_VIT_LEVELS
    if scale not in levels:
        raise ValueError(f"scale={scale!r} is not valid; accepted: {', '.join(levels)}")
    return levels[scale]


CAFF_TABLE1_LORA_RANKS = (24, 12, 6, 3)
"""The LoRA ranks HetLoRA may give a device (its default)."""

CAFF_TABLE1_RANK_RATIOS = (1.0, 0.5, 0.25, 0.125)
"""The rank ratios FedHM may give a device (its default; 1 = the dense model)."""

CAFF_WIDTHS = (1.0, 0.5, 0.25, 0.125)
"""The width scales the width-slicing baselines may give a device (CAFF appendix Eq. 7; their default)."""

CAFF_SETTING_KEYS = {"hetlora": "rank", "fedhm": "rank_ratio", "depthfl": "depth", "heterofl-ft": "width",
                     "fjord-ft": "width", "fedrolex-ft": "width"}
"""The resource-table column each baseline chooses its per-device configuration by."""

_CAFF_TABLE1_TABLES: dict[tuple[str, str], dict] = {}


def _task_batch(task: str, scale: str):
    import torch

    if task == "shakespeare":
        sizes = _CAFF_FIG1_SIZES[scale]
        return torch.zeros(sizes["batch_size"], sizes["dataset_options"]["seq_len"], dtype=torch.long)
    return torch.zeros(_CAFF_VIT_SIZES[scale]["batch_size"], 3, 32, 32)


def _task_model(task: str, scale: str, layers: int, width: float = 1.0) -> nn.Module:
    """The task's pretrained architecture ``F_layers`` at ``width`` (randomly initialised: costs depend on shapes)."""
    from subfl.models import build_model
    from subfl.pretraining import preset as pretrain_preset

    if task == "shakespeare":
        vocab = pretrain_preset("lm", scale).vocab_size
        seq_len = _CAFF_FIG1_SIZES[scale]["dataset_options"]["seq_len"]
        return build_model("tiny_gpt", num_classes=vocab, input_shape=(seq_len,), layers=layers, vocab_size=vocab,
                           width=width)
    return build_model("tiny_vit", num_classes=5, input_shape=(3, 32, 32), layers=layers, width=width)


def caff_resource_tables(scale: str = "cpu", task: str = "shakespeare") -> dict[str, "pd.DataFrame"]:
    """The measured costs every method of Tables 1–2 chooses from at ``scale`` on ``task``, for each pretrained depth
    (:func:`caff_fig1_depths`) on the task's mini-batch: ``"caff"`` — every ``F_l^t``; ``"hetlora"`` — LoRA at
    :data:`CAFF_TABLE1_LORA_RANKS`; ``"fedhm"`` — the factorised model at :data:`CAFF_TABLE1_RANK_RATIOS`;
    ``"depthfl"`` — every depth ``d`` with its exits; ``"width"`` — the head-preserving width slices at
    :data:`CAFF_WIDTHS` (the three width-slicing baselines share it). Measured once per process with the functions
    the methods measure with when a run starts."""
    _check_task(task)
    if (scale, task) not in _CAFF_TABLE1_TABLES:
        import pandas as pd

        from subfl.costs.finetuning import resource_table
        from subfl.methods.depthfl import depthfl_resource_table
        from subfl.methods.fedhm import fedhm_resource_table
        from subfl.methods.width_finetuning import width_resource_table

        batch = _task_batch(task, scale)
        models = {l: _task_model(task, scale, l) for l in caff_fig1_depths(scale)}
        build = lambda layers, width=1.0: _task_model(task, scale, layers, width)  # noqa: E731
        _CAFF_TABLE1_TABLES[(scale, task)] = {
            "caff": resource_table(models, batch),
            "hetlora": resource_table(models, batch, trained_layers=(), lora_ranks=CAFF_TABLE1_LORA_RANKS),
            "fedhm": pd.concat([fedhm_resource_table(m, CAFF_TABLE1_RANK_RATIOS, batch) for m in models.values()],
                               ignore_index=True),
            "depthfl": pd.concat([depthfl_resource_table(m, batch) for m in models.values()], ignore_index=True),
            "width": pd.concat([width_resource_table(build, l, CAFF_WIDTHS, batch) for l in models],
                               ignore_index=True)}
    return _CAFF_TABLE1_TABLES[(scale, task)]


def _method_table(tables: dict, method: str):
    return tables["width"] if method.endswith("-ft") else tables[method]


def _largest_within(table, key: str, layers: int, budget: dict) -> float | None:
    from subfl.methods.finetuning_common import largest_fitting, rows_for, table_rows

    rows = table_rows(table, key, layers=layers)
    return largest_fitting(rows_for(rows, key, rows[key].tolist()), budget)


def _baseline_choice(table, key: str, chosen: int | None, depths: Sequence[int], budgets: dict[str, dict],
                     ) -> tuple[int | None, dict[str, float | None], str]:
    """A baseline's plan under group budgets: the model CAFF chose if every group has a configuration on it, else
    the deepest model where every group has one (``"†"``), else none (``"—"``). Returns ``(layers, {group: its
    largest configuration}, mark)``."""
    order = ([chosen] if chosen else []) + [l for l in sorted(depths, reverse=True) if l != chosen]
    for layers in order:
        settings = {g: _largest_within(table, key, layers, b) for g, b in budgets.items()}
        if all(v is not None for v in settings.values()):
            return layers, settings, "" if layers == chosen else "†"
    return None, {g: None for g in budgets}, "—"


def caff_table1_plan(scale: str = "cpu", task: str = "shakespeare") -> "pd.DataFrame":
    """What every method of Table 1 trains at every constraint level of ``task`` at ``scale``
    (:func:`caff_table1_levels`), from :func:`caff_resource_tables`. One row per (constraint, level, method) with
    ``layers`` (the depth ``l``, or ``None``), ``setting`` (CAFF: trained blocks ``t``; HetLoRA: rank; FedHM: rank
    ratio; FedRolex: width scale) and ``mark``:

    * CAFF: Eq. (3) over the pretrained depths (:func:`subfl.methods.caff.select_architecture`); ``"—"`` when no depth
      is feasible;
    * a baseline finetunes the model CAFF selected, with its largest configuration within the budget; when it has
      none there, the deepest model on which it has one (``mark "†"``); ``"—"`` when none fits anywhere (the paper's
      tables mark a missing configuration the same way)."""
    import pandas as pd

    from subfl.methods.caff import select_architecture

    levels = caff_table1_levels(scale, task)
    tables = caff_resource_tables(scale, task)
    depths = caff_fig1_depths(scale)
    rows = []
    for constraint, values in levels.items():
        for level in values:
            budget = {constraint: level}
            try:
                selection = select_architecture(tables["caff"], [budget])
                chosen, t = selection.layers, int(selection.mean_trained)
            except ValueError:
                chosen, t = None, None
            rows.append({"constraint": constraint, "level": level, "method": "caff", "layers": chosen,
                         "setting": t, "mark": "" if chosen else "—"})
            for method in CAFF_TABLE1_METHODS[1:]:
                layers, settings, mark = _baseline_choice(_method_table(tables, method), CAFF_SETTING_KEYS[method],
                                                          chosen, depths, {"1": budget})
                rows.append({"constraint": constraint, "level": level, "method": method, "layers": layers,
                             "setting": settings["1"], "mark": mark})
    return pd.DataFrame(rows)


def _check_constraint(constraint: str) -> None:
    from subfl.methods.finetuning_common import CONSTRAINT_COLUMNS

    if constraint not in CONSTRAINT_COLUMNS.values():
        raise ValueError(f"constraint={constraint!r} is not valid; accepted: {', '.join(CONSTRAINT_COLUMNS.values())}")


def _baseline_options(method: str, layers: int, budgets: dict) -> dict:
    """A baseline's options for a table cell: the depth it finetunes, its configuration choices and the budgets."""
    choices = {"hetlora": dict(ranks=CAFF_TABLE1_LORA_RANKS), "fedhm": dict(rank_ratios=CAFF_TABLE1_RANK_RATIOS),
               "depthfl": {}}.get(method, dict(widths=CAFF_WIDTHS))
    return dict(architecture=layers, **choices, budgets=budgets)


def caff_table1_config(method: str, constraint: str, level: float, layers: int, *, scale: str = "cpu",
                       seed: int = 0, task: str = "shakespeare") -> ExperimentConfig:
    """One cell of Table 1: the task's finetuning setting (:func:`caff_task_config`) with every device's budget
    ``{constraint: level}``. ``caff`` chooses its architecture among the pretrained depths itself (Eq. 3; ``layers``
    must be the one :func:`caff_table1_plan` gives); the baselines finetune ``F_layers`` and choose their rank /
    rank ratio / width within the budget."""
    if method not in CAFF_TABLE1_METHODS:
        raise ValueError(f"method={method!r} is not valid; accepted: {', '.join(CAFF_TABLE1_METHODS)}")
    _check_constraint(constraint)
    base = caff_task_config(task, layers, scale=scale, seed=seed)
    budgets = {"1": {constraint: float(level)}}  # every device is in group "1" (homogeneous keep ratio 1.0)
    if method == "caff":
        options = dict(layers=caff_fig1_depths(scale), budgets=budgets)
    else:
        options = _baseline_options(method, layers, budgets)
    return base.replace(method=method, method_options=dict(pretrained=scale, **options))


def caff_table1_configs(*, scale: str = "cpu", seed: int = 0, task: str = "shakespeare") -> list[ExperimentConfig]:
    """Every feasible cell of :func:`caff_table1_plan` as a run configuration."""
    plan = caff_table1_plan(scale, task)
    return [caff_table1_config(r.method, r.constraint, r.level, int(r.layers), scale=scale, seed=seed, task=task)
            for r in plan.itertuples() if r.mark != "—"]


# ---- CAFF Table 2: heterogeneous constraints -------------------------------------------------------------------
CAFF_TABLE2_METHODS = ("caff", "hetlora", "fedhm", "depthfl", "heterofl-ft", "fjord-ft", "fedrolex-ft")
"""The seven methods of CAFF's Table 2: CAFF, HetLoRA, FedHM, DepthFL and the three width-slicing methods on the
pretrained transformers (:mod:`subfl.methods.width_finetuning`)."""

CAFF_TABLE2_HETEROGENEITY = "0.5:0.5,1.0:0.5"
"""Half the devices weak (group ``"0.5"``), half strong (group ``"1"``); the keep ratio only names the group."""

CAFF_TABLE2_BUDGETS = {
    "shakespeare": {"ci": {"memory_mb": (1e6, 1e6)},
                    "cpu": {"memory_mb": (40.0, 65.0), "upload_mb": (1.3, 3.5), "gflops": (4.0, 6.6)}},
    "cifar10": {"ci": {"memory_mb": (1e6, 1e6)},
                "cpu": {"memory_mb": (70.0, 130.0), "upload_mb": (1.8, 10.7), "gflops": (9.0, 21.0)}},
}
"""Per task and scale, the (weak, strong) budget of each constraint of Table 2: the weak group gets a low level of
Table 1, the strong group its highest (the two other constraints unset)."""


def caff_table2_budgets(scale: str = "cpu", task: str = "shakespeare") -> dict[str, tuple[float, float]]:
    """Table 2's (weak, strong) budgets of each constraint for ``task`` at ``scale``."""
    _check_task(task)
    if scale not in CAFF_TABLE2_BUDGETS[task]:
        raise ValueError(f"scale={scale!r} is not valid; accepted: {', '.join(CAFF_TABLE2_BUDGETS[task])}")
    return CAFF_TABLE2_BUDGETS[task][scale]


def _group_budgets(constraint: str, weak: float, strong: float) -> dict[str, dict[str, float]]:
    return {"0.5": {constraint: float(weak)}, "1": {constraint: float(strong)}}


def caff_table2_plan(scale: str = "cpu", task: str = "shakespeare") -> "pd.DataFrame":
    """What every method of Table 2 trains under each constraint's (weak, strong) budgets (:func:`caff_table2_budgets`),
    half the devices weak. One row per (constraint, method) with ``layers``, ``weak`` / ``strong`` (each group's
    configuration: CAFF's ``t_c``, a rank, rank ratio, depth or width) and ``mark``. CAFF: Eq. (3) over the population
    of 50 weak and 50 strong devices; the baselines: as in :func:`caff_table1_plan`, on a model where *both* groups
    have a configuration (``"†"``: a shallower one than CAFF's; ``"—"``: none)."""
    import pandas as pd

    from subfl.methods.caff import select_architecture, trainable_layers

    tables = caff_resource_tables(scale, task)
    depths = caff_fig1_depths(scale)
    rows = []
    for constraint, (weak, strong) in caff_table2_budgets(scale, task).items():
        budgets = _group_budgets(constraint, weak, strong)
        try:
            chosen = select_architecture(tables["caff"], [budgets["0.5"]] * 50 + [budgets["1"]] * 50).layers
            settings = {g: trainable_layers(tables["caff"], chosen, b) for g, b in budgets.items()}
        except ValueError:
            chosen, settings = None, {"0.5": None, "1": None}
        rows.append({"constraint": constraint, "weak_budget": weak, "strong_budget": strong, "method": "caff",
                     "layers": chosen, "weak": settings["0.5"], "strong": settings["1"], "mark": "" if chosen else "—"})
        for method in CAFF_TABLE2_METHODS[1:]:
            layers, settings, mark = _baseline_choice(_method_table(tables, method), CAFF_SETTING_KEYS[method],
                                                      chosen, depths, budgets)
            rows.append({"constraint": constraint, "weak_budget": weak, "strong_budget": strong, "method": method,
                         "layers": layers, "weak": settings["0.5"], "strong": settings["1"], "mark": mark})
    return pd.DataFrame(rows)


def caff_table2_config(method: str, constraint: str, layers: int, *, scale: str = "cpu", seed: int = 0,
                       task: str = "shakespeare") -> ExperimentConfig:
    """One cell of Table 2: the task's finetuning setting with half the devices weak (:data:`CAFF_TABLE2_HETEROGENEITY`)
    and the groups' budgets of ``constraint`` (:func:`caff_table2_budgets`); on ``cifar10`` the data follow the two
    halves (partition ``dirichlet_groups``, α = 0.1: CAFF Sec. 4.4's split for the weak-device F1); every method finetunes ``F_layers`` (for
    CAFF, the depth Eq. (3) picks for the whole population — :func:`caff_table2_plan` — fixed with option
    ``architecture`` so that the first round's sample does not stand in for the population)."""
    if method not in CAFF_TABLE2_METHODS:
        raise ValueError(f"method={method!r} is not valid; accepted: {', '.join(CAFF_TABLE2_METHODS)}")
    _check_constraint(constraint)
    budgets_by_constraint = caff_table2_budgets(scale, task)
    if constraint not in budgets_by_constraint:
        raise ValueError(f"constraint={constraint!r} has no Table 2 budgets at scale {scale!r}; accepted: "
                         f"{', '.join(budgets_by_constraint)}")
    budgets = _group_budgets(constraint, *budgets_by_constraint[constraint])
    base = caff_task_config(task, layers, scale=scale, seed=seed)
    if method == "caff":
        options = dict(layers=caff_fig1_depths(scale), architecture=layers, budgets=budgets)
    else:
        options = _baseline_options(method, layers, budgets)
    # on images, the data follow the devices (Sec. 4.4, after CoCoFL): per class, Dir(0.1) shares of the weak and the
    # strong half, so that most classes sit on one half — the split the weak-device F1 is measured on
    partition = {"partition": "dirichlet_groups"} if task == "cifar10" else {}
    return base.replace(method=method, heterogeneity=CAFF_TABLE2_HETEROGENEITY,
                        method_options=dict(pretrained=scale, **options), **partition)


def caff_table2_configs(*, scale: str = "cpu", seed: int = 0, task: str = "shakespeare") -> list[ExperimentConfig]:
    """Every feasible cell of :func:`caff_table2_plan` as a run configuration."""
    plan = caff_table2_plan(scale, task)
    return [caff_table2_config(r.method, r.constraint, int(r.layers), scale=scale, seed=seed, task=task)
            for r in plan.itertuples() if r.mark != "—"]


# ---- CAFF Fig. 3: the architecture-selection ablation ---------------------------------------------------------
CAFF_FIG3_BUDGETS = {"ci": (1e6, 1e6), "cpu": (4.0, 6.6)}
"""Per scale, the compute budgets (GFLOPs per mini-batch) of Fig. 3's two device groups, (weak, strong). At the cpu
scale the weak devices can train ``F_3^3``, ``F_6^2`` or ``F_9^1`` and the strong ones ``F_3^3``, ``F_6^6`` or
``F_9^6`` (:func:`caff_resource_tables`), so the architecture Eq. (3) picks changes with the mix."""

CAFF_FIG3_WEAK_SHARES = (0.0, 0.25, 0.5, 0.75, 1.0)
"""The fractions of weak devices of Fig. 3 (the paper mixes the two groups from 0 to 100 %)."""


def _fig3_heterogeneity(share: float) -> str:
    """Keep-ratio spec of a mix: weak devices are the group ``"0.5"``, strong ones ``"1"`` (the keep ratio only
    names the group; CAFF reads the budgets)."""
    return f"0.5:{share:g},1.0:{1 - share:g}"


def caff_fig3_plan(scale: str = "cpu") -> "pd.DataFrame":
    """Fig. 3's table: per weak share and pretrained depth ``l``, the trained blocks of a weak and of a strong device
    (``t_weak``, ``t_strong``: the largest ``t`` within the budget), the mean over the population (Eq. 3's
    objective, with the engine's group sizes of 100 devices) and whether Eq. (3) selects ``l`` (ties → deeper)."""
    import pandas as pd

    from subfl.methods.caff import select_architecture, trainable_layers

    if scale not in CAFF_FIG3_BUDGETS:
        raise ValueError(f"scale={scale!r} is not valid; accepted: {', '.join(CAFF_FIG3_BUDGETS)}")
    table = caff_resource_tables(scale)["caff"]
    weak, strong = ({"gflops": g} for g in CAFF_FIG3_BUDGETS[scale])
    rows = []
    for share in CAFF_FIG3_WEAK_SHARES:
        n_weak = round(share * 100)
        selection = select_architecture(table, [weak] * n_weak + [strong] * (100 - n_weak))  # Eqs. (2)-(3)
        for layers in caff_fig1_depths(scale):
            rows.append({"weak_share": share, "layers": layers, "t_weak": trainable_layers(table, layers, weak),
                         "t_strong": trainable_layers(table, layers, strong),
                         "mean_trained": selection.candidates.get(layers, float("nan")),
                         "feasible": layers in selection.candidates, "selected": layers == selection.layers})
    return pd.DataFrame(rows)


def caff_fig3_config(weak_share: float, layers: int, *, scale: str = "cpu", seed: int = 0) -> ExperimentConfig:
    """One bar of Fig. 3: CAFF with the architecture fixed to ``F_layers`` (option ``architecture``) and every
    device training the largest ``t_c`` within its group's compute budget (:data:`CAFF_FIG3_BUDGETS`), a fraction
    ``weak_share`` of the devices weak. Fig. 1's setting otherwise."""
    if weak_share not in CAFF_FIG3_WEAK_SHARES:
        raise ValueError(f"weak_share={weak_share!r} is not valid; accepted: "
                         f"{', '.join(map(str, CAFF_FIG3_WEAK_SHARES))}")
    weak, strong = CAFF_FIG3_BUDGETS[scale]
    base = caff_fig1_config("layers", layers, 1, scale=scale, seed=seed)
    options = dict(pretrained=scale, architecture=layers, layers=(layers,),
                   budgets={"0.5": {"gflops": float(weak)}, "1": {"gflops": float(strong)}})
    return base.replace(method="caff", heterogeneity=_fig3_heterogeneity(weak_share), method_options=options)


def caff_fig3_configs(*, scale: str = "cpu", seed: int = 0) -> list[ExperimentConfig]:
    """Every feasible (weak share, depth) of :func:`caff_fig3_plan` as a run configuration."""
    plan = caff_fig3_plan(scale)
    return [caff_fig3_config(r.weak_share, int(r.layers), scale=scale, seed=seed) for r in plan.itertuples()
            if r.feasible]


# ---- Spectral sharding and PriSM chapters -------------------------------------------------------------------
SPECTRAL_KEEP = {"r0.1": "0.1", "r0.2": "0.2", "mixed": "0.2:0.6,0.4:0.4", "r1": "1.0"}
"""Keep-ratio settings of spectral sharding's Table 1 (homogeneous r = 0.1 / 0.2; 60 % of the clients at 0.2 and
40 % at 0.4, PriSM's Table 3 mix; r = 1) as heterogeneity specs."""

SPECTRAL_METHODS = ("fedavg", "origdrop", "splitmix", "topn", "prism", "prism+wallenius", "prism+wallenius+cliplr",
                    "unbiased+cliplr", "collective+cliplr")
"""Table 1's rows at the cpu scale: the full-model reference, PriSM's three baselines (OrigDrop, SplitMix;
OrthDrop = topn), PriSM, PriSM + Wallenius (without and with the clipped learning rate), and spectral sharding's
two optimal designs with the clipped learning rate."""

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


SPECTRAL_RESNET_METHODS = ("fedavg", "topn", "prism")
"""The rows of the narrow-ResNet-18 check: the full-model reference, OrthDrop (top-n) and PriSM."""

SPECTRAL_RESNET_SIZE = {"ci": dict(width=0.125), "cpu": dict(width=0.25, rounds=20), "paper": dict(width=1.0)}
"""ResNet-18's width (and, at ``cpu``, the rounds) in :func:`spectral_resnet_config`, per scale: a quarter of the
width (0.70 M parameters instead of 11.2 M, about 1/16 of the MACs) and 20 rounds, about 25 minutes per run on
one CPU thread (measured pilot: 61 s of local training per round with 10 clients)."""


SPECTRAL_RESNET_NORM = "bn_nostats"
"""The normalisation of every row of the ResNet-18 comparison: BatchNorm with batch statistics only, in training and
evaluation (PriSM Sec. 3.2.2; nothing to aggregate). The spectral methods switch a BatchNorm model to it anyway
(their ``sbn`` option); the full-model FedAvg reference gets it here too, so that the rows differ in the method
alone (with the model's default, FedAvg alone would keep running statistics)."""


def spectral_resnet_config(method: str, *, scale: str = "cpu", seed: int = 0) -> ExperimentConfig:
    """The spectral training table's keep-0.2 run at :data:`SPECTRAL_LOW_LR` (:func:`spectral_config`) with
    ResNet-18 in place of the FedAvg CNN, sized by :data:`SPECTRAL_RESNET_SIZE` and normalised by
    :data:`SPECTRAL_RESNET_NORM` for every method: the CPU counterpart of ``scripts/spectral_resnet18.py``'s
    full-width GPU runs (same clients, split, optimiser and schedule shape)."""
    if scale not in SPECTRAL_RESNET_SIZE:
        raise ValueError(f"scale={scale!r} is not valid; accepted: {', '.join(SPECTRAL_RESNET_SIZE)}")
    config = spectral_config(method, "r0.2", scale=scale, seed=seed, lr=SPECTRAL_LOW_LR)
    return config.replace(model="resnet18", norm=SPECTRAL_RESNET_NORM, **SPECTRAL_RESNET_SIZE[scale])


SPECTRAL_LOW_LR_METHODS = SPECTRAL_METHODS
"""The rows the spectral training table also runs at :data:`SPECTRAL_LOW_LR`: all of them, so that every strategy
is compared at one learning rate, the one at which no strategy diverged at seed 0 (at seeds 1 and 2 Unbiased + cliplr
still diverges in the first rounds: spectral/heterogeneity, spectral/updates)."""


def spectral_runs(keep: str = "r0.2", *, seeds: Sequence[int] = (0, 1), scale: str = "cpu",
                  methods: Sequence[str] = SPECTRAL_METHODS, low_lr_methods: Sequence[str] = SPECTRAL_LOW_LR_METHODS,
                  data_root: str | Path | None = None, same_environment: bool = False) -> list[RunResult]:
    """Every run of the spectral training table for one keep-ratio setting: ``methods`` at chapter 1's learning
    rate and ``low_lr_methods`` at :data:`SPECTRAL_LOW_LR`, for every seed (run or read from the store;
    ``same_environment``: only runs of this machine's environment class, for a page that reads their timings)."""
    configs = [spectral_config(m, keep, scale=scale) for m in methods]
    configs += [spectral_config(m, keep, scale=scale, lr=SPECTRAL_LOW_LR) for m in low_lr_methods]
    return [r for cfg in configs
            for r in run_seeds(cfg, seeds, data_root=data_root, same_environment=same_environment)]


SPECTRAL_TIMING_ROUNDS = 4
"""Rounds of a timing run (:func:`spectral_timing_runs`): per-round stage times settle after the first round, and
the full 40-round training runs of the spectral table cost about 35 minutes each on one CPU thread."""


def spectral_timing_configs(keep: str = "r0.2", *, scale: str = "cpu", methods: Sequence[str] = SPECTRAL_METHODS,
                            rounds: int = SPECTRAL_TIMING_ROUNDS, seed: int = 0) -> list[ExperimentConfig]:
    """Short runs to time a round stage by stage (PriSM Table 4): the spectral table's runs at
    :data:`SPECTRAL_LOW_LR` (:func:`spectral_config`), cut to ``rounds`` rounds (fewer where the scale has fewer)
    and evaluated once, at the end."""
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds={rounds!r} is not valid; accepted: an integer >= 1")
    configs = []
    for m in methods:
        config = spectral_config(m, keep, scale=scale, seed=seed, lr=SPECTRAL_LOW_LR)
        short = min(rounds, config.rounds)
        configs.append(config.replace(rounds=short, eval_every=short))
    return configs


def spectral_timing_runs(keep: str = "r0.2", *, seeds: Sequence[int] = (0,), scale: str = "cpu",
                         methods: Sequence[str] = SPECTRAL_METHODS, rounds: int = SPECTRAL_TIMING_ROUNDS,
                         data_root: str | Path | None = None) -> list[RunResult]:
    """The runs of :func:`spectral_timing_configs` for every seed, read from the store or computed; only runs made
    in this machine's environment class count, as timings differ between machines."""
    return [r for cfg in spectral_timing_configs(keep, scale=scale, methods=methods, rounds=rounds)
            for r in run_seeds(cfg, seeds, data_root=data_root, same_environment=True)]


SPECTRAL_FIG4_METHODS = ("topn", "prism", "unbiased+cliplr", "collective+cliplr")
"""The strategies of the update-cosine figure (spectral sharding Fig. 4): OrthDrop (top-n), PriSM, and the two
optimal designs with the clipped learning rate."""


def spectral_probe_config(method: str, keep: str = "r0.2", *, scale: str = "cpu", seed: int = 0,
                          lr: float | None = SPECTRAL_LOW_LR) -> ExperimentConfig:
    """The run of :func:`spectral_config` wrapped in the update probe (:mod:`subfl.methods.update_probe`): the same
    trajectory, plus each round's cosine similarity between the strategy's server update and FedAvg's from the same
    state. Default learning rate :data:`SPECTRAL_LOW_LR` (no strategy diverged there at seed 0; Unbiased + cliplr
    does at seeds 1 and 2)."""
    config = spectral_config(method, keep, scale=scale, seed=seed, lr=lr)
    return config.replace(method="update-probe",
                          method_options={"method": config.method, "method_options": dict(config.method_options)})


SPECTRAL_HETEROGENEITY: dict[str, tuple[str, ...]] = {
    "iid": ("fedavg", "topn", "prism", "origdrop", "splitmix"),
    "10": ("fedavg", "topn", "prism", "unbiased+cliplr", "collective+cliplr"),
    "1": ("fedavg", "topn", "prism", "origdrop", "splitmix", "unbiased+cliplr", "collective+cliplr"),
    "0.1": ("fedavg", "topn", "prism", "origdrop", "splitmix", "unbiased+cliplr", "collective+cliplr"),
}
"""Data-heterogeneity grid: the label distribution (``"iid"`` or the α of the plain Dirichlet split ``dirichlet``,
each client's class prior ~ Dir(α·1)) → the methods run at keep ratio 0.2 and :data:`SPECTRAL_LOW_LR`.

* Spectral sharding's Fig. 3 (sampling strategies) compares α = 10 with α = 1 in its Dir(α·p) notation, p the class
  proportions; on CIFAR-10's ten balanced classes that is the plain Dir(α / 10), so its α = 10 and α = 1 (its main
  setting) are the splits ``"1"`` and ``"0.1"`` here; ``"10"`` (its α = 100) has no counterpart in that paper.
* PriSM's Fig. 5 (PriSM, OrthDrop = top-n, OrigDrop, SplitMix) uses the plain Dir(α) with α = 1 and 0.1, and iid:
  the splits ``"1"``, ``"0.1"`` and ``"iid"`` here."""


def spectral_heterogeneity_config(method: str, label_split: str, *, scale: str = "cpu",
                                  seed: int = 0) -> ExperimentConfig:
    """One run of :data:`SPECTRAL_HETEROGENEITY`: ``method`` at keep ratio 0.2 and :data:`SPECTRAL_LOW_LR` on the
    split ``label_split`` (``"iid"`` or a Dirichlet α such as ``"1"``) of the spectral training table's setting."""
    if label_split not in SPECTRAL_HETEROGENEITY:
        raise ValueError(f"label_split={label_split!r} is not valid; accepted: {', '.join(SPECTRAL_HETEROGENEITY)}")
    if method not in SPECTRAL_HETEROGENEITY[label_split]:
        raise ValueError(f"method={method!r} is not run on split {label_split!r}; accepted: "
                         f"{', '.join(SPECTRAL_HETEROGENEITY[label_split])}")
    if label_split == "iid":
        return spectral_config(method, "r0.2", "iid", None, scale=scale, seed=seed, lr=SPECTRAL_LOW_LR)
    return spectral_config(method, "r0.2", "dirichlet", float(label_split), scale=scale, seed=seed, lr=SPECTRAL_LOW_LR)


PRISM_FACTOR_DECAY_METHODS = ("prism", "topn")
"""The methods of PriSM's Eq. (6) page: PriSM and OrthDrop (top-n), each with both ``factor_decay`` values."""


def prism_factor_decay_config(method: str, factor_decay: str, *, scale: str = "cpu", seed: int = 0) -> ExperimentConfig:
    """One run of PriSM's Eq. (6) page: ``method`` (:data:`PRISM_FACTOR_DECAY_METHODS`) at keep ratio 0.2 on the
    Dirichlet(0.1) split at :data:`SPECTRAL_LOW_LR` (the setting of the memory-efficient and Fig. 5 pages) with
    option ``factor_decay`` (:data:`~subfl.methods.spectral.FACTOR_DECAYS`). ``"weight"``, the option's default,
    is left out of the configuration, so that run is exactly ``spectral_heterogeneity_config(method, "0.1")`` and
    shares its stored runs."""
    from subfl.methods.spectral import FACTOR_DECAYS
    if method not in PRISM_FACTOR_DECAY_METHODS:
        raise ValueError(f"method={method!r} is not valid; accepted: {', '.join(PRISM_FACTOR_DECAY_METHODS)}")
    if factor_decay not in FACTOR_DECAYS:
        raise ValueError(f"factor_decay={factor_decay!r} is not valid; accepted: {', '.join(FACTOR_DECAYS)}")
    options = {} if factor_decay == "weight" else {"factor_decay": factor_decay}
    return spectral_config(method, "r0.2", "dirichlet", 0.1, scale=scale, seed=seed, lr=SPECTRAL_LOW_LR, **options)


SPECTRAL_ABLATIONS: dict[str, tuple[tuple[str, dict], ...]] = {
    "clipped learning rate (Table 3)": (("unbiased", {}), ("unbiased+cliplr", {}), ("collective", {}),
                                        ("collective+cliplr", {})),
    "sampler (Table 4)": (("collective+cliplr", {}), ("collective+cliplr", {"sampler": "brewer"}),
                          ("collective+cliplr", {"sampler": "min_support"}), ("unbiased+cliplr", {}),
                          ("unbiased+cliplr", {"sampler": "brewer"}), ("unbiased+cliplr", {"sampler": "min_support"})),
    "Schatten p = 4 (Table 5)": (("unbiased+cliplr", {}), ("schatten+cliplr", {})),
    "PriSM's scaling": (("prism", {}), ("prism+scaled", {}), ("prism+wallenius", {})),
    "Top-n's scaling": (("topn", {}), ("topn+scaled", {})),
    "PriSM's sampling distribution (PriSM Table 5)": (("prism", {"kappa": 0.0}), ("prism", {"weighting": "softmax"}),
                                                      ("prism", {})),
}
"""Spectral sharding's ablations, each a list of (method, method options) run at :data:`SPECTRAL_LOW_LR`, r = 0.2:
Table 3 (with / without the clipped learning rate), Table 4 (conditional Poisson vs Brewer vs minimum-support
sampling of the Collective and the Unbiased designs, the two strategies of the paper's table), Table 5 (Schatten p = 4 instead of the Frobenius norm), PriSM's ω variants
(ω = 1, ω keeping the Frobenius norm, ω = 1 / Wallenius mean), Top-n with and without the Frobenius-norm ω (Table 1's
*Top-n + Scaled* rows), and PriSM's Table 5 in its row order: uniform
sampling (κ = 0), the softmax of the singular values (``weighting="softmax"``) and PriSM's p ∝ λ^κ with κ = 4."""


def spectral_ablation_configs(table: str, *, keep: str = "r0.2", scale: str = "cpu", seed: int = 0,
                              split: str = "0.1") -> list[ExperimentConfig]:
    """The runs of one of :data:`SPECTRAL_ABLATIONS` (at :data:`SPECTRAL_LOW_LR`) on the label split ``split``:
    ``"iid"`` or a Dirichlet α written as a number (``"0.1"``, the training table's split, by default)."""
    if table not in SPECTRAL_ABLATIONS:
        raise ValueError(f"table={table!r} is not valid; accepted: {', '.join(SPECTRAL_ABLATIONS)}")
    partition, alpha = label_split(split)
    return [spectral_config(m, keep, partition, alpha, scale=scale, seed=seed, lr=SPECTRAL_LOW_LR, **options)
            for m, options in SPECTRAL_ABLATIONS[table]]


def label_split(split: str) -> tuple[str, float | None]:
    """``(partition, alpha)`` of a label split named as the pages name them: ``"iid"``, or a Dirichlet α written as a
    positive number (``"1"``, ``"0.1"``)."""
    if split == "iid":
        return "iid", None
    try:
        alpha = float(split)
    except (TypeError, ValueError):
        alpha = None
    if not isinstance(split, str) or alpha is None or not math.isfinite(alpha) or alpha <= 0:
        raise ValueError(f"split={split!r} is not valid; accepted: 'iid' or a Dirichlet α written as a positive "
                         f"number, e.g. '1' or '0.1'")
    return "dirichlet", alpha


def split_name(split: str) -> str:
    """How a page names a label split (:func:`label_split`): ``"i.i.d"`` or ``"Dirichlet(α)"``."""
    label_split(split)
    return "i.i.d" if split == "iid" else f"Dirichlet({split})"


# ---- FedP3 chapter -------------------------------------------------------------------------------------------
FEDP3_SPLITS = {"S1": dict(partition="k_classes", classes_per_client=5),
                "S2": dict(partition="dirichlet_allocation", alpha=0.5),
                "iid": dict(partition="iid")}
"""Data splits of the FedP3 chapter (FedP3 Sec. 4.1-4.2 and App. B.2): ``S1`` class-wise, every client holds 5 classes;
``S2`` Dirichlet allocation with concentration 0.5 (per class, proportions over the clients ~ Dir(0.5); clients of
unequal size — the paper's S2, after FedCR, instead draws a class-preference vector per client and deals the samples
out without repetition, every client the same size in its Table 3); ``iid`` is not one of the paper's splits: it is
the book's reference for the full-model FedAvg bar."""

FEDP3_FIG2_SPLITS = ("S1", "S2")
"""The splits of FedP3's Fig. 2."""

FEDP3_FIG2_METHODS = ("fedavg", "lowerb", "opu2", "opu3")
"""Fig. 2's methods: full-model FedAvg and the layer-overlap variants LowerB / OPU2 / OPU3 (the FFC plus 1 / 2 / 3 other
layers, drawn per client and round; :mod:`subfl.methods.fedp3`)."""

FEDP3_LOCAL_TEST_FRACTION = 0.3
"""FedP3's personalised evaluation (Sec. 4.1; per-client sizes in App. B.1, Table 3): each client's data split 70/30
into local train and local test sets."""

FEDP3_MODELS = {"fmnist": "fedp3_cnn", "cifar10": "fedp3_cnn", "femnist": "fedp3_mlp"}
"""The network of each dataset: the CNN of FedP3's Table 4 on Fashion-MNIST and CIFAR-10; on FEMNIST (letters, case
merged: 26 classes, standing in for the paper's EMNIST-L) the paper's EMNIST-L MLP with 26 outputs,
784-1024-1024-1024-26 (Table 4's ends in 10: EMNIST-L has 10 labels)."""

FEDP3_NUM_CLASSES = {"fmnist": 10, "cifar10": 10, "femnist": 26}
"""Classes of each dataset as the FedP3 chapter loads it (FEMNIST: 26 case-merged letters)."""

FEDP3_PAPER_SETTINGS = {"fmnist": "fmnist-cnn", "cifar10": "cifar10-cnn", "femnist": "emnistl-mlp"}
"""The FedP3 register's setting (``book/claims/fedp3.yml``) of the experiment each of our datasets repeats
(FEMNIST's letters stand in for EMNIST-L): a scorecard row names its departures against it
(:meth:`subfl_book.scorecard.Scorecard.defaults`)."""


def fedp3_paper_setting(dataset: str) -> str:
    """:data:`FEDP3_PAPER_SETTINGS` of ``dataset``, with an error naming the datasets it has."""
    if dataset not in FEDP3_PAPER_SETTINGS:
        raise ValueError(f"dataset={dataset!r} has no FedP3 setting; accepted: {', '.join(FEDP3_PAPER_SETTINGS)}")
    return FEDP3_PAPER_SETTINGS[dataset]


_FEDP3_DATASET_OPTIONS = {"femnist": dict(letters_only=True, merge_case=True)}

# Fashion-MNIST at the cpu scale: the Fashion-MNIST preset (100 clients of 600 images, 10 per round, 2 local epochs,
# 30 rounds, SGD lr 0.02 with momentum 0.9, batch 32) with the Table 4 CNN at width 0.25 (16 channels, FC 256) and
# evaluation every 5 rounds (each evaluation scores the global test set and all 100 local test sets: 28,000 images).
# Probes of full-model FedAvg with the 70/30 local split, one torch thread, on a 2-core machine whose other core was busy
# (measured):
#   width 0.25, iid, 30 rounds: global accuracy 0.737 / 0.783 / 0.816 / 0.844 / 0.848 / 0.861 at rounds 5…30 (local
#     0.749 … 0.866); 96 s in all — 2.4 s of local training per round, 3.8 s per evaluation;
#   5 rounds, iid: width 0.25 → 0.737, 0.375 → 0.743, 0.5 → 0.747 global accuracy (1.7 / 4.9 / 3.7 s of local training per
#     round; the differences in time are mostly the other processes' load);
#   width 0.5, S1, 2 rounds: 6.4 s of local training per round, 8.6 s per evaluation (width 0.25: 3.4 s and 3.6 s);
#   width 0.25, 3 rounds: LowerB on S2 2.1 s of local training per round, OPU3 on S1 2.8 s.
# Width barely moves the accuracy at this scale while the cost roughly doubles from 0.25 to 0.5, so the chapter runs 0.25:
# about 1.5–2.5 min per run on one core.
_FEDP3_CPU = {"fmnist": dict(width=0.25, eval_every=5),
              "cifar10": dict(width=1.0, **{**_CIFAR10_CPU, "eval_every": 5}),
              "femnist": dict(width=1.0, num_clients=20, eval_every=5)}
# CIFAR-10 at the cpu scale: chapter 1's sizes (20 clients of 1 000 images, 10 per round, 2 local epochs, 40 rounds, cosine
# lr 0.02, weight decay 5e-4) with the Table 4 CNN at its full width 1.0 (64 channels, FC 1024). Full-model FedAvg on an
# iid split reaches 0.550 / 0.584 / 0.613 global test accuracy at width 0.25 / 0.5 / 1.0 (measured), and only width 1.0
# clears the book's 0.60 bar for CIFAR-10; a width-1.0 run takes about 9 minutes on two cores (width 0.25: about 5 min
# on one thread).
# FEMNIST at the cpu scale: the FEMNIST preset (10 clients per round, 2 local epochs, 40 rounds, lr 0.05 with momentum
# 0.9) with the MLP at full width and 20 clients instead of the preset's 105 writers: the 4,112 letter images split 105
# ways leave a client ~27 training images. 5-round probes of FedAvg (measured): S1 with 105 clients 0.075 global accuracy
# (1.0 s of local training per round), with 20 clients 0.119 (2.5 s per round); iid with 20 clients 0.252. About 2 min
# per run.


def fedp3_config(method: str, split: str = "S1", *, dataset: str = "fmnist", scale: str = "cpu", seed: int = 0,
                 lr: float | None = None, **method_options) -> ExperimentConfig:
    """One run of the FedP3 chapter: ``method`` (e.g. one of :data:`FEDP3_FIG2_METHODS`) on split ``split``
    (:data:`FEDP3_SPLITS`) of ``dataset`` (:data:`FEDP3_MODELS`), with FedP3's personalised evaluation
    (:data:`FEDP3_LOCAL_TEST_FRACTION`: the history gets ``local_accuracy`` beside the global ``accuracy``).
    ``method_options`` go to the method (e.g. ``global_keep=0.9``); none are set by default, so the FedP3 variants run
    without global or local pruning and with simple per-layer averaging. ``lr`` replaces the scale's learning rate.

    Sizes: the scale's preset for the dataset, then the chapter's cpu sizes (see the comments above). At the ``paper``
    scale the networks run at full width; at ``ci`` at the preset's width 0.25."""
    if split not in FEDP3_SPLITS:
        raise ValueError(f"split={split!r} is not valid; accepted: {', '.join(FEDP3_SPLITS)}")
    if dataset not in FEDP3_MODELS:
        raise ValueError(f"dataset={dataset!r} has no FedP3 setting; accepted: {', '.join(FEDP3_MODELS)}")
    sizes = dict(_FEDP3_CPU[dataset]) if scale == "cpu" else {}
    if lr is not None:
        sizes["lr"] = lr
    options = _FEDP3_DATASET_OPTIONS.get(dataset, {})
    return make_config(method, dataset, FEDP3_MODELS[dataset], scale=scale, seed=seed,
                       local_test_fraction=FEDP3_LOCAL_TEST_FRACTION, method_options=method_options,
                       dataset_options=options, **FEDP3_SPLITS[split], **sizes)


def fedp3_runs(split: str = "S1", *, methods: Sequence[str] = FEDP3_FIG2_METHODS, seeds: Sequence[int] = (0,),
               dataset: str = "fmnist", scale: str = "cpu", data_root: str | Path | None = None,
               **method_options) -> list[RunResult]:
    """Every ``method`` × ``seed`` of one FedP3-chapter split (:func:`fedp3_config`), run or read from the store.
    ``method_options`` go to every method except ``fedavg`` (the full-model reference takes none)."""
    return [r for m in methods for r in run_seeds(
        fedp3_config(m, split, dataset=dataset, scale=scale, **({} if m == "fedavg" else method_options)), seeds,
        data_root=data_root)]


def fedp3_model(config: ExperimentConfig) -> nn.Module:
    """The network of a FedP3-chapter run of ``config`` (freshly initialised), e.g. to count the layers of its uploads
    (:func:`subfl_book.analysis.upload_savings`)."""
    if config.dataset not in FEDP3_NUM_CLASSES:
        raise ValueError(f"config.dataset={config.dataset!r} has no FedP3 setting; accepted: "
                         f"{', '.join(FEDP3_NUM_CLASSES)}")
    from subfl.models import build_model
    from .analysis import IMAGE_SHAPES
    return build_model(config.model, num_classes=FEDP3_NUM_CLASSES[config.dataset],
                       input_shape=IMAGE_SHAPES[config.dataset], width=config.width, norm=config.norm,
                       **dict(config.model_options))


# ---- FedP3 ablations: global pruning (Fig. 4), local pruning (Table 2), aggregation (Fig. 5), LDP ------------------
FEDP3_ABLATION_METHOD = "opu2"
"""The FedP3 variant of the pruning ablations (Fig. 4, Table 2): OPU2, the FFC plus two layers drawn per client and
round. The paper does not say which overlap its pruning figures use; OPU2 is the middle of Fig. 2's three."""

FEDP3_GLOBAL_KEEPS = (1.0, 0.9, 0.7, 0.5)
"""Fig. 4's global pruning ratios P: the fraction of weights kept, server → client, in the layers a client does not
train (option ``global_keep`` of :class:`subfl.methods.fedp3.FedP3`; 1.0 = no pruning)."""

FEDP3_LOCAL_PRUNING = ("fixed", "uniform", "ordered_dropout")
"""Table 2's local pruning strategies (option ``local_pruning``)."""

FEDP3_TABLE2_KEEPS = (0.9, 0.7)
"""The two global pruning ratios of Table 2."""

FEDP3_AGGREGATIONS = ("simple", "weighted", "attention")
"""Fig. 5's aggregation strategies (option ``aggregation``; attention's parameterisation is the library's own)."""

FEDP3_FIG5_METHODS = ("opu123", "opu23")
"""Fig. 5's variants, in which clients train different numbers of layers (so "weighted" differs from "simple")."""

FEDP3_LDP_NOISE = (0.0, 0.6, 1.0, 1.5, 2.5)
"""Noise multipliers σ of the LDP-FedP3 privacy–utility curve (DP-SGD in local training, clip norm
:data:`FEDP3_LDP_CLIP`): larger σ, smaller ε. σ = 0 keeps DP-SGD's per-example clipping and Poisson batches without
noise (no privacy, ε = ∞): it separates what clipping costs from what the noise costs."""

FEDP3_LDP_CLIP = 1.0
"""Per-example gradient clip norm C of the LDP-FedP3 runs."""

FEDP3_LDP_DELTA = 1e-5
"""δ of the LDP-FedP3 runs' (ε, δ)."""


def fedp3_variant_config(split: str = "S2", *, method: str = FEDP3_ABLATION_METHOD, dataset: str = "fmnist",
                         scale: str = "cpu", seed: int = 0, **method_options) -> ExperimentConfig:
    """A FedP3 ablation run (:func:`fedp3_config`) with ``method_options`` such as ``global_keep``, ``local_pruning``,
    ``aggregation``. Options equal to the method's own defaults are left out of the config, so the ablations'
    baseline cells (P = 1, fixed, simple) are the very runs of Fig. 2: one stored run, not two."""
    from subfl.methods import METHODS

    defaults = METHODS[method].options
    options = {k: v for k, v in method_options.items() if not (k in defaults and v == defaults[k])}
    return fedp3_config(method, split, dataset=dataset, scale=scale, seed=seed, **options)


def fedp3_ablation_configs(kind: str, split: str = "S2", *, dataset: str = "fmnist", scale: str = "cpu",
                           seed: int = 0) -> list[ExperimentConfig]:
    """The runs of one FedP3 ablation for one seed: ``"global"`` (Fig. 4: :data:`FEDP3_GLOBAL_KEEPS`), ``"local"``
    (Table 2: :data:`FEDP3_LOCAL_PRUNING` × :data:`FEDP3_TABLE2_KEEPS`), ``"aggregation"`` (Fig. 5:
    :data:`FEDP3_FIG5_METHODS` × :data:`FEDP3_AGGREGATIONS`) or ``"ldp"`` (:data:`FEDP3_LDP_NOISE`, DP-SGD)."""
    common = dict(split=split, dataset=dataset, scale=scale, seed=seed)
    if kind == "global":
        return [fedp3_variant_config(global_keep=p, **common) for p in FEDP3_GLOBAL_KEEPS]
    if kind == "local":
        return [fedp3_variant_config(global_keep=p, local_pruning=s, **common)
                for p in FEDP3_TABLE2_KEEPS for s in FEDP3_LOCAL_PRUNING]
    if kind == "aggregation":
        return [fedp3_variant_config(method=m, aggregation=a, **common)
                for m in FEDP3_FIG5_METHODS for a in FEDP3_AGGREGATIONS]
    if kind == "ldp":
        return [fedp3_variant_config(ldp_mechanism="dpsgd", clip_norm=FEDP3_LDP_CLIP, noise_multiplier=s,
                                     delta=FEDP3_LDP_DELTA, **common) for s in FEDP3_LDP_NOISE]
    raise ValueError(f"kind={kind!r} is not valid; accepted: global, local, aggregation, ldp")


# ---- FedP3's ResNet-18 block ablation ---------------------------------------------------------------------------
FEDP3_BLOCK_ROWS: dict[str, tuple[str, ...]] = {
    "−B2−B3 full": ("layer2", "layer3"), "−B2 part": ("layer2.1",), "−B3 part": ("layer3.1",), "Full": ()}
"""FedP3's four ResNet-18 rows → the blocks our reading leaves out of the assignment pool (option ``excluded`` of
:class:`subfl.methods.fedp3_blocks.FedP3BlockAblation`; the definitions are ours, see that module)."""

FEDP3_BLOCK_PAPER = {"−B2−B3 full": 0.6568, "−B2 part": 0.7209, "−B3 part": 0.7347, "Full": 0.7325}
"""The paper's CIFAR-10 accuracies of the four rows (Sec. 4.2's ResNet-18 table, global pruning 0.9): Full 73.25 %,
−B2−B3 (full) 65.68 %, −B2 (part) 72.09 %, −B3 (part) 73.47 % (CIFAR-100: 63.33 / 58.26 / 61.11 / 62.39 %)."""

FEDP3_BLOCK_METHOD = "fedp3-blocks"
"""The method of the block ablation: FedP3 with block units, OPU2's k = 2 and P = 0.9 by default."""

FEDP3_BLOCK_NORM = "bn"
"""The block ablation's ResNet-18 keeps BatchNorm's running statistics (at every scale); they travel with their block,
so a block that is never trained keeps its initial ones. Batch statistics only ("bn_nostats") was tried first and
dropped: full-model FedAvg on S2 then sat at 0.143 global test accuracy after 25 rounds (at evaluation the batch
statistics follow each test batch's class mix, not what training saw), against 0.437 after 10 rounds with running
statistics and 0.286 with GroupNorm (10-round probes, measured). The class mix was the evaluation's fault: the
CIFAR-10 test file is sorted by class and was then scored in storage order, so every test batch held one class;
evaluation now scores batch-statistics models in shuffled batches (:func:`subfl.fl.training.evaluation_batches`),
and this page keeps running statistics."""

# ResNet-18 at the cpu scale: width 1/8 (8 → 64 channels, 176k parameters) and chapter 1's CIFAR-10 sizes (20 clients
# of 1,000 images, 10 per round, 2 local epochs, 40 rounds, cosine lr 0.02). A probe of "−B2−B3 full" took 72 s for two
# rounds and one evaluation on one thread of a shared 2-core machine: about 20 minutes per run.
_FEDP3_BLOCK_CPU = dict(width=0.125, **{**_CIFAR10_CPU, "eval_every": 5})


def fedp3_block_config(row: str, split: str = "S2", *, scale: str = "cpu", seed: int = 0,
                       method: str | None = None) -> ExperimentConfig:
    """One run of FedP3's ResNet-18 block ablation on CIFAR-10: ``row`` one of :data:`FEDP3_BLOCK_ROWS`, or
    ``method="fedavg"`` (``row`` ignored) for the full-model reference on the same network and split."""
    if method is None and row not in FEDP3_BLOCK_ROWS:
        raise ValueError(f"row={row!r} is not valid; accepted: {', '.join(FEDP3_BLOCK_ROWS)}")
    if split not in FEDP3_SPLITS:
        raise ValueError(f"split={split!r} is not valid; accepted: {', '.join(FEDP3_SPLITS)}")
    sizes = dict(_FEDP3_BLOCK_CPU) if scale == "cpu" else {}
    options = {} if method is not None else (
        {"excluded": list(FEDP3_BLOCK_ROWS[row])} if FEDP3_BLOCK_ROWS[row] else {})
    return make_config(method or FEDP3_BLOCK_METHOD, "cifar10", "resnet18", scale=scale, seed=seed,
                       norm=FEDP3_BLOCK_NORM, local_test_fraction=FEDP3_LOCAL_TEST_FRACTION, method_options=options,
                       **FEDP3_SPLITS[split], **sizes)
