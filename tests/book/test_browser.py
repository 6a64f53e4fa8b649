"""The built site in a real browser: headless Chromium at 1280 px finds no violation beyond the committed baseline.

The site is always built afresh into a temporary folder (``jupyter-book build`` of the sources as they are, with
warnings as errors: one build serves every check here) rather than reusing ``_build/html``: a fresh build can never
be stale, carries no leftover pages of removed sources, and does not write into the ``_build`` folder others read.  To check a site that is already
built (say right after ``make site``), point ``SUBFL_BOOK_SITE`` at its ``html`` folder.

``browser_baseline.json`` lists the violations of today (``python -m subfl_book.browser --site _build/html
--baseline --json tests/book/browser_baseline.json`` after ``make site``).  The test fails on a violation that is
not listed (a regression) and on a listed one that no longer occurs, so the list shrinks as pages are fixed.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from subfl_book import browser, sphinx_mathjax

ROOT = Path(__file__).resolve().parents[2]
BASELINE = Path(__file__).with_name("browser_baseline.json")
REGENERATE = ("make site && .venv/bin/python -m subfl_book.browser --site _build/html --baseline "
              "--json tests/book/browser_baseline.json")

needs_chromium = pytest.mark.skipif(browser.find_chromium() is None,
                                    reason="Chromium not found: install Debian's `chromium` (make setup as root) "
                                           "or set SUBFL_CHROMIUM to a Chromium binary")


class Build(NamedTuple):
    result: subprocess.CompletedProcess
    html: Path

    @property
    def log(self) -> str:
        return self.result.stdout[-3000:] + self.result.stderr[-3000:]


@pytest.fixture(scope="module")
def build(tmp_path_factory) -> Build | None:
    """One ``jupyter-book build`` of the sources with warnings as errors (``-W -n --keep-going``), shared by the
    checks of this module; ``None`` when ``$SUBFL_BOOK_SITE`` names a site built already."""
    if os.environ.get("SUBFL_BOOK_SITE"):
        return None
    exe = Path(sys.executable).with_name("jupyter-book")
    if not exe.exists() and shutil.which("jupyter-book") is None:
        pytest.skip("jupyter-book is not installed")
    out = tmp_path_factory.mktemp("site")
    cmd = [str(exe) if exe.exists() else "jupyter-book", "build", str(ROOT), "--path-output", str(out),
           "-W", "-n", "--keep-going"]
    return Build(subprocess.run(cmd, capture_output=True, text=True, timeout=1200), out / "_build" / "html")


@pytest.fixture(scope="module")
def site(build) -> Path:
    if build is None:
        return Path(os.environ["SUBFL_BOOK_SITE"])
    assert (build.html / "index.html").exists(), build.log
    return build.html


def test_site_builds_with_warnings_as_errors(build):
    if build is None:
        pytest.skip("$SUBFL_BOOK_SITE names a site built already")
    assert build.result.returncode == 0, build.log
    page = (build.html / "book" / "federated_setting" / "fedavg.html").read_text()
    assert "<img" in page, "the executed FedAvg page shows its figures"


def _page(body: str, head: str = "") -> str:
    return (f"<!doctype html><html><head><meta charset='utf-8'>{head}<style>body{{margin:0}}"
            f"article.bd-article{{width:752px;margin-left:200px}} pre{{overflow-x:auto}}"
            f".wrap{{overflow-x:auto}}</style></head><body><main id='main-content'>"
            f"<article class='bd-article'>{body}</article></main></body></html>")


@needs_chromium
def test_checker_finds_each_kind_of_violation(tmp_path):
    """A two-page site with one known instance of each problem, and the same things done right."""
    png = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000"
                        "1f15c4890000000d49444154789c6360f8cf000000030101001bb6ee560000000049454e44ae426082")
    (tmp_path / "dot.png").write_bytes(png)
    (tmp_path / "other.html").write_text(_page("<section id='there'><p>x</p></section>"))
    wide = "x" * 400
    (tmp_path / "index.html").write_text(_page(f"""
      <section id="good">
        <figure><img src="dot.png" alt="A dot" style="width:100px"><figcaption>Figure 1: a dot.</figcaption></figure>
        <p>Rendered math <span class="math">\\(\\frac{{a}}{{b}}\\)</span>, code <code>x_{{i}}</code>, a
           <a href="other.html#there">good link</a>, <a href="#good">here</a>,
           <a href="https://example.org">web</a>.</p>
        <pre>short</pre>
        <table><tr><td>{{1, 2, 3}}</td><td>—</td><td>k = 2</td></tr></table>
      </section>
      <section id="bad">
        <div class="cell"><div class="cell_output"><img src="dot.png" alt="dot.png" style="width:900px"></div></div>
        <img src="dot.png" alt="fine" style="width:700px" width="700">
        <img src="missing.png" alt="gone">
        <div class="wrap"><table><tr><td style="white-space:nowrap">{wide} {wide}</td></tr></table></div>
        <pre>{wide}</pre>
        <p>Raw $x^2$ and \\frac{{1}}{{2}} and sum_{{k>t}}, <a href="nowhere.html">dead</a>,
           <a href="other.html#nothere">no anchor</a>.</p>
        <div class="cell_output"><pre>&lt;matplotlib.lines.Line2D at 0x7f00deadbeef&gt;</pre></div>
        <table><tr><td>whole</td><td>{{'clip_norm': 1.0, 'delta': 1e-05, 'ldp_mechan...</td></tr></table>
        <table><tr><td>[0, 1]</td><td>None</td><td>0, 1</td></tr></table>
      </section>"""))
    report = browser.check_site(tmp_path, pages=[tmp_path / "index.html"])
    got = report["pages"]["index.html"]["violations"]
    assert got.get("figure_overflow") == ["figure 1 in #bad"]
    assert got.get("figure_no_alt") == ["figure 1 in #bad"]
    assert got.get("figure_no_caption") == ["figure 1 in #bad", "figure 2 in #bad", "figure 3 in #bad"]
    assert got.get("table_overflow") == ["table 1 in #bad"]
    assert got.get("code_overflow") == ["code 1 in #bad"]
    assert sorted(got.get("broken_link", [])) == ["anchor other.html#nothere", "image missing.png",
                                                  "link nowhere.html", "resource missing.png"]
    latex = got.get("raw_latex", [])
    assert [x.split(" in ")[0] for x in latex] == ["$x^2$", "\\frac", "_{k>t}"] and all("#bad" in x for x in latex)
    assert got.get("repr") == ["<matplotlib.lines.Line2D at 0x…> in #bad", "cell [0, 1] in #bad", "cell None in #bad"]
    assert got.get("cell_cut") == ["cell 3 in #bad"]   # cells count across the section's tables
    assert "figure_shrunk" not in got


MATHJAX = ROOT / sphinx_mathjax.SOURCE_DIR
needs_mathjax = pytest.mark.skipif(sphinx_mathjax.local_mathjax(ROOT) is None,
                                   reason="MathJax not installed in _mathjax/ (`make mathjax` needs npm)")


@needs_chromium
@needs_mathjax
def test_checker_finds_formulas_mathjax_did_not_typeset(tmp_path):
    """With the site's own MathJax: a good formula passes; one without delimiters (never typeset), a TeX error and a
    too-wide display fail."""
    shutil.copytree(MATHJAX, tmp_path / "_static" / "mathjax")
    head = "<script defer src='_static/mathjax/tex-mml-chtml.js'></script>"
    long = " + ".join(f"x_{{{i}}}" for i in range(200))
    (tmp_path / "index.html").write_text(_page(f"""
      <section id="good"><p>Fine <span class="math">\\(\\frac{{a}}{{b}}\\)</span>.</p></section>
      <section id="bad">
        <p>Undelimited <span class="math">x + y</span>,
           broken <span class="math">\\(\\frac{{a}}\\)</span>.</p>
        <div class="math">\\[{long}\\]</div>
      </section>""", head=head))
    report = browser.check_site(tmp_path, pages=[tmp_path / "index.html"])
    assert report["math"].startswith("checked")
    got = report["pages"]["index.html"]["violations"].get("math", [])
    assert got == ["math-unrendered 1 in #bad", "math-error 1 in #bad", "math-wide 1 in #bad"], got


def test_sphinx_mathjax_finds_the_installed_copy(tmp_path):
    assert sphinx_mathjax.local_mathjax(tmp_path) is None
    (tmp_path / "_mathjax").mkdir()
    (tmp_path / "_mathjax" / "tex-mml-chtml.js").write_text("// MathJax")
    assert sphinx_mathjax.local_mathjax(tmp_path) == tmp_path / "_mathjax"


@needs_chromium
def test_site_has_no_violation_beyond_the_baseline(site):
    report = browser.check_site(site)
    if sphinx_mathjax.local_mathjax(ROOT) is not None and not os.environ.get("SUBFL_BOOK_SITE"):
        assert report["math"].startswith("checked"), report["math"]   # the fresh build serves its own MathJax
    base = json.loads(BASELINE.read_text())
    expected = browser.violations({"pages": {p: {"violations": v} for p, v in base["pages"].items()}})
    found = browser.violations(report)
    new = sorted((found - expected).elements())
    gone = sorted((expected - found).elements())
    lines = [f"  new:  {p}: {c}: {i}" for p, c, i in new] + [f"  gone: {p}: {c}: {i}" for p, c, i in gone]
    assert not lines, ("the browser check differs from tests/book/browser_baseline.json -- fix the new violations; "
                       f"for gone ones, shrink the baseline ({REGENERATE}):\n" + "\n".join(lines[:80])
                       + (f"\n  ... {len(lines) - 80} more" if len(lines) > 80 else ""))
