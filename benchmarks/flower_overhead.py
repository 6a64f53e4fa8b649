"""What running on Flower costs: FedAvg four ways, each in a fresh process, repetitions interleaved.

1. ``plain``   — a plain PyTorch loop: sample clients, train each on its partition, average the weights, evaluate;
2. ``subfl``   — ``subfl run`` (the in-process engine, :func:`subfl.experiments.run_experiment`);
3. ``flower``  — Flower's simulation runtime with its stock ``FedAvg`` strategy and a minimal PyTorch ClientApp;
4. ``adapter`` — ``subfl run --engine flower`` (:func:`subfl.flower.simulation.simulate`).

All four train the same model (the dataset's usual model) on the same partition (``num_clients`` IID clients,
``clients_per_round`` per round, one local epoch, SGD, batch 32) and evaluate the global model on the same test set
after every round, with one torch thread per process (``OMP_NUM_THREADS=1``). Both Flower variants run one virtual
SuperNode per client, ``--cpus`` Ray workers. Reported per variant: wall time of the process, start-up (process start
until the first round begins: imports, data, Ray), time per round, and the peak resident memory of the whole process
tree (the process and every child: Ray's workers too), sampled every 0.1 s.

    python benchmarks/flower_overhead.py                     # Fashion-MNIST, 100 clients, 10/round, 5 rounds, 3 reps
    python benchmarks/flower_overhead.py --dataset digits --clients 10 --per-round 2 --rounds 2 --reps 1   # smoke
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VARIANTS = ("plain", "subfl", "flower", "adapter")


# ----- the measuring parent -------------------------------------------------------------------------------------
def _tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and all its descendants (0 once it is gone)."""
    try:
        import psutil
    except ImportError:  # psutil comes with Flower's simulation extra; without it, this process only
        try:
            return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            return 0
    try:
        root = psutil.Process(pid)
        total = root.memory_info().rss
        for child in root.children(recursive=True):
            try:
                total += child.memory_info().rss
            except psutil.Error:
                pass
        return total
    except psutil.Error:
        return 0


def measure(variant: str, args: argparse.Namespace, timeout_s: float) -> dict:
    """Run one variant in a fresh process; its JSON report plus wall time and peak tree RSS."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "FLWR_TELEMETRY_ENABLED": "0",
           "PYTHONWARNINGS": "ignore", "TQDM_DISABLE": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, __file__, "--child", variant, "--report", str(report), "--dataset", args.dataset,
               "--clients", str(args.clients), "--per-round", str(args.per_round), "--rounds", str(args.rounds),
               "--cpus", str(args.cpus), "--max-train", str(args.max_train), "--max-test", str(args.max_test)]
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, _tree_rss(proc.pid))
            if time.perf_counter() - t0 > timeout_s:
                os.killpg(proc.pid, 9)
                proc.wait()
                raise TimeoutError(f"{variant} did not finish within {timeout_s} s")
            time.sleep(0.1)
        wall = time.perf_counter() - t0
        err = proc.stderr.read()
        if proc.returncode != 0 or not report.exists():
            raise RuntimeError(f"{variant} failed ({proc.returncode}):\n{err[-3000:]}")
        out = json.loads(report.read_text())
    # start-up: process start until the first round begins (the child reports seconds since its own start, which is
    # within a few ms of t0); teardown: the wall time after the last round (Ray's shutdown, freeing memory)
    rounds = out["round_s"]
    later = rounds[1:] or rounds
    return {"variant": variant, "wall_s": wall, "startup_s": out["startup_s"], "first_round_s": rounds[0],
            "later_round_s": sum(later) / len(later), "per_round_s": sum(rounds) / len(rounds),
            "teardown_s": wall - out["startup_s"] - sum(rounds), "peak_rss_mb": peak / 2**20,
            "final_accuracy": out.get("accuracy")}


# ----- the variants (in the child process) ------------------------------------------------------------------------
T_START = time.perf_counter()
T_START_WALL = time.time()


def _engine_rounds(folder: Path) -> tuple[float, list[float]]:
    """(seconds from process start to the engine's first round, each round's seconds) of a finished run folder: the
    rounds from ``timings.csv`` (configure, local training, aggregation, evaluation), the start from the time
    ``history.csv`` was written minus the engine's wall time."""
    import pandas as pd

    timings = pd.read_csv(folder / "timings.csv")
    rounds = timings.groupby("round").seconds.sum().sort_index().tolist()
    wall = json.loads((folder / "summary.json").read_text())["wall_time_s"]
    return (folder / "history.csv").stat().st_mtime - wall - T_START_WALL, rounds


def _config(args):
    from subfl.experiments import make_config

    return make_config("fedavg", args.dataset, scale="cpu", num_clients=args.clients,
                       clients_per_round=args.per_round, rounds=args.rounds, local_epochs=1, batch_size=32,
                       max_train_samples=args.max_train or None, max_test_samples=args.max_test or None)


def _setup(args):
    import torch

    from subfl.experiments.runner import ModelFactory, prepare_data

    torch.set_num_threads(1)
    config = _config(args)
    dataset, test, parts = prepare_data(config)
    return config, dataset, test, parts, ModelFactory(config, dataset)


def _train(model, dataset, part, config, generator) -> int:
    import torch
    import torch.nn.functional as F

    from subfl.fl import ClientDataset

    opt = torch.optim.SGD(model.parameters(), lr=config.lr)
    data = ClientDataset(dataset.train, part)
    model.train()
    for x, y in data.batches(config.batch_size, generator):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return len(part)


def _accuracy(model, test) -> float:
    from subfl.fl.training import evaluate

    return evaluate(model, test)["accuracy"]


def child_plain(args) -> dict:
    import numpy as np
    import torch

    config, dataset, test, parts, factory = _setup(args)
    model = factory()
    rng = np.random.default_rng(0)
    t_first = time.perf_counter()
    marks = [t_first]
    for rnd in range(args.rounds):
        chosen = rng.choice(len(parts), args.per_round, replace=False)
        sums, total = None, 0
        for c in chosen:
            local = factory()
            local.load_state_dict(model.state_dict())
            n = _train(local, dataset, parts[c], config, torch.Generator().manual_seed(int(rnd * 10_000 + c)))
            state = local.state_dict()
            sums = {k: v * n for k, v in state.items()} if sums is None else {k: sums[k] + v * n for k, v in state.items()}
            total += n
        model.load_state_dict({k: (v / total).to(model.state_dict()[k].dtype) for k, v in sums.items()})
        acc = _accuracy(model, test)
        marks.append(time.perf_counter())
    return {"startup_s": t_first - T_START, "round_s": [b - a for a, b in zip(marks, marks[1:])], "accuracy": acc}


def child_subfl(args) -> dict:
    from subfl.experiments import run_experiment

    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        result = run_experiment(_config(args), tmp, cache=False, progress=False)
        startup, rounds = _engine_rounds(Path(tmp))
        accuracy = result.summary["final_accuracy"]
    return {"startup_s": startup, "round_s": rounds, "accuracy": accuracy}


def child_flower(args) -> dict:
    import torch
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg
    from flwr.simulation import run_simulation

    config, dataset, test, parts, factory = _setup(args)
    client = ClientApp()

    @client.train()
    def train(msg: Message, context: Context) -> Message:
        torch.set_num_threads(1)
        model = factory()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        cid = int(context.node_config["partition-id"])
        n = _train(model, dataset, parts[cid], config, torch.Generator().manual_seed(cid))
        return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()),
                                   "metrics": MetricRecord({"num-examples": n})}), reply_to=msg)

    marks: dict[int, float] = {}
    accuracy: list[float] = []
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        model = factory()

        def evaluate_fn(rnd: int, arrays: ArrayRecord) -> MetricRecord:
            marks[rnd] = time.perf_counter()
            if rnd:
                model.load_state_dict(arrays.to_torch_state_dict())
                accuracy.append(_accuracy(model, test))
            return MetricRecord({})

        strategy = FedAvg(fraction_train=args.per_round / args.clients, fraction_evaluate=0.0,
                          min_train_nodes=args.per_round, min_available_nodes=args.clients)
        strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()), num_rounds=args.rounds,
                       train_config=ConfigRecord({"lr": config.lr}), evaluate_fn=evaluate_fn)

    run_simulation(server, client, num_supernodes=args.clients,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": args.cpus, "num_gpus": 0, "include_dashboard": False,
                                                 "log_to_driver": False}})
    # round r is from the evaluation closing round r-1 to the one closing round r; round 1 includes starting the Ray
    # workers, which the stock strategy first contacts then (the adapter asks its nodes before round 1)
    return {"startup_s": marks[0] - T_START, "round_s": [marks[r] - marks[r - 1] for r in range(1, args.rounds + 1)],
            "accuracy": accuracy[-1] if accuracy else None}


def child_adapter(args) -> dict:
    import json as json_

    import torch

    from subfl.flower.simulation import simulate

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        simulate([(_config(args), tmp)], num_supernodes=args.clients, torch_threads=1, num_cpus=args.cpus)
        accuracy = json_.loads((Path(tmp) / "summary.json").read_text())["final_accuracy"]
        startup, rounds = _engine_rounds(Path(tmp))  # start-up includes the Ray workers answering the node query
    return {"startup_s": startup, "round_s": rounds, "accuracy": accuracy}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="fmnist")
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--per-round", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--cpus", type=int, default=2, help="Ray workers of the Flower variants")
    parser.add_argument("--max-train", type=int, default=0, help="cap on training samples (0: the dataset's)")
    parser.add_argument("--max-test", type=int, default=0, help="cap on test samples (0: the dataset's)")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per variant run")
    parser.add_argument("--out", default=None, help="CSV of every measurement")
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--report", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        Path(args.report).write_text(json.dumps(globals()[f"child_{args.child}"](args)))
        return 0
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variant(s) {unknown}; accepted: {', '.join(VARIANTS)}")
    rows = []
    for rep in range(args.reps):  # interleaved: every variant once per repetition, in a rotating order
        for variant in variants[rep % len(variants):] + variants[:rep % len(variants)]:
            row = {"rep": rep, **measure(variant, args, args.timeout)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"\nFedAvg on {args.dataset}: {args.clients} clients, {args.per_round} per round, {args.rounds} rounds, "
          f"{args.reps} repetition(s), medians")
    keys = ("wall_s", "startup_s", "first_round_s", "later_round_s", "per_round_s", "teardown_s", "peak_rss_mb")
    print(f"{'variant':10s} {'wall s':>8s} {'start-up s':>11s} {'round 1 s':>10s} {'rounds 2+ s':>12s} "
          f"{'s/round':>8s} {'teardown s':>11s} {'peak RSS MB':>12s} {'accuracy':>9s}")
    for variant in variants:
        mine = [r for r in rows if r["variant"] == variant]
        med = {k: statistics.median(r[k] for r in mine) for k in keys}
        acc = mine[-1]["final_accuracy"]
        print(f"{variant:10s} {med['wall_s']:8.2f} {med['startup_s']:11.2f} {med['first_round_s']:10.2f} "
              f"{med['later_round_s']:12.2f} {med['per_round_s']:8.2f} {med['teardown_s']:11.2f} "
              f"{med['peak_rss_mb']:12.0f} {acc if acc is None else round(acc, 4)!s:>9s}")
    if args.out:
        import csv

        with open(args.out, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
