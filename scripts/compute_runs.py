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


def history_difference(recorded: list[list], computed: list[list]) -> str | None:
    """None when two histories (record form) are identical, else where they first part: the row's round, metric
    and group with both values."""
    if json.dumps(recorded, sort_keys=True) == json.dumps(computed, sort_keys=True):
        return None
    old, new = dict((c, v) for c, v in recorded), dict((c, v) for c, v in computed)
    if set(old) != set(new) or len(old.get("value", [])) != len(new.get("value", [])):
        return (f"the histories have different shapes ({len(old.get('value', []))} rows recorded, "
                f"{len(new.get('value', []))} computed)")
    for i, (a, b) in enumerate(zip(old["value"], new["value"])):
        if json.dumps(a) != json.dumps(b) or any(old[c][i] != new[c][i] for c in old if c != "value"):
            where = ", ".join(f"{c} {old[c][i]}" for c in ("round", "metric", "group") if c in old)
            return f"first at {where}: recorded {a!r}, computed {b!r}"
    return "the histories differ outside their values"


def compute(entry: dict, device: str, store_dir: str, work_dir: str, data_root: str | None,
            verify: bool = True, replace_differing: bool = False) -> dict:
    """One run of the plan, recorded into ``store_dir``; returns its key, status and wall time.

    ``verify=False``: do not check the data files against the manifest's sha256 (a copy re-packed to travel whose
    arrays the caller has checked; :func:`subfl.experiments.runner.prepare_data`)."""
    import torch

    torch.set_num_threads(1)  # the book's runs use one intra-op thread (part of the run key's environment class)
    from subfl.experiments import ExperimentConfig
    from subfl.experiments import run_experiment as compute_run
    from subfl_book.store import _frame_columns as frame_columns
    from subfl_book.store import book_key, record_pretrained_cache, recorded_enough, save_record, seed_pretrained_cache

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
    recorded = _recorded(key, root)
    difference = None if recorded is None else history_difference(   # both as the record's JSON holds them
        recorded["history"], json.loads(json.dumps(frame_columns(result.history), default=str)))
    if difference is not None and not replace_differing:  # weights or analyses of another run than the record's
        summary = recorded.get("summary") or {}
        row = {"key": key, "status": "differs", "label": config.label(),
                "wall_s": round(time.perf_counter() - start, 1), "difference": difference,
                "recorded_final_accuracy": summary.get("final_accuracy"),
                "computed_final_accuracy": result.summary.get("final_accuracy"),
                "recorded_hardware": recorded.get("hardware"), "this_hardware": machine(device),
                "kept": "the store's record; nothing of this run was written (--replace-differing replaces it)"}
        shutil.rmtree(work, ignore_errors=True)
        return row
    save_record(result, key, keep_state=keep_state, data_root=data_root, root=root, verify=verify, analyses=analyses)
    if config.scale != "ci":
        record_pretrained_cache(root / "pretrained")  # a model this run pretrained outlives the machine
    shutil.rmtree(work, ignore_errors=True)
    return {"key": key, "status": "diverged" if result.diverged else "done", "label": config.label(),
            "wall_s": round(time.perf_counter() - start, 1), "final_accuracy": result.summary.get("final_accuracy")}


def _recorded(key: str, root: Path) -> dict | None:
    """The store's record of ``key`` under ``root``, or None."""
    import gzip

    from subfl_book.store import record_path

    path = record_path(key, root)
    return json.loads(gzip.decompress(path.read_bytes())) if path.exists() else None


def machine(device: str) -> dict:
    """This machine as a record names it (:func:`subfl_book.store.hardware`), with the CPU's vendor, family, model
    and name where the system tells them (two CPUs of one instruction set can still round differently)."""
    from subfl_book.store import hardware

    out = dict(hardware(device))
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        fields = {}
        for line in cpuinfo.read_text(errors="replace").splitlines():
            name, _, value = line.partition(":")
            if not name.strip() and fields:
                break   # the first processor's block is enough
            fields.setdefault(name.strip(), value.strip())
        out.update({k: fields[f] for k, f in (("cpu_vendor", "vendor_id"), ("cpu_family", "cpu family"),
                                               ("cpu_model", "model"), ("cpu_name", "model name")) if f in fields})
    return out


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
    print(json.dumps({"machine": machine(args.device)}), flush=True)
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
