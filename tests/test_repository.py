"""Repository hygiene: no dataset file is tracked; the manifest in data/ is the package's manifest."""
import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA_SUFFIXES = (".npz", ".gz", ".jsonl", "-ubyte", ".pt", ".npy", ".tar")


def test_no_dataset_file_is_tracked():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    tracked = [f for f in files if f.endswith(DATA_SUFFIXES)]
    assert tracked == []


def test_data_manifest_is_the_package_manifest():
    manifest = json.loads((ROOT / "data" / "manifest.json").read_text())
    package = json.loads((ROOT / "lib" / "subfl" / "data" / "manifest.json").read_text())
    assert manifest == package
