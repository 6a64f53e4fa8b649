"""Server overhead of spectral sharding per round, as a fraction of local-training time (one run).

PriSM reports (3.27 + 0.11 + 0.96) s of server work (SVD refresh + sampling + aggregation) against 36.82 s of
local training per round for ResNet-18 (≈ 12 %). Here: the `prism` and `unbiased` strategies on CIFAR-10 with
ResNet-18 at the given width, heterogeneity 0.2, a few rounds. The engine times `configure` (sampling and
building each client's task) and `aggregate` (per-term averaging, rebuilding W and the SVD refresh of every
decomposed layer) separately from the clients' local training.

    python benchmarks/bench_spectral_server.py [--width 0.25] [--rounds 2] [--clients 4] [--samples 400]
"""
from __future__ import annotations

import argparse
import tempfile

from subfl.experiments import make_config, run_experiment


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--width", type=float, default=0.25)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--samples", type=int, default=400, help="training samples in total")
    parser.add_argument("--strategies", default="prism,unbiased")
    args = parser.parse_args()
    for strategy in args.strategies.split(","):
        config = make_config(strategy, "cifar10", "resnet18", scale="cpu", width=args.width, rounds=args.rounds,
                             num_clients=args.clients, clients_per_round=args.clients, local_epochs=1,
                             heterogeneity="0.2", max_train_samples=args.samples, max_test_samples=200,
                             eval_every=args.rounds, lr=0.01)
        with tempfile.TemporaryDirectory() as tmp:
            t = run_experiment(config, tmp, cache=False, progress=False).timings
        stages = t.groupby("stage").seconds.sum() / args.rounds
        local = stages["local_train"]
        server = stages["configure"] + stages["aggregate"]
        print(f"{strategy}: ResNet-18 width {args.width}, {args.clients} clients at r = 0.2, "
              f"{args.samples // args.clients} samples each, per round: configure {stages['configure']:.3f} s, "
              f"aggregate + SVD refresh {stages['aggregate']:.3f} s, local training {local:.2f} s "
              f"→ server overhead {server / local:.1%} of local training")


if __name__ == "__main__":
    main()
