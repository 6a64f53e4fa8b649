"""Settings shared by the unit tests (tests/) and the notebook checks (notebooks/, nbval): notebook kernels inherit
these variables, so no test run reads or writes this machine's run cache or the repository's run store.

Under nbval each notebook runs with its parameters cell overridden as papermill would override it
(``-p seeds '[0, 1]'``): :data:`NBVAL_PARAMETERS` replace the parameters of those names a notebook's parameters cell
assigns. Two seeds keep every multi-seed code path (spreads, per-seed tables, the verdict's seed rule) in the check
while the ci-scale notebooks train a third fewer runs; the pages the book shows are executed with their own
parameters (three seeds or more) by ``subfl-book``.
"""
from __future__ import annotations

import ast
import os
import tempfile

os.environ.setdefault("TQDM_DISABLE", "1")
for _name, _prefix in (("SUBFL_STORE_DIR", "store"), ("SUBFL_WORK_DIR", "work"), ("SUBFL_CACHE_DIR", "cache"),
                       ("SUBFL_ARTIFACTS_DIR", "artifacts")):
    os.environ.setdefault(_name, tempfile.mkdtemp(prefix=f"subfl-test-{_prefix}-"))

NBVAL_PARAMETERS = {"seeds": [0, 1], "table1_seeds": [0, 1], "claim_seeds": [0, 1], "mixed_seeds": [0, 1]}
"""Parameters every notebook check runs with, where the notebook's parameters cell assigns them."""


def assigned_names(source: str) -> set[str]:
    """The names a cell's top-level statements assign."""
    return {target.id for node in ast.parse(source).body if isinstance(node, ast.Assign)
            for target in node.targets if isinstance(target, ast.Name)}


def injected_parameters(source: str, parameters: dict = NBVAL_PARAMETERS) -> str:
    """``source`` (a parameters cell) followed by an assignment of each of ``parameters`` it assigns itself."""
    lines = [f"{name} = {value!r}" for name, value in parameters.items() if name in assigned_names(source)]
    return source if not lines else source.rstrip("\n") + "\n# injected by conftest.py (nbval)\n" + "\n".join(lines)


def pytest_collection_modifyitems(session, config, items) -> None:
    for item in items:
        cell = getattr(item, "cell", None)   # nbval's IPyNbCell
        if cell is not None and "parameters" in cell.get("metadata", {}).get("tags", []):
            cell.source = injected_parameters(cell.source)
