"""What a FLANC client exchanges per round, in parameters, under the constructions FLANC's text allows.

FLANC (Mei et al., NeurIPS 2022) composes the weight of a p-width layer from a basis ``V`` shared by all widths
(``k² × R₁ × R₂``) and coefficients ``U_p`` of that width (``R₂ × (S_p/R₁ · T_p)``) (Sec. 2.2, Eq. (1)-(2),
Fig. 2), and a client of width p receives the basis and ``U_p`` and returns both (Sec. 2.3, Algorithm 1). The
text leaves open several things that set the count of Table 1's communication column:

* ``R₁``: "a common divisor of the input channels over all widths" (Sec. 2.2, Sec. 3.4); Fig. 7b tries 25 %, 50 %
  and 100 % of the smallest incoming channel. Here ``R₁`` is the largest common divisor of the layer's input sizes
  ``S_p`` not above ``round(r1_fraction · S_full)``; with the smallest width ¼ the three shares are
  ``r1_fraction`` = 1/16, 1/8 and 1/4 (1/4: the greatest common divisor itself).
* which "incoming channel": the layer's own input (``scope="layer"``), or that of the residual block the layer
  sits in (``scope="block"``, both 3×3 convolutions of a BasicBlock take ``R₁`` from the block's input).
* ``R₂``: Fig. 7c tries 25 %, 50 % and 75 % of the layer's full-width output channels (``r2_fraction``), at most
  ``R₁k²``.
* whether the input layer (ResNet-18's stem, the CNN's head) scales with p or keeps its full width.
* what is counted: every tensor of the p-width model (``count="all"``), all but the normalisation layers
  (``"no-norm"``), or only the bases and coefficients of the composed layers (``"composed"``); one direction
  or both (``directions``).

Everything here is closed-form over integer channel counts (no model is built); :func:`payload` with the
library's defaults (:data:`LIBRARY`) equals :func:`subfl.methods.flanc.flanc_parameter_counts` exactly.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..models.norm import scaled_channels

WIDTHS = (0.25, 0.5, 0.75, 1.0)
"""FLANC's capacity levels p (Sec. 3, Table 1)."""

COUNTS = ("all", "no-norm", "composed")
SCOPES = ("layer", "block")
INPUT_LAYERS = ("scaled", "fixed")


@dataclass(frozen=True)
class Layer:
    """One weight layer of a model family: ``ins`` / ``outs`` are its input / output sizes at each width (in the
    order of the family's widths), ``kernel`` its ``k`` (``k×k``; 1 for a linear layer), ``role`` one of
    ``"input"``, ``"hidden"`` (composable), ``"shortcut"`` (1×1 projection), ``"output"``; ``block`` the residual
    block it belongs to (``""`` if none)."""

    name: str
    role: str
    kernel: int
    ins: tuple[int, ...]
    outs: tuple[int, ...]
    bias: bool
    block: str = ""


@dataclass(frozen=True)
class Family:
    """A model at several widths: its weight layers and, per width, its normalisation channels (each carries a
    scale and a shift)."""

    name: str
    widths: tuple[float, ...]
    layers: tuple[Layer, ...]
    norm_channels: tuple[int, ...]

    def dense(self, i: int) -> int:
        """Parameters of the dense model at width ``widths[i]``."""
        weights = sum(l.kernel ** 2 * l.ins[i] * l.outs[i] + (l.outs[i] if l.bias else 0) for l in self.layers)
        return weights + 2 * self.norm_channels[i]


@dataclass(frozen=True)
class Construction:
    """One reading of FLANC's text (see the module docstring)."""

    label: str
    r1_fraction: float = 0.125
    scope: str = "layer"
    r2_fraction: float = 0.25
    input_layer: str = "scaled"
    compose_1x1: bool = False
    count: str = "all"
    directions: int = 1

    def __post_init__(self) -> None:
        if self.scope not in SCOPES:
            raise ValueError(f"scope must be one of {SCOPES}, got {self.scope!r}")
        if self.input_layer not in INPUT_LAYERS:
            raise ValueError(f"input_layer must be one of {INPUT_LAYERS}, got {self.input_layer!r}")
        if self.count not in COUNTS:
            raise ValueError(f"count must be one of {COUNTS}, got {self.count!r}")
        if self.directions not in (1, 2):
            raise ValueError(f"directions must be 1 or 2, got {self.directions!r}")
        for key in ("r1_fraction", "r2_fraction"):
            v = getattr(self, key)
            if not 0.0 < float(v) <= 1.0:
                raise ValueError(f"{key} must be in (0, 1], got {v!r}")


LIBRARY = Construction("library default (R₁ per layer)")
"""The library's FLANC: ``R₁`` = ⅛ of each composed layer's full-width input, ``R₂`` = ¼ of its full-width output,
input layer scaled with p, every tensor counted once."""

RELEASED = Construction("released code: R₁ per residual block, input layer at full width", scope="block",
                        input_layer="fixed")
"""The construction of the authors' released ResNet-18 / CNN: both convolutions of a residual block take ``R₁`` =
⅛ of the *block's* full-width input channels, and the input layer keeps its full width (64 channels) at every p."""


# --------------------------------------------------------------------------------------------------
# the two model families of Table 1's communication column
# --------------------------------------------------------------------------------------------------
def resnet18_family(widths: Sequence[float] = WIDTHS, num_classes: int = 10, input_layer: str = "scaled",
                    in_channels: int = 3) -> Family:
    """CIFAR ResNet-18 (:class:`subfl.models.resnet.ResNet18`, BatchNorm, convolutions without bias) at each width.

    ``input_layer="fixed"`` keeps the 3×3 stem at 64 channels for every p (the released code), so the first block
    of ``layer1`` gets a 1×1 projection shortcut wherever its width is below 64.
    """
    widths = tuple(float(p) for p in widths)
    if input_layer not in INPUT_LAYERS:
        raise ValueError(f"input_layer must be one of {INPUT_LAYERS}, got {input_layer!r}")
    stem = tuple(64 if input_layer == "fixed" else scaled_channels(64, p) for p in widths)
    layers = [Layer("conv1", "input", 3, (in_channels,) * len(widths), stem, False)]
    norms = list(stem)
    channels = stem
    for stage, base in enumerate((64, 128, 256, 512), start=1):
        outs = tuple(scaled_channels(base, p) for p in widths)
        for b in range(2):
            block = f"layer{stage}.{b}"
            stride = 2 if (stage > 1 and b == 0) else 1
            layers.append(Layer(f"{block}.conv1", "hidden", 3, channels, outs, False, block))
            layers.append(Layer(f"{block}.conv2", "hidden", 3, outs, outs, False, block))
            norms = [n + 2 * o for n, o in zip(norms, outs)]
            if stride != 1 or channels != outs:
                # a 1×1 projection wherever the block changes stride or width; size 0 marks a width without one
                # (with the fixed stem, layer1.0 needs it only below full width)
                ins_needed = tuple(c if (stride != 1 or c != o) else 0 for c, o in zip(channels, outs))
                outs_needed = tuple(o if (stride != 1 or c != o) else 0 for c, o in zip(channels, outs))
                layers.append(Layer(f"{block}.shortcut", "shortcut", 1, ins_needed, outs_needed, False, block))
                norms = [n + o for n, o in zip(norms, outs_needed)]
            channels = outs
    layers.append(Layer("fc", "output", 1, channels, (num_classes,) * len(widths), True))
    return Family("resnet18", widths, tuple(layers), tuple(norms))


def flanc_cnn_family(widths: Sequence[float] = WIDTHS, num_classes: int = 10, input_layer: str = "scaled",
                     input_shape: tuple[int, int, int] = (1, 28, 28)) -> Family:
    """FLANC's Fashion-MNIST CNN (:class:`subfl.models.composed.FlancCNN`: head 3×3 with bias → conv1 3×3 → pool →
    conv2 3×3 → pool → linear classifier, no normalisation) at each width; ``input_layer="fixed"`` keeps the head
    at 64 channels for every p (the released code)."""
    widths = tuple(float(p) for p in widths)
    if input_layer not in INPUT_LAYERS:
        raise ValueError(f"input_layer must be one of {INPUT_LAYERS}, got {input_layer!r}")
    c, h, w = input_shape
    head = tuple(64 if input_layer == "fixed" else scaled_channels(64, p) for p in widths)
    c1 = tuple(scaled_channels(128, p) for p in widths)
    c2 = tuple(scaled_channels(128, p) for p in widths)
    flat = (h // 4) * (w // 4)
    layers = (Layer("head", "input", 3, (c,) * len(widths), head, True),
              Layer("conv1", "hidden", 3, head, c1, False),
              Layer("conv2", "hidden", 3, c1, c2, False),
              Layer("classifier", "output", 1, tuple(x * flat for x in c2), (num_classes,) * len(widths), True))
    return Family("flanc_cnn", widths, layers, (0,) * len(widths))


FAMILIES = {"resnet18": resnet18_family, "flanc_cnn": flanc_cnn_family}


# --------------------------------------------------------------------------------------------------
# sizes and payload
# --------------------------------------------------------------------------------------------------
def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def r1_of(ins: Sequence[int], r1_fraction: float) -> int:
    """The largest common divisor of ``ins`` not above ``max(1, round_half_up(r1_fraction · max(ins)))``."""
    g = math.gcd(*[int(s) for s in ins if s > 0])
    target = max(1, math.floor(float(r1_fraction) * max(ins) + 0.5))
    return max(d for d in _divisors(g) if d <= target)


def sizes(family: Family, c: Construction) -> dict[str, tuple[int, int]]:
    """``{layer: (R₁, R₂)}`` of the composed layers of ``family`` under ``c``."""
    composed = [l for l in family.layers
                if l.role == "hidden" or (c.compose_1x1 and l.role == "shortcut" and min(l.ins) > 0)]
    first_of_block: dict[str, Layer] = {}
    for l in family.layers:
        if l.block and l.role == "hidden":
            first_of_block.setdefault(l.block, l)
    out = {}
    for l in composed:
        source = first_of_block[l.block] if (c.scope == "block" and l.block) else l
        r1 = r1_of(source.ins, c.r1_fraction)
        if any(s % r1 for s in l.ins):
            r1 = r1_of(l.ins, c.r1_fraction)  # the block's R₁ must also divide this layer's inputs
        r2 = min(max(1, math.floor(c.r2_fraction * max(l.outs) + 0.5)), r1 * l.kernel ** 2)
        out[l.name] = (r1, r2)
    return out


def payload(family: Family, c: Construction) -> list[dict]:
    """Per width: ``dense`` (the p-width model), ``basis`` (``Σ k²R₁R₂``), ``coefficients`` (``Σ R₂·S_p/R₁·T_p``),
    ``other`` (what is counted of the uncomposed tensors), ``sent`` (``directions × (basis + coefficients +
    other)``), in parameters. ``family`` must have been built with ``c.input_layer``."""
    plan = sizes(family, c)
    basis = sum(l.kernel ** 2 * plan[l.name][0] * plan[l.name][1] for l in family.layers if l.name in plan)
    rows = []
    for i, p in enumerate(family.widths):
        coefficients = sum(plan[l.name][1] * (l.ins[i] // plan[l.name][0]) * l.outs[i]
                           for l in family.layers if l.name in plan)
        dense_rest = sum(l.kernel ** 2 * l.ins[i] * l.outs[i] for l in family.layers if l.name not in plan)
        biases = sum(l.outs[i] for l in family.layers if l.bias)
        norms = 2 * family.norm_channels[i]
        other = {"all": dense_rest + biases + norms, "no-norm": dense_rest + biases, "composed": 0}[c.count]
        rows.append({"width": p, "dense": family.dense(i), "basis": basis, "coefficients": coefficients,
                     "other": other, "sent": c.directions * (basis + coefficients + other)})
    return rows


# --------------------------------------------------------------------------------------------------
# Table 1 and the candidates
# --------------------------------------------------------------------------------------------------
TABLE1_FLANC = {"resnet18": (0.5e6, 1.2e6, 2.4e6, 4.0e6, 2.0e6), "flanc_cnn": (33e3, 63e3, 98e3, 136e3, 83e3)}
"""FLANC's communication column of Table 1 at widths ¼, ½, ¾, 1 and the average: CIFAR-10 (and CIFAR-100) with
ResNet-18, in parameters (printed 0.5M … 4.0M, Avg 2.0M), and Fashion-MNIST with the CNN (printed 33K … 136K,
Avg 83K)."""
TABLE1_DENSE = {"resnet18": (0.7e6, 2.8e6, 6.3e6, 11.1e6, 5.2e6), "flanc_cnn": (43e3, 106e3, 186e3, 285e3, 155e3)}
"""Table 1's p-width column (the dense model a slicing client exchanges), same layout."""
UNIT = {"resnet18": 1e5, "flanc_cnn": 1e3}
"""The last printed digit of each model's column: 0.1M and 1K."""


def printed(value: float, model: str) -> float:
    """``value`` rounded (half up) to the last digit Table 1 prints for ``model``."""
    u = UNIT[model]
    return math.floor(value / u + 0.5) * u


def candidates(model: str) -> list[Construction]:
    """The constructions compared for ``model``: the library's, the released code's, and one change at a time
    from the library's (R₁ share, R₁ scope, R₂ share, input layer, 1×1 shortcuts composed, what is counted,
    both directions). For the CNN, which has no residual block, shortcut or norm, the rows that would repeat
    another are left out and the released code's construction is the input-layer row."""
    rows = [LIBRARY, RELEASED,
            replace(LIBRARY, label="R₁ per residual block", scope="block"),
            replace(LIBRARY, label="input layer at full width", input_layer="fixed"),
            replace(LIBRARY, label="R₁ = 25 % of the smallest input (1/16 of full)", r1_fraction=1 / 16),
            replace(LIBRARY, label="R₁ = 100 % of the smallest input (gcd of S_p)", r1_fraction=0.25),
            replace(LIBRARY, label="R₂ = 50 % of full-width output", r2_fraction=0.5),
            replace(LIBRARY, label="R₂ = 75 % of full-width output", r2_fraction=0.75),
            replace(LIBRARY, label="composed 1×1 shortcuts too", compose_1x1=True),
            replace(LIBRARY, label="norms not counted", count="no-norm"),
            replace(LIBRARY, label="only bases and coefficients counted", count="composed"),
            replace(LIBRARY, label="both directions counted", directions=2)]
    if model == "flanc_cnn":  # no residual block, shortcut or norm: those rows would repeat others
        rows = [r for r in rows if r.scope == "layer" and not r.compose_1x1 and r.count != "no-norm"]
        rows[1] = replace(rows[1], label="input layer (head) at full width, as in the released code")
    return rows


def _family(model: str, c: Construction, num_classes: int) -> Family:
    return FAMILIES[model](WIDTHS, num_classes=num_classes, input_layer=c.input_layer)


def candidate_table(model: str = "resnet18", num_classes: int = 10,
                    constructions: Sequence[Construction] | None = None) -> list[dict]:
    """One row per construction (:func:`candidates` unless given): FLANC's payload at widths ¼, ½, ¾, 1 and
    its average, each next to Table 1's printed value, and ``matches``: every one of the five equals the printed
    value when rounded to the printed digit (0.1M for ResNet-18, 1K for the CNN)."""
    if model not in FAMILIES:
        raise ValueError(f"model must be one of {sorted(FAMILIES)}, got {model!r}")
    out = []
    for c in constructions if constructions is not None else candidates(model):
        rows = payload(_family(model, c, num_classes), c)
        values = [r["sent"] for r in rows] + [sum(r["sent"] for r in rows) / len(rows)]
        row = {"construction": c.label}
        for key, v in zip(("w0.25", "w0.5", "w0.75", "w1", "avg"), values):
            row[key] = v
        row["agree"] = sum(printed(v, model) == t for v, t in zip(values, TABLE1_FLANC[model]))
        row["matches"] = row["agree"] == 5
        out.append(row)
    return out


def grid(model: str = "resnet18", num_classes: int = 10) -> list[dict]:
    """:func:`candidate_table` over every combination of R₁ share (1/16, 1/8, 1/4 of full), R₁ scope, R₂ share
    (¼, ½, ¾), input layer (scaled, fixed), 1×1 shortcuts (dense, composed), count (all, no-norm, composed) and
    directions (1, 2): 432 constructions for ResNet-18."""
    cs = [Construction(f"R₁ {r1:g}·S_full per {scope}, R₂ {r2:g}·T_full, input layer {inp}, "
                       f"1×1 {'composed' if c1 else 'dense'}, count {count}, ×{d}", r1, scope, r2, inp, c1, count, d)
          for r1 in (1 / 16, 0.125, 0.25) for scope in SCOPES for r2 in (0.25, 0.5, 0.75)
          for inp in INPUT_LAYERS for c1 in (False, True) for count in COUNTS for d in (1, 2)]
    return candidate_table(model, num_classes, cs)


def dense_table(model: str = "resnet18", num_classes: int = 10) -> list[dict]:
    """The p-width column: the dense model at ¼, ½, ¾, 1 and its average, with the input layer scaled and at full
    width, next to Table 1's printed values."""
    out = []
    for inp in INPUT_LAYERS:
        family = FAMILIES[model](WIDTHS, num_classes=num_classes, input_layer=inp)
        values = [family.dense(i) for i in range(len(WIDTHS))]
        values.append(sum(values) / len(values))
        row = {"input layer": inp}
        for key, v in zip(("w0.25", "w0.5", "w0.75", "w1", "avg"), values):
            row[key] = v
        row["agree"] = sum(printed(v, model) == t for v, t in zip(values, TABLE1_DENSE[model]))
        out.append(row)
    return out


__all__ = ["Construction", "Family", "LIBRARY", "Layer", "RELEASED", "TABLE1_DENSE", "TABLE1_FLANC", "WIDTHS",
           "candidate_table", "candidates", "dense_table", "flanc_cnn_family", "grid", "payload", "printed",
           "r1_of", "resnet18_family", "sizes"]
