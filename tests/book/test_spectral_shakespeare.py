"""Spectral sharding's Shakespeare setting: one optimiser for every method, sizes per scale, the decomposed maps."""
import math

import pandas as pd
import pytest

from subfl.experiments import run_experiment
from subfl_book.spectral_shakespeare import (FULL_MODEL_METHODS, last_evaluations_mean,
                                                     length_comparison, seed_summary,
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


def _two_method_curves():
    """top-n at 0.4 then 0.5 (seeds agree); prism rising 0.1 per evaluation, seeds 0.02 apart; rounds 2..8."""
    rows = []
    for seed in (0, 1):
        for round_ in (2, 4, 6, 8):
            rows.append(("topn", seed, round_, 0.4 if round_ <= 4 else 0.5))
            rows.append(("prism", seed, round_, 0.1 * round_ / 2 + 0.02 * seed))
    return pd.DataFrame(rows, columns=["method", "seed", "round", "value"])


def test_seed_summary_averages_each_run_then_the_seeds_in_the_methods_order():
    summary = seed_summary(_two_method_curves(), end=4, eval_every=2, methods=["topn", "prism", "absent"],
                           evaluations=2)
    assert list(summary.index) == ["topn", "prism", "absent"]
    assert summary.loc["topn", "mean"] == pytest.approx(0.4) and summary.loc["topn", "std"] == pytest.approx(0)
    assert summary.loc["prism", "mean"] == pytest.approx(0.16)                 # runs 0.15 and 0.17
    assert summary.loc["prism", "std"] == pytest.approx(0.02 / math.sqrt(2))   # sample sd of two values 0.02 apart
    assert math.isnan(summary.loc["absent", "mean"])


def test_length_comparison_reads_both_lengths_the_gap_the_change_and_the_best_round():
    table = length_comparison(_two_method_curves(), ends=(4, 8), eval_every=2, methods=["topn", "prism"])
    # last five evaluations up to round 4 are rounds 2 and 4; up to 8 all four rounds
    assert table.loc["topn", "last five to round 4"] == "0.4000 ± 0.0000"
    assert table.loc["prism", "gap to topn, round 4 (points)"] == pytest.approx(-24.0)   # 0.16 - 0.40
    assert table.loc["prism", "gap to topn, round 8 (points)"] == pytest.approx(-19.0)   # 0.26 - 0.45
    assert table.loc["prism", "change, round 4→8 (points)"] == pytest.approx(10.0)
    assert table.loc["prism", "best seed-mean evaluation"] == pytest.approx(0.41)        # round 8: 0.40 and 0.42
    assert table.loc["prism", "at round"] == 8 and table.loc["topn", "at round"] == 6   # first of the 0.5 rounds
    with pytest.raises(ValueError, match="ends="):
        length_comparison(_two_method_curves(), ends=(8, 4), eval_every=2, methods=["topn"])
    with pytest.raises(ValueError, match="reference="):
        length_comparison(_two_method_curves(), ends=(4, 8), eval_every=2, methods=["prism"])
