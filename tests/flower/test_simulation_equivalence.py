"""A run through Flower's simulation runtime is the in-process engine's run, bit for bit.

For FedAvg, PriSM, a FedP3 variant (OPU3), FLANC and CAFF — the golden cases of ``tests/golden`` (ci scale: 4
clients, 2 per round, 2 rounds; CAFF on a tiny GPT over Shakespeare tokens with ``pretrained='none'``) — each method
runs once in-process (:func:`subfl.experiments.run_experiment`) and once on Flower (:func:`subfl.flower.simulation
.simulate`: two virtual SuperNodes in Ray workers, all five runs in one simulation), both with one torch thread. The
two runs select the same clients (those :func:`~subfl.fl.engine.select_clients` draws), write the same ledger (every
tensor and config sent and received, byte counts and ``n_samples`` included: identical ``ledger.csv`` files), and end
with the same history and server state (identical ``history.csv`` files and state digests, equal to the recorded
golden run: its digests, or within the golden test's tolerance on a CPU other than the one it was recorded on).
"""
from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("flwr", reason="Flower is not installed (pip install 'subfl[flower]'); the adapter needs it")

import pandas as pd  # noqa: E402
import torch  # noqa: E402

from subfl.experiments import run_experiment  # noqa: E402
from subfl.fl.engine import select_clients  # noqa: E402

from .helpers import FLOWER_CASES, case_config, digests, golden_mismatch  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``{case: (local folder, flower folder)}`` and the seconds each engine took."""
    from subfl.flower.simulation import simulate

    root = tmp_path_factory.mktemp("flower-equivalence")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        folders = {case: (root / "local" / case, root / "flower" / case) for case in FLOWER_CASES}
        t0 = time.perf_counter()
        for case, (local, _) in folders.items():
            run_experiment(case_config(case), local, cache=False, progress=False)
        t1 = time.perf_counter()
        simulate([(case_config(case), flower) for case, (_, flower) in folders.items()], num_supernodes=2,
                 torch_threads=1)
        t2 = time.perf_counter()
    finally:
        torch.set_num_threads(threads)
    print(f"\nin-process: {t1 - t0:.1f} s, Flower simulation: {t2 - t1:.1f} s for {len(folders)} runs")
    for case, (local, flower) in folders.items():  # shown with pytest -s
        summary = json.loads((flower / "summary.json").read_text())
        same = digests(local) == digests(flower)
        print(f"{case:6s} upload {summary['upload_bytes']:>9d} B, download {summary['download_bytes']:>9d} B, "
              f"{summary['flower']['messages_down']} tasks, identical: {same}, history "
              f"{digests(flower)['history'][:16]}, ledger.csv {digests(flower)['ledger'][:16]}")
    return folders


@pytest.mark.parametrize("case", FLOWER_CASES)
def test_flower_run_is_the_in_process_run(runs, case):
    local, flower = runs[case]
    ours, theirs = digests(local), digests(flower)
    assert theirs == ours, f"{case}: the Flower run differs from the in-process run"
    assert golden_mismatch(case, theirs) is None, golden_mismatch(case, theirs)


@pytest.mark.parametrize("case", FLOWER_CASES)
def test_flower_run_selects_the_seeded_clients_and_moves_the_same_bytes(runs, case):
    local, flower = runs[case]
    config = case_config(case)
    ledger = pd.read_csv(flower / "ledger.csv", keep_default_na=False)
    assert (flower / "ledger.csv").read_bytes() == (local / "ledger.csv").read_bytes()
    for rnd in range(1, config.rounds + 1):
        chosen = select_clients(config.num_clients, config.clients_per_round, config.seed, rnd).tolist()
        down = ledger[(ledger["round"] == rnd) & (ledger.direction == "down")]
        up = ledger[(ledger["round"] == rnd) & (ledger.direction == "up")]
        assert sorted(set(down.client)) == chosen and sorted(set(up.client)) == chosen
        assert (up.n_samples > 0).all() and (down.n_samples == 0).all()
    summary, local_summary = (json.loads((f / "summary.json").read_text()) for f in (flower, local))
    for key in ("upload_bytes", "download_bytes", "final", "final_accuracy", "rounds", "client_samples"):
        assert summary[key] == local_summary[key], key
    assert summary["upload_bytes"] == int(ledger[ledger.direction == "up"].bytes.sum()) > 0
    wire = summary["flower"]
    assert summary["engine"] == "flower" and wire["nodes"] == 2
    tasks = ledger[ledger.direction == "down"].groupby(["round", "client"]).ngroups
    assert wire["messages_down"] == wire["messages_up"] == tasks
    # the arrays on the wire hold the ledger's tensor bytes plus NumPy's .npy header (at most 128 bytes per array)
    for direction in ("down", "up"):
        rows = ledger[(ledger.direction == direction) & (ledger.name != "__config__")]
        assert 0 <= wire[f"array_bytes_{direction}"] - int(rows.bytes.sum()) <= 128 * len(rows)
