from subfl.experiments.cache import PACKAGE_DIR, code_fingerprint, dependency_files


def _rel(paths):
    return {p.relative_to(PACKAGE_DIR).as_posix() for p in paths}


def test_run_dependencies_follow_imports_but_not_the_registries():
    deps = _rel(dependency_files(("subfl.experiments.runner", "subfl.methods.fedavg")))
    for needed in ("fl/engine.py", "fl/training.py", "data/partition.py", "models/registry.py", "models/norm.py",
                   "methods/base.py", "methods/fedavg.py", "experiments/config.py"):
        assert needed in deps
    # neither the method registry nor the model table, nor any architecture the run does not name
    for absent in ("methods/__init__.py", "models/names.py", "models/resnet.py", "models/cnn.py",
                   "models/char_rnn.py", "models/transformers.py"):
        assert absent not in deps
    assert not any(d.startswith("sampling/") for d in deps)
    with_model = _rel(dependency_files(("subfl.experiments.runner", "subfl.methods.fedavg", "subfl.models.cnn")))
    assert with_model - deps == {"models/cnn.py"}


def test_run_key_covers_the_named_model_only(monkeypatch):
    from subfl.experiments import make_config
    from subfl.experiments.runner import run_code_fingerprint
    from subfl.models import names

    cnn = make_config("fedavg", "digits", model="cnn", scale="ci")
    mlp = make_config("fedavg", "digits", model="mlp", scale="ci")
    before = run_code_fingerprint(cnn), run_code_fingerprint(mlp)
    assert before[0] != before[1]
    # changing the mlp's table entry (its default norm) re-keys mlp runs and leaves cnn runs alone
    specs = dict(names._SPECS)
    specs["mlp"] = names.ModelSpec("mlp", specs["mlp"].constructor, "bn", ("hidden",))
    monkeypatch.setattr("subfl.models.registry._SPECS", specs)
    assert run_code_fingerprint(cnn) == before[0]
    assert run_code_fingerprint(mlp) != before[1]


def test_fingerprints_are_stable_and_scoped():
    a = code_fingerprint(("subfl.methods.fedavg",))
    assert a == code_fingerprint(("subfl.methods.fedavg",))
    assert a != code_fingerprint(("subfl.experiments.runner", "subfl.methods.fedavg"))
    assert len(code_fingerprint()) == 64


def test_external_datasets_are_keyed_by_their_own_loader_module():
    from subfl.experiments import make_config
    from subfl.experiments.runner import run_code_fingerprint

    deps = _rel(dependency_files(("subfl.experiments.runner", "subfl.methods.fedavg")))
    assert "data/names.py" not in deps and "data/tokenizer.py" not in deps
    assert "experiments/pretraining.py" not in deps
    builtin = make_config("fedavg", "digits", model="mlp", scale="ci")
    external = builtin.replace(dataset="cifar10_downstream", model="cnn")
    assert "experiments/pretraining.py" in _rel(dependency_files(
        ("subfl.experiments.runner", "subfl.methods.fedavg", "subfl.experiments.pretraining")))
    assert run_code_fingerprint(external) != run_code_fingerprint(external.replace(dataset="cifar10"))
