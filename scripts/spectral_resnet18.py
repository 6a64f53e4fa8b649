"""Spectral sharding Table 1 at keep ratio 0.2 with the papers' model, ResNet-18 at full width, on a GPU.

The book's spectral pages run the FedAvg CNN on two CPU cores; this script runs the same setting
(:func:`subfl_book.catalog.spectral_config`, keep ratio 0.2: CIFAR-10 20k subset, Dirichlet(0.1) over 20
clients, 10 per round, 2 local epochs, SGD momentum 0.9, cosine schedule) with ResNet-18 (width 1.0) instead,
one process per row, all sharing one accelerator. Every run is an ordinary :func:`run_experiment` on
``device``; a run still going at ``--minutes`` is stopped and recorded with the rounds it completed (from its
checkpoint). The result is one JSON file with each run's configuration, history, wall time and upload bytes,
which the chapter page reads (it does not re-run these rows: they need an accelerator).

    python scripts/spectral_resnet18.py --out results/spectral_resnet18.json --device cuda --minutes 7
    python scripts/spectral_resnet18.py --out /tmp/smoke.json --device cpu --smoke   # seconds, any machine
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from subfl.experiments import RunResult, run_experiment
from subfl_book.catalog import SPECTRAL_LOW_LR, SPECTRAL_RESNET_NORM, spectral_config
from subfl.fl.engine import CHECKPOINT_NAME
from subfl.fl.ledger import Ledger

METHODS = ("fedavg", "origdrop", "splitmix", "topn", "prism", "prism+wallenius+cliplr", "unbiased+cliplr",
           "collective+cliplr")
KEPT_METRICS = ("accuracy", "train_loss", "diverged", "covered_fraction", "anme")


def row_config(method: str, lr: float, device: str, smoke: bool, rounds: int | None = None, seed: int = 0):
    """One row: the spectral training table's keep-ratio-0.2 run of ``method`` with ResNet-18 at full width, every
    row with batch-statistics BatchNorm (:data:`~subfl_book.catalog.SPECTRAL_RESNET_NORM`; the files recorded before
    2026-11-28 have FedAvg with running statistics). ``rounds`` replaces the table's 40 rounds (the cosine schedule
    spans the rounds run); ``seed`` as in the table's seeds: data split, initialisation and sampling."""
    config = spectral_config(method, "r0.2", scale="ci" if smoke else "cpu", lr=lr, seed=seed)
    config = config.replace(model="resnet18", width=0.25 if smoke else 1.0, norm=SPECTRAL_RESNET_NORM, device=device)
    return config if rounds is None else config.replace(rounds=rounds)


def worker(method: str, lr: float, device: str, smoke: bool, rounds: int | None, seed: int, out_dir: str,
           repacked: bool) -> None:
    torch.set_num_threads(2)
    # repacked: the files were re-written to travel (same arrays, other bytes), so the manifest's sha256 differs
    run_experiment(row_config(method, lr, device, smoke, rounds, seed), out_dir, cache=False, progress=False,
                   verify=not repacked)


def collect(method: str, lr: float, device: str, smoke: bool, rounds: int | None, seed: int, out_dir: Path,
            wall_s: float) -> dict:
    """The run's record: from its summary if it finished, else from its last checkpoint."""
    config = row_config(method, lr, device, smoke, rounds, seed)
    record = {"method": method, "lr": lr, "config": config.to_dict(), "wall_s": round(wall_s, 1)}
    if (out_dir / "summary.json").exists():
        result = RunResult(config, out_dir)
        history = list(result.history[["round", "metric", "value", "group"]].itertuples(index=False, name=None))
        timings = list(result.timings[["round", "stage", "seconds"]].itertuples(index=False, name=None))
        summary = result.summary
        record.update(complete=True, rounds=summary["rounds"], diverged_at=summary["diverged_at_round"],
                      upload_bytes=summary["upload_bytes"], engine_wall_s=summary["wall_time_s"])
    elif (out_dir / CHECKPOINT_NAME).exists():
        saved = torch.load(out_dir / CHECKPOINT_NAME, map_location="cpu", weights_only=False)
        history, timings = saved["history"], saved["timings"]
        record.update(complete=False, rounds=saved["round"], diverged_at=saved["round"] if saved.get("diverged")
                      else None, upload_bytes=Ledger(saved["ledger"]).total_bytes("up"),
                      engine_wall_s=saved["elapsed"])
    else:
        history, timings = [], []
        record.update(complete=False, rounds=0, diverged_at=None, upload_bytes=None, engine_wall_s=None)
    record["history"] = [[int(r), m, float(v), g] for r, m, v, g in history if m in KEPT_METRICS]
    stages: dict[str, float] = {}
    for _, stage, seconds in timings:
        stages[stage] = stages.get(stage, 0.0) + seconds
    record["seconds_per_round"] = {k: v / max(1, record["rounds"]) for k, v in stages.items()}
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="the JSON file to write (required)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--minutes", type=float, default=7.0, help="wall-clock limit for all rows together")
    parser.add_argument("--lr", type=float, default=SPECTRAL_LOW_LR, help="learning rate of every row (default: the "
                        "spectral tables' lower rate, at which no strategy diverged on the CNN)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of every row (default: the table's 40)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every row (default 0)")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--repacked-data", default="", metavar="NOTE",
                        help="the data files are a re-written copy (their checksums differ from the manifest's): "
                             "skip the checksum and record NOTE, which says what the copy holds")
    parser.add_argument("--smoke", action="store_true", help="ci-scale sizes and a quarter-width ResNet-18")
    parser.add_argument("--worker", nargs=2, metavar=("METHOD", "OUT_DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.minutes <= 0:
        raise SystemExit(f"--minutes must be > 0, got {args.minutes}")
    if args.worker:
        worker(args.worker[0], args.lr, args.device, args.smoke, args.rounds, args.seed, args.worker[1],
               bool(args.repacked_data))
        return
    if args.seed < 0:
        raise SystemExit(f"--seed must be >= 0, got {args.seed}")
    if args.rounds is not None and args.rounds < 1:
        raise SystemExit(f"--rounds must be >= 1, got {args.rounds}")
    if not args.out:
        raise SystemExit("--out is required: the JSON file to write")
    methods = [m for m in args.methods.split(",") if m]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        raise SystemExit(f"--methods: {', '.join(unknown)} not valid; accepted: {', '.join(METHODS)}")
    root = Path(tempfile.mkdtemp(prefix="spectral-resnet18-"))
    run_dirs = {m: root / m.replace("+", "_") for m in methods}
    started = time.time()
    procs = {}
    for method in methods:
        cmd = [sys.executable, __file__, "--worker", method, str(run_dirs[method]),
               "--lr", str(args.lr), "--device", args.device, "--seed", str(args.seed)] + \
            (["--smoke"] if args.smoke else []) + (["--rounds", str(args.rounds)] if args.rounds else []) + \
            (["--repacked-data", args.repacked_data] if args.repacked_data else [])
        run_dirs[method].mkdir()
        log = open(run_dirs[method] / "stderr.log", "w")
        procs[method] = (subprocess.Popen(cmd, stderr=log), time.time())
    deadline = started + 60 * args.minutes
    finished: dict[str, float] = {}
    exit_codes: dict[str, int | None] = {}
    while len(finished) < len(procs) and time.time() < deadline:
        for method, (proc, t0) in procs.items():
            if method not in finished and proc.poll() is not None:
                finished[method] = time.time() - t0
                exit_codes[method] = proc.returncode
                print(f"{method}: exit {proc.returncode} after {finished[method]:.0f} s", flush=True)
        time.sleep(2)
    for method, (proc, t0) in procs.items():
        if method not in finished:
            proc.kill()
            proc.wait()
            finished[method] = time.time() - t0
            exit_codes[method] = None
            print(f"{method}: stopped at the time limit after {finished[method]:.0f} s", flush=True)
    runs = [collect(m, args.lr, args.device, args.smoke, args.rounds, args.seed, run_dirs[m], finished[m])
            for m in methods]
    for r in runs:
        r["exit_code"] = exit_codes[r["method"]]
        if r["exit_code"]:
            r["error"] = (run_dirs[r["method"]] / "stderr.log").read_text()[-2000:]
            print(f"{r['method']} failed:\n{r['error']}", flush=True)
    accelerator = torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor() or "cpu"
    out = {"script": "scripts/spectral_resnet18.py", "argv": sys.argv[1:], "device": args.device,
           "accelerator": accelerator, "torch": torch.__version__, "python": platform.python_version(),
           "time_limit_min": args.minutes, "seed": args.seed,
           "data": args.repacked_data or "the data root's files, checksums verified",
           "date": time.strftime("%Y-%m-%d", time.gmtime(started)), "runs": runs}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    for r in runs:
        acc = [v for _, m, v, g in r["history"] if m == "accuracy" and g == "global"]
        print(f"{r['method']:>24}: {r['rounds']} rounds{'' if r['complete'] else ' (stopped)'}, "
              f"final accuracy {acc[-1] if acc else float('nan'):.4f}", flush=True)


if __name__ == "__main__":
    main()
