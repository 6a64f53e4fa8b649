"""Build a model by name: the one entry point experiments and methods use.

>>> model = build_model("resnet18", num_classes=10, input_shape=(3, 32, 32), width=0.25)

Names (:data:`MODELS`), their classes, default normalisation and extra options:

=========== ===================================== ============ =====================
name        class                                 default norm options
=========== ===================================== ============ =====================
resnet18    :class:`~subfl.models.resnet.ResNet18` ``"bn"``     —
vgg11       :class:`~subfl.models.vgg.VGG11`       ``"bn"``     —
cnn         :class:`~subfl.models.cnn.FedAvgCNN`   ``"none"``   —
mlp         :class:`~subfl.models.mlp.MLP`         ``"none"``   ``hidden=(200, 200)``
flanc_cnn   :class:`~subfl.models.composed.FlancCNN` ``"none"`` —
fedp3_cnn   :class:`~subfl.models.fedp3_nets.FedP3CNN` ``"none"`` ``padding``
fedp3_mlp   :class:`~subfl.models.fedp3_nets.FedP3MLP` ``"none"`` ``hidden``
char_rnn    :class:`~subfl.models.char_rnn.CharLSTM` ``"none"`` —
tiny_gpt    :func:`~subfl.models.transformers.tiny_gpt` ``"none"`` ``layers``, ``embed_dim``, ``heads`` …
tiny_vit    :func:`~subfl.models.transformers.tiny_vit` ``"none"`` ``layers``, ``embed_dim``, ``patch_size`` …
=========== ===================================== ============ =====================

The table itself lives in :mod:`subfl.models.names`; a model's module is imported only when it is built.
"""
from __future__ import annotations

import importlib

from torch import nn

from .names import _SPECS, ModelSpec
from .norm import check_norm

MODELS: tuple[str, ...] = tuple(_SPECS)
"""Names accepted by :func:`build_model`."""


def model_spec(name: str) -> ModelSpec:
    """The :class:`ModelSpec` of ``name``; ``ValueError`` naming the accepted names otherwise."""
    if name not in _SPECS:
        accepted = ", ".join(repr(n) for n in MODELS)
        raise ValueError(f"name={name!r} is not a known model; accepted values: {accepted}")
    return _SPECS[name]


def build_model(
    name: str,
    *,
    num_classes: int,
    input_shape: tuple[int, ...],
    width: float = 1.0,
    norm: str | None = None,
    **options,
) -> nn.Module:
    """Construct the model ``name`` (one of :data:`MODELS`).

    Args:
        name: model name.
        num_classes: number of outputs.
        input_shape: shape of one sample, e.g. ``(3, 32, 32)``; image models need ``(C, H, W)``.
        width: channel / hidden-unit multiplier in (0, ∞); every hidden size is
            :func:`~subfl.models.norm.scaled_channels` ``(base, width) = max(1, round_half_up(width·base))``.
        norm: ``"bn"``, ``"bn_nostats"``, ``"gn"`` or ``"none"``; ``None`` picks the model's default
            (``"bn"`` for resnet18 / vgg11, ``"none"`` for cnn / mlp).
        options: model-specific options (see the table in this module's docstring).

    Raises:
        ValueError: unknown ``name``, ``norm`` or option, or an out-of-range value.
        TypeError: ``width`` is not a real number.
    """
    spec = model_spec(name)
    norm = spec.default_norm if norm is None else check_norm(norm)
    unknown = sorted(set(options) - set(spec.options))
    if unknown:
        accepted = ", ".join(repr(o) for o in spec.options) if spec.options else "none"
        raise ValueError(
            f"option {unknown[0]!r}={options[unknown[0]]!r} is not accepted by model {name!r}; "
            f"accepted options: {accepted}"
        )
    module, attribute = spec.constructor.split(":", 1)
    constructor = getattr(importlib.import_module(module), attribute)
    return constructor(num_classes, input_shape, width=width, norm=norm, **options)
