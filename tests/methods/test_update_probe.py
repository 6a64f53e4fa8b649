"""The update probe (subfl.methods.update_probe): a method's server update against FedAvg's from the same state."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from subfl.experiments import make_config, run_experiment
from subfl.methods import make_method
from subfl.methods.update_probe import update_similarity


def test_update_similarity_by_hand():
    old = {"w": torch.zeros(1, 2), "b": torch.zeros(2)}
    new = {"w": torch.tensor([[1.0, 0.0]]), "b": torch.zeros(2)}
    ref = {"w": torch.tensor([[1.0, 1.0]]), "b": torch.tensor([0.0, 2.0])}
    out = update_similarity(old, new, ref, ["w", "b"])
    assert out[("update_cosine", "w")] == pytest.approx(1 / math.sqrt(2))  # (1,0)·(1,1) / (1·√2)
    assert out[("update_cosine", "all")] == pytest.approx(1 / math.sqrt(6))  # (1,0,0,0)·(1,1,0,2) / (1·√6)
    assert out[("update_norm_ratio", "all")] == pytest.approx(1 / math.sqrt(6))
    assert ("update_cosine", "b") not in out  # vectors (biases) only count in "all"
    assert math.isnan(update_similarity(old, old, ref, ["w"])[("update_cosine", "all")])


def _probe_config(method: str, **fields):
    return make_config("update-probe", "digits", "mlp", scale="ci", rounds=3,
                       method_options={"method": method, "method_options": {}}, **fields)


def _curve(result, metric, group="all"):
    h = result.history
    return h[(h.metric == metric) & (h.group == group)].value.to_numpy()


def test_probe_of_fedavg_is_fedavg_itself(tmp_path):
    result = run_experiment(_probe_config("fedavg"), tmp_path / "probe", cache=False)
    np.testing.assert_allclose(_curve(result, "update_cosine"), 1.0, atol=1e-9)  # same batches, same update
    np.testing.assert_allclose(_curve(result, "update_norm_ratio"), 1.0, atol=1e-9)
    plain = run_experiment(make_config("fedavg", "digits", "mlp", scale="ci", rounds=3), tmp_path / "plain", cache=False)
    assert result.final() == plain.final()


def test_probe_leaves_the_methods_trajectory_unchanged(tmp_path):
    probe = run_experiment(_probe_config("prism", heterogeneity="0.5"), tmp_path / "probe", cache=False)
    plain = run_experiment(make_config("prism", "digits", "mlp", scale="ci", rounds=3, heterogeneity="0.5"),
                           tmp_path / "plain", cache=False)
    a, b = probe.state()["weights"], plain.state()["weights"]
    assert all(torch.equal(a[k], b[k]) for k in b)
    cosines = _curve(probe, "update_cosine")
    assert len(cosines) == 3 and np.all(np.abs(cosines) <= 1) and np.all(cosines < 1 - 1e-6)  # a real sub-model
    layers = set(probe.history[probe.history.metric == "update_cosine"].group) - {"all"}
    assert layers and all(name.endswith("weight") for name in layers)
    # the probe's own tensors travel under their prefix; the method's own keep their names
    up = probe.ledger[(probe.ledger.direction == "up") & (probe.ledger.name != "__config__")]
    assert up.name.str.startswith("fedavg-probe/").any() and (~up.name.str.startswith("fedavg-probe/")).any()


def test_probe_refuses_methods_it_cannot_compare():
    with pytest.raises(ValueError, match="option method must be one of"):
        make_method("update-probe", method="caff")
    with pytest.raises(ValueError, match="option method_options must be a dict"):
        make_method("update-probe", method="prism", method_options=[1])


def test_probe_leaves_out_undefined_values_and_its_history_reads_back(tmp_path):
    # lr 1e-30: every step moves each weight by far less than half a float32 ulp, so both updates are exactly zero
    # and their cosine is undefined in every round
    result = run_experiment(_probe_config("fedavg", lr=1e-30), tmp_path / "probe", cache=False)
    h = result.history  # read back from history.csv: a NaN written there could not be read
    assert not (h.metric == "update_cosine").any() and not (h.metric == "update_norm_ratio").any()
    assert not h.value.isna().any() and result.final() == result.final()
    defined = run_experiment(_probe_config("fedavg"), tmp_path / "defined", cache=False)
    assert sorted(defined.history[defined.history.metric == "update_cosine"]["round"].unique()) == [1, 2, 3]
