"""Sphinx extension: serve MathJax from the site itself when ``make mathjax`` installed it.

Sphinx's ``mathjax_path`` defaults to MathJax's CDN, so a site read offline (or built and opened on a machine
without internet) shows every formula as TeX source.  When ``_mathjax/tex-mml-chtml.js`` exists beside the book's
``_config.yml`` (``make mathjax``: npm's MathJax 3.2.2), this extension points ``mathjax_path`` at
``_static/mathjax/tex-mml-chtml.js`` and copies ``_mathjax/`` there when the HTML build finishes; otherwise it
leaves the CDN in place.  The copy lives outside ``_static/`` in the sources because Jupyter Book adds every
``.js`` file under a static path to every page (:func:`jupyter_book.config.get_final_config`), and MathJax's
components must be loaded on demand by MathJax, not up front.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

SOURCE_DIR = "_mathjax"
"""Where ``make mathjax`` puts MathJax, relative to the book's sources (not tracked)."""
SITE_DIR = "mathjax"
"""Where the built site serves it, relative to the site's ``_static`` folder."""
COMPONENT = "tex-mml-chtml.js"
"""The component the pages load (MathJax's combined TeX + MathML input, CommonHTML output)."""


def local_mathjax(srcdir: Path | str) -> Path | None:
    """The installed MathJax folder of the sources at ``srcdir``, or None when ``make mathjax`` did not install it."""
    folder = Path(srcdir) / SOURCE_DIR
    return folder if (folder / COMPONENT).is_file() else None


def _use_local(app: Any, config: Any) -> None:
    if local_mathjax(app.srcdir) is not None:
        config.mathjax_path = f"{SITE_DIR}/{COMPONENT}"   # relative: Sphinx resolves it inside _static


def _copy(app: Any, exception: Exception | None) -> None:
    from sphinx.util.fileutil import copy_asset

    source = local_mathjax(app.srcdir)
    if exception is None and source is not None and app.builder.format == "html":
        copy_asset(str(source), str(Path(app.outdir) / "_static" / SITE_DIR))


def setup(app: Any) -> dict[str, Any]:
    app.connect("config-inited", _use_local)
    app.connect("build-finished", _copy)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
