"""The FedP3 chapter (Yi et al., "FedP3: Federated Personalized and Privacy-friendly Network Pruning under Model
Heterogeneity"): the single-layer-client figures of App. B.5 and Sec. 4.2 that ``notebooks/fedp3/communication.ipynb``
recomputes from Table 4's printed counts and from the library's nets.

A *count list* holds one parameter count per layer in forward order, the final fully-connected layer (FFC) last.
"""
from __future__ import annotations

from collections.abc import Sequence
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
