"""Fixed-size without-replacement samplers with prescribed inclusion probabilities.

Every ``sample_*(pi, rng)`` takes marginals ``pi`` (1-D, each in ``[0, 1]``, summing to an integer ``n``
within 1e-6) and a ``numpy.random.Generator`` and returns the sorted ``int64`` array of exactly ``n``
distinct indices; the probability that index ``i`` is returned is exactly ``pi_i``. Items with
``pi_i = 1`` are always returned and items with ``pi_i = 0`` never. ("Exactly" up to two conventions:
entries within 1e-12 of 0 or 1 are treated as 0 or 1, and the random entries are rescaled by at most the
1e-6 sum tolerance so that they add up to an integer; CPS is calibrated to 1e-10.)

Designs (references to Tillé, *Sampling Algorithms*, Springer 2006):

* :func:`sample_cps` / :func:`cps_design` -- conditional Poisson sampling (maximum entropy design, ch. 5):
  calibrated working odds, then the exact sequential (list-sequential) draw of Chen, Dempster & Liu (1994).
* :func:`sample_brewer` -- Brewer's draw-by-draw method (Brewer 1963/1975; Tillé ch. 6, splitting methods).
* :func:`sample_min_support` -- the minimum-support splitting design (Deville & Tillé 1998; Tillé ch. 6).
* :func:`sample_numpy_choice` -- ``rng.choice(N, n, replace=False, p=w / sum(w))``: PriSM's sampler. It takes
  *weights*, and its marginals are Wallenius' (:func:`subfl.sampling.inclusion.wallenius_inclusion`).
"""
from __future__ import annotations

from collections.abc import Iterator

from dataclasses import dataclass, field

import numpy as np
from scipy.special import logsumexp

from .inclusion import _as_count, _as_spectrum, _as_vector

__all__ = [
    "CPSDesign",
    "cps_design",
    "sample_cps",
    "sample_brewer",
    "sample_min_support",
    "sample_numpy_choice",
]

_SUM_TOL = 1e-6  # |sum(pi) - n| accepted
_BOUND_TOL = 1e-12  # pi within this of 0 / 1 is treated as 0 / 1


def _check_rng(rng: object) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    return rng


def _split_inclusion(pi: object) -> tuple[np.ndarray, int, np.ndarray, np.ndarray, np.ndarray]:
    """Validate marginals and split them into certain, impossible and random items.

    Returns ``(pi, n, certain, candidates, targets)``: ``certain`` are the indices with ``pi = 1``,
    ``candidates`` the indices with ``0 < pi < 1`` and ``targets`` their marginals rescaled to sum to
    ``n - len(certain)`` exactly (a correction of at most 1e-6 in total).
    """
    arr = _as_vector(pi, "pi", allow_empty=True)
    if np.any((arr < -_BOUND_TOL) | (arr > 1 + _BOUND_TOL)):
        idx = int(np.flatnonzero((arr < -_BOUND_TOL) | (arr > 1 + _BOUND_TOL))[0])
        raise ValueError(f"pi must lie in [0, 1], got pi[{idx}]={arr[idx]}")
    total = float(arr.sum())
    n = int(round(total))
    if abs(total - n) > _SUM_TOL:
        raise ValueError(f"pi must sum to an integer (within {_SUM_TOL}), got sum(pi)={total!r}")
    certain = np.flatnonzero(arr >= 1 - _BOUND_TOL)
    candidates = np.flatnonzero((arr > _BOUND_TOL) & (arr < 1 - _BOUND_TOL))
    remaining = n - certain.size
    targets = arr[candidates]
    if candidates.size:
        if not 0 <= remaining <= candidates.size:
            raise ValueError(f"pi has {certain.size} entries equal to 1 but sums to {total!r}")
        if remaining == 0:
            candidates, targets = candidates[:0], targets[:0]
        else:
            targets = targets * (remaining / targets.sum())
            if np.any(targets >= 1):  # only possible through the 1e-6 rescaling
                targets = np.minimum(targets, 1 - 1e-12)
                targets = targets * (remaining / targets.sum())
    elif remaining != 0:
        raise ValueError(f"pi has {certain.size} entries equal to 1 but sums to {total!r}")
    return arr, n, certain, candidates, targets


def _finish(certain: np.ndarray, chosen: np.ndarray) -> np.ndarray:
    out = np.concatenate((certain.astype(np.int64), np.asarray(chosen, dtype=np.int64)))
    out.sort()
    return out


# --------------------------------------------------------------------------------------------------
# Conditional Poisson sampling
# --------------------------------------------------------------------------------------------------
def _backward_log_esp(theta: np.ndarray, size: int) -> np.ndarray:
    """``B[k, j] = log e_j(w_k, ..., w_{M-1})`` for ``k = 0..M``, ``j = 0..size`` (``w = exp(theta)``).

    Elementary symmetric polynomials in log space (Chen, Dempster & Liu 1994): column ``j`` is the reverse
    cumulative log-sum-exp of ``theta_l + B[l + 1, j - 1]``; ``size`` vectorised steps of length ``M``.
    """
    m = theta.size
    table = np.full((m + 1, size + 1), -np.inf)
    table[:, 0] = 0.0
    for j in range(1, size + 1):
        terms = theta + table[1:, j - 1]
        table[:m, j] = np.logaddexp.accumulate(terms[::-1])[::-1]
    return table


def _forward_log_esp(theta: np.ndarray, size: int) -> np.ndarray:
    """``F[k, j] = log e_j(w_0, ..., w_{k-1})`` for ``k = 0..M``, ``j = 0..size``."""
    m = theta.size
    table = np.full((m + 1, size + 1), -np.inf)
    table[:, 0] = 0.0
    for j in range(1, size + 1):
        terms = theta + table[:m, j - 1]
        table[1:, j] = np.logaddexp.accumulate(terms)
    return table


def _cps_inclusion(theta: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact inclusion probabilities of CPS with log-odds ``theta`` and sample size ``size``.

    ``pi_i = w_i e_{n-1}(w without i) / e_n(w)`` (Tillé 2006, ch. 5), with the
    leave-one-out polynomial obtained stably as ``sum_j F[i, j] B[i + 1, n - 1 - j]``. Returns
    ``(pi, B)``; ``B`` is reused for the sequential draw.
    """
    back = _backward_log_esp(theta, size)
    fwd = _forward_log_esp(theta, size - 1)
    j = np.arange(size)
    # leave-one-out log e_{n-1}(w_{-i}) = logsumexp_j F[i, j] + B[i+1, n-1-j]
    loo = logsumexp(fwd[:-1, j] + back[1:, size - 1 - j], axis=1)
    pi = np.exp(theta + loo - back[0, size])
    return pi, back


def _logit(x: np.ndarray) -> np.ndarray:
    x = np.clip(x, 1e-300, 1 - 1e-16)
    return np.log(x) - np.log1p(-x)


def _calibrate_cps(
    target: np.ndarray, size: int, tol: float, max_iter: int, memory: int = 8
) -> tuple[np.ndarray, np.ndarray, int, float]:
    """Log-odds ``theta`` (mean 0) of the CPS design of size ``size`` whose marginals are ``target``.

    Fixed point ``theta <- theta + logit(target) - logit(pi_CPS(theta))`` (Chen, Dempster & Liu 1994, in
    logit form), accelerated with Anderson mixing (memory ``memory``; Walker & Ni 2011). The plain map
    converges fast when the Hájek approximation is good (many items with ``pi`` away from 0 and 1) but
    slowly, or not at all (``M = 2``: it oscillates), when few items carry the randomness; Anderson mixing
    converges in a few steps in both regimes. Safeguard: a step that does not decrease
    ``||pi_CPS - target||_2`` is replaced by a halved plain step and the history is cleared.
    Returns ``(theta, backward table, iterations, max error)``.
    """
    logit_target = _logit(target)
    theta = logit_target - logit_target.mean()
    current, back = _cps_inclusion(theta, size)
    resid = logit_target - _logit(current)
    norm = float(np.linalg.norm(current - target))
    error = float(np.max(np.abs(current - target)))
    d_theta: list[np.ndarray] = []
    d_resid: list[np.ndarray] = []
    iterations = 0
    while error >= tol:
        if iterations >= max_iter:
            raise RuntimeError(
                f"cps_design: calibration did not reach tol={tol} in {max_iter} iterations (error {error:.3g})"
            )
        iterations += 1
        if d_resid:
            big_r = np.column_stack(d_resid)
            gamma = np.linalg.lstsq(big_r, resid, rcond=None)[0]
            trial = theta + resid - (np.column_stack(d_theta) + big_r) @ gamma
        else:
            trial = theta + resid
        trial -= trial.mean()
        trial_pi, trial_back = _cps_inclusion(trial, size)
        trial_norm = float(np.linalg.norm(trial_pi - target))
        if not trial_norm < norm:  # safeguard: damped plain step, forget the history
            d_theta.clear()
            d_resid.clear()
            step = 0.5
            while True:
                trial = theta + step * resid
                trial -= trial.mean()
                trial_pi, trial_back = _cps_inclusion(trial, size)
                trial_norm = float(np.linalg.norm(trial_pi - target))
                if trial_norm < norm or step < 2.0**-40:
                    break
                step *= 0.5
        trial_resid = logit_target - _logit(trial_pi)
        d_theta.append(trial - theta)
        d_resid.append(trial_resid - resid)
        if len(d_resid) > memory:
            d_theta.pop(0)
            d_resid.pop(0)
        theta, current, back, resid, norm = trial, trial_pi, trial_back, trial_resid, trial_norm
        error = float(np.max(np.abs(current - target)))
    return theta, back, iterations, error


@dataclass(frozen=True, eq=False)
class CPSDesign:
    """A calibrated conditional Poisson (maximum entropy) design; draw with :meth:`sample`.

    ``P(S) ∝ prod_{i in S} w_i`` over samples of size ``n`` (Tillé 2006, ch. 5), with working odds ``w``
    calibrated so that the inclusion probabilities equal the requested ``pi``. Build with :func:`cps_design`.

    Attributes
    ----------
    pi: the requested marginals (validated).
    size: ``n``.
    working_probabilities: Poisson probabilities ``p~ = w / (1 + w)`` of the random items (``nan`` for
        items with ``pi`` in ``{0, 1}``), normalised so that their log-odds have mean 0.
    iterations: calibration iterations used.
    max_error: ``max |pi_CPS(w) - pi|`` at the end of calibration.
    """

    pi: np.ndarray
    size: int
    working_probabilities: np.ndarray
    iterations: int
    max_error: float
    _certain: np.ndarray = field(repr=False)
    _candidates: np.ndarray = field(repr=False)
    _complement: bool = field(repr=False)
    _draw_size: int = field(repr=False)
    _theta: np.ndarray = field(repr=False)  # log-odds of the drawn design (of the complement if _complement)
    _select: list = field(repr=False)  # _select[k][j]: P(take item k | j still to take from k..M-1)

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        """One exact CPS sample: sorted ``int64`` indices, exactly ``size`` of them.

        List-sequential method (Chen, Dempster & Liu 1994; Tillé 2006, ch. 5): item ``k`` is taken
        with probability ``w_k e_{j-1}(w_{k+1..}) / e_j(w_{k..})`` where ``j`` items are still to be taken.
        When more than half of the random items are to be taken, the complement is drawn (CPS of the
        complement has odds ``1/w``), so the loop is over at most ``M`` items and ``min(n, M - n)`` tables.
        """
        _check_rng(rng)
        m = self._candidates.size
        j = self._draw_size
        if m == 0 or j == 0:
            picked_local: list[int] = []
        else:
            u = rng.random(m).tolist()
            select = self._select
            picked_local = []
            for k in range(m):
                if m - k == j:
                    picked_local.extend(range(k, m))
                    break
                if u[k] < select[k][j]:
                    picked_local.append(k)
                    j -= 1
                    if j == 0:
                        break
        local = np.asarray(picked_local, dtype=np.int64)
        if self._complement:
            mask = np.ones(m, dtype=bool)
            mask[local] = False
            local = np.flatnonzero(mask)
        return _finish(self._certain, self._candidates[local])

    def inclusion_probabilities(self) -> np.ndarray:
        """Exact inclusion probabilities of the calibrated design (for checking; ``O(N n)``)."""
        out = np.zeros_like(self.pi)
        out[self._certain] = 1.0
        if self._candidates.size:
            if self._draw_size:
                local, _ = _cps_inclusion(self._theta, self._draw_size)
            else:
                local = np.zeros(self._candidates.size)
            out[self._candidates] = 1.0 - local if self._complement else local
        return out


def cps_design(pi: object, *, tol: float = 1e-10, max_iter: int = 200) -> CPSDesign:
    """Calibrate a conditional Poisson design with inclusion probabilities ``pi``.

    Calibration (Tillé 2006, ch. 5; Chen, Dempster & Liu 1994): start from the Poisson log-odds
    ``theta = logit(pi)`` and iterate ``theta <- theta + logit(pi) - logit(pi_CPS(theta))`` with Anderson
    acceleration (see ``_calibrate_cps``) until ``max |pi_CPS(theta) - pi| < tol``, where ``pi_CPS`` is
    computed exactly from elementary symmetric polynomials in log space (``O(M min(n, M - n))`` per
    iteration, ``M`` the number of items with ``0 < pi < 1``). Any ``pi`` in ``(0, 1)^M`` with integer sum
    is attainable by CPS. The backward table of the last iteration becomes the selection table of
    :meth:`CPSDesign.sample`.

    Raises ``RuntimeError`` if ``tol`` is not reached within ``max_iter`` iterations.
    """
    arr, n, certain, candidates, targets = _split_inclusion(pi)
    m = candidates.size
    size = n - certain.size
    working = np.full(arr.shape, np.nan)
    if m == 0 or size == 0:
        return CPSDesign(arr, n, working, 0, 0.0, certain, candidates[:0], False, 0, np.zeros(0), [])
    complement = size > m - size
    target = 1.0 - targets if complement else targets
    draw_size = m - size if complement else size
    theta, back, iterations, error = _calibrate_cps(target, draw_size, tol, max_iter)
    # selection table: P(take k | j to take among k..M-1) = w_k e_{j-1}(k+1..) / e_j(k..)
    with np.errstate(invalid="ignore"):
        select = np.exp(theta[:, None] + back[1:, :-1] - back[:-1, 1:])
    select = np.nan_to_num(select, nan=1.0)
    select = np.concatenate((np.zeros((m, 1)), np.minimum(select, 1.0)), axis=1)
    odds_theta = -theta if complement else theta
    working[candidates] = 1.0 / (1.0 + np.exp(-odds_theta))
    return CPSDesign(
        arr, n, working, iterations, error, certain, candidates, complement, draw_size, theta, select.tolist()
    )


def sample_cps(pi: object, rng: np.random.Generator) -> np.ndarray:
    """One conditional Poisson (maximum entropy) sample with inclusion probabilities ``pi``.

    Calibrates a :func:`cps_design` on every call; to draw repeatedly from the same ``pi`` build the
    design once and call :meth:`CPSDesign.sample`.
    """
    _check_rng(rng)
    return cps_design(pi).sample(rng)


# --------------------------------------------------------------------------------------------------
# Brewer
# --------------------------------------------------------------------------------------------------
def sample_brewer(pi: object, rng: np.random.Generator) -> np.ndarray:
    """Brewer's draw-by-draw method (Brewer 1963, 1975; Tillé 2006, ch. 6).

    ``n`` draws among the random items; at draw ``i = 1..n`` an unselected item ``k`` is chosen with
    probability proportional to

        pi_k (r - pi_k) / (r - pi_k (n - i + 1)),   r = n - sum_{selected} pi_l = sum_{unselected} pi_l,

    which gives inclusion probabilities exactly ``pi`` (Brewer 1975). Cost ``O(n M)``.
    """
    _check_rng(rng)
    _, _, certain, candidates, targets = _split_inclusion(pi)
    size = int(round(targets.sum())) if candidates.size else 0
    if size == 0:
        return _finish(certain, candidates[:0])
    available = np.ones(candidates.size, dtype=bool)
    picked = np.empty(size, dtype=np.int64)
    u = rng.random(size)
    for i in range(1, size + 1):
        weight = brewer_step_weights(targets, available, size - i + 1)
        cum = np.cumsum(weight)
        k = int(np.searchsorted(cum, u[i - 1] * cum[-1], side="right"))
        k = min(k, candidates.size - 1)
        while not available[k] or weight[k] == 0:  # guard against rounding at the top end
            k -= 1
        available[k] = False
        picked[i - 1] = k
    return _finish(certain, candidates[picked])


# --------------------------------------------------------------------------------------------------
# Minimum support
# --------------------------------------------------------------------------------------------------
def sample_min_support(pi: object, rng: np.random.Generator) -> np.ndarray:
    """Minimum-support design by splitting (Deville & Tillé 1998; Tillé 2006, ch. 6).

    While some ``pi`` is non-integer: with ``A`` the non-integer items, ``n_A = sum_A pi`` and ``B`` the
    ``n_A`` items of ``A`` with the largest ``pi``, set
    ``alpha = min(min_B pi, 1 - max_{A \\ B} pi)`` and write ``pi = alpha v + (1 - alpha) pi'`` with
    ``v = 1_B`` on ``A``. With probability ``alpha`` the sample is ``B`` (plus the items already at 1);
    otherwise continue from ``pi' = (pi - alpha v) / (1 - alpha)``, which has at least one more integer
    component. At most ``M`` steps, so the design has at most ``M`` samples in its support; the expected
    inclusion vector is preserved at every split, hence the marginals are exactly ``pi``.
    """
    _check_rng(rng)
    _, _, certain, candidates, _ = _split_inclusion(pi)
    for alpha, stop in min_support_splits(pi):
        if alpha >= 1.0 or rng.random() < alpha:  # the last split (alpha = 1) draws nothing
            return _finish(certain, candidates[stop])
    raise AssertionError("min_support_splits ends with a split of weight 1")


def brewer_step_weights(targets: np.ndarray, available: np.ndarray, steps_left: int) -> np.ndarray:
    """Brewer's unnormalised weights of the items still ``available`` at a draw with ``steps_left`` draws to go
    (:func:`sample_brewer`); the last draw, or one where the formula gives no positive weight, is proportional to
    ``pi`` (the formula's limit)."""
    rest = float(targets[available].sum())
    with np.errstate(divide="ignore", invalid="ignore"):
        weight = targets * (rest - targets) / (rest - targets * steps_left)
    weight = np.where(available & np.isfinite(weight), np.maximum(weight, 0.0), 0.0)
    if steps_left == 1 or not np.any(weight > 0):
        weight = np.where(available, targets, 0.0)
    return weight


def min_support_splits(pi: object) -> Iterator[tuple[float, np.ndarray]]:
    """The splitting steps of :func:`sample_min_support`: ``(alpha, stop)`` per step, ``stop`` the mask over the
    non-certain candidates of the sample taken when the step stops (with probability ``alpha`` given that no earlier
    step stopped); the last step has ``alpha = 1``. The design's law is therefore ``P(stop_k) = alpha_k ·
    prod_{j<k} (1 - alpha_j)`` (:func:`subfl.sampling.analysis.joint_law` enumerates it)."""
    _, _, _, _, targets = _split_inclusion(pi)
    q = targets.astype(np.float64).copy()
    active = np.ones(q.size, dtype=bool)
    while True:
        idx = np.flatnonzero(active)
        if idx.size == 0:
            break
        size = int(round(q[idx].sum()))
        if size == 0:
            q[idx] = 0.0
            break
        if size == idx.size:
            q[idx] = 1.0
            break
        order = idx[np.argsort(-q[idx], kind="stable")]
        big, small = order[:size], order[size:]
        low_big = int(big[np.argmin(q[big])])
        high_small = int(small[np.argmax(q[small])])
        from_big, from_small = q[low_big], 1.0 - q[high_small]
        alpha = min(from_big, from_small)
        stop = q.copy()
        stop[big], stop[small] = 1.0, 0.0
        yield float(alpha), stop >= 0.5
        q[big] = (q[big] - alpha) / (1.0 - alpha)
        q[small] = q[small] / (1.0 - alpha)
        # the component(s) that set alpha reach their bound exactly; snap them (guarantees progress)
        if from_big <= from_small:
            q[low_big] = 0.0
        if from_small <= from_big:
            q[high_small] = 1.0
        q[q < _BOUND_TOL] = 0.0
        q[q > 1.0 - _BOUND_TOL] = 1.0
        active = (q > 0.0) & (q < 1.0)
    yield 1.0, q >= 0.5


# --------------------------------------------------------------------------------------------------
# numpy's sequential sampler (PriSM)
# --------------------------------------------------------------------------------------------------
def sample_numpy_choice(weights: object, n: int, rng: np.random.Generator) -> np.ndarray:
    """PriSM's sampler: ``rng.choice(N, n, replace=False, p=weights / sum(weights))``, sorted.

    Successive sampling proportional to ``weights``; its inclusion probabilities are the Wallenius means
    (:func:`subfl.sampling.inclusion.wallenius_inclusion`), *not* ``n * weights / sum(weights)``.
    At least ``n`` weights must be positive.
    """
    _check_rng(rng)
    w = _as_spectrum(weights, "weights")
    n = _as_count(n, "n", 0, w.size)
    positive = int(np.count_nonzero(w > 0))
    if positive < n:
        raise ValueError(f"weights must have at least n={n} positive entries, got {positive}")
    if n == 0:
        return np.empty(0, dtype=np.int64)
    out = rng.choice(w.size, size=n, replace=False, p=w / w.sum()).astype(np.int64)
    out.sort()
    return out
