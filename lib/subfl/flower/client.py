"""The client side on Flower: a :class:`flwr.clientapp.ClientApp` that runs a method's ``local_update``.

A train message carries the task (:mod:`subfl.flower.codec`) and the run's experiment config. The client builds the
run's data exactly as the in-process engine does (:func:`~subfl.experiments.runner.prepare_data` and
:func:`~subfl.experiments.runner.client_splits`: the same partition for the same config and seed), takes its own
client's index set, and trains with the engine's generators: ``torch_generator(seed, "local", round, client)`` and the
global torch generator seeded from ``(seed, "torch-global", round, client)`` (:func:`local_update`).

A SuperNode hosts the library clients ``c`` with ``c % num-partitions == partition-id`` (its node config; Flower's
simulation sets both) and refuses a task for any other client. It reads its data from its node config's ``data-root``
when set, else ``$SUBFL_DATA_ROOT`` (else the library's default folder).
"""
from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")  # a simulation must not phone home

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from ..data.base import FederatedDataset
from ..fl.method import ClientContext, Method
from ..fl.rng import numpy_rng, torch_generator
from ..fl.training import ClientDataset
from ..fl.types import Task, Update
from .codec import content_to_task, update_to_content

NODE_RECORD = "subfl.node"


@dataclass
class ClientSide:
    """What a node builds once per experiment: the method (client code only), the data and the model factory."""

    config: Any
    method: Method
    dataset: FederatedDataset
    parts: list[np.ndarray]
    model_fn: Any


_CACHE: dict[str, ClientSide] = {}
_LOCK = threading.Lock()


def client_side(experiment: dict[str, Any], data_root: str | None) -> ClientSide:
    """The (cached) :class:`ClientSide` of an experiment config given as :meth:`ExperimentConfig.to_dict`."""
    from ..experiments.config import ExperimentConfig
    from ..experiments.runner import ModelFactory, client_splits, prepare_data
    from ..methods import make_method

    key = json.dumps([experiment, data_root], sort_keys=True, default=str)
    with _LOCK:
        if key not in _CACHE:
            config = ExperimentConfig.from_dict(experiment)
            dataset, _, parts = prepare_data(config, data_root)
            parts, _ = client_splits(config, parts)
            method = make_method(config.method, **dict(config.method_options))
            _CACHE.clear()  # one experiment at a time per node
            _CACHE[key] = ClientSide(config, method, dataset, parts, ModelFactory(config, dataset))
        return _CACHE[key]


def local_update(method: Method, task: Task, data: ClientDataset, model_fn, *, seed: int, device: str, task_kind: str,
                 num_classes: int) -> Update:
    """``method.local_update`` with the in-process engine's generators (:func:`subfl.fl.engine.run_simulation`)."""
    cid, rnd = int(task.client_id), int(task.round)
    cctx = ClientContext(model_fn, torch_generator(seed, "local", rnd, cid), device, task_kind, num_classes)
    with torch.random.fork_rng(devices=[]):  # layers such as dropout read the global generator
        torch.manual_seed(int(numpy_rng(seed, "torch-global", rnd, cid).integers(2**62)))
        return method.local_update(task, data, cctx)


def _node_partition(context: Context) -> tuple[int, int]:
    node = context.node_config
    return int(node.get("partition-id", 0)), int(node.get("num-partitions", 1))


def handle_train(msg: Message, context: Context) -> Message:
    task, run = content_to_task(msg.content)
    partition, partitions = _node_partition(context)
    if task.client_id % partitions != partition:
        raise ValueError(f"node {partition}/{partitions} hosts clients c with c % {partitions} == {partition}, "
                         f"got a task for client {task.client_id}")
    data_root = context.node_config.get("data-root") or run.get("data_root") or None
    side = client_side(run["experiment"], None if data_root is None else str(data_root))
    threads = torch.get_num_threads()
    if run.get("torch_threads"):
        torch.set_num_threads(int(run["torch_threads"]))  # the server's: float sums depend on the thread count
    try:
        data = ClientDataset(side.dataset.train, side.parts[task.client_id])
        update = local_update(side.method, task, data, side.model_fn, seed=side.config.seed,
                              device=str(run.get("device") or side.config.device), task_kind=side.dataset.task,
                              num_classes=side.dataset.num_classes)
    finally:
        torch.set_num_threads(threads)
    return Message(update_to_content(update), reply_to=msg)


def handle_query(msg: Message, context: Context) -> Message:
    """Which library clients this node hosts (its partition id and the number of partitions)."""
    partition, partitions = _node_partition(context)
    return Message(RecordDict({NODE_RECORD: ConfigRecord({"partition-id": partition,
                                                          "num-partitions": partitions})}), reply_to=msg)


client_app = ClientApp()
client_app.train()(handle_train)
client_app.query()(handle_query)
