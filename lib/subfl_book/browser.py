"""Browser check of the built site: open every page of ``_build/html`` in headless Chromium and report what a
reader would trip over.

Every HTML page of the site (``_static`` templates and hidden ``.*.html`` leftovers excluded) is loaded from disk
in a 1280 px wide window.  Requests to the internet are refused, as they would fail offline anyway, so the check
is deterministic.  Folded cells (``<details>``) are opened before measuring, so code a reader can unfold counts
too.  Per page the check reports, each as a list of stable labels (``kind n in #section``, where ``n`` counts the
elements of that kind inside the section, so a label survives re-executed figures and edits to other sections):

``figure_overflow``   an ``img`` or figure-sized ``svg`` in the article column whose rendered width or scroll
                      width exceeds the column (``article.bd-article`` of the sphinx-book-theme, 752 px at 1280 px).
``figure_shrunk``     an ``img`` scaled down to less than ``SHRINK`` (60 %) of its natural width to fit the column:
                      matplotlib text drawn at 10 pt, 100 dpi (about 14 px) lands below 8.5 px, too small to read.
``table_overflow``    a ``table`` wider than the column (rendered or scroll width), or whose scrolling wrapper
                      (``pst-scrollable-table-container``, an output area) has to scroll sideways.
``code_overflow``     a ``pre`` (code cell, text output, literal block) wider than the column, or whose own box has
                      to scroll sideways because its longest line does not fit.
``figure_no_alt``     an ``img`` in the column whose ``alt`` is missing, blank, or merely a file name or path (the
                      default myst-nb writes for notebook outputs, which tells a screen-reader user nothing).
``figure_no_caption`` an ``img`` in the column with no caption.  An image counts as captioned when (1) it sits in a
                      ``<figure>`` with a non-empty ``<figcaption>`` (or a docutils ``.figure`` with a ``.caption``),
                      or (2) the block holding it (its notebook cell, else its parent block) is directly followed
                      by an element of class ``caption``/``figure-caption``, or by a paragraph whose text starts
                      with "Figure" or "Fig.", or (3) it points with ``aria-describedby`` to a non-empty element.
``broken_link``       a link (anywhere on the page, sidebars included) or image whose file target does not exist,
                      an internal link whose ``#anchor`` is not an id in the target page, a page-local resource
                      (CSS, script, image) that failed to load, or an image that loaded but could not be decoded.
                      Links to the internet (http, https, mailto) are not followed.
``raw_latex``         LaTeX visible in the text of the column: ``$...$``, ``$$``, ``\\(``/``\\[``, a command such
                      as ``\\frac`` or ``\\lambda``, or a ``^{...}``/``_{...}`` group -- outside code (``pre``,
                      ``code``, code cells) and outside elements MathJax renders (``.math``, ``mjx-container``).
``math``              a formula MathJax did not typeset (``math-unrendered``: an element of class ``math`` with no
                      ``mjx-container`` inside), typeset as an error (``math-error``: TeX MathJax could not parse), or
                      wider than the column (``math-wide``).  Checked only when the site serves its own MathJax
                      (``_static/mathjax/``, see :mod:`subfl_book.sphinx_mathjax`): a site that loads MathJax from
                      its CDN cannot typeset here, where the internet is refused, and its report says so.
``cell_cut``          a table cell in the column whose text ends in "..." -- pandas' cut of a long value
                      (``display.max_colwidth``) or of hidden rows/columns, so the reader never sees the value.
``repr``              an object repr in the column outside code cells' sources: ``<matplotlib....>``,
                      ``<Figure size ...>`` or ``<... at 0x...>`` (the address is written ``0x…`` in the label, as
                      it changes every run); or a table cell whose whole text is a Python value's repr: ``None``,
                      ``nan``, a list ``[...]``, an empty dict or one with string keys ``{'...': ...}``, or a tuple
                      of tuples ``((...))`` (a set written ``{1, 2}`` is read as notation and passes).

Command line::

    python -m subfl_book.browser [--site _build/html] [--json out.json] [--screenshots DIR]

prints a per-page summary and the totals; ``--json`` writes the full report (the baseline format of
``tests/book/browser_baseline.json``); ``--screenshots`` saves PNGs of ``SCREENSHOT_PAGES`` (1280 px wide, the
first 2000 px of the page, as the reader first sees it, before folded cells are opened).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit
from urllib.request import url2pathname

from . import sphinx_mathjax

CATEGORIES = ("figure_overflow", "figure_shrunk", "figure_no_alt", "figure_no_caption", "table_overflow",
              "code_overflow", "broken_link", "raw_latex", "math", "cell_cut", "repr")
WIDTH = 1280
HEIGHT = 900
SCREENSHOT_HEIGHT = 2000
SHRINK = 0.6
COLUMN_SELECTORS = ("article.bd-article", "main#main-content", "main", "body")
SCREENSHOT_PAGES = ("book/spectral/ablations.html", "book/caff/heterogeneous.html", "book/prism/index.html")
CHROMIUM_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
MATHJAX_SECONDS = 30
"""How long a page may take MathJax to typeset before the check measures it anyway (its formulas then count as
unrendered)."""
LOCAL_MATHJAX = f"_static/{sphinx_mathjax.SITE_DIR}/{sphinx_mathjax.COMPONENT}"
"""A site holding this file serves its own MathJax (:mod:`subfl_book.sphinx_mathjax`), so its math is checked."""

# Resolves once MathJax has typeset the page: "typeset", "failed" (startup rejected), "absent" (no MathJax loaded)
# or "timeout".
_MATHJAX_JS = r"""
(seconds) => {
  const mj = window.MathJax;
  if (!mj || !mj.startup || !mj.startup.promise) return 'absent';
  const timer = new Promise(done => setTimeout(() => done('timeout'), seconds * 1000));
  return Promise.race([mj.startup.promise.then(() => 'typeset', () => 'failed'), timer]);
}
"""

# Measured in the page; returns plain data, judged in Python (see `_judge`).
_MEASURE_JS = r"""
({selectors}) => {
  let col = null, selector = null;
  for (const s of selectors) { col = document.querySelector(s); if (col) { selector = s; break; } }
  const cr = col.getBoundingClientRect();
  const colW = cr.width, colRight = cr.right;
  const counters = {};
  const label = (kind, el) => {
    const sec = el.closest('section[id]');
    const where = sec ? sec.id : 'top';
    const key = kind + '|' + where;
    counters[key] = (counters[key] || 0) + 1;
    return `${kind} ${counters[key]} in #${where}`;
  };
  const scrolls = el => {
    const ox = getComputedStyle(el).overflowX;
    return ox !== 'visible' && ox !== 'clip' && el.scrollWidth > el.clientWidth + 1;
  };
  const scrollingWrapper = el => {   // a scroll container between el and the column that scrolls sideways
    for (let p = el.parentElement; p && p !== col; p = p.parentElement) if (scrolls(p)) return p;
    return null;
  };
  const widths = el => {
    const r = el.getBoundingClientRect();
    return {width: Math.round(r.width), scroll: el.scrollWidth, right: Math.round(r.right)};
  };
  const wider = w => w.width > colW + 1 || w.scroll > colW + 1 || w.right > colRight + 1;
  const out = {column: {selector, width: Math.round(colW)}, overflow: [], images: [], latex: [], reprs: []};

  for (const t of col.querySelectorAll('table')) {
    const w = widths(t), wrap = scrollingWrapper(t), lab = label('table', t);
    if (wider(w) || wrap) out.overflow.push({category: 'table_overflow', item: lab, ...w,
                                             scrolls: !!wrap});
  }
  for (const p of col.querySelectorAll('pre')) {
    const w = widths(p), lab = label('code', p);
    const own = scrolls(p), wrap = scrollingWrapper(p);
    if (wider(w) || own || wrap) out.overflow.push({category: 'code_overflow', item: lab, ...w,
                                                    client: p.clientWidth, scrolls: own || !!wrap,
                                                    folded: !!p.closest('details.hide')});
  }
  for (const s of col.querySelectorAll('svg')) {
    if (s.parentElement.closest('svg, button, a, .headerlink, .copybtn, label')) continue;
    const r = s.getBoundingClientRect();
    if (r.width < 64 && r.height < 64) continue;          // icons
    const w = widths(s), lab = label('svg', s);
    if (wider(w)) out.overflow.push({category: 'figure_overflow', item: lab, ...w});
  }

  const captionAfter = el => {
    const n = el && el.nextElementSibling;
    if (!n) return false;
    if (n.matches('.caption, .figure-caption, figcaption')) return n.textContent.trim().length > 0;
    return n.matches('p') && /^\s*(Figure|Fig\.)/i.test(n.textContent);
  };
  const captioned = img => {
    const fig = img.closest('figure');
    if (fig) { const fc = fig.querySelector('figcaption'); if (fc && fc.textContent.trim()) return true; }
    const dfig = img.closest('.figure');
    if (dfig) { const c = dfig.querySelector('.caption'); if (c && c.textContent.trim()) return true; }
    const block = img.closest('.cell') || img.closest('p, div') || img;
    if (captionAfter(block) || captionAfter(img)) return true;
    const out_ = img.closest('.cell_output');
    if (out_ && out_.lastElementChild && out_.lastElementChild !== img &&
        out_.lastElementChild.matches('.caption, .figure-caption')) return true;
    const ids = (img.getAttribute('aria-describedby') || '').split(/\s+/).filter(Boolean);
    return ids.some(id => { const d = document.getElementById(id); return d && d.textContent.trim(); });
  };
  for (const img of document.querySelectorAll('img')) {
    const inCol = col.contains(img);
    const rec = {src: img.getAttribute('src') || '', url: img.currentSrc || img.src, complete: img.complete,
                 natural: img.naturalWidth, inCol};
    if (inCol) {
      const w = widths(img);
      rec.item = label('figure', img);
      rec.alt = img.getAttribute('alt');
      rec.captioned = captioned(img);
      rec.wider = wider(w) || !!scrollingWrapper(img);
      rec.width = w.width; rec.scroll = w.scroll;
    }
    out.images.push(rec);
  }

  // Links and anchors.
  out.links = Array.from(document.querySelectorAll('a[href]'), a => ({href: a.getAttribute('href'), url: a.href}));
  out.ids = Array.from(document.querySelectorAll('[id]'), e => e.id)
    .concat(Array.from(document.querySelectorAll('a[name]'), e => e.getAttribute('name')));

  // Text, grouped by the nearest block, skipping code and MathJax.
  const SKIP = 'pre, code, script, style, textarea, .math, mjx-container, .MathJax, math, .highlight, ' +
               '.cell_input, .headerlink';
  const BLOCK = 'p, li, td, th, dt, dd, h1, h2, h3, h4, h5, h6, caption, figcaption, blockquote, summary, div, section';
  const blocks = new Map();
  const walker = document.createTreeWalker(col, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const el = n.parentElement;
    if (!el || el.closest(SKIP)) continue;
    const b = el.closest(BLOCK) || col;
    blocks.set(b, (blocks.get(b) || '') + n.nodeValue);
  }
  for (const [b, text] of blocks) {
    if (!/[$\\^_]/.test(text)) continue;
    const sec = b.closest('section[id]');
    out.latex.push({section: sec ? sec.id : 'top', text});
  }
  // Formulas: typeset, without error, within the column.
  out.math = [];
  for (const m of col.querySelectorAll('.math')) {
    if (m.parentElement.closest('.math')) continue;
    const box = m.querySelector('mjx-container');
    if (!box) { out.math.push({item: label('math-unrendered', m), text: m.textContent.slice(0, 80)}); continue; }
    if (box.querySelector('mjx-merror')) out.math.push({item: label('math-error', m), text: m.textContent.slice(0, 80)});
    const w = widths(box);
    if (wider(w) || scrolls(box)) out.math.push({item: label('math-wide', m), width: w.width, scroll: w.scroll});
  }
  // Cut cells: table cells whose text pandas cut short ("...").
  out.cut = [];
  out.values = [];
  for (const c of col.querySelectorAll('td, th')) {
    if (c.closest('.cell_input')) continue;
    const lab = label('cell', c);
    if (/\.\.\.$/.test(c.textContent.trim())) out.cut.push({item: lab, text: c.textContent.trim().slice(-60)});
    if (c.tagName === 'TD' && /^(None|nan|NaN|\{\}|\[.*\]|\{['"].*\}|\(\(.*\)\))$/s.test(c.textContent.trim())) {
      const sec = c.closest('section[id]');
      out.values.push({section: sec ? sec.id : 'top', text: c.textContent.trim()});
    }
  }
  // Reprs: anywhere in the column but the code cells' sources.
  for (const o of col.querySelectorAll('.cell_output, .output, p, li, td')) {
    if (o.closest('.cell_input') || (o.parentElement && o.parentElement.closest('.cell_output, .output'))) continue;
    const text = o.textContent;
    if (!/at 0x[0-9a-fA-F]+>|<matplotlib\.|<Figure size /.test(text)) continue;
    const sec = o.closest('section[id]');
    out.reprs.push({section: sec ? sec.id : 'top', text});
  }
  return out;
}
"""

_LATEX = re.compile(
    r"\$\$"                                            # display math delimiters
    r"|\$[^$\s](?:[^$\n]{0,200}?[^$\s\\])?\$"          # $...$ inline math
    r"|\\[()\[\]]"                                     # \( \) \[ \]
    r"|\\[A-Za-z]{2,}"                                 # \frac, \lambda, \mathbf ...
    r"|[\^_]\{[^{}\n]{0,40}\}?")                       # ^{...} _{...}
_REPR = re.compile(r"<(?:matplotlib\.|Figure size \d|[A-Za-z_][\w.]*[^<>\n]{0,120}? at 0x)[^<>\n]{0,160}>")


@dataclass
class PageReport:
    page: str
    column: dict = field(default_factory=dict)
    violations: dict = field(default_factory=lambda: {c: [] for c in CATEGORIES})
    details: dict = field(default_factory=lambda: {c: [] for c in CATEGORIES})

    def add(self, category: str, item: str, **detail) -> None:
        items = self.violations[category]
        base, n = item, 2
        while item in items:                            # the same label twice: number the repeats
            item, n = f"{base} ({n})", n + 1
        items.append(item)
        self.details[category].append({"item": item, **detail})

    @property
    def total(self) -> int:
        return sum(len(v) for v in self.violations.values())


def find_chromium() -> str | None:
    """The Chromium to drive: ``$SUBFL_CHROMIUM``, else the first of ``CHROMIUM_CANDIDATES`` on ``PATH``."""
    env = os.environ.get("SUBFL_CHROMIUM")
    if env:
        return env if Path(env).exists() else None
    for name in CHROMIUM_CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def site_pages(site: Path) -> list[Path]:
    """Every HTML page of the site: ``_static`` (theme templates) and hidden ``.*.html`` files left out."""
    pages = []
    for p in sorted(site.rglob("*.html")):
        rel = p.relative_to(site)
        if rel.parts[0] == "_static" or any(part.startswith(".") for part in rel.parts):
            continue
        pages.append(p)
    return pages


def _file_of(url: str) -> tuple[Path, str] | None:
    """The local file and the fragment a ``file:`` URL points to (None for other schemes)."""
    parts = urlsplit(url)
    if parts.scheme != "file":
        return None
    return Path(url2pathname(parts.path)), unquote(parts.fragment)


_REFRESH_RE = re.compile(r"""<meta\s+http-equiv=["']refresh["']\s+content=["'][^"';]*;\s*url=([^"']+)["']""", re.I)
_ID_RE = re.compile(r"""\s(?:id|name)\s*=\s*["']([^"']+)["']""")


def _judge(page: PageReport, data: dict, failed: list[str], site: Path, ids_of, check_math: bool = True) -> None:
    """Turn what the page measured into violations (formulas only with ``check_math``)."""
    page.column = data["column"]
    for rec in data["overflow"]:
        page.add(rec.pop("category"), rec.pop("item"), **rec)
    seen_broken = set()

    def broken(what: str, target: str, **detail):
        if (what, target) not in seen_broken:
            seen_broken.add((what, target))
            page.add("broken_link", f"{what} {target}", **detail)

    for img in data["images"]:
        loc = _file_of(img["url"])
        if loc is not None and not loc[0].exists():
            broken("image", img["src"], url=img["url"])
        elif img["complete"] and img["natural"] == 0 and not img["url"].startswith(("http:", "https:")):
            broken("image", img["src"], url=img["url"], reason="does not decode")
        if not img.get("inCol"):
            continue
        item = img["item"]
        if img["wider"]:
            page.add("figure_overflow", item, src=img["src"], width=img["width"], scroll=img["scroll"])
        elif img["natural"] and img["width"] < SHRINK * img["natural"]:
            page.add("figure_shrunk", item, src=img["src"], width=img["width"], natural=img["natural"],
                     scale=round(img["width"] / img["natural"], 2))
        alt = (img.get("alt") or "").strip()
        if not alt or alt == img["src"] or "/" in alt and " " not in alt or \
                re.fullmatch(r"[\w.\-/]+\.(png|jpe?g|gif|svg|webp)", alt, re.I):
            page.add("figure_no_alt", item, src=img["src"], alt=img.get("alt"))
        if not img["captioned"]:
            page.add("figure_no_caption", item, src=img["src"])
    for url in failed:
        loc = _file_of(url)
        if loc is not None:
            rel = os.path.relpath(loc[0], site) if loc[0].is_relative_to(site) else str(loc[0])
            broken("resource", rel, url=url)
    for link in data["links"]:
        loc = _file_of(link["url"])
        if loc is None:
            continue
        path, frag = loc
        if path.is_dir():
            path = path / "index.html"
        if not path.exists():
            broken("link", link["href"], url=link["url"])
        elif frag and path.suffix == ".html" and frag not in ids_of(path):
            broken("anchor", link["href"], url=link["url"])
    for block in data["latex"]:
        for m in _LATEX.finditer(block["text"]):
            context = block["text"][max(0, m.start() - 40): m.end() + 40].replace("\n", " ")
            page.add("raw_latex", f"{m.group(0)[:60]} in #{block['section']}", context=context)
    if check_math:
        for rec in data["math"]:
            page.add("math", rec.pop("item"), **rec)
    for rec in data["cut"]:
        page.add("cell_cut", rec.pop("item"), **rec)
    for block in data["reprs"]:
        for m in _REPR.finditer(block["text"]):
            text = re.sub(r"0x[0-9a-fA-F]+", "0x…", m.group(0))
            page.add("repr", f"{text[:100]} in #{block['section']}")
    for cell in data["values"]:
        page.add("repr", f"cell {cell['text'][:60]} in #{cell['section']}")


def check_site(site: Path | str = "_build/html", screenshots: Path | str | None = None,
               screenshot_pages=SCREENSHOT_PAGES, chromium: str | None = None,
               pages: list[Path] | None = None) -> dict:
    """Check every page of ``site``; return the report (``{"site", "column", "pages": {page: {...}}, "totals"}``)."""
    from playwright.sync_api import sync_playwright

    site = Path(site).resolve()
    if not (site / "index.html").exists():
        raise FileNotFoundError(f"no built site at {site} (run `make site`)")
    chromium = chromium or find_chromium()
    if chromium is None:
        raise FileNotFoundError("Chromium not found (install Debian's `chromium`, or set SUBFL_CHROMIUM)")
    pages = site_pages(site) if pages is None else [Path(p).resolve() for p in pages]
    check_math = (site / LOCAL_MATHJAX).is_file()
    shots_dir = Path(screenshots) if screenshots else None
    if shots_dir:
        shots_dir.mkdir(parents=True, exist_ok=True)
    measured: dict[str, tuple[dict, list[str]]] = {}
    ids_cache: dict[Path, set[str]] = {}
    shots = []
    started = time.perf_counter()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        context = browser.new_context(viewport={"width": WIDTH, "height": HEIGHT}, device_scale_factor=1)
        context.route(re.compile(r"^(https?|wss?)://"), lambda route: route.abort())
        tab = context.new_page()
        for path in pages:
            rel = path.relative_to(site).as_posix()
            refresh = _REFRESH_RE.search(path.read_text(errors="replace")[:4000])
            if refresh:                                 # a redirect stub (the site's index.html): check its target
                measured[rel] = ({"redirect": refresh.group(1)}, [])
                continue
            failed: list[str] = []
            handler = lambda req, failed=failed: failed.append(req.url)  # noqa: E731
            tab.on("requestfailed", handler)
            tab.goto(path.as_uri(), wait_until="load")
            if check_math:   # typeset before measuring (a page MathJax fails on shows its formulas unrendered)
                tab.evaluate(_MATHJAX_JS, MATHJAX_SECONDS)
            tab.evaluate("document.fonts.ready.then(() => true)")
            if shots_dir and rel in screenshot_pages:
                height = tab.evaluate("document.documentElement.scrollHeight")
                out = shots_dir / (rel.removesuffix(".html").replace("/", "__") + ".png")
                tab.screenshot(path=str(out), full_page=True,
                               clip={"x": 0, "y": 0, "width": WIDTH, "height": min(height, SCREENSHOT_HEIGHT)})
                shots.append(str(out))
            tab.evaluate("document.querySelectorAll('details').forEach(d => d.open = true)")
            data = tab.evaluate(_MEASURE_JS, {"selectors": list(COLUMN_SELECTORS)})
            tab.remove_listener("requestfailed", handler)
            ids_cache[path.resolve()] = set(data["ids"])
            measured[rel] = (data, failed)
        browser.close()

    def ids_of(target: Path) -> set[str]:
        target = target.resolve()
        if target not in ids_cache:
            ids_cache[target] = set(_ID_RE.findall(target.read_text(errors="replace")))
        return ids_cache[target]

    reports = {}
    for rel, (data, failed) in measured.items():
        page = PageReport(rel)
        if "redirect" in data:
            target = (site / rel).parent / unquote(urlsplit(data["redirect"]).path)
            if not target.exists():
                page.add("broken_link", f"redirect {data['redirect']}")
        else:
            _judge(page, data, failed, site, ids_of, check_math=check_math)
        reports[rel] = page
    totals = {c: sum(len(p.violations[c]) for p in reports.values()) for c in CATEGORIES}
    columns = Counter(f"{p.column['selector']} {p.column['width']}px" for p in reports.values() if p.column)
    return {
        "site": str(site),
        "window": {"width": WIDTH, "height": HEIGHT},
        "column": dict(columns),
        "seconds": round(time.perf_counter() - started, 1),
        "math": ("checked: the site serves its own MathJax" if check_math else
                 "not checked: the site loads MathJax from its CDN (run `make mathjax`, then rebuild)"),
        "screenshots": shots,
        "totals": totals,
        "pages": {rel: {"violations": {c: v for c, v in p.violations.items() if v},
                        "details": {c: v for c, v in p.details.items() if v}}
                  for rel, p in reports.items()},
    }


def violations(report: dict) -> Counter:
    """The report's violations as a multiset of ``(page, category, item)``: what the baseline compares."""
    return Counter((page, cat, item) for page, rec in report["pages"].items()
                   for cat, items in rec["violations"].items() for item in items)


def baseline(report: dict) -> dict:
    """The committed-baseline form of a report: labels only, no measurements."""
    return {"window": report["window"], "totals": report["totals"],
            "pages": {page: rec["violations"] for page, rec in sorted(report["pages"].items()) if rec["violations"]}}


SHORT = {"figure_overflow": "fig-wide", "figure_shrunk": "fig-small", "figure_no_alt": "no-alt",
         "figure_no_caption": "no-cap", "table_overflow": "tables", "code_overflow": "code",
         "broken_link": "links", "raw_latex": "latex", "math": "math", "cell_cut": "cut", "repr": "reprs"}


def summary(report: dict) -> str:
    """A table: one row per page, one column per category, the totals last."""
    cols = [SHORT[c] for c in CATEGORIES]
    width = max(len(p) for p in report["pages"]) if report["pages"] else 10
    lines = [f"{'page':{width}s} " + " ".join(f"{c:>9s}" for c in cols) + "     all"]
    for page, rec in sorted(report["pages"].items()):
        counts = [len(rec["violations"].get(c, [])) for c in CATEGORIES]
        lines.append(f"{page:{width}s} " + " ".join(f"{n:9d}" for n in counts) + f" {sum(counts):7d}")
    totals = [report["totals"][c] for c in CATEGORIES]
    lines.append(f"{'TOTAL':{width}s} " + " ".join(f"{n:9d}" for n in totals) + f" {sum(totals):7d}")
    folded = sum(d.get("folded", False) for rec in report["pages"].values()
                 for d in rec.get("details", {}).get("code_overflow", []))
    lines.append("")
    lines.append(f"totals: figures too wide {report['totals']['figure_overflow']}, figures shrunk below "
                 f"{SHRINK:.0%} (illegible) {report['totals']['figure_shrunk']}, figures without alt text "
                 f"{report['totals']['figure_no_alt']}, without caption {report['totals']['figure_no_caption']}, "
                 f"tables overflowing {report['totals']['table_overflow']}, code blocks overflowing "
                 f"{report['totals']['code_overflow']} ({folded} in folded cells), broken links "
                 f"{report['totals']['broken_link']}, raw LaTeX {report['totals']['raw_latex']}, formulas "
                 f"{report['totals']['math']} ({report['math']}), table cells cut short "
                 f"{report['totals']['cell_cut']}, reprs {report['totals']['repr']}")
    lines.append(f"{len(report['pages'])} pages, window {report['window']['width']} px, "
                 f"column {', '.join(report['column'])}, checked in {report['seconds']} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m subfl_book.browser", description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", default="_build/html", help="the built site (default _build/html)")
    parser.add_argument("--json", default=None, help="write the report here; with --baseline, the baseline")
    parser.add_argument("--baseline", action="store_true",
                        help="with --json: write only the violation labels "
                             "(the form of tests/book/browser_baseline.json)")
    parser.add_argument("--screenshots", default=None, help=f"save PNGs of {', '.join(SCREENSHOT_PAGES)} here")
    parser.add_argument("--details", action="store_true", help="also print every violation")
    args = parser.parse_args(argv)
    try:
        report = check_site(args.site, screenshots=args.screenshots)
    except FileNotFoundError as err:
        print(f"browser check: error: {err}", file=sys.stderr)
        return 2
    print(summary(report))
    if args.details:
        for page, rec in sorted(report["pages"].items()):
            for cat, items in rec["details"].items():
                for d in items:
                    extra = {k: v for k, v in d.items() if k != "item"}
                    print(f"{page}: {cat}: {d['item']}  {json.dumps(extra, ensure_ascii=False)}")
    if report["screenshots"]:
        print("screenshots: " + ", ".join(report["screenshots"]))
    if args.json:
        data = baseline(report) if args.baseline else report
        Path(args.json).write_text(json.dumps(data, indent=1, ensure_ascii=False, sort_keys=False) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
