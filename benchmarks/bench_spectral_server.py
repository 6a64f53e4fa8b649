"""Server overhead of spectral sharding per round, as a fraction of local-training time (one run per strategy).

PriSM reports (3.27 + 0.11 + 0.96) s of server work (SVD refresh + sampling + aggregation) against 36.82 s of
local training per round for ResNet-18 (≈ 12 %). Here: the given strategies on CIFAR-10 with ResNet-18 at the
given width, every client at keep ratio 0.2, a few rounds. The engine times `configure` (sampling and building
each client's task) and `aggregate` (per-term averaging, rebuilding W and the SVD refresh of every decomposed
layer) separately from the clients' local training. With more than one round the first is left out of the means
(it holds one-time start-up work: CUDA context, cuDNN autotuning, the first allocations).

    python benchmarks/bench_spectral_server.py [--width 0.25] [--rounds 2] [--clients 4] [--samples 400]
    python benchmarks/bench_spectral_server.py --model cnn --width 1 --clients 10 --samples 10000 \\
        --local-epochs 2 --strategies prism --svd-solvers exact,gram --threads 1
    python benchmarks/bench_spectral_server.py --device cuda --width 1 --clients 10 --samples 5000 \\
        --local-epochs 2 --rounds 3 --out /tmp/server_overhead.json
"""
from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import torch

from subfl.experiments import make_config, run_experiment
from subfl.models.spectral_refresh import SVD_SOLVERS


def measure(strategy: str, solver: str, args: argparse.Namespace) -> dict:
    """One run of ``strategy`` with refresh solver ``solver``; its per-round seconds of every engine stage (mean
    over the kept rounds)."""
    options = {} if strategy == "fedavg" else {"svd_solver": solver}
    config = make_config(strategy, "cifar10", args.model, scale="cpu", width=args.width, rounds=args.rounds,
                         num_clients=args.clients, clients_per_round=args.clients, local_epochs=args.local_epochs,
                         heterogeneity="0.2", max_train_samples=args.samples, max_test_samples=200,
                         eval_every=args.rounds, lr=0.01, device=args.device, method_options=options)
    with tempfile.TemporaryDirectory() as tmp:
        timings = run_experiment(config, tmp, cache=False, progress=False).timings
    kept = timings[timings["round"] > 1] if args.rounds > 1 else timings
    rounds = kept["round"].nunique()
    stages = (kept.groupby("stage").seconds.sum() / rounds).to_dict()
    server = stages.get("configure", 0.0) + stages.get("aggregate", 0.0)
    return {"strategy": strategy, "svd_solver": solver if options else None, "rounds_kept": int(rounds),
            "batch_size": config.batch_size,
            "seconds_per_round": stages, "server_over_local": server / stages["local_train"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet18", help="resnet18 (the papers') or cnn (the book's cpu scale)")
    parser.add_argument("--width", type=float, default=0.25)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--samples", type=int, default=400, help="training samples in total")
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--strategies", default="prism,unbiased")
    parser.add_argument("--svd-solvers", default="exact", help="refresh solvers to time each strategy with "
                        "(comma-separated: exact, gram)")
    parser.add_argument("--device", default="cpu", help="torch device of the clients' training (default cpu)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--out", default=None, help="also write the measurements to this JSON file")
    parser.add_argument("--repacked-data", default="", metavar="NOTE",
                        help="the data files are a re-written copy (their checksums differ from the manifest's): "
                             "skip the checksum and record NOTE, which says what the copy holds")
    args = parser.parse_args()
    for name in ("rounds", "clients", "samples", "local_epochs"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.repacked_data:  # same arrays, other bytes: the manifest's sha256 differs
        from subfl.data import datasets
        datasets.verify_file = lambda path, entry: None
    solvers = [s for s in args.svd_solvers.split(",") if s]
    bad = sorted(set(solvers) - set(SVD_SOLVERS))
    if bad or not solvers:
        raise SystemExit(f"--svd-solvers: {', '.join(bad) or 'none given'} not valid; accepted: "
                         f"{', '.join(SVD_SOLVERS)}")
    results = []
    for strategy in [s for s in args.strategies.split(",") if s]:
        for solver in solvers[:1] if strategy == "fedavg" else solvers:
            r = measure(strategy, solver, args)
            results.append(r)
            s = r["seconds_per_round"]
            print(f"{strategy}" + (f" ({solver} SVD)" if r["svd_solver"] else "") + f": {args.model} width "
                  f"{args.width} on {args.device}, {args.clients} clients at r = 0.2, "
                  f"{args.samples // args.clients} samples each, {args.local_epochs} local epoch(s), per round: "
                  f"configure {s.get('configure', 0):.3f} s, aggregate + SVD refresh {s.get('aggregate', 0):.3f} s, "
                  f"local training {s['local_train']:.2f} s → server overhead {r['server_over_local']:.1%} of local "
                  f"training", flush=True)
    if args.out:
        accelerator = torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor()
        out = {"script": "benchmarks/bench_spectral_server.py", "args": vars(args), "accelerator": accelerator,
               "torch": torch.__version__, "cpu_threads": torch.get_num_threads(),
               "date": time.strftime("%Y-%m-%d", time.gmtime()), "results": results}
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
