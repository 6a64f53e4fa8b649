"""PriSM's centralised experiment (Fig. 4): one learner trains VGG-11 on CIFAR-10 through sub-models only.

PriSM (Niu et al., TMLR 2023, Fig. 4) motivates sampling in the orthogonal space before any federated experiment:
a single learner trains VGG-11 on CIFAR-10, but every update goes through a sub-model that keeps a fraction ``r``
of each layer — OrigDrop (the leading ``r`` of the original channels), OrthDrop (the top ``r`` of the SVD terms)
or PriSM (``r`` of the terms drawn with ``p ∝ λ^κ``) — and the full model is evaluated. The authors' released
script re-draws the sub-model once per epoch. The book runs it on the engine: **one client holding the whole
training set, one round = one epoch**, so that the sub-model is re-drawn (and the layers re-decomposed) every epoch
by exactly the code of the federated chapters (:func:`centralised_config`).

Choices, departing from the paper's Sec. 4.1 (SGD, batch 128, weight decay 10⁻⁴, 150 epochs, a new sub-model
every iteration): SGD lr 0.05 with momentum 0.9, weight decay 5 · 10⁻⁴, cosine schedule over
the run, mini-batch 64, no augmentation; every method — full-model training included — uses BatchNorm with batch
statistics (``norm="bn_nostats"``, PriSM's static batch norm), so the four rows differ only in the sub-model.

Sizes per scale (:data:`CENTRALISED_SIZES`): ``ci`` seconds; ``cpu`` VGG-11 at width 0.25 (16 → 128 channels,
0.6 M parameters) on the 20,000 training images for 20 epochs, scored on all 10,000 test images every 5 epochs;
``paper`` full width, 200 epochs.
"""
from __future__ import annotations

from types import MappingProxyType

from subfl.experiments.config import ExperimentConfig, make_config

CENTRALISED_METHODS = ("origdrop", "topn", "prism")
"""The sub-model methods of Fig. 4: OrigDrop, OrthDrop (``topn``) and PriSM; ``fedavg`` is the full-model row."""

CENTRALISED_KEEPS = ("0.1", "0.2", "0.4", "0.6")
"""The keep ratios ``r`` of the sub-models."""

CENTRALISED_TRAINING = MappingProxyType(dict(
    optimizer="sgd", lr=0.05, momentum=0.9, weight_decay=5e-4, lr_schedule="cosine", batch_size=64,
    norm="bn_nostats", num_clients=1, clients_per_round=1, partition="iid", local_epochs=1, local_steps=None))
"""Training of every row at every scale: one client, one epoch per round, the sub-model re-drawn each round."""

CENTRALISED_SIZES = MappingProxyType({
    "ci": MappingProxyType(dict(width=0.125, rounds=2, eval_every=1, max_train_samples=256, max_test_samples=128)),
    "cpu": MappingProxyType(dict(width=0.25, rounds=20, eval_every=5, max_train_samples=None, max_test_samples=None)),
    "paper": MappingProxyType(dict(width=1.0, rounds=200, eval_every=10, max_train_samples=None,
                                   max_test_samples=None, device="cuda")),
})
"""Sizes of the centralised setting per scale."""


def centralised_config(method: str, keep: str = "0.2", *, scale: str = "cpu", seed: int = 0,
                       **overrides) -> ExperimentConfig:
    """The centralised VGG-11 run of ``method`` (one of :data:`CENTRALISED_METHODS`, or ``"fedavg"`` for the full
    model, whose ``keep`` is ignored) training sub-models of keep ratio ``keep``. ``overrides``: any config field,
    applied last."""
    if scale not in CENTRALISED_SIZES:
        raise ValueError(f"scale={scale!r} is not valid; accepted: {', '.join(CENTRALISED_SIZES)}")
    if method != "fedavg" and method not in CENTRALISED_METHODS:
        raise ValueError(f"method={method!r} is not valid; accepted: fedavg, {', '.join(CENTRALISED_METHODS)}")
    if method != "fedavg" and keep not in CENTRALISED_KEEPS:
        raise ValueError(f"keep={keep!r} is not valid; accepted: {', '.join(CENTRALISED_KEEPS)}")
    fields = {**CENTRALISED_TRAINING, **CENTRALISED_SIZES[scale],
              "heterogeneity": "1.0" if method == "fedavg" else keep, **overrides}
    return make_config(method, "cifar10", model="vgg11", scale=scale, seed=seed, **fields)


def centralised_configs(*, scale: str = "cpu", seed: int = 0) -> list[ExperimentConfig]:
    """Every run of Fig. 4 for one seed: the full model, then each method at each keep ratio."""
    return [centralised_config("fedavg", scale=scale, seed=seed)] + [
        centralised_config(m, k, scale=scale, seed=seed) for m in CENTRALISED_METHODS for k in CENTRALISED_KEEPS]


__all__ = ["CENTRALISED_KEEPS", "CENTRALISED_METHODS", "CENTRALISED_SIZES", "CENTRALISED_TRAINING",
           "centralised_config", "centralised_configs"]
