"""Neural composition (FLANC; Mei, Guo, Zhou & Patel, NeurIPS 2022): layers whose weight is one shared
*neural basis* times per-width *coefficients*, and the composable models of the FLANC chapter.

Composition (Eqs. (1)–(2), Fig. 2 of the paper). A ``k_h × k_w`` convolution of a p-width network with
``S_p`` input and ``T_p`` output channels has its kernel ``W_p`` (shape ``(T_p, S_p, k_h, k_w)``) composed from

* the **basis** ``V`` of shape ``(R₁·k_h·k_w, R₂)`` — ``R₂`` basis kernels, each acting on ``R₁`` input channels —
  shared by every width; row ``r·k_h·k_w + a·k_w + b`` holds input channel ``r`` of the group, kernel position
  ``(a, b)``;
* the **coefficients** ``U_p`` of shape ``(R₂, G_p·T_p)`` with ``G_p = S_p / R₁`` — one ``R₂``-vector per
  (output channel ``t``, input group ``g``) pair, in column ``t·G_p + g`` — one tensor per width p;

as ``W_p[t, g·R₁ + r, a, b] = Σ_j V[r·k_h·k_w + a·k_w + b, j] · U_p[j, t·G_p + g]``, i.e. the matrix product
``V U_p`` (``(R₁k_hk_w) × (G_p T_p)``) reshaped to the kernel: the ``S_p`` input channels are cut into ``G_p``
groups of ``R₁`` consecutive channels (Fig. 2), and every (group, output channel) pair mixes the ``R₂`` basis
kernels with its own coefficients. A linear layer is the ``k_h = k_w = 1`` case (``W_p`` of shape
``(T_p, S_p)``). This is exactly the released code's two-step form (a convolution with the ``R₂`` basis kernels
applied to each group of ``R₁`` channels, then a 1×1 convolution ``G_p·R₂ → T_p``), written as one kernel.
:func:`compose_weight` implements it; :class:`ComposedConv2d` / :class:`ComposedLinear` compute ``W_p`` in
every forward pass, so gradients reach ``V`` and ``U_p``.

Orthogonality (Eq. (3)): ``Σ_l ‖V_lᵀ V_l − I_{R₂}‖²_F`` (:func:`orthogonality_penalty`). With ``V`` of shape
``(R₁k², R₂)`` and ``R₂ ≤ R₁k²`` the Gram matrix ``VᵀV`` is ``R₂ × R₂`` and vanishes exactly when the ``R₂``
basis kernels are orthonormal (the released code's ``B Bᵀ`` with ``B = V`` transposed). ``R₂`` is therefore
never larger than ``R₁k²`` (:func:`choose_r2` clips it).

Which layers are composed (:func:`composable_layers`). Every ``Linear`` / ``Conv2d`` (``groups = 1``, zero
padding) **except the first and the last** in registration order — the input layer (its input channels are
the data's, not a width) and the classifier (its outputs are the classes) stay dense, one copy per width, as
in the released code (``head`` / ``conv1`` and ``classifier`` / ``fc`` are plain layers there). 1×1
convolutions (ResNet's projection shortcuts) stay dense by default, as in the released ResNet-18
(``downsample`` uses plain 1×1 convolutions); ``compose_1x1=True`` composes them too (``k = 1``).
The classifier's input width scales with p; its output stays ``num_classes``.

Sizes (:func:`composition_plan`): the p-width dense model (``build_model(width=w·p)``) gives ``S_p`` and ``T_p``.
``R₁`` must divide every ``S_p``; by default it is the largest divisor of ``gcd_p S_p`` not above
``r1_fraction · S_max`` (``r1_fraction = 0.125``: the released code's ``--basis_fraction 0.125``). Which input
``S`` that is, is ``r1_scope``'s choice: ``"layer"`` (default) takes each composed layer's own input;
``"block"`` takes, for every composed layer inside a residual block, the input of the block's first composed
layer (:func:`residual_block_of`). The released ResNet-18 does the latter: both 3×3 convolutions of a
BasicBlock get ``R₁ = 0.125 ×`` the block's full-width input channels, so the second convolution of the first
block of stages 2–4 has ``R₁`` = 8 / 16 / 32 where ``"layer"`` gives 16 / 32 / 64 (twice the input groups, so
twice the coefficients of those three layers). With ``"block"`` a ResNet-18 client's payload is 0.53M / 1.21M /
2.36M / 3.96M parameters at p = ¼, ½, ¾, 1, the values FLANC's Table 1 prints (0.5M / 1.2M / 2.4M / 4.0M); with
``"layer"`` it is 0.53M / 1.09M / 2.02M / 3.32M (:mod:`subfl.costs.flanc_payload`). The two scopes coincide on
the FLANC CNN (no residual block). ``R₂`` is ``round(r2_fraction · T_max)`` (``r2_fraction = 0.25``: ``--n_basis
0.25``, a quarter of the full-width output channels), at most ``R₁k²``. Integers ``r1`` / ``r2`` override both
rules for every layer.

Models. Any model of :func:`~subfl.models.build_model` can be composed (:func:`build_composed_models`); the
chapter uses the CIFAR ResNet-18 (:mod:`subfl.models.resnet`: the 16 3×3 convolutions of its BasicBlocks are
composed; stem, 1×1 shortcuts, norms and ``fc`` dense) and :class:`FlancCNN`, the Fashion-MNIST CNN of the
released code (name ``"flanc_cnn"`` in :func:`build_dense_model`).
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from .factorized import decomposable_layers
from .norm import check_image_model_args, make_norm, scaled_channels

__all__ = [
    "BASIS",
    "COEFFICIENTS",
    "ComposedConv2d",
    "ComposedLayerSpec",
    "ComposedLinear",
    "FlancCNN",
    "R1_SCOPES",
    "build_composed_models",
    "build_dense_model",
    "choose_r1",
    "choose_r2",
    "compose_from_tensors",
    "compose_model",
    "compose_weight",
    "composable_layers",
    "composed_modules",
    "composition_plan",
    "init_bases",
    "init_coefficients",
    "orthogonality_penalty",
    "orthonormal_columns",
    "residual_block_of",
    "split_state",
]

BASIS = "basis"
"""Parameter name of a composed layer's shared basis ``V`` (state_dict key ``f"{layer}.basis"``)."""
COEFFICIENTS = "coefficients"
"""Parameter name of a composed layer's per-width coefficients ``U_p`` (key ``f"{layer}.coefficients"``)."""

R1_FRACTION = 0.125
"""Default ``R₁`` target as a fraction of the full-width input channels (released code: ``--basis_fraction``)."""
R2_FRACTION = 0.25
"""Default ``R₂`` as a fraction of the full-width output channels (released code: ``--n_basis``)."""


# --------------------------------------------------------------------------------------------------
# the composition itself
# --------------------------------------------------------------------------------------------------
def _pair(value: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(value, numbers.Integral):
        return int(value), int(value)
    kh, kw = value
    return int(kh), int(kw)


def compose_weight(basis: torch.Tensor, coefficients: torch.Tensor, out_channels: int, in_channels: int,
                   kernel_size: int | Sequence[int] = 1) -> torch.Tensor:
    """``W_p`` from ``V`` and ``U_p`` (Eqs. (1)–(2), Fig. 2): ``W[t, g·R₁ + r, a, b] = Σ_j V[r·k_hk_w + a·k_w + b, j]
    · U[j, t·G + g]`` with ``G = in_channels / R₁``.

    ``basis``: ``(R₁·k_h·k_w, R₂)``; ``coefficients``: ``(R₂, G·out_channels)``. Returns ``(T, S, k_h, k_w)``, or
    ``(T, S)`` when ``kernel_size`` is 1 given as an int (a linear layer). Differentiable in both inputs.
    """
    kh, kw = _pair(kernel_size)
    if basis.dim() != 2 or coefficients.dim() != 2:
        raise ValueError(f"basis and coefficients must be 2-d, got {tuple(basis.shape)} and "
                         f"{tuple(coefficients.shape)}")
    rows, r2 = basis.shape
    if rows % (kh * kw):
        raise ValueError(f"basis has {rows} rows, not a multiple of the kernel's {kh}x{kw} positions")
    r1 = rows // (kh * kw)
    if in_channels % r1:
        raise ValueError(f"R1={r1} does not divide in_channels={in_channels}")
    groups = in_channels // r1
    if tuple(coefficients.shape) != (r2, groups * out_channels):
        raise ValueError(f"coefficients must have shape (R2={r2}, G·T={groups}·{out_channels}), got "
                         f"{tuple(coefficients.shape)}")
    w = (basis @ coefficients).view(r1, kh, kw, out_channels, groups)
    w = w.permute(3, 4, 0, 1, 2).reshape(out_channels, in_channels, kh, kw)
    if isinstance(kernel_size, numbers.Integral) and kh == kw == 1:
        return w.view(out_channels, in_channels)
    return w


def orthogonality_penalty(bases: Iterable[torch.Tensor] | Mapping[str, torch.Tensor],
                          reduction: str = "sum") -> torch.Tensor:
    """Eq. (3) without ``λ``: ``Σ_l ‖V_lᵀ V_l − I‖²_F`` over the bases ``V_l`` (each ``(R₁k², R₂)``).

    ``reduction="mean"`` divides each layer's term by ``R₂²`` (the mean over the Gram matrix's entries, the
    released code's ``MSELoss(B Bᵀ, I)``). Zero exactly when every basis has orthonormal columns.
    """
    if reduction not in ("sum", "mean"):
        raise ValueError(f"reduction must be 'sum' or 'mean', got {reduction!r}")
    values = list(bases.values()) if isinstance(bases, Mapping) else list(bases)
    if not values:
        return torch.zeros(())
    total = None
    for v in values:
        m = v.reshape(v.shape[0], -1)
        gram = m.t() @ m
        term = (gram - torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device)).pow(2).sum()
        if reduction == "mean":
            term = term / gram.numel()
        total = term if total is None else total + term
    return total


def orthonormal_columns(rows: int, cols: int, generator: torch.Generator | None = None,
                        dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A ``rows × cols`` matrix with orthonormal columns (``cols ≤ rows``): Q of the QR decomposition of a Gaussian
    matrix, signs fixed by ``diag(R) > 0`` (Haar-distributed; the released code's ``nn.init.orthogonal``)."""
    if not 1 <= cols <= rows:
        raise ValueError(f"orthonormal_columns needs 1 <= cols <= rows, got rows={rows}, cols={cols}")
    a = torch.randn(rows, cols, generator=generator, dtype=torch.float64)
    q, r = torch.linalg.qr(a)
    signs = torch.sign(torch.diagonal(r))
    signs[signs == 0] = 1.0
    return (q * signs).to(dtype)


# --------------------------------------------------------------------------------------------------
# which layers, and their sizes
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ComposedLayerSpec:
    """A composed layer: its name, kind, kernel, ``R₁``, ``R₂`` and its input / output sizes at every width.

    ``in_sizes`` / ``out_sizes`` are ``((p, S_p), …)`` / ``((p, T_p), …)`` in increasing ``p``.
    """

    name: str
    kind: str  # "conv2d" or "linear"
    kernel_size: tuple[int, int]
    r1: int
    r2: int
    in_sizes: tuple[tuple[float, int], ...]
    out_sizes: tuple[tuple[float, int], ...]
    bias: bool

    def _size(self, sizes: tuple[tuple[float, int], ...], p: float) -> int:
        for q, n in sizes:
            if abs(q - float(p)) < 1e-9:
                return n
        raise ValueError(f"layer {self.name!r} has no width {p}; widths: {[q for q, _ in sizes]}")

    def in_channels(self, p: float) -> int:
        """``S_p``."""
        return self._size(self.in_sizes, p)

    def out_channels(self, p: float) -> int:
        """``T_p``."""
        return self._size(self.out_sizes, p)

    def groups(self, p: float) -> int:
        """``G_p = S_p / R₁``: the number of input-channel groups at width p."""
        return self.in_channels(p) // self.r1

    @property
    def kernel_positions(self) -> int:
        return self.kernel_size[0] * self.kernel_size[1]

    @property
    def basis_shape(self) -> tuple[int, int]:
        """``(R₁·k_h·k_w, R₂)``."""
        return (self.r1 * self.kernel_positions, self.r2)

    def coefficient_shape(self, p: float) -> tuple[int, int]:
        """``(R₂, G_p·T_p)``."""
        return (self.r2, self.groups(p) * self.out_channels(p))

    def weight_shape(self, p: float) -> tuple[int, ...]:
        t, s = self.out_channels(p), self.in_channels(p)
        return (t, s, *self.kernel_size) if self.kind == "conv2d" else (t, s)

    def basis_parameters(self) -> int:
        return math.prod(self.basis_shape)

    def coefficient_parameters(self, p: float) -> int:
        return math.prod(self.coefficient_shape(p))

    def dense_weight_parameters(self, p: float) -> int:
        return math.prod(self.weight_shape(p))


def _is_pointwise(module: nn.Module) -> bool:
    return isinstance(module, nn.Conv2d) and tuple(module.kernel_size) == (1, 1)


def composable_layers(model: nn.Module, compose_1x1: bool = False) -> list[str]:
    """Names of the layers FLANC composes: every ``Linear`` / ``Conv2d`` but the first and the last (see
    :func:`~subfl.models.factorized.decomposable_layers`), without 1×1 convolutions unless ``compose_1x1``."""
    modules = dict(model.named_modules())
    return [n for n in decomposable_layers(model) if compose_1x1 or not _is_pointwise(modules[n])]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def choose_r1(in_sizes: Sequence[int], r1: int | None = None, r1_fraction: float = R1_FRACTION,
              layer: str = "") -> int:
    """``R₁`` of a layer with input sizes ``in_sizes`` (one per width): ``r1`` if given (it must divide every
    size), else the largest divisor of ``gcd(in_sizes)`` not above ``max(1, round(r1_fraction · max(in_sizes)))``."""
    sizes = [int(s) for s in in_sizes]
    g = math.gcd(*sizes)
    if r1 is not None:
        if isinstance(r1, bool) or not isinstance(r1, numbers.Integral) or r1 < 1 or g % int(r1):
            raise ValueError(f"r1={r1!r} must be a positive integer dividing every input size of layer {layer!r} "
                             f"({sizes}); accepted: the divisors of {g}: {_divisors(g)}")
        return int(r1)
    target = max(1, math.floor(float(r1_fraction) * max(sizes) + 0.5))
    return max(d for d in _divisors(g) if d <= target)


def choose_r2(out_size: int, r1: int, kernel_positions: int, r2: int | None = None,
              r2_fraction: float = R2_FRACTION) -> int:
    """``R₂``: ``r2`` if given, else ``max(1, round(r2_fraction · out_size))`` (``out_size``: the widest ``T``);
    in both cases at most ``R₁·k_h·k_w`` (more bases than the basis dimension cannot be orthonormal)."""
    if r2 is not None:
        if isinstance(r2, bool) or not isinstance(r2, numbers.Integral) or r2 < 1:
            raise ValueError(f"r2 must be a positive integer or None, got {r2!r}")
        value = int(r2)
    else:
        value = max(1, math.floor(float(r2_fraction) * int(out_size) + 0.5))
    return min(value, int(r1) * int(kernel_positions))


R1_SCOPES = ("layer", "block")
"""Whose input sizes set a layer's ``R₁``: the layer's own, or its residual block's (see the module docstring)."""

_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


def residual_block_of(model: nn.Module, name: str) -> str:
    """The residual block holding layer ``name``: its innermost enclosing module that is neither the model itself
    nor a container (``nn.Sequential`` / ``ModuleList`` / ``ModuleDict``); ``""`` if there is none. In the CIFAR
    ResNet-18 ``"layer2.0.conv2"`` and ``"layer2.0.shortcut.0"`` are in ``"layer2.0"``; the FLANC CNN's and VGG's
    layers are in none."""
    parts = name.split(".")[:-1]
    while parts:
        candidate = ".".join(parts)
        if not isinstance(model.get_submodule(candidate), _CONTAINERS):
            return candidate
        parts.pop()
    return ""


def composition_plan(models: Mapping[float, nn.Module], *, r1: int | None = None, r2: int | None = None,
                     r1_fraction: float = R1_FRACTION, r2_fraction: float = R2_FRACTION,
                     compose_1x1: bool = False, r1_scope: str = "layer") -> dict[str, ComposedLayerSpec]:
    """The composed layers of a family of dense models, one per width p (``{p: build_model(width=w·p)}``).

    Every model must have the same composable layers (names, kinds, kernels); their weights give ``S_p``, ``T_p``.
    ``R₁``, ``R₂``: :func:`choose_r1`, :func:`choose_r2` per layer. ``r1_scope="block"`` computes ``R₁`` from the
    input sizes of the first composed layer of the layer's residual block (:func:`residual_block_of`) instead of
    its own, falling back to its own where that ``R₁`` does not divide all of them (see the module docstring).
    Raises ``ValueError`` if the family has no composable layer or its models differ in structure.
    """
    if not models:
        raise ValueError("models must hold at least one width")
    if r1_scope not in R1_SCOPES:
        raise ValueError(f"r1_scope must be one of {R1_SCOPES}, got {r1_scope!r}")
    widths = sorted(float(p) for p in models)
    by_width = {float(p): m for p, m in models.items()}
    names = composable_layers(by_width[widths[-1]], compose_1x1)
    if not names:
        raise ValueError("the model has no composable layer (FLANC composes every Linear / Conv2d but the first "
                         "and the last)")
    for p in widths:
        other = composable_layers(by_width[p], compose_1x1)
        if other != names:
            raise ValueError(f"the width-{p:g} model's composable layers differ from the widest model's: "
                             f"{sorted(set(other) ^ set(names))[:5]}")
    plan: dict[str, ComposedLayerSpec] = {}
    block_inputs: dict[str, list[int]] = {}  # residual block -> input sizes of its first composed layer
    for name in names:
        mods = {p: by_width[p].get_submodule(name) for p in widths}
        widest = mods[widths[-1]]
        kind = "conv2d" if isinstance(widest, nn.Conv2d) else "linear"
        kernel = tuple(int(k) for k in widest.kernel_size) if kind == "conv2d" else (1, 1)
        ins = tuple((p, int(m.weight.shape[1])) for p, m in mods.items())
        outs = tuple((p, int(m.weight.shape[0])) for p, m in mods.items())
        for p, m in mods.items():
            k = tuple(int(x) for x in m.kernel_size) if isinstance(m, nn.Conv2d) else (1, 1)
            if k != kernel or isinstance(m, nn.Conv2d) != (kind == "conv2d"):
                raise ValueError(f"layer {name!r} differs in kind or kernel between widths")
        a = choose_r1([s for _, s in ins], r1, r1_fraction, name)
        block = residual_block_of(by_width[widths[-1]], name) if r1_scope == "block" and r1 is None else ""
        if block:
            source = block_inputs.setdefault(block, [s for _, s in ins])
            shared = choose_r1(source, None, r1_fraction, name)
            if all(s % shared == 0 for _, s in ins):
                a = shared
        b = choose_r2(outs[-1][1], a, kernel[0] * kernel[1], r2, r2_fraction)
        plan[name] = ComposedLayerSpec(name, kind, kernel, a, b, ins, outs, widest.bias is not None)
    return plan


# --------------------------------------------------------------------------------------------------
# composed modules
# --------------------------------------------------------------------------------------------------
class _Composed(nn.Module):
    """Parameters ``basis`` ``(R₁k_hk_w, R₂)``, ``coefficients`` ``(R₂, G·T)`` and an optional ``bias`` ``(T,)``."""

    def _setup(self, in_channels: int, out_channels: int, kernel_size: tuple[int, int], r1: int, r2: int,
               bias: bool) -> None:
        if in_channels % r1:
            raise ValueError(f"R1={r1} does not divide in_channels={in_channels}")
        self.in_channels, self.out_channels, self.kernel_size = int(in_channels), int(out_channels), kernel_size
        self.r1, self.r2 = int(r1), int(r2)
        self.groups_of_r1 = self.in_channels // self.r1
        self.basis = nn.Parameter(torch.zeros(self.r1 * kernel_size[0] * kernel_size[1], self.r2))
        self.coefficients = nn.Parameter(torch.zeros(self.r2, self.groups_of_r1 * self.out_channels))
        if bias:
            self.bias = nn.Parameter(torch.zeros(self.out_channels))
        else:
            self.register_parameter("bias", None)

    def extra_repr(self) -> str:
        return (f"{self.in_channels} -> {self.out_channels}, kernel={self.kernel_size}, R1={self.r1}, R2={self.r2}, "
                f"groups={self.groups_of_r1}, bias={self.bias is not None}")


class ComposedConv2d(_Composed):
    """A ``Conv2d`` whose kernel is :func:`compose_weight` ``(basis, coefficients)`` (same stride / padding /
    dilation as the dense layer it replaces)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | Sequence[int], r1: int, r2: int, *,
                 stride=1, padding=0, dilation=1, bias: bool = False) -> None:
        super().__init__()
        self._setup(in_channels, out_channels, _pair(kernel_size), r1, r2, bias)
        self.stride, self.padding, self.dilation = stride, padding, dilation

    def weight(self) -> torch.Tensor:
        """The composed kernel ``W_p`` ``(T, S, k_h, k_w)``."""
        return compose_weight(self.basis, self.coefficients, self.out_channels, self.in_channels, self.kernel_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, self.weight(), self.bias, self.stride, self.padding, self.dilation)


class ComposedLinear(_Composed):
    """A ``Linear`` layer whose matrix is :func:`compose_weight` ``(basis, coefficients)`` (``k = 1``)."""

    def __init__(self, in_features: int, out_features: int, r1: int, r2: int, *, bias: bool = True) -> None:
        super().__init__()
        self._setup(in_features, out_features, (1, 1), r1, r2, bias)

    def weight(self) -> torch.Tensor:
        """The composed matrix ``W_p`` ``(T, S)``."""
        return compose_weight(self.basis, self.coefficients, self.out_channels, self.in_channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight(), self.bias)


def _set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, module)


def compose_model(model: nn.Module, ranks: Mapping[str, tuple[int, int]]) -> nn.Module:
    """Replace, **in place**, each dense layer named in ``ranks`` by its composed version with ``(R₁, R₂)``.

    The new ``basis`` / ``coefficients`` are zeros (fill them with ``load_state_dict``); a dense bias is copied.
    Returns ``model``. Its ``state_dict`` then holds ``f"{name}.basis"`` and ``f"{name}.coefficients"`` instead of
    ``f"{name}.weight"``.
    """
    for name, (r1, r2) in ranks.items():
        dense = model.get_submodule(name)
        if isinstance(dense, nn.Conv2d):
            if dense.groups != 1 or dense.padding_mode != "zeros":
                raise ValueError(f"layer {name!r}: only Conv2d with groups=1 and zero padding can be composed")
            new: _Composed = ComposedConv2d(dense.in_channels, dense.out_channels, tuple(dense.kernel_size), r1, r2,
                                            stride=dense.stride, padding=dense.padding, dilation=dense.dilation,
                                            bias=dense.bias is not None)
        elif isinstance(dense, nn.Linear):
            new = ComposedLinear(dense.in_features, dense.out_features, r1, r2, bias=dense.bias is not None)
        else:
            raise ValueError(f"layer {name!r} is a {type(dense).__name__}; accepted: nn.Conv2d, nn.Linear")
        new = new.to(dense.weight.device, dense.weight.dtype)
        if dense.bias is not None:
            with torch.no_grad():
                new.bias.copy_(dense.bias)
        _set_submodule(model, name, new)
    return model


def compose_from_tensors(model: nn.Module, tensors: Mapping[str, torch.Tensor]) -> nn.Module:
    """Compose, in place, every layer ``name`` of ``model`` for which ``tensors`` holds ``f"{name}.basis"``,
    reading ``R₂`` (columns) and ``R₁`` (rows / kernel positions) from that basis — what a client does with the
    tensors it received."""
    suffix = "." + BASIS
    ranks: dict[str, tuple[int, int]] = {}
    for key, value in tensors.items():
        if not key.endswith(suffix):
            continue
        name = key[: -len(suffix)]
        try:
            dense = model.get_submodule(name)
        except AttributeError:
            raise ValueError(f"tensor {key!r} names no layer of the model") from None
        positions = math.prod(dense.kernel_size) if isinstance(dense, nn.Conv2d) else 1
        if value.dim() != 2 or value.shape[0] % positions:
            raise ValueError(f"basis {key!r} of shape {tuple(value.shape)} does not fit layer {name!r}")
        ranks[name] = (int(value.shape[0]) // positions, int(value.shape[1]))
    return compose_model(model, ranks)


def composed_modules(model: nn.Module) -> dict[str, _Composed]:
    """The composed layers of ``model`` by name, in registration order."""
    return {name: m for name, m in model.named_modules() if isinstance(m, _Composed)}


def split_state(state: Mapping[str, torch.Tensor], layers: Iterable[str],
                ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """``(bases, coefficients, others)`` of a composed model's state (or a dense model's state, whose composed
    layers' ``weight`` is then dropped): bases ``f"{l}.basis"``, coefficients ``f"{l}.coefficients"``, and every
    other tensor (biases of composed layers, norms, non-composed layers)."""
    layers = list(layers)
    basis_keys = {f"{l}.{BASIS}" for l in layers}
    coeff_keys = {f"{l}.{COEFFICIENTS}" for l in layers}
    dropped = {f"{l}.weight" for l in layers}
    bases, coefficients, others = {}, {}, {}
    for key, value in state.items():
        if key in basis_keys:
            bases[key] = value
        elif key in coeff_keys:
            coefficients[key] = value
        elif key not in dropped:
            others[key] = value
    return bases, coefficients, others


# --------------------------------------------------------------------------------------------------
# initialisation
# --------------------------------------------------------------------------------------------------
def init_bases(plan: Mapping[str, ComposedLayerSpec], generator: torch.Generator | None = None,
               ) -> dict[str, torch.Tensor]:
    """Orthonormal bases ``{f"{layer}.basis": V}`` (:func:`orthonormal_columns`, as the released code's
    orthogonal initialisation of the filter banks): Eq. (3)'s penalty starts at 0."""
    return {f"{name}.{BASIS}": orthonormal_columns(*spec.basis_shape, generator=generator)
            for name, spec in plan.items()}


def init_coefficients(plan: Mapping[str, ComposedLayerSpec], p: float, generator: torch.Generator | None = None,
                      ) -> dict[str, torch.Tensor]:
    """Coefficients ``{f"{layer}.coefficients": U_p}``, uniform in ``±b`` with ``b = sqrt(R₁k_hk_w / (R₂ · fan_in))``.

    ``fan_in = S_p·k_h·k_w``. With orthonormal basis columns the composed ``W_p = V U_p`` then has, on average,
    the per-entry variance ``1 / (3·fan_in)`` of PyTorch's default initialisation of the dense layer (the rows of
    ``V`` have mean squared norm ``R₂ / (R₁k_hk_w)``), so a composed model starts at the scale of the dense one.
    """
    out = {}
    for name, spec in plan.items():
        fan_in = spec.in_channels(p) * spec.kernel_positions
        bound = math.sqrt(spec.r1 * spec.kernel_positions / (spec.r2 * fan_in))
        u = (torch.rand(spec.coefficient_shape(p), generator=generator, dtype=torch.float64) * 2 - 1) * bound
        out[f"{name}.{COEFFICIENTS}"] = u.to(torch.float32)
    return out


# --------------------------------------------------------------------------------------------------
# the FLANC CNN and composed model families
# --------------------------------------------------------------------------------------------------
class FlancCNN(nn.Module):
    """The Fashion-MNIST CNN of FLANC's released code (``cnn_flanc``), at width multiplier ``width``.

    ``head: conv3×3(C → 64w, bias) → conv1: conv3×3(64w → 128w) → [norm] → ReLU → maxpool 2 → conv2:
    conv3×3(128w → 128w) → [norm] → ReLU → maxpool 2 → flatten → classifier: Linear(128w·⌊H/4⌋·⌊W/4⌋ →
    num_classes)`` — four weight layers. As in the released code there is no activation between the head and
    ``conv1``, and ``conv1`` / ``conv2`` (the composed layers) have no bias. One departure: the released head
    keeps 64 channels at every width; here every hidden size scales with the width (the library's one rule,
    :func:`~subfl.models.norm.scaled_channels`), so the head is a width-p layer like the others. That departure
    is what separates FLANC's Table 1 Fashion-MNIST column from this model's: with the released 64-channel head a
    client of width ¼ / ½ / ¾ / 1 exchanges 33,482 / 63,498 / 97,610 / 135,818 parameters (printed 33K / 63K / 98K /
    136K), with the scaled head 26,858 / 54,986 / 91,306 / 135,818 (:mod:`subfl.costs.flanc_payload`).

    At width 1 on 1×28×28 inputs: 284,554 parameters (head 640, conv1 73,728, conv2 147,456, classifier 62,730).
    """

    def __init__(self, num_classes: int, input_shape: tuple[int, ...] = (1, 28, 28), *, width: float = 1.0,
                 norm: str = "none") -> None:
        super().__init__()
        num_classes, (in_channels, height, width_px), width = check_image_model_args(
            num_classes, input_shape, width, norm, min_size=4, why="two 2x2 max-pools")
        self.width, self.norm = width, norm
        c0, c1, c2 = scaled_channels(64, width), scaled_channels(128, width), scaled_channels(128, width)
        self.head = nn.Conv2d(in_channels, c0, kernel_size=3, padding=1, bias=True)
        self.conv1 = nn.Conv2d(c0, c1, kernel_size=3, padding=1, bias=False)
        self.norm1 = make_norm(norm, c1)
        self.conv2 = nn.Conv2d(c1, c2, kernel_size=3, padding=1, bias=False)
        self.norm2 = make_norm(norm, c2)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(kernel_size=2, stride=2)
        self.classifier = nn.Linear(c2 * (height // 4) * (width_px // 4), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.head(x)
        x = self.pool(self.relu(self.norm1(self.conv1(x))))
        x = self.pool(self.relu(self.norm2(self.conv2(x))))
        return self.classifier(torch.flatten(x, 1))


LOCAL_MODELS = {"flanc_cnn": FlancCNN}
"""Dense models defined here (not yet in :data:`~subfl.models.MODELS`), by name."""


def build_dense_model(name: str, *, num_classes: int, input_shape: tuple[int, ...], width: float = 1.0,
                      norm: str | None = None, **options) -> nn.Module:
    """:func:`~subfl.models.build_model`, plus ``"flanc_cnn"`` (:class:`FlancCNN`, default norm ``"none"``).

    (``build_model`` is imported here, not at module level, so that :mod:`subfl.models.registry` can import
    :class:`FlancCNN` from this module without an import cycle.)
    """
    from .registry import build_model

    if name in LOCAL_MODELS:
        if options:
            raise ValueError(f"model {name!r} accepts no options, got {sorted(options)}")
        return LOCAL_MODELS[name](num_classes, input_shape, width=width, norm="none" if norm is None else norm)
    return build_model(name, num_classes=num_classes, input_shape=input_shape, width=width, norm=norm, **options)


def build_composed_models(name: str, widths: Sequence[float] = (0.25, 0.5, 0.75, 1.0), *, num_classes: int,
                          input_shape: tuple[int, ...], width: float = 1.0, norm: str | None = None,
                          r1: int | None = None, r2: int | None = None, r1_fraction: float = R1_FRACTION,
                          r2_fraction: float = R2_FRACTION, compose_1x1: bool = False, r1_scope: str = "layer",
                          generator: torch.Generator | None = None, **options,
                          ) -> tuple[dict[float, nn.Module], dict[str, ComposedLayerSpec]]:
    """The all-in-one family: a composed p-width model for every ``p`` of ``widths`` whose composed layers share
    the **same** ``basis`` parameters (one ``nn.Parameter`` per layer, orthonormal init), each with its own
    coefficients (:func:`init_coefficients`) and dense tensors. Returns ``({p: model}, plan)``.

    For analysis and centralised use (e.g. parameter counts); the federated method keeps one copy of each basis
    on the server and sends it to every client instead.
    """
    dense = {float(p): build_dense_model(name, num_classes=num_classes, input_shape=input_shape,
                                         width=round(float(width) * float(p), 12), norm=norm, **options)
             for p in sorted(widths)}
    plan = composition_plan(dense, r1=r1, r2=r2, r1_fraction=r1_fraction, r2_fraction=r2_fraction,
                            compose_1x1=compose_1x1, r1_scope=r1_scope)
    shared = {k: nn.Parameter(v) for k, v in init_bases(plan, generator).items()}
    models = {}
    for p, model in dense.items():
        compose_model(model, {n: (s.r1, s.r2) for n, s in plan.items()})
        coefficients = init_coefficients(plan, p, generator)
        for layer_name, module in composed_modules(model).items():
            module.basis = shared[f"{layer_name}.{BASIS}"]
            with torch.no_grad():
                module.coefficients.copy_(coefficients[f"{layer_name}.{COEFFICIENTS}"])
        models[p] = model
    return models, plan
