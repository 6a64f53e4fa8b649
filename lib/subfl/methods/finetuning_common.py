"""What the finetuning methods of CAFF's paper share (Pfeiffer, Ahmed, Khalili & Henkel, "Efficient Federated
Finetuning of Tiny Transformers with Resource-Constrained Devices"): CAFF itself (:mod:`subfl.methods.caff`) and
its baselines HetLoRA (:mod:`subfl.methods.hetlora`), FedHM (:mod:`subfl.methods.fedhm`) and DepthFL
(:mod:`subfl.methods.depthfl`).

* **Budgets.** A device has three budgets (:class:`DeviceBudget`): peak training memory (MB), upload per round
  (MB) and compute per mini-batch (GFLOPs). :func:`resolve_budget` takes, per constraint, the first that is set
  of: the :class:`~subfl.fl.types.ClientProfile`'s own field; the declared device of the same id (option
  ``devices`` / ``ServerContext.devices``, :func:`declared_population`); the group's entry of option
  ``budgets``; else unconstrained.
* **Choosing a configuration.** Every method has a resource table — one row per configuration it can give a
  device (CAFF: ``t`` trained layers, HetLoRA: a LoRA rank, FedHM: a rank ratio) with columns ``memory_mb``,
  ``upload_mb``, ``gflops`` — and gives each device the largest configuration that fits all three budgets
  (:func:`largest_fitting`; a cost equal to the budget fits). :func:`exceeded` words why a row does not fit.
* **Pretrained weights** (option ``pretrained``, else ``ServerContext.pretrained``; :func:`pretrained_source`,
  :func:`pretrained_state`): a mapping ``{l: state_dict}``, a pretraining scale ``"ci"`` / ``"cpu"`` / ``"paper"``
  (:func:`subfl.pretraining.pretrain`), or ``"none"``.
* **Measurement inputs**: a mini-batch of ``training.batch_size`` samples of the task's input shape
  (:func:`measurement_batch`) and the configured optimiser's state (:func:`optimizer_state`).
* **Local training** (:func:`train_transformer`): a language model is trained with the next-token loss over every
  position of a window (:func:`~subfl.models.transformers.causal_lm_loss`), a ViT with cross-entropy; a method may
  pass its own loss of ``(output, inputs, targets)`` (DepthFL's exits and self-distillation).
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
from torch import nn

from ..fl.method import ClientContext, Method, ServerContext
from ..fl.training import ClientDataset, train_epochs
from ..fl.types import ClientProfile
from ..models.transformers import causal_lm_loss, load_pretrained, transformer_blocks
from ..pretraining import PRETRAINING_VERSION

CONSTRAINTS: tuple[str, ...] = ("memory", "upload", "compute")
"""The three resource constraints of CAFF, in the order they are reported."""

CONSTRAINT_COLUMNS: dict[str, str] = {"memory": "memory_mb", "upload": "upload_mb", "compute": "gflops"}
"""Resource-table column (and budget field) of each constraint."""

UNITS: dict[str, str] = {"memory": "MB", "upload": "MB", "compute": "GFLOPs"}
"""Unit of each constraint in messages."""

_CONSTRAINT_OF = {column: constraint for constraint, column in CONSTRAINT_COLUMNS.items()}

PRETRAINING_SCALES: tuple[str, ...] = ("ci", "cpu", "paper")
"""Scale names accepted as a pretrained-weights source (besides a mapping and ``"none"``)."""


class FinetuningMethod(Method):
    """Base of the methods that finetune pretrained weights: a run whose option ``pretrained`` names a pretraining
    scale executes :mod:`subfl.pretraining` too, so its versions include :data:`PRETRAINING_VERSION`."""

    @classmethod
    def behaviour_versions(cls, options: Mapping[str, Any]) -> dict[str, int]:
        versions = super().behaviour_versions(options)
        if isinstance(options.get("pretrained"), str) and options["pretrained"] in PRETRAINING_SCALES:
            versions["pretraining"] = PRETRAINING_VERSION
        return versions


# ----- budgets -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DeviceBudget:
    """A device's budgets (``None``: unconstrained): peak memory (MB), upload per round (MB), GFLOPs per batch."""

    device: int | str
    memory_mb: float | None = None
    upload_mb: float | None = None
    gflops: float | None = None

    def limit(self, constraint: str) -> float | None:
        return getattr(self, CONSTRAINT_COLUMNS[constraint])


def as_budget(value: Any, index: int = 0) -> DeviceBudget:
    """A :class:`DeviceBudget` from a ClientProfile, a DeviceBudget or a dict (``device``/``client_id`` + fields)."""
    if isinstance(value, DeviceBudget):
        return value
    if isinstance(value, ClientProfile):
        return DeviceBudget(value.client_id, value.memory_mb, value.upload_mb, value.gflops)
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - {"device", "client_id", "memory_mb", "upload_mb", "gflops", "group"})
        if unknown:
            raise ValueError(f"unknown budget field(s) {unknown}; accepted: device, memory_mb, upload_mb, gflops")
        device = value.get("device", value.get("client_id", index))
        return DeviceBudget(device, *(None if value.get(k) is None else float(value[k])
                                      for k in ("memory_mb", "upload_mb", "gflops")))
    raise TypeError(f"a budget must be a ClientProfile, DeviceBudget or dict, got {type(value).__name__}")


def device_budgets(budgets: Sequence[Any]) -> list[DeviceBudget]:
    """:func:`as_budget` of every entry (a dict's position is its default device id); at least one."""
    out = [as_budget(b, i) for i, b in enumerate(budgets)]
    if not out:
        raise ValueError("budgets must hold at least one device")
    return out


def _check_limits(value: Any, where: str) -> None:
    """Each budget field of a dict or :class:`DeviceBudget` ``value`` is ``None`` or a finite real number > 0."""
    fields = value if isinstance(value, Mapping) else vars(value) if isinstance(value, DeviceBudget) else {}
    for name in CONSTRAINT_COLUMNS.values():
        limit = fields.get(name)
        if limit is None:
            continue
        if isinstance(limit, bool) or not isinstance(limit, numbers.Real) or not math.isfinite(float(limit)) \
                or not float(limit) > 0:
            raise ValueError(f"option {where}: {name}={limit!r} is not valid; accepted: a finite number > 0 "
                             f"(the budget in {UNITS[_CONSTRAINT_OF[name]]}) or None (unconstrained)")


def check_group_budgets(budgets: Any) -> None:
    """Validate option ``budgets``: ``None`` or ``{group: budget dict}``, every limit a finite number > 0."""
    if budgets is None:
        return
    if not isinstance(budgets, Mapping):
        raise ValueError(f"option budgets must be a dict {{group: budget dict}}, got {budgets!r}")
    for group, value in budgets.items():
        if not isinstance(value, (Mapping, DeviceBudget, ClientProfile)):
            raise ValueError(f"option budgets[{group!r}] must be a budget dict (memory_mb, upload_mb, gflops), "
                             f"got {value!r}")
        _check_limits(value, f"budgets[{group!r}]")
        as_budget(value)


def check_devices(devices: Any) -> None:
    """Validate option ``devices``: ``None`` or a non-empty sequence of budget dicts / :class:`DeviceBudget`, every
    limit a finite number > 0."""
    if devices is None:
        return
    if isinstance(devices, (str, bytes, Mapping)) or not isinstance(devices, Sequence):
        raise ValueError(f"option devices must be a list of budget dicts (device, memory_mb, upload_mb, gflops) or "
                         f"None, got {devices!r}")
    for i, value in enumerate(devices):
        if not isinstance(value, (Mapping, DeviceBudget, ClientProfile)):
            raise ValueError(f"option devices[{i}] must be a budget dict (device, memory_mb, upload_mb, gflops), "
                             f"got {value!r}")
        _check_limits(value, f"devices[{i}]")
    device_budgets(devices)


def declared_population(devices: Sequence[Any] | None, ctx: ServerContext | None) -> list[Any] | None:
    """The declared devices: option ``devices``, else ``ctx.devices``, else ``None``."""
    if devices is not None:
        return list(devices)
    if ctx is not None and ctx.devices is not None:
        return list(ctx.devices)
    return None


def resolve_budget(profile: ClientProfile, population: Sequence[Any] | None,
                   group_budgets: Mapping[str, Any] | None) -> DeviceBudget:
    """Per constraint: the profile's own budget, else the declared device of the same id, else the group's."""
    sources = [as_budget(profile)]
    if population is not None:
        declared = {b.device: b for b in device_budgets(population)}
        if profile.client_id in declared:
            sources.append(declared[profile.client_id])
    if group_budgets is not None:
        if profile.group not in group_budgets:
            raise ValueError(f"option budgets has no entry for group {profile.group!r} of client "
                             f"{profile.client_id}; groups given: {sorted(group_budgets)}")
        sources.append(as_budget(group_budgets[profile.group]))
    limits = [next((b.limit(c) for b in sources if b.limit(c) is not None), None) for c in CONSTRAINTS]
    return DeviceBudget(profile.client_id, *limits)


# ----- resource tables -----------------------------------------------------------------------------------------
def violated_constraints(row: Mapping[str, Any], budget: DeviceBudget) -> list[str]:
    """The constraints of ``budget`` that configuration ``row`` exceeds."""
    return [c for c in CONSTRAINTS
            if budget.limit(c) is not None and float(row[CONSTRAINT_COLUMNS[c]]) > budget.limit(c)]


def exceeded(row: Mapping[str, Any], budget: Any, setting: str) -> str:
    """The constraints ``row`` exceeds, with needed and available amounts, e.g.
    ``"memory (needs 68.8 MB for rank=3, has 50 MB)"``; ``setting`` names the configuration (``"rank=3"``)."""
    budget = as_budget(budget)
    parts = [f"{c} (needs {float(row[CONSTRAINT_COLUMNS[c]]):.4g} {UNITS[c]} for {setting}, "
             f"has {budget.limit(c):.4g} {UNITS[c]})" for c in violated_constraints(row, budget)]
    return " and ".join(parts) or "none"


def table_rows(resource_table: pd.DataFrame | Sequence[Mapping[str, Any]], key: str, *, layers: int | None = None,
               scheme: str | None = None) -> pd.DataFrame:
    """The rows of a resource table that a method chooses among, checked: the columns ``key`` and the three
    constraint columns must exist; rows of another ``scheme`` (when the column exists) or another depth ``layers``
    (when the column exists and ``layers`` is given) are dropped. Sorted by ``key``."""
    table = resource_table if isinstance(resource_table, pd.DataFrame) else pd.DataFrame(list(resource_table))
    needed = [key, *CONSTRAINT_COLUMNS.values()]
    missing = [c for c in needed if c not in table.columns]
    if missing:
        raise ValueError(f"resource_table lacks column(s) {missing}; it needs {needed}")
    if scheme is not None and "scheme" in table.columns:
        table = table[table["scheme"] == scheme]
    if layers is not None and "layers" in table.columns:
        table = table[table["layers"] == int(layers)]
    return table.sort_values(key).reset_index(drop=True)


def rows_for(rows: pd.DataFrame, key: str, candidates: Iterable[Any]) -> dict[Any, dict[str, Any]]:
    """``{candidate: its row}`` (the first row whose ``key`` equals it); ``ValueError`` naming missing ones."""
    records = rows.to_dict(orient="records")
    out, missing = {}, []
    for value in candidates:
        match = [r for r in records if r[key] == value]
        if match:
            out[value] = {**match[0], key: value}
        else:
            missing.append(value)
    if missing:
        raise ValueError(f"resource_table has no row for {key}={missing}; it has {sorted(rows[key].tolist())}")
    return out


def largest_fitting(rows: Mapping[Any, Mapping[str, Any]], budget: Any) -> Any | None:
    """The largest configuration (key of ``rows``) whose row fits every budget; ``None`` if none does."""
    budget = as_budget(budget)
    return max((value for value, row in rows.items() if not violated_constraints(row, budget)), default=None)


def assign_largest(rows: Mapping[Any, Mapping[str, Any]], budget: Any, what: str, key: str) -> Any:
    """The largest configuration of ``rows`` (a LoRA rank, a rank ratio, a depth, a width: ``what`` names it for
    messages, ``key`` is its column name, e.g. ``"rank"``) whose
    memory, upload and FLOPs fit ``budget`` (CAFF appendix, Eq. 7; a cost equal to the budget fits); ``ValueError``
    naming the device and the constraint(s) the smallest configuration exceeds when none fits."""
    budget = as_budget(budget)
    value = largest_fitting(rows, budget)
    if value is None:
        smallest = min(rows)
        raise ValueError(f"device {budget.device} cannot train any {what} of {sorted(rows, reverse=True)}: the "
                         f"smallest exceeds {exceeded(rows[smallest], budget, f'{key}={smallest:g}')}")
    return value


# ----- pretrained weights ---------------------------------------------------------------------------------------
def pretrained_source(option: Any, ctx: ServerContext, method: str) -> Any:
    """Option ``pretrained``, else ``ctx.pretrained``; ``ValueError`` when neither is given."""
    source = option if option is not None else ctx.pretrained
    if source is None:
        raise ValueError(f"{method} needs pretrained weights: pass option pretrained= a {{layers: state_dict}} "
                         f"mapping, a pretraining scale ('ci', 'cpu', 'paper'), or 'none' (no pretraining), or put "
                         f"one of them in ServerContext.pretrained")
    if not isinstance(source, Mapping) and source not in (*PRETRAINING_SCALES, "none"):
        raise ValueError(f"pretrained must be a mapping, 'ci', 'cpu', 'paper' or 'none', got {source!r}")
    return source


def model_kind(ctx: ServerContext) -> str:
    """The pretrained family of the task: ``"lm"`` for ``next_token``, else ``"vit"``."""
    return "lm" if ctx.task == "next_token" else "vit"


def pretrained_depths(source: Any, ctx: ServerContext) -> list[int] | None:
    """The depths a source has weights for (``None``: any depth, for ``"none"``)."""
    if isinstance(source, Mapping):
        return sorted(int(l) for l in source)
    if source == "none":
        return None
    from ..pretraining import family_depths  # lazy: experiments imports the methods

    return list(family_depths(model_kind(ctx), source))


def pretrained_state(source: Any, ctx: ServerContext, layers: int) -> Mapping[str, torch.Tensor] | None:
    """The pretrained state dict of depth ``layers`` from ``source`` (``None`` for ``"none"``)."""
    if isinstance(source, Mapping):
        return source[layers] if layers in source else source[str(layers)]
    if source == "none":
        return None
    if source not in PRETRAINING_SCALES:
        raise ValueError(f"pretrained must be a mapping, 'ci', 'cpu', 'paper' or 'none', got {source!r}")
    from ..pretraining import pretrain, preset

    return pretrain(preset(model_kind(ctx), source, layers))


def check_architecture(architecture: Any) -> None:
    """Validate option ``architecture``: ``None`` or an int number of blocks."""
    if architecture is not None and (isinstance(architecture, bool) or not isinstance(architecture, int)
                                     or architecture < 1):
        raise ValueError(f"option architecture must be an int number of layers >= 1 or None, got {architecture!r}")


def fixed_depth(architecture: int | None, source: Any, ctx: ServerContext) -> int:
    """The depth a single-architecture method finetunes: option ``architecture``, else the depth of the configured
    model ``ctx.model_fn()``; it must have pretrained weights in ``source``."""
    depth = int(architecture) if architecture is not None else len(transformer_blocks(ctx.model_fn()))
    available = pretrained_depths(source, ctx)
    if available is not None and depth not in available:
        raise ValueError(f"no pretrained weights for depth {depth} (option architecture, or the configured model's "
                         f"depth); available depths: {available}")
    return depth


def pretrained_model(ctx: ServerContext, source: Any, layers: int) -> tuple[nn.Module, list[str]]:
    """``ctx.model_fn(layers=layers)`` with the pretrained weights of ``source`` loaded, and the names not loaded."""
    model = ctx.model_fn(layers=layers)
    state = pretrained_state(source, ctx, layers)
    return model, (load_pretrained(model, state) if state is not None else [])


# ----- measurement inputs ---------------------------------------------------------------------------------------
def measurement_batch(ctx: ServerContext) -> torch.Tensor:
    """A mini-batch of ``training.batch_size`` samples of the task's input shape (token ids or images)."""
    b = int(ctx.training.batch_size)
    g = torch.Generator().manual_seed(0)
    if ctx.task == "next_token":
        return torch.randint(ctx.num_classes, (b, *ctx.input_shape), generator=g)
    return torch.randn((b, *ctx.input_shape), generator=g)


_OPTIMIZER_STATE = {"sgd": "sgd", "adam": "adam", "adamw": "adamw"}


def optimizer_state(ctx: ServerContext) -> str:
    """The optimiser-state kind of :func:`subfl.costs.training_memory` for the configured optimiser."""
    name = ctx.training.optimizer
    if name == "sgd":
        return "sgd_momentum" if ctx.training.momentum > 0 else "sgd"
    return _OPTIMIZER_STATE[name]


# ----- local training ---------------------------------------------------------------------------------------------
class _WithInputs(nn.Module):
    """Returns ``(output, inputs)`` so that a loss of ``(output, y)`` can build next-token targets from inputs."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> tuple[Any, torch.Tensor]:
        return self.model(x), x


def _lm_loss(output: tuple[torch.Tensor, torch.Tensor], y: torch.Tensor) -> torch.Tensor:
    logits, tokens = output
    return causal_lm_loss(logits, tokens, y)


InputLoss = Callable[[Any, torch.Tensor, torch.Tensor], torch.Tensor]
"""A loss of ``(model output, inputs, targets)`` — the signature of :func:`subfl.fl.training.default_loss`."""


def train_transformer(model: nn.Module, data: ClientDataset, config: Mapping[str, Any],
                      ctx: ClientContext, loss_fn: InputLoss | None = None) -> dict[str, float]:
    """Train ``model``'s trainable parameters with ``config["train"]``: next-token loss over every position for a
    ``next_token`` task (``config["task"]``, else the client context's), the default loss otherwise. ``loss_fn(output,
    inputs, targets)``, when given, replaces both (it sees the mini-batch's inputs, so a language model's loss can
    build its next-token targets from them, as :func:`~subfl.fl.training.default_loss` does)."""
    if loss_fn is not None:
        return train_epochs(_WithInputs(model), data, config["train"], ctx.generator, device=ctx.device,
                            loss_fn=lambda output, y: loss_fn(output[0], output[1], y))
    if config.get("task", ctx.task) == "next_token":
        return train_epochs(_WithInputs(model), data, config["train"], ctx.generator, device=ctx.device,
                            loss_fn=_lm_loss)
    return train_epochs(model, data, config["train"], ctx.generator, device=ctx.device)


def group_means(rows: Sequence[Mapping[str, Any]], key: str, metric: str) -> dict[tuple[str, str], float]:
    """``{(metric, "global"): mean of row[key]}`` plus one entry per non-empty ``row["group"]``."""
    if not rows:
        return {}
    out = {(metric, "global"): sum(float(r[key]) for r in rows) / len(rows)}
    for group in sorted({r["group"] for r in rows if r["group"]}):
        values = [float(r[key]) for r in rows if r["group"] == group]
        out[(metric, group)] = sum(values) / len(values)
    return out


__all__ = ["CONSTRAINTS", "CONSTRAINT_COLUMNS", "DeviceBudget", "InputLoss", "PRETRAINING_SCALES", "UNITS",
           "as_budget", "check_architecture", "check_group_budgets", "declared_population", "device_budgets",
           "assign_largest", "exceeded", "fixed_depth", "group_means", "largest_fitting", "measurement_batch", "model_kind",
           "optimizer_state", "pretrained_depths", "pretrained_model", "pretrained_source", "pretrained_state",
           "resolve_budget", "rows_for", "table_rows", "train_transformer", "violated_constraints"]
