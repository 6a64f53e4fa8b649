"""Fairness towards weak devices: how well the global model serves the classes the weak devices hold.

CAFF (Pfeiffer et al., §4.4) asks whether the data of constrained ("weak") devices is represented in the global
model. With weak devices' class occurrence probabilities ``p_k`` (the share of class ``k`` among all samples the
weak devices hold, :func:`class_occurrence_probabilities`) and the global model's class-specific F1 scores
``F1_k`` on the test set, the score is

    weak_device_F1 = Σ_k p_k · F1_k,        F1_k = 2·TP_k / (2·TP_k + FP_k + FN_k)

(``F1_k = 0`` for a class that is neither predicted nor present). A method that lets weak devices contribute
little scores lower when their classes differ from the strong devices'. For next-token tasks the classes are the
vocabulary's tokens (predictions at the last position, as the engine's evaluation scores).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from ..data.base import ArrayData
from ..fl.training import evaluation_batches


def confusion_matrix(predictions, labels, num_classes: int) -> np.ndarray:
    """``C[i, j]`` = number of samples of true class ``i`` predicted as ``j`` (int64, ``num_classes²``)."""
    preds = np.asarray(predictions, dtype=np.int64).reshape(-1)
    truth = np.asarray(labels, dtype=np.int64).reshape(-1)
    if preds.shape != truth.shape:
        raise ValueError(f"predictions and labels differ in length: {preds.size} vs {truth.size}")
    if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or num_classes < 1:
        raise ValueError(f"num_classes must be an int >= 1, got {num_classes!r}")
    for name, values in (("predictions", preds), ("labels", truth)):
        if values.size and (values.min() < 0 or values.max() >= num_classes):
            raise ValueError(f"{name} must lie in [0, {num_classes - 1}], got range [{values.min()}, {values.max()}]")
    return np.bincount(truth * num_classes + preds, minlength=num_classes * num_classes).reshape(num_classes,
                                                                                                  num_classes)


def class_f1(confusion) -> np.ndarray:
    """Per-class F1 ``2·TP / (2·TP + FP + FN)`` of a confusion matrix (rows: true class, columns: predicted)."""
    c = np.asarray(confusion, dtype=np.float64)
    if c.ndim != 2 or c.shape[0] != c.shape[1]:
        raise ValueError(f"confusion must be a square matrix, got shape {c.shape}")
    if (c < 0).any():
        raise ValueError("confusion must hold counts >= 0")
    tp = np.diag(c)
    fp = c.sum(axis=0) - tp
    fn = c.sum(axis=1) - tp
    denom = 2 * tp + fp + fn
    return np.divide(2 * tp, denom, out=np.zeros_like(tp), where=denom > 0)


def class_occurrence_probabilities(labels_per_device: Sequence, num_classes: int) -> np.ndarray:
    """The share of each class among all samples held by the given (weak) devices: pooled label histogram / total."""
    counts = np.zeros(num_classes, dtype=np.float64)
    for labels in labels_per_device:
        values = np.asarray(labels, dtype=np.int64).reshape(-1)
        if values.size and (values.min() < 0 or values.max() >= num_classes):
            raise ValueError(f"labels must lie in [0, {num_classes - 1}]")
        counts += np.bincount(values, minlength=num_classes)
    if counts.sum() == 0:
        raise ValueError("the weak devices hold no samples")
    return counts / counts.sum()


def weak_device_f1(confusion_or_preds, labels=None, weak_class_probabilities=None) -> float:
    """CAFF §4.4: ``Σ_k p_k F1_k`` — the global model's class-specific F1 weighted by the weak devices' class
    occurrence probabilities ``p`` (normalised to sum 1).

    Call as ``weak_device_f1(confusion, weak_class_probabilities=p)`` with a square confusion matrix (rows: true
    class), or ``weak_device_f1(predictions, labels, p)`` with predicted and true class ids (``len(p)`` classes).
    """
    if weak_class_probabilities is None:
        raise ValueError("weak_class_probabilities is required (one probability per class)")
    p = np.asarray(weak_class_probabilities, dtype=np.float64).reshape(-1)
    if (p < 0).any() or not p.sum() > 0:
        raise ValueError(f"weak_class_probabilities must be >= 0 with a positive sum, got {p.tolist()}")
    if labels is None:
        confusion = np.asarray(confusion_or_preds)
    else:
        confusion = confusion_matrix(confusion_or_preds, labels, len(p))
    if confusion.shape != (len(p), len(p)):
        raise ValueError(f"confusion has shape {confusion.shape}; {len(p)} class probabilities need "
                         f"({len(p)}, {len(p)})")
    return float(np.dot(p / p.sum(), class_f1(confusion)))


@torch.no_grad()
def model_predictions(model: nn.Module, data: ArrayData, *, batch_size: int = 500,
                      device: str | torch.device = "cpu") -> tuple[np.ndarray, np.ndarray]:
    """``(predicted, true)`` class ids of ``model`` on ``data`` (last position for ``(B, T, V)`` outputs, as the
    engine's evaluation scores next-token models)."""
    model.eval()
    preds = np.zeros(len(data), dtype=np.int64)
    for batch in evaluation_batches(model, len(data), batch_size):
        out = model(data.x[batch].to(device))
        if out.dim() == 3:
            out = out[:, -1, :]
        preds[batch if isinstance(batch, slice) else batch.numpy()] = out.argmax(dim=1).cpu().numpy()
    return preds, data.y.cpu().numpy().astype(np.int64)


__all__ = ["class_f1", "class_occurrence_probabilities", "confusion_matrix", "model_predictions", "weak_device_f1"]
