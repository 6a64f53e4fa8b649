"""Building blocks shared by every model: width scaling and normalisation layers.

Two rules live here so that every model (and every method that slices a model) uses the same one:

* **Width scaling** — :func:`scaled_channels`: a layer whose base size is ``base`` has
  ``max(1, round_half_up(width * base))`` channels / units in a model built at ``width``.
* **Normalisation** — :func:`make_norm`: one constructor for the normalisation kinds the papers use
  (``"bn"``, ``"bn_nostats"``, ``"gn"``, ``"none"``), with one documented GroupNorm group rule.
"""
from __future__ import annotations

import math
import numbers

from torch import nn

NORMS: tuple[str, ...] = ("bn", "bn_nostats", "gn", "none")
"""Accepted values of the ``norm`` argument of every model."""

GROUPNORM_MAX_GROUPS = 32
"""Number of groups of GroupNorm when it divides the channel count (Wu & He, ECCV 2018 default)."""


def check_width(width: float) -> float:
    """Return ``width`` as a float after checking it lies in (0, ∞).

    Raises ``TypeError`` if ``width`` is not a real number (``bool`` is rejected) and ``ValueError`` if it
    is not finite and strictly positive.
    """
    if isinstance(width, bool) or not isinstance(width, numbers.Real):
        raise TypeError(f"width must be a real number in (0, inf), got {width!r} of type {type(width).__name__}")
    value = float(width)
    if not (math.isfinite(value) and value > 0.0):
        raise ValueError(f"width must be a finite number in (0, inf), got width={width!r}")
    return value


def scaled_channels(base: int, width: float) -> int:
    """Channels (or hidden units) of a layer of base size ``base`` in a model of width multiplier ``width``.

    The rule is ``max(1, floor(width * base + 1/2))``: round half *up* (not Python's half-to-even
    ``round``), and never fewer than one channel. Examples: ``scaled_channels(64, 0.125) == 8``,
    ``scaled_channels(200, 0.5) == 100``, ``scaled_channels(5, 0.5) == 3``, ``scaled_channels(64, 0.001) == 1``.

    This is the *construction* rule. Methods that slice a built full-width model down to a fraction ``p``
    of its channels (HeteroFL, FLANC) keep ``floor(p * base)`` channels; the two rules agree whenever
    ``p * base`` is an integer, e.g. for the usual ``p`` in {1, 1/2, 1/4, 1/8, 1/16} and base widths that
    are multiples of 16 (32, 64, 128, 256, 512).
    """
    if isinstance(base, bool) or not isinstance(base, numbers.Integral) or base < 1:
        raise ValueError(f"base must be a positive integer, got base={base!r}")
    value = check_width(width)
    return max(1, int(math.floor(value * int(base) + 0.5)))


def groupnorm_groups(channels: int) -> int:
    """Number of GroupNorm groups used for ``channels`` channels: ``gcd(channels, 32)``.

    That is 32 groups whenever 32 divides ``channels`` (every full-width layer of ResNet-18 / VGG-11 and
    every width multiple of 1/2 of them), otherwise the largest power of two dividing ``channels`` (e.g.
    8 channels → 8 groups, 48 → 16, 6 → 2), and 1 group (LayerNorm over channels and space) for odd
    counts. The result always divides ``channels``.
    """
    if isinstance(channels, bool) or not isinstance(channels, numbers.Integral) or channels < 1:
        raise ValueError(f"channels must be a positive integer, got channels={channels!r}")
    return math.gcd(int(channels), GROUPNORM_MAX_GROUPS)


def check_norm(norm: str) -> str:
    """Return ``norm`` after checking it is one of :data:`NORMS`."""
    if norm not in NORMS:
        accepted = ", ".join(repr(n) for n in NORMS)
        raise ValueError(f"norm={norm!r} is not supported; accepted values: {accepted}")
    return norm


def make_norm(kind: str, channels: int, *, dims: int = 2) -> nn.Module:
    """Normalisation layer of kind ``kind`` over ``channels`` channels.

    ``kind``:

    * ``"bn"`` — ``BatchNorm2d`` (``BatchNorm1d`` when ``dims=1``) with running statistics;
    * ``"bn_nostats"`` — the same with ``track_running_stats=False``: batch statistics are used in
      training *and* evaluation, as PriSM and HeteroFL do (static BN; no running statistics to aggregate);
    * ``"gn"`` — ``GroupNorm(groupnorm_groups(channels), channels)`` (see :func:`groupnorm_groups`);
      works for ``(N, C)`` inputs too, so the same layer serves ``dims=1``;
    * ``"none"`` — ``Identity``.

    ``dims`` is 2 for feature maps ``(N, C, H, W)`` and 1 for features ``(N, C)`` after a linear layer.
    """
    check_norm(kind)
    if dims not in (1, 2):
        raise ValueError(f"dims must be 1 (features) or 2 (feature maps), got dims={dims!r}")
    if isinstance(channels, bool) or not isinstance(channels, numbers.Integral) or channels < 1:
        raise ValueError(f"channels must be a positive integer, got channels={channels!r}")
    batch_norm = nn.BatchNorm2d if dims == 2 else nn.BatchNorm1d
    if kind == "bn":
        return batch_norm(channels)
    if kind == "bn_nostats":
        return batch_norm(channels, track_running_stats=False)
    if kind == "gn":
        return nn.GroupNorm(groupnorm_groups(channels), channels)
    return nn.Identity()


def check_input_shape(input_shape: tuple[int, ...], *, rank: int | None = None, name: str = "input_shape") -> tuple[int, ...]:
    """Return ``input_shape`` as a tuple of positive ints, checking its rank when ``rank`` is given."""
    try:
        shape = tuple(input_shape)
    except TypeError:
        raise TypeError(f"{name} must be a tuple of positive ints, got {input_shape!r}") from None
    if not shape or any(isinstance(s, bool) or not isinstance(s, numbers.Integral) or s < 1 for s in shape):
        raise ValueError(f"{name} must be a non-empty tuple of positive ints, got {name}={input_shape!r}")
    if rank is not None and len(shape) != rank:
        raise ValueError(
            f"{name} must have {rank} entries (channels, height, width), got {name}={input_shape!r}"
            if rank == 3
            else f"{name} must have {rank} entries, got {name}={input_shape!r}"
        )
    return tuple(int(s) for s in shape)


def check_num_classes(num_classes: int) -> int:
    """Return ``num_classes`` after checking it is a positive int."""
    if isinstance(num_classes, bool) or not isinstance(num_classes, numbers.Integral) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive integer, got num_classes={num_classes!r}")
    return int(num_classes)


def check_image_model_args(num_classes: int, input_shape: tuple[int, ...], width: float, norm: str, *,
                           min_size: int = 1, why: str = "") -> tuple[int, tuple[int, int, int], float]:
    """The common argument checks of the image models: ``(num_classes, (C, H, W), width)`` validated, ``norm``
    checked; ``H`` and ``W`` must be at least ``min_size`` (``why`` says which layers need it)."""
    num_classes = check_num_classes(num_classes)
    channels, height, width_px = check_input_shape(input_shape, rank=3)
    width = check_width(width)
    check_norm(norm)
    if height < min_size or width_px < min_size:
        raise ValueError(f"input_shape must have height and width >= {min_size}{f' ({why})' if why else ''}, "
                         f"got {input_shape!r}")
    return num_classes, (channels, height, width_px), width
