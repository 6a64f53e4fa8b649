"""Numbers computed from a finished run's final weights, recorded with the run so that its weights need not be kept.

Some pages score a run's final model again after the run: edited (:mod:`subfl_book.submodel_eval`,
:mod:`subfl_book.prism_memory_eval`) or with its BatchNorm statistics recomputed
(:func:`subfl_book.analysis.bn_recalibrated_accuracy`). Keeping the weights of every such run in the repository's
store costs up to 9 MB a run (the FedAvg CNN at full width), so a page instead *requests* the analyses it will read
when it asks for the runs (``run_seeds(..., analyses=[("top_terms_accuracy", {"keep": 0.2})])``). The run is then
recorded with each analysis' value, computed from its final weights right after it finished
(:func:`subfl_book.store.run_experiment`, ``scripts/compute_runs.py``), and the page reads the value with
:func:`final_analysis`. A record that lacks a requested analysis (and has no kept weights to compute it from) counts
as missing: the run is computed again.

Each analysis has a ``version``, recorded with its value; bump it whenever the analysis computes something different,
and a recorded value of another version is no longer read. The registry :data:`ANALYSES` names what can be requested.
"""
from __future__ import annotations

import json
import numbers
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

Request = tuple[str, Mapping[str, Any]]
"""``(analysis name, its parameters)``, e.g. ``("top_terms_accuracy", {"keep": 0.2})``."""


@dataclass(frozen=True)
class Analysis:
    """One analysis of a finished run: ``function(result, data_root=..., **params)`` returns a flat dict of numbers."""

    name: str
    function: Callable[..., dict[str, float]]
    version: int = 1


def _top_terms(result, data_root=None, *, keep: float) -> dict[str, float]:
    from .submodel_eval import top_terms_accuracy

    return top_terms_accuracy(result, keep, data_root)


def _leading_outputs(result, data_root=None, *, output_keep: float | None = None) -> dict[str, float]:
    from .prism_memory_eval import leading_outputs_accuracy

    return leading_outputs_accuracy(result, output_keep, data_root)


def _expected_outputs(result, data_root=None, *, output_keep: float | None = None) -> dict[str, float]:
    from .prism_memory_eval import expected_outputs_accuracy

    return expected_outputs_accuracy(result, output_keep, data_root)


def _bn_recalibrated(result, data_root=None) -> dict[str, float]:
    from .analysis import bn_recalibrated_accuracy

    return bn_recalibrated_accuracy(result, data_root)


def _final_spectra(result, data_root=None) -> dict[str, float]:
    """The singular values of each decomposed layer of a spectral run's final global model, as ``"<layer>[<i>]"``
    (read back with :func:`spectra_from_value`)."""
    import torch

    factors = result.state().get("factors") or {}
    if not factors:
        raise ValueError(f"run {result.config.label()} keeps no decomposed layers (not a spectral method's run)")
    return {f"{layer}[{i}]": value for layer, f in factors.items()
            for i, value in enumerate(torch.as_tensor(f["singular_values"]).to(torch.float64).tolist())}


def spectra_from_value(value: Mapping[str, float]) -> dict[str, list[float]]:
    """``{layer: singular values in order}`` from a ``final_spectra`` value."""
    import re

    out: dict[str, dict[int, float]] = {}
    for name, v in value.items():
        match = re.fullmatch(r"(.+)\[(\d+)\]", name)
        if match is None:
            raise ValueError(f"{name!r} is not a final_spectra entry (expected '<layer>[<index>]')")
        out.setdefault(match.group(1), {})[int(match.group(2))] = float(v)
    return {layer: [values[i] for i in sorted(values)] for layer, values in out.items()}


ANALYSES: dict[str, Analysis] = {a.name: a for a in (
    Analysis("top_terms_accuracy", _top_terms),
    Analysis("leading_outputs_accuracy", _leading_outputs),
    Analysis("expected_outputs_accuracy", _expected_outputs),
    Analysis("bn_recalibrated_accuracy", _bn_recalibrated),
    Analysis("final_spectra", _final_spectra),
)}
"""The analyses a page can request, by name."""


def _numbers(value: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (float(v) if isinstance(v, numbers.Real) and not isinstance(v, bool) else v) for k, v in value.items()}


class MissingAnalysisError(LookupError):
    """A run's record holds no value of the asked analysis and the store keeps no weights to compute it from."""


def _check_params(name: str, params: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(params, Mapping):
        raise ValueError(f"the parameters of analysis {name!r} must be a mapping, got {params!r}")
    out = {}
    for key, value in params.items():
        if value is None:
            continue   # an absent parameter and None are the same request (each function's default is None)
        if isinstance(value, bool) or not isinstance(value, (numbers.Real, str)):
            raise ValueError(f"parameter {key}={value!r} of analysis {name!r} is not valid; accepted: a number or "
                             f"a string (recorded as JSON)")
        out[str(key)] = float(value) if isinstance(value, numbers.Real) else value
    return out


def request_key(name: str, params: Mapping[str, Any] | None = None) -> str:
    """The name a request's value is recorded under: ``name`` and its parameters as sorted JSON (``None``-valued
    parameters dropped, numbers as floats): ``top_terms_accuracy{"keep": 0.2}``. Unknown names raise ``ValueError``."""
    if name not in ANALYSES:
        raise ValueError(f"analysis {name!r} is not known; accepted: {', '.join(sorted(ANALYSES))}")
    return name + json.dumps(_check_params(name, params or {}), sort_keys=True)


def normalise(requests: Iterable[Request] | None) -> list[tuple[str, dict[str, Any]]]:
    """``requests`` checked and without repeats, in order: each ``(name, params)`` as :func:`request_key` reads it."""
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    for request in requests or ():
        if not (isinstance(request, (tuple, list)) and len(request) == 2):
            raise ValueError(f"an analysis request must be (name, params), got {request!r}")
        name, params = request
        out.setdefault(request_key(name, params), (name, _check_params(name, params or {})))
    return list(out.values())


def _current_entry(analyses: Mapping[str, Any] | None, name: str, params: Mapping[str, Any] | None
                   ) -> dict[str, Any] | None:
    entry = (analyses or {}).get(request_key(name, params))
    return entry if entry is not None and entry.get("version") == ANALYSES[name].version else None


def recorded_value(analyses: Mapping[str, Any] | None, name: str, params: Mapping[str, Any] | None = None
                   ) -> dict[str, float] | None:
    """The value a record's ``analyses`` hold for the request; ``None`` when absent, of another version, or recorded
    for a diverged run (which has no value)."""
    entry = _current_entry(analyses, name, params)
    return None if entry is None or entry["value"] is None else dict(entry["value"])


def has_all(analyses: Mapping[str, Any] | None, requests: Iterable[Request] | None) -> bool:
    """Whether a record's ``analyses`` hold a current entry of every request (a diverged run's entries have no
    value: there is nothing to compute again)."""
    return all(_current_entry(analyses, name, params) is not None for name, params in normalise(requests))


def compute(result, requests: Iterable[Request] | None, data_root=None) -> dict[str, dict[str, Any]]:
    """Each request computed from ``result``'s final weights, as a record holds it:
    ``{request_key: {"analysis", "params", "version", "value"}}``. A diverged run's entries have ``value`` None:
    its final weights are not a model (the analyses raise on it), and the entry says so instead of leaving the
    request open (which would have the run computed again every time it is asked for)."""
    diverged = bool(getattr(result, "diverged", False))
    return {request_key(name, params): {"analysis": name, "params": params, "version": ANALYSES[name].version,
                                        "value": None if diverged else
                                        _numbers(ANALYSES[name].function(result, data_root, **params))}
            for name, params in normalise(requests)}


def final_analysis(result, name: str, *, data_root=None, **params: Any) -> dict[str, float]:
    """The value of analysis ``name`` with ``params`` for a finished run: as recorded with it, else computed from its
    kept final weights. Raises :class:`MissingAnalysisError` when neither is there (request the analysis with the
    run: ``run_seeds(config, seeds, analyses=[(name, params)])``)."""
    entry = _current_entry(getattr(result, "analyses", None), name, params)
    if entry is not None:
        if entry["value"] is None:
            raise ValueError(f"run {result.config.label()} diverged; its final model is not a result, so it has no "
                             f"{request_key(name, params)}")
        return dict(entry["value"])
    if not result.has_state():
        raise MissingAnalysisError(
            f"run {result.config.label()} has no recorded {request_key(name, params)} and no kept weights; request "
            f"it with the run (run_seeds(..., analyses=[({name!r}, {dict(params)!r})]))")
    return _numbers(ANALYSES[name].function(result, data_root, **_check_params(name, params)))


__all__ = ["ANALYSES", "Analysis", "MissingAnalysisError", "Request", "compute", "final_analysis", "has_all",
           "normalise", "recorded_value", "request_key", "spectra_from_value"]
