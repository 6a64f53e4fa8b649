"""Parameter counts and the bytes they occupy."""
from __future__ import annotations

from torch import nn


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of scalar parameters of ``model`` (shared parameters counted once; buffers excluded).

    With ``trainable_only=True`` only parameters with ``requires_grad`` are counted.
    """
    return int(sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only))


def parameter_bytes(model: nn.Module, trainable_only: bool = False) -> int:
    """Bytes of the parameters of ``model``: ``Σ numel · element_size`` (each tensor's own dtype)."""
    return int(sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad or not trainable_only))


def buffer_bytes(model: nn.Module) -> int:
    """Bytes of the buffers of ``model`` (e.g. BatchNorm running mean / variance / batch counter)."""
    return int(sum(b.numel() * b.element_size() for b in model.buffers()))
