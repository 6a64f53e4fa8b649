"""PriSM's IMDB setting: one optimiser for every method, sizes per scale, the reference at full width."""
import pytest

from subfl_book.imdb import imdb_config


def test_every_method_shares_the_training_and_fedavg_is_the_full_model():
    fedavg, prism = imdb_config("fedavg"), imdb_config("prism", "0.2")
    assert fedavg.heterogeneity == "1.0" and prism.heterogeneity == "0.2"
    for c in (fedavg, prism):
        assert (c.optimizer, c.lr, c.grad_clip, c.local_epochs) == ("adam", 0.003, 1.0, 1)
        assert (c.model, c.dataset, c.num_clients, c.clients_per_round, c.rounds, c.width) == \
            ("sentiment_lstm", "imdb", 10, 5, 30, 0.25)
        assert dict(c.dataset_options) == {"vocab_size": 1001, "max_len": 128, "max_train": 10000, "max_test": 2000}
    assert fedavg.replace(method="prism", heterogeneity="0.2") == prism


def test_the_embedding_has_table_8s_1001_rows():
    from subfl.experiments.runner import ModelFactory, prepare_data
    config = imdb_config("fedavg", scale="ci")
    dataset, _, _ = prepare_data(config)
    assert dataset.vocab_size == 1001
    assert ModelFactory(config, dataset)().embedding.weight.shape == (1001, 64)


def test_scales_change_sizes_only_and_overrides_come_last():
    ci = imdb_config("topn", scale="ci", seed=3, rounds=4)
    assert (ci.rounds, ci.seed, dict(ci.dataset_options)["max_len"], ci.optimizer) == (4, 3, 32, "adam")
    assert dict(imdb_config("fedavg", scale="paper").dataset_options) == {"vocab_size": 1001, "max_len": 256}
    wide = imdb_config("fedavg", dataset_options=dict(vocab_size=10000))
    assert dict(wide.dataset_options) == {"vocab_size": 10000, "max_len": 128, "max_train": 10000, "max_test": 2000}
    with pytest.raises(ValueError, match="scale='gpu'"):
        imdb_config("fedavg", scale="gpu")
