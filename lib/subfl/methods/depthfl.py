"""DepthFL — depth-wise federated finetuning with early exits: the depth baseline of CAFF (Pfeiffer, Ahmed, Khalili &
Henkel, "Efficient Federated Finetuning of Tiny Transformers with Resource-Constrained Devices"), after Kim, Kim,
Hwang & Yang, "DepthFL: Depthwise Federated Learning for Heterogeneous Clients" (ICLR 2023).

The server keeps one pretrained tiny transformer ``F_l`` (:mod:`subfl.models.transformers`) with an **early exit
after every block** (:class:`EarlyExitTransformer`): exit ``i`` (``1 ≤ i ≤ l``) is a LayerNorm and a linear head to the
classes / vocabulary, the same form as the model's final head, read out as the model reads out (every position of
a language model, the class token or mean token of a ViT). Exit ``l`` *is* the model's own final LayerNorm and head
(state names ``norm.*``, ``head.*``, pretrained weights); exits ``1 … l−1`` are ``exits.<i>.norm.*`` /
``exits.<i>.head.*``. Each round, for each device ``c``:

1. **Depth per device.** Every depth ``d = 1 … l`` — the first ``d`` blocks and their ``d`` exits trained, the input
   embeddings frozen — is measured once at ``init`` (:func:`depthfl_resource_table`: the truncated model, measured
   with :func:`subfl.costs.finetuning.training_step_cost` — peak training memory, upload bytes of the trained
   parameters, GFLOPs per mini-batch, with the DepthFL loss below — as CAFF measures its configurations; or option
   ``resource_table``, rows with ``depth, memory_mb, upload_mb, gflops``, rows of another depth ``layers`` ignored
   when that column exists). The device gets the largest ``d_c`` whose three costs fit its budgets
   (:func:`~subfl.methods.finetuning_common.assign_largest`; a cost equal to the budget fits; equal costs → the deeper model), budgets resolved as
   CAFF's (:func:`~subfl.methods.finetuning_common.resolve_budget`: profile fields, option ``devices`` /
   ``ServerContext.devices``, option ``budgets`` by group). A device that fits no depth raises
   ``ValueError`` naming it and the constraint(s) depth 1 exceeds.
2. **Download** (:func:`depth_payload`): the embeddings, the first ``d_c`` blocks and exits ``1 … d_c`` (the final
   LayerNorm and head only when ``d_c = l``) — a device of depth ``d_c`` holds nothing deeper (DepthFL's local model).
3. **Local loss** (:func:`depthfl_loss`) over the device's exit logits ``z_1 … z_d`` (``d = d_c``) with targets ``y``,
   ``λ`` = option ``distill_weight`` (default 1), ``T`` = option ``temperature`` (default 1)::

       L = Σ_{i=1..d} CE(z_i, y)  +  λ · Σ_{i=1..d} T² · KL( q_{−i} ‖ softmax(z_i / T) ),
       q_{−i} = stopgrad( (1 / (d − 1)) · Σ_{j≠i} softmax(z_j / T) ),
       KL(q ‖ p) = Σ_k q_k (log q_k − log p_k), averaged over samples (a language model: over all B·T positions).

   ``CE`` is the task loss of :func:`~subfl.fl.training.default_loss` (a language model: the next-token loss over
   every position of the window, as :func:`~subfl.methods.finetuning_common.train_transformer` trains CAFF). With
   ``d = 1`` (or ``λ = 0``) there is no distillation term: ``L = CE(z_1, y)``.
4. **Upload**: what trained — the first ``d_c`` blocks and their exits (embeddings never change, never sent back).
5. **Aggregation** (:func:`~subfl.methods.caff.layerwise_average`, CAFF's Eqs. 4–5): every block and every exit
   becomes the average over the devices that trained it, weighted by their data sizes ``n_c``; blocks and exits
   nobody trained (and the embeddings) keep their value.
6. **Evaluation**: group ``"global"`` is DepthFL's inference, the ensemble of all ``l`` exits of the global model —
   the mean of their softmax probabilities, returned as log-probabilities (:class:`ExitEnsemble`, so the engine's
   cross-entropy and argmax apply unchanged); groups ``"exit1"`` … ``"exit{l}"`` score each exit alone
   (:class:`ExitOutput`; ``exit{l}`` is the finetuned ``F_l`` itself).

Choices where the papers are silent:

* **Exit heads of a pretrained model.** Exits ``1 … l−1`` start as copies of the pretrained final LayerNorm and head
  (the pretrained model has only the one head; its features after every pre-LN block live in the same residual
  stream, so the final read-out is the natural starting point); exit ``l`` keeps the pretrained weights. (A ViT head
  whose class count differs from the pretraining task's is re-initialised by
  :func:`~subfl.models.transformers.load_pretrained`, and the exits copy that.)
* **What trains.** The first ``d_c`` blocks and exits; the token / position / patch embeddings and the class token
  are frozen, as CAFF freezes them (DepthFL trains from scratch and so trains them).
* **Depth choice.** DepthFL assigns a depth per resource group; here the depth comes from the measured resources
  against the device's three budgets, the same rule as CAFF's ``t_c`` and the other baselines.
* **Self-distillation.** DepthFL's mutual self-distillation distils each classifier from the other classifiers of
  the device's model; here each exit matches the detached *mean* of the others' softened predictions (one KL term
  per exit; for ``d_c = 2`` the two forms coincide). The ``T²`` factor keeps the distillation gradient's scale
  independent of ``T`` (Hinton et al., 2015); with the default ``T = 1`` it is 1. The task losses of the exits are
  summed, not averaged.
* **Measurement.** The resource table is measured with this loss (task losses of all exits + distillation, the
  targets' values do not change costs), so the exits' activations count towards the peak memory; the FLOP counter
  counts matrix products only (the exits' heads, not the softmaxes).
* **Depth and pretrained weights**: as for :mod:`subfl.methods.hetlora` — option ``architecture`` (else the
  configured model's depth), weights from option ``pretrained`` / ``ServerContext.pretrained`` (a
  ``{l: state_dict}`` mapping, ``"ci"`` / ``"cpu"`` / ``"paper"``, or ``"none"``).
* **Zero-sample devices** take part with weight 0 (uniform if every device holding a tensor has ``n_c = 0``).

:meth:`DepthFL.round_metrics` reports ``trained_layers`` (mean ``d_c`` of the round, per group and ``global``: the
number of trained blocks, as CAFF reports its ``t_c``).
"""
from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from numbers import Real
from typing import Any

import pandas as pd
import torch
from torch import nn
from torch.nn import functional as F

from ..costs.finetuning import in_table_units, sequence_loss, training_step_cost
from ..fl.training import ClientDataset, default_loss
from ..fl.types import ClientProfile, Task, Update
from ..models.transformers import (EMBEDDING_NAMES, embed_inputs, read_out, trainable_parameter_names,
                                   transformer_blocks)
from ..fl.method import ClientContext, ServerContext, ServerState, clone_tensors
from .caff import layerwise_average
from .fedhm import freeze_embeddings
from .finetuning_common import (FinetuningMethod, DeviceBudget, check_architecture, check_group_budgets,
                                assign_largest, declared_population, fixed_depth, group_means, measurement_batch,
                                optimizer_state, pretrained_model, pretrained_source, resolve_budget, rows_for,
                                table_rows, train_transformer)

_COPIED_ATTRIBUTES: tuple[str, ...] = ("context_length", "vocab_size", "image_size", "pool")
"""Plain attributes of TinyGPT / TinyViT that :func:`~subfl.models.transformers.embed_inputs` and
:func:`~subfl.models.transformers.read_out` read."""


# ----- options ------------------------------------------------------------------------------------------------------
def check_distill_weight(value: Any) -> float:
    """Option ``distill_weight`` as a float: a finite number >= 0."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value < 0:
        raise ValueError(f"option distill_weight must be a finite number >= 0 (0: no self-distillation; default 1.0), "
                         f"got {value!r}")
    return float(value)


def check_temperature(value: Any) -> float:
    """Option ``temperature`` as a float: a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"option temperature must be a finite number > 0 (default 1.0), got {value!r}")
    return float(value)


# ----- the model with early exits -------------------------------------------------------------------------------------
class ExitHead(nn.Module):
    """An early exit: a LayerNorm and a linear head (the form of a tiny transformer's final ``norm`` / ``head``)."""

    def __init__(self, norm: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.norm = norm
        self.head = head


class EarlyExitTransformer(nn.Module):
    """The first ``depth`` blocks of a tiny transformer ``model`` (``l`` blocks) with an exit after each.

    Holds (shares, not copies) ``model``'s embeddings and first ``depth`` blocks; exit ``i < l`` is ``exits[str(i)]``
    (an :class:`ExitHead`), exit ``l`` is ``model.norm`` / ``model.head`` (present only when ``depth = l``). State
    names are those of ``model`` plus ``exits.<i>.norm.*`` / ``exits.<i>.head.*``, the same at every depth, so a
    truncated model's state is a subset of the full one's. ``exits``: the heads of exits ``1 … l−1`` (a mapping by
    ``str(i)``; e.g. another instance's ``.exits``, to share them); default: fresh copies of ``model.norm`` and
    ``model.head``. ``forward`` returns the ``depth`` exits' logits, shallowest first.
    """

    def __init__(self, model: nn.Module, depth: int, exits: Mapping[str, nn.Module] | None = None) -> None:
        super().__init__()
        blocks = transformer_blocks(model)
        layers = len(blocks)
        if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= layers:
            raise ValueError(f"depth must be an int in [1, {layers}] (the model has {layers} blocks), got {depth!r}")
        if getattr(model, "tie_weights", False):
            raise ValueError("DepthFL needs an untied head (tie_weights=False): it freezes the token embedding but "
                             "trains the heads")
        self.layers, self.depth = layers, depth
        for name in EMBEDDING_NAMES:
            value = getattr(model, name, None)
            if value is not None:
                setattr(self, name, value)
        for name in _COPIED_ATTRIBUTES:
            if hasattr(model, name):
                setattr(self, name, getattr(model, name))
        self.blocks = nn.ModuleList(list(blocks)[:depth])
        if exits is None:
            exits = {str(i): ExitHead(copy.deepcopy(model.norm), copy.deepcopy(model.head)) for i in range(1, layers)}
        missing = [i for i in range(1, min(depth, layers - 1) + 1) if str(i) not in exits]
        if missing:
            raise ValueError(f"exits lacks the heads of exit(s) {missing}")
        self.exits = nn.ModuleDict({str(i): exits[str(i)] for i in range(1, min(depth, layers - 1) + 1)})
        if depth == layers:
            self.norm, self.head = model.norm, model.head

    def exit_head(self, i: int) -> tuple[nn.Module, nn.Module]:
        """The LayerNorm and head of exit ``i`` (``1 ≤ i ≤ depth``)."""
        if i == self.layers:
            return self.norm, self.head
        exit_ = self.exits[str(i)]
        return exit_.norm, exit_.head

    def forward(self, inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        x = embed_inputs(self, inputs)
        outputs = []
        for i, block in enumerate(self.blocks, start=1):
            x = block(x)
            outputs.append(read_out(self, x, *self.exit_head(i)))
        return tuple(outputs)


def early_exit_model(model: nn.Module) -> EarlyExitTransformer:
    """``model`` (pretrained weights loaded) with exits after every block: exits ``1 … l−1`` copies of its final
    LayerNorm and head, exit ``l`` its own."""
    return EarlyExitTransformer(model, len(transformer_blocks(model)))


def depth_views(net: EarlyExitTransformer, model: nn.Module) -> dict[int, EarlyExitTransformer]:
    """``{d: the first d blocks and exits of net}`` for ``d = 1 … l``, sharing ``net``'s parameters (``model`` is
    the transformer ``net`` was built from); ``d = l`` is ``net`` itself."""
    return {d: net if d == net.layers else EarlyExitTransformer(model, d, exits=net.exits)
            for d in range(1, net.layers + 1)}


def _net(model_fn: Callable[..., nn.Module], layers: int, depth: int) -> EarlyExitTransformer:
    return EarlyExitTransformer(model_fn(layers=layers), depth)


def in_depth(name: str, depth: int, layers: int) -> bool:
    """Whether the tensor ``name`` of the global model belongs to a device of depth ``depth``: ``blocks.<i>`` with
    ``i < depth`` (0-based blocks), ``exits.<i>`` with ``i ≤ depth`` (1-based exits), ``norm`` / ``head`` (exit
    ``l``) when ``depth = layers``, and every embedding."""
    top, _, rest = name.partition(".")
    if top == "blocks":
        return int(rest.split(".", 1)[0]) < depth
    if top == "exits":
        return int(rest.split(".", 1)[0]) <= depth
    if top in ("norm", "head"):
        return depth == layers
    return True


def depth_payload(weights: Mapping[str, torch.Tensor], depth: int, layers: int) -> dict[str, torch.Tensor]:
    """The tensors a device of depth ``depth`` receives (:func:`in_depth`): exactly the state of
    ``EarlyExitTransformer(model, depth)``."""
    return {name: value for name, value in weights.items() if in_depth(name, depth, layers)}


# ----- the loss -------------------------------------------------------------------------------------------------------
def _class_rows(logits: torch.Tensor) -> torch.Tensor:
    """Logits ``(B, C)`` as they are, ``(B, T, V)`` as ``(B·T, V)`` (one row per predicted position)."""
    return logits.reshape(-1, logits.shape[-1])


def self_distillation(outputs: Sequence[torch.Tensor], temperature: float = 1.0) -> torch.Tensor:
    """``Σ_i T² · KL(q_{−i} ‖ softmax(z_i / T))`` with ``q_{−i}`` the detached mean of the other exits' softmax(z_j / T)
    (the module docstring's formula); the KL averaged over samples / positions. 0 for a single exit."""
    if len(outputs) < 2:
        return outputs[0].new_zeros(())
    t = float(temperature)
    probs = [F.softmax(_class_rows(z) / t, dim=-1) for z in outputs]
    total = sum(p.detach() for p in probs)
    loss = outputs[0].new_zeros(())
    for z, p in zip(outputs, probs):
        teacher = (total - p.detach()) / (len(outputs) - 1)
        loss = loss + F.kl_div(F.log_softmax(_class_rows(z) / t, dim=-1), teacher, reduction="batchmean")
    return loss * t * t


def depthfl_loss(outputs: Sequence[torch.Tensor], inputs: torch.Tensor, targets: torch.Tensor, *,
                 distill_weight: float = 1.0, temperature: float = 1.0) -> torch.Tensor:
    """DepthFL's local loss (the module docstring's formula): the task loss of every exit
    (:func:`~subfl.fl.training.default_loss` — class cross-entropy, or a language model's next-token loss over every
    position built from ``inputs``) summed, plus ``distill_weight`` · :func:`self_distillation` when there are two or
    more exits."""
    loss = sum(default_loss(z, inputs, targets) for z in outputs)
    if len(outputs) > 1 and distill_weight > 0:
        loss = loss + distill_weight * self_distillation(outputs, temperature)
    return loss


def measurement_loss(outputs: Sequence[torch.Tensor], *, distill_weight: float = 1.0,
                     temperature: float = 1.0) -> torch.Tensor:
    """:func:`depthfl_loss` with placeholder targets (:func:`~subfl.costs.finetuning.sequence_loss` per exit): what the
    resource table measures (target values do not change costs)."""
    loss = sum(sequence_loss(z) for z in outputs)
    if len(outputs) > 1 and distill_weight > 0:
        loss = loss + distill_weight * self_distillation(outputs, temperature)
    return loss


# ----- evaluation -----------------------------------------------------------------------------------------------------
def log_mean_softmax(outputs: Sequence[torch.Tensor]) -> torch.Tensor:
    """``log((1/n) Σ_i softmax(z_i))`` over the last axis, computed stably as
    ``logsumexp_i log_softmax(z_i) − log n``."""
    stacked = torch.stack([F.log_softmax(z, dim=-1) for z in outputs])
    return torch.logsumexp(stacked, dim=0) - math.log(len(outputs))


class ExitEnsemble(nn.Module):
    """DepthFL's inference: the mean of the softmax probabilities of all exits of ``net``, as log-probabilities."""

    def __init__(self, net: EarlyExitTransformer) -> None:
        super().__init__()
        self.net = net

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return log_mean_softmax(self.net(inputs))


class ExitOutput(nn.Module):
    """The logits of the deepest exit of ``net`` (exit ``net.depth``)."""

    def __init__(self, net: EarlyExitTransformer) -> None:
        super().__init__()
        self.net = net

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.net(inputs)[-1]


# ----- resources and depth choice -------------------------------------------------------------------------------------
def depthfl_resource_table(model: nn.Module, batch: torch.Tensor, *, optimizer: str = "adamw",
                           distill_weight: float = 1.0, temperature: float = 1.0) -> pd.DataFrame:
    """One row per depth ``d = 1 … l``: ``layers, depth`` and :func:`~subfl.costs.finetuning.in_table_units` of
    :func:`~subfl.costs.finetuning.training_step_cost` of the truncated model (first ``d`` blocks and exits trained,
    embeddings frozen) with :func:`measurement_loss`. ``model`` is not changed."""
    base = copy.deepcopy(model)
    views = depth_views(early_exit_model(base), base)
    freeze_embeddings(views[len(views)])
    layers = len(views)
    loss_fn = lambda outputs: measurement_loss(outputs, distill_weight=distill_weight,  # noqa: E731
                                               temperature=temperature)
    rows = [{"layers": layers, "depth": d,
             **in_table_units(training_step_cost(net, batch, optimizer=optimizer, loss_fn=loss_fn))}
            for d, net in views.items()]
    return pd.DataFrame(rows)


def depth_rows(resource_table: pd.DataFrame | Sequence[Mapping[str, Any]], layers: int) -> dict[int, dict[str, Any]]:
    """``{d: its row}`` for ``d = 1 … layers`` of a resource table (rows of depth ``layers`` when that column exists);
    ``ValueError`` naming a depth without a row."""
    rows = table_rows(resource_table, "depth", layers=layers)
    return {int(d): row for d, row in rows_for(rows, "depth", list(range(1, int(layers) + 1))).items()}


# ----- the method -----------------------------------------------------------------------------------------------------
class DepthFL(FinetuningMethod):
    """Depth-wise finetuning of a pretrained tiny transformer with early exits (see the module docstring).

    Options: ``pretrained`` (None → ``ServerContext.pretrained``), ``architecture`` (None → the configured
    model's depth), ``devices`` (declared budgets by device id), ``budgets`` (``{group: budget dict}``),
    ``resource_table`` (None → measured at ``init``), ``distill_weight`` (``λ`` >= 0, default 1.0), ``temperature``
    (``T`` > 0, default 1.0).
    """

    name = "depthfl"
    options: dict = {"pretrained": None, "architecture": None, "devices": None, "budgets": None,
                     "resource_table": None, "distill_weight": 1.0, "temperature": 1.0}

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.distill_weight = check_distill_weight(self.config["distill_weight"])
        self.temperature = check_temperature(self.config["temperature"])
        check_group_budgets(self.config["budgets"])
        check_architecture(self.config["architecture"])

    # ----- server side -------------------------------------------------------------------------------
    def budget(self, profile: ClientProfile, ctx: ServerContext | None = None) -> DeviceBudget:
        """The device's budgets (as CAFF resolves them)."""
        return resolve_budget(profile, declared_population(self.config["devices"], ctx), self.config["budgets"])

    def init(self, ctx: ServerContext) -> ServerState:
        source = pretrained_source(self.config["pretrained"], ctx, self.name)
        layers = fixed_depth(self.config["architecture"], source, ctx)
        model, skipped = pretrained_model(ctx, source, layers)
        table = self.config["resource_table"]
        if table is None:
            table = depthfl_resource_table(model, measurement_batch(ctx), optimizer=optimizer_state(ctx),
                                           distill_weight=self.distill_weight, temperature=self.temperature)
        rows = depth_rows(table, layers)
        net = early_exit_model(model)
        return {"weights": clone_tensors(net.state_dict()), "layers": layers, "table": list(rows.values()),
                "not_loaded": skipped, "last_round": []}

    def configure(self, state: ServerState, round: int, clients: Sequence[ClientProfile],
                  ctx: ServerContext) -> dict[int, Task]:
        rows = {int(row["depth"]): row for row in state["table"]}
        layers = int(state["layers"])
        tasks = {}
        for profile in clients:
            depth = int(assign_largest(rows, self.budget(profile, ctx), "DepthFL depth", "depth"))
            config = {"train": ctx.train_config(round), "layers": layers, "depth": depth,
                      "distill_weight": self.distill_weight, "temperature": self.temperature,
                      "group": profile.group, "task": ctx.task}
            tasks[profile.client_id] = Task(profile.client_id, round, depth_payload(state["weights"], depth, layers),
                                            config)
        return tasks

    def aggregate(self, state: ServerState, round: int, updates: Sequence[Update],
                  ctx: ServerContext) -> ServerState:
        weights = layerwise_average(state["weights"], [(u.tensors, u.n_samples) for u in updates])
        last = [{"client": u.client_id, "depth": int(u.stats["depth"]), "group": str(u.stats.get("group", ""))}
                for u in updates]
        return {**state, "weights": weights, "last_round": last}

    def round_metrics(self, state: ServerState, round: int) -> dict[tuple[str, str], float]:
        return group_means(state.get("last_round") or [], "depth", "trained_layers")

    def evaluation_models(self, state: ServerState, ctx: ServerContext) -> dict[str, nn.Module]:
        layers = int(state["layers"])
        model = ctx.model_fn(layers=layers)
        net = early_exit_model(model)
        net.load_state_dict(state["weights"])
        models: dict[str, nn.Module] = {"global": ExitEnsemble(net)}
        models.update({f"exit{d}": ExitOutput(view) for d, view in depth_views(net, model).items()})
        return models

    # ----- client side -------------------------------------------------------------------------------
    def local_update(self, task: Task, data: ClientDataset, ctx: ClientContext) -> Update:
        cfg = task.config
        depth = int(cfg["depth"])
        net = freeze_embeddings(_net(ctx.model_fn, int(cfg["layers"]), depth)).to(ctx.device)
        net.load_state_dict(task.tensors)
        weight, temperature = float(cfg["distill_weight"]), float(cfg["temperature"])
        stats = train_transformer(net, data, cfg, ctx, loss_fn=lambda outputs, x, y: depthfl_loss(
            outputs, x, y, distill_weight=weight, temperature=temperature))
        trained = set(trainable_parameter_names(net))
        upload = clone_tensors({k: v for k, v in net.state_dict().items() if k in trained})
        return Update(task.client_id, upload, len(data), {**stats, "depth": depth, "group": cfg.get("group", "")})


__all__ = ["DepthFL", "EarlyExitTransformer", "ExitEnsemble", "ExitHead", "ExitOutput",
           "check_distill_weight", "check_temperature", "depth_payload", "depth_rows", "depth_views",
           "depthfl_loss", "depthfl_resource_table", "early_exit_model", "in_depth", "log_mean_softmax",
           "measurement_loss", "self_distillation"]
