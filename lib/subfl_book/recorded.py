"""Runs recorded on another machine and read back for the book.

Some rows need hardware the book's build does not have — ResNet-18 at full width needs minutes per round on two
CPU cores. A script in ``scripts/`` (e.g. ``scripts/spectral_resnet18.py``) runs them there with
:func:`~subfl.experiments.run_experiment` and writes one JSON file: the machine, the script's arguments, and per
run its configuration, history, per-stage wall time and upload bytes. A run the script's time limit stopped is
recorded with the rounds it completed (``complete`` false). This module reads such a file into tables; the book
shows these numbers as recorded, naming the machine, and does not re-run them.

>>> recorded = load_recorded(recorded_path("spectral_resnet18_h200.json"))  # doctest: +SKIP
>>> recorded.table()                                                        # doctest: +SKIP
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from .analysis import with_server_shares
from .store import checkout_root

RESULTS_DIR = "results"

RECORDED_LOG_ENV = "SUBFL_PAGE_RECORDED"
"""Environment variable naming the JSON-lines file where :func:`load_recorded` logs each recorded file a page reads
(set by :func:`subfl_book.pipeline.execute_notebook`; its run card names the files and where they were computed)."""
"""Folder of the checkout holding recorded result files."""

_RUN_KEYS = ("method", "lr", "config", "complete", "rounds", "diverged_at", "upload_bytes", "seconds_per_round",
             "history")
_SERVER_STAGES = ("configure", "aggregate")


@dataclass(frozen=True)
class RecordedRun:
    """One run of a recorded file: its configuration (a dict of :class:`ExperimentConfig` fields), the rounds it
    completed, and its history as a frame with columns ``round, metric, value, group``."""

    method: str
    lr: float
    config: dict[str, Any]
    complete: bool
    rounds: int
    diverged_at: int | None
    upload_bytes: int | None
    seconds_per_round: dict[str, float]
    history: pd.DataFrame
    exit_code: int | None = None
    error: str | None = None

    @property
    def status(self) -> str:
        """``complete``, ``diverged in round k``, ``failed`` (the process exited with an error) or ``stopped after
        round k of n`` (the script's time limit)."""
        if self.diverged_at is not None:
            return f"diverged in round {self.diverged_at}"
        if self.exit_code not in (None, 0) and not self.complete:
            return "failed"
        if self.complete:
            return "complete"
        return f"stopped after round {self.rounds} of {self.config['rounds']}"

    def curve(self, metric: str = "accuracy", group: str = "global") -> pd.Series:
        """``metric`` of ``group`` by round (the rounds it was recorded in)."""
        h = self.history
        rows = h[(h.metric == metric) & (h.group == group)]
        return pd.Series(rows.value.to_numpy(), index=rows["round"].to_numpy(), name=self.method)

    def value_at(self, round: int, metric: str = "accuracy", group: str = "global") -> float:
        """``metric`` at ``round`` (NaN if it was not recorded then)."""
        curve = self.curve(metric, group)
        return float(curve.loc[round]) if round in curve.index else float("nan")


def _last_shared_round(runs: Sequence[RecordedRun], metric: str, group: str) -> int | None:
    """The last round at which every one of ``runs`` recorded ``metric`` of ``group`` (None if there is none)."""
    rounds = [set(r.curve(metric, group).index) for r in runs]
    shared = set.intersection(*rounds) if rounds else set()
    return int(max(shared)) if shared else None


@dataclass(frozen=True)
class RecordedRuns:
    """A recorded file: ``meta`` (machine, script arguments, data note, date) and its runs in file order."""

    meta: dict[str, Any]
    runs: list[RecordedRun] = field(default_factory=list)

    def run(self, method: str) -> RecordedRun:
        for r in self.runs:
            if r.method == method:
                return r
        raise KeyError(f"method={method!r} is not in this file; recorded: {', '.join(r.method for r in self.runs)}")

    @property
    def seeds(self) -> list[int]:
        """The distinct seeds of the runs' configurations (0 where a configuration names none)."""
        return sorted({int(r.config.get("seed", 0)) for r in self.runs})

    def common_round(self, metric: str = "accuracy", group: str = "global") -> int | None:
        """The last round at which every run recorded ``metric`` (None if there is none): the round at which runs
        that stopped at different rounds can be compared."""
        return _last_shared_round(self.runs, metric, group)

    def table(self, metric: str = "accuracy", group: str = "global") -> pd.DataFrame:
        """One row per run: status, rounds run, ``metric`` at :meth:`common_round`, at the last round it was
        recorded and its best, and the mean upload of one client in one round (MB = 10⁶ bytes)."""
        common = self.common_round(metric, group)
        rows = []
        for r in self.runs:
            curve = r.curve(metric, group)
            client_rounds = r.rounds * int(r.config["clients_per_round"])
            rows.append({
                "method": r.method, "lr": r.lr, "status": r.status, "rounds run": r.rounds,
                f"{metric} at round {common}": r.value_at(common, metric, group) if common else np.nan,
                f"last {metric}": float(curve.iloc[-1]) if len(curve) else np.nan,
                "last recorded round": int(curve.index[-1]) if len(curve) else np.nan,
                f"best {metric}": float(curve.max()) if len(curve) else np.nan,
                "upload (MB per client-round)": (r.upload_bytes / client_rounds / 1e6
                                                 if r.upload_bytes is not None and client_rounds else np.nan),
            })
        return pd.DataFrame(rows)

    def curves(self, metric: str = "accuracy", group: str = "global") -> pd.DataFrame:
        """Long frame ``method, round, value`` of every run's ``metric``."""
        frames = [pd.DataFrame({"method": r.method, "round": c.index, "value": c.to_numpy()})
                  for r in self.runs if len(c := r.curve(metric, group))]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["method", "round", "value"])

    def timings(self) -> pd.DataFrame:
        """Seconds per round of every engine stage, per run, with the server's share (configure + aggregate) of
        the clients' local training."""
        table = pd.DataFrame({r.method: r.seconds_per_round for r in self.runs}).T.fillna(0.0)
        if "local_train" in table:
            server = sum(table[s] for s in _SERVER_STAGES if s in table)
            table["server / local training"] = server / table["local_train"].where(table["local_train"] > 0)
        return table.rename_axis("method")


def seed_table(recorded: Sequence[RecordedRuns], metric: str = "accuracy", group: str = "global") -> pd.DataFrame:
    """The same rows recorded with different seeds (one file per seed, e.g. by one script call each), compared at
    one round: the last round at which every run of every file recorded ``metric``.

    One row per method (in the first file's order): ``round``, one column ``seed s`` per seed (from each run's
    configuration), ``mean``, ``sd`` (sample standard deviation; NaN with one seed) and ``seeds``. ValueError when
    the files do not hold the same methods, when a method has two runs of one seed, or when no round is shared.
    """
    if not recorded:
        raise ValueError("recorded must hold at least one RecordedRuns (one file per seed)")
    methods = [r.method for r in recorded[0].runs]
    for i, rec in enumerate(recorded[1:], start=1):
        if sorted(r.method for r in rec.runs) != sorted(methods):
            raise ValueError(f"recorded[{i}] holds methods {sorted(r.method for r in rec.runs)}, recorded[0] "
                             f"holds {sorted(methods)}: every file must hold the same rows")
    common = _last_shared_round([r for rec in recorded for r in rec.runs], metric, group)
    if common is None:
        raise ValueError(f"no round at which every run recorded {metric!r} of group {group!r}")
    rows = []
    for method in methods:
        values: dict[int, float] = {}
        for rec in recorded:
            for r in rec.runs:
                if r.method != method:
                    continue
                seed = int(r.config.get("seed", 0))
                if seed in values:
                    raise ValueError(f"method {method!r} has two runs of seed {seed}: one run per seed is accepted")
                values[seed] = r.value_at(common, metric, group)
        vals = np.array([values[s] for s in sorted(values)])
        rows.append({"method": method, "round": common, **{f"seed {s}": values[s] for s in sorted(values)},
                     "mean": float(vals.mean()), "sd": float(vals.std(ddof=1)) if len(vals) > 1 else np.nan,
                     "seeds": len(vals)})
    return pd.DataFrame(rows)


def load_stage_benchmark(path: str | Path) -> pd.DataFrame:
    """A file written by ``benchmarks/bench_spectral_server.py --out``: one row per strategy and refresh solver
    with the machine (``accelerator``, ``device``, ``cpu_threads``), the strategy's ``svd_solver`` (None for
    FedAvg; ``"exact"`` in files written before the benchmark recorded it, when it timed the exact SVD only),
    the mean seconds per round of every engine stage, one client's
    share of local training (``local_per_client``), and the server's share (configure + aggregate) of the round's
    summed local training (``server_share``) and of one client's (``server_share_per_client``), as
    :func:`subfl_book.analysis.stage_seconds` gives them for runs of this machine."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no benchmark results at {str(path)!r}")
    data = json.loads(path.read_text(encoding="utf-8"))
    missing = [k for k in ("args", "accelerator", "cpu_threads", "results") if k not in data]
    if missing:
        raise ValueError(f"{path.name}: a stage benchmark file needs {', '.join(missing)}")
    _log_read(path, {"accelerator": data["accelerator"], "torch": data.get("torch"), "date": data.get("date")})
    rows = [{"strategy": r["strategy"],
             "svd_solver": r.get("svd_solver", None if r["strategy"] == "fedavg" else "exact"),
             "accelerator": data["accelerator"], "device": data["args"]["device"],
             "cpu_threads": int(data["cpu_threads"]), "clients_per_round": int(data["args"]["clients"]),
             **{stage: float(r["seconds_per_round"].get(stage, 0.0))
                for stage in ("configure", "aggregate", "local_train", "evaluate")}} for r in data["results"]]
    return with_server_shares(pd.DataFrame(rows)).drop(columns="clients_per_round")


def recorded_path(name: str) -> Path:
    """``results/<name>`` of the checkout (FileNotFoundError when the package runs outside a checkout)."""
    root = checkout_root()
    if root is None:
        raise FileNotFoundError(f"recorded results live in the repository's {RESULTS_DIR}/ folder; this package "
                                f"is not running from a checkout, so {name!r} cannot be found")
    return root / RESULTS_DIR / name


def load_recorded(path: str | Path) -> RecordedRuns:
    """Read a recorded file (ValueError naming the missing key when a run lacks one)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no recorded results at {str(path)!r}")
    data = json.loads(path.read_text(encoding="utf-8"))
    if "runs" not in data:
        raise ValueError(f"{path.name}: a recorded file needs a 'runs' list")
    runs = []
    for i, r in enumerate(data["runs"]):
        missing = [k for k in _RUN_KEYS if k not in r]
        if missing:
            raise ValueError(f"{path.name}: run {i} lacks {', '.join(missing)}")
        history = pd.DataFrame([tuple(row) for row in r["history"]], columns=["round", "metric", "value", "group"])
        runs.append(RecordedRun(method=r["method"], lr=float(r["lr"]), config=r["config"], complete=bool(r["complete"]),
                                rounds=int(r["rounds"]), diverged_at=r["diverged_at"], upload_bytes=r["upload_bytes"],
                                seconds_per_round=dict(r["seconds_per_round"]), history=history,
                                exit_code=r.get("exit_code"), error=r.get("error")))
    meta = {k: v for k, v in data.items() if k != "runs"}
    _log_read(path, meta)
    return RecordedRuns(meta, runs)


def _log_read(path: Path, meta: dict[str, Any]) -> None:
    """Append the file's name, sha256, accelerator (or device), torch and date to the page's log, if one is set."""
    import hashlib
    import os

    log = os.environ.get(RECORDED_LOG_ENV)
    if not log:
        return
    entry = {"file": path.name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
             "hardware": meta.get("accelerator") or meta.get("device"), "torch": meta.get("torch"),
             "date": meta.get("date") or meta.get("recorded_at")}
    with open(log, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")


__all__ = ["RESULTS_DIR", "RecordedRun", "RecordedRuns", "load_recorded", "load_stage_benchmark", "recorded_path",
           "seed_table"]


def stage_benchmark_config(name: str) -> "ExperimentConfig":
    """The configuration a recorded stage benchmark (``scripts/bench_spectral_server.py``'s ``measure()``, PriSM
    Table 4's counterpart) ran, rebuilt from the file's arguments — so a scorecard can name how it departs from the
    paper's setting."""
    from subfl.experiments import make_config
    args = json.loads(recorded_path(name).read_text(encoding="utf-8"))["args"]
    return make_config("prism", "cifar10", args.get("model", "resnet18"), scale="cpu", width=args["width"],
                       rounds=args["rounds"], num_clients=args["clients"], clients_per_round=args["clients"],
                       local_epochs=args["local_epochs"], heterogeneity="0.2", max_train_samples=args["samples"],
                       max_test_samples=200, eval_every=args["rounds"], lr=0.01)
