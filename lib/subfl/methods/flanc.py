"""FLANC (Mei, Guo, Zhou & Patel, "Resource-Adaptive Federated Learning with All-In-One Neural Composition",
NeurIPS 2022): a client of capacity p trains a p-width network composed from one shared neural basis.

Model (:mod:`subfl.models.composed`). Every hidden ``Conv2d`` / ``Linear`` (all but the first and the last
layer; 1×1 shortcuts dense unless ``compose_1x1``) of the p-width network has its weight composed as
``W_p = V · U_p`` reshaped to the kernel (Eqs. (1)–(2), Fig. 2): ``V`` (``(R₁k², R₂)``, one per layer) is shared
by all widths, ``U_p`` (``(R₂, S_p/R₁ · T_p)``) belongs to width p. Every other tensor (input layer,
classifier, norms, biases, dense shortcuts) exists once per width, at that width's size.

Server state: ``bases`` (``{f"{layer}.basis": V}``), and per width level name (``"0.25"``, …, ``"1"``) its
``coefficients`` and ``others``. No dense model is kept or sent: the dense p-models are built once in
:meth:`FLANC.init`, for their shapes and the initial values of the non-composed tensors, and dropped; at
evaluation every width's composed model computes ``W_p`` from ``(V, U_p)``.

One round.

* ``configure``: a client of keep ratio r gets width ``p = max{q ∈ widths : q ≤ r}`` (``ValueError`` if none)
  and receives ``V`` of every layer, its ``U_p`` and the width-p ``others`` (the ledger shows smaller payloads
  for smaller p), with the config naming p.
* ``local_update``: the client builds its p-width model (``model_fn(width=w·p)``, composed layers replaced by
  :class:`~subfl.models.composed.ComposedConv2d` / ``ComposedLinear``), and trains ``V``, ``U_p`` and its other
  tensors on ``cross-entropy + λ·R(V)``; ``R`` is Eq. (3), ``Σ_l ‖V_lᵀV_l − I‖²_F``, with ``reduction="mean"``
  (default) dividing each layer's term by ``R₂²`` as the released code's ``MSELoss`` does. It uploads the same
  tensors it received (trained).
* ``aggregate`` (Eq. (4)): ``V ← Σ_k n_k V_k / Σ_k n_k`` over **all** participants; ``U_p`` and the width-p
  others ``← Σ_{k∈C_p} n_k U_{p,k} / Σ_{k∈C_p} n_k`` over the participants ``C_p`` of width p; widths without a
  participant this round keep their tensors. (The released code averages uniformly, ``1/n_joined``; with
  equal client sizes the two coincide.)

Evaluation (:meth:`FLANC.evaluation_models`): the composed model of every width of ``widths``, named like the
profiles' groups (:func:`~subfl.methods.width.level_name`: ``"0.25"``, ``"0.5"``, ``"0.75"``, ``"1"``), and
``"global"``: the widest one (width 1 by default).

Normalisation: option ``sbn`` as in :mod:`subfl.methods.width` — for models with BatchNorm statistics (ResNet-18)
every model is built with ``norm="bn_nostats"`` (batch statistics in training and evaluation). The released
code keeps BatchNorm running statistics per width (averaged with the width's other tensors); ``sbn=False``
does that (running statistics are part of the width-p ``others``).

Options: ``widths`` ((0.25, 0.5, 0.75, 1.0)); ``r1`` / ``r2`` (None: per layer ``R₁`` = the largest divisor of
``gcd_p S_p`` not above ``r1_fraction · S_max``, ``R₂ = round(r2_fraction · T_max)`` clipped to ``R₁k²``;
``r1_fraction = 0.125`` and ``r2_fraction = 0.25`` are the released code's ``--basis_fraction 0.125 --n_basis
0.25``); ``ortho_lambda`` (10, the released code's ``--lambdaR`` default) and ``ortho_reduction`` (``"mean"``,
the released code; ``"sum"``: Eq. (3) literally); ``compose_1x1`` (False); ``sbn`` (True). ``R₁`` is set per
composed layer from its own input channels; the released ResNet-18 sets it per residual block instead, which
halves ``R₁`` of the second convolution of the first block of stages 2–4 (``composition_plan(r1_scope="block")``,
used only for the parameter counts below, not by the method).

:func:`flanc_parameter_counts` gives, per width, the parameters a client receives / sends next to the dense
p-width model's (the chapter's Table 1).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ..fl.aggregation import weighted_average
from ..fl.rng import torch_generator
from ..fl.training import ClientDataset, train_epochs
from ..fl.types import ClientProfile, Task, Update
from ..models.composed import (R1_FRACTION, R2_FRACTION, ComposedLayerSpec, build_dense_model, compose_from_tensors,
                               compose_model, composed_modules, composition_plan, init_bases, init_coefficients,
                               orthogonality_penalty, split_state)
from ..fl.method import ClientContext, Method, ServerContext, ServerState, clone_tensors
from .width import SBN_NORM, _check_levels, global_width, has_batchnorm_statistics, level_name, model_width

DEFAULT_WIDTHS = (0.25, 0.5, 0.75, 1.0)
ORTHO_REDUCTIONS = ("mean", "sum")


def _check_widths(value: Any) -> tuple[float, ...]:
    widths = _check_levels(value, "widths")
    if widths is None:
        raise ValueError("option widths must be a non-empty sequence of numbers in (0, 1], got None")
    return widths


def client_width(keep_ratio: float, widths: Sequence[float]) -> float:
    """The width a client of keep ratio ``keep_ratio`` trains: the largest of ``widths`` not above it."""
    fitting = [p for p in widths if p <= float(keep_ratio) + 1e-12]
    if not fitting:
        raise ValueError(f"a client of keep ratio {keep_ratio:g} fits no FLANC width; widths are "
                         f"{[float(p) for p in widths]} — add a width <= {keep_ratio:g} to option widths")
    return max(fitting)


def _build(model_fn: Callable[..., nn.Module], width: float, norm: str) -> nn.Module:
    return model_fn(width=width, norm=norm) if norm else model_fn(width=width)


class FLANC(Method):
    """FLANC: width-p models composed from one shared neural basis (see the module docstring)."""

    name = "flanc"
    options: dict = {"widths": DEFAULT_WIDTHS, "r1": None, "r2": None, "r1_fraction": R1_FRACTION,
                     "r2_fraction": R2_FRACTION, "ortho_lambda": 10.0, "ortho_reduction": "mean",
                     "compose_1x1": False, "sbn": True}

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        cfg = self.config
        cfg["widths"] = _check_widths(cfg["widths"])
        for key in ("r1", "r2"):
            v = cfg[key]
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"option {key} must be a positive integer or None, got {v!r}")
        for key in ("r1_fraction", "r2_fraction"):
            v = cfg[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 < float(v) <= 1.0:
                raise ValueError(f"option {key} must be a number in (0, 1], got {v!r}")
        lam = cfg["ortho_lambda"]
        if isinstance(lam, bool) or not isinstance(lam, (int, float)) or not float(lam) >= 0.0:
            raise ValueError(f"option ortho_lambda must be a number >= 0, got {lam!r}")
        if cfg["ortho_reduction"] not in ORTHO_REDUCTIONS:
            raise ValueError(f"option ortho_reduction must be one of {ORTHO_REDUCTIONS}, "
                             f"got {cfg['ortho_reduction']!r}")
        for flag in ("compose_1x1", "sbn"):
            if not isinstance(cfg[flag], bool):
                raise ValueError(f"option {flag} must be True or False, got {cfg[flag]!r}")
        self._plans: dict[tuple[float, str], dict[str, ComposedLayerSpec]] = {}

    # ----- helpers -----------------------------------------------------------------------------------
    @property
    def widths(self) -> tuple[float, ...]:
        return self.config["widths"]

    def plan(self, ctx: ServerContext, global_w: float, norm: str) -> dict[str, ComposedLayerSpec]:
        """The composed layers and their ``R₁``, ``R₂`` (:func:`~subfl.models.composed.composition_plan` of the
        dense models ``model_fn(width=w·p)``, p in ``widths``); cached."""
        key = (float(global_w), norm)
        if key not in self._plans:
            dense = {p: _build(ctx.model_fn, model_width(global_w, p), norm) for p in self.widths}
            self._plans[key] = self._plan_of(dense)
        return self._plans[key]

    def _plan_of(self, dense: Mapping[float, nn.Module]) -> dict[str, ComposedLayerSpec]:
        c = self.config
        return composition_plan(dense, r1=c["r1"], r2=c["r2"], r1_fraction=c["r1_fraction"],
                                r2_fraction=c["r2_fraction"], compose_1x1=c["compose_1x1"])

    def composed_model(self, state: ServerState, p: float, ctx: ServerContext) -> nn.Module:
        """The width-p composed model holding the server's ``V``, ``U_p`` and width-p others."""
        plan = self.plan(ctx, state["width"], state["norm"])
        model = _build(ctx.model_fn, model_width(state["width"], p), state["norm"])
        compose_model(model, {n: (s.r1, s.r2) for n, s in plan.items()})
        level = level_name(p)
        model.load_state_dict({**state["bases"], **state["coefficients"][level], **state["others"][level]})
        return model

    # ----- server side -------------------------------------------------------------------------------
    def init(self, ctx: ServerContext) -> ServerState:
        declared = ctx.heterogeneity_levels
        if declared:
            for level in declared:
                client_width(float(level), self.widths)  # every declared keep ratio must fit a width
        w = global_width(ctx.model_fn)
        model = ctx.model_fn()
        norm = SBN_NORM if self.config["sbn"] and has_batchnorm_statistics(model) else ""
        dense = {p: _build(ctx.model_fn, model_width(w, p), norm) for p in self.widths}
        plan = self._plan_of(dense)
        self._plans[(float(w), norm)] = plan
        bases = init_bases(plan, torch_generator(ctx.seed, "flanc-init", "basis"))
        coefficients, others = {}, {}
        for p, m in dense.items():
            level = level_name(p)
            coefficients[level] = init_coefficients(plan, p, torch_generator(ctx.seed, "flanc-init", "coefficients",
                                                                             level))
            others[level] = clone_tensors(split_state(m.state_dict(), plan)[2])
        return {"bases": bases, "coefficients": coefficients, "others": others, "width": w, "norm": norm,
                "widths": list(self.widths)}

    def configure(self, state: ServerState, round: int, clients: Sequence[ClientProfile],
                  ctx: ServerContext) -> dict[int, Task]:
        tasks = {}
        for profile in clients:
            p = client_width(profile.keep_ratio, self.widths)
            level = level_name(p)
            tensors = {**state["bases"], **state["coefficients"][level], **state["others"][level]}
            config = {"train": ctx.train_config(round), "keep_ratio": float(profile.keep_ratio), "width": p,
                      "model_width": model_width(state["width"], p), "norm": state["norm"],
                      "ortho_lambda": float(self.config["ortho_lambda"]),
                      "ortho_reduction": self.config["ortho_reduction"]}
            tasks[profile.client_id] = Task(profile.client_id, round, clone_tensors(tensors), config)
        return tasks

    def aggregate(self, state: ServerState, round: int, updates: Sequence[Update],
                  ctx: ServerContext) -> ServerState:
        if not updates:
            return state
        basis_keys = list(state["bases"])
        for u in updates:
            missing = [k for k in basis_keys if k not in u.tensors]
            if missing or "width" not in u.stats:
                raise ValueError(f"update of client {u.client_id} lacks the basis {missing[:3]} or its width stat; "
                                 f"a FLANC update holds every layer's basis, its width's coefficients and others")
        bases = weighted_average([{k: u.tensors[k] for k in basis_keys} for u in updates], _weights(updates))
        coefficients, others = dict(state["coefficients"]), dict(state["others"])
        for p in self.widths:
            level = level_name(p)
            group = [u for u in updates if abs(float(u.stats["width"]) - p) < 1e-9]
            if not group:
                continue  # Eq. (4): U_p of a width without participants is unchanged
            weights = _weights(group)
            coefficients[level] = weighted_average(
                [{k: u.tensors[k] for k in state["coefficients"][level]} for u in group], weights)
            others[level] = weighted_average([{k: u.tensors[k] for k in state["others"][level]} for u in group],
                                             weights)
        return {**state, "bases": bases, "coefficients": coefficients, "others": others}

    def evaluation_models(self, state: ServerState, ctx: ServerContext) -> dict[str, nn.Module]:
        models = {level_name(p): self.composed_model(state, p, ctx) for p in self.widths}
        models["global"] = models[level_name(max(self.widths))]
        return models

    def round_metrics(self, state: ServerState, round: int) -> dict[tuple[str, str], float]:
        """``basis_orthogonality``: Eq. (3)'s ``Σ_l ‖V_lᵀV_l − I‖²_F`` of the aggregated bases (no ``λ``, sum)."""
        with torch.no_grad():
            value = orthogonality_penalty({k: v.double() for k, v in state["bases"].items()}, "sum")
        return {("basis_orthogonality", "global"): float(value)}

    # ----- client side -------------------------------------------------------------------------------
    def local_update(self, task: Task, data: ClientDataset, ctx: ClientContext) -> Update:
        cfg = task.config
        model = _build(ctx.model_fn, cfg["model_width"], cfg["norm"])
        compose_from_tensors(model, task.tensors)
        model.load_state_dict(task.tensors)
        model.to(ctx.device)
        bases = [m.basis for m in composed_modules(model).values()]
        lam, reduction = float(cfg["ortho_lambda"]), cfg["ortho_reduction"]
        regulariser = (lambda: lam * orthogonality_penalty(bases, reduction)) if lam > 0 else None
        stats = train_epochs(model, data, cfg["train"], ctx.generator, device=ctx.device, regulariser=regulariser)
        with torch.no_grad():
            ortho = float(orthogonality_penalty(bases, reduction))
        return Update(task.client_id, clone_tensors(model.state_dict()), len(data),
                      {**stats, "orthogonality": ortho, "keep_ratio": cfg["keep_ratio"], "width": cfg["width"]})


def _weights(updates: Sequence[Update]) -> list[float]:
    """Data sizes ``n_k`` (equal weights if every client is empty)."""
    n = [float(u.n_samples) for u in updates]
    return n if sum(n) > 0 else [1.0] * len(n)


DEFAULT_INPUT_SHAPES = {"resnet18": (3, 32, 32), "vgg11": (3, 32, 32)}


def flanc_parameter_counts(model_name: str = "resnet18", widths: Sequence[float] = DEFAULT_WIDTHS,
                           r1: int | None = None, r2: int | None = None, *, r1_fraction: float = R1_FRACTION,
                           r2_fraction: float = R2_FRACTION, compose_1x1: bool = False, r1_scope: str = "layer",
                           num_classes: int = 10, input_shape: tuple[int, ...] | None = None, width: float = 1.0,
                           norm: str | None = None, **model_options: Any) -> list[dict[str, Any]]:
    """Parameters a FLANC client of each width receives and sends, next to the dense p-width model's (Table 1).

    One row per width p: ``dense`` (parameters of ``build_model(width=w·p)``; buffers excluded), ``basis``
    (``Σ_l R₁k²R₂``, the same for every p), ``coefficients`` (``Σ_l R₂·G_p·T_p``), ``other`` (every parameter of
    the dense p-model outside the composed layers' weights: input layer, classifier, norms, biases, dense 1×1
    shortcuts), ``sent = basis + coefficients + other`` (each direction, per round) and ``ratio = sent / dense``.
    Pure: models are built on the ``meta`` device (shapes only). ``model_name``: a name of
    :func:`~subfl.models.build_model` or ``"flanc_cnn"``; default input shape (3, 32, 32) for resnet18 / vgg11,
    else (1, 28, 28).

    ``r1_scope`` (:func:`~subfl.models.composed.composition_plan`): ``"layer"`` is what the :class:`FLANC` method
    trains; ``"block"`` is the released ResNet-18's ``R₁`` (one per residual block), whose counts for ResNet-18 on
    10 classes, 526,874 / 1,214,506 / 2,357,818 / 3,956,810 at p = ¼, ½, ¾, 1, round to Table 1's 0.5M / 1.2M /
    2.4M / 4.0M (``"layer"``: 532,250 / 1,090,858 / 2,019,130 / 3,317,066).
    """
    widths = _check_widths(widths)
    shape = tuple(input_shape) if input_shape is not None else DEFAULT_INPUT_SHAPES.get(model_name, (1, 28, 28))
    with torch.device("meta"):
        dense = {p: build_dense_model(model_name, num_classes=num_classes, input_shape=shape,
                                      width=model_width(width, p), norm=norm, **model_options) for p in widths}
    plan = composition_plan(dense, r1=r1, r2=r2, r1_fraction=r1_fraction, r2_fraction=r2_fraction,
                            compose_1x1=compose_1x1, r1_scope=r1_scope)
    basis = sum(s.basis_parameters() for s in plan.values())
    rows = []
    for p, model in dense.items():
        total = sum(t.numel() for t in model.parameters())
        composed_weights = sum(s.dense_weight_parameters(p) for s in plan.values())
        coefficients = sum(s.coefficient_parameters(p) for s in plan.values())
        other = total - composed_weights
        sent = basis + coefficients + other
        rows.append({"width": p, "dense": int(total), "basis": int(basis), "coefficients": int(coefficients),
                     "other": int(other), "sent": int(sent), "ratio": sent / total})
    return rows


__all__ = ["DEFAULT_WIDTHS", "FLANC", "client_width", "flanc_parameter_counts"]
