"""scripts/compute_runs.py records a plan's runs where the store reads them; scripts/plan_runs.py lists what a page
lacks."""
import gzip
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
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


def test_repacked_image_file_rebuilds_byte_identical(tmp_path):
    rng = np.random.default_rng(0)
    source = tmp_path / "source"
    source.mkdir()
    x = (rng.integers(0, 8, (130, 8, 8, 3)) * 32).astype(np.uint8)  # 130 images: two 12×12 mosaics, the last padded
    np.savez_compressed(source / "images.npz", x=x, y=rng.integers(0, 10, 130), names=np.array(["a", "bb"]))
    packed, rebuilt = tmp_path / "packed", tmp_path / "rebuilt"
    done = _script("repack_data.py", "pack", str(source), str(packed), "--files", "images.npz")
    assert done.returncode == 0, done.stderr[-2000:]
    index = json.loads((packed / "index.json").read_text())
    assert (index[0]["side"], index[0]["mosaics"], index[0]["shape"]) == (12, 1, [130, 8, 8, 3])
    done = _script("repack_data.py", "unpack", str(packed), str(rebuilt))
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert (rebuilt / "images.npz").read_bytes() == (source / "images.npz").read_bytes()
    with np.load(rebuilt / "images.npz") as arrays:
        assert arrays.files == ["x", "y", "names"] and np.array_equal(arrays["x"], x)
    (packed / "images.0.webp").write_bytes((packed / "images.0.webp").read_bytes()[:-40])  # a damaged mosaic
    damaged = _script("repack_data.py", "unpack", str(packed), str(tmp_path / "again"))
    assert damaged.returncode not in (0, 3)


def test_compute_runs_without_verification_reads_a_repacked_copy(tmp_path):
    source = Path(os.environ.get("SUBFL_DATA_ROOT", ROOT.parent / "shared" / "data")) / "femnist_leaf_subset.npz"
    if not source.is_file():
        pytest.skip(f"data file {source.name} not found (set SUBFL_DATA_ROOT)")
    copy = tmp_path / "data"
    copy.mkdir()
    with np.load(source) as arrays:
        np.savez(copy / source.name, **{name: arrays[name] for name in arrays.files})  # same arrays, other bytes
    config = make_config("fedavg", "femnist", scale="ci", rounds=1, num_clients=4, clients_per_round=2,
                         max_train_samples=200, max_test_samples=100)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps([{"config": config.to_dict(), "keep_state": False}]))
    statuses = {}
    for flag in ([], ["--no-verify"]):
        log = tmp_path / f"log{len(flag)}.jsonl"
        done = _script("compute_runs.py", str(plan), "--device", "cpu", "--store", str(tmp_path / f"store{len(flag)}"),
                       "--work", str(tmp_path / "work"), "--data-root", str(copy), "--log", str(log), *flag)
        assert done.returncode == 0, done.stderr[-2000:]
        statuses[bool(flag)] = json.loads(log.read_text())
    assert statuses[False]["status"] == "failed" and "sha256" in statuses[False]["error"]
    assert statuses[True]["status"] == "done"


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process parents from /proc (Linux)")
@pytest.mark.parametrize("signal_name", ["SIGKILL", "SIGTERM"])
def test_killing_compute_runs_ends_its_workers(tmp_path, signal_name):
    """A planner killed mid-run (SIGKILL: at once; SIGTERM: through its handler) leaves no worker computing:
    the worker notices its parent is gone within PARENT_POLL_S (5 s) and exits, its checkpoint kept."""
    import signal
    import time

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps([{"config": CONFIG.replace(rounds=100000).to_dict(), "keep_state": False}]))
    work = tmp_path / "work"
    workers: list[int] = []
    planner = subprocess.Popen([sys.executable, str(SCRIPTS / "compute_runs.py"), str(plan), "--device", "cpu",
                                "--store", str(tmp_path / "store"), "--work", str(work)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not list(work.glob("*/checkpoint.pt")):      # the worker is training
            assert time.monotonic() < deadline and planner.poll() is None, "the run never started"
            time.sleep(0.5)
        workers += [pid for pid in _children(planner.pid)
                    if "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")]
        assert workers
        planner.send_signal(getattr(signal, signal_name))
        planner.wait(timeout=30)
        deadline = time.monotonic() + 30
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not any(_alive(pid) for pid in workers), f"workers {workers} outlived the planner ({signal_name})"
        assert list(work.glob("*/checkpoint.pt"))          # the next planner resumes from here
    finally:
        if planner.poll() is None:
            planner.kill()
        for pid in [pid for pid in workers if _alive(pid)]:   # a failed check leaves no process behind
            os.kill(pid, signal.SIGKILL)


def _plan_page_over_one_stored_run(tmp_path, cells):
    """Record one run of ``CONFIG`` (the digits MLP) into a fresh store, then plan a page of ``cells`` (code cell
    sources) against it: ``(plan_runs' output, the planned runs)``."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps([{"config": CONFIG.to_dict(), "keep_state": False}]))
    env = {**os.environ, "SUBFL_STORE_DIR": str(tmp_path / "store")}
    done = _script("compute_runs.py", str(plan), "--device", "cpu", "--store", str(tmp_path / "store"),
                   "--work", str(tmp_path / "work"), env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    page = tmp_path / "page.ipynb"
    page.write_text(json.dumps({"cells": [{"cell_type": "code", "metadata": {}, "source": source, "outputs": [],
                                           "execution_count": None} for source in cells],
                                "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    done = _script("plan_runs.py", str(page), "--out", str(tmp_path / "out.json"), env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, json.loads((tmp_path / "out.json").read_text())


PAGE_HEAD = "from subfl.experiments import make_config\nfrom subfl_book import store\n"


def test_plan_goes_on_past_a_page_that_reads_final_weights(tmp_path):
    """A missing run's stand-in has the asked model's initial weights, so a page that analyses final weights goes on
    to ask for the runs after it (the plan used to stop at the first ``state()``)."""
    out, planned = _plan_page_over_one_stored_run(tmp_path, [
        PAGE_HEAD + "config = make_config('fedavg', 'digits', scale='ci', rounds=2, max_train_samples=120, seed=7)\n"
        "weights = store.run_experiment(config, keep_state=True).state()['weights']\n"
        "width = weights['fc2.weight'].shape[1] if 'fc2.weight' in weights else len(weights)\n"
        "store.run_experiment(config.replace(seed=100 + width))\n"])
    assert "broke" not in out, out
    assert [(p["config"]["seed"] >= 100, p["keep_state"]) for p in planned] == [(False, True), (True, False)]


def test_a_stand_in_of_another_model_has_the_asked_models_ledger(tmp_path):
    """When no stored run has the asked model, the stand-in's ledger names the asked model's tensors (a ledger
    audit against the asked model used to stop the plan: 'the ledger names tensors the model does not have')."""
    out, planned = _plan_page_over_one_stored_run(tmp_path, [   # the stored run is the MLP's; the page asks a CNN
        PAGE_HEAD + "config = make_config('fedavg', 'digits', scale='ci', rounds=2, max_train_samples=120, model='cnn')\n"
        "run = store.run_experiment(config)\n"
        "names = set(run.ledger.name) - {'__config__'}\n"
        "model = set(run.state()['weights'])\n"
        "assert names == model, sorted(names ^ model)[:4]\n"
        "store.run_experiment(config.replace(seed=100 + len(names)))\n"])
    assert "broke" not in out, out
    assert [p["config"]["model"] for p in planned] == ["cnn", "cnn"]
    assert planned[1]["config"]["seed"] >= 100


def test_plan_goes_on_past_a_cell_that_breaks_on_a_stand_in(tmp_path):
    """A code cell that raises on a stand-in is reported and the next cells still run and ask for their runs."""
    out, planned = _plan_page_over_one_stored_run(tmp_path, [
        PAGE_HEAD + "config = make_config('fedavg', 'digits', scale='ci', rounds=2, max_train_samples=120, seed=7)\n",
        "store.run_experiment(config)\nraise KeyError('conv2')\n",
        "store.run_experiment(config.replace(seed=8))\n"])
    assert "1 code cells broke on stand-ins" in out and "code cell 2: KeyError: 'conv2'" in out
    assert [p["config"]["seed"] for p in planned] == [7, 8]


def test_planned_runs_carry_a_cpu_time_estimate_from_the_store(tmp_path):
    """A planned run's ``estimated_cpu_s`` is the stored one-thread CPU record's seconds per client-epoch of its
    dataset and model times the run's client-epochs: twice the rounds, twice the stored run's time."""
    out, planned = _plan_page_over_one_stored_run(tmp_path, [
        PAGE_HEAD + f"config = make_config('fedavg', 'digits', scale='ci', rounds={2 * CONFIG.rounds}, "
        f"max_train_samples={CONFIG.max_train_samples}, seed=8)\nstore.run_experiment(config)\n"])
    (record,) = [json.loads(gzip.decompress(p.read_bytes()))
                 for p in (tmp_path / "store").glob("??/*.json.gz")]
    stored_seconds = sum(dict(record["timings"])["seconds"])
    assert record["environment"]["threads"] == 1 and record["config"]["rounds"] == CONFIG.rounds
    assert planned[0]["estimated_cpu_s"] == pytest.approx(2 * stored_seconds, abs=0.1)
    assert "one-thread CPU hours" in out


def _plan_runs_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("plan_runs", SCRIPTS / "plan_runs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_stand_in_of_another_dataset_reports_the_asked_datasets_metrics():
    """A stand-in recorded on another dataset gains the metrics the store's runs of the asked dataset report (a
    Shakespeare page reading perplexity used to break on a Fashion-MNIST stand-in), as copies of its loss rows."""
    import pandas as pd

    plan_runs = _plan_runs_module()
    history = pd.DataFrame({"round": [5, 5, 10, 10], "metric": ["accuracy", "loss"] * 2, "group": "global",
                            "value": [0.5, 1.5, 0.6, 1.2]})
    shakespeare = {"config": {"dataset": "shakespeare"},
                   "history": [["metric", ["accuracy", "loss", "perplexity"]]]}
    other = {"config": {"dataset": "fmnist"}, "history": [["metric", ["accuracy", "loss", "f1"]]]}
    grafted = plan_runs.with_metrics_of("shakespeare", history, [shakespeare, other])
    assert grafted[grafted.metric == "perplexity"].value.tolist() == [1.5, 1.2]
    assert len(grafted) == 6 and "f1" not in set(grafted.metric)
    assert plan_runs.with_metrics_of("fmnist", history, [shakespeare]) is history  # no run of it: unchanged


def test_cost_estimates_follow_the_width_of_the_model():
    """The rate is the median seconds per client-epoch of the one-thread CPU records of the same dataset, model
    and width: a width-0.25 ResNet-18 run is not priced at its width-0.125 records' rate."""
    plan_runs = _plan_runs_module()

    def record(width, seconds, threads=1, device="cpu"):
        return {"config": {"dataset": "cifar10", "model": "resnet18", "width": width, "rounds": 10,
                           "clients_per_round": 5, "local_epochs": 2},
                "environment": {"device": device, "threads": threads},
                "timings": [["seconds", [seconds / 2, seconds / 2]]]}

    records = [record(0.125, 100.0), record(0.125, 120.0), record(0.125, 140.0), record(0.25, 600.0),
               record(0.25, 10.0, threads=2), record(0.25, 10.0, device="cuda")]
    rates = plan_runs.cpu_rates(records)
    assert rates == {("cifar10", "resnet18", 0.125): 1.2, ("cifar10", "resnet18", 0.25): 6.0}
    asked = {"dataset": "cifar10", "model": "resnet18", "width": 0.25, "rounds": 20, "clients_per_round": 10,
             "local_epochs": 2}
    assert plan_runs.estimated_cpu_seconds(asked, rates) == 2400.0
    assert plan_runs.estimated_cpu_seconds({**asked, "width": 0.5}, rates) is None


def test_a_plan_carries_a_pages_analyses_and_compute_runs_records_them(tmp_path):
    """A page's final-weights analyses travel in the plan and are recorded with the run (its weights not kept)."""
    out, planned = _plan_page_over_one_stored_run(tmp_path, [
        PAGE_HEAD + "from subfl_book.final_analyses import final_analysis\n"
        "config = make_config('fedavg', 'digits', scale='ci', rounds=2, max_train_samples=120, seed=7)\n"
        "run = store.run_experiment(config, analyses=[('top_terms_accuracy', {'keep': 0.5})])\n"
        "final_analysis(run, 'top_terms_accuracy', keep=0.5)\n"])
    assert "broke" not in out, out
    assert [(p["keep_state"], p["analyses"]) for p in planned] == [(False, [["top_terms_accuracy", {"keep": 0.5}]])]
    plan = tmp_path / "analyses-plan.json"
    plan.write_text(json.dumps(planned))
    done = _script("compute_runs.py", str(plan), "--device", "cpu", "--store", str(tmp_path / "store2"),
                   "--work", str(tmp_path / "work2"), "--log", str(tmp_path / "log2.jsonl"))
    assert done.returncode == 0, done.stderr[-2000:]
    key = json.loads((tmp_path / "log2.jsonl").read_text().splitlines()[0])["key"]
    record = json.loads(gzip.decompress(store.record_path(key, tmp_path / "store2").read_bytes()))
    value = record["analyses"]['top_terms_accuracy{"keep": 0.5}']["value"]
    assert value["keep"] == 0.5 and 0.0 <= value["top_terms_accuracy"] <= 1.0
    assert not store.state_path(key, tmp_path / "store2").exists()


def _rewrite_record(path: Path, change) -> None:
    record = json.loads(gzip.decompress(path.read_bytes()))
    change(record)
    path.write_bytes(gzip.compress(json.dumps(record).encode()))


def test_a_run_computed_again_for_its_weights_must_match_its_record(tmp_path):
    """A page that now asks for a stored run's weights gets them only from a recomputation with the record's
    history: a record computed elsewhere (here: one history value moved by 1e-7, as another CPU's rounding moves
    it) is kept and nothing is written, unless --replace-differing."""
    plan, plan_weights = tmp_path / "plan.json", tmp_path / "weights.json"
    plan.write_text(json.dumps([{"config": CONFIG.to_dict(), "keep_state": False}]))
    plan_weights.write_text(json.dumps([{"config": CONFIG.to_dict(), "keep_state": True}]))
    root = tmp_path / "store"
    args = ("--device", "cpu", "--store", str(root), "--work", str(tmp_path / "work"))
    first = _script("compute_runs.py", str(plan), *args)
    assert first.returncode == 0 and '"status": "done"' in first.stdout, first.stderr[-2000:]
    key = json.loads(next(line for line in first.stdout.splitlines() if '"status"' in line))["key"]
    path = store.record_path(key, root)

    same = _script("compute_runs.py", str(plan_weights), *args)   # identical history: the weights are added
    assert '"status": "done"' in same.stdout and store.state_path(key, root).exists(), same.stdout + same.stderr
    store.state_path(key, root).unlink()

    computed = json.loads(gzip.decompress(path.read_bytes()))["history"]
    moved = 1e-7
    _rewrite_record(path, lambda r: r["history"][2][1].__setitem__(0, r["history"][2][1][0] + moved))
    before = path.read_bytes()
    differs = _script("compute_runs.py", str(plan_weights), *args)
    row = json.loads(next(line for line in differs.stdout.splitlines() if '"status"' in line))
    assert differs.returncode == 0 and row["status"] == "differs", differs.stdout + differs.stderr
    assert "first at round 1" in row["difference"] and row["this_hardware"]["cpus"] >= 1
    assert path.read_bytes() == before and not store.state_path(key, root).exists()

    replaced = _script("compute_runs.py", str(plan_weights), *args, "--replace-differing")
    assert '"status": "done"' in replaced.stdout, replaced.stdout + replaced.stderr
    assert path.read_bytes() != before and store.state_path(key, root).exists()
    assert json.loads(gzip.decompress(path.read_bytes()))["history"] == computed  # this machine's run, whole
