"""Spectral diagnostics: how random a sampling design is, and how spread a spectrum is.

* :func:`anme` -- average normalised marginal entropy, §4.2.2 of spectral sharding (Korzhenkov & Louizos).
* :func:`effective_rank` -- effective rank of Roy & Vetterli (2007), used in §4.4.1 of PriSM (Niu et al.).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
from scipy.special import entr

__all__ = ["anme", "effective_rank", "bernoulli_entropy"]


def _as_vector(values: object, name: str) -> np.ndarray:
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a 1-D array of real numbers, got {type(values).__name__}") from exc
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite (no NaN or inf)")
    return arr


def bernoulli_entropy(pi: object) -> np.ndarray:
    """``H(pi) = -pi log pi - (1 - pi) log(1 - pi)`` in nats, elementwise, with ``0 log 0 = 0``."""
    pi = np.asarray(pi, dtype=np.float64)
    return entr(pi) + entr(1.0 - pi)


def anme(probabilities_per_layer: Sequence[object]) -> float:
    """Average normalised marginal entropy (ANME), §4.2.2 of spectral sharding.

    For a layer with marginals ``pi`` (``N`` terms, ``n = sum(pi)``) the normalised marginal entropy is

        mean_i H(pi_i) / H(n / N),

    the mean Bernoulli entropy of the inclusion indicators divided by that of the uniform design with the
    same expected size (which maximises ``sum_i H(pi_i)`` under ``sum pi = n`` since ``H`` is concave). ANME
    is its average over layers: 0 for deterministic top-``n`` (``pi`` in ``{0, 1}``), 1 for uniform sampling.

    Layers with ``n`` in ``{0, N}`` admit a single design (all zeros / all ones, entropy 0) and no
    normalisation; they are skipped. If every layer is such, the result is 0.0 (no randomness).
    """
    if isinstance(probabilities_per_layer, np.ndarray) and probabilities_per_layer.ndim == 1:
        raise TypeError("probabilities_per_layer must be a sequence of per-layer arrays, got a single 1-D array")
    layers = list(probabilities_per_layer)
    if not layers:
        raise ValueError("probabilities_per_layer must contain at least one layer, got none")
    values = []
    for index, layer in enumerate(layers):
        pi = _as_vector(layer, f"probabilities_per_layer[{index}]")
        if np.any((pi < 0) | (pi > 1)):
            raise ValueError(
                f"probabilities_per_layer[{index}] must lie in [0, 1], got values in [{pi.min()}, {pi.max()}]"
            )
        rate = float(pi.sum()) / pi.size
        reference = float(bernoulli_entropy(rate))
        if reference <= 1e-15:
            continue
        values.append(float(np.mean(bernoulli_entropy(pi))) / reference)
    return float(np.mean(values)) if values else 0.0


def effective_rank(singular_values: object) -> float:
    """Effective rank ``exp(-sum_i p_i log p_i)``, ``p_i = sigma_i / sum_j sigma_j`` (Roy & Vetterli 2007; PriSM §4.4.1).

    ``N`` for ``N`` equal singular values, 1 for a rank-one matrix; e.g. ``(2, 1, 1)`` gives
    ``exp(1.5 log 2) = 2 sqrt 2``. Zero singular values contribute nothing (``0 log 0 = 0``).
    """
    sigma = _as_vector(singular_values, "singular_values")
    if np.any(sigma < 0):
        raise ValueError(f"singular_values must be non-negative, got minimum {sigma.min()}")
    total = float(sigma.sum())
    if total <= 0:
        raise ValueError("singular_values must have a positive sum, got all zeros")
    return float(np.exp(np.sum(entr(sigma / total))))
