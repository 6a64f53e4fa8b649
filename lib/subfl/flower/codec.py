"""The library's payloads as Flower records, and back.

A :class:`~subfl.fl.types.Task` or :class:`~subfl.fl.types.Update` is a dict of named tensors plus a small JSON
config. On Flower's Message API that is

* the tensors: one :class:`flwr.app.ArrayRecord`, one :class:`flwr.app.Array` per tensor under the tensor's name, in
  the payload's order. A dtype NumPy knows travels as Flower's standard NumPy array (``stype="numpy.ndarray"``); one it
  does not (``bfloat16``, the ``float8`` types) as the tensor's raw bytes (``stype`` :data:`RAW_STYPE`) with the
  torch dtype name. Either way the receiver gets the same dtype, shape and element bytes;
* the config: a :class:`flwr.app.ConfigRecord` holding its JSON text (``"json"``), because a ConfigRecord holds only
  scalars and flat lists while a payload's config may nest. Plus the payload's ids (client, round) and the tensors'
  names in order;
* an update's sample count: a :class:`flwr.app.MetricRecord` with Flower's ``"num-examples"``.

JSON round-trips what :class:`~subfl.fl.types.Task` admits except that tuples come back as lists and non-string keys
as strings; :func:`decode_config` undoes neither, so a method's client code must read its config as JSON (it already
must, to run on a real client).
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from ..fl.types import Task, Update

RAW_STYPE = "torch.raw"
"""The ``stype`` of an :class:`~flwr.app.Array` holding a tensor's raw element bytes (dtypes NumPy lacks)."""

TASK_TENSORS, TASK_CONFIG = "subfl.task.tensors", "subfl.task.config"
UPDATE_TENSORS, UPDATE_STATS, UPDATE_METRICS = "subfl.update.tensors", "subfl.update.stats", "subfl.update.metrics"
RUN_RECORD = "subfl.run"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def tensor_to_array(tensor: torch.Tensor) -> Array:
    """A Flower Array holding ``tensor``'s dtype, shape and elements."""
    t = tensor.detach().to("cpu").contiguous()
    try:
        return Array.from_numpy_ndarray(t.numpy())
    except TypeError:  # a dtype NumPy has no type for: its raw bytes
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        return Array(dtype=_dtype_name(t.dtype), shape=tuple(t.shape), stype=RAW_STYPE, data=data)


def array_to_tensor(array: Array) -> torch.Tensor:
    """The tensor an :func:`tensor_to_array` Array holds (a fresh, writable CPU tensor)."""
    if array.stype == RAW_STYPE:
        dtype = getattr(torch, array.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"unknown torch dtype {array.dtype!r} in a {RAW_STYPE} array")
        flat = torch.frombuffer(bytearray(array.data), dtype=torch.uint8) if array.data else torch.empty(0, dtype=torch.uint8)
        return flat.view(dtype).reshape(tuple(array.shape)).clone()
    return torch.from_numpy(np.array(array.numpy(), copy=True))


def tensors_to_record(tensors: dict[str, torch.Tensor]) -> ArrayRecord:
    record = ArrayRecord()
    for name, tensor in tensors.items():
        record[name] = tensor_to_array(tensor)
    return record


def record_to_tensors(record: ArrayRecord, names: list[str]) -> dict[str, torch.Tensor]:
    if sorted(names) != sorted(record.keys()):
        raise ValueError(f"the array record holds {sorted(record.keys())}, the config names {sorted(names)}")
    return {name: array_to_tensor(record[name]) for name in names}


def encode_config(config: dict[str, Any]) -> str:
    return json.dumps(config)


def decode_config(text: str) -> dict[str, Any]:
    return json.loads(text)


def task_to_content(task: Task, run: dict[str, Any]) -> RecordDict:
    """The RecordDict of a train message: the task, and ``run`` (what the client needs to build its data)."""
    return RecordDict({
        TASK_TENSORS: tensors_to_record(task.tensors),
        TASK_CONFIG: ConfigRecord({"json": encode_config(task.config), "client_id": int(task.client_id),
                                   "round": int(task.round), "names": list(task.tensors)}),
        RUN_RECORD: ConfigRecord({"json": json.dumps(run, sort_keys=True)}),
    })


def content_to_task(content: RecordDict) -> tuple[Task, dict[str, Any]]:
    cfg = content.config_records[TASK_CONFIG]
    tensors = record_to_tensors(content.array_records[TASK_TENSORS], list(cfg.get("names", [])))
    task = Task(client_id=int(cfg["client_id"]), round=int(cfg["round"]), tensors=tensors,
                config=decode_config(str(cfg["json"])))
    return task, json.loads(str(content.config_records[RUN_RECORD]["json"]))


def update_to_content(update: Update) -> RecordDict:
    return RecordDict({
        UPDATE_TENSORS: tensors_to_record(update.tensors),
        UPDATE_STATS: ConfigRecord({"json": encode_config(update.stats), "names": list(update.tensors)}),
        UPDATE_METRICS: MetricRecord({"num-examples": int(update.n_samples), "client-id": int(update.client_id)}),
    })


def content_to_update(content: RecordDict) -> Update:
    stats = content.config_records[UPDATE_STATS]
    metrics = content.metric_records[UPDATE_METRICS]
    tensors = record_to_tensors(content.array_records[UPDATE_TENSORS], list(stats.get("names", [])))
    return Update(client_id=int(metrics["client-id"]), tensors=tensors, n_samples=int(metrics["num-examples"]),
                  stats=decode_config(str(stats["json"])))


def array_record_bytes(record: ArrayRecord) -> int:
    """Bytes of the arrays' serialised data in ``record`` (NumPy's ``.npy`` header included)."""
    return int(sum(len(record[name].data) for name in record.keys()))
