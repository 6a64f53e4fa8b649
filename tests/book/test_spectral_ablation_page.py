"""The ablations page's helpers for PriSM's sampling ablation (subfl_book.pages.spectral; PriSM Sec. 4.5, Table 5)."""
from __future__ import annotations

import types

import numpy as np
import pytest

from subfl.sampling import softmax_probabilities, wallenius_inclusion
from subfl_book.catalog import spectral_ablation_configs, split_name
from subfl_book.pages.spectral import PRISM_SAMPLING_TABLE, final_layer_spectra, sampling_distribution_rows


def _label(cfg) -> str:
    return " ".join([cfg.method, *(f"{k}={v}" for k, v in cfg.method_options)])


def test_prism_table5_runs_its_three_rows_in_the_papers_order():
    """Uniform, softmax, PriSM, built alike (keep ratio 0.2, lr 0.005, Dirichlet(0.1)) and differing only in their
    method options, so the uniform and PriSM runs keep the configs (and stored runs) they had before softmax."""
    for seed in (0, 1):
        configs = spectral_ablation_configs(PRISM_SAMPLING_TABLE, scale="cpu", seed=seed)
        assert [_label(c) for c in configs] == ["prism kappa=0.0", "prism weighting=softmax", "prism"]
        softmax, prism = configs[1], configs[2]
        assert softmax == prism.replace(method_options={"weighting": "softmax"})
        assert softmax.lr == 0.005 and softmax.heterogeneity == "0.2" and softmax.seed == seed


def test_ablations_run_on_other_label_splits_and_refuse_bad_ones():
    """Table 5 of PriSM has i.i.d and alpha = 1 columns: the same three runs on those splits differ from the default
    (Dirichlet(0.1)) runs in the partition alone, and the default split keeps the configs it had."""
    default = spectral_ablation_configs(PRISM_SAMPLING_TABLE, scale="cpu")
    assert spectral_ablation_configs(PRISM_SAMPLING_TABLE, scale="cpu", split="0.1") == default
    assert [(c.partition, c.alpha) for c in default] == [("dirichlet", 0.1)] * 3
    for split, partition, alpha in (("iid", "iid", None), ("1", "dirichlet", 1.0)):
        configs = spectral_ablation_configs(PRISM_SAMPLING_TABLE, scale="cpu", split=split)
        assert [c.replace(partition="dirichlet", alpha=0.1) for c in configs] == default
        assert {(c.partition, c.alpha) for c in configs} == {(partition, alpha)}
    for bad in ("dirichlet", "0", "-1", "nan", 1.0):
        with pytest.raises(ValueError, match="split=.*accepted: 'iid' or a Dirichlet"):
            spectral_ablation_configs(PRISM_SAMPLING_TABLE, scale="cpu", split=bad)
        with pytest.raises(ValueError, match="split=.*accepted: 'iid' or a Dirichlet"):
            split_name(bad)
    assert [split_name(s) for s in ("iid", "1", "0.1")] == ["i.i.d", "Dirichlet(1)", "Dirichlet(0.1)"]


def test_sampling_distribution_rows_on_known_spectra():
    """A flat spectrum: all three distributions are uniform, π = n / N = 2/10 and the kept share 0.2. Uniform
    sampling keeps n / N of ‖W‖² whatever the spectrum (0.4 with n = 2 of 5). Softmax of (ln 4, ln 2, 0, 0, 0) is
    (4, 2, 1, 1, 1) / 9; with n = 1 its exact marginals are p itself (largest 4/9 = 0.444), and the rows use Fog's
    approximation of them, 0.405 here (Fog's error on five items, 0.04, is within 0.05)."""
    flat = sampling_distribution_rows({"a": np.ones(10)}, 0.2, "flat")[0]
    for arm in ("uniform", "softmax", "Eq. (2)"):
        assert flat[f"{arm}: π max"] == pytest.approx(0.2) and flat[f"{arm}: kept share of ‖W‖²"] == pytest.approx(0.2)
    skewed = sampling_distribution_rows({"a": [3.0, 2.0, 1.0, 0.5, 0.1]}, 0.4, "skewed")[0]
    assert skewed["uniform: kept share of ‖W‖²"] == pytest.approx(0.4)
    assert skewed["uniform: kept share of ‖W‖²"] < skewed["softmax: kept share of ‖W‖²"] < 1
    lam = np.array([np.log(4.0), np.log(2.0), 0.0, 0.0, 0.0])
    row = sampling_distribution_rows({"b": lam}, 0.2, "run")[0]
    assert (row["run"], row["layer"], row["N"]) == ("run", "b", 5)
    assert row["λ min"] == 0.0 and row["λ max"] == pytest.approx(np.log(4.0))
    assert abs(row["softmax: π max"] - 4 / 9) < 0.05
    pi = wallenius_inclusion(softmax_probabilities(lam), 1)
    assert row["softmax: kept share of ‖W‖²"] == pytest.approx(float(pi @ lam**2 / np.sum(lam**2)), rel=1e-12)


def test_final_layer_spectra_reads_the_first_run_that_finished(monkeypatch):
    import subfl_book.pages.spectral as page
    from subfl_book import final_analyses

    value = {"conv2[0]": 3.0, "conv2[1]": 1.0, "fc1[1]": 0.5, "fc1[0]": 2.0}
    recorded = {final_analyses.request_key("final_spectra"): {"version": 1, "value": value}}
    asked = []

    def stored(config, analyses):  # the store hands the run back with the analysis recorded
        asked.append((config, analyses))
        return types.SimpleNamespace(analyses=recorded, config=config)

    monkeypatch.setattr(page, "stored_run", stored)
    diverged = types.SimpleNamespace(diverged=True, config="a")
    finished = types.SimpleNamespace(diverged=False, config="b")
    spectra = final_layer_spectra([diverged, finished])
    assert asked == [("b", [("final_spectra", {})])]
    assert list(spectra) == ["conv2", "fc1"] and spectra["conv2"].dtype == np.float64
    assert spectra["conv2"].tolist() == [3.0, 1.0] and spectra["fc1"].tolist() == [2.0, 0.5]
    assert final_layer_spectra([diverged]) == {}
