"""Models of the book: CIFAR ResNet-18, VGG-11, the FedAvg CNN and MLP, built by :func:`build_model`.

Every model takes ``num_classes``, ``input_shape``, a ``width`` multiplier (one rounding rule,
:func:`scaled_channels`) and a ``norm`` kind (one constructor, :func:`make_norm`).
"""
from .cnn import FedAvgCNN
from .mlp import MLP
from .norm import NORMS, check_width, groupnorm_groups, make_norm, scaled_channels
from .registry import MODELS, ModelSpec, build_model, model_spec
from .resnet import BasicBlock, CifarResNet, ResNet18
from .vgg import VGG11, VGG11_CONFIG

__all__ = [
    "MODELS",
    "NORMS",
    "VGG11_CONFIG",
    "BasicBlock",
    "CifarResNet",
    "FedAvgCNN",
    "MLP",
    "ModelSpec",
    "ResNet18",
    "VGG11",
    "build_model",
    "check_width",
    "groupnorm_groups",
    "make_norm",
    "model_spec",
    "scaled_channels",
]
