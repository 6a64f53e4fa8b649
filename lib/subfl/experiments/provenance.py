"""Behavioural provenance: what a run's result depends on, stated as versions, not as source text.

A run's **key** is the hash of three things, each recorded with the run:

* its **canonical config** — the :class:`~subfl.experiments.config.ExperimentConfig` with every field at its
  default dropped (so adding a field with a default re-keys nothing) and ``scale`` dropped (a preset only fills
  fields, which are all in the config);
* the **versions** of what it executes — the engine and data pipeline, its method (and each behaviour-changing
  option it sets), its model and its dataset entry. A change of behaviour must bump the version it changes; a
  golden run per method and option set (``tests/golden``) fails CI when a digest moves and no version did;
* its **environment class** — torch ``major.minor``, the intra-op thread count and the device type (the same
  config gives different floating-point histories with 1 and 2 threads).

A refactor that changes no behaviour changes no key. :func:`history_digest` and :func:`state_digest` are the
digests the golden runs pin.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

ENGINE_VERSION = 1
"""Version of the round loop (:mod:`subfl.fl`): client selection, local training loop, evaluation, ledger. Bump it
when any of them computes something different. Learning-rate schedules carry their own versions
(:data:`subfl.fl.training.SCHEDULE_VERSIONS`)."""

DATA_VERSION = 1
"""Version of the data pipeline shared by every dataset: sample caps, test subset, partitioners, local test split."""


def canonical_config(config) -> dict[str, Any]:
    """The config's fields that differ from the dataclass defaults (``scale`` left out), JSON-ready.

    Two configs that run the same experiment have the same canonical form, and a field added later with a default
    leaves every existing canonical form unchanged.
    """
    defaults = type(config)()
    out: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        if f.name == "scale":
            continue
        value, default = getattr(config, f.name), getattr(defaults, f.name)
        if value != default:
            out[f.name] = _jsonable(dict(value) if f.name.endswith("_options") else value)
    return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and math.isfinite(value) and value == int(value) and abs(value) < 2**53:
        return value  # keep 1.0 a float: json writes 1.0, so the text is stable either way
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value)


def run_versions(config) -> dict[str, int]:
    """The versions a run of ``config`` executes: ``engine``, ``data``, ``method:<name>`` (and
    ``method:<name>.<option>`` for each behaviour-changing option it sets away from its default),
    ``model:<name>``, ``dataset:<name>`` and, for a non-constant learning-rate schedule, ``schedule:<name>``."""
    from ..data.datasets import dataset_version
    from ..fl.training import SCHEDULE_VERSIONS
    from ..methods import METHODS
    from ..models import model_spec

    versions = {"engine": ENGINE_VERSION, "data": DATA_VERSION}
    versions.update(METHODS[config.method].behaviour_versions(dict(config.method_options)))
    versions[f"model:{config.model}"] = model_spec(config.model).version
    versions[f"dataset:{config.dataset}"] = dataset_version(config.dataset)
    if config.lr_schedule != "constant":
        versions[f"schedule:{config.lr_schedule}"] = SCHEDULE_VERSIONS[config.lr_schedule]
    return dict(sorted(versions.items()))


def environment_class(device: str = "cpu") -> dict[str, Any]:
    """What of the environment changes a run's floating-point history: torch ``major.minor``, the intra-op thread
    count and the device type."""
    major_minor = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    return {"torch": major_minor, "threads": torch.get_num_threads(), "device": torch.device(device).type}


def run_key(config, environment: Mapping[str, Any] | None = None) -> str:
    """sha256 of (canonical config, versions, environment class) — the identity of a run's result."""
    environment = environment_class(config.device) if environment is None else dict(environment)
    blob = {"config": canonical_config(config), "versions": run_versions(config), "environment": environment}
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()


def history_digest(rows) -> str:
    """sha256 of a history's (round, metric, value, group) rows, values written with ``repr`` (every bit counts)."""
    h = hashlib.sha256()
    for r, m, v, g in rows:
        h.update(f"{int(r)},{m},{float(v)!r},{g}\n".encode())
    return h.hexdigest()


def state_digest(state: Any) -> str:
    """sha256 over a server state's tensors and numbers (names, dtypes, shapes and bytes), walked in a fixed order."""
    h = hashlib.sha256()

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous()
            h.update(f"{prefix}:{t.dtype}:{tuple(t.shape)}:".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        elif isinstance(value, np.ndarray):
            h.update(f"{prefix}:{value.dtype}:{value.shape}:".encode() + np.ascontiguousarray(value).tobytes())
        elif isinstance(value, Mapping):
            for k in sorted(value, key=str):
                walk(f"{prefix}/{k}", value[k])
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(f"{prefix}[{i}]", v)
        else:
            h.update(f"{prefix}={value!r};".encode())

    walk("", state)
    return h.hexdigest()
