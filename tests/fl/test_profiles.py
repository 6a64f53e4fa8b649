import numpy as np
import pytest

from subfl.fl import ClientProfile, Heterogeneity, parse_heterogeneity


def test_mix_gives_exact_counts():
    h = parse_heterogeneity("0.2:0.6,0.4:0.4")
    levels = np.array([p.keep_ratio for p in h.profiles(100, seed=0, round=1)])
    assert (levels == 0.2).sum() == 60 and (levels == 0.4).sum() == 40


def test_uniform_four_groups_and_static_across_rounds():
    h = parse_heterogeneity("uniform:0.25,0.5,0.75,1.0")
    r1 = [p.keep_ratio for p in h.profiles(20, seed=3, round=1)]
    r9 = [p.keep_ratio for p in h.profiles(20, seed=3, round=9)]
    assert r1 == r9
    assert sorted(np.unique(r1, return_counts=True)[1]) == [5, 5, 5, 5]


def test_dynamic_redraws_each_round_with_the_right_frequencies():
    h = parse_heterogeneity("dynamic:0.2:0.6,0.4:0.4")
    assert h.dynamic
    rounds = [[p.keep_ratio for p in h.profiles(50, seed=1, round=r)] for r in range(1, 201)]
    assert rounds[0] != rounds[1]
    share = np.mean(np.array(rounds) == 0.2)
    assert abs(share - 0.6) < 0.02  # 10 000 draws: sd ≈ 0.005


def test_homogeneous_and_groups():
    h = parse_heterogeneity("homogeneous")
    assert h.is_homogeneous and h.profiles(3, 0, 1)[0].group == "1"
    assert parse_heterogeneity("0.2").profiles(2, 0, 1)[1].keep_ratio == 0.2


@pytest.mark.parametrize("spec, fragment", [
    ("1.5", "keep ratio must be in (0, 1]"),
    ("0", "keep ratio must be in (0, 1]"),
    ("0.2:0.5,0.4:0.4", "sum to 1"),
    ("uniform:", "not a valid spec"),
    ("", "non-empty"),
])
def test_bad_specs_are_named(spec, fragment):
    with pytest.raises(ValueError, match="heterogeneity") as err:
        parse_heterogeneity(spec)
    assert fragment in str(err.value)


def test_profile_validation():
    with pytest.raises(ValueError, match="keep_ratio"):
        ClientProfile(0, keep_ratio=0.0)
    with pytest.raises(ValueError, match="memory_mb"):
        ClientProfile(0, memory_mb=-1)
    assert Heterogeneity((0.5,), (1.0,)).describe() == "100% at 0.5"
