"""Scoring a run's global model cut to its top SVD terms (subfl_book.submodel_eval)."""
from __future__ import annotations

import pytest
import torch

from subfl.experiments import make_config, run_experiment
from subfl_book.analysis import final_models
from subfl.experiments.runner import prepare_data
from subfl_book.submodel_eval import edited_accuracy, top_terms_accuracy, truncate_to_top_terms
from subfl.metrics.fairness import model_predictions


@pytest.fixture(scope="module")
def topn_run(tmp_path_factory):
    cfg = make_config("topn", "digits", "mlp", scale="ci", heterogeneity="0.2", clients_per_round=2)
    return run_experiment(cfg, tmp_path_factory.mktemp("topn") / "run", cache=False, progress=False)


def test_truncation_keeps_the_top_terms_and_is_the_best_low_rank_approximation():
    torch.manual_seed(0)
    weight = torch.randn(6, 2, 3, 3)  # a convolution: its matrix is 6 x 18, N = 6
    original = weight.clone()
    truncate_to_top_terms(weight, 0.5)  # keep_count(6, 0.5) = 3 terms
    matrix = original.reshape(6, -1).double()
    s = torch.linalg.svdvals(matrix)
    assert torch.linalg.matrix_rank(weight.reshape(6, -1)).item() == 3
    assert torch.linalg.svdvals(weight.reshape(6, -1).double())[:3] == pytest.approx(s[:3].tolist(), rel=1e-5)
    # Eckart-Young: the squared error is the energy of the dropped terms
    error = ((weight.reshape(6, -1).double() - matrix) ** 2).sum().item()
    assert error == pytest.approx((s[3:] ** 2).sum().item(), rel=1e-4)
    kept = original.clone()
    truncate_to_top_terms(kept, 1.0)
    assert torch.allclose(kept, original, atol=1e-5)


def test_top_terms_accuracy_scores_the_truncated_decomposed_layers(topn_run):
    scores = top_terms_accuracy(topn_run, 0.2)
    assert scores["keep"] == 0.2 and scores["accuracy"] == pytest.approx(topn_run.final("accuracy"))
    model = final_models(topn_run)["global"]  # mlp 64 -> 200 -> 200 -> 10: only layers.3 (200 x 200) is decomposed
    with torch.no_grad():
        u, s, vh = torch.linalg.svd(model.layers[3].weight.double())
        model.layers[3].weight.copy_(((u[:, :40] * s[:40]) @ vh[:40]).float())  # keep_count(200, 0.2) = 40
    preds, truth = model_predictions(model, prepare_data(topn_run.config)[1])
    assert scores["top_terms_accuracy"] == pytest.approx(float((preds == truth).mean()))
    assert top_terms_accuracy(topn_run, 1.0)["top_terms_accuracy"] == pytest.approx(scores["accuracy"], abs=2e-3)


def test_edited_accuracy_visits_only_the_decomposed_layers(topn_run):
    seen = []
    dense, edited = edited_accuracy(topn_run, lambda name, weight: seen.append((name, tuple(weight.shape))))
    assert seen == [("layers.3", (200, 200))]
    assert dense == edited == pytest.approx(topn_run.final("accuracy"))
    _, zeroed = edited_accuracy(topn_run, lambda name, weight: weight.zero_())
    labels = prepare_data(topn_run.config)[1].y
    # with that weight zero every input gets the same output: one class is predicted for all
    assert zeroed <= torch.bincount(labels).max().item() / len(labels) + 1e-9


@pytest.mark.parametrize("keep", [0, 1.5, True, "0.2", None])
def test_keep_is_validated(topn_run, keep):
    with pytest.raises(ValueError, match=f"keep={keep!r} is not valid; accepted: a real number in \\(0, 1\\]"):
        top_terms_accuracy(topn_run, keep)
