"""The run store: every run a page reads, recorded in the repository under ``store/``.

A record is one gzip-compressed JSON file per run, named by its run key
(:func:`subfl.experiments.provenance.run_key`: canonical config, versions, environment class), holding the config,
the versions, the environment, the summary, the history, the full communication ledger, the stage timings and, for a
classification run that did not diverge, the confusion matrix of each final evaluation model on the test set (so the
class-specific metrics of CAFF §4.4 are read without weights; stored sparse).
Final weights are kept (``<key>.state.pt``) only for the runs a page evaluates again (``keep_state=True``).
The pretrained models finetuning runs start from are kept too (``pretrained/<name>/``, :func:`pretrained`): a page
that scores them, or a run computed on another machine, reads the recorded weights instead of pretraining again.
Timings a page measures outside its runs are kept under ``measured/`` (:mod:`subfl_book.measured`).

:func:`run_experiment` reads a run from the store when its key is there and computes it otherwise (resuming from a
checkpoint in the work folder, ``.subfl-work/`` by default), then records it. The book's runs are made with **one
torch thread** (:data:`BOOK_THREADS`), so their keys, and their histories, do not depend on the machine's core count.

A run's key names its environment class (torch ``major.minor``, threads, device type), so a machine with another
torch, or a run made on a GPU, has other keys. When the store holds no run of the reader's own environment, the
page reads one of another environment **of the same experiment** — the same canonical config (its ``device`` aside)
and the same versions (:func:`experiment_key`) — and its run card names each environment it read. Two environments
give different floating-point histories of one experiment; they are not different experiments. Set
``$SUBFL_STORE_SAME_ENVIRONMENT=1`` to read only runs of this environment (and compute the others here).

Size budget: the store is meant to stay under :data:`SIZE_BUDGET_MB` (``tests/book/test_store.py`` checks it).
"""
from __future__ import annotations

import contextlib
import functools
import gzip
import hashlib
import io
import json
import os
import platform
import shutil
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from subfl.experiments import ExperimentConfig, RunResult
from subfl.experiments import run_experiment as compute_run
from subfl.files import copy_atomically, write_bytes_atomically
from subfl.locking import exclusive
from subfl.experiments.provenance import run_key

BOOK_THREADS = 1
"""torch intra-op threads of every run the book records (part of the run key's environment class)."""

SIZE_BUDGET_MB = 150
"""The most the committed store may weigh (records and kept weights together)."""

RUNS_LOG_ENV = "SUBFL_PAGE_RUNS"
"""When set (by the page pipeline), every run read or computed appends its key and config to this file."""


def checkout_root() -> Path:
    """The repository this package runs from."""
    return Path(__file__).resolve().parents[2]


def store_root() -> Path:
    """``$SUBFL_STORE_DIR``, else ``store/`` in the checkout."""
    return Path(os.environ["SUBFL_STORE_DIR"]).expanduser() if os.environ.get("SUBFL_STORE_DIR") \
        else checkout_root() / "store"


def work_root() -> Path:
    """``$SUBFL_WORK_DIR``, else ``.subfl-work/`` in the checkout: checkpoints of runs being computed."""
    return Path(os.environ["SUBFL_WORK_DIR"]).expanduser() if os.environ.get("SUBFL_WORK_DIR") \
        else checkout_root() / ".subfl-work"


def record_path(key: str, root: Path | None = None) -> Path:
    root = store_root() if root is None else root
    return root / key[:2] / f"{key}.json.gz"


def state_path(key: str, root: Path | None = None) -> Path:
    return record_path(key, root).with_name(f"{key}.state.pt")


@contextlib.contextmanager
def book_threads() -> Iterator[None]:
    """Run with :data:`BOOK_THREADS` torch threads, then restore the caller's count."""
    before = torch.get_num_threads()
    torch.set_num_threads(BOOK_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def book_key(config: ExperimentConfig) -> str:
    """The run key of ``config`` as the book records it (with :data:`BOOK_THREADS` threads)."""
    with book_threads():
        return run_key(config)


def _frame_columns(frame: pd.DataFrame) -> list[list]:
    """``[[column, values], ...]`` in the frame's column order (a JSON object's keys would be sorted)."""
    return [[c, frame[c].tolist()] for c in frame.columns]


def _frame(columns: list[list]) -> pd.DataFrame:
    return pd.DataFrame({c: values for c, values in columns})


def _sparse(matrix: np.ndarray) -> dict[str, Any]:
    rows, cols = np.nonzero(matrix)
    return {"shape": list(matrix.shape), "entries": [[int(i), int(j), int(matrix[i, j])] for i, j in zip(rows, cols)]}


def _dense(sparse: dict[str, Any]) -> np.ndarray:
    matrix = np.zeros(sparse["shape"], dtype=np.int64)
    for i, j, count in sparse["entries"]:
        matrix[i, j] = count
    return matrix


def _confusions(result: RunResult, data_root: str | Path | None, verify: bool = True) -> dict[str, Any] | None:
    from subfl.experiments.runner import prepare_data

    from .analysis import final_confusions

    if result.diverged:
        return None
    prepared = prepare_data(result.config, data_root, verify=verify)
    return {name: _sparse(m) for name, m in final_confusions(result, data_root, prepared=prepared).items()}


def hardware(device: str) -> dict[str, Any]:
    """The machine a run was computed on: its processor and core count, the CPU's vendor, family, model and name
    where the system tells them (``/proc/cpuinfo``), the instruction set torch's CPU kernels use (``cpu_capability``,
    e.g. AVX512) and torch's full version, and the accelerator's name for a GPU run. None of these is part of the run
    key (:func:`subfl.experiments.provenance.environment_class`), yet CPU kernels of another build, instruction set or
    CPU round differently (two CPUs of one instruction set can too): they say why a recomputation of a key need not
    match its record."""
    out: dict[str, Any] = {"processor": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                           **cpu_identity(),
                           "cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch_build": torch.__version__}
    if torch.device(device).type == "cuda" and torch.cuda.is_available():
        out["accelerator"] = torch.cuda.get_device_name(torch.device(device))
    return out


def cpu_identity(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, str]:
    """The first processor's ``cpu_vendor``, ``cpu_family``, ``cpu_model`` and ``cpu_name`` as ``cpuinfo`` gives
    them; ``{}`` where the file is absent (not Linux) or names none of them."""
    if not cpuinfo.is_file():
        return {}
    fields: dict[str, str] = {}
    for line in cpuinfo.read_text(errors="replace").splitlines():
        name, _, value = line.partition(":")
        if not name.strip() and fields:
            break   # the first processor's block is enough
        fields.setdefault(name.strip(), value.strip())
    return {k: fields[f] for k, f in (("cpu_vendor", "vendor_id"), ("cpu_family", "cpu family"),
                                      ("cpu_model", "model"), ("cpu_name", "model name")) if f in fields}


class RecordDiffers(RuntimeError):
    """A run computed again (for its weights or analyses) gave another history than the store's record of its key:
    saving it would change what the pages that read the record show. ``difference`` says where the two first part."""

    def __init__(self, key: str, difference: str, recorded: dict[str, Any]) -> None:
        self.key, self.difference, self.recorded = key, difference, recorded
        recorded_hw = recorded.get("hardware") or {}
        super().__init__(
            f"run {key[:12]} computed here gives another history than its record ({difference}); recorded on "
            f"{recorded_hw.get('cpu_name') or recorded_hw.get('processor', 'an unnamed machine')}, computed on "
            f"{cpu_identity().get('cpu_name') or platform.machine()}. The store keeps its record; to replace it (the "
            f"pages that read it go stale), save with replace_differing=True or run scripts/compute_runs.py with "
            f"--replace-differing")


def history_difference(recorded: list[list], computed: list[list]) -> str | None:
    """None when two histories in record form (``[[column, values], ...]``) are identical, else where they first
    part: the row's round, metric and group with both values."""
    if json.dumps(recorded, sort_keys=True, default=str) == json.dumps(computed, sort_keys=True, default=str):
        return None
    old, new = dict((c, v) for c, v in recorded), dict((c, v) for c, v in computed)
    if set(old) != set(new) or len(old.get("value", [])) != len(new.get("value", [])):
        return (f"the histories have different shapes ({len(old.get('value', []))} rows recorded, "
                f"{len(new.get('value', []))} computed)")
    for i, (a, b) in enumerate(zip(old["value"], new["value"])):
        if json.dumps(a) != json.dumps(b) or any(old[c][i] != new[c][i] for c in old if c != "value"):
            where = ", ".join(f"{c} {old[c][i]}" for c in ("round", "metric", "group") if c in old)
            return f"first at {where}: recorded {a!r}, computed {b!r}"
    return "the histories differ outside their values"


def experiment_key(canonical: dict[str, Any], versions: dict[str, Any]) -> str:
    """sha256 of (canonical config without its ``device``, versions): what a run computes, whichever machine
    computed it. Runs of one experiment in different environment classes share it (their run keys differ)."""
    config = {k: v for k, v in canonical.items() if k != "device"}
    return hashlib.sha256(json.dumps({"config": config, "versions": versions}, sort_keys=True).encode()).hexdigest()


def save_record(result: RunResult, key: str, *, keep_state: bool = False, data_root: str | Path | None = None,
                root: Path | None = None, verify: bool = True, analyses: Iterable[Any] | None = None,
                replace_differing: bool = False) -> Path:
    """Write ``result`` into the store under ``key`` (atomically); its weights too with ``keep_state``.

    A run the store already holds (computed again for its weights or analyses) must give the record's history;
    otherwise :class:`RecordDiffers` is raised and nothing is written, unless ``replace_differing``. (A key fixes the
    code and the environment class, not the CPU: another CPU can round differently, and a training run amplifies a
    difference in the last bit.)

    ``analyses``: requests of :mod:`subfl_book.final_analyses`, each computed now from the run's final weights and
    recorded with the run (so a page reads them without the weights).
    ``verify``: check the data files (read again for the record's confusion matrices) against the manifest's
    sha256; ``False`` for a re-packed copy whose arrays are identical (:func:`subfl.experiments.runner.prepare_data`).
    """
    from . import final_analyses

    path = record_path(key, root)
    history = _frame_columns(result.history)
    earlier = json.loads(gzip.decompress(path.read_bytes())) if path.exists() else None
    difference = None if earlier is None else history_difference(earlier["history"],
                                                                  json.loads(json.dumps(history, default=str)))
    if difference is not None and not replace_differing:
        raise RecordDiffers(key, difference, earlier)
    summary = result.summary
    record = {"key": key, "config": summary["config"], "canonical_config": summary["canonical_config"],
              "versions": summary["versions"], "environment": summary["environment"], "summary": summary,
              "experiment_key": experiment_key(summary["canonical_config"], summary["versions"]),
              "hardware": hardware(result.config.device),
              "history": history, "ledger": _frame_columns(result.ledger),
              "timings": _frame_columns(result.timings), "confusions": _confusions(result, data_root, verify),
              "analyses": final_analyses.compute(result, analyses, data_root)}
    if earlier is not None and difference is None:  # computed again for more analyses: keep those recorded before
        record["analyses"] = {**(earlier.get("analyses") or {}), **record["analyses"]}
    if keep_state:
        buffer = io.BytesIO()
        torch.save(result.state(), buffer)
        write_bytes_atomically(state_path(key, root), buffer.getvalue())
    _write_record(path, record)
    return path


def _write_record(path: Path, record: Mapping[str, Any]) -> None:
    """Write a record as the store keeps it: canonical JSON (sorted keys), gzip without a timestamp, atomically —
    so the same record always gives the same bytes."""
    text = json.dumps(record, sort_keys=True, separators=(",", ":"), default=str).encode()
    write_bytes_atomically(path, gzip.compress(text, compresslevel=9, mtime=0))


def record_analyses_from_state(config: ExperimentConfig, key: str, analyses: Iterable[Any], *,
                               root: Path | None = None, data_root: str | Path | None = None,
                               drop_state: bool = False) -> Path:
    """Compute ``analyses`` (:mod:`subfl_book.final_analyses` requests) from the final weights the store keeps for
    run ``key`` — the weights of the very computation the record holds, so nothing is computed again — and record
    them with the run; ``drop_state`` then removes the weights (a page that read them now reads the analyses)."""
    from . import final_analyses

    stored = load_record(config, key, root)
    if stored is None or not stored.has_state():
        raise FileNotFoundError(f"the store under {root or store_root()} keeps no weights for run {key[:12]}: "
                                f"its analyses can only come from computing it again")
    path = record_path(key, root)
    record = json.loads(gzip.decompress(path.read_bytes()))
    record["analyses"] = {**(record.get("analyses") or {}), **final_analyses.compute(stored, analyses, data_root)}
    _write_record(path, record)
    if drop_state:
        state_path(key, root).unlink()
    return path


class StoredRun(RunResult):
    """A :class:`~subfl.experiments.RunResult` read from a store record (no files on disk besides the record)."""

    def __init__(self, config: ExperimentConfig, record: dict[str, Any], state_file: Path) -> None:
        super().__init__(config, state_file.parent, from_cache=True)
        self.key = record["key"]
        self.__dict__["summary"] = record["summary"]
        history = _frame(record["history"])
        self.__dict__["history"] = history.astype({"round": int, "metric": str, "value": float, "group": str})
        self.__dict__["ledger"] = _frame(record["ledger"])
        self.__dict__["timings"] = _frame(record["timings"])
        confusions = record.get("confusions")
        self.confusions = None if confusions is None else {k: _dense(v) for k, v in confusions.items()}
        self.analyses = dict(record.get("analyses") or {})   # values of subfl_book.final_analyses, by request
        self.digest = record_digest(record)
        self._state_file = state_file

    def has_state(self) -> bool:
        return self._state_file.exists()

    def state(self) -> dict[str, Any]:
        if not self._state_file.exists():
            raise FileNotFoundError(f"the store keeps no weights for run {self.key[:12]} ({self.config.label()}); "
                                    f"read it with keep_state=True to record them")
        return torch.load(self._state_file, map_location="cpu", weights_only=False)


def record_digest(record: dict[str, Any]) -> str:
    """sha256 of what a computation of the run produced: the record without the final-weights analyses added to it
    later (they have versions of their own). Two computations of one key on machines whose CPU kernels round
    differently give two digests: a page that read one is stale once the store holds the other."""
    produced = {name: value for name, value in record.items() if name != "analyses"}
    return hashlib.sha256(json.dumps(produced, sort_keys=True, default=str).encode()).hexdigest()


def stored_digest(key: str, root: Path | None = None) -> str | None:
    """:func:`record_digest` of the stored record of ``key`` (``None``: not in the store)."""
    path = record_path(key, root)
    return record_digest(json.loads(gzip.decompress(path.read_bytes()))) if path.exists() else None


def load_record(config: ExperimentConfig, key: str, root: Path | None = None) -> StoredRun | None:
    path = record_path(key, root)
    if not path.exists():
        return None
    return StoredRun(config, json.loads(gzip.decompress(path.read_bytes())), state_path(key, root))


def _log_read(key: str, config: ExperimentConfig, same_environment: bool = False,
              analyses: Iterable[Any] | None = None, digest: str | None = None) -> None:
    """One line of the page's runs log (``$SUBFL_PAGE_RUNS``): the key, config and analyses read, and the
    :func:`record_digest` of the record read (absent on the line written before a missing run is computed)."""
    from . import final_analyses

    log = os.environ.get(RUNS_LOG_ENV)
    if log:
        requests = [list(r) for r in final_analyses.normalise(analyses)]
        entry = ({"key": key, "config": config.to_dict()} | ({"same_environment": True} if same_environment else {})
                 | ({"analyses": requests} if requests else {}) | ({"record_sha256": digest} if digest else {}))
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry, sort_keys=True, default=list) + "\n")


def _run_lock(key: str) -> contextlib.AbstractContextManager:
    """Exclusive right to compute run ``key`` on this machine (a lock file ``work_root()/<key>.lock``, held through
    :func:`subfl.locking.exclusive`): two pages executed at once that read the same run compute it once;
    the second waits at most ``$SUBFL_LOCK_TIMEOUT_S`` (default 12 h)."""
    return exclusive(work_root() / f"{key[:24]}.lock", f"run {key[:12]}")


STORE_ONLY_ENV = "SUBFL_STORE_ONLY"
"""Set to 1: a run missing from the store is an error instead of being computed (re-executing pages from the store
only, e.g. after a change to their prose or analysis)."""


class MissingRunError(LookupError):
    """A run is not in the store and ``$SUBFL_STORE_ONLY`` forbids computing it."""


def root_for(config: ExperimentConfig) -> Path:
    """Where a run is recorded: :func:`store_root`, except that ``ci``-scale runs (smoke tests) never go into the
    repository's store — without ``$SUBFL_STORE_DIR`` they are kept in the work folder's ``ci-store/``."""
    if config.scale == "ci" and not os.environ.get("SUBFL_STORE_DIR"):
        return work_root() / "ci-store"
    return store_root()


SAME_ENVIRONMENT_ENV = "SUBFL_STORE_SAME_ENVIRONMENT"
"""Set to 1: read only runs recorded in this machine's environment class (no run of another environment stands in)."""


def _read_header(path: Path) -> tuple[str, dict[str, Any]]:
    record = json.loads(gzip.decompress(path.read_bytes()))
    ek = record.get("experiment_key") or experiment_key(record["canonical_config"], record["versions"])
    return ek, record["environment"]


@functools.lru_cache(maxsize=8)
def _experiment_index(root: Path, stamp: tuple[int, float]) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """``{experiment key: [(run key, environment), ...]}`` of every record under ``root`` (``stamp``: the records'
    count and latest change, so that a record written since is seen)."""
    index: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for path in sorted(root.glob("??/*.json.gz")):
        ek, environment = _read_header(path)
        index.setdefault(ek, []).append((path.name[:-len(".json.gz")], environment))
    return index


def _stamp(root: Path) -> tuple[int, float]:
    dirs = [d for d in root.glob("??") if d.is_dir()]
    return (sum(1 for d in dirs for _ in d.glob("*.json.gz")), max((d.stat().st_mtime for d in dirs), default=0.0))


def same_experiment(config: ExperimentConfig, root: Path | None = None) -> list[str]:
    """Run keys of the records under ``root`` that computed ``config``'s experiment in any environment class,
    CPU runs first, then by key (the order a page takes them in)."""
    from subfl.experiments.provenance import canonical_config, run_versions

    root = store_root() if root is None else root
    if not root.exists():
        return []
    rows = _experiment_index(root, _stamp(root)).get(experiment_key(canonical_config(config), run_versions(config)),
                                                      [])
    return [key for key, env in sorted(rows, key=lambda row: (row[1].get("device") != "cpu", row[0]))]


def recorded_enough(key: str, root: Path, keep_state: bool = False, analyses: Iterable[Any] | None = None) -> bool:
    """Whether the store under ``root`` holds run ``key`` as a page asks for it: its record, its weights for
    ``keep_state``, and for ``analyses`` (:mod:`subfl_book.final_analyses` requests) a current value of each, or
    the weights to compute them from."""
    from . import final_analyses

    if not record_path(key, root).exists():
        return False
    has_state = state_path(key, root).exists()
    if keep_state and not has_state:
        return False
    requests = final_analyses.normalise(analyses)
    if not requests or has_state:
        return True
    record = json.loads(gzip.decompress(record_path(key, root).read_bytes()))
    return final_analyses.has_all(record.get("analyses"), requests)


def key_to_read(config: ExperimentConfig, keep_state: bool = False, same_environment: bool = False,
                analyses: Iterable[Any] | None = None) -> str | None:
    """The key of the record a page reads for ``config`` now: the run of this environment when the store has it,
    else (unless ``same_environment`` or ``$SUBFL_STORE_SAME_ENVIRONMENT``) the first of :func:`same_experiment`;
    ``None`` when neither is recorded (with its weights, for ``keep_state``; with the requested ``analyses``, see
    :func:`recorded_enough`)."""
    key = book_key(config)
    root = root_for(config)
    candidates = [key]
    if not same_environment and os.environ.get(SAME_ENVIRONMENT_ENV, "") in ("", "0"):
        candidates += [k for k in same_experiment(config, root) if k != key]
    for candidate in candidates:
        if recorded_enough(candidate, root, keep_state, analyses):
            return candidate
    return None


def _stored_enough(config: ExperimentConfig, keep_state: bool, same_environment: bool = False,
                   analyses: Iterable[Any] | None = None) -> StoredRun | None:
    found = key_to_read(config, keep_state, same_environment, analyses)
    return None if found is None else load_record(config, found, root_for(config))


def run_experiment(config: ExperimentConfig, *, data_root: str | Path | None = None, progress: bool | None = None,
                   keep_state: bool = False, same_environment: bool = False,
                   analyses: Iterable[Any] | None = None) -> RunResult:
    """The run of ``config`` from the store, computed (with one torch thread) and recorded when it is not there.

    ``keep_state``: the page evaluates the run's final weights again, so the store keeps them too.
    ``analyses``: the :mod:`subfl_book.final_analyses` the page reads of this run's final weights
    (``[("top_terms_accuracy", {"keep": 0.2})]``); they are recorded with the run, and a record without them (and
    without weights) is computed again.
    ``same_environment``: read only a run of this machine's environment class (a page that reads timings, which
    another device or torch would change), computing it when the store has none. A run another
    process is computing is waited for (at most ``$SUBFL_LOCK_TIMEOUT_S``, default 12 h) and then read.
    """
    key = book_key(config)
    stored = _stored_enough(config, keep_state, same_environment, analyses)
    if stored is not None:
        _log_read(stored.key, config, same_environment, analyses, stored.digest)
        return stored
    _log_read(key, config, same_environment, analyses)
    if os.environ.get(STORE_ONLY_ENV, "") not in ("", "0"):
        raise MissingRunError(f"run {key[:12]} ({config.label()}) is not in the store "
                              f"{'with its weights ' if keep_state else ''}"
                              f"{'with its analyses ' if analyses else ''}and ${STORE_ONLY_ENV} forbids computing it")
    with _run_lock(key):
        stored = _stored_enough(config, keep_state, same_environment, analyses)  # recorded while we waited
        if stored is not None:
            _log_read(stored.key, config, same_environment, analyses, stored.digest)
            return stored
        work = work_root() / key[:24]
        seed_pretrained_cache(pretrained_root(config.scale))
        with book_threads():   # the record's confusion matrices too, as scripts/compute_runs.py computes them
            result = compute_run(config, work, cache=False, data_root=data_root, progress=progress)
            save_record(result, key, keep_state=keep_state, data_root=data_root, root=root_for(config),
                        analyses=analyses)
        if config.scale != "ci":
            record_pretrained_cache(pretrained_root(config.scale))
        shutil.rmtree(work, ignore_errors=True)
    stored = load_record(config, key, root_for(config))
    _log_read(key, config, same_environment, analyses, stored.digest)
    return stored


# ---- pretrained models ----------------------------------------------------------------------------------
# The weights a finetuning run starts from are a result like the runs themselves: pretraining them again on
# another machine costs CPU-hours and need not give the same bits. The store keeps each one the book uses
# (``pretrained/<name>/weights.pt`` and its ``summary.json``, ``<name>`` as in ``subfl.pretraining.pretrained_dir``).

def pretrained_root(scale: str = "cpu") -> Path:
    """Where the store keeps pretrained models: ``store_root()/pretrained``; for ``ci``-scale pretraining (smoke
    tests) the work folder's ``ci-store/pretrained`` unless ``$SUBFL_STORE_DIR`` is set (as :func:`root_for`)."""
    if scale == "ci" and not os.environ.get("SUBFL_STORE_DIR"):
        return work_root() / "ci-store" / "pretrained"
    return store_root() / "pretrained"


def _copy_pretrained(source: Path, target: Path) -> None:
    """``summary.json`` then ``weights.pt`` (written under a temporary name and renamed: a reader never sees a
    partial file) from folder ``source`` to folder ``target``."""
    target.mkdir(parents=True, exist_ok=True)
    if (source / "summary.json").is_file():
        copy_atomically(source / "summary.json", target / "summary.json")
    copy_atomically(source / "weights.pt", target / "weights.pt")


def seed_pretrained_cache(root: Path | None = None) -> list[str]:
    """Copy each pretrained model kept in ``root`` (default :func:`pretrained_root`) into the library's cache
    (``subfl.artifacts``) where the cache lacks it, so a run computed here starts from the recorded weights instead
    of pretraining again. Returns the names copied."""
    from subfl.artifacts import artifact_dir

    root, copied = pretrained_root() if root is None else root, []
    if not root.is_dir():
        return copied
    for entry in sorted(p for p in root.iterdir() if (p / "weights.pt").is_file()):
        target = artifact_dir("pretrained") / entry.name
        if not (target / "weights.pt").is_file():
            _copy_pretrained(entry, target)
            copied.append(entry.name)
    return copied


def record_pretrained_cache(root: Path | None = None) -> list[str]:
    """Copy into ``root`` (default :func:`pretrained_root`) each pretrained model of the library's presets at the
    ``cpu`` and ``paper`` scales (``subfl.pretraining.PRESETS``, every depth) that the library's cache holds and
    ``root`` lacks: a run computed here may have pretrained it, and it must outlive this machine. Returns the names
    copied."""
    from subfl.pretraining import PRESETS, preset, pretrained_dir

    root, copied = pretrained_root() if root is None else root, []
    for (kind, scale), values in PRESETS.items():
        if scale == "ci":
            continue
        for layers in values["layers"]:
            cached = pretrained_dir(preset(kind, scale, layers))
            if (cached / "weights.pt").is_file() and not (root / cached.name / "weights.pt").is_file():
                _copy_pretrained(cached, root / cached.name)
                copied.append(cached.name)
    return copied


def pretrained(config: Any, scale: str, data_root: str | Path | None = None) -> dict[str, torch.Tensor]:
    """The weights of pretraining ``config`` (a :class:`subfl.pretraining.PretrainConfig` of the preset ``scale``)
    from the store; pretrained with one torch thread and recorded when the store lacks them. Raises
    :class:`MissingRunError` instead of pretraining when ``$SUBFL_STORE_ONLY`` is set."""
    from subfl.pretraining import pretrain, pretrained_dir

    entry = pretrained_root(scale) / pretrained_dir(config).name
    if (entry / "weights.pt").is_file():
        seed_pretrained_cache(entry.parent)
        return torch.load(entry / "weights.pt", map_location="cpu", weights_only=True)
    if os.environ.get(STORE_ONLY_ENV, "") not in ("", "0"):
        raise MissingRunError(f"pretrained model {entry.name} is not in the store and ${STORE_ONLY_ENV} forbids "
                              f"pretraining it")
    with book_threads():
        state = pretrain(config, data_root)
    _copy_pretrained(pretrained_dir(config), entry)
    return state


def pretraining_summary(config: Any, scale: str) -> dict[str, Any] | None:
    """The recorded summary (loss curve, held-out loss, wall time) of pretraining ``config``: the store's, else the
    library cache's, else ``None``."""
    from subfl.pretraining import pretrain_summary, pretrained_dir

    path = pretrained_root(scale) / pretrained_dir(config).name / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else pretrain_summary(config)


def run_seeds(config: ExperimentConfig, seeds: Iterable[int], **kwargs: Any) -> list[RunResult]:
    """:func:`run_experiment` for each seed."""
    return [run_experiment(config.replace(seed=s), **kwargs) for s in seeds]


def store_size_bytes(root: Path | None = None) -> int:
    root = store_root() if root is None else root
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) if root.exists() else 0
