"""Tests for subfl.sampling.samplers: exact size, distinct sorted indices, marginals equal pi."""
from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest

from subfl.sampling import (
    collective_inclusion,
    cps_design,
    sample_brewer,
    sample_cps,
    sample_min_support,
    sample_numpy_choice,
    unbiased_inclusion,
)

DRAWS = 20_000
Z = 4.0  # tolerance: |frequency - pi| <= 4 binomial standard errors sqrt(pi (1 - pi) / DRAWS)


def _spectrum(seed: int, size: int, shape: float) -> np.ndarray:
    return np.random.default_rng(seed).gamma(shape, 1.0, size) ** 2


def _pi_vectors() -> dict[str, np.ndarray]:
    saturated = unbiased_inclusion(_spectrum(0, 15, 0.4), 5)  # heavy tail: some pi_i = 1
    assert (saturated == 1).sum() >= 1
    tiny = np.array([1.0, 0.0, 0.001, 0.999, 0.5, 0.5, 0.25, 0.75, 0.3, 0.7])  # sums to 5, tiny and near-1
    dense = collective_inclusion(_spectrum(2, 12, 2.0), 8, 3)[0]  # n > N/2: CPS draws the complement
    return {"saturated": saturated, "tiny": tiny, "dense": dense}


PI_VECTORS = _pi_vectors()


def _cps_sampler(pi: np.ndarray):
    design = cps_design(pi)
    return lambda rng: design.sample(rng)


SAMPLERS = {
    "cps": _cps_sampler,
    "brewer": lambda pi: (lambda rng: sample_brewer(pi, rng)),
    "min_support": lambda pi: (lambda rng: sample_min_support(pi, rng)),
}


@pytest.mark.parametrize("sampler_name", sorted(SAMPLERS))
@pytest.mark.parametrize("pi_name", sorted(PI_VECTORS))
def test_marginals_equal_pi(sampler_name, pi_name):
    """20k draws: every draw has exactly n distinct sorted int64 indices; frequencies within 4 SE of pi;
    items with pi = 1 appear in every draw and items with pi = 0 in none."""
    pi = PI_VECTORS[pi_name]
    n = int(round(pi.sum()))
    draw = SAMPLERS[sampler_name](pi)
    rng = np.random.default_rng(123)
    counts = np.zeros(pi.size)
    for _ in range(DRAWS):
        s = draw(rng)
        assert s.dtype == np.int64 and s.size == n
        assert np.all(np.diff(s) > 0)  # sorted and distinct
        counts[s] += 1
    freq = counts / DRAWS
    se = np.sqrt(pi * (1 - pi) / DRAWS)
    assert np.all(np.abs(freq - pi) <= Z * se + 1e-12), np.max(np.abs(freq - pi) / np.maximum(se, 1e-12))
    assert np.all(freq[pi == 1] == 1) and np.all(freq[pi == 0] == 0)


def test_cps_calibration_is_exact_and_fast_to_draw():
    lam = _spectrum(3, 512, 1.0)
    pi = unbiased_inclusion(lam, 51)
    design = cps_design(pi)
    assert design.max_error < 1e-10
    np.testing.assert_allclose(design.inclusion_probabilities(), pi, rtol=0, atol=1e-9)
    assert design.iterations <= 20
    s = design.sample(np.random.default_rng(0))
    assert s.size == 51 and np.all(np.diff(s) > 0)


@pytest.mark.parametrize("size, n", [(2, 1), (3, 1), (5, 4), (6, 3)])
def test_cps_calibration_small_populations(size, n):
    """The plain fixed point oscillates for M = 2 and crawls for n = 1 with a dominant item; the accelerated
    calibration reaches 1e-10 in a few iterations."""
    rng = np.random.default_rng(size * 10 + n)
    pi = unbiased_inclusion(rng.random(size) ** 4 + 1e-3, n)
    design = cps_design(pi)
    np.testing.assert_allclose(design.inclusion_probabilities(), pi, rtol=0, atol=1e-10)
    assert design.iterations <= 20


def test_cps_sample_distribution_is_maximum_entropy():
    """P(S) ∝ prod_{i in S} w_i with w the calibrated odds (exponential family = maximum entropy for given
    marginals): all 20 samples of size 3 out of 6, 40k draws, each within 4 SE of its probability."""
    pi = unbiased_inclusion(np.array([3.0, 2.5, 2.0, 1.5, 1.0, 0.5]), 3)  # no pi_i = 1
    design = cps_design(pi)
    odds = design.working_probabilities / (1 - design.working_probabilities)
    supports = list(itertools.combinations(range(6), 3))
    weight = np.array([np.prod(odds[list(s)]) for s in supports])
    prob = weight / weight.sum()
    marg = np.array([sum(p for p, s in zip(prob, supports) if i in s) for i in range(6)])
    np.testing.assert_allclose(marg, pi, atol=1e-9)  # the calibrated odds reproduce pi exactly
    rng = np.random.default_rng(7)
    draws = 40_000
    counts = Counter(tuple(design.sample(rng)) for _ in range(draws))
    freq = np.array([counts[s] / draws for s in supports])
    se = np.sqrt(prob * (1 - prob) / draws)
    assert np.all(np.abs(freq - prob) <= 4 * se)
    # entropy of CPS exceeds that of the minimum support design with the same marginals
    ms_counts = Counter(tuple(sample_min_support(pi, rng)) for _ in range(5000))
    ms = np.array(list(ms_counts.values())) / 5000
    assert -np.sum(prob * np.log(prob)) > -np.sum(ms * np.log(ms)) + 0.5


def test_min_support_uses_at_most_m_supports():
    """The splitting design has at most M samples in its support (M = number of 0 < pi < 1 items)."""
    pi = PI_VECTORS["tiny"]
    m = int(np.sum((pi > 0) & (pi < 1)))
    rng = np.random.default_rng(5)
    supports = {tuple(sample_min_support(pi, rng)) for _ in range(5000)}
    assert len(supports) <= m


def test_sample_cps_one_shot_and_reproducible():
    pi = PI_VECTORS["saturated"]
    a = sample_cps(pi, np.random.default_rng(11))
    b = sample_cps(pi, np.random.default_rng(11))
    np.testing.assert_array_equal(a, b)
    assert a.size == 5


def test_deterministic_and_empty_designs():
    rng = np.random.default_rng(0)
    pi = np.array([1.0, 0.0, 1.0, 0.0])
    for sampler in (sample_cps, sample_brewer, sample_min_support):
        np.testing.assert_array_equal(sampler(pi, rng), [0, 2])
        assert sampler(np.zeros(3), rng).size == 0
        assert sampler(np.full(4, 0.5 + 2e-7), rng).size == 2  # sum 2 + 8e-7: within the 1e-6 tolerance


def test_numpy_choice_is_numpy_sorted():
    w = np.array([5.0, 1.0, 0.0, 2.0, 3.0])
    s = sample_numpy_choice(w, 3, np.random.default_rng(4))
    ref = np.sort(np.random.default_rng(4).choice(5, 3, replace=False, p=w / w.sum()))
    np.testing.assert_array_equal(s, ref)
    assert s.dtype == np.int64
    with pytest.raises(ValueError, match="at least n=4 positive entries, got 3"):
        sample_numpy_choice([1.0, 0.0, 1.0, 1.0], 4, np.random.default_rng(0))


@pytest.mark.parametrize("sampler", [sample_cps, sample_brewer, sample_min_support])
@pytest.mark.parametrize(
    "pi, match",
    [
        ([0.5, 0.7], r"pi must sum to an integer \(within 1e-06\), got sum\(pi\)=1.2"),
        ([1.5, 0.5], r"pi must lie in \[0, 1\], got pi\[0\]=1.5"),
        ([-0.5, 1.0, 0.5], r"pi must lie in \[0, 1\], got pi\[0\]=-0.5"),
        ([[0.5, 0.5]], r"pi must be 1-D"),
        ([0.5, float("nan")], r"pi must be finite"),
    ],
)
def test_samplers_reject_bad_pi(sampler, pi, match):
    with pytest.raises(ValueError, match=match):
        sampler(pi, np.random.default_rng(0))


def test_samplers_reject_bad_rng():
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator"):
        sample_brewer([0.5, 0.5], np.random.RandomState(0))
