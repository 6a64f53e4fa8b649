"""VGG-11 (configuration "A" of Simonyan & Zisserman, ICLR 2015), CIFAR-sized.

Features: ``64, M, 128, M, 256, 256, M, 512, 512, M, 512, 512, M`` where a number is a 3×3 convolution
(padding 1) with that many base channels (× ``width``), followed by the optional normalisation and a ReLU,
and ``M`` is a 2×2 max-pool of stride 2.

Classifier: ``AdaptiveAvgPool2d(1) → flatten → Linear(512w, 512w) → ReLU → Linear(512w, num_classes)``
(no dropout). For a 32×32 input the features end at 1×1, so the average-pool is the identity and this
is the usual CIFAR VGG-11 head; the adaptive pool lets any other size work. The max-pools use
``ceil_mode=True`` so odd sizes shrink without vanishing (28 → 14 → 7 → 4 → 2 → 1); for sizes that are
multiples of 32 this is identical to the usual floor rounding.

Convolutions followed by a normalisation layer have no bias; with ``norm="none"`` they have one.
"""
from __future__ import annotations

import torch
from torch import nn

from .norm import check_image_model_args, make_norm, scaled_channels

VGG11_CONFIG: tuple[int | str, ...] = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")
"""Configuration "A": base channels of each 3×3 convolution, ``"M"`` for a 2×2 max-pool."""

VGG_CLASSIFIER_WIDTH = 512
"""Base size of the hidden linear layer of the classifier (× ``width``)."""


def make_vgg_features(config: tuple[int | str, ...], in_channels: int, *, width: float, norm: str) -> nn.Sequential:
    """Convolutional part of a VGG described by ``config`` (see :data:`VGG11_CONFIG`)."""
    layers: list[nn.Module] = []
    channels = in_channels
    for item in config:
        if item == "M":
            layers.append(nn.MaxPool2d(kernel_size=2, stride=2, ceil_mode=True))
            continue
        out_channels = scaled_channels(int(item), width)
        layers.append(nn.Conv2d(channels, out_channels, kernel_size=3, padding=1, bias=norm == "none"))
        if norm != "none":
            layers.append(make_norm(norm, out_channels))
        layers.append(nn.ReLU())
        channels = out_channels
    return nn.Sequential(*layers)


class VGG11(nn.Module):
    """VGG-11 with optional normalisation after each convolution.

    Args:
        num_classes: outputs of the last linear layer.
        input_shape: shape of one sample ``(C, H, W)``; any ``H, W`` ≥ 1 works.
        width: multiplier of every channel count and of the hidden classifier layer.
        norm: ``"bn"``, ``"bn_nostats"``, ``"gn"`` or ``"none"``.
    """

    def __init__(
        self, num_classes: int, input_shape: tuple[int, ...] = (3, 32, 32), *, width: float = 1.0, norm: str = "bn"
    ) -> None:
        super().__init__()
        num_classes, (in_channels, _, _), width = check_image_model_args(num_classes, input_shape, width, norm)
        self.width = width
        self.norm = norm
        self.features = make_vgg_features(VGG11_CONFIG, in_channels, width=width, norm=norm)
        feature_channels = scaled_channels(512, width)
        hidden = scaled_channels(VGG_CLASSIFIER_WIDTH, width)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.classifier = nn.Sequential(
            nn.Linear(feature_channels, hidden),
            nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(self.avgpool(self.features(x)), 1)
        return self.classifier(x)
