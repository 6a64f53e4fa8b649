"""RDP accounting of the sampled Gaussian mechanism (subfl.privacy).

Reference values: TF-Privacy's tests of its RDP accountant (Abadi et al.'s MNIST example, classic conversion) and
Opacus 1.6.0's ``opacus.accountants.analysis.rdp`` (default orders, improved conversion), hard-coded here and
compared live when ``opacus`` is importable.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from subfl import privacy
from subfl.privacy import DEFAULT_ORDERS, RDPAccountant, compute_rdp, epsilon, privacy_spent, rdp_sampled_gaussian

# (σ, q, steps, δ) → (ε, best order) from Opacus 1.6.0: compute_rdp + get_privacy_spent at its DEFAULT_ALPHAS
OPACUS_VALUES = [
    ((1.1, 0.01, 10_000, 1e-5), (5.63199236854841, 4.7)),
    ((4.0, 0.01, 10_000, 1e-5), (1.0354900660362476, 17.0)),
    ((1.0, 0.05, 1_000, 1e-5), (11.97954718661729, 2.8)),
    ((0.7, 0.1, 50, 1e-6), (13.9379516563855, 2.4)),
    ((2.0, 1.0, 10, 1e-5), (8.079406222420491, 3.9)),
    ((0.5, 0.3, 20, 1e-5), (36.123029734346204, 1.6)),
]


@pytest.mark.parametrize("args, expected", OPACUS_VALUES)
def test_matches_opacus_values(args, expected):
    sigma, q, steps, delta = args
    eps, order = privacy_spent(compute_rdp(sigma, q, steps), DEFAULT_ORDERS, delta)
    assert eps == pytest.approx(expected[0], rel=1e-6)  # the two differ by ~1e-9 (series truncation)
    assert order == expected[1]


def test_abadi_et_al_mnist_example_classic_conversion():
    # Abadi et al. (CCS 2016), Sec. 3.1: q = 0.01, σ = 4, T = 10 000, δ = 1e-5 → ε ≈ 1.26 with the moments
    # accountant; TF-Privacy's test of compute_rdp / get_privacy_spent (orders 2..32): 1.258575 at order 20.
    orders = range(2, 33)
    eps, order = privacy_spent(compute_rdp(4.0, 0.01, 10_000, orders), orders, 1e-5, conversion="classic")
    assert eps == pytest.approx(1.258575, abs=1e-5) and order == 20
    # the improved conversion (Balle et al. 2020) is tighter
    assert epsilon(4.0, 0.01, 10_000, 1e-5, orders=orders) == pytest.approx(1.035490, abs=1e-5)
    # σ = 1.1 with the same q and T is far from that: ε ≈ 5.63 (improved) — σ = 4 is Abadi's 1.26 example
    assert epsilon(1.1, 0.01, 10_000, 1e-5) == pytest.approx(5.632, abs=1e-3)


def test_tf_privacy_heterogeneous_composition():
    # TF-Privacy rdp_accountant_test.test_check_composition (old conversion): 8.509656 at order 2.5
    orders = (1.25, 1.5, 1.75, 2., 2.5, 3., 4., 5., 6., 7., 8., 10., 12., 14., 16., 20., 24., 28., 32., 64., 256.)
    rdp = compute_rdp(0.4, 1e-4, 40_000, orders) + compute_rdp(2.0, 0.1, 100, orders)
    eps, order = privacy_spent(rdp, orders, 1e-5, conversion="classic")
    assert eps == pytest.approx(8.509656, abs=1e-5) and order == 2.5
    accountant = RDPAccountant(orders)
    accountant.step(0.4, 1e-4, 40_000)
    accountant.step(2.0, 0.1, 100)
    assert accountant.epsilon(1e-5, conversion="classic") == pytest.approx(eps)


def test_live_comparison_with_opacus():
    rdp_module = pytest.importorskip("opacus.accountants.analysis.rdp")
    for sigma, q, steps in ((1.1, 0.01, 1000), (0.8, 0.2, 30), (3.0, 0.001, 100_000)):
        theirs = rdp_module.compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=list(DEFAULT_ORDERS))
        assert np.allclose(compute_rdp(sigma, q, steps), theirs, rtol=1e-7)


def test_closed_forms_and_limits():
    orders = (1.5, 2.0, 7.0, 32.5)
    assert np.allclose(rdp_sampled_gaussian(2.0, 1.0, orders), np.array(orders) / (2 * 2.0 ** 2))  # Gaussian
    assert np.all(rdp_sampled_gaussian(1.0, 0.0, orders) == 0)
    assert np.all(np.isinf(rdp_sampled_gaussian(0.0, 0.1, orders)))
    assert epsilon(0.0, 0.1, 1, 1e-5) == math.inf
    # integer formula and fractional series agree next to an integer order
    for alpha in (2, 3, 8):
        close = rdp_sampled_gaussian(1.2, 0.05, (alpha - 1e-6, alpha, alpha + 1e-6))
        assert close[0] <= close[1] + 1e-9 <= close[2] + 2e-9 and abs(close[2] - close[0]) < 1e-6


def test_monotone_in_noise_rate_and_steps():
    base = epsilon(1.0, 0.02, 500, 1e-5)
    assert epsilon(2.0, 0.02, 500, 1e-5) < base < epsilon(0.8, 0.02, 500, 1e-5)
    assert epsilon(1.0, 0.01, 500, 1e-5) < base < epsilon(1.0, 0.04, 500, 1e-5)
    assert epsilon(1.0, 0.02, 100, 1e-5) < base < epsilon(1.0, 0.02, 2000, 1e-5)
    assert epsilon(1.0, 0.02, 500, 1e-3) < base  # larger δ, smaller ε
    assert np.allclose(compute_rdp(1.0, 0.02, 500), 500 * rdp_sampled_gaussian(1.0, 0.02))


def test_invalid_arguments():
    with pytest.raises(ValueError, match="noise_multiplier"):
        compute_rdp(-1.0, 0.1, 1)
    with pytest.raises(ValueError, match="sample_rate"):
        compute_rdp(1.0, 1.5, 1)
    with pytest.raises(ValueError, match="steps"):
        compute_rdp(1.0, 0.1, -2)
    with pytest.raises(ValueError, match="orders"):
        compute_rdp(1.0, 0.1, 1, orders=(1.0, 2.0))
    with pytest.raises(ValueError, match="delta"):
        privacy_spent([1.0], [2.0], 0.0)
    with pytest.raises(ValueError, match="conversion"):
        privacy_spent([1.0], [2.0], 1e-5, conversion="tight")
    assert privacy.CONVERSIONS == ("improved", "classic")
