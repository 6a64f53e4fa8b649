"""``tests/nbval-store/``: the ci-scale runs the notebook checks read are the runs the current code computes.

Every record must be keyed by the versions its method, model, dataset and engine have now (a version that moved
leaves the record unread, and the notebooks would train its run again in every CI run); a sample, the quickest run
of each method and of each dataset, is computed again here and must give the recorded history and ledger exactly.
``make nbval-store`` records the folder again.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch

from subfl.experiments import ExperimentConfig, run_experiment as compute_run
from subfl.experiments.provenance import canonical_config, environment_class, run_versions
from subfl_book import store

ROOT = Path(__file__).resolve().parents[2]
NBVAL_STORE = ROOT / "tests" / "nbval-store"
SIZE_BUDGET_MB = 15
"""The folder is cloned with the repository: it stays small."""


def _records() -> dict[Path, dict]:
    return {path: json.loads(gzip.decompress(path.read_bytes())) for path in sorted(NBVAL_STORE.glob("??/*.json.gz"))}


RECORDS = _records()


def _sample() -> list[Path]:
    """The quickest record of each method, and of each dataset the former leave out."""
    quickest = sorted(RECORDS, key=lambda path: (RECORDS[path]["summary"]["wall_time_s"], path.name))
    chosen: dict[str, Path] = {}
    for path in quickest:
        chosen.setdefault(RECORDS[path]["config"]["method"], path)
    datasets = {RECORDS[path]["config"]["dataset"] for path in chosen.values()}
    for path in quickest:
        if RECORDS[path]["config"]["dataset"] not in datasets:
            datasets.add(RECORDS[path]["config"]["dataset"])
            chosen["dataset:" + RECORDS[path]["config"]["dataset"]] = path
    return [chosen[name] for name in sorted(chosen)]


def test_the_folder_holds_ci_runs_filed_under_their_keys_within_its_budget():
    assert len(RECORDS) > 100, "tests/nbval-store/ is missing or nearly empty: `make nbval-store` records it"
    for path, record in RECORDS.items():
        assert record["config"]["scale"] == "ci", path.name
        assert path == store.record_path(record["key"], NBVAL_STORE)
    size = sum(p.stat().st_size for p in NBVAL_STORE.rglob("*") if p.is_file())
    assert size <= SIZE_BUDGET_MB * 1e6
    assert not (NBVAL_STORE / "measured").exists()   # timings belong to the machine that measured them


def test_every_record_is_keyed_by_the_current_versions():
    stale = []
    for record in RECORDS.values():
        config = ExperimentConfig.from_dict(record["config"])
        if store.experiment_key(canonical_config(config), run_versions(config)) != record["experiment_key"]:
            stale.append(config.label())
    assert stale == [], (f"{len(stale)} of {len(RECORDS)} records were computed with versions that have moved since "
                         f"(e.g. {stale[:3]}): `make nbval-store` records them again")


def _jsonable(frame) -> list:
    return json.loads(json.dumps(store._frame_columns(frame), default=str))


@pytest.mark.parametrize("path", _sample(), ids=lambda p: f'{RECORDS[p]["config"]["method"]}-{RECORDS[p]["config"]["dataset"]}')
def test_a_recorded_run_computed_again_gives_its_recorded_history_and_ledger(path, tmp_path):
    record = RECORDS[path]
    config = ExperimentConfig.from_dict(record["config"])
    if record["environment"] != environment_class(config.device):
        pytest.skip(f"recorded in {record['environment']}, this is {environment_class(config.device)}: floating-point "
                    f"results may differ")
    recorded_isa = (record.get("hardware") or {}).get("cpu_capability")
    if config.device == "cpu" and recorded_isa and recorded_isa != torch.backends.cpu.get_cpu_capability():
        pytest.skip(f"recorded with {recorded_isa} CPU kernels, this machine runs "
                    f"{torch.backends.cpu.get_cpu_capability()}: their float rounding differs (e.g. a loss 2.32296768 "
                    f"against 2.32296771 recorded)")
    again = compute_run(config, tmp_path / "run", cache=False, progress=False)
    assert _jsonable(again.history) == record["history"], config.label()
    assert _jsonable(again.ledger) == record["ledger"], config.label()
