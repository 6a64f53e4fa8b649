"""Factorized (spectral) layers: a layer held as a sum of rank-one terms, and sub-models made of some terms.

Both spectral papers of the book (PriSM, Niu et al., TMLR 2023; spectral sharding, Korzhenkov & Louizos,
NeurIPS 2024) write the weight of a layer through its singular value decomposition

    W = U diag(λ) Vᵀ = Σ_{i<N} λ_i u_i v_iᵀ,        N = min(n, m),

and absorb the singular values symmetrically into the vectors, ``u'_i = √λ_i u_i`` and ``v'_i = √λ_i v_i``,
so that ``W = Σ_i u'_i v'_iᵀ = U' V'`` with ``U'`` of shape ``(n, N)`` and ``V'`` of shape ``(N, m)``.

Which layers. Every :class:`~torch.nn.Linear` and every :class:`~torch.nn.Conv2d` (``groups=1``, zero
padding) of a model is decomposable, **except the first and the last of them** in registration order (which
is forward order for every model of :mod:`subfl.models`): the stem convolution / input layer and the
classifier stay dense, as in both papers. Linear layers inside :class:`~torch.nn.MultiheadAttention` are
left alone (their weights are read directly by the attention kernel, not through ``forward``). The 1×1
projection shortcuts of ResNet are convolutions and are decomposed like the others.

Shapes. A linear layer ``n × m`` is its own matrix. A ``k_h × k_w`` convolution with ``n`` outputs and ``C``
inputs is the matrix ``W.reshape(n, C·k_h·k_w)``. A sub-model with term set ``S`` (``|S| = k``) and frozen
multipliers ``ω_S`` computes ``Σ_{i∈S} ω_i u'_i v'_iᵀ``:

* linear: ``x ↦ U'_S ((V'_S x) ⊙ ω_S) + b``;
* convolution: a ``k_h × k_w`` convolution with ``k`` outputs (weights ``V'_S`` reshaped to ``(k, C, k_h, k_w)``,
  same stride / padding / dilation, no bias), the channels multiplied by ``ω_S``, then a 1×1 convolution
  ``k → n`` with weights ``U'_S`` and the layer's bias. Multiplying the ``k`` channels by ``ω`` is the same as
  using the 1×1 weights ``U'_S ⊙ ω_S`` (same outputs and same gradients for ``U'`` and ``V'``).

``ω`` is a non-persistent buffer (``omega``): it is not trainable, not in ``state_dict()`` and therefore never
uploaded; the trainable parameters of a factorized layer are ``u`` (``(n, k)``), ``v`` (``(k, m)`` or
``(k, C, k_h, k_w)``) and ``bias``.

Main entry points: :func:`decomposable_layers`, :func:`layer_specs`, :func:`decompose` /
:func:`decompose_weights` (server-side SVD, ``torch.linalg.svd`` in float64), :func:`term_tensors` (what a
client receives for a term set), :func:`factorize` (turn a dense model into a factorized one, in place),
:func:`build_submodel`, :func:`read_factors` and :func:`dense_weight` (rebuild ``W = U' V'``).
"""
from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

__all__ = [
    "FactorizedConv2d",
    "FactorizedLinear",
    "LayerSpec",
    "SpectralFactors",
    "build_submodel",
    "decomposable_layers",
    "decompose",
    "decompose_weights",
    "dense_weight",
    "factorize",
    "factorized_modules",
    "layer_specs",
    "read_factors",
    "set_omega",
    "svd_factors",
    "term_tensors",
]


# --------------------------------------------------------------------------------------------------
# which layers, and their shapes
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LayerSpec:
    """A decomposable layer: its name in the model, kind, and the shape of its weight matrix ``(n, m)``.

    ``weight_shape`` is the dense weight's shape (``(n, m)`` or ``(n, C, k_h, k_w)``); ``conv`` holds the
    convolution's ``stride``, ``padding`` and ``dilation`` (empty for linear layers).
    """

    name: str
    kind: str  # "linear" or "conv2d"
    weight_shape: tuple[int, ...]
    bias: bool
    conv: tuple[tuple[str, object], ...] = ()

    @property
    def out_features(self) -> int:
        """``n``: rows of the weight matrix (output features / channels)."""
        return int(self.weight_shape[0])

    @property
    def in_features(self) -> int:
        """``m``: columns of the weight matrix (``C·k_h·k_w`` for a convolution)."""
        return int(math.prod(self.weight_shape[1:]))

    @property
    def num_terms(self) -> int:
        """``N = min(n, m)``: the number of rank-one terms of the SVD."""
        return min(self.out_features, self.in_features)

    def v_shape(self, rank: int) -> tuple[int, ...]:
        """Shape of the ``v`` parameter of a factorized layer with ``rank`` terms."""
        return (int(rank), *self.weight_shape[1:])

    def factorized_parameters(self, rank: int) -> int:
        """Parameters of the factorized layer with ``rank`` terms: ``rank·(n + m)`` (+ ``n`` for the bias)."""
        return int(rank) * (self.out_features + self.in_features) + (self.out_features if self.bias else 0)

    def dense_parameters(self) -> int:
        """Parameters of the dense layer: ``n·m`` (+ ``n`` for the bias)."""
        return self.out_features * self.in_features + (self.out_features if self.bias else 0)


def _is_decomposable(module: nn.Module) -> bool:
    if isinstance(module, nn.Linear):
        return True
    if isinstance(module, nn.Conv2d):
        return module.groups == 1 and module.padding_mode == "zeros"
    return False


def _candidate_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Linear / Conv2d modules in registration order, excluding those owned by MultiheadAttention."""
    inside_attention: set[int] = set()
    for module in model.modules():
        if isinstance(module, nn.MultiheadAttention):
            inside_attention.update(id(m) for m in module.modules())
    return [(name, m) for name, m in model.named_modules()
            if isinstance(m, (nn.Linear, nn.Conv2d)) and id(m) not in inside_attention]


def decomposable_layers(model: nn.Module) -> list[str]:
    """Names of the layers of ``model`` that are held factorized: every Linear / Conv2d but the first and last.

    Layers are taken in registration order (forward order for the models of :mod:`subfl.models`). A
    convolution with ``groups > 1`` or non-zero padding mode stays dense, as do linear layers inside
    :class:`~torch.nn.MultiheadAttention`. A model with fewer than three such layers has none.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    layers = _candidate_layers(model)
    return [name for name, m in layers[1:-1] if _is_decomposable(m)]


def layer_specs(model: nn.Module, layers: Sequence[str] | None = None) -> dict[str, LayerSpec]:
    """The :class:`LayerSpec` of each decomposable layer (default: :func:`decomposable_layers`), in order."""
    modules = dict(model.named_modules())
    names = decomposable_layers(model) if layers is None else list(layers)
    specs: dict[str, LayerSpec] = {}
    for name in names:
        if name not in modules:
            raise ValueError(f"layer {name!r} is not a module of the model; decomposable layers: "
                             f"{decomposable_layers(model)}")
        m = modules[name]
        if not _is_decomposable(m):
            raise ValueError(f"layer {name!r} ({type(m).__name__}) cannot be factorized; accepted: nn.Linear and "
                             f"nn.Conv2d with groups=1 and padding_mode='zeros'")
        if isinstance(m, nn.Conv2d):
            conv = (("stride", tuple(m.stride)), ("padding", m.padding if isinstance(m.padding, str)
                                                          else tuple(m.padding)),
                    ("dilation", tuple(m.dilation)))
            specs[name] = LayerSpec(name, "conv2d", tuple(m.weight.shape), m.bias is not None, conv)
        else:
            specs[name] = LayerSpec(name, "linear", tuple(m.weight.shape), m.bias is not None)
    return specs


# --------------------------------------------------------------------------------------------------
# server side: SVD and reconstruction
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SpectralFactors:
    """``W = U' V'`` with ``U' = U diag(√λ)`` ``(n, N)``, ``V' = diag(√λ) Vᵀ`` ``(N, m)``, ``λ`` decreasing ``(N,)``."""

    u: torch.Tensor
    v: torch.Tensor
    singular_values: torch.Tensor

    @property
    def num_terms(self) -> int:
        return int(self.singular_values.numel())


def svd_factors(matrix: torch.Tensor) -> SpectralFactors:
    """Thin SVD of an ``(n, m)`` matrix with the singular values absorbed as ``√λ`` into both sides.

    Computed with ``torch.linalg.svd(full_matrices=False)`` in float64 on the CPU and returned in the
    matrix's dtype, so ``U' V'`` reproduces the matrix to float32 rounding.
    """
    if not isinstance(matrix, torch.Tensor) or matrix.dim() != 2:
        raise ValueError(f"matrix must be a 2-D tensor, got {type(matrix).__name__} "
                         f"{tuple(getattr(matrix, 'shape', ()))}")
    dtype = matrix.dtype if matrix.is_floating_point() else torch.float32
    u, lam, vh = torch.linalg.svd(matrix.detach().to("cpu", torch.float64), full_matrices=False)
    root = lam.clamp_min(0).sqrt()
    return SpectralFactors((u * root).to(dtype).contiguous(), (root[:, None] * vh).to(dtype).contiguous(),
                           lam.to(dtype))


def decompose_weights(weights: Mapping[str, torch.Tensor], specs: Mapping[str, LayerSpec],
                      factors: Callable[[torch.Tensor], SpectralFactors] | None = None,
                      ) -> dict[str, SpectralFactors]:
    """``factors`` (default :func:`svd_factors`; e.g. a solver of :mod:`subfl.models.spectral_refresh`) of
    ``weights[f"{name}.weight"]`` reshaped to ``(n, m)``, for every layer of ``specs``."""
    factors = svd_factors if factors is None else factors
    out: dict[str, SpectralFactors] = {}
    for name, spec in specs.items():
        key = f"{name}.weight"
        if key not in weights:
            raise ValueError(f"weights lack {key!r} (layer {name!r} is decomposed)")
        w = weights[key]
        if tuple(w.shape) != spec.weight_shape:
            raise ValueError(f"{key} has shape {tuple(w.shape)}, expected {spec.weight_shape}")
        out[name] = factors(w.reshape(spec.out_features, spec.in_features))
    return out


def decompose(model: nn.Module, layers: Sequence[str] | None = None) -> dict[str, SpectralFactors]:
    """SVD factors of every decomposable layer of a dense ``model`` (default: :func:`decomposable_layers`)."""
    specs = layer_specs(model, layers)
    return decompose_weights({f"{n}.weight": dict(model.named_modules())[n].weight for n in specs}, specs)


def dense_weight(u: torch.Tensor, v: torch.Tensor, shape: Sequence[int] | LayerSpec) -> torch.Tensor:
    """Rebuild the dense weight ``W = Σ_i u'_i v'_iᵀ = U' V'`` (computed in float64) in the layer's ``shape``.

    ``u``: ``(n, k)``; ``v``: ``(k, m)`` or ``(k, C, k_h, k_w)``.
    """
    shape = shape.weight_shape if isinstance(shape, LayerSpec) else tuple(int(s) for s in shape)
    v2 = v.reshape(v.shape[0], -1)
    if u.dim() != 2 or u.shape[1] != v2.shape[0]:
        raise ValueError(f"u {tuple(u.shape)} and v {tuple(v.shape)} do not hold the same number of terms")
    w = u.detach().to(torch.float64) @ v2.detach().to(torch.float64)
    if math.prod(w.shape) != math.prod(shape):
        raise ValueError(f"U'V' has shape {tuple(w.shape)}, which does not fit the weight shape {shape}")
    return w.to(u.dtype).reshape(shape)


def term_tensors(factors: SpectralFactors, indices: Sequence[int] | np.ndarray | torch.Tensor,
                 spec: LayerSpec) -> dict[str, torch.Tensor]:
    """``{"u": U'[:, S], "v": V'[S]}`` in the shapes of a factorized layer's parameters (copies)."""
    idx = torch.as_tensor(np.asarray(indices, dtype=np.int64))
    if idx.dim() != 1 or idx.numel() == 0:
        raise ValueError(f"indices must be a non-empty 1-D index set, got shape {tuple(idx.shape)}")
    if int(idx.min()) < 0 or int(idx.max()) >= factors.num_terms:
        raise ValueError(f"indices must lie in [0, {factors.num_terms}), got {idx.tolist()}")
    if torch.unique(idx).numel() != idx.numel():
        raise ValueError(f"indices must be distinct, got {idx.tolist()}")
    return {"u": factors.u[:, idx].clone(), "v": factors.v[idx].reshape(spec.v_shape(idx.numel())).clone()}


# --------------------------------------------------------------------------------------------------
# factorized modules
# --------------------------------------------------------------------------------------------------
class _Factorized(nn.Module):
    """Shared parts: parameters ``u`` ``(n, k)``, ``v``, optional ``bias`` and the frozen buffer ``omega``."""

    spec: LayerSpec

    def _setup(self, spec: LayerSpec, rank: int) -> None:
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 1 <= rank <= spec.num_terms:
            raise ValueError(f"rank of layer {spec.name!r} must be an integer in [1, {spec.num_terms}], got {rank!r}")
        self.spec = spec
        self.rank = int(rank)
        self.u = nn.Parameter(torch.zeros(spec.out_features, self.rank))
        self.v = nn.Parameter(torch.zeros(spec.v_shape(self.rank)))
        if spec.bias:
            self.bias = nn.Parameter(torch.zeros(spec.out_features))
        else:
            self.register_parameter("bias", None)
        self.register_buffer("omega", torch.ones(self.rank), persistent=False)

    def extra_repr(self) -> str:
        return f"{self.spec.in_features} -> rank {self.rank} -> {self.spec.out_features}, bias={self.spec.bias}"

    def dense_weight(self) -> torch.Tensor:
        """``Σ_{i∈S} ω_i u'_i v'_iᵀ`` in the dense layer's weight shape."""
        return dense_weight(self.u * self.omega, self.v, self.spec)


class FactorizedLinear(_Factorized):
    """``x ↦ U'((V' x) ⊙ ω) + b``: a linear layer as ``k`` rank-one terms with frozen multipliers ``ω``."""

    def __init__(self, spec: LayerSpec, rank: int) -> None:
        super().__init__()
        if spec.kind != "linear":
            raise ValueError(f"FactorizedLinear needs a linear layer spec, got kind={spec.kind!r}")
        self._setup(spec, rank)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(F.linear(x, self.v) * self.omega, self.u, self.bias)


class FactorizedConv2d(_Factorized):
    """A ``k_h × k_w`` convolution with ``k`` outputs (weights ``V'``), channels scaled by ``ω``, then a 1×1
    convolution ``k → n`` (weights ``U'``) with the layer's bias."""

    def __init__(self, spec: LayerSpec, rank: int) -> None:
        super().__init__()
        if spec.kind != "conv2d":
            raise ValueError(f"FactorizedConv2d needs a conv2d layer spec, got kind={spec.kind!r}")
        self._setup(spec, rank)
        conv = dict(spec.conv)
        self.stride, self.padding, self.dilation = conv["stride"], conv["padding"], conv["dilation"]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.conv2d(x, self.v, None, self.stride, self.padding, self.dilation)
        h = h * self.omega.view(1, -1, 1, 1)
        return F.conv2d(h, self.u[:, :, None, None], self.bias)


def _factorized_module(spec: LayerSpec, rank: int) -> _Factorized:
    return FactorizedConv2d(spec, rank) if spec.kind == "conv2d" else FactorizedLinear(spec, rank)


def _set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, module)


def factorize(model: nn.Module, ranks: Mapping[str, int]) -> nn.Module:
    """Replace, **in place**, each dense layer named in ``ranks`` by a factorized layer with that many terms.

    The new layers' ``u``, ``v`` are zeros and ``omega`` ones (fill them with ``load_state_dict`` /
    :func:`set_omega`); a dense bias is copied. Returns ``model``. Layer names must be decomposable layers of
    the dense model (:func:`decomposable_layers`) but need not be all of them.
    """
    allowed = set(decomposable_layers(model))
    unknown = sorted(set(ranks) - allowed)
    if unknown:
        raise ValueError(f"cannot factorize {unknown}: not decomposable layers of the model; "
                         f"accepted: {sorted(allowed)}")
    specs = layer_specs(model, list(ranks))
    for name, spec in specs.items():
        dense = model.get_submodule(name)
        new = _factorized_module(spec, ranks[name]).to(dense.weight.device, dense.weight.dtype)
        if spec.bias:
            with torch.no_grad():
                new.bias.copy_(dense.bias)
        _set_submodule(model, name, new)
    return model


def factorized_modules(model: nn.Module) -> dict[str, _Factorized]:
    """The factorized layers of ``model`` by name, in registration order."""
    return {name: m for name, m in model.named_modules() if isinstance(m, _Factorized)}


def set_omega(model: nn.Module, omegas: Mapping[str, torch.Tensor | Sequence[float]]) -> None:
    """Set the frozen multipliers ``ω`` of factorized layers (one value per term, in the layer's term order)."""
    layers = factorized_modules(model)
    for name, omega in omegas.items():
        if name not in layers:
            raise ValueError(f"{name!r} is not a factorized layer; factorized layers: {list(layers)}")
        m = layers[name]
        value = torch.as_tensor(omega, dtype=m.omega.dtype).reshape(-1)
        if value.numel() != m.rank:
            raise ValueError(f"omega of layer {name!r} must have {m.rank} entries, got {value.numel()}")
        m.omega = value.to(m.omega.device).clone()


def build_submodel(model: nn.Module, factors: Mapping[str, SpectralFactors],
                   indices: Mapping[str, Sequence[int]],
                   omegas: Mapping[str, Sequence[float] | torch.Tensor] | None = None) -> nn.Module:
    """A factorized copy of the dense ``model`` holding the terms ``indices[name]`` of each layer.

    ``factors``: the SVD of the layers (:func:`decompose`); ``indices``: term set ``S`` per decomposed layer
    (layers not listed stay dense); ``omegas``: the multipliers ``ω_S`` in the order of ``indices`` (default 1).
    Every other tensor (first / last layers, norms, biases) is copied from ``model``; ``model`` is unchanged.
    With every index and ``ω = 1`` the sub-model computes the dense model's function (to float rounding).
    """
    sub = copy.deepcopy(model)
    specs = layer_specs(model, list(indices))
    factorize(sub, {name: len(idx) for name, idx in indices.items()})
    layers = factorized_modules(sub)
    with torch.no_grad():
        for name, idx in indices.items():
            if name not in factors:
                raise ValueError(f"no factors for layer {name!r}")
            t = term_tensors(factors[name], idx, specs[name])
            layers[name].u.copy_(t["u"])
            layers[name].v.copy_(t["v"])
    if omegas:
        set_omega(sub, omegas)
    return sub


def read_factors(model: nn.Module) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The (trained) ``(U'_S (n, k), V'_S (k, m))`` of every factorized layer of ``model`` (detached copies)."""
    return {name: (m.u.detach().clone(), m.v.detach().reshape(m.rank, -1).clone())
            for name, m in factorized_modules(model).items()}
