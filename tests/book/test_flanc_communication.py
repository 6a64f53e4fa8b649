"""The FLANC communication page's tables: which construction reproduces Table 1's FLANC column."""
from __future__ import annotations

import pytest

from subfl_book.pages import flanc as page


def test_resnet18_candidates_in_millions():
    t = page.communication_candidates("resnet18")
    assert list(t.loc["Table 1 (printed)", ["w0.25", "w0.5", "w0.75", "w1", "avg"]]) == [0.5, 1.2, 2.4, 4.0, 2.0]
    assert list(t.loc["library default (R₁ per layer)", ["w0.25", "w0.5", "w0.75", "w1"]]) == [
        0.532, 1.091, 2.019, 3.317]
    assert list(t.loc["R₁ per residual block", ["w0.25", "w0.5", "w0.75", "w1", "avg"]]) == [
        0.527, 1.215, 2.358, 3.957, 2.014]
    assert sorted(t.index[t.matches]) == sorted(["Table 1 (printed)", "R₁ per residual block",
                                                 "released code: R₁ per residual block, input layer at full width"])


def test_cnn_candidates_in_thousands():
    t = page.communication_candidates("flanc_cnn")
    row = "input layer (head) at full width, as in the released code"
    assert list(t.loc[row, ["w0.25", "w0.5", "w0.75", "w1", "avg"]]) == [33.5, 63.5, 97.6, 135.8, 82.6]
    assert bool(t.loc[row, "matches"]) and int(t.loc["library default (R₁ per layer)", "agree"]) == 1


def test_grid_matches():
    table, n, distinct = page.communication_grid_matches("resnet18")
    assert (len(table), n, distinct) == (4, 432, 424)
    assert sorted(table["w1"]) == [3_956_810, 3_956_810, 3_958_154, 3_958_154]
    table, n, distinct = page.communication_grid_matches("flanc_cnn")
    assert (len(table), n, distinct, int(table["constructions"][0])) == (1, 432, 68, 8)


def test_table1_communication_for_the_scorecard():
    resnet = page.table1_communication("resnet18")
    assert list(resnet["sent"]) == [526_874, 1_214_506, 2_357_818, 3_956_810]
    assert resnet["sent"].mean() / 1e6 == pytest.approx(2.014, abs=5e-4)
    cnn = page.table1_communication("flanc_cnn")
    assert list(cnn["sent"]) == [33_482, 63_498, 97_610, 135_818]
    assert list(cnn["dense"]) == [43_978, 105_738, 185_930, 284_554]
