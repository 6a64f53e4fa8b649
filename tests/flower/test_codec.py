"""subfl.flower.codec: payloads on Flower records keep names, order, dtype, shape, elements and config."""
from __future__ import annotations

import pytest

pytest.importorskip("flwr", reason="Flower is not installed (pip install 'subfl[flower]')")

import torch  # noqa: E402

from subfl.fl.ledger import Ledger  # noqa: E402
from subfl.fl.types import Task, Update  # noqa: E402
from subfl.flower.codec import (RAW_STYPE, array_to_tensor, content_to_task, content_to_update,  # noqa: E402
                                task_to_content, tensor_to_array, update_to_content)

TENSORS = {
    "w": torch.randn(3, 4),
    "transposed": torch.randn(2, 3).t(),  # not contiguous
    "double": torch.randn(2, dtype=torch.float64),
    "half": torch.randn(5).half(),
    "bf16": torch.randn(2, 2).bfloat16(),
    "steps": torch.tensor(7),  # 0-d
    "mask": torch.tensor([True, False, True]),
    "idx": torch.arange(6, dtype=torch.int64).reshape(2, 3),
    "small": torch.tensor([1, -2], dtype=torch.int8),
    "empty": torch.empty(0, 5),
}


@pytest.mark.parametrize("name", list(TENSORS))
def test_a_tensor_comes_back_with_its_dtype_shape_and_bits(name):
    tensor = TENSORS[name]
    back = array_to_tensor(tensor_to_array(tensor))
    assert back.dtype == tensor.dtype and back.shape == tensor.shape
    assert torch.equal(back.reshape(-1).view(torch.uint8) if back.numel() else back,
                       tensor.contiguous().reshape(-1).view(torch.uint8) if tensor.numel() else tensor)
    back.add_(1) if back.dtype != torch.bool else None  # writable, and not the sender's memory
    assert torch.equal(TENSORS[name], tensor)


def test_dtypes_numpy_lacks_travel_as_raw_bytes():
    assert tensor_to_array(TENSORS["bf16"]).stype == RAW_STYPE
    assert tensor_to_array(TENSORS["w"]).stype == "numpy.ndarray"


def test_task_and_update_round_trip_with_the_same_ledger_rows():
    config = {"lr": 0.1, "keep": [0.5, 1.0], "nested": {"a": [1, 2], "b": None}, "name": "x", "nan": float("inf")}
    task = Task(client_id=3, round=2, tensors=dict(TENSORS), config=config)
    back, run = content_to_task(task_to_content(task, {"experiment": {"seed": 1}}))
    assert run == {"experiment": {"seed": 1}}
    assert (back.client_id, back.round, back.config) == (3, 2, config)
    assert list(back.tensors) == list(task.tensors)  # order kept: aggregation and ledger rows follow it
    sent, received = Ledger(), Ledger()
    sent.record(2, 3, "down", task.tensors, task.config)
    received.record(2, 3, "down", back.tensors, back.config)
    assert sent.rows == received.rows
    update = Update(client_id=3, tensors={"b": torch.ones(2), "a": torch.zeros(1, dtype=torch.float16)}, n_samples=17,
                    stats={"loss": 0.25, "steps": 4})
    got = content_to_update(update_to_content(update))
    assert (got.client_id, got.n_samples, got.stats, list(got.tensors)) == (3, 17, update.stats, ["b", "a"])
    assert all(torch.equal(got.tensors[k], v) and got.tensors[k].dtype == v.dtype for k, v in update.tensors.items())
