"""CAFF result tables (subfl_book.caff_results): labels, seed statistics, the plan check, CAFF against the
best baseline, and the class shares of the weak devices."""
import math
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from subfl_book import caff_results, catalog
from subfl_book.analysis import group_class_probabilities
from tests.conftest import data_root


@dataclass
class _Run:
    """The part of a RunResult the tables read: final values (``accuracy`` of the global model, ``slices`` of the
    width slices a width method evaluates), the recorded per-group choice and the method."""
    accuracy: float
    chosen: dict
    method: str = "caff"
    slices: dict = field(default_factory=dict)

    def final(self, metric="accuracy", group="global"):
        if metric != "accuracy":
            return float("nan")
        return self.accuracy if group == "global" else self.slices[group]

    @property
    def config(self):
        return SimpleNamespace(method=self.method)

    @property
    def history(self):
        accuracy = {"global": self.accuracy, **self.slices}
        return pd.DataFrame([{"round": 1, "metric": m, "group": g, "value": v}
                             for m, per_group in {**self.chosen, "accuracy": accuracy}.items()
                             for g, v in per_group.items()])


def _plan1():
    return pd.DataFrame([
        {"constraint": "memory_mb", "level": 36.0, "method": "caff", "layers": 9.0, "setting": 1.0, "mark": ""},
        {"constraint": "memory_mb", "level": 36.0, "method": "hetlora", "layers": None, "setting": None, "mark": "—"},
        {"constraint": "memory_mb", "level": 36.0, "method": "fedhm", "layers": 3.0, "setting": 0.5, "mark": "†"},
        {"constraint": "memory_mb", "level": 36.0, "method": "fedrolex-ft", "layers": 9.0, "setting": 0.25,
         "mark": ""}])


def test_plan_labels_name_model_setting_and_mark():
    assert caff_results.plan_labels(_plan1()) == ["F₉¹", "—", "F₃ ρ=0.5†", "F₉ s=0.25"]
    plan2 = pd.DataFrame([{"method": "depthfl", "layers": 6.0, "weak": 1.0, "strong": 3.0, "mark": ""},
                          {"method": "hetlora", "layers": 3.0, "weak": 12.0, "strong": 24.0, "mark": "†"},
                          {"method": "caff", "layers": 6.0, "weak": 3.0, "strong": 6.0, "mark": ""}])
    assert caff_results.plan_labels(plan2) == ["F₆ d=1/3", "F₃ LoRA r=12/24†", "F₆³/F₆⁶"]


def test_table1_results_seed_mean_sd_and_plan_check():
    runs = {("memory_mb", 36.0, "caff"): [_Run(0.60, {"trained_layers": {"1": 1.0}}),
                                          _Run(0.64, {"trained_layers": {"1": 1.0}})],
            ("memory_mb", 36.0, "fedhm"): [_Run(0.50, {"rank_ratio": {"1": 0.5}})],
            ("memory_mb", 36.0, "fedrolex-ft"): [_Run(0.40, {"width": {"1": 0.5}}, "fedrolex-ft",
                                                      {"0.5": 0.45})]}  # not the planned 0.25
    table = caff_results.table1_results(_plan1(), runs).set_index("method")
    assert table.loc["caff", "accuracy"] == pytest.approx(0.62)
    assert table.loc["caff", "accuracy sd"] == pytest.approx(math.sqrt(2 * 0.02 ** 2))  # sample sd of two values
    assert table.loc["caff", "seeds"] == 2 and table.loc["hetlora", "seeds"] == 0
    assert math.isnan(table.loc["hetlora", "accuracy"]) and math.isnan(table.loc["fedhm", "accuracy sd"])
    assert table.loc["caff", "run chose the planned setting"] is True
    assert table.loc["fedrolex-ft", "run chose the planned setting"] is False
    assert table.loc["hetlora", "run chose the planned setting"] == "—"
    # a width method trained below full width is scored on its largest trained slice; the full model beside it
    assert table.loc["fedrolex-ft", "evaluated"] == "width 0.5" and table.loc["caff", "evaluated"] == "global"
    assert table.loc["fedrolex-ft", "accuracy"] == pytest.approx(0.45)
    assert table.loc["fedrolex-ft", "global accuracy"] == pytest.approx(0.40)
    assert table.loc["caff", "global accuracy"] == pytest.approx(0.62)


def test_evaluated_model_is_the_largest_trained_width_below_full_width():
    assert caff_results.evaluated_model(_Run(0.1, {}, "heterofl-ft", {"0.25": 0.27, "0.5": 0.31})) == "0.5"
    # a device trained the full width: the full model is a trained model
    assert caff_results.evaluated_model(_Run(0.48, {}, "heterofl-ft", {"0.5": 0.42, "1": 0.48})) == "global"
    assert caff_results.evaluated_model(_Run(0.1, {}, "fedhm", {"0.5": 0.3})) == "global"  # not width slicing


def _results(rows, seeds=3):
    return pd.DataFrame([{"constraint": c, "method": m, "trains": t, "seeds": seeds, "accuracy": a, "accuracy sd": s}
                         for c, m, t, a, s in rows])


def test_caff_against_baselines_judges_caff_against_the_best_baseline_by_the_verdict_rules_bands():
    table = _results([("memory_mb", "caff", "F_9^1", 0.60, 0.01), ("memory_mb", "hetlora", "F_3 LoRA r=24†", 0.55, 0.02),
                      ("memory_mb", "fedhm", "F_9 ρ=0.5", 0.50, 0.01),
                      ("gflops", "caff", "F_3^3", 0.50, 0.03), ("gflops", "fedhm", "F_3 ρ=1", 0.52, 0.04),
                      ("upload_mb", "caff", "F_9^1", 0.40, 0.01), ("upload_mb", "hetlora", "—", float("nan"),
                                                                   float("nan"))])
    checks = caff_results.caff_against_baselines(table, "accuracy").set_index("constraint")
    # memory: ahead of HetLoRA by 0.05 > 0.01 + 0.02 (bands apart); the best on CAFF's own model is FedHM
    assert checks.loc["memory_mb", "best baseline"] == "HetLoRA"
    assert checks.loc["memory_mb", "margin"] == pytest.approx(0.05)
    assert checks.loc["memory_mb", "spread"] == pytest.approx(0.03)
    assert checks.loc["memory_mb", "status"] == "ahead"
    assert checks.loc["memory_mb", "best on CAFF's model"] == "FedHM 0.5"
    # compute: 0.02 behind, bands 0.47-0.53 and 0.48-0.56 overlap
    assert checks.loc["gflops", "margin"] == pytest.approx(-0.02)
    assert checks.loc["gflops", "status"] == "within seed spread"
    assert checks.loc["upload_mb", "status"] == "n/a (no baseline fits)"
    # lower is better (e.g. perplexity): the sign flips, FedHM's 0.50 is now the best rival and CAFF is behind
    flipped = caff_results.caff_against_baselines(table, "accuracy", higher_is_better=False).set_index("constraint")
    assert flipped.loc["memory_mb", "best baseline"] == "FedHM"
    assert flipped.loc["memory_mb", "margin"] == pytest.approx(-0.10) and flipped.loc["memory_mb", "status"] == "behind"
    # fewer than three seeds: the sign of the margin is shown, the status is inconclusive
    two_seeds = _results([("memory_mb", "caff", "F_9^1", 0.60, 0.01), ("memory_mb", "fedhm", "F_9 ρ=0.5", 0.50, 0.01)],
                         seeds=2)
    assert list(caff_results.caff_against_baselines(two_seeds, "accuracy").status) == ["inconclusive (n < 3)"]
    with pytest.raises(ValueError, match="metric='perplexity' needs a column 'perplexity'"):
        caff_results.caff_against_baselines(table, "perplexity")
    with pytest.raises(ValueError, match="needs a column 'seeds'"):
        caff_results.caff_against_baselines(table.drop(columns="seeds"), "accuracy")


def test_group_class_shares_split_every_training_image_between_the_groups():
    config = catalog.caff_task_config("cifar10", 3, scale="ci", seed=1).replace(
        heterogeneity=catalog.CAFF_TABLE2_HETEROGENEITY, num_clients=4)
    shares = caff_results.group_class_shares(config, data_root=data_root())
    assert list(shares.index) == ["dog", "frog", "horse", "ship", "truck"]
    total = shares.weak_samples + shares.other_samples
    assert total.sum() == 200  # the ci scale's max_train_samples, each image on exactly one device
    np.testing.assert_allclose(shares.weak_share, shares.weak_samples / total)
    assert shares.weak_p.sum() == pytest.approx(1.0) and shares.other_p.sum() == pytest.approx(1.0)
    # the weak group's probabilities are the weak-device F1's weights
    np.testing.assert_allclose(shares.weak_p, group_class_probabilities(config, ["0.5"], data_root()))
    np.testing.assert_allclose(shares.other_p, group_class_probabilities(config, ["1"], data_root()))
    with pytest.raises(ValueError, match=r"no client is in groups \['0.2'\]; the run's groups are"):
        caff_results.group_class_shares(config, weak_groups=("0.2",), data_root=data_root())
