"""Spectral sharding's Shakespeare setting: one optimiser for every method, sizes per scale, the decomposed maps."""
import pytest

from subfl.experiments import run_experiment
from subfl.experiments.spectral_shakespeare import FULL_MODEL_METHODS, spectral_shakespeare_config
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
