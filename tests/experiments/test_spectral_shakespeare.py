"""Spectral sharding's Shakespeare setting: one optimiser for every method, sizes per scale, the decomposed maps."""
import math

import pandas as pd
import pytest

from subfl.experiments import run_experiment
from subfl.experiments.spectral_shakespeare import (FULL_MODEL_METHODS, gap_to_heuristics, last_evaluations_mean,
                                                     spectral_shakespeare_config)
from subfl.models import build_model
from subfl.models.factorized import layer_specs
from subfl.sampling import keep_count


def test_every_method_shares_the_training_and_fedavg_is_the_full_model():
    fedavg, collective = spectral_shakespeare_config("fedavg"), spectral_shakespeare_config("collective")
    assert fedavg.heterogeneity == "1.0" and collective.heterogeneity == "0.2"
    for c in (fedavg, collective):
        assert (c.optimizer, c.lr, c.grad_clip, c.lr_schedule, c.local_steps) == ("adam", 0.003, 1.0, "constant", 50)
        assert (c.dataset, c.model, c.partition, c.width) == ("shakespeare", "tiny_gpt", "natural", 1.0)
        assert (c.num_clients, c.clients_per_round, c.rounds, c.max_test_samples) == (100, 5, 30, 2000)
        assert dict(c.dataset_options) == {"stride": 20, "max_users": 100}
    assert fedavg.replace(method="collective", heterogeneity="0.2") == collective


def test_full_model_methods_ignore_the_keep_ratio():
    assert FULL_MODEL_METHODS == ("fedavg", "nosharding")
    for method in FULL_MODEL_METHODS:
        assert spectral_shakespeare_config(method, "0.1").heterogeneity == "1.0"
        assert spectral_shakespeare_config(method, "0.1") == spectral_shakespeare_config(method, "0.2")
    assert spectral_shakespeare_config("topn", "0.1").heterogeneity == "0.1"


def test_scales_change_sizes_only_and_overrides_come_last():
    ci = spectral_shakespeare_config("topn", "0.4", scale="ci", seed=3, rounds=1)
    assert (ci.rounds, ci.seed, ci.heterogeneity, ci.optimizer, dict(ci.dataset_options)["max_users"]) == \
        (1, 3, "0.4", "adam", 4)
    with pytest.raises(ValueError, match="scale='gpu'"):
        spectral_shakespeare_config("fedavg", scale="gpu")


def test_seventeen_of_the_eighteen_block_maps_are_decomposed_and_a_client_keeps_a_fifth_of_each():
    model = build_model("tiny_gpt", num_classes=63, input_shape=(80,), width=1.0)  # 3 blocks, embedding 96
    specs = layer_specs(model)
    maps = [f"blocks.{b}.{m}" for b in range(3) for m in ("attn.q", "attn.k", "attn.v", "attn.proj", "mlp.fc1",
                                                            "mlp.fc2")]
    assert list(specs) == maps[1:]  # the first Linear of the network (block 0's query map) and the head stay dense
    assert {s.num_terms for s in specs.values()} == {96}
    assert keep_count(96, 0.2) == 20
    assert specs["blocks.0.mlp.fc1"].weight_shape == (384, 96)


@pytest.mark.parametrize("method", ["collective", "unbiased"])
def test_the_designs_train_the_transformer_at_ci_scale(method, tmp_path, monkeypatch):
    monkeypatch.setenv("SUBFL_CACHE_DIR", str(tmp_path / "cache"))
    result = run_experiment(spectral_shakespeare_config(method, scale="ci"), progress=False)
    assert not result.diverged and 0.0 <= result.final() <= 1.0
    terms = result.history[result.history.metric == "covered_fraction"]
    assert len(terms) > 0 and terms.value.between(0, 1).all()


def test_last_evaluations_mean_averages_the_window_ending_at_the_given_round():
    rounds = [2, 4, 6, 8, 10, 12]
    curves = pd.DataFrame({"round": rounds * 2, "value": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6] + [1.0] * 6,
                           "method": ["topn"] * 12, "seed": [0] * 6 + [1] * 6})
    means = last_evaluations_mean(curves, end=10, eval_every=2, evaluations=2)   # rounds 8 and 10
    assert means.loc[("topn", 0)] == pytest.approx(0.45) and means.loc[("topn", 1)] == 1.0
    assert last_evaluations_mean(curves, end=12, eval_every=2).loc[("topn", 0)] == pytest.approx(0.4)  # 4..12


def test_gap_to_heuristics_measures_against_the_better_heuristic_in_seed_spreads():
    late = pd.DataFrame({"mean": [0.40, 0.38, 0.34, 0.395, 0.30], "std": [0.003, 0.01, 0.004, 0.004, float("nan")]},
                        index=["topn", "prism", "unbiased", "collective", "single"])
    checks = gap_to_heuristics(late)
    assert checks.loc["unbiased", "better heuristic"] == "topn"
    assert checks.loc["unbiased", "gap (points)"] == pytest.approx(-6.0)
    assert checks.loc["unbiased", "spread (points)"] == pytest.approx(0.5)   # sqrt(0.3² + 0.4²)
    assert checks.loc["unbiased", "status"] == "differs"                      # 6 points > 2 × 0.5
    assert checks.loc["collective", "gap (points)"] == pytest.approx(-0.5)
    assert checks.loc["collective", "status"] == "same"
    assert gap_to_heuristics(late, designs=("single",)).loc["single", "status"].startswith("— (one seed")
    diverged = late.assign(mean=late["mean"].where(late.index != "unbiased", math.nan))
    assert gap_to_heuristics(diverged).loc["unbiased", "status"] == "differs (diverged)"
