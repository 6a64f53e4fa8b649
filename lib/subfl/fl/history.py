"""Tidy per-round results: rows of (round, metric, value, group), saved as CSV."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

HISTORY_COLUMNS = ("round", "metric", "value", "group")


@dataclass
class History:
    """Append-only list of (round, metric, value, group) rows."""

    rows: list[tuple[int, str, float, str]] = field(default_factory=list)

    def add(self, round: int, metric: str, value: float, group: str = "global") -> None:
        self.rows.append((int(round), str(metric), float(value), str(group)))

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows, columns=list(HISTORY_COLUMNS))

    def last(self, metric: str, group: str = "global") -> float:
        """The most recent value of ``metric`` for ``group`` (NaN if never recorded)."""
        for r, m, v, g in reversed(self.rows):
            if m == metric and g == group:
                return v
        return math.nan

    def write_csv(self, path: str | Path) -> None:
        """Write rows with full float precision (``repr``) so equal runs give byte-identical files."""
        with open(path, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(",".join(HISTORY_COLUMNS) + "\n")
            for r, m, v, g in self.rows:
                fh.write(f"{r},{m},{v!r},{g}\n")


def read_history(path: str | Path) -> pd.DataFrame:
    """Read a history.csv written by :meth:`History.write_csv`: ``nan`` in the value column is a float NaN (a loss
    that overflowed), while no other text anywhere is read as missing (a group may be called ``NA``)."""
    return pd.read_csv(path, dtype={"round": int, "metric": str, "value": float, "group": str},
                       keep_default_na=False, na_values={"value": ["nan"]})
