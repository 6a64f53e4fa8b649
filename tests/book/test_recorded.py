"""Recorded runs: the reader's tables on a hand-made file, the committed ResNet-18 file against the model, and the
script that writes such files (ci sizes, CPU)."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from subfl_book.recorded import load_recorded, load_stage_benchmark, recorded_path, seed_table
from subfl.models import build_model

ROOT = Path(__file__).resolve().parents[2]


def _run(method, rounds, planned, accuracies, *, complete, upload_bytes, seconds, diverged_at=None, exit_code=0,
         seed=0):
    history = [[r, "accuracy", a, "global"] for r, a in accuracies] + [[1, "train_loss", 2.0, "global"]]
    return {"method": method, "lr": 0.01, "config": {"rounds": planned, "clients_per_round": 4, "seed": seed},
            "complete": complete, "rounds": rounds, "diverged_at": diverged_at, "upload_bytes": upload_bytes,
            "seconds_per_round": seconds, "history": history, "exit_code": exit_code}


@pytest.fixture
def recorded(tmp_path):
    runs = [_run("a", 10, 10, [(2, 0.2), (4, 0.3), (6, 0.35), (8, 0.4), (10, 0.5)], complete=True,
                 upload_bytes=8_000_000, seconds={"configure": 0.5, "local_train": 10.0, "aggregate": 1.5}),
            _run("b", 7, 10, [(2, 0.1), (4, 0.25), (6, 0.2)], complete=False, upload_bytes=2_800_000,
                 seconds={"configure": 0.0, "local_train": 4.0, "aggregate": 1.0})]
    path = tmp_path / "rec.json"
    path.write_text(json.dumps({"accelerator": "test", "runs": runs}))
    return load_recorded(path)


def test_table_compares_at_the_last_round_every_run_recorded(recorded):
    assert recorded.common_round() == 6
    table = recorded.table().set_index("method")
    assert table.loc["a", "accuracy at round 6"] == 0.35 and table.loc["b", "accuracy at round 6"] == 0.2
    assert table.loc["a", "last accuracy"] == 0.5 and table.loc["b", "last recorded round"] == 6
    assert table.loc["b", "best accuracy"] == 0.25
    # 8e6 bytes over 10 rounds × 4 clients = 0.2 MB; 2.8e6 over 7 × 4 = 0.1 MB
    assert table.loc["a", "upload (MB per client-round)"] == pytest.approx(0.2)
    assert table.loc["b", "upload (MB per client-round)"] == pytest.approx(0.1)
    assert table.loc["a", "status"] == "complete" and table.loc["b", "status"] == "stopped after round 7 of 10"


def test_timings_give_the_server_share_of_local_training(recorded):
    timings = recorded.timings()
    assert timings.loc["a", "server / local training"] == pytest.approx(0.2)   # (0.5 + 1.5) / 10
    assert timings.loc["b", "server / local training"] == pytest.approx(0.25)  # (0 + 1) / 4


def test_status_of_diverged_and_failed_runs(tmp_path):
    runs = [_run("d", 3, 10, [(2, 0.1)], complete=True, upload_bytes=1, seconds={}, diverged_at=3),
            _run("f", 0, 10, [], complete=False, upload_bytes=None, seconds={}, exit_code=1)]
    path = tmp_path / "rec.json"
    path.write_text(json.dumps({"runs": runs}))
    rec = load_recorded(path)
    assert [r.status for r in rec.runs] == ["diverged in round 3", "failed"]
    assert np.isnan(rec.table().set_index("method").loc["f", "upload (MB per client-round)"])


def test_bad_files_name_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="no recorded results"):
        load_recorded(tmp_path / "absent.json")
    path = tmp_path / "rec.json"
    path.write_text(json.dumps({"runs": [{"method": "a", "lr": 0.1}]}))
    with pytest.raises(ValueError, match="run 0 lacks config, complete, rounds"):
        load_recorded(path)
    path.write_text(json.dumps({"accelerator": "x"}))
    with pytest.raises(ValueError, match="'runs'"):
        load_recorded(path)


def _write(path, runs):
    path.write_text(json.dumps({"runs": runs}))
    return load_recorded(path)


def test_seed_table_compares_every_seed_at_the_round_all_recorded(recorded, tmp_path):
    seed1 = _write(tmp_path / "s1.json", [
        _run("b", 8, 10, [(2, 0.15), (4, 0.3), (6, 0.3), (8, 0.31)], complete=False, upload_bytes=1, seconds={},
             seed=1),
        _run("a", 4, 10, [(2, 0.25), (4, 0.45)], complete=False, upload_bytes=1, seconds={}, seed=1)])
    table = seed_table([recorded, seed1]).set_index("method")
    assert list(table.index) == ["a", "b"]          # the first file's order
    assert (table["round"] == 4).all()              # seed 1's run of a stopped after round 4
    assert table.loc["a", "seed 0"] == 0.3 and table.loc["a", "seed 1"] == 0.45
    assert table.loc["a", "mean"] == pytest.approx(0.375)
    assert table.loc["a", "sd"] == pytest.approx(np.std([0.3, 0.45], ddof=1))   # 0.1061
    assert table.loc["b", "mean"] == pytest.approx(0.275) and (table["seeds"] == 2).all()
    one = seed_table([recorded]).set_index("method")
    assert one.loc["a", "round"] == 6 and np.isnan(one.loc["a", "sd"])


def test_seed_table_refuses_mismatched_files(recorded, tmp_path):
    with pytest.raises(ValueError, match="at least one"):
        seed_table([])
    other = _write(tmp_path / "o.json", [_run("a", 2, 10, [(2, 0.2)], complete=False, upload_bytes=1, seconds={})])
    with pytest.raises(ValueError, match="same rows"):
        seed_table([recorded, other])
    same_seed = _write(tmp_path / "s.json", [_run(m, 2, 10, [(2, 0.2)], complete=False, upload_bytes=1, seconds={})
                                             for m in ("a", "b")])
    with pytest.raises(ValueError, match="two runs of seed 0"):
        seed_table([recorded, same_seed])
    late = _write(tmp_path / "l.json", [_run(m, 12, 12, [(12, 0.2)], complete=True, upload_bytes=1, seconds={},
                                             seed=3) for m in ("a", "b")])
    with pytest.raises(ValueError, match="no round"):
        seed_table([recorded, late])


def test_committed_seed_files_hold_the_same_rows_with_seeds_0_1_and_2():
    files = [load_recorded(recorded_path(n)) for n in ("spectral_resnet18_h200.json",
                                                       "spectral_resnet18_seed1_h100.json",
                                                       "spectral_resnet18_seed2_h100.json")]
    assert [f.seeds for f in files] == [[0], [1], [2]]
    assert all([r.method for r in f.runs] == [r.method for r in files[0].runs] for f in files)
    table = seed_table(files)
    assert table["round"].iloc[0] == 22 and (table["seeds"] == 3).all()


def test_committed_resnet18_file_matches_the_model():
    rec = load_recorded(recorded_path("spectral_resnet18_h200.json"))
    assert [r.method for r in rec.runs] == ["fedavg", "origdrop", "topn", "prism", "unbiased+cliplr",
                                            "collective+cliplr"]
    assert all(r.config["model"] == "resnet18" and r.config["width"] == 1.0 for r in rec.runs)
    # FedAvg uploads ResNet-18's whole state every client-round: 11,173,962 parameters plus the BN buffers
    state = build_model("resnet18", num_classes=10, input_shape=(3, 32, 32), width=1.0).state_dict()
    state_mb = sum(t.numel() * t.element_size() for t in state.values()) / 1e6
    upload = rec.table().set_index("method").loc["fedavg", "upload (MB per client-round)"]
    assert upload == pytest.approx(state_mb, rel=1e-5)
    # top-n trains the same 20 % of every decomposed layer's terms in every round
    topn = rec.run("topn").history
    assert topn[topn.metric == "covered_fraction"].value.between(0.19, 0.21).all()


def test_script_writes_a_file_the_reader_loads(tmp_path):
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "spectral_resnet18.py"), "--out", str(out),
                           "--device", "cpu", "--smoke", "--rounds", "1", "--minutes", "5", "--methods", "fedavg,topn",
                           "--seed", "1"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rec = load_recorded(out)
    assert [r.status for r in rec.runs] == ["complete", "complete"]
    assert all(r.config["rounds"] == 1 and r.config["model"] == "resnet18" and r.config["seed"] == 1
               for r in rec.runs)
    assert rec.meta["seed"] == 1
    assert rec.common_round() == 1
    bad = subprocess.run([sys.executable, str(ROOT / "scripts" / "spectral_resnet18.py"), "--out", str(out),
                          "--methods", "nope"], capture_output=True, text=True)
    assert bad.returncode != 0 and "--methods: nope not valid" in bad.stderr


def test_stage_benchmark_gives_the_server_share(tmp_path):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"args": {"clients": 10, "device": "cuda"}, "accelerator": "gpu", "cpu_threads": 4,
                                "results": [{"strategy": "prism", "seconds_per_round": {
                                    "configure": 0.1, "aggregate": 0.9, "local_train": 5.0, "evaluate": 0.2}}]}))
    row = load_stage_benchmark(path).iloc[0]
    assert row["server_share"] == pytest.approx(0.2)               # (0.1 + 0.9) / 5
    assert row["local_per_client"] == pytest.approx(0.5)           # 5 s over 10 clients
    assert row["server_share_per_client"] == pytest.approx(2.0)
    assert row["cpu_threads"] == 4 and row["device"] == "cuda"
    assert row["svd_solver"] == "exact"                            # a file from before solvers were recorded
    path.write_text(json.dumps({"args": {"clients": 10, "device": "cuda"}, "accelerator": "gpu", "cpu_threads": 4,
                                "results": [{"strategy": s, "svd_solver": v, "seconds_per_round": {
                                    "configure": 0.1, "aggregate": a, "local_train": 5.0}}
                                    for s, v, a in (("prism", "gram", 0.4), ("fedavg", None, 0.1))]}))
    table = load_stage_benchmark(path)
    assert table["svd_solver"].iloc[0] == "gram" and pd.isna(table["svd_solver"].iloc[1])
    assert table["server_share"].tolist() == pytest.approx([0.1, 0.04])   # (0.1 + 0.4) / 5, (0.1 + 0.1) / 5
    path.write_text(json.dumps({"args": {}, "results": []}))
    with pytest.raises(ValueError, match="accelerator, cpu_threads"):
        load_stage_benchmark(path)
    with pytest.raises(FileNotFoundError, match="no benchmark results"):
        load_stage_benchmark(tmp_path / "absent.json")


def test_committed_runtime_files_time_resnet18_at_full_width():
    for name, threads in (("prism_runtime_resnet18_h200_16threads.json", 16),
                          ("prism_runtime_resnet18_h200_2threads.json", 2),
                          ("prism_runtime_resnet18_gram_h100_16threads.json", 16),
                          ("prism_runtime_resnet18_gram_h100_2threads.json", 2)):
        table = load_stage_benchmark(recorded_path(name))
        assert (table["cpu_threads"] == threads).all() and "prism" in set(table["strategy"])
        data = json.loads(recorded_path(name).read_text())
        assert data["args"]["width"] == 1.0 and data["args"]["device"] == "cuda"
