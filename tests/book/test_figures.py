"""The book's figure style (subfl_book.figures): column-fitting sizes, legible text, one colour per method."""
import io

import matplotlib

matplotlib.use("agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from subfl.methods import METHODS  # noqa: E402
from subfl_book import figures  # noqa: E402
from subfl_book.catalog import SPECTRAL_METHODS  # noqa: E402


def test_the_default_figure_fits_the_column_with_legible_text():
    figures.apply_style()
    rc = matplotlib.rcParams
    assert rc["figure.figsize"][0] <= figures.COLUMN_IN
    assert figures.COLUMN_IN * 96 <= figures.COLUMN_PX  # SVG: 96 CSS px per inch, shown at 1:1
    for key in ("font.size", "axes.titlesize", "axes.labelsize", "xtick.labelsize", "ytick.labelsize",
                "legend.fontsize", "figure.titlesize"):
        assert matplotlib.font_manager.FontProperties(size=rc[key]).get_size_in_points() >= figures.MIN_FONT_PT


def test_every_method_has_a_colour_and_variants_share_their_base_methods():
    assert set(figures.METHOD_COLORS) >= {"fedavg", "prism", "topn", "unbiased", "collective", "heterofl", "fjord",
                                          "fedrolex", "flanc", "lowerb", "opu2", "opu3", "caff", "hetlora", "fedhm",
                                          "depthfl", "splitmix"}
    for name in METHODS:
        assert figures.method_color(name).startswith("#")
    assert figures.method_color("unbiased+cliplr") == figures.method_color("unbiased")
    assert figures.method_color("fjord-ft") == figures.method_color("fjord")
    assert figures.method_color("HeteroFL") == figures.method_color("heterofl")
    assert figures.method_color("FedAvg (full model)") == figures.method_color("fedavg")
    assert figures.method_color("something new") == figures.method_color("something new")


@pytest.mark.parametrize("group", [
    list(SPECTRAL_METHODS),
    ["fedavg", "heterofl", "fjord", "fedrolex", "flanc"],
    ["fedavg", "caff", "hetlora", "fedhm", "depthfl", "heterofl", "fjord", "fedrolex"],
    ["fedavg", "fedp3", "lowerb", "opu2", "opu3", "opu123", "opu23"],
    ["fedavg", "topn", "prism", "origdrop", "splitmix", "unbiased", "collective"],
])
def test_methods_that_share_a_figure_have_distinct_colours(group):
    assert len(set(figures.method_colors(group).values())) == len(group)


def _saved_width(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    head = buf.getvalue()[:2000].decode()
    return float(head.split('width="')[1].split("pt")[0]) / 72


def test_a_figure_wider_than_the_column_is_narrowed_with_its_text_kept_legible():
    figures.apply_style()
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8), constrained_layout=True)
    for ax in axes:
        ax.plot([0, 1], [0, 1], label="prism")
        ax.set_title("a panel", fontsize=7)
        ax.tick_params(labelsize=6)
        ax.legend(fontsize=7)
    assert figures.fit_to_column(fig)
    assert _saved_width(fig) <= figures.COLUMN_IN + 0.01
    sizes = [t.get_fontsize() for t in fig.findobj(Text) if t.get_text()]
    sizes += [t.get_fontsize() for ax in axes for t in ax.get_xticklabels() + ax.get_yticklabels()]
    assert min(sizes) >= figures.MIN_FONT_PT
    plt.close(fig)


def test_a_figure_that_fits_keeps_its_size():
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.plot([0, 1])
    assert not figures.fit_to_column(fig)
    assert tuple(fig.get_size_inches()) == (6, 3)
    plt.close(fig)


def test_grid_fits_the_column_and_returns_one_axes_per_panel():
    fig, axes = figures.grid(5, ncols=2, sharey=True)
    assert len(axes) == 5 and len(fig.axes) == 5
    assert fig.get_size_inches()[0] <= figures.COLUMN_IN
    plt.close(fig)


def test_install_outside_a_kernel_only_sets_the_style():
    assert figures.install() is False
    assert matplotlib.rcParams["svg.fonttype"] == "path"


def _code_cells(path):
    import json

    return ["".join(c["source"]) for c in json.loads(path.read_text(encoding="utf-8"))["cells"]
            if c["cell_type"] == "code"]


def test_notebooks_take_method_colours_from_the_book_not_the_cycle():
    """A method keeps one colour across the book: no notebook maps a method name to a colour of its own (a
    ``{"prism": "C1"}`` literal), nor colours a method by its position in a loop (``color=f"C{i}"`` in a loop over
    methods); both drift from :data:`subfl_book.figures.METHOD_COLORS` from one page to the next."""
    import re
    from pathlib import Path

    names = "|".join(re.escape(m) for m in sorted(METHODS, key=len, reverse=True))
    literal = re.compile(rf'"({names})"\s*:\s*"(C\d|k|#[0-9A-Fa-f]{{6}})"')
    loop = re.compile(r"^(\s*)for i, (m|method|v|run) in enumerate\((\w*METHODS|methods|VARIANTS|rec\.runs)\b")

    def positional(cell: str) -> list[str]:
        """Loops over methods whose body colours by the loop index."""
        lines, found = cell.splitlines(), []
        for k, line in enumerate(lines):
            head = loop.match(line)
            if not head:
                continue
            body = []
            for inner in lines[k + 1:]:
                if inner.strip() and len(inner) - len(inner.lstrip()) <= len(head.group(1)):
                    break
                body.append(inner)
            if any('color=f"C{i}"' in inner for inner in body):
                found.append(line.strip())
        return found

    offenders = []
    for path in sorted(Path(__file__).resolve().parents[2].joinpath("notebooks").glob("*/*.ipynb")):
        for cell in _code_cells(path):
            offenders += [f"{path.parent.name}/{path.stem}: {m.group(0)}" for m in literal.finditer(cell)]
            offenders += [f"{path.parent.name}/{path.stem}: {line}" for line in positional(cell)]
    assert not offenders, offenders
    assert literal.search('COLORS = {"fedavg": "k", "prism": "C1"}')
    assert positional('for i, m in enumerate(methods):\n    ax.plot(x, y, color=f"C{i}")\n')
    assert not positional('for i, m in enumerate(methods):\n    ax.plot(x, y)\nax.plot(x, color=f"C{i}")\n')


def test_a_figure_of_live_values_is_written_the_same_when_they_move_in_their_last_bits():
    import re
    import xml.etree.ElementTree as ET

    import numpy as np

    from subfl_book.figures import _PRINT_KWARGS, SVG_DECIMALS, coarse_svg

    def svg_of(values):
        fig, ax = plt.subplots(figsize=(4, 3))
        ax.semilogy(np.arange(1, 65) / 64, values, label="conv2.weight (N=64)")
        ax.legend()
        buffer = io.StringIO()
        fig.savefig(buffer, format="svg", **_PRINT_KWARGS)
        plt.close(fig)
        return buffer.getvalue()

    def numbers(svg):
        return re.findall(r"-?\d+\.?\d*", svg)

    def moved_numbers(a, b):
        assert len(numbers(a)) == len(numbers(b))
        return sum(x != y for x, y in zip(numbers(a), numbers(b)))

    lam = 1.0 / np.arange(1, 65)
    moved = lam * (1 + 1e-7 * np.cos(np.arange(64)))     # 10⁻⁵ px or so: float rounding moving the layout
    raw_here, raw_there = svg_of(lam), svg_of(moved)
    # at 6 decimals 71 of the 1,133 numbers move; at 3 a move needs to straddle a rounding edge: 1 here
    assert moved_numbers(raw_here, raw_there) >= 50
    assert moved_numbers(coarse_svg(raw_here), coarse_svg(raw_there)) <= moved_numbers(raw_here, raw_there) / 20
    assert coarse_svg(svg_of(lam * (1 + 1e-10))) == coarse_svg(raw_here)    # float64 noise: nothing moves
    ET.fromstring(coarse_svg(raw_here).encode())              # still a well-formed SVG
    assert not re.search(r"\d\.\d{%d}" % (SVG_DECIMALS + 1), coarse_svg(raw_here))
    assert coarse_svg('<path d="M 0.0004 -0.0004 L 12.34567 7"/>') == '<path d="M 0 0 L 12.346 7"/>'
    assert len(coarse_svg(raw_here)) < len(raw_here)
