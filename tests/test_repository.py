"""Repository hygiene: no dataset file is tracked; the manifest in data/ is the package's manifest; the library's
imports point away from the book and form no cycle."""
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA_SUFFIXES = (".npz", ".gz", ".jsonl", "-ubyte", ".pt", ".npy", ".tar")


STORES = ("store/", "tests/nbval-store/")
"""The run stores: the book's, and the ci-scale runs of the notebook checks (conftest.py)."""


def test_no_dataset_file_is_tracked():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    tracked = [f for f in files if f.endswith(DATA_SUFFIXES) and not f.startswith(STORES)]
    assert tracked == []
    for prefix in STORES:
        _check_store_files([f.removeprefix(prefix) for f in files if f.startswith(prefix) and f != prefix + "README.md"])


def _check_store_files(files: list[str]) -> None:
    """A run store holds run records and kept weights, each named by its run key, and pretrained models, each a
    folder named as the library's cache names it (<kind>-l<layers>-<24 hex digits of its key>), and timings measured
    once (subfl_book.measured: measured/<name>-<24 hex digits of its key>.json). ``files``: relative to the store."""
    stored = [f for f in files if not f.startswith(("pretrained/", "measured/"))]
    assert all(f.endswith((".json.gz", ".state.pt")) and len(Path(f).name.split(".")[0]) == 64 for f in stored), stored
    measured = [Path(f) for f in files if f.startswith("measured/")]
    assert all(len(p.parts) == 2 and re.fullmatch(r"[a-z0-9_-]+-[0-9a-f]{24}\.json", p.name) for p in measured), measured
    pretrained = [Path(f) for f in files if f.startswith("pretrained/")]
    assert all(len(p.parts) == 3 and p.name in ("weights.pt", "summary.json")
               and re.fullmatch(r"(lm|vit)-l\d+-[0-9a-f]{24}", p.parts[1]) for p in pretrained), pretrained


def test_data_manifest_is_the_package_manifest():
    manifest = json.loads((ROOT / "data" / "manifest.json").read_text())
    package = json.loads((ROOT / "lib" / "subfl" / "data" / "manifest.json").read_text())
    assert manifest == package


def _subfl_package_imports() -> dict[str, set[str]]:
    """``{subpackage: the other subfl subpackages (or top-level modules) it imports}``, lazy imports included."""
    import ast
    lib = ROOT / "lib"
    edges: dict[str, set[str]] = {}
    for path in (lib / "subfl").rglob("*.py"):
        module = ".".join(path.relative_to(lib).with_suffix("").parts)
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        module = module.removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level:
                parts = package.removesuffix(".__init__").split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                targets = [f"{base}.{node.module}" if node.module else base]
            elif isinstance(node, ast.ImportFrom):
                targets = [node.module or ""]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for target in targets:
                assert not target.startswith("subfl_book"), f"{module} imports the book package ({target})"
                if target.startswith("subfl."):
                    a, b = module.split(".")[1], target.split(".")[1]
                    if a != b:
                        edges.setdefault(a, set()).add(b)
    return edges


def test_the_library_never_imports_the_book_and_its_packages_form_no_cycle():
    edges = _subfl_package_imports()
    assert {"methods", "fl"} <= set(edges)
    assert "methods" not in edges["fl"], "the engine must not import the methods (the contract lives in fl)"
    assert "methods" not in edges.get("costs", set()) and "experiments" not in edges.get("data", set())

    def reachable(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in edges.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    cycles = sorted(p for p in edges if p in reachable(p))
    assert not cycles, f"import cycles through {cycles}: {edges}"
