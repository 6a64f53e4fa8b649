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
digests the golden runs pin on the CPU they were recorded on; :func:`history_summary`, :func:`state_summary` and
:func:`summary_deviation` compare runs made on different CPUs, which end a few ulps apart.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Iterator, Mapping
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


def library_versions() -> dict[str, int]:
    """Every version the library declares: ``engine``, ``data``, ``pretraining``, ``method:<name>`` and
    ``method:<name>.<option>`` for every registered method and behaviour-changing option, ``model:<name>``,
    ``dataset:<name>`` and ``schedule:<name>``. What code outside a run computes with the versioned parts of the
    library (a page's live numerical check of a sampler, say) depends on these, not on their source text."""
    from ..data.datasets import DATASETS, dataset_version
    from ..fl.training import SCHEDULE_VERSIONS
    from ..methods import METHODS
    from ..models import MODELS, model_spec
    from ..pretraining import PRETRAINING_VERSION

    versions = {"engine": ENGINE_VERSION, "data": DATA_VERSION, "pretraining": PRETRAINING_VERSION}
    for name, cls in METHODS.items():
        versions[f"method:{name}"] = cls.version
        versions.update({f"method:{name}.{option}": v for option, v in cls.option_versions.items()})
    versions.update({f"model:{name}": model_spec(name).version for name in MODELS})
    versions.update({f"dataset:{name}": dataset_version(name) for name in DATASETS})
    versions.update({f"schedule:{name}": v for name, v in SCHEDULE_VERSIONS.items()})
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
    for name, value in _leaves("", state):
        if isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous()
            h.update(f"{name}:{t.dtype}:{tuple(t.shape)}:".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        elif isinstance(value, np.ndarray):
            h.update(f"{name}:{value.dtype}:{value.shape}:".encode() + np.ascontiguousarray(value).tobytes())
        else:
            h.update(f"{name}={value!r};".encode())
    return h.hexdigest()


SUMMARY_PROBES = 2
"""Random ±1 directions each float tensor of a state is projected on by :func:`state_summary`."""


def _leaves(prefix: str, value: Any) -> Iterator[tuple[str, Any]]:
    """``(name, leaf)`` of a nested state in a fixed order: mappings by ``str`` of their keys (``/key``), sequences
    by position (``[i]``); tensors, arrays and everything else are leaves."""
    if isinstance(value, Mapping):
        for k in sorted(value, key=str):
            yield from _leaves(f"{prefix}/{k}", value[k])
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _leaves(f"{prefix}[{i}]", v)
    else:
        yield prefix, value


def state_summary(state: Any) -> dict[str, Any]:
    """A machine-independent description of a server state, for comparing runs made on different CPUs.

    :func:`state_digest` changes with the last bit of any weight, and the same run computed on another CPU
    (AVX2 against AVX-512 kernels, another BLAS code path) ends a few ulps away. Per leaf (same names as
    :func:`state_digest`'s walk): a floating-point tensor becomes ``[numel, ‖x‖, ⟨x, r_1⟩/√n, …]`` in float64,
    with ``r_k`` fixed ±1 vectors drawn from numpy's PCG64 seeded by ``(k, numel)`` (the same on every machine);
    a float becomes ``[1, |v|, v]``; anything else its ``repr`` (compared exactly by :func:`summary_deviation`).
    """
    out: dict[str, Any] = {}
    for name, value in _leaves("", state):
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            x = value.detach().cpu().double().reshape(-1)
            n = x.numel()
            probes = [float(x @ torch.from_numpy(
                np.random.Generator(np.random.PCG64([k, n])).integers(0, 2, n).astype(np.float64) * 2 - 1)) / math.sqrt(n)
                if n else 0.0 for k in range(SUMMARY_PROBES)]
            out[name] = [n, float(x.norm())] + probes
        elif isinstance(value, float):
            out[name] = [1, abs(value), value]
        elif isinstance(value, torch.Tensor):
            out[name] = repr(value.tolist())
        else:
            out[name] = repr(value)
    return out


def history_summary(rows) -> dict[str, Any]:
    """:func:`state_summary` of a history's ``(round, metric, value, group)`` rows, one leaf per row
    (``"<round>/<metric>/<group>"``)."""
    return state_summary({f"{int(r)}/{m}/{g}": float(v) for r, m, v, g in rows})


def summary_deviation(recorded: Mapping[str, Any], now: Mapping[str, Any],
                      floor: float = 1e-2) -> tuple[float, str]:
    """The largest relative deviation between two :func:`state_summary` (or :func:`history_summary`) results, and
    the leaf it is at.

    For a float leaf ``[n, ‖x‖, p_1, …]`` it is the larger of ``|Δ‖x‖| / (‖x‖ + floor·√n)`` and
    ``max_k |Δp_k| / (‖x‖/√n + floor)`` (a probe is of the size of one entry, ``‖x‖/√n``): a relative change of
    every entry by ε deviates by about ε. ``floor`` keeps a tensor that is numerically zero (a key bias, which
    attention is invariant to) from dividing by nothing. A leaf missing on one side, of another size or type, of
    another exact value, or not finite on one side only deviates by ``inf``.
    """
    worst, where = 0.0, ""
    for name in sorted(set(recorded) | set(now)):
        a, b = recorded.get(name), now.get(name)
        if isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and a[0] == b[0]:
            root_n = math.sqrt(max(int(a[0]), 1))
            gaps = [abs(a[1] - b[1]) / (a[1] + floor * root_n)]
            gaps += [abs(x - y) / (a[1] / root_n + floor) for x, y in zip(a[2:], b[2:])]
            gap = max(gaps)
            if math.isnan(gap):
                gap = 0.0 if repr(a) == repr(b) else math.inf
        else:
            gap = 0.0 if a == b and a is not None else math.inf
        if gap > worst or not where:
            worst, where = max(worst, gap), name
    return worst, where
