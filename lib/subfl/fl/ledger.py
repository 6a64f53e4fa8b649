"""The communication ledger: one row per tensor that crosses the wire.

Every figure about communication is computed from these rows, and they double as an audit of exactly
what left each client (e.g. that a FedP3 client uploaded only its assigned layers).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch

LEDGER_COLUMNS = ("round", "client", "direction", "name", "shape", "dtype", "bytes", "n_samples")
CONFIG_ROW_NAME = "__config__"


def tensor_bytes(tensor: torch.Tensor) -> int:
    """Bytes of a tensor's elements as sent on the wire (numel × element size; sparse layouts are not used)."""
    return int(tensor.numel() * tensor.element_size())


@dataclass
class Ledger:
    """Rows (round, client, direction, name, shape, dtype, bytes, n_samples); direction is ``"down"`` or ``"up"``.

    The JSON config that travels with a payload is recorded as one row named ``__config__`` with the
    length of its UTF-8 JSON encoding. ``n_samples`` is, on every row of an upload, the sample count the client
    reports with it — the weight the server's aggregation gives the update — and 0 on download rows. Like a
    tensor's shape and dtype it is metadata of the message: ``bytes`` counts tensor elements and the JSON config.
    """

    rows: list[tuple] = field(default_factory=list)

    def record(self, round: int, client: int, direction: str, tensors: dict[str, torch.Tensor],
               config: dict[str, Any] | None = None, n_samples: int = 0) -> int:
        """Record one payload (an upload with the ``n_samples`` it reports); returns its total bytes."""
        if direction not in ("down", "up"):
            raise ValueError(f"direction must be 'down' or 'up', got {direction!r}")
        if isinstance(n_samples, bool) or not isinstance(n_samples, int) or n_samples < 0:
            raise ValueError(f"n_samples must be an integer >= 0, got {n_samples!r}")
        if direction == "down" and n_samples:
            raise ValueError(f"n_samples is reported with uploads only, got {n_samples} for a download")
        total = 0
        for name, tensor in tensors.items():
            nbytes = tensor_bytes(tensor)
            shape = "x".join(str(s) for s in tensor.shape)
            self.rows.append((round, client, direction, name, shape, str(tensor.dtype).replace("torch.", ""), nbytes,
                              n_samples))
            total += nbytes
        if config:
            nbytes = len(json.dumps(config, sort_keys=True).encode("utf-8"))
            self.rows.append((round, client, direction, CONFIG_ROW_NAME, "", "json", nbytes, n_samples))
            total += nbytes
        return total

    def to_frame(self) -> pd.DataFrame:
        # rows of a checkpoint written before n_samples was recorded have 7 fields: their n_samples is unknown
        rows = [row if len(row) == len(LEDGER_COLUMNS) else (*row, -1) for row in self.rows]
        return pd.DataFrame(rows, columns=list(LEDGER_COLUMNS))

    def total_bytes(self, direction: str) -> int:
        return int(sum(r[6] for r in self.rows if r[2] == direction))
