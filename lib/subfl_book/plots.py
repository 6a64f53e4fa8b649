"""Figures shared by the chapters (matplotlib; every function draws on an Axes it is given or creates).

Sizes, fonts and colours follow the book's style (:mod:`subfl_book.figures`): lines of a known method are drawn
in its colour (:func:`subfl_book.figures.method_color`) unless a colour is given."""
from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from .figures import method_color


def label_distribution(hist: np.ndarray, ax=None, title: str = "", class_names: Sequence[str] | None = None,
                       cmap: str = "tab10"):
    """Stacked horizontal bars: one bar per client, segments = its samples of each class."""
    ax = ax or plt.gca()
    hist = np.asarray(hist, dtype=float)
    colors = plt.get_cmap(cmap)(np.linspace(0, 1, hist.shape[1])) if hist.shape[1] > 10 else \
        plt.get_cmap(cmap)(np.arange(hist.shape[1]))
    left = np.zeros(hist.shape[0])
    clients = np.arange(hist.shape[0])
    for c in range(hist.shape[1]):
        label = class_names[c] if class_names is not None else None
        ax.barh(clients, hist[:, c], left=left, color=colors[c], height=0.85, label=label)
        left += hist[:, c]
    ax.set_yticks(clients if len(clients) <= 20 else clients[::max(1, len(clients) // 10)])
    ax.invert_yaxis()
    ax.set_xlabel("samples")
    ax.set_ylabel("client")
    ax.set_title(title)
    return ax


def mean_band(frame: pd.DataFrame, x: str, y: str, ax=None, label: str | None = None, **kwargs):
    """Mean of ``y`` over seeds against ``x`` with a ±1 standard-deviation band (a line if one seed)."""
    ax = ax or plt.gca()
    stats = frame.groupby(x)[y].agg(["mean", "std", "count"]).reset_index()
    line, = ax.plot(stats[x], stats["mean"], label=label, **kwargs)
    if (stats["count"] > 1).any():
        ax.fill_between(stats[x], stats["mean"] - stats["std"].fillna(0), stats["mean"] + stats["std"].fillna(0),
                        color=line.get_color(), alpha=0.2, linewidth=0)
    return ax


def by_width(table: pd.DataFrame, ax=None, label_field: str = "method", value: str = "mean", error: str = "std",
             reference: float | None = None, reference_label: str = "full-model FedAvg", **kwargs):
    """Accuracy (or any metric) against sub-model width: one line with error bars per ``label_field`` value.

    ``table``: rows with ``width``, ``value`` and ``error`` columns (e.g. :func:`subfl_book.analysis.
    width_table`); ``reference``: a horizontal dashed line (e.g. the full model's accuracy)."""
    ax = ax or plt.gca()
    for name, sub in table.groupby(label_field, sort=False):
        sub = sub.sort_values("width")
        err = sub[error].fillna(0) if error in sub else None
        style = {"color": method_color(str(name))} if label_field == "method" and "color" not in kwargs else {}
        ax.errorbar(sub["width"], sub[value], yerr=err, marker="o", capsize=3, label=str(name), **style, **kwargs)
    if reference is not None:
        ax.axhline(reference, color="0.4", linestyle="--", linewidth=1, label=reference_label)
    ax.set_xlabel("sub-model width p")
    ax.set_xticks(sorted(table["width"].unique()))
    ax.grid(alpha=0.3)
    return ax
