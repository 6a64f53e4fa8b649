"""How much of the activation memory of a training step is channels that hold one value.

A sub-model that computes only some output channels of a layer and pads the others with zeros
(:mod:`subfl.models.output_subset`, PriSM's memory-efficient sub-model) still hands full-width tensors to the
operations that follow: a BatchNorm with batch statistics turns a zero channel into its ``β``, a ReLU into
``max(β, 0)``, the next convolution saves that input for its weight gradient. Stock PyTorch operations keep all
of these tensors for the backward pass whatever their content. A channel that is constant over the batch and
every position could be kept as a single number, so those bytes are what an implementation aware of the dropped
outputs could save.

:func:`constant_channel_memory` measures it on one real forward pass, with the same saved-tensor hooks as
:func:`subfl.costs.activation_memory_bytes` (whose total it reports beside): every distinct floating-point tensor
autograd saves with a batch dimension first and channels (or features) second is scanned, and the bytes of its
channels whose values are all equal are summed. Integer tensors (max-pool indices) and tensors of fewer than two
dimensions are counted as not constant.

:func:`memory_efficient_cost_table` puts the dense model, PriSM's plain sub-model and its memory-efficient
sub-models side by side: parameters, MACs, the activation memory stock modules keep, and how much of it is
constant channels.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import torch
from torch import nn

from ..models.factorized import decompose, layer_specs
from ..models.output_subset import restrict_outputs
from ..models.registry import build_model
from ..sampling import keep_count
from .flops import LossFn, _compute_loss
from .memory import _storage_ptr, activation_memory_bytes
from .submodels import MB, check_keep_ratio, spectral_submodel, submodel_costs, submodel_ranks

COST_COLUMNS: tuple[str, ...] = ("model", "output_keep", "params", "params_ratio", "macs", "macs_ratio",
                                 "activations_mb", "constant_mb", "needed_mb", "needed_ratio")
"""Columns of :func:`memory_efficient_cost_table`."""


@dataclass(frozen=True)
class ConstantChannelMemory:
    """``total``: activation bytes (:func:`~subfl.costs.activation_memory_bytes`); ``constant``: bytes of saved
    channels whose values are all equal; ``batch``: the batch size of the forward pass."""

    total: int
    constant: int
    batch: int

    @property
    def needed(self) -> int:
        """``total − constant``: the bytes left if constant channels were kept as one value each."""
        return self.total - self.constant


def _constant_bytes(tensor: torch.Tensor, batch: int) -> int:
    if not tensor.is_floating_point() or tensor.dim() < 2 or tensor.shape[0] != batch or tensor.shape[1] == 0:
        return 0
    channels = tensor.detach().transpose(0, 1).reshape(tensor.shape[1], -1)
    constant = int((channels.amax(dim=1) == channels.amin(dim=1)).sum())
    return constant * channels.shape[1] * tensor.element_size()


def constant_channel_memory(model: nn.Module, example_input: torch.Tensor,
                            loss_fn: LossFn | None = None) -> ConstantChannelMemory:
    """Activation memory of one training forward of ``model`` (and ``loss_fn``) on ``example_input``, and how
    much of it is channels holding a single value (see the module docstring).

    Tensors in the storage of a parameter or buffer are skipped, as in :func:`subfl.costs.activation_memory_bytes`;
    a tensor saved several times (same storage, offset, shape, stride and dtype) is scanned once.
    """
    if not isinstance(example_input, torch.Tensor) or example_input.dim() < 1:
        raise ValueError("example_input must be a batched tensor (batch dimension first)")
    batch = int(example_input.shape[0])
    weight_storages = {_storage_ptr(t) for t in [*model.parameters(), *model.buffers()]}
    seen: set[tuple] = set()
    constant = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal constant
        ptr = _storage_ptr(tensor)
        if ptr is not None and ptr in weight_storages:
            return tensor
        key = (ptr, tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype) \
            if ptr is not None and tensor.layout == torch.strided else ("object", id(tensor))
        if key not in seen:
            seen.add(key)
            constant += _constant_bytes(tensor, batch)
        return tensor

    was_training = model.training
    model.train()
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            _compute_loss(model, example_input, loss_fn)
        total = activation_memory_bytes(model, example_input, loss_fn)
    finally:
        model.train(was_training)
    return ConstantChannelMemory(total=int(total), constant=int(constant), batch=batch)


def memory_efficient_cost_table(model: str = "resnet18", keep_ratio: float = 0.2,
                                output_keeps: Sequence[float] = (0.2, 0.4), *, batch_size: int = 32,
                                width: float = 1.0, num_classes: int = 10,
                                input_shape: Sequence[int] = (3, 32, 32), norm: str | None = "bn_nostats",
                                seed: int = 0) -> pd.DataFrame:
    """Costs of PriSM's sub-models of ``model`` with and without the memory-efficient output subset.

    Rows: ``"dense"``; ``"sub-model r×"`` (the top ``⌈r·T⌉`` terms of every decomposed layer's SVD, the shape of
    every PriSM / OrthDrop sub-model, :func:`~subfl.costs.submodels.spectral_submodel`); and one
    ``"memory-efficient, q = …"`` row per entry of ``output_keeps``: the same sub-model computing only the first
    ``⌈q·n⌉`` outputs of each decomposed layer (:func:`~subfl.models.output_subset.restrict_outputs`).
    Columns (:data:`COST_COLUMNS`): parameters of the module, MACs per sample, activation memory of one training
    forward on ``batch_size`` random inputs (MB = 10⁶ bytes) as stock modules keep it, the part of it that is
    constant channels, the rest (``needed_mb``); ``*_ratio`` relative to the dense model's value. ``norm``:
    the model's normalisation (``"bn_nostats"``, batch statistics, is what PriSM's clients train with; ``None``
    keeps the model's default). The weights are the untrained initialisation (seed ``seed``).
    """
    keep_ratio = check_keep_ratio(keep_ratio)
    output_keeps = [check_keep_ratio(q, "output_keeps") for q in output_keeps]
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 2:
        raise ValueError(f"batch_size must be an integer >= 2 (a constant channel is judged over the batch), "
                         f"got {batch_size!r}")
    torch.manual_seed(seed)
    kwargs = {} if norm is None else {"norm": norm}
    dense = build_model(model, num_classes=num_classes, input_shape=tuple(input_shape), width=width, **kwargs)
    x = torch.randn(batch_size, *input_shape, generator=torch.Generator().manual_seed(seed))
    specs = layer_specs(dense)
    factors = decompose(dense, list(submodel_ranks(dense, keep_ratio)))  # one SVD, shared by every sub-model
    variants: list[tuple[str, float | None, nn.Module]] = [("dense", None, dense),
                                                           (f"sub-model {keep_ratio:g}×", None,
                                                            spectral_submodel(dense, keep_ratio, factors=factors))]
    for q in output_keeps:
        sub = restrict_outputs(spectral_submodel(dense, keep_ratio, factors=factors),
                               {name: keep_count(spec.out_features, q) for name, spec in specs.items()})
        variants.append((f"memory-efficient, q = {q:g}", q, sub))
    rows = []
    for label, q, net in variants:
        costs = submodel_costs(net, x, activations=False)
        memory = constant_channel_memory(net, x)
        rows.append({"model": label, "output_keep": q, "params": costs["params"], "macs": costs["macs"],
                     "activations_mb": memory.total / MB, "constant_mb": memory.constant / MB,
                     "needed_mb": memory.needed / MB})
    table = pd.DataFrame(rows)
    base = table.iloc[0]
    table["params_ratio"] = table.params / base.params
    table["macs_ratio"] = table.macs / base.macs
    table["needed_ratio"] = table.needed_mb / base.activations_mb
    return table[list(COST_COLUMNS)]
