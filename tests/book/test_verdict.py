"""The book's verdict rule, with numbers."""
import math

import pytest

from subfl_book.verdict import (MIN_SEEDS, STATUSES, Band, Verdict, fmt_deviation, fmt_residue, judge_best, judge_bound,
                                judge_exact, judge_order, judge_trend, rounding_tolerance)


def test_band_mean_and_sample_sd():
    band = Band.of([0.60, 0.62, 0.64])
    assert band.mean == pytest.approx(0.62)
    assert band.sd == pytest.approx(0.02)          # sample sd (n − 1)
    assert (band.low, band.high) == pytest.approx((0.60, 0.64))
    assert Band.of(0.5).sd == 0.0 and Band.of(0.5).n == 1


def test_diverged_seed_counts_at_chance_when_given():
    assert Band.of([float("nan"), 0.3], chance=0.1).values == (0.1, 0.3)
    assert not Band.of([float("nan"), 0.3]).finite


@pytest.mark.parametrize("printed, tol", [(3.27, 0.005), (10815, 0.5), (0.8, 0.05), (73.25, 0.005), (100, 0.5),
                                          ("2.50", 0.005)])
def test_rounding_tolerance_is_half_the_last_digit(printed, tol):
    assert rounding_tolerance(printed) == pytest.approx(tol)


def test_exact_within_and_beyond_rounding():
    assert judge_exact(3.27, 3.274).status == "exact"
    assert judge_exact(3.27, 3.276).status == "differs"
    assert judge_exact(10815, 10815.4).status == "exact"
    assert judge_exact(10815, 10816).status == "differs"
    assert judge_exact(1.0, 1.2, tolerance=0.25).status == "exact"
    assert judge_exact(1.0, math.nan).status == "differs"
    with pytest.raises(ValueError, match="tolerance"):
        judge_exact(1.0, 1.0, tolerance=-1)


def test_roundoff_deviations_read_the_same_on_any_machine():
    # 2.8e-16 and 2.3e-15 are what one check gives on 1 and 2 threads: both are shown as float64 roundoff
    assert judge_exact(0.0, 2.8e-16, tolerance=1e-6).reason == "|Δ| < 1e-12 ≤ 1e-06 (tolerance)"
    assert judge_exact(0.0, 2.3e-15, tolerance=1e-6).reason == "|Δ| < 1e-12 ≤ 1e-06 (tolerance)"
    assert judge_exact(0.0, 0.0, tolerance=1e-6).reason == "|Δ| = 0 ≤ 1e-06 (tolerance)"    # a deterministic zero
    assert judge_exact(0.0, 0.0, tolerance=1e-6, residue=True).reason == "|Δ| < 1e-12 ≤ 1e-06 (tolerance)"  # 1e-17 there
    assert judge_exact(57.93, 57.93 + 1e-14).reason == "|Δ| < 1e-12 ≤ 0.005 (rounding)"
    assert judge_exact(0.0, 2e-13, tolerance=0).status == "differs"            # the floor changes the text, not the verdict
    assert judge_exact(0.0, 2e-13, tolerance=0).reason == "|Δ| < 1e-12 > 0 (tolerance)"
    assert fmt_deviation(4.4e-07) == "4.4e-07" and fmt_deviation(math.nan) == "nan"


def test_live_residues_show_their_bound_not_their_digits():
    # one float32 identity of the PriSM costs page gave 4.4e-07 on one CPU and 1.7e-06 on another: both read the same
    assert judge_exact(0.0, 4.4e-07, tolerance=1e-5, residue=True).reason == \
        judge_exact(0.0, 1.7e-06, tolerance=1e-5, residue=True).reason == "|Δ| ≤ 1e-05 (tolerance)"
    assert judge_exact(0.0, 3.1e-11, tolerance=1e-6, residue=True).reason == "|Δ| ≤ 1e-06 (tolerance)"
    # a failed check shows what it missed by
    assert judge_exact(0.0, 2.3, tolerance=1e-6, residue=True) == Verdict("differs", "|Δ| = 2.3 > 1e-06 (tolerance)")
    assert judge_exact(0.0, -2e-5, tolerance=1e-5, residue=True).status == "differs"
    # a deterministic gap within a tolerance (a Monte-Carlo error, n − r·N) keeps its digits
    assert judge_exact(0.0, 0.8, tolerance=1.0).reason == "|Δ| = 0.8 ≤ 1 (tolerance)"
    assert judge_exact(0.0, 3.1e-11, tolerance=1e-6).reason == "|Δ| = 3.1e-11 ≤ 1e-06 (tolerance)"
    # the printed-digit path keeps the difference: a value against a paper's number is not a residue
    assert judge_exact(3.27, 3.273).reason == "|Δ| = 0.003 ≤ 0.005 (rounding)"
    assert [fmt_residue(v, 1e-5) for v in (0.0, 3e-16, 4.4e-07, 1e-5, 2.2e-5, -3e-5, math.inf)] == \
        ["< 1e-12", "< 1e-12", "≤ 1e-05", "≤ 1e-05", "2.2e-05", "-3e-05", "inf"]
    assert [fmt_residue(v, 0) for v in (0, 2, 2e-13)] == ["0", "2", "< 1e-12"]   # integer identities are exact
    assert fmt_residue(5e-13, 1e-13) == "5e-13"        # above a tolerance finer than the floor: a miss, with its digits
    with pytest.raises(ValueError, match="tolerance"):
        fmt_residue(1.0, -1.0)


def test_order_same_differs_and_overlap():
    a, b = Band.of([0.70, 0.72, 0.74]), Band.of([0.60, 0.61, 0.62])
    assert judge_order(85.0, 80.0, a, b).status == "same"           # paper a > b, ours a > b, apart
    assert judge_order(80.0, 85.0, a, b).status == "differs"        # paper a < b
    close = Band.of([0.62, 0.65, 0.68])                              # 0.65 ± 0.03 overlaps 0.61 ± 0.01? 0.62 > 0.62?
    assert judge_order(85.0, 80.0, close, Band.of([0.60, 0.63, 0.66])).status == "inconclusive"
    assert judge_order(85.0, 80.0, Band.of([0.7, 0.7]), Band.of([0.1, 0.1])).status == "inconclusive"  # 2 seeds


def test_order_needs_min_seeds_on_both_sides():
    three, two = Band.of([0.7, 0.71, 0.72]), Band.of([0.2, 0.21])
    v = judge_order(1.0, 0.0, three, two)
    assert v.status == "inconclusive" and f"2 seeds < {MIN_SEEDS}" in v.reason


def test_order_near_chance_only_when_every_value_is_near_chance():
    low1, low2 = Band.of([0.11, 0.12, 0.13]), Band.of([0.15, 0.16, 0.17])
    # chance 0.1: near chance below 0.1 + 0.1 · 0.9 = 0.19
    assert judge_order(80.0, 70.0, low1, low2, chance=0.1).status == "near-chance"
    high = Band.of([0.60, 0.61, 0.62])
    assert judge_order(80.0, 70.0, high, low1, chance=0.1).status == "same"     # one at chance, one learned
    assert judge_order(70.0, 80.0, high, low1, chance=0.1).status == "differs"
    # lower-is-better metrics (perplexity) have no chance gate
    assert judge_order(3.0, 4.0, Band.of([3.1, 3.2, 3.3]), Band.of([4.0, 4.1, 4.2]), chance=0.1,
                       higher_is_better=False).status == "same"


def test_order_with_equal_paper_values():
    a, b = Band.of([0.60, 0.61, 0.62]), Band.of([0.605, 0.615, 0.625])
    assert judge_order(5.0, 5.0, a, b).status == "inconclusive"
    assert judge_order(5.0, 5.0, a, Band.of([0.8, 0.81, 0.82])).status == "differs"


def test_ci_scale_never_decides_a_learned_claim():
    a, b = Band.of([0.9, 0.91, 0.92]), Band.of([0.1, 0.11, 0.12])
    assert judge_order(2.0, 1.0, a, b, scale="ci").status == "inconclusive"
    assert judge_exact(3.27, 3.27).status == "exact"     # analytic quantities do not depend on the scale


def test_bound_sides_and_straddle():
    assert judge_bound(2.0, Band.of([1.0, 1.2, 1.4]), at_most=True).status == "same"       # 1.2 ± 0.2 ≤ 2
    assert judge_bound(2.0, Band.of([2.4, 2.6, 2.8]), at_most=True).status == "differs"    # 2.6 ± 0.2 > 2
    assert judge_bound(2.0, Band.of([1.5, 2.0, 2.5]), at_most=True).status == "inconclusive"
    assert judge_bound(10.0, Band.of([12, 13, 14]), at_most=False).status == "same"
    assert judge_bound(10.0, Band.of([5, 6, 7]), at_most=False).status == "differs"


def test_trend_pairwise():
    up = [Band.of([0.5, 0.51, 0.52]), Band.of([0.6, 0.61, 0.62]), Band.of([0.7, 0.71, 0.72])]
    assert judge_trend([1, 2, 3], up).status == "same"
    assert judge_trend([3, 2, 1], up).status == "differs"
    flat = [Band.of([0.5, 0.55, 0.6]), Band.of([0.52, 0.56, 0.6]), Band.of([0.7, 0.71, 0.72])]
    v = judge_trend([1, 2, 3], flat)
    assert v.status == "inconclusive" and "1 of 2" in v.reason
    with pytest.raises(ValueError, match="trend"):
        judge_trend([1], up[:1])


def test_best_of_is_judged_against_every_rival():
    """IMDB's Fig. 7 at 3 seeds: PriSM 82.5 ± 0.56 is ahead of SplitMix (81.0 ± 0.79, the best rival mean) beyond
    the bands, but OrthDrop's 80.5 ± 2.0 band reaches 82.5, so "PriSM is the best" is not shown."""
    prism = Band.of([81.9, 83.0, 82.65])
    splitmix, orthdrop, origdrop = Band.of([81.7, 81.15, 80.15]), Band.of([82.15, 78.25, 81.0]), \
        Band.of([79.65, 72.95, 79.8])
    assert judge_order(1, 0, prism, splitmix).status == "same"
    v = judge_best(prism, [splitmix, orthdrop, origdrop])
    assert v.status == "inconclusive" and "1 of 3" in v.reason          # OrthDrop's band overlaps PriSM's
    assert judge_best(prism, [splitmix]).status == "same"
    assert judge_best(splitmix, [prism, orthdrop]).status == "differs"   # PriSM ahead of it beyond the bands
    named = judge_best(prism, [splitmix, orthdrop], names=["SplitMix", "OrthDrop"])
    assert named.reason == "1 of 2 rivals within the seed spread (OrthDrop)"
    assert judge_best(splitmix, [prism], names=["PriSM"]).reason == "PriSM ahead beyond the seed spread"
    with pytest.raises(ValueError, match="names"):
        judge_best(prism, [splitmix], names=["a", "b"])
    loss = judge_best(Band.of([1.0, 1.1, 1.05]), [Band.of([2.0, 2.1, 2.2])], higher_is_better=False)
    assert loss.status == "same"
    assert judge_best(Band.of([10.5, 10.6, 10.4]), [Band.of([10.2, 10.1, 10.3])], chance=10).status == "near-chance"
    assert judge_best(prism, [Band.of([80.0, 81.0])]).status == "inconclusive"   # 2 seeds
    with pytest.raises(ValueError, match="rival"):
        judge_best(prism, [])


def test_no_run_and_unknown_status():
    assert judge_order(1, 0, Band.of([]), Band.of([0.1, 0.2, 0.3])).status == "not-run"
    assert set(STATUSES) == {"exact", "same", "differs", "inconclusive", "near-chance", "not-run"}
    with pytest.raises(ValueError, match="status"):
        Verdict("meets the bar", "")


def test_analytic_quantities_skip_the_seed_and_scale_gates():
    one, other = Band.of(5.0), Band.of(3.0)
    assert judge_order(2, 1, one, other).status == "inconclusive"                 # one seed: a learned quantity
    assert judge_order(2, 1, one, other, analytic=True, scale="ci").status == "same"
    assert judge_order(1, 2, one, other, analytic=True).status == "differs"
    assert judge_bound(90.0, Band.of(93.7), at_most=False, analytic=True).status == "same"
    assert judge_bound(90.0, Band.of(85.0), at_most=False, analytic=True).status == "differs"
    assert judge_trend([1, 2, 3], [Band.of(1.0), Band.of(2.0), Band.of(2.5)], analytic=True).status == "same"
    assert judge_order(2, 1, Band.of(math.nan), other, analytic=True).status == "differs"


def test_register_numbers_keep_their_printed_rounding():
    from subfl_book.claims import PrintedFloat
    assert rounding_tolerance(PrintedFloat(4.0, "4.0")) == pytest.approx(0.05)   # "4.0M" is not "4M"
    assert rounding_tolerance(4.0) == pytest.approx(0.5)
    assert judge_exact(PrintedFloat(4.0, "4.0"), 3.96).status == "exact"
    assert judge_exact(PrintedFloat(4.0, "4.0"), 3.3).status == "differs"


def test_near_chance_in_percent_as_in_fractions():
    # 10 classes: near chance below 10 + 0.1 · 90 = 19 % (or 0.19)
    low1, low2 = Band.of([11.0, 12.0, 13.0]), Band.of([15.0, 16.0, 17.0])
    assert judge_order(80.0, 70.0, low1, low2, chance=10.0).status == "near-chance"
    assert judge_order(80.0, 70.0, Band.of([60.0, 61.0, 62.0]), low1, chance=10.0).status == "same"
    # 100 classes in percent: chance 1 %, near chance below 10.9 %
    assert judge_order(2.0, 1.0, Band.of([5.0, 6.0, 7.0]), Band.of([2.0, 2.5, 3.0]), chance=1.0).status == "near-chance"


def test_analytic_reasons_name_no_seed_spread():
    """Deterministic quantities have no seed spread, so their reason says so instead of citing one."""
    one, two = Band.of(2.0), Band.of(1.0)
    assert judge_order(2.0, 1.0, one, two, analytic=True).reason == "the paper's ordering holds (deterministic values)"
    assert judge_order(1.0, 2.0, one, two, analytic=True).reason == \
        "the opposite ordering holds (deterministic values)"
    assert judge_trend([1, 2, 3], [Band.of(1.0), Band.of(2.0), Band.of(3.0)], analytic=True).reason == \
        "every step goes the paper's way (deterministic values)"
    assert judge_best(one, [two], names=["B"], analytic=True).reason == "ahead of all 1 rivals (deterministic values)"
    assert judge_order(2.0, 1.0, Band.of([2.0, 2.1, 2.2]), Band.of([1.0, 1.1, 1.2])).reason == \
        "the paper's ordering holds beyond the seed spread"


def test_seed_ordering_is_judge_orders_band_test_on_summaries():
    from subfl_book.verdict import bands_apart, seed_ordering
    assert bands_apart(0.60, 0.01, 0.55, 0.02) and not bands_apart(0.60, 0.03, 0.55, 0.02)   # 0.05 vs sd sum 0.03 / 0.05
    assert seed_ordering((0.60, 0.01, 3), (0.55, 0.02, 3)) == "ahead"
    assert seed_ordering((0.60, 0.01, 3), (0.55, 0.02, 3), higher_is_better=False) == "behind"
    assert seed_ordering((0.60, 0.03, 3), (0.55, 0.02, 3)) == "within seed spread"
    assert seed_ordering((0.60, 0.01, 2), (0.55, 0.02, 3)) == "inconclusive (n < 3)"
    assert seed_ordering((float("nan"), 0.0, 3), (0.55, 0.02, 3)) == "diverged"
    # the same values through judge_order: one rule
    first, second = Band.of([0.59, 0.60, 0.61]), Band.of([0.53, 0.55, 0.57])
    assert judge_order(2.0, 1.0, first, second).status == "same"
    assert seed_ordering((first.mean, first.sd, 3), (second.mean, second.sd, 3)) == "ahead"
    wide = Band.of([0.56, 0.60, 0.64])
    assert judge_order(2.0, 1.0, wide, second).status == "inconclusive"
    assert seed_ordering((wide.mean, wide.sd, 3), (second.mean, second.sd, 3)) == "within seed spread"
