"""Tests for subfl.sampling.inclusion: optimality (vs SLSQP / brute force), closed forms, Monte Carlo."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import optimize

from subfl.sampling import (
    collective_inclusion,
    collective_term_discrepancy,
    collective_weights,
    cps_design,
    expected_discrepancy,
    keep_count,
    monte_carlo_discrepancy,
    prism_probabilities,
    sample_brewer,
    sample_numpy_choice,
    schatten_discrepancy,
    schatten_inclusion,
    softmax_probabilities,
    unbiased_inclusion,
    unbiased_weights,
    wallenius_inclusion,
)


def spectrum(seed: int, size: int, shape: float = 0.7) -> np.ndarray:
    """A decaying, shuffled random spectrum (gamma(shape)^2: a few large values, a long tail)."""
    rng = np.random.default_rng(seed)
    return rng.gamma(shape, 1.0, size) ** 2


def unbiased_objective(lam: np.ndarray, pi: np.ndarray) -> float:
    return float(np.sum(lam**2 * (1.0 / pi - 1.0)))


def slsqp(fun, grad, x0: np.ndarray, n: int, lower: float = 1e-9) -> np.ndarray:
    res = optimize.minimize(
        fun,
        x0,
        jac=grad,
        method="SLSQP",
        bounds=[(lower, 1.0)] * x0.size,
        constraints=[{"type": "eq", "fun": lambda x: x.sum() - n, "jac": lambda x: np.ones_like(x)}],
        options={"ftol": 1e-14, "maxiter": 2000},
    )
    return np.clip(res.x, lower, 1.0)


# ------------------------------------------------------------------------------------------------
# keep_count
# ------------------------------------------------------------------------------------------------
def test_keep_count_is_ceiling_without_float_noise():
    assert keep_count(512, 0.1) == 52  # ceil(51.2)
    assert keep_count(100, 0.07) == 7  # 100 * 0.07 = 7.000000000000001 in floating point
    assert keep_count(10, 1.0) == 10
    assert keep_count(10, 0.01) == 1
    with pytest.raises(ValueError, match="ratio"):
        keep_count(10, 0.0)


# ------------------------------------------------------------------------------------------------
# Unbiased (Theorem 3.1)
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed, size, n", [(0, 12, 3), (1, 20, 5), (2, 30, 10), (3, 25, 20)])
def test_unbiased_matches_slsqp_optimum(seed, size, n):
    lam = spectrum(seed, size)
    pi = unbiased_inclusion(lam, n)
    assert pi.sum() == pytest.approx(n, abs=1e-12)
    assert np.all((pi > 0) & (pi <= 1))
    s = lam / lam.max()
    ref = slsqp(
        lambda x: float(np.sum(s**2 / x)),
        lambda x: -(s**2) / x**2,
        np.full(size, n / size),
        n,
    )
    ours, theirs = unbiased_objective(lam, pi), unbiased_objective(lam, ref)
    assert ours <= theirs * (1 + 1e-9)
    assert abs(ours - theirs) / ours < 1e-6


def test_unbiased_is_water_filling_and_order_invariant():
    lam = spectrum(4, 40, shape=0.4)
    n = 10
    pi = unbiased_inclusion(lam, n)
    saturated = pi == 1.0
    assert saturated.sum() >= 1  # heavy-tailed spectrum: the top terms saturate
    ratio = pi[~saturated] / lam[~saturated]
    assert np.ptp(ratio) < 1e-12 * ratio.max()  # pi = c * lam off the bound
    assert np.all(ratio[0] * lam[saturated] >= 1 - 1e-12)  # c * lam >= 1 on the bound
    perm = np.random.default_rng(0).permutation(lam.size)
    np.testing.assert_allclose(unbiased_inclusion(lam[perm], n), pi[perm], rtol=0, atol=1e-15)


def test_unbiased_beats_uniform_and_topn_is_inadmissible():
    lam = spectrum(5, 30)
    n = 8
    pi = unbiased_inclusion(lam, n)
    uniform = np.full(lam.size, n / lam.size)
    ours, flat = unbiased_objective(lam, pi), unbiased_objective(lam, uniform)
    assert ours < 0.8 * flat  # strictly better than uniform on a decaying spectrum (numbers below)
    # top-n puts pi = 0 on positive terms: 1/pi is undefined, the unbiased variance is infinite
    top = np.zeros(lam.size)
    top[np.argsort(-lam)[:n]] = 1.0
    with np.errstate(divide="ignore"):
        assert np.isinf(np.sum(lam**2 * (1.0 / top - 1.0)))
    # and the unbiased closed form equals expected_discrepancy with omega = 1/pi
    assert expected_discrepancy(lam, pi, unbiased_weights(pi)) == pytest.approx(ours, rel=1e-12)


def test_unbiased_edge_cases():
    np.testing.assert_array_equal(unbiased_inclusion([3.0, 1.0, 2.0], 3), [1.0, 1.0, 1.0])
    # equal values: uniform
    np.testing.assert_allclose(unbiased_inclusion(np.ones(8), 2), np.full(8, 0.25))
    # fewer positive values than n: positives saturate, leftover mass spread over zeros
    np.testing.assert_allclose(unbiased_inclusion([0.0, 5.0, 0.0, 1.0, 0.0], 3), [1 / 3, 1, 1 / 3, 1, 1 / 3])
    # zeros get probability zero otherwise
    pi = unbiased_inclusion([0.0, 5.0, 1.0, 1.0], 2)
    assert pi[0] == 0.0 and pi.sum() == pytest.approx(2.0)


@pytest.mark.parametrize(
    "lam, n, match",
    [
        ([1.0, -1.0, 2.0], 1, r"lam must be non-negative, got lam\[1\]=-1.0"),
        ([1.0, 2.0], 0, r"n must be an integer in \[1, 2\], got 0"),
        ([1.0, 2.0], 3, r"n must be an integer in \[1, 2\], got 3"),
        ([1.0, 2.0], 1.5, r"n must be an integer"),
        ([[1.0, 2.0]], 1, r"lam must be 1-D, got an array of shape \(1, 2\)"),
        ([1.0, float("nan")], 1, r"lam must be finite"),
        ([], 1, r"lam must be non-empty"),
    ],
)
def test_unbiased_rejects_bad_input(lam, n, match):
    with pytest.raises(ValueError, match=match):
        unbiased_inclusion(lam, n)


# ------------------------------------------------------------------------------------------------
# Collective (Theorem 3.2)
# ------------------------------------------------------------------------------------------------
def test_collective_weights_minimise_each_term():
    """omega* = C / (1 + (C-1) pi) minimises (1 - omega pi)^2 + omega^2 pi (1-pi) / C (scalar search)."""
    for clients in (2, 5, 20):
        for pi in (0.05, 0.3, 0.9):
            res = optimize.minimize_scalar(
                lambda w: (1 - w * pi) ** 2 + w**2 * pi * (1 - pi) / clients, bounds=(0, 100), method="bounded",
                options={"xatol": 1e-12},
            )
            assert collective_weights([pi], clients)[0] == pytest.approx(res.x, rel=1e-6)
            assert collective_term_discrepancy([pi], clients)[0] == pytest.approx(res.fun, rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("seed, size, n, clients", [(0, 20, 5, 2), (1, 30, 6, 5), (2, 25, 10, 10), (3, 40, 4, 3)])
def test_collective_matches_slsqp_optimum(seed, size, n, clients):
    lam = spectrum(seed, size)
    pi, omega = collective_inclusion(lam, n, clients)
    assert pi.sum() == pytest.approx(n, abs=1e-9)
    assert np.all((pi >= 0) & (pi <= 1))
    np.testing.assert_allclose(omega, clients / (1 + (clients - 1) * pi))
    s2 = (lam / lam.max()) ** 2
    a = clients - 1

    def fun(x):
        return float(np.sum(s2 * (1 - x) / (1 + a * x)))

    def grad(x):
        return -s2 * clients / (1 + a * x) ** 2

    ref = slsqp(fun, grad, np.full(size, n / size), n, lower=0.0)
    ours = expected_discrepancy(lam, pi, omega, clients)
    theirs = expected_discrepancy(lam, ref, collective_weights(ref, clients), clients)
    assert ours <= theirs * (1 + 1e-9)
    assert abs(ours - theirs) / ours < 1e-6


def test_collective_kkt_structure():
    """pi_i = clip((nu lam_i - 1) / (C - 1), 0, 1): drops the tail, saturates the head, linear in between."""
    lam = spectrum(6, 60, shape=0.5)
    clients, n = 4, 12
    pi, _ = collective_inclusion(lam, n, clients)
    inner = (pi > 0) & (pi < 1)
    nu = (1 + (clients - 1) * pi[inner]) / lam[inner]
    assert np.ptp(nu) < 1e-9 * nu.max()
    nu = nu.mean()
    assert np.all(lam[pi == 0] * nu <= 1 + 1e-9)
    assert np.all(lam[pi == 1] * nu >= clients - 1e-9)
    assert (pi == 0).sum() > 0 and (pi == 1).sum() > 0  # this spectrum exercises both bounds


@pytest.mark.parametrize("clients", [2, 3, 10, 100])
def test_collective_not_worse_than_unbiased(clients):
    lam = spectrum(7, 50)
    n = 10
    pi_u = unbiased_inclusion(lam, n)
    pi_c, omega_c = collective_inclusion(lam, n, clients)
    unbiased = expected_discrepancy(lam, pi_u, unbiased_weights(pi_u), clients)  # C clients, omega = 1/pi
    collective = expected_discrepancy(lam, pi_c, omega_c, clients)
    assert collective <= unbiased * (1 + 1e-12)
    # the unbiased design with the optimal collective omega is also dominated
    assert collective <= expected_discrepancy(lam, pi_u, collective_weights(pi_u, clients), clients) + 1e-12


def test_collective_single_client_is_truncated_svd():
    """C = 1: f(pi) = 1 - pi is linear, the optimum is top-n with omega = 1 (biased), error sum_{i>n} lam_(i)^2.

    Brute force over all deterministic size-n subsets confirms it is the best subset, and it is below the
    unbiased optimum (which pays variance to stay unbiased)."""
    lam = spectrum(8, 9)
    n = 3
    pi, omega = collective_inclusion(lam, n, 1)
    np.testing.assert_array_equal(omega, np.ones(lam.size))
    assert set(np.flatnonzero(pi == 1)) == set(np.argsort(-lam)[:n])
    tail = float(np.sum(np.sort(lam)[: lam.size - n] ** 2))
    assert expected_discrepancy(lam, pi, omega, 1) == pytest.approx(tail, rel=1e-12)
    brute = min(float(np.sum(lam**2) - np.sum(lam[list(s)] ** 2)) for s in itertools.combinations(range(lam.size), n))
    assert brute == pytest.approx(tail, rel=1e-12)
    pi_u = unbiased_inclusion(lam, n)
    assert tail < expected_discrepancy(lam, pi_u, unbiased_weights(pi_u), 1)


def test_collective_handles_ties_zeros_and_full():
    pi, omega = collective_inclusion(np.ones(10), 4, 3)
    np.testing.assert_allclose(pi, np.full(10, 0.4))
    pi, _ = collective_inclusion([0.0, 2.0, 0.0, 1.0, 0.5], 2, 3)
    assert pi[0] == 0 and pi[2] == 0 and pi.sum() == pytest.approx(2.0)
    pi, omega = collective_inclusion([1.0, 2.0, 3.0], 3, 5)
    np.testing.assert_array_equal(pi, np.ones(3))
    np.testing.assert_allclose(omega, np.ones(3))
    with pytest.raises(ValueError, match=r"clients must be an integer in \[1, .*\], got 0"):
        collective_inclusion([1.0, 2.0], 1, 0)


# ------------------------------------------------------------------------------------------------
# Schatten-p
# ------------------------------------------------------------------------------------------------
def test_schatten_identity_is_exact_for_shared_singular_vectors():
    """||W - W_hat||_{S_4}^4 = sum lam_i^4 |1 - z_i/pi_i|^4 for any U, V (W_hat shares W's singular vectors)."""
    rng = np.random.default_rng(0)
    lam = spectrum(9, 12)
    u, _ = np.linalg.qr(rng.standard_normal((20, 12)))
    v, _ = np.linalg.qr(rng.standard_normal((15, 12)))
    pi = unbiased_inclusion(lam, 4)
    for _ in range(5):
        z = rng.random(12) < pi
        coef = lam * (1 - z / pi)
        diff = (u * coef) @ v.T
        sv = np.linalg.svd(diff, compute_uv=False)
        assert np.sum(sv**4) == pytest.approx(np.sum(np.abs(coef) ** 4), rel=1e-10)
        assert np.sum(sv**2) == pytest.approx(np.sum(coef**2), rel=1e-10)


def test_schatten_discrepancy_matches_bernoulli_monte_carlo():
    """E sum lam^4 |1 - z/pi|^4 with independent z ~ Bernoulli(pi) (only marginals matter): 400k draws, 2%."""
    rng = np.random.default_rng(1)
    lam = np.array([1.0, 0.8, 0.5, 0.3])
    pi = np.array([0.9, 0.6, 0.4, 0.3])
    z = rng.random((400_000, 4)) < pi
    mc = np.mean(np.sum(lam**4 * np.abs(1 - z / pi) ** 4, axis=1))
    assert mc == pytest.approx(schatten_discrepancy(lam, pi, 4), rel=0.02)
    assert schatten_discrepancy(lam, pi, 2) == pytest.approx(unbiased_objective(lam, pi), rel=1e-12)


@pytest.mark.parametrize("method", ["kkt", "slsqp"])
def test_schatten_p2_reproduces_unbiased(method):
    lam = spectrum(10, 30)
    np.testing.assert_allclose(schatten_inclusion(lam, 7, p=2, method=method), unbiased_inclusion(lam, 7), atol=1e-5)
    if method == "kkt":
        np.testing.assert_allclose(schatten_inclusion(lam, 7, p=2), unbiased_inclusion(lam, 7), atol=1e-12)


def test_schatten_p4_kkt_matches_slsqp_and_beats_frobenius_solution():
    lam = spectrum(11, 40, shape=1.0)
    n = 10
    kkt = schatten_inclusion(lam, n, p=4)
    ref = schatten_inclusion(lam, n, p=4, method="slsqp")
    assert kkt.sum() == pytest.approx(n, abs=1e-9)
    ours, theirs = schatten_discrepancy(lam, kkt, 4), schatten_discrepancy(lam, ref, 4)
    assert ours <= theirs * (1 + 1e-9)
    assert abs(ours - theirs) / ours < 1e-6
    frob = schatten_discrepancy(lam, unbiased_inclusion(lam, n), 4)
    assert ours < 0.99 * frob
    # KKT: lam^p phi(pi) is constant off the bound
    inner = kkt < 1
    phi = kkt[inner] ** -4 * (1 - kkt[inner]) ** 3 * (3 + kkt[inner]) + 1
    level = lam[inner] ** 4 * phi
    assert np.ptp(level) < 1e-7 * level.mean()


# ------------------------------------------------------------------------------------------------
# PriSM and Wallenius
# ------------------------------------------------------------------------------------------------
def test_prism_probabilities():
    lam = np.array([4.0, 2.0, 1.0, 0.0])
    p = prism_probabilities(lam, kappa=2.0)
    np.testing.assert_allclose(p, np.array([16, 4, 1, 0]) / 21)
    np.testing.assert_allclose(prism_probabilities(lam, r=0.1), np.array([256, 16, 1, 0]) / 273)  # kappa = 4
    np.testing.assert_allclose(prism_probabilities(lam, r=0.2), prism_probabilities(lam, kappa=4))
    np.testing.assert_allclose(prism_probabilities(lam, r=0.5), prism_probabilities(lam, kappa=2.5))
    assert prism_probabilities(spectrum(0, 100) * 1e-200, kappa=4).sum() == pytest.approx(1.0)  # no underflow
    with pytest.raises(ValueError, match="needs kappa, or the keep ratio r"):
        prism_probabilities(lam)
    with pytest.raises(ValueError, match=r"r must be a keep ratio in \(0, 1\], got 1.5"):
        prism_probabilities(lam, r=1.5)


def test_softmax_probabilities_of_raw_singular_values():
    """PriSM Sec. 4.5's softmax row: p_i = exp(lam_i) / sum_j exp(lam_j) of the singular values as they are.
    Hand-computed: exp(ln 4, ln 2, 0, 0) = (4, 2, 1, 1) of sum 8; softmax(2, 1, 0) = (e^2, e, 1) / (e^2 + e + 1)
    = (0.665241, 0.244728, 0.090031)."""
    np.testing.assert_allclose(softmax_probabilities([np.log(4.0), np.log(2.0), 0.0, 0.0]),
                               [0.5, 0.25, 0.125, 0.125], rtol=1e-14)
    np.testing.assert_allclose(softmax_probabilities([2.0, 1.0, 0.0]), [0.6652409558, 0.2447284711, 0.0900305732],
                               rtol=1e-9)
    # the max is subtracted: (1002, 1001, 1000) would overflow exp (e^1000 = inf) and gives the same p
    np.testing.assert_allclose(softmax_probabilities([1002.0, 1001.0, 1000.0]), [0.6652409558, 0.2447284711,
                                                                                 0.0900305732], rtol=1e-9)
    # a term 800 below the largest underflows to exactly 0; the rest still sum to 1
    assert softmax_probabilities([800.0, 0.0]).tolist() == [1.0, 0.0]
    np.testing.assert_allclose(softmax_probabilities(np.zeros(5)), np.full(5, 0.2))
    # raw values: scaling the spectrum changes the softmax (2x: (4, 2, 0) -> 0.8668, 0.1173, 0.0159), while
    # Eq. (2) depends only on ratios
    np.testing.assert_allclose(softmax_probabilities([4.0, 2.0, 0.0]), [0.8668133, 0.1173104, 0.0158762], atol=1e-7)
    np.testing.assert_allclose(prism_probabilities([4.0, 2.0, 1.0], kappa=2), prism_probabilities([2.0, 1.0, 0.5],
                                                                                                 kappa=2))


@pytest.mark.parametrize("lam, match", [([], "lam must be non-empty"), ([1.0, -0.5], r"lam must be non-negative"),
                                        ([1.0, np.nan], "lam must be finite"), ([[1.0, 2.0]], "lam must be 1-D")])
def test_softmax_probabilities_reject_bad_input(lam, match):
    with pytest.raises(ValueError, match=match):
        softmax_probabilities(lam)


def test_softmax_weights_through_prisms_sampler_have_wallenius_marginals():
    """Softmax weights drawn with PriSM's sampler (rng.choice without replacement, n = 8 of N = 40): the empirical
    inclusion frequencies of 20k draws lie within 4 binomial standard errors (+3/draws for the rare items) of the
    exact Wallenius means; Fog's approximation is within 0.01 of them (measured 0.005); n p is not the marginal
    (off by 0.23: the largest p = 0.121 gives n p = 0.968 where pi = 0.736)."""
    lam = np.random.default_rng(5).permutation(np.linspace(0.0, 5.0, 40))
    w = softmax_probabilities(lam)
    n = 8
    exact = wallenius_inclusion(w, n, method="exact")
    assert exact.sum() == pytest.approx(n, abs=1e-9)
    assert np.max(np.abs(wallenius_inclusion(w, n) - exact)) < 0.01
    _check_numpy_choice_frequencies(w, n, exact, draws=20_000)
    assert np.max(np.abs(np.minimum(n * w, 1) - exact)) > 0.2


def _check_numpy_choice_frequencies(w: np.ndarray, n: int, exact: np.ndarray, draws: int) -> np.ndarray:
    """Inclusion frequencies of ``draws`` PriSM draws (``rng.choice`` without replacement, seed 0) against the exact
    marginals: within 4 binomial standard errors, plus 3 / draws for the rare items. Returns the frequencies."""
    rng = np.random.default_rng(0)
    counts = np.zeros(len(w))
    for _ in range(draws):
        counts[sample_numpy_choice(w, n, rng)] += 1
    freq = counts / draws
    se = np.sqrt(exact * (1 - exact) / draws)
    assert np.all(np.abs(freq - exact) <= 4 * se + 3 / draws)
    return freq


def successive_sampling_brute_force(w: np.ndarray, n: int) -> np.ndarray:
    """Inclusion probabilities of sequential sampling ∝ w by enumerating all ordered n-draws."""
    w = np.asarray(w) / np.sum(w)
    pi = np.zeros(w.size)
    for seq in itertools.permutations(range(w.size), n):
        prob, left = 1.0, 1.0
        for i in seq:
            prob *= w[i] / left
            left -= w[i]
        pi[list(seq)] += prob
    return pi


@pytest.mark.parametrize("size, n", [(6, 2), (7, 3), (8, 5)])
def test_wallenius_exact_matches_enumeration(size, n):
    w = spectrum(size, size, shape=0.5) + 1e-3
    exact = wallenius_inclusion(w, n, method="exact")
    np.testing.assert_allclose(exact, successive_sampling_brute_force(w, n), rtol=0, atol=1e-12)
    # Fog's approximation is only approximate on tiny populations (measured 0.016, 0.095, 0.016)
    assert np.max(np.abs(wallenius_inclusion(w, n) - exact)) < 0.12


def test_wallenius_matches_numpy_choice_monte_carlo():
    """Exact Wallenius marginals vs 40k draws of rng.choice(replace=False, p=w): within 4 binomial standard
    errors (+3/draws for the rare items). Fog's approximation is within 0.025 of exact here (measured
    0.016), and the naive n * p is far off (it even exceeds 1)."""
    lam = spectrum(12, 40, shape=1.0)
    n = 10
    w = prism_probabilities(lam, kappa=2.5)
    exact = wallenius_inclusion(w, n, method="exact")
    fog = wallenius_inclusion(w, n)
    assert exact.sum() == pytest.approx(n, abs=1e-9)
    assert fog.sum() == pytest.approx(n, abs=1e-9)
    assert np.max(np.abs(fog - exact)) < 0.025
    freq = _check_numpy_choice_frequencies(w, n, exact, draws=40_000)
    assert np.max(np.abs(freq - np.minimum(n * w, 1))) > 0.1  # the weights are not the marginals
    assert n * w.max() > 1


def test_wallenius_edge_cases():
    np.testing.assert_allclose(wallenius_inclusion(np.ones(5), 2), np.full(5, 0.4))
    np.testing.assert_array_equal(wallenius_inclusion([1.0, 0.0, 2.0], 2), [1.0, 0.0, 1.0])
    with pytest.raises(ValueError, match="at least n=2 positive entries, got 1"):
        wallenius_inclusion([1.0, 0.0, 0.0], 2)


# ------------------------------------------------------------------------------------------------
# Expected vs Monte-Carlo discrepancy
# ------------------------------------------------------------------------------------------------
def test_frobenius_identity_with_real_matrices():
    """||W - W_hat||_F^2 = sum lam_i^2 (1 - omega_i X_i / C)^2 checked on explicit matrices."""
    rng = np.random.default_rng(2)
    lam = spectrum(13, 10)
    u, _ = np.linalg.qr(rng.standard_normal((16, 10)))
    v, _ = np.linalg.qr(rng.standard_normal((12, 10)))
    w = (u * lam) @ v.T
    pi, omega = collective_inclusion(lam, 4, 3)
    design = cps_design(pi)
    samples = [design.sample(rng) for _ in range(3)]
    w_hat = sum((u[:, s] * (omega[s] * lam[s])) @ v[:, s].T for s in samples) / 3
    counts = np.zeros(10)
    for s in samples:
        counts[s] += 1
    assert np.sum((w - w_hat) ** 2) == pytest.approx(np.sum(lam**2 * (1 - omega * counts / 3) ** 2), rel=1e-10)


@pytest.mark.parametrize("clients", [1, 4])
def test_monte_carlo_matches_expected_discrepancy(clients):
    """6000 draws x C clients; agreement within 3% (relative standard error of the mean is about 1%)."""
    lam = spectrum(14, 30, shape=1.0)
    n = 8
    if clients == 1:
        pi = unbiased_inclusion(lam, n)
        omega = unbiased_weights(pi)
    else:
        pi, omega = collective_inclusion(lam, n, clients)
    design = cps_design(pi)
    rng = np.random.default_rng(3)
    expected = expected_discrepancy(lam, pi, omega, clients)
    for sampler in (lambda p, r: design.sample(r), sample_brewer):
        mc = monte_carlo_discrepancy(lam, pi, omega, sampler, rng, draws=6000, clients=clients)
        assert mc == pytest.approx(expected, rel=0.03)


def test_expected_discrepancy_validates():
    with pytest.raises(ValueError, match="pi and omega must have the shape of lam"):
        expected_discrepancy([1.0, 2.0], [0.5], [2.0, 2.0])
    with pytest.raises(ValueError, match=r"pi must lie in \[0, 1\]"):
        expected_discrepancy([1.0, 2.0], [0.5, 1.5], [2.0, 2.0])
