"""Factorized layers that compute only some of their outputs: PriSM's memory-efficient sub-model.

PriSM (Niu et al., TMLR 2023) lets a weak client "learn only a subset of" the intermediate representations
(abstract): besides a subset ``S`` of the SVD terms of each decomposed layer
(:mod:`subfl.models.factorized`), the client keeps only ``o = ⌈q·n⌉`` of the layer's ``n`` output channels (rows
of ``U'``). This module is the client side of that sub-model as this library reads it (the paper's Eq. (5) is
summarised in the book's tracker as "only the first r·N output channels of u are computed, the rest cached and
concatenated back at aggregation"; the authors' released code keeps the first rows of ``U`` and masks the others
to zero, an earlier version of it draws the rows at random). For a set ``R`` of ``o`` rows:

* the layer computes ``y_R = U'_{R,S} ((V'_S x) ⊙ ω_S)`` for the rows in ``R`` only;
* the other ``n − o`` outputs are **zero** (plus the layer's bias, if it has one). For the leading rows
  ``R = {0, …, o−1}`` they are appended with :func:`torch.nn.functional.pad`, otherwise ``y_R`` is scattered into
  a zero tensor with :meth:`torch.Tensor.index_copy`; neither keeps anything for the backward pass;
* the trainable parameters are ``u`` ``(o, k)`` (row ``a`` of ``u`` is row ``R[a]`` of ``U'``), ``v`` (as in a
  factorized layer) and the full ``bias``.

The rows ``U'_{R̄,S}`` the client does not hold stay on the server, which puts them back before it averages
(:mod:`subfl.methods.prism_memory`).

What this saves. The ``1×1`` convolution (or the second matrix product) costs ``o·k`` instead of ``n·k`` per
position, and the client trains and uploads ``o·k`` entries of ``U'`` instead of ``n·k``. Activation memory
is saved only where later operations know that the padded channels are constant: a BatchNorm with batch
statistics maps a zero channel to its ``β``, a ReLU keeps ``max(β, 0)``, and neither needs to keep those channels
for the backward pass (their gradient ends at the padding). Stock PyTorch modules do not know it and keep
them; :func:`subfl.costs.constant_channels.constant_channel_bytes` measures how much of the kept memory is
such constant channels.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from .factorized import (FactorizedConv2d, FactorizedLinear, LayerSpec, _set_submodule, dense_weight,
                         factorized_modules)

__all__ = ["OutputSubsetConv2d", "OutputSubsetLinear", "restrict_outputs"]


def _check_outputs(spec: LayerSpec, outputs: int | Sequence[int]) -> tuple[int, torch.Tensor | None]:
    """``(o, rows)`` of an ``outputs`` argument: a count ``o`` of leading rows (``rows`` is ``None``) or the rows
    themselves, distinct integers in ``[0, n)`` (kept in the given order)."""
    n = spec.out_features
    if isinstance(outputs, (int, np.integer)) and not isinstance(outputs, bool):
        if not 1 <= outputs <= n:
            raise ValueError(f"outputs of layer {spec.name!r} must be an integer in [1, {n}] or a sequence of "
                             f"distinct row indices in [0, {n - 1}], got {outputs!r}")
        return int(outputs), None
    rows = np.asarray(outputs) if isinstance(outputs, (Sequence, np.ndarray, torch.Tensor)) else None
    ok = (rows is not None and rows.ndim == 1 and 1 <= rows.size <= n and rows.dtype.kind in "iu"
          and rows.min() >= 0 and rows.max() < n and np.unique(rows).size == rows.size)
    if not ok:
        raise ValueError(f"outputs of layer {spec.name!r} must be an integer in [1, {n}] or a sequence of "
                         f"distinct row indices in [0, {n - 1}], got {outputs!r}")
    if np.array_equal(rows, np.arange(rows.size)):
        return int(rows.size), None  # the leading rows: computed as a count
    return int(rows.size), torch.as_tensor(rows, dtype=torch.int64)


class _OutputSubset:
    """Shared parts: ``u`` holds only the rows ``R`` (the first ``outputs`` rows when ``rows`` is ``None``); the
    missing rows read as zero."""

    spec: LayerSpec
    u: nn.Parameter
    omega: torch.Tensor
    rows: torch.Tensor | None

    def _keep_rows(self, outputs: int | Sequence[int]) -> None:
        self.outputs, rows = _check_outputs(self.spec, outputs)
        self.register_buffer("rows", rows, persistent=False)  # moves with the module, never in its state_dict
        self.u = nn.Parameter(torch.zeros(self.outputs, self.rank, dtype=self.u.dtype, device=self.u.device))

    def row_indices(self) -> torch.Tensor:
        """``R``: the rows of ``U'`` this layer holds, in the order of ``u``'s rows."""
        return torch.arange(self.outputs, device=self.u.device) if self.rows is None else self.rows

    def extra_repr(self) -> str:
        held = f"first {self.outputs}" if self.rows is None else f"{self.outputs} chosen"
        return (f"{self.spec.in_features} -> rank {self.rank} -> {held} of {self.spec.out_features}, "
                f"bias={self.spec.bias}")

    def _scatter(self, y: torch.Tensor, dim: int) -> torch.Tensor:
        """The computed outputs ``y`` (``o`` along ``dim``) placed at their rows of ``n`` outputs, zeros elsewhere."""
        missing = self.spec.out_features - self.outputs
        if self.rows is None:
            return F.pad(y, (0, 0) * (y.dim() - 1 - dim % y.dim()) + (0, missing))
        shape = list(y.shape)
        shape[dim] = self.spec.out_features
        return y.new_zeros(shape).index_copy(dim, self.rows, y)

    def full_u(self) -> torch.Tensor:
        """``U'`` with the rows this layer does not hold as zeros, shape ``(n, k)``."""
        return self._scatter(self.u, 0)

    def dense_weight(self) -> torch.Tensor:
        """``Σ_{i∈S} ω_i u'_i v'_iᵀ`` with the missing rows zero, in the dense layer's weight shape."""
        return dense_weight(self.full_u() * self.omega, self.v, self.spec)


class OutputSubsetLinear(_OutputSubset, FactorizedLinear):
    """``x ↦ [U'_{R,S} ((V'_S x) ⊙ ω) at rows R, 0 elsewhere] + b``: a factorized linear layer computing the
    outputs ``R`` (``outputs``: a count of leading rows or the row indices)."""

    def __init__(self, spec: LayerSpec, rank: int, outputs: int | Sequence[int]) -> None:
        super().__init__(spec, rank)
        self._keep_rows(outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self._scatter(F.linear(F.linear(x, self.v) * self.omega, self.u), -1)
        return y if self.bias is None else y + self.bias


class OutputSubsetConv2d(_OutputSubset, FactorizedConv2d):
    """A factorized convolution whose ``1×1`` part computes only the channels ``R`` (``outputs``: a count of
    leading channels or the channel indices); the other channels are zero (plus the bias)."""

    def __init__(self, spec: LayerSpec, rank: int, outputs: int | Sequence[int]) -> None:
        super().__init__(spec, rank)
        self._keep_rows(outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.conv2d(x, self.v, None, self.stride, self.padding, self.dilation)
        h = h * self.omega.view(1, -1, 1, 1)
        y = self._scatter(F.conv2d(h, self.u[:, :, None, None]), 1)
        return y if self.bias is None else y + self.bias.view(1, -1, 1, 1)


def restrict_outputs(model: nn.Module, outputs: Mapping[str, int | Sequence[int]]) -> nn.Module:
    """Replace, **in place**, factorized layers of ``model`` by ones that compute only some of their outputs.

    ``outputs``: layer name → the number ``o`` of leading output channels / features to compute (``1 ≤ o ≤ n``)
    or the indices ``R`` of the outputs to compute (distinct, in ``[0, n)``). The layers must be factorized
    already (:func:`~subfl.models.factorized.factorize`); their rank, ``ω`` and bias carry over and ``u`` keeps
    its rows ``R``. Returns ``model``.
    """
    layers = factorized_modules(model)
    unknown = sorted(set(outputs) - set(layers))
    if unknown:
        raise ValueError(f"cannot restrict the outputs of {unknown}: not factorized layers of the model; "
                         f"factorized layers: {list(layers)}")
    for name, count in outputs.items():
        old = layers[name]
        cls = OutputSubsetConv2d if isinstance(old, FactorizedConv2d) else OutputSubsetLinear
        new = cls(old.spec, old.rank, count).to(old.u.device, old.u.dtype)
        with torch.no_grad():
            new.u.copy_(old.u[new.row_indices()])
            new.v.copy_(old.v)
            if old.bias is not None:
                new.bias.copy_(old.bias)
        new.omega = old.omega.clone()
        _set_submodule(model, name, new)
    return model
