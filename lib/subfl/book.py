"""The notebook → book pipeline: execute stale notebooks with papermill, record provenance, build the site.

Source notebooks live in ``notebooks/<chapter>/*.ipynb`` (no outputs). Executed copies live in
``book/<chapter>/*.ipynb`` and are what the site renders. Each executed copy records in its metadata
(``metadata.subfl``) the scale, the parameters (seeds included), the library version, its wall time and what
it depends on (:func:`page_dependencies`): the digest of every library source file the page can reach and of
every registry entry (method, model, external dataset) it may use. A copy is *stale* when its notebook source,
its parameters, the data manifest or one of those files or entries changed; ``subfl book`` re-executes only
stale or missing copies, and ``subfl book --status`` names what changed.

What a page reaches: the subfl modules its code cells import, everything they import in turn, and — because a
page names methods and models by string — every entry of each registry it reaches, with the entry's module.
The registry files themselves are represented by their entries, so adding a method, a model or a dataset does
not make existing pages stale; editing a module they may use does.
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

from .experiments.cache import (PACKAGE_DIR, REGISTRIES, _NOT_COMPUTATIONAL, _module_file, dependency_files,
                                imports_in_source, registries_reached, repo_root)
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


def _notebook_cells(source: Path) -> list[tuple[str, str]]:
    """``(cell type, text)`` of every cell of ``source``."""
    return [(c["cell_type"], "".join(c["source"])) for c in json.loads(source.read_text())["cells"]]


def _cells_blob(cells: list[tuple[str, str]], parameters: dict[str, Any]) -> str:
    return json.dumps({"cells": cells, "parameters": parameters}, sort_keys=True, default=str)


def _notebook_blob(source: Path, parameters: dict[str, Any]) -> str:
    return _cells_blob(_notebook_cells(source), parameters)


def notebook_imports(source: Path) -> list[str]:
    """The subfl modules the code cells of ``source`` import (lines of IPython magics and shell escapes skipped)."""
    nb = json.loads(source.read_text())
    found: set[str] = set()
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            found |= imports_in_source("\n".join(line for line in "".join(cell["source"]).splitlines()
                                                 if not line.lstrip().startswith(("%", "!"))))
    return sorted(found)


_REGISTRY_KINDS = {"subfl.methods": "method", "subfl.models.names": "model", "subfl.data.names": "dataset"}


def registry_entries(registry: str) -> dict[str, tuple[str, str]]:
    """``{"<kind>:<name>": (module, description)}`` of one registry (kind ``method``, ``model`` or ``dataset``): a
    method's class path, a model's or a dataset's table entry. The description changes when the entry does."""
    if registry == "subfl.methods":
        from .methods import METHODS
        table = {n: (c.__module__, f"{c.__module__}:{c.__qualname__}") for n, c in METHODS.items()}
    elif registry == "subfl.models.names":
        from .models.names import _SPECS
        table = {n: (spec.module, repr(spec)) for n, spec in _SPECS.items()}
    elif registry == "subfl.data.names":
        from .data.names import EXTERNAL_DATASETS
        table = {n: (d.module, repr(d)) for n, d in EXTERNAL_DATASETS.items()}
    else:
        raise ValueError(f"registry={registry!r} is not a registry; accepted: {', '.join(sorted(REGISTRIES))}")
    return {f"{_REGISTRY_KINDS[registry]}:{n}": entry for n, entry in table.items()}


def _digest(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()[:16]


def _file_digest(rel: str) -> str:
    path = PACKAGE_DIR / rel
    return _digest(path.read_bytes()) if path.is_file() else "missing"


def page_dependencies(source: Path) -> dict[str, dict[str, str]]:
    """What an executed copy of ``source`` depends on, as digests: ``{"files": {path in the package: digest},
    "entries": {"method:prism": digest, ...}}``.

    Files: every module the notebook imports and, transitively, what they import; entries: every entry of each
    registry reached (a page may name any method or model), and each entry's module with its imports, until no
    new registry is reached. The registry files, the book builder, the command line and the cache are not
    counted (they cannot change a page's numbers; a registry is counted by its entries).
    """
    modules = set(notebook_imports(source))
    entries: dict[str, str] = {}
    expanded: set[str] = set()
    while True:
        todo = registries_reached(sorted(modules)) - expanded
        if not todo:
            break
        for registry in sorted(todo):
            for name, (module, description) in registry_entries(registry).items():
                entries[name] = _digest(description)
                modules.add(module)
        expanded |= todo
    skip = _NOT_COMPUTATIONAL | {_module_file(r).relative_to(PACKAGE_DIR).as_posix() for r in REGISTRIES}
    files = {}
    for path in dependency_files(sorted(modules)):
        rel = path.relative_to(PACKAGE_DIR).as_posix()
        if rel not in skip:
            files[rel] = _file_digest(rel)
    return {"files": dict(sorted(files.items())), "entries": dict(sorted(entries.items()))}


def _current_dependencies(recorded: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """The digests, now, of the files and registry entries in ``recorded`` ("missing" for those that are gone)."""
    kinds = {name.split(":", 1)[0] for name in recorded["entries"]}
    now = {name: _digest(description) for registry, kind in _REGISTRY_KINDS.items() if kind in kinds
           for name, (_, description) in registry_entries(registry).items()}
    return {"files": {rel: _file_digest(rel) for rel in recorded["files"]},
            "entries": {name: now.get(name, "missing") for name in recorded["entries"]}}


def page_fingerprint(source: Path, parameters: dict[str, Any], dependencies: dict[str, dict[str, str]]) -> str:
    """Hash of the notebook's cells and parameters, the library version, the data manifest and ``dependencies``."""
    return _blob_fingerprint(_notebook_blob(source, parameters), dependencies)


def _blob_fingerprint(notebook_blob: str, dependencies: dict[str, dict[str, str]]) -> str:
    blob = notebook_blob + json.dumps(dependencies, sort_keys=True)
    return _digest(blob + subfl.__version__ + _data_manifest_hash())


def _executed_cells(nb) -> list:
    """The cells of an executed copy that came from its notebook (papermill's injected-parameters cell left out)."""
    return [c for c in nb.cells if "injected-parameters" not in c.get("metadata", {}).get("tags", [])]


def _changed(recorded: dict[str, dict[str, str]], current: dict[str, dict[str, str]]) -> list[tuple[str, str]]:
    """``(part, name)`` of the files and entries whose digest differs between ``recorded`` and ``current``."""
    return [(part, name) for part in ("files", "entries") for name, digest in recorded[part].items()
            if current[part][name] != digest]


def _changed_dependencies(recorded: dict[str, dict[str, str]], current: dict[str, dict[str, str]]) -> list[str]:
    """The files and entries whose digest differs between ``recorded`` and ``current``, each marked removed or
    changed."""
    return [f"{name} {'removed' if current[part][name] == 'missing' else 'changed'}"
            for part, name in _changed(recorded, current)]


def _staleness(source: Path, meta: dict[str, Any], scale: str) -> str | None:
    """Why the executed copy with metadata ``meta`` is stale at ``scale``, or None when it is fresh."""
    if meta.get("scale") != scale:
        return f"scale {meta.get('scale')} != {scale}"
    recorded = meta.get("dependencies")
    if recorded is None:
        return "executed before per-page dependencies were recorded"
    parameters = {**default_parameters(source), "scale": scale}
    current = _current_dependencies(recorded)
    if meta.get("fingerprint") == page_fingerprint(source, parameters, current):
        return None
    if meta.get("notebook_fingerprint") != _digest(_notebook_blob(source, parameters)):
        return "notebook or its parameters changed"
    changed = _changed_dependencies(recorded, current)
    if changed:
        more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        return "library code changed: " + ", ".join(changed[:3]) + more
    if meta.get("library_version") != subfl.__version__:
        return f"library version {meta.get('library_version')} != {subfl.__version__}"
    return "data manifest changed"


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
        reason = _staleness(src, meta, scale)
        if reason is not None:
            out.append(NotebookState(rel, "stale", reason))
        else:
            out.append(NotebookState(rel, "fresh", f"executed {meta.get('executed_at', '?')}"))
    return out


def acknowledge_change(files: list[str] | tuple[str, ...], reason: str, scale: str = "cpu",
                       root: Path | None = None) -> list[str]:
    """Record that a change to the library ``files`` (paths in the package, e.g. ``"fl/training.py"``) cannot alter
    the numbers of the executed copies that depend on them, so that they read fresh again without re-execution.

    Use it only for a change shown not to touch what the pages computed — a docstring, or a code path none of their
    runs takes — and say how it was shown in ``reason``. A copy is updated only when it is stale through a change of
    ``files`` alone (its notebook, parameters, other files, registry entries, library version and data manifest
    unchanged); its metadata keeps each acknowledgement (``acknowledged``: the files with their digests before and
    after, the reason, the date) next to the original execution record. Returns the notebooks updated.
    """
    import nbformat

    _check_scale(scale)
    if not isinstance(reason, str) or not reason.strip():
        raise ValueError("reason must say why the change cannot alter the pages' numbers; got an empty reason")
    files = list(files)
    unknown = [f for f in files if not (PACKAGE_DIR / f).is_file()]
    if not files or unknown:
        raise ValueError(f"files must name source files of the package (e.g. 'fl/training.py'); not found: "
                         f"{unknown or 'none given'}")
    root = project_root() if root is None else root
    updated = []
    for src in _sources(root, None):
        dst = executed_path(src, root)
        if not dst.exists():
            continue
        nb = nbformat.read(dst, as_version=4)
        meta = nb.metadata.get("subfl", {})
        recorded = meta.get("dependencies")
        if meta.get("scale") != scale or recorded is None:
            continue
        current = _current_dependencies(recorded)
        changed = {name for _, name in _changed(recorded, current)}
        parameters = {**default_parameters(src), "scale": scale}
        if not changed or not changed <= set(files) or \
                meta.get("fingerprint") != page_fingerprint(src, parameters, recorded):
            continue  # fresh, or stale for another reason too (only re-execution can refresh it)
        meta.setdefault("acknowledged", []).append({
            "files": {f: [recorded["files"][f], current["files"][f]] for f in sorted(changed)},
            "reason": reason.strip(),
            "at": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")})
        meta["dependencies"] = current
        meta["fingerprint"] = page_fingerprint(src, parameters, current)
        nbformat.write(nb, dst)
        updated.append(src.relative_to(root).as_posix())
    return updated


def update_prose(notebook: str | Path, reason: str, scale: str = "cpu", root: Path | None = None) -> list[int]:
    """Carry edited text of ``notebook``'s markdown cells into its executed copy without re-executing it.

    For a correction of a page's prose (a sentence made wrong by later work, say) where re-execution would
    re-run hours of experiments. Allowed only when the copy is stale through its markdown alone: the copy's
    cells must give back the notebook it was executed from (checked against its recorded
    ``notebook_fingerprint``), the notebook now must have the same cells in the same order with the same code,
    and the parameters, library files, registry entries, library version and data manifest must be unchanged.
    Outputs are kept; the copy's metadata records each update (``prose_updated``: the cells, the reason, the
    date). Returns the indices (in the notebook) of the markdown cells replaced; ValueError names what blocks it.
    """
    import nbformat

    _check_scale(scale)
    if not isinstance(reason, str) or not reason.strip():
        raise ValueError("reason must say what the prose change corrects; got an empty reason")
    root = project_root() if root is None else root
    source = Path(notebook) if Path(notebook).is_absolute() else root / notebook
    if not source.is_file():
        raise ValueError(f"notebook={str(notebook)!r} is not a notebook of {root}")
    dst = executed_path(source, root)
    if not dst.exists():
        raise ValueError(f"{source.name} has no executed copy ({dst}); execute it instead")
    nb = nbformat.read(dst, as_version=4)
    meta = nb.metadata.get("subfl", {})
    if meta.get("scale") != scale or meta.get("dependencies") is None:
        raise ValueError(f"the executed copy of {source.name} is not a {scale}-scale copy with recorded dependencies; "
                         f"execute it instead")
    parameters = {**default_parameters(source), "scale": scale}
    if parameters != meta.get("parameters"):
        raise ValueError(f"the parameters of {source.name} changed since it was executed; execute it instead")
    executed = _executed_cells(nb)
    old_blob = _cells_blob([(c.cell_type, c.source) for c in executed], parameters)
    if _digest(old_blob) != meta.get("notebook_fingerprint"):
        raise ValueError(f"the executed copy of {source.name} does not give back the notebook it was executed from "
                         f"(its cells were edited); execute it instead")
    new = _notebook_cells(source)
    if [t for t, _ in new] != [c.cell_type for c in executed] or \
            [text for t, text in new if t != "markdown"] != [c.source for c in executed if c.cell_type != "markdown"]:
        raise ValueError(f"{source.name} changed beyond the text of its markdown cells (cells added, removed, "
                         f"reordered or code edited); execute it instead")
    if meta.get("fingerprint") != _blob_fingerprint(old_blob, _current_dependencies(meta["dependencies"])):
        raise ValueError(f"{source.name} is stale for another reason too (library code, registry entries, version "
                         f"or data manifest); execute it instead")
    changed = [i for i, ((t, text), cell) in enumerate(zip(new, executed)) if t == "markdown" and text != cell.source]
    for i in changed:
        executed[i].source = new[i][1]
    meta.setdefault("prose_updated", []).append({
        "cells": changed, "reason": reason.strip(),
        "at": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")})
    new_blob = _cells_blob(new, parameters)
    meta["notebook_fingerprint"] = _digest(new_blob)
    meta["fingerprint"] = _blob_fingerprint(new_blob, meta["dependencies"])
    nbformat.write(nb, dst)
    return changed


def execute_notebook(source: Path, scale: str = "cpu", root: Path | None = None) -> Path:
    """Execute one notebook with papermill at ``scale`` and write its executed copy with provenance."""
    import nbformat
    import papermill

    _check_scale(scale)
    root = project_root() if root is None else root
    dst = executed_path(source, root)
    dst.parent.mkdir(parents=True, exist_ok=True)
    parameters = {**default_parameters(source), "scale": scale}
    dependencies = page_dependencies(source)
    os.environ.setdefault("TQDM_DISABLE", "1")
    t0 = time.perf_counter()
    papermill.execute_notebook(str(source), str(dst), parameters={"scale": scale}, progress_bar=False,
                               cwd=str(source.parent), kernel_name="python3")
    nb = nbformat.read(dst, as_version=4)
    nb.metadata["subfl"] = {
        "scale": scale,
        "parameters": parameters,
        "library_version": subfl.__version__,
        "fingerprint": page_fingerprint(source, parameters, dependencies),
        "notebook_fingerprint": _digest(_notebook_blob(source, parameters)),
        "dependencies": dependencies,
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
