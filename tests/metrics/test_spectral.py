"""Tests for subfl.metrics.spectral: ANME (spectral sharding §4.2.2) and effective rank (PriSM §4.4.1)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from subfl.metrics.spectral import anme, bernoulli_entropy, effective_rank
from subfl.sampling import collective_inclusion, unbiased_inclusion


def test_anme_top_n_is_zero_and_uniform_is_one():
    top = np.zeros(20)
    top[:5] = 1.0
    assert anme([top, np.array([1.0, 0.0, 0.0])]) == 0.0
    assert anme([np.full(20, 0.25), np.full(7, 3 / 7)]) == pytest.approx(1.0, abs=1e-15)


def test_anme_intermediate_value_by_hand():
    """Layer (0.5, 0.5, 1, 0): n = 2, N = 4, reference H(1/2) = log 2, mean entropy (2 log 2) / 4 -> 0.5.
    Averaged with a uniform layer (1.0) gives 0.75."""
    layer = np.array([0.5, 0.5, 1.0, 0.0])
    assert anme([layer]) == pytest.approx(0.5, abs=1e-15)
    assert anme([layer, np.full(10, 0.3)]) == pytest.approx(0.75, abs=1e-15)


def test_anme_orders_designs():
    """A decaying spectrum: uniform (1) > unbiased > collective C=2 (which drops the tail) > top-n (0)."""
    lam = np.random.default_rng(0).gamma(0.7, 1.0, 64) ** 2
    unb = anme([unbiased_inclusion(lam, 16)])
    col = anme([collective_inclusion(lam, 16, 2)[0]])
    assert 1.0 > unb > col > 0.0


def test_anme_skips_degenerate_layers_and_validates():
    assert anme([np.ones(5), np.full(4, 0.5)]) == pytest.approx(1.0)
    assert anme([np.ones(5)]) == 0.0
    with pytest.raises(ValueError, match="at least one layer"):
        anme([])
    with pytest.raises(ValueError, match=r"probabilities_per_layer\[1\] must lie in \[0, 1\]"):
        anme([np.full(2, 0.5), np.array([1.5, 0.5])])
    with pytest.raises(TypeError, match="sequence of per-layer arrays"):
        anme(np.full(4, 0.5))


def test_bernoulli_entropy():
    np.testing.assert_allclose(bernoulli_entropy([0.0, 0.5, 1.0]), [0.0, math.log(2), 0.0])


def test_effective_rank_extremes_and_hand_value():
    assert effective_rank(np.full(7, 3.0)) == pytest.approx(7.0, rel=1e-14)
    assert effective_rank([4.0, 0.0, 0.0, 0.0]) == pytest.approx(1.0, rel=1e-14)
    # (2, 1, 1): p = (1/2, 1/4, 1/4), H = 1.5 log 2, erank = 2^1.5
    assert effective_rank([2.0, 1.0, 1.0]) == pytest.approx(2 * math.sqrt(2), rel=1e-14)
    assert effective_rank([2.0, 1.0, 1.0]) == pytest.approx(effective_rank([20.0, 10.0, 10.0]), rel=1e-14)


def test_effective_rank_matches_matrix_svd():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((30, 2)) @ rng.standard_normal((2, 20))  # rank 2
    sv = np.linalg.svd(a, compute_uv=False)
    assert 1.0 < effective_rank(sv) < 2.0 + 1e-6


def test_effective_rank_validates():
    with pytest.raises(ValueError, match="non-negative"):
        effective_rank([1.0, -1.0])
    with pytest.raises(ValueError, match="positive sum"):
        effective_rank([0.0, 0.0])
    with pytest.raises(ValueError, match="non-empty 1-D"):
        effective_rank(np.ones((2, 2)))
