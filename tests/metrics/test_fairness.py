"""Weak-device F1 (CAFF §4.4; subfl.metrics.fairness) on hand-made numbers."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from subfl.data.base import ArrayData
from subfl.metrics.fairness import (class_f1, class_occurrence_probabilities, confusion_matrix, model_predictions,
                                    weak_device_f1)

# rows: true class, columns: predicted class
CONFUSION = np.array([[5, 1, 0],
                      [2, 3, 1],
                      [0, 0, 4]])


def test_class_f1_by_hand():
    # TP = (5, 3, 4); FP = column sums - TP = (2, 1, 1); FN = row sums - TP = (1, 3, 0)
    # F1 = 2TP / (2TP + FP + FN) = 10/13, 6/10, 8/9
    assert class_f1(CONFUSION) == pytest.approx([10 / 13, 0.6, 8 / 9])


def test_weak_device_f1_by_hand():
    # weak devices hold classes 0 and 1 equally: 0.5 · 10/13 + 0.5 · 0.6 = 0.6846153846...
    assert weak_device_f1(CONFUSION, weak_class_probabilities=[0.5, 0.5, 0.0]) == pytest.approx(0.6846153846)
    # probabilities are normalised
    assert weak_device_f1(CONFUSION, weak_class_probabilities=[2, 2, 0]) == pytest.approx(0.6846153846)
    # weak devices hold only class 2: F1_2 = 8/9
    assert weak_device_f1(CONFUSION, weak_class_probabilities=[0, 0, 1]) == pytest.approx(8 / 9)


def test_predictions_and_confusion_agree():
    labels = np.repeat([0, 1, 2], CONFUSION.sum(axis=1))
    preds = np.concatenate([np.repeat(np.arange(3), row) for row in CONFUSION])
    assert np.array_equal(confusion_matrix(preds, labels, 3), CONFUSION)
    p = class_occurrence_probabilities([[0, 0, 1], [1, 1, 2, 2, 2]], 3)  # pooled: 2, 3, 3 of 8
    assert p == pytest.approx([0.25, 0.375, 0.375])
    # 0.25·10/13 + 0.375·0.6 + 0.375·8/9 = 0.7506410256...
    assert weak_device_f1(preds, labels, p) == pytest.approx(0.7506410256)
    assert weak_device_f1(preds, labels, p) == pytest.approx(weak_device_f1(CONFUSION, weak_class_probabilities=p))


def test_absent_class_scores_zero_and_errors():
    assert class_f1(np.array([[2, 0], [0, 0]])).tolist() == [1.0, 0.0]
    with pytest.raises(ValueError, match="weak_class_probabilities"):
        weak_device_f1(CONFUSION)
    with pytest.raises(ValueError, match="shape"):
        weak_device_f1(CONFUSION, weak_class_probabilities=[1, 1])
    with pytest.raises(ValueError, match="positive sum"):
        weak_device_f1(CONFUSION, weak_class_probabilities=[0, 0, 0])
    with pytest.raises(ValueError, match="lie in"):
        confusion_matrix([0, 3], [0, 1], 3)


def test_model_predictions_use_the_last_position_of_sequence_outputs():
    class Last(torch.nn.Module):  # logits (B, T, V) whose argmax at every position is the input token
        def forward(self, x):
            return torch.nn.functional.one_hot(x, 4).float()

    x = torch.tensor([[0, 1, 2], [3, 3, 1], [2, 0, 0]])
    preds, truth = model_predictions(Last(), ArrayData(x, torch.tensor([2, 1, 1])), batch_size=2)
    assert preds.tolist() == [2, 1, 0] and truth.tolist() == [2, 1, 1]
