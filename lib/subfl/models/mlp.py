"""Multi-layer perceptron (the "2NN" of FedAvg, McMahan et al., AISTATS 2017, by default).

``flatten → Linear(h1·w) → [norm] → ReLU → … → Linear(h_k·w) → [norm] → ReLU → Linear(num_classes)``
with ``hidden=(200, 200)`` by default. Works on any input shape (the sample is flattened). For 784
inputs and 10 classes at width 1 it has 199,210 parameters, the FedAvg 2NN count.

The default ``norm`` of this model is ``"none"``; other kinds use the 1-d layers of
:func:`~subfl.models.norm.make_norm` (``dims=1``). Every linear layer has a bias.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch
from torch import nn

from .norm import check_input_shape, check_norm, check_num_classes, check_width, make_norm, scaled_channels


class MLP(nn.Module):
    """Fully connected network with ReLU hidden layers.

    Args:
        num_classes: outputs of the last linear layer.
        input_shape: shape of one sample (any rank); its product is the input size.
        width: multiplier of every hidden size (see :func:`~subfl.models.norm.scaled_channels`).
        norm: ``"none"`` (default), ``"bn"``, ``"bn_nostats"`` or ``"gn"``, applied after each hidden linear layer.
        hidden: base sizes of the hidden layers; ``()`` gives multinomial logistic regression.
    """

    def __init__(
        self,
        num_classes: int,
        input_shape: tuple[int, ...] = (1, 28, 28),
        *,
        width: float = 1.0,
        norm: str = "none",
        hidden: Sequence[int] = (200, 200),
    ) -> None:
        super().__init__()
        num_classes = check_num_classes(num_classes)
        shape = check_input_shape(input_shape)
        width = check_width(width)
        check_norm(norm)
        try:
            hidden = tuple(hidden)
        except TypeError:
            raise ValueError(f"hidden must be a sequence of positive ints, got hidden={hidden!r}") from None
        if any(isinstance(h, bool) or not isinstance(h, numbers.Integral) or h < 1 for h in hidden):
            raise ValueError(f"hidden must be a sequence of positive ints, got hidden={hidden!r}")
        self.width = width
        self.norm = norm
        self.hidden_sizes = tuple(scaled_channels(int(h), width) for h in hidden)
        layers: list[nn.Module] = [nn.Flatten(1)]
        features = math.prod(shape)
        for size in self.hidden_sizes:
            layers.append(nn.Linear(features, size))
            if norm != "none":
                layers.append(make_norm(norm, size, dims=1))
            layers.append(nn.ReLU())
            features = size
        layers.append(nn.Linear(features, num_classes))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)
