"""subfl_book.pages.spectral.term_gradient_scales: Sec. 3.3's claim that a term's multiplier scales its gradients."""
import pytest
import torch
from torch import nn

from subfl_book.pages.spectral import term_gradient_scales


def test_each_terms_gradient_carries_its_multiplier_and_cliplr_caps_it_at_tau():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))
    rows = term_gradient_scales(model, "2", [0, 2, 5], [1.0, 20.0, 100.0], inputs=torch.randn(16, 6),
                                targets=torch.randint(0, 3, (16,)), tau=10.0)
    assert rows.term.tolist() == [0, 2, 5]
    assert rows.scale.tolist() == pytest.approx([1.0, 20.0, 100.0], rel=1e-5)
    assert rows["relative error"].max() < 1e-10  # float64
    assert rows["scale with ClipLR"].tolist() == pytest.approx([1.0, 10.0, 10.0], rel=1e-5)


def test_schatten_solver_rows_compare_slsqp_with_the_exact_solution():
    import numpy as np

    from subfl_book.pages.spectral import schatten_solver_rows

    rows = schatten_solver_rows({"1/i": 1.0 / np.arange(1, 9)}, [0.25, 0.5], [2, 4])
    assert rows[["keep ratio", "p", "n"]].values.tolist() == [[0.25, 2, 2], [0.25, 4, 2], [0.5, 2, 4], [0.5, 4, 4]]
    assert rows["SLSQP converged"].all() and rows["SLSQP optimal"].all()
    assert rows["SLSQP excess"].abs().max() < 1e-6  # both solve the same convex problem


def test_sampler_round_milliseconds_times_every_sampler():
    import numpy as np

    from subfl_book.pages.spectral import sampler_round_milliseconds

    times = sampler_round_milliseconds(np.full(8, 0.5), 3, np.random.default_rng(0), repeats=2)
    assert list(times) == ["CPS (calibration + draws)", "Brewer", "minimum support", "CPS calibration alone",
                           "one CPS draw alone"]
    assert all(t > 0 for t in times.values())
