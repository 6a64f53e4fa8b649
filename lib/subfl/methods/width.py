"""Width-slicing baselines: HeteroFL, FjORD and FedRolex.

A client of keep ratio ``p`` (:attr:`~subfl.fl.types.ClientProfile.keep_ratio`) trains a *p-width sub-model*:
the same architecture built at width ``w·p`` (``w``: the global model's width, the config's ``width``), whose
tensors are a slice of the global model's (:mod:`subfl.models.slicing`). The three methods differ in which
slice a client gets and how it trains it:

========== ============================================ ==================================================
method     slice of a p-client                           local training
========== ============================================ ==================================================
heterofl   leading slice, every round                    the p-model (optional scaler ÷p, static BN)
fjord      leading slice at its cap (largest width of    ordered dropout: each mini-batch trains the
           ``widths`` ≤ p)                               leading slice of a width drawn uniformly from
                                                         ``widths`` ≤ cap (optional self-distillation)
fedrolex   rolling window ``{(r + i) mod K : i < k}``    the p-model (optional scaler ÷p, static BN)
========== ============================================ ==================================================

What travels. Down: the client's slice (``extract`` of the global state) and a JSON config naming the width.
Up: only the trained slice — the ledger shows smaller payloads for smaller widths.

Aggregation (all three; HeteroFL Sec. 3.2, FedRolex Eq. (3)): every entry of the global model is the
average of the clients that trained it, weighted by their data sizes ``n_k``; entries no client trained keep
the server's value (:func:`~subfl.models.slicing.average_slices`).

Normalisation — *static batch norm* (HeteroFL's sBN, option ``sbn``, default on, for all three): when the
configured model has BatchNorm with running statistics (``norm="bn"``, the default of resnet18 / vgg11),
every model of the run — global, client and evaluation models — is built with ``norm="bn_nostats"``: no
running statistics are tracked or sent, and BatchNorm normalises with the statistics of the current batch
in training *and* evaluation (the engine evaluates in batches of ``eval_batch_size`` = 500 test samples).
This departs from HeteroFL's evaluation, where the server afterwards queries the clients to accumulate
global statistics of each width's model before testing (which the Method contract's evaluation cannot do:
it sees no client data); FjORD keeps per-width BN statistics, which batch statistics replace in the same
way. Models without BatchNorm (the cnn / mlp defaults, ``norm="gn"``) are unchanged. ``sbn=False`` keeps
``norm="bn"``; running means / variances are then sliced and averaged like the channels they belong to.

Evaluation (:meth:`evaluation_models`): ``"global"`` — the full-width global model — and, for every width
level present in the run, the model of that width named like the profiles' group strings (``"0.25"``,
``"1"``): its leading slice for all three methods (FedRolex included: its paper reports the global model; its
code, inherited from HeteroFL, tests sub-models as leading slices, and no rolling offset is canonical at test
time). Levels are, in order of preference: the option ``levels``; ``ServerContext.heterogeneity_levels``
when the runner provides it; otherwise the keep ratios of the clients that have taken part so far (with
partial participation a level appears once one of its clients was sampled).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import chain
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from ..fl.training import ClientDataset, train_epochs
from ..fl.types import ClientProfile, Task, Update
from ..models.slicing import (SliceIndices, average_slices, extract, leading_indices, leading_view, rolling_indices,
                              state_shapes)
from ..fl.method import ClientContext, Method, ServerContext, ServerState, clone_tensors

SBN_NORM = "bn_nostats"
"""The norm kind static batch norm builds every model with (see :func:`~subfl.models.norm.make_norm`)."""


def global_width(model_fn: Callable[..., nn.Module]) -> float:
    """The width multiplier ``w`` of the global model: ``model_fn.width`` (the runner's
    :class:`~subfl.experiments.runner.ModelFactory` holds the config's ``width``), else 1."""
    return float(getattr(model_fn, "width", 1.0) or 1.0)


def model_width(global_w: float, p: float) -> float:
    """The width multiplier a p-width sub-model is built at: ``w·p`` (rounded to 12 decimals, so that the server
    and the clients build identical shapes)."""
    return round(float(global_w) * float(p), 12)


def level_name(p: float) -> str:
    """Group name of width level ``p``, as :class:`~subfl.fl.types.ClientProfile` names groups (``"0.25"``, ``"1"``)."""
    return f"{p:g}"


def has_batchnorm_statistics(model: nn.Module) -> bool:
    """Whether ``model`` has a BatchNorm layer that tracks running statistics."""
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats for m in model.modules())


def hidden_layers(model: nn.Module) -> list[nn.Module]:
    """Every convolution and linear layer of ``model`` except its last linear layer (the classifier)."""
    layers = [m for m in model.modules() if isinstance(m, (nn.modules.conv._ConvNd, nn.Linear))]
    linears = [m for m in layers if isinstance(m, nn.Linear)]
    classifier = linears[-1] if linears else None
    return [m for m in layers if m is not classifier]


def add_scaler(model: nn.Module, keep_ratio: float) -> list[torch.utils.hooks.RemovableHandle]:
    """HeteroFL's *scaler* (Diao et al., ICLR 2021, Sec. 3.2): the output of every hidden layer
    (:func:`hidden_layers`) is divided by ``keep_ratio`` in training mode and left unchanged in evaluation mode.

    Implemented with forward hooks on the client's model (the architecture code is not touched); returns the
    hook handles. A no-op for ``keep_ratio == 1``.
    """
    if keep_ratio >= 1.0:
        return []
    scale = 1.0 / float(keep_ratio)

    def hook(module: nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
        return output * scale if module.training else output

    return [m.register_forward_hook(hook) for m in hidden_layers(model)]


def _check_levels(value: Any, option: str) -> tuple[float, ...] | None:
    if value is None:
        return None
    try:
        levels = tuple(sorted({float(v) for v in value}))
    except (TypeError, ValueError):
        raise ValueError(f"option {option} must be a sequence of numbers in (0, 1], got {value!r}") from None
    if not levels or any(not 0.0 < v <= 1.0 for v in levels):
        raise ValueError(f"option {option} must be a non-empty sequence of numbers in (0, 1], got {value!r}")
    return levels


class WidthSlicing(Method):
    """Shared machinery of the width-slicing methods (HeteroFL by default: the leading slice of width p).

    Subclasses override :meth:`slice_for` (which slice a client gets), :meth:`client_width` (the width a client
    receives) and, for other local training, :meth:`local_update`.
    """

    name = "width_slicing"
    options: dict = {"sbn": True, "scaler": True, "levels": None}

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        for flag in ("sbn", "scaler"):
            if flag in self.config and not isinstance(self.config[flag], bool):
                raise ValueError(f"option {flag} must be True or False, got {self.config[flag]!r}")
        self.config["levels"] = _check_levels(self.config.get("levels"), "levels")
        self._shapes: dict[tuple[float, str], dict[str, tuple[int, ...]]] = {}

    # ----- helpers -----------------------------------------------------------------------------------
    @staticmethod
    def _build(model_fn: Callable[..., nn.Module], width: float, norm: str) -> nn.Module:
        return model_fn(width=width, norm=norm) if norm else model_fn(width=width)

    def _sub_shapes(self, ctx: ServerContext, state: ServerState, p: float) -> dict[str, tuple[int, ...]]:
        key = (model_width(state["width"], p), state["norm"])
        if key not in self._shapes:
            self._shapes[key] = state_shapes(self._build(ctx.model_fn, key[0], key[1]).state_dict())
        return self._shapes[key]

    def declared_levels(self, ctx: ServerContext) -> tuple[float, ...] | None:
        """The run's width levels if known up front: option ``levels``, else ``ctx.heterogeneity_levels``."""
        if self.config.get("levels") is not None:
            return self.config["levels"]
        return _check_levels(ctx.heterogeneity_levels, "ServerContext.heterogeneity_levels")

    def check_levels(self, levels: Sequence[float], where: str) -> None:
        """Hook for methods with requirements on the width levels (HeteroFL); ``where`` names their source."""

    def client_width(self, profile: ClientProfile) -> float:
        """The width (relative to the global model) of the slice a client receives: its keep ratio."""
        return float(profile.keep_ratio)

    def slice_for(self, state: ServerState, round: int, global_shapes: Mapping[str, tuple[int, ...]],
                  sub_shapes: Mapping[str, tuple[int, ...]]) -> SliceIndices:
        """Index sets of a client's sub-model in ``round``: the leading slice."""
        return leading_indices(global_shapes, sub_shapes)

    def client_config(self, state: ServerState, round: int, profile: ClientProfile, width: float,
                      ctx: ServerContext) -> dict[str, Any]:
        """The JSON config a client receives besides its tensors."""
        return {"train": ctx.train_config(round), "keep_ratio": float(profile.keep_ratio), "width": width,
                "global_width": state["width"], "model_width": model_width(state["width"], width),
                "norm": state["norm"], "scaler": bool(self.config.get("scaler", False))}

    # ----- server side -------------------------------------------------------------------------------
    def init(self, ctx: ServerContext) -> ServerState:
        levels = self.declared_levels(ctx)
        if levels is not None:
            self.check_levels(levels, "the declared heterogeneity levels")
        w = global_width(ctx.model_fn)
        model = ctx.model_fn()
        if state_shapes(self._build(ctx.model_fn, w, "").state_dict()) != state_shapes(model.state_dict()):
            raise ValueError(f"model_fn(width={w}) does not build the global model model_fn(); give the model factory "
                             f"a 'width' attribute equal to its default width")
        norm = SBN_NORM if self.config.get("sbn", False) and has_batchnorm_statistics(model) else ""
        if norm:
            model = self._build(ctx.model_fn, w, norm)
        return {"weights": clone_tensors(model.state_dict()), "width": w, "norm": norm, "levels": []}

    def configure(self, state: ServerState, round: int, clients: Sequence[ClientProfile],
                  ctx: ServerContext) -> dict[int, Task]:
        if self.declared_levels(ctx) is None and len(clients) == ctx.num_clients and clients:
            self.check_levels(sorted({float(c.keep_ratio) for c in clients}),
                              "the keep ratios of all clients (full participation)")
        global_shapes = state_shapes(state["weights"])
        tasks = {}
        for profile in clients:
            width = self.client_width(profile)
            indices = self.slice_for(state, round, global_shapes, self._sub_shapes(ctx, state, width))
            config = self.client_config(state, round, profile, width, ctx)
            tasks[profile.client_id] = Task(profile.client_id, round, extract(state["weights"], indices), config)
        return tasks

    def aggregate(self, state: ServerState, round: int, updates: Sequence[Update],
                  ctx: ServerContext) -> ServerState:
        global_shapes = state_shapes(state["weights"])
        contributions = [(u.tensors, self.slice_for(state, round, global_shapes, state_shapes(u.tensors)),
                          float(u.n_samples)) for u in updates]
        weights = average_slices(state["weights"], contributions)
        seen = sorted(set(state["levels"]) | {float(u.stats["keep_ratio"]) for u in updates if "keep_ratio" in u.stats})
        return {**state, "weights": weights, "levels": seen}

    def evaluation_levels(self, state: ServerState, ctx: ServerContext) -> list[float]:
        """The width levels evaluated (see the module docstring)."""
        declared = self.declared_levels(ctx)
        return sorted(declared) if declared is not None else list(state["levels"])

    def evaluation_width(self, level: float) -> float:
        """The width of the model evaluated for clients of keep ratio ``level``."""
        return level

    def evaluation_models(self, state: ServerState, ctx: ServerContext) -> dict[str, nn.Module]:
        models: dict[str, nn.Module] = {}
        global_shapes = state_shapes(state["weights"])
        for level in self.evaluation_levels(state, ctx):
            width = self.evaluation_width(level)
            model = self._build(ctx.model_fn, model_width(state["width"], width), state["norm"])
            indices = leading_indices(global_shapes, state_shapes(model.state_dict()))
            model.load_state_dict(extract(state["weights"], indices))
            models[level_name(level)] = model
        model = self._build(ctx.model_fn, state["width"], state["norm"])
        model.load_state_dict(state["weights"])
        models["global"] = model
        return models

    # ----- client side -------------------------------------------------------------------------------
    def local_update(self, task: Task, data: ClientDataset, ctx: ClientContext) -> Update:
        cfg = task.config
        model = self._build(ctx.model_fn, cfg["model_width"], cfg["norm"]).to(ctx.device)
        model.load_state_dict(task.tensors)
        handles = add_scaler(model, cfg["width"]) if cfg.get("scaler") else []
        stats = train_epochs(model, data, cfg["train"], ctx.generator, device=ctx.device)
        for h in handles:
            h.remove()
        return Update(task.client_id, clone_tensors(model.state_dict()), len(data),
                      {**stats, "keep_ratio": cfg["keep_ratio"], "width": cfg["width"]})


class HeteroFL(WidthSlicing):
    """HeteroFL (Diao, Ding & Tarokh, ICLR 2021): a client of keep ratio p trains the leading slice of width p.

    Options:

    * ``sbn`` (True): static batch norm — see the module docstring (``norm="bn_nostats"``: no running
      statistics; batch statistics in training and evaluation).
    * ``scaler`` (True): the output of every hidden convolution / linear layer is divided by p during local
      training and left unchanged at evaluation (Sec. 3.2; :func:`add_scaler`).
    * ``levels`` (None): the run's width levels, for the full-width check and for evaluation.

    HeteroFL's global model is its widest client model, so the levels must include 1.0: ``ValueError`` at
    ``init`` when the levels are declared (option ``levels`` or ``ServerContext.heterogeneity_levels``),
    otherwise in the first ``configure`` that sees every client (full participation). With partial
    participation and undeclared levels the check cannot be made (the method sees only the sampled clients);
    declare ``levels`` to get it.
    """

    name = "heterofl"
    options: dict = {"sbn": True, "scaler": True, "levels": None}

    def check_levels(self, levels: Sequence[float], where: str) -> None:
        if max(levels) < 1.0:
            raise ValueError(
                f"heterofl needs at least one full-width client (keep ratio 1.0), but {where} are "
                f"{[float(v) for v in levels]}; HeteroFL's global model is its widest client model — use a "
                f"heterogeneity spec with a 1.0 level (e.g. 'uniform:0.25,0.5,0.75,1.0') or method 'fedrolex', "
                f"which trains a global model wider than every client")


class FedRolex(WidthSlicing):
    """FedRolex (Alam, Liu, Yan & Zhang, NeurIPS 2022): rolling sub-model extraction.

    In round r (the engine's rounds start at 1; ``r = round - 1`` so that round 1 takes the leading slice), a
    layer of K units gives a client of sub-size k the units ``{(r + i) mod K : i < k}`` (CAFF appendix, Eqs. 8–9;
    FedRolex Sec. 3.2), the same start r for every layer so that residual connections stay consistent. With
    this one-unit step every unit of a layer is trained within ``K - k + 1`` consecutive rounds (not ``⌈K/k⌉``:
    consecutive windows overlap in ``k - 1`` units).

    Options: ``roll`` — ``"unit"`` (default, the paper: the window advances one unit per round) or
    ``"window"`` (it advances by k units, ``s = r·k mod K``: disjoint consecutive windows covering every unit
    within ``⌈K/k⌉`` rounds; a variant, not the paper); ``sbn``, ``scaler`` and ``levels`` as for
    :class:`HeteroFL` (the FedRolex code inherits HeteroFL's sBN and scaler). No full-width client is
    required: entries outside every window of a round keep their value. Evaluation: see the module docstring.
    """

    name = "fedrolex"
    options: dict = {"sbn": True, "scaler": True, "levels": None, "roll": "unit"}
    ROLLS = ("unit", "window")

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        if self.config["roll"] not in self.ROLLS:
            raise ValueError(f"option roll must be one of {self.ROLLS}, got {self.config['roll']!r}")

    def offset(self, round: int) -> int | Callable[[int, int], int]:
        """The window start of ``round``: ``r = round - 1`` (``"unit"``) or ``(K, k) -> r·k mod K`` (``"window"``)."""
        r = max(0, int(round) - 1)
        if self.config["roll"] == "window":
            return lambda size, keep: (r * keep) % size
        return r

    def slice_for(self, state: ServerState, round: int, global_shapes: Mapping[str, tuple[int, ...]],
                  sub_shapes: Mapping[str, tuple[int, ...]]) -> SliceIndices:
        return rolling_indices(global_shapes, sub_shapes, self.offset(round))


class _OrderedDropout(nn.Module):
    """The cap-width model run at a width drawn per forward pass (FjORD's ordered dropout).

    Width q < cap runs the q-width architecture (``skeletons[q]``) on *views* of the leading slices of the
    cap model's parameters and buffers (:func:`~subfl.models.slicing.leading_view`), so gradients and
    BatchNorm statistics reach exactly the entries of the q-slice. ``counts`` records the draws.
    """

    def __init__(self, cap_model: nn.Module, cap: float, skeletons: dict[float, nn.Module], widths: Sequence[float],
                 generator: torch.Generator, distill: bool) -> None:
        super().__init__()
        self.cap_model = cap_model
        self.cap = cap
        self.widths = list(widths)
        self.generator = generator
        self.distill = distill
        self.counts: dict[str, int] = {}
        object.__setattr__(self, "_skeletons", skeletons)  # not submodules: their own weights are never used
        self._shapes = {q: state_shapes(m.state_dict()) for q, m in skeletons.items()}

    def run(self, width: float, x: torch.Tensor) -> torch.Tensor:
        if width == self.cap:
            return self.cap_model(x)
        shapes = self._shapes[width]
        tensors = {name: leading_view(t, shapes[name])
                   for name, t in chain(self.cap_model.named_parameters(), self.cap_model.named_buffers())}
        return torch.func.functional_call(self._skeletons[width], tensors, (x,))

    def forward(self, x: torch.Tensor):
        q = self.widths[int(torch.randint(len(self.widths), (1,), generator=self.generator))]
        self.counts[level_name(q)] = self.counts.get(level_name(q), 0) + 1
        out = self.run(q, x)
        if self.distill:
            return out, self.run(self.cap, x)
        return out

    def train(self, mode: bool = True) -> "_OrderedDropout":
        super().train(mode)
        for m in self._skeletons.values():
            m.train(mode)
        return self


def distillation_loss(outputs: tuple[torch.Tensor, torch.Tensor], target: torch.Tensor) -> torch.Tensor:
    """FjORD's self-distillation (Horváth et al., NeurIPS 2021, Sec. 3.3; as in Flower's FjORD baseline):
    ``CE(teacher, y) + CE(student, softmax(teacher))`` with the teacher — the client's widest affordable
    width — detached in the second term."""
    student, teacher = outputs
    return F.cross_entropy(teacher, target) + F.cross_entropy(student, teacher.detach().softmax(dim=1))


class FjORD(WidthSlicing):
    """FjORD (Horváth et al., NeurIPS 2021): ordered dropout over a discrete set of widths.

    A client of keep ratio p can afford the widths ``widths ∩ (0, p]``; its *cap* is the largest of them. It
    receives and returns only the leading slice at its cap. In local training every mini-batch draws a width
    q uniformly from its affordable widths and trains the leading q-slice (:class:`_OrderedDropout`); with
    ``distill`` the cap width is run on the same batch as a teacher (:func:`distillation_loss`). The draws are
    returned in ``Update.stats["width_counts"]`` (``{"0.25": n, ...}``).

    Options: ``widths`` ((0.25, 0.5, 0.75, 1.0)), ``distill`` (False), ``sbn`` (True; FjORD's per-width BN
    statistics are replaced by batch statistics, see the module docstring) and ``levels``. No scaler (not part of
    FjORD). A client whose keep ratio is below every width raises ``ValueError``. Aggregation counts a client as
    having trained its whole cap slice (entries of widths it happened not to draw come back unchanged and are
    averaged in, as in FjORD's FedAvg of the returned sub-models). Evaluation: the group of keep ratio p
    evaluates the leading slice at p's cap.
    """

    name = "fjord"
    options: dict = {"widths": (0.25, 0.5, 0.75, 1.0), "distill": False, "sbn": True, "levels": None}

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.config["widths"] = _check_levels(self.config["widths"], "widths")
        if not isinstance(self.config["distill"], bool):
            raise ValueError(f"option distill must be True or False, got {self.config['distill']!r}")

    def affordable(self, keep_ratio: float) -> list[float]:
        """The widths a client of ``keep_ratio`` can train (``widths`` ≤ keep ratio), ascending."""
        widths = [q for q in self.config["widths"] if q <= keep_ratio + 1e-12]
        if not widths:
            raise ValueError(f"fjord: a client of keep ratio {keep_ratio:g} can afford none of the widths "
                             f"{list(self.config['widths'])}; add a smaller width to option widths")
        return widths

    def client_width(self, profile: ClientProfile) -> float:
        return self.affordable(float(profile.keep_ratio))[-1]

    def evaluation_width(self, level: float) -> float:
        return self.affordable(level)[-1]

    def client_config(self, state: ServerState, round: int, profile: ClientProfile, width: float,
                      ctx: ServerContext) -> dict[str, Any]:
        config = super().client_config(state, round, profile, width, ctx)
        config.update(scaler=False, widths=self.affordable(float(profile.keep_ratio)),
                      distill=bool(self.config["distill"]))
        return config

    def local_update(self, task: Task, data: ClientDataset, ctx: ClientContext) -> Update:
        cfg = task.config
        cap = float(cfg["width"])
        model = self._build(ctx.model_fn, cfg["model_width"], cfg["norm"]).to(ctx.device)
        model.load_state_dict(task.tensors)
        widths = [float(q) for q in cfg["widths"]]
        skeletons = {q: self._build(ctx.model_fn, model_width(cfg["global_width"], q), cfg["norm"]).to(ctx.device)
                     for q in widths if q != cap}
        draws = torch.Generator().manual_seed(int(torch.randint(2**62, (1,), generator=ctx.generator)))
        net = _OrderedDropout(model, cap, skeletons, widths, draws, bool(cfg.get("distill")))
        loss_fn = distillation_loss if cfg.get("distill") else F.cross_entropy
        stats = train_epochs(net, data, cfg["train"], ctx.generator, device=ctx.device, loss_fn=loss_fn)
        return Update(task.client_id, clone_tensors(model.state_dict()), len(data),
                      {**stats, "keep_ratio": cfg["keep_ratio"], "width": cap,
                       "width_counts": dict(sorted(net.counts.items(), key=lambda kv: float(kv[0])))})


__all__ = ["FedRolex", "FjORD", "HeteroFL", "WidthSlicing", "add_scaler", "distillation_loss", "global_width",
           "has_batchnorm_statistics", "hidden_layers", "level_name", "model_width"]
