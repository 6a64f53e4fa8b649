"""Factorized layers that compute only their first outputs: PriSM's memory-efficient sub-model.

PriSM (Niu et al., TMLR 2023) lets a weak client "learn only a subset of" the intermediate representations
(abstract): besides a subset ``S`` of the SVD terms of each decomposed layer
(:mod:`subfl.models.factorized`), the client keeps only the first ``o = ⌈q·n⌉`` of the layer's ``n`` output
channels (rows of ``U'``). This module is the client side of that sub-model as this library reads it (the
paper's Eq. (5) is summarised in the book's tracker as "only the first r·N output channels of u are computed, the
rest cached and concatenated back at aggregation"; the authors' released code keeps the first rows of ``U``
and masks the others to zero):

* the layer computes ``y_R = U'_{R,S} ((V'_S x) ⊙ ω_S)`` for the rows ``R = {0, …, o−1}`` only;
* the other ``n − o`` outputs are **zero** (plus the layer's bias, if it has one), appended with
  :func:`torch.nn.functional.pad`, which keeps nothing for the backward pass;
* the trainable parameters are ``u`` ``(o, k)``, ``v`` (as in a factorized layer) and the full ``bias``.

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

from collections.abc import Mapping

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from .factorized import (FactorizedConv2d, FactorizedLinear, LayerSpec, _set_submodule, dense_weight,
                         factorized_modules)

__all__ = ["OutputSubsetConv2d", "OutputSubsetLinear", "restrict_outputs"]


def _check_outputs(spec: LayerSpec, outputs: int) -> int:
    if isinstance(outputs, bool) or not isinstance(outputs, (int, np.integer)) or not 1 <= outputs <= spec.out_features:
        raise ValueError(f"outputs of layer {spec.name!r} must be an integer in [1, {spec.out_features}], "
                         f"got {outputs!r}")
    return int(outputs)


class _OutputSubset:
    """Shared parts: ``u`` holds only the first ``outputs`` rows; the missing rows read as zero."""

    spec: LayerSpec
    u: nn.Parameter
    omega: torch.Tensor

    def _keep_rows(self, outputs: int) -> None:
        self.outputs = _check_outputs(self.spec, outputs)
        self.u = nn.Parameter(torch.zeros(self.outputs, self.rank, dtype=self.u.dtype, device=self.u.device))

    def extra_repr(self) -> str:
        return (f"{self.spec.in_features} -> rank {self.rank} -> first {self.outputs} of {self.spec.out_features}, "
                f"bias={self.spec.bias}")

    def full_u(self) -> torch.Tensor:
        """``U'`` with the rows this layer does not hold as zeros, shape ``(n, k)``."""
        return F.pad(self.u, (0, 0, 0, self.spec.out_features - self.outputs))

    def dense_weight(self) -> torch.Tensor:
        """``Σ_{i∈S} ω_i u'_i v'_iᵀ`` with the missing rows zero, in the dense layer's weight shape."""
        return dense_weight(self.full_u() * self.omega, self.v, self.spec)


class OutputSubsetLinear(_OutputSubset, FactorizedLinear):
    """``x ↦ [U'_{R,S} ((V'_S x) ⊙ ω), 0] + b``: a factorized linear layer computing its first ``outputs``."""

    def __init__(self, spec: LayerSpec, rank: int, outputs: int) -> None:
        super().__init__(spec, rank)
        self._keep_rows(outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(F.linear(x, self.v) * self.omega, self.u)
        y = F.pad(y, (0, self.spec.out_features - self.outputs))
        return y if self.bias is None else y + self.bias


class OutputSubsetConv2d(_OutputSubset, FactorizedConv2d):
    """A factorized convolution whose ``1×1`` part computes only the first ``outputs`` channels; the other
    channels are zero (plus the bias)."""

    def __init__(self, spec: LayerSpec, rank: int, outputs: int) -> None:
        super().__init__(spec, rank)
        self._keep_rows(outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.conv2d(x, self.v, None, self.stride, self.padding, self.dilation)
        h = h * self.omega.view(1, -1, 1, 1)
        y = F.pad(F.conv2d(h, self.u[:, :, None, None]), (0, 0, 0, 0, 0, self.spec.out_features - self.outputs))
        return y if self.bias is None else y + self.bias.view(1, -1, 1, 1)


def restrict_outputs(model: nn.Module, outputs: Mapping[str, int]) -> nn.Module:
    """Replace, **in place**, factorized layers of ``model`` by ones that compute only their first outputs.

    ``outputs``: layer name → number of leading output channels / features to compute (``1 ≤ o ≤ n``). The
    layers must be factorized already (:func:`~subfl.models.factorized.factorize`); their rank, ``ω`` and bias
    carry over and ``u`` keeps its first ``o`` rows. Returns ``model``.
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
            new.u.copy_(old.u[: new.outputs])
            new.v.copy_(old.v)
            if old.bias is not None:
                new.bias.copy_(old.bias)
        new.omega = old.omega.clone()
        _set_submodule(model, name, new)
    return model
