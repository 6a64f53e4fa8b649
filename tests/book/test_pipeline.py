"""The book: every chapter notebook is parameterised and rendered (the site build: ``test_browser.py``)."""
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from subfl_book import pipeline as book

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted((ROOT / "notebooks").glob("*/*.ipynb"))


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.relative_to(ROOT / "notebooks").as_posix())
def test_notebook_is_papermill_ready_and_thin(source):
    params = book.default_parameters(source)
    assert "scale" in params and "data_root" in params
    nb = json.loads(source.read_text())
    assert nb["cells"][0]["cell_type"] == "markdown", "first cell names the paper/figure and the claim"
    assert all(not c.get("outputs") for c in nb["cells"] if c["cell_type"] == "code"), "sources carry no outputs"
    code = "".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    assert "def " not in code and "class " not in code, "no algorithm code in notebooks"
    # tables go through subfl_book.tables (no index column, "—" for missing, fitted to the column); a pandas
    # Styler is shown as its author made it, however wide
    assert ".style." not in code, "show a formatted table with subfl_book.tables.show(frame, formats=...)"


def test_no_prose_line_starts_with_a_percent_sign():
    """MyST reads a line that starts with ``%`` as a comment and drops it from the page (a wrapped "in\\n%):" lost
    its words on two pages); such a line must be re-wrapped."""
    found = []
    for source in SOURCES:
        for i, cell in enumerate(json.loads(source.read_text())["cells"]):
            if cell["cell_type"] == "markdown":
                found += [f"{source.name} cell {i}: {line[:40]!r}" for line in "".join(cell["source"]).split("\n")
                          if line.lstrip().startswith("%")]
    for page in (ROOT / "book").rglob("*.md"):
        found += [f"{page.name}: {line[:40]!r}" for line in page.read_text().split("\n") if line.lstrip().startswith("%")]
    assert not found, found


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.relative_to(ROOT / "notebooks").as_posix())
def test_a_page_with_a_scorecard_opens_with_it(source):
    """The scorecard's placeholder is the first code cell after the parameters: nothing a page computes or shows
    comes between its run card and its scorecard."""
    cells = json.loads(source.read_text())["cells"]
    code = [c for c in cells if c["cell_type"] == "code"]
    cards = [i for i, c in enumerate(code) if ".placeholder()" in "".join(c["source"])]
    if not cards:
        return  # a page that judges no claim of the register (the FedAvg reference)
    params = next(i for i, c in enumerate(code) if "parameters" in c.get("metadata", {}).get("tags", []))
    assert cards == [params + 1], f"code cell {cards} holds the placeholder; it belongs right after the parameters"


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.relative_to(ROOT / "notebooks").as_posix())
def test_every_notebook_has_an_executed_copy_in_the_toc(source):
    executed = book.executed_path(source, ROOT)
    assert executed.exists(), f"run `subfl-book` to execute {source.name}"
    meta = json.loads(executed.read_text())["metadata"]["subfl"]
    assert meta["scale"] == "cpu" and "notebook_fingerprint" in meta and "parameters" in meta and meta["wall_time_s"] >= 0
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = json.dumps(toc)
    assert executed.relative_to(ROOT).with_suffix("").as_posix() in files


def test_status_reports_every_notebook():
    rows = book.status("cpu")
    assert {r.notebook for r in rows} == {s.relative_to(ROOT).as_posix() for s in SOURCES}
    assert all(r.state in ("fresh", "stale", "missing") for r in rows)
    with pytest.raises(ValueError, match="scale"):
        book.status("gpu")


def test_execute_runs_stale_notebooks_in_parallel_with_provenance(tmp_path):
    import nbformat
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook
    for name in ("a", "b"):
        nb = new_notebook(cells=[new_markdown_cell("# t"), new_code_cell("scale = None\ndata_root = None",
                                                                          metadata={"tags": ["parameters"]}),
                                 new_code_cell(f"answer = {name!r} + str(scale)")])
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        (tmp_path / "notebooks" / "ch").mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, tmp_path / "notebooks" / "ch" / f"{name}.ipynb")
    done = book.execute("ci", jobs=2, root=tmp_path)
    assert [p.relative_to(tmp_path).as_posix() for p in done] == ["book/ch/a.ipynb", "book/ch/b.ipynb"]
    assert {r.state for r in book.status("ci", root=tmp_path)} == {"fresh"}
    assert book.execute("ci", jobs=2, root=tmp_path) == []  # nothing stale any more
    with pytest.raises(ValueError, match="jobs"):
        book.execute("ci", jobs=0, root=tmp_path)


def _notebook(path, code):
    import nbformat
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook
    nb = new_notebook(cells=[new_markdown_cell("# t"), new_code_cell("scale = None\ndata_root = None",
                                                                      metadata={"tags": ["parameters"]}),
                             new_code_cell(code)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


@pytest.fixture(scope="module")
def _executed_template(tmp_path_factory):
    """Two executed pages: ``a`` reads one tiny run from a store in the folder, ``b`` reads none (executed once per
    module: each test gets a copy, :func:`executed_root`)."""
    root = tmp_path_factory.mktemp("executed")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SUBFL_STORE_DIR", str(root / "store"))
        mp.setenv("SUBFL_WORK_DIR", str(root / "work"))
        _notebook(root / "notebooks" / "ch" / "a.ipynb",
                  "from subfl_book import make_config, run_experiment\n"
                  "run = run_experiment(make_config('fedavg', 'digits', scale='ci', rounds=1, max_train_samples=100))\n"
                  "accuracy = run.final()")
        _notebook(root / "notebooks" / "ch" / "b.ipynb", "from subfl.sampling import sample_cps")
        book.execute("ci", root=root)
    return root


@pytest.fixture
def executed_root(_executed_template, tmp_path, monkeypatch):
    """A copy of :func:`_executed_template` of this test's own, its store and work folder in use."""
    shutil.copytree(_executed_template, tmp_path, dirs_exist_ok=True)
    monkeypatch.setenv("SUBFL_STORE_DIR", str(tmp_path / "store"))
    monkeypatch.setenv("SUBFL_WORK_DIR", str(tmp_path / "work"))
    return tmp_path


def _rewrite_meta(path, change):
    nb = json.loads(path.read_text())
    change(nb["metadata"]["subfl"])
    path.write_text(json.dumps(nb))


def _meta(root, name):
    return json.loads((root / "book" / "ch" / name).read_text())["metadata"]["subfl"]


def test_an_executed_page_records_the_runs_it_read_and_the_machine(executed_root):
    a, b = _meta(executed_root, "a.ipynb"), _meta(executed_root, "b.ipynb")
    assert len(a["runs"]) == 1 and b["runs"] == []
    run = a["runs"][0]
    assert run["config"]["method"] == "fedavg" and run["config"]["rounds"] == 1
    assert (executed_root / "store" / run["key"][:2] / f"{run['key']}.json.gz").exists()
    assert a["machine"]["torch_threads"] == 1 and a["machine"]["cpus"] >= 1


def test_staleness_follows_the_notebook_and_the_keys_of_its_runs(executed_root, monkeypatch):
    assert {r.state for r in book.status("ci", root=executed_root)} == {"fresh"}
    from subfl.methods import METHODS, FedAvg

    class Newcomer(FedAvg):
        name = "newcomer"

    with monkeypatch.context() as patch:
        patch.setitem(METHODS, "newcomer", Newcomer)  # adding a method stales nothing
        assert {r.state for r in book.status("ci", root=executed_root)} == {"fresh"}
        patch.setattr(FedAvg, "version", FedAvg.version + 1)  # a behaviour change of a method a page read
        rows = {r.notebook: r for r in book.status("ci", root=executed_root)}
        assert rows["notebooks/ch/a.ipynb"].state == "stale" and "1 of its 1 runs changed key" in \
            rows["notebooks/ch/a.ipynb"].reason
        # it read no run, but a page may compute with a method live: every version it was executed under counts
        assert rows["notebooks/ch/b.ipynb"].reason == "library versions moved: method:fedavg"
    _notebook(executed_root / "notebooks" / "ch" / "b.ipynb", "x = 3")  # an edited notebook
    rows = {r.notebook: r for r in book.status("ci", root=executed_root)}
    assert rows["notebooks/ch/b.ipynb"].reason == "notebook or its parameters changed"
    assert rows["notebooks/ch/a.ipynb"].state == "fresh", rows["notebooks/ch/a.ipynb"].reason
    assert book.status("cpu", root=executed_root)[0].reason == "scale ci != cpu"


def test_a_page_whose_run_left_the_store_is_stale_and_re_executes(executed_root):
    key = _meta(executed_root, "a.ipynb")["runs"][0]["key"]
    (executed_root / "store" / key[:2] / f"{key}.json.gz").unlink()
    rows = {r.notebook: r for r in book.status("ci", root=executed_root)}
    assert rows["notebooks/ch/a.ipynb"].reason == "1 of its 1 runs are not in the store"
    assert book.execute("ci", root=executed_root) == [executed_root / "book" / "ch" / "a.ipynb"]
    assert {r.state for r in book.status("ci", root=executed_root)} == {"fresh"}


def test_a_page_is_stale_when_a_run_it_read_was_recorded_again_with_other_results(executed_root):
    """The same key computed anew (another CPU's kernels round differently) stales the pages that read the old
    record; an analysis added to the record later does not."""
    import gzip

    run = _meta(executed_root, "a.ipynb")["runs"][0]
    assert len(run["record_sha256"]) == 64
    path = executed_root / "store" / run["key"][:2] / f"{run['key']}.json.gz"
    record = json.loads(gzip.decompress(path.read_bytes()))
    record["analyses"] = {"top_terms_accuracy{}": {"value": 0.5}}
    path.write_bytes(gzip.compress(json.dumps(record).encode()))
    assert {r.state for r in book.status("ci", root=executed_root)} == {"fresh"}
    values = dict(record["history"])["value"]
    values[0] += 1e-7   # one value, one rounding apart
    path.write_bytes(gzip.compress(json.dumps(record).encode()))
    rows = {r.notebook: r for r in book.status("ci", root=executed_root)}
    assert rows["notebooks/ch/a.ipynb"].reason.startswith("1 of its 1 runs were recorded again with other results")
    assert rows["notebooks/ch/b.ipynb"].state == "fresh"
    assert book.execute("ci", root=executed_root) == [executed_root / "book" / "ch" / "a.ipynb"]
    assert {r.state for r in book.status("ci", root=executed_root)} == {"fresh"}


def test_a_page_is_stale_when_an_analysis_it_reads_moves_version(executed_root, monkeypatch):
    from subfl_book import final_analyses
    _notebook(executed_root / "notebooks" / "ch" / "c.ipynb",
              "from subfl_book import make_config, run_experiment\n"
              "from subfl_book.final_analyses import final_analysis\n"
              "run = run_experiment(make_config('prism', 'digits', scale='ci', rounds=1, max_train_samples=100,\n"
              "                                 heterogeneity='0.5'), analyses=[('top_terms_accuracy', {'keep': 0.5})])\n"
              "cut = final_analysis(run, 'top_terms_accuracy', keep=0.5)")
    book.execute("ci", root=executed_root)
    run = _meta(executed_root, "c.ipynb")["runs"][0]
    assert run["analyses"] == [["top_terms_accuracy", {"keep": 0.5}]]
    rows = {r.notebook: r for r in book.status("ci", root=executed_root)}
    assert rows["notebooks/ch/c.ipynb"].state == "fresh", rows["notebooks/ch/c.ipynb"].reason
    current = final_analyses.ANALYSES["top_terms_accuracy"]
    monkeypatch.setitem(final_analyses.ANALYSES, "top_terms_accuracy",
                        final_analyses.Analysis(current.name, current.function, current.version + 1))
    rows = {r.notebook: r for r in book.status("ci", root=executed_root)}
    assert rows["notebooks/ch/c.ipynb"].reason.startswith("1 of its 1 runs lack a current value of an analysis")
    assert rows["notebooks/ch/a.ipynb"].state == "fresh"   # it reads no analysis


def test_a_page_reads_a_timing_measured_once_names_it_on_its_card_and_is_stale_when_it_changes(executed_root):
    _notebook(executed_root / "notebooks" / "ch" / "t.ipynb",
              "from subfl_book.measured import measured\n"
              "import time\n"
              "timing = measured('clock', {'what': 'now'}, lambda: {'seconds': time.perf_counter()}, scale='ci')")
    book.execute("ci", root=executed_root)
    meta = _meta(executed_root, "t.ipynb")
    (entry,) = meta["measured"]
    assert entry["file"].startswith("measured/clock-") and "1 torch thread" in entry["hardware"]
    card = json.loads((executed_root / "book" / "ch" / "t.ipynb").read_text())["cells"][1]
    assert "**timings read** 1 measured once and recorded in the run store: measured/clock-" in "".join(card["source"])
    rows = {r.notebook: r for r in book.status("ci", root=executed_root)}
    assert rows["notebooks/ch/t.ipynb"].state == "fresh", rows["notebooks/ch/t.ipynb"].reason
    path = executed_root / "store" / entry["file"]
    path.write_text(path.read_text().replace('"seconds": ', '"seconds": 1'))   # measured again, other numbers
    rows = {r.notebook: r for r in book.status("ci", root=executed_root)}
    assert rows["notebooks/ch/t.ipynb"].reason == f"measurement {entry['file']} changed or is gone"
    assert rows["notebooks/ch/a.ipynb"].state == "fresh"


def test_a_page_is_stale_when_a_recorded_file_it_read_changed(executed_root):
    from subfl_book.recorded import recorded_path
    name = "spectral_resnet18_h200.json"
    sha = hashlib.sha256(recorded_path(name).read_bytes()).hexdigest()
    _rewrite_meta(executed_root / "book" / "ch" / "b.ipynb", lambda m: m.update(recorded=[{"file": name, "sha256": sha}]))
    assert {r.state for r in book.status("ci", root=executed_root)} == {"fresh"}
    _rewrite_meta(executed_root / "book" / "ch" / "b.ipynb",
                  lambda m: m.update(recorded=[{"file": name, "sha256": "0" * 64}]))
    rows = {r.notebook: r for r in book.status("ci", root=executed_root)}
    assert rows["notebooks/ch/b.ipynb"].reason == f"recorded file {name} changed or is gone"


def test_verify_re_executes_fresh_pages_and_names_the_cells_whose_outputs_moved(executed_root):
    _notebook(executed_root / "notebooks" / "ch" / "r.ipynb", "import random\nprint(random.random())")
    book.execute("ci", root=executed_root)
    committed = (executed_root / "book" / "ch" / "a.ipynb").read_bytes()
    rows = {r.notebook: r for r in book.verify("ci", root=executed_root)}
    assert rows["notebooks/ch/a.ipynb"].differing_cells == ()   # its run read from the store again
    assert rows["notebooks/ch/b.ipynb"].differing_cells == ()
    moved = rows["notebooks/ch/r.ipynb"]   # an unseeded draw: its one output moves
    assert moved.outputs == 1 and len(moved.differing_cells) == 1
    cell = json.loads((executed_root / "book" / "ch" / "r.ipynb").read_text())["cells"][moved.differing_cells[0]]
    assert "random.random()" in "".join(cell["source"])
    assert (executed_root / "book" / "ch" / "a.ipynb").read_bytes() == committed   # the copies are not touched


def test_page_outputs_leave_out_the_run_card_and_hash_images():
    nb = {"cells": [{"cell_type": "markdown", "metadata": {"tags": [book.RUN_CARD_TAG]}, "source": "x"},
                    {"cell_type": "code", "metadata": {}, "outputs": [
                        {"output_type": "stream", "name": "stdout", "text": ["a\n", "b"]},
                        {"output_type": "display_data", "data": {"image/png": "iVBOR", "text/plain": ["<Figure>"]}}]}]}
    assert book.page_outputs(nb) == [(1, "stream:stdout", "a\nb"),
                                     (1, "image/png", hashlib.sha256(b"iVBOR").hexdigest()),
                                     (1, "text/plain", "<Figure>")]


def test_a_failed_execution_leaves_the_last_good_copy_in_place(executed_root):
    copy = executed_root / "book" / "ch" / "b.ipynb"
    before = copy.read_bytes()
    _notebook(executed_root / "notebooks" / "ch" / "b.ipynb", "raise RuntimeError('boom')")
    with pytest.raises(Exception, match="boom"):
        book.execute_notebook(executed_root / "notebooks" / "ch" / "b.ipynb", "ci", executed_root)
    assert copy.read_bytes() == before


def test_a_copy_without_recorded_runs_is_stale(executed_root):
    _rewrite_meta(executed_root / "book" / "ch" / "b.ipynb", lambda m: m.pop("runs"))
    rows = {r.notebook: r for r in book.status("ci", root=executed_root)}
    assert rows["notebooks/ch/b.ipynb"].state == "stale" and "before pages recorded" in rows["notebooks/ch/b.ipynb"].reason


def test_a_copy_that_did_not_record_the_digests_of_its_records_is_stale(executed_root):
    _rewrite_meta(executed_root / "book" / "ch" / "a.ipynb", lambda m: m["runs"][0].pop("record_sha256"))
    rows = {r.notebook: r for r in book.status("ci", root=executed_root)}
    assert rows["notebooks/ch/a.ipynb"].reason == "executed before pages recorded the sha256 of the records they read"
    assert rows["notebooks/ch/b.ipynb"].state == "fresh"   # it read no run


def test_fold_code_tags_executed_cells_for_the_site():
    import nbformat
    from subfl_book.pipeline import fold_code
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("scale = None", metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell('scale = "cpu"', metadata={"tags": ["injected-parameters"]}),
                nbformat.v4.new_code_cell('card = Scorecard("flanc", scale=scale).placeholder()'),
                nbformat.v4.new_markdown_cell("text"),
                nbformat.v4.new_code_cell("x = 1", metadata={"tags": ["remove-input"]})]
    fold_code(nb)
    assert [c.metadata.get("tags") for c in nb.cells] == [
        ["parameters", "hide-input"], ["injected-parameters", "remove-cell"], ["remove-input"], None,
        ["remove-input"]]
    assert nb.cells[1].id == "injected-parameters"   # papermill's random id replaced: re-executions diff cleanly


def test_run_card_follows_the_title_and_states_scale_runs_machine_and_date():
    import nbformat
    from subfl_book.pipeline import RUN_CARD_TAG, add_run_card
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# Title"), nbformat.v4.new_code_cell("x = 1")]
    nb.metadata["subfl"] = {"scale": "cpu", "runs": [], "wall_time_s": 12.3, "executed_at": "2026-11-27 12:00 UTC",
                            "library_version": "0.2.0", "machine": {"processor": "x86_64", "cpus": 2, "torch": "2.14"}}
    add_run_card(add_run_card(nb))  # idempotent: one card
    cards = [c for c in nb.cells if RUN_CARD_TAG in c.metadata.get("tags", [])]
    assert len(cards) == 1 and nb.cells[1] is cards[0] and cards[0].id == RUN_CARD_TAG
    text = cards[0].source
    assert "**Scale** `cpu`" in text and "none (this page computes what it shows)" in text
    assert "x86_64, 2 CPUs, torch 2.14, in 12 s, 2026-11-27 12:00 UTC, subfl 0.2.0" in text
    nb.metadata["subfl"]["machine"]["cpu_name"] = "AMD EPYC"
    assert "on AMD EPYC, 2 CPUs, torch 2.14" in add_run_card(nb).cells[1].source


def test_the_run_card_names_the_cpu_each_record_was_computed_on(monkeypatch):
    from subfl_book import pipeline
    env = {"torch": "2.14", "threads": 1, "device": "cpu"}
    facts = {"named": {"summary": {"environment": env, "wall_time_s": 3600.0},
                       "hardware": {"cpu_name": "AMD EPYC", "cpu_capability": "AVX512"}},
             "unnamed": {"summary": {"environment": env, "wall_time_s": 1800.0},
                         "hardware": {"cpu_capability": "AVX512"}},
             "old": {"summary": {"environment": env, "wall_time_s": 0.0}, "hardware": {"processor": "x86_64"}}}
    monkeypatch.setattr(pipeline, "_record_facts", lambda key: facts[key])
    runs = [{"key": k, "config": {"seed": 0, "dataset": "cifar10"}} for k in ("named", "unnamed", "named", "old")]
    text = pipeline.run_card({"scale": "cpu", "runs": runs, "machine": {}})
    assert "computing them took 2.50 hours" in text
    assert ("2 on torch 2.14, 1 thread, cpu (AMD EPYC); 1 on torch 2.14, 1 thread, cpu (a CPU with AVX512, "
            "not named); 1 on torch 2.14, 1 thread, cpu (processor not recorded)") in text


def test_a_page_reading_recorded_files_names_them_and_their_machine_on_its_run_card(tmp_path, monkeypatch):
    from subfl_book.pipeline import _recorded_read, run_card
    from subfl_book.recorded import RECORDED_LOG_ENV, load_recorded

    recorded = tmp_path / "gpu.json"
    recorded.write_text(json.dumps({"accelerator": "NVIDIA H200", "torch": "2.11.0", "date": "2026-11-20", "runs": []}))
    log = tmp_path / "recorded.jsonl"
    monkeypatch.setenv(RECORDED_LOG_ENV, str(log))
    load_recorded(recorded)
    load_recorded(recorded)  # read twice: listed once
    entries = _recorded_read(log)
    assert len(entries) == 1 and entries[0]["file"] == "gpu.json" and len(entries[0]["sha256"]) == 64
    text = run_card({"scale": "cpu", "runs": [], "recorded": entries, "machine": {}})
    assert "**recorded files read** 1 from `results/`: gpu.json (NVIDIA H200, torch 2.11.0, 2026-11-20)" in text
    assert "computes what it shows" not in text


def test_outputs_that_only_name_an_object_are_dropped():
    import nbformat
    from subfl_book.pipeline import drop_object_reprs
    legend = nbformat.v4.new_output("execute_result", data={"text/plain": "<matplotlib.legend.Legend at 0x7fbd4644b9d0>"})
    styled = nbformat.v4.new_output("execute_result", data={"text/plain": "<pandas.io.formats.style.Styler at 0x7f>",
                                                            "text/html": "<table></table>"})
    number = nbformat.v4.new_output("execute_result", data={"text/plain": "0.634"})
    printed = nbformat.v4.new_output("stream", text="<object at 0x1>\n")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("ax.legend()")])
    nb.cells[0].outputs = [legend, styled, number, printed]
    drop_object_reprs(nb)
    assert nb.cells[0].outputs == [styled, number, printed]


def test_printed_text_is_one_output_however_the_kernel_chunked_it():
    import nbformat
    from subfl_book.pipeline import merge_streams
    out = lambda name, text: nbformat.v4.new_output("stream", name=name, text=text)
    shown = nbformat.v4.new_output("display_data", data={"text/plain": "x"})
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(1); print(2)")])
    nb.cells[0].outputs = [out("stdout", "keep 0.4\n"), out("stdout", "keep 0.2\n"), out("stderr", "warn\n"), shown,
                           out("stdout", "after\n")]
    merge_streams(nb)
    assert [(o.output_type, o.get("name"), o.get("text")) for o in nb.cells[0].outputs] == [
        ("stream", "stdout", "keep 0.4\nkeep 0.2\n"), ("stream", "stderr", "warn\n"), ("display_data", None, None),
        ("stream", "stdout", "after\n")]


def test_a_prose_edit_keeps_the_page_fresh_and_is_synced_without_executing(executed_root):
    import nbformat
    source = executed_root / "notebooks" / "ch" / "b.ipynb"
    nb = nbformat.read(source, as_version=4)
    nb.cells[0].source = "# b, with $\\sigma^\\kappa$ now written as math"
    nbformat.write(nb, source)
    row = {r.notebook: r for r in book.status("ci", root=executed_root)}["notebooks/ch/b.ipynb"]
    assert row.state == "fresh" and "prose differs" in row.reason
    copy = executed_root / "book" / "ch" / "b.ipynb"
    outputs_before = [c.get("outputs") for c in nbformat.read(copy, as_version=4).cells if c.cell_type == "code"]
    executed_before = _meta(executed_root, "b.ipynb")["executed_at"]
    assert book.sync_all_prose(root=executed_root) == [copy]
    synced = nbformat.read(copy, as_version=4)
    assert synced.cells[0].source == "# b, with $\\sigma^\\kappa$ now written as math"
    assert any("run-card" in c.metadata.get("tags", []) for c in synced.cells)  # the run card stays
    assert [c.get("outputs") for c in synced.cells if c.cell_type == "code"] == outputs_before
    assert _meta(executed_root, "b.ipynb")["executed_at"] == executed_before  # nothing was executed
    row = {r.notebook: r for r in book.status("ci", root=executed_root)}["notebooks/ch/b.ipynb"]
    assert row.state == "fresh" and "prose" not in row.reason
    assert book.sync_all_prose(root=executed_root) == []


def test_prose_is_not_synced_into_a_copy_that_runs_other_code(executed_root):
    source = _notebook(executed_root / "notebooks" / "ch" / "b.ipynb", "x = 3")
    with pytest.raises(ValueError, match="execute it"):
        book.sync_prose(source, executed_root)
    assert book.sync_all_prose(root=executed_root) == []  # skipped: its execution brings the prose


def test_captions_and_alt_text_are_synced_into_the_executed_copy_without_executing(tmp_path):
    import nbformat
    source = _notebook(tmp_path / "notebooks" / "ch" / "c.ipynb", "plot()")
    copy = nbformat.read(source, as_version=4)
    copy.cells.insert(1, nbformat.v4.new_markdown_cell("card", metadata={"tags": [book.RUN_CARD_TAG]}))
    copy.cells[3].metadata["tags"] = ["hide-input"]
    copy.cells[3].outputs = [nbformat.v4.new_output("display_data", data={"image/svg+xml": "<svg/>"})]
    copy.metadata["subfl"] = {"parameters": {"scale": "ci"}, "notebook_fingerprint": "old"}
    book.executed_path(source, tmp_path).parent.mkdir(parents=True)
    nbformat.write(copy, book.executed_path(source, tmp_path))
    display = {"figure": {"caption": "Accuracy per round, one line per method.", "name": "fig-c-1"},
               "image": {"alt": "Line chart of accuracy against round."}}
    nb = nbformat.read(source, as_version=4)
    nb.cells[2].metadata["mystnb"] = display
    nbformat.write(nb, source)
    executed = json.loads(book.executed_path(source, tmp_path).read_text())
    assert book.prose_differs(source, executed)
    assert book.sync_prose(source, tmp_path)
    synced = nbformat.read(book.executed_path(source, tmp_path), as_version=4)
    assert synced.cells[3].metadata == {"tags": ["hide-input"], "mystnb": display}
    assert synced.cells[3].outputs == copy.cells[3].outputs
    assert synced.cells[2].metadata == {"tags": ["parameters"]}
    assert not book.prose_differs(source, json.loads(book.executed_path(source, tmp_path).read_text()))
    assert not book.sync_prose(source, tmp_path)
    del nb.cells[2].metadata["mystnb"]  # a caption removed from the source goes from the copy too
    nbformat.write(nb, source)
    assert book.sync_prose(source, tmp_path)
    assert nbformat.read(book.executed_path(source, tmp_path), as_version=4).cells[3].metadata == {"tags": ["hide-input"]}


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.relative_to(ROOT / "notebooks").as_posix())
def test_every_executed_copy_that_runs_its_sources_code_shows_its_sources_prose(source, monkeypatch):
    monkeypatch.setenv("SUBFL_STORE_DIR", str(ROOT / "store"))  # the run card is written from the repository's runs
    executed = json.loads(book.executed_path(source, ROOT).read_text())
    if book._staleness(source, executed, "cpu") == "notebook or its parameters changed":
        pytest.skip("its code changed since it was executed: executing it brings the prose")
    assert not book.prose_differs(source, executed), "run `subfl-book --sync-prose`"


def test_a_stale_page_carries_a_notice_under_its_title_until_it_is_fresh_again(executed_root):
    import nbformat
    copy = executed_root / "book" / "ch" / "b.ipynb"
    assert book.mark_stale_pages("ci", root=executed_root) == []  # every page fresh: nothing to mark
    original = executed_root / "notebooks" / "ch" / "b.ipynb"
    before = original.read_text()
    _notebook(original, "x = 3")  # its code changes: the copy is stale
    assert book.mark_stale_pages("ci", root=executed_root) == [copy]
    cells = nbformat.read(copy, as_version=4).cells
    notices = [c for c in cells if book.STALE_NOTICE_TAG in c.metadata.get("tags", [])]
    assert len(notices) == 1 and cells[1] is notices[0] and cells[1].cell_type == "markdown"
    text = notices[0].source
    assert text.startswith(":::{warning}") and "notebooks/ch/b.ipynb" in text and "its notebook has changed" in text
    assert _meta(executed_root, "b.ipynb")["executed_at"] in text
    assert book.mark_stale_pages("ci", root=executed_root) == []  # idempotent: one notice
    row = {r.notebook: r for r in book.status("ci", root=executed_root)}["notebooks/ch/b.ipynb"]
    assert row.state == "stale" and row.reason == "notebook or its parameters changed"  # the notice is no page cell
    original.write_text(before)  # fresh again: the notice goes
    assert book.mark_stale_pages("ci", root=executed_root) == [copy]
    assert not any(book.STALE_NOTICE_TAG in c.metadata.get("tags", [])
                   for c in nbformat.read(copy, as_version=4).cells)


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.relative_to(ROOT / "notebooks").as_posix())
def test_every_committed_copy_carries_a_stale_notice_exactly_when_it_is_stale(source, monkeypatch):
    monkeypatch.setenv("SUBFL_STORE_DIR", str(ROOT / "store"))  # staleness follows the repository's runs (read only)
    executed = json.loads(book.executed_path(source, ROOT).read_text())
    marked = any(book.STALE_NOTICE_TAG in c.get("metadata", {}).get("tags", []) for c in executed["cells"])
    assert marked == (book._staleness(source, executed, "cpu") is not None), "run `subfl-book --sync-prose`"


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.relative_to(ROOT / "notebooks").as_posix())
def test_every_executed_card_is_the_current_rendering_of_its_recorded_rows(source):
    import nbformat
    nb = nbformat.read(book.executed_path(source, ROOT), as_version=4)
    html = book.recorded_card_html(nb)
    if html is None:
        return
    cell = book._card_cell(nb)
    shown = ["".join(o.data["text/html"]) for o in cell.outputs if "text/html" in o.get("data", {})]
    assert shown == [html], "run `subfl-book --sync-prose` to re-render the card"


def test_refresh_card_rewrites_an_outdated_rendering_only(tmp_path):
    import nbformat
    copy = tmp_path / "theory.ipynb"
    shutil.copy(ROOT / "book" / "spectral" / "theory.ipynb", copy)
    assert not book.refresh_card(copy)  # already the current rendering
    nb = nbformat.read(copy, as_version=4)
    out = next(o for o in book._card_cell(nb).outputs if "text/html" in o.get("data", {}))
    out.data["text/html"] = "<p>an older rendering</p>"
    nbformat.write(nb, copy)
    assert book.refresh_card(copy)
    assert "".join(next(o for o in book._card_cell(nbformat.read(copy, as_version=4)).outputs
                        if "text/html" in o.get("data", {})).data["text/html"]) == book.recorded_card_html(nb)
