"""Datasets whose loaders live outside :mod:`subfl.data.datasets` (data only).

Each entry names its loader by import path (``"module:function"``), resolved when the dataset is loaded, its
options with their defaults, and a description. A run's key covers the ``version`` of *its* dataset's
entry (:mod:`subfl.experiments.provenance`), so adding a dataset here re-keys no other run. A loader is called as
``loader(data_root: pathlib.Path, verify: bool, **options)`` and returns a
:class:`~subfl.data.base.FederatedDataset`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True)
class ExternalDataset:
    """One dataset of the table: loader path, options (name → default) and what it is."""

    name: str
    loader: str
    options: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    description: str = ""
    version: int = 1
    """Bumped whenever the loader gives different samples for the same options; part of every run key."""

    @property
    def module(self) -> str:
        """The module that defines the loader."""
        return self.loader.split(":", 1)[0]


def _options(**defaults: Any) -> MappingProxyType:
    return MappingProxyType(defaults)


EXTERNAL_DATASETS = MappingProxyType({
    d.name: d for d in (
        ExternalDataset(
            "shakespeare_tokens", "subfl.data.tokenizer:load_shakespeare_tokens",
            _options(vocab_size=2048, tokenizer_max_chars=None, seq_len=256, stride=1, min_tokens=None,
                     max_users=None),
            "LEAF-style Shakespeare by role, SentencePiece tokens of the English-corpus tokenizer (CAFF)"),
        ExternalDataset(
            "cifar10_downstream", "subfl.pretraining:load_cifar10_downstream",
            _options(max_train=None, max_test=None),
            "CIFAR-10 restricted to the five classes the ViTs are not pretrained on (CAFF)"),
    )
})
