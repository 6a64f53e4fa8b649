"""Analysis of spectral sampling designs: the numbers behind the spectral-sharding theory chapter.

* :func:`layer_spectra` — singular values of a trained model's layers (conv kernels reshaped to
  ``(out, in·k·k)``, the factorisation of PriSM and spectral sharding);
* :func:`strategy_design` — the marginals ``pi`` and multipliers ``omega`` each strategy implies;
* :func:`discrepancy_table` — ``E||W - W_hat||_F^2 / ||W||_F^2`` per layer, keep ratio and strategy;
* :func:`check_unbiased_optimum`, :func:`check_collective_optimum` — Theorems 3.1 and 3.2 against a generic
  constrained optimiser (SLSQP);
* :func:`matrix_monte_carlo` — the expected discrepancy measured on an actual matrix by sampling,
  reconstructing ``W_hat`` from its SVD and measuring ``||W - W_hat||_F^2``;
* :func:`choice_inclusion_frequencies` — how often ``numpy.random.choice(replace=False, p=w)`` includes each
  item (PriSM's sampler), against ``w·n`` and the Wallenius marginals (spectral sharding, Appendix C).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import numpy as np
import pandas as pd
import torch
from scipy.optimize import minimize

from .inclusion import (collective_inclusion, collective_term_discrepancy, expected_discrepancy, keep_count,
                        prism_probabilities, unbiased_inclusion, wallenius_inclusion)

STRATEGIES = ("topn", "uniform", "prism", "prism+wallenius", "unbiased", "collective")


def layer_spectra(state: Mapping[str, torch.Tensor], skip_first_last: bool = True) -> dict[str, np.ndarray]:
    """Singular values (descending) of every weight matrix / conv kernel in a state dict.

    Conv kernels ``(n, C, k, k)`` are reshaped to ``(n, C·k·k)``. With ``skip_first_last`` the first and the
    last weight are left out, as neither paper decomposes them.
    """
    names = [k for k, v in state.items() if k.endswith("weight") and v.dim() >= 2]
    if skip_first_last:
        names = names[1:-1]
    return {k: torch.linalg.svdvals(state[k].detach().double().reshape(state[k].shape[0], -1)).numpy()
            for k in names}


def strategy_design(lam: np.ndarray, n: int, strategy: str, clients: int = 1,
                    keep_ratio: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(pi, omega)`` of a strategy keeping ``n`` of the ``N`` terms with singular values ``lam``.

    ``topn``: the n largest, ω = 1 (FedHM / OrthDrop). ``uniform``: π = n/N, ω = N/n (unbiased).
    ``prism``: PriSM's draw (p ∝ λ^κ, Eq. 2, sequential without replacement) — its marginals are Wallenius'
    (Fog's approximation), ω = 1 as in PriSM. ``prism+wallenius``: the same marginals with ω = 1/π (unbiased).
    ``unbiased``: Theorem 3.1. ``collective``: Theorem 3.2 for ``clients`` clients.
    """
    lam = np.asarray(lam, dtype=float)
    N = lam.size
    if strategy == "topn":
        pi = np.zeros(N)
        pi[np.argsort(-lam, kind="stable")[:n]] = 1.0
        return pi, np.ones(N)
    if strategy == "uniform":
        return np.full(N, n / N), np.full(N, N / n)
    if strategy in ("prism", "prism+wallenius"):
        r = keep_ratio if keep_ratio is not None else n / N
        pi = wallenius_inclusion(prism_probabilities(lam, r=r), n)
        omega = np.ones(N) if strategy == "prism" else 1.0 / np.maximum(pi, 1e-300)
        return pi, omega
    if strategy == "unbiased":
        pi = unbiased_inclusion(lam, n)
        return pi, 1.0 / np.maximum(pi, 1e-300)
    if strategy == "collective":
        return collective_inclusion(lam, n, clients)
    raise ValueError(f"strategy={strategy!r} is not valid; accepted: {', '.join(STRATEGIES)}")


def discrepancy_table(spectra: Mapping[str, np.ndarray], keep_ratios: Iterable[float], clients: int = 1,
                      strategies: Iterable[str] = STRATEGIES) -> pd.DataFrame:
    """Relative expected discrepancy ``E||W - W_hat||^2 / ||W||^2`` with ``clients`` clients averaged.

    Columns: layer, N, keep_ratio, n, strategy, relative_discrepancy.
    """
    rows = []
    for layer, lam in spectra.items():
        total = float(np.sum(np.asarray(lam) ** 2))
        for r in keep_ratios:
            n = keep_count(len(lam), r)
            for s in strategies:
                pi, omega = strategy_design(lam, n, s, clients, r)
                value = expected_discrepancy(lam, pi, omega, clients) / total
                rows.append({"layer": layer, "N": len(lam), "keep_ratio": r, "n": n, "strategy": s,
                             "relative_discrepancy": value})
    return pd.DataFrame(rows)


def _slsqp(objective: Callable[[np.ndarray], float], gradient: Callable[[np.ndarray], np.ndarray], N: int, n: int,
           lower: float) -> np.ndarray:
    start = np.full(N, n / N)
    res = minimize(objective, start, jac=gradient, method="SLSQP", bounds=[(lower, 1.0)] * N,
                   constraints=[{"type": "eq", "fun": lambda p: p.sum() - n, "jac": lambda p: np.ones(N)}],
                   options={"maxiter": 2000, "ftol": 1e-15})
    return np.clip(res.x, lower, 1.0)


def check_unbiased_optimum(lam: np.ndarray, n: int) -> dict[str, float]:
    """Theorem 3.1: the closed form vs SLSQP on Σ λ²(1/π − 1) s.t. Σπ = n, 0 < π ≤ 1."""
    lam = np.asarray(lam, dtype=float)
    lam2 = lam**2
    closed = unbiased_inclusion(lam, n)
    f = lambda p: float(np.sum(lam2 * (1.0 / p - 1.0)))  # noqa: E731
    numeric = _slsqp(f, lambda p: -lam2 / p**2, lam.size, n, 1e-9)
    return {"N": lam.size, "n": n, "closed_form": f(closed), "slsqp": f(numeric),
            "relative_gap": (f(numeric) - f(closed)) / f(closed), "max_abs_pi_difference":
                float(np.abs(numeric - closed).max())}


def check_collective_optimum(lam: np.ndarray, n: int, clients: int) -> dict[str, float]:
    """Theorem 3.2: the closed form vs SLSQP on Σ λ² (1 − π)/(1 + (C − 1)π) (ω already optimal)."""
    lam = np.asarray(lam, dtype=float)
    lam2 = lam**2
    closed, _ = collective_inclusion(lam, n, clients)
    f = lambda p: float(np.sum(lam2 * collective_term_discrepancy(p, clients)))  # noqa: E731
    grad = lambda p: -lam2 * clients / (1.0 + (clients - 1) * p) ** 2  # noqa: E731
    numeric = _slsqp(f, grad, lam.size, n, 0.0)
    return {"N": lam.size, "n": n, "clients": clients, "closed_form": f(closed), "slsqp": f(numeric),
            "relative_gap": (f(numeric) - f(closed)) / f(closed),
            "max_abs_pi_difference": float(np.abs(numeric - closed).max())}


def matrix_monte_carlo(weight: torch.Tensor, pi: np.ndarray, omega: np.ndarray,
                       sampler: Callable[[np.ndarray, np.random.Generator], np.ndarray], rng: np.random.Generator,
                       draws: int, clients: int = 1) -> float:
    """Mean of ``||W - W_hat||_F^2`` over ``draws`` rounds on an actual matrix.

    ``W_hat = (1/C) Σ_c Σ_{i ∈ S_c} ω_i λ_i u_i v_iᵀ`` is rebuilt from the SVD of ``weight`` (reshaped to 2-d)
    for ``clients`` independent index sets drawn by ``sampler(pi, rng)``.
    """
    w = weight.detach().double().reshape(weight.shape[0], -1)
    u, lam, vh = torch.linalg.svd(w, full_matrices=False)
    om = torch.as_tensor(omega, dtype=torch.float64)
    total = 0.0
    for _ in range(draws):
        coef = torch.zeros_like(lam)
        for _ in range(clients):
            idx = torch.as_tensor(np.asarray(sampler(pi, rng), dtype=np.int64))
            coef[idx] += om[idx] * lam[idx] / clients
        w_hat = (u * coef) @ vh
        total += float(torch.sum((w - w_hat) ** 2))
    return total / draws


def choice_inclusion_frequencies(weights: np.ndarray, n: int, draws: int, rng: np.random.Generator) -> np.ndarray:
    """Empirical inclusion frequency of each item under ``rng.choice(N, n, replace=False, p=weights)``."""
    w = np.asarray(weights, dtype=float)
    w = w / w.sum()
    counts = np.zeros(w.size)
    for _ in range(draws):
        counts[rng.choice(w.size, n, replace=False, p=w)] += 1
    return counts / draws


ALGORITHM2_LINE30 = ("printed", "eq27")
"""How :func:`algorithm2_collective` evaluates a candidate (t, u) on line 30: ``"printed"`` as the paper's
Algorithm 2 prints it, ``E = C/(C−1)·Σ λᵢ(λᵢ − √β/√C) − E_t``; ``"eq27"`` as Eq. (27) gives it,
``E = E_t − C/(C−1)·Σ λᵢ(λᵢ − √β/√C)`` (the sum of the Fᵢ of Eq. 27, which the search minimises)."""


def algorithm2_collective(lam: np.ndarray, n: int, clients: int,
                          line30: str = "printed") -> tuple[np.ndarray, np.ndarray, float, tuple[int, int]]:
    """Spectral sharding's Algorithm 2 (the Collective design's search over t terms kept with probability 1 and u
    sampled ones), line by line, with line 30 as printed or as Eq. (27) gives it (:data:`ALGORITHM2_LINE30`).

    Returns ``(pi, omega, E*, (t, u))``; ``(t, u) = (n, 0)`` is the top-n start of lines 1–11. Line 21 reads
    λ_t for t = 0 as +∞ (the printed algorithm leaves λ₀ undefined). Written out by hand to test the pseudo-code
    itself; the library's design (:func:`subfl.sampling.collective_design`) solves Eq. (8) separately.
    """
    if line30 not in ALGORITHM2_LINE30:
        raise ValueError(f"line30={line30!r} is not valid; accepted: {', '.join(ALGORITHM2_LINE30)}")
    lam = np.asarray(lam, dtype=float)
    N, C = lam.size, int(clients)
    if not (0 < n < N) or C < 2:
        raise ValueError(f"need 0 < n < N and clients >= 2, got n={n}, N={N}, clients={clients}")
    best_pi = np.r_[np.ones(n), np.zeros(N - n)]                      # lines 1–8: top-n
    best_w = best_pi.copy()
    best_e, best_tu = -float(np.sum(lam[:n] ** 2)), (n, 0)            # line 9
    for t in range(n):                                                 # line 13
        e_t = -float(np.sum(lam[:t] ** 2))                             # line 18
        upper = np.inf if t == 0 else lam[t - 1] / np.sqrt(C)          # λ_t (1-based) / √C
        for u in range(1, N - t + 1):                                  # line 19
            block = lam[t:t + u]
            sqrt_beta = np.sqrt(C) * block.sum() / ((n - t) * (C - 1) + u)          # line 20
            if not (lam[t] / np.sqrt(C) < sqrt_beta <= upper and sqrt_beta < lam[t + u - 1] * np.sqrt(C)):
                continue                                               # line 21
            pi = np.zeros(N)
            w = np.zeros(N)
            pi[:t], w[:t] = 1.0, 1.0                                   # lines 14–17
            pi[t:t + u] = (block * np.sqrt(C) / sqrt_beta - 1.0) / (C - 1)           # line 23
            w[t:t + u] = np.sqrt(C) * sqrt_beta / block                # line 24
            gain = C / (C - 1) * float(np.sum(block * (block - sqrt_beta / np.sqrt(C))))
            e = gain - e_t if line30 == "printed" else e_t - gain      # line 30
            if e < best_e:                                             # lines 31–34
                best_e, best_pi, best_w, best_tu = e, pi, w, (t, u)
    return best_pi, best_w, best_e, best_tu
