"""Settings shared by the unit tests (tests/) and the notebook checks (notebooks/, nbval): notebook kernels inherit
these variables, so no test run reads or writes this machine's run cache or the repository's run store.

Under nbval each notebook runs with its parameters cell overridden as papermill would override it
(``-p seeds '[0, 1]'``): :data:`NBVAL_PARAMETERS` replace the parameters of those names a notebook's parameters cell
assigns. Two seeds keep every multi-seed code path (spreads, per-seed tables, the verdict's seed rule) in the check
while the ci-scale notebooks train a third fewer runs; the pages the book shows are executed with their own
parameters (three seeds or more) by ``subfl-book``.

The notebook checks read their ``ci``-scale runs from ``tests/nbval-store/`` (copied into the session's own store), as
the book's pages read theirs from ``store/``: a run is keyed on its canonical config and the versions of the method,
model, dataset and engine it uses, and the golden runs (``tests/golden``) fail CI when behaviour moves without a
version, so a recorded run is the run the current code computes. The checks then execute every analysis, table and
figure cell of every notebook; training each ci run again is left to ``make nbval-store`` (which records them) and
to ``tests/book/test_nbval_store.py`` (which computes a sample again and requires them all to be keyed by the
current versions). A run the recorded store lacks is computed, and the session's summary counts it.
"""
from __future__ import annotations

import ast
import os
import shutil
import tempfile
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")
NBVAL_STORE = Path(__file__).resolve().parent / "tests" / "nbval-store"
"""The ``ci``-scale runs the notebook checks read, recorded by ``make nbval-store`` (``scripts/record_nbval_store.py``)."""

if "SUBFL_STORE_DIR" not in os.environ:
    # a store of this test session's own, holding a copy of NBVAL_STORE: the notebooks read the runs recorded there
    # and compute (into the copy only) those it lacks
    os.environ["SUBFL_STORE_DIR"] = tempfile.mkdtemp(prefix="subfl-test-store-")
    if NBVAL_STORE.is_dir():
        shutil.copytree(NBVAL_STORE, os.environ["SUBFL_STORE_DIR"], dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("README.md"))
for _name, _prefix in (("SUBFL_WORK_DIR", "work"), ("SUBFL_CACHE_DIR", "cache"), ("SUBFL_ARTIFACTS_DIR", "artifacts")):
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
    # files holding a test marked `slow` (a federated training, a deployment) first: with `--dist loadfile
    # --no-loadscope-reorder` (make test) each xdist worker starts on one of them, and the run ends on short files
    slow_files = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in slow_files)
    for item in items:
        cell = getattr(item, "cell", None)   # nbval's IPyNbCell
        if cell is not None and "parameters" in cell.get("metadata", {}).get("tags", []):
            cell.source = injected_parameters(cell.source)


def _recorded_runs(root: Path) -> set[str]:
    return {p.name for p in root.glob("??/*.json.gz")}


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """How many ci-scale runs this session computed because ``tests/nbval-store/`` lacks them (controller only)."""
    if hasattr(config, "workerinput") or not NBVAL_STORE.is_dir():
        return
    session_store = Path(os.environ["SUBFL_STORE_DIR"])
    computed = _recorded_runs(session_store) - _recorded_runs(NBVAL_STORE)
    if computed and session_store.name.startswith("subfl-test-store-"):
        terminalreporter.write_line(f"nbval store: {len(computed)} ci-scale runs were computed that tests/nbval-store/ "
                                    f"lacks; `make nbval-store` records them")
