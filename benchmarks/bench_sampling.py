"""Timings of subfl.sampling on one layer of N = 512 singular values, n = 51 kept terms.

Run: ``PYTHONPATH=lib python benchmarks/bench_sampling.py [repeats]``. Each line is the median of
``repeats`` calls timed with ``time.perf_counter``. Targets: one CPS draw (calibrated design) < 5 ms,
collective probabilities < 10 ms.
"""
from __future__ import annotations

import statistics
import sys
import time
from typing import Callable

import numpy as np

from subfl.sampling import (
    collective_inclusion,
    cps_design,
    prism_probabilities,
    sample_brewer,
    sample_cps,
    sample_min_support,
    sample_numpy_choice,
    schatten_inclusion,
    unbiased_inclusion,
    wallenius_inclusion,
)

N, n, CLIENTS = 512, 51, 10


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``fn()`` in milliseconds over ``repeats`` calls (after one warm-up call)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main(repeats: int = 50) -> int:
    rng = np.random.default_rng(0)
    lam = np.sort(rng.gamma(1.0, 1.0, N) ** 2)[::-1]  # a decaying spectrum
    pi = unbiased_inclusion(lam, n)
    design = cps_design(pi)
    weights = prism_probabilities(lam, r=n / N)
    rows = [
        ("unbiased_inclusion", lambda: unbiased_inclusion(lam, n), None),
        (f"collective_inclusion (C={CLIENTS})", lambda: collective_inclusion(lam, n, CLIENTS), 10.0),
        ("schatten_inclusion p=4 (kkt)", lambda: schatten_inclusion(lam, n, 4), None),
        ("wallenius_inclusion (fog)", lambda: wallenius_inclusion(weights, n), None),
        ("cps_design (calibration)", lambda: cps_design(pi), None),
        ("CPSDesign.sample (one draw)", lambda: design.sample(rng), 5.0),
        ("sample_cps (calibrate + draw)", lambda: sample_cps(pi, rng), None),
        ("sample_brewer", lambda: sample_brewer(pi, rng), None),
        ("sample_min_support", lambda: sample_min_support(pi, rng), None),
        ("sample_numpy_choice", lambda: sample_numpy_choice(weights, n, rng), None),
    ]
    print(f"subfl.sampling, N={N}, n={n}, median of {repeats} repeats (ms)")
    failed = 0
    for name, fn, target in rows:
        ms = median_ms(fn, repeats)
        verdict = ""
        if target is not None:
            ok = ms < target
            failed += not ok
            verdict = f"target < {target:g} ms: {'ok' if ok else 'MISSED'}"
        print(f"  {name:<36s} {ms:9.3f}  {verdict}")
    print(f"  (CPS calibration: {design.iterations} iterations, max error {design.max_error:.1e})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 50))
