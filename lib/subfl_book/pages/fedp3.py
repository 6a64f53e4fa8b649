"""The FedP3 chapter (Yi et al., "FedP3: Federated Personalized and Privacy-friendly Network Pruning under Model
Heterogeneity"): the single-layer-client figures of App. B.5 and Sec. 4.2 that ``notebooks/fedp3/communication.ipynb``
recomputes from Table 4's printed counts and from the library's nets.

A *count list* holds one parameter count per layer in forward order, the final fully-connected layer (FFC) last.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from subfl_book.claims import Register


def paper_value(register: Register, claim: str) -> Any:
    """The paper's number for ``claim`` as the claims register holds it (Table 4's counts, App. B.5's figures)."""
    return register.claim(claim).value


def spread(values: Sequence[float]) -> tuple[float, float]:
    """App. B.5's figure 100 · (largest − smallest) / smallest, and the plain multiple largest / smallest."""
    return 100 * (max(values) - min(values)) / min(values), max(values) / min(values)


def single_layer_uploads(counts: Sequence[float]) -> list[float]:
    """What each single-layer client uploads (App. B.5, Sec. 4.2): one layer plus the FFC (the last count)."""
    return [c + counts[-1] for c in counts[:-1]]


def single_layer_deployed(counts: Sequence[float], kept: Sequence[float]) -> list[float]:
    """The deployed model of each single-layer client (App. B.5, P = 0.5): its layer and the FFC whole, every other
    layer at ``kept``."""
    return [sum(kept[:-1]) - kept[i] + counts[i] + counts[-1] for i in range(len(counts) - 1)]


def table4_counts(register: Register) -> dict[str, list[float]]:
    """Table 4's printed parameter counts per model, as count lists (convolutions with their bias, FC layers weights
    only; the FFC last): the CNN of CIFAR-10, CIFAR-100 and Fashion-MNIST and the EMNIST-L MLP."""
    conv1, conv2, fc1, fc2, fc3 = (paper_value(register, f"t4-cnn-{layer}")
                                   for layer in ("conv1", "conv2", "fc1", "fc2", "fc3"))
    return {"CIFAR-10 CNN": [conv1[0], conv2, fc1, fc2, fc3[0]],
            "CIFAR-100 CNN": [conv1[0], conv2, fc1, fc2, fc3[1]],
            "Fashion-MNIST CNN": [conv1[1], conv2, fc1, fc2, fc3[0]],
            "EMNIST-L MLP": [paper_value(register, f"t4-mlp-fc{i}") for i in range(1, 5)]}


def top_class_share(labels: Any, parts: Sequence[Any], k: int = 4) -> list[float]:
    """App. B.2: per client, the share of its samples that belong to its ``k`` most frequent classes (a client's
    ``parts`` entry indexes ``labels``). Raises ``ValueError`` for ``k < 1`` or an empty client."""
    import numpy as np

    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k={k!r} is not valid; accepted: an integer >= 1")
    labels = np.asarray(labels)
    shares = []
    for i, part in enumerate(parts):
        counts = np.bincount(labels[np.asarray(part)])
        if counts.sum() == 0:
            raise ValueError(f"client {i} holds no sample")
        shares.append(float(np.sort(counts)[::-1][:k].sum() / counts.sum()))
    return shares


def split_skew_rows(config: Any, data_root: Any = None, *, k: int = 4, recipes: Mapping[str, dict] | None = None
                    ) -> list[dict[str, Any]]:
    """The top-``k`` class share (:func:`top_class_share`) of every client of ``config``'s split, and of each of
    ``recipes`` (name → :func:`subfl.data.make_partition` arguments) drawn on the same training set with the same
    number of clients and partition seed. One row per split: mean, sd, min and max over the clients."""
    import numpy as np

    from subfl.data import make_partition
    from subfl.experiments.runner import prepare_data
    from subfl.fl import numpy_rng

    dataset, _, parts = prepare_data(config, data_root)
    splits = {"run's split": parts}
    for name, kwargs in (recipes or {}).items():
        kwargs = dict(kwargs)
        splits[name] = make_partition(kwargs.pop("name"), dataset.train.labels, config.num_clients,
                                      numpy_rng(config.seed, "partition"), **kwargs)
    rows = []
    for name, split in splits.items():
        shares = np.array(top_class_share(dataset.train.labels, split, k))
        rows.append({"dataset": config.dataset, "seed": config.seed, "split": name, "clients": len(split),
                     "mean": shares.mean(), "sd": shares.std(ddof=1), "min": shares.min(), "max": shares.max()})
    return rows
