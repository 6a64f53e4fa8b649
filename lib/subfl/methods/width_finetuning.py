"""Width-slicing finetuning baselines of CAFF (Pfeiffer, Ahmed, Khalili & Henkel, "Efficient Federated Finetuning of
Tiny Transformers with Resource-Constrained Devices"): HeteroFL (Diao, Ding & Tarokh, ICLR 2021), FjORD (Horváth et
al., NeurIPS 2021) and FedRolex (Alam, Liu, Yan & Zhang, NeurIPS 2022) applied to a *pretrained* tiny transformer
``F_l`` (:mod:`subfl.models.transformers`), registered as ``heterofl-ft``, ``fjord-ft`` and ``fedrolex-ft``.

The server keeps the full-width pretrained ``F_l``. Each round, for each device:

1. **Width per device** (CAFF appendix, Eq. 7). Every candidate scale ``s`` of option ``widths`` (default
   ``(1.0, 0.5, 0.25, 0.125)``) scales every linear map of the model: the ``s``-width sub-model is
   ``model_fn(layers=l, width=w·s)`` (``w``: the configured width, normally 1), which keeps the number of heads and
   scales the head dimension (``embed_dim = heads · scaled_channels(embed_dim / heads, w·s)``), hence the residual
   stream, the MLP hidden size and the head's input. Each ``s`` is measured once at ``init``
   (:func:`width_resource_table`: one training step of the ``s``-width sub-model with frozen embeddings on
   :func:`~subfl.methods.finetuning_common.measurement_batch`, through :func:`subfl.costs.finetuning.training_step_cost`
   — peak training memory, upload bytes of the trained parameters, GFLOPs per mini-batch — as CAFF measures its
   configurations; or option ``resource_table``, rows with ``width, memory_mb, upload_mb, gflops``, rows of another
   depth ``layers`` ignored when that column exists). A device gets the largest ``s`` whose three costs fit its
   budgets (:func:`~subfl.methods.finetuning_common.assign_largest`; a cost equal to the budget fits; equal costs → the larger width), budgets resolved
   as CAFF's (:func:`~subfl.methods.finetuning_common.resolve_budget`: profile fields, option ``devices`` /
   ``ServerContext.devices``, option ``budgets`` by group). A device that fits no width raises
   ``ValueError`` naming it and the constraint(s) the smallest width exceeds.
2. **Download**: the device's slice of the global model (:func:`head_aware_indices`,
   :func:`~subfl.models.slicing.extract`), frozen embeddings included.
3. **Local training**: every block, the final LayerNorm and the head train; the token / position / patch embeddings
   and the class token are frozen (as CAFF freezes them). A language model is trained with the next-token loss over
   every window position, a ViT with cross-entropy (:func:`~subfl.methods.finetuning_common.train_transformer`).

   * ``heterofl-ft``: the head-aware *leading* slice of width ``s``, trained as it is.
   * ``fedrolex-ft``: the head-aware *rolling window* of width ``s`` (below), trained as it is.
   * ``fjord-ft``: the device receives the leading slice at its cap ``s``; each mini-batch trains the head-aware
     leading sub-network of a width drawn uniformly from the candidate widths ``≤ s`` (ordered dropout,
     :class:`HeadAwareOrderedDropout`); the draws are returned in ``Update.stats["width_counts"]``.

4. **Upload**: only what trained (blocks, final LayerNorm, head; never the embeddings).
5. **Aggregation** (HeteroFL Sec. 3.2, FedRolex Eq. 3; :func:`~subfl.models.slicing.average_slices`): every entry of
   the global model becomes the average over the devices that trained it, weighted by their data sizes ``n_c``;
   entries nobody trained (and the embeddings) keep the server's value.
6. **Evaluation**: ``"global"`` (the full-width model) and, for every width assigned so far, the head-aware leading
   slice of that width, named ``f"{s:g}"`` (``"0.5"``; FedRolex's sub-models are evaluated as leading slices too, as
   in :mod:`subfl.methods.width`).

**Head-aware slicing.** :mod:`subfl.models.slicing` slices every dimension by its leading (or rolling) units. For
the ``q``, ``k``, ``v`` output channels and the ``proj`` input channels that would *regroup heads*: at width 0.5 the
sub-model's head 1 would be made of the second half of the global head 0. Here those channels keep, for each head
``h`` of ``H``, its own channels ``h·d + window(d, d_s, offset)`` (``d`` / ``d_s``: the global / sub head dimension,
:func:`head_channels`), so sub-model head ``h`` is a part of global head ``h``. Every other sliced dimension (the
residual stream and everything on it — embeddings, LayerNorms, the q/k/v inputs, the proj / fc2 outputs, the head's
input — and the MLP hidden units) uses :func:`~subfl.models.slicing.slice_indices` as it is, called tensor by
tensor (a transformer has no convolution → linear flatten boundary, so this equals one call on the whole state dict,
and no coincidence of shapes can be taken for such a boundary). Attention maps are found by module type
(:class:`~subfl.models.transformers.Attention`), not by name.

**Rolling window** (FedRolex, ``fedrolex-ft``; CAFF appendix, Eqs. 8–9): in round ``t`` (``r = t − 1``), a
dimension of ``K`` units of which a sub-model keeps ``k`` keeps ``{(r + i) mod K : i < k}`` (option ``roll="unit"``,
the paper) or starts at ``r·k mod K`` (``roll="window"``), the same rule as :class:`~subfl.methods.width.FedRolex`;
within each head the window runs over the head's ``d`` channels with the same rule.

Choices where the papers are silent:

* **No HeteroFL scaler.** HeteroFL divides hidden outputs by ``s`` in training; for a pre-LN transformer every
  LayerNorm renormalises the residual stream anyway, and dividing the ``q`` and ``k`` outputs by ``s`` would change
  the attention temperature by ``1/s²`` — so the scaler is off for all three methods (FedRolex's code inherits it,
  FjORD has none).
* **Attention temperature.** A sub-model's attention scales its scores by ``1/√d_s`` (its own head dimension), as the
  width-``s`` architecture does; only the parameters are shared.
* **What trains** (as CAFF and the other finetuning baselines): blocks, final LayerNorm and head; embeddings frozen
  and never uploaded.
* **FjORD's widths.** The ordered-dropout widths are the candidate widths of option ``widths`` (the same set the
  budgets choose from); no self-distillation. The resource table measures the cap-width sub-model, the most
  expensive network a device runs. Aggregation counts a device as having trained its whole cap slice.
* **Evaluation widths** are those assigned to the devices that have taken part so far (FjORD: their caps).
* **Depth and pretrained weights**: as for :mod:`subfl.methods.hetlora` — option ``architecture`` (else the
  configured model's depth), weights from option ``pretrained`` / ``ServerContext.pretrained`` (a
  ``{l: state_dict}`` mapping, ``"ci"`` / ``"cpu"`` / ``"paper"``, or ``"none"``).
* **Zero-sample devices** take part with weight 0 (an entry only they hold keeps the server's value).

:meth:`WidthFinetuning.round_metrics` reports ``width`` (mean assigned width of the round, per group and ``global``).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import chain
from numbers import Real
from typing import Any

import pandas as pd
import torch
from torch import nn

from ..costs.finetuning import in_table_units, training_step_cost
from ..fl.training import ClientDataset
from ..fl.types import ClientProfile, Task, Update
from ..models.slicing import (Offset, SliceIndices, _offset_for, average_slices, extract, slice_indices, state_shapes,
                              window)
from ..models.transformers import Attention, trainable_parameter_names
from ..fl.method import ClientContext, Method, ServerContext, ServerState, clone_tensors
from .fedhm import freeze_embeddings
from .finetuning_common import (FinetuningMethod, DeviceBudget, check_architecture, check_group_budgets,
                                assign_largest, declared_population, fixed_depth, group_means, measurement_batch,
                                optimizer_state, pretrained_model, pretrained_source, resolve_budget, rows_for,
                                table_rows, train_transformer)
from .width import FedRolex, _OrderedDropout, global_width, level_name, model_width

DEFAULT_WIDTHS: tuple[float, ...] = (1.0, 0.5, 0.25, 0.125)
"""The candidate width scales ``s`` of every linear map."""

ROLLS: tuple[str, ...] = FedRolex.ROLLS
"""FedRolex's window steps (option ``roll`` of ``fedrolex-ft``)."""


# ----- options ------------------------------------------------------------------------------------------------------
def check_widths(widths: Any) -> tuple[float, ...]:
    """Option ``widths`` as a tuple sorted from the largest: a non-empty sequence of distinct numbers in (0, 1]."""
    values = list(widths) if isinstance(widths, Sequence) and not isinstance(widths, str) else None
    if not values or any(isinstance(s, bool) or not isinstance(s, Real) or not 0 < s <= 1 for s in values) \
            or len({float(s) for s in values}) != len(values):
        raise ValueError(f"option widths must be a non-empty sequence of distinct numbers in (0, 1] (e.g. "
                         f"{DEFAULT_WIDTHS}), got {widths!r}")
    return tuple(sorted((float(s) for s in values), reverse=True))


def check_roll(roll: Any) -> str:
    """Option ``roll``: ``"unit"`` or ``"window"``."""
    if roll not in ROLLS:
        raise ValueError(f"option roll must be one of {ROLLS}, got {roll!r}")
    return str(roll)


def rolling_offset(round: int, roll: str = "unit") -> Offset:
    """FedRolex's window start in ``round`` (1-based, ``r = round − 1``): ``r`` (``"unit"``) or
    ``(K, k) -> r·k mod K`` (``"window"``) — :meth:`subfl.methods.width.FedRolex.offset` itself."""
    return FedRolex(roll=check_roll(roll)).offset(round)


# ----- head-aware slicing -------------------------------------------------------------------------------------------
def attention_heads(model: nn.Module) -> dict[str, tuple[int, int]]:
    """``{module name: (num_heads, head_dim)}`` of every :class:`~subfl.models.transformers.Attention` in ``model``
    (the name is ``""`` when ``model`` is one)."""
    return {name: (m.num_heads, m.q.out_features // m.num_heads)
            for name, m in model.named_modules() if isinstance(m, Attention)}


def head_channels(num_heads: int, head_dim: int, sub_head_dim: int, offset: Offset = 0) -> torch.Tensor:
    """The attention channels a sub-model keeps: ``concat_h (h·d + window(d, d_s, offset))`` — each head ``h`` keeps
    ``d_s`` of its own ``d`` channels (its leading ones for ``offset = 0``, a rolling window otherwise).

    >>> head_channels(3, 4, 2).tolist()
    [0, 1, 4, 5, 8, 9]
    >>> head_channels(2, 4, 2, offset=3).tolist()
    [3, 0, 7, 4]
    """
    if num_heads < 1:
        raise ValueError(f"num_heads must be >= 1, got {num_heads}")
    within = window(head_dim, sub_head_dim, _offset_for(offset, head_dim, sub_head_dim))
    return (torch.arange(num_heads, dtype=torch.int64)[:, None] * head_dim + within).reshape(-1)


def _plain_indices(global_shapes: Mapping[str, tuple[int, ...]], sub_shapes: Mapping[str, tuple[int, ...]],
                   offset: Offset) -> SliceIndices:
    """:func:`~subfl.models.slicing.slice_indices` of every tensor on its own (no flatten boundaries)."""
    if list(global_shapes) != list(sub_shapes):
        missing = sorted(set(global_shapes) ^ set(sub_shapes))
        raise ValueError(f"global and sub-model state_dicts must hold the same names in the same order; "
                         f"differing: {missing[:5] or 'order only'}")
    out: SliceIndices = {}
    for name, shape in global_shapes.items():
        out.update(slice_indices({name: shape}, {name: sub_shapes[name]}, offset))
    return out


def _prefixed(module: str, tensor: str) -> str:
    return f"{module}.{tensor}" if module else tensor


def head_aware_indices(global_model: nn.Module, sub_model: nn.Module, offset: Offset = 0) -> SliceIndices:
    """Index sets of ``sub_model`` (the same architecture at a smaller width) inside ``global_model``.

    The output channels of every attention's ``q``, ``k``, ``v`` (weight dim 0, bias) and the input channels of its
    ``proj`` (weight dim 1) keep each head's own channels (:func:`head_channels`); every other dimension is sliced by
    :func:`~subfl.models.slicing.slice_indices` (leading for ``offset = 0``, a rolling window otherwise). ``ValueError``
    when the two models' attention modules or head counts differ.
    """
    global_shapes, sub_shapes = state_shapes(global_model.state_dict()), state_shapes(sub_model.state_dict())
    indices = _plain_indices(global_shapes, sub_shapes, offset)
    big, small = attention_heads(global_model), attention_heads(sub_model)
    if list(big) != list(small):
        raise ValueError(f"global and sub-model have different attention modules: {list(big)} vs {list(small)}")
    for name, (heads, dim) in big.items():
        sub_heads, sub_dim = small[name]
        if sub_heads != heads:
            raise ValueError(f"attention {name!r}: the sub-model has {sub_heads} heads, the global model {heads}; "
                             f"width slicing keeps the number of heads")
        if sub_dim == dim:
            continue
        kept = head_channels(heads, dim, sub_dim, offset)
        for part in ("q", "k", "v"):
            weight = _prefixed(name, f"{part}.weight")
            indices[weight] = (kept, *indices[weight][1:])
            if _prefixed(name, f"{part}.bias") in indices:
                indices[_prefixed(name, f"{part}.bias")] = (kept,)
        proj = _prefixed(name, "proj.weight")
        indices[proj] = (indices[proj][0], kept)
    return indices


def select_slice(tensor: torch.Tensor, index: Sequence[torch.Tensor | None]) -> torch.Tensor:
    """``tensor`` restricted to an index set with ``index_select`` (differentiable: gradients reach ``tensor``)."""
    for d, ix in enumerate(index):
        if ix is not None:
            tensor = tensor.index_select(d, ix.to(tensor.device))
    return tensor


# ----- resources and the width choice (CAFF appendix, Eq. 7) ---------------------------------------------------------
def width_model(model_fn: Callable[..., nn.Module], layers: int, width: float) -> nn.Module:
    """The ``width``-scale sub-model ``model_fn(layers=l, width=w·s)`` with its embeddings frozen (everything else
    trains; :func:`~subfl.methods.fedhm.freeze_embeddings`)."""
    return freeze_embeddings(model_fn(layers=layers, width=model_width(global_width(model_fn), width)))


def width_resource_table(model_fn: Callable[..., nn.Module], layers: int, widths: Sequence[float],
                         batch: torch.Tensor, *, optimizer: str = "adamw") -> pd.DataFrame:
    """One row per width: ``layers, width`` and :func:`~subfl.costs.finetuning.in_table_units` of
    :func:`~subfl.costs.finetuning.training_step_cost` of :func:`width_model` on ``batch`` with ``optimizer``'s state
    (``memory_mb``, ``upload_mb``, ``gflops``, ...)."""
    rows = [{"layers": int(layers), "width": float(s),
             **in_table_units(training_step_cost(width_model(model_fn, layers, float(s)), batch, optimizer=optimizer))}
            for s in widths]
    return pd.DataFrame(rows)


def width_rows(resource_table: pd.DataFrame | Sequence[Mapping[str, Any]], widths: Sequence[float],
               layers: int | None = None) -> dict[float, dict[str, Any]]:
    """``{s: its row}`` of a resource table (rows of depth ``layers`` when that column exists); ``ValueError`` naming
    a width without a row."""
    rows = table_rows(resource_table, "width", layers=layers)
    return {float(s): row for s, row in rows_for(rows, "width", [float(s) for s in widths]).items()}


# ----- FjORD's ordered dropout ----------------------------------------------------------------------------------------
class HeadAwareOrderedDropout(_OrderedDropout):
    """The cap-width model run at a width drawn uniformly per forward pass (FjORD's ordered dropout, Horváth et al.,
    NeurIPS 2021, Sec. 3), with head-aware leading slices: :class:`subfl.methods.width._OrderedDropout` (the draw,
    ``counts``, train mode; no self-distillation) with another view of the cap model.

    A width ``q`` below the cap runs ``skeletons[q]`` (the ``q``-width architecture) through
    :func:`torch.func.functional_call` on the :func:`select_slice` of the cap model's tensors at ``indices[q]`` (the
    head-aware leading slice of the ``q``-width model inside the cap model), so gradients reach exactly the entries of
    that slice of the cap model's parameters. ``counts`` records the draws by :func:`~subfl.methods.width.level_name`.
    """

    def __init__(self, cap_model: nn.Module, cap: float, skeletons: Mapping[float, nn.Module],
                 indices: Mapping[float, SliceIndices], widths: Sequence[float], generator: torch.Generator) -> None:
        super().__init__(cap_model, float(cap), dict(skeletons), [float(q) for q in widths], generator, distill=False)
        self._indices = dict(indices)

    def run(self, width: float, x: torch.Tensor) -> torch.Tensor:
        """The output of the ``width`` sub-network on ``x``."""
        if width == self.cap:
            return self.cap_model(x)
        ix = self._indices[width]
        tensors = {name: select_slice(t, ix[name])
                   for name, t in chain(self.cap_model.named_parameters(), self.cap_model.named_buffers())}
        return torch.func.functional_call(self._skeletons[width], tensors, (x,))


# ----- the methods ---------------------------------------------------------------------------------------------------
class WidthFinetuning(FinetuningMethod):
    """Width-sliced finetuning of a pretrained tiny transformer (the machinery of the three methods; by itself
    HeteroFL's rule): a device of width ``s`` trains the head-aware leading ``s``-slice (see the module docstring; no
    scaler).

    Options: ``pretrained`` (None → ``ServerContext.pretrained``), ``architecture`` (None → the configured
    model's depth), ``widths`` (candidate scales, default ``(1.0, 0.5, 0.25, 0.125)``), ``devices`` (declared budgets
    by device id), ``budgets`` (``{group: budget dict}``), ``resource_table`` (None → measured at ``init``; rows with
    ``width, memory_mb, upload_mb, gflops``).

    Subclasses override :meth:`offset` (which slice a device gets) and, for other local training,
    :meth:`local_update`.
    """

    name = "width_finetuning"
    options: dict = {"pretrained": None, "architecture": None, "widths": DEFAULT_WIDTHS, "devices": None,
                     "budgets": None, "resource_table": None}

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.widths = check_widths(self.config["widths"])
        check_group_budgets(self.config["budgets"])
        check_architecture(self.config["architecture"])
        self._skeletons: dict[tuple[Callable[..., nn.Module], int, float], nn.Module] = {}

    # ----- helpers -------------------------------------------------------------------------------------------
    def offset(self, round: int) -> Offset:
        """The window start of ``round``: 0 (the leading slice)."""
        return 0

    def skeleton(self, model_fn: Callable[..., nn.Module], layers: int, width: float) -> nn.Module:
        """The ``width``-scale model of depth ``layers`` (built once per method instance; only its shapes and
        modules are used)."""
        key = (model_fn, int(layers), float(width))
        if key not in self._skeletons:
            self._skeletons[key] = width_model(model_fn, layers, width)
        return self._skeletons[key]

    def indices(self, model_fn: Callable[..., nn.Module], layers: int, width: float,
                offset: Offset = 0) -> SliceIndices:
        """Head-aware index sets of the ``width`` sub-model inside the global model."""
        return head_aware_indices(self.skeleton(model_fn, layers, 1.0), self.skeleton(model_fn, layers, width), offset)

    def budget(self, profile: ClientProfile, ctx: ServerContext | None = None) -> DeviceBudget:
        """The device's budgets (as CAFF resolves them)."""
        return resolve_budget(profile, declared_population(self.config["devices"], ctx), self.config["budgets"])

    def _rows(self, ctx: ServerContext, layers: int) -> dict[float, dict[str, Any]]:
        table = self.config["resource_table"]
        if table is None:
            table = width_resource_table(ctx.model_fn, layers, self.widths, measurement_batch(ctx),
                                         optimizer=optimizer_state(ctx))
        return width_rows(table, self.widths, layers)

    def client_config(self, state: ServerState, round: int, profile: ClientProfile, width: float,
                      ctx: ServerContext) -> dict[str, Any]:
        """The JSON config a device receives besides its tensors."""
        return {"train": ctx.train_config(round), "layers": state["layers"], "width": width,
                "group": profile.group, "task": ctx.task}

    # ----- server side ---------------------------------------------------------------------------------------
    def init(self, ctx: ServerContext) -> ServerState:
        source = pretrained_source(self.config["pretrained"], ctx, self.name)
        layers = fixed_depth(self.config["architecture"], source, ctx)
        model, skipped = pretrained_model(ctx, source, layers)
        full = self.skeleton(ctx.model_fn, layers, 1.0)
        if state_shapes(full.state_dict()) != state_shapes(model.state_dict()):
            raise ValueError(f"model_fn(layers={layers}, width={global_width(ctx.model_fn)}) does not build the global "
                             f"model model_fn(layers={layers}); give the model factory a 'width' attribute equal to "
                             f"its default width")
        rows = self._rows(ctx, layers)
        return {"weights": clone_tensors(model.state_dict()), "layers": layers, "table": list(rows.values()),
                "not_loaded": skipped, "levels": [], "last_round": []}

    def configure(self, state: ServerState, round: int, clients: Sequence[ClientProfile],
                  ctx: ServerContext) -> dict[int, Task]:
        rows = {float(row["width"]): row for row in state["table"]}
        tasks = {}
        for profile in clients:
            width = float(assign_largest(rows, self.budget(profile, ctx), "width", "width"))
            indices = self.indices(ctx.model_fn, state["layers"], width, self.offset(round))
            tasks[profile.client_id] = Task(profile.client_id, round, extract(state["weights"], indices),
                                            self.client_config(state, round, profile, width, ctx))
        return tasks

    def aggregate(self, state: ServerState, round: int, updates: Sequence[Update],
                  ctx: ServerContext) -> ServerState:
        offset = self.offset(round)
        contributions = [(u.tensors, self.indices(ctx.model_fn, state["layers"], float(u.stats["width"]), offset),
                          float(u.n_samples)) for u in updates]
        weights = average_slices(state["weights"], contributions)
        last = [{"client": u.client_id, "width": float(u.stats["width"]), "group": str(u.stats.get("group", ""))}
                for u in updates]
        levels = sorted(set(state["levels"]) | {row["width"] for row in last})
        return {**state, "weights": weights, "levels": levels, "last_round": last}

    def round_metrics(self, state: ServerState, round: int) -> dict[tuple[str, str], float]:
        return group_means(state.get("last_round") or [], "width", "width")

    def evaluation_models(self, state: ServerState, ctx: ServerContext) -> dict[str, nn.Module]:
        models: dict[str, nn.Module] = {}
        for width in state["levels"]:
            model = width_model(ctx.model_fn, state["layers"], width)
            model.load_state_dict(extract(state["weights"], self.indices(ctx.model_fn, state["layers"], width)))
            models[level_name(width)] = model
        model = ctx.model_fn(layers=state["layers"])
        model.load_state_dict(state["weights"])
        models["global"] = model
        return models

    # ----- client side ---------------------------------------------------------------------------------------
    @staticmethod
    def _client_model(cfg: Mapping[str, Any], ctx: ClientContext, tensors: Mapping[str, torch.Tensor]) -> nn.Module:
        model = width_model(ctx.model_fn, int(cfg["layers"]), float(cfg["width"])).to(ctx.device)
        model.load_state_dict(tensors)
        return model

    @staticmethod
    def _upload(model: nn.Module) -> dict[str, torch.Tensor]:
        trained = set(trainable_parameter_names(model))
        return clone_tensors({k: v for k, v in model.state_dict().items() if k in trained})

    def local_update(self, task: Task, data: ClientDataset, ctx: ClientContext) -> Update:
        cfg = task.config
        model = self._client_model(cfg, ctx, task.tensors)
        stats = train_transformer(model, data, cfg, ctx)
        return Update(task.client_id, self._upload(model), len(data),
                      {**stats, "width": float(cfg["width"]), "group": cfg.get("group", "")})


class HeteroFLFinetuning(WidthFinetuning):
    """``heterofl-ft``: HeteroFL (Diao, Ding & Tarokh, ICLR 2021) on a pretrained tiny transformer — the head-aware
    leading slice of the device's width (CAFF appendix, Eq. 7), no scaler. Options as :class:`WidthFinetuning`."""

    name = "heterofl-ft"


class FedRolexFinetuning(WidthFinetuning):
    """``fedrolex-ft``: FedRolex (Alam, Liu, Yan & Zhang, NeurIPS 2022) on a pretrained tiny transformer — the
    head-aware rolling window of the device's width, advancing every round (:func:`rolling_offset`), no scaler.

    Options as :class:`WidthFinetuning`, plus ``roll`` (``"unit"``, default, the paper: one unit per round; or
    ``"window"``: ``k`` units per round)."""

    name = "fedrolex-ft"
    options: dict = {**WidthFinetuning.options, "roll": "unit"}

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        check_roll(self.config["roll"])

    def offset(self, round: int) -> Offset:
        return rolling_offset(round, self.config["roll"])


class FjORDFinetuning(WidthFinetuning):
    """``fjord-ft``: FjORD (Horváth et al., NeurIPS 2021) on a pretrained tiny transformer — the device receives the
    head-aware leading slice at its cap width (the largest that fits its budgets, CAFF appendix Eq. 7) and trains it
    with ordered dropout: each mini-batch trains the head-aware leading sub-network of a width drawn uniformly from
    the candidate widths ``≤`` its cap (:class:`HeadAwareOrderedDropout`). No self-distillation, no scaler. Options
    as :class:`WidthFinetuning`."""

    name = "fjord-ft"

    def affordable(self, cap: float) -> list[float]:
        """The candidate widths ``≤ cap``, ascending."""
        return sorted(s for s in self.widths if s <= cap + 1e-12)

    def client_config(self, state: ServerState, round: int, profile: ClientProfile, width: float,
                      ctx: ServerContext) -> dict[str, Any]:
        return {**super().client_config(state, round, profile, width, ctx), "widths": self.affordable(width)}

    def local_update(self, task: Task, data: ClientDataset, ctx: ClientContext) -> Update:
        cfg = task.config
        layers, cap = int(cfg["layers"]), float(cfg["width"])
        model = self._client_model(cfg, ctx, task.tensors)
        widths = [float(q) for q in cfg["widths"]]
        skeletons = {q: width_model(ctx.model_fn, layers, q).to(ctx.device) for q in widths if q != cap}
        indices = {q: head_aware_indices(model, skeleton) for q, skeleton in skeletons.items()}
        draws = torch.Generator().manual_seed(int(torch.randint(2**62, (1,), generator=ctx.generator)))
        net = HeadAwareOrderedDropout(model, cap, skeletons, indices, widths, draws)
        stats = train_transformer(net, data, cfg, ctx)
        counts = dict(sorted(net.counts.items(), key=lambda kv: float(kv[0])))
        return Update(task.client_id, self._upload(model), len(data),
                      {**stats, "width": cap, "group": cfg.get("group", ""), "width_counts": counts})


WIDTH_FINETUNING_METHODS: dict[str, type[Method]] = {
    HeteroFLFinetuning.name: HeteroFLFinetuning, FjORDFinetuning.name: FjORDFinetuning,
    FedRolexFinetuning.name: FedRolexFinetuning,
}
"""The three methods by registered name."""


__all__ = ["DEFAULT_WIDTHS", "FedRolexFinetuning", "FjORDFinetuning", "HeadAwareOrderedDropout", "HeteroFLFinetuning",
           "ROLLS", "WIDTH_FINETUNING_METHODS", "WidthFinetuning", "attention_heads", "check_roll",
           "check_widths", "head_aware_indices", "head_channels", "rolling_offset", "select_slice", "width_model",
           "width_resource_table", "width_rows"]
