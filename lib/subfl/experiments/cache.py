"""Where results are cached, and the fingerprint of the code they depend on.

A cached run is keyed by hash(config, fingerprint of the source files the run imports): re-running a
notebook whose experiments did not change is instant, and a change to any file a run depends on makes its
old results stale (they are recomputed, never silently reused). Dependencies are found by following the
``import`` statements of the package's modules. The registries — the method registry ``subfl.methods``, the
model table ``subfl.models.names`` and the external-dataset table ``subfl.data.names`` — are not followed: a run
names its method's, its model's and (for an external dataset) its loader's module itself
(:func:`~subfl.experiments.runner.run_code_fingerprint`), so adding a method, a model or a dataset does not
invalidate other results.
"""
from __future__ import annotations

import ast
import hashlib
import os
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

import subfl

PACKAGE_DIR = Path(subfl.__file__).resolve().parent
# Files that cannot change a result: the command line, the book builder, the cache itself.
_NOT_COMPUTATIONAL = {"cli.py", "book.py", "experiments/cache.py"}
# Tables of names → modules; a run names its own entry, so these are not followed (see dependency_files).
REGISTRIES = frozenset({"subfl.methods", "subfl.models.names", "subfl.data.names"})


def _module_file(module: str) -> Path | None:
    rel = module.split(".")[1:]
    base = PACKAGE_DIR.joinpath(*rel)
    if base.with_suffix(".py").exists():
        return base.with_suffix(".py")
    if (base / "__init__.py").exists():
        return base / "__init__.py"
    return None


def _imports(module: str, path: Path) -> set[str]:
    """Absolute names of the subfl modules imported by ``module`` (anywhere in the file)."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    return imports_in_source(path.read_text(encoding="utf-8"), package)


def imports_in_source(source: str, package: str = "subfl") -> set[str]:
    """Absolute names of the subfl modules that Python ``source`` imports (anywhere in it); relative imports are
    resolved against ``package``. ``from subfl.x import y`` counts ``subfl.x`` and, in case ``y`` is a module,
    ``subfl.x.y``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "subfl")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            if target.split(".")[0] != "subfl":
                continue
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)  # `from . import x` may name modules
    return found


def dependency_files(modules: Iterable[str]) -> list[Path]:
    """The source files of ``modules`` and of every subfl module they import, transitively.

    Parent packages' ``__init__`` files are included (they run on import); the registries (``subfl.methods``,
    ``subfl.models.names``, ``subfl.data.names``) are not followed (their members are reached only when named).
    """
    seen: set[str] = set()
    files: set[Path] = set()
    todo = list(modules)
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        path = _module_file(mod)
        if path is None:
            continue
        parts = mod.split(".")
        todo.extend(".".join(parts[:i]) for i in range(2, len(parts)))
        if mod in REGISTRIES and mod not in modules:
            continue
        files.add(path)
        todo.extend(_imports(mod, path))
    return sorted(files)


def registries_reached(modules: Iterable[str]) -> set[str]:
    """The registries (:data:`REGISTRIES`) that ``modules`` name or that a module they depend on imports.

    :func:`dependency_files` stops at a registry; this says which ones it stopped at, so that a caller who cannot
    name the entries it uses (a book page) can depend on all of them instead.
    """
    modules = list(modules)
    reached = {m for m in modules if m in REGISTRIES}
    for path in dependency_files(modules):
        rel = path.relative_to(PACKAGE_DIR).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        reached |= _imports(".".join(("subfl", *parts)), path) & REGISTRIES
    return reached


@lru_cache(maxsize=64)
def code_fingerprint(modules: tuple[str, ...] | None = None) -> str:
    """sha256 over the computational source files (paths and contents) — of the whole package, or of the
    files that ``modules`` depend on."""
    h = hashlib.sha256(subfl.__version__.encode())
    if modules is None:
        paths = [p for p in PACKAGE_DIR.rglob("*") if p.suffix in (".py", ".json")]
    else:
        paths = dependency_files(modules) + [PACKAGE_DIR / "data" / "manifest.json"]
    for path in sorted(set(paths)):
        rel = path.relative_to(PACKAGE_DIR).as_posix()
        if rel in _NOT_COMPUTATIONAL or "__pycache__" in rel or not path.exists():
            continue
        h.update(rel.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def repo_root() -> Path | None:
    """The checkout this package runs from (``lib/subfl`` inside it), or None for an installed wheel."""
    root = PACKAGE_DIR.parent.parent
    return root if (root / "pyproject.toml").exists() and (root / "lib").is_dir() else None


def cache_root() -> Path:
    """``$SUBFL_CACHE_DIR``; else ``.subfl-cache/`` in the checkout; else ``~/.cache/subfl/runs``."""
    if os.environ.get("SUBFL_CACHE_DIR"):
        return Path(os.environ["SUBFL_CACHE_DIR"]).expanduser()
    root = repo_root()
    if root is not None:
        return root / ".subfl-cache"
    return Path.home() / ".cache" / "subfl" / "runs"
