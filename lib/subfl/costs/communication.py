"""Bytes on the wire: of a payload, and totals of the engine's ledger.

The ledger is a :class:`pandas.DataFrame` with one row per tensor sent, and columns ``round``, ``client``,
``direction`` (``"down"``: server → client, ``"up"``: client → server), ``name``, ``shape``, ``dtype`` and
``bytes``.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd
import torch

LEDGER_COLUMNS: tuple[str, ...] = ("round", "client", "direction", "name", "shape", "dtype", "bytes")
"""Columns of the engine's ledger."""

DIRECTIONS: tuple[str, ...] = ("down", "up")


def bytes_of(tensors: Mapping[str, torch.Tensor]) -> int:
    """Bytes of a payload of named tensors: ``Σ numel · element_size`` (the dense size on the wire)."""
    total = 0
    for name, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"payload entry {name!r} is a {type(tensor).__name__}, expected a torch.Tensor")
        total += tensor.numel() * tensor.element_size()
    return int(total)


def _check_ledger(ledger: pd.DataFrame, needed: Sequence[str]) -> None:
    if not isinstance(ledger, pd.DataFrame):
        raise TypeError(f"ledger must be a pandas.DataFrame, got {type(ledger).__name__}")
    missing = [c for c in needed if c not in ledger.columns]
    if missing:
        raise ValueError(f"ledger lacks column(s) {missing}; a ledger has columns {list(LEDGER_COLUMNS)}")


def ledger_totals(ledger: pd.DataFrame, by: Sequence[str] = ("round", "direction")) -> pd.DataFrame:
    """Total ``bytes`` of ``ledger`` grouped by the columns ``by``: a DataFrame with columns ``[*by, "bytes"]``."""
    if isinstance(by, str):
        by = (by,)
    by = list(by)
    for column in by:
        if column not in LEDGER_COLUMNS:
            raise ValueError(f"by={column!r} is not a ledger column; accepted values: {list(LEDGER_COLUMNS)}")
    _check_ledger(ledger, [*by, "bytes"])
    if not by:
        return pd.DataFrame({"bytes": [int(ledger["bytes"].sum())]})
    totals = ledger.groupby(by, sort=True, observed=True)["bytes"].sum().reset_index()
    totals["bytes"] = totals["bytes"].astype("int64")
    return totals


def _direction_bytes(ledger: pd.DataFrame, direction: str, client, round) -> int:
    needed = ["direction", "bytes"]
    needed += ["client"] if client is not None else []
    needed += ["round"] if round is not None else []
    _check_ledger(ledger, needed)
    mask = ledger["direction"] == direction
    if client is not None:
        mask &= ledger["client"] == client
    if round is not None:
        mask &= ledger["round"] == round
    return int(ledger.loc[mask, "bytes"].sum())


def upload_bytes(ledger: pd.DataFrame, client=None, round=None) -> int:
    """Bytes sent client → server (``direction == "up"``), optionally for one ``client`` and/or ``round``."""
    return _direction_bytes(ledger, "up", client, round)


def download_bytes(ledger: pd.DataFrame, client=None, round=None) -> int:
    """Bytes sent server → client (``direction == "down"``), optionally for one ``client`` and/or ``round``."""
    return _direction_bytes(ledger, "down", client, round)
