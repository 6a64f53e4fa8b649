"""Diagnostics for PriSM's memory-efficient sub-model: score a finished run's model as its clients computed it.

Clients of ``prism+memory`` (:mod:`subfl.methods.prism_memory`) compute only ``o = ⌈q·n⌉`` of the ``n`` outputs of
each decomposed layer; the others are zero in every forward pass they train. The server is evaluated with the dense
model, which computes every output. Each function here scores the same final model twice — as evaluated, and with
every decomposed layer's weight edited to stand for what the clients computed (the biases kept, since clients
keep every bias) — so a page can tell whether the dense evaluation, rather than the learned weights, is what costs
accuracy:

* :func:`leading_outputs_accuracy` (option ``output_rows="leading"``): the rows ``j ≥ o`` of the weight set to
  zero, which is exactly the function the clients trained. Applied with the same ``q`` to a run that never dropped
  outputs (plain PriSM), it is the control: how much that restriction costs a model trained without it.
* :func:`expected_outputs_accuracy` (option ``output_rows="random"``): every row of the weight scaled by ``o/n``,
  the probability that a client computes it. This is the expected pre-activation of a client's layer over its
  random rows — dropout's weight-scaling rule for inference (Srivastava et al., JMLR 2014), applied to channels
  that were dropped without the training-time ``n/o`` rescaling. It is an approximation (the expectation does not
  pass through the non-linearities exactly), not the function any one client trained.
"""
from __future__ import annotations

import numbers
from collections.abc import Callable

import torch

from subfl.sampling import keep_count
from subfl.experiments.runner import RunResult
from .submodel_eval import edited_accuracy

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


def _output_keep(result: RunResult, output_keep: float | None) -> float:
    if output_keep is None:
        return _run_output_keep(result)
    if isinstance(output_keep, numbers.Real) and not isinstance(output_keep, bool) and 0 < output_keep <= 1:
        return float(output_keep)
    raise ValueError(f"output_keep={output_keep!r} is not valid; accepted: a real number in (0, 1] or None")


def _output_rows(result: RunResult) -> str:
    return dict(result.config.method_options).get("output_rows", "leading")


def _scores(result: RunResult, q: float, edit: Callable[[torch.Tensor, int], None],
            data_root: str | None) -> tuple[float, float]:
    """Accuracy of the final global model as evaluated, and after ``edit(weight, o)`` of every decomposed layer."""
    return edited_accuracy(result, lambda name, weight: edit(weight, keep_count(weight.shape[0], q)), data_root)


def leading_outputs_accuracy(result: RunResult, output_keep: float | None = None,
                             data_root: str | None = None) -> dict[str, float]:
    """``{"accuracy": …, "leading_outputs_accuracy": …, "output_keep": q}`` of a finished run's global model.

    ``accuracy``: the global model as the run evaluates it (every output computed). ``leading_outputs_accuracy``:
    the same weights with the rows ``j ≥ ⌈q·n⌉`` of every decomposed layer (:func:`~subfl.models.factorized
    .layer_specs`) set to zero. ``output_keep``: ``q``; ``None`` takes a ``prism+memory`` run's own (its option, or
    its single keep ratio). A diverged run, or a ``prism+memory`` run with ``output_rows="random"`` (see
    :func:`expected_outputs_accuracy`), raises ``ValueError``.
    """
    if _output_rows(result) != "leading":
        raise ValueError(f"run {result.config.label()} drew its clients' output rows at random (output_rows="
                         f"{_output_rows(result)!r}): every row was trained, so the leading-outputs restriction does "
                         f"not describe what its clients computed; use expected_outputs_accuracy")
    q = _output_keep(result, output_keep)

    def zero_trailing_rows(weight: torch.Tensor, outputs: int) -> None:
        weight[outputs:] = 0.0

    dense, leading = _scores(result, q, zero_trailing_rows, data_root)
    return {"accuracy": dense, "leading_outputs_accuracy": leading, "output_keep": q}


def expected_outputs_accuracy(result: RunResult, output_keep: float | None = None,
                              data_root: str | None = None) -> dict[str, float]:
    """``{"accuracy": …, "expected_outputs_accuracy": …, "output_keep": q}`` of a finished run's global model.

    ``expected_outputs_accuracy``: the final weights with every decomposed layer's weight scaled by ``o/n``
    (``o = ⌈q·n⌉`` of its ``n`` outputs), the inclusion probability of each row when a client draws ``o`` rows
    uniformly; biases unchanged. ``output_keep`` as in :func:`leading_outputs_accuracy`. Meant for runs with
    ``output_rows="random"``; on any other run it is a control.
    """
    q = _output_keep(result, output_keep)

    def scale_rows(weight: torch.Tensor, outputs: int) -> None:
        weight.mul_(outputs / weight.shape[0])

    dense, expected = _scores(result, q, scale_rows, data_root)
    return {"accuracy": dense, "expected_outputs_accuracy": expected, "output_keep": q}


LEADING_EDIT = "leading outputs only (rows j ≥ o zeroed)"
EXPECTED_EDIT = "expected outputs (rows scaled by o/n)"


def output_checks(config, output_keeps) -> list[tuple[str, str, dict]]:
    """The edited evaluations the memory-efficient page reads of a run of ``config``, as
    ``(edit label, analysis name, params)`` (:mod:`subfl_book.final_analyses` requests; the value's field of the
    edited accuracy is the analysis name):

    * ``prism+memory``: the one edit that matches its clients — leading rows (:func:`leading_outputs_accuracy`) or,
      with ``output_rows="random"``, expected rows (:func:`expected_outputs_accuracy`) — at its own ``q``;
    * ``prism`` (plain PriSM, which never dropped outputs): the control, both edits at each ``q`` of
      ``output_keeps``;
    * any other method: none.
    """
    if config.method == "prism+memory":
        random_rows = dict(config.method_options).get("output_rows") == "random"
        return [(EXPECTED_EDIT, "expected_outputs_accuracy", {}) if random_rows
                else (LEADING_EDIT, "leading_outputs_accuracy", {})]
    if config.method == "prism":
        return [(edit, name, {"output_keep": float(q)}) for edit, name in
                ((LEADING_EDIT, "leading_outputs_accuracy"), (EXPECTED_EDIT, "expected_outputs_accuracy"))
                for q in output_keeps]
    return []


__all__ = ["EXPECTED_EDIT", "LEADING_EDIT", "expected_outputs_accuracy", "leading_outputs_accuracy", "output_checks"]
