"""The notebook → book pipeline: execute stale notebooks with papermill, record what they read, build the site.

Source notebooks live in ``notebooks/<chapter>/*.ipynb`` (no outputs). Executed copies live in
``book/<chapter>/*.ipynb`` and are what the site renders. Each executed copy records in its metadata
(``metadata.subfl``) the scale, the parameters, its wall time, the machine it ran on and **the runs it read**: the
key and config of every run it took from the run store (:mod:`subfl_book.store`).

A copy is *stale* when its notebook or parameters changed, when the key of a run it read changed (a version that
run uses moved: :mod:`subfl.experiments.provenance`), or when a run it read is not in the store. Library edits that
change no behaviour change no key, so they stale no page. ``subfl-book`` re-executes only stale or missing copies;
``subfl-book --status`` says why each is stale.
"""
from __future__ import annotations

import ast
import datetime as _dt
import gzip
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

import subfl
from subfl.experiments.config import ExperimentConfig
from subfl.experiments.presets import SCALES

from .measured import MEASURED_LOG_ENV, file_changed, measurement_changed
from .page_code import code_changes, page_code
from .recorded import RECORDED_LOG_ENV, RESULTS_DIR
from .scorecard import PAGE_NAME_ENV, SCORECARD_LOG_ENV, read_rows
from .store import (BOOK_THREADS, RUNS_LOG_ENV, book_key, checkout_root, cpu_identity, key_to_read, record_path,
                    recorded_enough, record_digest, root_for, store_root)


def project_root() -> Path:
    """The book's checkout (``notebooks/``, ``book/``, ``_toc.yml``)."""
    root = checkout_root()
    if not (root / "notebooks").is_dir():
        raise FileNotFoundError("subfl-book needs a checkout of the book's repository (notebooks/, book/, _toc.yml)")
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


def page_name(source: Path) -> str:
    """The page a source notebook renders as, as ``_toc.yml`` names it: ``book/<chapter>/<page>``."""
    return f"book/{source.parent.name}/{source.stem}"


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


def _notebook_cells(source: Path) -> list[tuple[str, str]]:
    """``(cell type, text)`` of every cell of ``source``."""
    return [(c["cell_type"], "".join(c["source"])) for c in json.loads(source.read_text())["cells"]]


def _cells_blob(cells: list[tuple[str, str]], parameters: dict[str, Any]) -> str:
    return json.dumps({"cells": cells, "parameters": parameters}, sort_keys=True, default=str)


def _notebook_blob(source: Path, parameters: dict[str, Any]) -> str:
    return _cells_blob(_notebook_cells(source), parameters)


def _digest(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()[:16]


def _page_source_code(source: Path) -> str:
    """The code cells of ``source``, one after another (what :mod:`subfl_book.page_code` follows imports from)."""
    return "\n\n".join(text for kind, text in _notebook_cells(source) if kind == "code")


def page_fingerprint(source: Path, parameters: dict[str, Any]) -> str:
    """Hash of the notebook's cells and parameters."""
    return _digest(_notebook_blob(source, parameters))


DISPLAY_KEY = "mystnb"
"""Cell metadata MyST-NB reads to show a cell's outputs (``figure``: caption and name, ``image``: alt text)."""


STALE_NOTICE_TAG = "stale-notice"
"""Tag of the notice :func:`mark_stale_pages` puts after the opening cell (title and introduction) of a page whose
executed copy is stale."""


def _page_cells(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An executed copy's cells without what the pipeline added (papermill's injected parameters, the run card, a
    stale notice): the source notebook's cells, in its order."""
    added = {RUN_CARD_TAG, "injected-parameters", STALE_NOTICE_TAG}
    return [c for c in cells if not added & set(c.get("metadata", {}).get("tags", []))]


def _code_of(cells: list[dict[str, Any]]) -> list[str]:
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]


def _display_of(cells: list[dict[str, Any]]) -> list[Any]:
    """The ``mystnb`` metadata of each code cell (a figure's caption, name and alt text; ``None`` when absent)."""
    return [c.get("metadata", {}).get(DISPLAY_KEY) for c in cells if c["cell_type"] == "code"]


def prose_differs(source: Path, executed: dict[str, Any]) -> bool:
    """Whether the executed copy (its notebook JSON) shows other text than ``source`` in its markdown cells, or
    other captions and alt text (code cells' ``mystnb`` metadata), while running the same code: :func:`sync_prose`
    brings them over without executing anything."""
    body = _page_cells(executed.get("cells", []))
    ours = [(c["cell_type"], "".join(c["source"])) for c in body]
    if ours != _notebook_cells(source) or _run_card_differs(executed):
        return True
    return _display_of(body) != _display_of(json.loads(source.read_text())["cells"])


def _run_card_differs(executed: dict[str, Any]) -> bool:
    """Whether the executed copy's run card is not the one its metadata and the store give now (:func:`run_card`)."""
    cards = [c for c in executed.get("cells", []) if RUN_CARD_TAG in c.get("metadata", {}).get("tags", [])]
    return not cards or "".join(cards[0]["source"]) != run_card(executed.get("metadata", {}).get("subfl", {}))


def _replace_copy(nb: Any, dst: Path) -> None:
    """Write the executed copy ``dst`` through a temporary file, so that a reader never sees it half-written."""
    import nbformat

    tmp = dst.with_name(f".{dst.stem}.writing.ipynb")
    nbformat.write(nb, tmp)
    os.replace(tmp, dst)


def sync_prose(source: Path, root: Path | None = None) -> bool:
    """Copy the markdown of ``source`` into its executed copy, whose code cells must be the source's, one for one
    (``ValueError`` otherwise: that page needs executing), and each code cell's ``mystnb`` metadata (how MyST-NB
    shows its outputs: a figure's caption, name and alt text), and writes its run card again from its metadata and
    the store (:func:`run_card`). None of these changes what a page computes, so a fix to a page's text, math,
    citations, captions or run card reaches the book without re-running anything. Returns whether it changed."""
    import nbformat

    root = project_root() if root is None else root
    dst = executed_path(source, root)
    nb = nbformat.read(dst, as_version=4)
    body, theirs = _page_cells(nb.cells), nbformat.read(source, as_version=4).cells
    if [c.cell_type for c in body] != [c.cell_type for c in theirs] or _code_of(body) != _code_of(theirs):
        raise ValueError(f"{dst} runs other code than {source} (cells added, removed or edited): execute it")
    changed = False
    for executed_cell, source_cell in zip(body, theirs):
        if executed_cell.cell_type != "code" and executed_cell.source != source_cell.source:
            executed_cell.source, changed = source_cell.source, True
        if executed_cell.cell_type == "code" and \
                executed_cell.metadata.get(DISPLAY_KEY) != source_cell.metadata.get(DISPLAY_KEY):
            if DISPLAY_KEY in source_cell.metadata:
                executed_cell.metadata[DISPLAY_KEY] = source_cell.metadata[DISPLAY_KEY]
            else:
                del executed_cell.metadata[DISPLAY_KEY]
            changed = True
    if _run_card_differs(nb):   # the card is written from the metadata and the store: no execution needed
        add_run_card(nb)
        changed = True
    if changed:
        meta = nb.metadata["subfl"]
        meta["notebook_fingerprint"] = page_fingerprint(source, meta["parameters"])
        _replace_copy(nb, dst)
    return changed


def config_from_record(config: dict[str, Any]) -> ExperimentConfig:
    """The :class:`ExperimentConfig` of a run a page recorded (``TypeError`` for a field no longer known)."""
    return ExperimentConfig.from_dict(config)


def _current_key(run: dict[str, Any]) -> str | None:
    """The key of the record the page would read for this run now (:func:`subfl_book.store.key_to_read`), else the
    key it would compute; ``None`` for a config no longer valid."""
    try:
        config = config_from_record(run["config"])
    except (TypeError, ValueError):
        return None
    key = book_key(config)
    if recorded_enough(key, root_for(config)):   # key_to_read's first choice, without indexing the whole store
        return key
    return key_to_read(config, same_environment=run.get("same_environment", False)) or key


_SEEN: dict[str, tuple[str, str]] = {}
"""sha256 of a stored record file's bytes -> (record_digest of the record, the run card's facts as JSON)."""


def _stored_facts(key: str) -> tuple[str, str] | None:
    """``(record_digest, run-card facts as JSON)`` of run ``key``'s stored record (``None``: not in the store). The
    status of every page asks for each run it read, so both are kept per process under the hash of the file's bytes:
    hashing the compressed file costs far less than parsing it, and a record written again is parsed again."""
    try:
        data = record_path(key).read_bytes()
    except FileNotFoundError:
        return None
    sha = hashlib.sha256(data).hexdigest()
    if sha not in _SEEN:
        record = json.loads(gzip.decompress(data))
        summary = record.get("summary", {})
        facts = {"summary": {k: summary[k] for k in ("wall_time_s", "dataset_notes", "environment") if k in summary},
                 "hardware": record.get("hardware", {})}
        _SEEN[sha] = record_digest(record), json.dumps(facts)
    return _SEEN[sha]


def _current_digest(key: str) -> str | None:
    """:func:`subfl_book.store.record_digest` of run ``key``'s stored record (``None``: not in the store)."""
    stored = _stored_facts(key)
    return None if stored is None else stored[0]


def _record_facts(key: str) -> dict[str, Any]:
    """How run ``key`` was computed, not what: ``{"summary": {wall_time_s, dataset_notes, environment},
    "hardware": ...}`` from its stored record (``{}``: not in the store), for the run card."""
    stored = _stored_facts(key)
    return {} if stored is None else json.loads(stored[1])


def _staleness(source: Path, executed: dict[str, Any], scale: str) -> str | None:
    """Why the executed copy (its notebook JSON) is stale at ``scale``, or None when it is fresh. Only what the page
    computes counts: its code cells, its parameters and its runs; other prose is brought over by
    :func:`sync_prose`."""
    meta = executed.get("metadata", {}).get("subfl", {})
    if meta.get("scale") != scale:
        return f"scale {meta.get('scale')} != {scale}"
    parameters = {**default_parameters(source), "scale": scale}
    same_code = _code_of(_page_cells(executed.get("cells", []))) == \
        [text for kind, text in _notebook_cells(source) if kind == "code"]
    if not same_code or meta.get("parameters") != parameters:
        return "notebook or its parameters changed"
    runs = meta.get("runs")
    if runs is None:
        return "executed before pages recorded the runs they read"
    changed = [r for r in runs if _current_key(r) != r["key"]]
    if changed:
        return f"{len(changed)} of its {len(runs)} runs changed key (a version they use moved, or a run of this environment was recorded)"
    if "code" not in meta:
        return "executed before pages recorded the code they ran"
    moved = code_changes(meta["code"], _page_source_code(source), checkout_root() / "lib", str(source))
    if moved:
        return moved
    files = [r for r in meta.get("recorded") or [] if _recorded_changed(r)]
    if files:
        return f"recorded file {files[0]['file']} changed or is gone"
    timings = [r for r in meta.get("measured") or [] if measurement_changed(r, scale)]
    if timings:
        return f"measurement {timings[0]['file']} changed or is gone"
    missing = [r for r in runs if not record_path(r["key"]).exists()]
    if missing:
        return f"{len(missing)} of its {len(runs)} runs are not in the store"
    if any("record_sha256" not in r for r in runs):
        return "executed before pages recorded the sha256 of the records they read"
    recomputed = [r for r in runs if _current_digest(r["key"]) != r["record_sha256"]]
    if recomputed:
        return (f"{len(recomputed)} of its {len(runs)} runs were recorded again with other results (the same key "
                f"computed anew, e.g. on a CPU whose kernels round differently)")
    lacking = [r for r in runs if r.get("analyses") and not recorded_enough(r["key"], store_root(),
                                                                            analyses=r["analyses"])]
    if lacking:
        return (f"{len(lacking)} of its {len(runs)} runs lack a current value of an analysis it reads "
                f"(subfl_book.final_analyses: recorded under another version, or never)")
    return None


def _recorded_changed(entry: dict[str, Any]) -> bool:
    """Whether a recorded file a page read (an entry of its log) is gone from ``results/`` or changed since."""
    return file_changed(checkout_root() / RESULTS_DIR / entry["file"], entry["sha256"])


def _recorded_read(log: Path) -> list[dict[str, Any]]:
    """The distinct recorded files of a page's log (:data:`subfl_book.recorded.RECORDED_LOG_ENV`), first read first."""
    if not log.exists():
        return []
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for line in log.read_text(encoding="utf-8").splitlines():
        entry = json.loads(line)
        seen.setdefault((entry["file"], entry["sha256"]), entry)
    return list(seen.values())


def _runs_read(log: Path) -> list[dict[str, Any]]:
    """The distinct runs of a page's runs log, in the order first read."""
    from .final_analyses import normalise

    seen: dict[str, dict[str, Any]] = {}
    if log.exists():
        for line in log.read_text(encoding="utf-8").splitlines():
            entry = json.loads(line)
            first = seen.setdefault(entry["key"], entry)
            if first is not entry and entry.get("analyses"):   # the same run read again for other analyses
                first["analyses"] = [list(r) for r in normalise([*first.get("analyses", []), *entry["analyses"]])]
            if entry.get("record_sha256"):   # the record read (a line logged before computing it has none)
                first["record_sha256"] = entry["record_sha256"]
    return list(seen.values())


def machine() -> dict[str, Any]:
    """What a page's numbers were computed on (for its run card)."""
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            **cpu_identity(), "cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
            "torch_threads": BOOK_THREADS}


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
        executed = json.loads(dst.read_text())
        meta = executed.get("metadata", {}).get("subfl", {})
        reason = _staleness(src, executed, scale)
        if reason is not None:
            out.append(NotebookState(rel, "stale", reason))
        else:
            prose = "; its prose differs from the source (synced by `subfl-book`)" if prose_differs(src, executed) \
                else ""
            out.append(NotebookState(rel, "fresh", f"executed {meta.get('executed_at', '?')}{prose}"))
    return out


def execute_notebook(source: Path, scale: str = "cpu", root: Path | None = None) -> Path:
    """Execute one notebook with papermill at ``scale`` and write its executed copy with the runs it read."""
    import nbformat
    import papermill

    _check_scale(scale)
    root = project_root() if root is None else root
    dst = executed_path(source, root)
    dst.parent.mkdir(parents=True, exist_ok=True)
    parameters = {**default_parameters(source), "scale": scale}
    os.environ.setdefault("TQDM_DISABLE", "1")
    # papermill writes its output as it goes: execute into a side file, so that an interrupted or failed execution
    # never leaves a half-executed copy in place of the last good one
    partial = dst.with_name(f".{dst.stem}.partial.ipynb")
    with tempfile.TemporaryDirectory() as tmp:
        log, card_log = Path(tmp) / "runs.jsonl", Path(tmp) / "scorecard.jsonl"
        recorded_log, measured_log = Path(tmp) / "recorded.jsonl", Path(tmp) / "measured.jsonl"
        page = page_name(source)
        # the kernel inherits these: the runs, recorded files and measurements the page reads, the scorecard rows it
        # judges, its name
        overrides = {RUNS_LOG_ENV: str(log), SCORECARD_LOG_ENV: str(card_log), PAGE_NAME_ENV: page,
                     RECORDED_LOG_ENV: str(recorded_log), MEASURED_LOG_ENV: str(measured_log),
                     # what the page computes live runs on the runs' thread count too (the run card states it;
                     # a numerical check's last digits depend on it)
                     "OMP_NUM_THREADS": str(BOOK_THREADS)}
        before = {k: os.environ.get(k) for k in overrides}
        os.environ.update(overrides)
        try:
            t0 = time.perf_counter()
            papermill.execute_notebook(str(source), str(partial), parameters={"scale": scale}, progress_bar=False,
                                       cwd=str(source.parent), kernel_name="python3")
            wall = time.perf_counter() - t0
        finally:
            for k, v in before.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        runs = _runs_read(log)
        recorded, measurements = _recorded_read(recorded_log), _recorded_read(measured_log)
        scorecard = [asdict(r) for r in read_rows(card_log.read_text(encoding="utf-8").splitlines())] \
            if card_log.exists() else []
    nb = nbformat.read(partial, as_version=4)
    fold_code(nb)
    drop_object_reprs(nb)
    merge_streams(nb)
    nb.metadata["subfl"] = {
        "scale": scale,
        "parameters": parameters,
        "library_version": subfl.__version__,
        "notebook_fingerprint": page_fingerprint(source, parameters),
        "runs": runs,
        "recorded": recorded,
        "measured": measurements,
        "scorecard": scorecard,
        "code": page_code(_page_source_code(source), scorecard, checkout_root() / "lib", str(source)),
        "machine": machine(),
        "wall_time_s": round(wall, 1),
        "executed_at": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    add_run_card(nb)
    nbformat.write(nb, partial)
    os.replace(partial, dst)
    return dst


RUN_CARD_TAG = "run-card"


def _environment_label(record: dict[str, Any]) -> str:
    """The environment class of a record and the processor it ran on: the accelerator, else the CPU's name (records
    made before the store named CPUs give only its instruction set)."""
    env, hw = record["summary"]["environment"], record.get("hardware", {})
    processor = hw.get("accelerator") or hw.get("cpu_name") or (
        f"a CPU with {hw['cpu_capability']}, not named" if hw.get("cpu_capability") else "processor not recorded")
    return (f"torch {env['torch']}, {env['threads']} thread{'s' if env['threads'] != 1 else ''}, {env['device']}"
            + (f" ({processor})" if processor else ""))


def _recorded_label(entry: dict[str, Any]) -> str:
    """``file (hardware, torch version, date)`` of a recorded file a page read, with what the file states."""
    facts = [entry.get("hardware"), entry.get("torch") and f"torch {entry['torch']}", entry.get("date")]
    return f"{entry['file']} ({', '.join(str(f) for f in facts if f) or 'no machine recorded'})"


def run_card(meta: dict[str, Any]) -> str:
    """The run card of an executed page (markdown): scale, seeds, the runs it read, the environments they were computed
    in and what computing them took, data caveats, hardware, wall time, library version, date — all from the page's
    metadata and the run store."""
    from collections import Counter

    runs = meta.get("runs") or []
    records = [_record_facts(r["key"]) for r in runs]
    summaries = [r.get("summary", {}) for r in records]
    seeds = sorted({r["config"].get("seed", 0) for r in runs})
    datasets = sorted({r["config"].get("dataset") for r in runs if r["config"].get("dataset")})
    train_s = sum(s.get("wall_time_s") or 0.0 for s in summaries)
    notes = {s.get("dataset_notes") for s in summaries if s.get("dataset_notes")}
    envs = Counter(_environment_label(r) for r in records if r.get("summary", {}).get("environment"))
    env_text = "; ".join(f"{n} on {label}" for label, n in sorted(envs.items(), key=lambda kv: (-kv[1], kv[0])))
    m = meta.get("machine", {})
    lines = [f"**Scale** `{meta.get('scale')}`"]
    if runs:
        lines.append(f"**runs read** {len(runs)} from the run store (seeds {', '.join(map(str, seeds))}; "
                     f"datasets {', '.join(datasets)}); computing them took {train_s / 3600:.2f} hours, one process "
                     f"each ({env_text})")
    recorded = meta.get("recorded") or []
    if recorded:
        files = "; ".join(_recorded_label(r) for r in recorded)
        lines.append(f"**recorded files read** {len(recorded)} from `{RESULTS_DIR}/`: {files}")
    measurements = meta.get("measured") or []
    if measurements:
        lines.append(f"**timings read** {len(measurements)} measured once and recorded in the run store: "
                     + "; ".join(_recorded_label(r) for r in measurements))
    if not runs and not recorded and not measurements:
        lines.append("**runs read** none (this page computes what it shows)")
    lines.append(f"**page executed** on {m.get('cpu_name') or m.get('processor', '?')}, {m.get('cpus', '?')} CPUs, "
                 f"torch {m.get('torch', '?')}, in {meta.get('wall_time_s', 0):.0f} s, {meta.get('executed_at', '?')}, "
                 f"subfl {meta.get('library_version', '?')}")
    body = " · ".join(lines)
    if notes:
        body += "\n\n**Data.** " + " ".join(sorted(notes))
    return f"```{{admonition}} Run card\n:class: note\n{body}\n```"


def add_run_card(nb: Any) -> Any:
    """Insert (or replace) the run card after the page's first markdown cell (its title and introduction)."""
    import nbformat
    nb.cells = [c for c in nb.cells if RUN_CARD_TAG not in c.get("metadata", {}).get("tags", [])]
    card = nbformat.v4.new_markdown_cell(run_card(nb.metadata.get("subfl", {})), metadata={"tags": [RUN_CARD_TAG]})
    card["id"] = RUN_CARD_TAG   # a fixed id: re-executing a page changes only what it computes
    first = next((i for i, c in enumerate(nb.cells) if c.get("cell_type") == "markdown"), -1)
    nb.cells.insert(first + 1, card)
    return nb


_HIDDEN = {"hide-input", "remove-input", "remove-cell", "hide-cell", "remove-output"}

_OBJECT_REPR = re.compile(r"^<[\w.]+(?: object)? at 0x[0-9a-f]+>$")


def drop_object_reprs(nb: Any) -> Any:
    """Remove the outputs that only name an object (``<matplotlib.legend.Legend at 0x…>``: a cell whose last line
    returns a plotting object) from an executed copy; every other output stays."""
    for cell in nb.cells:
        if cell.get("cell_type") != "code":
            continue
        kept = []
        for out in cell.get("outputs", []):
            data = out.get("data", {}) if out.get("output_type") == "execute_result" else {}
            text = "".join(data.get("text/plain", "")) if set(data) == {"text/plain"} else None
            if text is None or not _OBJECT_REPR.match(text.strip()):
                kept.append(out)
        cell["outputs"] = kept
    return nb


def merge_streams(nb: Any) -> Any:
    """Join each run of consecutive ``stream`` outputs of one name (stdout, stderr) into one output. How the kernel
    chunks printed text depends on timing, so without this the same page executed twice can store its text in a
    different number of outputs."""
    for cell in nb.cells:
        if cell.get("cell_type") != "code":
            continue
        merged: list[Any] = []
        for out in cell.get("outputs", []):
            last = merged[-1] if merged else None
            if (out.get("output_type") == "stream" and last is not None and last.get("output_type") == "stream"
                    and last.get("name") == out.get("name")):
                last["text"] = "".join(last["text"]) + "".join(out["text"])
            else:
                merged.append(out)
        cell["outputs"] = merged
    return nb


def fold_code(nb: Any) -> Any:
    """Presentation tags of an executed copy: papermill's injected parameters removed, the scorecard's placeholder
    cell shown without its code, every other code cell folded (its output shown, its code one click away). Tags
    a cell already carries win. Staleness does not depend on tags."""
    for cell in nb.cells:
        if cell.get("cell_type") != "code":
            continue
        tags = cell.setdefault("metadata", {}).setdefault("tags", [])
        if _HIDDEN & set(tags):
            continue
        if "injected-parameters" in tags:
            tags.append("remove-cell")
            cell["id"] = "injected-parameters"   # papermill draws a random id each execution
        elif ".placeholder()" in "".join(cell.get("source", "")):
            tags.append("remove-input")
        else:
            tags.append("hide-input")
    return nb


def recorded_card_html(nb: Any) -> str | None:
    """The scorecard of an executed copy rendered now (:func:`subfl_book.scorecard.render_card`) from the rows its
    execution recorded (``metadata.subfl.scorecard``); ``None`` for a page that judged no claim."""
    from .claims import load_register
    from .scorecard import ScoreRow, page_card

    rows = [ScoreRow(**r) for r in nb.metadata.get("subfl", {}).get("scorecard", [])]
    if not rows:
        return None
    return page_card(rows, load_register(rows[0].claim.partition(":")[0]))  # its first row: its own paper's claim


def _card_cell(nb: Any) -> Any | None:
    return next((c for c in nb.cells if c.cell_type == "code" and ".placeholder()" in "".join(c.source)), None)


def refresh_card(executed: Path) -> bool:
    """Re-render an executed copy's scorecard from its recorded rows when the renderer has changed since (how a
    claim's math or a note is shown, never a verdict: the rows are the execution's). Returns whether it changed."""
    import nbformat

    nb = nbformat.read(executed, as_version=4)
    html, cell = recorded_card_html(nb), _card_cell(nb)
    if html is None or cell is None:
        return False
    outputs = [o for o in cell.outputs if "text/html" in o.get("data", {})]
    if len(outputs) != 1 or "".join(outputs[0].data["text/html"]) == html:
        return False
    outputs[0].data["text/html"] = html
    _replace_copy(nb, executed)
    return True


def sync_all_prose(only: str | None = None, root: Path | None = None) -> list[Path]:
    """:func:`sync_prose` for every executed copy that runs its source's code (the others wait for their
    execution), and :func:`refresh_card` for every executed copy; returns the copies that changed."""
    root = project_root() if root is None else root
    changed = []
    for src in _sources(root, only):
        dst = executed_path(src, root)
        if not dst.exists():
            continue
        try:
            synced = sync_prose(src, root)
        except ValueError:
            synced = False  # its code changed: executing it brings the prose too
        if refresh_card(dst) or synced:
            changed.append(dst)
    return changed


def stale_notice(source: Path, reason: str, executed_at: str, root: Path) -> str:
    """The warning a stale page shows after its opening cell (MyST admonition)."""
    rel = source.relative_to(root).as_posix()
    why = {"notebook or its parameters changed": "its notebook has changed since"}.get(reason, f"{reason} since")
    return (":::{warning}\n"
            f"**This page shows an earlier execution ({executed_at}).** It is stale: {why} that execution, so its "
            "code, outputs, numbers and prose below are the earlier version's, and the Scorecard counts its claims "
            "as *checked by a page not yet re-executed*. The current notebook is "
            f"`{rel}`; `subfl-book --status` lists why each page is stale, and executing it (`subfl-book`) brings "
            "the page up to date.\n:::")


def mark_stale_pages(scale: str = "cpu", only: str | None = None, root: Path | None = None) -> list[Path]:
    """Put :func:`stale_notice` after the opening cell (title and introduction) of every stale executed copy and take
    it off the fresh ones; returns the copies changed. What a page computes is untouched (the notice is not a page
    cell)."""
    import nbformat

    root = project_root() if root is None else root
    changed = []
    for src in _sources(root, only):
        dst = executed_path(src, root)
        if not dst.exists():
            continue
        nb = nbformat.read(dst, as_version=4)
        reason = _staleness(src, nb, scale)
        kept = [c for c in nb.cells if STALE_NOTICE_TAG not in c.get("metadata", {}).get("tags", [])]
        if reason is not None:
            notice = nbformat.v4.new_markdown_cell(
                stale_notice(src, reason, nb.metadata.get("subfl", {}).get("executed_at", "?"), root),
                metadata={"tags": [STALE_NOTICE_TAG]})
            if "id" in notice:  # nbformat >= 4.5: a fixed id, so that the file is the same every time
                notice["id"] = STALE_NOTICE_TAG
            kept.insert(1 if kept else 0, notice)
        if [c.get("source") for c in kept] == [c.get("source") for c in nb.cells]:
            continue
        nb.cells = kept
        _replace_copy(nb, dst)
        changed.append(dst)
    return changed


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


def page_outputs(nb: dict[str, Any]) -> list[tuple[int, str, str]]:
    """Every output of an executed page as ``(cell index, MIME type or "stream", content)``; images by the sha256 of
    their encoded bytes. The run card (execution date, wall time) is left out: it is the only part of a copy that
    records when and how long, not what."""
    out = []
    for i, cell in enumerate(nb.get("cells", [])):
        if RUN_CARD_TAG in cell.get("metadata", {}).get("tags", []):
            continue
        for output in cell.get("outputs", []):
            if "text" in output:
                out.append((i, f"stream:{output.get('name', '')}", _joined(output["text"])))
            for mime, value in output.get("data", {}).items():
                value = _joined(value) if isinstance(value, (list, str)) else json.dumps(value, sort_keys=True)
                if mime.startswith("image/"):
                    value = hashlib.sha256(value.encode()).hexdigest()
                out.append((i, mime, value))
    return out


def _joined(value: list[str] | str) -> str:
    return "".join(value) if isinstance(value, list) else value


@dataclass(frozen=True)
class Reexecution:
    """A fresh page executed again from the store: how many outputs it has and which cells' outputs moved."""
    notebook: str
    outputs: int
    differing_cells: tuple[int, ...]


def verify(scale: str = "cpu", only: str | None = None, root: Path | None = None) -> list[Reexecution]:
    """Execute every fresh page again, into a scratch folder, and compare every output with its committed copy
    (:func:`page_outputs`): a page whose outputs move between executions shows numbers that do not come from its
    runs alone (an unseeded draw, a timing measured live). Only fresh pages are executed, so their runs are read
    from the store and nothing is trained; the committed copies are not touched."""
    root = project_root() if root is None else root
    rows = [row for row in status(scale, only, root) if row.state == "fresh"]
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        for row in rows:
            source = root / row.notebook
            committed = page_outputs(json.loads(executed_path(source, root).read_text()))
            again = page_outputs(json.loads(execute_notebook(source, scale, Path(scratch)).read_text()))
            differing = sorted({a[0] for a, b in zip(committed, again) if a != b}
                               | {o[0] for o in (committed[len(again):] or again[len(committed):])})
            results.append(Reexecution(row.notebook, len(committed), tuple(differing)))
            print(f"{row.notebook}: {len(committed)} outputs, "
                  + (f"cells {', '.join(map(str, differing))} differ" if differing else "identical"), flush=True)
    return results


def build_site(root: Path | None = None, strict: bool = True) -> Path:
    """``jupyter-book build`` of the repository (warnings as errors with ``strict``) into ``_build/html``."""
    root = project_root() if root is None else root
    exe = Path(sys.executable).with_name("jupyter-book")
    cmd = [str(exe) if exe.exists() else "jupyter-book", "build", str(root), "--keep-going"]
    if strict:
        cmd += ["-W", "-n"]
    subprocess.run(cmd, check=True)
    return root / "_build" / "html" / "index.html"
