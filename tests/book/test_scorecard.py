"""Page scorecards: rows judged by the verdict rule, departures computed from the register's setting."""
import json

import pytest

from subfl.experiments import make_config
from subfl_book.claims import RegisterError, parse, validate
from subfl_book.scorecard import SCORECARD_LOG_ENV, Scorecard, departures, read_rows

RAW = {
    "paper": "prism", "title": "t", "file": "prism.md",
    "settings": {"c10": {"source": "Sec. 4.1", "dataset": "CIFAR-10", "model": "ResNet-18", "clients": 100,
                         "active_per_round": 10, "rounds": 800, "local_epochs": 2, "lr": 0.1, "batch_size": 32}},
    "claims": [
        {"id": "t1-prism", "source": "Table 1", "row": "PriSM", "column": "r = 0.2", "kind": "value", "value": 85.3,
         "sd": 0.4, "unit": "%", "setting": "c10", "statement": "PriSM at r = 0.2.", "checked_by": ["book/x"]},
        {"id": "t1-orthdrop", "source": "Table 1", "row": "OrthDrop", "column": "r = 0.2", "kind": "value",
         "value": 60.1, "unit": "%", "setting": "c10", "statement": "OrthDrop at r = 0.2.", "checked_by": ["book/x"]},
        {"id": "t4-svd", "source": "Table 4", "kind": "value", "value": 0.96, "unit": "s", "statement": "SVD time.",
         "not_run": {"reason": "not-testable", "detail": "GPU wall clock."}},
        {"id": "sec4-gap", "source": "Sec. 4.2", "kind": "bound", "value": 2, "unit": "points",
         "statement": "Within 2 points.", "checked_by": ["book/x"]},
    ],
}


def card(scale="cpu"):
    return Scorecard("prism", scale=scale, page="book/x", register=parse(RAW, "prism"))


def test_order_row_carries_both_values_and_the_computed_status(monkeypatch, tmp_path):
    log = tmp_path / "card.jsonl"
    monkeypatch.setenv(SCORECARD_LOG_ENV, str(log))
    c = card()
    cfg = make_config("fedavg", "fmnist", scale="cpu", rounds=30)
    v = c.order("t1-prism", "t1-orthdrop", [70.0, 71.0, 72.0], [50.0, 51.0, 52.0], chance=10.0, config=cfg)
    assert v.status == "same"
    row = c.rows[0]
    assert row.claim == "prism:t1-prism" and row.against == "prism:t1-orthdrop"
    assert row.paper == "85.3 vs 60.1 (+25.2)"
    assert row.ours == "71 ± 1 (n = 3) vs 51 ± 1 (n = 3) (+20)"
    assert row.source == "Table 1 · r = 0.2"
    logged = read_rows(log.read_text().splitlines())
    assert logged == c.rows
    assert row.departures.startswith("dataset CIFAR-10 → fmnist; model ResNet-18 → cnn")
    assert "rounds 800 → 30" in row.departures and "our offline copy" not in row.departures
    frame = c.frame()
    assert list(frame.columns) == ["paper source", "claim", "paper", "ours", "scale", "status", "why",
                                   "our setting departs"]
    assert "<th class=\"blank level0\"" not in c._repr_html_()  # no index column


def test_a_claim_without_setting_is_compared_against_the_page_default_or_the_rows_setting():
    raw = {**RAW, "settings": {**RAW["settings"], "c10-long": {**RAW["settings"]["c10"], "rounds": 1600}}}
    c = Scorecard("prism", scale="cpu", page="book/x", register=parse(raw, "prism"))
    cfg = make_config("fedavg", "cifar10", scale="cpu", rounds=30)
    c.bound("sec4-gap", [1.0, 1.2, 1.4], at_most=True)                       # no setting, no config: nothing named
    assert c.rows[-1].departures == "—" and c.rows[-1].setting == ""
    c.defaults(setting="c10", config=cfg)
    c.bound("sec4-gap", [1.0, 1.2, 1.4], at_most=True)
    assert "rounds 800 → 30" in c.rows[-1].departures and c.rows[-1].setting == "prism:c10"
    c.bound("sec4-gap", [1.0, 1.2, 1.4], at_most=True, setting="c10-long")   # the row's own setting wins
    assert "rounds 1600 → 30" in c.rows[-1].departures and c.rows[-1].setting == "prism:c10-long"
    c.bound("sec4-gap", [1.0, 1.2, 1.4], at_most=True, config=cfg.replace(rounds=800))   # and the row's own config
    assert "rounds" not in c.rows[-1].departures
    c.bound("sec4-gap", [1.0, 1.2, 1.4], at_most=True, analytic=True)        # an analytic row takes no default run
    assert c.rows[-1].departures == "—"
    c.order("t1-prism", "t1-orthdrop", [70, 71, 72], [50, 51, 52])            # a claim's own setting is kept
    assert c.rows[-1].setting == "prism:c10" and "rounds 800 → 30" in c.rows[-1].departures
    with pytest.raises(ValueError, match="setting='c100' is not a setting of the prism register; it has: c10, c10-long"):
        c.bound("sec4-gap", [1.0], at_most=True, setting="c100")
    with pytest.raises(ValueError, match="setting='nope' is not a setting"):
        c.defaults(setting="nope", config=cfg)


def test_reversed_order_two_seeds_bound_and_exact():
    c = card()
    assert c.order("t1-orthdrop", "t1-prism", [70, 71, 72], [50, 51, 52]).status == "differs"
    assert c.order("t1-prism", "t1-orthdrop", [70, 71], [50, 51]).status == "inconclusive"
    assert c.bound("sec4-gap", [1.0, 1.2, 1.4], at_most=True).status == "same"
    assert c.exact("t4-svd", 0.964).status == "exact"
    assert c.exact("t4-svd", 0.97).status == "differs"
    assert c.counts() == {"differs": 2, "inconclusive": 1, "same": 1, "exact": 1}
    with pytest.raises(KeyError, match="no claim 'nope'"):
        c.order("nope", "t1-prism", [1], [1])


def test_best_of_row_lists_every_rival_best_first():
    c = card()
    v = c.stated_best("t1-prism", [82.0, 83.0, 82.5], {"SplitMix": [80.0, 81.0, 80.5], "OrthDrop": [78.0, 83.0, 80.5]},
                      what="PriSM vs its rivals", chance=50.0)
    assert v.status == "inconclusive" and "1 of 2" in v.reason    # OrthDrop's band (78–83) reaches PriSM's
    row = c.rows[0]
    assert row.ours == "82.5 ± 0.5 (n = 3) vs SplitMix 80.5 ± 0.5 (n = 3), OrthDrop 80.5 ± 2.5 (n = 3)"
    assert row.statement.endswith("— PriSM vs its rivals") and row.paper == "85.3 ± 0.4 %"
    assert c.stated_best("t1-prism", [82.0, 83.0, 82.5], {"SplitMix": [80.0, 81.0, 80.5]}, what="x").status == "same"


def test_ci_scale_rows_are_inconclusive():
    assert card("ci").order("t1-prism", "t1-orthdrop", [70, 71, 72], [50, 51, 52]).status == "inconclusive"


def test_departures_name_every_differing_field_and_the_data_caveat():
    cfg = make_config("fedavg", "cifar10", scale="cpu", model="cnn", num_clients=20, clients_per_round=10,
                      rounds=40, local_epochs=2, lr=0.02, batch_size=32, width=1.0)
    out = departures(RAW["settings"]["c10"], cfg)
    assert out[0] == "model ResNet-18 → cnn"
    assert "clients 100 → 20" in out and "rounds 800 → 40" in out and "lr 0.1 → 0.02" in out
    assert not any(d.startswith("clients per round") or d.startswith("local epochs") or d.startswith("batch")
                   for d in out)
    assert out[-1].startswith("CIFAR-10: our offline copy has 20,000 training images")
    assert departures(None, None) == []


def test_register_schema_errors_name_entry_and_field():
    bad = json.loads(json.dumps(RAW))
    bad["claims"][0]["kind"] = "finding"
    bad["claims"][1]["id"] = "t1-prism"
    bad["claims"][2].pop("not_run")
    bad["claims"][3]["value"] = "two"
    bad["claims"].append({"id": "x", "source": "Fig. 1", "kind": "value", "statement": "s", "checked_by": ["book/y"],
                          "setting": "nope"})
    errors = "\n".join(validate(bad, "prism", {"book/x"}))
    assert "kind='finding'" in errors
    assert "duplicate id" in errors
    assert "needs exactly one of checked_by" in errors
    assert "value must be a number" in errors
    assert "needs a value" in errors and "setting 'nope'" in errors and "'book/y' is not in _toc.yml" in errors
    with pytest.raises(RegisterError):
        parse(bad, "prism")
    assert validate(RAW, "prism", {"book/x"}) == []


def test_exact_keeps_the_papers_printed_rounding():
    from subfl_book.claims import PrintedFloat
    raw = json.loads(json.dumps(RAW))
    register = parse(raw, "prism")
    c = Scorecard("prism", scale="cpu", page="book/x", register=register)
    object.__setattr__(register.claims[2], "value", PrintedFloat(4.0, "4.0"))   # printed "4.0": rounding 0.05
    assert c.exact("t4-svd", 3.96).status == "exact"
    assert c.exact("t4-svd", 3.317).status == "differs" and c.rows[-1].paper == "4.0 s"


def test_departures_read_dir_alpha_p_as_the_plain_per_class_alpha():
    setting = {"source": "Sec. 4.1", "dataset": "CIFAR-10", "alpha": 1,
               "partition": "per-client class priors drawn from Dir(αp), p the dataset's class proportions"}
    same = make_config("fedavg", "cifar10", scale="cpu", partition="dirichlet", alpha=0.1)
    assert not any(d.startswith("α") for d in departures(setting, same))
    other = make_config("fedavg", "cifar10", scale="cpu", partition="dirichlet", alpha=1.0)
    assert "α 0.1 → 1" in departures(setting, other)
    listed = {**setting, "alpha": [1, 10]}
    assert not any(d.startswith("α") for d in departures(listed, same))
    assert "α 0.1 / 1 → 0.5" in departures(listed, make_config("fedavg", "cifar10", scale="cpu",
                                                               partition="dirichlet", alpha=0.5))


def test_departures_name_an_alpha_the_paper_does_not_run():
    setting = {"source": "Sec. 4.2", "dataset": "IMDB", "alpha": [0.1], "partition": "i.i.d or Dirichlet"}
    at_one = make_config("fedavg", "imdb", model="sentiment_lstm", scale="cpu", partition="dirichlet", alpha=1.0)
    assert "α 0.1 → 1" in departures(setting, at_one)
    assert not any(d.startswith("α") for d in departures(setting, at_one.replace(alpha=0.1)))
    iid = make_config("fedavg", "imdb", model="sentiment_lstm", scale="cpu")
    assert not any(d.startswith("α") for d in departures(setting, iid))


def test_a_chapter_index_table_counts_each_claim_of_a_page_once_with_its_least_favourable_status(tmp_path):
    from subfl_book.scorecard_page import chapter_block

    (tmp_path / "_toc.yml").write_text("- file: book/prism/index\n  sections:\n  - file: book/prism/costs\n"
                                       "  - file: book/prism/runtime\n")
    rows = {"book/prism/costs": [{"claim": "prism:a", "status": "exact"}, {"claim": "prism:a", "status": "differs"},
                                 {"claim": "prism:b", "status": "same"}, {"claim": "prism:c", "status": "inconclusive"}]}
    block = chapter_block(tmp_path, "prism", rows).splitlines()
    assert block[3] == "| {doc}`costs` | 3 | 0 | 1 | 1 | 1 | 0 |"  # exact, same, differs, inconclusive, near-chance
    assert block[4].startswith("| {doc}`runtime` | — (awaiting")


def test_a_cards_inline_math_is_typeset_not_shown_raw():
    from subfl_book.scorecard import ScoreRow, render_card
    row = ScoreRow(claim="x", against=None, source="Alg. 2 line 30", statement=r"returns $E_t = -\sum_{i\le t} \lambda_i^2 < 0$ <always>",
                   paper="holds", ours="error 0", scale="analytic", status="exact", reason="|Δ| = 0", departures="")
    html = render_card([row])
    # the math becomes MyST's inline-math span (MathJax typesets its class), the rest is escaped text
    assert r'<span class="math notranslate nohighlight">\(E_t = -\sum_{i\le t} \lambda_i^2 &lt; 0\)</span>' in html
    assert "$" not in html and "&lt;always&gt;" in html


def test_an_identitys_live_residue_reads_the_same_on_any_cpu_and_a_deterministic_gap_keeps_its_digits():
    # Eq. 3's float32 output error of one page: 1.7e-06 on one processor, 1.4e-06 on another
    here, there = card(), card()
    here.identity("sec4-gap", 1.7e-06, tolerance=1e-5, what="float32", residue=True)
    there.identity("sec4-gap", 1.4e-06, tolerance=1e-5, what="float32", residue=True)
    assert here.rows[0].ours == there.rows[0].ours == "error ≤ 1e-05"
    assert here.rows[0].reason == there.rows[0].reason == "|Δ| ≤ 1e-05 (tolerance)"
    assert here.rows[0].status == "exact"
    gap = card()
    gap.identity("sec4-gap", 0.8, tolerance=1.0, what="n − r·N")      # a gap of definitions, not rounding
    assert gap.rows[0].ours == "error 0.8" and gap.rows[0].reason == "|Δ| = 0.8 ≤ 1 (tolerance)"
    missed = card()
    assert missed.identity("sec4-gap", 2.3, tolerance=1e-6, what="x", residue=True).status == "differs"
    assert missed.rows[0].ours == "error 2.3"
