"""PriSM's narrowed sub-model: every layer keeps its leading ``r`` channels, so the next layer sees ``r`` inputs.

Paper: PriSM (Niu et al., "Overcoming resource constraints in federated learning: large models can be trained
with only weak clients", TMLR 2023), Sec. 3.2.1 and Table 1. The memory-efficient sub-model lets ``Conv_U``
compute only ``r`` output channels (:mod:`subfl.methods.prism_memory`). Table 1's PriSM block counts the sub-model
that follows from it: a layer that emits ``r`` channels hands ``r`` channels to the next layer, whose kernels then
need weights for those ``r`` inputs only (``Conv_V``: ``r × r_in × k²``, ``Conv_U``: ``r × r``), and Sec. 3.2.2
keeps the norm entries of the kept channels only. :mod:`subfl.costs.narrow_submodel` builds that network for
ResNet-18 and measures it; this method trains it.

Which entries a client holds (decided here, the paper does not list them). Every hidden dimension of the model —
each layer's output channels, the input channels of the layer after it, the norm entries between them, both sides
of a residual addition, the features of a flatten — keeps its leading ``⌈r·K⌉`` entries
(:func:`~subfl.sampling.keep_count`, the rule of the other sub-models and of :func:`subfl.costs.narrow_submodel`);
the image channels and the classifier's outputs are whole. Which dimensions are hidden is read from the model
built at width ``w·r`` (:func:`narrow_indices`: a dimension that model narrows is hidden), and the index sets are
:func:`subfl.models.slicing.leading_indices` of the sizes above, so every topology the width-slicing methods handle
(flatten boundaries, projection shortcuts) is handled here. In each decomposed layer the client holds its sampled
terms (PriSM's, as in :mod:`subfl.methods.spectral`), the leading ``o = ⌈r·n⌉`` rows of ``U'`` (as in
``prism+memory`` with ``output_keep=None`` and leading rows) and the columns of ``V'`` of its kept inputs.

A round:

1. **Down** (:meth:`configure`): PriSM's task, cut to the held entries (:func:`~subfl.models.slicing.extract`):
   the ledger counts only what a narrowed client receives.
2. **Client** (:meth:`client_model`, :meth:`local_update`): the slices are written into a zero-filled model of
   the dense layout (:func:`~subfl.models.slicing.scatter`), trained, and cut again. With every entry outside
   the slices at zero, a dropped channel is exactly zero everywhere: its weights, bias and norm scale and shift
   are zero, and the weights that read it are zero. Its gradients are then zero too, so the zero-padded model
   trains the held entries exactly as the narrowed network would (the tests compare logits and gradients with
   :func:`subfl.costs.narrow_submodel`), for any optimiser, weight decay included. This holds for convolutions,
   linear layers, BatchNorm with batch statistics, ReLU, pooling, residual additions and flattening; a
   GroupNorm or LayerNorm mixes kept and dropped channels in its statistics, so models with them are refused.
3. **Up / aggregation** (:meth:`aggregate`): every entry is the average, weighted by data size, of the clients
   that held it; an entry nobody held keeps the server's value (the completion of ``prism+memory``, extended to
   ``V'`` and to the tensors that are not decomposed). Then PriSM's per-term aggregation and SVD refresh.

Evaluation: ``"global"`` is the dense model, as for PriSM; for each keep ratio of the run (``"narrow <r>"``,
e.g. ``"narrow 0.2"``) also the narrowed network its clients train, i.e. the dense model with every entry
outside that keep ratio's slices set to zero and every term of each decomposed layer. With homogeneous clients
the channels beyond the slices are never trained, so the dense ``"global"`` model adds untrained channels to the
narrowed one; ``"narrow <r>"`` is what the clients learned.

Registered as ``prism+narrow``: the options of :class:`~subfl.methods.spectral.SpectralSharding` (``strategy``
default ``prism``); ``prism+memory``'s ``output_keep`` and ``output_rows`` accept only their defaults here (``None``,
``"leading"``).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from ..fl.method import ClientContext, ServerContext, ServerState
from ..fl.training import ClientDataset
from ..fl.types import ClientProfile, Task, Update
from ..models.factorized import LayerSpec
from ..models.slicing import SliceIndices, average_slices, coverage, extract, flatten_boundaries, leading_indices, \
    scatter, state_shapes
from ..sampling import keep_count
from .prism_memory import MemoryEfficientPriSM
from .width import global_width, model_width

_MIXING_NORMS = (nn.GroupNorm, nn.LayerNorm)


def _build(model_fn: Callable[..., nn.Module], norm: str, width: float | None = None) -> nn.Module:
    kwargs: dict[str, Any] = {} if width is None else {"width": width}
    if norm:
        kwargs["norm"] = norm
    return model_fn(**kwargs)


def narrow_indices(global_shapes: Mapping[str, Any], narrowed_shapes: Mapping[str, Any],
                   keep_ratio: float) -> SliceIndices:
    """Index sets of the narrowed sub-model of keep ratio ``keep_ratio`` inside the dense ``state_dict``.

    ``narrowed_shapes``: the ``state_dict`` shapes of the model built at width ``w·keep_ratio``; a dimension it
    makes smaller is a hidden dimension and keeps its leading ``keep_count(K, keep_ratio)`` entries (``C`` channels
    flattened over ``HW`` positions keep ``keep_count(C, keep_ratio)·HW`` features); the others stay whole.
    """
    g_shapes, w_shapes = state_shapes(global_shapes), state_shapes(narrowed_shapes)
    if list(g_shapes) != list(w_shapes):
        raise ValueError("the dense and the narrowed model must hold the same tensors in the same order; differing: "
                         f"{sorted(set(g_shapes) ^ set(w_shapes))[:5] or 'order only'}")
    boundaries = flatten_boundaries(g_shapes)
    sizes: dict[str, tuple[int, ...]] = {}
    for name, g in g_shapes.items():
        dims = []
        for d, (big, small) in enumerate(zip(g, w_shapes[name])):
            if small >= big:
                dims.append(big)
            elif d == 1 and name in boundaries:
                _, channels, hw = boundaries[name]
                dims.append(keep_count(channels, keep_ratio) * hw)
            else:
                dims.append(keep_count(big, keep_ratio))
        sizes[name] = tuple(dims)
    return leading_indices(g_shapes, sizes)


class NarrowPriSM(MemoryEfficientPriSM):
    """PriSM's narrowed sub-model (see the module docstring)."""

    name = "prism+narrow"
    options: dict = dict(MemoryEfficientPriSM.options)

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        for option, fixed in (("output_keep", None), ("output_rows", "leading")):
            if self.config[option] != fixed:
                raise ValueError(f"option {option}={self.config[option]!r} is not valid for method {self.name!r}; "
                                 f"accepted: {fixed!r} (a narrowed client computes the leading ⌈r·n⌉ channels of "
                                 f"every layer); use 'prism+memory' to vary it")
        self._indices: dict[tuple[Any, float, str], SliceIndices] = {}

    # ----- which entries a client holds --------------------------------------------------------------
    def dense_indices(self, model_fn: Callable[..., nn.Module], keep_ratio: float, norm: str) -> SliceIndices:
        """:func:`narrow_indices` of keep ratio ``keep_ratio`` in the dense model's ``state_dict`` (cached per model
        factory, which the key holds, keep ratio and norm)."""
        key = (model_fn, float(keep_ratio), norm)
        if key not in self._indices:
            dense = _build(model_fn, norm)
            mixing = sorted({type(m).__name__ for m in dense.modules() if isinstance(m, _MIXING_NORMS)})
            if mixing:
                raise ValueError(f"method {self.name!r} needs norms that treat each channel alone (BatchNorm or "
                                 f"none); the model has {', '.join(mixing)}: use norm='bn' or 'none'")
            narrowed = _build(model_fn, norm, model_width(global_width(model_fn), keep_ratio))
            self._indices[key] = narrow_indices(dense.state_dict(), narrowed.state_dict(), keep_ratio)
        return self._indices[key]

    @staticmethod
    def task_indices(dense: SliceIndices, layers: Mapping[str, Any], tensors: Mapping[str, torch.Tensor]
                     ) -> SliceIndices:
        """Index sets of a task's (or an update's) ``tensors``: the dense ones for the tensors that are not
        decomposed, and for each decomposed layer of ``layers`` (names) its ``u`` and ``ω`` whole (``u`` is already
        cut to ``o`` rows) and the kept input columns of ``v``."""
        out: SliceIndices = {}
        for key, tensor in tensors.items():
            layer, _, part = key.rpartition(".")
            if layer in layers and part in ("u", "omega"):
                out[key] = (None,) * tensor.dim()
            elif layer in layers and part == "v":
                out[key] = (None, dense[f"{layer}.weight"][1], *(None,) * (tensor.dim() - 2))
            else:
                out[key] = dense[key]
        return out

    def output_count(self, spec: LayerSpec, keep_ratio: float) -> int:
        return keep_count(spec.out_features, keep_ratio)

    # ----- server side -------------------------------------------------------------------------------
    def configure(self, state: ServerState, round: int, clients: Sequence[ClientProfile],
                  ctx: ServerContext) -> dict[int, Task]:
        """``prism+memory``'s tasks, every tensor cut to the entries the narrowed client holds."""
        tasks = super().configure(state, round, clients, ctx)
        for cid, task in tasks.items():
            dense = self.dense_indices(ctx.model_fn, task.config["keep_ratio"], state["norm"])
            indices = self.task_indices(dense, task.config["terms"], task.tensors)
            tasks[cid] = replace(task, tensors=extract(task.tensors, indices))
        return tasks

    def aggregate(self, state: ServerState, round: int, updates: Sequence[Update],
                  ctx: ServerContext) -> ServerState:
        """Each update written back into the dense layout, the entries it did not hold filled with the average of
        the clients that held them (else the server's value); then ``prism+memory``'s aggregation."""
        specs: dict[str, LayerSpec] = state["specs"]
        self.check_updates(updates)
        sizes = self.aggregation_weights(updates)
        # the server's value of every entry, in the layout of a client's tensors (v: the client's terms)
        full_states, masks, held = [], [], []
        for upd in updates:
            terms = upd.stats["terms"]
            server = {}
            for key, tensor in upd.tensors.items():
                layer, _, part = key.rpartition(".")
                if layer in specs and part == "v":
                    v = state["factors"][layer]["v"][torch.as_tensor(terms[layer], dtype=torch.int64)]
                    server[key] = v.reshape(specs[layer].v_shape(len(terms[layer]))).to(tensor.dtype)
                elif layer in specs and part in ("u", "omega"):
                    server[key] = tensor
                else:
                    server[key] = state["weights"][key]
            dense = self.dense_indices(ctx.model_fn, float(upd.stats["keep_ratio"]), state["norm"])
            indices = self.task_indices(dense, terms, server)
            full_states.append(scatter(upd.tensors, indices, server))
            masks.append(coverage(indices, state_shapes(server)))
            held.append(indices)
        completed = [dict(s) for s in full_states]
        plain = [k for k in full_states[0] if k in state["weights"] and torch.is_floating_point(state["weights"][k])]
        fills = average_slices({k: state["weights"][k] for k in plain},   # per entry over its holders
                               [({k: u.tensors[k] for k in plain}, ix, size)
                                for u, ix, size in zip(updates, held, sizes)])
        for key in full_states[0]:
            layer, _, part = key.rpartition(".")
            if layer in specs and part in ("u", "omega"):
                continue
            if layer in specs and part == "v":   # entries are (term, column) of V'; fill per entry of the server's V'
                v_server = state["factors"][layer]["v"].to(torch.float64)
                shape = v_server.shape
                num, den = torch.zeros(shape, dtype=torch.float64), torch.zeros(shape, dtype=torch.float64)
                rows = [torch.as_tensor(u.stats["terms"][layer], dtype=torch.int64) for u in updates]
                for full, mask, idx, size in zip(full_states, masks, rows, sizes):
                    num[idx] += size * (full[key].to(torch.float64) * mask[key]).reshape(idx.numel(), -1)
                    den[idx] += size * mask[key].to(torch.float64).reshape(idx.numel(), -1)
                fill = torch.where(den > 0, num / den.clamp_min(torch.finfo(torch.float64).tiny), v_server)
                for out, full, mask, idx in zip(completed, full_states, masks, rows):
                    filled = fill[idx].reshape(full[key].shape).to(full[key].dtype)
                    out[key] = torch.where(mask[key], full[key], filled)
            elif key in fills:
                for out, full, mask in zip(completed, full_states, masks):
                    out[key] = torch.where(mask[key], full[key], fills[key].to(full[key].dtype))
        new_state = super().aggregate(state, round, [replace(u, tensors=t) for u, t in zip(updates, completed)], ctx)
        seen = {float(u.stats["keep_ratio"]) for u in updates}
        return {**new_state, "levels": sorted({*state.get("levels", ()), *seen})}

    def evaluation_models(self, state: ServerState, ctx: ServerContext) -> dict[str, nn.Module]:
        """``"global"`` (the dense model) and ``"narrow <r>"`` for each keep ratio of the run: the dense model with
        the entries outside that keep ratio's slices at zero."""
        models = super().evaluation_models(state, ctx)
        weights = dict(state["weights"])
        declared = ctx.heterogeneity_levels
        for level in sorted(declared) if declared is not None else state.get("levels", ()):
            if level >= 1:
                continue
            dense = self.dense_indices(ctx.model_fn, level, state["norm"])
            masks = coverage(dense, state_shapes(weights))
            model = _build(ctx.model_fn, state["norm"])
            model.load_state_dict({k: (w * masks[k] if torch.is_floating_point(w) else w) for k, w in weights.items()})
            models[f"narrow {level:g}"] = model
        return models

    # ----- client side -------------------------------------------------------------------------------
    def client_model(self, task: Task, ctx: ClientContext) -> nn.Module:
        """The zero-padded dense layout of the narrowed sub-model, the task's slices written in."""
        model = self.client_architecture(task, ctx)
        zeros = {k: torch.zeros_like(t) for k, t in model.state_dict().items()}
        indices = self.task_indices(self.dense_indices(ctx.model_fn, task.config["keep_ratio"], task.config["norm"]),
                                    task.config["terms"], zeros)
        padded = scatter(task.tensors, indices, zeros)   # tensors outside the state_dict (each ω) pass as they are
        return super().client_model(replace(task, tensors={k: padded.get(k, t) for k, t in task.tensors.items()}),
                                    ctx)

    def local_update(self, task: Task, data: ClientDataset, ctx: ClientContext) -> Update:
        """``prism+memory``'s local update, cut back to the held entries."""
        update = super().local_update(task, data, ctx)
        indices = self.task_indices(self.dense_indices(ctx.model_fn, task.config["keep_ratio"], task.config["norm"]),
                                    task.config["terms"], update.tensors)
        return replace(update, tensors=extract(update.tensors, indices))


__all__ = ["NarrowPriSM", "narrow_indices"]
