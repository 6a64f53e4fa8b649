"""Score a finished run's global model after editing the weight of every decomposed layer.

The server of a sub-model method evaluates the dense global model, but no client ever trains that model: each
trains a part of it. The functions here score the same final weights twice — as the run evaluates them, and with
every decomposed layer (:func:`~subfl.models.factorized.layer_specs`: all but the first and last layers) edited —
so that a page can tell what the untrained rest of the model does to the dense evaluation:

* :func:`edited_accuracy`, the general form: any in-place edit of each decomposed layer's weight;
* :func:`top_terms_accuracy`: each layer cut to its top ``⌈r·N⌉`` SVD terms, ``W = Σᵢ λᵢ uᵢ vᵢᵀ`` truncated — the
  sub-model a top-n (OrthDrop / FedHM) client would receive from this state, with ω = 1.
"""
from __future__ import annotations

import numbers
from collections.abc import Callable

import torch

from subfl.metrics.fairness import model_predictions
from subfl.models.factorized import layer_specs
from subfl.sampling import keep_count
from .analysis import final_models
from subfl.experiments.runner import RunResult, prepare_data

WeightEdit = Callable[[str, torch.Tensor], None]
"""``edit(layer_name, weight)``: changes the dense weight of one decomposed layer in place (no autograd)."""


def edited_accuracy(result: RunResult, edit: WeightEdit, data_root: str | None = None) -> tuple[float, float]:
    """``(accuracy, edited accuracy)`` of a finished run's final global model on its test set: as the run evaluates
    it, and after ``edit(name, weight)`` of every decomposed layer (biases and other layers unchanged). A diverged
    run raises ``ValueError`` (:func:`~subfl_book.analysis.final_models`)."""
    dataset, test, _ = prepare_data(result.config, data_root)
    model = final_models(result, dataset=dataset)["global"]
    preds, truth = model_predictions(model, test)
    dense = float((preds == truth).mean())
    with torch.no_grad():
        for name in layer_specs(model):
            edit(name, model.get_submodule(name).weight)
    preds, truth = model_predictions(model, test)
    return dense, float((preds == truth).mean())


def truncate_to_top_terms(weight: torch.Tensor, keep: float) -> None:
    """Replace ``weight`` in place by its best rank-``⌈keep·N⌉`` approximation, ``N = min(n, m)`` of its matrix
    ``(n, m)`` (a convolution ``(n, C, k, k)`` as ``(n, C·k·k)``, the library's factorization): the top terms of
    its SVD (Eckart–Young), computed in float64."""
    matrix = weight.detach().reshape(weight.shape[0], -1).double()
    u, s, vh = torch.linalg.svd(matrix, full_matrices=False)
    n = keep_count(s.numel(), keep)
    weight.copy_(((u[:, :n] * s[:n]) @ vh[:n]).reshape(weight.shape).to(weight.dtype))


def top_terms_accuracy(result: RunResult, keep: float, data_root: str | None = None) -> dict[str, float]:
    """``{"accuracy": …, "top_terms_accuracy": …, "keep": r}`` of a finished run's final global model: as
    evaluated, and with every decomposed layer cut to its top ``⌈r·N⌉`` terms (:func:`truncate_to_top_terms`).

    For a top-n run this is the model its clients receive (they train exactly those terms, with ω = 1); the
    rest of each layer is what the dense evaluation adds. For any other run it is a control: what the same
    restriction costs a model that was not trained under it. ``keep`` must be a real number in (0, 1].
    """
    if not (isinstance(keep, numbers.Real) and not isinstance(keep, bool) and 0 < keep <= 1):
        raise ValueError(f"keep={keep!r} is not valid; accepted: a real number in (0, 1]")
    dense, truncated = edited_accuracy(result, lambda name, weight: truncate_to_top_terms(weight, float(keep)),
                                       data_root)
    return {"accuracy": dense, "top_terms_accuracy": truncated, "keep": float(keep)}


__all__ = ["WeightEdit", "edited_accuracy", "top_terms_accuracy", "truncate_to_top_terms"]
