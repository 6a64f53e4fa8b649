"""Shared test settings: quiet progress bars, an isolated result cache, the data root."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TQDM_DISABLE", "1")


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SUBFL_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))


def data_root() -> Path | None:
    value = os.environ.get("SUBFL_DATA_ROOT")
    return Path(value) if value else None
