"""The spectral methods' orthogonal-space refresh, solver against solver (one run, same process, same threads).

Times :func:`subfl.models.spectral_refresh.refresh_factors` — every decomposed layer's thin SVD — with the
``exact`` solver (LAPACK's SVD in float64) and the ``gram`` solver (eigendecomposition of the smaller Gram matrix
in float64) on freshly initialised models at full width: ResNet-18 (19 decomposed convolutions, the papers'
model) and the FedAvg CNN (the book's cpu-scale model, 2 decomposed layers). Median of ``--repeats`` calls; the
ratio is the speed-up of ``gram``. Also reports how far the two agree (largest relative difference of the
singular values, largest entry of ``U'V' - W``).

    python benchmarks/bench_svd_refresh.py [--repeats 5] [--threads 2]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from subfl.models import build_model
from subfl.models.factorized import layer_specs
from subfl.models.spectral_refresh import SVD_SOLVERS, refresh_factors

MODELS = {"resnet18": dict(input_shape=(3, 32, 32)), "cnn": dict(input_shape=(3, 32, 32))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = parser.parse_args()
    if args.repeats < 1:
        raise SystemExit(f"--repeats must be >= 1, got {args.repeats}")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    for name, kw in MODELS.items():
        model = build_model(name, num_classes=10, width=1.0, **kw)
        specs = layer_specs(model)
        weights = model.state_dict()
        seconds, factors = {}, {}
        for solver in SVD_SOLVERS:
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                factors[solver] = refresh_factors(weights, specs, solver)
                times.append(time.perf_counter() - start)
            seconds[solver] = statistics.median(times)
        rel = max(((factors["gram"][n].singular_values - factors["exact"][n].singular_values).abs()
                   / factors["exact"][n].singular_values.clamp_min(1e-30)).max().item() for n in specs)
        recon = max((factors["gram"][n].u @ factors["gram"][n].v
                     - weights[f"{n}.weight"].reshape(s.out_features, s.in_features)).abs().max().item()
                    for n, s in specs.items())
        print(f"{name} (width 1, {len(specs)} decomposed layers, {torch.get_num_threads()} threads): refresh exact "
              f"{seconds['exact']:.3f} s, gram {seconds['gram']:.3f} s -> {seconds['exact'] / seconds['gram']:.1f}x; "
              f"singular values agree to {rel:.1e} (relative), U'V' - W up to {recon:.1e}", flush=True)


if __name__ == "__main__":
    main()
