"""Floating-point operations of one training step, measured with ``torch.utils.flop_counter``.

Counts come from :class:`torch.utils.flop_counter.FlopCounterMode`, which counts **only** matrix products
and convolutions (``mm``, ``addmm``, ``bmm``, ``baddbmm``, convolutions and their backward, scaled-dot-product
attention): one multiply-add is 2 FLOPs. Element-wise work (activations, normalisation, pooling, the
residual additions, softmax / the loss, bias additions outside ``addmm``, the optimiser step) is *not*
counted; for the CNNs of this book it is well under a few percent of the total.

Backward counts what autograd actually computes: gradients with respect to trainable parameters, and with
respect to activations only where an earlier trainable layer needs them. The first layer therefore does
not compute a gradient with respect to the batch (unless ``example_input.requires_grad`` is set), so the
backward of a network is slightly less than twice its forward. Example: ``nn.Linear(10, 5)`` on a batch of
3 costs 2·3·10·5 = 300 forward FLOPs and 300 backward FLOPs (weight gradient only), or 600 backward FLOPs
with an input that requires grad (weight and input gradients).

Measurements are pure: they run in training mode, restore the modules' modes and buffers (BatchNorm
running statistics) afterwards, leave ``.grad`` untouched (gradients are taken with
:func:`torch.autograd.grad`) and do not advance the global random number generators.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

LossFn = Callable[[torch.Tensor], torch.Tensor]


def default_loss(output: torch.Tensor) -> torch.Tensor:
    """Loss used when no ``loss_fn`` is given.

    A floating output of shape ``(B, K)`` is treated as classifier logits: cross-entropy against class 0 for
    every sample (the target values do not change costs). Any other tensor output: ``output.sum()``.
    """
    if not isinstance(output, torch.Tensor):
        raise TypeError(f"the model output is a {type(output).__name__}, not a tensor; pass loss_fn=")
    if output.dim() == 2 and output.is_floating_point():
        target = torch.zeros(output.shape[0], dtype=torch.long, device=output.device)
        return F.cross_entropy(output, target)
    return output.sum()


def macs(flops: int) -> int:
    """Multiply-accumulate operations for a FLOP count of :class:`FlopCounterMode` (``flops // 2``)."""
    return int(flops) // 2


@contextlib.contextmanager
def isolated_training_step(model: nn.Module, example_input: torch.Tensor | None = None) -> Iterator[nn.Module]:
    """Put ``model`` in training mode for a measurement and undo every side effect afterwards.

    Restores each submodule's ``training`` flag and every buffer's value, and forks the CPU (and, for
    CUDA tensors, the CUDA) random number generators so that dropout does not advance them.
    """
    modes = [(module, module.training) for module in model.modules()]
    saved_buffers = [(buffer, buffer.detach().clone()) for buffer in model.buffers()]
    devices = {t.device.index or 0 for t in [*model.parameters(), *model.buffers()] if t.is_cuda}
    if isinstance(example_input, torch.Tensor) and example_input.is_cuda:
        devices.add(example_input.device.index or 0)
    try:
        with torch.random.fork_rng(devices=sorted(devices)):
            model.train()
            yield model
    finally:
        for module, training in modes:
            module.training = training
        with torch.no_grad():
            for buffer, value in saved_buffers:
                buffer.copy_(value)


def _compute_loss(model: nn.Module, example_input: torch.Tensor, loss_fn: LossFn | None) -> torch.Tensor:
    output = model(example_input)
    loss = (loss_fn or default_loss)(output)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise ValueError(f"loss_fn must return a scalar tensor, got {loss!r:.80}")
    return loss


def _gradient_targets(model: nn.Module, example_input: torch.Tensor) -> list[torch.Tensor]:
    targets = [p for p in model.parameters() if p.requires_grad]
    if isinstance(example_input, torch.Tensor) and example_input.requires_grad:
        targets.append(example_input)
    return targets


def training_flops(model: nn.Module, example_input: torch.Tensor, loss_fn: LossFn | None = None) -> dict[str, int]:
    """FLOPs of one forward and backward pass of ``model`` on ``example_input``.

    Returns ``{"forward", "backward", "total"}`` (FLOPs; a multiply-add is 2, see :func:`macs`). The
    forward includes ``loss_fn(output)`` (default: :func:`default_loss`); the backward computes the
    gradients of every trainable parameter (and of ``example_input`` if it requires grad). See the
    module docstring for which operations are counted.
    """
    with isolated_training_step(model, example_input), torch.enable_grad():
        with FlopCounterMode(display=False) as forward_counter:
            loss = _compute_loss(model, example_input, loss_fn)
        targets = _gradient_targets(model, example_input)
        with FlopCounterMode(display=False) as backward_counter:
            if targets and loss.requires_grad:
                torch.autograd.grad(loss, targets, allow_unused=True)
    forward = int(forward_counter.get_total_flops())
    backward = int(backward_counter.get_total_flops())
    return {"forward": forward, "backward": backward, "total": forward + backward}


def forward_flops(model: nn.Module, example_input: torch.Tensor) -> int:
    """FLOPs of one forward pass of ``model`` on ``example_input`` (no loss, no gradient graph)."""
    with isolated_training_step(model, example_input), torch.no_grad():
        with FlopCounterMode(display=False) as counter:
            model(example_input)
    return int(counter.get_total_flops())
