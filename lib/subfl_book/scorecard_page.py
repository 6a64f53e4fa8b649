"""The book's Scorecard page (``book/scorecard.md``) and the status counts of the intro and the README, generated from
the claims register (:mod:`subfl_book.claims`) and the scorecards the executed pages recorded
(``metadata.subfl.scorecard``, :mod:`subfl_book.scorecard`). Nothing on it is typed by hand: ``subfl-book
--scorecard`` rewrites it, and a test fails when the committed copy differs from what the register and the pages
give.
"""
from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from . import design_page
from .claims import NOT_RUN_REASONS, PAPERS, Claim, Register, load_register
from .pipeline import executed_path, status
from .verdict import STATUSES

PAPER_NAMES = {"spectral": "Spectral model sharding (Korzhenkov & Louizos, NeurIPS 2024)",
               "prism": "PriSM (Niu et al., TMLR 2023)", "flanc": "FLANC (Mei et al., NeurIPS 2022)",
               "fedp3": "FedP3 (Yi et al., ICLR 2024)", "caff": "CAFF (Pfeiffer et al.)"}
SHORT_NAMES = {"spectral": "Spectral sharding", "prism": "PriSM", "flanc": "FLANC", "fedp3": "FedP3", "caff": "CAFF"}

COMBINE_ORDER = ("differs", "same", "exact", "inconclusive", "near-chance", "not-run")
"""A claim judged by several rows takes the first of these among its rows' statuses: one ``differs`` outweighs any
number of ``same``."""

MARKERS = ("<!-- scorecard-counts:start -->", "<!-- scorecard-counts:end -->")

PAGE_MARKERS = ("<!-- chapter-scorecard:start -->", "<!-- chapter-scorecard:end -->")
"""Where a chapter's index page holds its generated table of pages and their verdicts."""

STATUS_MARKERS = ("<!-- page-status:start -->", "<!-- page-status:end -->")
"""Where the README holds its generated table of every page: fresh or stale, its seeds, the claims it judges."""


@dataclass(frozen=True)
class ClaimStatus:
    claim: Claim
    status: str
    rows: tuple[dict, ...]
    note: str


def page_rows(root: Path) -> dict[str, list[dict]]:
    """The scorecard rows every executed page recorded, by page (``book/<chapter>/<page>``)."""
    out: dict[str, list[dict]] = {}
    for nb in sorted((root / "book").glob("*/*.ipynb")):
        meta = json.loads(nb.read_text()).get("metadata", {}).get("subfl", {})
        out[f"book/{nb.parent.name}/{nb.stem}"] = list(meta.get("scorecard") or [])
    return out


REFERENCE_SIDE = "the other side of an ordering judged under another claim"
"""Why a claim with no row of its own is not judged on its own although a page uses it: it is the cell a page's
ordering compares another claim against (``against`` of a row), and that row's status belongs to the other claim."""


def claim_statuses(paper: str, rows_by_page: dict[str, list[dict]],
                   register: "Register | None" = None) -> list[ClaimStatus]:
    """Each claim of ``paper`` with the status the book gives it (:data:`COMBINE_ORDER` over its rows)."""
    by_claim: dict[str, list[dict]] = {}
    against: dict[str, list[str]] = {}   # claim -> the claims of the orderings it is the other side of
    for rows in rows_by_page.values():
        for row in rows:
            by_claim.setdefault(row["claim"], []).append(row)
            if row.get("against"):
                against.setdefault(row["against"], []).append(row["claim"])
    out = []
    for claim in (register or load_register(paper)).claims:
        rows = tuple(by_claim.get(claim.key, ()))
        if rows:
            statuses = {r["status"] for r in rows}
            status = next(s for s in COMBINE_ORDER if s in statuses)
            note = "; ".join(dict.fromkeys(_row_note(r) for r in rows))
        elif claim.not_run:
            status, note = "not-run", f"{NOT_RUN_REASONS[claim.not_run['reason']]}: {claim.not_run['detail']}"
        elif claim.key in against:
            status = "not-run"
            others = list(dict.fromkeys(against[claim.key]))
            note = (f"{REFERENCE_SIDE}: its value is the paper's reference in the ordering"
                    f"{'s' if len(others) > 1 else ''} judged under {', '.join(o.split(':', 1)[-1] for o in others)}")
        else:
            status = "not-run"
            note = "its page has not judged it yet (page awaiting re-execution with its scorecard)"
        out.append(ClaimStatus(claim, status, rows, note))
    return out


def _row_note(row: dict) -> str:
    """``status (reason)``, plus where the row's setting departs from the paper's (a page row's ``departures``,
    e.g. ``α 0.1 → 1``), so the book-level table says what a verdict was judged on."""
    departs = row.get("departures")
    if departs and departs != "—" and row.get("scale") != "analytic":
        return f"{row['status']} ({row['reason']}; our setting departs: {departs})"
    return f"{row['status']} ({row['reason']})"


def counts(statuses: Iterable[ClaimStatus]) -> Counter:
    return Counter(s.status for s in statuses)


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


_JOINED_NAME = re.compile(r"(?<=[a-z]{2})\+(?=[a-z]{2})")   # a name part has 2+ letters: math like a+b is left alone


def breakable(text: str) -> str:
    """``text`` with a line-break opportunity (a zero-width space) after each ``+`` that joins two parts of a method's
    name (``prism+wallenius+cliplr``), so a narrow column wraps the name instead of running off the page; the
    house style never splits a word anywhere else."""
    return _JOINED_NAME.sub("+\u200b", text)


def _page_link(page: str) -> str:
    return f"{{doc}}`{page.removeprefix('book/')}`"


def counts_table(all_statuses: dict[str, list[ClaimStatus]], link: bool = True) -> str:
    """Markdown: one row per paper, one column per status, plus the total."""
    head = "| paper | " + " | ".join(STATUSES) + " | claims |"
    lines = [head, "|" + "---|" * (len(STATUSES) + 2)]
    for paper, statuses in all_statuses.items():
        c = counts(statuses)
        name = f"[{SHORT_NAMES[paper]}](#{paper}-claims)" if link else SHORT_NAMES[paper]
        lines.append(f"| {name} | " + " | ".join(str(c.get(s, 0)) for s in STATUSES) + f" | {len(statuses)} |")
    return "\n".join(lines)


def _group_key(claim: Claim) -> str:
    m = re.match(r"(Table|Fig\.|Figure|Sec\.|Section|Eq\.|Alg\.|Theorem|Thm\.|Proposition|Lemma|App\.)\s*\(?"
                 r"[A-Z]?[0-9.]*\)?", claim.source)
    return m.group(0).rstrip(".") if m else claim.source


def _paper_cell(status: ClaimStatus) -> str:
    """The claim's own value, plus, for each row that judged it as a comparison with another claim (``against``),
    what was compared and the paper's values in that comparison (e.g. ``PriSM vs Top-n: 82.59 vs 78.37 (+4.22)``),
    so that the ``ours`` column is read against the paper's numbers of the same comparison."""
    compared = dict.fromkeys(f"{r['statement']}: {r['paper']}" for r in status.rows
                             if r.get("against") and r.get("statement") and r.get("paper"))
    label = status.claim.paper_label()
    return f"{label} (judged as {'; '.join(compared)})" if compared else label


def _claims_table(members: Iterable[ClaimStatus]) -> list[str]:
    lines = ["| claim | where | paper | ours | status | pages / why |", "|---|---|---|---|---|---|"]
    for s in members:
        ours = "; ".join(dict.fromkeys(r["ours"] for r in s.rows)) or "—"
        pages = sorted({r["page"] for r in s.rows if r.get("page")} | set(s.claim.checked_by))
        links = ", ".join(_page_link(p) for p in pages)
        why = f"{links} — {s.note}" if links else s.note
        lines.append(f"| {_cell(s.claim.statement)} | {_cell(s.claim.where)} | {_cell(breakable(_paper_cell(s)))} | "
                     f"{_cell(ours)} | **{s.status}** | {_cell(why)} |")
    return lines


def render(root: Path) -> str:
    """The Scorecard page's markdown."""
    rows_by_page = page_rows(root)
    all_statuses = {p: claim_statuses(p, rows_by_page) for p in PAPERS}
    parts = ["# Scorecard", "",
             "Every claim of the five papers — each table cell, each quantitative sentence, each theorem the book "
             "checks — with the status the book's one verdict rule gives it. The claims are transcribed from the "
             "papers' text into the register (`book/claims/<paper>.yml`, with the source of every number); the "
             "statuses come from the scorecards the executed pages record. Nothing here is typed by hand: "
             "`subfl-book --scorecard` regenerates this page.", "",
             "**The verdict rule** (`subfl_book.verdict`). *exact*: an analytic quantity equal to the paper's "
             "within its rounding, or an identity that holds within a stated tolerance; deviations below 1e-12 "
             "(float64 roundoff, whose last digits depend on the CPU and the thread count) are shown as "
             "\"< 1e-12\". Learned quantities are summarised per compared side by mean ± sd over seeds: "
             "*inconclusive* with fewer than 3 seeds on a side, when the bands overlap (a bound: when the band "
             "straddles the limit), or at the `ci` smoke-test scale; *near-chance* when every compared value closed "
             "less than 10 % of the gap from chance to a perfect score; otherwise *same* when the paper's ordering, "
             "bound or trend holds beyond the bands and *differs* when the opposite does. A trend is judged step by "
             "step along its sweep, and a claim that one method is the best of several against every rival, not "
             "only the one with the best mean: *same* needs every step or rival to go the paper's way beyond the "
             "bands, one going the other way beyond them makes it *differs*. Orderings, bounds and trends of "
             "deterministic quantities (counts, bytes, identities, timings in one run) are compared as they are, "
             "without seeds or bands. *not-run*: no page judges "
             "the claim (the reason is given). A claim judged on several pages takes the first of "
             f"{', '.join(COMBINE_ORDER)} among its rows.", "",
             "Absolute accuracies of the papers' full-scale runs are not reproduced at the `cpu` scale; the pages "
             "judge the orderings between them (a method against its baseline in the same column), which is what "
             "a smaller scale can test.", "",
             "A learned verdict holds for the records its page read. A run is reproducible bit for bit on one "
             "machine, but another CPU can round differently and a training run amplifies a last-bit difference "
             "to points of accuracy: {doc}`prism/homogeneous` shows one seed that moved by more than the spread "
             "of its seeds, and with it verdicts at the edge of that spread. Every record names the machine it "
             "was computed on, and each page's run card lists them.", "",
             "## Status counts", "", counts_table(all_statuses), ""]
    reasons = Counter((s.claim.paper, s.claim.not_run["reason"]) for st in all_statuses.values() for s in st
                      if s.status == "not-run" and s.claim.not_run)
    reference = Counter(s.claim.paper for st in all_statuses.values() for s in st
                        if s.status == "not-run" and not s.claim.not_run and s.note.startswith(REFERENCE_SIDE))
    pending = Counter(s.claim.paper for st in all_statuses.values() for s in st
                      if s.status == "not-run" and not s.claim.not_run and not s.note.startswith(REFERENCE_SIDE))
    parts += ["**Not run, and why** (claims per paper):", "",
              "| reason | " + " | ".join(SHORT_NAMES[p] for p in PAPERS) + " |",
              "|---|" + "---|" * len(PAPERS)]
    for reason, words in NOT_RUN_REASONS.items():
        parts.append(f"| {words} | " + " | ".join(str(reasons.get((p, reason), 0)) for p in PAPERS) + " |")
    parts.append(f"| {REFERENCE_SIDE} | " + " | ".join(str(reference.get(p, 0)) for p in PAPERS) + " |")
    parts.append("| checked by a page not yet re-executed with its scorecard | " +
                 " | ".join(str(pending.get(p, 0)) for p in PAPERS) + " |")
    parts.append("")
    for paper, statuses in all_statuses.items():
        reg = load_register(paper)
        parts += [f"({paper}-claims)=", f"## {PAPER_NAMES[paper]}", "", f"*{reg.title}*", "",
                  counts_table({paper: statuses}, link=False), ""]
        judged = [s for s in statuses if s.rows]
        if judged:
            parts += ["**Judged so far**:", "", *_claims_table(judged), ""]
        groups: dict[str, list[ClaimStatus]] = {}
        for s in statuses:
            groups.setdefault(_group_key(s.claim), []).append(s)
        parts += ["**Every claim**, by where the paper makes it:", ""]
        for group, members in groups.items():
            c = counts(members)
            summary = ", ".join(f"{c[k]} {k}" for k in STATUSES if c.get(k))
            parts += [f"````{{dropdown}} {group} — {len(members)} claim{'s' if len(members) != 1 else ''}: {summary}",
                      *_claims_table(members), "````", ""]
    return "\n".join(parts).rstrip() + "\n"


def counts_block(root: Path) -> str:
    """The counts table for the intro and the README, between :data:`MARKERS`."""
    rows_by_page = page_rows(root)
    table = counts_table({p: claim_statuses(p, rows_by_page) for p in PAPERS}, link=False)
    return f"{MARKERS[0]}\n{table}\n{MARKERS[1]}"


def replace_block(text: str, block: str, where: str, markers: tuple[str, str] = MARKERS) -> str:
    start, end = (re.escape(m) for m in markers)
    pattern = re.compile(f"{start}.*?{end}", re.S)
    if not pattern.search(text):
        raise ValueError(f"{where} has no {markers[0]} … {markers[1]} block to fill")
    return pattern.sub(lambda _: block, text, count=1)


def _toc_files(root: Path) -> list[str]:
    """Every page of ``_toc.yml`` in the book's order (``book/<chapter>/<page>``)."""
    return re.findall(r"file:\s*(book/[\w-]+/[\w-]+)", (root / "_toc.yml").read_text())


def _toc_pages(root: Path, chapter: str) -> list[str]:
    """The pages of ``chapter`` in the order of ``_toc.yml`` (``book/<chapter>/<page>``, the index left out)."""
    return [f for f in _toc_files(root) if f.startswith(f"book/{chapter}/") and not f.endswith("/index")]


def chapter_block(root: Path, chapter: str, rows_by_page: dict[str, list[dict]] | None = None) -> str:
    """A chapter index's table: one row per page with the number of the paper's claims it judges and how many of
    them get each status there (a claim judged by several rows of the page takes :data:`COMBINE_ORDER`'s first)."""
    rows_by_page = page_rows(root) if rows_by_page is None else rows_by_page
    judged = [s for s in STATUSES if s != "not-run"]
    lines = ["| page | claims judged | " + " | ".join(judged) + " |", "|---|---|" + "---|" * len(judged)]
    for page in _toc_pages(root, chapter):
        by_claim: dict[str, set[str]] = {}
        for row in rows_by_page.get(page, []):
            by_claim.setdefault(row["claim"], set()).add(row["status"])
        combined = Counter(next(s for s in COMBINE_ORDER if s in statuses) for statuses in by_claim.values())
        if not by_claim:
            lines.append(f"| {{doc}}`{page.rsplit('/', 1)[1]}` | — (awaiting re-execution with its scorecard) |"
                         + " |" * len(judged))
            continue
        lines.append(f"| {{doc}}`{page.rsplit('/', 1)[1]}` | {len(by_claim)} | " + " | ".join(str(combined.get(s, 0)) for s in judged)
                     + " |")
    return f"{PAGE_MARKERS[0]}\n" + "\n".join(lines) + f"\n{PAGE_MARKERS[1]}"


def _page_title(notebook: Path) -> str:
    """The first level-1 heading of a notebook, without the ``#``."""
    for cell in json.loads(notebook.read_text()).get("cells", []):
        if cell.get("cell_type") == "markdown":
            match = re.search(r"^# (.+)$", "".join(cell["source"]), re.M)
            if match:
                return match.group(1).strip()
    return notebook.stem


def _seeds_cell(parameters: dict) -> str:
    seeds = parameters.get("seeds")
    if isinstance(seeds, list) and seeds:
        return f"{len(seeds)} ({', '.join(str(s) for s in seeds)})"
    return "—"


def status_block(root: Path, rows_by_page: dict[str, list[dict]] | None = None) -> str:
    """The README's table of every page in the book's order: fresh (executed from the store by the current code) or
    stale and why (:func:`subfl_book.pipeline.status`, against the store :func:`subfl_book.store.store_root` names),
    the seeds of the outputs it shows, and how many claims it judges — between :data:`STATUS_MARKERS`."""
    rows_by_page = page_rows(root) if rows_by_page is None else rows_by_page
    order = {page: i for i, page in enumerate(_toc_files(root))}
    states = sorted(status("cpu", root=root), key=lambda s: order.get(
        f"book/{Path(s.notebook).parent.name}/{Path(s.notebook).stem}", len(order)))
    fresh = sum(s.state == "fresh" for s in states)
    lines = [f"{fresh} of {len(states)} pages are fresh; the stale ones show their earlier outputs under a "
             "notice that says why.", "",
             "| chapter | page | state | seeds of the outputs shown | claims judged |", "|---|---|---|---|---|"]
    for s in states:
        source = root / s.notebook
        executed = executed_path(source, root)
        meta = json.loads(executed.read_text()).get("metadata", {}).get("subfl", {}) if executed.exists() else {}
        page = f"book/{source.parent.name}/{source.stem}"
        judged = len({row["claim"] for row in rows_by_page.get(page, [])})
        state = "fresh" if s.state == "fresh" else f"{s.state}: {s.reason}"
        lines.append(f"| {source.parent.name} | {_cell(_page_title(source))} | {_cell(state)} | "
                     f"{_seeds_cell(meta.get('parameters') or {})} | {judged or '—'} |")
    return f"{STATUS_MARKERS[0]}\n" + "\n".join(lines) + f"\n{STATUS_MARKERS[1]}"


def targets(root: Path) -> dict[Path, str]:
    """Every generated file and the text it must hold: the Scorecard page, the status counts of the intro and the
    README, the README's table of pages, each chapter index's table and the design appendix's table of methods."""
    block = counts_block(root)
    out = {root / "book" / "scorecard.md": render(root)}
    for rel in ("book/intro.md", "README.md"):
        path = root / rel
        out[path] = replace_block(path.read_text(), block, rel)
    rows_by_page = page_rows(root)
    design = design_page.design_path(root)
    out[design] = replace_block(design.read_text(), design_page.methods_block(), str(design), design_page.MARKERS)
    readme = root / "README.md"
    out[readme] = replace_block(out[readme], status_block(root, rows_by_page), "README.md", STATUS_MARKERS)
    for paper in PAPERS:
        path = root / "book" / paper / "index.md"
        out[path] = replace_block(path.read_text(), chapter_block(root, paper, rows_by_page), str(path),
                                  PAGE_MARKERS)
    return out


def write(root: Path) -> list[Path]:
    """Regenerate the Scorecard page, the counts of the intro and README and each chapter index's table of pages;
    returns the files that changed."""
    changed = []
    for path, text in targets(root).items():
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            changed.append(path)
    return changed


def out_of_date(root: Path) -> list[Path]:
    """The generated files whose committed text differs from what the register and the pages give."""
    return [path for path, text in targets(root).items() if not path.exists() or path.read_text() != text]
