"""Named experiments shared by several chapters (so two notebooks never drift apart on one setting)."""
from __future__ import annotations

from .config import ExperimentConfig, make_config

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
