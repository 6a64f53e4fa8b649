"""Page scorecards: each row one claim of the register (:mod:`subfl_book.claims`) against our runs, with the status
the book's verdict rule (:mod:`subfl_book.verdict`) gives it.

A page builds its card after its runs::

    card = Scorecard("prism", scale=scale)
    card.order("t1-cifar10-r0.2-prism", "t1-cifar10-r0.2-orthdrop", ours, ours_orthdrop, chance=10, config=cfg)
    card                                   # renders claim · paper · ours · scale · status · departures

``ours`` are our per-seed values **in the claim's unit** (percent where the paper prints percent). ``config`` (our
:class:`~subfl.experiments.config.ExperimentConfig`) lets the row name how our setting departs from the paper's
(:func:`departures`), computed from the register's setting, never typed. A claim the paper states without a setting
of its own (a sentence of its text) is compared against the setting a row names (``setting=``, an id of the
register's settings) or the page's default (:meth:`Scorecard.defaults`: the paper's set-up of the experiment the page
repeats, and the configuration of the page's runs). When the page runs under the pipeline the rows are also written
to ``$SUBFL_PAGE_SCORECARD``, from which the book's Scorecard page is generated.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import pandas as pd
from subfl.experiments.runner import RunResult

from .claims import Claim, Register, load_register
from .verdict import Band, Verdict, fmt, fmt_deviation, fmt_residue, judge_best, judge_bound, judge_exact, judge_order, judge_trend

SCORECARD_LOG_ENV = "SUBFL_PAGE_SCORECARD"
"""The file the pipeline reads a page's scorecard rows from (one JSON object per line)."""

PAGE_NAME_ENV = "SUBFL_PAGE_NAME"
"""The page being executed (``book/<chapter>/<page>``), set by the pipeline."""

DATA_CAVEATS = {
    "cifar10": "CIFAR-10: our offline copy has 20,000 training images decoded from JPEG (the paper: 50,000 PNG)",
}
"""Caveats of our offline data that every row on that dataset names."""

_CONFIG_FIELDS = {"clients": "num_clients", "active_per_round": "clients_per_round", "rounds": "rounds",
                  "local_epochs": "local_epochs", "lr": "lr", "batch_size": "batch_size", "alpha": "alpha"}
_LABELS = {"clients": "clients", "active_per_round": "clients per round", "rounds": "rounds",
           "local_epochs": "local epochs", "lr": "lr", "batch_size": "batch", "alpha": "α"}
_DATASET_NAMES = {"fashionmnist": "fmnist", "fmnist": "fmnist", "cifar10": "cifar10", "cifar100": "cifar100",
                  "femnist": "femnist", "shakespeare": "shakespeare", "imdb": "imdb", "emnistl": "emnist"}


def _slug(text: Any) -> str:
    return re.sub(r"[^a-z0-9]", "", str(text).lower())


def departures(setting: dict[str, Any] | None, config: Any) -> list[str]:
    """How ``config`` (an ExperimentConfig) departs from the paper's ``setting`` (a register settings entry): one
    phrase per field both state and that differs (dataset, model, clients, clients per round, rounds, local epochs,
    lr, batch, α), plus the caveat of our copy of the dataset. Where the setting lists several values (the α of
    each split the paper runs), ours departs when it is none of them; ``None`` on our side (an i.i.d split has no
    α) is not a departure."""
    if config is None:
        return []
    out: list[str] = []
    setting = setting or {}
    paper_data = setting.get("dataset")
    if isinstance(paper_data, str):
        name = _DATASET_NAMES.get(_slug(paper_data), _slug(paper_data))
        if name != config.dataset:
            out.append(f"dataset {paper_data} → {config.dataset}")
    paper_model = setting.get("model")
    ours_model = config.model + (f" ×{config.width:g} width" if config.width != 1.0 else "")
    if isinstance(paper_model, str) and (_slug(re.sub(r"\(.*?\)", "", paper_model)) != _slug(config.model)
                                         or config.width != 1.0):
        out.append(f"model {paper_model} → {ours_model}")
    for field, attr in _CONFIG_FIELDS.items():
        paper_value = _plain_alpha(setting, config) if field == "alpha" else setting.get(field)
        paper_values = paper_value if isinstance(paper_value, list) else [paper_value]
        ours = getattr(config, attr)
        if paper_values and all(_is_number(v) for v in paper_values) and ours is not None \
                and float(ours) not in [float(v) for v in paper_values]:
            out.append(f"{_LABELS[field]} {' / '.join(f'{v:g}' for v in paper_values)} → {ours:g}")
    if config.dataset in DATA_CAVEATS:
        out.append(DATA_CAVEATS[config.dataset])
    return out


_CLASSES = {"cifar10": 10, "cifar100": 100, "fmnist": 10, "tinyimagenet": 200}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _plain_alpha(setting: dict[str, Any], config: Any) -> Any:
    """The paper's Dirichlet α (a number, or the list of the values it runs) in our plain Dir(α·1) notation:
    spectral sharding writes Dir(α·p) with p the class proportions, so its α on a balanced K-class dataset is α/K
    per class (its α = 1 on CIFAR-10 is our 0.1)."""
    alpha = setting.get("alpha")
    partition = str(setting.get("partition") or "")
    values = alpha if isinstance(alpha, list) else [alpha]
    if values and all(_is_number(a) for a in values) and re.search(r"Dir\(\s*α\s*·?\s*p\s*\)", partition):
        classes = _CLASSES.get(_DATASET_NAMES.get(_slug(setting.get("dataset")), config.dataset))
        if not classes:
            return None
        return [a / classes for a in values] if isinstance(alpha, list) else alpha / classes
    return alpha


@dataclass(frozen=True)
class ScoreRow:
    """One row of a page's scorecard."""

    claim: str                # book-wide id of the claim judged
    against: str | None       # book-wide id of the claim it is compared with (orderings), else None
    source: str               # where in the paper: "Table 1 · PriSM · CIFAR-10"
    statement: str            # the claim, in the register's words (plus what it is compared with)
    paper: str                # the paper's value(s)
    ours: str                 # our mean ± sd (n seeds)
    scale: str
    status: str
    reason: str
    departures: str
    page: str | None = None
    setting: str = ""         # the paper's set-up the departures are named against ("<paper>:<settings id>"), or ""


class Scorecard:
    """The scorecard of one page: rows judged by the verdict rule, rendered as a table, logged for the book."""

    def __init__(self, paper: str, *, scale: str, page: str | None = None,
                 register: "Register | None" = None) -> None:
        self.register = register if register is not None else load_register(paper)
        self.paper = paper
        self.scale = scale
        self.page = page or os.environ.get(PAGE_NAME_ENV)
        self.rows: list[ScoreRow] = []
        self._default_setting: str | None = None
        self._default_config: Any = None

    def defaults(self, *, setting: str, config: Any = None) -> None:
        """The paper's set-up (``setting``, a settings id of this paper's register) and, optionally, our run
        configuration (``config``, an ExperimentConfig) that a measured row is compared against when it names
        neither: a claim of this paper without a setting of its own (a sentence of the text, "across every setting
        we tried") then names how the page's runs depart from the paper's set-up of the experiment the page
        repeats. A row's own ``setting=`` / ``config=`` and a claim's own setting take precedence; analytic rows
        take no default configuration."""
        self._setting_of(self.register, setting, "setting")
        self._default_setting, self._default_config = setting, config

    # ---- checks ------------------------------------------------------------------------------------------
    def order(self, claim: str, against: str, ours: float | Iterable[float], ours_against: float | Iterable[float],
              *, index: int | None = None, against_index: int | None = None, chance: float | None = None,
              higher_is_better: bool = True, analytic: bool = False, config: Any = None,
              note: str | None = None, setting: str | None = None) -> Verdict:
        """The paper's ordering of two of its numbers (``claim`` above or below ``against``, e.g. two cells of
        a column) against ours. ``index``: the element of a list-valued claim; ``analytic``: deterministic
        quantities (counts, bytes), judged without seeds."""
        first, second = self._claim(claim), self._claim(against)
        a, b = _value(first, index), _value(second, against_index)
        ours_a, ours_b = Band.of(ours, chance), Band.of(ours_against, chance)
        verdict = judge_order(a, b, ours_a, ours_b, chance=chance, higher_is_better=higher_is_better,
                              scale=self.scale, analytic=analytic)
        self._add(first, verdict, statement=note or f"{_short(first)} vs {_short(second)}", against=second,
                  paper=f"{_printed(a)} vs {_printed(b)} ({a - b:+.3g})", ours=_pair_label(ours_a, ours_b, analytic), config=config,
                  scale="analytic" if analytic else None, setting=setting)
        return verdict

    def stated_order(self, claim: str, ours_above: float | Iterable[float], ours_below: float | Iterable[float],
                     *, what: str, chance: float | None = None, higher_is_better: bool = True,
                     analytic: bool = False, config: Any = None, setting: str | None = None) -> Verdict:
        """An ordering the paper states in words (``claim``): the first of ``what`` ("FLANC vs HeteroFL, ¼ width")
        should come out above the second — better, with ``higher_is_better=False`` for lower-is-better metrics."""
        c = self._claim(claim)
        above, below = Band.of(ours_above, chance), Band.of(ours_below, chance)
        sign = 1.0 if higher_is_better else -1.0
        verdict = judge_order(sign, -sign, above, below, chance=chance, higher_is_better=higher_is_better,
                              scale=self.scale, analytic=analytic)
        self._add(c, verdict, statement=f"{c.statement} — {what}", paper=c.paper_label() if c.value is not None
                  else "stated", ours=_pair_label(above, below, analytic), config=config,
                  scale="analytic" if analytic else None, setting=setting)
        return verdict

    def stated_best(self, claim: str, ours: float | Iterable[float], rivals: Mapping[str, float | Iterable[float]],
                    *, what: str, chance: float | None = None, higher_is_better: bool = True, analytic: bool = False,
                    config: Any = None, setting: str | None = None) -> Verdict:
        """A claim that one method is the best of several (``claim``): ours against every named rival
        (:func:`~subfl_book.verdict.judge_best`); the row shows our band and each rival's mean, best first."""
        c = self._claim(claim)
        mine = Band.of(ours, chance)
        bands = {name: Band.of(values, chance) for name, values in rivals.items()}
        verdict = judge_best(mine, list(bands.values()), chance=chance, higher_is_better=higher_is_better,
                             scale=self.scale, analytic=analytic, names=list(bands))
        order = sorted(bands, key=lambda n: -bands[n].mean if higher_is_better else bands[n].mean)
        label = mine.label(analytic) + " vs " + ", ".join(f"{n} {bands[n].label(analytic)}" for n in order)
        self._add(c, verdict, statement=f"{c.statement} — {what}", paper=c.paper_label() if c.value is not None
                  else "stated", ours=label, config=config, scale="analytic" if analytic else None,
                  setting=setting)
        return verdict

    def bound(self, claim: str, ours: float | Iterable[float], *, at_most: bool, limit: float | None = None,
              chance: float | None = None, analytic: bool = False, config: Any = None,
              note: str | None = None, setting: str | None = None) -> Verdict:
        """The paper says a quantity stays at most / at least its value (or ``limit``); ours against it."""
        c = self._claim(claim)
        bound = _value(c, None) if limit is None else limit
        band = Band.of(ours, chance)
        verdict = judge_bound(bound, band, at_most=at_most, chance=chance, scale=self.scale, analytic=analytic)
        self._add(c, verdict, statement=note or c.statement, paper=f"{'≤' if at_most else '≥'} {bound:g}",
                  ours=band.label(analytic), config=config, scale="analytic" if analytic else None, setting=setting)
        return verdict

    def trend(self, claims: Sequence[str], ours: Sequence[float | Iterable[float]], *, chance: float | None = None,
              higher_is_better: bool = True, analytic: bool = False, config: Any = None,
              note: str | None = None, setting: str | None = None) -> Verdict:
        """A sweep: the paper's numbers of ``claims`` (in sweep order) against ours, step by step."""
        found = [self._claim(c) for c in claims]
        paper_values = [_value(c, None) for c in found]
        return self._trend(found[0], paper_values, ours, chance=chance, higher_is_better=higher_is_better,
                           analytic=analytic, config=config, setting=setting,
                           statement=note or f"trend along {', '.join(_short(c) for c in found)}",
                           paper=" → ".join(_printed(v) for v in paper_values))

    def stated_trend(self, claim: str, ours: Sequence[float | Iterable[float]], *, increasing: bool, what: str,
                     chance: float | None = None, higher_is_better: bool = True, analytic: bool = False,
                     config: Any = None, setting: str | None = None) -> Verdict:
        """A trend the paper states in words: ours along the sweep ``what`` should rise (``increasing``) or fall."""
        c = self._claim(claim)
        steps = list(range(len(ours)))
        paper_values = steps if increasing else steps[::-1]
        return self._trend(c, paper_values, ours, chance=chance, higher_is_better=higher_is_better,
                           analytic=analytic, config=config, setting=setting, statement=f"{c.statement} — {what}",
                           paper="rises along the sweep" if increasing else "falls along the sweep")

    def exact(self, claim: str, ours: float, *, index: int | None = None, tolerance: float | None = None,
              note: str | None = None) -> Verdict:
        """An analytic quantity (no seeds) against the paper's printed value, within its rounding."""
        c = self._claim(claim)
        paper = _value(c, index)
        verdict = judge_exact(paper, float(ours), tolerance=tolerance)
        self._add(c, verdict, statement=note or c.statement, paper=_printed(paper) + _unit_of(c, index),
                  ours=fmt(float(ours), 4), config=None, scale="analytic")
        return verdict

    def identity(self, claim: str, error: float, *, tolerance: float, what: str, residue: bool = False) -> Verdict:
        """An equation or proposition checked numerically: ``error`` (e.g. the largest deviation between its two
        sides over the cases tried, ``what``) within ``tolerance`` is ``exact``. ``residue``: ``error`` is float
        rounding computed live on the page, shown by its bound (:func:`~subfl_book.verdict.fmt_residue`: its digits
        depend on the CPU); otherwise (a count, a Monte-Carlo error, a gap of definitions) as it is."""
        c = self._claim(claim)
        verdict = judge_exact(0.0, float(error), tolerance=tolerance, residue=residue)
        shown = fmt_residue(float(error), tolerance) if residue else fmt_deviation(float(error))
        self._add(c, verdict, statement=f"{c.statement} — {what}", paper="holds", ours=f"error {shown}", config=None,
                  scale="analytic")
        return verdict

    def _trend(self, first: Claim, paper_values: Sequence[float], ours: Sequence[Any], *, chance, higher_is_better,
               analytic, config, statement, paper, setting=None) -> Verdict:
        bands = [Band.of(o, chance) for o in ours]
        verdict = judge_trend(paper_values, bands, chance=chance, higher_is_better=higher_is_better,
                              scale=self.scale, analytic=analytic)
        self._add(first, verdict, statement=statement, paper=paper,
                  ours=" → ".join(fmt(b.mean) for b in bands) + ("" if analytic else
                                                                     f" (n = {min(b.n for b in bands)})"),
                  config=config, scale="analytic" if analytic else None, setting=setting)
        return verdict

    # ---- output ------------------------------------------------------------------------------------------
    def placeholder(self) -> "Scorecard":
        """Show where the card goes (a page opens with it) and fill it in when :meth:`show` is called after the
        page's runs: the output of this cell is replaced in place (a Jupyter display update)."""
        from IPython.display import HTML, display
        self._handle = display(HTML("<p><em>Scorecard: filled in once the runs below are read.</em></p>"),
                               display_id=True)
        return self

    def show(self) -> None:
        """Render the card into :meth:`placeholder`'s output (or here, without one)."""
        from IPython.display import HTML, display
        html = HTML(self._repr_html_())
        handle = getattr(self, "_handle", None)
        if handle is None:
            display(html)
        else:
            handle.update(html)

    def frame(self) -> pd.DataFrame:
        columns = {"source": "paper source", "statement": "claim", "paper": "paper", "ours": "ours",
                   "scale": "scale", "status": "status", "reason": "why", "departures": "our setting departs"}
        frame = pd.DataFrame([asdict(r) for r in self.rows], columns=[*asdict(_EMPTY)])
        return frame[list(columns)].rename(columns=columns)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rows:
            out[r.status] = out.get(r.status, 0) + 1
        return out

    def _repr_html_(self) -> str:
        return page_card(self.rows, self.register)

    def __repr__(self) -> str:
        return self.frame().to_string(index=False)

    # ---- internals ---------------------------------------------------------------------------------------
    def _claim(self, claim_id: str) -> Claim:
        if ":" in claim_id:
            paper, _, cid = claim_id.partition(":")
            if paper != self.paper:
                return load_register(paper).claim(cid)
            claim_id = cid
        return self.register.claim(claim_id)

    @staticmethod
    def _setting_of(register: Register, setting: str, parameter: str) -> dict[str, Any]:
        if setting not in register.settings:
            raise ValueError(f"{parameter}={setting!r} is not a setting of the {register.paper} register; it has: "
                             f"{', '.join(register.settings)}")
        return register.settings[setting]

    def _add(self, claim: Claim, verdict: Verdict, *, statement: str, paper: str, ours: str, config: Any,
             against: Claim | None = None, scale: str | None = None, setting: str | None = None) -> None:
        """Log one row. Its departures are named against the row's ``setting`` (an id of the claim's register), else
        the claim's own, else the page's :meth:`defaults` (a claim of this page's paper only); our side is the
        row's ``config``, else the page's default one (measured rows only: an analytic row names none)."""
        register = self.register if claim.paper == self.paper else load_register(claim.paper)
        if setting is not None:
            self._setting_of(register, setting, "setting")
        elif claim.setting:
            setting = claim.setting
        elif claim.paper == self.paper:
            setting = self._default_setting
        if config is None and scale != "analytic":
            config = self._default_config
        paper_setting = register.settings.get(setting) if setting else None
        row = ScoreRow(claim=claim.key, against=against.key if against else None,
                       source=claim.where if against is None else _pair_source(claim, against),
                       statement=statement, paper=paper, ours=ours, scale=scale or self.scale,
                       status=verdict.status, reason=verdict.reason,
                       departures="; ".join(departures(paper_setting, config)) or "—", page=self.page,
                       setting=f"{claim.paper}:{setting}" if setting else "")
        self.rows.append(row)
        _log(row)


_EMPTY = ScoreRow(*[""] * 10)


def _value(claim: Claim, index: int | None) -> float:
    value = claim.value
    if isinstance(value, list):
        if index is None:
            raise ValueError(f"{claim.key} holds {len(value)} values; pass index= to pick one")
        return _keep_printed(value[index])
    if value is None:
        raise ValueError(f"{claim.key} states no number; it cannot be judged numerically")
    if index not in (None, 0):
        raise ValueError(f"{claim.key} holds one value; index={index!r} is not valid")
    return _keep_printed(value)


def _unit_of(claim: Claim, index: int | None) -> str:
    """The unit of one element: a list-valued claim may give one unit per element ("M parameters, % of full")."""
    if not claim.unit:
        return ""
    parts = [u.strip() for u in claim.unit.split(",")]
    if isinstance(claim.value, list) and index is not None and len(parts) == len(claim.value):
        return f" {parts[index]}"
    return f" {claim.unit}"


def _keep_printed(value: Any) -> float:
    """A register number as a float that still knows how the paper printed it (its rounding)."""
    return value if isinstance(value, float) else float(value)


def _printed(value: float) -> str:
    """The paper's number as printed (its register text), else plainly (thousands separated from 10,000 on)."""
    return getattr(value, "printed", None) or (fmt(value) if abs(value) >= 10_000 else f"{value:g}")


def _pair_label(first: Band, second: Band, analytic: bool = False) -> str:
    gap = f" ({'+' if first.mean >= second.mean else '−'}{fmt(abs(first.mean - second.mean))})" \
        if first.finite and second.finite else ""
    return f"{first.label(analytic)} vs {second.label(analytic)}{gap}"


def _short(claim: Claim) -> str:
    parts = [p for p in (claim.row, claim.column) if p]
    return " / ".join(parts) if parts else claim.id


def _pair_source(first: Claim, second: Claim) -> str:
    if first.source == second.source and first.column == second.column and first.column:
        return f"{first.source} · {first.column}"
    if first.source == second.source:
        return first.source
    return f"{first.where}; {second.where}"


def _log(row: ScoreRow) -> None:
    path = os.environ.get(SCORECARD_LOG_ENV)
    if path:
        with open(path, "a") as fh:
            fh.write(json.dumps(asdict(row)) + "\n")


def seed_percent(results: Iterable[RunResult], metric: str = "accuracy",
                 group: Callable[[RunResult], str] | None = None) -> list[float]:
    """Each run's final ``metric`` in percent, one value per seed run — our values in the unit the papers print
    (NaN for a diverged run; the verdict rule counts it at chance). ``group`` names each run's scored model
    (default: the global one)."""
    return [100 * r.final(metric, group(r) if group is not None else "global") for r in results]


STATUS_COLOURS = {"exact": "#1a7f37", "same": "#1a7f37", "differs": "#cf222e", "inconclusive": "#9a6700",
                  "near-chance": "#8250df", "not-run": "#57606a"}


_CARD_STYLE = """<style>
table.scorecard {border-collapse: collapse; font-size: 0.8rem; line-height: 1.3; width: 100%; margin: 0.5rem 0;}
table.scorecard th {text-align: left; border-bottom: 2px solid #8c959f; padding: 0.25rem 0.4rem;}
table.scorecard td {vertical-align: top; border-bottom: 1px solid #d0d7de; padding: 0.3rem 0.4rem;}
table.scorecard td.claim {width: 40%;}
table.scorecard td.verdict {min-width: 7.5rem;}
table.scorecard .note {display: block; color: #57606a; font-size: 0.72rem;}
table.scorecard .status {font-weight: 600; white-space: nowrap;}
p.scorecard-caption {font-size: 0.8rem; color: #57606a; margin: 0.2rem 0 0.8rem 0;}
</style>"""


def _esc(text: object) -> str:
    import html
    return html.escape(str(text))


_INLINE_MATH = re.compile(r"(?<![$\\])\$([^$\n]+?)\$(?!\$)")


def _esc_math(text: object) -> str:
    """``text`` escaped for HTML, with each inline ``$…$`` (the register writes its statements' math that way)
    turned into the span MyST writes for inline math, which the book's MathJax typesets (its ``math`` class is
    processed even inside a notebook's output)."""
    import html
    out, last = [], 0
    text = str(text)
    for m in _INLINE_MATH.finditer(text):
        out.append(html.escape(text[last:m.start()]))
        out.append(f'<span class="math notranslate nohighlight">\\({html.escape(m.group(1))}\\)</span>')
        last = m.end()
    out.append(html.escape(text[last:]))
    return "".join(out)


def page_card(rows: Sequence[ScoreRow], register: Register) -> str:
    """The scorecard a page shows: :func:`render_card` under the title of its paper's ``register``."""
    return render_card(rows, title=f"Scorecard — {register.title}")


def render_card(rows: Sequence[ScoreRow], title: str = "Scorecard") -> str:
    """A page's scorecard as compact HTML: where · claim · paper · ours · status (with the rule's reason beneath);
    the departures of our setting once under the table when every row shares them, else beneath each claim."""
    if not rows:
        return "<p><em>No claim judged on this page.</em></p>"
    shared = {r.departures for r in rows if r.scale != "analytic"}
    common = shared.pop() if len(shared) == 1 else None
    body = []
    for r in rows:
        departs = "" if r.scale == "analytic" or r.departures in ("—", common) else \
            f'<span class="note">our setting departs: {_esc(r.departures)}</span>'
        colour = STATUS_COLOURS.get(r.status, "inherit")
        body.append(f'<tr><td>{_esc(r.source)}</td><td class="claim">{_esc_math(r.statement)}{departs}</td>'
                    f'<td>{_esc(r.paper)}</td><td>{_esc(r.ours)}<span class="note">{_esc(r.scale)}</span></td>'
                    f'<td class="verdict"><span class="status" style="color: {colour}">{_esc(r.status)}</span>'
                    f'<span class="note">{_esc(r.reason)}</span></td></tr>')
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.status] = counts.get(r.status, 0) + 1
    tally = ", ".join(f"{n} {status}" for status, n in counts.items())
    caption = f"<b>{_esc(title)}</b>: {len(rows)} checks — {tally}. Statuses from the book's verdict rule " \
              "(see the Scorecard page); ours are mean ± sd over seeds at the scale shown."
    if common and common != "—":
        caption += f" Our setting departs from the paper's: {_esc(common)}."
    return (f'{_CARD_STYLE}<p class="scorecard-caption">{caption}</p><table class="scorecard"><thead><tr>'
            "<th>paper source</th><th>claim</th><th>paper</th><th>ours</th><th>status</th></tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table>")


def render_html(frame: pd.DataFrame) -> str:
    """Any table of the book as HTML, without an index column, status cells coloured."""
    def colour(status: str) -> str:
        return f"color: {STATUS_COLOURS.get(status, 'inherit')}; font-weight: 600"
    styler = frame.style.hide(axis="index")
    if "status" in frame.columns:
        styler = styler.map(colour, subset=["status"])
    return styler.set_table_attributes('class="scorecard"').to_html()


def read_rows(lines: Iterable[str]) -> list[ScoreRow]:
    """Rows logged to ``$SUBFL_PAGE_SCORECARD``."""
    return [ScoreRow(**json.loads(line)) for line in lines if line.strip()]
