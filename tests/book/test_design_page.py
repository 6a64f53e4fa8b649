"""The design appendix's table of methods, generated from the registry."""
import pytest

from subfl.methods import METHODS
from subfl_book import design_page


def test_every_registered_method_has_a_row_and_every_row_a_registered_module():
    block = design_page.methods_block()
    for name in METHODS:
        assert f"`{name}`" in block, name
    modules = {cls.__module__ for cls in METHODS.values()}
    assert set(design_page.ROWS) == modules
    assert len(block.splitlines()) == 2 + 2 + len(modules)   # markers, header, rule, one row per module


def test_a_method_module_without_a_row_is_refused(monkeypatch):
    monkeypatch.delitem(design_page.ROWS, "subfl.methods.fedavg")
    with pytest.raises(ValueError, match="subfl.methods.fedavg"):
        design_page.methods_block()


def test_every_citation_is_in_the_bibliography():
    import re

    from subfl_book.store import checkout_root
    bib = (checkout_root() / "book" / "references.bib").read_text()
    keys = set(re.findall(r"^@\w+\{([^,]+),", bib, re.M))
    cited = {k for _, paper in design_page.ROWS.values() for k in re.findall(r"\{cite:t\}`([^`]+)`", paper)}
    assert cited <= keys, sorted(cited - keys)
