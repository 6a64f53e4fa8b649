"""FedHM — low-rank factorised training with a device-dependent rank: the factorisation baseline of CAFF (Pfeiffer,
Ahmed, Khalili & Henkel, "Efficient Federated Finetuning of Tiny Transformers with Resource-Constrained Devices"),
after Yao et al., "FedHM: Efficient Federated Learning for Heterogeneous Models via Low-rank Factorization"
(arXiv:2111.14655).

The server keeps the full (dense) weights of one pretrained tiny transformer ``F_l``. Each round, for each device:

1. **Rank ratio per device.** Every ratio ``ρ`` of option ``rank_ratios`` (default ``(1.0, 0.5, 0.25, 0.125)``) is
   measured once at ``init`` (:func:`fedhm_resource_table`: the factorised model below, measured with
   :func:`subfl.costs.finetuning.training_step_cost` — peak training memory, upload bytes of the trained parameters,
   GFLOPs per mini-batch — as CAFF measures its configurations; or option ``resource_table``, rows with
   ``rank_ratio, memory_mb, upload_mb, gflops``, rows of another depth ``layers`` ignored when that column
   exists). A device gets the largest ``ρ`` whose three costs fit its budgets (:func:`~subfl.methods.finetuning_common.assign_largest`; a cost equal to
   the budget fits; equal costs → the larger ratio), budgets resolved as CAFF's
   (:func:`~subfl.methods.finetuning_common.resolve_budget`). A device that fits no ratio raises ``ValueError``
   naming it and the constraint the smallest ratio exceeds.
2. **Factorisation** (server side, :func:`truncated_factors`). Every linear map of every block (``q, k, v, proj,
   fc1, fc2``; :func:`factorized_layer_names`) of shape ``n × m`` is replaced by its rank-``z`` truncated SVD
   factors ``U_z √S_z`` (``n × z``, parameter ``<layer>.u``) and ``√S_z V_zᵀ`` (``z × m``, ``<layer>.v``), with
   ``z = ⌈ρ · min(n, m)⌉`` (:func:`~subfl.sampling.keep_count`, at least 1); the bias stays. A device with ``ρ = 1``
   — the least constrained — trains the dense model instead (no factorisation).
3. **Local training.** Everything but the embeddings trains: the factors (or dense weights), the biases, every
   LayerNorm and the head; the token / position / patch embeddings and the class token are frozen as in CAFF.
   The device uploads what it trained.
4. **Aggregation.** For each device the server rebuilds the dense ``W = (U_z √S_z)(√S_z V_zᵀ)`` of every factorised
   map from its trained factors (:func:`dense_update`) and averages the dense weights over the devices, weighted by
   their data sizes (:func:`~subfl.methods.caff.layerwise_average`); the frozen embeddings keep their value. This is
   FedHM's aggregation: it averages the products of the low-rank factors (the full-rank weights they represent),
   not the factors themselves.
5. **Evaluation**: the dense global model.

Choices where the paper is silent:

* **Which maps are factorised**: the blocks' six linear maps; the head and the embeddings stay dense (as the first
  and last layers stay dense in :mod:`subfl.models.factorized`).
* **Rank of a map**: ``z = ⌈ρ · min(n, m)⌉``, the ratio applied to each map's own full rank; ``ρ = 1`` means the
  dense model, not a full-rank factorisation (which would have more parameters than ``W``).
* **SVD per round**: the factors of round ``t`` come from the SVD of the aggregated dense weights of round ``t − 1``
  (computed in float64, :func:`~subfl.models.factorized.svd_factors`), so every round starts from the best rank-``z``
  approximation of the global model.
* **Depth and pretrained weights**: as for :mod:`subfl.methods.hetlora` — option ``architecture`` (else the
  configured model's depth), weights from option ``pretrained`` / ``ServerContext.pretrained``.

:meth:`FedHM.round_metrics` reports ``rank_ratio`` (mean ratio of the round, per group and ``global``).
"""
from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from numbers import Real
from typing import Any

import pandas as pd
import torch
from torch import nn

from ..costs.finetuning import in_table_units, training_step_cost
from ..fl.training import ClientDataset
from ..fl.types import ClientProfile, Task, Update
from ..models.factorized import FactorizedLinear, LayerSpec, dense_weight, layer_specs, svd_factors
from ..models.transformers import EMBEDDING_NAMES, LORA_TARGETS, trainable_parameter_names, transformer_blocks
from ..sampling import keep_count
from ..fl.method import ClientContext, ServerContext, ServerState, clone_tensors
from .caff import layerwise_average
from .finetuning_common import (FinetuningMethod, DeviceBudget, check_architecture, check_group_budgets,
                                assign_largest, declared_population, fixed_depth, group_means, measurement_batch,
                                optimizer_state, pretrained_model, pretrained_source, resolve_budget, rows_for,
                                table_rows, train_transformer)

DEFAULT_RANK_RATIOS: tuple[float, ...] = (1.0, 0.5, 0.25, 0.125)
"""The candidate rank ratios ``ρ`` (1: the dense model)."""


def check_rank_ratios(ratios: Any) -> tuple[float, ...]:
    """Option ``rank_ratios`` as a tuple sorted from the largest: a non-empty sequence of distinct numbers in (0, 1]."""
    values = list(ratios) if isinstance(ratios, Sequence) and not isinstance(ratios, str) else None
    if not values or any(isinstance(r, bool) or not isinstance(r, Real) or not 0 < r <= 1 for r in values) \
            or len({float(r) for r in values}) != len(values):
        raise ValueError(f"option rank_ratios must be a non-empty sequence of distinct numbers in (0, 1] (e.g. "
                         f"{DEFAULT_RANK_RATIOS}), got {ratios!r}")
    return tuple(sorted((float(r) for r in values), reverse=True))


def factorized_layer_names(model: nn.Module) -> list[str]:
    """The linear maps FedHM factorises: ``blocks.<i>.attn.{q,k,v,proj}`` and ``blocks.<i>.mlp.{fc1,fc2}``."""
    names = []
    for i, block in enumerate(transformer_blocks(model)):
        for part, parent in (("attn", block.attn), ("mlp", block.mlp)):
            names += [f"blocks.{i}.{part}.{t}" for t in LORA_TARGETS if isinstance(getattr(parent, t, None), nn.Linear)]
    return names


def layer_ranks(specs: Mapping[str, LayerSpec], ratio: float) -> dict[str, int]:
    """``{layer: z}`` with ``z = ⌈ρ · min(n, m)⌉`` for every layer of ``specs``; ``{}`` (dense) when ``ρ = 1``."""
    if ratio >= 1.0:
        return {}
    return {name: keep_count(spec.num_terms, ratio) for name, spec in specs.items()}


def truncated_factors(weight: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rank-``z`` truncated SVD of an ``n × m`` weight as ``(U_z √S_z (n × z), √S_z V_zᵀ (z × m))``: their
    product is the best rank-``z`` approximation, ``‖W − U_z S_z V_zᵀ‖_F² = Σ_{i>z} σ_i²`` (Eckart–Young)."""
    factors = svd_factors(weight)
    if isinstance(rank, bool) or not 1 <= int(rank) <= factors.num_terms:
        raise ValueError(f"rank must be an int in [1, {factors.num_terms}], got {rank!r}")
    return factors.u[:, :rank].contiguous(), factors.v[:rank].contiguous()


def freeze_embeddings(model: nn.Module) -> nn.Module:
    """Every parameter trains except the input embeddings (token, position, patch, class token). In place."""
    for name, p in model.named_parameters():
        p.requires_grad_(not name.startswith(EMBEDDING_NAMES))
    return model


def low_rank_model(model: nn.Module, ranks: Mapping[str, int]) -> nn.Module:
    """Replace, **in place**, each linear map named in ``ranks`` by a :class:`~subfl.models.factorized.FactorizedLinear`
    with that many terms (factors zero, bias copied; fill them with ``load_state_dict``), then
    :func:`freeze_embeddings`. Empty ``ranks``: the dense model. Returns ``model``."""
    specs = layer_specs(model, list(ranks))
    for name, spec in specs.items():
        dense = model.get_submodule(name)
        layer = FactorizedLinear(spec, ranks[name]).to(dense.weight.device, dense.weight.dtype)
        if spec.bias:
            with torch.no_grad():
                layer.bias.copy_(dense.bias)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, layer)
    return freeze_embeddings(model)


def factorized_payload(weights: Mapping[str, torch.Tensor], specs: Mapping[str, LayerSpec],
                       ranks: Mapping[str, int], svds: Mapping[str, Any] | None = None) -> dict[str, torch.Tensor]:
    """The dense ``weights`` with ``<layer>.weight`` replaced by ``<layer>.u``, ``<layer>.v`` (:func:`truncated_factors`
    of rank ``ranks[layer]``) for every layer in ``ranks``. ``svds``: precomputed
    :func:`~subfl.models.factorized.svd_factors` by layer (to share one SVD among devices)."""
    out = {k: v for k, v in weights.items() if not (k.endswith(".weight") and k[: -len(".weight")] in ranks)}
    for name, z in ranks.items():
        factors = svds[name] if svds is not None else svd_factors(weights[f"{name}.weight"].reshape(
            specs[name].out_features, specs[name].in_features))
        out[f"{name}.u"] = factors.u[:, :z].clone()
        out[f"{name}.v"] = factors.v[:z].reshape(specs[name].v_shape(z)).clone()
    return out


def dense_update(tensors: Mapping[str, torch.Tensor], specs: Mapping[str, LayerSpec]) -> dict[str, torch.Tensor]:
    """A device's upload with every factorised map's ``u``, ``v`` replaced by the dense ``<layer>.weight = u v``."""
    out = {}
    for name, value in tensors.items():
        layer, _, kind = name.rpartition(".")
        if layer in specs and kind in ("u", "v"):
            if kind == "u":
                out[f"{layer}.weight"] = dense_weight(value, tensors[f"{layer}.v"], specs[layer])
        else:
            out[name] = value
    return out


def fedhm_resource_table(model: nn.Module, rank_ratios: Sequence[float], batch: torch.Tensor, *,
                         optimizer: str = "adamw") -> pd.DataFrame:
    """One row per rank ratio: ``layers, rank_ratio`` and :func:`~subfl.costs.finetuning.in_table_units` of
    :func:`~subfl.costs.finetuning.training_step_cost` of the factorised ``model`` (:func:`low_rank_model`).
    ``model`` is not changed."""
    specs = layer_specs(model, factorized_layer_names(model))
    layers = len(transformer_blocks(model))
    rows = []
    for ratio in rank_ratios:
        configured = low_rank_model(copy.deepcopy(model), layer_ranks(specs, float(ratio)))
        rows.append({"layers": layers, "rank_ratio": float(ratio),
                     **in_table_units(training_step_cost(configured, batch, optimizer=optimizer))})
    return pd.DataFrame(rows)


def ratio_rows(resource_table: pd.DataFrame | Sequence[Mapping[str, Any]], rank_ratios: Sequence[float],
               layers: int | None = None) -> dict[float, dict[str, Any]]:
    """``{ρ: its row}`` of a resource table (rows of depth ``layers`` when that column exists)."""
    rows = table_rows(resource_table, "rank_ratio", layers=layers)
    return rows_for(rows, "rank_ratio", [float(r) for r in rank_ratios])


def _client_model(model_fn: Callable[..., nn.Module], layers: int, ranks: Mapping[str, int]) -> nn.Module:
    return low_rank_model(model_fn(layers=layers), ranks)


class FedHM(FinetuningMethod):
    """Heterogeneous low-rank factorised training of a pretrained tiny transformer (see the module docstring).

    Options: ``pretrained`` (None → ``ServerContext.pretrained``), ``architecture`` (None → the configured
    model's depth), ``rank_ratios`` (default ``(1.0, 0.5, 0.25, 0.125)``), ``devices`` (declared budgets by device
    id), ``budgets`` (``{group: budget dict}``), ``resource_table`` (None → measured at ``init``).
    """

    name = "fedhm"
    options: dict = {"pretrained": None, "architecture": None, "rank_ratios": DEFAULT_RANK_RATIOS, "devices": None,
                     "budgets": None, "resource_table": None}

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.rank_ratios = check_rank_ratios(self.config["rank_ratios"])
        check_group_budgets(self.config["budgets"])
        check_architecture(self.config["architecture"])

    # ----- server side -------------------------------------------------------------------------------
    def budget(self, profile: ClientProfile, ctx: ServerContext | None = None) -> DeviceBudget:
        """The device's budgets (as CAFF resolves them)."""
        return resolve_budget(profile, declared_population(self.config["devices"], ctx), self.config["budgets"])

    @staticmethod
    def _specs(model_fn: Callable[..., nn.Module], layers: int) -> dict[str, LayerSpec]:
        model = model_fn(layers=layers)
        return layer_specs(model, factorized_layer_names(model))

    def init(self, ctx: ServerContext) -> ServerState:
        source = pretrained_source(self.config["pretrained"], ctx, self.name)
        layers = fixed_depth(self.config["architecture"], source, ctx)
        model, skipped = pretrained_model(ctx, source, layers)
        table = self.config["resource_table"]
        if table is None:
            table = fedhm_resource_table(model, self.rank_ratios, measurement_batch(ctx),
                                         optimizer=optimizer_state(ctx))
        rows = ratio_rows(table, self.rank_ratios, layers)
        return {"weights": clone_tensors(model.state_dict()), "layers": layers, "table": list(rows.values()),
                "not_loaded": skipped, "last_round": []}

    def configure(self, state: ServerState, round: int, clients: Sequence[ClientProfile],
                  ctx: ServerContext) -> dict[int, Task]:
        rows = {float(row["rank_ratio"]): row for row in state["table"]}
        ratios = {p.client_id: float(assign_largest(rows, self.budget(p, ctx), "FedHM rank ratio", "rank_ratio")) for p in clients}
        specs = self._specs(ctx.model_fn, state["layers"])
        weights = state["weights"]
        svds = ({name: svd_factors(weights[f"{name}.weight"].reshape(spec.out_features, spec.in_features))
                 for name, spec in specs.items()} if any(r < 1.0 for r in ratios.values()) else {})
        tasks = {}
        for profile in clients:
            ranks = layer_ranks(specs, ratios[profile.client_id])
            config = {"train": ctx.train_config(round), "layers": state["layers"],
                      "rank_ratio": ratios[profile.client_id], "ranks": ranks, "group": profile.group,
                      "task": ctx.task}
            tasks[profile.client_id] = Task(profile.client_id, round,
                                            factorized_payload(weights, specs, ranks, svds), config)
        return tasks

    def aggregate(self, state: ServerState, round: int, updates: Sequence[Update],
                  ctx: ServerContext) -> ServerState:
        specs = self._specs(ctx.model_fn, state["layers"])
        weights = layerwise_average(state["weights"], [(dense_update(u.tensors, specs), u.n_samples) for u in updates])
        last = [{"client": u.client_id, "rank_ratio": float(u.stats["rank_ratio"]),
                 "group": str(u.stats.get("group", ""))} for u in updates]
        return {**state, "weights": weights, "last_round": last}

    def round_metrics(self, state: ServerState, round: int) -> dict[tuple[str, str], float]:
        return group_means(state.get("last_round") or [], "rank_ratio", "rank_ratio")

    def evaluation_models(self, state: ServerState, ctx: ServerContext) -> dict[str, nn.Module]:
        model = ctx.model_fn(layers=state["layers"])
        model.load_state_dict(state["weights"])
        return {"global": model}

    # ----- client side -------------------------------------------------------------------------------
    def local_update(self, task: Task, data: ClientDataset, ctx: ClientContext) -> Update:
        cfg = task.config
        model = _client_model(ctx.model_fn, int(cfg["layers"]), cfg["ranks"]).to(ctx.device)
        model.load_state_dict(task.tensors)
        stats = train_transformer(model, data, cfg, ctx)
        trained = set(trainable_parameter_names(model))
        upload = clone_tensors({k: v for k, v in model.state_dict().items() if k in trained})
        return Update(task.client_id, upload, len(data),
                      {**stats, "rank_ratio": float(cfg["rank_ratio"]), "group": cfg.get("group", "")})


__all__ = ["DEFAULT_RANK_RATIOS", "FedHM", "check_rank_ratios", "dense_update",
           "factorized_layer_names", "factorized_payload", "fedhm_resource_table", "freeze_embeddings",
           "layer_ranks", "low_rank_model", "ratio_rows", "truncated_factors"]
