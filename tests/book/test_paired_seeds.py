"""Tables of one method's runs in two settings, paired by seed (subfl_book.paired_seeds)."""
from __future__ import annotations

import types

import pytest

from subfl_book.paired_seeds import compare_settings, paired_points, points_label, seeds_label


def _run(seed: int, final: float | None, *, setting: str = "a", diverged_at: int = 2):
    """A stand-in for a RunResult: ``final`` None means the run diverged in round ``diverged_at``."""
    return types.SimpleNamespace(
        config=types.SimpleNamespace(seed=seed, setting=setting),
        diverged=final is None, final=lambda: float("nan") if final is None else final,
        summary={"diverged_at_round": diverged_at if final is None else None})


def test_seeds_label_mean_sd_and_seeds():
    """0.40, 0.43, 0.46: mean 0.43, sample sd 0.03; in percent 43.00 ± 3.00."""
    runs = [_run(0, 0.40), _run(1, 0.43), _run(2, 0.46)]
    assert seeds_label(runs) == "0.4300 ± 0.0300 (0.4000 / 0.4300 / 0.4600)"
    assert seeds_label(runs, percent=True, per_seed=False) == "43.00 ± 3.00"


def test_seeds_label_names_diverged_seeds_and_leaves_them_out():
    runs = [_run(0, 0.40), _run(1, None, diverged_at=1), _run(2, 0.46)]
    assert seeds_label(runs) == "0.4300 ± 0.0424 (0.4000 / diverged (round 1) / 0.4600)"
    assert seeds_label(runs, percent=True, per_seed=False) == "43.00 ± 4.24 (2 of 3 seeds)"
    one = [_run(0, 0.4068), _run(1, None, diverged_at=1), _run(2, None)]
    assert seeds_label(one) == "0.4068 (0.4068 / diverged (round 1) / diverged (round 2))"
    assert seeds_label([_run(0, None)] * 2, per_seed=False) == "diverged on every seed"
    assert seeds_label([_run(0, None, diverged_at=1), _run(1, None)]) == "diverged on every seed (rounds 1 / 2)"
    with pytest.raises(ValueError, match="runs is empty"):
        seeds_label([])


def test_paired_points_pair_by_seed_not_by_position():
    """Second setting listed in another order: seed 0 0.50 − 0.45 = +5, seed 1 0.40 − 0.44 = −4; seed 2 diverged in
    the second setting and seed 3 ran only in the first, so neither is paired."""
    first = [_run(0, 0.50), _run(1, 0.40), _run(2, 0.30), _run(3, 0.2)]
    second = [_run(2, None), _run(1, 0.44), _run(0, 0.45)]
    points = paired_points(first, second)
    assert list(points) == [0, 1]
    assert points[0] == pytest.approx(5.0) and points[1] == pytest.approx(-4.0)
    assert points_label(points) == "+0.5 (+5.0, -4.0)"
    assert points_label(points, per_seed=False) == "+0.5"
    assert points_label({}) == "—"
    with pytest.raises(ValueError, match="several runs of one seed"):
        paired_points([_run(0, 0.5), _run(0, 0.6)], second)


def test_compare_settings_rows_columns_and_shared_runs():
    shared = [_run(0, 0.52), _run(1, 0.51)]
    table = compare_settings(
        {"fedavg": (shared, shared),
         "topn": ([_run(0, 0.48), _run(1, 0.45)], [_run(0, 0.46, setting="b"), _run(1, 0.44, setting="b")]),
         "topn+scaled": ([_run(0, 0.47), _run(1, 0.44)], [])},
        ("mixed", "all at 0.2"), "gain (points)")
    assert list(table.columns) == ["mixed", "all at 0.2", "gain (points)"]
    assert list(table.index) == ["fedavg", "topn", "topn+scaled"] and table.index.name == "method"
    assert table.loc["fedavg", "all at 0.2"] == "the same runs" and table.loc["fedavg", "gain (points)"] == "—"
    assert table.loc["topn", "gain (points)"] == "+1.5 (+2.0, +1.0)"
    assert table.loc["topn+scaled", "all at 0.2"] == "—" and table.loc["topn+scaled", "gain (points)"] == "—"
    assert not table.isna().any().any()
    with pytest.raises(ValueError, match="settings=.*are not valid"):
        compare_settings({}, ("a", "a"), "d")
