"""Shared test settings: quiet progress bars, an isolated run cache, run store and work folder, the data root."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """No test reads or writes this machine's run cache or the repository's run store."""
    monkeypatch.setenv("SUBFL_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    monkeypatch.setenv("SUBFL_ARTIFACTS_DIR", str(tmp_path_factory.mktemp("artifacts")))
    monkeypatch.setenv("SUBFL_STORE_DIR", str(tmp_path_factory.mktemp("store")))
    monkeypatch.setenv("SUBFL_WORK_DIR", str(tmp_path_factory.mktemp("work")))


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
