"""Aggregation building blocks shared by methods."""
from __future__ import annotations

from collections.abc import Sequence

import torch


def weighted_average(tensor_dicts: Sequence[dict[str, torch.Tensor]], weights: Sequence[float],
                     ) -> dict[str, torch.Tensor]:
    """Σ_k w_k T_k / Σ_k w_k for every name (FedAvg, McMahan et al. 2017, Alg. 1 with w_k = n_k).

    Every dict must hold the same names and shapes. Integer tensors (e.g. BatchNorm's
    ``num_batches_tracked``) are averaged in float64 and rounded back to their dtype.
    """
    if len(tensor_dicts) == 0:
        raise ValueError("weighted_average needs at least one tensor dict")
    if len(tensor_dicts) != len(weights):
        raise ValueError(f"got {len(tensor_dicts)} tensor dicts but {len(weights)} weights")
    w = torch.tensor([float(x) for x in weights], dtype=torch.float64)
    if (w < 0).any() or not w.sum() > 0:
        raise ValueError(f"weights must be >= 0 with a positive sum, got {list(weights)}")
    w = w / w.sum()
    names = list(tensor_dicts[0])
    for d in tensor_dicts[1:]:
        if list(d) != names:
            raise ValueError("all tensor dicts must hold the same names in the same order")
    out: dict[str, torch.Tensor] = {}
    for name in names:
        first = tensor_dicts[0][name]
        acc = torch.zeros(first.shape, dtype=torch.float64)
        for wk, d in zip(w, tensor_dicts):
            if d[name].shape != first.shape:
                raise ValueError(f"tensor {name!r} has shape {tuple(d[name].shape)} in one update and "
                                 f"{tuple(first.shape)} in another")
            acc += wk * d[name].detach().to(torch.float64)
        out[name] = acc.round().to(first.dtype) if not first.is_floating_point() else acc.to(first.dtype)
    return out
