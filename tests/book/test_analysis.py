"""Per-width traffic and costs read back from finished runs (digits: always available, seconds)."""
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from subfl.costs import parameter_bytes
from subfl.experiments import RunResult, make_config, run_experiment
from subfl_book.analysis import client_levels, payload_by_level, width_costs, width_table
from subfl_book.catalog import FLANC_SETTINGS, fedavg_reference, flanc_config
from subfl.methods.width import model_width
from subfl.models import build_model


def test_static_levels_have_the_requested_shares_and_dynamic_ones_move():
    cfg = flanc_config("flanc", "static", scale="cpu")
    counts = Counter(client_levels(cfg, 1).values())
    assert counts == {0.25: 25, 0.5: 25, 0.75: 25, 1.0: 25}
    assert client_levels(cfg, 1) == client_levels(cfg, cfg.rounds)
    dyn = flanc_config("flanc", "dynamic", scale="cpu")
    assert client_levels(dyn, 1) != client_levels(dyn, 2)
    a25 = Counter(client_levels(flanc_config("heterofl", "A25", scale="cpu"), 1).values())
    assert a25 == {1.0: 25, 0.25: 75}
    with pytest.raises(ValueError, match="round"):
        client_levels(cfg, 0)


def test_flanc_config_validates_and_applies_the_chapter_defaults():
    assert set(FLANC_SETTINGS) >= {"static", "dynamic", "A25", "A75", "full"}
    cfg = flanc_config("heterofl", "static", "classes", scale="cpu")
    assert (cfg.model, cfg.width, cfg.partition, cfg.classes_per_client) == ("flanc_cnn", 0.25, "k_classes", 3)
    assert (cfg.lr, flanc_config("flanc", "static", "iid").lr) == (0.01, 0.02)  # the non-iid split runs at 0.01
    assert dict(cfg.method_options) == {"scaler": False}
    assert dict(flanc_config("heterofl", scaler=True).method_options) == {"scaler": True}
    for bad in (dict(setting="half"), dict(partition="dirichlet"), dict(dataset="digits")):
        with pytest.raises(ValueError, match=next(iter(bad))):
            flanc_config("flanc", **bad)
    shk = flanc_config("flanc", "static", "roles", dataset="shakespeare")
    assert (shk.model, shk.width, shk.partition, shk.num_clients, shk.local_steps) == (
        "char_rnn", 0.25, "natural", 100, 20)
    assert dict(shk.dataset_options) == {"stride": 20, "max_users": 100}
    shk_iid = flanc_config("flanc", "dynamic", "iid", dataset="shakespeare")   # Table 1's IID column
    assert (shk_iid.partition, shk_iid.num_clients, dict(shk_iid.dataset_options)) == (
        "iid", 100, {"stride": 20, "max_users": 100})
    with pytest.raises(ValueError, match="partition='classes' is not a split of 'shakespeare'"):
        flanc_config("flanc", "static", "classes", dataset="shakespeare")
    with pytest.raises(ValueError, match="partition='roles' is not a split of 'fmnist'"):
        flanc_config("flanc", "static", "roles")
    cif = flanc_config("heterofl", "A25", dataset="cifar10")  # chapter 1's CIFAR-10 model and sizes
    ref = fedavg_reference("cifar10")
    assert (cif.model, cif.width, cif.num_clients, cif.rounds, cif.lr, cif.lr_schedule, cif.eval_every) == (
        ref.model, ref.width, ref.num_clients, ref.rounds, ref.lr, ref.lr_schedule, 5) == (
        "cnn", 1.0, 20, 40, 0.02, "cosine", 5)
    assert dict(cif.method_options) == {"scaler": False}  # the FedAvg CNN has no normalisation either
    assert flanc_config("flanc", dataset="cifar10", scale="paper").model == "resnet18"


def test_spectral_config_shares_chapter_ones_reference_setting():
    from subfl_book.catalog import SPECTRAL_KEEP, fedavg_reference, spectral_config
    ref = fedavg_reference("cifar10", "dirichlet", 0.1, seed=1)
    assert spectral_config("fedavg", seed=1) == ref  # the FedAvg row is chapter 1's run
    cfg = spectral_config("collective+cliplr", "mixed", seed=1, lr=0.005)
    assert cfg.replace(method="fedavg", heterogeneity="1.0", lr=ref.lr) == ref
    assert (cfg.heterogeneity, cfg.lr) == (SPECTRAL_KEEP["mixed"], 0.005) == ("0.2:0.6,0.4:0.4", 0.005)
    with pytest.raises(ValueError, match="keep"):
        spectral_config("topn", "r0.3")


def test_spectral_timing_configs_are_the_low_lr_runs_cut_short():
    from subfl_book.catalog import SPECTRAL_LOW_LR, SPECTRAL_METHODS, spectral_config, spectral_timing_configs
    timing = spectral_timing_configs("r0.2")
    assert [c.method for c in timing] == [spectral_config(m).method for m in SPECTRAL_METHODS]
    full = spectral_config("prism", lr=SPECTRAL_LOW_LR)
    prism = timing[SPECTRAL_METHODS.index("prism")]
    assert (full.rounds, full.eval_every) == (40, 2) and (prism.rounds, prism.eval_every) == (4, 4)
    assert prism.replace(rounds=40, eval_every=2) == full  # nothing else differs from the training table's run
    assert spectral_timing_configs(scale="ci", rounds=100)[0].rounds == spectral_config("fedavg", scale="ci").rounds
    with pytest.raises(ValueError, match="rounds=0"):
        spectral_timing_configs(rounds=0)


def test_spectral_ablation_configs_share_the_table_one_runs():
    from subfl_book.catalog import (SPECTRAL_ABLATIONS, SPECTRAL_LOW_LR, spectral_ablation_configs,
                                           spectral_config)
    table3 = spectral_ablation_configs("clipped learning rate (Table 3)", seed=1)
    assert [c.method for c in table3] == ["unbiased", "unbiased+cliplr", "collective", "collective+cliplr"]
    assert table3[1] == spectral_config("unbiased+cliplr", seed=1, lr=SPECTRAL_LOW_LR)  # Table 1's own run
    samplers = spectral_ablation_configs("sampler (Table 4)")
    assert [(c.method, dict(c.method_options).get("sampler", "cps")) for c in samplers] == [
        (design, sampler) for design in ("collective+cliplr", "unbiased+cliplr")
        for sampler in ("cps", "brewer", "min_support")]  # Table 4's two strategies
    assert samplers[3] == spectral_config("unbiased+cliplr", lr=SPECTRAL_LOW_LR)  # shared with Table 1's run
    top = spectral_ablation_configs("Top-n's scaling")
    assert [c.method for c in top] == ["topn", "topn+scaled"] and top[0] == spectral_config("topn", lr=SPECTRAL_LOW_LR)
    assert all(c.lr == SPECTRAL_LOW_LR == 0.005 and c.heterogeneity == "0.2" for t in SPECTRAL_ABLATIONS
               for c in spectral_ablation_configs(t))
    with pytest.raises(ValueError, match="table='Table 9'"):
        spectral_ablation_configs("Table 9")



def test_spectral_heterogeneity_configs_share_the_training_tables_runs():
    from subfl_book.catalog import (SPECTRAL_HETEROGENEITY, SPECTRAL_LOW_LR, spectral_config,
                                           spectral_heterogeneity_config)
    # alpha 0.1 is the training table's split: its runs at the low learning rate are reused, not re-run
    assert spectral_heterogeneity_config("prism", "0.1") == spectral_config("prism", lr=SPECTRAL_LOW_LR)
    iid = spectral_heterogeneity_config("topn", "iid", seed=1)
    assert (iid.partition, iid.alpha, iid.seed, iid.heterogeneity, iid.lr) == ("iid", None, 1, "0.2", 0.005)
    assert spectral_heterogeneity_config("fedavg", "10").alpha == 10.0
    assert sum(len(m) for m in SPECTRAL_HETEROGENEITY.values()) == 24
    with pytest.raises(ValueError, match="label_split='0.5'"):
        spectral_heterogeneity_config("prism", "0.5")
    with pytest.raises(ValueError, match="method='origdrop' is not run on split '10'"):
        spectral_heterogeneity_config("origdrop", "10")


def test_factor_decay_configs_share_the_weight_decay_runs():
    from subfl_book.catalog import prism_factor_decay_config, spectral_heterogeneity_config
    assert prism_factor_decay_config("prism", "weight", seed=2) == spectral_heterogeneity_config("prism", "0.1", seed=2)
    frob = prism_factor_decay_config("topn", "frobenius", scale="ci")
    assert dict(frob.method_options) == {"factor_decay": "frobenius"}
    assert frob.replace(method_options=()) == spectral_heterogeneity_config("topn", "0.1", scale="ci")
    with pytest.raises(ValueError, match="method='unbiased' is not valid; accepted: prism, topn"):
        prism_factor_decay_config("unbiased", "weight")
    with pytest.raises(ValueError, match="factor_decay='l2' is not valid; accepted: weight, frobenius"):
        prism_factor_decay_config("prism", "l2")

def test_every_row_of_the_resnet_comparison_normalises_with_batch_statistics_only():
    """FedAvg and the spectral rows are built alike: ResNet-18's 20 BatchNorm layers, none keeping running
    statistics (PriSM Sec. 3.2.2)."""
    from torch import nn

    from subfl.models import build_model
    from subfl_book.catalog import SPECTRAL_RESNET_METHODS, spectral_resnet_config
    for method in SPECTRAL_RESNET_METHODS:
        config = spectral_resnet_config(method, scale="ci")
        model = build_model(config.model, num_classes=10, input_shape=(3, 32, 32), width=config.width,
                            norm=config.norm)
        norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
        assert len(norms) == 20, method
        assert sum(m.track_running_stats for m in norms) == 0, method


def test_spectral_resnet_config_changes_only_the_model_of_the_training_table_run():
    from subfl_book.catalog import SPECTRAL_LOW_LR, spectral_config, spectral_resnet_config
    for scale, width, rounds in (("ci", 0.125, None), ("cpu", 0.25, 20), ("paper", 1.0, None)):
        config = spectral_resnet_config("topn", scale=scale, seed=1)
        table_run = spectral_config("topn", "r0.2", scale=scale, seed=1, lr=SPECTRAL_LOW_LR)
        assert (config.model, config.width) == ("resnet18", width)
        assert config.rounds == (rounds or table_run.rounds)
        assert config.norm == "bn_nostats"
        assert config.replace(model=table_run.model, width=table_run.width, rounds=table_run.rounds,
                              norm=table_run.norm) == table_run
    assert spectral_resnet_config("fedavg").heterogeneity == "1.0"  # the reference trains the full model
    with pytest.raises(ValueError, match="scale='gpu' is not valid; accepted: ci, cpu, paper"):
        spectral_resnet_config("prism", scale="gpu")


@pytest.fixture(scope="module")
def heterofl_run(tmp_path_factory):
    cfg = make_config("heterofl", "digits", "mlp", scale="ci", heterogeneity="0.5:0.5,1.0:0.5", rounds=2,
                      num_clients=4, clients_per_round=4, method_options={"scaler": False})
    return run_experiment(cfg, tmp_path_factory.mktemp("heterofl") / "run", cache=False)


def test_payload_by_level_matches_the_slice_sizes(heterofl_run):
    result, cfg = heterofl_run, heterofl_run.config
    up = payload_by_level(result, "up").set_index("level")
    for level in (0.5, 1.0):
        model = build_model("mlp", num_classes=10, input_shape=(64,), width=model_width(cfg.width, level))
        assert up.loc[level, "bytes_min"] == up.loc[level, "bytes_max"] == parameter_bytes(model)
        assert up.loc[level, "client_rounds"] == 4  # 2 clients x 2 rounds
    with pytest.raises(ValueError, match="direction"):
        payload_by_level(result, "sideways")


def test_width_costs_grow_with_width_and_composition_adds_its_own_cost():
    dense = width_costs("flanc_cnn", (0.5, 1.0), width=0.25)
    composed = width_costs("flanc_cnn", (0.5, 1.0), width=0.25, composed=True)
    assert list(dense.parameters) == [sum(p.numel() for p in build_model(
        "flanc_cnn", num_classes=10, input_shape=(1, 28, 28), width=w).parameters()) for w in (0.125, 0.25)]
    assert dense.train_flops_per_sample.is_monotonic_increasing
    # composing W_p = V U_p costs FLOPs of its own, but the convolutions are the same size
    assert (composed.train_flops_per_sample > dense.train_flops_per_sample).all()
    assert (composed.train_flops_per_sample < 1.5 * dense.train_flops_per_sample).all()
    with pytest.raises(ValueError, match="composed=True"):
        width_costs("flanc_cnn", (1.0,), r1=2)


def test_width_table_averages_seeds_per_width(heterofl_run):
    table = width_table([heterofl_run, heterofl_run], groups=("0.5", "1", "0.25"))
    assert list(table.width) == [0.5, 1.0]  # 0.25 was never evaluated: left out
    assert list(table.seeds) == [2, 2] and (table["std"] == 0).all()
    assert table.set_index("width").loc[1.0, "mean"] == pytest.approx(heterofl_run.final(group="1"))
    with pytest.raises(ValueError, match="no run recorded"):
        width_table([heterofl_run], groups=("0.3",))


def test_bar_status_judges_the_band_by_the_verdict_rule():
    from subfl_book.analysis import bar_status
    assert bar_status([0.64, 0.65, 0.63], 0.60, scale="cpu") == "meets the bar"          # band 0.63-0.65
    assert bar_status([0.55, 0.56, 0.57], 0.60, scale="cpu") == "below the bar"          # band 0.55-0.57
    assert bar_status([0.58, 0.62, 0.61], 0.60, scale="cpu").startswith("inconclusive")  # band 0.585-0.625
    assert bar_status([0.64, 0.65], 0.60, scale="cpu") == "inconclusive (2 seeds < 3)"  # the mean alone clears it
    assert bar_status([0.64, 0.65, 0.63], 0.60, scale="ci").startswith("inconclusive (ci scale")
    assert bar_status([0.64, 0.65, 0.63], None, scale="cpu") == "—"


def _synthetic_run(method: str, seed: int, finals: dict[str, float], metric: str = "accuracy") -> RunResult:
    """A RunResult whose history holds only the final ``metric`` of each width group (no files)."""
    run = RunResult(make_config(method, "digits", "mlp", scale="ci", seed=seed), Path("/nonexistent"))
    run.__dict__["history"] = pd.DataFrame([{"round": 2, "metric": metric, "value": v, "group": g}
                                            for g, v in finals.items()])
    return run


def test_ordering_check_judges_each_rival_by_the_verdict_rules_bands():
    from subfl_book.analysis import ordering_check
    runs = [_synthetic_run("flanc", s, {"0.25": 0.80 + d, "1": 0.70 + d}) for s, d in ((0, 0.0), (1, 0.02), (2, 0.01))]
    runs += [_synthetic_run("heterofl", s, {"0.25": 0.70, "1": 0.709 + d}) for s, d in ((0, 0.0), (1, 0.002), (2, 0.001))]
    runs += [_synthetic_run("fjord", s, {"0.25": 0.75, "1": 0.80}) for s in (0, 1, 2)]
    table = ordering_check(runs).set_index("width")
    # width 1/4: flanc 0.81 ± 0.01, best rival fjord 0.75 ± 0 -> margin 0.06, bands apart beyond sd sum 0.01: ahead
    assert table.loc[0.25, "margin"] == pytest.approx(0.06)
    assert table.loc[0.25, "spread"] == pytest.approx(0.01)
    assert (table.loc[0.25, "status"], table.loc[0.25, "best"]) == ("ahead", "flanc")
    # width 1: flanc 0.71 vs fjord 0.80 -> behind by 0.09
    assert table.loc[1.0, "margin"] == pytest.approx(-0.09)
    assert (table.loc[1.0, "status"], table.loc[1.0, "best"]) == ("behind", "fjord")
    # lower is better (perplexity): the sign flips, so flanc's larger values put it behind at 1/4
    ppl = ordering_check(runs, higher_is_better=False).set_index("width")
    assert ppl.loc[0.25, "margin"] == pytest.approx(-0.11) and ppl.loc[0.25, "best"] == "heterofl"
    # bands overlap: flanc 0.71 ± 0.01 vs heterofl alone 0.710 ± 0.001
    near = ordering_check(runs, rivals=("heterofl",)).set_index("width")
    assert near.loc[1.0, "status"] == "within seed spread"
    assert near.loc[1.0, "spread"] == pytest.approx(0.011)
    # the rule's band test, not a √(sd₁² + sd₂²) spread: margin 0.015 with sds 0.01 and 0.01 is within the bands
    # (sum 0.02) although it exceeds √2·0.01 = 0.0141
    close = [_synthetic_run("flanc", s, {"1": 0.715 + d}) for s, d in ((0, -0.01), (1, 0.0), (2, 0.01))]
    close += [_synthetic_run("heterofl", s, {"1": 0.70 + d}) for s, d in ((0, -0.01), (1, 0.0), (2, 0.01))]
    assert ordering_check(close, rivals=("heterofl",)).iloc[0]["status"] == "within seed spread"
    # fewer than three seeds: inconclusive whatever the margin
    assert set(ordering_check(runs[:2] + runs[3:5] + runs[6:8]).status) == {"inconclusive (n < 3)"}
    with pytest.raises(ValueError, match="fedrolex"):
        ordering_check(runs, rivals=("fedrolex",))


def test_stage_seconds_averages_rounds_and_divides_by_the_clients(heterofl_run):
    from subfl_book.analysis import stage_seconds
    table = stage_seconds([heterofl_run, heterofl_run]).iloc[0]
    t = heterofl_run.timings
    per_stage = {s: t[t.stage == s].seconds.mean() for s in ("configure", "aggregate", "local_train")}
    assert table["local_train"] == pytest.approx(per_stage["local_train"])
    assert table["local_per_client"] == pytest.approx(per_stage["local_train"] / 4)  # 4 clients per round
    server = per_stage["configure"] + per_stage["aggregate"]
    assert table["server_share"] == pytest.approx(server / per_stage["local_train"])
    assert table["server_share_per_client"] == pytest.approx(4 * table["server_share"])
    with pytest.raises(ValueError, match="no finished"):
        stage_seconds([])


def test_stage_seconds_keeps_a_timed_part_as_its_own_column(heterofl_run):
    """A part a method timed (``aggregate/svd_refresh``) is averaged over its rounds; a run without it shows none."""
    import dataclasses

    from subfl_book.analysis import stage_seconds
    parts = pd.DataFrame({"round": [1, 2], "stage": ["aggregate/svd_refresh"] * 2, "seconds": [0.25, 0.75]})
    timed = dataclasses.replace(heterofl_run)   # a copy whose timings (a cached property) are set by hand
    timed.timings = pd.concat([heterofl_run.timings, parts], ignore_index=True)
    table = stage_seconds([timed, heterofl_run], by=("method", "seed"))
    assert table["aggregate/svd_refresh"].iloc[0] == pytest.approx(0.5)   # the same (method, seed): mean of 0.5
    assert table["aggregate"].iloc[0] == pytest.approx(heterofl_run.timings.query("stage == 'aggregate'").seconds.mean())
    assert "aggregate/svd_refresh" not in stage_seconds([heterofl_run])


def test_svd_refresh_seconds_lists_every_decomposed_layer():
    from subfl_book.analysis import svd_refresh_seconds
    model = build_model("cnn", num_classes=10, input_shape=(3, 32, 32), width=0.25)
    table = svd_refresh_seconds(model, repeats=1)
    # the FedAvg CNN: conv1 and fc2 (first / last) are kept dense; conv2 (16 x 8*5*5) and fc1 (128 x 16*8*8) are not
    assert list(table.layer) == ["conv2", "fc1"] and list(table["shape"]) == ["16 × 200", "128 × 1024"]
    assert (table.seconds > 0).all()
    with pytest.raises(ValueError, match="repeats"):
        svd_refresh_seconds(model, repeats=0)
    gram = svd_refresh_seconds(model, repeats=1, svd_solver="gram")
    assert list(gram.layer) == ["conv2", "fc1"] and (gram.seconds > 0).all()
    with pytest.raises(ValueError, match="svd_solver='qr' is not valid; accepted: exact, gram"):
        svd_refresh_seconds(model, svd_solver="qr")


def test_svd_refresh_seconds_measures_with_the_runs_thread_count(monkeypatch):
    import torch

    import subfl.models.spectral_refresh as refresh
    from subfl_book.analysis import svd_refresh_seconds
    from subfl_book.store import BOOK_THREADS
    seen = []
    monkeypatch.setattr(refresh, "solver_function", lambda name: lambda m: seen.append(torch.get_num_threads()))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        svd_refresh_seconds(build_model("cnn", num_classes=10, input_shape=(3, 32, 32), width=0.25), repeats=2)
        assert seen == [BOOK_THREADS] * 4 == [1] * 4  # 2 layers x 2 repeats, as the runs' stages were timed
        assert torch.get_num_threads() == 2  # the caller's count is restored
    finally:
        torch.set_num_threads(before)


def test_ordering_check_marks_a_diverged_run():
    from subfl_book.analysis import ordering_check
    runs = [_synthetic_run("flanc", 0, {"1": 0.8}), _synthetic_run("heterofl", 0, {"1": 0.7}),
            _synthetic_run("fjord", 0, {"1": 0.75})]
    runs[0].__dict__["history"] = pd.concat([runs[0].history, pd.DataFrame(
        [{"round": 2, "metric": "diverged", "value": 1.0, "group": "global"}])])
    row = ordering_check(runs).iloc[0]
    assert (row["status"], row["best"]) == ("diverged", "fjord") and row["margin"] != row["margin"]


def test_weak_device_f1_table_rebuilds_the_final_model(tmp_path):
    import numpy as np

    from subfl_book.analysis import final_models, group_class_probabilities, weak_device_f1_table
    from subfl.experiments.runner import prepare_data
    from subfl.metrics.fairness import model_predictions

    cfg = make_config("fedavg", "digits", partition="dirichlet", alpha=0.1, scale="ci", heterogeneity="0.5:0.5,1.0:0.5")
    result = run_experiment(cfg, tmp_path / "run", cache=False)
    row = weak_device_f1_table([result]).iloc[0]
    # the rebuilt global model scores exactly the accuracy the engine recorded at the last round
    assert row.accuracy == pytest.approx(result.final(), abs=1e-12)
    weak, strong = group_class_probabilities(cfg, ["0.5"]), group_class_probabilities(cfg, ["1"])
    assert weak.sum() == pytest.approx(1.0) and strong.sum() == pytest.approx(1.0)
    assert not np.allclose(weak, strong)  # alpha = 0.1: the two halves hold different classes
    # by hand: F1 per class from the predictions, weighted by the weak devices' class shares
    _, test, _ = prepare_data(cfg)
    preds, truth = model_predictions(final_models(result)["global"], test)
    f1 = []
    for k in range(10):
        tp = np.sum((preds == k) & (truth == k))
        denom = 2 * tp + np.sum((preds == k) & (truth != k)) + np.sum((preds != k) & (truth == k))
        f1.append(2 * tp / denom if denom else 0.0)
    assert row.weak_f1 == pytest.approx(float(np.dot(weak, f1)), abs=1e-12)
    with pytest.raises(ValueError, match="no client is in groups"):
        group_class_probabilities(cfg, ["0.25"])
    # the scored model can be chosen by key or by a function of the run; an unknown key is named
    by_function = weak_device_f1_table([result], model=lambda r: "global").iloc[0]
    assert by_function.weak_f1 == pytest.approx(row.weak_f1, abs=1e-12)
    with pytest.raises(ValueError, match=r"model='0.5' is not an evaluation model of run .*accepted: global"):
        weak_device_f1_table([result], model="0.5")


def test_recalibrate_batchnorm_sets_the_exact_input_statistics():
    import torch

    from subfl_book.analysis import recalibrate_batchnorm

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    x = torch.randn(70, 1, 6, 6) * 3 + 1
    model[1].running_mean.fill_(5.0)
    recalibrate_batchnorm(model, x, batch_size=14)  # 5 batches of 14
    h = model[0](x).detach().transpose(0, 1).reshape(4, 5, -1)  # channel, batch, values
    bn = model[1]
    assert torch.allclose(bn.running_mean, h.mean(dim=(1, 2)), atol=1e-5)  # equal batches: the exact mean
    assert torch.allclose(bn.running_var, h.var(dim=2).mean(dim=1), rtol=1e-4)  # mean of the batch variances
    assert not model.training
    with pytest.raises(ValueError, match="batch_size"):
        recalibrate_batchnorm(model, x, batch_size=0)


def test_bn_recalibrated_accuracy_starts_from_the_engines_final_accuracy(tmp_path):
    from subfl_book.analysis import bn_recalibrated_accuracy

    cfg = make_config("fedavg", "digits", model="cnn", norm="bn", partition="dirichlet", alpha=0.1, scale="ci")
    result = run_experiment(cfg, tmp_path / "bn", cache=False)
    scores = bn_recalibrated_accuracy(result)
    assert scores["accuracy"] == pytest.approx(result.final(), abs=1e-12)
    assert 0.0 <= scores["recalibrated_accuracy"] <= 1.0
    plain = run_experiment(make_config("fedavg", "digits", scale="ci"), tmp_path / "plain", cache=False)
    with pytest.raises(ValueError, match="no BatchNorm"):
        bn_recalibrated_accuracy(plain)


def test_svd_refresh_by_solver_puts_each_solver_in_its_own_column():
    from subfl_book.analysis import svd_refresh_by_solver
    model = build_model("cnn", num_classes=10, input_shape=(3, 32, 32), width=0.25)
    table = svd_refresh_by_solver(model, ("exact", "gram"), repeats=1)
    assert list(table.columns) == ["layer", "shape", "seconds_exact", "seconds_gram"]
    assert list(table.layer) == ["conv2", "fc1"] and (table[["seconds_exact", "seconds_gram"]] > 0).all().all()
    with pytest.raises(ValueError, match="at least one solver"):
        svd_refresh_by_solver(model, ())


def test_refresh_layer_seconds_splits_the_refresh_by_the_layers_the_runs_timed():
    from subfl_book.analysis import refresh_layer_seconds
    stages = pd.DataFrame({"aggregate": [1.0, 0.1], "aggregate/svd_refresh": [0.8, float("nan")],
                           "aggregate/svd_refresh/conv2": [0.02, float("nan")],
                           "aggregate/svd_refresh/fc1": [0.76, float("nan")]}, index=["prism", "fedavg"])
    table = refresh_layer_seconds(stages, "prism")
    assert list(table.layer) == ["conv2", "fc1"]
    assert list(table["seconds per round"]) == pytest.approx([0.02, 0.76])
    assert list(table["share of the refresh"]) == pytest.approx([0.025, 0.95])   # 0.02 / 0.8, 0.76 / 0.8
    with pytest.raises(ValueError, match="refreshes nothing"):
        refresh_layer_seconds(stages, "fedavg")
    with pytest.raises(ValueError, match="no 'aggregate/svd_refresh' parts per layer"):
        refresh_layer_seconds(stages[["aggregate", "aggregate/svd_refresh"]], "prism")


def test_curve_summary_reads_the_peak_its_round_and_the_late_training_loss():
    from subfl_book.analysis import curve_summary
    run = RunResult(make_config("fedavg", "digits", "mlp", scale="ci", seed=4), Path("/nonexistent"))
    accuracy = {2: 0.30, 4: 0.45, 6: 0.41, 8: 0.40}
    loss = {k: 2.0 - 0.1 * k for k in range(1, 9)}   # 1.9 ... 1.2
    run.__dict__["history"] = pd.DataFrame(
        [{"round": k, "metric": "accuracy", "value": v, "group": "global"} for k, v in accuracy.items()]
        + [{"round": k, "metric": "train_loss", "value": v, "group": "global"} for k, v in loss.items()])
    row = curve_summary([run], late_rounds=3).iloc[0]
    assert (row.seed, row.final, row.best, row["best round"]) == (4, 0.40, 0.45, 4)
    assert row["train loss, last 3 rounds"] == pytest.approx((1.4 + 1.3 + 1.2) / 3)
    with pytest.raises(ValueError, match="late_rounds=0"):
        curve_summary([run], late_rounds=0)
