"""Shared by the Flower tests: the cases (the golden runs' configs of tests/golden) and how runs are compared."""
from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "golden"))
from cases import CASES, case_config, golden_mismatch, recorded  # noqa: E402

from subfl.experiments.provenance import (history_digest, history_summary, state_digest,  # noqa: E402
                                         state_summary)
from subfl.fl.history import read_history  # noqa: E402

FLOWER_CASES = ("fedavg", "prism", "opu3", "flanc", "caff")
"""One golden case per method family the issue names: FedAvg, PriSM, a FedP3 variant (OPU3), FLANC and CAFF (on the
cheapest data each accepts: digits + MLP, CAFF a tiny GPT on Shakespeare tokens, pretrained='none')."""


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def digests(folder: Path) -> dict[str, Any]:
    """The history / state digests and summaries of a run folder (those of goldens.json) and the sha256 of its
    ledger.csv and history.csv."""
    rows = list(read_history(folder / "history.csv").itertuples(index=False, name=None))
    state = torch.load(folder / "state.pt", map_location="cpu", weights_only=False)
    return {"history": history_digest(rows), "state": state_digest(state), "ledger": sha256(folder / "ledger.csv"),
            "history.csv": sha256(folder / "history.csv"),
            "summary": {"history": history_summary(rows), "state": state_summary(state)}}


__all__ = ["CASES", "FLOWER_CASES", "case_config", "digests", "golden_mismatch", "recorded", "sha256"]
