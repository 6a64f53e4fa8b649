"""Inclusion probabilities for spectral sub-models.

Setting (both spectral papers): a layer ``W = sum_i lam_i u_i v_i^T`` has ``N`` singular values ``lam``.
A client with keep ratio ``r`` receives ``n = ceil(N r)`` terms drawn without replacement with inclusion
probabilities ``pi`` (``sum(pi) == n``, ``0 <= pi_i <= 1``) and rebuilds
``W_hat = sum_{i in S} omega_i lam_i u_i v_i^T``.

Because ``W_hat`` keeps the singular vectors of ``W``, ``W - W_hat = sum_i lam_i (1 - omega_i z_i) u_i v_i^T``
(``z_i`` the inclusion indicator) is itself a singular value decomposition up to signs, so *every* unitarily
invariant discrepancy (Frobenius, Schatten-p) is a function of the coefficients ``lam_i (1 - omega_i z_i)``
only, and its expectation depends on the design only through the marginals ``pi``. This module therefore
works on marginals; :mod:`subfl.sampling.samplers` turns marginals into exact fixed-size designs.

Functions
---------
* :func:`unbiased_inclusion` -- Theorem 3.1 / Eq. (5) of spectral sharding (Korzhenkov & Louizos).
* :func:`collective_inclusion` -- Theorem 3.2 / Eq. (8) of spectral sharding.
* :func:`schatten_inclusion` -- unbiased estimator, Schatten-p discrepancy (exact KKT or SLSQP).
* :func:`prism_probabilities` -- Eq. (2) of PriSM (Niu et al., TMLR 2023).
* :func:`softmax_probabilities` -- the softmax-based distribution of PriSM's sampling ablation (Sec. 4.5, Table 5).
* :func:`wallenius_inclusion` -- marginals of PriSM's sequential sampler (Fog's approximation or exact).
* :func:`expected_discrepancy`, :func:`monte_carlo_discrepancy` -- ``E||W - W_hat||_F^2``.
"""
from __future__ import annotations

import math
import numbers
from typing import Callable

import numpy as np
from scipy import optimize

__all__ = [
    "keep_count",
    "unbiased_inclusion",
    "unbiased_weights",
    "collective_inclusion",
    "collective_weights",
    "collective_term_discrepancy",
    "schatten_inclusion",
    "schatten_discrepancy",
    "prism_probabilities",
    "softmax_probabilities",
    "wallenius_inclusion",
    "expected_discrepancy",
    "monte_carlo_discrepancy",
]


# --------------------------------------------------------------------------------------------------
# validation helpers (shared with samplers.py)
# --------------------------------------------------------------------------------------------------
def _as_vector(values: object, name: str, *, allow_empty: bool = False) -> np.ndarray:
    """``values`` as a finite 1-D float64 array, or ``ValueError`` naming ``name``."""
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a 1-D array of real numbers, got {type(values).__name__}") from exc
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got an array of shape {arr.shape}")
    if arr.size == 0 and not allow_empty:
        raise ValueError(f"{name} must be non-empty, got an empty array")
    if not np.all(np.isfinite(arr)):
        bad = arr[~np.isfinite(arr)][0]
        raise ValueError(f"{name} must be finite (no NaN or inf), got {name}[...]={bad}")
    return arr


def _as_spectrum(lam: object, name: str = "lam") -> np.ndarray:
    """Singular values: a finite, non-negative, non-empty 1-D array."""
    arr = _as_vector(lam, name)
    if np.any(arr < 0):
        idx = int(np.flatnonzero(arr < 0)[0])
        raise ValueError(f"{name} must be non-negative, got {name}[{idx}]={arr[idx]}")
    return arr


def _as_count(value: object, name: str, low: int, high: int) -> int:
    """An integer in ``[low, high]`` (bools and non-integral floats are refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        if isinstance(value, numbers.Real) and float(value).is_integer():
            value = int(value)
        else:
            raise ValueError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
    value = int(value)
    if not low <= value <= high:
        raise ValueError(f"{name} must be an integer in [{low}, {high}], got {value}")
    return value


def _fill_when_few_positive(lam: np.ndarray, n: int) -> np.ndarray | None:
    """Trivial allocation when at most ``n`` singular values are positive, else ``None``.

    All positive terms are kept with certainty; the remaining mass ``n - m`` is spread evenly over the
    zero terms (they contribute nothing to any discrepancy, so any spread is optimal).
    """
    positive = lam > 0
    m = int(positive.sum())
    if m > n:
        return None
    pi = np.zeros_like(lam)
    pi[positive] = 1.0
    if n > m:
        pi[~positive] = (n - m) / (lam.size - m)
    return pi


def keep_count(num_terms: int, ratio: float) -> int:
    """Number of terms ``n = ceil(N r)`` a client with keep ratio ``r`` receives (at least 1).

    A relative slack of 1e-9 keeps ``ceil(100 * 0.07)`` (``7.000000000000001`` in floating point) at 7.
    """
    num_terms = _as_count(num_terms, "num_terms", 1, 2**62)
    if not (isinstance(ratio, numbers.Real) and 0 < ratio <= 1):
        raise ValueError(f"ratio must be a real number in (0, 1], got {ratio!r}")
    return max(1, min(num_terms, math.ceil(num_terms * float(ratio) * (1.0 - 1e-9))))


# --------------------------------------------------------------------------------------------------
# Unbiased (Theorem 3.1)
# --------------------------------------------------------------------------------------------------
def unbiased_inclusion(lam: object, n: int) -> np.ndarray:
    """Optimal inclusion probabilities of the unbiased estimator (Theorem 3.1 / Eq. (5) of spectral sharding).

    With ``omega = 1/pi`` the estimator is unbiased and ``E||W - W_hat||_F^2 = sum_i lam_i^2 (1/pi_i - 1)``.
    Minimising it subject to ``sum(pi) = n, 0 < pi <= 1`` (KKT: ``lam_i^2 / pi_i^2 = mu`` off the bound)
    gives water-filling ``pi_i = min(1, c lam_i)``: with ``lam`` sorted decreasingly and ``T_k`` the sum of
    ``lam_(k), lam_(k+1), ...``, the number of saturated terms is the smallest ``k`` with
    ``(n - k) lam_(k) <= T_k`` and then ``c = (n - k) / T_k``. Cost ``O(N log N)``.

    Parameters
    ----------
    lam: singular values (any order, ``>= 0``); the result is in the same order.
    n: number of terms to keep, ``1 <= n <= N`` (``n == N`` gives all ones).

    Returns
    -------
    ``pi`` with ``sum(pi) == n`` (to rounding). Terms with ``lam_i = 0`` get ``pi_i = 0`` unless fewer than
    ``n`` singular values are positive, in which case the leftover mass is spread evenly over them.
    """
    lam = _as_spectrum(lam)
    n = _as_count(n, "n", 1, lam.size)
    trivial = _fill_when_few_positive(lam, n)
    if trivial is not None:
        return trivial
    order = np.argsort(-lam, kind="stable")
    s = lam[order]
    tail = np.cumsum(s[::-1])[::-1]  # tail[k] = s[k] + s[k+1] + ...
    k_range = np.arange(n)
    feasible = (n - k_range) * s[:n] <= tail[:n]
    k = int(np.argmax(feasible))  # smallest feasible k; k = n - 1 is always feasible
    c = (n - k) / tail[k]
    pi_sorted = np.minimum(1.0, c * s)
    pi_sorted[:k] = 1.0
    pi = np.empty_like(pi_sorted)
    pi[order] = pi_sorted
    return pi


def unbiased_weights(pi: object) -> np.ndarray:
    """Horvitz-Thompson multipliers ``omega = 1/pi`` (0 where ``pi == 0``; such terms are never drawn)."""
    pi = _as_vector(pi, "pi")
    omega = np.zeros_like(pi)
    np.divide(1.0, pi, out=omega, where=pi > 0)
    return omega


# --------------------------------------------------------------------------------------------------
# Collective (Theorem 3.2)
# --------------------------------------------------------------------------------------------------
def collective_weights(pi: object, clients: int) -> np.ndarray:
    """Optimal multipliers of the collective estimator for given marginals (Theorem 3.2 of spectral sharding).

    ``omega_i = C / (1 + (C - 1) pi_i)`` minimises ``(1 - omega pi)^2 + omega^2 pi (1 - pi) / C``.
    For ``C = 1`` this is ``omega = 1`` (plain truncation); as ``C`` grows it tends to ``1/pi``.
    """
    pi = _as_vector(pi, "pi")
    clients = _as_count(clients, "clients", 1, 2**62)
    return clients / (1.0 + (clients - 1) * pi)


def collective_term_discrepancy(pi: object, clients: int) -> np.ndarray:
    """Per-term residual ``E[(1 - omega* X / C)^2] = (1 - pi) / (1 + (C - 1) pi)``, ``X ~ Bin(C, pi)``."""
    pi = _as_vector(pi, "pi")
    clients = _as_count(clients, "clients", 1, 2**62)
    return (1.0 - pi) / (1.0 + (clients - 1) * pi)


def collective_inclusion(lam: object, n: int, clients: int) -> tuple[np.ndarray, np.ndarray]:
    """Optimal marginals and multipliers of the collective estimator (Theorem 3.2 / Eq. (8) of spectral sharding).

    ``C`` clients each draw ``n`` terms with the same marginals ``pi``; the server averages
    ``W_hat = (1/C) sum_c sum_{i in S_c} omega_i lam_i u_i v_i^T``. With ``X_i ~ Bin(C, pi_i)`` the number of
    clients holding term ``i``, orthogonality of the rank-one terms gives

        E||W - W_hat||_F^2 = sum_i lam_i^2 [(1 - omega_i pi_i)^2 + omega_i^2 pi_i (1 - pi_i) / C].

    * Minimising over ``omega_i``: ``omega_i* = C / (1 + (C - 1) pi_i)`` and the residual is
      ``lam_i^2 f(pi_i)`` with ``f(pi) = (1 - pi) / (1 + (C - 1) pi)``;
      ``f'(pi) = -C / (1 + (C - 1) pi)^2`` and ``f'' > 0`` for ``C > 1`` (strictly convex problem).
    * KKT for ``min sum lam_i^2 f(pi_i)`` s.t. ``sum pi = n, 0 <= pi <= 1`` with multiplier ``mu`` and
      ``nu = sqrt(C / mu)``: ``pi_i(nu) = clip((nu lam_i - 1) / (C - 1), 0, 1)`` -- terms with
      ``lam_i <= 1/nu`` are dropped, terms with ``lam_i >= C/nu`` are saturated.
    * ``g(nu) = sum_i pi_i(nu)`` is continuous, non-decreasing and piecewise linear with breakpoints
      ``1/lam_i`` and ``C/lam_i``; it is evaluated at all ``2N`` breakpoints with sorted prefix sums and
      ``g(nu) = n`` is solved exactly by linear interpolation. Cost ``O(N log N)`` (the paper's search is
      ``O(N^2 n)``).
    * ``C = 1``: ``f(pi) = 1 - pi`` is linear, so the optimum is deterministic top-``n`` with ``omega = 1``
      (the truncated SVD, expected error ``sum_{i > n} lam_(i)^2``), a *biased* estimator; ties among
      equal singular values are broken by position.

    Returns
    -------
    ``(pi, omega)`` in the caller's order, ``sum(pi) == n`` to rounding, ``omega = C / (1 + (C - 1) pi)``.
    """
    lam = _as_spectrum(lam)
    n = _as_count(n, "n", 1, lam.size)
    clients = _as_count(clients, "clients", 1, 2**62)
    trivial = _fill_when_few_positive(lam, n)
    if trivial is not None:
        return trivial, collective_weights(trivial, clients)
    if clients == 1:
        order = np.argsort(-lam, kind="stable")
        pi = np.zeros_like(lam)
        pi[order[:n]] = 1.0
        return pi, np.ones_like(lam)

    a = float(clients - 1)
    positive = lam[lam > 0]
    s = np.sort(positive)[::-1]  # decreasing
    m = s.size
    prefix = np.concatenate(([0.0], np.cumsum(s)))  # prefix[j] = sum of the j largest
    ascending = s[::-1]
    nus = np.sort(np.concatenate((1.0 / s, clients / s)))

    def g(nu: np.ndarray) -> np.ndarray:
        k_sat = m - np.searchsorted(ascending, clients / nu, side="left")  # lam * nu >= C
        k_pos = m - np.searchsorted(ascending, 1.0 / nu, side="right")  # lam * nu > 1
        k_sat = np.minimum(k_sat, k_pos)
        interior = nu * (prefix[k_pos] - prefix[k_sat]) - (k_pos - k_sat)
        return k_sat + interior / a

    values = np.maximum.accumulate(g(nus))  # monotone by theory; guard against rounding
    j = int(np.searchsorted(values, n, side="left"))  # values[j] >= n > values[j-1]
    j = min(max(j, 1), nus.size - 1)
    lo, hi = nus[j - 1], nus[j]
    glo, ghi = values[j - 1], values[j]
    nu = hi if ghi <= glo else lo + (n - glo) * (hi - lo) / (ghi - glo)
    # Exact closed form on the active segment: nu = (a (n - |K|) + |A|) / sum_A lam.
    mid = 0.5 * (lo + hi)
    sat = lam * mid >= clients
    act = (lam * mid > 1.0) & ~sat
    if act.any():
        nu = (a * (n - sat.sum()) + act.sum()) / lam[act].sum()
    pi = np.clip((nu * lam - 1.0) / a, 0.0, 1.0)
    return pi, collective_weights(pi, clients)


# --------------------------------------------------------------------------------------------------
# Schatten-p (unbiased estimator)
# --------------------------------------------------------------------------------------------------
def _schatten_term(pi: np.ndarray, p: float) -> np.ndarray:
    """``E|1 - z/pi|^p = pi^(1-p) (1-pi)^p + (1 - pi)`` for ``z ~ Bernoulli(pi)``."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        out = pi ** (1.0 - p) * (1.0 - pi) ** p + (1.0 - pi)
    return np.where(pi > 0, out, np.inf)


def schatten_discrepancy(lam: object, pi: object, p: float = 4.0) -> float:
    """``E||W - W_hat||_{S_p}^p`` of the unbiased estimator ``omega = 1/pi`` (exact, any design with marginals ``pi``).

    ``W - W_hat = sum_i lam_i (1 - z_i / pi_i) u_i v_i^T`` shares the singular vectors of ``W``, so its
    Schatten-p norm to the power ``p`` is ``sum_i lam_i^p |1 - z_i/pi_i|^p`` *exactly* (no dependence on
    ``U``, ``V``; not a surrogate), and

        E||W - W_hat||_{S_p}^p = sum_i lam_i^p [pi_i (1/pi_i - 1)^p + (1 - pi_i)]
                               = sum_i lam_i^p [pi_i^(1-p) (1 - pi_i)^p + 1 - pi_i].

    For ``p = 2`` this is ``sum lam_i^2 (1/pi_i - 1)`` (Eq. (5)); for ``p = 4``
    ``sum lam_i^4 [(1 - pi_i)^4 / pi_i^3 + 1 - pi_i]``. Terms with ``lam_i = 0`` contribute 0; a term with
    ``lam_i > 0`` and ``pi_i = 0`` makes the value ``inf``.
    """
    lam = _as_spectrum(lam)
    pi = _as_vector(pi, "pi")
    if pi.shape != lam.shape:
        raise ValueError(f"pi must have the shape of lam {lam.shape}, got {pi.shape}")
    if not (isinstance(p, numbers.Real) and p > 1):
        raise ValueError(f"p must be a real number > 1, got {p!r}")
    keep = lam > 0
    return float(np.sum(lam[keep] ** p * _schatten_term(pi[keep], float(p))))


def _schatten_marginal_slope(pi: np.ndarray, p: float) -> np.ndarray:
    """``phi(pi) = -d/dpi E|1 - z/pi|^p = pi^(-p) (1 - pi)^(p-1) (p - 1 + pi) + 1`` (decreasing, ``phi(1) = 1``)."""
    return pi ** (-p) * (1.0 - pi) ** (p - 1.0) * (p - 1.0 + pi) + 1.0


def _schatten_kkt(w: np.ndarray, n: int, p: float) -> np.ndarray:
    """Exact KKT solution of ``min sum w_i h(pi_i)`` s.t. ``sum pi = n``, ``0 < pi <= 1`` (``w > 0``).

    Stationarity: ``w_i phi(pi_i) = mu`` off the bound and ``pi_i = 1`` when ``w_i >= mu`` (``phi(1) = 1``).
    ``log(phi(pi) - 1) = -p log pi + (p - 1) log(1 - pi) + log(p - 1 + pi)`` decreases strictly from
    ``+inf`` to ``-inf`` on ``(0, 1)``, so ``pi_i(mu)`` is found by vectorised bisection on ``log pi``, and
    ``sum_i pi_i(mu) = n`` (decreasing in ``mu``) by ``brentq`` on ``log mu``.
    """

    def pi_of(log_mu: float) -> np.ndarray:
        level = log_mu - np.log(w)  # log(mu / w_i)
        out = np.ones_like(w)
        inner = level > 0
        if not inner.any():
            return out
        target = np.log(np.expm1(level[inner]))  # log(mu / w_i - 1)
        lo = np.full(target.shape, -745.0)  # log pi bounds
        hi = np.zeros(target.shape)
        for _ in range(110):
            mid = 0.5 * (lo + hi)
            x = np.exp(mid)
            val = -p * mid + (p - 1.0) * np.log1p(-np.minimum(x, 1 - 1e-16)) + np.log(p - 1.0 + x)
            above = val > target  # phi too large -> pi too small
            lo = np.where(above, mid, lo)
            hi = np.where(above, hi, mid)
        out[inner] = np.exp(0.5 * (lo + hi))
        return out

    def excess(log_mu: float) -> float:
        return float(pi_of(log_mu).sum() - n)

    lo = float(np.log(w.min()))  # every pi = 1: excess = M - n > 0
    hi = float(np.log(w.max())) + 1.0
    while excess(hi) > 0:
        hi += 2.0 * (hi - lo) + 1.0
    log_mu = optimize.brentq(excess, lo, hi, xtol=1e-15, rtol=4 * np.finfo(float).eps, maxiter=500)
    return pi_of(log_mu)


def schatten_inclusion(
    lam: object,
    n: int,
    p: float = 4.0,
    *,
    method: str = "kkt",
    tol: float = 1e-10,
    max_iter: int = 500,
) -> np.ndarray:
    """Inclusion probabilities of the unbiased estimator (``omega = 1/pi``) minimising the Schatten-p discrepancy.

    Objective (exact, not a surrogate; see :func:`schatten_discrepancy`), for ``p = 4``:

        minimise  sum_i lam_i^4 [(1 - pi_i)^4 / pi_i^3 + 1 - pi_i]   s.t.  sum(pi) = n,  0 < pi <= 1,

    and in general ``sum_i lam_i^p h(pi_i)`` with ``h(pi) = pi^(1-p) (1 - pi)^p + 1 - pi``. ``pi h``-terms
    are perspectives of convex functions, so the problem is convex and any KKT point is the optimum:
    ``lam_i^p phi(pi_i) = mu`` with ``phi = -h' = pi^(-p) (1 - pi)^(p-1) (p - 1 + pi) + 1``, and
    ``pi_i = 1`` when ``lam_i^p >= mu``. For ``p = 2``, ``phi = 1/pi^2`` and this is water-filling
    (:func:`unbiased_inclusion`).

    ``method``:
      * ``"kkt"`` (default): 1-d root find on the multiplier ``mu`` (``brentq``), each ``pi_i(mu)`` by
        vectorised bisection; ``O(N)`` per evaluation, about 50 ms for ``N = 512``.
      * ``"slsqp"``: ``scipy.optimize.minimize`` (SLSQP, bounds ``[1e-9, 1]``, analytic gradient
        ``-lam^p phi(pi)``, equality constraint) started from the Frobenius solution, on ``lam / max(lam)``
        with the objective divided by its starting value and ``ftol = tol``. Kept as an independent check;
        it is slow and fragile for large ``N`` (dense quasi-Newton QP: about 100 s for ``N = 512``, ``p = 4``,
        and "positive directional derivative" stops for some spectra). Raises ``RuntimeError`` if SLSQP
        does not report success.

    Terms with ``lam_i = 0`` get ``pi_i = 0`` (unless fewer than ``n`` terms are positive). The result is
    clipped to ``[0, 1]`` and rescaled onto ``sum(pi) = n``.
    """
    lam = _as_spectrum(lam)
    n = _as_count(n, "n", 1, lam.size)
    if not (isinstance(p, numbers.Real) and p > 1):
        raise ValueError(f"p must be a real number > 1, got {p!r}")
    if method not in ("kkt", "slsqp"):
        raise ValueError(f"method must be 'kkt' or 'slsqp', got {method!r}")
    p = float(p)
    trivial = _fill_when_few_positive(lam, n)
    if trivial is not None:
        return trivial
    positive = lam > 0  # more than n terms are positive here
    w = (lam[positive] / lam.max()) ** p
    if method == "kkt":
        x = _schatten_kkt(w, n, p)
    else:
        lower = 1e-9
        x0 = np.clip(unbiased_inclusion(lam, n)[positive], lower, 1.0)
        scale = float(np.sum(w * _schatten_term(x0, p)))
        if not np.isfinite(scale) or scale <= 0:
            scale = 1.0
        res = optimize.minimize(
            lambda x: float(np.sum(w * _schatten_term(x, p)) / scale),
            x0,
            jac=lambda x: -w * _schatten_marginal_slope(x, p) / scale,
            method="SLSQP",
            bounds=[(lower, 1.0)] * w.size,
            constraints=[{"type": "eq", "fun": lambda x: np.sum(x) - n, "jac": lambda x: np.ones_like(x)}],
            options={"ftol": tol, "maxiter": max_iter},
        )
        if not res.success:
            raise RuntimeError(f"schatten_inclusion: SLSQP failed for p={p}, n={n}: {res.message}")
        x = res.x
    x = np.clip(x, 0.0, 1.0)
    free = x < 1.0
    surplus = n - x.sum()
    if free.any() and surplus != 0.0:
        x[free] = np.clip(x[free] * (1.0 + surplus / x[free].sum()), 0.0, 1.0)
    pi = np.zeros_like(lam)
    pi[positive] = x
    return pi


# --------------------------------------------------------------------------------------------------
# PriSM and its sequential sampler
# --------------------------------------------------------------------------------------------------
def prism_probabilities(lam: object, kappa: float | None = None, r: float | None = None) -> np.ndarray:
    """PriSM's sampling distribution over principal kernels, Eq. (2) of Niu et al. (TMLR 2023).

    ``p_i = lam_i^kappa / sum_j lam_j^kappa``. It is a *per-draw* distribution (sums to 1), used with
    ``rng.choice(N, n, replace=False, p=p)``; the resulting inclusion probabilities are Wallenius'
    (:func:`wallenius_inclusion`), not ``n p``. Default ``kappa`` (when ``kappa is None``): 4 if the keep ratio
    ``r <= 0.2`` else 2.5, so ``r`` is then required.
    """
    lam = _as_spectrum(lam)
    if kappa is None:
        if r is None:
            raise ValueError("prism_probabilities needs kappa, or the keep ratio r to pick the default kappa; got neither")
        if not (isinstance(r, numbers.Real) and 0 < r <= 1):
            raise ValueError(f"r must be a keep ratio in (0, 1], got {r!r}")
        kappa = 4.0 if r <= 0.2 else 2.5
    if not (isinstance(kappa, numbers.Real) and np.isfinite(kappa) and kappa >= 0):
        raise ValueError(f"kappa must be a finite real number >= 0, got {kappa!r}")
    top = lam.max()
    if top <= 0:
        raise ValueError("lam must have at least one positive singular value, got all zeros")
    powered = (lam / top) ** float(kappa)  # kappa = 0 gives the uniform distribution (0 ** 0 = 1)
    return powered / powered.sum()


def softmax_probabilities(lam: object) -> np.ndarray:
    """The softmax-based sampling distribution of PriSM's ablation (Niu et al., TMLR 2023, Sec. 4.5, Table 5).

    ``p_i = exp(lam_i) / sum_j exp(lam_j)``: Sec. 4.5 obtains each kernel's probability by passing the singular
    values through a softmax, and states no temperature or rescaling, so the singular values enter as they are.
    Like Eq. (2) (:func:`prism_probabilities`) it is a *per-draw* distribution, used with PriSM's sequential
    draw without replacement, whose inclusion probabilities are Wallenius' (:func:`wallenius_inclusion`).

    Unlike Eq. (2), which depends only on the ratios ``lam_i / lam_j``, the softmax depends on the absolute size
    of the singular values: scaling the layer ``W -> c W`` is a softmax at temperature ``1/c``. Singular values
    spread over less than about one unit give a nearly uniform distribution (``exp(1) ~ 2.7`` is the largest
    odds ratio), a spread of several units a sharply peaked one.

    Computed as ``exp(lam_i - max(lam)) / sum_j exp(lam_j - max(lam))`` (the same value), which cannot overflow;
    a term more than about 745 below the largest gets probability 0 (its exact value is below 1e-323).
    """
    lam = _as_spectrum(lam)
    odds = np.exp(lam - lam.max())  # the largest is exp(0) = 1, so the sum is in [1, N]
    return odds / odds.sum()


def _fog_clock(w: np.ndarray, n: int) -> float:
    """``t > 0`` with ``sum_i (1 - exp(-w_i t)) = n`` (``w`` normalised, more than ``n`` positive)."""

    def excess(log_t: float) -> float:
        return float(-np.expm1(-w * math.exp(log_t)).sum() - n)

    lo, hi = math.log(n) - 1.0, math.log(n) + 1.0
    while excess(lo) > 0:
        lo -= 2.0
    while excess(hi) < 0:
        hi += 2.0
    return math.exp(optimize.brentq(excess, lo, hi, xtol=1e-14, rtol=4 * np.finfo(float).eps, maxiter=500))


def _leave_one_out_cdf(q: np.ndarray, n: int) -> np.ndarray:
    """``P(#{j != i : B_j = 1} <= n - 1)`` for independent ``B_j ~ Bernoulli(q_j)``, for every ``i``.

    Forward/backward Poisson-binomial tables truncated to counts ``< n`` (convex combinations only, so
    numerically stable); ``O(N n)``.
    """
    size = q.size
    forward = np.zeros((size + 1, n))
    forward[0, 0] = 1.0
    for k in range(size):
        forward[k + 1] = forward[k] * (1.0 - q[k])
        forward[k + 1, 1:] += forward[k, :-1] * q[k]
    backward = np.zeros((size + 1, n))
    backward[size, 0] = 1.0
    for k in range(size - 1, -1, -1):
        backward[k] = backward[k + 1] * (1.0 - q[k])
        backward[k, 1:] += backward[k + 1, :-1] * q[k]
    backward_cdf = np.cumsum(backward, axis=1)
    return np.sum(forward[:-1] * backward_cdf[1:, ::-1], axis=1)


def wallenius_inclusion(weights: object, n: int, *, method: str = "fog") -> np.ndarray:
    """Inclusion probabilities of sequential sampling ∝ ``weights`` (``rng.choice(replace=False, p=w)``).

    These are the means of the multivariate Wallenius noncentral hypergeometric distribution with one ball
    per colour. Exponential-clock representation: item ``i`` rings at ``T_i ~ Exp(w_i)`` independently and
    the sample is the first ``n`` to ring, so with ``q_j(t) = 1 - exp(-w_j t)``

        pi_i = int_0^inf w_i exp(-w_i t) P(#{j != i : T_j < t} <= n - 1) dt.

    ``method``:
      * ``"fog"`` (default): Fog's approximation (Fog 2008, "Calculation methods for Wallenius' noncentral
        hypergeometric distribution") replaces the random ``n``-th ringing time by the deterministic ``t``
        solving ``sum_i (1 - exp(-w_i t)) = n`` (``brentq`` on ``log t``): ``pi_i = 1 - exp(-w_i t)``.
        ``O(N)``. Measured against ``"exact"``: absolute error about 0.1 for ``N = 7``, 0.016 for ``N = 40``,
        ``n = 10`` and 0.0025 for ``N = 512``, ``n = 52`` (PriSM weights, ``kappa`` in {2.5, 4}).
      * ``"exact"``: the integral above with ``scipy.integrate.quad_vec`` (relative tolerance 1e-10, after
        ``t = t_fog x / (1 - x)``) and Poisson-binomial leave-one-out tables; ``O(N n)`` per node, a few
        hundred nodes (about 1 s for ``N = 512``); agrees with enumeration of ordered draws to 1e-14.

    ``weights`` need not be normalised; at least ``n`` of them must be positive (as ``numpy`` requires).
    """
    w = _as_spectrum(weights, "weights")
    n = _as_count(n, "n", 1, w.size)
    if method not in ("fog", "exact"):
        raise ValueError(f"method must be 'fog' or 'exact', got {method!r}")
    positive = w > 0
    m = int(positive.sum())
    if m < n:
        raise ValueError(f"weights must have at least n={n} positive entries, got {m}")
    if m == n:
        return positive.astype(np.float64)
    w = w / w.sum()
    clock = _fog_clock(w, n)
    if method == "fog":
        return -np.expm1(-w * clock)

    from scipy.integrate import quad_vec

    wp = w[positive]

    def integrand(x: float) -> np.ndarray:
        # t = clock * x / (1 - x) maps [0, 1) onto [0, inf); dt = clock / (1 - x)^2 dx
        if x >= 1.0:
            return np.zeros_like(wp)
        t = clock * x / (1.0 - x)
        q = -np.expm1(-wp * t)
        return wp * np.exp(-wp * t) * _leave_one_out_cdf(q, n) * clock / (1.0 - x) ** 2

    value, _ = quad_vec(integrand, 0.0, 1.0, epsabs=1e-13, epsrel=1e-10, norm="max", points=[0.5])
    pi = np.zeros_like(w)
    pi[positive] = np.clip(value, 0.0, 1.0)
    return pi


# --------------------------------------------------------------------------------------------------
# Discrepancy
# --------------------------------------------------------------------------------------------------
def _check_design(lam: object, pi: object, omega: object, clients: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    lam = _as_spectrum(lam)
    pi = _as_vector(pi, "pi")
    omega = _as_vector(omega, "omega")
    if pi.shape != lam.shape or omega.shape != lam.shape:
        raise ValueError(f"pi and omega must have the shape of lam {lam.shape}, got {pi.shape} and {omega.shape}")
    if np.any((pi < 0) | (pi > 1)):
        raise ValueError(f"pi must lie in [0, 1], got values in [{pi.min()}, {pi.max()}]")
    clients = _as_count(clients, "clients", 1, 2**62)
    return lam, pi, omega, clients


def expected_discrepancy(lam: object, pi: object, omega: object, clients: int = 1) -> float:
    """Closed-form ``E||W - W_hat||_F^2`` for marginals ``pi`` and multipliers ``omega`` (spectral sharding §3).

    ``W_hat = (1/C) sum_c sum_{i in S_c} omega_i lam_i u_i v_i^T`` with ``C`` independent clients using the
    same design. The rank-one terms are Frobenius-orthogonal and ``X_i = #{c : i in S_c} ~ Bin(C, pi_i)``,
    so the value depends only on the marginals:

        sum_i lam_i^2 [(1 - omega_i pi_i)^2 + omega_i^2 pi_i (1 - pi_i) / C].

    ``C = 1, omega = 1/pi`` gives Eq. (5), ``sum lam_i^2 (1/pi_i - 1)``.
    """
    lam, pi, omega, clients = _check_design(lam, pi, omega, clients)
    per_term = (1.0 - omega * pi) ** 2 + omega**2 * pi * (1.0 - pi) / clients
    return float(np.sum(lam**2 * per_term))


def monte_carlo_discrepancy(
    lam: object,
    pi: object,
    omega: object,
    sampler: Callable[[np.ndarray, np.random.Generator], np.ndarray],
    rng: np.random.Generator,
    draws: int,
    clients: int = 1,
) -> float:
    """Monte-Carlo estimate of ``E||W - W_hat||_F^2`` to check :func:`expected_discrepancy`.

    Each of ``draws`` repetitions draws ``clients`` independent samples ``sampler(pi, rng)`` (index arrays)
    and evaluates ``||W - W_hat||_F^2 = sum_i lam_i^2 (1 - omega_i X_i / C)^2`` (exact by orthogonality of
    ``u_i v_i^T``; ``X_i`` counts the clients that drew term ``i``). Returns the mean over draws.
    """
    lam, pi, omega, clients = _check_design(lam, pi, omega, clients)
    draws = _as_count(draws, "draws", 1, 2**62)
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    lam2 = lam**2
    total = 0.0
    counts = np.zeros(lam.size, dtype=np.float64)
    for _ in range(draws):
        counts[:] = 0.0
        for _ in range(clients):
            np.add.at(counts, np.asarray(sampler(pi, rng), dtype=np.int64), 1.0)
        total += float(np.sum(lam2 * (1.0 - omega * counts / clients) ** 2))
    return total / draws
