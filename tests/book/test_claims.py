"""The committed claims register (book/claims/*.yml) and the generated Scorecard page."""
import re

import pytest

from subfl_book import scorecard_page
from subfl_book.claims import (PAPER_FILES, PAPERS, load_register, paper_tables, papers_dir, read_raw, toc_pages,
                               validate)
from subfl_book.store import checkout_root


@pytest.mark.parametrize("paper", PAPERS)
def test_register_follows_the_schema_and_names_only_pages_of_the_book(paper):
    errors = validate(read_raw(paper), paper, toc_pages())
    assert errors == [], "\n".join(errors)


@pytest.mark.parametrize("paper", PAPERS)
def test_every_numbered_table_of_the_paper_has_entries(paper):
    text = (papers_dir() / PAPER_FILES[paper]).read_text()
    tables = paper_tables(text)
    assert tables, f"no table found in {PAPER_FILES[paper]}"
    register = load_register(paper)
    covered = {m.group(0) for c in register.claims for m in [re.match(r"Table [0-9]+", c.source)] if m}
    covered |= {m.group(0) for s in register.settings.values() for m in re.finditer(r"Table [0-9]+", s["source"])}
    assert tables <= covered, f"{paper}: tables without entries: {sorted(tables - covered)}"


def test_table_detection_reads_captions_and_mentions():
    assert paper_tables("Table 1: Accuracy ...\nsee Table. 3 and Table 12") == {"Table 1", "Table 3", "Table 12"}


@pytest.mark.parametrize("paper", PAPERS)
def test_statements_are_not_copied_from_the_paper(paper):
    """A statement sharing a run of 12 words with the paper's text is a copied sentence."""
    words = lambda t: re.findall(r"[a-z]+", t.lower())
    text = words((papers_dir() / PAPER_FILES[paper]).read_text())
    grams = {tuple(text[i:i + 12]) for i in range(len(text) - 11)}
    copied = [c.id for c in load_register(paper).claims
              if any(tuple(w[i:i + 12]) in grams for w in [words(c.statement)] for i in range(len(w) - 11))]
    assert copied == []


def test_scorecard_page_intro_and_readme_are_generated_from_the_register_and_pages(monkeypatch):
    monkeypatch.setenv("SUBFL_STORE_DIR", str(checkout_root() / "store"))   # the README's page states: the committed store
    stale = scorecard_page.out_of_date(checkout_root())
    assert stale == [], f"regenerate with `subfl-book --scorecard`: {[p.name for p in stale]}"


def test_pages_with_a_scorecard_judge_every_claim_they_are_named_for():
    """Every fresh executed page judges each claim the register names it for; a stale page (its notebook changed,
    e.g. to judge a new claim, and it awaits re-execution) may not yet, and the Scorecard page says so."""
    from subfl_book import pipeline

    rows = scorecard_page.page_rows(checkout_root())
    unjudged = set()
    for paper in PAPERS:
        for claim in load_register(paper).claims:
            for page in claim.checked_by:
                if rows.get(page):
                    judged = {r["claim"] for r in rows[page]} | {r["against"] for r in rows[page] if r["against"]}
                    if claim.key not in judged:
                        unjudged.add((page, claim.key))
    chapters = {page.split("/")[1] for page, _ in unjudged}
    fresh = {"book/" + s.notebook.removeprefix("notebooks/").removesuffix(".ipynb")
             for chapter in chapters for s in pipeline.status("cpu", only=chapter, root=checkout_root())
             if s.state == "fresh"}
    assert sorted((page, key) for page, key in unjudged if page in fresh) == [], "fresh pages leave claims unjudged"


def test_claim_status_combines_rows_with_differs_first():
    from subfl_book.claims import parse
    from .test_scorecard import RAW
    register = parse(RAW, "prism")
    rows = {"book/x": [{"claim": "prism:t1-prism", "status": "same", "reason": "r1", "ours": "1", "page": "book/x"}],
            "book/y": [{"claim": "prism:t1-prism", "status": "differs", "reason": "r2", "ours": "2", "page": "book/y"},
                       {"claim": "prism:sec4-gap", "status": "inconclusive", "reason": "r3", "ours": "3",
                        "page": "book/y", "scale": "cpu", "departures": "α 0.1 → 1"},
                       {"claim": "prism:sec4-gap", "status": "inconclusive", "reason": "r4", "ours": "4",
                        "page": "book/y", "scale": "analytic", "departures": "α 0.1 → 1"},
                       {"claim": "prism:sec4-gap", "status": "inconclusive", "reason": "r5", "ours": "5",
                        "page": "book/y", "scale": "cpu", "departures": "—"}]}
    got = {s.claim.id: (s.status, s.note) for s in scorecard_page.claim_statuses("prism", rows, register)}
    assert got["t1-prism"] == ("differs", "same (r1); differs (r2)")
    assert got["sec4-gap"] == ("inconclusive", "inconclusive (r3; our setting departs: α 0.1 → 1); inconclusive (r4); "
                                                "inconclusive (r5)")
    assert got["t4-svd"] == ("not-run", "not testable: GPU wall clock.")
    assert got["t1-orthdrop"][0] == "not-run" and "not judged it yet" in got["t1-orthdrop"][1]
    assert dict(scorecard_page.counts(scorecard_page.claim_statuses("prism", rows, register))) == {
        "differs": 1, "inconclusive": 1, "not-run": 2}


def test_a_claim_judged_against_another_shows_the_papers_values_of_that_comparison():
    from subfl_book.claims import parse
    from .test_scorecard import RAW
    register = parse(RAW, "prism")
    rows = {"book/x": [{"claim": "prism:t1-prism", "status": "same", "reason": "r", "ours": "22.8 vs 11.8 (+11)",
                        "page": "book/x", "against": "prism:t1-orthdrop", "statement": "PriSM vs OrthDrop",
                        "paper": "82.6 vs 78.4 (+4.2)"}]}
    statuses = {s.claim.id: s for s in scorecard_page.claim_statuses("prism", rows, register)}
    own = statuses["t1-prism"].claim.paper_label()
    assert scorecard_page._paper_cell(statuses["t1-prism"]) == f"{own} (judged as PriSM vs OrthDrop: 82.6 vs 78.4 (+4.2))"
    assert scorecard_page._paper_cell(statuses["t4-svd"]) == statuses["t4-svd"].claim.paper_label()
    assert statuses["t1-orthdrop"].status == "not-run" and not statuses["t1-orthdrop"].rows
    assert statuses["t1-orthdrop"].note == (f"{scorecard_page.REFERENCE_SIDE}: its value is the paper's reference in "
                                            f"the ordering judged under t1-prism")


def test_readme_page_table_follows_the_toc_and_reads_each_executed_copy(tmp_path, monkeypatch):
    import json

    from subfl_book.pipeline import NotebookState
    (tmp_path / "_toc.yml").write_text("- file: book/ch/b\n- file: book/ch/a\n")
    for name, title, seeds in (("a", "Page A", [0, 1, 2]), ("b", "Page B", None)):
        cells = [{"cell_type": "markdown", "metadata": {}, "source": [f"# {title}\n", "text"]}]
        for folder in ("notebooks", "book"):
            (tmp_path / folder / "ch").mkdir(parents=True, exist_ok=True)
            meta = {"subfl": {"parameters": {} if seeds is None else {"seeds": seeds}}} if folder == "book" else {}
            (tmp_path / folder / "ch" / f"{name}.ipynb").write_text(json.dumps({"cells": cells, "metadata": meta}))
    monkeypatch.setattr(scorecard_page, "status", lambda scale, root: [
        NotebookState("notebooks/ch/a.ipynb", "fresh", "executed"),
        NotebookState("notebooks/ch/b.ipynb", "stale", "notebook or its parameters changed")])
    rows = {"book/ch/a": [{"claim": "x"}, {"claim": "x"}, {"claim": "y"}]}
    lines = scorecard_page.status_block(tmp_path, rows).splitlines()
    assert lines[1].startswith("1 of 2 pages are fresh")
    assert lines[-3:-1] == ["| ch | Page B | stale: notebook or its parameters changed | — | — |",
                            "| ch | Page A | fresh | 3 (0, 1, 2) | 2 |"]


def test_the_paper_settings_the_catalog_names_are_in_the_registers():
    from subfl_book.catalog import FEDP3_PAPER_SETTINGS, fedp3_paper_setting, flanc_paper_setting
    fedp3 = load_register("fedp3").settings
    assert [s for s in FEDP3_PAPER_SETTINGS.values() if s not in fedp3] == []
    with pytest.raises(ValueError, match="dataset='emnist' has no FedP3 setting; accepted: fmnist, cifar10, femnist"):
        fedp3_paper_setting("emnist")
    flanc = load_register("flanc").settings
    named = [flanc_paper_setting(d, h) for d in ("fmnist", "cifar10", "shakespeare") for h in ("static", "dynamic")]
    assert len(named) == 6 and [s for s in named if s not in flanc] == []
    with pytest.raises(ValueError, match="dataset='mnist' has no FLANC setting; accepted: fmnist, cifar10, shakespeare"):
        flanc_paper_setting("mnist")
    with pytest.raises(ValueError, match="setting='full' is not one of the paper's capacity settings"):
        flanc_paper_setting("fmnist", "full")


def test_a_joined_method_name_may_wrap_after_its_plus_signs_and_nothing_else_changes():
    text = "prism+wallenius+cliplr vs prism, 82.95 vs 78.71 (+4.24); $a+b$ kept"
    shown = scorecard_page.breakable(text)
    assert shown.count("\u200b") == 2   # after the two joins of the name; not in "(+4.24)", not in the math "a+b"
    assert shown.replace("\u200b", "") == text
    assert "prism+\u200bwallenius+\u200bcliplr" in shown
