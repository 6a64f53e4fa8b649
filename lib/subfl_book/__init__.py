"""subfl_book: what the reproducibility book needs beside the :mod:`subfl` library.

Per-chapter experiment catalogs and analyses, readers of recorded results, the run store (every run a page reads,
recorded in the repository), the page pipeline and plots. It imports :mod:`subfl`; :mod:`subfl` never imports it.
"""
from subfl.experiments import default_scale, final_table, history_frame, make_config

from .store import run_experiment, run_seeds
from .figures import install as _install_figures
from .tables import install as _install_tables

_install_tables()  # in a notebook: frames shown without their default row numbers, missing values as "—"
_install_figures()  # the book's figure style; in a notebook: SVG figures that fit the content column (figures.py)

__all__ = ["default_scale", "final_table", "history_frame", "make_config", "run_experiment", "run_seeds"]
