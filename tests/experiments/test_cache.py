from subfl.experiments.cache import PACKAGE_DIR, code_fingerprint, dependency_files


def _rel(paths):
    return {p.relative_to(PACKAGE_DIR).as_posix() for p in paths}


def test_run_dependencies_follow_imports_but_not_the_method_registry():
    deps = _rel(dependency_files(("subfl.experiments.runner", "subfl.methods.fedavg")))
    for needed in ("fl/engine.py", "fl/training.py", "data/partition.py", "models/resnet.py", "methods/base.py",
                   "methods/fedavg.py", "experiments/config.py"):
        assert needed in deps
    assert "methods/__init__.py" not in deps
    assert not any(d.startswith("sampling/") for d in deps)


def test_fingerprints_are_stable_and_scoped():
    a = code_fingerprint(("subfl.methods.fedavg",))
    assert a == code_fingerprint(("subfl.methods.fedavg",))
    assert a != code_fingerprint(("subfl.experiments.runner", "subfl.methods.fedavg"))
    assert len(code_fingerprint()) == 64
