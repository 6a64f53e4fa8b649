"""HetLoRA — LoRA finetuning with a device-dependent rank: the LoRA baseline of CAFF (Pfeiffer, Ahmed, Khalili &
Henkel, "Efficient Federated Finetuning of Tiny Transformers with Resource-Constrained Devices"), after Cho et al.,
"Heterogeneous LoRA for Federated Fine-tuning of On-Device Foundation Models" (2024).

One pretrained tiny transformer ``F_l`` (:mod:`subfl.models.transformers`) gets LoRA adapters (Hu et al., ICLR 2022;
:func:`~subfl.models.transformers.add_lora`) on every block's linear maps (``q, k, v, proj, fc1, fc2``): ``W x +
B A x`` with the pretrained ``W`` (and biases, embeddings) frozen and ``A`` (r×in), ``B`` (out×r), every LayerNorm,
the final LayerNorm and the head trained.

1. **Rank per device.** Every rank of option ``ranks`` (default ``(24, 12, 6, 3)``: the LoRA ranks 24, 12 and 3 of
   CAFF's Fig. 5, and 6 between them) is measured once at ``init`` like CAFF's configurations
   (:func:`subfl.costs.finetuning.resource_table` with scheme ``lora``: peak training memory, upload bytes of the
   trained parameters, GFLOPs per mini-batch; or option ``resource_table``, rows with ``rank, memory_mb, upload_mb,
   gflops``, rows of another ``scheme`` or depth ``layers`` ignored when those columns exist). Each round a device gets the largest rank whose three costs fit
   its budgets (:func:`~subfl.methods.finetuning_common.assign_largest`; a cost equal to the budget fits; equal costs → the larger rank). Budgets are
   resolved exactly as CAFF's (:func:`~subfl.methods.finetuning_common.resolve_budget`: profile fields, option
   ``devices`` / ``ServerContext.devices``, option ``budgets`` by group). A device that fits no rank
   raises ``ValueError`` naming it and the constraint the smallest rank exceeds (CAFF marks such a setting in its
   tables; here it is an error).
2. **Download.** The server holds the adapters at the largest rank ``R``; a device of rank ``r`` receives the frozen
   weights, the norms, the head and the leading ``r`` rows of every ``A`` and leading ``r`` columns of every ``B``
   (:func:`truncate_lora`).
3. **Upload**: only what trains — its ``A`` (r×in), ``B`` (out×r), the LayerNorms and the head.
4. **Aggregation** (:func:`padded_average`, HeteroFL-style zero padding, Diao et al., ICLR 2021): each uploaded
   tensor is placed in the leading block of the server tensor; each entry becomes the average over the devices
   that trained it, weighted by their data sizes ``n_c``; entries (and tensors) nobody trained keep their value.
5. **Evaluation**: the global model with the full-rank (``R``) adapters applied.

Choices where the paper is silent:

* **Aggregation.** HeteroFL's masked average of the zero-padded factors (above). The original HetLoRA additionally
  weights devices by the norm of their update ("sparsity-weighted aggregation") and lets devices prune their rank
  locally; neither is implemented.
* **Scaling.** ``α/r = 1`` at every rank (``add_lora``'s default ``α = r``), so the adapter a device of rank ``r``
  trains is exactly the leading-``r`` truncation ``B_{:, :r} A_{:r}`` of the server's, with no rank-dependent
  rescaling.
* **Initialisation.** ``A`` Kaiming-uniform (drawn from a generator of (seed, "hetlora", "init")), ``B = 0``, so the
  finetuned model starts as the pretrained one. Rows ``r..R`` of ``A`` that no device trains stay at their
  initialisation; with ``B``'s matching columns at 0 they do not change the model.
* **Depth.** One architecture ``F_l``: option ``architecture`` (an int), else the depth of the configured model
  ``ServerContext.model_fn()``; pretrained weights come from option ``pretrained`` / ``ServerContext.pretrained``
  as for CAFF (a ``{l: state_dict}`` mapping, ``"ci"`` / ``"cpu"`` / ``"paper"``, or ``"none"``).
* **Zero-sample devices** take part with weight 0 (if every device holding a tensor has ``n_c = 0`` the average is
  uniform, as in CAFF's :func:`~subfl.methods.caff.layerwise_average`).

:meth:`HetLoRA.round_metrics` reports ``lora_rank`` (mean rank of the round, per group and ``global``).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from numbers import Integral
from typing import Any

import pandas as pd
import torch
from torch import nn

from ..costs.finetuning import resource_table as measure_resource_table
from ..fl.training import ClientDataset
from ..fl.types import ClientProfile, Task, Update
from ..models.transformers import add_lora, trainable_parameter_names
from ..fl.method import ClientContext, ServerContext, ServerState, clone_tensors
from .finetuning_common import (FinetuningMethod, DeviceBudget, check_architecture, check_group_budgets,
                                assign_largest, declared_population, fixed_depth, group_means, measurement_batch,
                                optimizer_state, pretrained_model, pretrained_source, resolve_budget, rows_for,
                                table_rows, train_transformer)

DEFAULT_RANKS: tuple[int, ...] = (24, 12, 6, 3)
"""The candidate LoRA ranks: 24, 12 and 3 (CAFF's Fig. 5) and 6."""


def check_ranks(ranks: Any) -> tuple[int, ...]:
    """Option ``ranks`` as a tuple sorted from the largest: a non-empty sequence of distinct ints >= 1."""
    values = list(ranks) if isinstance(ranks, Sequence) and not isinstance(ranks, str) else None
    if not values or any(isinstance(r, bool) or not isinstance(r, Integral) or r < 1 for r in values) \
            or len(set(values)) != len(values):
        raise ValueError(f"option ranks must be a non-empty sequence of distinct ints >= 1 (e.g. {DEFAULT_RANKS}), "
                         f"got {ranks!r}")
    return tuple(sorted((int(r) for r in values), reverse=True))


def lora_rows(resource_table: pd.DataFrame | Sequence[Mapping[str, Any]], ranks: Sequence[int],
              layers: int | None = None) -> dict[int, dict[str, Any]]:
    """``{rank: its row}`` of a resource table (rows with ``scheme == "lora"`` and ``layers`` when those columns
    exist); ``ValueError`` naming a rank without a row."""
    rows = table_rows(resource_table, "rank", layers=layers, scheme="lora")
    return {int(r): row for r, row in rows_for(rows, "rank", [int(r) for r in ranks]).items()}


def truncate_lora(weights: Mapping[str, torch.Tensor], rank: int) -> dict[str, torch.Tensor]:
    """``weights`` with every ``*.lora_A`` cut to its leading ``rank`` rows and every ``*.lora_B`` to its leading
    ``rank`` columns (copies of those); other tensors as they are."""
    out = {}
    for name, value in weights.items():
        if name.endswith(".lora_A"):
            out[name] = value[:rank].clone()
        elif name.endswith(".lora_B"):
            out[name] = value[:, :rank].clone()
        else:
            out[name] = value
    return out


def padded_average(weights: Mapping[str, torch.Tensor],
                   updates: Sequence[tuple[Mapping[str, torch.Tensor], float]]) -> dict[str, torch.Tensor]:
    """HeteroFL-style aggregation of zero-padded tensors: an update tensor of shape ``s`` covers the leading block
    ``[:s_0, :s_1, …]`` of the server tensor; each entry becomes ``Σ_c n_c θ_c / Σ_c n_c`` over the updates covering
    it; entries no update covers keep ``weights``' value. If every update holding a tensor has ``n_c = 0``, they
    count equally."""
    out = dict(weights)
    names = {name for tensors, _ in updates for name in tensors}
    unknown = sorted(names - set(weights))
    if unknown:
        raise ValueError(f"updates hold tensors the global model lacks: {unknown[:5]}")
    for name in sorted(names):
        target = weights[name]
        held = [(tensors[name], float(n)) for tensors, n in updates if name in tensors]
        if sum(n for _, n in held) <= 0:
            held = [(t, 1.0) for t, _ in held]
        total = torch.zeros(target.shape, dtype=torch.float64)
        mass = torch.zeros(target.shape, dtype=torch.float64)
        for tensor, n in held:
            if tensor.dim() != target.dim() or any(a > b for a, b in zip(tensor.shape, target.shape)):
                raise ValueError(f"update of {name!r} has shape {tuple(tensor.shape)}, which is not a leading block "
                                 f"of the global {tuple(target.shape)}")
            block = tuple(slice(0, s) for s in tensor.shape)
            total[block] += n * tensor.detach().to(torch.float64)
            mass[block] += n
        covered = mass > 0
        new = target.detach().to(torch.float64).clone()
        new[covered] = total[covered] / mass[covered]
        out[name] = new.to(target.dtype)
    return out


def lora_model(model: nn.Module, rank: int, seed: int = 0) -> nn.Module:
    """``model`` with LoRA adapters of ``rank`` (:func:`~subfl.models.transformers.add_lora`, scaling 1), the
    adapters' ``A`` drawn from a generator seeded with ``seed`` (global RNG state untouched). In place."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return add_lora(model, rank)


def _model(model_fn: Callable[..., nn.Module], layers: int, rank: int) -> nn.Module:
    return lora_model(model_fn(layers=layers), rank)


class HetLoRA(FinetuningMethod):
    """Heterogeneous-rank LoRA finetuning of a pretrained tiny transformer (see the module docstring).

    Options: ``pretrained`` (None → ``ServerContext.pretrained``), ``architecture`` (None → the configured
    model's depth), ``ranks`` (candidate ranks, default ``(24, 12, 6, 3)``), ``devices`` (declared budgets by device
    id), ``budgets`` (``{group: budget dict}``), ``resource_table`` (None → measured at ``init``).
    """

    name = "hetlora"
    options: dict = {"pretrained": None, "architecture": None, "ranks": DEFAULT_RANKS, "devices": None,
                     "budgets": None, "resource_table": None}

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.ranks = check_ranks(self.config["ranks"])
        check_group_budgets(self.config["budgets"])
        check_architecture(self.config["architecture"])

    # ----- server side -------------------------------------------------------------------------------
    def _rows(self, ctx: ServerContext, layers: int) -> dict[int, dict[str, Any]]:
        table = self.config["resource_table"]
        if table is None:
            table = measure_resource_table({layers: ctx.model_fn(layers=layers)}, measurement_batch(ctx),
                                           trained_layers=(), lora_ranks=self.ranks, optimizer=optimizer_state(ctx))
        return lora_rows(table, self.ranks, layers)

    def budget(self, profile: ClientProfile, ctx: ServerContext | None = None) -> DeviceBudget:
        """The device's budgets (as CAFF resolves them)."""
        return resolve_budget(profile, declared_population(self.config["devices"], ctx), self.config["budgets"])

    def init(self, ctx: ServerContext) -> ServerState:
        source = pretrained_source(self.config["pretrained"], ctx, self.name)
        layers = fixed_depth(self.config["architecture"], source, ctx)
        rows = self._rows(ctx, layers)
        model, skipped = pretrained_model(ctx, source, layers)
        seed = int(ctx.rng("hetlora", "init").integers(2**31))
        lora_model(model, self.ranks[0], seed)
        return {"weights": clone_tensors(model.state_dict()), "layers": layers, "max_rank": self.ranks[0],
                "table": list(rows.values()), "not_loaded": skipped, "last_round": []}

    def configure(self, state: ServerState, round: int, clients: Sequence[ClientProfile],
                  ctx: ServerContext) -> dict[int, Task]:
        rows = {int(row["rank"]): row for row in state["table"]}
        tasks = {}
        for profile in clients:
            rank = int(assign_largest(rows, self.budget(profile, ctx), "LoRA rank", "rank"))
            config = {"train": ctx.train_config(round), "layers": state["layers"], "rank": rank,
                      "group": profile.group, "task": ctx.task}
            tasks[profile.client_id] = Task(profile.client_id, round, truncate_lora(state["weights"], rank), config)
        return tasks

    def aggregate(self, state: ServerState, round: int, updates: Sequence[Update],
                  ctx: ServerContext) -> ServerState:
        weights = padded_average(state["weights"], [(u.tensors, u.n_samples) for u in updates])
        last = [{"client": u.client_id, "rank": int(u.stats["rank"]), "group": str(u.stats.get("group", ""))}
                for u in updates]
        return {**state, "weights": weights, "last_round": last}

    def round_metrics(self, state: ServerState, round: int) -> dict[tuple[str, str], float]:
        return group_means(state.get("last_round") or [], "rank", "lora_rank")

    def evaluation_models(self, state: ServerState, ctx: ServerContext) -> dict[str, nn.Module]:
        model = _model(ctx.model_fn, state["layers"], state["max_rank"])
        model.load_state_dict(state["weights"])
        return {"global": model}

    # ----- client side -------------------------------------------------------------------------------
    def local_update(self, task: Task, data: ClientDataset, ctx: ClientContext) -> Update:
        cfg = task.config
        model = _model(ctx.model_fn, int(cfg["layers"]), int(cfg["rank"])).to(ctx.device)
        model.load_state_dict(task.tensors)
        stats = train_transformer(model, data, cfg, ctx)
        trained = set(trainable_parameter_names(model))
        upload = clone_tensors({k: v for k, v in model.state_dict().items() if k in trained})
        return Update(task.client_id, upload, len(data),
                      {**stats, "rank": int(cfg["rank"]), "group": cfg.get("group", "")})


__all__ = ["DEFAULT_RANKS", "HetLoRA", "check_ranks", "lora_model", "lora_rows", "padded_average",
           "truncate_lora"]
