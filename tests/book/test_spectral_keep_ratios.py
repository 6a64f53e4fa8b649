"""The keep-ratios page's Fig. 2 helper (subfl_book.pages.spectral.training_loss_checkpoints; spectral App. A)."""
from __future__ import annotations

import types

import pandas as pd
import pytest

from subfl_book.pages.spectral import training_loss_checkpoints


def _run(losses: dict[int, float], *, diverged: bool = False, metric: str = "train_set_loss"):
    rows = [{"round": rnd, "metric": metric, "group": "global", "value": v} for rnd, v in losses.items()]
    rows += [{"round": rnd, "metric": "accuracy", "group": "global", "value": 0.5} for rnd in losses]
    return types.SimpleNamespace(history=pd.DataFrame(rows), diverged=diverged,
                                 config=types.SimpleNamespace(label=lambda: "run"))


def test_checkpoints_are_evenly_spaced_evaluations_ending_at_the_last():
    """20 evaluations every 2 rounds (2 … 40): quarters are rounds 10, 20, 30 and 40; a diverged run is left out;
    6 evaluations in 3 parts: the 2nd, 4th and 6th."""
    first = _run({rnd: 100.0 / rnd for rnd in range(2, 41, 2)})
    second = _run({rnd: 200.0 / rnd for rnd in range(2, 41, 2)})
    rounds, values = training_loss_checkpoints([first, second, _run({2: 1.0}, diverged=True)])
    assert rounds == [10, 20, 30, 40]
    assert values == [[10.0, 20.0], [5.0, 10.0], [pytest.approx(100 / 30), pytest.approx(200 / 30)], [2.5, 5.0]]
    rounds, _ = training_loss_checkpoints([_run({rnd: 1.0 for rnd in range(1, 7)})], parts=3)
    assert rounds == [2, 4, 6]


def test_checkpoints_refuse_runs_without_the_metric_or_of_other_schedules():
    with pytest.raises(ValueError, match="logged no 'train_set_loss'; set its train_eval_samples"):
        training_loss_checkpoints([_run({2: 1.0, 4: 0.5}, metric="loss")])
    with pytest.raises(ValueError, match="different rounds"):
        training_loss_checkpoints([_run({2: 1.0, 4: 0.5}), _run({3: 1.0, 6: 0.5})])
    with pytest.raises(ValueError, match="parts=1 is not valid"):
        training_loss_checkpoints([_run({2: 1.0})], parts=1)
