"""Statistics of a partition: how non-iid is it?"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from ..data.partition import label_histogram


def partition_summary(labels: np.ndarray, parts: Sequence[np.ndarray], num_classes: int) -> dict[str, float]:
    """Sizes and label skew of a partition.

    * ``classes_per_client`` — mean number of classes a client holds at least one sample of;
    * ``dominant_share`` — mean share of a client's most frequent class;
    * ``tv_to_global`` — mean total-variation distance ½‖q_k − p‖₁ between a client's label distribution
      q_k and the global one p (0 for perfectly iid shards, → 1 for disjoint single-class clients).
    """
    hist = label_histogram(labels, parts, num_classes).astype(float)
    sizes = hist.sum(axis=1)
    q = hist / np.maximum(sizes[:, None], 1)
    p = np.bincount(np.asarray(labels), minlength=num_classes) / len(labels)
    return {
        "clients": len(parts),
        "min_size": int(sizes.min()),
        "median_size": float(np.median(sizes)),
        "max_size": int(sizes.max()),
        "classes_per_client": float((hist > 0).sum(axis=1).mean()),
        "dominant_share": float(q.max(axis=1).mean()),
        "tv_to_global": float(0.5 * np.abs(q - p).sum(axis=1).mean()),
    }


def labels_per_client(labels: np.ndarray, parts: Sequence[np.ndarray], num_classes: int, *,
                      share: float = 0.9) -> pd.DataFrame:
    """How many classes each client holds, two ways; one row per client.

    * ``present`` — classes the client has at least one sample of;
    * ``covering`` — the fewest classes whose samples make up at least ``share`` of the client's data (its
      dominant classes: a class with a handful of samples among hundreds does not count).

    Raises ``ValueError`` if ``share`` is not in (0, 1] or a client holds no sample.
    """
    if not 0.0 < share <= 1.0:
        raise ValueError(f"share must be in (0, 1], got {share!r}")
    hist = label_histogram(labels, parts, num_classes).astype(float)
    sizes = hist.sum(axis=1)
    if (sizes == 0).any():
        raise ValueError(f"client(s) {np.flatnonzero(sizes == 0).tolist()[:5]} hold no sample")
    shares = np.sort(hist / sizes[:, None], axis=1)[:, ::-1]
    covered = np.cumsum(shares, axis=1) >= share - 1e-12
    return pd.DataFrame({"present": (hist > 0).sum(axis=1), "covering": covered.argmax(axis=1) + 1})


def summarise_partitions(labels: np.ndarray, partitions: dict[str, Sequence[np.ndarray]], num_classes: int,
                         decimals: int = 3) -> pd.DataFrame:
    """One row of :func:`partition_summary` per named partition."""
    rows = [{"partition": name, **partition_summary(labels, parts, num_classes)}
            for name, parts in partitions.items()]
    return pd.DataFrame(rows).set_index("partition").round(decimals)
