"""SplitMix (Hong, Wang, Wang & Zhou, "Efficient Split-Mix Federated Learning for On-Demand and In-Situ
Customization", ICLR 2022) — PriSM's ensemble baseline.

The global model is split into K *atoms*: K independent networks of the configured architecture at width w/K
(w the experiment's width). Their ensemble — the mean of the atoms' logits — is the model that is evaluated.

* **Which atoms a client trains.** A client with keep ratio r can afford m = ⌊r·K⌋ atoms (r·K rounded down; a
  client that cannot afford one atom is an error naming its keep ratio). Each round it trains m distinct atoms
  drawn uniformly at random from the K (a server-side draw per (round, client)). SplitMix's released code chooses
  atoms by a rotating offset so that they are trained evenly; a uniform draw is even in expectation and is what we
  implement.
* **Local training.** Each assigned atom is trained on the client's data independently (its own forward and
  loss, the experiment's training settings), as SplitMix's base models are.
* **Upload and aggregation.** The client uploads only its atoms; each atom is averaged with weights n_k over the
  clients that trained it (FedAvg per atom); an atom nobody trained keeps its weights. BatchNorm statistics travel
  with their atom and are averaged likewise (SplitMix's dual BatchNorm for adversarial training is not modelled).
* **Initialisation.** Atom 0 is the experiment's model at width w/K; every other atom is re-drawn from the same
  default initialisation (each module's ``reset_parameters``) under a generator seeded by (seed, atom), so the
  atoms start independent, as separately built networks do.

Option ``atoms`` (K, default 5: atoms of width 1/5, the affordable unit of a client with r = 0.2). The history
gets ``atoms_trained`` per round (mean over clients) and ``atom_clients`` / ``<k>`` (how many clients trained
atom k).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..fl.aggregation import weighted_average
from ..fl.rng import seed_sequence
from ..fl.training import ClientDataset, train_epochs
from ..fl.types import ClientProfile, Task, Update
from ..fl.method import ClientContext, Method, ServerContext, ServerState, clone_tensors
from .width import global_width, model_width


class AtomEnsemble(nn.Module):
    """K networks evaluated as one: the mean of their outputs (logits)."""

    def __init__(self, atoms: Sequence[nn.Module]) -> None:
        super().__init__()
        if not atoms:
            raise ValueError("AtomEnsemble needs at least one atom")
        self.atoms = nn.ModuleList(atoms)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([atom(x) for atom in self.atoms]).mean(dim=0)


def affordable_atoms(keep_ratio: float, atoms: int) -> int:
    """m = ⌊r·K⌋, the atoms a client with keep ratio ``keep_ratio`` trains (a 1e-9 slack absorbs float error)."""
    m = int(math.floor(float(keep_ratio) * atoms + 1e-9))
    if m < 1:
        raise ValueError(f"a client with keep ratio {keep_ratio:g} cannot afford one SplitMix atom of width 1/{atoms}: "
                         f"option atoms must be at least {math.ceil(1 / float(keep_ratio) - 1e-9)} for it")
    return m


def _atom_key(index: int, name: str) -> str:
    return f"atoms.{index}.{name}"


class SplitMix(Method):
    """SplitMix: K narrow atoms trained by the clients that can afford them, evaluated as an ensemble."""

    name = "splitmix"
    options: dict = {"atoms": 5}

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        k = self.config["atoms"]
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"option atoms must be an integer ≥ 1, got {k!r}")

    def atom_width(self, ctx: ServerContext | ClientContext) -> float:
        """The width every atom is built at: the experiment's width / K."""
        return model_width(global_width(ctx.model_fn), 1.0 / self.config["atoms"])

    def _atom(self, ctx: ServerContext | ClientContext, index: int, seed: int | None = None) -> nn.Module:
        model = ctx.model_fn(width=self.atom_width(ctx))
        if index > 0 and seed is not None:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(int(seed_sequence(seed, "splitmix-atom", index).generate_state(1)[0]))
                for module in model.modules():
                    if hasattr(module, "reset_parameters"):
                        module.reset_parameters()
        return model

    def _ensemble(self, ctx: ServerContext, seed: int | None = None) -> AtomEnsemble:
        return AtomEnsemble([self._atom(ctx, k, seed) for k in range(self.config["atoms"])])

    # ----- server side -------------------------------------------------------------------------------
    def init(self, ctx: ServerContext) -> ServerState:
        return {"weights": clone_tensors(self._ensemble(ctx, ctx.seed).state_dict()), "round_stats": {}}

    def assign(self, round: int, profile: ClientProfile, ctx: ServerContext) -> list[int]:
        """The atoms client ``profile`` trains in ``round`` (sorted)."""
        k = self.config["atoms"]
        m = affordable_atoms(profile.keep_ratio, k)
        rng = ctx.rng("splitmix-atoms", int(round), int(profile.client_id))
        return sorted(int(i) for i in rng.choice(k, size=min(m, k), replace=False))

    def configure(self, state: ServerState, round: int, clients: Sequence[ClientProfile],
                  ctx: ServerContext) -> dict[int, Task]:
        tasks = {}
        for profile in clients:
            chosen = self.assign(round, profile, ctx)
            prefixes = tuple(f"atoms.{i}." for i in chosen)
            tensors = {k: v for k, v in state["weights"].items() if k.startswith(prefixes)}
            tasks[profile.client_id] = Task(profile.client_id, round, tensors,
                                            {"train": ctx.train_config(round), "atoms": chosen})
        return tasks

    def aggregate(self, state: ServerState, round: int, updates: Sequence[Update],
                  ctx: ServerContext) -> ServerState:
        new = dict(state["weights"])
        counts = {}
        for index in range(self.config["atoms"]):
            prefix = f"atoms.{index}."
            holders = [u for u in updates if any(k.startswith(prefix) for k in u.tensors)]
            counts[str(index)] = len(holders)
            if not holders:
                continue
            averaged = weighted_average([{k: v for k, v in u.tensors.items() if k.startswith(prefix)}
                                         for u in holders], [u.n_samples for u in holders])
            new.update(averaged)
        trained = [len(u.stats.get("atoms", [])) for u in updates]
        stats = {"atom_clients": counts, "atoms_trained": sum(trained) / len(trained) if trained else 0.0}
        return {**state, "weights": new, "round_stats": stats}

    def round_metrics(self, state: ServerState, round: int) -> dict[tuple[str, str], float]:
        stats = state.get("round_stats") or {}
        out = {("atom_clients", k): float(v) for k, v in stats.get("atom_clients", {}).items()}
        if "atoms_trained" in stats:
            out[("atoms_trained", "mean")] = float(stats["atoms_trained"])
        return out

    def evaluation_models(self, state: ServerState, ctx: ServerContext) -> dict[str, nn.Module]:
        ensemble = self._ensemble(ctx)
        ensemble.load_state_dict(state["weights"])
        return {"global": ensemble}

    # ----- client side -------------------------------------------------------------------------------
    def local_update(self, task: Task, data: ClientDataset, ctx: ClientContext) -> Update:
        tensors: dict[str, torch.Tensor] = {}
        losses, steps = [], 0
        for index in task.config["atoms"]:
            prefix = f"atoms.{index}."
            model = self._atom(ctx, index).to(ctx.device)
            model.load_state_dict({k[len(prefix):]: v for k, v in task.tensors.items() if k.startswith(prefix)})
            stats = train_epochs(model, data, task.config["train"], ctx.generator, device=ctx.device)
            losses.append(stats["loss"])
            steps += int(stats.get("steps", 0))
            tensors.update({_atom_key(index, k): v for k, v in clone_tensors(model.state_dict()).items()})
        return Update(task.client_id, tensors, len(data),
                      {"loss": sum(losses) / len(losses), "steps": steps, "atoms": list(task.config["atoms"])})


__all__ = ["AtomEnsemble", "SplitMix", "affordable_atoms"]
