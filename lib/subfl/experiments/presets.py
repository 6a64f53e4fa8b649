"""Scale presets: sizes per (scale, dataset, model). They change sizes, never the algorithm.

* ``ci`` — seconds: a few clients, two rounds, a few hundred samples, narrow models. For CI and nbval.
* ``cpu`` — minutes on 2 cores; what the book shows. Chosen so that the reference (full-model FedAvg)
  reaches a meaningful accuracy (Fashion-MNIST ≥ 85 %, CIFAR-10 ≥ 60 %): the model is narrowed, not the
  learning. Learning rate 0.02 with momentum 0.9: at 0.05 FedAvg diverged (NaN loss, Fashion-MNIST) or
  collapsed to chance (CIFAR-10) on Dirichlet(0.1) splits for some seeds.
* ``paper`` — the papers' own sizes (100 clients, full width, hundreds of rounds): for a GPU.
"""
from __future__ import annotations

import os
from typing import Any

SCALES = ("ci", "cpu", "paper")

DEFAULT_MODEL = {"fmnist": "cnn", "femnist": "cnn", "cifar10": "resnet18", "digits": "mlp"}

_COMMON: dict[str, dict[str, Any]] = {
    "ci": dict(num_clients=4, clients_per_round=2, rounds=2, max_train_samples=400, max_test_samples=200,
               width=0.25, batch_size=32, local_epochs=1, eval_every=1),
    "cpu": dict(num_clients=20, clients_per_round=10, rounds=20, batch_size=32, local_epochs=1),
    "paper": dict(num_clients=100, clients_per_round=10, rounds=200, width=1.0, batch_size=64, local_epochs=2),
}

_DATASET: dict[tuple[str, str], dict[str, Any]] = {
    ("ci", "digits"): dict(width=1.0, max_train_samples=None, max_test_samples=None, lr=0.1),
    ("cpu", "digits"): dict(num_clients=10, clients_per_round=5, rounds=20, lr=0.1),
    ("cpu", "fmnist"): dict(num_clients=100, clients_per_round=10, rounds=30, local_epochs=2, lr=0.02,
                            momentum=0.9, width=0.5),
    ("paper", "fmnist"): dict(lr=0.05, momentum=0.9),
    ("cpu", "femnist"): dict(num_clients=105, clients_per_round=10, rounds=40, local_epochs=2, lr=0.05,
                             momentum=0.9, width=0.5),
    ("cpu", "cifar10"): dict(num_clients=20, clients_per_round=10, rounds=30, local_epochs=2, lr=0.02,
                             momentum=0.9, weight_decay=5e-4, width=0.25, lr_schedule="cosine", eval_every=2),
    ("paper", "cifar10"): dict(lr=0.1, momentum=0.9, weight_decay=5e-4, rounds=500, lr_schedule="cosine"),
}


def preset(scale: str, dataset: str, model: str | None = None) -> dict[str, Any]:
    """The field values of ``scale`` for ``dataset`` (common values, then dataset-specific ones)."""
    if scale not in SCALES:
        raise ValueError(f"scale={scale!r} is not valid; accepted: {', '.join(SCALES)}")
    values = dict(_COMMON[scale])
    values.update(_DATASET.get((scale, dataset), {}))
    return values


def default_scale() -> str:
    """``$SUBFL_SCALE`` if set (CI sets ``ci``), else ``cpu`` — the scale notebooks use when given none."""
    scale = os.environ.get("SUBFL_SCALE", "cpu")
    if scale not in SCALES:
        raise ValueError(f"SUBFL_SCALE={scale!r} is not valid; accepted: {', '.join(SCALES)}")
    return scale
