"""CAFF — constraint-aware federated finetuning (Pfeiffer, Ahmed, Khalili & Henkel, "Efficient Federated
Finetuning of Tiny Transformers with Resource-Constrained Devices").

Given a family of pretrained tiny transformers ``F_l`` (``l`` blocks; :mod:`subfl.models.transformers`,
:mod:`subfl.pretraining`) and devices with memory, upload and compute budgets, CAFF

1. measures the resources of every configuration ``F_l^t`` — ``t`` of the ``l`` blocks trained (the last ``t``),
   the rest frozen — once (:func:`subfl.costs.finetuning.resource_table`: peak training memory, upload bytes of
   the trained parameters, FLOPs per mini-batch);
2. gives each device ``c`` the largest ``t_c(l)`` whose three costs fit its budgets (:func:`trainable_layers`);
3. keeps the architectures every device can train at least one layer of (**Eq. 2**, :func:`feasible_architectures`)
   and picks the one maximising the mean number of trained layers ``(1/|C|) Σ_c t_c(l)`` (**Eq. 3**,
   :func:`select_architecture`; ties go to the deeper model — more pretrained capacity at the same trained depth);
4. each round, device ``c`` trains the last ``t_c`` blocks, the final LayerNorm and the head of the global ``F_l``
   (:func:`~subfl.models.transformers.freeze_for_finetuning`) and uploads only those (frozen layers never change,
   so they are never sent back — the ledger shows it);
5. aggregates layer-wise (**Eqs. 4–5**): a layer's new weight is the average of the devices that trained it,
   weighted by their data sizes ``n_c``; layers nobody trained keep their weights (the embeddings always do).

What counts as a budget. A device's budgets are, per constraint, the first that is set of: its
:class:`~subfl.fl.types.ClientProfile` fields (``memory_mb``, ``upload_mb``, ``gflops``); the entry of the same
device id in the declared population (option ``devices`` / ``ServerContext.devices``, below); option
``budgets`` ``{group: {"memory_mb": …, "upload_mb": …, "gflops": …}}`` keyed by the profile's group
(``"0.25"`` …); else unconstrained. Units follow the resource table: MB = 10⁶ bytes of peak memory / upload per
round, GFLOPs per mini-batch (forward + backward).

Which devices Eq. 2 ranges over. Option ``devices`` (a list of budget dicts, one per device of the population;
a dict's ``device`` key is the client id, its position in the list by default), else
``ServerContext.devices`` — the selection is then made at ``init``; else the clients of the first round
(all devices under full participation; with partial participation the first round's sample stands in for the
population, and a later device that cannot train one layer of the chosen ``F_l`` raises ``ValueError`` naming its
binding constraint). Option ``architecture`` fixes ``l`` (only the ``t_c`` are chosen).

Fixed configurations (option ``trained_layers``, CAFF's Fig. 1). With ``trained_layers = t`` (and ``architecture =
l``, which it requires; ``1 ≤ t ≤ l``) every device trains exactly the last ``t`` blocks of ``F_l`` — the
configuration ``F_l^t`` — instead of the largest ``t_c`` within its budgets. Budgets, when given, still apply: a
device whose budgets ``F_l^t`` exceeds raises ``ValueError`` naming the binding constraint. Fig. 1 finetunes every
device with the same ``F_l^t``, one point of its layer-finetuning curves per ``(l, t)``.

Pretrained weights (option ``pretrained``, else ``ServerContext.pretrained``):

* a mapping ``{l: state_dict}`` (the candidate depths are its keys, unless option ``layers`` narrows them);
* a scale name ``"ci"`` / ``"cpu"`` / ``"paper"``: :func:`subfl.pretraining.pretrain_family` of the
  task's kind (``next_token`` → language model, else ViT), trained once and cached. A language task's data must
  then be tokenized with the same tokenizer, ``train_tokenizer(preset("lm", scale).tokenizer_config())``
  (a vocabulary mismatch raises ``ValueError`` when the weights are loaded);
* ``"none"``: no pretraining (the models' own initialisation; an ablation).

Weights load with :func:`~subfl.models.transformers.load_pretrained` (a head whose class count differs from the
task's — the ViT's downstream classes — is re-initialised; it is always trained). The model architecture comes
from ``ServerContext.model_fn``, called as ``model_fn(layers=l)`` (the registry's ``tiny_gpt`` / ``tiny_vit``).

Option ``resource_table``: a table (DataFrame or list of row dicts with ``layers, trained, memory_mb, upload_mb,
gflops``; rows with ``scheme != "freeze"`` are ignored) instead of measuring at ``init`` — for hand-made budgets.
When measured, the mini-batch is ``training.batch_size`` samples of the dataset's input shape and the optimiser
state is the configured optimiser's (AdamW: 2 copies of the trainable parameters).

Language models are trained with the next-token loss over every position of a window
(:func:`~subfl.models.transformers.causal_lm_loss`); evaluation (the engine's) scores the last position.
Budgets and their resolution, pretrained weights, the measurement batch and local training are shared with CAFF's
baselines :mod:`subfl.methods.hetlora` and :mod:`subfl.methods.fedhm` (:mod:`subfl.methods.finetuning_common`).
:meth:`CAFF.round_metrics` reports ``trained_layers`` (mean ``t_c`` of the round, per group and ``global``) and
``architecture_layers`` (``l``).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
from torch import nn

from ..costs.finetuning import resource_table as measure_resource_table
from ..fl.training import ClientDataset
from ..fl.types import ClientProfile, Task, Update
from ..models.transformers import freeze_for_finetuning, load_pretrained, trainable_parameter_names
from ..fl.method import ClientContext, ServerContext, ServerState, clone_tensors
from .finetuning_common import (FinetuningMethod, CONSTRAINT_COLUMNS, CONSTRAINTS, DeviceBudget, as_budget, check_group_budgets,
                                declared_population, device_budgets, exceeded, group_means, measurement_batch,
                                model_kind, optimizer_state, pretrained_depths, pretrained_source, pretrained_state,
                                resolve_budget, train_transformer, violated_constraints)


def freeze_rows(resource_table: pd.DataFrame | Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """The ``F_l^t`` rows of a resource table (``scheme == "freeze"`` when the column exists), checked."""
    table = resource_table if isinstance(resource_table, pd.DataFrame) else pd.DataFrame(list(resource_table))
    needed = ["layers", "trained", *CONSTRAINT_COLUMNS.values()]
    missing = [c for c in needed if c not in table.columns]
    if missing:
        raise ValueError(f"resource_table lacks column(s) {missing}; it needs {needed}")
    if "scheme" in table.columns:
        table = table[table["scheme"] == "freeze"]
    table = table[table["trained"] >= 1]
    if table.empty:
        raise ValueError("resource_table has no F_l^t row with t >= 1")
    return table.astype({"layers": int, "trained": int}).sort_values(["layers", "trained"]).reset_index(drop=True)


def trainable_layers(resource_table, layers: int, budget: Any) -> int:
    """``t_c(l)``: the largest ``t`` whose ``F_l^t`` fits all of the device's budgets; 0 if none does."""
    budget = as_budget(budget)
    table = freeze_rows(resource_table)
    rows = table[table["layers"] == int(layers)]
    if rows.empty:
        raise ValueError(f"resource_table has no row for layers={layers}; it has depths {sorted(set(table.layers))}")
    fitting = [int(r["trained"]) for _, r in rows.iterrows() if not violated_constraints(r, budget)]
    return max(fitting, default=0)


def binding_constraints(resource_table, layers: int, budget: Any) -> str:
    """Why a device cannot train one layer of ``F_l``: the constraints the cheapest ``F_l^t`` exceeds, with
    needed and available amounts (e.g. ``"memory (needs 68.8 MB, has 50 MB)"``)."""
    rows = freeze_rows(resource_table)
    row = rows[rows["layers"] == int(layers)].iloc[0]
    return exceeded(row, budget, f"t={int(row['trained'])}")


def device_layers(resource_table, budgets: Sequence[Any]) -> dict[int, list[int]]:
    """``{l: [t_c(l) for every device]}`` for every depth in the table."""
    budgets = device_budgets(budgets)
    rows = freeze_rows(resource_table)
    return {int(l): [trainable_layers(rows, int(l), b) for b in budgets] for l in sorted(set(rows["layers"]))}


def feasible_architectures(resource_table, budgets: Sequence[Any]) -> list[int]:
    """Eq. (2): the depths ``l`` for which *every* device can train at least one layer (``t_c(l) ≥ 1``)."""
    return [l for l, ts in device_layers(resource_table, budgets).items() if min(ts) >= 1]


@dataclass(frozen=True)
class Selection:
    """The outcome of Eq. (3): the depth, every device's ``t_c``, and the mean ``t_c`` of each feasible depth."""

    layers: int
    trained: dict[Any, int]
    mean_trained: float
    candidates: dict[int, float]


def _infeasible_message(resource_table, budgets: list[DeviceBudget], per_layer: dict[int, list[int]]) -> str:
    reasons = []
    for l, ts in per_layer.items():
        bad = [b for b, t in zip(budgets, ts) if t < 1]
        shown = "; ".join(f"device {b.device} exceeds {binding_constraints(resource_table, l, b)}" for b in bad[:3])
        more = f"; and {len(bad) - 3} more device(s)" if len(bad) > 3 else ""
        reasons.append(f"F_{l}: {shown}{more}")
    return ("no architecture is feasible for every device (CAFF Eq. 2: each device must train at least one layer "
            "within its memory, upload and compute budgets): " + " | ".join(reasons))


def select_architecture(resource_table, budgets: Sequence[Any], layers: int | None = None) -> Selection:
    """Eq. (3): among :func:`feasible_architectures`, the depth maximising the mean over devices of ``t_c(l)``;
    ties → the deeper model. ``layers`` fixes the depth (it must be feasible). ``ValueError`` naming the binding
    constraint(s) and device(s) when no depth (or the fixed one) is feasible."""
    budgets = device_budgets(budgets)
    per_layer = device_layers(resource_table, budgets)
    if layers is not None and int(layers) not in per_layer:
        raise ValueError(f"architecture layers={layers} is not in the resource table (depths {sorted(per_layer)})")
    feasible = {l: ts for l, ts in per_layer.items() if min(ts) >= 1 and (layers is None or l == int(layers))}
    if not feasible:
        scope = per_layer if layers is None else {int(layers): per_layer[int(layers)]}
        raise ValueError(_infeasible_message(resource_table, budgets, scope))
    best = max(feasible, key=lambda l: (sum(feasible[l]), l))  # equal device counts: compare sums, exact
    n = len(budgets)
    return Selection(best, {b.device: t for b, t in zip(budgets, feasible[best])}, sum(feasible[best]) / n,
                     {l: sum(ts) / n for l, ts in feasible.items()})


def layerwise_average(weights: Mapping[str, torch.Tensor], updates: Sequence[tuple[Mapping[str, torch.Tensor], float]],
                      ) -> dict[str, torch.Tensor]:
    """Eqs. (4)–(5): every tensor some update holds becomes ``Σ_c n_c θ_c / Σ_c n_c`` over the updates holding it
    (uniform weights if all of their ``n_c`` are 0); tensors no update holds keep ``weights``' value."""
    out = dict(weights)
    names = {name for tensors, _ in updates for name in tensors}
    unknown = sorted(names - set(weights))
    if unknown:
        raise ValueError(f"updates hold tensors the global model lacks: {unknown[:5]}")
    for name in names:
        held = [(tensors[name], float(n)) for tensors, n in updates if name in tensors]
        total = sum(n for _, n in held)
        coeffs = [n / total for _, n in held] if total > 0 else [1.0 / len(held)] * len(held)
        acc = torch.zeros(weights[name].shape, dtype=torch.float64)
        for (tensor, _), w in zip(held, coeffs):
            if tuple(tensor.shape) != tuple(weights[name].shape):
                raise ValueError(f"update of {name!r} has shape {tuple(tensor.shape)}, expected "
                                 f"{tuple(weights[name].shape)}")
            acc += w * tensor.detach().to(torch.float64)
        out[name] = acc.to(weights[name].dtype)
    return out


class CAFF(FinetuningMethod):
    """Constraint-aware federated finetuning of pretrained tiny transformers (see the module docstring).

    Options: ``pretrained`` (None → ``ServerContext.pretrained``), ``layers`` (candidate depths, None →
    all available), ``architecture`` (None → Eq. 3; an int fixes ``l``), ``trained_layers`` (None → each device's
    largest ``t_c`` within its budgets; an int ``t`` → every device trains ``F_l^t``, needs ``architecture``),
    ``devices`` (budgets of the population for Eq. 2), ``budgets`` (``{group: budget dict}``), ``resource_table``
    (None → measured at ``init``).
    """

    name = "caff"
    options: dict = {"pretrained": None, "layers": None, "architecture": None, "trained_layers": None,
                     "devices": None, "budgets": None, "resource_table": None}

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        check_group_budgets(self.config["budgets"])
        if self.config["architecture"] is not None and (isinstance(self.config["architecture"], bool)
                                                        or not isinstance(self.config["architecture"], int)):
            raise ValueError(f"option architecture must be an int number of layers or None, "
                             f"got {self.config['architecture']!r}")
        fixed, architecture = self.config["trained_layers"], self.config["architecture"]
        if fixed is not None:
            if isinstance(fixed, bool) or not isinstance(fixed, int) or fixed < 1:
                raise ValueError(f"option trained_layers must be an int >= 1 (the last t blocks every device trains) "
                                 f"or None, got {fixed!r}")
            if architecture is None:
                raise ValueError(f"option trained_layers={fixed} needs option architecture (the depth l of F_l^t)")
            if fixed > architecture:
                raise ValueError(f"option trained_layers={fixed} exceeds architecture={architecture}: accepted "
                                 f"1..{architecture}")

    # ----- helpers -----------------------------------------------------------------------------------
    def _pretrained_source(self, ctx: ServerContext) -> Any:
        return pretrained_source(self.config["pretrained"], ctx, self.name)

    def candidate_depths(self, ctx: ServerContext) -> list[int]:
        """The depths ``l`` CAFF chooses among."""
        source = self._pretrained_source(ctx)
        available = pretrained_depths(source, ctx)
        if available is None:  # "none": the family's depths
            available = [3, 6, 9, 12]
        wanted = self.config["layers"]
        if wanted is not None:
            missing = sorted(set(int(l) for l in wanted) - set(available))
            if missing and not (source == "none"):
                raise ValueError(f"option layers asks for depths {missing} that have no pretrained weights "
                                 f"(available: {available})")
            available = sorted(int(l) for l in wanted)
        if self.config["architecture"] is not None and self.config["architecture"] not in available:
            raise ValueError(f"option architecture={self.config['architecture']} is not a candidate depth {available}")
        return available

    @staticmethod
    def _kind(ctx: ServerContext) -> str:
        return model_kind(ctx)

    def _pretrained_state(self, ctx: ServerContext, layers: int) -> Mapping[str, torch.Tensor] | None:
        return pretrained_state(self._pretrained_source(ctx), ctx, layers)

    def _table(self, ctx: ServerContext, depths: Sequence[int]) -> pd.DataFrame:
        given = self.config["resource_table"]
        if given is not None:
            return freeze_rows(given)
        models = {l: ctx.model_fn(layers=l) for l in depths}
        return freeze_rows(measure_resource_table(models, measurement_batch(ctx), optimizer=optimizer_state(ctx)))

    def _population(self, ctx: ServerContext | None) -> list[Any] | None:
        return declared_population(self.config["devices"], ctx)

    def _budget(self, profile: ClientProfile, ctx: ServerContext | None = None) -> DeviceBudget:
        """Per constraint: the profile's own budget, else the declared device of the same id, else the group's."""
        return resolve_budget(profile, self._population(ctx), self.config["budgets"])

    def _select(self, state: ServerState, ctx: ServerContext, population: Sequence[Any]) -> None:
        table = state["table"]
        selection = select_architecture(table, population, self.config["architecture"])
        model = ctx.model_fn(layers=selection.layers)
        pretrained = self._pretrained_state(ctx, selection.layers)
        skipped = load_pretrained(model, pretrained) if pretrained is not None else []
        state.update({"weights": clone_tensors(model.state_dict()), "layers": selection.layers,
                      "selection": {"layers": selection.layers, "mean_trained": selection.mean_trained,
                                    "candidates": {str(k): v for k, v in selection.candidates.items()},
                                    "population": len(selection.trained), "not_loaded": skipped}})

    def _fixed_trained_layers(self, table, layers: int, budget: DeviceBudget) -> int:
        """Option ``trained_layers``' ``t``; ``ValueError`` when ``F_l^t`` exceeds one of the device's budgets."""
        t = int(self.config["trained_layers"])
        rows = freeze_rows(table)
        row = rows[(rows["layers"] == int(layers)) & (rows["trained"] == t)]
        if row.empty:
            raise ValueError(f"resource_table has no row for F_{layers}^{t} (option trained_layers={t})")
        if violated_constraints(row.iloc[0], budget):
            raise ValueError(f"device {budget.device} cannot train F_{layers}^{t} (option trained_layers={t}): it "
                             f"exceeds {exceeded(row.iloc[0], budget, f't={t}')}")
        return t

    # ----- server side -------------------------------------------------------------------------------
    def init(self, ctx: ServerContext) -> ServerState:
        depths = self.candidate_depths(ctx)
        table = self._table(ctx, depths)
        table = table[table["layers"].isin(depths)].reset_index(drop=True)
        state: ServerState = {"weights": None, "layers": None, "selection": None,
                              "table": table.to_dict(orient="records"), "last_round": []}
        population = self._population(ctx)
        if population is not None:
            self._select(state, ctx, population)
        return state

    def configure(self, state: ServerState, round: int, clients: Sequence[ClientProfile],
                  ctx: ServerContext) -> dict[int, Task]:
        budgets = {p.client_id: self._budget(p, ctx) for p in clients}
        if state["layers"] is None:  # Eq. (2)-(3) over the first round's devices (see the module docstring)
            self._select(state, ctx, list(budgets.values()))
        layers, table = state["layers"], state["table"]
        tasks = {}
        fixed = self.config["trained_layers"]
        for profile in clients:
            if fixed is not None:
                t = self._fixed_trained_layers(table, layers, budgets[profile.client_id])
            else:
                t = trainable_layers(table, layers, budgets[profile.client_id])
            if t < 1:
                raise ValueError(f"client {profile.client_id} cannot train one layer of the selected F_{layers}: it "
                                 f"exceeds {binding_constraints(table, layers, budgets[profile.client_id])}; declare "
                                 f"the whole population with option devices= so that Eq. (2) accounts for it")
            config = {"train": ctx.train_config(round), "layers": layers, "trained_layers": t,
                      "group": profile.group, "task": ctx.task}
            tasks[profile.client_id] = Task(profile.client_id, round, state["weights"], config)
        return tasks

    def aggregate(self, state: ServerState, round: int, updates: Sequence[Update],
                  ctx: ServerContext) -> ServerState:
        weights = layerwise_average(state["weights"], [(u.tensors, u.n_samples) for u in updates])
        last = [{"client": u.client_id, "trained_layers": int(u.stats["trained_layers"]),
                 "group": str(u.stats.get("group", ""))} for u in updates]
        return {**state, "weights": weights, "last_round": last}

    def round_metrics(self, state: ServerState, round: int) -> dict[tuple[str, str], float]:
        rows = state.get("last_round") or []
        if not rows:
            return {}
        return {**group_means(rows, "trained_layers", "trained_layers"),
                ("architecture_layers", "global"): float(state["layers"])}

    def evaluation_models(self, state: ServerState, ctx: ServerContext) -> dict[str, nn.Module]:
        model = ctx.model_fn(layers=state["layers"])
        model.load_state_dict(state["weights"])
        return {"global": model}

    # ----- client side -------------------------------------------------------------------------------
    def local_update(self, task: Task, data: ClientDataset, ctx: ClientContext) -> Update:
        cfg = task.config
        model = ctx.model_fn(layers=cfg["layers"]).to(ctx.device)
        model.load_state_dict(task.tensors)
        freeze_for_finetuning(model, int(cfg["trained_layers"]))
        stats = train_transformer(model, data, cfg, ctx)
        trained = set(trainable_parameter_names(model))
        upload = clone_tensors({k: v for k, v in model.state_dict().items() if k in trained})
        return Update(task.client_id, upload, len(data),
                      {**stats, "trained_layers": int(cfg["trained_layers"]), "group": cfg.get("group", "")})


__all__ = ["CAFF", "CONSTRAINTS", "CONSTRAINT_COLUMNS", "DeviceBudget", "Selection", "as_budget",
           "binding_constraints", "device_layers", "feasible_architectures", "freeze_rows", "layerwise_average",
           "select_architecture", "trainable_layers", "violated_constraints"]
