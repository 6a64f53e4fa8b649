"""subfl_book.pages.spectral: the per-seed summaries of the heterogeneity page (Fig. 3's early / final leads)."""
import pytest

from subfl_book.pages.spectral import best_by_mean, lead_per_seed, mean_sd_label

PER_SEED = {("0.1", "topn"): [50.0, 52.0, 54.0], ("0.1", "prism"): [49.0, 53.0, 51.0],
            ("0.1", "collective"): [48.0, 46.0, 58.0], ("0.1", "short"): [40.0]}


def test_mean_sd_label_uses_the_sample_standard_deviation():
    assert mean_sd_label([50.0, 52.0, 54.0], 1) == "52.0 ± 2.0"
    assert mean_sd_label([0.5]) == "0.500"
    assert mean_sd_label([0.5, float("nan"), float("nan")]) == "diverged (2 of 3 seeds)"   # not "nan ± nan"
    with pytest.raises(ValueError, match="at least one"):
        mean_sd_label([])


def test_best_by_mean_picks_the_highest_mean_not_the_highest_seed():
    # collective holds the single best seed (58) but prism the better mean (51.0 against 50.67)
    assert best_by_mean(PER_SEED, "0.1", ["collective", "prism"]) == "prism"
    tie = {("a", "x"): [1.0, 3.0], ("a", "y"): [2.0, 2.0]}
    assert best_by_mean(tie, "a", ["y", "x"]) == "y" and best_by_mean(tie, "a", ["x", "y"]) == "x"   # first listed
    assert best_by_mean(PER_SEED, "0.1", ["topn", "prism"]) == "topn"   # 52 > 51
    with pytest.raises(ValueError, match="at least one"):
        best_by_mean(PER_SEED, "0.1", [])


def test_lead_per_seed_subtracts_the_best_rival_seed_by_seed():
    assert lead_per_seed(PER_SEED, "0.1", "topn", ["prism", "collective"]) == [1.0, -1.0, 3.0]
    with pytest.raises(ValueError, match="the same seeds"):
        lead_per_seed(PER_SEED, "0.1", "topn", ["short"])
