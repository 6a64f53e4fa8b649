"""The notebook → book pipeline: execute stale notebooks with papermill, record provenance, build the site.

Source notebooks live in ``notebooks/<chapter>/*.ipynb`` (no outputs). Executed copies live in
``book/<chapter>/*.ipynb`` and are what the site renders. Each executed copy records in its metadata
(``metadata.subfl``) the scale, the parameters (seeds included), the library version, the fingerprint of
its inputs (notebook source, parameters, library code, data manifest) and its wall time. A copy is *stale*
when that fingerprint no longer matches; ``subfl book`` re-executes only stale or missing copies.
"""
from __future__ import annotations

import ast
import datetime as _dt
import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import subfl

from .experiments.cache import code_fingerprint, repo_root
from .experiments.presets import SCALES


def project_root() -> Path:
    root = repo_root()
    if root is None:
        raise FileNotFoundError("subfl book needs a checkout of the book's repository (notebooks/, book/, "
                                "_toc.yml); the installed package alone has no notebooks")
    return root


@dataclass(frozen=True)
class NotebookState:
    notebook: str
    state: str  # fresh | stale | missing
    reason: str


def _sources(root: Path, only: str | None = None) -> list[Path]:
    nb_dir = root / "notebooks"
    chapters = sorted(p for p in nb_dir.iterdir() if p.is_dir())
    if only is not None:
        names = [c.name for c in chapters]
        if only not in names:
            raise ValueError(f"only={only!r} is not a chapter; accepted: {', '.join(names)}")
        chapters = [nb_dir / only]
    return [nb for ch in chapters for nb in sorted(ch.glob("*.ipynb"))]


def executed_path(source: Path, root: Path) -> Path:
    return root / "book" / source.parent.name / source.name


def default_parameters(source: Path) -> dict[str, Any]:
    """Literal assignments of the cell tagged ``parameters``."""
    nb = json.loads(source.read_text())
    for cell in nb["cells"]:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            out = {}
            for node in ast.parse("".join(cell["source"])).body:
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    try:
                        out[node.targets[0].id] = ast.literal_eval(node.value)
                    except ValueError:
                        out[node.targets[0].id] = ast.unparse(node.value)
            return out
    raise ValueError(f"notebook {source} has no cell tagged 'parameters' (papermill needs one)")


def _data_manifest_hash() -> str:
    path = Path(subfl.__file__).parent / "data" / "manifest.json"
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else ""


def inputs_fingerprint(source: Path, parameters: dict[str, Any]) -> str:
    """Hash of what an executed copy depends on: cell sources, parameters, library code, data manifest."""
    nb = json.loads(source.read_text())
    cells = [(c["cell_type"], "".join(c["source"])) for c in nb["cells"]]
    blob = json.dumps({"cells": cells, "parameters": parameters}, sort_keys=True, default=str)
    return hashlib.sha256((blob + code_fingerprint() + _data_manifest_hash()).encode()).hexdigest()


def _check_scale(scale: str) -> None:
    if scale not in SCALES:
        raise ValueError(f"scale={scale!r} is not valid; accepted: {', '.join(SCALES)}")


def status(scale: str = "cpu", only: str | None = None, root: Path | None = None) -> list[NotebookState]:
    """Which executed copies are fresh, stale (and why) or missing (``root``: the checkout; default: this one)."""
    _check_scale(scale)
    root = project_root() if root is None else root
    out = []
    for src in _sources(root, only):
        rel = src.relative_to(root).as_posix()
        dst = executed_path(src, root)
        if not dst.exists():
            out.append(NotebookState(rel, "missing", f"no {dst.relative_to(root).as_posix()}"))
            continue
        meta = json.loads(dst.read_text()).get("metadata", {}).get("subfl", {})
        want = inputs_fingerprint(src, {**default_parameters(src), "scale": scale})
        if meta.get("fingerprint") != want:
            reason = ("scale " + str(meta.get("scale")) + " != " + scale) if meta.get("scale") != scale else \
                "notebook, library code or data changed"
            out.append(NotebookState(rel, "stale", reason))
        else:
            out.append(NotebookState(rel, "fresh", f"executed {meta.get('executed_at', '?')}"))
    return out


def execute_notebook(source: Path, scale: str = "cpu", root: Path | None = None) -> Path:
    """Execute one notebook with papermill at ``scale`` and write its executed copy with provenance."""
    import nbformat
    import papermill

    _check_scale(scale)
    root = project_root() if root is None else root
    dst = executed_path(source, root)
    dst.parent.mkdir(parents=True, exist_ok=True)
    parameters = {**default_parameters(source), "scale": scale}
    os.environ.setdefault("TQDM_DISABLE", "1")
    t0 = time.perf_counter()
    papermill.execute_notebook(str(source), str(dst), parameters={"scale": scale}, progress_bar=False,
                               cwd=str(source.parent), kernel_name="python3")
    nb = nbformat.read(dst, as_version=4)
    nb.metadata["subfl"] = {
        "scale": scale,
        "parameters": parameters,
        "library_version": subfl.__version__,
        "code_fingerprint": code_fingerprint(),
        "fingerprint": inputs_fingerprint(source, parameters),
        "wall_time_s": round(time.perf_counter() - t0, 1),
        "executed_at": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    nbformat.write(nb, dst)
    return dst


def execute(scale: str = "cpu", only: str | None = None, force: bool = False, jobs: int = 1,
            root: Path | None = None) -> list[Path]:
    """Execute every stale or missing notebook (all of them with ``force``), ``jobs`` at a time (separate
    processes; every notebook runs in its own kernel either way). Returns the executed copies in status order."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be an int >= 1, got {jobs!r}")
    root = project_root() if root is None else root
    todo = [row for row in status(scale, only, root) if force or row.state != "fresh"]
    for row in todo:
        print(f"executing {row.notebook} at scale {scale} ({row.reason})", flush=True)
    sources = [root / row.notebook for row in todo]
    if jobs == 1 or len(sources) < 2:
        return [execute_notebook(src, scale, root) for src in sources]
    from concurrent.futures import ProcessPoolExecutor
    with ProcessPoolExecutor(max_workers=min(jobs, len(sources))) as pool:
        return list(pool.map(execute_notebook, sources, [scale] * len(sources), [root] * len(sources)))


def build_site(root: Path | None = None, strict: bool = True) -> Path:
    """``jupyter-book build`` of the repository (warnings as errors with ``strict``) into ``_build/html``."""
    root = project_root() if root is None else root
    exe = Path(sys.executable).with_name("jupyter-book")
    cmd = [str(exe) if exe.exists() else "jupyter-book", "build", str(root), "--keep-going"]
    if strict:
        cmd += ["-W", "-n"]
    subprocess.run(cmd, check=True)
    return root / "_build" / "html" / "index.html"
