"""The leading-outputs diagnostic of PriSM's memory-efficient sub-model (subfl_book.prism_memory_eval)."""
from __future__ import annotations

import pytest
import torch

from subfl.experiments import make_config, run_experiment
from subfl_book.analysis import final_models
from subfl_book.prism_memory_eval import expected_outputs_accuracy, leading_outputs_accuracy
from subfl.experiments.runner import prepare_data
from subfl.metrics.fairness import model_predictions


def _run(method, tmp_path, **options):
    cfg = make_config(method, "digits", "mlp", scale="ci", heterogeneity="0.2", clients_per_round=2,
                      method_options=tuple(options.items()))
    return run_experiment(cfg, tmp_path / method.replace("+", "_"), cache=False, progress=False)


def test_leading_outputs_accuracy_zeroes_the_rows_the_clients_never_computed(tmp_path):
    run = _run("prism+memory", tmp_path)
    scores = leading_outputs_accuracy(run)
    assert scores["output_keep"] == 0.2 and scores["accuracy"] == pytest.approx(run.final("accuracy"))
    model = final_models(run)["global"]  # mlp 64 -> 200 -> 200 -> 10: layers.3 (200 x 200) is decomposed
    with torch.no_grad():
        model.layers[3].weight[40:] = 0.0  # keep_count(200, 0.2) = 40
    preds, truth = model_predictions(model, prepare_data(run.config)[1])
    assert scores["leading_outputs_accuracy"] == pytest.approx(float((preds == truth).mean()))
    assert leading_outputs_accuracy(run, 1.0)["leading_outputs_accuracy"] == scores["accuracy"]


def test_output_keep_is_required_or_validated(tmp_path):
    run = _run("prism", tmp_path)
    with pytest.raises(ValueError, match="output_keep is needed for a run of method 'prism'"):
        leading_outputs_accuracy(run)
    with pytest.raises(ValueError, match="output_keep=0"):
        leading_outputs_accuracy(run, 0)
    assert leading_outputs_accuracy(run, 0.5)["output_keep"] == 0.5


def test_random_row_runs_are_refused(tmp_path):
    run = _run("prism+memory", tmp_path, output_rows="random")
    with pytest.raises(ValueError, match="drew its clients. output rows at random.*use expected_outputs_accuracy"):
        leading_outputs_accuracy(run)


def test_expected_outputs_accuracy_scales_every_row_by_its_inclusion_probability(tmp_path):
    run = _run("prism+memory", tmp_path, output_rows="random")
    scores = expected_outputs_accuracy(run)
    assert scores["output_keep"] == 0.2 and scores["accuracy"] == pytest.approx(run.final("accuracy"))
    model = final_models(run)["global"]  # layers.3 (200 x 200) is decomposed; each client computes 40 rows
    with torch.no_grad():
        model.layers[3].weight.mul_(40 / 200)
    preds, truth = model_predictions(model, prepare_data(run.config)[1])
    assert scores["expected_outputs_accuracy"] == pytest.approx(float((preds == truth).mean()))
    assert expected_outputs_accuracy(run, 1.0)["expected_outputs_accuracy"] == scores["accuracy"]
    with pytest.raises(ValueError, match="output_keep=1.5"):
        expected_outputs_accuracy(run, 1.5)
