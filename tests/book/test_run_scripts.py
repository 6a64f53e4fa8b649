"""scripts/compute_runs.py records a plan's runs where the store reads them; scripts/plan_runs.py lists what a page
lacks."""
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from subfl.experiments import make_config
from subfl_book import store

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
CONFIG = make_config("fedavg", "digits", scale="ci", rounds=2, max_train_samples=120)


def _script(name: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPTS / name), *args], capture_output=True, text=True, timeout=300,
                          env=env)


def test_computed_runs_are_recorded_packed_and_read_by_the_store(tmp_path, monkeypatch):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps([{"config": CONFIG.to_dict(), "keep_state": True},
                                {"config": CONFIG.replace(seed=1).to_dict(), "keep_state": False}]))
    out = tmp_path / "out"
    out.mkdir()
    done = _script("compute_runs.py", str(plan), "--device", "cpu", "--jobs", "2", "--store", str(tmp_path / "store"),
                   "--work", str(tmp_path / "work"), "--pack", str(out), "--log", str(out / "log.jsonl"))
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert sorted(r["status"] for r in rows) == ["done", "done"]
    with tarfile.open(out / "store-1.tar") as tar:
        names = tar.getnames()
    assert len([n for n in names if n.endswith(".json.gz")]) == 2 and len([n for n in names if n.endswith(".pt")]) == 1
    monkeypatch.setenv("SUBFL_STORE_DIR", str(tmp_path / "store"))
    monkeypatch.setenv(store.STORE_ONLY_ENV, "1")
    first = store.run_experiment(CONFIG, keep_state=True)
    assert first.key == rows[0]["key"] or first.key == rows[1]["key"]
    assert first.final() == pytest.approx(next(r["final_accuracy"] for r in rows if r["key"] == first.key))
    assert set(first.state()["weights"])
    again = _script("compute_runs.py", str(plan), "--device", "cpu", "--store", str(tmp_path / "store"),
                    "--work", str(tmp_path / "work"))
    assert again.returncode == 0 and again.stdout.count('"status": "present"') == 2  # nothing computed twice


def test_compute_runs_refuses_bad_arguments(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text("[]")
    for args, fragment in ((["--jobs", "0"], "--jobs=0"), (["--minutes", "-1"], "--minutes=-1.0"),
                           (["--device", "tpu"], "device")):
        base = ["--device", "cpu"] if "--device" not in args else []
        done = _script("compute_runs.py", str(plan), "--store", str(tmp_path / "s"), *base, *args)
        assert done.returncode != 0 and fragment in done.stderr, done.stderr[-500:]
