"""What a page's outputs depend on besides its notebook and its runs: the code it executes, and the claims it judges.

A page reads its runs from the store (their keys carry the versions of the code that computed them). Everything
else it shows — tables, figures, verdicts, analytic costs, numerical checks — is computed when the page executes,
by the book package and the library. So an executed page records, beside its runs (:func:`page_code`):

* ``modules``: a digest of every module of the book package and of the library's unversioned parts that the
  notebook's imports reach (a static closure over its code cells and, module by module, over every ``import`` in
  their source, function bodies included). The digest is taken over the module's syntax tree without docstrings,
  so comments, docstrings and formatting change nothing; any other edit does.
* ``versions``: :func:`subfl.experiments.provenance.library_versions`. The engine, methods, models, data pipeline
  and samplers (:data:`VERSIONED`) declare versions that a change of behaviour must move (golden runs fail CI
  otherwise), so their source is not digested: a behaviour-preserving refactor of them, such as a private helper
  renamed in ``fl/engine.py``, stales no page.
* ``claims``: a digest of each register entry the page's scorecard rows judge, with the setting it names (the
  departures a row names come from it): correcting a paper's number in ``book/claims/`` stales the pages that
  show it. ``settings``: a digest of each setting a row names its departures against in the claim's stead (a
  row's ``setting=`` or the page's :meth:`~subfl_book.scorecard.Scorecard.defaults`).

:func:`code_changes` says what of these moved since a page executed (:func:`subfl_book.pipeline.status`).
"""
from __future__ import annotations

import ast
import functools
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

PACKAGES = ("subfl", "subfl_book")
"""The packages of the checkout (under ``lib/``) whose modules a page's closure follows."""

VERSIONED = ("subfl.fl", "subfl.methods", "subfl.models", "subfl.data", "subfl.sampling", "subfl.pretraining")
"""Library modules (and packages) whose behaviour their declared versions vouch for: followed for imports, not
digested."""


def _is_versioned(module: str) -> bool:
    return any(module == v or module.startswith(v + ".") for v in VERSIONED)


def module_file(module: str, lib: Path) -> Path | None:
    """The source file of ``module`` (dotted name) under ``lib``, or None when it is not a module of :data:`PACKAGES`."""
    if module.split(".")[0] not in PACKAGES:
        return None
    base = lib.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _parse(text: str, where: str) -> ast.Module:
    # IPython lines (magics, shell escapes) are not Python: blank them, keeping line numbers
    lines = ["" if line.lstrip().startswith(("%", "!")) else line for line in text.splitlines()]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError as err:
        raise ValueError(f"{where}: cannot parse its code to find its imports ({err})") from None


def _imported(tree: ast.Module, package: str | None, lib: Path) -> set[str]:
    """Dotted names of the modules of :data:`PACKAGES` that ``tree`` imports anywhere (``package``: the package a
    relative import starts from; None for a notebook)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                if package is None:
                    continue
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            # ``from pkg import name``: name may be a submodule
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            # importing a.b.c imports a and a.b too
            found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1)
                         if module_file(".".join(parts[:i]), lib) is not None)
    return found


def import_closure(code: str, lib: Path, where: str = "code") -> set[str]:
    """Every module of :data:`PACKAGES` (under ``lib``) that ``code`` reaches through imports, transitively."""
    todo = list(_imported(_parse(code, where), None, lib))
    seen: set[str] = set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        path = module_file(module, lib)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        todo.extend(_module_imports(path.read_text(encoding="utf-8"), str(path), package, lib) - seen)
    return seen


@functools.lru_cache(maxsize=1024)
def _module_imports(text: str, where: str, package: str, lib: Path) -> frozenset[str]:
    """:func:`_imported` of a module's source, parsed once per text (the status of every page walks the same
    modules)."""
    return frozenset(_imported(_parse(text, where), package, lib))


def _without_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return tree


@functools.lru_cache(maxsize=1024)
def _source_digest(text: str) -> str:
    tree = _without_docstrings(ast.parse(text))
    return hashlib.sha256(ast.dump(tree, include_attributes=False).encode()).hexdigest()[:16]


def module_digest(path: Path) -> str:
    """Digest of a module's syntax tree without its docstrings (comments and formatting are not in the tree)."""
    return _source_digest(path.read_text(encoding="utf-8"))


def module_digests(code: str, lib: Path, where: str = "code") -> dict[str, str]:
    """``{module: digest}`` of the unversioned modules ``code`` reaches (:func:`import_closure`)."""
    return {m: module_digest(module_file(m, lib)) for m in sorted(import_closure(code, lib, where))
            if not _is_versioned(m)}


def _json_digest(value: Any) -> str:
    """A short digest of a register entry or setting (its JSON, keys sorted)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def claim_digests(claim_keys: Iterable[str], *, missing_ok: bool = False) -> dict[str, str | None]:
    """``{"<paper>:<id>": digest}`` of register entries, each with the setting it names (what a scorecard row reads
    of the register: the claim, and the setting its departures are named against; another setting's edit changes
    no digest). ``None`` for an entry no longer in the register when ``missing_ok``; ``KeyError`` otherwise."""
    from .claims import load_register

    out: dict[str, str | None] = {}
    registers: dict[str, Any] = {}
    for key in sorted(set(claim_keys)):
        paper, _, claim_id = key.partition(":")
        register = registers.setdefault(paper, load_register(paper))
        try:
            claim = register.claim(claim_id)
        except KeyError:
            if not missing_ok:
                raise
            out[key] = None
            continue
        blob = {"claim": asdict(claim), "setting": register.settings.get(claim.setting) if claim.setting else None}
        out[key] = _json_digest(blob)
    return out


def setting_digests(setting_keys: Iterable[str]) -> dict[str, str | None]:
    """``{"<paper>:<settings id>": digest}`` of the register settings that scorecard rows name their departures
    against (a row's own or the page's default setting; see :meth:`subfl_book.scorecard.Scorecard.defaults`);
    ``None`` for a setting no longer in its register."""
    from .claims import load_register

    out: dict[str, str | None] = {}
    for key in sorted(set(setting_keys)):
        paper, _, setting_id = key.partition(":")
        setting = load_register(paper).settings.get(setting_id)
        out[key] = None if setting is None else _json_digest(setting)
    return out


def named_settings(scorecard: Iterable[Mapping[str, Any]]) -> set[str]:
    """The register settings a page's recorded scorecard rows name their departures against."""
    return {row["setting"] for row in scorecard if row.get("setting")}


def judged_claims(scorecard: Iterable[Mapping[str, Any]]) -> set[str]:
    """The register entries a page's recorded scorecard rows name (each row's claim and the claim it is compared
    with)."""
    return {key for row in scorecard for key in (row.get("claim"), row.get("against")) if key}


def page_code(code: str, scorecard: Iterable[Mapping[str, Any]], lib: Path, where: str = "page") -> dict[str, Any]:
    """What an executed page records of the code it ran and the claims it judged (see the module docstring)."""
    from subfl.experiments.provenance import library_versions

    scorecard = list(scorecard)
    return {"modules": module_digests(code, lib, where), "versions": library_versions(),
            "claims": claim_digests(judged_claims(scorecard)), "settings": setting_digests(named_settings(scorecard))}


def code_changes(recorded: Mapping[str, Any], code: str, lib: Path, where: str = "page") -> str | None:
    """Why ``recorded`` (a page's :func:`page_code` at execution) no longer holds for ``code`` now, or None."""
    from subfl.experiments.provenance import library_versions

    versions, now = recorded.get("versions", {}), library_versions()
    moved = sorted(k for k in versions if versions[k] != now.get(k))   # a name registered since cannot matter
    if moved:
        return f"library versions moved: {', '.join(moved[:3])}{' …' if len(moved) > 3 else ''}"
    modules = recorded.get("modules", {})
    current = module_digests(code, lib, where)
    changed = sorted(m for m in modules.keys() | current.keys() if modules.get(m) != current.get(m))
    if changed:
        return f"code it runs changed: {', '.join(changed[:3])}{' …' if len(changed) > 3 else ''}"
    claims = recorded.get("claims", {})
    now_claims = claim_digests(claims, missing_ok=True)
    edited = sorted(k for k, d in claims.items() if now_claims[k] != d)
    if edited:
        return f"register entries it judges changed: {', '.join(edited[:3])}{' …' if len(edited) > 3 else ''}"
    settings = recorded.get("settings", {})
    now_settings = setting_digests(settings)
    edited = sorted(k for k, d in settings.items() if now_settings[k] != d)
    if edited:
        return f"register settings its rows are compared against changed: {', '.join(edited[:3])}" \
               f"{' …' if len(edited) > 3 else ''}"
    return None

