"""Diagnostics of FLANC's neural composition (Mei et al., NeurIPS 2022, Figs. 5–6).

Shapes follow :mod:`subfl.models.composed`: a layer's basis ``V`` is ``(R₁k², R₂)`` (one column per basis
kernel) and width p's coefficients ``U_p`` are ``(R₂, G_p·T_p)`` (row j: how strongly every (output channel,
input group) pair uses basis kernel j).
"""
from __future__ import annotations

import numpy as np
import torch


def _matrix(tensor: torch.Tensor | np.ndarray, name: str) -> np.ndarray:
    array = tensor.detach().cpu().double().numpy() if isinstance(tensor, torch.Tensor) else np.asarray(tensor, float)
    if array.ndim != 2 or 0 in array.shape:
        raise ValueError(f"{name} must be a non-empty 2-D matrix, got shape {array.shape}")
    return array


def basis_usage(coefficients: torch.Tensor | np.ndarray) -> np.ndarray:
    """Mean absolute coefficient of every basis kernel: ``mean_c |U_p[j, c]|`` for j = 1..R₂ (Fig. 5).

    If every width's ``U_p`` spreads its weight over all ``R₂`` kernels, the composition shares the basis; if
    a width used only a few kernels (the rest near zero) it would degenerate into picking a sub-basis, i.e.
    pruning."""
    return np.abs(_matrix(coefficients, "coefficients")).mean(axis=1)


def column_magnitudes(coefficients: torch.Tensor | np.ndarray) -> np.ndarray:
    """Mean absolute coefficient of every column of ``U_p`` (one per (output channel, input group) pair)."""
    return np.abs(_matrix(coefficients, "coefficients")).mean(axis=0)


def basis_gram(basis: torch.Tensor | np.ndarray, normalise: bool = True) -> np.ndarray:
    """``VᵀV`` (``R₂ × R₂``, Fig. 6); with ``normalise`` the cosine similarities of the basis kernels (unit
    diagonal). The identity for an orthonormal basis — Eq. (3)'s regulariser is ``‖VᵀV − I‖²_F``."""
    v = _matrix(basis, "basis")
    if normalise:
        norms = np.linalg.norm(v, axis=0)
        if np.any(norms == 0):
            raise ValueError("basis has a zero column; its cosine similarities are undefined (use normalise=False)")
        v = v / norms
    return v.T @ v


def off_diagonal_energy(gram: np.ndarray) -> float:
    """Root mean square of the off-diagonal entries of a square matrix (0 for orthogonal kernels)."""
    g = np.asarray(gram, float)
    if g.ndim != 2 or g.shape[0] != g.shape[1] or g.shape[0] < 2:
        raise ValueError(f"gram must be a square matrix of size >= 2, got shape {g.shape}")
    mask = ~np.eye(g.shape[0], dtype=bool)
    return float(np.sqrt(np.mean(g[mask] ** 2)))


__all__ = ["basis_gram", "basis_usage", "column_magnitudes", "off_diagonal_energy"]
