"""Width-sliced sub-models: which entries of a global ``state_dict`` a narrower copy of the network holds.

A *p-width sub-model* is the same architecture built at width multiplier ``w·p`` (``w``: the global model's
width, ``p``: the client's keep ratio, :attr:`~subfl.fl.types.ClientProfile.keep_ratio`). Every hidden
layer keeps a subset of its units on its output side *and* on its input side; the network's input channels
and the classifier's outputs are never sliced. Used by HeteroFL, FjORD and FedRolex
(:mod:`subfl.methods.width`) and reusable by any method that trains width-sliced parts (FLANC, ...).

Sizes. A sub-model's layer sizes come from building it (``model_fn(width=w·p)``), i.e. from the library's one
construction rule :func:`~subfl.models.norm.scaled_channels`: a layer of base size ``b`` has
``max(1, floor(w·p·b + 1/2))`` units (round half up). The papers keep ``floor(p·K)`` of a global layer's
``K = scaled_channels(b, w)`` units (HeteroFL and FedRolex's code use ``ceil``); all of these coincide
whenever ``w·b`` and ``w·p·b`` are integers, e.g. at ``w = 1`` for ``p`` in {1/4, 1/2, 3/4, 1} and base sizes that
are multiples of 4 (the 32/64/512 of the FedAvg CNN, the 64…512 of ResNet-18 / VGG-11, the 200 of the MLP),
and for ``p`` in {1/8, 1/16} when the base sizes are multiples of 16. The functions here never assume a
rule: they read both sets of shapes, and a dimension is *sliced* when the sub-model's size is smaller.

Index sets. For a sliced dimension of global size ``K`` and sub-size ``k`` the kept indices are

* the **leading slice** ``{0, …, k-1}`` (HeteroFL, FjORD's ordered dropout), or
* a **rolling window** ``{(s + i) mod K : i < k}`` (FedRolex; CAFF appendix, Eqs. 8–9), with the same
  offset rule for every layer, so that the output units of a layer, the input units of the next one, the
  BatchNorm entries between them and both sides of a residual connection select the same channels.
  ``s`` may be an int (the same for all layers) or a function ``(K, k) -> s``.

The flatten → linear boundary (the FedAvg CNN, :class:`~subfl.models.cnn.FedAvgCNN`): a convolution with
``C`` output channels on an ``H×W`` map is flattened channel-major into ``C·HW`` features, so the input
indices of the following linear layer for the channel set ``S`` are ``{c·HW + j : c ∈ S, j < HW}``.
``HW`` is derived from shapes (:func:`flatten_boundaries`): a 2-d weight whose input size is a multiple
``HW > 1`` of the output channels of the convolution just before it in the ``state_dict``.

BatchNorm buffers: ``running_mean`` / ``running_var`` are sliced like the channels (their shapes say so);
``num_batches_tracked`` is a scalar and is never sliced.

An index set of one tensor is a tuple with one entry per dimension: ``None`` (dimension kept whole) or a
1-d ``int64`` tensor of global indices. :func:`extract` reads a sub-model state from a global one;
:func:`scatter` writes it back; :func:`scatter_add` / :func:`average_slices` aggregate many of them, each
entry averaged over the clients that actually hold it (entries nobody holds keep the server's value).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Union

import torch

ShapeLike = Union[torch.Tensor, torch.Size, Sequence[int]]
IndexSet = tuple[Union[torch.Tensor, None], ...]
"""Per-dimension global indices of one tensor (``None``: the dimension is not sliced)."""
SliceIndices = dict[str, IndexSet]
"""Index sets of every tensor of a ``state_dict``, by name."""
Offset = Union[int, Callable[[int, int], int]]
"""A rolling window's start: one int for every layer, or a function of (global size K, sub-size k)."""


def state_shapes(state: Mapping[str, ShapeLike]) -> dict[str, tuple[int, ...]]:
    """The shape of every entry of ``state`` (tensors, ``torch.Size`` or tuples of ints) as tuples."""
    out = {}
    for name, value in state.items():
        shape = value.shape if isinstance(value, torch.Tensor) else value
        out[name] = tuple(int(s) for s in shape)
    return out


def window(size: int, keep: int, offset: int = 0) -> torch.Tensor:
    """The indices ``(offset + i) mod size`` for ``i < keep`` (``offset = 0``: the leading slice).

    >>> window(8, 3, 6).tolist()
    [6, 7, 0]
    """
    if size < 1 or not 1 <= keep <= size:
        raise ValueError(f"window needs 1 <= keep <= size, got keep={keep}, size={size}")
    return (int(offset) + torch.arange(keep, dtype=torch.int64)) % size


def flatten_boundaries(global_shapes: Mapping[str, ShapeLike]) -> dict[str, tuple[str, int, int]]:
    """The 2-d weights whose input features are the channel-major flatten of a convolution's output.

    Returns ``{linear weight name: (convolution weight name, channels C, HW)}``: a weight ``(out, C·HW)``
    with ``HW > 1`` whose nearest preceding tensor of rank ≥ 2 in the ``state_dict`` is a convolution weight
    (rank ≥ 3) with ``C`` output channels. For the FedAvg CNN on 8×8 digits: ``{"fc1.weight": ("conv2.weight",
    64, 4)}`` at width 1 (two 2×2 max-pools: 8 → 2, HW = 2·2).
    """
    shapes = state_shapes(global_shapes)
    found: dict[str, tuple[str, int, int]] = {}
    previous: tuple[str, tuple[int, ...]] | None = None
    for name, shape in shapes.items():
        if len(shape) == 2 and previous is not None and len(previous[1]) >= 3:
            channels = previous[1][0]
            if shape[1] > channels and shape[1] % channels == 0:
                found[name] = (previous[0], channels, shape[1] // channels)
        if len(shape) >= 2:
            previous = (name, shape)
    return found


def _offset_for(offset: Offset, size: int, keep: int) -> int:
    return int(offset(size, keep)) if callable(offset) else int(offset)


def slice_indices(global_shapes: Mapping[str, ShapeLike], sub_shapes: Mapping[str, ShapeLike],
                  offset: Offset = 0) -> SliceIndices:
    """Index sets of a sub-model inside the global model, from the two ``state_dict`` shapes.

    A dimension is sliced when the sub-model's size ``k`` is smaller than the global size ``K``; its indices are
    ``window(K, k, s)`` with ``s = offset`` (or ``offset(K, k)``). The input dimension of a linear layer after a
    flatten (:func:`flatten_boundaries`) gets ``{c·HW + j : c ∈ window(C, c_sub, s), j < HW}``.

    Raises ``ValueError`` when the names differ, a rank differs, a sub-size exceeds the global size, or a
    flattened input size is not ``c_sub·HW``.
    """
    g_shapes, s_shapes = state_shapes(global_shapes), state_shapes(sub_shapes)
    if list(g_shapes) != list(s_shapes):
        missing = sorted(set(g_shapes) ^ set(s_shapes))
        raise ValueError(f"global and sub-model state_dicts must hold the same names in the same order; "
                         f"differing: {missing[:5] or 'order only'}")
    boundaries = flatten_boundaries(g_shapes)
    out: SliceIndices = {}
    for name, g in g_shapes.items():
        s = s_shapes[name]
        if len(g) != len(s) or any(b > a for a, b in zip(g, s)):
            raise ValueError(f"tensor {name!r}: sub-model shape {s} does not fit in global shape {g}")
        dims: list[torch.Tensor | None] = []
        for d, (big, small) in enumerate(zip(g, s)):
            if small == big:
                dims.append(None)
            elif d == 1 and name in boundaries:
                producer, channels, hw = boundaries[name]
                sub_channels = s_shapes[producer][0]
                if small != sub_channels * hw:
                    raise ValueError(f"tensor {name!r}: flattened input size {small} != {sub_channels} channels of "
                                     f"{producer!r} x HW={hw}")
                kept = window(channels, sub_channels, _offset_for(offset, channels, sub_channels))
                dims.append((kept[:, None] * hw + torch.arange(hw, dtype=torch.int64)).reshape(-1))
            else:
                dims.append(window(big, small, _offset_for(offset, big, small)))
        out[name] = tuple(dims)
    return out


def leading_indices(global_shapes: Mapping[str, ShapeLike], sub_shapes: Mapping[str, ShapeLike]) -> SliceIndices:
    """Index sets of the leading slice (the first ``k`` units of every sliced dimension; HeteroFL, FjORD)."""
    return slice_indices(global_shapes, sub_shapes, 0)


def rolling_indices(global_shapes: Mapping[str, ShapeLike], sub_shapes: Mapping[str, ShapeLike],
                    offset: Offset) -> SliceIndices:
    """Index sets of the rolling window ``{(s + i) mod K : i < k}`` of every sliced dimension (FedRolex)."""
    return slice_indices(global_shapes, sub_shapes, offset)


def _full(index: IndexSet, shape: Sequence[int]) -> list[torch.Tensor]:
    return [torch.arange(n, dtype=torch.int64) if ix is None else ix for ix, n in zip(index, shape)]


def _broadcast(index: IndexSet, shape: Sequence[int]) -> tuple[torch.Tensor, ...]:
    full = _full(index, shape)
    n = len(full)
    return tuple(ix.view([-1 if j == d else 1 for j in range(n)]) for d, ix in enumerate(full))


def _put(target: torch.Tensor, index: IndexSet, values: torch.Tensor, accumulate: bool = False) -> None:
    """``target[ix] = values`` (or ``+=``), also for 0-d tensors (which have no index)."""
    if target.dim() == 0:
        if accumulate:
            target.add_(values.reshape(()))
        else:
            target.copy_(values.reshape(()))
        return
    target.index_put_(_broadcast(index, target.shape), values, accumulate=accumulate)


def sub_shape(index: IndexSet, shape: Sequence[int]) -> tuple[int, ...]:
    """Shape of the slice that ``index`` selects from a tensor of ``shape``."""
    return tuple(int(n) if ix is None else int(ix.numel()) for ix, n in zip(index, shape))


def extract(global_state: Mapping[str, torch.Tensor], indices: Mapping[str, IndexSet]) -> dict[str, torch.Tensor]:
    """The sub-model state: ``global_state[name][ix_0, ix_1, …]`` for every name (detached copies)."""
    out = {}
    for name, tensor in global_state.items():
        t = tensor.detach()
        for d, ix in enumerate(indices[name]):
            if ix is not None:
                t = t.index_select(d, ix.to(t.device))
        out[name] = t.clone()
    return out


def leading_view(tensor: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """The leading slice ``tensor[:k_0, :k_1, …]`` as a *view* (gradients and in-place updates reach ``tensor``).

    Equals ``extract`` with :func:`leading_indices`, including across a flatten boundary (channel-major
    flattening makes the leading channels the leading features).
    """
    if len(shape) != tensor.dim() or any(k > n for k, n in zip(shape, tensor.shape)):
        raise ValueError(f"shape {tuple(shape)} does not fit in tensor of shape {tuple(tensor.shape)}")
    return tensor[tuple(slice(0, int(k)) for k in shape)]


def scatter(sub_state: Mapping[str, torch.Tensor], indices: Mapping[str, IndexSet],
            into: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A copy of ``into`` with the sub-model's entries written at their global indices (inverse of
    :func:`extract`: ``scatter(extract(g, ix), ix, g) == g``)."""
    out = {}
    for name, tensor in into.items():
        t = tensor.detach().clone()
        if name in sub_state:
            _put(t, indices[name], sub_state[name].detach().to(t.dtype))
        out[name] = t
    return out


def scatter_add(sums: dict[str, torch.Tensor], weights: dict[str, torch.Tensor],
                sub_state: Mapping[str, torch.Tensor], indices: Mapping[str, IndexSet], weight: float) -> None:
    """Accumulate one client's sub-model in place: ``sums[ix] += weight·x`` and ``weights[ix] += weight``.

    ``sums`` and ``weights`` are float64 tensors of the global shapes (see :func:`average_slices`).
    """
    for name, value in sub_state.items():
        _put(sums[name], indices[name], weight * value.detach().to("cpu", torch.float64), accumulate=True)
        _put(weights[name], indices[name], torch.full(value.shape, float(weight), dtype=torch.float64),
             accumulate=True)


def average_slices(global_state: Mapping[str, torch.Tensor],
                   contributions: Sequence[tuple[Mapping[str, torch.Tensor], Mapping[str, IndexSet], float]],
                   ) -> dict[str, torch.Tensor]:
    """Every entry averaged over the sub-models that hold it, weighted: ``Σ_k w_k x_k / Σ_k w_k`` over the
    clients ``k`` whose index set contains the entry (HeteroFL, Diao et al. ICLR 2021, Sec. 3.2; FedRolex,
    Alam et al. NeurIPS 2022, Eq. (3)); entries no client holds keep the server's value.

    ``contributions``: ``(sub_state, indices, weight)`` per client, e.g. ``weight = n_k`` (data size). Integer
    tensors (``num_batches_tracked``) are averaged in float64 and rounded back to their dtype.
    """
    for _, _, w in contributions:
        if not float(w) >= 0:
            raise ValueError(f"weights must be >= 0, got {w}")
    sums = {k: torch.zeros(v.shape, dtype=torch.float64) for k, v in global_state.items()}
    weights = {k: torch.zeros(v.shape, dtype=torch.float64) for k, v in global_state.items()}
    for sub_state, indices, w in contributions:
        scatter_add(sums, weights, sub_state, indices, float(w))
    out = {}
    for name, tensor in global_state.items():
        held = weights[name] > 0
        avg = torch.where(held, sums[name] / weights[name].clamp_min(1e-300), tensor.detach().to("cpu", torch.float64))
        if not tensor.is_floating_point():
            avg = avg.round()
        out[name] = avg.to(tensor.dtype)
    return out


def coverage(indices: Mapping[str, IndexSet], global_shapes: Mapping[str, ShapeLike]) -> dict[str, torch.Tensor]:
    """Boolean masks of the global entries a set of index sets selects (for audits and tests)."""
    out = {}
    for name, shape in state_shapes(global_shapes).items():
        mask = torch.zeros(shape, dtype=torch.bool)
        _put(mask, indices[name], torch.ones(sub_shape(indices[name], shape), dtype=torch.bool))
        out[name] = mask
    return out


__all__ = ["IndexSet", "Offset", "SliceIndices", "average_slices", "coverage", "extract", "flatten_boundaries",
           "leading_indices", "leading_view", "rolling_indices", "scatter", "scatter_add", "slice_indices",
           "state_shapes", "sub_shape", "window"]
