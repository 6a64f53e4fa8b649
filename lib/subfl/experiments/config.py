"""Experiment configurations: one frozen dataclass, filled from a scale preset and explicit overrides.

A run is a pure function of its :class:`ExperimentConfig` (which includes the seed). ``scale`` picks a
preset (``ci``: seconds, for CI and nbval; ``cpu``: minutes on a 2-core laptop, what the book shows;
``paper``: the papers' own sizes, for a GPU). Presets change sizes, never the algorithm.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from ..fl.profiles import Heterogeneity, parse_heterogeneity
from ..fl.training import LR_SCHEDULES, OPTIMIZERS, LocalTraining
from .presets import DEFAULT_MODEL, SCALES, preset

DIRICHLET_PARTITIONS = ("dirichlet", "dirichlet_prior", "dirichlet_allocation", "pachinko")


@dataclass(frozen=True)
class ExperimentConfig:
    """Everything that determines a run. Build one with :func:`make_config`."""

    method: str = "fedavg"
    dataset: str = "fmnist"
    model: str = "cnn"
    partition: str = "iid"
    alpha: float | None = None
    classes_per_client: int | None = None
    num_clients: int = 10
    clients_per_round: int = 10
    rounds: int = 10
    heterogeneity: str = "1.0"
    width: float = 1.0
    norm: str | None = None
    optimizer: str = "sgd"
    lr: float = 0.05
    momentum: float = 0.0
    weight_decay: float = 0.0
    local_epochs: int = 1
    local_steps: int | None = None
    batch_size: int = 32
    lr_schedule: str = "constant"
    lr_min: float = 0.0
    grad_clip: float | None = None
    eval_every: int = 1
    max_train_samples: int | None = None
    max_test_samples: int | None = None
    local_test_fraction: float = 0.0
    seed: int = 0
    scale: str = "cpu"
    device: str = "cpu"
    method_options: tuple[tuple[str, Any], ...] = ()
    dataset_options: tuple[tuple[str, Any], ...] = ()
    model_options: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        validate_config(self)

    # ---- derived views ----------------------------------------------------------------------------
    @property
    def training(self) -> LocalTraining:
        return LocalTraining(optimizer=self.optimizer, lr=self.lr, momentum=self.momentum,
                             weight_decay=self.weight_decay, local_epochs=self.local_epochs,
                             local_steps=self.local_steps, batch_size=self.batch_size,
                             lr_schedule=self.lr_schedule, lr_min=self.lr_min, grad_clip=self.grad_clip)

    @property
    def heterogeneity_setting(self) -> Heterogeneity:
        return parse_heterogeneity(self.heterogeneity)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for key in ("method_options", "dataset_options", "model_options"):
            d[key] = {k: v for k, v in getattr(self, key)}
        return d

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "ExperimentConfig":
        """The config :meth:`to_dict` (or its JSON) describes; ``TypeError`` names a field that is not known."""
        return cls(**_normalise_options(values))

    def key(self) -> str:
        """A hash of every field, ``scale`` included (a run's identity is :func:`~subfl.experiments.provenance.run_key`)."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True, default=str).encode()).hexdigest()

    def replace(self, **changes: Any) -> "ExperimentConfig":
        """A copy with some fields changed (``method_options`` etc. accept dicts)."""
        return dataclasses.replace(self, **_normalise_options(changes))

    def label(self) -> str:
        bits = [self.method, self.dataset, self.model, self.partition]
        if self.alpha is not None:
            bits.append(f"a{self.alpha:g}")
        return "-".join(bits) + f"-s{self.seed}"


FIELDS = tuple(f.name for f in dataclasses.fields(ExperimentConfig))


def _normalise_options(values: dict[str, Any]) -> dict[str, Any]:
    out = dict(values)
    for key in ("method_options", "dataset_options", "model_options"):
        if key in out and isinstance(out[key], dict):
            out[key] = tuple(sorted(out[key].items()))
    return out


def validate_config(cfg: ExperimentConfig) -> None:
    """Raise ``ValueError`` naming the first invalid field, its value and what is accepted."""
    from ..data import DATASETS, PARTITIONS
    from ..methods import METHODS
    from ..models import MODELS

    def bad(name: str, accepted: str) -> ValueError:
        return ValueError(f"{name}={getattr(cfg, name)!r} is not valid; accepted: {accepted}")

    if cfg.method not in METHODS:
        raise bad("method", ", ".join(sorted(METHODS)))
    if cfg.dataset not in DATASETS:
        raise bad("dataset", ", ".join(DATASETS))
    if cfg.model not in MODELS:
        raise bad("model", ", ".join(MODELS))
    if cfg.partition not in PARTITIONS:
        raise bad("partition", ", ".join(PARTITIONS))
    if cfg.scale not in SCALES:
        raise bad("scale", ", ".join(SCALES))
    if cfg.partition in DIRICHLET_PARTITIONS and (cfg.alpha is None or not cfg.alpha > 0):
        raise bad("alpha", f"a positive number (required by partition={cfg.partition!r})")
    if cfg.alpha is not None and not cfg.alpha > 0:
        raise bad("alpha", "a positive number or None")
    if cfg.partition == "k_classes" and (cfg.classes_per_client is None or cfg.classes_per_client < 1):
        raise bad("classes_per_client", "a positive integer (required by partition='k_classes')")
    if cfg.num_clients < 1:
        raise bad("num_clients", "an integer >= 1")
    if not 1 <= cfg.clients_per_round <= cfg.num_clients:
        raise bad("clients_per_round", f"an integer in [1, num_clients={cfg.num_clients}]")
    if cfg.rounds < 1:
        raise bad("rounds", "an integer >= 1")
    if cfg.eval_every < 1:
        raise bad("eval_every", "an integer >= 1")
    if not cfg.width > 0:
        raise bad("width", "a positive number (1.0 = the paper's width)")
    if cfg.optimizer not in OPTIMIZERS:
        raise bad("optimizer", ", ".join(OPTIMIZERS))
    if cfg.lr_schedule not in LR_SCHEDULES:
        raise bad("lr_schedule", ", ".join(LR_SCHEDULES))
    for name in ("max_train_samples", "max_test_samples"):
        value = getattr(cfg, name)
        if value is not None and value < 1:
            raise bad(name, "a positive integer or None")
    if isinstance(cfg.local_test_fraction, bool) or not isinstance(cfg.local_test_fraction, (int, float)) \
            or not 0.0 <= cfg.local_test_fraction < 1.0:
        raise bad("local_test_fraction", "a number in [0, 1): the share of each client's data held out as its "
                                         "local test set (0: none)")
    if cfg.seed < 0:
        raise bad("seed", "a non-negative integer")
    try:
        parse_heterogeneity(cfg.heterogeneity)
    except ValueError as err:
        raise ValueError(f"heterogeneity={cfg.heterogeneity!r} is not valid: {err}") from None
    cfg.training  # validates optimiser settings


def make_config(method: str = "fedavg", dataset: str = "fmnist", model: str | None = None,
                partition: str = "iid", *, scale: str = "cpu", seed: int = 0, **overrides: Any) -> ExperimentConfig:
    """A config from the ``scale`` preset for ``dataset``/``model``, then ``overrides`` (field=value).

    >>> make_config("fedavg", "fmnist", partition="dirichlet", alpha=0.1, scale="ci").rounds
    2
    """
    if scale not in SCALES:
        raise ValueError(f"scale={scale!r} is not valid; accepted: {', '.join(SCALES)}")
    unknown = sorted(set(overrides) - set(FIELDS))
    if unknown:
        raise ValueError(f"unknown config field(s) {unknown}; accepted: {', '.join(FIELDS)}")
    if model is None:
        model = DEFAULT_MODEL.get(dataset, "mlp")
    values: dict[str, Any] = {"method": method, "dataset": dataset, "model": model, "partition": partition,
                              "scale": scale, "seed": seed}
    values.update(preset(scale, dataset, model))
    values.update(overrides)
    return ExperimentConfig(**_normalise_options(values))
