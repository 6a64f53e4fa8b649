"""Helpers of the PriSM chapter (notebooks/prism): per-seed accuracies and drops, kernel coverage, the scorecard
rows the pages share, and the seeded model factory of the memory-efficient page's numerical checks.

Niu et al., "Overcoming Resource Constraints in Federated Learning: Large Models Can Be Trained with only Weak
Clients" (TMLR 2023); the heterogeneous page also scores Korzhenkov & Louizos, "On Sampling Strategies for Spectral
Model Sharding" (Table 1).
"""
from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any

import torch

from subfl.experiments.config import ExperimentConfig
from subfl.experiments.runner import RunResult
from subfl.models import build_model

from ..scorecard import Scorecard
from ..verdict import Band, Verdict


def covered_fraction(result: RunResult, how: str = "mean") -> float:
    """The share of each decomposed layer's terms trained by at least one client in a round (``covered_fraction``
    in the run history), ``"mean"`` or ``"worst"`` (minimum) over the rounds and layers: PriSM's kernel coverage
    of Fig. 9, Sec. 4.5 and the abstract's "nearly all" kernels."""
    if how not in ("mean", "worst"):
        raise ValueError(f"how must be 'mean' or 'worst', not {how!r}")
    values = result.history[result.history["metric"] == "covered_fraction"]["value"]
    return values.mean() if how == "mean" else values.min()


def seed_drops(reference: Sequence[float], values: Sequence[float]) -> list[float]:
    """Per seed, ``reference`` minus ``values`` (points when both are in %; NaN where either diverged): a
    method's drop below the full model (Figs. 5 and 11) or a variant's loss against plain PriSM (abstract)."""
    return [ref - value for ref, value in zip(reference, values)]


def best_of(acc: Mapping[Hashable, Sequence[float]], candidates: Iterable[Hashable], *, chance: float) -> Hashable:
    """The candidate with the highest mean accuracy over the seeds, a diverged seed counted at ``chance`` as the
    verdict rule counts it (candidates absent from ``acc`` are skipped; the first wins a tie): the "best rival"
    that PriSM's Fig. 5, Sec. 4.3 and conclusion compare it with."""
    present = [c for c in candidates if c in acc]
    if not present:
        raise ValueError("none of the candidates has accuracies")
    return max(present, key=lambda c: Band.of(acc[c], chance).mean)


def accuracy_order(card: Scorecard, claim: str, against: str, acc: Mapping[Hashable, Sequence[float]],
                   configs: Mapping[Hashable, ExperimentConfig], first: Hashable, second: Hashable, *, setting: str,
                   chance: float) -> Verdict:
    """Scores the paper's ordering of two table cells (``claim`` vs ``against``, e.g. Table 3's α = 0.1 row or
    spectral sharding's Table 1) against our final accuracies of ``first`` and ``second`` (per seed, in %)."""
    return card.order(claim, against, acc[first], acc[second], chance=chance, config=configs[first],
                      note=f"{first} vs {second}, {setting} (final accuracy, %)")


def stated_accuracy_order(card: Scorecard, claim: str, acc: Mapping[Hashable, Sequence[float]],
                          configs: Mapping[Hashable, ExperimentConfig], first: Hashable, second: Hashable, *,
                          what: str, setting: str, chance: float) -> Verdict:
    """Scores an ordering the paper states in words (e.g. Sec. 4.3, Fig. 5: ``first`` above ``second``) against our
    final accuracies of the two methods (per seed, in %)."""
    return card.stated_order(claim, acc[first], acc[second], chance=chance, config=configs[first],
                             what=f"{what}, {setting} (final accuracy, %)")


def prism_drop_bound(card: Scorecard, claim: str, acc: Mapping[str, Sequence[float]],
                     configs: Mapping[str, ExperimentConfig], *, setting: str, reading: str,
                     limit: float = 2.0) -> Verdict:
    """Scores PriSM's drop below full-model FedAvg (per seed, in points; ``acc`` in % by method) as at most
    ``limit``: the abstract's and conclusion's "about 2 points" at 0.2×, Sec. 1's "marginal", Fig. 5's
    "comparable to full-model training"."""
    drops = seed_drops(acc["fedavg"], acc["prism"])   # NaN if a run diverged
    return card.bound(claim, drops, at_most=True, limit=limit, config=configs["prism"],
                      note=f"PriSM's drop below FedAvg, {setting} (points; {reading})")


def seeded_model_fn(config: ExperimentConfig, *, seed: int = 0, num_classes: int = 10,
                    input_shape: tuple[int, ...] = (3, 32, 32)) -> Callable[..., torch.nn.Module]:
    """A ``ServerContext.model_fn`` building ``config``'s model (at its width unless given one) from the global
    torch seed ``seed``, so every call gives the same weights; it carries ``width`` as the runner's factory does.
    Serves the memory-efficient page's numerical checks of Sec. 3.2.1 and Eq. (5)."""

    def model_fn(width: float | None = None, **_: Any) -> torch.nn.Module:
        torch.manual_seed(seed)
        return build_model(config.model, num_classes=num_classes, input_shape=input_shape,
                           width=config.width if width is None else width)

    model_fn.width = config.width
    return model_fn
