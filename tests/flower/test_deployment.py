"""A deployment on localhost with TLS: a SuperLink and two SuperNodes as separate processes, ``flwr run``.

The test writes a certificate authority and a server certificate it signs (:func:`subfl.flower.deployment
.make_certificates`); the SuperLink serves TLS with it, the SuperNodes and ``flwr run`` trust only that CA.

* The PriSM golden case of ``tests/golden`` (the one ``test_simulation_equivalence.py`` runs on the simulation
  runtime): its history, server state and ledger equal the in-process engine's, so those of the simulation too.
* A SuperNode killed mid-run: the run stops at that round with :class:`~subfl.flower.server.NodeUnavailable` (once
  the SuperLink has missed the node's heartbeats, at most 2 × 30 s), keeps the checkpoint of its last finished round,
  and — the node restarted, the same app run again — resumes from it and ends with the uninterrupted run's history,
  state and ledger.

Every wait has a timeout; the processes are stopped (by their process group) whatever happens.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="Flower is not installed (pip install 'subfl[flower]'); the adapter needs it")
pytest.importorskip("cryptography", reason="the test's certificate authority needs the cryptography package")

import torch  # noqa: E402

from subfl.experiments import run_experiment  # noqa: E402
from subfl.fl.engine import CHECKPOINT_NAME  # noqa: E402
from subfl.flower.deployment import make_certificates, write_app, write_connection  # noqa: E402

from .helpers import case_config, digests, golden_mismatch  # noqa: E402

pytestmark = pytest.mark.slow

CASE = "prism"
BIN = Path(sys.executable).parent
START_TIMEOUT_S, RUN_TIMEOUT_S = 90, 480


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalDeployment:
    """A SuperLink, SuperNodes and ``flwr`` commands as processes in ``folder``, TLS from a CA written there."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
                    "FLWR_HOME": str(folder / "home"), "FLWR_TELEMETRY_ENABLED": "0", "OMP_NUM_THREADS": "1",
                    "PYTHONWARNINGS": "ignore"}
        self.certs = make_certificates(folder / "certs")
        self.port = _free_port()
        write_connection(folder / "home", "local-tls", f"127.0.0.1:{self.port}", self.certs["ca"])
        self.processes: dict[str, subprocess.Popen] = {}
        self.logs: list[Path] = []

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float, what: str, every_s: float = 0.2) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > deadline:
                tails = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in self.logs
                                  if p.exists())
                raise TimeoutError(f"{what}: not within {timeout_s} s\n{tails}")
            time.sleep(every_s)

    def _start(self, name: str, *args: str) -> Path:
        log = self.folder / f"{name}.log"
        self.logs.append(log)
        self.processes[name] = subprocess.Popen([str(BIN / args[0]), *args[1:]], cwd=self.folder, env=self.env,
                                                stdout=log.open("w"), stderr=subprocess.STDOUT,
                                                start_new_session=True)
        return log

    def start_link(self) -> None:
        log = self._start("superlink", "flower-superlink", "--ssl-ca-certfile", str(self.certs["ca"]),
                          "--ssl-certfile", str(self.certs["cert"]), "--ssl-keyfile", str(self.certs["key"]), "--host",
                          "127.0.0.1", "--port", str(self.port), "--disable-runtime-dependency-installation")
        self.wait_for(lambda: "Uvicorn running on https://" in log.read_text(errors="replace"), START_TIMEOUT_S,
                      "the SuperLink did not start")

    def start_nodes(self, partitions: list[int], of: int, tag: str = "") -> None:
        logs = [self._start(f"supernode{p}{tag}", "flower-supernode", "--superlink", f"127.0.0.1:{self.port}",
                            "--root-certificates", str(self.certs["ca"]), "--node-config",
                            f"partition-id={p} num-partitions={of}", "--port", str(_free_port()))
                for p in partitions]
        self.wait_for(lambda: all("SuperNode ID" in log.read_text(errors="replace") for log in logs),
                      START_TIMEOUT_S, "the SuperNodes did not connect")

    def kill(self, name: str) -> None:
        proc = self.processes[name]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=20)

    def flwr(self, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "flwr"), *args], cwd=self.folder, env=self.env, capture_output=True,
                              text=True, timeout=timeout_s)

    def run_app(self, app: Path) -> int:
        started = self.flwr("run", str(app), "local-tls", "--format", "json", timeout_s=START_TIMEOUT_S)
        assert started.returncode == 0, started.stdout + started.stderr
        return json.loads(started.stdout[started.stdout.index("{"):])["run-id"]

    def status(self, run_id: int) -> str:
        """The run's Flower status, e.g. ``running``, ``finished:completed``, ``finished:failed``."""
        listed = self.flwr("ls", "--run-id", str(run_id), "--format", "json")
        runs = json.loads(listed.stdout[listed.stdout.index("{"):])["runs"]
        return str(runs[0]["status"])

    def wait_finished(self, run_id: int) -> str:
        """Wait for the run to end (Flower's status ``finished:…``); its status."""
        found: list[str] = []

        def ended() -> bool:
            found[:] = [self.status(run_id)]
            return found[0].startswith("finished")

        # each `flwr ls` is a process of ~1.5 s CPU: polled every 5 s, it leaves the other test worker its core
        self.wait_for(ended, RUN_TIMEOUT_S, f"run {run_id} did not end", every_s=5.0)
        return found[0]

    def log(self, run_id: int) -> str:
        return self.flwr("log", str(run_id), "local-tls", "--show").stdout

    def stop(self) -> None:
        for proc in self.processes.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.processes.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=20)


@pytest.fixture
def deployment(tmp_path) -> Iterator[LocalDeployment]:
    started = LocalDeployment(tmp_path)
    try:
        started.start_link()
        started.start_nodes([0, 1], of=2)
        yield started
    finally:
        started.stop()


def _in_process(config, folder: Path) -> Path:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run_experiment(config, folder, cache=False, progress=False).directory
    finally:
        torch.set_num_threads(threads)


def test_prism_through_a_tls_deployment_is_the_in_process_run(deployment, tmp_path):
    config = case_config(CASE)
    out = tmp_path / "out"
    run_id = deployment.run_app(write_app(tmp_path / "app", config, out, min_nodes=2, torch_threads=1))
    assert deployment.wait_finished(run_id) == "finished:completed", deployment.log(run_id)[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["engine"] == "flower" and summary["flower"]["nodes"] == 2
    assert summary["torch_threads"] == 1
    deployed = digests(out)
    assert golden_mismatch(CASE, deployed) is None, golden_mismatch(CASE, deployed)
    assert deployed == digests(_in_process(config, tmp_path / "local"))  # history/ledger byte for byte, state digest


def test_a_supernode_killed_mid_run_stops_the_run_which_resumes_once_it_is_back(deployment, tmp_path):
    # each round starts a ClientApp process on each node (seconds), so the kill lands before round 2 ends; the
    # resumed run then trains two rounds from the checkpoint
    config = dataclasses.replace(case_config(CASE), rounds=3, eval_every=3)
    out = tmp_path / "out"
    app = write_app(tmp_path / "app", config, out, min_nodes=2, torch_threads=1)
    run_id = deployment.run_app(app)
    checkpoint = out / CHECKPOINT_NAME
    deployment.wait_for(checkpoint.exists, RUN_TIMEOUT_S, "the run did not finish its first round")
    deployment.kill("supernode1")
    killed_at = time.monotonic()
    assert deployment.wait_finished(run_id) == "finished:failed"
    assert time.monotonic() - killed_at < 2 * 30 + 30  # Flower's heartbeat patience (2 × 30 s), and some slack
    assert not (out / "summary.json").exists()
    stopped_at = torch.load(checkpoint, map_location="cpu", weights_only=False)["round"]
    assert 1 <= stopped_at < config.rounds
    log = deployment.log(run_id)
    assert "NodeUnavailable" in log and "stopped answering" in log and "restart the node" in log, log[-3000:]

    deployment.start_nodes([1], of=2, tag="-restarted")
    resumed = deployment.run_app(app)
    assert deployment.wait_finished(resumed) == "finished:completed", deployment.log(resumed)[-3000:]
    assert not checkpoint.exists()
    assert digests(out) == digests(_in_process(config, tmp_path / "local"))  # as if never interrupted
