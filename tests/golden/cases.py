"""Golden runs: one tiny deterministic run per registered method and per behaviour-changing option set the book uses.

Each case's history and final-state digests are recorded in ``goldens.json`` together with the versions the run
executed (:func:`subfl.experiments.provenance.run_versions`), the machine it was recorded on, and a
machine-independent summary of both (:func:`~subfl.experiments.provenance.history_summary`,
:func:`~subfl.experiments.provenance.state_summary`). ``test_goldens.py`` fails when

* the run changed while no version moved (a behaviour change must bump a version): its digests differ from the
  recorded ones *and* its summary deviates from the recorded one by more than :data:`TOLERANCE`. The digests are
  bit-exact on the CPU they were recorded on; another CPU (AVX2 against AVX-512 kernels, another BLAS path) ends
  the same run a few ulps away — up to 9.3e-6 across the cases, scalar or AVX2 against AVX-512 kernels — so
  there the summary decides;
* a version moved and the golden was not re-recorded,
* two cases give the same digests without a declared equivalence (:data:`EQUIVALENT`).

Re-record after a deliberate change (and a version bump) with ``python tests/golden/cases.py --record``.
Every run is on the CPU with one torch thread.
"""
from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from subfl.experiments import make_config, run_experiment
from subfl.experiments.provenance import (history_digest, history_summary, run_versions, state_digest,
                                         state_summary, summary_deviation)

GOLDENS = Path(__file__).with_name("goldens.json")

TOLERANCE = 1e-4
"""Largest :func:`~subfl.experiments.provenance.summary_deviation` (about a relative change of every entry) a run
may show against its golden when its digests differ: 10 times the largest seen over all cases between one CPU's
AVX-512 kernels and its AVX2 or scalar ones (9.3e-6 in a state, a tiny GPT's key bias, which attention makes
numerical noise; 4.8e-7 in a history), and a tenth of what a 1 % change of FedAvg's learning rate moves in the
case's two rounds (``test_goldens.py``)."""

_IMAGE = dict(dataset="digits", model="mlp", scale="ci", heterogeneity="uniform:0.25,0.5,1.0",
              max_train_samples=200, max_test_samples=100, model_options={"hidden": (32, 32)})
_SPECTRAL = dict(_IMAGE, heterogeneity="0.1")  # keep 0.1: top-n and Collective's samples differ
_FEDP3 = dict(_IMAGE, model="fedp3_mlp", model_options={"hidden": (32, 32, 32)}, local_test_fraction=0.2)
_TOKENS = dict(dataset="shakespeare_tokens", model="tiny_gpt", partition="natural", scale="ci", num_clients=4,
               clients_per_round=2, rounds=2, heterogeneity="0.5:0.5,1.0:0.5", optimizer="adamw", lr=3e-4,
               local_steps=2, batch_size=4, max_test_samples=32,
               dataset_options={"max_users": 4, "seq_len": 16, "stride": 16, "tokenizer_max_chars": 300000,
                                "vocab_size": 512},
               model_options={"layers": 2, "embed_dim": 24, "heads": 2})
_BUDGETS = {"0.5": {"memory_mb": 1e6}, "1": {"memory_mb": 1e6}}
_PRETRAINED = dict(pretrained="none", architecture=2, budgets=_BUDGETS)

CASES: dict[str, dict[str, Any]] = {
    "fedavg": dict(_IMAGE, method="fedavg"),
    "fedavg/cosine": dict(_IMAGE, method="fedavg", lr_schedule="cosine", lr_min=0.01),
    "fedavg/momentum+wd+clip": dict(_IMAGE, method="fedavg", momentum=0.9, weight_decay=5e-4, grad_clip=1.0),
    "heterofl": dict(_IMAGE, method="heterofl"),
    "fjord": dict(_IMAGE, method="fjord"),
    "fedrolex": dict(_IMAGE, method="fedrolex"),
    "origdrop": dict(_IMAGE, method="origdrop"),
    "splitmix": dict(_IMAGE, method="splitmix"),
    "flanc": dict(_IMAGE, method="flanc"),
    "flanc/ortho_lambda=0": dict(_IMAGE, method="flanc", method_options={"ortho_lambda": 0.0}),
    **{name: dict(_SPECTRAL, method=name) for name in (
        "spectral", "topn", "topn+scaled", "topn+scaled+cliplr", "prism", "prism+scaled", "prism+scaled+cliplr",
        "prism+wallenius", "prism+wallenius+cliplr", "unbiased", "unbiased+cliplr", "collective", "collective+cliplr", "schatten",
        "schatten+cliplr", "nosharding")},
    **{f"{name}/tau=1": dict(_SPECTRAL, method=name, method_options={"tau": 1.0})
       for name in ("collective+cliplr", "prism+scaled+cliplr")},
    **{name: dict(_IMAGE, method=name) for name in ("prism+memory", "prism+narrow", "prism+sigma")},
    "prism/factor_decay=frobenius": dict(_IMAGE, method="prism", weight_decay=1e-3,
                                         method_options={"factor_decay": "frobenius"}),
    "prism/weight_decay": dict(_IMAGE, method="prism", weight_decay=1e-3),
    "prism/svd_solver=gram": dict(_IMAGE, method="prism", method_options={"svd_solver": "gram"}),
    "prism/weighting=softmax": dict(_SPECTRAL, method="prism", method_options={"weighting": "softmax"}),
    "prism+memory/output_rows=random": dict(_IMAGE, method="prism+memory", method_options={"output_rows": "random"}),
    "update-probe/prism": dict(_IMAGE, method="update-probe", method_options={"method": "prism"}),
    **{name: dict(_FEDP3, method=name) for name in ("fedp3", "lowerb", "opu2", "opu3", "opu123", "opu23")},
    "fedp3/global_keep=0.9": dict(_FEDP3, method="fedp3", method_options={"global_keep": 0.9}),
    # lr 0.003: this tiny ResNet (batch norm over batches of 18-32 images) turns an ulp of difference between two
    # CPUs into a 20 % change of a conv layer in two rounds at the default lr 0.1, and into 1.5e-3 of a batch-norm
    # bias at 0.01 (scalar against AVX-512 kernels); at 0.003 into 6e-7, so the golden holds on another machine
    "fedp3-blocks": dict(_FEDP3, method="fedp3-blocks", model="resnet18", width=0.125, model_options={}, lr=0.003),
    "caff": dict(_TOKENS, method="caff", method_options=dict(_PRETRAINED, layers=(2,), trained_layers=1)),
    "hetlora": dict(_TOKENS, method="hetlora", method_options=dict(_PRETRAINED, ranks=(4, 2))),
    "fedhm": dict(_TOKENS, method="fedhm", method_options=dict(_PRETRAINED, rank_ratios=(1.0, 0.5))),
    "depthfl": dict(_TOKENS, method="depthfl", method_options=_PRETRAINED),
    **{name: dict(_TOKENS, method=name, method_options=dict(_PRETRAINED, widths=(1.0, 0.5)))
       for name in ("heterofl-ft", "fjord-ft", "fedrolex-ft")},
    **{f"{name}/width=0.5": dict(_TOKENS, method=name, method_options=dict(_PRETRAINED, widths=(0.5,)))
       for name in ("heterofl-ft", "fedrolex-ft")},  # the window rolls only below full width
}
"""Case id → :func:`~subfl.experiments.make_config` arguments (``method`` included)."""

EQUIVALENT: dict[str, str] = {
    "spectral": "unbiased",  # `spectral`'s default strategy is Unbiased
    "opu2": "fedp3",  # FedP3's default trains k = 2 layers besides the FFC: the OPU2 preset
    # At keep 0.1 with τ = 10 (the papers' and the book's τ) no term has ω_i > τ: clipping never binds here; the
    # `/tau=1` cases show that it changes the run once it does.
    "collective+cliplr": "collective",
    "prism+scaled+cliplr": "prism+scaled",
    "topn+scaled+cliplr": "topn+scaled",
    # With every client at full width (budgets fit everything), HeteroFL's and FedRolex's windows coincide; the
    # `/width=0.5` cases differ.
    "fedrolex-ft": "heterofl-ft",
}
"""Cases meant to give the same run as another case (case → the case it equals), each with its reason."""


def case_config(case_id: str):
    args = dict(CASES[case_id])
    return make_config(args.pop("method"), args.pop("dataset"), args.pop("model"), scale=args.pop("scale"), **args)


def run_case(case_id: str) -> dict[str, Any]:
    """Run one case on the CPU with one torch thread; its versions, digests, summaries and this machine."""
    config = case_config(case_id)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            result = run_experiment(config, tmp, cache=False, progress=False)
            rows = list(result.history.itertuples(index=False, name=None))
            state = result.state()
    finally:
        torch.set_num_threads(threads)
    return {"versions": run_versions(config), "history": history_digest(rows), "state": state_digest(state),
            "machine": machine(), "summary": {"history": history_summary(rows), "state": state_summary(state)}}


def machine() -> str:
    """The CPU class a golden was recorded on: torch's build, the instruction set its CPU kernels use, the
    architecture (as the run store's ``hardware`` names them)."""
    return f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}, {platform.machine()}"


def golden_mismatch(case_id: str, now: dict[str, Any]) -> str | None:
    """Why ``now`` (a :func:`run_case`-like dict) is not the recorded golden run of ``case_id``, or ``None``.

    Identical digests match; otherwise the summaries must agree within :data:`TOLERANCE`.
    """
    golden = recorded()[case_id]
    if (now["history"], now["state"]) == (golden["history"], golden["state"]):
        return None
    if "summary" not in golden:
        return (f"{case_id!r} differs from its golden digests, and its golden has no summary to compare with on "
                f"this CPU ({machine()}): re-record it with `python tests/golden/cases.py --record {case_id}`")
    worst = max((summary_deviation(golden["summary"][part], now["summary"][part]) + (part,)
                 for part in ("history", "state")), key=lambda d: d[0])
    if worst[0] <= TOLERANCE:
        return None
    return (f"{case_id!r} is not bit-identical to its golden (recorded on {golden['machine']}; this is "
            f"{machine()}) and its {worst[2]} deviates by {worst[0]:.2e} > {TOLERANCE:g} at {worst[1]!r}")


def recorded() -> dict[str, dict[str, Any]]:
    return json.loads(GOLDENS.read_text()) if GOLDENS.exists() else {}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--record", action="store_true", help="write goldens.json (all cases, or those named)")
    parser.add_argument("cases", nargs="*", help="case ids (default: all)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.cases) - set(CASES))
    if unknown:
        parser.error(f"unknown case(s) {unknown}; accepted: {', '.join(CASES)}")
    goldens = recorded()
    for case_id in args.cases or list(CASES):
        now = run_case(case_id)
        old = goldens.get(case_id)
        same = old is not None and (old["history"], old["state"]) == (now["history"], now["state"])
        print(f"{case_id:36s} {'same' if same else 'CHANGED'}", flush=True)
        goldens[case_id] = now
    if args.record:
        GOLDENS.write_text(_dumps({k: goldens[k] for k in CASES if k in goldens}))


def _dumps(goldens: dict[str, Any]) -> str:
    """JSON with one line per summary leaf (each innermost list on one line)."""
    text = json.dumps(goldens, indent=1)
    return re.sub(r"\[\s+([^\[\]{}]*?)\s+\]", lambda m: "[" + re.sub(r"\s*\n\s*", " ", m.group(1)) + "]", text) + "\n"


if __name__ == "__main__":
    sys.exit(main())
