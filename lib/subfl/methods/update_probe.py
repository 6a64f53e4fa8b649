"""Update probe: how close a method's server update is to FedAvg's from the same state (spectral sharding, Fig. 4).

Korzhenkov & Louizos compare sampling strategies by the cosine similarity between the server update a strategy
makes and the update full-model FedAvg would make from the same global model. Method ``update-probe`` runs any
method of :data:`PROBED_MODULES` (option ``method``, with its ``method_options``) unchanged and, every round, also
computes that FedAvg update:

* **server → client**: the method's own task, plus the dense global model ``W_t`` (the method's evaluation model)
  under the prefix ``fedavg-probe/``;
* **on the client**: the method's local update as usual; then :class:`~subfl.methods.fedavg.FedAvg`'s local update
  of the dense model ``W_t`` on the same data, from a copy of the client's random generator taken before the
  method's training, so both see the same mini-batches;
* **server**: the method aggregates its own updates as usual (the run's trajectory is the method's, bit for bit);
  FedAvg's aggregation (weights n_k, McMahan et al., Alg. 1) of the FedAvg updates gives ``W_fedavg``, which is
  compared and discarded.

With ``Δ_m = W_{t+1} − W_t`` (the method's new dense model minus the old one) and ``Δ_f = W_fedavg − W_t``, over the
dense model's parameters (buffers such as BatchNorm statistics left out), the history gets per round:

* ``update_cosine`` / ``all``: ``cos(Δ_m, Δ_f)`` of all parameters concatenated; / ``<parameter>``: the same for
  every weight matrix or convolution kernel (parameters with two or more dimensions);
* ``update_norm_ratio`` / ``all``: ``‖Δ_m‖ / ‖Δ_f‖``.

A value that is undefined in a round (a cosine with a zero update, a ratio with a zero FedAvg update — for example in
the last round of a cosine learning-rate schedule, whose rate is ``lr_min = 0``) is not recorded for that round.

The probe is a diagnostic: its ledger also records the probe's tensors (the dense model down, the FedAvg-trained
model up), so a probe run's byte counts are not the method's. Each round costs one extra full-model local training
per selected client. A method whose state names a normalisation (``state["norm"]``, e.g. the spectral methods'
batch-statistics BatchNorm) gets its reference model built with that normalisation, so both updates live in the
same architecture.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ..fl.training import ClientDataset
from ..fl.types import ClientProfile, Task, Update
from . import fedavg, origdrop, spectral
from ..fl.method import ClientContext, Method, ServerContext, ServerState, clone_tensors
from .fedavg import FedAvg

PREFIX = "fedavg-probe/"
"""Prefix of the probe's tensors in tasks and updates."""

PROBED_MODULES = (fedavg, origdrop, spectral)
"""Modules whose methods the probe accepts: imported here so that a probe run's cache key covers their code."""


def probed_methods() -> list[str]:
    """Names of the methods ``update-probe`` accepts as option ``method``."""
    from . import METHODS

    modules = {m.__name__ for m in PROBED_MODULES}
    return sorted(name for name, cls in METHODS.items() if cls.__module__ in modules)


def update_similarity(old: dict[str, torch.Tensor], new: dict[str, torch.Tensor], reference: dict[str, torch.Tensor],
                      names: Sequence[str]) -> dict[tuple[str, str], float]:
    """``{("update_cosine", "all" | name), ("update_norm_ratio", "all")}`` of ``Δ = new − old`` against
    ``Δ_ref = reference − old`` over the tensors ``names`` (float64; a zero update gives cosine NaN)."""
    deltas = {n: (new[n].double() - old[n].double()).reshape(-1) for n in names}
    refs = {n: (reference[n].double() - old[n].double()).reshape(-1) for n in names}

    def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
        denominator = float(a.norm() * b.norm())
        return float(a @ b) / denominator if denominator > 0 else math.nan

    every, every_ref = torch.cat([deltas[n] for n in names]), torch.cat([refs[n] for n in names])
    out = {("update_cosine", "all"): cosine(every, every_ref)}
    out.update({("update_cosine", n): cosine(deltas[n], refs[n]) for n in names if old[n].dim() >= 2})
    ref_norm = float(every_ref.norm())
    out[("update_norm_ratio", "all")] = float(every.norm()) / ref_norm if ref_norm > 0 else math.nan
    return out


class UpdateProbe(Method):
    """Runs option ``method`` (with ``method_options``) and records how its server update compares with FedAvg's
    from the same state (see the module docstring)."""

    name = "update-probe"
    options: dict = {"method": None, "method_options": None}

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        from . import make_method

        accepted = probed_methods()
        if self.config["method"] not in accepted:
            raise ValueError(f"option method must be one of {', '.join(accepted)}, got {self.config['method']!r}")
        inner_options = self.config["method_options"] or {}
        if not isinstance(inner_options, dict):
            raise ValueError(f"option method_options must be a dict or None, got {inner_options!r}")
        self.inner = make_method(self.config["method"], **inner_options)
        self.reference = FedAvg()

    @classmethod
    def behaviour_versions(cls, options: Mapping[str, Any]) -> dict[str, int]:
        """Its own version, the probed method's (with its options) and FedAvg's (the reference update)."""
        from . import METHODS

        versions = {**super().behaviour_versions(options), **FedAvg.behaviour_versions({})}
        if options.get("method") in METHODS:
            versions.update(METHODS[options["method"]].behaviour_versions(options.get("method_options") or {}))
        return versions

    @staticmethod
    def _model_overrides(state: ServerState) -> dict[str, Any]:
        return {"norm": state["norm"]} if state.get("norm") else {}

    def _dense(self, state: ServerState, ctx: ServerContext) -> nn.Module:
        return self.inner.evaluation_models(state, ctx)["global"]

    # ----- server side -------------------------------------------------------------------------------
    def init(self, ctx: ServerContext) -> ServerState:
        return self.inner.init(ctx)

    def configure(self, state: ServerState, round: int, clients: Sequence[ClientProfile],
                  ctx: ServerContext) -> dict[int, Task]:
        tasks = self.inner.configure(state, round, clients, ctx)
        dense = {"weights": clone_tensors(self._dense(state, ctx).state_dict())}  # FedAvg's state at W_t
        references = self.reference.configure(dense, round, clients, ctx)
        overrides = self._model_overrides(state)
        return {cid: Task(t.client_id, t.round, {**t.tensors, **_prefixed(references[cid].tensors)},
                          {**t.config, "probe": {"config": references[cid].config, "model_overrides": overrides}})
                for cid, t in tasks.items()}

    def aggregate(self, state: ServerState, round: int, updates: Sequence[Update],
                  ctx: ServerContext) -> ServerState:
        own = [Update(u.client_id, _split(u.tensors)[0], u.n_samples, u.stats) for u in updates]
        references = [Update(u.client_id, _split(u.tensors)[1], u.n_samples, {}) for u in updates]
        reference = self.reference.aggregate({}, round, references, ctx)["weights"]
        old_model = self._dense(state, ctx)
        new_state = self.inner.aggregate({k: v for k, v in state.items() if k != "probe"}, round, own, ctx)
        names = [n for n, p in old_model.named_parameters() if p.is_floating_point()]
        similarity = update_similarity(old_model.state_dict(), self._dense(new_state, ctx).state_dict(), reference,
                                       names)
        return {**new_state, "probe": similarity}

    def evaluation_models(self, state: ServerState, ctx: ServerContext) -> dict[str, nn.Module]:
        return self.inner.evaluation_models(state, ctx)

    def round_metrics(self, state: ServerState, round: int) -> dict[tuple[str, str], float]:
        """The method's own metrics and the probe's, leaving out the probe's undefined ones (NaN: a zero update, e.g.
        in a round whose learning rate is 0)."""
        defined = {k: v for k, v in state.get("probe", {}).items() if not math.isnan(v)}
        return {**self.inner.round_metrics(state, round), **defined}

    # ----- client side -------------------------------------------------------------------------------
    def local_update(self, task: Task, data: ClientDataset, ctx: ClientContext) -> Update:
        probe = task.config["probe"]
        own, dense = _split(task.tensors)
        generator = torch.Generator()
        generator.set_state(ctx.generator.get_state())  # before the method draws: the same mini-batches for both
        update = self.inner.local_update(
            Task(task.client_id, task.round, own, {k: v for k, v in task.config.items() if k != "probe"}), data, ctx)
        reference_ctx = dataclasses.replace(
            ctx, model_fn=functools.partial(ctx.model_fn, **probe["model_overrides"]), generator=generator)
        reference = self.reference.local_update(Task(task.client_id, task.round, dense, probe["config"]), data,
                                                reference_ctx)
        return Update(update.client_id, {**update.tensors, **_prefixed(reference.tensors)}, update.n_samples,
                      {**update.stats, "probe_loss": reference.stats.get("loss")})


def _prefixed(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {PREFIX + k: v for k, v in tensors.items()}


def _split(tensors: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(the method's own tensors, the probe's tensors with the prefix removed)."""
    own = {k: v for k, v in tensors.items() if not k.startswith(PREFIX)}
    return own, {k[len(PREFIX):]: v for k, v in tensors.items() if k.startswith(PREFIX)}


__all__ = ["PREFIX", "PROBED_MODULES", "UpdateProbe", "probed_methods", "update_similarity"]
