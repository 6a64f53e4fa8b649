"""Shared test settings: quiet progress bars, an isolated result cache, the data root."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("TQDM_DISABLE", "1")


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SUBFL_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))


def data_root() -> Path | None:
    value = os.environ.get("SUBFL_DATA_ROOT")
    return Path(value) if value else None


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tests run tiny models: one torch thread is faster than two on a busy 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
