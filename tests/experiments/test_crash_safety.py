"""The run folder and the run cache survive a kill at every write point, and identical runs started together are
computed once (issue 40, "crash-safe, concurrent-safe storage").

A killed process is simulated for real: a child process counts every write the run makes (a file opened for
writing, ``torch.save``, ``os.replace`` / ``os.rename``) and, at the k-th, leaves that file half-written or the
rename undone and ends with ``os._exit`` (no ``finally`` runs, as with ``kill -9``). After each kill the same call,
made again, must return the clean run's results, and a third call must read them back without computing.

The children are forked from one helper process that has imported torch and the library once (a "zygote"), so
that trying every write point costs a fork each, not a Python start-up and a torch import each. The helper itself
runs no tensor operation, so forking it is safe; the write-counting patches are installed in the child only.
"""
from __future__ import annotations

import json
import os
import select
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
CHILD_TIMEOUT_S = 300

ZYGOTE = textwrap.dedent('''
    import builtins, io, json, os, sys, time, traceback
    import torch
    from subfl.experiments import make_config, run_experiment
    from subfl_book.store import run_experiment as stored_run
    # Modules the first run imports lazily (the optimiser imports torch._dynamo; the digits come from scikit-learn):
    # imported here once, so that each forked child does not spend seconds importing them again.
    import torch._dynamo, sklearn.datasets, sklearn.model_selection

    def run(task):
        kill_at, count = task["kill_at"], [0]

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
        config = make_config(**task["config"])
        if task["api"] == "store":  # the book's run store (subfl_book.store), weights kept
            stored_run(config, keep_state=True)
            return {"writes": count[0], "from_cache": False}
        result = run_experiment(config, task["out_dir"], cache=task["cache"])
        return {"writes": count[0], "from_cache": result.from_cache}

    for line in sys.stdin:
        task = json.loads(line)
        pid = os.fork()
        if pid == 0:  # the child: its output goes to its log, its end is os._exit (a kill or a clean finish)
            log = os.open(task["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.environ.update(task["env"])
            try:
                report = run(task)
            except BaseException:
                traceback.print_exc()
                sys.stderr.flush()
                os._exit(1)
            print(json.dumps(report))
            sys.stdout.flush()
            os._exit(0)
        deadline = time.monotonic() + task["timeout_s"]
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                _, status = os.waitpid(pid, 0)
                break
            time.sleep(0.01)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)
''')


class Zygote:
    """A helper process that forks one child per task (see the module docstring); ``close`` ends it."""

    def __init__(self, folder: Path):
        self.folder, self.tasks = folder, 0
        folder.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
        self.process = subprocess.Popen([sys.executable, "-c", ZYGOTE], env=env, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def start(self, kill_at: int, env: dict[str, str], out_dir: Path | None = None, cache: bool = True,
              api: str = "experiment") -> Path:
        """Fork a child that runs ``CONFIG`` and is killed at its ``kill_at``-th write (0: never); returns its log."""
        self.tasks += 1
        log = self.folder / f"child{self.tasks}.log"
        task = dict(kill_at=kill_at, env=env, out_dir=None if out_dir is None else str(out_dir), cache=cache,
                    api=api, config=CONFIG, log=str(log), timeout_s=CHILD_TIMEOUT_S)
        self.process.stdin.write(json.dumps(task) + "\n")
        self.process.stdin.flush()
        return log

    def wait(self, log: Path, timeout_s: float = CHILD_TIMEOUT_S + 60) -> tuple[int, str]:
        """The child's exit code and its output; fails the test if no answer comes within ``timeout_s``."""
        ready, _, _ = select.select([self.process.stdout], [], [], timeout_s)
        line = self.process.stdout.readline() if ready else ""
        if not line:
            self.close()
            pytest.fail(f"the helper process gave no answer within {timeout_s} s: {self.process.stderr.read()}")
        return json.loads(line)["returncode"], log.read_text() if log.exists() else ""

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)


@pytest.fixture
def zygote(tmp_path):
    helper = Zygote(tmp_path / "children")
    yield helper
    helper.close()


def _env(cache_dir: Path, **extra: str) -> dict[str, str]:
    return {"SUBFL_CACHE_DIR": str(cache_dir), **extra}


def _fingerprint(result) -> tuple:
    summary = {k: v for k, v in result.summary.items() if k not in ("wall_time_s", "resumed_from_round")}
    return (history_digest(result.history.itertuples(index=False)), result.ledger.to_csv(index=False),
            json.dumps(summary, sort_keys=True, default=str), state_digest(result.state()))


def _writes(output: str) -> int:
    return json.loads(output.splitlines()[-1])["writes"]


@pytest.mark.slow
def test_a_kill_at_any_write_leaves_a_run_that_finishes_with_the_clean_result(tmp_path, monkeypatch, zygote):
    clean = _fingerprint(run_experiment(make_config(**CONFIG), tmp_path / "clean", cache=False))
    kill_at, finished = 0, False
    while not finished:
        kill_at += 1
        assert kill_at < 80, "the run makes more writes than expected"
        cache_dir, out = tmp_path / f"cache{kill_at}", tmp_path / f"out{kill_at}"
        returncode, output = zygote.wait(zygote.start(kill_at, _env(cache_dir), out, cache=True))
        if returncode == 0:  # fewer writes than kill_at: every write point was tried
            finished = _writes(output) < kill_at
            continue
        assert returncode == 137, output
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
    helpers = [Zygote(tmp_path / f"children{i}") for i in range(2)]
    try:
        logs = [helper.start(0, env, out, cache=not shared_out) for helper in helpers]  # both start together
        reports = []
        for helper, log in zip(helpers, logs):
            returncode, output = helper.wait(log)
            assert returncode == 0, output
            reports.append(json.loads(output.splitlines()[-1]))
    finally:
        for helper in helpers:
            helper.close()
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
def test_the_book_store_survives_a_kill_at_any_write(tmp_path, monkeypatch, zygote):
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
        env = _env(root / "cache", SUBFL_STORE_DIR=str(root / "store"), SUBFL_WORK_DIR=str(root / "work"))
        returncode, output = zygote.wait(zygote.start(kill_at, env, api="store"))
        if returncode == 0:
            finished = _writes(output) < kill_at
            continue
        assert returncode == 137, output
        assert _fingerprint(stored(root)) == clean, f"killed at write {kill_at}: the store returned another result"
    assert kill_at > 10
