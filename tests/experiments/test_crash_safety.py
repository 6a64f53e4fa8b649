"""The run folder and the run cache survive a kill at every write point, and identical runs started together are
computed once (issue 40, "crash-safe, concurrent-safe storage").

A killed process is simulated for real: a child Python process counts every write the run makes (a file opened
for writing, ``torch.save``, ``os.replace`` / ``os.rename``) and, at the k-th, leaves that file half-written or the
rename undone and ends with ``os._exit`` (no ``finally`` runs, as with ``kill -9``). After each kill the same call,
made again, must return the clean run's results, and a third call must read them back without computing.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from subfl.experiments import make_config, run_experiment
from subfl.experiments.provenance import history_digest, state_digest

CONFIG = dict(method="fedavg", dataset="digits", model="mlp", scale="ci", rounds=2, num_clients=4,
              clients_per_round=2, max_train_samples=120, max_test_samples=60)

DRIVER = textwrap.dedent('''
    import builtins, io, json, os, sys
    import torch
    kill_at, out_dir, cache = int(sys.argv[1]), sys.argv[2] or None, sys.argv[3] == "1"
    count = [0]

    def reached():
        count[0] += 1
        return count[0] == kill_at

    real_open, real_save, real_replace, real_rename = builtins.open, torch.save, os.replace, os.rename

    def open_(file, mode="r", *args, **kwargs):
        handle = real_open(file, mode, *args, **kwargs)
        if any(c in mode for c in "wax+") and reached():
            handle.write(b"\\0half" if "b" in mode else "half")
            handle.flush()
            os._exit(137)
        return handle

    def save(obj, f, *args, **kwargs):
        if isinstance(f, (str, os.PathLike)) and reached():  # a write into a buffer is not a file write
            with real_open(f, "wb") as handle:
                handle.write(b"PK\\3\\4half")
            os._exit(137)
        return real_save(obj, f, *args, **kwargs)

    def replace(src, dst, *args, **kwargs):
        if reached():
            os._exit(137)
        return real_replace(src, dst, *args, **kwargs)

    def rename(src, dst, *args, **kwargs):
        if reached():
            os._exit(137)
        return real_rename(src, dst, *args, **kwargs)

    builtins.open, io.open, torch.save, os.replace, os.rename = open_, open_, save, replace, rename
    from subfl.experiments import make_config, run_experiment
    config = make_config(**json.loads(os.environ["CRASH_CONFIG"]))
    if os.environ.get("CRASH_API") == "store":  # the book's run store (subfl_book.store), weights kept
        from subfl_book.store import run_experiment as stored_run
        stored_run(config, keep_state=True)
        print(json.dumps({"writes": count[0], "from_cache": False}))
    else:
        result = run_experiment(config, out_dir, cache=cache)
        print(json.dumps({"writes": count[0], "from_cache": result.from_cache}))
''')


def _child(kill_at: int, out_dir: Path | None, cache: bool, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", DRIVER, str(kill_at), str(out_dir or ""), "1" if cache else "0"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _env(cache_dir: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "SUBFL_CACHE_DIR": str(cache_dir), "CRASH_CONFIG": json.dumps(CONFIG),
            "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1", **extra}


def _fingerprint(result) -> tuple:
    summary = {k: v for k, v in result.summary.items() if k not in ("wall_time_s", "resumed_from_round")}
    return (history_digest(result.history.itertuples(index=False)), result.ledger.to_csv(index=False),
            json.dumps(summary, sort_keys=True, default=str), state_digest(result.state()))


@pytest.mark.slow
def test_a_kill_at_any_write_leaves_a_run_that_finishes_with_the_clean_result(tmp_path, monkeypatch):
    clean = _fingerprint(run_experiment(make_config(**CONFIG), tmp_path / "clean", cache=False))
    kill_at, finished = 0, False
    while not finished:
        kill_at += 1
        assert kill_at < 80, "the run makes more writes than expected"
        cache_dir, out = tmp_path / f"cache{kill_at}", tmp_path / f"out{kill_at}"
        env = _env(cache_dir)
        done = _child(kill_at, out, True, env)
        stdout, stderr = done.communicate(timeout=300)
        if done.returncode == 0:  # fewer writes than kill_at: every write point was tried
            finished = json.loads(stdout.splitlines()[-1])["writes"] < kill_at
            continue
        assert done.returncode == 137, stderr
        monkeypatch.setenv("SUBFL_CACHE_DIR", str(cache_dir))
        again = run_experiment(make_config(**CONFIG), out, cache=True)
        assert _fingerprint(again) == clean, f"killed at write {kill_at}: the run finished with another result"
        elsewhere = run_experiment(make_config(**CONFIG), tmp_path / f"copy{kill_at}", cache=True)
        assert elsewhere.from_cache and _fingerprint(elsewhere) == clean, f"killed at write {kill_at}: bad cache"
    assert kill_at > 15  # checkpoints, the five result files, the summary's rename, the cache copy and its rename


@pytest.mark.slow
@pytest.mark.parametrize("shared_out", [False, True], ids=["cache", "same-out-dir"])
def test_two_identical_runs_started_together_compute_once(tmp_path, shared_out):
    env = _env(tmp_path / "cache")
    out = tmp_path / "out" if shared_out else None
    children = [_child(0, out, not shared_out, env) for _ in range(2)]
    reports = []
    deadline = time.monotonic() + 300
    for child in children:
        stdout, stderr = child.communicate(timeout=max(1.0, deadline - time.monotonic()))
        assert child.returncode == 0, stderr
        reports.append(json.loads(stdout.splitlines()[-1]))
    assert sorted(r["from_cache"] for r in reports) == [False, True]  # one computed it, the other read it back


def test_a_half_copied_cache_entry_of_an_earlier_version_is_computed_again(tmp_path, monkeypatch):
    """Earlier versions copied a run into the cache file by file, the summary second: killed after it, the entry
    had a summary but no ledger, and every later cached run of that config failed on the missing file."""
    from subfl.experiments.provenance import run_key
    from subfl.experiments.runner import run_cache_dir

    monkeypatch.setenv("SUBFL_CACHE_DIR", str(tmp_path / "cache"))
    config = make_config(**CONFIG)
    clean = run_experiment(config, tmp_path / "clean", cache=False)
    poisoned = run_cache_dir() / run_key(config)[:24]
    poisoned.mkdir(parents=True)
    for name in ("history.csv", "summary.json"):
        (poisoned / name).write_bytes((clean.directory / name).read_bytes())
    again = run_experiment(config, tmp_path / "again", cache=True)
    assert not again.from_cache and _fingerprint(again) == _fingerprint(clean)
    assert run_experiment(config, tmp_path / "third", cache=True).from_cache


@pytest.mark.slow
def test_the_book_store_survives_a_kill_at_any_write(tmp_path, monkeypatch):
    """The book's run store (``subfl_book.store.run_experiment`` with its weights kept): computed in a work folder,
    then a record and a state file written under temporary names and renamed. A kill at any write leaves either
    nothing or a complete entry; the next call returns the clean run's record and weights."""
    from subfl_book import store

    def stored(root: Path):
        monkeypatch.setenv("SUBFL_STORE_DIR", str(root / "store"))
        monkeypatch.setenv("SUBFL_WORK_DIR", str(root / "work"))
        monkeypatch.setenv("SUBFL_CACHE_DIR", str(root / "cache"))
        return store.run_experiment(make_config(**CONFIG), keep_state=True)

    clean = _fingerprint(stored(tmp_path / "clean"))
    kill_at, finished = 0, False
    while not finished:
        kill_at += 1
        assert kill_at < 80, "the run makes more writes than expected"
        root = tmp_path / f"k{kill_at}"
        env = _env(root / "cache", CRASH_API="store", SUBFL_STORE_DIR=str(root / "store"),
                   SUBFL_WORK_DIR=str(root / "work"))
        done = _child(kill_at, None, True, env)
        stdout, stderr = done.communicate(timeout=300)
        if done.returncode == 0:
            finished = json.loads(stdout.splitlines()[-1])["writes"] < kill_at
            continue
        assert done.returncode == 137, stderr
        assert _fingerprint(stored(root)) == clean, f"killed at write {kill_at}: the store returned another result"
    assert kill_at > 10
