"""The networks of FedP3 (Yi, Gazagnadou, Richtárik & Lyu, ICLR 2024): Table 4 (App. B.3), used in Sec. 4.2-4.3.

Two architectures, built by :func:`build_fedp3_net` (the FedP3 method builds its nets with it when given its
``net`` option; the model registry may expose them as ``fedp3_cnn`` / ``fedp3_mlp`` through the same classes):

``fedp3_cnn`` — :class:`FedP3CNN`, the CNN of Table 4 (CIFAR-10/100, FashionMNIST)::

    conv5×5(64w, valid) → [norm] → ReLU → maxpool 2 → conv5×5(64w, valid) → [norm] → ReLU → maxpool 2 →
    flatten → FC(1024w) → ReLU → FC(1024w) → ReLU → FC(num_classes)

  The paper's text speaks of "four FC layers" but its Table 4 lists three (FC 1600 → 1024, FC 1024 → 1024,
  FC 1024 → classes); we follow the table (as does the authors' public code, whose CIFAR "LeNet" has the same
  three). The flatten size 1600 = 64·5·5 of the table implies a 3×32×32 input and *valid* (unpadded)
  convolutions with floor pooling: 32 → conv 28 → pool 14 → conv 10 → pool 5. At width 1 with 10 classes the
  model has 2,806,602 parameters. The flatten size is computed from ``input_shape``; ``padding`` (default 0,
  the paper's) pads both convolutions, e.g. ``padding=2`` makes the net usable on 8×8 digits (64·2·2 = 256
  features). An input too small for two valid 5×5 convolutions and two pools raises ``ValueError``.

  Fashion-MNIST departs from Table 4: the table lists the same 1600 → 1024 first FC layer for all three CNN
  datasets, but a 1×28×28 image through the unpadded convolutions leaves 64·4·4 = 1024 features (28 → conv 24 →
  pool 12 → conv 8 → pool 4), so the library's Fashion-MNIST CNN has a 1024 × 1024 first FC layer at width 1.

``fedp3_mlp`` — :class:`FedP3MLP`, the 4-layer MLP of the EMNIST-L experiments:
  ``784 → 1024w → 1024w → 1024w → num_classes`` (three hidden layers + the classifier, ReLU after each hidden
  layer). ``hidden`` changes the hidden sizes; the authors' public code uses two hidden layers for EMNIST
  (``hidden=(1024, 1024)``), the paper describes four linear layers, which is our default.

  Table 4's MLP ends in 1024 × 10 (EMNIST-L has 10 labels, Sec. 4.1). The book has no EMNIST-L offline and builds
  this MLP for FEMNIST's letters, case merged, with ``num_classes=26``: its last layer is 1024 × 26.

Both follow the library's conventions: a ``width`` multiplier applied to every hidden size with
:func:`~subfl.models.norm.scaled_channels`, a ``norm`` kind (default ``"none"``, as in the paper), and a bias on
every layer not followed by a normalisation layer.
"""
from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType

import torch
from torch import nn

from .mlp import MLP
from .norm import check_image_model_args, make_norm, scaled_channels

FEDP3_CNN_CHANNELS = 64
FEDP3_HIDDEN = 1024


def _conv_pool_size(size: int, padding: int) -> int:
    """Spatial size after one 5×5 convolution (stride 1, ``padding``) and a 2×2 max-pool (floor)."""
    return (size + 2 * padding - 4) // 2


class FedP3CNN(nn.Module):
    """The CNN of FedP3's Table 4: two 5×5 convolutions of 64 channels with max-pooling, then three FC layers.

    Args:
        num_classes: outputs of the last linear layer.
        input_shape: shape of one sample ``(C, H, W)``; ``(3, 32, 32)`` gives the table's 1600 flatten features.
        width: multiplier of the 64 channels and the 1024 hidden units.
        norm: ``"none"`` (default), ``"bn"``, ``"bn_nostats"`` or ``"gn"``, after each convolution.
        padding: zero padding of both convolutions (0: the paper's valid convolutions).
    """

    def __init__(self, num_classes: int, input_shape: tuple[int, ...] = (3, 32, 32), *, width: float = 1.0,
                 norm: str = "none", padding: int = 0) -> None:
        super().__init__()
        num_classes, (in_channels, height, width_px), width = check_image_model_args(num_classes, input_shape, width,
                                                                                   norm)
        if isinstance(padding, bool) or not isinstance(padding, int) or padding < 0:
            raise ValueError(f"padding must be a non-negative int, got padding={padding!r}")
        h = _conv_pool_size(_conv_pool_size(height, padding), padding)
        w = _conv_pool_size(_conv_pool_size(width_px, padding), padding)
        if h < 1 or w < 1:
            raise ValueError(f"input_shape={tuple(input_shape)!r} is too small for two 5x5 convolutions with "
                             f"padding={padding} and two 2x2 max-pools (needs H, W >= {16 - 4 * padding}); "
                             f"use a larger input or padding=2")
        self.width = width
        self.norm = norm
        channels, hidden = scaled_channels(FEDP3_CNN_CHANNELS, width), scaled_channels(FEDP3_HIDDEN, width)
        bias = norm == "none"
        self.conv1 = nn.Conv2d(in_channels, channels, kernel_size=5, padding=padding, bias=bias)
        self.norm1 = make_norm(norm, channels)
        self.conv2 = nn.Conv2d(channels, channels, kernel_size=5, padding=padding, bias=bias)
        self.norm2 = make_norm(norm, channels)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(kernel_size=2, stride=2)
        self.flat_features = channels * h * w
        self.fc1 = nn.Linear(self.flat_features, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.relu(self.norm1(self.conv1(x))))
        x = self.pool(self.relu(self.norm2(self.conv2(x))))
        x = self.relu(self.fc1(torch.flatten(x, 1)))
        x = self.relu(self.fc2(x))
        return self.fc3(x)


class FedP3MLP(MLP):
    """The EMNIST-L MLP of FedP3: ``784 → 1024 → 1024 → 1024 → num_classes`` (an :class:`~subfl.models.mlp.MLP`
    with ``hidden=(1024, 1024, 1024)``).

    Args:
        num_classes: outputs of the last linear layer.
        input_shape: shape of one sample (flattened; ``(1, 28, 28)`` gives the 784 inputs).
        width: multiplier of the hidden sizes.
        norm: ``"none"`` (default) or a kind of :func:`~subfl.models.norm.make_norm` after each hidden layer.
        hidden: base hidden sizes (default three layers of 1024).
    """

    def __init__(self, num_classes: int, input_shape: tuple[int, ...] = (1, 28, 28), *, width: float = 1.0,
                 norm: str = "none", hidden: Sequence[int] = (FEDP3_HIDDEN,) * 3) -> None:
        super().__init__(num_classes, input_shape, width=width, norm=norm, hidden=hidden)


FEDP3_NETS = MappingProxyType({"fedp3_cnn": FedP3CNN, "fedp3_mlp": FedP3MLP})
"""Name → class of the FedP3 networks."""

FEDP3_NET_OPTIONS = MappingProxyType({"fedp3_cnn": ("padding",), "fedp3_mlp": ("hidden",)})
"""Name → the extra options its constructor accepts (besides ``width`` and ``norm``)."""


def build_fedp3_net(name: str, *, num_classes: int, input_shape: tuple[int, ...], width: float = 1.0,
                    norm: str | None = None, **options) -> nn.Module:
    """Construct the FedP3 network ``name`` (``"fedp3_cnn"`` or ``"fedp3_mlp"``).

    ``norm=None`` means ``"none"`` (the paper's nets have no normalisation). ``options``: ``padding`` for the
    CNN, ``hidden`` for the MLP. Raises ``ValueError`` for an unknown name or option.
    """
    if name not in FEDP3_NETS:
        raise ValueError(f"name={name!r} is not a FedP3 network; accepted values: {', '.join(FEDP3_NETS)}")
    unknown = sorted(set(options) - set(FEDP3_NET_OPTIONS[name]))
    if unknown:
        raise ValueError(f"option {unknown[0]!r} is not accepted by {name!r}; accepted options: "
                         f"{', '.join(FEDP3_NET_OPTIONS[name])}")
    return FEDP3_NETS[name](num_classes, tuple(input_shape), width=width, norm="none" if norm is None else norm,
                            **options)


__all__ = ["FEDP3_NETS", "FEDP3_NET_OPTIONS", "FedP3CNN", "FedP3MLP", "build_fedp3_net"]
