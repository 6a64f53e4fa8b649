"""Metrics: evaluation of models, partition statistics and method-specific diagnostics.

``evaluate`` (accuracy, loss, perplexity) lives with the engine and is re-exported here; spectral
diagnostics (``anme``, ``effective_rank``) are in :mod:`subfl.metrics.spectral`.
"""
from ..fl.training import evaluate
from .partition import labels_per_client, partition_summary, summarise_partitions
from .spectral import anme, effective_rank

__all__ = ["anme", "effective_rank", "evaluate", "labels_per_client", "partition_summary", "summarise_partitions"]
