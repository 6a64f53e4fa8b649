"""Memory of one training step: weights, gradients, optimiser state and the activations autograd keeps.

Activation memory is *measured*, not modelled: one forward pass (model and loss) runs under
:class:`torch.autograd.graph.saved_tensors_hooks`, whose pack hook sees every tensor autograd saves for the
backward pass. Rules:

* tensors that share memory are counted once: per storage, the union of the byte ranges the saved
  views span is counted (a tensor saved by two operations, or saved as ``x`` and as ``x.t()``, counts once;
  a saved slice of a larger tensor counts only its own range);
* tensors living in the storage of one of the model's parameters or buffers (``weight``, ``weight.t()``,
  BatchNorm running statistics) are excluded — they are counted as weights;
* the example batch itself counts when the first layer saves it (it does whenever that layer's weight is
  trainable), and so do small per-channel tensors such as BatchNorm's saved mean and inverse std.

The result is a lower bound on peak memory: it ignores temporaries freed during the forward, the
gradient buffers of activations during backward, and allocator overhead.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from .flops import LossFn, _compute_loss, isolated_training_step
from .params import buffer_bytes, parameter_bytes

OPTIMIZER_STATE_MULTIPLIERS: dict[str, int] = {"sgd": 0, "sgd_momentum": 1, "adam": 2, "adamw": 2}
"""Optimiser state per trainable parameter, in copies of the parameter: momentum buffer; Adam's two moments."""

LOSS_MODULE = "<loss>"
"""Module name given to tensors saved by ``loss_fn``."""


@dataclass(frozen=True)
class SavedTensor:
    """One distinct tensor autograd saved during the forward pass.

    ``module``: qualified name (as in ``named_modules``) of the innermost module whose forward was running
    (``""`` for the model's own ``forward``, ``"<loss>"`` for the loss). ``tensor_bytes``: ``numel ·
    element_size`` of the tensor. ``bytes``: memory it adds beyond the rows before it (0 for a view of
    memory already counted); the ``bytes`` of all rows sum to :func:`activation_memory_bytes`.
    """

    module: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    tensor_bytes: int
    bytes: int


def _add_interval(covered: list[tuple[int, int]], start: int, stop: int) -> int:
    """Add [start, stop) to the disjoint sorted intervals ``covered`` (in place); return the newly covered length."""
    if stop <= start:
        return 0
    new = stop - start
    merged_start, merged_stop = start, stop
    keep = []
    for a, b in covered:
        if b < start or a > stop:
            keep.append((a, b))
            continue
        new -= max(0, min(b, stop) - max(a, start))
        merged_start, merged_stop = min(merged_start, a), max(merged_stop, b)
    keep.append((merged_start, merged_stop))
    keep.sort()
    covered[:] = keep
    return new


def _byte_range(tensor: torch.Tensor) -> tuple[int, int]:
    """Byte range of ``tensor`` inside its storage."""
    size = tensor.element_size()
    if tensor.numel() == 0:
        return 0, 0
    last = sum((n - 1) * abs(s) for n, s in zip(tensor.shape, tensor.stride()))
    start = tensor.storage_offset() * size
    return start, start + (last + 1) * size


def _storage_ptr(tensor: torch.Tensor) -> int | None:
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def saved_tensor_breakdown(
    model: nn.Module, example_input: torch.Tensor, loss_fn: LossFn | None = None
) -> list[SavedTensor]:
    """The tensors autograd saves for backward during one forward pass of ``model`` and ``loss_fn``.

    One row per distinct saved tensor (same storage, offset, shape and stride → one row), in the order
    they were saved; parameters and buffers are excluded. See the module docstring for the rules.
    """
    weight_storages = {_storage_ptr(t) for t in [*model.parameters(), *model.buffers()]}
    weight_storages.discard(None)
    stack: list[str] = []
    rows: list[SavedTensor] = []
    seen_views: set[tuple] = set()
    covered: dict[int, list[tuple[int, int]]] = {}
    handles = []
    held: list[torch.Tensor] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        ptr = _storage_ptr(tensor)
        if ptr is not None and ptr in weight_storages:
            return tensor
        tensor_bytes = tensor.numel() * tensor.element_size()
        if ptr is None or tensor.layout != torch.strided:
            key: tuple = ("object", id(tensor))
            added = tensor_bytes
        else:
            key = (ptr, tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)
            start, stop = _byte_range(tensor)
            added = 0 if key in seen_views else _add_interval(covered.setdefault(ptr, []), start, stop)
        if key not in seen_views:
            seen_views.add(key)
            module = stack[-1] if stack else LOSS_MODULE
            rows.append(SavedTensor(module, tuple(tensor.shape), tensor.dtype, tensor_bytes, added))
        # the tensor is held here, as autograd would hold it until backward (so no later tensor reuses its memory
        # and is mistaken for a view of it), and released when the measurement ends. Handing it back to autograd
        # instead would tie an op's output to its own grad_fn: a reference cycle through the autograd graph that
        # Python's collector cannot free (each call leaked its activations). The pass is never differentiated.
        held.append(tensor)
        return None

    def unpack(packed: None) -> torch.Tensor:
        raise RuntimeError("saved_tensor_breakdown measures a forward pass; its graph cannot be differentiated")

    def enter(name: str) -> Callable:
        return lambda module, args: stack.append(name)

    def leave(module: nn.Module, args, output) -> None:
        stack.pop()

    try:
        for name, module in model.named_modules():
            handles.append(module.register_forward_pre_hook(enter(name)))
            handles.append(module.register_forward_hook(leave, always_call=True))
        with isolated_training_step(model, example_input), torch.enable_grad():
            with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
                _compute_loss(model, example_input, loss_fn)
    finally:
        for handle in handles:
            handle.remove()
        held.clear()
    return rows


def activation_memory_bytes(model: nn.Module, example_input: torch.Tensor, loss_fn: LossFn | None = None) -> int:
    """Bytes of the tensors autograd keeps for backward after one forward pass (model, then loss).

    Measured with saved-tensor hooks; shared memory counted once, parameters and buffers excluded (see
    the module docstring). ``loss_fn`` defaults to :func:`~subfl.costs.flops.default_loss`.
    """
    return int(sum(row.bytes for row in saved_tensor_breakdown(model, example_input, loss_fn)))


def optimizer_state_bytes(model: nn.Module, optimizer: str, trainable_only: bool = True) -> int:
    """Bytes of optimiser state for ``model``'s parameters.

    ``optimizer``: ``"sgd"`` (no state), ``"sgd_momentum"`` (one momentum buffer per parameter),
    ``"adam"`` / ``"adamw"`` (first and second moments). State has each parameter's dtype, as in
    :mod:`torch.optim`; Adam's per-parameter scalar step counters are ignored.
    """
    if optimizer not in OPTIMIZER_STATE_MULTIPLIERS:
        accepted = ", ".join(repr(name) for name in OPTIMIZER_STATE_MULTIPLIERS)
        raise ValueError(f"optimizer={optimizer!r} is not supported; accepted values: {accepted}")
    return OPTIMIZER_STATE_MULTIPLIERS[optimizer] * parameter_bytes(model, trainable_only=trainable_only)


def training_memory(
    model: nn.Module,
    example_input: torch.Tensor,
    optimizer: str = "sgd_momentum",
    loss_fn: LossFn | None = None,
) -> dict[str, int]:
    """Memory of one training step on ``example_input``, in bytes, by component.

    * ``weights``: all parameters and buffers (:func:`parameter_bytes` + :func:`buffer_bytes`);
    * ``gradients``: one gradient per trainable parameter;
    * ``optimizer``: :func:`optimizer_state_bytes` of the trainable parameters;
    * ``activations``: :func:`activation_memory_bytes`;
    * ``total``: the sum of the four.
    """
    components = {
        "weights": parameter_bytes(model) + buffer_bytes(model),
        "gradients": parameter_bytes(model, trainable_only=True),
        "optimizer": optimizer_state_bytes(model, optimizer, trainable_only=True),
        "activations": activation_memory_bytes(model, example_input, loss_fn),
    }
    components["total"] = sum(components.values())
    return components
