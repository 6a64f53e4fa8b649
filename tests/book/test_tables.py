"""The book shows a frame without its default row numbers and without NaN."""
import math
import re

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


def test_a_named_index_puts_its_name_in_the_corner_of_a_single_header_row():
    frame = pd.DataFrame({"accuracy": [0.5, 0.6], "sd": [0.01, 0.02]}, index=pd.Index(["fedavg", "prism"], name="row"))
    html = frame_html(frame)
    header = html[html.index("<thead>"):html.index("</thead>")]
    assert header.count("<tr") == 1
    assert re.findall(r"<th>(.*?)</th>", header) == ["row", "accuracy", "sd"]
    assert html.count("<th>fedavg</th>") == 1 and frame.index.name == "row"  # the caller's frame is untouched
    two_levels = frame.set_index("sd", append=True)  # a MultiIndex keeps pandas' own header layout
    assert frame_html(two_levels).count("<tr", 0, frame_html(two_levels).index("</thead>")) == 2


def test_collections_and_none_in_cells_are_shown_as_text_not_python_reprs():
    frame = pd.DataFrame({"options": [None, [0, 1, 2], {"atoms": 10}, {3, 1, 2}, {}],
                          "rounds": [40, 40, 20, 20, 10]})
    cells = re.findall(r"<td>(.*?)</td>", frame_html(frame))
    assert cells == [MISSING, "40", "0, 1, 2", "40", "atoms = 10", "20", "1, 2, 3", "20", MISSING, "10"]
    assert frame.loc[1, "options"] == [0, 1, 2]  # the caller's frame is untouched
    frozen = pd.DataFrame({"method_options": [(("global_keep", 0.5), ("layers", 2)), ((1, 2), (3, 4))]})
    assert re.findall(r"<td>(.*?)</td>", frame_html(frozen)) == ["global_keep = 0.5, layers = 2", "(1, 2), (3, 4)"]


def test_install_outside_a_kernel_changes_nothing():
    assert install() is False


def test_snake_case_names_read_as_words_and_other_labels_stay():
    from subfl_book.tables import readable_label

    assert readable_label("best_memory_mb") == "best memory mb"
    assert readable_label("F_3^1") == "F_3^1" and readable_label("OPU123, simple") == "OPU123, simple"
    assert readable_label(("accuracy", "mean_sd")) == ("accuracy", "mean sd") and readable_label(3) == 3
    html = frame_html(pd.DataFrame({"best_memory_mb": [1.5]}, index=pd.Index(["a"], name="run_label")))
    assert "best memory mb" in html and "run label" in html and "best_memory_mb" not in html


def test_a_wide_frame_with_few_rows_is_turned_on_its_side():
    from subfl_book.tables import COLUMN_PX, estimated_width, fit_to_column

    frame = pd.DataFrame({"config": ["a", "b", "c"],
                          **{f"F{layers}^{k}": [0.5, 0.25, 0.125] for layers in (3, 6, 9) for k in range(1, layers + 1)}})
    assert estimated_width(frame) > COLUMN_PX  # 18 value columns of about 61 px each
    (side,) = fit_to_column(frame)
    assert side.shape == (18, 3) and list(side.columns) == ["a", "b", "c"] and side.columns.name == "config"
    assert side.loc["F6^4", "c"] == "0.125" and estimated_width(side) <= COLUMN_PX


def test_a_wide_frame_with_many_rows_is_split_into_parts_that_keep_the_row_labels():
    from subfl_book.tables import COLUMN_PX, estimated_width, fit_to_column

    frame = pd.DataFrame({"run": [f"r{i}" for i in range(12)],
                          **{f"value {j}": [1234.5678 + i for i in range(12)] for j in range(20)}})
    parts = fit_to_column(frame)
    assert len(parts) == 3 and all(list(p.columns)[0] == "run" for p in parts)
    assert sum(p.shape[1] - 1 for p in parts) == 20 and all(estimated_width(p) <= COLUMN_PX for p in parts)
    assert [p.shape[1] for p in parts] == [9, 9, 5]  # 8 + 8 + 4 value columns of 76.8 px ("1234.5678") + 33.6 px
    narrow = pd.DataFrame({"a": [1.0], "b": [2.0]})
    assert fit_to_column(narrow)[0] is narrow


def test_a_multiindex_group_stays_together_when_it_fits():
    from subfl_book.tables import fit_to_column

    columns = pd.MultiIndex.from_product([["alpha 0.1", "alpha 1.0", "iid"], [f"seed {s}" for s in range(4)]])
    frame = pd.DataFrame([[0.123456] * 12] * 5, columns=columns, index=pd.Index(list("abcde"), name="method"))
    parts = fit_to_column(frame, width_px=400)
    assert [sorted({c[0] for c in p.columns}) for p in parts] == [["alpha 0.1"], ["alpha 1.0"], ["iid"]]
    assert all(p.index.name == "method" for p in parts)


def test_a_captioned_table_keeps_its_precision_and_fits():
    from subfl_book.tables import table_html

    frame = pd.DataFrame({"memory_mb": [1.23456789, None]}, index=pd.Index([3, 6], name="layers"))
    html = table_html(frame, caption="LoRA <vs> layers", precision=2)
    assert html.startswith('<p class="table-caption"><strong>LoRA &lt;vs&gt; layers</strong></p>')
    assert "1.23" in html and "1.2346" not in html and "memory mb" in html and MISSING in html


def test_formats_write_named_columns_and_refuse_unknown_ones():
    import pytest

    from subfl_book.tables import formatted, table_html

    frame = pd.DataFrame({"params": [11173962, None], "ratio": [0.123456, 1.0], "name": ["a", "b"]})
    shown = formatted(frame, {"params": "{:,.0f}", "ratio": "{:.3f}"})
    assert list(shown["params"]) == ["11,173,962", MISSING] and list(shown["ratio"]) == ["0.123", "1.000"]
    assert list(formatted(frame, "{:.1f}")["ratio"]) == ["0.1", "1.0"] and list(formatted(frame, "{:.1f}")["name"]) == ["a", "b"]
    with pytest.raises(KeyError, match="macs"):
        formatted(frame, {"macs": "{:,}"})
    assert "11,173,962" in table_html(frame, formats={"params": "{:,.0f}"})


def test_a_residue_column_shows_its_bound_so_it_reads_the_same_on_any_cpu():
    import pytest

    from subfl_book.tables import formatted, residue

    # the Eq. 3 output errors of two layers on two CPUs (6.3e-07 / 7.0e-07, 5.3e-07 / 1.2e-06): one text for both
    here = pd.DataFrame({"error": [6.3e-07, 5.3e-07, 2e-16, None, 3e-4]})
    there = pd.DataFrame({"error": [7.0e-07, 1.2e-06, 0.0, None, 3e-4]})
    assert list(formatted(here, {"error": residue(1e-5)})["error"]) == \
        list(formatted(there, {"error": residue(1e-5)})["error"]) == ["≤ 1e-05", "≤ 1e-05", "< 1e-12", MISSING, "0.0003"]
    with pytest.raises(ValueError, match="tolerance"):
        residue(-1)


def test_a_zero_is_written_without_the_sign_its_rounding_residue_had():
    from subfl_book.tables import formatted, residue

    # Algorithm 2's excess over the optimum: +2e-16 on one CPU, -1e-16 on another, 5.3 % where it is real
    frame = pd.DataFrame({"excess": [2e-16, -1e-16, 0.053, -0.002], "gap": [-1e-17, 1e-17, 0.0, -3e-3]})
    shown = formatted(frame, {"excess": "{:+.2%}", "gap": "{:.1f}"})
    assert list(shown["excess"]) == ["0.00%", "0.00%", "+5.30%", "-0.20%"]
    assert list(shown["gap"]) == ["0.0", "0.0", "0.0", "0.0"]
    # one function for every numeric column: real values keep their digits, residues their bound
    mixed = pd.DataFrame({"bias": [5.47e-13, 1.03e-10, 0.0385], "n": [2, 3, 4], "name": ["a", "b", "c"]})
    shown = formatted(mixed, residue(1e-8, above="{:.3g}"))
    assert list(shown["bias"]) == ["< 1e-12", "≤ 1e-08", "0.0385"] and list(shown["n"]) == ["2", "3", "4"]


def test_a_long_cell_is_shown_whole_not_cut_at_fifty_characters():
    text = "R1 0.125 S_full per block, R2 0.25 T_full, input layer and head dense (" + "x " * 40 + ")"
    html = frame_html(pd.DataFrame({"what": [text], "n": [1]}))
    assert text.strip() in html and "...</td>" not in html
    assert len(text) > 100  # twice pandas' cut


def test_settings_split_into_shared_and_differing_with_options_opened():
    from subfl_book.tables import settings_frames

    configs = {"σ = 0.6": {"method": "opu2", "lr": 0.02, "alpha": None, "keeps": [0.2, 0.5],
                           "method_options": {"clip_norm": 1.0, "noise_multiplier": 0.6}},
               "non-private": {"method": "opu2", "lr": 0.02, "alpha": None, "keeps": [0.2, 0.5],
                               "method_options": {}}}
    shared, differing = settings_frames(configs, ["method", "lr", "alpha", "keeps", "method_options"])
    assert shared.to_dict("records") == [{"setting": "method", "value": "opu2"}, {"setting": "lr", "value": "0.02"},
                                         {"setting": "alpha", "value": MISSING},
                                         {"setting": "keeps", "value": "0.2, 0.5"}]
    assert differing.to_dict("index") == {"method_options.clip_norm": {"σ = 0.6": "1", "non-private": MISSING},
                                          "method_options.noise_multiplier": {"σ = 0.6": "0.6",
                                                                              "non-private": MISSING}}
    same, none = settings_frames({"a": configs["non-private"], "b": configs["non-private"]}, ["method"])
    assert len(same) == 1 and none.empty


def test_settings_refuse_unknown_fields_and_no_runs():
    import pytest

    from subfl_book.tables import settings_frames

    with pytest.raises(KeyError, match=r"\['lr'\] are not settings of run 'a'"):
        settings_frames({"a": {"method": "x"}}, ["method", "lr"])
    with pytest.raises(ValueError, match="configs is empty"):
        settings_frames({}, ["method"])
