"""Models of the book: CIFAR ResNet-18, VGG-11, the FedAvg CNN and MLP, FLANC's and FedP3's networks, a character
LSTM and CAFF's tiny transformers, built by :func:`build_model`.

Every model takes ``num_classes``, ``input_shape``, a ``width`` multiplier (one rounding rule,
:func:`scaled_channels`) and a ``norm`` kind (one constructor, :func:`make_norm`). Model classes are imported
on first use (``from subfl.models import ResNet18`` works), so importing the package does not load every
architecture, and a run depends only on the module of the model it builds.
"""
from __future__ import annotations

import importlib
from typing import Any

from .names import ModelSpec
from .norm import NORMS, check_width, groupnorm_groups, make_norm, scaled_channels
from .registry import MODELS, build_model, model_spec

_LAZY = {
    "BasicBlock": "resnet", "CifarResNet": "resnet", "ResNet18": "resnet",
    "VGG11": "vgg", "VGG11_CONFIG": "vgg",
    "FedAvgCNN": "cnn", "MLP": "mlp", "CharLSTM": "char_rnn",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "MODELS", "NORMS", "ModelSpec", "build_model", "check_width", "groupnorm_groups", "make_norm", "model_spec",
    "scaled_channels", *_LAZY,
]
