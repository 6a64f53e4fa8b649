"""Runs on Flower's simulation runtime (:func:`flwr.simulation.run_simulation`, Ray backend).

:func:`simulate` runs one or more experiments in one simulation: the ServerApp of :mod:`subfl.flower.server` in a
thread of this process, ``num_supernodes`` virtual SuperNodes running the ClientApp of :mod:`subfl.flower.client` in
Ray workers (one CPU each; library client ``c`` trains on node ``c % num_supernodes``).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

import torch


def simulate(runs: list[tuple[Any, str | Path]], *, num_supernodes: int = 2, data_root: str | Path | None = None,
             torch_threads: int | None = None, num_cpus: int | None = None, verbose: bool = False) -> list[Path]:
    """Run every ``(config, out_dir)`` of ``runs`` through Flower's simulation runtime, one after another; each
    ``out_dir`` gets the files of ``subfl run``. ``torch_threads``: the server's and every client's torch thread count
    (default: this process's). Returns the output folders."""
    from flwr.simulation import run_simulation

    from .client import client_app
    from .server import make_server_app

    if num_supernodes < 1:
        raise ValueError(f"num_supernodes must be >= 1, got {num_supernodes}")
    threads = int(torch_threads or torch.get_num_threads())
    specs = [{"experiment": config.to_dict(), "out_dir": str(out), "torch_threads": threads,
              "data_root": None if data_root is None else str(data_root), "min_nodes": num_supernodes}
             for config, out in runs]
    errors: list[BaseException] = []
    cpus = int(num_cpus or max(1, min(num_supernodes, os.cpu_count() or 1)))
    backend_config = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                      "init_args": {"num_cpus": cpus, "num_gpus": 0, "include_dashboard": False,
                                    "logging_level": logging.INFO if verbose else logging.ERROR,
                                    "log_to_driver": verbose}}
    saved = torch.get_num_threads()
    try:
        run_simulation(make_server_app(specs, errors), client_app, num_supernodes=num_supernodes,
                       backend_config=backend_config, verbose_logging=verbose)
    finally:
        torch.set_num_threads(saved)
    if errors:
        raise errors[0]
    for _, out in runs:
        if not (Path(out) / "summary.json").exists():
            raise RuntimeError(f"the Flower simulation ended without finishing the run in {out}")
    return [Path(out) for _, out in runs]


def run_experiment_flower(config, out_dir: str | Path, *, data_root: str | Path | None = None,
                          num_supernodes: int | None = None, progress: bool | None = False):
    """``subfl run --engine flower``: run ``config`` through Flower's simulation runtime into ``out_dir`` (the files of
    :func:`~subfl.experiments.run_experiment`); a finished identical run there is read back, a finished run of another
    configuration is refused (``ValueError``), an interrupted one resumes from its checkpoint. Returns a
    :class:`~subfl.experiments.runner.RunResult`. ``num_supernodes``: default ``min(clients_per_round, CPUs)``."""
    from ..experiments.provenance import run_key
    from ..experiments.runner import RunResult, _finished_here, check_device_available, check_out_dir

    check_device_available(config.device)
    target = check_out_dir(out_dir)
    if _finished_here(config, target, run_key(config)):
        return RunResult(config, target, from_cache=True)
    nodes = num_supernodes or max(1, min(config.clients_per_round, os.cpu_count() or 1))
    simulate([(config, target)], num_supernodes=nodes, data_root=data_root)
    return RunResult(config, target)
