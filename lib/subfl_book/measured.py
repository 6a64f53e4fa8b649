"""Results a page shows that depend on the machine, measured once and recorded in the run store.

A wall-clock measurement (how long an SVD refresh or a sampler's round takes) depends on the machine and on its load,
and the end point of a generic numerical optimiser (SLSQP from random starts) on the CPU's rounding, which steers its
iterates: a page that computed them each time it ran would show new numbers, and could reach a new verdict, at every
execution and on every machine. :func:`measured` instead keys such a result on its name and its inputs, reads it from
the store when it is there (``store/measured/<name>-<key>.json``), and otherwise measures it now and records it, with
the machine, the torch version and thread count and the date. Executing the page again reads the same numbers; its
run card names the machine they were measured on. To measure again, delete the file. ``ci``-scale measurements (smoke
tests) go to the work folder's ``ci-store/measured`` instead, as ``ci``-scale runs do
(:func:`subfl_book.store.root_for`).

>>> seconds = measured("svd-refresh", {"model": "resnet18", "width": 1.0}, lambda: {"exact": 1.2}, scale="cpu")  # doctest: +SKIP
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
import platform
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from subfl.files import write_bytes_atomically

from .store import store_root, work_root

MEASURED_DIR = "measured"
MEASURED_LOG_ENV = "SUBFL_PAGE_MEASURED"
"""Environment variable naming the JSON-lines file where :func:`measured` logs each measurement a page reads (set by
:func:`subfl_book.pipeline.execute_notebook`: the page's run card names them, and the page is stale when one changes)."""

ROUND_DECIMALS = 9
"""Decimals a floating-point input array is rounded to before it is hashed into a measurement's key."""

_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789-_")


def _canonical(value: Any) -> Any:
    """A JSON-able stand-in for an input: an array by its dtype, shape and the sha256 of its bytes (a floating-point
    one rounded to :data:`ROUND_DECIMALS` decimals first)."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        data = np.ascontiguousarray(value)
        if np.issubdtype(data.dtype, np.floating):
            # to 9 decimals: an input computed on another CPU (an SVD of the same weights) differs in its last bits,
            # which must not re-key the measurement
            data = np.ascontiguousarray(np.round(data.astype(np.float64), ROUND_DECIMALS))
        return {"array": str(data.dtype), "shape": list(data.shape), "sha256": hashlib.sha256(data.tobytes()).hexdigest()}
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"inputs: {type(value).__name__} is not accepted; accepted: numbers, strings, None, arrays and "
                    f"tensors, and lists or mappings of them")


def measurement_key(name: str, inputs: Mapping[str, Any]) -> str:
    """sha256 of (name, canonical inputs): which measurement this is, whichever machine made it."""
    blob = {"name": name, "inputs": _canonical(dict(inputs))}
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()


def measured_root(scale: str) -> Path:
    """Where measurements are recorded: the store's ``measured/``; at the ``ci`` scale (without
    ``$SUBFL_STORE_DIR``) the work folder's ``ci-store/measured``."""
    if scale == "ci" and not os.environ.get("SUBFL_STORE_DIR"):
        return work_root() / "ci-store" / MEASURED_DIR
    return store_root() / MEASURED_DIR


def measurement_path(name: str, inputs: Mapping[str, Any], scale: str) -> Path:
    return measured_root(scale) / f"{name}-{measurement_key(name, inputs)[:24]}.json"


def _encode(result: Any) -> dict[str, Any]:
    if isinstance(result, pd.DataFrame):
        if not all(isinstance(c, str) for c in result.columns):
            raise TypeError("a measured table needs string column names")
        return {"table": {"columns": list(result.columns),
                          "rows": [[_plain(v, missing_ok=True) for v in row] for row in result.itertuples(index=False)]}}
    if isinstance(result, Mapping):
        return {"values": {str(k): _plain(v) for k, v in result.items()}}
    raise TypeError(f"a measurement must return a pandas DataFrame or a mapping of numbers, got {type(result).__name__}")


def _plain(value: Any, missing_ok: bool = False) -> Any:
    """A JSON value for one number or string of a result; a table's missing cell (NaN) is recorded as null with
    ``missing_ok`` (read back as NaN)."""
    value = value.item() if isinstance(value, np.generic) else value
    if missing_ok and isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"a measurement returned {value!r}; only finite numbers are recorded (and NaN as a "
                         f"table's missing cell)")
    if value is not None and not isinstance(value, (bool, int, float, str)):
        raise TypeError(f"a measurement's values must be numbers or strings, got {type(value).__name__}")
    return value


def _decode(record: Mapping[str, Any]) -> pd.DataFrame | dict[str, Any]:
    if "table" in record:
        return pd.DataFrame(record["table"]["rows"], columns=record["table"]["columns"])
    return dict(record["values"])


def machine_facts() -> dict[str, Any]:
    """The machine a measurement is made on: processor, core count, torch version and threads, platform."""
    return {"processor": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "platform": platform.platform(), "torch": torch.__version__, "torch_threads": torch.get_num_threads()}


def measured(name: str, inputs: Mapping[str, Any], measure: Callable[[], Any], *, scale: str
             ) -> pd.DataFrame | dict[str, Any]:
    """The result of ``measure()`` for (``name``, ``inputs``): read from the store when recorded, otherwise measured
    now (with :data:`~subfl_book.store.BOOK_THREADS` torch threads, as the book's runs) and recorded.

    ``name``: lower-case letters, digits, ``-`` and ``_``. ``inputs``: everything the measurement depends on (numbers,
    strings, arrays — an array counts by its bytes); two calls with the same name and inputs share one record.
    ``measure``: returns a DataFrame (string columns; numbers, strings or NaN in its cells) or a mapping of numbers."""
    from .store import book_threads

    if not name or set(name) - _NAME_CHARS:
        raise ValueError(f"name={name!r} is not valid; accepted: lower-case letters, digits, '-' and '_'")
    path = measurement_path(name, inputs, scale)
    if path.is_file():
        record = json.loads(path.read_text(encoding="utf-8"))
    else:
        with book_threads():
            facts = machine_facts()
            result = measure()
        record = {"name": name, "key": measurement_key(name, inputs), "inputs": _canonical(dict(inputs)),
                  **_encode(result), "machine": facts,
                  "measured_at": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
        write_bytes_atomically(path, (json.dumps(record, indent=1, sort_keys=True) + "\n").encode("utf-8"))
        # return what was written, as a later read gets it (keys in the file's order): a page executed while
        # measuring shows what its re-execution from the store shows
        record = json.loads(path.read_text(encoding="utf-8"))
    _log_read(path, record)
    return _decode(record)


def _log_read(path: Path, record: Mapping[str, Any]) -> None:
    log = os.environ.get(MEASURED_LOG_ENV)
    if not log:
        return
    m = record.get("machine", {})
    threads = m.get("torch_threads", "?")
    entry = {"file": f"{MEASURED_DIR}/{path.name}", "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
             "hardware": f"{m.get('processor', '?')}, {m.get('cpus', '?')} CPUs, {threads} torch "
                         f"thread{'' if threads == 1 else 's'}", "torch": m.get("torch"), "date": record.get("measured_at")}
    with open(log, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")


def file_changed(path: Path, sha256: str) -> bool:
    """Whether the file a page read, with this sha256, is gone or holds other bytes now."""
    return not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != sha256


def measurement_changed(entry: Mapping[str, Any], scale: str) -> bool:
    """Whether a measurement a page read (an entry of its log) is no longer the recorded one: gone, or changed."""
    return file_changed(measured_root(scale).parent / entry["file"], entry["sha256"])


__all__ = ["MEASURED_DIR", "MEASURED_LOG_ENV", "file_changed", "machine_facts", "measured", "measured_root", "measurement_changed",
           "measurement_key", "measurement_path"]
