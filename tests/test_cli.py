"""The acceptance commands of the spine issue, through the real console script."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from subfl.data import load_dataset

pytestmark = pytest.mark.slow


def _subfl(*args, **kw):
    return subprocess.run([sys.executable, "-m", "subfl.cli", *args], capture_output=True, text=True,
                          env={**os.environ, "TQDM_DISABLE": "1"}, **kw)


def _fmnist_available() -> bool:
    try:
        load_dataset("fmnist")
        return True
    except FileNotFoundError:
        return False


needs_fmnist = pytest.mark.skipif(not _fmnist_available(), reason="Fashion-MNIST files not found")


@needs_fmnist
def test_ci_run_twice_gives_identical_history(tmp_path):
    args = ["run", "fedavg", "--dataset", "fmnist", "--model", "cnn", "--partition", "dirichlet", "--alpha",
            "0.1", "--scale", "ci", "--seed", "0"]
    t0 = time.time()
    first = _subfl(*args, "--out", str(tmp_path / "a"))
    assert first.returncode == 0, first.stderr
    assert time.time() - t0 < 120
    second = _subfl(*args, "--out", str(tmp_path / "b"))
    assert second.returncode == 0, second.stderr
    assert (tmp_path / "a/history.csv").read_bytes() == (tmp_path / "b/history.csv").read_bytes()
    summary = json.loads((tmp_path / "a/summary.json").read_text())
    assert summary["upload_bytes"] > 0 and 0 <= summary["final_accuracy"] <= 1
    assert (tmp_path / "a/ledger.csv").exists()


@needs_fmnist
def test_killed_run_resumes_with_the_same_command(tmp_path):
    args = ["run", "fedavg", "--dataset", "fmnist", "--scale", "ci", "--set", "rounds=12", "--quiet"]
    reference = _subfl(*args, "--out", str(tmp_path / "ref"))
    assert reference.returncode == 0, reference.stderr
    out = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "subfl.cli", *args, "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not (out / "checkpoint.pt").exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "summary.json").exists(), "the run finished before it could be interrupted"
    resumed = _subfl(*args, "--out", str(out))
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((out / "summary.json").read_text())["resumed_from_round"] >= 1
    assert (out / "history.csv").read_bytes() == (tmp_path / "ref/history.csv").read_bytes()


def test_bad_arguments_give_a_one_line_error(tmp_path):
    res = _subfl("run", "fedavg", "--dataset", "mnist", "--scale", "ci", "--out", str(tmp_path))
    assert res.returncode == 2
    assert "dataset='mnist'" in res.stderr and "fmnist" in res.stderr


def test_list_names_everything():
    res = _subfl("list")
    assert res.returncode == 0 and "fedavg" in res.stdout and "dirichlet" in res.stdout


def test_a_diverged_run_is_reported_not_a_crash(tmp_path):
    """Issue 40: a diverged run used to crash the CLI while printing its summary (a None accuracy)."""
    res = _subfl("run", "schatten", "--dataset", "digits", "--scale", "ci", "--set",
                 "heterogeneity=uniform:0.25,0.5,0.75,1.0", "--set", "rounds=4", "--quiet", "--out", str(tmp_path / "d"))
    assert res.returncode == 0, res.stderr
    summary = json.loads((tmp_path / "d/summary.json").read_text())
    if summary["diverged_at_round"] is not None:
        assert f"diverged in round {summary['diverged_at_round']}" in res.stdout
    assert "Traceback" not in res.stderr


def test_bad_input_is_one_line_through_the_console_script(tmp_path):
    for args in (["--set", "rounds=abc"], ["--set", "seed=3"], ["--set", "device=banana"]):
        res = _subfl("run", "fedavg", "--dataset", "digits", "--scale", "ci", *args, "--out", str(tmp_path / "o"))
        assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert args[1].split("=")[0] in res.stderr
    assert not (tmp_path / "o").exists()
