"""The server side on Flower: a :class:`flwr.serverapp.ServerApp` that runs a method's ``configure`` / ``aggregate`` /
evaluation with the library's engine, the clients' ``local_update`` running in Flower ClientApps.

:class:`FlowerTransport` wraps a :class:`~subfl.fl.method.Method`: its ``configure`` calls the method's, then sends
every task to the SuperNode hosting its client (one train message each, all pushed at once, so clients train in
parallel); its ``local_update`` waits for that client's reply and decodes the update. Everything else is the method's
own code, run by :func:`subfl.fl.engine.run_simulation`, so client selection (:func:`~subfl.fl.engine.select_clients`),
the ledger (one row per tensor sent and received, and the configs), the history, divergence checks and checkpoints
are the in-process engine's. :func:`run_on_grid` writes the files of ``subfl run`` (``history.csv``,
``ledger.csv``, ``timings.csv``, ``state.pt``, ``summary.json``).
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

import torch
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid, ServerApp

from ..fl.method import ClientContext, Method, ServerContext, ServerState
from ..fl.training import ClientDataset
from ..fl.types import ClientProfile, Task, Update
from .client import NODE_RECORD
from .codec import UPDATE_TENSORS, TASK_TENSORS, array_record_bytes, content_to_update, task_to_content

DEFAULT_TIMEOUT_S = 600.0
"""How long the server waits for nodes to connect and for one client's reply before giving up."""


class NodeUnavailable(RuntimeError):
    """A SuperNode stopped answering mid-run (Flower's SuperLink missed its heartbeats).

    The run stops at that round: it is not finished with the clients that answered, because the round's aggregate
    would then depend on which node failed when, and the run would no longer equal its in-process twin. The checkpoint
    of the last finished round stays in the output folder; restarting the node and running the same app again resumes
    from it and ends with the history of an uninterrupted run."""


class FlowerTransport(Method):
    """A method whose client side runs on Flower nodes; its server side is ``inner``'s."""

    def __init__(self, inner: Method, grid: Grid, run: dict[str, Any], nodes: dict[int, int], partitions: int, *,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.inner, self.grid, self.run, self.nodes, self.partitions = inner, grid, run, nodes, partitions
        self.name, self.config, self.timeout_s = inner.name, inner.config, timeout_s
        self._pending: dict[int, str] = {}  # client id -> message id of its task
        self._replies: dict[str, Message] = {}
        self.wire = {"messages_down": 0, "messages_up": 0, "array_bytes_down": 0, "array_bytes_up": 0}

    # ----- server side: the method's -----------------------------------------------------------------
    def init(self, ctx: ServerContext) -> ServerState:
        return self.inner.init(ctx)

    def configure(self, state: ServerState, round: int, clients: Sequence[ClientProfile],
                  ctx: ServerContext) -> dict[int, Task]:
        tasks = self.inner.configure(state, round, clients, ctx)
        messages, order = [], []
        for cid, task in tasks.items():
            content = task_to_content(task, self.run)
            self.wire["array_bytes_down"] += array_record_bytes(content.array_records[TASK_TENSORS])
            messages.append(Message(content, dst_node_id=self.nodes[int(cid) % self.partitions],
                                    message_type=MessageType.TRAIN, group_id=str(round)))
            order.append(int(cid))
        self._pending.update(zip(order, self.grid.push_messages(messages)))
        self.wire["messages_down"] += len(messages)
        return tasks

    def aggregate(self, state: ServerState, round: int, updates: Sequence[Update], ctx: ServerContext) -> ServerState:
        return self.inner.aggregate(state, round, updates, ctx)

    def evaluation_models(self, state: ServerState, ctx: ServerContext):
        return self.inner.evaluation_models(state, ctx)

    def personalized_models(self, state: ServerState, round: int, client: ClientProfile, models, ctx: ServerContext):
        return self.inner.personalized_models(state, round, client, models, ctx)

    def round_metrics(self, state: ServerState, round: int):
        return self.inner.round_metrics(state, round)

    def __getattr__(self, name: str) -> Any:  # anything else a caller reads from the method
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    # ----- client side: on a node ----------------------------------------------------------------------
    def local_update(self, task: Task, data: ClientDataset, ctx: ClientContext) -> Update:
        message_id = self._pending.pop(int(task.client_id))
        deadline = time.monotonic() + self.timeout_s
        while message_id not in self._replies:
            # ask only for replies not yet received: a message id pulled again answers "message unavailable"
            waiting = [m for m in (message_id, *self._pending.values()) if m not in self._replies]
            for reply in self.grid.pull_messages(waiting):
                self._replies.setdefault(reply.metadata.reply_to_message_id, reply)
            if message_id in self._replies:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"no reply from client {task.client_id}'s node within {self.timeout_s:g} s")
            time.sleep(0.005)
        reply = self._replies.pop(message_id)
        if reply.has_error() and reply.error.code == ErrorCode.NODE_UNAVAILABLE:
            partition = int(task.client_id) % self.partitions
            raise NodeUnavailable(
                f"round {task.round}: the SuperNode hosting client {task.client_id} (partition-id {partition}, node "
                f"{self.nodes[partition]}) stopped answering; Flower says: {reply.error.reason}")
        if reply.has_error():
            raise RuntimeError(f"client {task.client_id} failed on its node: {reply.error.reason}")
        self.wire["messages_up"] += 1
        self.wire["array_bytes_up"] += array_record_bytes(reply.content.array_records[UPDATE_TENSORS])
        update = content_to_update(reply.content)
        if update.client_id != task.client_id:
            raise RuntimeError(f"the reply to client {task.client_id}'s task is client {update.client_id}'s update")
        return update


def discover_nodes(grid: Grid, min_nodes: int = 1, timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[dict[int, int], int]:
    """``({partition id: node id}, number of partitions)`` of the connected nodes (asked with a query message);
    waits up to ``timeout_s`` for ``min_nodes`` nodes and for every partition to be present."""
    deadline = time.monotonic() + timeout_s
    while True:
        node_ids = sorted(grid.get_node_ids())
        if len(node_ids) >= min_nodes:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(node_ids)} node(s) connected within {timeout_s:g} s, {min_nodes} needed")
        time.sleep(0.2)
    queries = [Message(RecordDict({NODE_RECORD: ConfigRecord({})}), dst_node_id=n, message_type=MessageType.QUERY)
               for n in node_ids]
    replies = list(grid.send_and_receive(queries, timeout=max(1.0, deadline - time.monotonic())))
    nodes, partitions = {}, set()
    for reply in replies:
        if reply.has_error():
            raise RuntimeError(f"node {reply.metadata.src_node_id} could not say what it hosts: {reply.error.reason}")
        record = reply.content.config_records[NODE_RECORD]
        nodes[int(record["partition-id"])] = reply.metadata.src_node_id
        partitions.add(int(record["num-partitions"]))
    if len(replies) < len(node_ids):
        raise TimeoutError(f"{len(node_ids) - len(replies)} node(s) did not answer within {timeout_s:g} s")
    if len(partitions) != 1 or set(nodes) != set(range(next(iter(partitions)))):
        raise RuntimeError(f"the nodes' partitions {sorted(nodes)} of {sorted(partitions)} do not cover 0 .. n-1")
    return nodes, partitions.pop()


def run_on_grid(grid: Grid, config, out_dir: str | Path, *, data_root: str | None = None, min_nodes: int = 1,
                progress: bool | None = False, timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
    """Run ``config`` (an :class:`~subfl.experiments.ExperimentConfig`) with the engine, clients on the grid's nodes;
    write the result files of ``subfl run`` into ``out_dir`` and return the summary. A run interrupted there resumes
    from its checkpoint (the transport keeps no state between rounds)."""
    from ..experiments.provenance import run_key
    from ..experiments.runner import _summary, _write_json_atomic, client_splits, prepare_data, server_context
    from ..fl.engine import CHECKPOINT_NAME, EngineSettings, run_simulation, write_timings
    from ..methods import make_method

    target = Path(out_dir)
    target.mkdir(parents=True, exist_ok=True)
    key = run_key(config)
    nodes, partitions = discover_nodes(grid, min_nodes, timeout_s)
    dataset, test, parts = prepare_data(config, data_root)
    parts, local_tests = client_splits(config, parts)
    run = {"experiment": config.to_dict(), "torch_threads": torch.get_num_threads(), "data_root": data_root}
    method = FlowerTransport(make_method(config.method, **dict(config.method_options)), grid, run, nodes, partitions,
                             timeout_s=timeout_s)
    ctx = server_context(config, dataset)
    settings = EngineSettings(rounds=config.rounds, clients_per_round=config.clients_per_round,
                              eval_every=config.eval_every, seed=config.seed, device=config.device)
    try:
        result = run_simulation(method, dataset, parts, config.heterogeneity_setting, ctx, settings, test_data=test,
                                out_dir=target, fingerprint=key, progress=progress,
                                description=config.label() + " (flower)", client_test_indices=local_tests)
    except NodeUnavailable as err:
        kept = target / CHECKPOINT_NAME
        resume = (f"the checkpoint of the last finished round is kept in {kept}: restart the node and run the same "
                  "app again to resume from it" if kept.exists() else "no round had finished, so nothing is kept")
        raise NodeUnavailable(f"{err}. The run stops; {resume}.") from None
    (target / "summary.json").unlink(missing_ok=True)
    result.history.write_csv(target / "history.csv")
    result.ledger.to_frame().to_csv(target / "ledger.csv", index=False)
    write_timings(result.timings, target / "timings.csv")
    torch.save(result.state, target / "state.pt")
    summary = _summary(config, result, dataset, parts, key)
    summary["engine"] = "flower"
    summary["flower"] = {"nodes": partitions, **method.wire}
    _write_json_atomic(summary, target / "summary.json")
    (target / CHECKPOINT_NAME).unlink(missing_ok=True)
    return summary


def _runs_from_context(context: Context) -> list[dict[str, Any]]:
    """The runs a deployment's run config names: ``experiment`` (the config's JSON) and ``out-dir``, optionally
    ``data-root``, ``min-nodes`` and ``torch-threads``."""
    rc = context.run_config
    if "experiment" not in rc or "out-dir" not in rc:
        raise ValueError("the run config needs 'experiment' (an experiment config as JSON) and 'out-dir'")
    return [{"experiment": json.loads(str(rc["experiment"])), "out_dir": str(rc["out-dir"]),
             "data_root": str(rc["data-root"]) if rc.get("data-root") else None,
             "min_nodes": int(rc.get("min-nodes", 1)), "torch_threads": int(rc.get("torch-threads", 0))}]


def make_server_app(runs: list[dict[str, Any]] | None = None, errors: list[BaseException] | None = None) -> ServerApp:
    """A ServerApp that runs ``runs`` (dicts with ``experiment`` (a config's :meth:`to_dict`), ``out_dir`` and
    optionally ``data_root``, ``min_nodes``, ``torch_threads``) one after another; without ``runs``, the one its run
    config names. Exceptions are appended to ``errors`` when given (then re-raised)."""
    from ..experiments.config import ExperimentConfig

    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        try:
            for spec in (runs if runs is not None else _runs_from_context(context)):
                if spec.get("torch_threads"):
                    torch.set_num_threads(int(spec["torch_threads"]))
                run_on_grid(grid, ExperimentConfig.from_dict(spec["experiment"]), spec["out_dir"],
                            data_root=spec.get("data_root"), min_nodes=int(spec.get("min_nodes", 1)))
        except BaseException as err:
            if errors is not None:
                errors.append(err)
            raise

    return app


server_app = make_server_app()
"""The ServerApp of a deployment (``flwr run``): its run config names the experiment (see ``_runs_from_context``)."""
