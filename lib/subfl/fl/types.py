"""What crosses the wire between server and clients, and what describes a client.

A payload is a dict of named tensors plus a small JSON-able config — nothing else — so that the ledger
counts every byte and a deployment on real clients (e.g. Flower) is a thin adapter.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class ClientProfile:
    """A client's resources and group for one round.

    ``keep_ratio`` is the fraction of the model the client can train (width p of FLANC/HeteroFL, keep ratio r
    of PriSM / spectral sharding); the budgets are optional absolute limits used by methods that choose a
    configuration from them (CAFF, FedHM). ``group`` names the client's heterogeneity group in results.
    """

    client_id: int
    keep_ratio: float = 1.0
    group: str = ""
    memory_mb: float | None = None
    upload_mb: float | None = None
    gflops: float | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.keep_ratio <= 1.0:
            raise ValueError(f"keep_ratio must be in (0, 1], got {self.keep_ratio} (client {self.client_id})")
        for name in ("memory_mb", "upload_mb", "gflops"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be positive or None, got {value} (client {self.client_id})")
        if not self.group:
            object.__setattr__(self, "group", f"{self.keep_ratio:g}")


def _check_payload(tensors: dict[str, torch.Tensor], config: dict[str, Any], what: str) -> None:
    for name, value in tensors.items():
        if not isinstance(name, str) or not isinstance(value, torch.Tensor):
            raise TypeError(f"{what} tensors must map str -> torch.Tensor, got {name!r}: {type(value).__name__}")
    try:
        json.dumps(config)
    except TypeError as err:
        raise TypeError(f"{what} config must be JSON-serialisable: {err}") from None


@dataclass
class Task:
    """What the server sends one client in one round: named tensors and a JSON-able config."""

    client_id: int
    round: int
    tensors: dict[str, torch.Tensor]
    config: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_payload(self.tensors, self.config, "Task")


@dataclass
class Update:
    """What a client sends back: named tensors, its number of training samples and JSON-able stats."""

    client_id: int
    tensors: dict[str, torch.Tensor]
    n_samples: int
    stats: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_payload(self.tensors, self.stats, "Update")
        if self.n_samples < 0:
            raise ValueError(f"n_samples must be >= 0, got {self.n_samples}")
