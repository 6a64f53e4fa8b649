"""Golden runs pin every version to a behaviour (see ``cases.py``)."""
from __future__ import annotations

import collections
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from cases import CASES, EQUIVALENT, case_config, golden_mismatch, recorded, run_case  # noqa: E402

from subfl.experiments.provenance import run_versions  # noqa: E402
from subfl.methods import METHODS  # noqa: E402

GOLDENS = recorded()
RERECORD = "re-record it with `python tests/golden/cases.py --record {case}`"


@pytest.mark.parametrize("case", list(CASES))
def test_golden_run_matches_its_record(case):
    assert case in GOLDENS, f"golden {case!r} is not recorded: " + RERECORD.format(case=case)
    versions = run_versions(case_config(case))
    assert GOLDENS[case]["versions"] == versions, (
        f"a version used by {case!r} moved ({GOLDENS[case]['versions']} recorded, {versions} now): "
        + RERECORD.format(case=case))
    mismatch = golden_mismatch(case, run_case(case))
    assert mismatch is None, (
        f"{mismatch}: it computes something different while no version it uses moved: bump the version of what "
        f"changed (the engine, the data pipeline, the method or one of its options, the model, the dataset), then "
        + RERECORD.format(case=case))


def test_every_registered_method_has_a_golden_run():
    covered = {args["method"] for args in CASES.values()}
    assert set(METHODS) <= covered, f"no golden run for {sorted(set(METHODS) - covered)}"


def test_only_declared_equivalences_share_a_digest():
    groups = collections.defaultdict(set)
    for case, golden in GOLDENS.items():
        groups[golden["history"], golden["state"]].add(case)
    undeclared = [sorted(g) for g in groups.values()
                  if len(g) > 1 and len({EQUIVALENT.get(c, c) for c in g}) > 1]
    assert not undeclared, f"these cases give identical runs without a declared equivalence: {undeclared}"
    for case, same_as in EQUIVALENT.items():
        assert (GOLDENS[case]["history"], GOLDENS[case]["state"]) == \
            (GOLDENS[same_as]["history"], GOLDENS[same_as]["state"]), f"{case!r} is declared equal to {same_as!r}"


def test_no_recorded_golden_is_left_without_a_case():
    assert set(GOLDENS) <= set(CASES), f"recorded goldens without a case: {sorted(set(GOLDENS) - set(CASES))}"


def test_a_one_percent_change_of_the_learning_rate_is_beyond_the_tolerance():
    """The cross-machine tolerance still sees a small change of behaviour: FedAvg's case at 1.01 × its learning rate."""
    import dataclasses
    import tempfile

    import torch

    from cases import TOLERANCE
    from subfl.experiments import run_experiment
    from subfl.experiments.provenance import state_summary, summary_deviation

    config = case_config("fedavg")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            state = run_experiment(dataclasses.replace(config, lr=1.01 * config.lr), tmp, cache=False,
                                   progress=False).state()
    finally:
        torch.set_num_threads(threads)
    worst, where = summary_deviation(GOLDENS["fedavg"]["summary"]["state"], state_summary(state))
    assert worst > 5 * TOLERANCE, (worst, where)
