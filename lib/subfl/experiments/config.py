"""Experiment configurations: one frozen dataclass, filled from a scale preset and explicit overrides.

A run is a pure function of its :class:`ExperimentConfig` (which includes the seed). ``scale`` picks a
preset (``ci``: seconds, for CI and nbval; ``cpu``: minutes on a 2-core laptop, what the book shows;
``paper``: the papers' own sizes, for a GPU). Presets change sizes, never the algorithm.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import numbers
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..fl.profiles import Heterogeneity, parse_heterogeneity
from ..fl.training import LR_SCHEDULES, OPTIMIZERS, LocalTraining
from .presets import DEFAULT_MODEL, SCALES, preset

DIRICHLET_PARTITIONS = ("dirichlet", "dirichlet_prior", "dirichlet_allocation", "dirichlet_groups", "pachinko")
"""Partitions that draw label proportions from a Dirichlet(``alpha``): they need ``alpha``, the others ignore it."""

UNRUNNABLE_PARTITIONS = ("pachinko",)
"""Partitions of :mod:`subfl.data.partition` the runner cannot use (pachinko needs coarse labels)."""


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
    train_eval_samples: int | None = None
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
        if key in out and isinstance(out[key], dict):  # sorted by name (str() only so a bad key sorts too)
            out[key] = tuple(sorted(out[key].items(), key=lambda item: str(item[0])))
    return out


class ConfigError(ValueError):
    """An invalid configuration: the message names the field (:attr:`field`), the value given and what is accepted.

    A ``ValueError``, so code that catches those keeps working."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class FieldRule:
    """The type and range of one config field: ``kind`` is ``"int"`` (an integer; ``bool`` refused, an integral float
    such as ``2.0`` taken as ``2``), ``"real"`` (a finite number, ``bool`` refused), ``"str"`` or ``"options"`` (a
    dict of option name → value); ``low`` / ``high`` bound it (``*_open``: the bound itself excluded)."""

    kind: str
    optional: bool = False
    low: float | None = None
    low_open: bool = False
    high: float | None = None
    high_open: bool = False

    def describe(self) -> str:
        """What is accepted, in words (``"an integer >= 1"``, ``"a finite number in [0, 1)"``)."""
        noun = {"int": "an integer", "real": "a finite number", "str": "a string",
                "options": "a dict of option name → value"}[self.kind]
        if self.low is not None and self.high is not None:
            noun += f" in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"
        elif self.low is not None:
            noun += f" {'>' if self.low_open else '>='} {self.low:g}"
        elif self.high is not None:
            noun += f" {'<' if self.high_open else '<='} {self.high:g}"
        return noun + (" or None" if self.optional else "")

    def admits(self, value: float) -> bool:
        if self.low is not None and not (value > self.low if self.low_open else value >= self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)


FIELD_RULES: dict[str, FieldRule] = {
    "method": FieldRule("str"), "dataset": FieldRule("str"), "model": FieldRule("str"), "partition": FieldRule("str"),
    "alpha": FieldRule("real", optional=True, low=0.0, low_open=True),
    "classes_per_client": FieldRule("int", optional=True, low=1),
    "num_clients": FieldRule("int", low=1),
    "clients_per_round": FieldRule("int", low=1),
    "rounds": FieldRule("int", low=1),
    "heterogeneity": FieldRule("str"),
    "width": FieldRule("real", low=0.0, low_open=True),
    "norm": FieldRule("str", optional=True),
    "optimizer": FieldRule("str"),
    "lr": FieldRule("real", low=0.0, low_open=True),
    "momentum": FieldRule("real", low=0.0, high=1.0, high_open=True),
    "weight_decay": FieldRule("real", low=0.0),
    "local_epochs": FieldRule("int", low=1),
    "local_steps": FieldRule("int", optional=True, low=1),
    "batch_size": FieldRule("int", low=1),
    "lr_schedule": FieldRule("str"),
    "lr_min": FieldRule("real", low=0.0),
    "grad_clip": FieldRule("real", optional=True, low=0.0, low_open=True),
    "eval_every": FieldRule("int", low=1),
    "max_train_samples": FieldRule("int", optional=True, low=1),
    "max_test_samples": FieldRule("int", optional=True, low=1),
    "local_test_fraction": FieldRule("real", low=0.0, high=1.0, high_open=True),
    "train_eval_samples": FieldRule("int", optional=True, low=1),
    "seed": FieldRule("int", low=0),
    "scale": FieldRule("str"),
    "device": FieldRule("str"),
    "method_options": FieldRule("options"),
    "dataset_options": FieldRule("options"),
    "model_options": FieldRule("options"),
}
"""The type and range of every :class:`ExperimentConfig` field (a test checks that every field has one)."""

DEVICE_TYPES = ("cpu", "cuda", "mps")
"""Device types a run accepts (``"cuda:1"`` names one GPU)."""

_FIELD_HINTS = {
    "alpha": " (the Dirichlet concentration)", "width": " (1.0 = the paper's width)",
    "local_test_fraction": " (the share of each client's data held out as its local test set; 0: none)",
    "train_eval_samples": " (training samples the global model is also scored on at every evaluation; None: none)",
    "heterogeneity": "", "grad_clip": " (the gradient-norm clip; None: no clipping)",
}


class ConfigWarning(UserWarning):
    """A setting the run ignores (:func:`ignored_settings`): ``subfl run`` refuses it, the Python API warns."""


def ignored_settings(cfg: ExperimentConfig, setting: Heterogeneity | None = None) -> list[tuple[str, str]]:
    """``(field, message)`` for each field ``cfg`` sets that its run ignores, beyond those :func:`validate_config`
    refuses: keep ratios below 1 for a method that does not use them (``Method.uses_keep_ratios`` false, e.g.
    ``fedavg``, which trains the full model on every client; the engine hands the profiles only to the method). The
    API only warns (:class:`ConfigWarning`): the golden runs set one on purpose, to show that FedAvg's run does not
    depend on it; ``subfl run`` refuses them."""
    from ..methods import METHODS

    setting = parse_heterogeneity(cfg.heterogeneity) if setting is None else setting
    out = []
    method = METHODS.get(cfg.method)
    if method is not None and not method.uses_keep_ratios and any(level != 1.0 for level in setting.levels):
        out.append(("heterogeneity", f"heterogeneity={cfg.heterogeneity!r} does not apply to method {cfg.method!r}, "
                                     f"which trains the full model on every client and ignores keep ratios; accepted: "
                                     f"'1.0' (or a sub-model method)"))
    return out


def _bad(name: str, value: Any, accepted: str) -> ConfigError:
    return ConfigError(f"{name}={value!r} is not valid; accepted: {accepted}", name)


def _check_type(cfg: ExperimentConfig, name: str, rule: FieldRule) -> None:
    """Check one field's type and range; an integral float in an int field becomes that int."""
    value = getattr(cfg, name)
    if value is None:
        if rule.optional:
            return
        raise _bad(name, value, rule.describe() + _FIELD_HINTS.get(name, ""))
    if rule.kind == "str":
        if not isinstance(value, str):
            raise _bad(name, value, rule.describe())
        return
    if rule.kind == "options":
        ok = isinstance(value, tuple) and all(isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                                              for item in value)
        if not ok or len({k for k, _ in value}) != len(value):
            raise _bad(name, value, rule.describe())
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise _bad(name, value, rule.describe() + _FIELD_HINTS.get(name, ""))
    try:
        number = value if isinstance(value, numbers.Integral) and rule.kind == "int" else float(value)
    except OverflowError:  # an int too large for a float field
        raise _bad(name, value, rule.describe() + _FIELD_HINTS.get(name, "")) from None
    if not isinstance(number, numbers.Integral) and not math.isfinite(number):
        raise _bad(name, value, rule.describe() + _FIELD_HINTS.get(name, ""))
    if rule.kind == "int" and not isinstance(value, numbers.Integral):
        if number != int(number):
            raise _bad(name, value, rule.describe())
        object.__setattr__(cfg, name, int(number))  # 2.0 → 2 (a --set value read as JSON)
    if not rule.admits(number):
        raise _bad(name, value, rule.describe() + _FIELD_HINTS.get(name, ""))


def _nan_in(value: Any, path: str) -> str | None:
    """The path of the first NaN inside an option value (dicts, lists, tuples), or None."""
    if isinstance(value, float) and math.isnan(value):
        return path
    if isinstance(value, Mapping):
        items: Any = ((f"{path}[{k!r}]", v) for k, v in value.items())
    elif isinstance(value, (list, tuple)):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for sub, v in items:
        found = _nan_in(v, sub)
        if found:
            return found
    return None


def check_device(device: str) -> str:
    """``device`` after checking it names a device type torch knows (:data:`DEVICE_TYPES`, ``"cuda:1"`` included);
    whether this machine has it is checked when a run starts (:func:`~subfl.experiments.runner.run_experiment`)."""
    import torch

    accepted = "'cpu', 'cuda', 'cuda:N' (one GPU) or 'mps'"
    if not isinstance(device, str):
        raise _bad("device", device, accepted)
    try:
        kind = torch.device(device).type
    except (RuntimeError, ValueError, TypeError):
        raise _bad("device", device, accepted) from None
    if kind not in DEVICE_TYPES:
        raise _bad("device", device, accepted)
    return device


def validate_config(cfg: ExperimentConfig) -> None:
    """Raise :class:`ConfigError` (a ``ValueError``) naming the first invalid field, its value and what is accepted.

    Checked, without loading any data: every field's type and range (:data:`FIELD_RULES`); the names of the method,
    dataset, model, partition, scale, optimiser, schedule, normalisation and device; fields that do not apply to the
    rest of the configuration (``alpha`` or ``classes_per_client`` with a partition that ignores it, ``lr_min``
    without the cosine schedule, ``momentum`` with Adam, ``local_epochs`` beside ``local_steps``; keep ratios below 1
    for FedAvg only warn, :func:`ignored_settings`); the method's options (by building the method: each
    method checks its own), the dataset's and the model's option names, and no NaN in any option.
    """
    from ..data import DATASETS, PARTITIONS
    from ..data.datasets import dataset_options
    from ..methods import METHODS, make_method
    from ..models import MODELS, model_spec
    from ..models.norm import NORMS

    def bad(name: str, accepted: str) -> ConfigError:
        return _bad(name, getattr(cfg, name), accepted)

    for name, rule in FIELD_RULES.items():
        _check_type(cfg, name, rule)

    # ---- names ----
    if cfg.method not in METHODS:
        raise bad("method", ", ".join(sorted(METHODS)))
    if cfg.dataset not in DATASETS:
        raise bad("dataset", ", ".join(DATASETS))
    if cfg.model not in MODELS:
        raise bad("model", ", ".join(MODELS))
    runnable = tuple(p for p in PARTITIONS if p not in UNRUNNABLE_PARTITIONS)
    if cfg.partition not in runnable:
        extra = "; 'pachinko' needs coarse labels, which no dataset of the runner provides" \
            if cfg.partition in UNRUNNABLE_PARTITIONS else ""
        raise bad("partition", ", ".join(runnable) + extra)
    if cfg.scale not in SCALES:
        raise bad("scale", ", ".join(SCALES))
    if cfg.optimizer not in OPTIMIZERS:
        raise bad("optimizer", ", ".join(OPTIMIZERS))
    if cfg.lr_schedule not in LR_SCHEDULES:
        raise bad("lr_schedule", ", ".join(LR_SCHEDULES))
    if cfg.norm is not None and cfg.norm not in NORMS:
        raise bad("norm", ", ".join(NORMS) + " or None (the model's default)")
    check_device(cfg.device)

    # ---- the partition and what it uses ----
    if cfg.partition in DIRICHLET_PARTITIONS and cfg.alpha is None:
        raise bad("alpha", f"a positive number (required by partition={cfg.partition!r})")
    if cfg.alpha is not None and cfg.partition not in DIRICHLET_PARTITIONS:
        raise ConfigError(f"alpha={cfg.alpha!r} does not apply to partition={cfg.partition!r}, which ignores it; "
                          f"accepted: alpha=None, or a partition that uses it ({', '.join(DIRICHLET_PARTITIONS[:3])})",
                          "alpha")
    if cfg.partition == "k_classes" and cfg.classes_per_client is None:
        raise bad("classes_per_client", "a positive integer (required by partition='k_classes')")
    if cfg.classes_per_client is not None and cfg.partition != "k_classes":
        raise ConfigError(f"classes_per_client={cfg.classes_per_client!r} does not apply to partition="
                          f"{cfg.partition!r}, which ignores it; accepted: None, or partition='k_classes'",
                          "classes_per_client")
    if cfg.clients_per_round > cfg.num_clients:
        raise bad("clients_per_round", f"an integer in [1, num_clients={cfg.num_clients}]")

    # ---- local training ----
    if cfg.lr_schedule != "cosine" and cfg.lr_min != 0:
        raise ConfigError(f"lr_min={cfg.lr_min!r} does not apply to lr_schedule={cfg.lr_schedule!r}, which ignores "
                          f"it; accepted: lr_min=0, or lr_schedule='cosine' (annealed from lr to lr_min)", "lr_min")
    if cfg.lr_min > cfg.lr:
        raise bad("lr_min", f"a number in [0, lr={cfg.lr!r}] (the cosine schedule anneals from lr down to lr_min)")
    if cfg.optimizer != "sgd" and cfg.momentum != 0:
        raise ConfigError(f"momentum={cfg.momentum!r} does not apply to optimizer={cfg.optimizer!r}, which ignores "
                          f"it; accepted: momentum=0, or optimizer='sgd'", "momentum")
    if cfg.local_steps is not None and cfg.local_epochs != 1:
        raise ConfigError(f"local_epochs={cfg.local_epochs!r} does not apply when local_steps={cfg.local_steps!r} is "
                          f"set (a client trains local_steps mini-batches); accepted: local_epochs=1 with local_steps, "
                          f"or local_steps=None", "local_epochs")

    # ---- heterogeneity ----
    try:
        setting = parse_heterogeneity(cfg.heterogeneity)
    except ValueError as err:
        raise ConfigError(f"heterogeneity={cfg.heterogeneity!r} is not valid: {err}", "heterogeneity") from None
    if cfg.partition == "dirichlet_groups" and (setting.dynamic or setting.is_homogeneous):
        raise ConfigError(f"partition='dirichlet_groups' follows the clients' keep-ratio groups, which "
                          f"heterogeneity={cfg.heterogeneity!r} does not fix; accepted: a static mix of two or more "
                          f"levels (e.g. '0.5:0.5,1.0:0.5'), or another partition", "partition")
    for _, message in ignored_settings(cfg, setting):
        warnings.warn(message, ConfigWarning, stacklevel=2)

    # ---- options ----
    for name in ("method_options", "dataset_options", "model_options"):
        for key, value in getattr(cfg, name):
            found = _nan_in(value, key)
            if found:
                raise ConfigError(f"{name}: {found}=nan is not valid; accepted: a number (NaN never is)", name)
    accepted = dataset_options(cfg.dataset)
    unknown = sorted(k for k, _ in cfg.dataset_options if k not in accepted)
    if unknown:
        raise ConfigError(f"dataset_options: unknown option(s) {unknown} for dataset {cfg.dataset!r}; accepted: "
                          f"{', '.join(sorted(accepted)) or 'none'}", "dataset_options")
    for key, value in cfg.dataset_options:
        if value is not None and not isinstance(value, (bool, int, float, str)):
            raise ConfigError(f"dataset_options: {key}={value!r} is not valid; accepted: a number, string, true/false "
                              f"or null", "dataset_options")
    spec = model_spec(cfg.model)
    unknown = sorted(k for k, _ in cfg.model_options if k not in spec.options)
    if unknown:
        raise ConfigError(f"model_options: unknown option(s) {unknown} for model {cfg.model!r}; accepted: "
                          f"{', '.join(spec.options) or 'none'}", "model_options")
    method_options = dict(cfg.method_options)
    if "devices" in METHODS[cfg.method].options:
        from ..methods.finetuning_common import check_devices

        try:
            check_devices(method_options.get("devices"))
        except (ValueError, TypeError) as err:
            raise ConfigError(f"method_options of method {cfg.method!r}: {err}", "method_options") from None
    try:
        make_method(cfg.method, **method_options)  # every method checks its own options when built
    except (ValueError, TypeError) as err:
        raise ConfigError(f"method_options of method {cfg.method!r}: {err}", "method_options") from None
    try:
        cfg.training  # the optimiser settings, as the clients receive them
    except ValueError as err:
        raise ConfigError(str(err)) from None


def make_config(method: str = "fedavg", dataset: str = "fmnist", model: str | None = None,
                partition: str = "iid", *, scale: str = "cpu", seed: int = 0, **overrides: Any) -> ExperimentConfig:
    """A config from the ``scale`` preset for ``dataset``/``model``, then ``overrides`` (field=value).

    >>> make_config("fedavg", "fmnist", partition="dirichlet", alpha=0.1, scale="ci").rounds
    2
    """
    for name, value in (("method", method), ("dataset", dataset), ("partition", partition), ("scale", scale)):
        if not isinstance(value, str):
            raise _bad(name, value, "a string (see `subfl list`)")
    if model is not None and not isinstance(model, str):
        raise _bad("model", model, "a string (see `subfl list`) or None (the dataset's usual model)")
    if scale not in SCALES:
        raise ConfigError(f"scale={scale!r} is not valid; accepted: {', '.join(SCALES)}", "scale")
    unknown = sorted(set(overrides) - set(FIELDS))
    if unknown:
        raise ConfigError(f"unknown config field(s) {unknown}; accepted: {', '.join(FIELDS)}", unknown[0])
    if model is None:
        model = DEFAULT_MODEL.get(dataset, "mlp")
    values: dict[str, Any] = {"method": method, "dataset": dataset, "model": model, "partition": partition,
                              "scale": scale, "seed": seed}
    values.update(preset(scale, dataset, model))
    values.update(overrides)
    return ExperimentConfig(**_normalise_options(values))
