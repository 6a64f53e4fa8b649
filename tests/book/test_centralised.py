"""PriSM's centralised setting (Fig. 4): one client, one epoch per round, every row with batch statistics."""
import pytest

from subfl.data import default_data_root
from subfl_book.centralised import (CENTRALISED_KEEPS, CENTRALISED_METHODS, centralised_config,
                                           centralised_configs)
from subfl.experiments.runner import client_splits, prepare_data


def test_every_row_shares_the_training_and_the_full_model_is_the_reference():
    full, prism = centralised_config("fedavg"), centralised_config("prism", "0.2")
    assert full.heterogeneity == "1.0" and prism.heterogeneity == "0.2"
    for c in (full, prism):
        assert (c.model, c.dataset, c.num_clients, c.clients_per_round, c.local_epochs, c.local_steps) == \
            ("vgg11", "cifar10", 1, 1, 1, None)
        assert (c.optimizer, c.lr, c.momentum, c.weight_decay, c.lr_schedule, c.batch_size, c.norm) == \
            ("sgd", 0.05, 0.9, 5e-4, "cosine", 64, "bn_nostats")
        assert (c.width, c.rounds, c.max_train_samples, c.max_test_samples) == (0.25, 20, None, None)
    assert full.replace(method="prism", heterogeneity="0.2") == prism
    configs = centralised_configs(seed=3)
    assert len(configs) == 1 + len(CENTRALISED_METHODS) * len(CENTRALISED_KEEPS) == 13
    assert {c.seed for c in configs} == {3} and configs[0].method == "fedavg"


def test_the_one_client_holds_every_training_sample():
    config = centralised_config("topn", "0.1", scale="ci")
    dataset, _, parts = prepare_data(config, default_data_root())
    train_parts, _ = client_splits(config, parts)
    assert len(train_parts) == 1 and len(train_parts[0]) == len(dataset.train) == config.max_train_samples == 256


@pytest.mark.parametrize(("method", "keep", "scale", "message"), [
    ("splitmix", "0.2", "cpu", "method='splitmix'"), ("prism", "0.3", "cpu", "keep='0.3'"),
    ("prism", "0.2", "gpu", "scale='gpu'")])
def test_bad_arguments_name_the_parameter(method, keep, scale, message):
    with pytest.raises(ValueError, match=message):
        centralised_config(method, keep, scale=scale)
