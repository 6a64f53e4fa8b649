"""A diagnostic for PriSM's memory-efficient sub-model: score a finished run's model on its leading outputs only.

Clients of ``prism+memory`` (:mod:`subfl.methods.prism_memory`) compute only the first ``o = ⌈q·n⌉`` outputs of
each decomposed layer; the others are zero in every forward pass they train. The server is evaluated with the dense
model, which computes every output. :func:`leading_outputs_accuracy` scores the same final model both ways — as
evaluated, and with the rows ``j ≥ o`` of every decomposed layer's weight set to zero (the biases kept), which is
the function the clients trained — so a page can tell whether the dense evaluation, rather than the learned
weights, is what costs accuracy. Applied with the same ``q`` to a run that never dropped outputs (plain PriSM), it
is the control: how much that restriction costs a model trained without it.
"""
from __future__ import annotations

import numbers

import torch

from ..metrics.fairness import model_predictions
from ..models.factorized import layer_specs
from ..sampling import keep_count
from .analysis import final_models
from .runner import RunResult, prepare_data


def _run_output_keep(result: RunResult) -> float:
    config = result.config
    if config.method != "prism+memory":
        raise ValueError(f"output_keep is needed for a run of method {config.method!r}; only a prism+memory run "
                         f"carries its own")
    q = dict(config.method_options).get("output_keep")
    if q is not None:
        return float(q)
    levels = config.heterogeneity_setting.levels
    if len(levels) != 1:
        raise ValueError(f"run {config.label()} has several keep ratios {levels}: pass output_keep")
    return float(levels[0])


def leading_outputs_accuracy(result: RunResult, output_keep: float | None = None,
                             data_root: str | None = None) -> dict[str, float]:
    """``{"accuracy": …, "leading_outputs_accuracy": …, "output_keep": q}`` of a finished run's global model.

    ``accuracy``: the global model as the run evaluates it (every output computed). ``leading_outputs_accuracy``:
    the same weights with the rows ``j ≥ ⌈q·n⌉`` of every decomposed layer (:func:`~subfl.models.factorized
    .layer_specs`) set to zero. ``output_keep``: ``q``; ``None`` takes a ``prism+memory`` run's own (its option, or
    its single keep ratio). A diverged run, or a ``prism+memory`` run with ``output_rows="random"``, raises
    ``ValueError``.
    """
    if dict(result.config.method_options).get("output_rows", "leading") != "leading":
        raise ValueError(f"run {result.config.label()} drew its clients' output rows at random (output_rows="
                         f"{dict(result.config.method_options)['output_rows']!r}): every row was trained, so the "
                         f"leading-outputs restriction does not describe what its clients computed")
    if output_keep is None:
        q = _run_output_keep(result)
    elif isinstance(output_keep, numbers.Real) and not isinstance(output_keep, bool) and 0 < output_keep <= 1:
        q = float(output_keep)
    else:
        raise ValueError(f"output_keep={output_keep!r} is not valid; accepted: a real number in (0, 1] or None")
    model = final_models(result, data_root)["global"]
    test = prepare_data(result.config, data_root)[1]
    preds, truth = model_predictions(model, test)
    dense = float((preds == truth).mean())
    with torch.no_grad():
        for name, spec in layer_specs(model).items():
            model.get_submodule(name).weight[keep_count(spec.out_features, q):] = 0.0
    preds, truth = model_predictions(model, test)
    return {"accuracy": dense, "leading_outputs_accuracy": float((preds == truth).mean()), "output_keep": q}


__all__ = ["leading_outputs_accuracy"]
