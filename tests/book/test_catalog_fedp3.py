"""The FedP3 chapter's settings (catalog) and the upload savings read from run ledgers (analysis)."""
from pathlib import Path

import pandas as pd
import pytest
from torch import nn

from subfl.costs import parameter_bytes
from subfl.experiments import RunResult, make_config, run_experiment
from subfl_book import catalog
from subfl_book.analysis import upload_savings
from subfl_book.catalog import (FEDP3_FIG2_METHODS, FEDP3_FIG2_SPLITS, FEDP3_SPLITS, fedp3_config,
                                       fedp3_model, fedp3_runs)
from subfl.models import build_model


def test_fedp3_splits_and_methods():
    assert FEDP3_FIG2_SPLITS == ("S1", "S2") and FEDP3_FIG2_METHODS == ("fedavg", "lowerb", "opu2", "opu3")
    s1, s2, iid = (fedp3_config("lowerb", s) for s in ("S1", "S2", "iid"))
    assert (s1.partition, s1.classes_per_client, s1.alpha) == ("k_classes", 5, None)
    assert (s2.partition, s2.classes_per_client, s2.alpha) == ("dirichlet_allocation", None, 0.5)
    assert (iid.partition, iid.classes_per_client, iid.alpha) == ("iid", None, None)
    assert set(FEDP3_SPLITS) == {"S1", "S2", "iid"}


def test_fedp3_config_fashion_mnist_cpu_sizes():
    cfg = fedp3_config("opu2", "S2", seed=1)
    # the Fashion-MNIST cpu preset, the Table 4 CNN at width 0.25, the 70/30 personalised split, no method options
    assert (cfg.method, cfg.dataset, cfg.model, cfg.width, cfg.seed) == ("opu2", "fmnist", "fedp3_cnn", 0.25, 1)
    assert (cfg.num_clients, cfg.clients_per_round, cfg.rounds, cfg.local_epochs, cfg.batch_size) == (100, 10, 30, 2, 32)
    assert (cfg.lr, cfg.momentum, cfg.lr_schedule, cfg.eval_every, cfg.local_test_fraction) == (
        0.02, 0.9, "constant", 5, 0.3)
    assert cfg.method_options == () and cfg.dataset_options == ()
    assert dict(fedp3_config("opu2", global_keep=0.9).method_options) == {"global_keep": 0.9}
    # every method of a split shares everything but the method
    assert fedp3_config("fedavg", "S2", seed=1) == cfg.replace(method="fedavg")
    assert fedp3_config("opu2", "S2", seed=1, lr=0.01) == cfg.replace(lr=0.01)  # only the learning rate changes


def test_fedp3_config_other_datasets_and_scales():
    cif = fedp3_config("fedavg", "S1", dataset="cifar10")
    assert (cif.model, cif.width, cif.num_clients, cif.clients_per_round, cif.rounds, cif.local_epochs) == (
        "fedp3_cnn", 1.0, 20, 10, 40, 2)  # full width: the only one at which FedAvg clears the 0.60 bar
    assert (cif.lr, cif.weight_decay, cif.lr_schedule, cif.eval_every) == (0.02, 5e-4, "cosine", 5)
    fem = fedp3_config("lowerb", "S2", dataset="femnist")
    assert (fem.model, fem.width, fem.num_clients, fem.rounds, fem.lr) == ("fedp3_mlp", 1.0, 20, 40, 0.05)
    assert dict(fem.dataset_options) == {"letters_only": True, "merge_case": True}
    ci = fedp3_config("opu3", "S1", scale="ci")
    assert (ci.width, ci.num_clients, ci.rounds, ci.local_test_fraction) == (0.25, 4, 2, 0.3)
    paper = fedp3_config("opu3", "S1", scale="paper")
    assert (paper.width, paper.num_clients, paper.rounds, paper.model) == (1.0, 100, 200, "fedp3_cnn")


def test_fedp3_config_rejects_bad_input():
    with pytest.raises(ValueError, match=r"split='S3' is not valid; accepted: S1, S2, iid"):
        fedp3_config("opu2", "S3")
    with pytest.raises(ValueError, match=r"dataset='digits' has no FedP3 setting; accepted: fmnist, cifar10, femnist"):
        fedp3_config("opu2", dataset="digits")
    with pytest.raises(ValueError, match="scale='gpu'"):
        fedp3_config("opu2", scale="gpu")
    with pytest.raises(ValueError, match="method='opu4'"):
        fedp3_config("opu4")
    with pytest.raises(ValueError, match="config.dataset='digits'"):
        fedp3_model(make_config("fedavg", "digits", "mlp", scale="ci"))


def test_fedp3_runs_gives_method_options_to_the_fedp3_variants_only(monkeypatch):
    seen = []
    monkeypatch.setattr(catalog, "run_seeds", lambda cfg, seeds, **kw: seen.append((cfg, tuple(seeds))) or [])
    assert fedp3_runs("S2", seeds=(0, 1), global_keep=0.5) == []
    assert [c.method for c, _ in seen] == list(FEDP3_FIG2_METHODS)
    assert [dict(c.method_options) for c, _ in seen] == [{}] + [{"global_keep": 0.5}] * 3
    assert {s for _, s in seen} == {(0, 1)} and {c.partition for c, _ in seen} == {"dirichlet_allocation"}


def test_fedp3_model_is_the_runs_network():
    cnn = fedp3_model(fedp3_config("fedavg"))
    # Table 4 CNN at width 0.25 on 1x28x28: conv 1->16 (416), conv 16->16 (6,416), FC 256->256 (65,792) twice,
    # FC 256->10 (2,570): 140,986 parameters
    assert sum(p.numel() for p in cnn.parameters()) == 416 + 6416 + 65792 + 65792 + 2570 == 140986
    mlp = fedp3_model(fedp3_config("fedavg", dataset="femnist"))
    # 784-1024-1024-1024-26: 803,840 + 1,049,600 + 1,049,600 + 26,650
    assert sum(p.numel() for p in mlp.parameters()) == 2929690


# ---- upload_savings ------------------------------------------------------------------------------------------------
_NET = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))  # two layers: "0" (60 bytes) and the FFC "2" (32)
_BYTES = {"0.weight": 48, "0.bias": 12, "2.weight": 24, "2.bias": 8}


def _ledger_run(method: str, uploads: dict[tuple[int, int], list[str]], partition: str = "iid") -> RunResult:
    """A RunResult whose ledger holds the given uploads per (round, client), plus rows that must be ignored."""
    rows = []
    for (rnd, client), names in uploads.items():
        rows += [{"round": rnd, "client": client, "direction": "down", "name": n, "bytes": b} for n, b in _BYTES.items()]
        rows += [{"round": rnd, "client": client, "direction": "up", "name": n, "bytes": _BYTES[n]} for n in names]
        rows.append({"round": rnd, "client": client, "direction": "up", "name": "__config__", "bytes": 1000})
    extra = dict(classes_per_client=2) if partition == "k_classes" else {}
    run = RunResult(make_config(method, "digits", "mlp", partition, scale="ci", **extra), Path("/nonexistent"))
    run.__dict__["ledger"] = pd.DataFrame(rows)
    return run


def test_upload_savings_against_a_hand_computation():
    full = list(_BYTES)
    fedavg = _ledger_run("fedavg", {(1, 0): full, (1, 1): full, (2, 0): full})
    # LowerB-like: (1, 0) uploads the FFC only (32 B, 1 layer), (2, 3) both layers (92 B, 2 layers)
    lowerb = _ledger_run("lowerb", {(1, 0): ["2.weight", "2.bias"], (2, 3): full})
    table = upload_savings([fedavg, lowerb], model=_NET).set_index("method")
    assert table.loc["fedavg", "bytes_up"] == 92 and table.loc["fedavg", "client_rounds"] == 3
    assert table.loc["lowerb", "bytes_up"] == (32 + 92) / 2 == 62
    assert table.loc["lowerb", "saving_bytes"] == pytest.approx(1 - 62 / 92)
    assert table.loc["lowerb", "layers_up"] == 1.5 and table.loc["lowerb", "saving_layers"] == pytest.approx(0.25)
    assert table.loc["fedavg", "saving_bytes"] == 0 and table.loc["fedavg", "saving_layers"] == 0
    # two runs of one method pool their client-rounds: (32 + 92 + 32) / 3
    again = _ledger_run("lowerb", {(1, 5): ["2.weight", "2.bias"]})
    pooled = upload_savings([fedavg, lowerb, again]).set_index("method")
    assert pooled.loc["lowerb", "bytes_up"] == pytest.approx(52) and "layers_up" not in pooled
    assert list(pooled.index) == ["fedavg", "lowerb"]


def test_upload_savings_matches_the_reference_of_the_same_split():
    full = list(_BYTES)
    runs = [_ledger_run("fedavg", {(1, 0): full}), _ledger_run("fedavg", {(1, 0): ["0.weight", "2.weight"]}, "k_classes"),
            _ledger_run("opu2", {(1, 0): ["2.weight", "2.bias"]}, "k_classes")]
    table = upload_savings(runs, by=("method", "partition"))
    opu2 = table[table.method == "opu2"].iloc[0]
    assert opu2["saving_bytes"] == pytest.approx(1 - 32 / 72)  # against the k_classes FedAvg (72 B), not the iid one
    with pytest.raises(ValueError, match="no 'fedavg' runs"):
        upload_savings(runs[2:], by=("method", "partition"))
    with pytest.raises(ValueError, match="must name 'method'"):
        upload_savings(runs, by=("partition",))
    with pytest.raises(ValueError, match="empty"):
        upload_savings([])


def test_upload_savings_of_real_runs_count_layers_as_fedp3_does(tmp_path):
    # the EMNIST-L MLP (4 layers) on digits: OPU2 uploads the FFC and 2 of the 3 other layers, i.e. 3 of 4 layers
    common = dict(scale="ci", rounds=2, num_clients=4, clients_per_round=2, width=0.125, local_test_fraction=0.3)
    runs = [run_experiment(make_config(m, "digits", "fedp3_mlp", **common), tmp_path / m, cache=False)
            for m in ("fedavg", "opu2")]
    model = build_model("fedp3_mlp", num_classes=10, input_shape=(64,), width=0.125)
    table = upload_savings(runs, model=model).set_index("method")
    assert table.loc["fedavg", "bytes_up"] == parameter_bytes(model) and table.loc["fedavg", "layers_up"] == 4
    assert table.loc["opu2", "layers_up"] == 3 and table.loc["opu2", "saving_layers"] == pytest.approx(0.25)
    assert table.loc["opu2", "client_rounds"] == 4 and 0 < table.loc["opu2", "saving_bytes"] < 1


# ---- client_round_bytes and the ablation settings ----------------------------------------------------------------
def test_client_round_bytes_against_a_hand_computation():
    from subfl_book.analysis import client_round_bytes
    full = list(_BYTES)
    a = _ledger_run("opu2", {(1, 0): ["2.weight", "2.bias"], (1, 1): full})
    b = _ledger_run("opu2", {(2, 4): ["2.weight"]})
    # every client-round downloads all four tensors (92 B; the 1000-byte __config__ row is not traffic)
    assert client_round_bytes([a, b]) == 92
    assert client_round_bytes([a, b], "up") == pytest.approx((32 + 92 + 24) / 3)
    with pytest.raises(ValueError, match="direction='sideways'"):
        client_round_bytes([a], "sideways")
    with pytest.raises(ValueError, match="no 'down' traffic"):
        client_round_bytes([])


def test_fedp3_variant_configs_leave_defaults_out():
    # the P = 1 / fixed / simple cell of every ablation is the very Fig. 2 run (same config, one cache entry)
    assert catalog.fedp3_variant_config("S2", global_keep=1.0, local_pruning="fixed") == fedp3_config("opu2", "S2")
    assert dict(catalog.fedp3_variant_config(global_keep=0.7, local_pruning="uniform").method_options) == {
        "global_keep": 0.7, "local_pruning": "uniform"}
    glob = catalog.fedp3_ablation_configs("global", "S1", seed=1)
    assert [dict(c.method_options).get("global_keep", 1.0) for c in glob] == [1.0, 0.9, 0.7, 0.5]
    assert {(c.partition, c.seed, c.method) for c in glob} == {("k_classes", 1, "opu2")}
    local = catalog.fedp3_ablation_configs("local")
    assert len(local) == 6 and len(set(local)) == 6
    assert local[0] == glob[1].replace(partition="dirichlet_allocation", classes_per_client=None, alpha=0.5, seed=0)
    agg = catalog.fedp3_ablation_configs("aggregation")
    assert [(c.method, dict(c.method_options).get("aggregation", "simple")) for c in agg] == [
        (m, a) for m in ("opu123", "opu23") for a in ("simple", "weighted", "attention")]
    ldp = catalog.fedp3_ablation_configs("ldp")
    assert [dict(c.method_options)["noise_multiplier"] for c in ldp] == list(catalog.FEDP3_LDP_NOISE)
    assert all(dict(c.method_options)["ldp_mechanism"] == "dpsgd" for c in ldp)
    with pytest.raises(ValueError, match="kind='blocks'"):
        catalog.fedp3_ablation_configs("blocks")


def test_fedp3_block_config_rows_and_reference():
    from subfl_book.catalog import FEDP3_BLOCK_PAPER, FEDP3_BLOCK_ROWS, fedp3_block_config

    assert list(FEDP3_BLOCK_ROWS) == list(FEDP3_BLOCK_PAPER)
    full, both = fedp3_block_config("Full"), fedp3_block_config("−B2−B3 full")
    assert (full.method, full.model, full.width, full.norm, full.partition, full.alpha) == (
        "fedp3-blocks", "resnet18", 0.125, "bn", "dirichlet_allocation", 0.5)
    assert dict(full.method_options) == {} and dict(both.method_options) == {"excluded": ["layer2", "layer3"]}
    assert both.replace(method_options={}) == full  # the rows differ in the excluded blocks only
    reference = fedp3_block_config("", method="fedavg")
    assert reference.replace(method="fedp3-blocks") == full
    assert fedp3_block_config("Full", scale="ci").norm == "bn"
    with pytest.raises(ValueError, match="row='-B4' is not valid"):
        fedp3_block_config("-B4")
