"""Engine overhead relative to pure local training, measured in one run.

Runs FedAvg on Fashion-MNIST (cpu preset, a few rounds) and splits the wall time into the engine's stages
(configure, local training, aggregation, evaluation, and the rest: ledger, client selection, checkpoints).
Also times the same local training steps outside the engine (a bare loop over the same mini-batches) to
report the engine's per-client overhead as a ratio.

    python benchmarks/bench_engine.py [--rounds 3] [--dataset fmnist]
"""
from __future__ import annotations

import argparse
import tempfile
import time

import torch
import torch.nn.functional as F

from subfl.experiments import make_config, prepare_data, run_experiment
from subfl.experiments.runner import ModelFactory
from subfl.fl import ClientDataset, torch_generator


def bare_local_training(config, rounds: int) -> float:
    """Seconds for the same number of client updates as a plain PyTorch loop (no engine)."""
    dataset, _, parts = prepare_data(config)
    factory = ModelFactory(config, dataset)
    model = factory()
    t0 = time.perf_counter()
    for r in range(rounds):
        for c in range(config.clients_per_round):
            opt = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
            data = ClientDataset(dataset.train, parts[c])
            for _ in range(config.local_epochs):
                for x, y in data.batches(config.batch_size, torch_generator(0, r, c)):
                    opt.zero_grad()
                    F.cross_entropy(model(x), y).backward()
                    opt.step()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dataset", default="fmnist")
    args = parser.parse_args()
    config = make_config("fedavg", args.dataset, scale="cpu", rounds=args.rounds, eval_every=args.rounds)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        result = run_experiment(config, tmp, cache=False, progress=False)
        wall = time.perf_counter() - t0
        stages = result.timings.groupby("stage").seconds.sum()
    bare = bare_local_training(config, args.rounds)
    local = stages.get("local_train", 0.0)
    print(f"FedAvg {args.dataset}, cpu preset, {args.rounds} rounds × {config.clients_per_round} clients")
    print(f"  wall time (incl. data loading)   {wall:8.2f} s")
    for stage, seconds in stages.items():
        print(f"  {stage:32s} {seconds:8.2f} s  ({seconds / wall:6.1%})")
    print(f"  bare PyTorch loop, same updates  {bare:8.2f} s")
    print(f"  engine local_train / bare loop   {local / bare:8.3f}")
    print(f"  engine overhead outside training and evaluation: "
          f"{(wall - local - stages.get('evaluate', 0.0)) / local:.1%} of local-training time")


if __name__ == "__main__":
    main()
