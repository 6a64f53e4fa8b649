"""The book's figure style: every figure fits the content column at 1:1, with legible text and one colour per method.

Importing :mod:`subfl_book` calls :func:`install`, which

* sets matplotlib's ``rcParams`` to :data:`STYLE`: a default figure of 6.4 × 4.0 in, text of 9–10.5 pt, thin grid,
  an Okabe–Ito colour cycle (distinguishable with the common colour-vision deficiencies), SVG glyphs as paths with
  a fixed id salt (re-executing a page rewrites the same bytes when the data are the same);
* inside an IPython kernel, shows every figure as **SVG** (``InlineBackend.figure_formats = {"svg"}``), through
  :func:`fit_to_column` first (the guard below).

Why SVG rather than ``retina`` PNG: the executed notebooks are committed, and a typical two-panel line plot of the
book is about 0.14 MB as SVG against 0.38 MB as a retina PNG in base64 (0.15 MB at 1×), so SVG is the smallest
sharp format; it stays sharp at every zoom and on every screen, and it is text a diff can read. An SVG figure
shows at its own size: 1 in of figure = 96 CSS px, so :data:`COLUMN_IN` (7.5 in = 720 px) fits the 752 px column
of the site at 1:1, and a 10 pt label is 10 pt on the page. (A retina PNG is shown at half its pixel width.)

The guard, :func:`fit_to_column`, runs on every figure a page displays, before it is drawn:

1. **font floor**: any text smaller than :data:`MIN_FONT_PT` (titles, labels, tick labels, legends, annotations,
   e.g. an explicit ``fontsize=7``) is raised to it;
2. **width**: if the figure, as it will be saved (``bbox_inches="tight"``, legends outside the axes included), is
   wider than :data:`COLUMN_IN`, the *canvas* is resized to fit (height scaled by the same factor, but never below
   :data:`MIN_HEIGHT_SCALE` of the original) and the layout is redone, so the axes shrink while the text keeps its
   point size. A figure made for 11–19 in of screen thus arrives at 7.5 in with 9–10 pt text instead of being
   squeezed by the browser to half its size. Only when the text alone is wider than the column (a very long title
   or legend) does the figure stay wider, and the browser scales it down.

Pages colour methods with :func:`method_color` / :func:`method_colors`: one fixed colour per method name of
:data:`subfl.methods.METHODS` across the whole book, so PriSM is the same vermillion on every page. Variants such as
``heterofl-ft`` or ``unbiased+cliplr`` take their base method's colour unless they share figures with it (then they
have their own); full-model FedAvg is near-black.
:func:`grid` lays out a number of panels in rows that fit the column.
"""
from __future__ import annotations

import math
import re
import warnings
import zlib
from collections.abc import Iterable
from typing import Any

import matplotlib as mpl
from cycler import cycler

from .tables import kernel_shell

COLUMN_PX = 752
"""Width of the site's content column (sphinx-book-theme at a 1280 px window)."""
COLUMN_IN = 7.5
"""Widest figure, in inches as saved: 720 CSS px, inside :data:`COLUMN_PX` at 1:1."""
MIN_FONT_PT = 9.0
"""Smallest text a figure shows (at 1:1, 12 CSS px)."""
MIN_HEIGHT_SCALE = 0.7
"""When :func:`fit_to_column` narrows a figure, its height shrinks by the same factor but not below this share."""
PANEL_HEIGHT_IN = 2.9
"""Height of one row of panels in :func:`grid`."""

OKABE_ITO = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000")
CYCLE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#882255", "#999933", "#666666",
         "#332288")
"""The default colour cycle (``C0`` … ``C9``): Okabe–Ito's colours without the yellow, then Tol's wine, olive,
a grey and indigo."""

STYLE: dict[str, Any] = {
    "figure.figsize": (6.4, 4.0),
    "figure.dpi": 96,
    "savefig.dpi": 150,  # raster parts (images) inside an SVG
    "figure.titlesize": 10.5,
    "font.size": 10,
    "axes.titlesize": 10,
    "axes.labelsize": 10,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "legend.fontsize": 9,
    "legend.title_fontsize": 9,
    "legend.framealpha": 0.85,
    "axes.prop_cycle": cycler(color=CYCLE),
    "axes.grid": False,
    "grid.alpha": 0.3,
    "grid.linewidth": 0.6,
    "lines.linewidth": 1.6,
    "lines.markersize": 5,
    "errorbar.capsize": 3,
    "svg.fonttype": "path",
    "svg.hashsalt": "subfl-book",
}
"""``rcParams`` of the book (:func:`apply_style`)."""

METHOD_COLORS: dict[str, str] = {
    # the full model
    "fedavg": "#222222",
    # spectral sharding / PriSM family
    "prism": "#D55E00", "prism+scaled": "#E69F00", "prism+scaled+cliplr": "#DDCC77", "prism+wallenius": "#882255",
    "prism+wallenius+cliplr": "#CC6677", "prism+memory": "#AA4499", "prism+sigma": "#CC6677",
    "topn": "#0072B2", "topn+scaled": "#88CCEE", "topn+scaled+cliplr": "#88CCEE", "unbiased": "#009E73", "collective": "#CC79A7", "spectral": "#56B4E9",
    "schatten": "#999933", "nosharding": "#888888", "origdrop": "#6F4E37", "splitmix": "#44AA99",
    # width slicing and FLANC
    "heterofl": "#332288", "fjord": "#117733", "fedrolex": "#88CCEE", "flanc": "#E69F00",
    # CAFF and its baselines
    "caff": "#D55E00", "hetlora": "#AA4499", "fedhm": "#0072B2", "depthfl": "#999933",
    # FedP3 and its variants
    "fedp3": "#D55E00", "lowerb": "#0072B2", "opu2": "#009E73", "opu3": "#CC79A7", "opu123": "#E69F00",
    "opu23": "#56B4E9", "fedp3-blocks": "#D55E00",
    "update-probe": "#666666",
}
"""One colour per method (names of :data:`subfl.methods.METHODS`). A chapter's own method and its comparisons are
distinct; methods that never share a figure may share a colour (each paper's proposed method is vermillion)."""

_ALIASES = {"fullmodel": "fedavg", "full": "fedavg", "orthdrop": "topn", "top-n": "topn", "fedp3(opu2)": "opu2"}
_SUFFIX = re.compile(r"(\+[\w.]+|-ft|\s*\(.*\))$")


def _lookup(name: str) -> str | None:
    key = name.strip().lower()
    while key:
        for candidate in (key, key.replace(" ", ""), key.replace("_", "-")):
            if candidate in METHOD_COLORS:
                return METHOD_COLORS[candidate]
            if candidate in _ALIASES:
                return METHOD_COLORS[_ALIASES[candidate]]
        shorter = _SUFFIX.sub("", key).strip()
        if shorter == key:
            return None
        key = shorter
    return None


def method_color(name: str) -> str:
    """The book's colour of method ``name``: a name of :data:`subfl.methods.METHODS` or a display form of one
    (``"HeteroFL"``, ``"PriSM"``, ``"FedAvg (full model)"``); variants take their base method's colour
    (``"unbiased+cliplr"`` → ``"unbiased"``, ``"fjord-ft"`` → ``"fjord"``). An unknown name gets a fixed colour of
    the cycle chosen by its name, the same on every page."""
    found = _lookup(name)
    return found if found is not None else CYCLE[zlib.crc32(name.encode()) % len(CYCLE)]


def method_colors(names: Iterable[str]) -> dict[str, str]:
    """``{name: method_color(name)}`` for the page's methods (a drop-in for a page's ``COLORS`` dict)."""
    return {n: method_color(n) for n in names}


def grid(panels: int, ncols: int = 2, height: float = PANEL_HEIGHT_IN, width: float = COLUMN_IN, **kwargs):
    """``plt.subplots`` for ``panels`` panels in rows of at most ``ncols`` that together fit the column; returns
    ``(fig, axes)`` with ``axes`` a flat list of the ``panels`` axes (the unused cells of the last row removed).
    ``kwargs`` go to ``plt.subplots`` (``sharey=True``, …); the layout is constrained unless given."""
    import matplotlib.pyplot as plt

    ncols = max(1, min(ncols, panels))
    nrows = math.ceil(panels / ncols)
    if not {"layout", "constrained_layout", "tight_layout"} & kwargs.keys():
        kwargs["layout"] = "constrained"
    kwargs["squeeze"] = False
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, height * nrows), **kwargs)
    flat = list(axes.flat)
    for ax in flat[panels:]:
        ax.remove()
    return fig, flat[:panels]


def apply_style() -> None:
    """Set :data:`STYLE` in ``matplotlib.rcParams``."""
    mpl.rcParams.update(STYLE)


def _raise_small_text(fig) -> None:
    from matplotlib.text import Text

    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            labels = axis.get_ticklabels(which="both")
            if labels and min(t.get_fontsize() for t in labels) < MIN_FONT_PT:
                axis.set_tick_params(which="both", labelsize=MIN_FONT_PT)
    for text in fig.findobj(Text):
        if text.get_text() and text.get_fontsize() < MIN_FONT_PT:
            text.set_fontsize(MIN_FONT_PT)


def _saved_width(fig, pad: float) -> float:
    """Width in inches of ``fig`` saved with ``bbox_inches="tight"``."""
    renderer = fig.canvas.get_renderer()
    fig.draw_without_rendering()
    return fig.get_tightbbox(renderer).width + 2 * pad


def fit_to_column(fig, column: float = COLUMN_IN, tries: int = 5) -> bool:
    """The display-time guard (see the module docstring): raise text below :data:`MIN_FONT_PT`, then narrow a
    figure wider than ``column`` inches (as saved, tight) by resizing its canvas, fonts unchanged. Returns whether
    the figure was narrowed. Never raises: a figure it cannot measure is left as it is."""
    try:
        _raise_small_text(fig)
        pad = mpl.rcParams["savefig.pad_inches"]
        narrowed = False
        for _ in range(tries):
            saved = _saved_width(fig, pad)
            if saved <= column + 1e-3:
                break
            w, h = fig.get_size_inches()
            scale = (column - 0.02) / saved
            fig.set_size_inches(w * scale, h * max(scale, MIN_HEIGHT_SCALE), forward=False)
            if fig.get_layout_engine() is None:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    fig.tight_layout()
            narrowed = True
        return narrowed
    except Exception:  # noqa: BLE001 - a display aid must never break a page
        return False


_FORMAT = "svg"
_PRINT_KWARGS = {"bbox_inches": "tight", "metadata": {"Date": None}}


SVG_DECIMALS = 3
"""Decimals an SVG coordinate keeps (:func:`coarse_svg`): 0.001 px, far below what a screen shows."""

_LONG_DECIMAL = re.compile(r"(?<![\w.])-?\d+\.\d{%d}\d+" % SVG_DECIMALS)


def coarse_svg(svg: str) -> str:
    """``svg`` with every number of more than :data:`SVG_DECIMALS` decimals rounded to that many.

    Matplotlib writes coordinates to 6 decimals (10⁻⁶ px). A figure of values computed live on the page (the
    singular values of a layer) moves at that digit from one CPU to another, as float rounding moves the layout
    (a legend's box at y = 20.798437 on one processor, 20.798438 on another), so the page's committed copy would
    differ from its re-execution elsewhere. At 10⁻³ px such a move needs a million times larger a difference."""
    def rounded(match: re.Match) -> str:
        text = f"{float(match.group(0)):.{SVG_DECIMALS}f}".rstrip("0").rstrip(".")
        return "0" if text == "-0" else text

    return _LONG_DECIMAL.sub(rounded, svg)


def _show_svg(fig):
    from IPython.core.pylabtools import print_figure

    fit_to_column(fig)
    return coarse_svg(print_figure(fig, fmt=_FORMAT, **_PRINT_KWARGS))


def _register(shell) -> None:
    from matplotlib.figure import Figure

    formatters = shell.display_formatter.formatters
    if formatters["image/svg+xml"].type_printers.get(Figure) is _show_svg:
        return
    for mime, formatter in formatters.items():
        if mime != "image/svg+xml":
            formatter.pop(Figure, None)
    formatters["image/svg+xml"].for_type(Figure, _show_svg)


def install() -> bool:
    """Apply :data:`STYLE`; inside an IPython kernel also show figures as SVG through :func:`fit_to_column`
    (re-asserted before every cell, should a page reset the formats). ``False`` outside a kernel."""
    apply_style()
    shell = kernel_shell()
    if shell is None:
        return False
    backend = mpl.rcParams._get("backend")
    if isinstance(backend, str) and backend in ("inline", "module://matplotlib_inline.backend_inline"):
        # load the inline backend now, so that its one-time set-up of the figure formats happens before ours
        import matplotlib_inline.backend_inline  # noqa: F401
        apply_style()
    try:
        from matplotlib_inline.config import InlineBackend
        cfg = InlineBackend.instance(parent=shell)
        cfg.shell = shell
        cfg.print_figure_kwargs = dict(_PRINT_KWARGS)
        cfg.figure_formats = {_FORMAT}
    except ImportError:
        pass
    _register(shell)
    if not getattr(shell, "_subfl_figures_hook", False):
        shell.events.register("pre_run_cell", lambda *_: _register(shell))
        shell._subfl_figures_hook = True
    return True
