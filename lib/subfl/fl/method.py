"""The Method contract every algorithm implements (FedAvg is the reference).

Server side: :meth:`Method.init`, :meth:`Method.configure`, :meth:`Method.aggregate`,
:meth:`Method.evaluation_models`. Client side: :meth:`Method.local_update`, a pure function of the
:class:`~subfl.fl.types.Task` it received, its own data and a generator — so the same code can run in a
real client process. The engine (not the method) owns client sampling, data, timing, the ledger, the
history, checkpoints and progress bars. This mirrors Flower's ``Strategy`` configure/aggregate split.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from .rng import numpy_rng
from .training import ClientDataset, LocalTraining
from .types import ClientProfile, Task, Update

ServerState = dict[str, Any]
"""A method's server state: a dict of tensors / numbers / small containers (``torch.save``-able)."""


@dataclass(frozen=True)
class ServerContext:
    """What the server side of a method may use: the architecture, schedule, seed and task description."""

    model_fn: Callable[..., nn.Module]
    training: LocalTraining
    rounds: int
    seed: int
    num_classes: int
    input_shape: tuple[int, ...]
    task: str = "classification"
    device: str = "cpu"
    num_clients: int = 1
    heterogeneity_levels: tuple[float, ...] | None = None
    """The keep ratios the run's heterogeneity setting can give a client, when known up front (width methods build
    their per-width models at ``init`` from them)."""
    devices: Sequence[Any] | None = None
    """The declared device population of a budget-driven method (CAFF and its baselines), when not given as the
    method's option ``devices``."""
    pretrained: Any = None
    """Pretrained weights for methods that finetune (a ``{layers: state_dict}`` mapping, a pretraining scale or
    ``"none"``), when not given as the method's option ``pretrained``."""

    part_seconds: dict[str, float] = field(default_factory=dict, compare=False, repr=False)
    """Seconds the server stage now running spent in the parts a method named with :meth:`timed`; the engine moves
    them into the run's timings after each stage (as ``"<stage>/<part>"``). Timings only: never read them."""

    @contextmanager
    def timed(self, part: str) -> Iterator[None]:
        """Time a named part of the server stage now running (``configure`` or ``aggregate``) on the engine's clock,
        e.g. the spectral methods' SVD refresh inside ``aggregate``. What it measures goes to the run's timings,
        never to its history or state, so it changes no result."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.part_seconds[part] = self.part_seconds.get(part, 0.0) + time.perf_counter() - start

    def rng(self, *keys: int | str) -> np.random.Generator:
        """A numpy generator for a server-side draw, derived from (seed, *keys)."""
        return numpy_rng(self.seed, "server", *keys)

    def train_config(self, round: int) -> dict[str, Any]:
        """The optimiser settings of ``round`` (1-based, as the engine numbers rounds); travels to clients
        inside the task config."""
        if not 1 <= round <= self.rounds:
            raise ValueError(f"round must be in [1, {self.rounds}], got {round}")
        return self.training.round_config(round - 1, self.rounds)


@dataclass(frozen=True)
class ClientContext:
    """What a client's code may use besides its task and data: the architecture code and its generator."""

    model_fn: Callable[..., nn.Module]
    generator: torch.Generator
    device: str = "cpu"
    task: str = "classification"
    num_classes: int = 0


class Method:
    """Base class of every federated algorithm in :mod:`subfl.methods`.

    Subclasses set ``name`` and ``options`` (a dict of option name → default) and implement the five
    methods below. Options arrive as keyword arguments; unknown ones raise a ``ValueError`` naming them.
    """

    name: ClassVar[str] = "method"
    options: ClassVar[dict[str, Any]] = {}
    version: ClassVar[int] = 1
    """Bumped whenever the method computes something different from the same inputs (part of every run key,
    :mod:`subfl.experiments.provenance`; its golden runs in ``tests/golden`` enforce it)."""
    option_versions: ClassVar[dict[str, int]] = {}
    """Versions of behaviour-changing options: a run that sets one away from its default carries its version too, so
    changing what ``factor_decay='frobenius'`` does re-keys only the runs that use it."""
    uses_keep_ratios: ClassVar[bool] = True
    """Whether the method reads the clients' keep ratios (``ServerContext.heterogeneity_levels`` and the profiles'
    levels). A method that trains the full model on every client sets it to ``False``: a configuration that gives
    it keep ratios below 1 is then reported as ignored (:func:`subfl.experiments.config.ignored_settings`)."""

    def __init__(self, **options: Any) -> None:
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            accepted = ", ".join(sorted(self.options)) or "none"
            raise ValueError(f"unknown option(s) {unknown} for method {self.name!r}; accepted: {accepted}")
        self.config = {**self.options, **options}

    @classmethod
    def behaviour_versions(cls, options: Mapping[str, Any]) -> dict[str, int]:
        """``{"method:<name>": version}`` plus ``"method:<name>.<option>"`` for each option of
        :attr:`option_versions` that ``options`` sets away from its default."""
        versions = {f"method:{cls.name}": cls.version}
        for option, version in cls.option_versions.items():
            if option in options and options[option] != cls.options.get(option):
                versions[f"method:{cls.name}.{option}"] = version
        return versions

    # ----- server side -------------------------------------------------------------------------------
    def init(self, ctx: ServerContext) -> ServerState:
        """Initial server state (e.g. the global model's weights)."""
        raise NotImplementedError

    def configure(self, state: ServerState, round: int, clients: Sequence[ClientProfile],
                  ctx: ServerContext) -> dict[int, Task]:
        """One task per selected client for ``round``."""
        raise NotImplementedError

    def aggregate(self, state: ServerState, round: int, updates: Sequence[Update],
                  ctx: ServerContext) -> ServerState:
        """The new server state from the clients' updates."""
        raise NotImplementedError

    def evaluation_models(self, state: ServerState, ctx: ServerContext) -> dict[str, nn.Module]:
        """Models to evaluate on the test set, by group name (``"global"`` for the single global model)."""
        raise NotImplementedError

    def personalized_models(self, state: ServerState, round: int, client: ClientProfile,
                            models: Mapping[str, nn.Module], ctx: ServerContext) -> Mapping[str, nn.Module]:
        """The models ``client`` (its profile in ``round``) is scored with on its own local test set after
        ``round`` was aggregated (the engine's personalised evaluation, FedP3 §5); ``models`` are this round's
        :meth:`evaluation_models`, and the result must use the same group names. Default: ``models``, for every
        client."""
        return models

    def round_metrics(self, state: ServerState, round: int) -> dict[tuple[str, str], float]:
        """Method-specific diagnostics of the round just aggregated, ``{(metric, group): value}``.

        The engine adds them to the history (e.g. the effective rank of each layer, ANME of the sampling
        probabilities). Default: none.
        """
        return {}

    # ----- client side -------------------------------------------------------------------------------
    def local_update(self, task: Task, data: ClientDataset, ctx: ClientContext) -> Update:
        """Train on the client's data; a pure function of (task, data, generator)."""
        raise NotImplementedError


def clone_tensors(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Detached CPU copies of a tensor dict (what is put on the wire)."""
    return {k: v.detach().to("cpu").clone() for k, v in tensors.items()}
