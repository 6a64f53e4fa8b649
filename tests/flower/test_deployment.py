"""A deployment on localhost with TLS: a SuperLink and two SuperNodes as separate processes, ``flwr run``.

The test writes a certificate authority and a server certificate it signs (:func:`subfl.flower.deployment
.make_certificates`); the SuperLink serves TLS with it, the SuperNodes and ``flwr run`` trust only that CA. The run is
the PriSM golden case of ``tests/golden`` (the one ``test_simulation_equivalence.py`` runs on the simulation
runtime); its history, server state and ledger equal the in-process engine's, so those of the simulation too. Every
wait has a timeout; the processes are stopped (by their process group) whatever happens.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="Flower is not installed (pip install 'subfl[flower]'); the adapter needs it")
pytest.importorskip("cryptography", reason="the test's certificate authority needs the cryptography package")

from subfl.experiments import run_experiment  # noqa: E402
from subfl.flower.deployment import make_certificates, write_app, write_connection  # noqa: E402

from .helpers import case_config, digests, recorded  # noqa: E402

pytestmark = pytest.mark.slow

CASE = "prism"
BIN = Path(sys.executable).parent
START_TIMEOUT_S, RUN_TIMEOUT_S = 90, 480


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(predicate, timeout_s: float, what: str, logs: list[Path]) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in logs if p.exists())
            raise TimeoutError(f"{what}: not within {timeout_s} s\n{tails}")
        time.sleep(0.5)


def test_prism_through_a_tls_deployment_is_the_in_process_run(tmp_path):
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "FLWR_HOME": str(tmp_path / "home"),
           "FLWR_TELEMETRY_ENABLED": "0", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    certs = make_certificates(tmp_path / "certs")
    link_port = _free_port()
    write_connection(tmp_path / "home", "local-tls", f"127.0.0.1:{link_port}", certs["ca"])
    config = case_config(CASE)
    out = tmp_path / "out"
    app = write_app(tmp_path / "app", config, out, min_nodes=2, torch_threads=1)
    processes: list[subprocess.Popen] = []
    logs: list[Path] = []

    def start(name: str, *args: str) -> Path:
        log = tmp_path / f"{name}.log"
        logs.append(log)
        processes.append(subprocess.Popen([str(BIN / args[0]), *args[1:]], cwd=tmp_path, env=env,
                                          stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True))
        return log

    try:
        link = start("superlink", "flower-superlink", "--ssl-ca-certfile", str(certs["ca"]), "--ssl-certfile",
                     str(certs["cert"]), "--ssl-keyfile", str(certs["key"]), "--host", "127.0.0.1", "--port",
                     str(link_port), "--disable-runtime-dependency-installation")
        _wait_for(lambda: "Uvicorn running on https://" in link.read_text(errors="replace"), START_TIMEOUT_S,
                  "the SuperLink did not start", logs)
        nodes = [start(f"supernode{i}", "flower-supernode", "--superlink", f"127.0.0.1:{link_port}",
                       "--root-certificates", str(certs["ca"]), "--node-config", f"partition-id={i} num-partitions=2",
                       "--port", str(_free_port())) for i in range(2)]
        _wait_for(lambda: all("SuperNode ID" in n.read_text(errors="replace") for n in nodes), START_TIMEOUT_S,
                  "the SuperNodes did not connect", logs)
        started = subprocess.run([str(BIN / "flwr"), "run", str(app), "local-tls", "--format", "json"], cwd=tmp_path,
                                 env=env, capture_output=True, text=True, timeout=START_TIMEOUT_S)
        assert started.returncode == 0, started.stdout + started.stderr
        run_id = json.loads(started.stdout[started.stdout.index("{"):])["run-id"]

        def finished() -> bool:
            if (out / "summary.json").exists():
                return True
            listed = subprocess.run([str(BIN / "flwr"), "ls", "--run-id", run_id, "--format", "json"], cwd=tmp_path,
                                    env=env, capture_output=True, text=True, timeout=60)
            if '"finished:' in listed.stdout and (out / "summary.json").exists() is False:
                raise AssertionError(f"the run ended without its results: {listed.stdout[-2000:]}")
            return False

        _wait_for(finished, RUN_TIMEOUT_S, "the Flower run did not finish", logs)
    finally:
        for proc in processes:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in processes:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=20)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["engine"] == "flower" and summary["flower"]["nodes"] == 2
    assert summary["torch_threads"] == 1
    golden = recorded()[CASE]
    deployed = digests(out)
    assert (deployed["history"], deployed["state"]) == (golden["history"], golden["state"])
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        local = run_experiment(config, tmp_path / "local", cache=False, progress=False).directory
    finally:
        torch.set_num_threads(threads)
    assert deployed == digests(local)  # history.csv and ledger.csv byte for byte, the state's digest
