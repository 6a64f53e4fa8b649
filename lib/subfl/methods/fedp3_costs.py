"""What a FedP3 client deploys and uploads: exact counts from the architecture, and an audit of the ledger.

FedP3 (Yi, Gazagnadou, Richtárik & Lyu, "FedP3: Federated Personalized and Privacy-friendly Network Pruning
under Model Heterogeneity", ICLR 2024, Algorithm 1) sends every client a globally pruned model; the client
trains the final fully-connected layer (FFC) and ``k`` of the other layers and uploads only those. The paper
states the saving of its variants by layer count (LowerB, OPU2 and OPU3 upload 2, 3 and 4 of the five layers of
its CNN, i.e. 60 %, 40 % and 20 % less than FedAvg); what a device pays is bytes, and layers differ in size by
orders of magnitude. This module computes both exactly:

* :func:`unit_sizes` — parameters and bytes of every assignable unit of a model, in the order and grouping of
  :func:`subfl.methods.fedp3.layer_units` (the FFC last);
* :func:`subset_distribution` — the exact distribution (fractions) of the summed size of a uniformly drawn
  set of ``k`` units, ``k`` itself drawn uniformly from a set (FedP3's step 1), by enumerating the subsets;
* :func:`upload_table` — expected upload per variant: by layer count, by parameters and by bytes;
* :func:`pruned_tensor_bytes`, :func:`unit_wire_bytes` and :func:`deployed_table` — what the server sends
  under global pruning ratio P (the wire format of :mod:`subfl.methods.fedp3`: kept values plus a bit mask or
  an index list), and how many parameters the deployed model keeps;
* :func:`upload_audit` — per (round, client) of a run's ledger: which units went up, whether they are whole
  units, whether the FFC is among them and whether they are exactly the units that came down unpruned;
* :func:`layer_ratio_matches` — an exhaustive search of ratios of summed layer sizes, to test which layer
  combinations a reported ratio could come from.

The method's own code is not used to compute the expected sizes (only its definition of a unit), so the
comparison with the engine's ledger is an independent check.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction
from typing import Any

import pandas as pd
import torch
from torch import nn

from .fedp3 import FEDP3_PRESETS, GROUPINGS, INDEX_SUFFIX, MASK_SUFFIX, layer_units

PAPER_LAYER_SAVINGS: dict[str, float] = {"lowerb": 0.6, "opu2": 0.4, "opu3": 0.2}
"""FedP3's stated communication savings (upload, by layer count, 5-layer CNN) of LowerB / OPU2 / OPU3."""

PAPER_RATIOS: dict[str, float] = {"cifar10": 10815.0, "cifar100": 1522.91, "fmnist": 13749.46, "emnist_l": 30.23}
"""The per-dataset communication figures of FedP3's App. B.5 (Fig. 6). App. B.5 defines them as the relative difference
between the largest and the smallest client in its single-layer scenario (each client trains and uploads the FFC and
one other layer, as in LowerB), i.e. 100 · (largest − smallest) / smallest upload, in percent; Table 4's parameter
counts reproduce all four to their printed digits. Sec. 4.2 quotes the CIFAR-10 figure as an FC2 + FFC client paying
"more than 10,815 times" a Conv1 + FFC client, which reads the percentage as a multiple."""


MAX_SUBSETS = 2_000_000
"""Largest number of subsets :func:`subset_distribution` enumerates by default."""


# ----- checking ---------------------------------------------------------------------------------------------
def check_layers(layers: Any) -> tuple[int, ...]:
    """``layers`` as a sorted tuple of distinct ints >= 0 (an int or a non-empty collection of ints).

    Raises ``ValueError`` naming ``layers`` otherwise.
    """
    items = [layers] if isinstance(layers, int) and not isinstance(layers, bool) else layers
    if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
        raise ValueError(f"layers must be an int >= 0 or a non-empty collection of ints >= 0, got {layers!r}")
    items = list(items)
    if not items or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in items) \
            or len(set(items)) != len(items):
        raise ValueError(f"layers must be an int >= 0 or a non-empty collection of distinct ints >= 0, "
                         f"got {layers!r}")
    return tuple(sorted(items))


def check_keep(keep: Any) -> float:
    """The global pruning ratio P (fraction of entries kept) as a float in (0, 1]; ``ValueError`` otherwise."""
    if isinstance(keep, bool) or not isinstance(keep, (int, float)) or not 0.0 < float(keep) <= 1.0:
        raise ValueError(f"keep must be a number in (0, 1] (the fraction of entries kept), got {keep!r}")
    return float(keep)


def _check_grouping(grouping: str) -> str:
    if grouping not in GROUPINGS:
        raise ValueError(f"grouping must be one of {GROUPINGS}, got {grouping!r}")
    return grouping


# ----- sizes of the units -------------------------------------------------------------------------------------
def _prunable(name: str, tensor: torch.Tensor, params: set[str]) -> bool:
    """What FedP3's global pruning touches: floating-point parameters of rank >= 2 (kernels, weight matrices)."""
    return name in params and tensor.is_floating_point() and tensor.dim() >= 2


def _units_and_state(model: nn.Module, grouping: str):
    """``(units with the FFC last, the FFC, the state dict, the parameter names)`` of ``model``."""
    _check_grouping(grouping)
    units, final = layer_units(model, grouping)
    return [*units, final], final, model.state_dict(), {n for n, _ in model.named_parameters()}


def unit_sizes(model: nn.Module, grouping: str = "layer") -> pd.DataFrame:
    """One row per FedP3 unit of ``model`` (assignable units in order, then the FFC).

    Columns: ``unit``, ``tensors`` (its state-dict names), ``parameters`` (scalar parameters), ``bytes`` (its
    state-dict entries — parameters and buffers — as uploaded), ``prunable`` (entries of its rank >= 2
    floating-point parameters, what global pruning may zero) and ``final`` (True for the FFC).
    """
    units, final, state, params = _units_and_state(model, grouping)
    rows = []
    for unit in units:
        rows.append({
            "unit": unit.name,
            "tensors": tuple(unit.keys),
            "parameters": int(sum(state[k].numel() for k in unit.keys if k in params)),
            "bytes": int(sum(state[k].numel() * state[k].element_size() for k in unit.keys)),
            "prunable": int(sum(state[k].numel() for k in unit.keys if _prunable(k, state[k], params))),
            "final": unit is final,
        })
    return pd.DataFrame(rows)


# ----- the layer draw -----------------------------------------------------------------------------------------
def subset_distribution(sizes: Sequence[int | float], layers: Any,
                        max_subsets: int = MAX_SUBSETS) -> dict[int | float, Fraction]:
    """Exact distribution of ``Σ_{i∈S} sizes[i]`` for FedP3's draw of the trained units ``S``.

    ``k`` is drawn uniformly from ``layers`` (clamped to ``len(sizes)``, as :meth:`FedP3.assign` does), then
    ``S`` uniformly among the ``C(L, k)`` subsets of size ``k``. Every subset is enumerated, so the result is
    exact: ``{sum: probability}`` with :class:`fractions.Fraction` probabilities summing to 1.

    Raises ``ValueError`` for bad ``layers``, negative sizes, or more than ``max_subsets`` subsets to enumerate.
    """
    ks = check_layers(layers)
    sizes = list(sizes)
    if any(isinstance(s, bool) or not isinstance(s, (int, float)) or s < 0 for s in sizes):
        raise ValueError(f"sizes must be numbers >= 0, got {sizes!r}")
    n = len(sizes)
    total_subsets = sum(math.comb(n, min(k, n)) for k in ks)
    if total_subsets > max_subsets:
        raise ValueError(f"layers={list(ks)} over {n} units means {total_subsets} subsets, more than "
                         f"max_subsets={max_subsets}")
    out: dict[int | float, Fraction] = {}
    for k in ks:
        k = min(k, n)
        weight = Fraction(1, len(ks) * math.comb(n, k))
        for subset in itertools.combinations(range(n), k):
            value = sum(sizes[i] for i in subset)
            out[value] = out.get(value, Fraction(0)) + weight
    return dict(sorted(out.items()))


def distribution_moments(distribution: Mapping[int | float, Fraction]) -> dict[str, float]:
    """``mean``, ``std``, ``min`` and ``max`` of a ``{value: probability}`` distribution (exact mean/variance,
    returned as floats)."""
    if not distribution:
        raise ValueError("distribution must not be empty")
    if sum(distribution.values()) != 1:
        raise ValueError(f"distribution probabilities must sum to 1, got {sum(distribution.values())}")
    mean = sum(Fraction(v) * p for v, p in distribution.items())
    var = sum((Fraction(v) - mean) ** 2 * p for v, p in distribution.items())
    return {"mean": float(mean), "std": math.sqrt(var), "min": float(min(distribution)),
            "max": float(max(distribution))}


def expected_upload(sizes: Sequence[int | float], final: int | float, layers: Any) -> dict[str, float]:
    """Upload of one client-round: the FFC (``final``) plus the units drawn from ``sizes`` (see
    :func:`subset_distribution`). Returns ``mean``, ``std``, ``min``, ``max`` and ``fraction`` (mean over the
    whole model, ``final + Σ sizes``)."""
    if isinstance(final, bool) or not isinstance(final, (int, float)) or final < 0:
        raise ValueError(f"final must be a number >= 0 (the FFC's size), got {final!r}")
    moments = distribution_moments(subset_distribution(sizes, layers))
    out = {key: value + (final if key != "std" else 0) for key, value in moments.items()}
    out["fraction"] = out["mean"] / (final + sum(sizes))
    return out


def upload_table(model: nn.Module, variants: Mapping[str, Any] | None = None,
                 grouping: str = "layer") -> pd.DataFrame:
    """Expected upload of one client in one round, per FedP3 variant (default :data:`~subfl.methods.fedp3.FEDP3_PRESETS`: variant → the set ``k`` is drawn from).

    Columns: ``variant``, ``k`` (its set), ``layers_up`` (expected units uploaded, FFC included),
    ``layer_fraction`` (of all units — the paper's measure), ``params_up`` / ``param_fraction``, ``bytes_up``
    (expected), ``bytes_std``, ``bytes_min``, ``bytes_max``, ``byte_fraction``, and ``paper_saving`` (the
    paper's stated saving, NaN where it states none).
    """
    variants = dict(FEDP3_PRESETS if variants is None else variants)
    sizes = unit_sizes(model, grouping)
    others, final = sizes[~sizes.final], sizes[sizes.final].iloc[0]
    n_units = len(sizes)
    rows = []
    for name, layers in variants.items():
        ks = check_layers(layers)
        count = expected_upload([1] * len(others), 1, ks)
        params = expected_upload(others.parameters.tolist(), int(final.parameters), ks)
        nbytes = expected_upload(others.bytes.tolist(), int(final.bytes), ks)
        rows.append({"variant": name, "k": "{" + ", ".join(map(str, ks)) + "}", "layers_up": count["mean"],
                     "layer_fraction": count["mean"] / n_units, "params_up": params["mean"],
                     "param_fraction": params["fraction"], "bytes_up": nbytes["mean"], "bytes_std": nbytes["std"],
                     "bytes_min": nbytes["min"], "bytes_max": nbytes["max"], "byte_fraction": nbytes["fraction"],
                     "paper_saving": PAPER_LAYER_SAVINGS.get(name, float("nan"))})
    return pd.DataFrame(rows)


# ----- what the server sends --------------------------------------------------------------------------------
def pruned_tensor_bytes(numel: int, keep: float, element_size: int = 4) -> int:
    """Bytes on the wire of a tensor of ``numel`` entries globally pruned to ratio ``keep`` by FedP3.

    ``k = max(1, ⌊keep·numel⌋)`` values of ``element_size`` bytes, plus the smaller of the bit-packed mask
    (``⌈numel/8⌉`` bytes) and the int32 index list (``4k`` bytes). ``keep = 1`` sends the tensor dense
    (``element_size·numel``).
    """
    if isinstance(numel, bool) or not isinstance(numel, int) or numel < 1:
        raise ValueError(f"numel must be an int >= 1, got {numel!r}")
    if isinstance(element_size, bool) or not isinstance(element_size, int) or element_size < 1:
        raise ValueError(f"element_size must be an int >= 1, got {element_size!r}")
    keep = check_keep(keep)
    if keep >= 1.0:
        return element_size * numel
    kept = kept_entries(numel, keep)
    return element_size * kept + min((numel + 7) // 8, 4 * kept)


def kept_entries(numel: int, keep: float) -> int:
    """Entries a pruned tensor keeps: ``max(1, ⌊keep·numel⌋)`` (FedP3's per-tensor top-|w| count)."""
    keep = check_keep(keep)
    return max(1, min(int(numel), int(math.floor(keep * int(numel) + 1e-9))))


def unit_wire_bytes(model: nn.Module, keep: float, grouping: str = "layer") -> pd.DataFrame:
    """What each FedP3 unit of ``model`` costs on the way down at global pruning ratio ``keep``.

    One row per unit (FFC last): ``unit``, ``final``, ``dense_bytes`` / ``parameters`` (sent whole, as to a client
    that trains it) and ``pruned_bytes`` / ``kept_parameters`` (sent to a client that does not train it: every
    rank >= 2 weight pruned per :func:`pruned_tensor_bytes`, biases and buffers whole; the FFC, which every
    client trains, is never pruned). A client's download is ``Σ pruned_bytes + Σ_{trained} (dense_bytes −
    pruned_bytes)``.
    """
    keep = check_keep(keep)
    units, final, state, params = _units_and_state(model, grouping)
    rows = []
    for unit in units:
        dense_b = pruned_b = dense_p = kept_p = 0
        for key in unit.keys:
            t = state[key]
            size = t.numel() * t.element_size()
            dense_b += size
            if key in params:
                dense_p += t.numel()
            if keep < 1.0 and unit is not final and _prunable(key, t, params):
                pruned_b += pruned_tensor_bytes(t.numel(), keep, t.element_size())
                kept_p += kept_entries(t.numel(), keep)
            else:
                pruned_b += size
                kept_p += t.numel() if key in params else 0
        rows.append({"unit": unit.name, "final": unit is final, "dense_bytes": dense_b, "pruned_bytes": pruned_b,
                     "parameters": dense_p, "kept_parameters": kept_p})
    return pd.DataFrame(rows)


def deployed_table(model: nn.Module, keeps: Iterable[float] = (1.0, 0.9, 0.7, 0.5),
                   variants: Mapping[str, Any] | None = None, grouping: str = "layer") -> pd.DataFrame:
    """What the server sends one client, per global pruning ratio P in ``keeps`` and FedP3 variant.

    The units the client trains (FFC included) travel dense; in every other unit each rank >= 2 weight keeps its
    ``max(1, ⌊P·n⌋)`` largest entries (values + mask or index list), biases travel whole. Expectations are over
    the layer draw (exact, by enumeration). Columns: ``keep``, ``variant``, ``parameters`` (of the dense model),
    ``kept_parameters`` (expected parameters the deployed model keeps, i.e. at most this many nonzeros),
    ``kept_fraction``, ``bytes_down`` (expected wire bytes, mask/index included), ``bytes_down_min`` /
    ``bytes_down_max`` and ``byte_fraction`` (of the dense model's bytes).
    """
    variants = dict(FEDP3_PRESETS if variants is None else variants)
    _check_grouping(grouping)
    rows = []
    for keep in keeps:
        keep = check_keep(keep)
        wire = unit_wire_bytes(model, keep, grouping)
        others, final = wire[~wire.final], wire[wire.final].iloc[0]
        dense_bytes, dense_params = int(wire.dense_bytes.sum()), int(wire.parameters.sum())
        base_bytes = int(others.pruned_bytes.sum()) + int(final.dense_bytes)
        base_params = int(others.kept_parameters.sum()) + int(final.parameters)
        for name, layers in variants.items():
            extra_b = distribution_moments(subset_distribution(
                (others.dense_bytes - others.pruned_bytes).tolist(), layers))
            extra_p = distribution_moments(subset_distribution(
                (others.parameters - others.kept_parameters).tolist(), layers))
            rows.append({"keep": keep, "variant": name, "parameters": dense_params,
                         "kept_parameters": base_params + extra_p["mean"],
                         "kept_fraction": (base_params + extra_p["mean"]) / dense_params,
                         "bytes_down": base_bytes + extra_b["mean"], "bytes_down_min": base_bytes + extra_b["min"],
                         "bytes_down_max": base_bytes + extra_b["max"],
                         "byte_fraction": (base_bytes + extra_b["mean"]) / dense_bytes})
    return pd.DataFrame(rows)


# ----- the ledger -----------------------------------------------------------------------------------------------
def upload_audit(ledger: pd.DataFrame, model: nn.Module, grouping: str = "layer") -> pd.DataFrame:
    """What every client uploaded in every round of a FedP3 run, checked against what it was sent.

    One row per (round, client) that uploaded. Columns: ``round``, ``client``, ``units_up`` (units whose
    tensors went up, in model order), ``tensors_up`` (their names), ``bytes_up`` and ``bytes_down`` (tensors only,
    the JSON ``__config__`` rows left out), ``ffc_up`` (the FFC is among them), ``whole_units`` (every uploaded unit
    sent all its tensors), ``pruned_down`` (the download of that round held pruned tensors), ``units_dense_down``
    (units whose weights all came down unpruned) and ``up_is_dense_down`` (the uploaded units are exactly those
    — under global pruning the server sends the units it assigned dense, so this ties the upload to the
    assignment; ``None`` when nothing was pruned).

    Raises ``ValueError`` if the ledger names a tensor the model does not have.
    """
    needed = ["round", "client", "direction", "name", "bytes"]
    if not isinstance(ledger, pd.DataFrame) or any(c not in ledger.columns for c in needed):
        raise ValueError(f"ledger must be a DataFrame with columns {needed}")
    _check_grouping(grouping)
    units, final = layer_units(model, grouping)
    order = [u.name for u in [*units, final]]
    unit_of_key = {k: u.name for u in [*units, final] for k in u.keys}
    keys_of_unit = {u.name: set(u.keys) for u in [*units, final]}
    state = model.state_dict()
    params = {n for n, _ in model.named_parameters()}
    prunable_of_unit = {u.name: {k for k in u.keys if _prunable(k, state[k], params)} for u in [*units, final]}
    tensors = ledger[ledger.name != "__config__"]

    def base(name: str) -> str:
        for suffix in (MASK_SUFFIX, INDEX_SUFFIX):
            if name.endswith(suffix):
                return name[: -len(suffix)]
        return name

    unknown = sorted({base(n) for n in tensors.name} - set(unit_of_key))
    if unknown:
        raise ValueError(f"the ledger names tensors the model does not have: {unknown[:5]}")
    sent_down = tensors[tensors.direction == "down"]
    down = {key: set(group.name) for key, group in sent_down.groupby(["round", "client"])}
    down_bytes = sent_down.groupby(["round", "client"]).bytes.sum().to_dict()
    rows = []
    for (rnd, client), group in tensors[tensors.direction == "up"].groupby(["round", "client"]):
        names = list(group.name)
        up_units = [u for u in order if any(unit_of_key[n] == u for n in names)]
        sent = down.get((rnd, client), set())
        pruned_names = {base(n) for n in sent if n != base(n)}
        dense_units = [u for u in order if prunable_of_unit[u] and not (prunable_of_unit[u] & pruned_names)]
        rows.append({
            "round": int(rnd), "client": int(client), "units_up": tuple(up_units), "tensors_up": tuple(names),
            "bytes_up": int(group.bytes.sum()), "bytes_down": int(down_bytes.get((rnd, client), 0)),
            "ffc_up": final.name in up_units,
            "whole_units": all(keys_of_unit[u] <= set(names) for u in up_units),
            "pruned_down": bool(pruned_names), "units_dense_down": tuple(dense_units),
            "up_is_dense_down": (tuple(up_units) == tuple(dense_units)) if pruned_names else None,
        })
    return pd.DataFrame(rows)


# ----- reading reported ratios ----------------------------------------------------------------------------------
def layer_ratio_matches(sizes: Sequence[int], target: float, tolerance: float) -> list[tuple[tuple[int, ...],
                                                                                         tuple[int, ...], float]]:
    """Every ratio ``Σ_{i∈A} sizes[i] / Σ_{j∈B} sizes[j]`` (``A``, ``B`` non-empty subsets of the layers) within
    ``tolerance`` of ``target``: a list of ``(A, B, ratio)``. Used to test whether a reported number can be
    a ratio of layer sizes at all; an empty list rules out that whole family of readings.
    """
    sizes = list(sizes)
    if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
        raise ValueError(f"sizes must be a non-empty list of ints >= 1, got {sizes!r}")
    if len(sizes) > 10:
        raise ValueError(f"sizes has {len(sizes)} layers; at most 10 are searched ((2^10 - 1)^2 pairs)")
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or tolerance < 0:
        raise ValueError(f"tolerance must be a number >= 0, got {tolerance!r}")
    sums = {c: sum(sizes[i] for i in c) for r in range(1, len(sizes) + 1)
            for c in itertools.combinations(range(len(sizes)), r)}
    return [(a, b, sa / sb) for a, sa in sums.items() for b, sb in sums.items() if abs(sa / sb - target) <= tolerance]


__all__ = ["MAX_SUBSETS", "PAPER_LAYER_SAVINGS", "PAPER_RATIOS", "check_keep", "check_layers",
           "deployed_table", "distribution_moments", "expected_upload", "kept_entries", "layer_ratio_matches",
           "pruned_tensor_bytes", "subset_distribution", "unit_sizes", "unit_wire_bytes", "upload_audit",
           "upload_table"]
