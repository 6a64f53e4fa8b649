import pytest

from subfl.experiments import ExperimentConfig, make_config, run_experiment


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(dataset="mnist"), "dataset='mnist'"),
    (dict(model="resnet99"), "model='resnet99'"),
    (dict(method="fedprox"), "method='fedprox'"),
    (dict(partition="shards"), "partition='shards'"),
    (dict(partition="dirichlet"), "alpha=None"),
    (dict(partition="dirichlet", alpha=0.0), "alpha=0.0"),
    (dict(partition="k_classes"), "classes_per_client"),
    (dict(num_clients=4, clients_per_round=5), "clients_per_round=5"),
    (dict(heterogeneity="1.5"), "keep ratio must be in (0, 1]"),
    (dict(heterogeneity="0.2:0.6,0.0:0.4"), "keep ratio must be in (0, 1]"),
    (dict(width=0), "width=0"),
    (dict(rounds=0), "rounds=0"),
    (dict(optimizer="lbfgs"), "optimizer='lbfgs'"),
    (dict(scale="gpu"), "scale='gpu'"),
    (dict(bogus=1), "unknown config field"),
    (dict(method_options={"kappa": 4}), "unknown option"),
])
def test_bad_configuration_is_named(kwargs, fragment, tmp_path):
    base = dict(method="fedavg", dataset="digits", model="mlp")
    base.update(kwargs)
    method, dataset, model = base.pop("method"), base.pop("dataset"), base.pop("model")
    scale = base.pop("scale", "ci")
    with pytest.raises(ValueError) as err:
        cfg = make_config(method, dataset, model, scale=scale, **base)
        run_experiment(cfg, tmp_path / "o", cache=False)
    assert fragment in str(err.value)


def test_missing_data_file_says_which_and_how(tmp_path):
    cfg = make_config("fedavg", "cifar10", "resnet18", scale="ci")
    with pytest.raises(FileNotFoundError) as err:
        run_experiment(cfg, tmp_path / "o", cache=False, data_root=tmp_path / "empty")
    assert "cifar10_train.npz" in str(err.value)


def test_presets_change_sizes_not_algorithm():
    ci = make_config("fedavg", "fmnist", scale="ci")
    cpu = make_config("fedavg", "fmnist", scale="cpu")
    assert ci.rounds < cpu.rounds and ci.method == cpu.method and ci.model == cpu.model == "cnn"
    assert make_config("fedavg", "fmnist", scale="cpu", rounds=3).rounds == 3
    assert ci.key() != cpu.key() and ci.key() == make_config("fedavg", "fmnist", scale="ci").key()


def test_fedavg_reference_catalog():
    from subfl_book.catalog import fedavg_reference

    cpu = fedavg_reference("cifar10", "dirichlet", 0.1, scale="cpu", seed=1)
    assert (cpu.model, cpu.width, cpu.rounds, cpu.num_clients, cpu.alpha, cpu.seed) == ("cnn", 1.0, 40, 20, 0.1, 1)
    assert fedavg_reference("fmnist", scale="ci").width == 0.25
    with pytest.raises(ValueError, match="dataset='imdb'"):
        fedavg_reference("imdb")


def test_run_versions_name_what_the_run_executes():
    from subfl.experiments.provenance import run_versions

    base = make_config("prism", "digits", scale="ci")
    versions = run_versions(base)
    assert {"engine", "data", "method:prism", "model:mlp", "dataset:digits"} == set(versions)
    # a behaviour-changing option set away from its default carries its own version; at its default it does not
    assert "method:prism.svd_solver" in run_versions(base.replace(method_options={"svd_solver": "gram"}))
    assert "method:prism.svd_solver" not in run_versions(base.replace(method_options={"svd_solver": "exact"}))
    assert run_versions(base.replace(lr_schedule="cosine"))["schedule:cosine"] == 2
    probe = run_versions(base.replace(method="update-probe", method_options={"method": "prism"}))
    assert {"method:update-probe", "method:prism", "method:fedavg"} <= set(probe)


def test_a_config_round_trips_through_its_json():
    import json
    config = make_config("caff", "shakespeare_tokens", "tiny_gpt", partition="natural", scale="ci",
                         method_options={"layers": (3,), "pretrained": "ci"}, dataset_options={"seq_len": 32})
    again = ExperimentConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    from subfl.experiments.provenance import run_key
    assert run_key(again) == run_key(config) and again.dataset_options == config.dataset_options
    with pytest.raises(TypeError, match="colour"):
        ExperimentConfig.from_dict({**config.to_dict(), "colour": "red"})
