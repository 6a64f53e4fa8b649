"""How the book's pages show a DataFrame: no meaningless row numbers, no ``NaN``.

Inside an IPython kernel, importing :mod:`subfl_book` registers :func:`frame_html` as the HTML form of every
``pandas.DataFrame`` (:func:`install`): a frame whose index is the default ``0 … n-1`` is shown without it (a named
or meaningful index stays), and a missing value is shown as "—". Numbers keep pandas' own display formatting and
truncation. Styled tables (``DataFrame.style``) are left as their authors made them.
"""
from __future__ import annotations

import pandas as pd

MISSING = "—"
"""How a missing value (``NaN``, ``None``) is shown."""


def frame_html(frame: pd.DataFrame) -> str:
    """The HTML of ``frame`` as the book shows it (see the module docstring)."""
    default_index = isinstance(frame.index, pd.RangeIndex) and frame.index.start == 0 and frame.index.step == 1 \
        and frame.index.name is None
    return frame.to_html(index=not default_index, na_rep=MISSING, notebook=True,
                         max_rows=pd.get_option("display.max_rows"), max_cols=pd.get_option("display.max_columns"),
                         show_dimensions=False)


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
