"""``subfl run --engine flower``: the same files as ``subfl run`` (the default ``--engine local``)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from subfl.cli import build_parser, main

ARGS = ["fedavg", "--dataset", "digits", "--scale", "ci", "--quiet"]


def test_engine_defaults_to_local_and_accepts_only_known_engines(capsys):
    assert build_parser().parse_args(["run", *ARGS, "--out", "x"]).engine == "local"
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["run", *ARGS, "--out", "x", "--engine", "grpc"])
    assert exit_.value.code == 2 and "--engine" in capsys.readouterr().err


def test_flower_engine_refuses_the_run_cache(tmp_path, capsys):
    pytest.importorskip("flwr", reason="Flower is not installed (pip install 'subfl[flower]')")
    assert main(["run", *ARGS, "--out", str(tmp_path), "--engine", "flower", "--cache"]) == 2
    assert "--cache applies to --engine local" in capsys.readouterr().err


@pytest.mark.slow
def test_subfl_run_on_flower_writes_the_local_run_files(tmp_path):
    pytest.importorskip("flwr", reason="Flower is not installed (pip install 'subfl[flower]')")
    local, flower = tmp_path / "local", tmp_path / "flower"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for engine, out in (("local", local), ("flower", flower)):
        done = subprocess.run([sys.executable, "-m", "subfl.cli", "run", *ARGS, "--engine", engine, "--out", str(out)],
                              env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "final accuracy" in done.stdout
    for name in ("history.csv", "ledger.csv"):
        assert (flower / name).read_bytes() == (local / name).read_bytes(), name
    assert {p.name for p in flower.iterdir()} >= {"history.csv", "ledger.csv", "timings.csv", "state.pt",
                                                   "summary.json"}
