"""ResNet-18 with the CIFAR stem (He et al., CVPR 2016; the variant used by PriSM, FLANC, HeteroFL, FedP3).

Differences from the ImageNet ResNet-18 of torchvision: the stem is one 3×3 stride-1 convolution (no 7×7
stride-2 convolution, no max-pool), so a 32×32 image reaches the last stage at 4×4. At width 1 with 10
classes and ``norm="bn"`` the model has 11,173,962 parameters, the usual CIFAR ResNet-18 count.

Convolutions followed by a normalisation layer have no bias (the norm's shift makes it redundant);
with ``norm="none"`` every convolution has a bias. This is the rule of every model in :mod:`subfl.models`.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .norm import check_image_model_args, make_norm, scaled_channels

RESNET_STAGE_WIDTHS: tuple[int, ...] = (64, 128, 256, 512)
"""Base channel counts of the four stages (and 64 for the stem), multiplied by ``width``."""


def conv3x3(in_channels: int, out_channels: int, stride: int = 1, *, bias: bool = False) -> nn.Conv2d:
    """3×3 convolution with padding 1."""
    return nn.Conv2d(in_channels, out_channels, kernel_size=3, stride=stride, padding=1, bias=bias)


def conv1x1(in_channels: int, out_channels: int, stride: int = 1, *, bias: bool = False) -> nn.Conv2d:
    """1×1 convolution (the projection shortcut)."""
    return nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=stride, bias=bias)


class BasicBlock(nn.Module):
    """Two 3×3 convolutions with a residual connection: ``relu(norm(conv(relu(norm(conv(x))))) + shortcut(x))``.

    The shortcut is the identity when the shape is unchanged, otherwise a 1×1 projection convolution of
    stride ``stride`` followed by a normalisation layer (option B of He et al.).
    """

    expansion: int = 1

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1, *, norm: str = "bn") -> None:
        super().__init__()
        bias = norm == "none"
        self.conv1 = conv3x3(in_channels, out_channels, stride, bias=bias)
        self.bn1 = make_norm(norm, out_channels)
        self.relu = nn.ReLU()
        self.conv2 = conv3x3(out_channels, out_channels, bias=bias)
        self.bn2 = make_norm(norm, out_channels)
        self.shortcut: nn.Module
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                conv1x1(in_channels, out_channels, stride, bias=bias), make_norm(norm, out_channels)
            )
        else:
            self.shortcut = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """ResNet of :class:`BasicBlock` stages with the CIFAR stem.

    Args:
        num_classes: outputs of the linear head.
        input_shape: shape of one sample ``(C, H, W)``; only ``C`` matters (global average pooling makes
            the network work for any ``H, W`` ≥ 1).
        width: multiplier of every channel count (see :func:`~subfl.models.norm.scaled_channels`).
        norm: ``"bn"``, ``"bn_nostats"``, ``"gn"`` or ``"none"`` (see :func:`~subfl.models.norm.make_norm`).
        blocks: number of blocks per stage; ``(2, 2, 2, 2)`` is ResNet-18.

    Layout: ``conv1 → bn1 → relu → layer1..layer4 → avgpool → flatten → fc``; stages 2–4 start with a
    stride-2 block.
    """

    def __init__(
        self,
        num_classes: int,
        input_shape: tuple[int, ...] = (3, 32, 32),
        *,
        width: float = 1.0,
        norm: str = "bn",
        blocks: Sequence[int] = (2, 2, 2, 2),
    ) -> None:
        super().__init__()
        num_classes, (in_channels, _, _), width = check_image_model_args(num_classes, input_shape, width, norm)
        blocks = tuple(blocks)
        if len(blocks) != len(RESNET_STAGE_WIDTHS) or any(not isinstance(b, int) or b < 1 for b in blocks):
            raise ValueError(f"blocks must be four positive ints (one per stage), got blocks={blocks!r}")
        self.width = width
        self.norm = norm
        stem_channels = scaled_channels(RESNET_STAGE_WIDTHS[0], width)
        self.conv1 = conv3x3(in_channels, stem_channels, bias=norm == "none")
        self.bn1 = make_norm(norm, stem_channels)
        self.relu = nn.ReLU()
        channels = stem_channels
        stages = []
        for index, (base, count) in enumerate(zip(RESNET_STAGE_WIDTHS, blocks)):
            out_channels = scaled_channels(base, width)
            first_stride = 1 if index == 0 else 2
            layers = []
            for block in range(count):
                layers.append(BasicBlock(channels, out_channels, first_stride if block == 0 else 1, norm=norm))
                channels = out_channels
            stages.append(nn.Sequential(*layers))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class ResNet18(CifarResNet):
    """CIFAR ResNet-18: :class:`CifarResNet` with ``blocks=(2, 2, 2, 2)``.

    ``ResNet18(10)`` has 11,173,962 parameters (width 1, ``norm="bn"``).
    """

    def __init__(
        self, num_classes: int, input_shape: tuple[int, ...] = (3, 32, 32), *, width: float = 1.0, norm: str = "bn"
    ) -> None:
        super().__init__(num_classes, input_shape, width=width, norm=norm, blocks=(2, 2, 2, 2))
