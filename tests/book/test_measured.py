"""Machine-dependent results (timings, an optimiser's end point) measured once and recorded: read back unchanged, keyed on their inputs, logged for the run card."""
import json

import numpy as np
import pandas as pd
import pytest
import torch

from subfl_book import measured as m


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("SUBFL_STORE_DIR", str(tmp_path / "store"))
    monkeypatch.delenv(m.MEASURED_LOG_ENV, raising=False)
    return tmp_path / "store"


def test_a_measurement_is_made_once_then_read_back_unchanged(store):
    calls = []

    def measure():
        calls.append(torch.get_num_threads())
        return pd.DataFrame({"layer": ["conv2", "fc1"], "seconds": [0.0125, 0.75]})

    first = m.measured("svd-refresh", {"model": "cnn", "width": 0.5}, measure, scale="cpu")
    again = m.measured("svd-refresh", {"model": "cnn", "width": 0.5}, measure, scale="cpu")
    assert calls == [1]   # measured once, with the book's one torch thread
    pd.testing.assert_frame_equal(first, again)
    assert list(again.seconds) == [0.0125, 0.75]
    (path,) = (store / "measured").glob("svd-refresh-*.json")
    record = json.loads(path.read_text())
    assert record["inputs"] == {"model": "cnn", "width": 0.5} and record["machine"]["torch_threads"] == 1
    m.measured("svd-refresh", {"model": "cnn", "width": 0.25}, measure, scale="cpu")   # other inputs: measured again
    assert len(calls) == 2 and len(list((store / "measured").glob("*.json"))) == 2


def test_an_array_input_counts_by_its_values_to_nine_decimals():
    pi = np.array([0.2, 0.5, 0.3])
    assert m.measurement_key("speed", {"pi": pi}) == m.measurement_key("speed", {"pi": pi.copy()})
    # the last bits an SVD on another CPU moves do not re-key a measurement; a difference in the 9th decimal does
    assert m.measurement_key("speed", {"pi": pi}) == m.measurement_key("speed", {"pi": np.nextafter(pi, 1.0)})
    assert m.measurement_key("speed", {"pi": pi}) == m.measurement_key("speed", {"pi": pi + 1e-12})
    assert m.measurement_key("speed", {"pi": pi}) != m.measurement_key("speed", {"pi": pi + 2e-9})
    assert m.measurement_key("speed", {"n": np.arange(3)}) != m.measurement_key("speed", {"n": np.arange(3) + 1})
    assert m.measurement_key("speed", {"pi": pi}) != m.measurement_key("speed", {"pi": pi.astype(np.float32)})
    assert m.measurement_key("speed", {"pi": pi}) != m.measurement_key("other", {"pi": pi})


def test_a_mapping_result_round_trips_and_is_logged_for_the_run_card(store, tmp_path, monkeypatch):
    log = tmp_path / "measured.jsonl"
    monkeypatch.setenv(m.MEASURED_LOG_ENV, str(log))
    values = m.measured("sampler-round-ms", {"clients": 10}, lambda: {"CPS": 4.5, "Brewer": np.float64(1.25)},
                        scale="cpu")
    assert values == {"CPS": 4.5, "Brewer": 1.25}
    (entry,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert entry["file"].startswith("measured/sampler-round-ms-") and "1 torch thread" in entry["hardware"]
    assert not m.measurement_changed(entry, "cpu")
    (store / entry["file"]).write_text((store / entry["file"]).read_text().replace("4.5", "4.75"))
    assert m.measurement_changed(entry, "cpu")   # a page that read the old numbers is stale
    (store / entry["file"]).unlink()
    assert m.measurement_changed(entry, "cpu")


def test_ci_scale_measurements_stay_out_of_the_store(tmp_path, monkeypatch):
    monkeypatch.delenv("SUBFL_STORE_DIR", raising=False)
    monkeypatch.setenv("SUBFL_WORK_DIR", str(tmp_path / "work"))
    assert m.measured_root("ci") == tmp_path / "work" / "ci-store" / "measured"
    m.measured("t", {}, lambda: {"s": 1.0}, scale="ci")
    assert list((tmp_path / "work" / "ci-store" / "measured").glob("t-*.json"))


def test_bad_names_inputs_and_results_are_refused(store):
    with pytest.raises(ValueError, match="name='Bad Name' is not valid"):
        m.measured("Bad Name", {}, lambda: {"s": 1.0}, scale="cpu")
    with pytest.raises(TypeError, match="inputs: object is not accepted"):
        m.measured("t", {"x": object()}, lambda: {"s": 1.0}, scale="cpu")
    with pytest.raises(TypeError, match="DataFrame or a mapping"):
        m.measured("t", {}, lambda: [1.0], scale="cpu")
    with pytest.raises(ValueError, match="only finite numbers"):
        m.measured("t", {}, lambda: {"s": float("nan")}, scale="cpu")
    assert not (store / "measured").exists() or not list((store / "measured").glob("*.json"))


def test_a_table_with_missing_cells_round_trips(store):
    # an optimiser's table: a failed solve has no objective (NaN), which is recorded as null and read back as NaN
    measure = lambda: pd.DataFrame({"p": [4, 16], "converged": [True, False], "excess": [1e-9, float("nan")]})
    first = m.measured("schatten-slsqp", {"p": [4, 16]}, measure, scale="cpu")
    again = m.measured("schatten-slsqp", {"p": [4, 16]}, measure, scale="cpu")
    pd.testing.assert_frame_equal(first, again)
    assert first.excess.isna().tolist() == [False, True] and first.converged.tolist() == [True, False]
    with pytest.raises(ValueError, match="only finite numbers"):
        m.measured("t", {}, lambda: pd.DataFrame({"x": [float("inf")]}), scale="cpu")


def test_measuring_and_reading_back_give_the_same_order(store):
    # the record is written with sorted keys: the first call (which measures) must return what later reads return,
    # or a page executed while measuring lists its rows in another order than its re-execution from the store
    measure = lambda: {"CPS (calibration + draws)": 20.0, "Brewer": 26.4, "minimum support": 1.62}
    first = m.measured("sampler-round-ms", {"clients": 10}, measure, scale="cpu")
    again = m.measured("sampler-round-ms", {"clients": 10}, measure, scale="cpu")
    assert list(first) == list(again) == ["Brewer", "CPS (calibration + draws)", "minimum support"]
