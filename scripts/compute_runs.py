"""Compute the runs of a plan into a store folder, several one-thread processes sharing one device.

A plan is a JSON list of ``{"config": ExperimentConfig.to_dict(), "keep_state": bool}``, optionally with
``"analyses": [[name, params], ...]`` (:mod:`subfl_book.final_analyses`, recorded with the run) (``scripts/plan_runs.py``
writes one: the runs the book's stale pages read that the store lacks). Each run is an ordinary
:func:`subfl.experiments.run_experiment` with ``device`` put into its config, so its key and its record name the
device and the torch version it ran with (:func:`subfl.experiments.provenance.environment_class`); a page reads it
through the store's experiment index when no run of its own environment is recorded
(:func:`subfl_book.store.run_experiment`). Runs are taken in plan order; at ``--minutes`` no new run starts and the
ones still going are stopped (the records written so far stay; a stopped run's checkpoint in ``--work`` lets the
next call resume it). Killing the planner stops its workers too: SIGTERM/SIGHUP through its handler, and any other
end (SIGKILL included) within ``PARENT_POLL_S``, as each worker exits when its parent is gone. With ``--pack DIR``
the new records are
also written, after every finished run, into tar files of at most 15 MB each (``store-1.tar`` …), for a machine
that hands back only a few files.

A run the store already records, computed again because a page now asks for its final weights or analyses, must
give the record's history again before anything is written: training is chaotic, and kernels of another CPU round
differently, so a recomputation on another machine can end points away from the record the pages read. Such a run
is logged ``differs`` (the first history value that moved, and both machines) and the store is left as it was;
``--replace-differing`` replaces the record instead, and the pages that read it go stale.

    python scripts/compute_runs.py plan.json --device cuda --jobs 12 --store store --minutes 8 --pack $OUT
    python scripts/compute_runs.py plan.json --device cpu --jobs 1 --store /tmp/s --limit 1   # any machine
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import multiprocessing
import os
import platform
import shutil
import signal
import sys
import tarfile
import time
from pathlib import Path

PART_BYTES = 15 * 2**20


def compute(entry: dict, device: str, store_dir: str, work_dir: str, data_root: str | None,
            verify: bool = True, replace_differing: bool = False) -> dict:
    """One run of the plan, recorded into ``store_dir``; returns its key, status and wall time.

    ``verify=False``: do not check the data files against the manifest's sha256 (a copy re-packed to travel whose
    arrays the caller has checked; :func:`subfl.experiments.runner.prepare_data`)."""
    import torch

    torch.set_num_threads(1)  # the book's runs use one intra-op thread (part of the run key's environment class)
    from subfl.experiments import ExperimentConfig
    from subfl.experiments import run_experiment as compute_run
    from subfl_book.store import (RecordDiffers, book_key, hardware, record_pretrained_cache, recorded_enough,
                                  save_record, seed_pretrained_cache)

    config = ExperimentConfig.from_dict(entry["config"]).replace(device=device)
    key = book_key(config)
    root = Path(store_dir)
    keep_state = bool(entry.get("keep_state", False))
    analyses = entry.get("analyses") or []
    if recorded_enough(key, root, keep_state, analyses):
        return {"key": key, "status": "present", "label": config.label(), "wall_s": 0.0}
    start = time.perf_counter()
    work = Path(work_dir) / key[:24]
    seed_pretrained_cache(root / "pretrained")  # a finetuning run starts from the store's pretrained weights
    result = compute_run(config, work, cache=False, data_root=data_root, progress=False, verify=verify)
    try:
        save_record(result, key, keep_state=keep_state, data_root=data_root, root=root, verify=verify,
                    analyses=analyses, replace_differing=replace_differing)
    except RecordDiffers as differs:  # weights or analyses of another run than the record's: nothing written
        row = {"key": key, "status": "differs", "label": config.label(),
                "wall_s": round(time.perf_counter() - start, 1), "difference": differs.difference,
                "recorded_final_accuracy": (differs.recorded.get("summary") or {}).get("final_accuracy"),
                "computed_final_accuracy": result.summary.get("final_accuracy"),
                "recorded_hardware": differs.recorded.get("hardware"), "this_hardware": hardware(device),
                "kept": "the store's record; nothing of this run was written (--replace-differing replaces it)"}
        shutil.rmtree(work, ignore_errors=True)   # after the row: the result reads its summary from there
        return row
    if config.scale != "ci":
        record_pretrained_cache(root / "pretrained")  # a model this run pretrained outlives the machine
    shutil.rmtree(work, ignore_errors=True)
    return {"key": key, "status": "diverged" if result.diverged else "done", "label": config.label(),
            "wall_s": round(time.perf_counter() - start, 1), "final_accuracy": result.summary.get("final_accuracy")}


PARENT_POLL_S = 5.0
"""How often a worker checks that the process that started it is still alive."""


def _exit_with_parent(parent: int) -> None:
    """Worker initializer: end this worker when ``parent`` (the ``compute_runs`` process) is gone, so that killing
    the planner never leaves workers computing runs the next planner would start again (two processes on one run
    folder; the run's checkpoint lets the next planner resume it instead)."""
    import threading

    def watch() -> None:
        while True:
            time.sleep(PARENT_POLL_S)
            if os.getppid() != parent:
                os._exit(3)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _stop_workers(pool: cf.ProcessPoolExecutor) -> None:
    for process in list(getattr(pool, "_processes", {}).values()):
        process.terminate()


def pack(store_dir: Path, since: float, out: Path) -> list[Path]:
    """Tar the records written after ``since`` into ``out/store-<i>.tar`` parts of at most :data:`PART_BYTES`."""
    files = sorted((p for p in store_dir.rglob("*") if p.is_file() and p.stat().st_mtime >= since),
                   key=lambda p: p.stat().st_mtime)
    parts: list[list[Path]] = [[]]
    size = 0
    for f in files:
        if parts[-1] and size + f.stat().st_size > PART_BYTES:
            parts.append([])
            size = 0
        parts[-1].append(f)
        size += f.stat().st_size
    written = []
    for i, group in enumerate(p for p in parts if p):
        target = out / f"store-{i + 1}.tar"
        tmp = target.with_suffix(".tmp")
        with tarfile.open(tmp, "w") as tar:
            for f in group:
                tar.add(f, arcname=str(f.relative_to(store_dir)))
        tmp.replace(target)
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("plan", nargs="+", type=Path, help="plan JSON file(s), runs taken in order")
    parser.add_argument("--device", required=True, help="cpu | cuda | cuda:<i> | mps")
    parser.add_argument("--jobs", type=int, default=1, help="processes at a time (default 1)")
    parser.add_argument("--store", type=Path, required=True, help="store folder the records go into")
    parser.add_argument("--work", type=Path, default=Path(".subfl-work/compute"), help="checkpoints of runs going")
    parser.add_argument("--data-root", default=None, help="data folder (default $SUBFL_DATA_ROOT)")
    parser.add_argument("--minutes", type=float, default=None, help="start no run after this, stop the rest")
    parser.add_argument("--limit", type=int, default=None, help="only the first N runs of the plan")
    parser.add_argument("--pack", type=Path, default=None, help="also write the new records as tar parts here")
    parser.add_argument("--log", type=Path, default=None, help="JSON-lines log of finished runs")
    parser.add_argument("--replace-differing", action="store_true",
                        help="replace a stored record when computing it again (for its weights or analyses) gives "
                             "another history; without it such a run is logged 'differs' and nothing is written")
    parser.add_argument("--no-verify", action="store_true",
                        help="skip the data files' sha256 check (a re-packed copy whose arrays were checked)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs={args.jobs} is not valid; accepted: an integer >= 1")
    if args.minutes is not None and args.minutes <= 0:
        parser.error(f"--minutes={args.minutes} is not valid; accepted: a positive number")
    entries, seen = [], set()
    for path in args.plan:
        for entry in json.loads(path.read_text()):
            marker = json.dumps(entry["config"], sort_keys=True)
            if marker not in seen:
                seen.add(marker)
                entries.append(entry)
    entries = entries[:args.limit] if args.limit is not None else entries
    from subfl.experiments.runner import check_device_available

    check_device_available(args.device)
    args.store.mkdir(parents=True, exist_ok=True)
    started = time.time()
    deadline = None if args.minutes is None else time.monotonic() + 60 * args.minutes
    log = open(args.log, "a") if args.log else None
    print(f"{len(entries)} runs on {args.device} ({platform.node()}), {args.jobs} processes", flush=True)
    from subfl_book.store import hardware

    print(json.dumps({"machine": hardware(args.device)}), flush=True)
    done = 0
    pool = cf.ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn"),
                                  initializer=_exit_with_parent, initargs=(os.getpid(),))

    def on_signal(signum: int, frame: object) -> None:   # SIGTERM / SIGHUP: the workers go too, then exit
        _stop_workers(pool)
        raise SystemExit(128 + signum)

    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, on_signal)
    try:
        pending = {pool.submit(compute, e, args.device, str(args.store), str(args.work), args.data_root,
                               not args.no_verify, args.replace_differing): e
                   for e in entries}
        while pending:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            finished, _ = cf.wait(pending, timeout=timeout, return_when=cf.FIRST_COMPLETED)
            if not finished:
                print(f"--minutes reached: {len(pending)} runs not finished, stopped", flush=True)
                for future in pending:
                    future.cancel()
                _stop_workers(pool)
                break
            for future in finished:
                entry = pending.pop(future)
                try:
                    row = future.result()
                except Exception as error:  # one failed run does not stop the others; the log says why
                    row = {"status": "failed", "error": f"{type(error).__name__}: {error}"[:500],
                           "config": entry["config"]}
                done += 1
                row["t_s"] = round(time.time() - started, 1)
                print(json.dumps(row), flush=True)
                if log:
                    log.write(json.dumps(row) + "\n")
                    log.flush()
                if args.pack:
                    pack(args.store, started, args.pack)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    if args.pack:
        pack(args.store, started, args.pack)
    print(f"{done} of {len(entries)} runs finished in {time.time() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
