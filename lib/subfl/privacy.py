"""Differential-privacy accounting: Rényi DP of the sampled Gaussian mechanism.

The *sampled Gaussian mechanism* (SGM) with sampling rate ``q`` and noise multiplier ``σ`` releases
``f(S) + N(0, σ²Δ²I)``, where ``S`` is a Poisson sample of the data (each record kept with probability ``q``) and
``f`` has L2 sensitivity ``Δ`` under adding / removing one record. DP-SGD (Abadi et al., CCS 2016) is ``T``
compositions of it (``f`` = the sum of per-example gradients clipped to ``C``, ``Δ = C``). Its Rényi DP at order
``α`` (Mironov, Talwar & Zhang, "Rényi Differential Privacy of the Sampled Gaussian Mechanism", 2019, Sec. 3.3)
is ``ε(α) = log(A_α) / (α − 1)`` per step, composed additively over steps, with

* integer ``α`` (their Eq. for integer orders; exact)::

      A_α = Σ_{k=0}^{α} C(α, k) (1 − q)^{α−k} q^k exp((k² − k) / (2σ²))

* fractional ``α``: ``A_α = A_{α,0} + A_{α,1}``, the two convergent series of Sec. 3.3 with
  ``z₀ = σ² log(1/q − 1) + 1/2``, summed until their terms fall below ``e^{-30}``.

``q = 1`` gives the Gaussian mechanism, ``ε(α) = α / (2σ²)``; ``q = 0`` gives 0.

Conversion to (ε, δ)-DP, minimised over the orders:

* ``"improved"`` (default; Balle et al., AISTATS 2020, Thm. 21 / Canonne, Kamath & Steinke 2020 — what Opacus and
  TF-Privacy use): ``ε = ε(α) + log((α − 1)/α) − (log δ + log α) / (α − 1)``;
* ``"classic"`` (Mironov, CSF 2017, Prop. 3; Abadi et al.'s moments accountant): ``ε = ε(α) + log(1/δ) / (α − 1)``.

Default orders :data:`DEFAULT_ORDERS` are Opacus's RDP accountant's (``1.1, 1.2, …, 10.9, 12, …, 63``).

Why not a library: Opacus (whose RDP analysis is the same computation) is not a dependency of this package; the
tests compare these functions with Opacus 1.6.0's values (hard-coded, and live when ``opacus`` is importable) and
with the published examples of Abadi et al. / TF-Privacy.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

import numpy as np
from scipy import special

DEFAULT_ORDERS: tuple[float, ...] = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))
"""RDP orders used unless told otherwise (those of Opacus's ``RDPAccountant``)."""

CONVERSIONS = ("improved", "classic")


def _log_add(a: float, b: float) -> float:
    """log(e^a + e^b)."""
    hi, lo = max(a, b), min(a, b)
    if hi == -math.inf:
        return -math.inf
    return hi + math.log1p(math.exp(lo - hi))


def _log_sub(a: float, b: float) -> float:
    """log(e^a − e^b) for a ≥ b."""
    if b == -math.inf:
        return a
    if b > a:
        raise ValueError(f"_log_sub needs a >= b, got a={a}, b={b}")
    if a == b:
        return -math.inf
    return a + math.log1p(-math.exp(b - a))


def _log_erfc(x: float) -> float:
    """log(erfc(x)), stable for large x (erfc(x) = 2Φ(−x√2))."""
    return math.log(2.0) + float(special.log_ndtr(-x * math.sqrt(2.0)))


def _log_a_integer(q: float, sigma: float, alpha: int) -> float:
    """log A_α for integer α (finite sum, in log space)."""
    log_q, log_1mq = math.log(q), math.log1p(-q)
    total = -math.inf
    for k in range(alpha + 1):
        log_binom = math.lgamma(alpha + 1) - math.lgamma(k + 1) - math.lgamma(alpha - k + 1)
        term = log_binom + k * log_q + (alpha - k) * log_1mq + (k * k - k) / (2.0 * sigma ** 2)
        total = _log_add(total, term)
    return total


def _log_a_fractional(q: float, sigma: float, alpha: float) -> float:
    """log A_α for fractional α: the two series A_{α,0}, A_{α,1} of Mironov et al. (2019), Sec. 3.3."""
    log_a0, log_a1 = -math.inf, -math.inf
    z0 = sigma ** 2 * math.log(1.0 / q - 1.0) + 0.5
    log_q, log_1mq = math.log(q), math.log1p(-q)
    i = 0
    while True:
        coef = special.binom(alpha, i)
        log_coef = math.log(abs(coef))
        j = alpha - i
        log_t0 = log_coef + i * log_q + j * log_1mq
        log_t1 = log_coef + j * log_q + i * log_1mq
        log_e0 = math.log(0.5) + _log_erfc((i - z0) / (math.sqrt(2.0) * sigma))
        log_e1 = math.log(0.5) + _log_erfc((z0 - j) / (math.sqrt(2.0) * sigma))
        log_s0 = log_t0 + (i * i - i) / (2.0 * sigma ** 2) + log_e0
        log_s1 = log_t1 + (j * j - j) / (2.0 * sigma ** 2) + log_e1
        if coef > 0:
            log_a0, log_a1 = _log_add(log_a0, log_s0), _log_add(log_a1, log_s1)
        else:
            log_a0, log_a1 = _log_sub(log_a0, log_s0), _log_sub(log_a1, log_s1)
        i += 1
        if max(log_s0, log_s1) < -30 or i > 100_000:
            break
    return _log_add(log_a0, log_a1)


def _rdp_one(q: float, sigma: float, alpha: float) -> float:
    if q == 0:
        return 0.0
    if sigma == 0:
        return math.inf
    if q == 1.0:
        return alpha / (2.0 * sigma ** 2)
    if math.isinf(alpha):
        return math.inf
    if float(alpha).is_integer():
        log_a = _log_a_integer(q, sigma, int(alpha))
    else:
        log_a = _log_a_fractional(q, sigma, float(alpha))
    return log_a / (alpha - 1.0)


def _check(noise_multiplier: float, sample_rate: float, orders: Sequence[float]) -> tuple[float, ...]:
    if not (isinstance(noise_multiplier, (int, float, np.floating)) and noise_multiplier >= 0
            and math.isfinite(noise_multiplier)):
        raise ValueError(f"noise_multiplier must be a finite number >= 0, got {noise_multiplier!r}")
    if not (isinstance(sample_rate, (int, float, np.floating)) and 0.0 <= sample_rate <= 1.0):
        raise ValueError(f"sample_rate must be a number in [0, 1], got {sample_rate!r}")
    orders = tuple(float(a) for a in np.atleast_1d(np.asarray(orders, dtype=float)))
    if not orders or any(not a > 1.0 for a in orders):
        raise ValueError(f"orders must be a non-empty sequence of numbers > 1, got {orders!r}")
    return orders


@lru_cache(maxsize=256)
def _rdp_cached(noise_multiplier: float, sample_rate: float, orders: tuple[float, ...]) -> tuple[float, ...]:
    return tuple(_rdp_one(sample_rate, noise_multiplier, a) for a in orders)


def rdp_sampled_gaussian(noise_multiplier: float, sample_rate: float,
                         orders: Sequence[float] = DEFAULT_ORDERS) -> np.ndarray:
    """RDP ``ε(α)`` of *one* step of the sampled Gaussian mechanism at each order (Mironov et al. 2019, Sec. 3.3).

    ``noise_multiplier`` σ: the noise standard deviation divided by the sensitivity; ``sample_rate`` q: the Poisson
    sampling probability. ``σ = 0`` gives ``inf``.
    """
    orders = _check(noise_multiplier, sample_rate, orders)
    return np.array(_rdp_cached(float(noise_multiplier), float(sample_rate), orders))


def compute_rdp(noise_multiplier: float, sample_rate: float, steps: int,
                orders: Sequence[float] = DEFAULT_ORDERS) -> np.ndarray:
    """RDP of ``steps`` compositions of the sampled Gaussian mechanism: ``steps · ε(α)`` at each order."""
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 0:
        raise ValueError(f"steps must be a non-negative int, got {steps!r}")
    return int(steps) * rdp_sampled_gaussian(noise_multiplier, sample_rate, orders)


def privacy_spent(rdp: Sequence[float], orders: Sequence[float], delta: float,
                  conversion: str = "improved") -> tuple[float, float]:
    """The smallest ε (over ``orders``) such that RDP ``rdp`` implies (ε, δ)-DP, and the order attaining it.

    ``conversion``: ``"improved"`` (Balle et al. 2020, default) or ``"classic"`` (Mironov 2017); see the module
    docstring. ε is clamped at 0.
    """
    if conversion not in CONVERSIONS:
        raise ValueError(f"conversion must be one of {CONVERSIONS}, got {conversion!r}")
    if not 0.0 < float(delta) < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    a = np.atleast_1d(np.asarray(orders, dtype=float))
    r = np.atleast_1d(np.asarray(rdp, dtype=float))
    if a.shape != r.shape:
        raise ValueError(f"orders and rdp must have the same length, got {a.size} and {r.size}")
    if np.any(a <= 1):
        raise ValueError("orders must be > 1")
    with np.errstate(invalid="ignore", over="ignore"):
        if conversion == "classic":
            eps = r + math.log(1.0 / delta) / (a - 1.0)
        else:
            eps = r + np.log((a - 1.0) / a) - (math.log(delta) + np.log(a)) / (a - 1.0)
    eps = np.where(np.isnan(eps), np.inf, eps)
    best = int(np.argmin(eps))
    return max(0.0, float(eps[best])), float(a[best])


def epsilon(noise_multiplier: float, sample_rate: float, steps: int, delta: float,
            orders: Sequence[float] = DEFAULT_ORDERS, conversion: str = "improved") -> float:
    """ε of ``steps`` steps of the sampled Gaussian mechanism (noise multiplier σ, sampling rate q) at ``delta``.

    >>> round(epsilon(4.0, 0.01, 10_000, 1e-5, orders=range(2, 33), conversion="classic"), 4)  # Abadi et al.
    1.2586
    """
    return privacy_spent(compute_rdp(noise_multiplier, sample_rate, steps, orders), orders, delta, conversion)[0]


class RDPAccountant:
    """Accumulates the RDP of heterogeneous steps (different σ, q) and converts it to (ε, δ) on demand."""

    def __init__(self, orders: Sequence[float] = DEFAULT_ORDERS) -> None:
        self.orders = tuple(float(a) for a in orders)
        self.rdp = np.zeros(len(self.orders))

    def step(self, noise_multiplier: float, sample_rate: float, steps: int = 1) -> None:
        """Record ``steps`` steps of the sampled Gaussian mechanism."""
        self.rdp = self.rdp + compute_rdp(noise_multiplier, sample_rate, steps, self.orders)

    def epsilon(self, delta: float, conversion: str = "improved") -> float:
        """ε at ``delta`` of everything recorded (0 if nothing was)."""
        return privacy_spent(self.rdp, self.orders, delta, conversion)[0] if self.rdp.any() else 0.0


__all__ = ["CONVERSIONS", "DEFAULT_ORDERS", "RDPAccountant", "compute_rdp", "epsilon", "privacy_spent",
           "rdp_sampled_gaussian"]
