"""Evaluation in batches: a model with batch statistics is scored in class-mixed batches whatever the storage order."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from subfl.data.base import ArrayData
from subfl.fl.training import evaluate, evaluation_batches, uses_batch_statistics
from subfl.metrics.fairness import model_predictions
from subfl.models import build_model


def _sorted_two_class_data(n_per_class: int = 200) -> ArrayData:
    """Two classes told apart by the sign of feature 0 (±1 plus noise of scale 0.1), stored sorted by class."""
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.full((n_per_class, 2), -1.0), torch.full((n_per_class, 2), 1.0)])
    x = x + 0.1 * torch.randn(x.shape, generator=g)
    y = torch.cat([torch.zeros(n_per_class, dtype=torch.long), torch.ones(n_per_class, dtype=torch.long)])
    return ArrayData(x, y)


def _batch_norm_classifier() -> nn.Module:
    """Batch-statistics BatchNorm then logits (−z₀, z₀): class 1 exactly when the normalised feature 0 is positive."""
    head = nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[-1.0, 0.0], [1.0, 0.0]]))
    return nn.Sequential(nn.BatchNorm1d(2, affine=False, track_running_stats=False), head)


def test_batch_statistics_are_detected_from_the_norm_layers():
    image = dict(num_classes=10, input_shape=(3, 32, 32))
    assert uses_batch_statistics(_batch_norm_classifier())
    assert uses_batch_statistics(build_model("vgg11", width=0.125, norm="bn_nostats", **image))
    assert not uses_batch_statistics(build_model("vgg11", width=0.125, norm="bn", **image))
    assert not uses_batch_statistics(build_model("cnn", width=0.25, **image))


def test_a_batch_statistics_model_is_scored_in_mixed_batches_of_class_sorted_data():
    data, model = _sorted_two_class_data(), _batch_norm_classifier().eval()
    # storage order: every batch of 100 holds one class, normalised to mean 0, so about half is misread
    contiguous = sum(int((model(data.x[s:s + 100]).argmax(1) == data.y[s:s + 100]).sum())
                     for s in range(0, 400, 100))
    assert contiguous / 400 < 0.65
    assert evaluate(model, data, batch_size=100)["accuracy"] == 1.0
    preds, truth = model_predictions(model, data, batch_size=100)
    assert (truth == data.y.numpy()).all() and (preds == truth).all()  # predictions come back in storage order


def test_the_batches_cover_every_sample_once():
    batches = evaluation_batches(_batch_norm_classifier(), 1003, 100)
    assert len(batches) == 11
    assert sorted(torch.cat(batches).tolist()) == list(range(1003))
    assert evaluation_batches(nn.Linear(2, 2), 1003, 100)[-1] == slice(1000, 1100)


def test_a_model_without_batch_statistics_is_scored_exactly_as_in_storage_order():
    data, model = _sorted_two_class_data(), nn.Linear(2, 2)
    with torch.no_grad():
        logits = torch.cat([model(data.x[s:s + 64]) for s in range(0, 400, 64)])
        expected = sum(float(F.cross_entropy(model(data.x[s:s + 64]), data.y[s:s + 64], reduction="sum"))
                       for s in range(0, 400, 64)) / 400
    result = evaluate(model, data, batch_size=64)
    assert result["accuracy"] == int((logits.argmax(1) == data.y).sum()) / 400
    assert result["loss"] == expected


@pytest.mark.parametrize("batch_size", [0, -1, 2.5, True])
def test_a_bad_batch_size_is_refused(batch_size):
    with pytest.raises(ValueError, match="batch_size"):
        evaluation_batches(nn.Linear(2, 2), 10, batch_size)
