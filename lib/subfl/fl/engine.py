"""The round loop: client sampling, configure → local updates → aggregate, ledger, history, checkpoints.

One round (DESIGN.md, "One round, as data flows"):

    server state ─configure─▶ {client: Task} ─(ledger: down)─▶ local_update ─(ledger: up)─▶ aggregate

Rounds are numbered from 1. Client selection in round t uses a generator derived from (seed, "select", t)
and client c's local training one derived from (seed, "local", t, c), so a run is a pure function of its
configuration and seed, and a run resumed from a checkpoint replays exactly the draws it would have made.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from ..data.base import FederatedDataset
from ..files import write_atomically
from .method import ClientContext, Method, ServerContext, ServerState
from .history import History
from .ledger import Ledger
from .profiles import ClientProfile, Heterogeneity
from .rng import numpy_rng, torch_generator
from .training import ClientDataset, evaluate

CHECKPOINT_NAME = "checkpoint.pt"

EXPLOSION_FACTOR = 100.0
"""A round whose sample-weighted mean training loss exceeds ``EXPLOSION_FACTOR × max(1, ln C)`` — a hundred times
the cross-entropy of a uniform guess over the task's ``C`` classes (tokens for a language model) — has diverged
although its loss is finite (e.g. a learning rate far too large). No run that learns comes near it: the largest
training loss among the book's recorded runs is 18 against a threshold of 230 for ten classes."""


TRAIN_SET_PREFIX = "train_set_"
"""Prefix of the metrics of the evaluation models on ``train_eval_data`` (``train_set_loss``, ``train_set_accuracy``):
the global objective on training data, not the clients' running ``train_loss`` of their local steps."""


@dataclass(frozen=True)
class EngineSettings:
    """How the engine runs a simulation (not what it simulates)."""

    rounds: int
    clients_per_round: int
    eval_every: int = 1
    eval_batch_size: int = 500
    checkpoint_every: int = 1
    seed: int = 0
    device: str = "cpu"

    def __post_init__(self) -> None:
        for name in ("rounds", "clients_per_round", "eval_every", "eval_batch_size", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class SimulationResult:
    """Everything a run produced."""

    history: History
    ledger: Ledger
    timings: list[tuple[int, str, float]]
    state: ServerState
    rounds_completed: int
    wall_time_s: float
    resumed_from: int = 0
    diverged_at: int | None = None

    @property
    def finished(self) -> bool:
        """True when the run reached its last round or stopped because it diverged."""
        return self.diverged_at is not None


def progress_enabled(progress: bool | None) -> bool:
    """Progress bars are on when asked; by default only in a terminal or a Jupyter kernel, and never under CI
    or with ``TQDM_DISABLE`` set."""
    if progress is not None:
        return progress
    if os.environ.get("CI") or os.environ.get("TQDM_DISABLE"):
        return False
    interactive = "ipykernel" in sys.modules
    return interactive or bool(getattr(sys.stderr, "isatty", lambda: False)())


def select_clients(num_clients: int, clients_per_round: int, seed: int, round: int) -> np.ndarray:
    """The sorted ids of the clients sampled uniformly without replacement in ``round``."""
    if clients_per_round > num_clients:
        raise ValueError(f"clients_per_round must be <= num_clients ({num_clients}), got {clients_per_round}")
    if clients_per_round == num_clients:
        return np.arange(num_clients)
    return np.sort(numpy_rng(seed, "select", round).choice(num_clients, clients_per_round, replace=False))


def _save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    write_atomically(path, lambda tmp: torch.save(payload, tmp))


def run_simulation(method: Method, dataset: FederatedDataset, client_indices: Sequence[np.ndarray],
                   heterogeneity: Heterogeneity, ctx: ServerContext, settings: EngineSettings, *,
                   test_data=None, out_dir: str | Path | None = None, fingerprint: str = "",
                   progress: bool | None = None, stop_after_round: int | None = None,
                   description: str = "", client_test_indices: Sequence[np.ndarray] | None = None,
                   train_eval_data=None) -> SimulationResult:
    """Run ``method`` for ``settings.rounds`` rounds over the clients' index sets of ``dataset.train``.

    With ``out_dir`` the state is checkpointed every ``checkpoint_every`` rounds; started again with the same
    ``fingerprint`` it resumes from the last checkpoint (a different fingerprint raises ``ValueError``).
    A round in which a client's training loss is not finite, or whose mean training loss exceeds
    :func:`explosion_threshold`, ends the run: the history gets a ``diverged`` row for that
    round, nothing is aggregated or evaluated, and ``diverged_at`` is set.
    ``stop_after_round`` ends the call early after that round (as an interruption would).

    Evaluation: every model of ``method.evaluation_models`` on ``test_data`` (a model returned under several
    group names is evaluated once). With ``client_test_indices`` (one index array into ``dataset.train`` per
    client: its held-out local test set) each group's model is also scored on every client's local test set and
    the history gets ``local_<metric>`` rows: the unweighted mean over clients of their local values (the
    personalised evaluation of FedP3 §5), with the models :meth:`~subfl.fl.method.Method.personalized_models` gives
    each client (by default the global ones). With ``train_eval_data`` (training samples, e.g.
    :func:`subfl.experiments.runner.train_eval_subset`) the same models are scored on it too, as
    ``train_set_<metric>`` rows: the global objective on training data.
    """
    num_clients = len(client_indices)
    if num_clients < 1:
        raise ValueError("client_indices must hold at least one client")
    select_clients(num_clients, settings.clients_per_round, settings.seed, 1)  # validates sizes
    test_data = dataset.test if test_data is None else test_data
    clients = [ClientDataset(dataset.train, idx) for idx in client_indices]
    if client_test_indices is not None and len(client_test_indices) != num_clients:
        raise ValueError(f"client_test_indices must hold one index array per client ({num_clients}), "
                         f"got {len(client_test_indices)}")
    local_tests = (None if client_test_indices is None else
                   [dataset.train.subset(idx) if len(idx) else None for idx in client_test_indices])
    history, ledger, timings = History(), Ledger(), []
    start_round, elapsed_before, diverged_at = 0, 0.0, None
    checkpoint = Path(out_dir) / CHECKPOINT_NAME if out_dir is not None else None
    state: ServerState | None = None
    if checkpoint is not None and checkpoint.exists():
        try:
            saved = torch.load(checkpoint, map_location="cpu", weights_only=False)
            _ = saved["fingerprint"], saved["round"], saved["state"]  # a checkpoint of this engine
        except Exception as err:  # truncated or overwritten: say which file, rather than a deserialisation traceback
            raise ValueError(f"out_dir {out_dir} holds a checkpoint that cannot be read ({checkpoint}: "
                             f"{type(err).__name__}); delete it to start the run again") from None
        if saved["fingerprint"] != fingerprint:
            raise ValueError(f"out_dir {out_dir} holds a checkpoint of a different run (fingerprint "
                             f"{saved['fingerprint'][:12]} != {fingerprint[:12]}); use another out_dir or delete it")
        state, start_round = saved["state"], saved["round"]
        history.rows, ledger.rows, timings = saved["history"], saved["ledger"], saved["timings"]
        elapsed_before = saved["elapsed"]
        diverged_at = start_round if saved.get("diverged") else None
    t_start = time.perf_counter()
    if state is None:
        state = method.init(ctx)
    last = settings.rounds if stop_after_round is None else min(settings.rounds, stop_after_round)
    if diverged_at is not None:
        last = diverged_at  # a diverged run is finished: nothing to resume
    bar = tqdm(range(start_round + 1, last + 1), desc=description or method.name, unit="round",
               disable=not progress_enabled(progress), leave=False, initial=start_round, total=settings.rounds)
    ctx.part_seconds.clear()  # a part timed before the first round (in init) belongs to no stage
    for rnd in bar:
        profiles = heterogeneity.profiles(num_clients, settings.seed, rnd)
        selected = select_clients(num_clients, settings.clients_per_round, settings.seed, rnd)
        t0 = time.perf_counter()
        tasks = method.configure(state, rnd, [profiles[c] for c in selected], ctx)
        timings.append((rnd, "configure", time.perf_counter() - t0))
        timings.extend(_stage_parts(ctx, rnd, "configure"))
        updates, t_local = [], 0.0
        for cid in selected:
            task = tasks.get(int(cid))
            if task is None:
                continue
            ledger.record(rnd, int(cid), "down", task.tensors, task.config)
            cctx = ClientContext(ctx.model_fn, torch_generator(settings.seed, "local", rnd, int(cid)),
                                 settings.device, ctx.task, ctx.num_classes)
            t0 = time.perf_counter()
            with torch.random.fork_rng(devices=[]):  # layers such as dropout read the global generator
                torch.manual_seed(int(numpy_rng(settings.seed, "torch-global", rnd, int(cid)).integers(2**62)))
                update = method.local_update(task, clients[cid], cctx)
            t_local += time.perf_counter() - t0
            ledger.record(rnd, int(cid), "up", update.tensors, update.stats, n_samples=update.n_samples)
            updates.append(update)
        timings.append((rnd, "local_train", t_local))
        diverged = any(not math.isfinite(float(u.stats.get("loss", 0.0))) for u in updates)
        round_loss = None if diverged else mean_training_loss(updates)
        if round_loss is not None:
            history.add(rnd, "train_loss", round_loss)
            diverged = round_loss > explosion_threshold(ctx.num_classes)
        if diverged:  # the run is over: record it and stop, rather than average NaNs for the remaining rounds
            history.add(rnd, "diverged", 1.0)
            last = diverged_at = rnd
            bar.set_postfix(diverged=f"round {rnd}")
        elif updates:
            t0 = time.perf_counter()
            state = method.aggregate(state, rnd, updates, ctx)
            timings.append((rnd, "aggregate", time.perf_counter() - t0))
            timings.extend(_stage_parts(ctx, rnd, "aggregate"))
            for (metric, group), value in method.round_metrics(state, rnd).items():
                history.add(rnd, metric, value, group)
        if (rnd % settings.eval_every == 0 or rnd == settings.rounds) and not diverged:
            t0 = time.perf_counter()
            models = method.evaluation_models(state, ctx)
            for (metric, group), value in _evaluate_models(models, test_data, settings, ctx.task).items():
                history.add(rnd, metric, value, group)
            timings.append((rnd, "evaluate", time.perf_counter() - t0))
            if train_eval_data is not None:
                t0 = time.perf_counter()
                for (metric, group), value in _evaluate_models(models, train_eval_data, settings, ctx.task).items():
                    history.add(rnd, f"{TRAIN_SET_PREFIX}{metric}", value, group)
                timings.append((rnd, "evaluate_train", time.perf_counter() - t0))
            if local_tests is not None:
                t0 = time.perf_counter()
                for (metric, group), value in _local_evaluation(method, state, rnd, profiles, ctx, models,
                                                                local_tests, settings).items():
                    history.add(rnd, f"local_{metric}", value, group)
                timings.append((rnd, "evaluate_local", time.perf_counter() - t0))
            acc = history.last("accuracy")
            if not math.isnan(acc):
                bar.set_postfix(acc=f"{acc:.3f}")
        if checkpoint is not None and (rnd % settings.checkpoint_every == 0 or rnd == last or diverged):
            _save_checkpoint(checkpoint, {
                "fingerprint": fingerprint, "round": rnd, "state": state, "history": history.rows,
                "ledger": ledger.rows, "timings": timings,
                "elapsed": elapsed_before + time.perf_counter() - t_start, "diverged": diverged})
        if diverged:
            break
    bar.close()
    return SimulationResult(history, ledger, timings, state, last, elapsed_before + time.perf_counter() - t_start,
                            resumed_from=start_round, diverged_at=diverged_at)


def explosion_threshold(num_classes: int) -> float:
    """The mean training loss above which a round has diverged: :data:`EXPLOSION_FACTOR` × max(1, ln C)."""
    return EXPLOSION_FACTOR * max(1.0, math.log(max(1, num_classes)))


def mean_training_loss(updates: Sequence) -> float | None:
    """The round's training loss: the clients' reported ``loss`` weighted by their ``n_samples`` (None when no
    client reported one or no client trained on any sample)."""
    losses = [(float(u.stats["loss"]), u.n_samples) for u in updates if u.stats.get("loss") is not None]
    if not losses or sum(u.n_samples for u in updates) == 0:
        return None
    return sum(loss * n for loss, n in losses) / max(1, sum(n for _, n in losses))


def _evaluate_models(models: dict[str, torch.nn.Module], data, settings: EngineSettings,
                     task: str) -> dict[tuple[str, str], float]:
    """``{(metric, group): value}`` of every model on ``data``; a model object listed under several groups (e.g.
    FLANC's full-width model, also its ``global`` model) is evaluated once."""
    done: dict[int, dict[str, float]] = {}
    out: dict[tuple[str, str], float] = {}
    for group, model in models.items():
        if id(model) not in done:
            done[id(model)] = evaluate(model.to(settings.device), data, batch_size=settings.eval_batch_size,
                                       device=settings.device, task=task)
        out.update({(metric, group): value for metric, value in done[id(model)].items()})
    return out


def _local_evaluation(method: Method, state: ServerState, rnd: int, profiles: Sequence[ClientProfile],
                      ctx: ServerContext, models: dict[str, torch.nn.Module], local_tests: Sequence[Any],
                      settings: EngineSettings) -> dict[tuple[str, str], float]:
    """Mean over clients (each counted once, clients without local test data skipped) of every group's metrics
    on the client's local test set, with the models :meth:`Method.personalized_models` gives each client (its
    profile of round ``rnd``)."""
    sums: dict[tuple[str, str], float] = {}
    count = 0
    for cid, data in enumerate(local_tests):
        if data is None:
            continue
        client_models = method.personalized_models(state, rnd, profiles[cid], models, ctx)
        if set(client_models) != set(models):
            raise ValueError(f"{type(method).__name__}.personalized_models must return the groups of "
                             f"evaluation_models ({sorted(models)}), got {sorted(client_models)}")
        for key, value in _evaluate_models(client_models, data, settings, ctx.task).items():
            sums[key] = sums.get(key, 0.0) + value
        count += 1
    return {key: total / count for key, total in sums.items()} if count else {}


def _stage_parts(ctx: ServerContext, rnd: int, stage: str) -> list[tuple[int, str, float]]:
    """The parts of ``stage`` the method timed with :meth:`ServerContext.timed`, as timing rows ``"<stage>/<part>"``;
    the context's clock is emptied for the next stage."""
    rows = [(rnd, f"{stage}/{part}", seconds) for part, seconds in ctx.part_seconds.items()]
    ctx.part_seconds.clear()
    return rows


def write_timings(timings: Sequence[tuple[int, str, float]], path: str | Path) -> None:
    """Per-round, per-stage wall time (seconds) as CSV."""
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("round,stage,seconds\n")
        for r, stage, s in timings:
            fh.write(f"{r},{stage},{s:.6f}\n")


def dump_json(obj: Any, path: str | Path) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=2, sort_keys=True, default=str)
        fh.write("\n")
