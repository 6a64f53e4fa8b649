"""PriSM's memory-efficient sub-model: spectral terms *and* only the first output channels of each layer.

Paper: PriSM (Niu et al., "Overcoming resource constraints in federated learning: large models can be trained
with only weak clients", TMLR 2023), the memory-efficient sub-model (Eq. (5) as cited by the book's tracker;
abstract: PriSM "exploits low-rank structure in intermediate representations and allows each sub-model to learn
only a subset of them"). The equation's own text is not in the book's notes. What is implemented is the
tracker's summary — "only the first r·N output channels of u are computed, the rest cached and concatenated back
at aggregation" — which matches the authors' released code (github.com/yuehniu/modeldecomp-fl,
``server_orth_drop_v2.py``: "drops both input and output channels in conv2d_U ... more memory-efficient as
outputs from conv2d_U have fewer channels"; there the kept rows are the first ``⌈0.4·n⌉``, a constant, with
``⌈r·n⌉`` commented out).

A round is :class:`~subfl.methods.spectral.SpectralSharding`'s (SVD refresh, per-layer term sampling with the
strategy of option ``strategy``, PriSM's by default; per-term averaging; see :mod:`subfl.methods.spectral`)
with one change per decomposed layer with ``n`` outputs:

1. **Sub-model** (:mod:`subfl.models.output_subset`): the client receives and trains only the first
   ``o = ⌈q·n⌉`` rows of ``U'_S`` (``q`` = option ``output_keep``; ``None`` means the client's keep ratio ``r``,
   the tracker's "first r·N"); its layer computes those ``o`` outputs and the others are zero (plus the bias).
   ``V'_S``, ``ω_S`` and every non-decomposed tensor are as in PriSM.
2. **Aggregation**: the rows ``o, …, n−1`` of the client's terms — which it never held — are taken from the
   server's refreshed ``U'`` ("cached") and concatenated back under the client's rows; then every term's
   ``u'_i`` and ``v'_i`` are averaged over the clients that trained it, as in PriSM. With one ``q`` for every
   client (the homogeneous case) this is exactly the authors' per-entry average (entry ``(j, i)`` of ``U'``
   averaged over the clients that trained it; rows nobody trained keep their value). With several keep-ratio
   groups and ``q = r``, a row held by some of a term's clients is averaged together with the cached value of
   the others, where the released code divides by the number of clients that held the entry.

Because every client keeps the *same* leading rows, the rows ``j ≥ o`` of ``U'`` are never trained; they
still change every round through the SVD refresh of ``W = U'V'`` (``V'`` is trained). The server evaluates the
dense model, which computes every output channel.

Registered as ``prism+memory``: options of :class:`~subfl.methods.spectral.SpectralSharding` (``strategy``
default ``prism``, any strategy of :data:`~subfl.methods.spectral.STRATEGIES` accepted) plus ``output_keep``.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from ..fl.types import ClientProfile, Task, Update
from ..models.factorized import LayerSpec
from ..models.output_subset import restrict_outputs
from ..sampling import keep_count
from .base import ClientContext, ServerContext, ServerState
from .spectral import SpectralSharding


class MemoryEfficientPriSM(SpectralSharding):
    """PriSM's memory-efficient sub-model (see the module docstring)."""

    name = "prism+memory"
    options: dict = {**SpectralSharding.options, "strategy": "prism", "output_keep": None}

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        q = self.config["output_keep"]
        ok = q is None or (isinstance(q, numbers.Real) and not isinstance(q, bool) and math.isfinite(float(q))
                           and 0 < float(q) <= 1)
        if not ok:
            raise ValueError(f"option output_keep={q!r} is not valid; accepted: a real number in (0, 1] (the share "
                             f"of each decomposed layer's output channels a client computes) or None (its keep "
                             f"ratio)")
        self.config["output_keep"] = None if q is None else float(q)

    def output_count(self, spec: LayerSpec, keep_ratio: float) -> int:
        """``o = ⌈q·n⌉``: the leading outputs of layer ``spec`` a client of keep ratio ``keep_ratio`` computes."""
        q = self.config["output_keep"]
        return keep_count(spec.out_features, keep_ratio if q is None else q)

    def configure(self, state: ServerState, round: int, clients: Sequence[ClientProfile],
                  ctx: ServerContext) -> dict[int, Task]:
        tasks = super().configure(state, round, clients, ctx)
        specs: dict[str, LayerSpec] = state["specs"]
        for cid, task in tasks.items():
            outputs = {name: self.output_count(spec, task.config["keep_ratio"]) for name, spec in specs.items()}
            tensors = dict(task.tensors)
            for name, count in outputs.items():
                tensors[f"{name}.u"] = tensors[f"{name}.u"][:count].clone()
            tasks[cid] = replace(task, tensors=tensors, config={**task.config, "outputs": outputs})
        return tasks

    def client_architecture(self, task: Task, ctx: ClientContext) -> nn.Module:
        return restrict_outputs(super().client_architecture(task, ctx), task.config["outputs"])

    def aggregate(self, state: ServerState, round: int, updates: Sequence[Update],
                  ctx: ServerContext) -> ServerState:
        """Put the rows each client did not hold back under its ``u`` (from the server's refreshed ``U'``), then
        aggregate as PriSM does."""
        specs: dict[str, LayerSpec] = state["specs"]
        completed = []
        for upd in updates:
            if "keep_ratio" not in upd.stats or "terms" not in upd.stats:
                raise ValueError(f"update of client {upd.client_id} lacks stats['keep_ratio'] / stats['terms']; "
                                 f"{self.name} updates carry the keep ratio and the terms each layer trained")
            tensors = dict(upd.tensors)
            for name, spec in specs.items():
                count = self.output_count(spec, float(upd.stats["keep_ratio"]))
                u_client = tensors[f"{name}.u"]
                idx = torch.as_tensor(upd.stats["terms"][name], dtype=torch.int64)
                if u_client.shape != (count, idx.numel()):
                    raise ValueError(f"client {upd.client_id}: {name}.u has shape {tuple(u_client.shape)}, expected "
                                     f"({count}, {idx.numel()}) for its first {count} outputs and "
                                     f"{idx.numel()} terms")
                cached = state["factors"][name]["u"][count:, idx].to(u_client.dtype)
                tensors[f"{name}.u"] = torch.cat((u_client, cached), dim=0)
            completed.append(replace(upd, tensors=tensors))
        return super().aggregate(state, round, completed, ctx)


__all__ = ["MemoryEfficientPriSM"]
