"""Cross-machine run summaries (:func:`subfl.experiments.provenance.state_summary` and friends)."""
from __future__ import annotations

import math

import pytest
import torch

from subfl.experiments.provenance import history_summary, state_summary, summary_deviation


def _state(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"weights": {"fc.weight": torch.randn(64, 32, generator=g), "fc.bias": 0.1 * torch.randn(64, generator=g)},
            "round": 3, "diagnostics": [{"rank": 25.98}]}


def test_identical_states_deviate_by_nothing():
    assert summary_deviation(state_summary(_state()), state_summary(_state())) == (0.0, "/diagnostics[0]/rank")


def test_an_ulp_level_change_of_every_entry_deviates_by_about_that_much():
    state, eps = _state(), 1e-6
    noisy = {**state, "weights": {k: v * (1 + eps * torch.randn(v.shape, generator=torch.Generator().manual_seed(1)))
                                  for k, v in state["weights"].items()}}
    worst, _ = summary_deviation(state_summary(state), state_summary(noisy))
    assert 1e-8 < worst < 5 * eps


def test_a_one_percent_change_of_one_row_is_seen():
    state = _state()
    changed = {**state, "weights": dict(state["weights"])}
    w = changed["weights"]["fc.weight"].clone()
    w[0] *= 1.01
    changed["weights"]["fc.weight"] = w
    worst, where = summary_deviation(state_summary(state), state_summary(changed))
    assert where == "/weights/fc.weight" and worst > 1e-4


def test_the_floor_keeps_a_numerically_zero_tensor_from_dominating():
    zero = {"k.bias": torch.full((6,), 3e-8)}
    other = {"k.bias": torch.full((6,), -2e-8)}
    worst, _ = summary_deviation(state_summary(zero), state_summary(other))
    assert worst < 1e-5  # 5e-8 against the floor of 1e-2 per entry


def test_missing_resized_or_exactly_different_leaves_deviate_infinitely():
    base = state_summary(_state())
    assert summary_deviation(base, state_summary({**_state(), "extra": 1})) == (math.inf, "/extra")
    assert summary_deviation(base, state_summary({**_state(), "round": 4}))[0] == math.inf
    resized = _state()
    resized["weights"]["fc.bias"] = resized["weights"]["fc.bias"][:-1]
    assert summary_deviation(base, state_summary(resized)) == (math.inf, "/weights/fc.bias")


def test_a_value_that_is_not_finite_on_one_side_only_deviates_infinitely():
    rows = [(1, "loss", 2.3, "global"), (1, "accuracy", 0.1, "global")]
    nan_rows = [(1, "loss", float("nan"), "global"), (1, "accuracy", 0.1, "global")]
    assert summary_deviation(history_summary(rows), history_summary(nan_rows)) == (math.inf, "/1/loss/global")
    assert summary_deviation(history_summary(nan_rows), history_summary(nan_rows))[0] == 0.0


def test_the_probe_directions_are_fixed_numbers():
    # every recorded golden summary holds projections on the ±1 draws of PCG64([k, n]); they must never move:
    # for x = (1, …, 8), Σ r_1 x = −4 and Σ r_2 x = 18
    expected = [8, math.sqrt(204), -4 / math.sqrt(8), 18 / math.sqrt(8)]
    assert state_summary({"w": torch.arange(1.0, 9.0)})["/w"] == [pytest.approx(v, rel=1e-12) for v in expected]
    assert state_summary({"w": torch.ones(4)}) == state_summary({"w": torch.ones(4, dtype=torch.float64)})
