"""The book shows a frame without its default row numbers and without NaN."""
import math

import pandas as pd

from subfl_book.tables import MISSING, frame_html, install


def test_default_row_numbers_are_hidden_and_missing_values_shown_as_a_dash():
    frame = pd.DataFrame({"method": ["fedavg", "prism"], "accuracy": [0.5595, math.nan]})
    html = frame_html(frame)
    assert "<th>0</th>" not in html and "<th>1</th>" not in html
    assert "NaN" not in html and html.count(MISSING) == 1 and "0.5595" in html


def test_a_meaningful_index_stays():
    frame = pd.DataFrame({"accuracy": [0.5, None]}, index=pd.Index(["fedavg", "prism"], name="method"))
    html = frame_html(frame)
    assert "fedavg" in html and "method" in html and MISSING in html and "None" not in html
    shifted = pd.DataFrame({"a": [1, 2]}, index=pd.RangeIndex(3, 5))  # a slice of a larger frame keeps its rows
    assert "<th>3</th>" in frame_html(shifted)


def test_install_outside_a_kernel_changes_nothing():
    assert install() is False
