"""The claims register: every number, setting and claim of the five papers, transcribed from the papers' text.

One YAML file per paper in ``book/claims/`` (``prism.yml``, ``spectral.yml``, ``flanc.yml``, ``fedp3.yml``,
``caff.yml``). A file holds the paper's ``settings`` (the experimental set-ups its tables and figures use, from
the text and the appendix hyper-parameter tables) and its ``claims``:

.. code-block:: yaml

    paper: prism
    title: "Overcoming Resource Constraints in Federated Learning: ..."
    file: prism.md                      # the paper's text in ../shared/papers/
    settings:
      cifar10-resnet18:                 # an id claims refer to
        source: "Sec. 4.1; Table 6"
        dataset: CIFAR-10
        model: ResNet-18
        ...                             # the fields of SETTING_FIELDS; null where the paper is silent
    claims:
      - id: t1-cifar10-r0.2-prism       # unique in the file; "prism:t1-cifar10-r0.2-prism" across the book
        source: Table 1                 # as the paper labels it: "Table 4", "Fig. 5", "Sec. 4.2", "Eq. (27)", ...
        row: PriSM                      # optional: the table's row and column labels
        column: "CIFAR-10, r = 0.2"
        kind: value                     # value | ordering | trend | bound | proof
        value: 85.3                     # a number, a list of numbers, or null (proofs, orderings stated in words)
        sd: 0.4                         # optional: the ± the paper gives
        unit: "% top-1 accuracy"
        setting: cifar10-resnet18       # a settings id, or null
        statement: "..."                # the claim in this book's words
        checked_by: [book/prism/heterogeneous]   # pages that test it (files of _toc.yml) ...
        not_run: {reason: compute, detail: "..."}  # ... or why no page does (NOT_RUN_REASONS)

Every claim has ``checked_by`` or ``not_run`` (not both). Numbers carry over with their source; statements are
this book's own words. :func:`validate` checks a register against this schema; ``tests/book/test_claims.py`` runs it
on the committed files.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

PAPERS = ("spectral", "prism", "flanc", "fedp3", "caff")
"""The register's files, in the book's chapter order."""

PAPER_FILES = {"prism": "prism.md", "spectral": "spectral_sharding.md", "flanc": "flanc.md", "fedp3": "fedp3.md",
               "caff": "caff.md"}
"""Each paper's text in the shared papers folder."""

KINDS = ("value", "ordering", "trend", "bound", "proof")
"""``value``: a number the paper reports; ``ordering``: one thing ranks above another; ``trend``: a quantity
moves one way along a sweep; ``bound``: a quantity stays above or below a limit ("within about 2 points", "more
than 10,815 times"); ``proof``: a theorem, proposition or equation."""

NOT_RUN_REASONS = {
    "dataset-offline": "dataset not available offline",
    "compute": "needs compute beyond the cpu scale",
    "not-implemented": "not implemented",
    "runs-pending": "implemented, its runs not computed yet",
    "not-testable": "not testable",
}
"""The fixed reasons a claim is not run, and how the book words them."""

SETTING_FIELDS = ("source", "dataset", "model", "clients", "active_per_round", "rounds", "local_epochs",
                  "optimiser", "lr", "lr_schedule", "batch_size", "partition", "alpha", "keep_ratios", "runs",
                  "notes")
"""The fields of a setting, as the paper states them (``null`` where it is silent). ``keep_ratios`` holds keep
ratios, widths, depths or pruning ratios — whatever sizes the paper's sub-models; ``notes`` anything else the
paper fixes (weight decay, momentum, normalisation layer, ...)."""

CLAIM_FIELDS = ("id", "source", "row", "column", "kind", "value", "sd", "unit", "setting", "statement",
                "checked_by", "not_run")
_REQUIRED = ("id", "source", "kind", "statement")
_ID = re.compile(r"^[a-z0-9][a-z0-9.+_-]*$")


def claims_dir() -> Path:
    """``book/claims/`` of the book's checkout."""
    from .store import checkout_root
    return checkout_root() / "book" / "claims"


def papers_dir() -> Path:
    """The papers' full text: ``$SUBFL_PAPERS_DIR``, else ``shared/papers`` beside the checkout."""
    import os
    from .store import checkout_root
    value = os.environ.get("SUBFL_PAPERS_DIR")
    return Path(value) if value else checkout_root().parent / "shared" / "papers"


_TABLE_CAPTION = re.compile(r"^\W*Table\s+([0-9]+)\s*[:.]", re.M)
_TABLE_MENTION = re.compile(r"Table\.?\s+([0-9]+)")


def paper_tables(text: str) -> set[str]:
    """The numbered tables of a paper's text: captions (``Table 4:``), and mentions (``Table 3``, ``Table. 2``) when a
    caption was lost in extraction."""
    return {f"Table {n}" for n in _TABLE_CAPTION.findall(text)} | {f"Table {n}" for n in _TABLE_MENTION.findall(text)}


@dataclass(frozen=True)
class Claim:
    """One entry of the register."""

    paper: str
    id: str
    source: str
    kind: str
    statement: str
    value: float | list[float] | None = None
    sd: float | list[float] | None = None
    unit: str | None = None
    row: str | None = None
    column: str | None = None
    setting: str | None = None
    checked_by: tuple[str, ...] = ()
    not_run: dict[str, str] | None = None

    @property
    def key(self) -> str:
        """The book-wide id, ``<paper>:<id>``."""
        return f"{self.paper}:{self.id}"

    @property
    def where(self) -> str:
        """Source, row and column in one label: ``Table 1 · PriSM · CIFAR-10, r = 0.2``."""
        return " · ".join(str(p) for p in (self.source, self.row, self.column) if p not in (None, ""))

    def paper_label(self) -> str:
        """The paper's value as the scorecard prints it (``85.3 ± 0.4 %``)."""
        if self.value is None:
            return "—"
        values = self.value if isinstance(self.value, list) else [self.value]
        sds = self.sd if isinstance(self.sd, list) else [self.sd] * len(values)
        text = ", ".join(f"{_number(v)}" + (f" ± {_number(s)}" if s is not None else "") for v, s in zip(values, sds))
        return f"{text} {self.unit}".strip() if self.unit else text


def _number(v: Any) -> str:
    if isinstance(v, float) and v.is_integer() and abs(v) >= 1000:
        return f"{int(v):,}"
    if isinstance(v, int) and abs(v) >= 10000:
        return f"{v:,}"
    return f"{v}"


@dataclass(frozen=True)
class Register:
    """One paper's register: its settings and claims."""

    paper: str
    title: str
    file: str
    settings: dict[str, dict[str, Any]]
    claims: tuple[Claim, ...] = field(default=())

    def claim(self, claim_id: str) -> Claim:
        for c in self.claims:
            if c.id == claim_id:
                return c
        raise KeyError(f"{self.paper} has no claim {claim_id!r} in {self.paper}.yml")


class RegisterError(ValueError):
    """A register file does not follow the schema; the message names the file, entry and field."""


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _numbers(v: Any) -> bool:
    return _is_number(v) or (isinstance(v, list) and len(v) > 0 and all(_is_number(x) for x in v))


def validate(raw: dict[str, Any], paper: str, pages: set[str] | None = None) -> list[str]:
    """Every schema violation of one register file's parsed YAML ``raw`` (empty when it is valid). ``pages``: the
    book's pages (``book/<chapter>/<page>``); a ``checked_by`` naming another page is an error."""
    errors: list[str] = []
    where = f"{paper}.yml"
    if not isinstance(raw, dict):
        return [f"{where}: the file must hold a mapping with paper, title, file, settings, claims"]
    for key in ("paper", "title", "file", "settings", "claims"):
        if key not in raw:
            errors.append(f"{where}: missing top-level key {key!r}")
    extra = set(raw) - {"paper", "title", "file", "settings", "claims"}
    if extra:
        errors.append(f"{where}: unknown top-level keys {sorted(extra)}")
    if raw.get("paper") != paper:
        errors.append(f"{where}: paper={raw.get('paper')!r}, expected {paper!r} (the file's name)")
    settings = raw.get("settings") or {}
    if not isinstance(settings, dict):
        errors.append(f"{where}: settings must be a mapping id -> setting")
        settings = {}
    for sid, setting in settings.items():
        if not isinstance(setting, dict):
            errors.append(f"{where}: setting {sid!r} must be a mapping")
            continue
        unknown = set(setting) - set(SETTING_FIELDS)
        if unknown:
            errors.append(f"{where}: setting {sid!r} has unknown fields {sorted(unknown)}; accepted: "
                          f"{', '.join(SETTING_FIELDS)}")
        if not setting.get("source"):
            errors.append(f"{where}: setting {sid!r} needs a source (where the paper states it)")
    claims = raw.get("claims") or []
    if not isinstance(claims, list):
        return errors + [f"{where}: claims must be a list"]
    seen: set[str] = set()
    for i, entry in enumerate(claims):
        label = f"{where}: claim #{i} ({entry.get('id') if isinstance(entry, dict) else entry!r})"
        if not isinstance(entry, dict):
            errors.append(f"{label}: must be a mapping")
            continue
        for key in _REQUIRED:
            if entry.get(key) in (None, ""):
                errors.append(f"{label}: missing {key!r}")
        unknown = set(entry) - set(CLAIM_FIELDS)
        if unknown:
            errors.append(f"{label}: unknown fields {sorted(unknown)}; accepted: {', '.join(CLAIM_FIELDS)}")
        cid = entry.get("id")
        if isinstance(cid, str):
            if not _ID.match(cid):
                errors.append(f"{label}: id must match {_ID.pattern}")
            if cid in seen:
                errors.append(f"{label}: duplicate id")
            seen.add(cid)
        if entry.get("kind") not in KINDS:
            errors.append(f"{label}: kind={entry.get('kind')!r}; accepted: {', '.join(KINDS)}")
        value = entry.get("value")
        if value is not None and not _numbers(value):
            errors.append(f"{label}: value must be a number, a list of numbers or null, got {value!r}")
        if entry.get("kind") == "value" and value is None:
            errors.append(f"{label}: a claim of kind 'value' needs a value")
        sd = entry.get("sd")
        if sd is not None:
            if not _numbers(sd):
                errors.append(f"{label}: sd must be a number or a list of numbers, got {sd!r}")
            elif isinstance(sd, list) != isinstance(value, list) or (
                    isinstance(sd, list) and len(sd) != len(value)):
                errors.append(f"{label}: sd must have the shape of value")
        if value is not None and not entry.get("unit"):
            errors.append(f"{label}: a value needs a unit")
        setting = entry.get("setting")
        if setting is not None and setting not in settings:
            errors.append(f"{label}: setting {setting!r} is not among the file's settings")
        checked, not_run = entry.get("checked_by"), entry.get("not_run")
        if bool(checked) == bool(not_run):
            errors.append(f"{label}: needs exactly one of checked_by (pages) and not_run (a reason)")
        if checked:
            if not isinstance(checked, list) or not all(isinstance(p, str) for p in checked):
                errors.append(f"{label}: checked_by must be a list of pages")
            elif pages is not None:
                for p in checked:
                    if p not in pages:
                        errors.append(f"{label}: checked_by page {p!r} is not in _toc.yml")
        if not_run:
            if not isinstance(not_run, dict) or not_run.get("reason") not in NOT_RUN_REASONS:
                errors.append(f"{label}: not_run must be {{reason, detail}} with reason one of "
                              f"{', '.join(NOT_RUN_REASONS)}")
            elif not not_run.get("detail"):
                errors.append(f"{label}: not_run needs a detail (one sentence: what is missing)")
    return errors


def parse(raw: dict[str, Any], paper: str) -> Register:
    """A validated register; raises :class:`RegisterError` listing every violation."""
    errors = validate(raw, paper)
    if errors:
        raise RegisterError("\n".join(errors))
    claims = tuple(Claim(paper=paper, id=e["id"], source=str(e["source"]), kind=e["kind"],
                         statement=e["statement"].strip(), value=e.get("value"), sd=e.get("sd"),
                         unit=e.get("unit"), row=_text(e.get("row")), column=_text(e.get("column")),
                         setting=e.get("setting"), checked_by=tuple(e.get("checked_by") or ()),
                         not_run=e.get("not_run"))
                   for e in raw["claims"])
    return Register(paper=paper, title=raw["title"], file=raw["file"], settings=dict(raw["settings"] or {}),
                    claims=claims)


def _text(v: Any) -> str | None:
    return None if v is None else str(v)


class PrintedFloat(float):
    """A register number that remembers how the paper printed it (``4.0`` is not ``4``: its rounding is 0.05)."""

    printed: str

    def __new__(cls, value: float, printed: str) -> "PrintedFloat":
        obj = super().__new__(cls, value)
        obj.printed = printed
        return obj

    def __reduce__(self):
        return (PrintedFloat, (float(self), self.printed))


def _loader():
    import yaml

    class RegisterLoader(yaml.SafeLoader):
        pass

    def construct_float(loader, node):
        value = yaml.SafeLoader.construct_yaml_float(loader, node)
        text = node.value.replace("_", "")
        return PrintedFloat(value, text) if re.fullmatch(r"[-+]?[0-9]*\.[0-9]+", text) else value

    RegisterLoader.add_constructor("tag:yaml.org,2002:float", construct_float)
    return RegisterLoader


def read_raw(paper: str, directory: Path | None = None) -> dict[str, Any]:
    """The parsed YAML of ``<paper>.yml`` (decimal numbers as :class:`PrintedFloat`)."""
    import yaml
    if paper not in PAPERS:
        raise ValueError(f"paper={paper!r} is not valid; accepted: {', '.join(PAPERS)}")
    path = (directory or claims_dir()) / f"{paper}.yml"
    if not path.is_file():
        raise FileNotFoundError(f"no register for {paper}: {path} does not exist")
    return yaml.load(path.read_text(), Loader=_loader())


@lru_cache(maxsize=None)
def load_register(paper: str) -> Register:
    """The committed register of ``paper`` (one of :data:`PAPERS`)."""
    return parse(read_raw(paper), paper)


def find_claim(key: str) -> Claim:
    """A claim by its book-wide id ``<paper>:<id>``."""
    paper, sep, claim_id = key.partition(":")
    if not sep:
        raise ValueError(f"claim key {key!r} must read '<paper>:<id>' with paper one of {', '.join(PAPERS)}")
    return load_register(paper).claim(claim_id)


def toc_pages() -> set[str]:
    """The book's pages as ``_toc.yml`` lists them (``book/<chapter>/<page>``)."""
    import yaml
    from .store import checkout_root
    toc = yaml.safe_load((checkout_root() / "_toc.yml").read_text())
    pages: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "file" in node:
                pages.add(node["file"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    walk(toc)
    if "root" in toc:
        pages.add(toc["root"])
    return pages


def main(argv: list[str] | None = None) -> int:
    """``python -m subfl_book.claims [paper ...]``: validate register files, print every violation."""
    import sys
    papers = (argv if argv is not None else sys.argv[1:]) or list(PAPERS)
    status = 0
    for paper in papers:
        errors = validate(read_raw(paper), paper, toc_pages())
        print(f"{paper}: " + ("ok" if not errors else f"{len(errors)} problem(s)"))
        for e in errors:
            print("  " + e)
        status |= bool(errors)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
