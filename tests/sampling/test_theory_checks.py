"""Numerical checks of spectral sharding's smaller claims (subfl.sampling.analysis): Eq. (9), Sec. 3.2.1,
Remark B.1, Sec. 1, Eqs. (26)-(27), Remark B.2, Sec. 3.2.3, Eq. (10) and Algorithm 1."""
import numpy as np
import pytest
import torch

from subfl import sampling
from subfl.sampling import analysis

LAM8 = 1.0 / np.arange(1, 9)


@pytest.mark.parametrize("design", analysis.JOINT_LAW_DESIGNS)
def test_joint_laws_are_distributions_with_the_requested_marginals(design):
    pi = sampling.unbiased_inclusion(LAM8, 3)  # pi = [1, 0.49, 0.33, ...]: one certain term
    law = analysis.joint_law(pi, design)
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-12)
    assert all(len(s) == 3 and 0 in s for s in law)
    np.testing.assert_allclose(analysis.law_marginals(law, 8), pi, atol=1e-9)


def test_joint_laws_match_the_library_samplers_frequencies():
    pi = sampling.unbiased_inclusion(LAM8, 3)
    rng = np.random.default_rng(0)
    cps = sampling.cps_design(pi)
    for design, draw in (("cps", lambda g: cps.sample(g)), ("brewer", lambda g: sampling.sample_brewer(pi, g)),
                         ("min_support", lambda g: sampling.sample_min_support(pi, g))):
        law = analysis.joint_law(pi, design)
        counts = {}
        for _ in range(4000):
            key = tuple(int(i) for i in draw(rng))
            counts[key] = counts.get(key, 0) + 1
        assert set(counts) <= set(law)
        worst = max(abs(counts.get(s, 0) / 4000 - q) for s, q in law.items())
        assert worst < 0.03, design


def test_cps_has_the_largest_entropy_and_min_support_the_smallest_support():
    rows = {r["design"]: r for r in analysis.sampler_entropy_rows(sampling.unbiased_inclusion(LAM8, 3))}
    h = {k: r["entropy (nats)"] for k, r in rows.items()}
    assert h["cps"] == pytest.approx(2.759677, abs=1e-5)
    assert h["max-entropy (SLSQP)"] == pytest.approx(h["cps"], abs=1e-6)
    assert h["brewer"] < h["cps"] and h["brewer"] == pytest.approx(2.759629, abs=1e-5)
    assert h["min_support"] == pytest.approx(1.488816, abs=1e-5)
    assert rows["min_support"]["samples in the support"] == 6 <= 7  # at most M = 7 random items
    assert rows["cps"]["samples in the support"] == 21  # every 3-set holding the certain term


def test_eq9_expected_multiplier_sum_is_n():
    for n in (2, 3, 4):
        out = analysis.multiplier_sum_check(LAM8, n)
        assert out["expected multiplier sum"] == pytest.approx(8.0, rel=1e-9)
        assert out["max multiplier"] >= out["N / n"]
    assert analysis.multiplier_sum_check(LAM8, 2)["max multiplier"] == pytest.approx(10.871428571, rel=1e-8)


def test_only_horvitz_thompson_multipliers_are_unbiased_and_fixed_ones_beat_random_ones():
    rows = {r["multipliers"].split(",")[0].split(" ×")[0]: r for r in analysis.multiplier_bias_rows(LAM8, 3, clients=10)}
    assert rows["1/π (Horvitz-Thompson)"]["relative bias"] < 1e-9
    assert rows["1 (no compensation)"]["relative bias"] == pytest.approx(0.346938, abs=1e-5)
    assert rows["C/(1+(C−1)π)"]["relative bias"] == pytest.approx(0.098577, abs=1e-5)
    assert rows["+Scaled"]["relative bias"] == pytest.approx(0.338579, abs=1e-5)
    assert rows["1/π"]["relative bias"] < 1e-9  # random factor of mean 1: still unbiased ...
    assert rows["1/π"]["relative error"] == pytest.approx(1.025894, abs=1e-5)  # ... but a larger error
    assert rows["1/π (Horvitz-Thompson)"]["relative error"] == pytest.approx(0.620715, abs=1e-5)


def test_remark_b1_every_sample_is_balanced():
    for n in (2, 3, 4):
        out = analysis.balance_check(LAM8, n)
        assert out["max relative deviation"] < 1e-12
    w = torch.as_tensor(np.random.default_rng(1).standard_normal((12, 20)))
    worst = analysis.nuclear_balance_monte_carlo(w, 3, sampling.sample_brewer, np.random.default_rng(2), 50)
    assert worst < 1e-10


def test_single_client_optimum_is_top_n():
    out = analysis.single_client_optimum(LAM8, 3)
    top = float(np.sum(LAM8[3:] ** 2))
    assert out["top-n error"] == pytest.approx(top) == pytest.approx(0.16631094, rel=1e-7)
    assert out["best fixed sample"] == pytest.approx(top)
    assert out["SLSQP over (π, ω)"] >= top - 1e-9
    assert out["library C = 1 design ≠ top-n"] == 0 and out["shortfall of top-n"] < 1e-9


def test_eq26_eq27_per_term_objective():
    out = analysis.collective_terms_check(1.0 / np.arange(1, 65), 13, 10)
    assert (out["t"], out["u"]) == (5, 47)
    assert out["sqrt(beta)"] == pytest.approx(0.0599161430, rel=1e-8)
    for key in ("max |πω − Eq. 26|", "max |F − Eq. 27| / λ₁²", "|ΣF + Σλ² − Eq. 7| / Σλ²"):
        assert out[key] < 1e-12


def test_remark_b2_collective_tends_to_theorem_3_1():
    rows = analysis.large_c_rows(1.0 / np.arange(1, 65), 13, [10, 1000, 10**6])
    assert rows[0]["terms never drawn"] == 12 and rows[0]["Collective / Unbiased error"] == pytest.approx(0.569782, abs=1e-5)
    assert rows[-1]["max |πω − 1| (kept terms)"] < 1e-4 and rows[-1]["terms never drawn"] == 0
    assert rows[-1]["max |π − π(Thm 3.1)|"] < 1e-5
    assert all(r["Collective / Unbiased error"] <= 1.0 for r in rows)


def test_eq10_bound_holds_and_its_bracket_is_exact():
    rows = analysis.schatten_bound_rows(LAM8, 3, [2, 4])
    assert rows[1]["E‖W−Ŵ‖_p / bound"] == pytest.approx(0.975872, abs=1e-5)
    for r in rows:
        assert r["E‖W−Ŵ‖_p"] <= r["bound (Eq. 10)"]
        assert r["|E‖W−Ŵ‖_p^p − bracket| / bracket"] < 1e-9
    p4 = sampling.schatten_discrepancy(LAM8, sampling.unbiased_inclusion(LAM8, 3), 4.0)
    assert rows[1]["bound (Eq. 10)"] == pytest.approx(p4 ** 0.25, rel=1e-12)


def test_algorithm1_as_printed_matches_water_filling():
    out = analysis.algorithm1_check(1.0 / np.arange(1, 65), 13)
    assert (out["t*"], out["admissible t"], out["t = n−1 admissible"]) == (3, 10, True)
    assert out["max |π − π(library)|"] < 1e-12 and out["relative gap"] == pytest.approx(0.0, abs=1e-12)
    rng = np.random.default_rng(3)
    for _ in range(20):
        lam = np.sort(rng.pareto(1.5, 40) + 0.01)[::-1]
        n = int(rng.integers(1, 39))
        assert analysis.algorithm1_check(lam, n)["max |π − π(library)|"] < 1e-12
    with pytest.raises(ValueError):
        analysis.algorithm1_unbiased(np.arange(1.0, 5.0), 2)  # increasing
