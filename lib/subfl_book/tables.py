"""How the book's pages show a DataFrame: no meaningless row numbers, no ``NaN``, no table wider than the column.

Inside an IPython kernel, importing :mod:`subfl_book` registers :func:`frame_html` as the HTML form of every
``pandas.DataFrame`` (:func:`install`):

* a frame whose index is the default ``0 … n-1`` is shown without it (a named or meaningful index stays);
* a named row index's name is shown in the header's corner, not on a header row of its own;
* a missing value is shown as "—", and so is ``None``;
* a list, tuple or set in a cell is shown as its items separated by commas, a mapping as ``name = value`` pairs
  (no Python reprs such as ``[0, 1]`` or ``{'atoms': 10}``; :func:`readable_value`);
* a cell is shown whole: pandas' cut of long text at 50 characters (``display.max_colwidth``, ending "...") is off,
  and the text wraps at its spaces instead;
* a snake_case column or index name (``best_memory_mb``) is shown as words (``best memory mb``), so that it can wrap;
* a frame whose estimated narrowest rendering (:func:`estimated_width`) is wider than the content column
  (:data:`COLUMN_PX`) is turned on its side when it has fewer rows than columns and then fits, or else split into
  several tables of consecutive columns, each repeating the row labels (:func:`fit_to_column`).

Numbers keep pandas' own display formatting unless :func:`show` is given formats. A pandas Styler (``DataFrame.style``)
is shown as its author made it, however wide: pages do not use one (a test checks).
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pandas as pd

MISSING = "—"
"""How a missing value (``NaN``, ``None``) is shown."""

COLUMN_PX = 680
"""The width a table may take: a notebook output's width in the book's content column at a 1280 px window (the
column is 752 px; its sections, and so the outputs, 688 px, measured in Chromium) less a margin."""

CHAR_PX = 7.2
"""Estimated width of one character in a table cell (0.78 rem of the theme's sans-serif; measured in Chromium at a
1280 px window: "11,173,962" takes 71.6 px)."""

HEAD_CHAR_PX = 9.2
"""Estimated width of one character of a header or row label, which are set bold ("momentum": 80.9 px)."""

CELL_PAD_PX = 12
"""A cell's horizontal padding and border (``_static/subfl.css``: 0.35 rem a side)."""

_SNAKE = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+)+")


def readable_label(label):
    """``label`` as a reader reads it: a snake_case identifier with spaces for underscores; anything else as it is."""
    if isinstance(label, tuple):
        return tuple(readable_label(part) for part in label)
    return label.replace("_", " ") if isinstance(label, str) and _SNAKE.fullmatch(label) else label


def readable_value(value: object, scalar: Callable[[object], object] = lambda v: v) -> object:
    """A table cell's value as a reader reads it: ``None`` as "—"; a list, tuple or set as its items separated by
    commas (a set sorted, a nested collection in parentheses); a mapping, or a tuple of ``(name, value)`` pairs (a
    config's frozen options), as ``name = value`` pairs; an empty collection as "—"; anything else as
    ``scalar(value)`` (unchanged by default, so that numbers keep pandas' formatting)."""
    if value is None:
        return MISSING
    if isinstance(value, (list, tuple)) and value and all(
            isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str) for v in value):
        value = dict(value)
    if isinstance(value, Mapping):
        return ", ".join(f"{k} = {_item_text(v, scalar)}" for k, v in value.items()) or MISSING
    if isinstance(value, (set, frozenset)):
        value = sorted(value, key=str)
    if isinstance(value, (list, tuple)):
        return ", ".join(_item_text(v, scalar) for v in value) or MISSING
    return scalar(value)


def _item_text(item: object, scalar: Callable[[object], object]) -> str:
    """An item of a collection cell: a nested collection in parentheses, so that its items stay together."""
    nested = isinstance(item, (list, tuple, set, frozenset)) and len(item) > 0
    return f"({readable_value(item, scalar)})" if nested else str(readable_value(item, scalar))


def _readable(frame: pd.DataFrame) -> pd.DataFrame:
    out = frame.copy()
    for i in range(out.shape[1]):
        if out.iloc[:, i].dtype == object:
            out.iloc[:, i] = out.iloc[:, i].map(readable_value)
    out.columns = out.columns.map(readable_label) if out.columns.nlevels == 1 else \
        pd.MultiIndex.from_tuples([readable_label(c) for c in out.columns], names=out.columns.names)
    out.columns.names = [readable_label(n) for n in frame.columns.names]
    out.index.names = [readable_label(n) for n in frame.index.names]
    return out


def _has_default_index(frame: pd.DataFrame) -> bool:
    return isinstance(frame.index, pd.RangeIndex) and frame.index.start == 0 and frame.index.step == 1 \
        and frame.index.name is None


def _text_px(text, char_px: float = CHAR_PX) -> float:
    """Narrowest width of a cell holding ``text``: its longest word (cells wrap at spaces, never inside a word)."""
    words = str(text).split() or [""]
    return char_px * max(len(w) for w in words) + CELL_PAD_PX


def _column_texts(series: pd.Series) -> list[str]:
    """The strings pandas shows for ``series``'s values (its own float formatting), "—" for missing ones."""
    if len(series) == 0:
        return []
    with pd.option_context("display.max_colwidth", None):
        shown = series.reset_index(drop=True).to_string(index=False, header=False, na_rep=MISSING).split("\n")
    return [s.strip() for s in shown]


def _label_px(labels) -> list[float]:
    return [max(_text_px(part, HEAD_CHAR_PX) for part in (label if isinstance(label, tuple) else (label,)))
            for label in labels]


def column_widths(frame: pd.DataFrame) -> list[float]:
    """Estimated narrowest width, in px, of each column of ``frame`` (header and every cell)."""
    heads = _label_px(frame.columns)
    return [max([head] + [_text_px(t) for t in _column_texts(frame.iloc[:, i])])
            for i, head in enumerate(heads)]


def _index_px(frame: pd.DataFrame) -> float:
    if _has_default_index(frame):
        return 0.0
    levels = [frame.index.get_level_values(i) for i in range(frame.index.nlevels)]
    return sum(max([_text_px(frame.index.names[i] or "", HEAD_CHAR_PX)] + [_text_px(v, HEAD_CHAR_PX) for v in level])
               for i, level in enumerate(levels))


def estimated_width(frame: pd.DataFrame) -> float:
    """Estimated narrowest rendered width of ``frame`` in px (index included when it is shown)."""
    return _index_px(frame) + sum(column_widths(frame))


def _on_its_side(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` transposed, each value written as pandas writes it in its own column (so numbers keep their form)."""
    keyed = _has_default_index(frame)  # the first column then labels the rows
    texts = pd.DataFrame({i: _column_texts(frame.iloc[:, i]) for i in range(int(keyed), frame.shape[1])})
    labels = pd.Index([str(v) for v in frame.iloc[:, 0]], name=frame.columns[0]) if keyed else frame.index
    side = pd.DataFrame(texts.to_numpy().T, index=frame.columns[int(keyed):], columns=labels)
    side.index.name = None
    return side


def fit_to_column(frame: pd.DataFrame, width_px: float = COLUMN_PX) -> list[pd.DataFrame]:
    """``frame`` as one or more tables no wider than ``width_px`` (estimated; see the module docstring).

    A frame that fits is returned as it is. One with fewer rows than columns whose transposition fits is returned
    transposed. Otherwise its columns are split into consecutive groups that fit (a column group under one
    top-level label of a MultiIndex stays together when it fits on its own); each part keeps the row labels: the
    index, or, for a default index, the first column. A single column wider than ``width_px`` stays whole.
    """
    if estimated_width(frame) <= width_px:
        return [frame]
    if frame.columns.nlevels == 1 and 1 < len(frame) < frame.shape[1]:
        side = _on_its_side(frame)
        if estimated_width(side) <= width_px:
            return [side]
    keyed = _has_default_index(frame)
    widths = column_widths(frame)
    labels_px = widths[0] if keyed else _index_px(frame)
    start = 1 if keyed else 0
    groups: list[list[int]] = []
    top = [c[0] if isinstance(c, tuple) else c for c in frame.columns]
    i = start
    while i < frame.shape[1]:  # blocks of columns sharing a top-level label
        j = i
        while j + 1 < frame.shape[1] and isinstance(frame.columns[i], tuple) and top[j + 1] == top[i]:
            j += 1
        groups.append(list(range(i, j + 1)))
        i = j + 1
    parts: list[list[int]] = [[]]
    used = labels_px
    for group in groups:
        for block in ([group] if labels_px + sum(widths[c] for c in group) <= width_px else [[c] for c in group]):
            block_px = sum(widths[c] for c in block)
            if parts[-1] and used + block_px > width_px:
                parts.append([])
                used = labels_px
            parts[-1].extend(block)
            used += block_px
    return [frame.iloc[:, ([0] if keyed else []) + part] for part in parts if part]


def _name_in_corner(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with a single named row index's name moved to the header's corner cell, so that the table has one
    header row instead of a second one that holds only that name."""
    if frame.index.nlevels == 1 and frame.index.name is not None and frame.columns.nlevels == 1 \
            and frame.columns.name is None:
        return frame.rename_axis(index=None, columns=frame.index.name)
    return frame


def _html(frame: pd.DataFrame) -> str:
    frame = _name_in_corner(frame)
    with pd.option_context("display.max_colwidth", None):  # whole cells: they wrap at spaces instead
        return frame.to_html(index=not _has_default_index(frame), na_rep=MISSING, notebook=True,
                             max_rows=pd.get_option("display.max_rows"), max_cols=pd.get_option("display.max_columns"),
                             show_dimensions=False)


def frame_html(frame: pd.DataFrame) -> str:
    """The HTML of ``frame`` as the book shows it (see the module docstring)."""
    return "\n".join(_html(part) for part in fit_to_column(_readable(frame)))


def formatted(frame: pd.DataFrame, formats: str | Callable[[Any], str] | dict | None) -> pd.DataFrame:
    """``frame`` with the columns named in ``formats`` written as text: ``{column: "{:,}"}`` (a format string per
    column, or a function of the value such as :func:`residue`), or one format for every numeric column; a missing
    value becomes "—", and a value that rounds to zero is written without a sign ("0.00%", not "-0.00%": a float
    residue of either sign, whose sign depends on the CPU's rounding). Unknown columns raise."""
    if formats is None:
        return frame
    if isinstance(formats, str) or callable(formats):
        formats = {c: formats for c in frame.columns if pd.api.types.is_numeric_dtype(frame[c])}
    unknown = [c for c in formats if c not in frame.columns]
    if unknown:
        raise KeyError(f"formats names columns the frame does not have: {unknown}; columns: {list(frame.columns)}")
    out = frame.copy()
    for column, spec in formats.items():
        write = spec if callable(spec) else spec.format
        out[column] = [MISSING if pd.isna(v) else _unsigned_zero(write(v)) for v in frame[column]]
    return out


_SIGNED_ZERO = re.compile(r"[+-](0(?:\.0*)?(?:e[+-]?\d+)?%?)")


def _unsigned_zero(text: str) -> str:
    """``text`` without the sign of a zero: "-0.00%" and "+0.00%" → "0.00%", "-0.0" → "0.0"."""
    match = _SIGNED_ZERO.fullmatch(text)
    return match.group(1) if match else text


def residue(tolerance: float, above: str = "{:.2g}") -> Callable[[float], str]:
    """A column format for residues of a check computed live on the page, against ``tolerance``
    (:func:`subfl_book.verdict.fmt_residue`): "< 1e-12", "≤ 1e-05", or — above the tolerance, where the check fails
    or the column holds a real quantity beside residues — the value written with ``above``. A residue's digits are
    the CPU's rounding noise, so a table that printed them would read differently on every machine."""
    from .verdict import fmt_residue

    if tolerance < 0:
        raise ValueError(f"tolerance={tolerance!r} is not valid; accepted: a number >= 0")

    def write(value: float) -> str:
        value = float(value)
        return above.format(value) if math.isfinite(value) and abs(value) > tolerance else fmt_residue(value, tolerance)
    return write


def table_html(frame: pd.DataFrame, caption: str | None = None, precision: int | None = None,
               formats: str | dict | None = None) -> str:
    """:func:`frame_html` of :func:`formatted` ``frame`` under a bold ``caption``, other floats written with
    ``precision`` decimals (pandas' default otherwise): the book's replacement for
    ``frame.style.format(…).set_caption(…)``, which is shown as its author made it, however wide."""
    import html

    with pd.option_context("display.precision", pd.get_option("display.precision") if precision is None
                           else precision):
        body = frame_html(formatted(frame, formats))
    return body if caption is None else f'<p class="table-caption"><strong>{html.escape(caption)}</strong></p>\n{body}'


def show(frame: pd.DataFrame, caption: str | None = None, precision: int | None = None,
         formats: str | dict | None = None):
    """``frame`` as an ``IPython.display.HTML`` object (:func:`table_html`), to ``display`` in a page."""
    from IPython.display import HTML

    return HTML(table_html(frame, caption, precision, formats))


def _shortest(value):
    """A float in its shortest form (``0.0003``, ``1e-05``), ``NaN`` as "—"; anything else unchanged."""
    if isinstance(value, float):
        return MISSING if math.isnan(value) else f"{value:g}"
    return value


def _setting_text(value) -> str:
    """One setting's value as a reader reads it: :func:`readable_value` with floats in their shortest form
    (``[0.2, 0.5]`` → "0.2, 0.5"; ``{"k": 2}`` → "k = 2")."""
    return str(readable_value(value, _shortest))


def settings_frames(configs: Mapping[str, object], fields: Sequence[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The settings of several runs, ``{label: config}`` (an ``ExperimentConfig`` or its ``to_dict()``), as a reader
    compares them: ``(shared, differing)``.

    Each of ``fields`` is one setting; a mapping field (``method_options``, ``dataset_options``) is opened into one
    setting per key, ``method_options.clip_norm``, and a key a run lacks is "—" for that run. ``shared`` holds the
    settings every run has alike (columns ``setting``, ``value``); ``differing`` the others, one row per setting (an
    unnamed index, so that the table reads the same turned on its side) and one column per run label (empty when
    the runs agree on everything). Values are written by :func:`_setting_text`. Unknown fields raise, naming the
    fields a config has."""
    if not configs:
        raise ValueError("configs is empty; accepted: a mapping {run label: config} with at least one run")
    rows: dict[str, dict[str, str]] = {}
    for label, config in configs.items():
        values = config.to_dict() if hasattr(config, "to_dict") else dict(config)
        unknown = [f for f in fields if f not in values]
        if unknown:
            raise KeyError(f"fields {unknown} are not settings of run {label!r}; its settings: {sorted(values)}")
        for name in fields:
            value = values[name]
            if isinstance(value, Mapping):
                for key, option in value.items():
                    rows.setdefault(f"{name}.{key}", {})[label] = _setting_text(option)
            else:
                rows.setdefault(name, {})[label] = _setting_text(value)
    labels = list(configs)
    table = {name: [given.get(label, MISSING) for label in labels] for name, given in rows.items()}
    shared = pd.DataFrame([{"setting": n, "value": v[0]} for n, v in table.items() if len(set(v)) == 1],
                          columns=["setting", "value"])
    differing = pd.DataFrame({n: v for n, v in table.items() if len(set(v)) > 1}, index=labels).T
    return shared, differing


def show_settings(configs: Mapping[str, object], fields: Sequence[str]):
    """:func:`settings_frames` as two captioned tables (the shared settings, then where the runs differ) in one
    ``IPython.display.HTML`` object."""
    from IPython.display import HTML

    shared, differing = settings_frames(configs, fields)
    parts = [table_html(shared, caption=f"Settings of every run ({len(configs)} runs)")]
    if len(differing):
        parts.append(table_html(differing, caption="Settings that differ between the runs"))
    return HTML("\n".join(parts))


def kernel_shell():
    """The running IPython shell, or ``None`` outside IPython (the installers below then change nothing)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def install() -> bool:
    """Register :func:`frame_html` with the running IPython kernel; ``False`` outside one (nothing changes)."""
    shell = kernel_shell()
    if shell is None:
        return False
    shell.display_formatter.formatters["text/html"].for_type(pd.DataFrame, frame_html)
    return True
