"""Helpers shared by the method tests."""
from __future__ import annotations

from collections.abc import Callable

import torch

from subfl.models import build_model


class Factory:
    """Like the runner's ModelFactory: deterministic init, a ``width`` attribute, keyword overrides."""

    def __init__(self, name: str = "mlp", width: float = 1.0, num_classes: int = 10, input_shape=(1, 8, 8), *,
                 builder: Callable[..., torch.nn.Module] = build_model, **kwargs):
        self.name, self.width, self.builder = name, width, builder
        self.kwargs = dict(num_classes=num_classes, input_shape=input_shape, **kwargs)

    def __call__(self, width: float | None = None, **overrides):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            return self.builder(self.name, width=self.width if width is None else width,
                                **{**self.kwargs, **overrides})
