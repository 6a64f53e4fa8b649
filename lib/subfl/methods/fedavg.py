"""FedAvg (McMahan et al., AISTATS 2017): the full model on every client, averaged by data size.

The reference every chapter compares against. Weights and buffers (BatchNorm statistics) travel both ways
and are averaged with weights n_k / Σ n (Algorithm 1 of the paper).
"""
from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from ..fl.aggregation import weighted_average
from ..fl.training import ClientDataset, train_epochs
from ..fl.types import ClientProfile, Task, Update
from ..fl.method import ClientContext, Method, ServerContext, ServerState, clone_tensors


class FedAvg(Method):
    """Federated averaging of the full model (every client trains the whole network)."""

    name = "fedavg"
    options: dict = {}
    uses_keep_ratios = False

    def init(self, ctx: ServerContext) -> ServerState:
        model = ctx.model_fn()
        return {"weights": clone_tensors(model.state_dict())}

    def configure(self, state: ServerState, round: int, clients: Sequence[ClientProfile],
                  ctx: ServerContext) -> dict[int, Task]:
        config = {"train": ctx.train_config(round)}
        return {p.client_id: Task(p.client_id, round, state["weights"], config) for p in clients}

    def local_update(self, task: Task, data: ClientDataset, ctx: ClientContext) -> Update:
        model = ctx.model_fn().to(ctx.device)
        model.load_state_dict(task.tensors)
        stats = train_epochs(model, data, task.config["train"], ctx.generator, device=ctx.device)
        return Update(task.client_id, clone_tensors(model.state_dict()), len(data), stats)

    def aggregate(self, state: ServerState, round: int, updates: Sequence[Update],
                  ctx: ServerContext) -> ServerState:
        weights = weighted_average([u.tensors for u in updates], [u.n_samples for u in updates])
        return {**state, "weights": weights}

    def evaluation_models(self, state: ServerState, ctx: ServerContext) -> dict[str, nn.Module]:
        model = ctx.model_fn()
        model.load_state_dict(state["weights"])
        return {"global": model}
