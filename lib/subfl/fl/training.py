"""Local training and evaluation: the pieces every method's client code shares.

``LocalTraining`` describes the optimiser and schedule; the engine turns it into a per-round
``train_config`` dict that travels inside each :class:`~subfl.fl.types.Task` (so the client's work is a
pure function of what it received). ``train_epochs`` runs the loop; ``evaluate`` scores a model.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ..data.base import ArrayData

OPTIMIZERS = ("sgd", "adam", "adamw")
LR_SCHEDULES = ("constant", "cosine", "step")

SCHEDULE_VERSIONS = {"constant": 1, "cosine": 2, "step": 1}
"""Version of each learning-rate schedule (part of the run key of every run that uses a non-constant one).
``cosine`` v2: round t of T trains at ``lr_min + (lr - lr_min)(1 + cos(π t / T)) / 2`` (SGDR's annealing without
restarts, Loshchilov & Hutter 2017, Eq. 5, with T_cur = t rounds done); v1 used ``t / (T - 1)`` and so trained the last
round at ``lr_min`` (0 by default), a round of no learning."""


@dataclass(frozen=True)
class LocalTraining:
    """Client optimiser settings and the server-side learning-rate schedule across rounds.

    ``lr_schedule``: ``constant``; ``cosine`` (annealed from ``lr`` towards ``lr_min`` over the run's rounds: round
    ``t`` (0-based) of ``T`` uses ``lr_min + (lr - lr_min)(1 + cos(π t/T))/2``, so every round learns);
    ``step`` (multiplied by ``lr_decay`` at each round listed in ``lr_milestones``, given as fractions of the
    run). ``local_steps``, when set, replaces ``local_epochs`` by a fixed number of mini-batches.
    """

    optimizer: str = "sgd"
    lr: float = 0.05
    momentum: float = 0.0
    weight_decay: float = 0.0
    local_epochs: int = 1
    local_steps: int | None = None
    batch_size: int = 32
    lr_schedule: str = "constant"
    lr_min: float = 0.0
    lr_decay: float = 0.1
    lr_milestones: tuple[float, ...] = (0.5, 0.75)
    grad_clip: float | None = None

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"lr_schedule must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if self.local_epochs < 1:
            raise ValueError(f"local_epochs must be >= 1, got {self.local_epochs}")
        if self.local_steps is not None and self.local_steps < 1:
            raise ValueError(f"local_steps must be >= 1 or None, got {self.local_steps}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")

    def lr_at(self, round: int, rounds: int) -> float:
        """Learning rate of ``round`` (0-based) in a run of ``rounds`` rounds."""
        if self.lr_schedule == "cosine":
            t = round / rounds
            return self.lr_min + 0.5 * (self.lr - self.lr_min) * (1 + math.cos(math.pi * t))
        if self.lr_schedule == "step":
            passed = sum(1 for m in self.lr_milestones if round >= m * rounds)
            return self.lr * self.lr_decay ** passed
        return self.lr

    def round_config(self, round: int, rounds: int) -> dict[str, Any]:
        """The JSON-able training settings a client receives in ``round``."""
        cfg = {k: v for k, v in asdict(self).items()
               if k not in ("lr_schedule", "lr_min", "lr_decay", "lr_milestones")}
        cfg["lr"] = self.lr_at(round, rounds)
        return cfg


def make_optimizer(params, config: dict[str, Any]) -> torch.optim.Optimizer:
    """Build the optimiser a client uses from its round config (see :meth:`LocalTraining.round_config`)."""
    name, lr, wd = config["optimizer"], config["lr"], config.get("weight_decay", 0.0)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=config.get("momentum", 0.0), weight_decay=wd)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=wd)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=wd)
    raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {name!r}")


class ClientDataset:
    """One client's samples: indices into shared tensors (no copies), batched on demand.

    Batches index the dataset's tensors, so zero-copy windowed text tensors stay zero-copy until a
    mini-batch is drawn.
    """

    def __init__(self, data: ArrayData, indices: np.ndarray) -> None:
        self.data = data
        self.indices = torch.as_tensor(np.asarray(indices, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.indices)

    def batches(self, batch_size: int, generator: torch.Generator, shuffle: bool = True,
                ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """One pass over the client's data in mini-batches (shuffled with ``generator``)."""
        order = self.indices
        if shuffle:
            order = order[torch.randperm(len(order), generator=generator)]
        starts = list(range(0, len(order), batch_size))
        if len(starts) > 1 and len(order) - starts[-1] == 1:
            starts.pop()  # a trailing batch of one sample joins the previous batch (BatchNorm needs > 1)
        for i, start in enumerate(starts):
            stop = starts[i + 1] if i + 1 < len(starts) else len(order)
            idx = order[start:stop]
            yield self.data.x[idx], self.data.y[idx]

    def labels(self) -> np.ndarray:
        return self.data.y[self.indices].numpy()


LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def default_loss(output: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy: of class logits ``(B, C)`` against ``y``; of a causal language model's ``(B, T, V)``
    logits over all ``B·T`` positions, where position ``i`` predicts ``x[:, i + 1]`` and the last predicts ``y``
    (the next-token datasets give a window ``x`` and the token after it, ``y``)."""
    if output.dim() == 3:
        targets = torch.cat([x[:, 1:], y.reshape(-1, 1).to(x.dtype)], dim=1)
        return F.cross_entropy(output.reshape(-1, output.shape[-1]), targets.reshape(-1))
    return F.cross_entropy(output, y)


def train_epochs(model: nn.Module, data: ClientDataset, config: dict[str, Any], generator: torch.Generator,
                 *, device: str | torch.device = "cpu", loss_fn: LossFn | None = None,
                 params=None, regulariser: Callable[[], torch.Tensor] | None = None,
                 before_step: Callable[[], None] | None = None,
                 no_weight_decay: Iterable[torch.Tensor] = ()) -> dict[str, float]:
    """Train ``model`` in place on a client's data for ``local_epochs`` (or ``local_steps``) mini-batches.

    ``loss_fn(output, y)`` replaces :func:`default_loss`; ``params`` restricts the optimised parameters (default:
    every parameter that requires grad);
    ``regulariser`` adds a penalty to each mini-batch loss (included in the returned loss); ``before_step`` may
    edit gradients (e.g. clipped learning rates); ``no_weight_decay``: parameters the optimiser does not decay
    (a second parameter group with weight decay 0; the others keep ``config["weight_decay"]``). Returns
    ``{"loss": mean training loss, "steps": mini-batches}``.
    """
    model.train()
    params = [p for p in (model.parameters() if params is None else params) if p.requires_grad]
    undecayed = {id(p) for p in no_weight_decay}
    groups = params if not undecayed else [
        {"params": [p for p in params if id(p) not in undecayed]},
        {"params": [p for p in params if id(p) in undecayed], "weight_decay": 0.0}]
    optimizer = make_optimizer(groups, config)
    batch_size = int(config["batch_size"])
    max_steps = config.get("local_steps")
    epochs = int(config.get("local_epochs", 1)) if max_steps is None else math.inf
    total, steps, epoch = 0.0, 0, 0
    while epoch < epochs and (max_steps is None or steps < max_steps):
        for x, y in data.batches(batch_size, generator):
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            output = model(x)
            loss = default_loss(output, x, y) if loss_fn is None else loss_fn(output, y)
            if regulariser is not None:
                loss = loss + regulariser()
            loss.backward()
            if before_step is not None:
                before_step()
            if config.get("grad_clip"):
                torch.nn.utils.clip_grad_norm_(params, config["grad_clip"])
            optimizer.step()
            total += float(loss.detach())
            steps += 1
            if max_steps is not None and steps >= max_steps:
                break
        epoch += 1
        if len(data) == 0:
            break
    return {"loss": total / max(1, steps), "steps": steps}


EVALUATION_ORDER_SEED = 0
"""Seed of the fixed permutation in which a model with batch statistics is evaluated (:func:`evaluation_batches`)."""


def uses_batch_statistics(model: nn.Module) -> bool:
    """Whether ``model`` normalises with the statistics of the batch at evaluation — a BatchNorm layer without
    running statistics (``norm="bn_nostats"``, the static batch norm of PriSM, HeteroFL and FLANC) — so that a
    sample's output depends on the other samples of its batch."""
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) and (m.running_mean is None or m.running_var is None)
               for m in model.modules())


def evaluation_batches(model: nn.Module, n: int, batch_size: int) -> list[slice | torch.Tensor]:
    """The batches in which ``model`` scores ``n`` stored samples, as indices covering each sample once.

    Contiguous slices in storage order when the model's outputs do not depend on the batch. For a model with batch
    statistics (:func:`uses_batch_statistics`), slices of one fixed pseudo-random permutation (seed
    :data:`EVALUATION_ORDER_SEED`), so that every batch is a uniform sample of the data whatever order it is stored
    in: the CIFAR-10 test file is sorted by class, and the statistics of a one-class batch normalise away what tells
    the classes apart (measured: VGG-11 trained to 0.45 scored 0.14 in storage order).
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} is not valid; accepted: an int >= 1")
    if not uses_batch_statistics(model):
        return [slice(start, start + batch_size) for start in range(0, n, batch_size)]
    order = torch.randperm(n, generator=torch.Generator().manual_seed(EVALUATION_ORDER_SEED))
    return [order[start:start + batch_size] for start in range(0, n, batch_size)]


@torch.no_grad()
def evaluate(model: nn.Module, data: ArrayData, *, batch_size: int = 500, device: str | torch.device = "cpu",
             task: str = "classification") -> dict[str, float]:
    """Top-1 accuracy and mean cross-entropy of ``model`` on ``data`` (plus perplexity for next-token tasks),
    in the batches of :func:`evaluation_batches`.

    Models whose output has a time axis ``(B, T, V)`` are scored on the last position, the next-token
    convention of the datasets in :mod:`subfl.data`.
    """
    model.eval()
    correct, loss_sum, n = 0, 0.0, len(data)
    for batch in evaluation_batches(model, n, batch_size):
        x = data.x[batch].to(device)
        y = data.y[batch].to(device)
        logits = model(x)
        if logits.dim() == 3:
            logits = logits[:, -1, :]
        loss_sum += float(F.cross_entropy(logits, y, reduction="sum"))
        correct += int((logits.argmax(dim=1) == y).sum())
    out = {"accuracy": correct / max(1, n), "loss": loss_sum / max(1, n)}
    if task == "next_token":
        out["perplexity"] = math.exp(min(out["loss"], 50.0))
    return out
