"""Record ``tests/nbval-store/``: the ``ci``-scale runs the notebook checks read.

Runs the notebook checks (``pytest notebooks --nbval-lax``, as ``make test`` runs them) against an empty store of
their own, so each ci-scale run is computed by the current code, then replaces ``tests/nbval-store/`` with the
records they wrote: run records, the weights of the runs a notebook reads again, and ci-scale pretrained models.
Timings measured once per machine (``measured/``) are left out: they belong to the machine that measured them.

Record again when a version moves (``tests/book/test_nbval_store.py`` fails until then) or a notebook asks for other
runs (the test session's summary counts the runs it had to compute).

    python scripts/record_nbval_store.py            # make nbval-store
    python scripts/record_nbval_store.py --workers 1
    python scripts/record_nbval_store.py --notebooks notebooks/fedp3/pruning.ipynb notebooks/fedp3/blocks.ipynb

With ``--notebooks``, only those notebooks run, against a store seeded with the folder's records whose versions are
current; the folder keeps them, gains the runs those notebooks computed and drops the records whose versions moved.
Use it when a version bump touches the runs of a few notebooks only; every other notebook must not read a dropped
record (``tests/book/test_nbval_store.py`` and the notebook checks' run count say if one does).
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "tests" / "nbval-store"
KEPT = ("??/*.json.gz", "??/*.state.pt", "pretrained/*/*")
"""What is copied from the session's store: records, weights, pretrained models (not ``measured/``)."""
README = """# The notebook checks' runs

The `ci`-scale runs that `pytest notebooks --nbval-lax` (part of `make test`) reads, recorded by
`make nbval-store` (`scripts/record_nbval_store.py`) from a session that computed every one of them with the current
code. `conftest.py` copies this folder into the test session's own store; `tests/book/test_nbval_store.py` checks
that every record is keyed by the current versions and recomputes a sample of them.
"""


def current_records(folder: Path) -> list[Path]:
    """The records of ``folder`` keyed by the versions their method, model, dataset and engine have now."""
    from subfl.experiments import ExperimentConfig
    from subfl.experiments.provenance import canonical_config, run_versions
    from subfl_book import store

    kept = []
    for path in sorted(folder.glob("??/*.json.gz")):
        record = json.loads(gzip.decompress(path.read_bytes()))
        config = ExperimentConfig.from_dict(record["config"])
        if store.experiment_key(canonical_config(config), run_versions(config)) == record["experiment_key"]:
            kept.append(path)
    return kept


def seed_store(session_store: Path) -> int:
    """Copy the current records of the folder (with their weights) and its pretrained models into
    ``session_store``; the number of records left out because their versions moved."""
    every = sorted(TARGET.glob("??/*.json.gz"))
    kept = current_records(TARGET)
    for path in kept:
        for source in [path, *path.parent.glob(path.name.removesuffix(".json.gz") + ".state.pt")]:
            target = session_store / source.relative_to(TARGET)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    for source in TARGET.glob("pretrained/*/*"):
        target = session_store / source.relative_to(TARGET)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    return len(every) - len(kept)


def record(workers: int, timeout_s: float, notebooks: list[str] | None = None) -> int:
    with tempfile.TemporaryDirectory(prefix="nbval-store-") as tmp:
        session_store = Path(tmp) / "store"
        session_store.mkdir()
        if notebooks:
            dropped = seed_store(session_store)
            print(f"{TARGET.relative_to(ROOT)}: {dropped} records with moved versions dropped; running {len(notebooks)} "
                  f"notebooks")
        env = {**os.environ, "SUBFL_STORE_DIR": str(session_store), "SUBFL_SCALE": "ci", "OMP_NUM_THREADS": "1"}
        command = [sys.executable, "-m", "pytest", *(notebooks or ["notebooks"]), "--nbval-lax", "-p",
                   "no:cacheprovider", "-q"]
        if workers > 1:
            command += ["-n", str(workers), "--dist", "loadfile"]
        try:
            done = subprocess.run(command, cwd=ROOT, env=env, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            print(f"the notebook checks did not finish within --timeout-s={timeout_s:g}; "
                  f"{TARGET.relative_to(ROOT)} left as it was", file=sys.stderr)
            return 1
        if done.returncode != 0:
            print(f"the notebook checks failed (exit {done.returncode}); {TARGET.relative_to(ROOT)} left as it was",
                  file=sys.stderr)
            return done.returncode
        files = sorted({p for pattern in KEPT for p in session_store.glob(pattern) if p.is_file()})
        staged = Path(tmp) / "nbval-store"
        for path in files:
            target = staged / path.relative_to(session_store)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
        (staged / "README.md").write_text(README)
        shutil.rmtree(TARGET, ignore_errors=True)
        shutil.copytree(staged, TARGET)
    size = sum(p.stat().st_size for p in TARGET.rglob("*") if p.is_file())
    print(f"{TARGET.relative_to(ROOT)}: {len(files)} files, {size / 1e6:.1f} MB")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers (default 2; 1: one process)")
    parser.add_argument("--timeout-s", type=float, default=3600.0, help="give up after this (default 3600)")
    parser.add_argument("--notebooks", nargs="+", metavar="NOTEBOOK",
                        help="run only these notebooks, keeping the folder's current records (see above)")
    args = parser.parse_args(argv)
    missing = [n for n in args.notebooks or [] if not (ROOT / n).is_file()]
    if missing:
        parser.error(f"--notebooks: no such notebook {missing[0]!r}; accepted: paths of notebooks/<chapter>/<page>.ipynb")
    if args.workers < 1:
        parser.error(f"--workers={args.workers} is not valid; accepted: an integer >= 1")
    if args.timeout_s <= 0:
        parser.error(f"--timeout-s={args.timeout_s:g} is not valid; accepted: seconds > 0")
    return record(args.workers, args.timeout_s, args.notebooks)


if __name__ == "__main__":
    sys.exit(main())
