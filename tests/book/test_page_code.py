"""What a page records of the code it ran and the claims it judged (subfl_book.page_code), and when it goes stale."""
from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from subfl.experiments import provenance
from subfl_book import claims, page_code

ROOT = Path(__file__).resolve().parents[2]
PAGE = "from subfl_book.analysis import curve_summary\nfrom subfl_book import plots\nimport subfl.fl.engine\n%matplotlib inline\n"


@pytest.fixture
def lib(tmp_path):
    copy = tmp_path / "lib"
    for package in page_code.PACKAGES:
        shutil.copytree(ROOT / "lib" / package, copy / package, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


def test_the_closure_follows_imports_in_function_bodies_relative_ones_and_parents_but_digests_no_versioned_module(lib):
    closure = page_code.import_closure(PAGE, lib)
    assert {"subfl_book", "subfl_book.analysis", "subfl_book.plots", "subfl_book.store", "subfl.fl",
            "subfl.fl.engine", "subfl.experiments.runner"} <= closure
    # a lazy import inside a function of pipeline-free modules: store imports final_analyses in a function body
    assert "subfl_book.final_analyses" in closure
    digests = page_code.module_digests(PAGE, lib)
    assert "subfl_book.analysis" in digests and "subfl.experiments.runner" in digests
    assert not [m for m in digests if m.startswith(("subfl.fl", "subfl.methods", "subfl.models", "subfl.sampling"))]
    assert "subfl_book.pipeline" not in closure   # no page imports the pipeline
    assert len(digests["subfl_book.analysis"]) == 16


def test_docstrings_comments_and_formatting_change_no_digest_any_statement_does(lib):
    path = lib / "subfl_book" / "analysis.py"
    before = page_code.module_digest(path)
    text = path.read_text()
    docstring = text.index('"""', text.index("\ndef ")) + 3   # the first function's docstring
    path.write_text(text[:docstring] + "Reworded. " + text[docstring:] + "\n\n# a comment\n")
    assert page_code.module_digest(path) == before
    path.write_text(text.replace("\ndef ", "\n\n\n# a comment\ndef ", 1))
    assert page_code.module_digest(path) == before
    path.write_text(text.replace("\ndef ", "\nX = 1\n\n\ndef ", 1))
    assert page_code.module_digest(path) != before


def test_an_engine_refactor_stales_no_page_an_edit_to_the_book_package_does(lib):
    recorded = page_code.page_code(PAGE, [], lib)
    assert page_code.code_changes(recorded, PAGE, lib) is None
    _edit(lib / "subfl" / "fl" / "engine.py", "_save_checkpoint", "_write_checkpoint_atomically")
    assert page_code.code_changes(recorded, PAGE, lib) is None
    _edit(lib / "subfl_book" / "verdict.py", "\ndef ", "\nTHRESHOLD_NOTE = 2\n\n\ndef ")
    assert page_code.code_changes(recorded, PAGE, lib) == "code it runs changed: subfl_book.verdict"


def test_a_new_import_in_a_module_the_page_reaches_is_a_change(lib):
    recorded = page_code.page_code(PAGE, [], lib)
    _edit(lib / "subfl_book" / "plots.py", "\nimport ", "\nimport subfl.privacy\nimport ")
    reason = page_code.code_changes(recorded, PAGE, lib)
    assert reason.startswith("code it runs changed:") and "subfl_book.plots" in reason


def test_a_moved_version_stales_the_page(lib, monkeypatch):
    recorded = page_code.page_code(PAGE, [], lib)
    assert recorded["versions"]["engine"] == provenance.ENGINE_VERSION
    assert recorded["versions"]["method:prism"] >= 1 and "dataset:cifar10" in recorded["versions"]
    from subfl.methods import METHODS, FedAvg

    class Newcomer(FedAvg):
        name = "newcomer"

    monkeypatch.setitem(METHODS, "newcomer", Newcomer)   # a name registered after the page ran cannot matter to it
    assert page_code.code_changes(recorded, PAGE, lib) is None
    monkeypatch.setattr(provenance, "ENGINE_VERSION", provenance.ENGINE_VERSION + 1)
    assert page_code.code_changes(recorded, PAGE, lib) == "library versions moved: engine"


def test_a_corrected_register_entry_stales_the_pages_that_judge_it(lib, monkeypatch):
    rows = [{"claim": "prism:fig5-prism-best-everywhere", "against": None},
            {"claim": "prism:abs-up-to-10-points", "against": "prism:eq1"}]
    register = claims.load_register("prism")
    assert {c.id for c in register.claims} >= {"fig5-prism-best-everywhere", "abs-up-to-10-points", "eq1"}
    recorded = page_code.page_code(PAGE, rows, lib)
    assert set(recorded["claims"]) == {"prism:fig5-prism-best-everywhere", "prism:abs-up-to-10-points",
                                       "prism:eq1"}
    corrected = dataclasses.replace(register, claims=tuple(
        dataclasses.replace(c, value=1.0) if c.id == "eq1" else c for c in register.claims))
    monkeypatch.setattr(claims, "load_register", lambda paper: corrected)
    assert page_code.code_changes(recorded, PAGE, lib) == "register entries it judges changed: prism:eq1"
    gone = dataclasses.replace(register, claims=tuple(c for c in register.claims if c.id != "abs-up-to-10-points"))
    monkeypatch.setattr(claims, "load_register", lambda paper: gone)
    assert "prism:abs-up-to-10-points" in page_code.code_changes(recorded, PAGE, lib)


def test_a_setting_edit_stales_only_the_claims_that_name_it(monkeypatch):
    register = claims.load_register("prism")
    central = [c.id for c in register.claims if c.setting == "cifar10-vgg11-central"]
    others = [c.id for c in register.claims if c.setting not in (None, "cifar10-vgg11-central")][:5]
    unset = [c.id for c in register.claims if c.setting is None][:3]
    assert len(central) >= 2 and len(others) == 5 and len(unset) == 3
    keys = [f"prism:{i}" for i in central + others + unset]
    before = page_code.claim_digests(keys)
    settings = {**register.settings, "cifar10-vgg11-central": {**register.settings["cifar10-vgg11-central"],
                                                               "rounds": 7}}
    monkeypatch.setattr(claims, "load_register", lambda paper: dataclasses.replace(register, settings=settings))
    after = page_code.claim_digests(keys)
    assert sorted(k for k in keys if before[k] != after[k]) == sorted(f"prism:{i}" for i in central)


def test_unparsable_code_is_an_error_naming_where():
    with pytest.raises(ValueError, match="notebooks/x.ipynb: cannot parse"):
        page_code.import_closure("def (:\n", ROOT / "lib", "notebooks/x.ipynb")


def test_every_library_version_is_listed_once_with_its_kind():
    versions = provenance.library_versions()
    kinds = {k.split(":")[0] for k in versions}
    assert kinds == {"engine", "data", "pretraining", "method", "model", "dataset", "schedule"}
    assert versions["schedule:cosine"] == 2
    from subfl.methods import METHODS
    assert {k.split(":")[1] for k in versions if k.startswith("method:") and "." not in k} == set(METHODS)


def test_a_setting_a_row_names_in_the_claims_stead_stales_the_page_when_edited(lib, monkeypatch):
    register = claims.load_register("prism")
    rows = [{"claim": "prism:abs-up-to-10-points", "against": None, "setting": "prism:femnist-cnn"}]
    recorded = page_code.page_code(PAGE, rows, lib)
    assert list(recorded["settings"]) == ["prism:femnist-cnn"]
    assert page_code.code_changes(recorded, PAGE, lib) is None
    settings = {**register.settings, "imdb-lstm": {**register.settings["imdb-lstm"], "rounds": 7}}
    monkeypatch.setattr(claims, "load_register", lambda paper: dataclasses.replace(register, settings=settings))
    assert page_code.code_changes(recorded, PAGE, lib) is None          # another setting's edit: still fresh
    settings = {**register.settings, "femnist-cnn": {**register.settings["femnist-cnn"], "rounds": 7}}
    monkeypatch.setattr(claims, "load_register", lambda paper: dataclasses.replace(register, settings=settings))
    assert page_code.code_changes(recorded, PAGE, lib) == \
        "register settings its rows are compared against changed: prism:femnist-cnn"
