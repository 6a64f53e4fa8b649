"""The costs page's Table 1 PriSM block: the comparison table and the scorecard rows (subfl_book.pages.prism)."""
from __future__ import annotations

import math

import pytest

from subfl.costs.narrow_submodel import narrow_analytic_costs
from subfl.costs.submodels import analytic_costs
from subfl.models import build_model
from subfl_book.claims import load_register
from subfl_book.pages.prism import score_table1_prism, table1_prism_comparison
from subfl_book.scorecard import Scorecard

RATIOS = (0.8, 0.2)


@pytest.fixture(scope="module")
def inputs() -> dict:
    full = build_model("resnet18", num_classes=10, input_shape=(3, 32, 32))
    columns = [None, *RATIOS]
    return {"narrow": {r: narrow_analytic_costs(r) for r in columns},
            "unrounded": {r: narrow_analytic_costs(r, rounding="none") for r in columns},
            "plain": {r: analytic_costs(full, r) for r in columns},
            "narrow_memory": {None: 1.0, 0.8: 1.147, 0.2: 0.290},   # the page's measured ratios (width 1, batch 32)
            "plain_memory": {None: 1.0, 0.8: 1.358, 0.2: 1.090}}


def test_comparison_puts_table1_beside_our_counts(inputs):
    """At 0.2×: Table 1's PriSM 0.5 M / 4.5 % and OrthDrop 2.5 M beside our 0.514 M (every layer, r rounded up),
    0.495 M (decomposed layers, r = 0.2·N) and the plain sub-model's 2.565 M."""
    table = table1_prism_comparison(load_register("prism"), RATIOS, batch_size=32, **inputs)
    params = table.loc[("params (M)", "0.2×")]
    assert params["paper PriSM"] == 0.5 and params["paper OrthDrop"] == 2.5
    assert params["ours: narrow, all layers"] == pytest.approx(0.514210)
    assert params["ours: narrow, decomposed layers, r = p·N"] == pytest.approx(0.49512448)
    assert params["library plain sub-model"] == pytest.approx(2.565002)
    assert table.loc[("params (% of full)", "0.2×"), "ours: narrow, decomposed layers, r = p·N"] == pytest.approx(
        100 * 495_124.48 / 10_985_472)
    assert table.loc[("G MACs (batch 32)", "Full"), "paper PriSM"] == 35
    assert table.loc[("MACs (% of full)", "0.2×"), "ours: narrow, all layers"] == pytest.approx(
        100 * 25_861_750 / 555_422_720)
    assert math.isnan(table.loc[("activation memory (% of full)", "0.2×"), "ours: narrow, decomposed layers, r = p·N"])


def test_scorecard_rows_for_the_prism_block(inputs):
    """Parameters match every printed cell (exact); MACs as % match at 0.8× (72.7 vs 73) but not at 0.2× (4.66 vs
    5.6); memory 114.7 % vs 115 matches, 29.0 % vs 30 does not."""
    card = Scorecard("prism", scale="cpu")
    score_table1_prism(card, RATIOS, batch_size=32, width=1.0, batch=32, **inputs)
    status = {}
    for row in card.rows:
        status.setdefault(row.claim, []).append(row.status)
    for column in ("0.8x", "0.2x"):
        assert status[f"prism:t1-prism-params-{column}"] == ["exact", "exact"]
    assert status["prism:t1-prism-macs-0.8x"] == ["differs", "exact"]
    assert status["prism:t1-prism-macs-0.2x"] == ["differs", "differs"]
    assert status["prism:t1-prism-mem-0.8x"] == ["exact"] and status["prism:t1-prism-mem-0.2x"] == ["differs"]
    assert set(status["prism:t1-caption-prism-cuts-all-costs"]) == {"same"}
    assert len(status["prism:sec4.2-prism-cheaper-than-fedhm"]) == 6
    assert status["prism:sec1-r0.2-is-5pct-of-model"] == ["exact"]
