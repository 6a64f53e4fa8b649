"""Heterogeneity settings: which keep ratio (width) each client has, statically or re-drawn every round.

Spec strings (used by configs and the CLI):

* ``"1.0"`` or ``"homogeneous"`` — every client at keep ratio 1 (``"0.2"``: every client at 0.2);
* ``"0.2:0.6,0.4:0.4"`` — a mix: 60 % of clients at r = 0.2 and 40 % at r = 0.4 (PriSM Table 3);
* ``"uniform:0.25,0.5,0.75,1.0"`` — equal shares of each level (FLANC's four groups);
* a ``"dynamic:"`` prefix re-draws every client's level each round with the same fractions
  (``"dynamic:uniform:0.25,0.5,0.75,1.0"``).

Static assignment gives exactly ``round(fraction · num_clients)`` clients to each level (largest remainder),
shuffled by a generator derived from the seed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..data.partition import largest_remainder_counts
from .rng import numpy_rng
from .types import ClientProfile


@dataclass(frozen=True)
class Heterogeneity:
    """Keep-ratio levels, the fraction of clients at each, and whether levels are re-drawn per round."""

    levels: tuple[float, ...] = (1.0,)
    fractions: tuple[float, ...] = (1.0,)
    dynamic: bool = False

    def __post_init__(self) -> None:
        if len(self.levels) == 0 or len(self.levels) != len(self.fractions):
            raise ValueError(
                f"heterogeneity needs as many fractions as levels, got levels={self.levels}, "
                f"fractions={self.fractions}")
        for level in self.levels:
            if not 0.0 < level <= 1.0:
                raise ValueError(f"keep ratio must be in (0, 1], got {level} in heterogeneity levels {self.levels}")
        if any(not math.isfinite(f) or f < 0 for f in self.fractions) or abs(sum(self.fractions) - 1.0) > 1e-6:
            raise ValueError(f"heterogeneity fractions must be >= 0 and sum to 1, got {self.fractions}")

    @property
    def is_homogeneous(self) -> bool:
        return len(set(self.levels)) == 1

    def _counts(self, num_clients: int) -> np.ndarray:
        return largest_remainder_counts(self.fractions, num_clients)

    def static_levels(self, num_clients: int, seed: int) -> np.ndarray:
        """Keep ratio of every client under static heterogeneity."""
        levels = np.repeat(np.asarray(self.levels, dtype=float), self._counts(num_clients))
        return levels[numpy_rng(seed, "profiles").permutation(num_clients)]

    def profiles(self, num_clients: int, seed: int, round: int) -> list[ClientProfile]:
        """Every client's profile in ``round`` (identical across rounds unless ``dynamic``)."""
        if num_clients < 1:
            raise ValueError(f"num_clients must be >= 1, got {num_clients}")
        if self.dynamic:
            rng = numpy_rng(seed, "profiles", round)
            levels = rng.choice(np.asarray(self.levels, dtype=float), size=num_clients, p=self.fractions)
        else:
            levels = self.static_levels(num_clients, seed)
        return [ClientProfile(client_id=i, keep_ratio=float(r)) for i, r in enumerate(levels)]

    def describe(self) -> str:
        mix = ", ".join(f"{f:.0%} at {lv:g}" for lv, f in zip(self.levels, self.fractions))
        return ("dynamic: " if self.dynamic else "") + mix


def parse_heterogeneity(spec: str) -> Heterogeneity:
    """Parse a heterogeneity spec string (see the module docstring)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"heterogeneity must be a non-empty string such as '1.0', '0.2:0.6,0.4:0.4', "
                         f"'uniform:0.25,0.5,0.75,1.0' or 'dynamic:...', got {spec!r}")
    text = spec.strip()
    dynamic = text.startswith("dynamic:")
    if dynamic:
        text = text[len("dynamic:"):]
    try:
        if text == "homogeneous":
            return Heterogeneity((1.0,), (1.0,), dynamic)
        if text.startswith("uniform:"):
            levels = tuple(float(v) for v in text[len("uniform:"):].split(","))
            return Heterogeneity(levels, tuple(1.0 / len(levels) for _ in levels), dynamic)
        if ":" in text:
            pairs = [item.split(":") for item in text.split(",")]
            return Heterogeneity(tuple(float(a) for a, _ in pairs), tuple(float(b) for _, b in pairs), dynamic)
        return Heterogeneity((float(text),), (1.0,), dynamic)
    except (ValueError, TypeError) as err:
        if "keep ratio" in str(err) or "fractions" in str(err):
            raise ValueError(f"heterogeneity {spec!r}: {err}") from None
        raise ValueError(f"heterogeneity {spec!r} is not a valid spec; accepted: '1.0', 'homogeneous', "
                         f"'0.2:0.6,0.4:0.4', 'uniform:0.25,0.5,0.75,1.0', optionally prefixed by 'dynamic:'") from None
