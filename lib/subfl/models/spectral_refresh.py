"""Solvers for the spectral methods' orthogonal-space refresh: the thin SVD of every decomposed layer, each round.

The refresh is most of the server's work in PriSM and spectral sharding (PriSM Table 4: 3.27 s of SVD against
0.11 s of sampling and 0.96 s of aggregation). Two solvers give the same factors ``U' = U √λ``, ``V' = √λ Vᵀ``
(:class:`~subfl.models.factorized.SpectralFactors`, terms sorted by decreasing singular value λ):

* ``"exact"`` — :func:`~subfl.models.factorized.svd_factors`: LAPACK's thin SVD (``torch.linalg.svd``) in float64.
* ``"gram"`` — :func:`gram_svd_factors`: the eigendecomposition of the smaller Gram matrix ``A Aᵀ`` (``A`` the
  layer's ``(n, m)`` matrix, or its transpose when ``n > m``) in float64, then ``Vᵀ = Λ⁻¹ Uᵀ A``. For the
  ``512 × 4608`` matrices of ResNet-18's last block it is several times faster on a CPU (two matrix products and a
  ``512 × 512`` symmetric eigendecomposition instead of a bidiagonalisation of the whole matrix).

What ``"gram"`` gives up: squaring the matrix squares its condition number, so a singular value ``λ_i`` carries an
absolute error of about ``ε λ_1² / λ_i`` (``ε`` = float64's 2.2 · 10⁻¹⁶) instead of ``ε λ_1``. Terms with
``λ_i² ≤ p ε λ_1²`` (``p`` the Gram matrix's size) are below that noise: their singular value is set to 0 and
their factors to zero vectors (LAPACK returns tiny, equally uninformative values there). Above it, singular values agree
with the exact SVD to about ``ε (λ_1 / λ_i)²`` relatively — far below the float32 rounding of the factors the
methods use for any spectrum spanning less than six orders of magnitude. The product ``U' V'`` reproduces the
matrix to float32 rounding in both cases (tested).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from .factorized import LayerSpec, SpectralFactors, decompose_weights, svd_factors

SVD_SOLVERS = ("exact", "gram")
"""Accepted names of a refresh solver (the spectral methods' option ``svd_solver``)."""


def gram_svd_factors(matrix: torch.Tensor) -> SpectralFactors:
    """Thin SVD of an ``(n, m)`` matrix through the eigendecomposition of its smaller Gram matrix, with the
    singular values absorbed as ``√λ`` into both sides — the same factors as
    :func:`~subfl.models.factorized.svd_factors` up to the sign of each term, computed in float64 on the CPU and
    returned in the matrix's dtype (terms with ``λ_i² ≤ p ε λ_1²`` are returned as zero; see the module)."""
    if not isinstance(matrix, torch.Tensor) or matrix.dim() != 2:
        raise ValueError(f"matrix must be a 2-D tensor, got {type(matrix).__name__} "
                         f"{tuple(getattr(matrix, 'shape', ()))}")
    dtype = matrix.dtype if matrix.is_floating_point() else torch.float32
    w = matrix.detach().to("cpu", torch.float64)
    transposed = w.shape[0] > w.shape[1]
    a = w.T if transposed else w                      # (p, q), p <= q
    eigenvalues, left = torch.linalg.eigh(a @ a.T)    # ascending
    eigenvalues, left = eigenvalues.flip(0), left.flip(1)
    noise = a.shape[0] * torch.finfo(torch.float64).eps * eigenvalues[0].clamp_min(0)
    kept = eigenvalues > noise
    lam = torch.where(kept, eigenvalues.clamp_min(0).sqrt(), torch.zeros_like(eigenvalues))
    root = lam.sqrt()
    inv_root = torch.where(kept, 1.0 / root.clamp_min(torch.finfo(torch.float64).tiny), torch.zeros_like(root))
    left_factor = left * root                         # (p, p): U √λ
    right_factor = inv_root[:, None] * (left.T @ a)   # (p, q): √λ Vᵀ = λ^{-1/2} Uᵀ A
    if transposed:                                    # W = Aᵀ = (√λ Vᵀ)ᵀ (U √λ)ᵀ
        left_factor, right_factor = right_factor.T, left_factor.T
    return SpectralFactors(left_factor.to(dtype).contiguous(), right_factor.to(dtype).contiguous(), lam.to(dtype))


def solver_function(svd_solver: str) -> Callable[[torch.Tensor], SpectralFactors]:
    """The factor function of ``svd_solver`` (one of :data:`SVD_SOLVERS`)."""
    if svd_solver not in SVD_SOLVERS:
        raise ValueError(f"svd_solver={svd_solver!r} is not valid; accepted: {', '.join(SVD_SOLVERS)}")
    return svd_factors if svd_solver == "exact" else gram_svd_factors


def refresh_factors(weights: Mapping[str, torch.Tensor], specs: Mapping[str, LayerSpec],
                    svd_solver: str = "exact") -> dict[str, SpectralFactors]:
    """The spectral methods' orthogonal-space refresh: :func:`~subfl.models.factorized.decompose_weights` with
    the factor function of ``svd_solver``."""
    return decompose_weights(weights, specs, solver_function(svd_solver))


__all__ = ["SVD_SOLVERS", "gram_svd_factors", "refresh_factors", "solver_function"]
