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


# ---------------------------------------------------------------------------------------------------------------
# Exact joint laws of the fixed-size samplers (small N, by enumeration) and the checks built on them
# ---------------------------------------------------------------------------------------------------------------
JOINT_LAW_DESIGNS = ("cps", "brewer", "min_support")


def _cps_joint_law(pi: np.ndarray) -> dict[tuple[int, ...], float]:
    from itertools import combinations

    from .samplers import cps_design
    design = cps_design(pi)
    cand, certain = design._candidates, design._certain
    if cand.size == 0 or design._draw_size == 0:
        local_sets = [()] if not design._complement else [tuple(range(cand.size))]
        return {tuple(sorted(np.r_[certain, cand[list(s)]].astype(int).tolist())): 1.0 for s in local_sets}
    theta = design._theta
    subsets = list(combinations(range(cand.size), design._draw_size))
    logw = np.array([theta[list(s)].sum() for s in subsets])
    prob = np.exp(logw - logw.max())
    prob /= prob.sum()
    out = {}
    for s, q in zip(subsets, prob):
        local = sorted(set(range(cand.size)) - set(s)) if design._complement else list(s)
        out[tuple(sorted(np.r_[certain, cand[local]].astype(int).tolist()))] = float(q)
    return out


def _brewer_joint_law(pi: np.ndarray) -> dict[tuple[int, ...], float]:
    from .samplers import _split_inclusion, brewer_step_weights
    _, _, certain, candidates, targets = _split_inclusion(pi)
    size = int(round(targets.sum())) if candidates.size else 0
    out: dict[tuple[int, ...], float] = {}

    def recurse(available: np.ndarray, picked: list[int], prob: float) -> None:
        i = len(picked) + 1
        if i > size:
            key = tuple(sorted(np.r_[certain, candidates[picked]].astype(int).tolist()))
            out[key] = out.get(key, 0.0) + prob
            return
        weight = brewer_step_weights(targets, available, size - i + 1)
        weight = weight / weight.sum()
        for k in np.flatnonzero(weight > 0):
            nxt = available.copy()
            nxt[k] = False
            recurse(nxt, picked + [int(k)], prob * float(weight[k]))

    recurse(np.ones(candidates.size, dtype=bool), [], 1.0)
    return out


def _min_support_joint_law(pi: np.ndarray) -> dict[tuple[int, ...], float]:
    from .samplers import _split_inclusion, min_support_splits
    _, _, certain, candidates, _ = _split_inclusion(pi)
    out: dict[tuple[int, ...], float] = {}
    remaining = 1.0
    for alpha, stop in min_support_splits(pi):
        key = tuple(sorted(np.r_[certain, candidates[stop]].astype(int).tolist()))
        out[key] = out.get(key, 0.0) + remaining * alpha
        remaining *= 1.0 - alpha
    return out


def joint_law(pi: np.ndarray, design: str) -> dict[tuple[int, ...], float]:
    """Exact law ``P(S)`` of a fixed-size sampler with marginals ``pi`` (small ``N``: enumerates the samples).

    ``"cps"``: ``P(S) ∝ Π_{i∈S} w_i`` with the working odds that :func:`subfl.sampling.cps_design` calibrates;
    ``"brewer"``: every ordered sequence of draws of :func:`subfl.sampling.sample_brewer`, with its draw
    probabilities; ``"min_support"``: the splitting chain of :func:`subfl.sampling.sample_min_support`, each stop
    with its probability. Keys are sorted index tuples; the values sum to 1.
    """
    pi = np.asarray(pi, dtype=float)
    if design == "cps":
        return _cps_joint_law(pi)
    if design == "brewer":
        return _brewer_joint_law(pi)
    if design == "min_support":
        return _min_support_joint_law(pi)
    raise ValueError(f"design={design!r} is not valid; accepted: {', '.join(JOINT_LAW_DESIGNS)}")


def law_marginals(law: Mapping[tuple[int, ...], float], size: int) -> np.ndarray:
    """Inclusion probabilities ``Σ_{S∋i} P(S)`` of a joint law over index tuples of ``range(size)``."""
    out = np.zeros(size)
    for s, q in law.items():
        out[list(s)] += q
    return out


def law_entropy(law: Mapping[tuple[int, ...], float]) -> float:
    """Shannon entropy ``−Σ P(S) log P(S)`` (nats) of a joint law."""
    q = np.array([v for v in law.values() if v > 0])
    return float(-np.sum(q * np.log(q)))


def max_entropy_fixed_size(pi: np.ndarray) -> tuple[float, dict[tuple[int, ...], float]]:
    """The largest entropy of any law over the samples of size ``n = Σπ`` with marginals ``pi``, by a generic
    optimiser (SLSQP on the probabilities of all ``C(N, n)`` samples; it knows nothing of conditional Poisson).
    Returns ``(entropy, law)``."""
    from itertools import combinations
    pi = np.asarray(pi, dtype=float)
    N, n = pi.size, int(round(pi.sum()))
    subsets = list(combinations(range(N), n))
    incidence = np.zeros((N, len(subsets)))
    for j, s in enumerate(subsets):
        incidence[list(s), j] = 1.0
    start = np.full(len(subsets), 1.0 / len(subsets))
    eps = 1e-300

    def negent(q: np.ndarray) -> float:
        return float(np.sum(q * np.log(np.maximum(q, eps))))

    res = minimize(negent, start, jac=lambda q: np.log(np.maximum(q, 1e-16)) + 1.0, method="SLSQP",
                   bounds=[(0.0, 1.0)] * len(subsets),
                   constraints=[{"type": "eq", "fun": lambda q: incidence @ q - pi, "jac": lambda q: incidence}],
                   options={"maxiter": 1000, "ftol": 1e-14})
    q = np.clip(res.x, 0.0, None)
    q /= q.sum()
    law = dict(zip(subsets, q.tolist()))
    return law_entropy(law), law


def sampler_entropy_rows(pi: np.ndarray) -> list[dict[str, float | str]]:
    """Sec. 3.2.3: each library sampler's exact joint law for marginals ``pi`` (by enumeration) — its entropy and
    how far its marginals are from ``pi`` — and, as the last row, the largest entropy a generic optimiser finds
    among fixed-size laws with the same marginals."""
    pi = np.asarray(pi, dtype=float)
    rows: list[dict[str, float | str]] = []
    for design in JOINT_LAW_DESIGNS:
        law = joint_law(pi, design)
        rows.append({"design": design, "samples in the support": len(law), "entropy (nats)": law_entropy(law),
                     "max |marginal − π|": float(np.abs(law_marginals(law, pi.size) - pi).max())})
    h, law = max_entropy_fixed_size(pi)
    rows.append({"design": "max-entropy (SLSQP)", "samples in the support": sum(v > 1e-12 for v in law.values()),
                 "entropy (nats)": h, "max |marginal − π|": float(np.abs(law_marginals(law, pi.size) - pi).max())})
    return rows


def multiplier_sum_check(lam: np.ndarray, n: int, design: str = "cps") -> dict[str, float]:
    """Eq. (9): the expected sum of the multipliers ``ω = 1/π`` of the ``n`` terms drawn by the Unbiased design,
    exactly over the sampler's joint law (small ``N``), against ``N``; also the largest multiplier and ``N/n``."""
    lam = np.asarray(lam, dtype=float)
    pi = unbiased_inclusion(lam, n)
    omega = 1.0 / pi
    law = joint_law(pi, design)
    expected = sum(q * float(omega[list(s)].sum()) for s, q in law.items())
    return {"N": lam.size, "n": n, "expected multiplier sum": expected, "max multiplier": float(omega.max()),
            "N / n": lam.size / n, "relative error": expected / lam.size - 1.0}


def multiplier_bias_rows(lam: np.ndarray, n: int, clients: int = 10, design: str = "cps",
                         spread: float = 0.5) -> list[dict[str, float | str]]:
    """Sec. 3.2.1 / App. B.1: relative bias ``‖E Ŵ − W‖_F / ‖W‖_F`` and error ``E‖W − Ŵ‖²_F / ‖W‖²_F`` of one
    client's estimator under the Unbiased marginals ``π`` (exact over the sampler's joint law), for several
    multiplier rules: Horvitz-Thompson ``1/π``; ``1`` (PriSM, top-n); the Collective rule ``C/(1 + (C−1)π)``;
    ``+Scaled`` (one factor per sample keeping ``‖Ŵ‖_F = ‖W‖_F``); ``1/π`` times a random factor in
    ``{1 − spread, 1 + spread}`` of mean 1 (``E[ω | z = 1] = 1/π`` but not fixed)."""
    lam = np.asarray(lam, dtype=float)
    pi = unbiased_inclusion(lam, n)
    law = joint_law(pi, design)
    total = float(np.sum(lam**2))
    rules: dict[str, Callable[[tuple[int, ...]], list[tuple[float, np.ndarray]]]] = {
        "1/π (Horvitz-Thompson)": lambda s: [(1.0, 1.0 / pi)],
        "1 (no compensation)": lambda s: [(1.0, np.ones_like(pi))],
        f"C/(1+(C−1)π), C = {clients}": lambda s: [(1.0, clients / (1.0 + (clients - 1) * pi))],
        "+Scaled": lambda s: [(1.0, np.full_like(pi, np.sqrt(total / float(np.sum(lam[list(s)] ** 2)))))],
        f"1/π × (1 ± {spread:g}), random": lambda s: [(0.5, (1.0 - spread) / pi), (0.5, (1.0 + spread) / pi)],
    }
    rows: list[dict[str, float | str]] = []
    for name, rule in rules.items():
        mean = np.zeros_like(lam)
        err = 0.0
        for s, q in law.items():
            z = np.zeros_like(lam)
            z[list(s)] = 1.0
            for w, omega in rule(s):
                coef = z * omega
                mean += q * w * coef
                err += q * w * float(np.sum(lam**2 * (1.0 - coef) ** 2))
        rows.append({"multipliers": name, "relative bias": float(np.linalg.norm(lam * (mean - 1.0)) / np.sqrt(total)),
                     "relative error": err / total})
    return rows


def balance_check(lam: np.ndarray, n: int, design: str = "cps") -> dict[str, float]:
    """Remark B.1: ``Σ_{j∈S} λ_j/π_j`` against ``Σ_i λ_i`` on every sample ``S`` of the Unbiased design's joint law
    (small ``N``); returns the largest relative deviation and the number of samples checked."""
    lam = np.asarray(lam, dtype=float)
    pi = unbiased_inclusion(lam, n)
    law = joint_law(pi, design)
    total = float(lam.sum())
    dev = max(abs(float(np.sum(lam[list(s)] / pi[list(s)])) - total) / total for s in law)
    return {"N": lam.size, "n": n, "samples": len(law), "max relative deviation": dev}


def nuclear_balance_monte_carlo(weight: torch.Tensor, n: int, sampler: Callable[[np.ndarray, np.random.Generator], np.ndarray],
                                rng: np.random.Generator, draws: int) -> float:
    """Remark B.1 on an actual matrix: largest relative gap between the sum of the singular values of the rebuilt
    Unbiased sub-model ``Σ_{i∈S} λ_i/π_i u_i v_iᵀ`` and that of ``W`` over ``draws`` samples."""
    w = weight.detach().double().reshape(weight.shape[0], -1)
    u, lam, vh = torch.linalg.svd(w, full_matrices=False)
    pi = unbiased_inclusion(lam.numpy(), n)
    total = float(lam.sum())
    worst = 0.0
    for _ in range(draws):
        idx = np.asarray(sampler(pi, rng), dtype=np.int64)
        coef = torch.zeros_like(lam)
        coef[idx] = lam[idx] / torch.as_tensor(pi[idx])
        nuclear = float(torch.linalg.svdvals((u * coef) @ vh).sum())
        worst = max(worst, abs(nuclear - total) / total)
    return worst


def single_client_optimum(lam: np.ndarray, n: int, starts: int = 5, seed: int = 0) -> dict[str, float]:
    """Sec. 1: one client (``C = 1``), no unbiasedness. Top-n's error ``Σ_{i>n} λ_i²`` against (a) the best fixed
    sample of size ``n`` with its best multipliers (enumeration; ``ω = 1`` is optimal for a fixed sample),
    (b) the least of Eq. (7) at ``C = 1`` jointly over ``(π, ω)`` found by SLSQP from ``starts`` random starts,
    (c) the library's Collective design at ``C = 1``. Returns the errors and how many of the design's ``π``
    differ from top-n's."""
    from itertools import combinations
    lam = np.asarray(lam, dtype=float)
    N = lam.size
    lam2 = lam**2
    topn = float(np.sum(np.sort(lam2)[::-1][n:]))
    best_subset = min(float(lam2.sum() - lam2[list(s)].sum()) for s in combinations(range(N), n)) if N <= 16 else _NAN
    rng = np.random.default_rng(seed)

    def f(x: np.ndarray) -> float:
        p, w = x[:N], x[N:]
        return float(np.sum(lam2 * ((1.0 - w * p) ** 2 + w**2 * p * (1.0 - p))))

    def grad(x: np.ndarray) -> np.ndarray:
        p, w = x[:N], x[N:]
        gp = lam2 * (-2.0 * w * (1.0 - w * p) + w**2 * (1.0 - 2.0 * p))
        gw = lam2 * (-2.0 * p * (1.0 - w * p) + 2.0 * w * p * (1.0 - p))
        return np.r_[gp, gw]

    best = np.inf
    for _ in range(starts):
        p0 = rng.dirichlet(np.ones(N)) * n
        p0 = np.clip(p0, 0.0, 1.0)
        p0 *= n / p0.sum()
        x0 = np.r_[np.clip(p0, 0, 1), 1.0 / np.maximum(p0, 0.05)]
        res = minimize(f, x0, jac=grad, method="SLSQP", bounds=[(0.0, 1.0)] * N + [(0.0, None)] * N,
                       constraints=[{"type": "eq", "fun": lambda x: x[:N].sum() - n,
                                     "jac": lambda x: np.r_[np.ones(N), np.zeros(N)]}],
                       options={"maxiter": 2000, "ftol": 1e-14})
        x = res.x.copy()
        x[:N] = np.clip(x[:N], 0.0, 1.0)              # back onto the feasible set before scoring
        if x[:N].sum() > n:
            x[:N] *= n / x[:N].sum()
        x[N:] = np.maximum(x[N:], 0.0)
        best = min(best, f(x))
    pi1, _ = collective_inclusion(lam, n, 1)
    top = np.zeros(N)
    top[np.argsort(-lam, kind="stable")[:n]] = 1.0
    return {"N": N, "n": n, "top-n error": topn, "best fixed sample": best_subset, "SLSQP over (π, ω)": best,
            "library C = 1 design ≠ top-n": int(np.sum(pi1 != top)),
            "shortfall of top-n": max(0.0, (topn - float(np.nanmin([best, best_subset]))) / topn)}


_NAN = float("nan")


def collective_terms_check(lam: np.ndarray, n: int, clients: int) -> dict[str, float]:
    """Eqs. (26)-(27): for the Collective optimum (library, Eq. 8) the per-term ``π_i ω_i`` and
    ``F_i = λ_i² ω_i π_i (−2 + ω_i/C + ω_i π_i (C−1)/C)`` computed from their definitions against the closed
    forms of Eqs. (26)-(27), with ``√β = √C Σ_{t<i≤t+u} λ_i / ((n−t)(C−1) + u)``; also ``Σ F_i + Σ λ_i²`` against
    Eq. (7). Returns the largest absolute deviations (relative to ``max λ²``), ``t`` and ``u``."""
    lam = np.sort(np.asarray(lam, dtype=float))[::-1]
    C = int(clients)
    pi, omega = collective_inclusion(lam, n, C)
    full = pi >= 1.0 - 1e-12
    part = (pi > 1e-12) & ~full
    t, u = int(full.sum()), int(part.sum())
    sqrt_beta = np.sqrt(C) * lam[part].sum() / ((n - t) * (C - 1) + u)
    pw_def = pi * omega
    f_def = lam**2 * omega * pi * (-2.0 + omega / C + omega * pi * (C - 1) / C)
    pw_eq = np.where(full, 1.0, np.where(part, C / (C - 1) - np.sqrt(C) * sqrt_beta / (lam * (C - 1)), 0.0))
    f_eq = np.where(full, -lam**2, np.where(part, -C / (C - 1) * lam * (lam - sqrt_beta / np.sqrt(C)), 0.0))
    scale = float(lam[0] ** 2)
    eq7 = float(f_def.sum() + np.sum(lam**2))
    return {"N": lam.size, "n": n, "clients": C, "t": t, "u": u, "sqrt(beta)": float(sqrt_beta),
            "max |πω − Eq. 26|": float(np.abs(pw_def - pw_eq).max()),
            "max |F − Eq. 27| / λ₁²": float(np.abs(f_def - f_eq).max() / scale),
            "|ΣF + Σλ² − Eq. 7| / Σλ²": abs(eq7 - expected_discrepancy(lam, pi, omega, C)) / float(np.sum(lam**2))}


def large_c_rows(lam: np.ndarray, n: int, clients: Iterable[int]) -> list[dict[str, float]]:
    """Remark B.2: the Collective optimum as ``C`` grows — its largest ``|π_i ω_i − 1|`` over kept terms (0 for a
    Horvitz-Thompson estimator), its single-client bias ``‖E Ŵ − W‖_F / ‖W‖_F``, the distance of its marginals from
    Theorem 3.1's, and its averaged error over the Unbiased design's (both with ``C`` clients)."""
    lam = np.asarray(lam, dtype=float)
    pi_u = unbiased_inclusion(lam, n)
    rows = []
    for C in clients:
        pi, omega = collective_inclusion(lam, n, int(C))
        kept = pi > 0
        bias = float(np.linalg.norm(lam * (pi * omega - 1.0)) / np.linalg.norm(lam))
        rows.append({"C": int(C), "max |πω − 1| (kept terms)": float(np.abs(pi[kept] * omega[kept] - 1.0).max()),
                     "terms never drawn": int((~kept).sum()), "relative bias": bias,
                     "max |π − π(Thm 3.1)|": float(np.abs(pi - pi_u).max()),
                     "Collective / Unbiased error": expected_discrepancy(lam, pi, omega, int(C))
                     / expected_discrepancy(lam, pi_u, 1.0 / pi_u, int(C))})
    return rows


def schatten_bound_rows(lam: np.ndarray, n: int, ps: Iterable[float], design: str = "cps") -> list[dict[str, float]]:
    """Eq. (10): for the Unbiased design (Theorem 3.1's marginals, ``ω = 1/π``) the exact expected Schatten-p error
    ``E (Σ_i λ_i^p |z_i/π_i − 1|^p)^{1/p}`` over the sampler's joint law (small ``N``) against the bound
    ``(Σ_i λ_i^p [1 − π_i + π_i (1/π_i − 1)^p])^{1/p}``; also ``E Σ_i λ_i^p |z_i/π_i − 1|^p`` against the bracket
    (the step where the bound is an equality)."""
    lam = np.asarray(lam, dtype=float)
    pi = unbiased_inclusion(lam, n)
    law = joint_law(pi, design)
    rows = []
    for p in ps:
        lhs = 0.0
        inner = 0.0
        for s, q in law.items():
            z = np.zeros_like(lam)
            z[list(s)] = 1.0
            power = float(np.sum(lam**p * np.abs(z / pi - 1.0) ** p))
            lhs += q * power ** (1.0 / p)
            inner += q * power
        bracket = float(np.sum(lam**p * (1.0 - pi + pi * (1.0 / pi - 1.0) ** p)))
        rows.append({"p": p, "E‖W−Ŵ‖_p": lhs, "bound (Eq. 10)": bracket ** (1.0 / p),
                     "E‖W−Ŵ‖_p / bound": lhs / bracket ** (1.0 / p),
                     "|E‖W−Ŵ‖_p^p − bracket| / bracket": abs(inner - bracket) / bracket})
    return rows


def algorithm1_unbiased(lam: np.ndarray, n: int) -> tuple[np.ndarray, float, int, list[int]]:
    """Spectral sharding's Algorithm 1 (the Unbiased design's search), line by line as printed: for t = 0..n−1,
    keep t only if λ_{t+1} < Λ_t/(n − t) with Λ_t = Σ_{l>t} λ_l, set π_l = 1 for l ≤ t and (n − t)λ_l/Λ_t otherwise,
    score E = Σ λ_i²(1/π_i − 1) and keep the best. ``lam`` must be sorted decreasingly with 0 < n < N.

    Returns ``(pi*, E*, t*, admissible t's)``; written out by hand to test the pseudo-code itself against the
    library's water-filling (:func:`subfl.sampling.unbiased_inclusion`)."""
    lam = np.asarray(lam, dtype=float)
    N = lam.size
    if not (0 < n < N) or np.any(np.diff(lam) > 0) or lam[-1] <= 0:
        raise ValueError("need 0 < n < N and lam sorted decreasingly and positive")
    best_e, best_pi, best_t, admissible = np.inf, None, -1, []
    for t in range(n):                                              # line 2
        big_lambda = float(lam[t:].sum())                            # line 3 (1-based l = t+1..N)
        if lam[t] < big_lambda / (n - t):                            # line 4 (λ_{t+1} is lam[t])
            admissible.append(t)
            pi = np.empty(N)
            pi[:t] = 1.0                                             # lines 5-7
            pi[t:] = (n - t) * lam[t:] / big_lambda                  # lines 8-10
            e = float(np.sum(lam**2 * (1.0 / pi - 1.0)))             # line 11
            if e < best_e:                                           # lines 12-15
                best_e, best_pi, best_t = e, pi, t
    return best_pi, best_e, best_t, admissible


def algorithm1_check(lam: np.ndarray, n: int) -> dict[str, float]:
    """Algorithm 1 as printed against the library's water-filling solution of Eq. (5) on a decreasing spectrum."""
    lam = np.sort(np.asarray(lam, dtype=float))[::-1]
    pi, e, t, admissible = algorithm1_unbiased(lam, n)
    lib = unbiased_inclusion(lam, n)
    e_lib = float(np.sum(lam**2 * (1.0 / lib - 1.0)))
    return {"N": lam.size, "n": n, "t*": t, "admissible t": len(admissible), "t = n−1 admissible": (n - 1) in admissible,
            "max |π − π(library)|": float(np.abs(pi - lib).max()), "E (Alg. 1)": e, "E (library)": e_lib,
            "relative gap": (e - e_lib) / e_lib}
