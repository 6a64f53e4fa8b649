import numpy as np
import pytest
import torch

from subfl.sampling import analysis, expected_discrepancy, sample_cps, wallenius_inclusion
from subfl.sampling.analysis import (STRATEGIES, check_collective_optimum, check_unbiased_optimum,
                                     choice_inclusion_frequencies, discrepancy_table, layer_spectra,
                                     matrix_monte_carlo, strategy_design)

LAM = np.sort(np.random.default_rng(0).gamma(1.0, size=40))[::-1] ** 2


def test_theorems_match_a_generic_optimiser():
    assert abs(check_unbiased_optimum(LAM, 8)["relative_gap"]) < 1e-5
    c = check_collective_optimum(LAM, 8, clients=5)
    assert abs(c["relative_gap"]) < 1e-5 and c["max_abs_pi_difference"] < 1e-3


def test_designs_sum_to_n_and_order_discrepancies():
    for s in STRATEGIES:
        pi, omega = strategy_design(LAM, 8, s, clients=5)
        assert pi.sum() == pytest.approx(8, abs=1e-6)
    table = discrepancy_table({"w": LAM}, [0.2], clients=5).set_index("strategy").relative_discrepancy
    assert table["collective"] <= table["unbiased"] + 1e-12   # Thm 3.2 optimises over a superset
    assert table["unbiased"] <= table["uniform"]              # Thm 3.1 is optimal among unbiased designs
    assert table["unbiased"] <= table["prism+wallenius"] + 1e-12


def test_matrix_monte_carlo_agrees_with_closed_form():
    rng = np.random.default_rng(1)
    w = torch.randn(12, 20, dtype=torch.float64) @ torch.diag(torch.linspace(3, 0.1, 20, dtype=torch.float64))
    lam = torch.linalg.svdvals(w).numpy()
    pi, omega = strategy_design(lam, 4, "unbiased")
    mc = matrix_monte_carlo(w, pi, omega, sample_cps, rng, draws=4000)
    assert mc == pytest.approx(expected_discrepancy(lam, pi, omega), rel=0.05)


def test_numpy_choice_marginals_are_wallenius_not_the_weights():
    w = np.array([0.5, 0.2, 0.1, 0.1, 0.05, 0.05])
    freq = choice_inclusion_frequencies(w, 3, 20000, np.random.default_rng(2))
    exact = wallenius_inclusion(w, 3, method="exact")
    assert np.abs(freq - exact).max() < 0.015          # ~4 binomial s.e.
    assert np.abs(freq - 3 * w).max() > 0.2             # 3·0.5 = 1.5 is not even a probability


def test_layer_spectra_skips_first_and_last_and_reshapes_convs():
    state = {"a.weight": torch.randn(4, 3, 3, 3), "b.weight": torch.randn(6, 4, 3, 3), "b.bias": torch.zeros(6),
             "c.weight": torch.randn(10, 24)}
    spectra = layer_spectra(state)
    assert list(spectra) == ["b.weight"] and spectra["b.weight"].shape == (6,)
    with pytest.raises(ValueError, match="strategy"):
        strategy_design(LAM, 3, "random")


def test_algorithm2_as_printed_never_leaves_top_n_and_eq27_reaches_the_optimum():
    """Spectral sharding Alg. 2, line 30 as printed is the negative of Eq. (27)'s objective: every admissible
    (t, u) scores E >= 0 > E*(top-n), so the printed search returns top-n. With Eq. (27)'s sign it returns the
    Theorem 3.2 optimum (the closed form, = SLSQP): on λᵢ = 1/i, N = 64, n = 13, C = 10, t = 5, u = 47."""
    lam = 1.0 / np.arange(1, 65)
    pi, w, e, tu = analysis.algorithm2_collective(lam, 13, 10, "printed")
    assert tu == (13, 0) and e == pytest.approx(-1.570893, abs=1e-6)
    printed = expected_discrepancy(lam, pi, np.where(pi > 0, w, 1.0), 10)
    pi, w, e, tu = analysis.algorithm2_collective(lam, 13, 10, "eq27")
    assert tu == (5, 47) and e == pytest.approx(-1.59645, abs=1e-5) and pi.sum() == pytest.approx(13)
    fixed = expected_discrepancy(lam, pi, np.where(pi > 0, w, 1.0), 10)
    closed = analysis.check_collective_optimum(lam, 13, 10)["closed_form"]
    assert fixed == pytest.approx(closed, rel=1e-9)
    assert printed == pytest.approx(0.058537, rel=1e-4) and printed > 1.7 * closed
    with pytest.raises(ValueError, match="line30"):
        analysis.algorithm2_collective(lam, 13, 10, "sign")
