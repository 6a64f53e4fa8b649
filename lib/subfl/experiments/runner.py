"""Run an :class:`~subfl.experiments.config.ExperimentConfig`: data, partition, model, method, engine.

Used by ``subfl run`` and by every notebook. Results are written as ``history.csv`` (tidy rows),
``summary.json``, ``ledger.csv`` and ``timings.csv``; with ``cache=True`` a run whose key
(:func:`~subfl.experiments.provenance.run_key`: canonical config, versions, environment class) was computed before
on this machine is read back instead of recomputed.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

import subfl

from ..artifacts import artifact_dir
from ..data import load_dataset, local_test_split, make_partition
from ..data.base import ArrayData, FederatedDataset
from ..fl.engine import CHECKPOINT_NAME, EngineSettings, dump_json, run_simulation, write_timings
from ..fl.history import read_history
from ..fl.rng import numpy_rng, seed_sequence
from ..methods import make_method
from ..fl.method import ServerContext
from ..models import build_model, model_spec
from .config import ExperimentConfig
from ..files import copy_atomically, write_atomically
from ..locking import exclusive, lock_file_for
from .provenance import canonical_config, environment_class, run_key, run_versions

OUTPUT_FILES = ("history.csv", "summary.json", "ledger.csv", "timings.csv", "state.pt")


class ModelFactory:
    """Builds the experiment's architecture; weights are initialised from a generator seeded by (seed, "init").

    Called with no argument it gives the configured model; methods that need other widths pass ``width``.
    Initialisation runs inside :func:`torch.random.fork_rng`, so it neither reads nor changes global state.
    """

    def __init__(self, config: ExperimentConfig, dataset: FederatedDataset) -> None:
        self.name = config.model
        self.kwargs = dict(num_classes=dataset.num_classes, input_shape=dataset.input_shape, norm=config.norm,
                           **dict(config.model_options))
        if dataset.vocab_size is not None and "vocab_size" in model_spec(config.model).options:
            self.kwargs.setdefault("vocab_size", dataset.vocab_size)
        self.width = config.width
        self.seed = config.seed

    def __call__(self, width: float | None = None, **overrides: Any) -> torch.nn.Module:
        kwargs = {**self.kwargs, **overrides}
        init_seed = int(seed_sequence(self.seed, "init").generate_state(1)[0])
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(init_seed)
            return build_model(self.name, width=self.width if width is None else width, **kwargs)


def _subset(data: ArrayData, n: int | None, rng: np.random.Generator) -> ArrayData:
    if n is None or n >= len(data):
        return data
    return data.subset(np.sort(rng.permutation(len(data))[:n]))


def prepare_data(config: ExperimentConfig, data_root: str | Path | None = None, *, verify: bool = True,
                 ) -> tuple[FederatedDataset, ArrayData, list[np.ndarray]]:
    """Load the dataset, apply the scale's sample caps and partition the training set into clients.

    ``verify``: check the data files against the manifest's sha256 (``False`` for a copy whose bytes differ but whose
    arrays do not, e.g. files re-packed to travel to another machine; the run's numbers do not depend on it).

    The test subset is drawn with a seed-independent generator so that every seed of an experiment is
    scored on the same test samples. With ``local_test_fraction > 0`` the partition's index arrays still hold
    every sample of a client; :func:`client_splits` separates the local test sets.
    """
    dataset = load_dataset(config.dataset, data_root, verify=verify, **dict(config.dataset_options))
    train = _subset(dataset.train, config.max_train_samples, numpy_rng(config.seed, "train-subset"))
    test = _subset(dataset.test, config.max_test_samples, numpy_rng(0, "test-subset"))
    dataset = FederatedDataset(**{**dataset.__dict__, "train": train})
    # dirichlet_groups: the groups are the clients' keep-ratio levels, assigned as the engine assigns them
    client_groups = config.heterogeneity_setting.static_levels(config.num_clients, config.seed) \
        if config.partition == "dirichlet_groups" else None
    parts = make_partition(config.partition, train.labels, config.num_clients, numpy_rng(config.seed, "partition"),
                           alpha=config.alpha, k=config.classes_per_client, groups=train.groups,
                           client_groups=client_groups)
    return dataset, test, parts


def client_splits(config: ExperimentConfig, parts: list[np.ndarray],
                  ) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
    """``(train_parts, local_test_parts)``: each client's ``local_test_fraction`` held out as its local test set
    (``None`` when the fraction is 0), drawn from a generator of (seed, "local-test")."""
    if not config.local_test_fraction:
        return parts, None
    return local_test_split(parts, config.local_test_fraction, numpy_rng(config.seed, "local-test"))


def train_eval_subset(config: ExperimentConfig, train: ArrayData, train_parts: Sequence[np.ndarray]) -> ArrayData | None:
    """The ``train_eval_samples`` training samples the global model is scored on at every evaluation (the training
    objective of, e.g., the spectral paper's Fig. 2), drawn once without replacement from the samples the clients
    train on (local test sets excluded) by a generator of (seed, "train-eval"); ``None`` when the field is unset.
    Asking for more samples than the clients hold raises ``ValueError``."""
    if config.train_eval_samples is None:
        return None
    held = np.sort(np.concatenate([np.asarray(part, dtype=np.int64) for part in train_parts]))
    if config.train_eval_samples > len(held):
        raise ValueError(f"train_eval_samples={config.train_eval_samples} is more than the {len(held)} training "
                         f"samples the clients hold; accepted: an int in 1..{len(held)} or None")
    chosen = numpy_rng(config.seed, "train-eval").choice(held, size=config.train_eval_samples, replace=False)
    return train.subset(np.sort(chosen))


@dataclass
class RunResult:
    """A finished run: its config, where its files are, and convenient views of them."""

    config: ExperimentConfig
    directory: Path
    from_cache: bool = False

    @cached_property
    def history(self) -> pd.DataFrame:
        return read_history(self.directory / "history.csv")

    @cached_property
    def summary(self) -> dict[str, Any]:
        return json.loads((self.directory / "summary.json").read_text())

    @cached_property
    def ledger(self) -> pd.DataFrame:
        return pd.read_csv(self.directory / "ledger.csv", keep_default_na=False)

    @cached_property
    def timings(self) -> pd.DataFrame:
        return pd.read_csv(self.directory / "timings.csv")

    def state(self) -> dict[str, Any]:
        """The method's final server state (e.g. ``state()["weights"]`` for FedAvg), as saved by the run."""
        return torch.load(self.directory / "state.pt", map_location="cpu", weights_only=False)

    def has_state(self) -> bool:
        """Whether :meth:`state` can load the final server state (without loading it)."""
        return (self.directory / "state.pt").exists()

    def curve(self, metric: str = "accuracy", group: str = "global") -> pd.DataFrame:
        """(round, value) rows of one metric for one group."""
        h = self.history
        return h[(h.metric == metric) & (h.group == group)][["round", "value"]].reset_index(drop=True)

    @property
    def diverged(self) -> bool:
        return bool((self.history.metric == "diverged").any())

    def final(self, metric: str = "accuracy", group: str = "global") -> float:
        """The metric at the end of the run (NaN if the run diverged or never recorded it)."""
        c = self.curve(metric, group)
        return float(c.value.iloc[-1]) if len(c) and not self.diverged else float("nan")

    def first_rounds(self, rounds: int) -> RunPrefix:
        """The run's first ``rounds`` rounds, as the run of ``config.replace(rounds=rounds)`` would have recorded
        them: its history, ledger and timings up to that round and a summary read from them.

        Every random draw of a run comes from (seed, round, client), so with a learning rate that does not depend
        on the run's length (``lr_schedule="constant"``) a shorter run repeats a longer one's first rounds bit for
        bit on one machine (``tests/experiments/test_runner.py``); a page can then read the shorter run from the
        longer one instead of computing both. Refused (``ValueError``) for any other schedule, and when the run
        neither evaluated at ``rounds`` nor diverged by then (the shorter run would have evaluated there). The
        prefix has no final weights (:meth:`RunPrefix.state` raises)."""
        if isinstance(rounds, bool) or not isinstance(rounds, (int, np.integer)) or not 1 <= rounds <= self.config.rounds:
            raise ValueError(f"rounds={rounds!r} is not valid; accepted: an int in 1..{self.config.rounds} (the run's "
                             f"rounds)")
        if self.config.lr_schedule != "constant":
            raise ValueError(f"the run's lr_schedule is {self.config.lr_schedule!r}: its first {rounds} rounds are not "
                             f"a shorter run's; accepted: runs with lr_schedule='constant'")
        diverged_at = self.summary.get("diverged_at_round")
        evaluated = set(self.curve()["round"]) | set(self.curve("loss")["round"])
        if int(rounds) not in evaluated and not (diverged_at is not None and diverged_at <= rounds):
            raise ValueError(f"rounds={rounds} is not a round the run evaluated (eval_every={self.config.eval_every}); "
                             f"accepted: a multiple of eval_every, or the run's last round")
        return RunPrefix(self, int(rounds))


class RunPrefix(RunResult):
    """The first rounds of a longer run (:meth:`RunResult.first_rounds`): what the shorter run would have recorded."""

    def __init__(self, run: RunResult, rounds: int) -> None:
        super().__init__(run.config.replace(rounds=rounds), run.directory, from_cache=run.from_cache)
        self.of, self.rounds = run, rounds
        self.key = getattr(run, "key", None)

    @cached_property
    def history(self) -> pd.DataFrame:
        h = self.of.history
        return h[h["round"] <= self.rounds].reset_index(drop=True)

    @cached_property
    def ledger(self) -> pd.DataFrame:
        led = self.of.ledger
        return led[led["round"] <= self.rounds].reset_index(drop=True)

    @cached_property
    def timings(self) -> pd.DataFrame:
        t = self.of.timings
        return t[t["round"] <= self.rounds].reset_index(drop=True)

    @cached_property
    def summary(self) -> dict[str, Any]:
        """The longer run's summary with the fields that depend on its length read from the first rounds (as
        :func:`_summary` reads them)."""
        diverged_at = self.of.summary.get("diverged_at_round")
        diverged = diverged_at is not None and diverged_at <= self.rounds
        up = self.ledger[self.ledger.direction == "up"]["bytes"].sum()
        down = self.ledger[self.ledger.direction == "down"]["bytes"].sum()
        return {**self.of.summary, **_history_summary(self.history, diverged_at if diverged else None),
                "rounds": min(self.rounds, diverged_at) if diverged else self.rounds,
                "wall_time_s": None, "upload_bytes": int(up), "download_bytes": int(down),
                "config": self.config.to_dict(), "first_rounds_of": self.of.summary.get("run_key")}

    def has_state(self) -> bool:
        return False

    def state(self) -> dict[str, Any]:
        raise FileNotFoundError(f"the first {self.rounds} rounds of a {self.of.config.rounds}-round run have no saved "
                                f"weights (only the whole run's final state is kept)")


def _history_summary(hist: pd.DataFrame, diverged_at: int | None) -> dict[str, Any]:
    """The summary fields read from a run's history: ``final_accuracy`` (the global model's, else the mean over the
    groups; ``None`` for a diverged run), ``diverged_at_round``, ``best_accuracy`` and ``final`` (every group's
    metrics in the last round)."""
    last_round = int(hist["round"].max()) if len(hist) else 0
    final = hist[(hist["round"] == last_round) & (hist.metric != "train_loss")]
    per_group = {f"{g}/{m}": v for g, m, v in zip(final.group, final.metric, final.value)}
    acc = hist[(hist.metric == "accuracy")]
    groups = sorted(set(acc.group))
    group_acc = [per_group[f"{g}/accuracy"] for g in groups if f"{g}/accuracy" in per_group]
    final_acc = per_group.get("global/accuracy", float(np.mean(group_acc)) if group_acc else None)
    if diverged_at is not None:
        final_acc = None  # the model after divergence is not a result; the curve up to it stays in history.csv
    return {"final_accuracy": final_acc, "diverged_at_round": diverged_at,
            "best_accuracy": float(acc[acc.group == "global"].value.max()) if "global" in groups else None,
            "final": per_group}


def _summary(config: ExperimentConfig, result, dataset: FederatedDataset, parts: list[np.ndarray],
             key: str) -> dict[str, Any]:
    sizes = np.array([len(p) for p in parts])
    return {
        **_history_summary(result.history.to_frame(), result.diverged_at),
        "rounds": result.rounds_completed,
        "wall_time_s": result.wall_time_s,
        "torch_threads": torch.get_num_threads(),  # results can differ in the last bits between thread counts
        "upload_bytes": result.ledger.total_bytes("up"),
        "download_bytes": result.ledger.total_bytes("down"),
        "resumed_from_round": result.resumed_from,
        "client_samples": {"min": int(sizes.min()), "median": float(np.median(sizes)), "max": int(sizes.max()),
                           "total": int(sizes.sum())},
        "dataset_notes": dataset.notes,
        "config": config.to_dict(),
        "canonical_config": canonical_config(config),
        "versions": run_versions(config),
        "environment": environment_class(config.device),
        "library_version": subfl.__version__,
        "run_key": key,
    }


def server_context(config: ExperimentConfig, dataset: FederatedDataset, device: str | None = None) -> ServerContext:
    """The :class:`~subfl.fl.method.ServerContext` a run of ``config`` gives its method (``device``: default the
    config's); analyses that rebuild a finished run's models use the same one."""
    return ServerContext(model_fn=ModelFactory(config, dataset), training=config.training, rounds=config.rounds,
                         seed=config.seed, num_classes=dataset.num_classes, input_shape=dataset.input_shape,
                         task=dataset.task, device=config.device if device is None else device,
                         num_clients=config.num_clients,
                         heterogeneity_levels=tuple(config.heterogeneity_setting.levels))


def run_cache_dir() -> Path:
    """``$SUBFL_CACHE_DIR``, else ``artifact_dir("runs")``: this machine's cache of finished runs (``cache=True``)."""
    return Path(os.environ["SUBFL_CACHE_DIR"]).expanduser() if os.environ.get("SUBFL_CACHE_DIR") \
        else artifact_dir("runs")


def check_out_dir(out_dir: str | Path) -> Path:
    """``out_dir`` as a path, after checking that it is (or can be created as) a writable folder: ``ValueError``
    naming the path otherwise (an empty path, a file, a folder below a file, no write permission)."""
    if isinstance(out_dir, bool) or not isinstance(out_dir, (str, os.PathLike)):
        raise ValueError(f"out_dir={out_dir!r} is not valid; accepted: a folder path")
    text = os.fspath(out_dir)
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"out_dir={text!r} is not valid; accepted: a folder path (an empty path would write into "
                         f"the current folder)")
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise ValueError(f"out_dir {path} is a file, not a folder; accepted: a folder path (existing or new)")
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"out_dir {path} cannot be created: {existing} is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"out_dir {path} is not writable (no write permission on {existing})")
    return path


def check_device_available(device: str) -> None:
    """``ValueError`` when this machine has no ``device`` (``config.device``; its syntax is checked with the
    config)."""
    kind = torch.device(device)
    if kind.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={device!r} is not available on this machine (torch finds no CUDA GPU); "
                             f"accepted here: 'cpu'")
        if kind.index is not None and kind.index >= torch.cuda.device_count():
            raise ValueError(f"device={device!r} is not available on this machine ({torch.cuda.device_count()} "
                             f"CUDA GPU(s)); accepted here: 'cpu', 'cuda' or 'cuda:0' … "
                             f"'cuda:{torch.cuda.device_count() - 1}'")
    if kind.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise ValueError(f"device={device!r} is not available on this machine (no Apple MPS); accepted here: 'cpu'")


def _differences(ours: dict[str, Any], theirs: dict[str, Any]) -> str:
    keys = sorted(set(ours) | set(theirs))
    changed = [f"{k}: {theirs.get(k, '(default)')!r} → {ours.get(k, '(default)')!r}" for k in keys
               if ours.get(k) != theirs.get(k)]
    return "; ".join(changed[:5]) + (f"; … ({len(changed)} fields)" if len(changed) > 5 else "")


def _finished_here(config: ExperimentConfig, target: Path, key: str) -> bool:
    """Whether ``target`` holds this very run, finished (then it is read back). ``ValueError`` when it holds a
    finished run of another configuration (it is not overwritten) or a summary that cannot be read with no
    checkpoint to finish from."""
    summary_path = target / "summary.json"
    if not summary_path.exists():
        return False
    try:
        summary = json.loads(summary_path.read_text())
    except (OSError, ValueError):
        if (target / CHECKPOINT_NAME).exists():
            return False  # killed while writing the summary: the run finishes again from its last checkpoint
        raise ValueError(f"out_dir {target} holds a summary.json that cannot be read and no checkpoint; delete the "
                         f"folder's files or use another out_dir") from None
    if summary.get("run_key") == key:
        return all((target / name).exists() for name in OUTPUT_FILES)
    theirs = summary.get("canonical_config")
    ours = json.loads(json.dumps(canonical_config(config), sort_keys=True, default=str))
    if isinstance(theirs, dict) and theirs != ours:
        raise ValueError(f"out_dir {target} holds a finished run of another configuration ({_differences(ours, theirs)}); "
                         f"use another out_dir, or delete its files to run this configuration there")
    return False  # the same configuration run by other versions or another environment: run it again


def _write_json_atomic(obj: Any, path: Path) -> None:
    """:func:`~subfl.fl.engine.dump_json` to a temporary name, then renamed: the file is complete or absent."""
    write_atomically(path, lambda tmp: dump_json(obj, tmp))


def run_experiment(config: ExperimentConfig, out_dir: str | Path | None = None, *, cache: bool = True,
                   data_root: str | Path | None = None, progress: bool | None = None,
                   stop_after_round: int | None = None, verify: bool = True) -> RunResult:
    """Run (or read back from the cache) one experiment.

    ``out_dir``: where the result files go (and the checkpoint while running; a run interrupted and started
    again with the same config and ``out_dir`` resumes; a finished run of the same config there is read back, and
    one of another config is refused with a ``ValueError``). Without ``out_dir`` the run lives in the cache.
    ``cache``: read a finished identical run from the cache and store this one there.
    ``verify``: check the data files against the manifest (:func:`prepare_data`).

    Checked before any data is loaded (``ValueError`` / ``TypeError`` naming what is wrong): the config (validated
    when it was built), that this machine has its device, ``out_dir`` (a writable folder) and the arguments.
    """
    if not isinstance(config, ExperimentConfig):
        raise TypeError(f"config must be an ExperimentConfig (build one with make_config), got "
                        f"{type(config).__name__}")
    for name, value in (("cache", cache), ("verify", verify)):
        if not isinstance(value, bool):
            raise TypeError(f"{name}={value!r} is not valid; accepted: True or False")
    if stop_after_round is not None and (isinstance(stop_after_round, bool) or not isinstance(stop_after_round, int)
                                         or stop_after_round < 1):
        raise ValueError(f"stop_after_round={stop_after_round!r} is not valid; accepted: an integer >= 1 or None")
    check_device_available(config.device)
    key = run_key(config)
    cached_dir = run_cache_dir() / key[:24]
    target = check_out_dir(out_dir) if out_dir is not None else cached_dir
    guarded = sorted({target, *([cached_dir] if cache else [])}, key=lambda p: str(p.absolute()))
    with contextlib.ExitStack() as locks:  # the second of two identical runs waits here, then reads the first's
        for folder in guarded:
            locks.enter_context(exclusive(lock_file_for(folder, run_cache_dir() / LOCKS), f"run folder {folder}"))
        if target != cached_dir and _finished_here(config, target, key):
            if cache and not _complete_entry(cached_dir):  # finished, then killed before the cache got its copy
                _publish(target, cached_dir)
            return RunResult(config, target, from_cache=True)
        if cache and _complete_entry(cached_dir):
            if target != cached_dir:
                _copy_files(cached_dir, target)
            return RunResult(config, target, from_cache=True)
        _compute(config, target, key, data_root, progress, stop_after_round, verify)
        if cache and target != cached_dir and (target / "summary.json").exists():
            _publish(target, cached_dir)
    return RunResult(config, target)


def _compute(config: ExperimentConfig, target: Path, key: str, data_root, progress, stop_after_round,
             verify: bool) -> None:
    """Run ``config`` in ``target`` (resuming from its checkpoint) and write its result files there; the summary is
    written last, under a temporary name then renamed, so a folder with a summary holds all its files complete."""
    target.mkdir(parents=True, exist_ok=True)
    dataset, test, parts = prepare_data(config, data_root, verify=verify)
    parts, local_tests = client_splits(config, parts)
    method = make_method(config.method, **dict(config.method_options))
    ctx = server_context(config, dataset)
    settings = EngineSettings(rounds=config.rounds, clients_per_round=config.clients_per_round,
                              eval_every=config.eval_every, seed=config.seed, device=config.device)
    result = run_simulation(method, dataset, parts, config.heterogeneity_setting, ctx, settings, test_data=test,
                            out_dir=target, fingerprint=key, progress=progress, stop_after_round=stop_after_round,
                            description=config.label(), client_test_indices=local_tests,
                            train_eval_data=train_eval_subset(config, dataset.train, parts))
    if result.rounds_completed < config.rounds and result.diverged_at is None:
        return  # stopped early on request: the checkpoint holds it
    (target / "summary.json").unlink(missing_ok=True)  # a summary of other versions there is replaced last
    result.history.write_csv(target / "history.csv")
    result.ledger.to_frame().to_csv(target / "ledger.csv", index=False)
    write_timings(result.timings, target / "timings.csv")
    torch.save(result.state, target / "state.pt")
    _write_json_atomic(_summary(config, result, dataset, parts, key), target / "summary.json")
    (target / CHECKPOINT_NAME).unlink(missing_ok=True)


LOCKS = "locks"
"""Folder of the run cache holding the lock files of run folders (:mod:`subfl.locking`)."""


def _complete_entry(folder: Path) -> bool:
    """Whether ``folder`` holds a finished run: its summary (written last) and every result file. A folder with a
    summary but missing files (an entry an earlier version left half-copied when killed) is deleted, so that the
    run is computed again."""
    if not (folder / "summary.json").exists():
        return False
    if all((folder / name).exists() for name in OUTPUT_FILES):
        return True
    shutil.rmtree(folder, ignore_errors=True)
    return False


def _copy_files(source: Path, target: Path) -> None:
    """Copy a finished run's files into ``target``, each under a temporary name then renamed, the summary last: a
    copy killed half-way leaves no summary, so the next call copies again."""
    target.mkdir(parents=True, exist_ok=True)
    for name in sorted(OUTPUT_FILES, key=lambda n: n == "summary.json"):
        copy_atomically(source / name, target / name)


def _publish(target: Path, cached_dir: Path) -> None:
    """Put a copy of the finished run in ``target`` into the cache as ``cached_dir``: copied into a temporary folder
    that is then renamed, so the cache entry is complete or absent (the caller holds ``cached_dir``'s lock)."""
    tmp = cached_dir.with_name(f".{cached_dir.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    _copy_files(target, tmp)
    if cached_dir.exists():  # an unfinished run of this key without out_dir, interrupted: replaced by this result
        shutil.rmtree(cached_dir)
    os.rename(tmp, cached_dir)


def run_seeds(config: ExperimentConfig, seeds: Iterable[int], **kwargs: Any) -> list[RunResult]:
    """The same experiment for several seeds (for error bars)."""
    return [run_experiment(config.replace(seed=s), **kwargs) for s in seeds]


def final_table(results: Iterable[RunResult], metric: str = "accuracy", group: str = "global",
                by: Iterable[str] = ("method",)) -> pd.DataFrame:
    """Mean ± std of the final ``metric`` over seeds, grouped by the given config fields; ``diverged`` counts
    the runs that diverged (their final value is NaN, so the group's mean is NaN too)."""
    by = list(by)
    rows = [{**{b: getattr(r.config, b) for b in by}, "seed": r.config.seed, metric: r.final(metric, group),
             "diverged": int(r.diverged)} for r in results]
    df = pd.DataFrame(rows)
    table = df.groupby(by)[metric].agg(["mean", "std", "count"])
    table["diverged"] = df.groupby(by)["diverged"].sum()
    return table.reset_index()


def history_frame(results: Iterable[RunResult], fields: Iterable[str] = ("method", "dataset", "partition", "seed"),
                  metric: str = "accuracy", group: str = "global") -> pd.DataFrame:
    """Long table of one metric's curve for many runs, with the named config fields as columns."""
    fields = list(fields)
    frames = []
    for r in results:
        c = r.curve(metric, group).assign(**{f: getattr(r.config, f) for f in fields})
        frames.append(c)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["round", "value", *fields])
