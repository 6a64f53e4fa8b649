"""PriSM's memory-efficient sub-model: spectral terms *and* only some output channels of each layer.

Paper: PriSM (Niu et al., "Overcoming resource constraints in federated learning: large models can be trained
with only weak clients", TMLR 2023), the memory-efficient sub-model of Sec. 3.2.1: a client computes only the
first outputs u_i(1:r) of each decomposed layer (the paper's Eq. (5) is the aggregation of the factors). What is
implemented: only the first r·N output channels of u are computed, the rest cached and concatenated back at
aggregation — which matches the authors' released code (github.com/yuehniu/modeldecomp-fl,
``server_orth_drop_v2.py``: "drops both input and output channels in conv2d_U ... more memory-efficient as
outputs from conv2d_U have fewer channels"; there the kept rows are the first ``⌈0.4·n⌉``, a constant, with
``⌈r·n⌉`` commented out).

A round is :class:`~subfl.methods.spectral.SpectralSharding`'s (SVD refresh, per-layer term sampling with the
strategy of option ``strategy``, PriSM's by default; per-term averaging; see :mod:`subfl.methods.spectral`)
with one change per decomposed layer with ``n`` outputs:

1. **Sub-model** (:mod:`subfl.models.output_subset`): the client receives and trains only ``o = ⌈q·n⌉`` rows
   ``R`` of ``U'_S`` (``q`` = option ``output_keep``; ``None`` means the client's keep ratio ``r``, the tracker's
   "first r·N"); its layer computes those ``o`` outputs and the others are zero (plus the bias). ``V'_S``,
   ``ω_S`` and every non-decomposed tensor are as in PriSM. Option ``output_rows`` picks ``R``:

   * ``"leading"`` (default): the first ``o`` rows, the tracker's reading and the released code's;
   * ``"random"``: ``o`` rows drawn uniformly without replacement, afresh for every client, layer and round
     (server generator ``("output-rows", round, client)``), as in an earlier version of the released code. Every
     row is then trained by some clients, where with leading rows the rows ``j ≥ o`` never are.
2. **Aggregation, per entry of ``U'``**: entry ``(j, i)`` is averaged, weighted by data size, over the clients
   that held it (row ``j`` and term ``i``); an entry nobody held keeps the server's refreshed value
   ("cached"). ``v'_i`` is averaged over the clients that trained term ``i``, as in PriSM. This is the released
   code's per-entry average (which counts clients; with equal data sizes the two agree). It is computed by
   completing each client's ``u`` — the rows it did not hold take the per-entry average of the clients that
   did, or the cached value — and handing the completed updates to PriSM's per-term average, which then
   returns exactly the per-entry average. With one ``q`` and leading rows for every client (the homogeneous
   case) the completion is the cached rows alone.

With leading rows the rows ``j ≥ o`` of ``U'`` are never trained; they still change every round through the SVD
refresh of ``W = U'V'`` (``V'`` is trained). The server evaluates the dense model, which computes every output
channel.

Registered as ``prism+memory``: options of :class:`~subfl.methods.spectral.SpectralSharding` (``strategy``
default ``prism``, any strategy of :data:`~subfl.methods.spectral.STRATEGIES` accepted) plus ``output_keep`` and
``output_rows``.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch import nn

from ..fl.training import ClientDataset
from ..fl.types import ClientProfile, Task, Update
from ..models.factorized import LayerSpec
from ..models.output_subset import restrict_outputs
from ..sampling import keep_count
from ..fl.method import ClientContext, ServerContext, ServerState
from .spectral import SpectralSharding


OUTPUT_ROWS = ("leading", "random")


class MemoryEfficientPriSM(SpectralSharding):
    """PriSM's memory-efficient sub-model (see the module docstring)."""

    name = "prism+memory"
    options: dict = {**SpectralSharding.options, "strategy": "prism", "output_keep": None, "output_rows": "leading"}
    option_versions = {**SpectralSharding.option_versions, "output_rows": 1}

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
        if self.config["output_rows"] not in OUTPUT_ROWS:
            raise ValueError(f"option output_rows={self.config['output_rows']!r} is not valid; accepted: "
                             f"{', '.join(repr(o) for o in OUTPUT_ROWS)} (which output channels a client computes)")

    def output_count(self, spec: LayerSpec, keep_ratio: float) -> int:
        """``o = ⌈q·n⌉``: how many outputs of layer ``spec`` a client of keep ratio ``keep_ratio`` computes."""
        q = self.config["output_keep"]
        return keep_count(spec.out_features, keep_ratio if q is None else q)

    def configure(self, state: ServerState, round: int, clients: Sequence[ClientProfile],
                  ctx: ServerContext) -> dict[int, Task]:
        """PriSM's tasks with each ``u`` cut to the client's rows; ``config["outputs"]`` names them per layer (a
        count of leading rows, or the sorted row indices with ``output_rows="random"``)."""
        tasks = super().configure(state, round, clients, ctx)
        specs: dict[str, LayerSpec] = state["specs"]
        random_rows = self.config["output_rows"] == "random"
        for cid, task in tasks.items():
            rng = ctx.rng("output-rows", round, cid) if random_rows else None
            outputs: dict[str, int | list[int]] = {}
            tensors = dict(task.tensors)
            for name, spec in specs.items():
                count = self.output_count(spec, task.config["keep_ratio"])
                if rng is None:
                    outputs[name] = count
                    tensors[f"{name}.u"] = tensors[f"{name}.u"][:count].clone()
                else:
                    rows = np.sort(rng.choice(spec.out_features, size=count, replace=False))
                    outputs[name] = [int(j) for j in rows]
                    tensors[f"{name}.u"] = tensors[f"{name}.u"][torch.as_tensor(rows)].clone()
            tasks[cid] = replace(task, tensors=tensors, config={**task.config, "outputs": outputs})
        return tasks

    def client_architecture(self, task: Task, ctx: ClientContext) -> nn.Module:
        return restrict_outputs(super().client_architecture(task, ctx), task.config["outputs"])

    def local_update(self, task: Task, data: ClientDataset, ctx: ClientContext) -> Update:
        """PriSM's local update; the stats also name the rows each layer held (``outputs``)."""
        update = super().local_update(task, data, ctx)
        return replace(update, stats={**update.stats, "outputs": task.config["outputs"]})

    def _held_rows(self, upd: Update, name: str, spec: LayerSpec) -> torch.Tensor:
        """The rows of ``U'`` that update ``upd`` holds for layer ``name``, checked against its ``u``."""
        outputs = (upd.stats.get("outputs") or {}).get(name)
        if outputs is None:
            if self.config["output_rows"] == "random":
                raise ValueError(f"update of client {upd.client_id} lacks stats['outputs'][{name!r}]; with "
                                 f"output_rows='random' updates name the rows each layer held")
            outputs = self.output_count(spec, float(upd.stats["keep_ratio"]))
        rows = torch.arange(outputs) if isinstance(outputs, int) else torch.as_tensor(outputs, dtype=torch.int64)
        u_client = upd.tensors[f"{name}.u"]
        terms = len(upd.stats["terms"][name])
        if u_client.shape != (rows.numel(), terms):
            raise ValueError(f"client {upd.client_id}: {name}.u has shape {tuple(u_client.shape)}, expected "
                             f"({rows.numel()}, {terms}) for its {rows.numel()} outputs and {terms} terms")
        return rows

    def check_updates(self, updates: Sequence[Update]) -> None:
        """Refuse an update that does not name its keep ratio and the terms each layer trained."""
        for upd in updates:
            if "keep_ratio" not in upd.stats or "terms" not in upd.stats:
                raise ValueError(f"update of client {upd.client_id} lacks stats['keep_ratio'] / stats['terms']; "
                                 f"{self.name} updates carry the keep ratio and the terms each layer trained")

    def aggregate(self, state: ServerState, round: int, updates: Sequence[Update],
                  ctx: ServerContext) -> ServerState:
        """Complete each client's ``u`` (see the module docstring, step 2), then aggregate as PriSM does."""
        specs: dict[str, LayerSpec] = state["specs"]
        self.check_updates(updates)
        sizes = self.aggregation_weights(updates)
        completed = [dict(u.tensors) for u in updates]
        for name, spec in specs.items():
            cached = state["factors"][name]["u"].to(torch.float64)
            held = [(self._held_rows(upd, name, spec), torch.as_tensor(upd.stats["terms"][name], dtype=torch.int64))
                    for upd in updates]
            num, den = torch.zeros_like(cached), torch.zeros_like(cached)
            for (rows, terms), upd, size in zip(held, updates, sizes):
                num[rows[:, None], terms] += size * upd.tensors[f"{name}.u"].to(torch.float64)
                den[rows[:, None], terms] += size
            fill = torch.where(den > 0, num / den.clamp_min(torch.finfo(torch.float64).tiny), cached)
            for (rows, terms), upd, tensors in zip(held, updates, completed):
                u_client = upd.tensors[f"{name}.u"]
                full = fill[:, terms].to(u_client.dtype)
                full[rows] = u_client
                tensors[f"{name}.u"] = full
        completed_updates = [replace(upd, tensors=tensors) for upd, tensors in zip(updates, completed)]
        return super().aggregate(state, round, completed_updates, ctx)


__all__ = ["OUTPUT_ROWS", "MemoryEfficientPriSM"]
