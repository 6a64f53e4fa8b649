"""The CNN of FedAvg (McMahan et al., AISTATS 2017, "CNN" for MNIST).

``conv5×5(32w, padding 2) → [norm] → ReLU → maxpool 2 → conv5×5(64w, padding 2) → [norm] → ReLU →
maxpool 2 → flatten → Linear(512w) → ReLU → Linear(num_classes)``.

For 1×28×28 inputs at width 1 the flatten size is 64·7·7 = 3136 and the model has 1,663,370 parameters,
the count reported in the FedAvg paper. The flatten size is computed from ``input_shape`` (floor
pooling: 8×8 digits give 64·2·2 = 256), so inputs need height and width of at least 4.

The default ``norm`` of this model is ``"none"`` (as in the paper); any kind of
:func:`~subfl.models.norm.make_norm` may be inserted after each convolution. Convolutions followed by a
normalisation layer have no bias; with ``norm="none"`` they have one.
"""
from __future__ import annotations

import torch
from torch import nn

from .norm import check_image_model_args, make_norm, scaled_channels


class FedAvgCNN(nn.Module):
    """Two 5×5 convolutions with max-pooling, then two linear layers.

    Args:
        num_classes: outputs of the last linear layer.
        input_shape: shape of one sample ``(C, H, W)`` with ``H, W`` ≥ 4.
        width: multiplier of the 32 / 64 channels and of the 512 hidden units.
        norm: ``"none"`` (default), ``"bn"``, ``"bn_nostats"`` or ``"gn"``.
    """

    def __init__(
        self, num_classes: int, input_shape: tuple[int, ...] = (1, 28, 28), *, width: float = 1.0, norm: str = "none"
    ) -> None:
        super().__init__()
        num_classes, (in_channels, height, width_px), width = check_image_model_args(
            num_classes, input_shape, width, norm, min_size=4, why="two 2x2 max-pools")
        self.width = width
        self.norm = norm
        c1, c2, hidden = scaled_channels(32, width), scaled_channels(64, width), scaled_channels(512, width)
        bias = norm == "none"
        self.conv1 = nn.Conv2d(in_channels, c1, kernel_size=5, padding=2, bias=bias)
        self.norm1 = make_norm(norm, c1)
        self.conv2 = nn.Conv2d(c1, c2, kernel_size=5, padding=2, bias=bias)
        self.norm2 = make_norm(norm, c2)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(kernel_size=2, stride=2)
        flat = c2 * (height // 2 // 2) * (width_px // 2 // 2)
        self.fc1 = nn.Linear(flat, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.relu(self.norm1(self.conv1(x))))
        x = self.pool(self.relu(self.norm2(self.conv2(x))))
        x = self.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc2(x)
