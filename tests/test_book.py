"""The book: every chapter notebook is parameterised and rendered, and the site builds with warnings as errors."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from subfl import book

ROOT = Path(__file__).resolve().parents[1]
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


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.relative_to(ROOT / "notebooks").as_posix())
def test_every_notebook_has_an_executed_copy_in_the_toc(source):
    executed = book.executed_path(source, ROOT)
    assert executed.exists(), f"run `subfl book` to execute {source.name}"
    meta = json.loads(executed.read_text())["metadata"]["subfl"]
    assert meta["scale"] == "cpu" and "fingerprint" in meta and "parameters" in meta and meta["wall_time_s"] >= 0
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = json.dumps(toc)
    assert executed.relative_to(ROOT).with_suffix("").as_posix() in files


def test_site_builds_with_warnings_as_errors(tmp_path):
    exe = Path(sys.executable).with_name("jupyter-book")
    if not exe.exists() and shutil.which("jupyter-book") is None:
        pytest.skip("jupyter-book is not installed")
    cmd = [str(exe) if exe.exists() else "jupyter-book", "build", str(ROOT), "--path-output", str(tmp_path),
           "-W", "-n", "--keep-going"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    index = tmp_path / "_build" / "html" / "index.html"
    assert index.exists()
    page = (tmp_path / "_build" / "html" / "book" / "federated_setting" / "fedavg.html").read_text()
    assert "<img" in page, "the executed FedAvg page shows its figures"


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


def test_page_dependencies_follow_the_notebooks_imports(tmp_path):
    sampling = book.page_dependencies(_notebook(tmp_path / "a.ipynb", "from subfl.sampling import sample_cps"))
    assert "sampling/samplers.py" in sampling["files"] and "sampling/__init__.py" in sampling["files"]
    assert not any(f.startswith(("methods/", "fl/", "models/")) for f in sampling["files"])
    assert sampling["entries"] == {}
    # a page that runs experiments may name any method or model: it depends on every entry and its module
    runs = book.page_dependencies(_notebook(tmp_path / "b.ipynb", "%matplotlib inline\n"
                                                                  "from subfl.experiments import run_seeds"))
    from subfl.methods import METHODS
    assert {f"method:{name}" for name in METHODS} <= set(runs["entries"]) and "model:cnn" in runs["entries"]
    assert {"methods/spectral.py", "models/cnn.py", "experiments/runner.py"} <= set(runs["files"])
    # registries count by their entries, the book builder and the cache not at all
    for absent in ("methods/__init__.py", "models/names.py", "data/names.py", "book.py", "cli.py",
                   "experiments/cache.py"):
        assert absent not in runs["files"]
    assert all(len(d) == 16 for d in runs["files"].values())


@pytest.fixture
def executed_root(tmp_path):
    _notebook(tmp_path / "notebooks" / "ch" / "a.ipynb", "from subfl.experiments import make_config\n"
                                                          "rounds = make_config('fedavg', 'digits', scale='ci').rounds")
    _notebook(tmp_path / "notebooks" / "ch" / "b.ipynb", "from subfl.sampling import sample_cps")
    book.execute("ci", root=tmp_path)
    return tmp_path


def _rewrite_meta(path, change):
    nb = json.loads(path.read_text())
    change(nb["metadata"]["subfl"])
    path.write_text(json.dumps(nb))


def test_status_names_the_changed_dependency_and_ignores_new_entries(executed_root, monkeypatch):
    assert {r.state for r in book.status("ci", root=executed_root)} == {"fresh"}
    from subfl.methods import METHODS, FedAvg

    class Newcomer(FedAvg):
        name = "newcomer"

    monkeypatch.setitem(METHODS, "newcomer", Newcomer)  # adding a method leaves executed pages fresh
    assert {r.state for r in book.status("ci", root=executed_root)} == {"fresh"}
    monkeypatch.setitem(METHODS, "fedavg", Newcomer)  # changing an entry a page may use makes it stale
    rows = {r.notebook: r for r in book.status("ci", root=executed_root)}
    assert rows["notebooks/ch/a.ipynb"].state == "stale" and "method:fedavg changed" in rows["notebooks/ch/a.ipynb"].reason
    assert rows["notebooks/ch/b.ipynb"].state == "fresh"  # it reaches no registry
    monkeypatch.undo()

    real_digest = book._file_digest
    monkeypatch.setattr(book, "_file_digest", lambda rel: "0" * 16 if rel == "sampling/samplers.py" else real_digest(rel))
    _notebook(executed_root / "notebooks" / "ch" / "a.ipynb", "rounds = 3")  # an edited notebook
    rows = {r.notebook: r for r in book.status("ci", root=executed_root)}
    assert rows["notebooks/ch/b.ipynb"].reason == "library code changed: sampling/samplers.py changed"
    assert rows["notebooks/ch/a.ipynb"].reason == "notebook or its parameters changed"
    assert rows["notebooks/ch/a.ipynb"].state == rows["notebooks/ch/b.ipynb"].state == "stale"
    assert book.status("cpu", root=executed_root)[0].reason == "scale ci != cpu"


def test_a_copy_without_recorded_dependencies_is_stale(executed_root):
    a = executed_root / "book" / "ch" / "a.ipynb"
    _rewrite_meta(a, lambda m: m.pop("dependencies"))
    rows = {r.notebook: r for r in book.status("ci", root=executed_root)}
    assert rows["notebooks/ch/a.ipynb"].state == "stale" and "before per-page dependencies" in \
        rows["notebooks/ch/a.ipynb"].reason
    assert rows["notebooks/ch/b.ipynb"].state == "fresh"
    assert book.execute("ci", root=executed_root) == [a]  # re-executing records them
    assert "experiments/presets.py" in json.loads(a.read_text())["metadata"]["subfl"]["dependencies"]["files"]


def test_an_acknowledged_change_refreshes_only_the_pages_stale_through_it(executed_root, monkeypatch):
    real_digest = book._file_digest
    monkeypatch.setattr(book, "_file_digest",
                        lambda rel: "0" * 16 if rel == "experiments/presets.py" else real_digest(rel))
    _notebook(executed_root / "notebooks" / "ch" / "b.ipynb", "from subfl.experiments import presets\nx = 1")
    rows = {r.notebook: r.state for r in book.status("ci", root=executed_root)}
    assert rows == {"notebooks/ch/a.ipynb": "stale", "notebooks/ch/b.ipynb": "stale"}
    with pytest.raises(ValueError, match="reason"):
        book.acknowledge_change(["experiments/presets.py"], " ", scale="ci", root=executed_root)
    with pytest.raises(ValueError, match="not found"):
        book.acknowledge_change(["experiments/nowhere.py"], "docstring only", scale="ci", root=executed_root)
    assert book.acknowledge_change(["sampling/samplers.py"], "not the changed file", scale="ci",
                                   root=executed_root) == []
    # a is stale through presets.py alone; b's notebook changed as well, so it keeps needing re-execution
    assert book.acknowledge_change(["experiments/presets.py"], "docstring only", scale="ci",
                                   root=executed_root) == ["notebooks/ch/a.ipynb"]
    rows = {r.notebook: r.state for r in book.status("ci", root=executed_root)}
    assert rows == {"notebooks/ch/a.ipynb": "fresh", "notebooks/ch/b.ipynb": "stale"}
    record = json.loads((executed_root / "book" / "ch" / "a.ipynb").read_text())["metadata"]["subfl"]["acknowledged"]
    assert len(record) == 1 and record[0]["reason"] == "docstring only"
    old, new = record[0]["files"]["experiments/presets.py"]
    assert new == "0" * 16 and old == real_digest("experiments/presets.py")
    monkeypatch.undo()  # the file "changes back": the page is stale again until re-executed or acknowledged
    assert book.status("ci", root=executed_root)[0].state == "stale"


def _edit_cells(path, change):
    nb = json.loads(path.read_text())
    change(nb["cells"])
    path.write_text(json.dumps(nb))


def test_a_prose_edit_is_carried_into_the_copy_without_re_execution(executed_root, monkeypatch):
    source = executed_root / "notebooks" / "ch" / "a.ipynb"
    copy = executed_root / "book" / "ch" / "a.ipynb"
    outputs_before = [c.get("outputs") for c in json.loads(copy.read_text())["cells"] if c["cell_type"] == "code"]
    _edit_cells(source, lambda cells: cells[0].update(source=["# t, corrected\n", "now two lines"]))
    assert book.status("ci", root=executed_root)[0].reason == "notebook or its parameters changed"
    with pytest.raises(ValueError, match="reason"):
        book.update_prose("notebooks/ch/a.ipynb", "", scale="ci", root=executed_root)
    assert book.update_prose("notebooks/ch/a.ipynb", "a wrong sentence", scale="ci", root=executed_root) == [0]
    assert [r.state for r in book.status("ci", root=executed_root)] == ["fresh", "fresh"]
    nb = json.loads(copy.read_text())
    assert "".join(nb["cells"][0]["source"]) == "# t, corrected\nnow two lines"
    assert [c.get("outputs") for c in nb["cells"] if c["cell_type"] == "code"] == outputs_before
    record = nb["metadata"]["subfl"]["prose_updated"]
    assert len(record) == 1 and record[0]["cells"] == [0] and record[0]["reason"] == "a wrong sentence"
    assert book.update_prose("notebooks/ch/a.ipynb", "again", scale="ci", root=executed_root) == []  # nothing left


@pytest.mark.parametrize("edit, message", [
    (lambda cells: cells[2].update(source=["rounds = 3"]), "beyond the text of its markdown"),
    (lambda cells: cells.append({"cell_type": "markdown", "metadata": {}, "source": ["more"]}),
     "beyond the text of its markdown"),
    (lambda cells: cells[1].update(source=["scale = None\ndata_root = None\nextra = 1"]), "parameters"),
])
def test_a_prose_update_refuses_other_changes(executed_root, edit, message):
    _edit_cells(executed_root / "notebooks" / "ch" / "a.ipynb", edit)
    with pytest.raises(ValueError, match=message):
        book.update_prose("notebooks/ch/a.ipynb", "text", scale="ci", root=executed_root)
    assert book.status("ci", root=executed_root)[0].state == "stale"


def test_a_prose_update_refuses_a_copy_stale_through_the_library(executed_root, monkeypatch):
    real_digest = book._file_digest
    monkeypatch.setattr(book, "_file_digest", lambda rel: "0" * 16 if rel == "experiments/presets.py" else real_digest(rel))
    _edit_cells(executed_root / "notebooks" / "ch" / "a.ipynb", lambda cells: cells[0].update(source=["# new"]))
    with pytest.raises(ValueError, match="stale for another reason"):
        book.update_prose("notebooks/ch/a.ipynb", "text", scale="ci", root=executed_root)
    copy = executed_root / "book" / "ch" / "a.ipynb"
    _rewrite_meta(copy, lambda m: m.update(notebook_fingerprint="x"))  # a copy whose cells were edited by hand
    with pytest.raises(ValueError, match="does not give back"):
        book.update_prose("notebooks/ch/a.ipynb", "text", scale="ci", root=executed_root)
    with pytest.raises(ValueError, match="not a notebook"):
        book.update_prose("notebooks/ch/zzz.ipynb", "text", scale="ci", root=executed_root)
