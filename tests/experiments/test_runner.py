"""Engine + runner behaviour on the always-available digits data (fast)."""
import json

import pandas as pd
import pytest
import torch

from subfl.experiments import make_config, prepare_data, run_experiment
from subfl.fl.engine import CHECKPOINT_NAME


def _cfg(**kw):
    base = dict(partition="dirichlet", alpha=0.5, num_clients=6, clients_per_round=3, rounds=4)
    base.update(kw)
    return make_config("fedavg", "digits", "mlp", scale="ci", **base)


def test_same_seed_gives_byte_identical_history(tmp_path):
    a = run_experiment(_cfg(), tmp_path / "a", cache=False)
    b = run_experiment(_cfg(), tmp_path / "b", cache=False)
    assert (tmp_path / "a/history.csv").read_bytes() == (tmp_path / "b/history.csv").read_bytes()
    assert (tmp_path / "a/ledger.csv").read_bytes() == (tmp_path / "b/ledger.csv").read_bytes()
    c = run_experiment(_cfg(seed=1), tmp_path / "c", cache=False)
    assert not a.history.equals(c.history)
    assert b.summary["final_accuracy"] == a.summary["final_accuracy"]


def test_interrupted_run_resumes_to_the_same_history(tmp_path):
    full = run_experiment(_cfg(), tmp_path / "full", cache=False)
    part = run_experiment(_cfg(), tmp_path / "part", cache=False, stop_after_round=2)
    assert (tmp_path / "part" / CHECKPOINT_NAME).exists() and not (tmp_path / "part/summary.json").exists()
    resumed = run_experiment(_cfg(), tmp_path / "part", cache=False)
    assert resumed.summary["resumed_from_round"] == 2
    assert (tmp_path / "full/history.csv").read_bytes() == (tmp_path / "part/history.csv").read_bytes()
    assert not (tmp_path / "part" / CHECKPOINT_NAME).exists()
    assert part.directory == resumed.directory


def test_checkpoint_of_another_config_is_refused(tmp_path):
    run_experiment(_cfg(), tmp_path / "x", cache=False, stop_after_round=1)
    with pytest.raises(ValueError, match="different run"):
        run_experiment(_cfg(lr=0.2), tmp_path / "x", cache=False)


def test_ledger_records_full_model_both_ways(tmp_path):
    cfg = _cfg()
    res = run_experiment(cfg, tmp_path / "r", cache=False)
    ledger = res.ledger
    from subfl.experiments.runner import ModelFactory, prepare_data
    dataset, _, _ = prepare_data(cfg)
    model = ModelFactory(cfg, dataset)()
    model_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    tensors = ledger[ledger.name != "__config__"]
    per = tensors.groupby(["round", "client", "direction"]).bytes.sum()
    assert (per == model_bytes).all()
    # every round: exactly clients_per_round distinct clients, each downloading and uploading once
    counts = tensors.groupby("round").client.nunique()
    assert counts.tolist() == [3, 3, 3, 3]
    assert res.summary["upload_bytes"] == int(ledger[ledger.direction == "up"].bytes.sum())


def test_cache_reads_back_identical_results(tmp_path):
    first = run_experiment(_cfg())
    second = run_experiment(_cfg())
    assert not first.from_cache and second.from_cache
    assert first.history.equals(second.history)


def test_fedavg_learns_digits(tmp_path):
    res = run_experiment(_cfg(partition="iid", alpha=None, rounds=8, lr=0.1), tmp_path / "d", cache=False)
    acc = res.curve("accuracy")
    assert acc.value.iloc[-1] > 0.85  # MLP on 8×8 digits; chance is 0.1
    assert acc.value.iloc[-1] > acc.value.iloc[0]


def test_summary_fields(tmp_path):
    res = run_experiment(_cfg(), tmp_path / "s", cache=False)
    s = json.loads((tmp_path / "s/summary.json").read_text())
    for key in ("final_accuracy", "wall_time_s", "upload_bytes", "download_bytes", "config", "canonical_config", "versions", "environment", "run_key"):
        assert key in s
    assert s["rounds"] == 4 and s["client_samples"]["total"] == res.summary["client_samples"]["total"]
    t = pd.read_csv(tmp_path / "s/timings.csv")
    assert set(t.stage) == {"configure", "local_train", "aggregate", "evaluate"}


def test_model_init_does_not_touch_global_rng(tmp_path):
    torch.manual_seed(123)
    expected = torch.rand(1)
    torch.manual_seed(123)
    run_experiment(_cfg(rounds=1), tmp_path / "g", cache=False)
    assert torch.rand(1) == expected


def test_final_state_is_saved_and_matches_the_evaluated_model(tmp_path):
    res = run_experiment(_cfg(rounds=2), tmp_path / "st", cache=False)
    from subfl.experiments.runner import ModelFactory, prepare_data
    from subfl.fl import evaluate
    dataset, test, _ = prepare_data(res.config)
    model = ModelFactory(res.config, dataset)()
    model.load_state_dict(res.state()["weights"])
    assert evaluate(model, test)["accuracy"] == res.final("accuracy")


def test_method_round_metrics_reach_the_history(tmp_path):
    from subfl.methods import METHODS, FedAvg

    class FedAvgWithNorm(FedAvg):
        name = "fedavg_test_norm"

        def round_metrics(self, state, round):
            return {("weight_norm", "global"): float(sum(v.float().norm() ** 2 for v in state["weights"].values()))}

    METHODS[FedAvgWithNorm.name] = FedAvgWithNorm
    try:
        res = run_experiment(_cfg(rounds=2).replace(method="fedavg_test_norm"), tmp_path / "m", cache=False)
    finally:
        del METHODS[FedAvgWithNorm.name]
    assert res.curve("weight_norm")["round"].tolist() == [1, 2]


def test_a_diverging_run_stops_and_says_so(tmp_path):
    res = run_experiment(_cfg(lr=1e6, rounds=4), tmp_path / "div", cache=False)  # SGD explodes at once
    assert res.diverged and res.summary["diverged_at_round"] == 1
    assert res.summary["final_accuracy"] is None and res.final() != res.final()  # NaN
    assert res.history[res.history.metric == "diverged"]["round"].tolist() == [1]
    again = run_experiment(_cfg(lr=1e6, rounds=4), tmp_path / "div", cache=False)
    assert again.summary["diverged_at_round"] == 1


def test_a_finite_but_exploding_loss_is_a_divergence(tmp_path):
    """lr=20 takes the first round's mean cross-entropy to ~3e4 without any NaN: the engine stops the run there, as
    it does for a non-finite loss, because it exceeds 100 × ln 10 = 230 (``explosion_threshold``)."""
    from subfl.fl.engine import explosion_threshold

    assert explosion_threshold(10) == pytest.approx(100 * 2.302585, rel=1e-6) and explosion_threshold(2) == 100.0
    res = run_experiment(_cfg(partition="iid", alpha=None, lr=20.0, rounds=3), tmp_path / "boom", cache=False)
    losses = res.history[res.history.metric == "train_loss"]
    assert res.summary["diverged_at_round"] == 1 and losses["round"].tolist() == [1]
    assert 230.3 < losses["value"].item() < float("inf")
    learning = run_experiment(_cfg(partition="iid", alpha=None, rounds=3), tmp_path / "ok", cache=False)
    assert not learning.diverged and learning.history[learning.history.metric == "train_loss"].value.max() < 3


def test_uploads_report_the_sample_counts_aggregation_weights_them_by(tmp_path):
    from subfl.experiments.runner import client_splits

    cfg = _cfg()
    res = run_experiment(cfg, tmp_path / "r", cache=False)
    _, _, parts = prepare_data(cfg)
    parts, _ = client_splits(cfg, parts)
    up = res.ledger[res.ledger.direction == "up"]
    reported = up.groupby(["round", "client"]).n_samples.agg(["min", "max"])
    assert (reported["min"] == reported["max"]).all()  # one count per upload, on each of its rows
    assert {c: n for (_, c), n in reported["min"].items()} == {c: len(parts[c]) for c in up.client.unique()}
    assert (res.ledger[res.ledger.direction == "down"].n_samples == 0).all()


def test_a_diverged_round_has_no_aggregate_timing(tmp_path):
    res = run_experiment(_cfg(lr=1e6, rounds=4), tmp_path / "div", cache=False)
    assert set(res.timings.stage) == {"configure", "local_train"}


def test_local_test_sets_are_held_out_and_scored(tmp_path):
    from subfl.experiments.runner import client_splits, prepare_data
    from subfl.fl import evaluate
    from subfl.methods import METHODS, FedAvg

    cfg = _cfg(rounds=2, local_test_fraction=0.3)
    _, _, parts = prepare_data(cfg)
    train, local = client_splits(cfg, parts)
    for whole, tr, te in zip(parts, train, local):
        assert len(te) == round(0.3 * len(whole)) and not set(tr) & set(te) and set(tr) | set(te) == set(whole)

    calls = []

    class Recording(FedAvg):  # checks that local training sees only the 70 %
        name = "fedavg_test_local"

        def local_update(self, task, data, ctx):
            calls.append(len(data))
            return super().local_update(task, data, ctx)

    METHODS[Recording.name] = Recording
    try:
        res = run_experiment(cfg.replace(method=Recording.name), tmp_path / "loc", cache=False)
    finally:
        del METHODS[Recording.name]
    assert set(calls) <= {len(t) for t in train}
    # the recorded local accuracy is the unweighted mean over clients of the final model's local accuracies
    dataset, _, _ = prepare_data(cfg)
    from subfl.experiments.runner import ModelFactory
    model = ModelFactory(cfg, dataset)()
    model.load_state_dict(res.state()["weights"])
    per_client = [evaluate(model, dataset.train.subset(idx))["accuracy"] for idx in local]
    assert res.final("local_accuracy") == pytest.approx(sum(per_client) / len(per_client), abs=1e-12)
    assert "evaluate_local" in set(res.timings.stage)
    with pytest.raises(ValueError, match="local_test_fraction"):
        _cfg(local_test_fraction=1.0)


def test_a_model_listed_under_two_groups_is_evaluated_once(monkeypatch):
    from subfl.fl import engine
    from subfl.fl.engine import EngineSettings, _evaluate_models

    seen = []
    monkeypatch.setattr(engine, "evaluate", lambda model, data, **kw: seen.append(id(model)) or {"accuracy": 0.5})
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    out = _evaluate_models({"1.0": a, "global": a, "0.5": b}, None, EngineSettings(rounds=1, clients_per_round=1),
                           "classification")
    assert sorted(seen) == sorted([id(a), id(b)])
    assert out == {("accuracy", "1.0"): 0.5, ("accuracy", "global"): 0.5, ("accuracy", "0.5"): 0.5}


def test_a_run_diverging_after_an_evaluated_round_still_gets_a_summary(tmp_path):
    from subfl.methods import METHODS, FedAvg

    class LateNaN(FedAvg):  # a finite first round, then a non-finite loss
        name = "fedavg_test_late_nan"

        def local_update(self, task, data, ctx):
            update = super().local_update(task, data, ctx)
            if task.config.get("round", 0) >= 2 or getattr(self, "_seen", 0) >= 3:
                update.stats["loss"] = float("nan")
            self._seen = getattr(self, "_seen", 0) + 1
            return update

    METHODS[LateNaN.name] = LateNaN
    try:
        res = run_experiment(_cfg(rounds=3).replace(method=LateNaN.name), tmp_path / "late", cache=False)
    finally:
        del METHODS[LateNaN.name]
    assert res.summary["diverged_at_round"] == 2 and res.summary["final_accuracy"] is None
    assert res.curve()["round"].tolist() == [1] and res.summary["torch_threads"] >= 1


@pytest.mark.parametrize("method", ["fedavg", "prism"])
def test_a_longer_run_repeats_the_shorter_run_round_for_round(tmp_path, method):
    """Every random draw comes from (seed, round, client), so with a constant learning rate the first rounds of a
    longer run are the shorter run (what the longer-training pages rely on); a cosine schedule, annealed over the
    run's own length, changes them."""
    cfg = _cfg(eval_every=1).replace(method=method, heterogeneity="1.0" if method == "fedavg" else "0.4")
    short = run_experiment(cfg.replace(rounds=2), tmp_path / "short", cache=False)
    longer = run_experiment(cfg.replace(rounds=4), tmp_path / "long", cache=False)
    head = longer.history[longer.history["round"] <= 2].reset_index(drop=True)
    assert len(head) == len(short.history) > 0
    pd.testing.assert_frame_equal(head[["round", "metric", "group"]], short.history[["round", "metric", "group"]])
    assert (head["value"] == short.history["value"]).all()  # bit for bit
    prefix = longer.first_rounds(2)   # what a page reads instead of computing the shorter run
    assert prefix.config == short.config
    pd.testing.assert_frame_equal(prefix.history, short.history)
    led, short_led = prefix.ledger.drop(columns="n_samples"), short.ledger.drop(columns="n_samples")
    pd.testing.assert_frame_equal(led, short_led, check_dtype=False)
    for field in ("final_accuracy", "best_accuracy", "diverged_at_round", "rounds", "upload_bytes", "download_bytes",
                  "final"):
        assert prefix.summary[field] == short.summary[field], field
    assert prefix.final() == short.final() and prefix.timings["round"].max() == 2
    with pytest.raises(FileNotFoundError, match="no saved weights"):
        prefix.state()
    with pytest.raises(ValueError, match=r"rounds=5 is not valid; accepted: an int in 1..4"):
        longer.first_rounds(5)
    cosine = cfg.replace(lr_schedule="cosine")
    short = run_experiment(cosine.replace(rounds=2), tmp_path / "cos_short", cache=False)
    longer = run_experiment(cosine.replace(rounds=4), tmp_path / "cos_long", cache=False)
    assert longer.curve("train_loss").value.iloc[1] != short.curve("train_loss").value.iloc[1]
    with pytest.raises(ValueError, match="lr_schedule is 'cosine'"):
        longer.first_rounds(2)
    sparse = run_experiment(cfg.replace(rounds=4, eval_every=2), tmp_path / "sparse", cache=False)
    with pytest.raises(ValueError, match="rounds=3 is not a round the run evaluated"):
        sparse.first_rounds(3)


def test_verify_false_reads_a_repacked_copy_that_verification_refuses(tmp_path):
    """A data file re-written to travel (same arrays, other bytes) fails the manifest check; ``verify=False`` loads it
    and gives the same clients and samples as the original."""
    import numpy as np

    from subfl.data import clear_dataset_cache
    from tests.conftest import data_root

    root = data_root()
    if root is None or not (root / "femnist_leaf_subset.npz").exists():
        pytest.skip("the FEMNIST subset is not in the data root")
    with np.load(root / "femnist_leaf_subset.npz") as original:
        np.savez(tmp_path / "femnist_leaf_subset.npz", **{k: original[k] for k in original.files})  # uncompressed
    config = make_config("fedavg", "femnist", scale="ci")
    with pytest.raises(ValueError, match="sha256"):
        prepare_data(config, tmp_path)
    clear_dataset_cache()
    repacked = prepare_data(config, tmp_path, verify=False)
    clear_dataset_cache()
    reference = prepare_data(config, root)
    assert torch.equal(repacked[0].train.x, reference[0].train.x)
    assert [p.tolist() for p in repacked[2]] == [p.tolist() for p in reference[2]]


def test_train_set_metrics_score_the_final_model_on_the_drawn_training_samples(tmp_path):
    from subfl.experiments.runner import ModelFactory, client_splits, train_eval_subset
    from subfl.fl import evaluate

    cfg = _cfg(rounds=2, local_test_fraction=0.3, train_eval_samples=40)
    dataset, _, parts = prepare_data(cfg)
    train_parts, local = client_splits(cfg, parts)
    subset = train_eval_subset(cfg, dataset.train, train_parts)
    assert len(subset) == 40
    again = train_eval_subset(cfg, dataset.train, train_parts)
    assert torch.equal(torch.as_tensor(subset.y), torch.as_tensor(again.y))  # drawn once, reproducibly
    res = run_experiment(cfg, tmp_path / "train-eval", cache=False)
    model = ModelFactory(cfg, dataset)()
    model.load_state_dict(res.state()["weights"])
    expected = evaluate(model, subset)
    assert res.final("train_set_loss") == pytest.approx(expected["loss"], abs=1e-9)
    assert res.final("train_set_accuracy") == pytest.approx(expected["accuracy"], abs=1e-12)
    assert "evaluate_train" in set(res.timings.stage)
    assert train_eval_subset(cfg.replace(train_eval_samples=None), dataset.train, train_parts) is None
    held = sum(len(p) for p in train_parts)
    with pytest.raises(ValueError, match=f"more than the {held} training samples"):
        train_eval_subset(cfg.replace(train_eval_samples=held + 1), dataset.train, train_parts)
    with pytest.raises(ValueError, match="train_eval_samples"):
        _cfg(train_eval_samples=0)
