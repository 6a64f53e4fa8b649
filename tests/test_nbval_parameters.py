"""The repository's conftest.py overrides a notebook's parameters under nbval as papermill would."""
import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("root_conftest", Path(__file__).resolve().parents[1] / "conftest.py")
root_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(root_conftest)


def test_only_the_parameters_a_cell_assigns_are_overridden():
    source = 'scale = None\nseeds = [0, 1, 2]  # error bars\ndata_root = None\n'
    out = root_conftest.injected_parameters(source, {"seeds": [0, 1], "table1_seeds": [7]})
    namespace: dict = {}
    exec(out, namespace)
    assert namespace["seeds"] == [0, 1] and "table1_seeds" not in namespace and namespace["scale"] is None


def test_a_cell_without_those_parameters_is_left_as_it_is():
    source = "scale = None\nseed = 0\n"
    assert root_conftest.injected_parameters(source, {"seeds": [0, 1]}) == source
    assert root_conftest.assigned_names("a = b = 1\nc: int = 2\nd += 1\n") == {"a", "b"}


def test_the_checks_keep_at_least_two_seeds():
    for name, value in root_conftest.NBVAL_PARAMETERS.items():
        assert len(value) >= 2, name   # a spread needs two
