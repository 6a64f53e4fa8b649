"""Spectral model sharding: clients train random subsets of the SVD terms of each layer.

Papers: PriSM (Niu et al., "Overcoming resource constraints in federated learning: large models can be
trained with only weak clients", TMLR 2023) and spectral sharding (Korzhenkov & Louizos, "On sampling
strategies for spectral model sharding", NeurIPS 2024). Layers are held as ``W = Σ_i u'_i v'_iᵀ`` with
``u'_i = √λ_i u_i``, ``v'_i = √λ_i v_i`` (:mod:`subfl.models.factorized`; first and last layers stay dense).

One round (spectral sharding §3.1; PriSM §3)
--------------------------------------------
1. **Orthogonal-space refresh.** Every decomposed layer's current ``W`` is decomposed by SVD. The server state
   keeps the dense weights *and* their SVD (``state["factors"]``): :meth:`init` decomposes the initial model
   and :meth:`aggregate` decomposes the new weights at its end, which is the same as decomposing at the
   start of the next round (one SVD per layer per round).
2. **Sampling.** A client of keep ratio ``r`` (``ClientProfile.keep_ratio``; 1 for ``nosharding``) gets, in
   every decomposed layer independently, ``n = ⌈N r⌉`` terms (:func:`~subfl.sampling.keep_count`) drawn by
   the strategy (list below) from a generator derived from (seed, "server", "spectral", round, client), and
   a multiplier ``ω_i`` per drawn term.
3. **What travels down:** ``<layer>.u = U'_S`` ``(n, k)``, ``<layer>.v = V'_S`` (``(k, m)`` or ``(k, C, k_h, k_w)``),
   ``<layer>.omega = ω_S`` ``(k,)`` for every decomposed layer, and every non-decomposed tensor (first / last
   layers, norms, biases — biases stay on the factorized layer's output); the config names the terms
   (``"terms": {layer: [i, ...]}``) and the training settings.
4. **Local training** (client): the sub-model computes ``Σ_{i∈S} ω_i u'_i v'_iᵀ`` in each decomposed layer;
   ``u'``, ``v'`` and the non-decomposed tensors are trained, ``ω`` is frozen. ``+cliplr`` strategies scale
   the gradient of ``u'_i`` and ``v'_i`` by ``min(1, τ/ω_i)`` before each optimiser step. **What travels up:**
   the client's sub-model state (only its own terms' ``u'``, ``v'``, no ``ω``) and, in the stats, its term sets.
5. **Aggregation** (:meth:`aggregate`). Non-decomposed tensors: FedAvg, weights ``n_k / Σ n``. Decomposed layers:
   each vector is averaged **separately** over the clients that trained its term, weighted by data size,

       u'_i ← Σ_{k∈K_i} n_k u'^{(k)}_i / Σ_{k∈K_i} n_k,    v'_i ← Σ_{k∈K_i} n_k v'^{(k)}_i / Σ_{k∈K_i} n_k,

   with ``K_i`` the clients that received term ``i`` (PriSM's per-kernel average over the ``C_i`` clients that
   trained kernel ``i``, here weighted by ``n_k``; with equal data sizes it is PriSM's ``1/C_i`` average).
   Terms nobody trained keep the refreshed ``u'_i``, ``v'_i`` of step 1. The new dense weight is
   ``W = Σ_i u'_i v'_iᵀ = U' V'`` (float64 product).

   **The ω's do not enter the global model.** They only scale the client's forward pass: the client's
   sub-model ``Ŵ_S = Σ_{i∈S} ω_i λ_i u_i v_iᵀ`` is the estimator of ``W`` that the sampling strategies
   design (spectral sharding §3: unbiased when ``ω_i = 1/π_i``, Theorem 3.1 / Eq. (5); the Collective
   optimum ``ω_i = C / (1 + (C − 1) π_i)``, Theorem 3.2 / Eq. (8); equation numbers as cited in
   :mod:`subfl.sampling.inclusion`), while the parameters being learned are
   the global terms ``u'_i``, ``v'_i`` themselves. A client returns ``u'_i``, ``v'_i`` — not ``ω_i u'_i`` — so
   that a client that does not change its parameters leaves ``W`` unchanged: averaging identical copies
   returns them, and ``Σ_i u'_i v'_iᵀ = W`` (aggregation has ``W`` as a fixed point). Rebuilding the server
   weight as the average of the clients' estimators ``(1/C) Σ_c Σ_{i∈S_c} ω_i u'_i v'_iᵀ`` instead would
   replace ``W`` by a random estimate of itself every round even without training.

   ``u'`` and ``v'`` are averaged separately (PriSM's per-kernel average of the factors), not as products
   ``u'_i v'_iᵀ``; so with several clients per term ``W`` is the product of the averages, not the average of
   the products. The next round's SVD re-orthogonalises the terms and resets the scale split between
   ``u'_i`` and ``v'_i`` to ``√λ_i``.

Strategies (option ``strategy``; each is also registered as a method name)
-------------------------------------------------------------------------
Each strategy draws ``n = ⌈N r⌉`` terms ``S`` and gives each drawn term a multiplier ``ω_i``:

* ``topn`` — the ``n`` largest ``λ`` (FedHM / "OrthDrop"); ``ω = 1``.
* ``topn+scaled`` — Top-n's terms, with the ``+Scaled`` multiplier below (spectral sharding Sec. 4.1, the *Top-n +
  Scaled* rows of Tables 1–2).
* ``prism`` — ``rng.choice(N, n, replace=False, p)`` with ``p_i ∝ λ_i^κ`` (PriSM Eq. (2)); ``κ`` = option
  ``kappa``, by default 4 if ``r ≤ 0.2`` else 2.5; ``ω = 1``. Option ``weighting`` replaces ``p`` by the other
  distribution of PriSM's sampling ablation (below).
* ``prism+scaled`` — PriSM's draw; ``ω_i = √(Σ_j λ_j² / Σ_{j∈S} λ_j²)`` for every ``i ∈ S`` (spectral sharding
  Sec. 4.1, *+Scaled*), so that the
  sub-model keeps the Frobenius norm of the layer: ``‖Σ_{i∈S} ω_i λ_i u_i v_iᵀ‖_F = ω √(Σ_{i∈S} λ_i²) = ‖W‖_F``
  (the terms are orthogonal).
* ``prism+wallenius`` — PriSM's draw; ``ω_i = 1/π_i`` with ``π`` the inclusion probabilities of that sequential
  draw (Wallenius' means, Fog's approximation: :func:`~subfl.sampling.wallenius_inclusion`), the
  Horvitz-Thompson correction that makes PriSM's sub-model unbiased.
* ``unbiased`` — a fixed-size design (option ``sampler``) with marginals ``π = unbiased_inclusion(λ, n)``
  (spectral sharding Theorem 3.1, Eq. (5) as cited in :mod:`subfl.sampling.inclusion`); ``ω_i = 1/π_i``.
* ``collective`` — ``(π, ω) = collective_inclusion(λ, n, C)`` (Theorem 3.2, Eq. (8)):
  ``ω_i = C / (1 + (C − 1) π_i)``, ``C`` = the number of clients selected this round with the same keep ratio
  (``C = 1`` gives ``topn``).
* ``schatten`` — ``π = schatten_inclusion(λ, n, p)`` (unbiased estimator, Schatten-``p`` discrepancy,
  ``p`` = option ``schatten_p`` = 4); ``ω_i = 1/π_i``.
* ``nosharding`` — every term, ``r = 1`` for every client whatever its profile (the over-parameterised
  factorized model); ``ω = 1``.

``+cliplr`` (``topn+scaled+cliplr``, ``prism+scaled+cliplr``, ``prism+wallenius+cliplr``, ``unbiased+cliplr``, ``collective+cliplr``,
``schatten+cliplr``): the gradients of ``u'_i`` and ``v'_i`` are multiplied by ``min(1, τ/ω_i)``, ``τ`` =
option ``tau`` (10). Why: the forward uses ``ω_i u'_i v'_iᵀ``, so both gradients carry a factor ``ω_i`` and the
term ``ω_i u'_i v'_iᵀ`` moves ``∝ ω_i²`` per step; terms with tiny ``π_i`` (huge ``ω_i``) blow up otherwise
(the reason spectral sharding clips learning rates in local training). With plain SGD (with or without momentum)
scaling the gradient is scaling the term's learning rate; with weight decay the decay is not scaled, and
Adam is insensitive to a constant gradient scale.

Samplers (option ``sampler``, used by ``unbiased``, ``collective``, ``schatten``): ``cps`` (conditional Poisson,
maximum entropy; default), ``brewer``, ``min_support`` (:mod:`subfl.sampling.samplers`). All have exactly the
marginals ``π``. PriSM's strategies always use numpy's sequential ``choice`` (its own sampler).

Other options
-------------
* ``kappa`` (None): PriSM's exponent; ``None`` = the paper's rule (4 if ``r ≤ 0.2`` else 2.5). ``kappa=0`` makes
  every term equally likely: the *uniform* row of PriSM's sampling ablation (Sec. 4.5, Table 5).
* ``weighting`` (``"power"``): the per-draw distribution of the ``prism*`` strategies (:data:`WEIGHTINGS`).
  ``"power"``: PriSM's Eq. (2), ``p_i ∝ λ_i^κ``. ``"softmax"``: the *softmax-based* row of PriSM's sampling
  ablation (Sec. 4.5, Table 5), ``p_i = exp(λ_i) / Σ_j exp(λ_j)`` (:func:`~subfl.sampling.softmax_probabilities`),
  of the layer's singular values as they are — Sec. 4.5 names no temperature, so none is applied; the
  distribution therefore depends on the scale of the weights (``W → cW`` is a softmax at temperature ``1/c``),
  where Eq. (2) does not. The terms are drawn exactly as PriSM draws them (the same sequential draw without
  replacement, ``n`` of ``N``), only ``p`` changes; the ω of ``prism+wallenius`` use the Wallenius means of that
  ``p``. ``"softmax"`` is refused for the other strategies (they draw no ``p``) and with ``kappa`` set (it has no
  exponent).
* ``frobenius_reg`` (0.0): weight ``β`` of the penalty ``(β/2) Σ_layers (‖U'_S‖_F² + ‖V'_S‖_F²)`` added to every
  mini-batch loss (client side, on the client's factors only). It is the Frobenius regulariser of a
  factorisation: for a fixed product ``Σ_{i∈S} u'_i v'_iᵀ`` it is smallest when ``‖u'_i‖ = ‖v'_i‖`` (the
  ``√λ`` split) and its minimum is ``β ‖U'_S V'_S‖_*`` (Srebro, Rennie & Jaakkola 2005), so it keeps the
  two factors balanced and favours low rank. The issue that asked for this option cites PriSM's Eq. (6) for
  it; that equation could not be checked when this was written, so the form above is this library's choice,
  stated exactly (change :func:`frobenius_penalty` if Eq. (6) differs).
* ``factor_decay`` (``"weight"``): how the run's weight decay ``wd`` (``ExperimentConfig.weight_decay``) treats the
  factors of the decomposed layers. ``"weight"``: the optimiser's weight decay, like every other parameter
  (gradient ``wd·u'``, ``wd·v'``). ``"frobenius"``: *Frobenius decay* of the layer the client computes, as
  PriSM's released code does it (``utils/frob.py`` of github.com/yuehniu/modeldecomp-fl: no weight decay on the
  factors, and the gradient of ``(wd/2) ‖U'_S V'_S‖_F²`` added to theirs, with the same coefficient ``wd``): the
  factors are left out of the optimiser's weight decay (``train_epochs(no_weight_decay=...)``; every other
  parameter keeps it) and the penalty ``(wd/2) Σ_layers ‖U'_S diag(ω_S) V'_S‖_F²`` is added to the loss. It
  penalises the product, not the factors: it leaves the split of each term between ``u'_i`` and ``v'_i`` free,
  and decays a term in proportion to its share of the layer. With ``ω = 1`` (PriSM) it is the released code's
  decay; this module includes ``ω`` so that the decayed matrix is the one the sub-model applies
  (:func:`frobenius_decay_penalty`). The released code also clips the gradient norm at 5; that is the run's
  ``grad_clip`` here, not part of this option.
* ``sbn`` (True): static batch norm — if the configured model has BatchNorm with running statistics, every
  model of the run is built with ``norm="bn_nostats"`` (batch statistics in training and evaluation, as PriSM
  does; nothing to aggregate). Models without BatchNorm are unchanged.
* ``diagnostics`` (True): append per-round diagnostics to ``state["diagnostics"]`` (below).
* ``svd_solver`` (``"exact"``): how the refresh decomposes each layer — ``"exact"``, LAPACK's thin SVD in
  float64; ``"gram"``, the eigendecomposition of the smaller Gram matrix in float64
  (:func:`~subfl.models.spectral_refresh.gram_svd_factors`), several times faster on ResNet-18's large layers,
  with the same factors to float32 rounding for spectra spanning less than about six orders of magnitude.

PriSM trains the singular values ``σ`` as separate parameters and merges them into ``U``, ``V`` after local
training. This module trains ``u'``, ``v'`` directly (``σ`` absorbed as ``√σ`` on both sides). With ``ω = 1``
both parameterisations represent exactly the same set of sub-models (``u' v'ᵀ = (u √σ)(v √σ)ᵀ``), so the
merged result lives in the same space; the optimisation trajectories are not identical (gradient descent is
not invariant to the reparameterisation), so this is a documented simplification, not an exact replica.

Diagnostics (``state["diagnostics"]``, one JSON-able dict per round; :meth:`SpectralSharding.round_metrics`
also puts the effective ranks, covered fractions and ANME into the run's history)::

    {"round": t,
     "effective_rank": {layer: erank(λ)},        # of the spectrum the round sampled from (Roy & Vetterli
                                                 #   2007; PriSM §4.4.1)
     "coverage": {layer: [C_i for i < N]},       # kernel coverage: clients that received term i this round
     "covered": {layer: #{i : C_i > 0} / N},
     "anme": {keep ratio: ANME},                 # of the inclusion probabilities π of the group's design,
                                                 #   over layers (spectral sharding §4.2.2)
     "clients": {keep ratio: C}}

ANME is 0 for ``topn`` / ``nosharding``; for PriSM's draws it uses Fog's Wallenius marginals.

The HeteroFL-style ``origdrop`` baseline (a fixed leading subset of original-space channels) is HeteroFL in
:mod:`subfl.methods.width`; it is not duplicated here. Evaluation: the dense global model (``"global"``).
"""
from __future__ import annotations

import math
import numbers
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from ..fl.aggregation import weighted_average
from ..fl.training import ClientDataset, train_epochs
from ..fl.types import ClientProfile, Task, Update
from ..metrics.spectral import anme, effective_rank
from ..models.factorized import (LayerSpec, SpectralFactors, dense_weight, factorize,
                                 factorized_modules, layer_specs, set_omega, term_tensors)
from ..models.spectral_refresh import SVD_SOLVERS, refresh_factors
from ..sampling import (collective_inclusion, cps_design, keep_count, prism_probabilities, sample_brewer,
                        sample_min_support, sample_numpy_choice, schatten_inclusion, softmax_probabilities,
                        unbiased_inclusion, unbiased_weights, wallenius_inclusion)
from ..fl.method import ClientContext, Method, ServerContext, ServerState, clone_tensors

BASE_STRATEGIES: tuple[str, ...] = ("topn", "topn+scaled", "prism", "prism+scaled", "prism+wallenius", "unbiased",
                                    "collective", "schatten", "nosharding")
"""Term-selection strategies (see the module docstring)."""

CLIPLR_SUFFIX = "+cliplr"
_CLIPPABLE = ("topn+scaled", "prism+scaled", "prism+wallenius", "unbiased", "collective", "schatten")  # ω can exceed 1

STRATEGIES: tuple[str, ...] = BASE_STRATEGIES + tuple(s + CLIPLR_SUFFIX for s in _CLIPPABLE)
"""Every accepted value of option ``strategy`` (and method name registered by this module)."""

SAMPLERS: tuple[str, ...] = ("cps", "brewer", "min_support")
"""Fixed-size samplers with prescribed marginals (option ``sampler``)."""

WEIGHTINGS: tuple[str, ...] = ("power", "softmax")
"""Accepted values of option ``weighting``: PriSM's ``p ∝ λ^κ`` (Eq. (2)) or a softmax of the singular values
(PriSM Sec. 4.5, Table 5)."""

FACTOR_DECAYS: tuple[str, ...] = ("weight", "frobenius")
"""Accepted values of option ``factor_decay``: the optimiser's weight decay on the factors, or Frobenius decay of
their product (PriSM's released code)."""

SBN_NORM = "bn_nostats"


def parse_strategy(strategy: str) -> tuple[str, bool]:
    """``(base strategy, clip learning rate?)`` of a strategy name; ``ValueError`` naming the accepted ones."""
    if not isinstance(strategy, str) or strategy not in STRATEGIES:
        raise ValueError(f"option strategy={strategy!r} is not valid; accepted: {', '.join(STRATEGIES)}")
    if strategy.endswith(CLIPLR_SUFFIX):
        return strategy[: -len(CLIPLR_SUFFIX)], True
    return strategy, False


def _check_real(value: Any, name: str, *, low: float, low_open: bool, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))
    if ok:
        ok = float(value) > low if low_open else float(value) >= low
    if not ok:
        bound = f"> {low:g}" if low_open else f">= {low:g}"
        extra = " or None" if allow_none else ""
        raise ValueError(f"option {name}={value!r} is not valid; accepted: a finite real number {bound}{extra}")
    return float(value)


# --------------------------------------------------------------------------------------------------
# term designs
# --------------------------------------------------------------------------------------------------
@dataclass
class TermDesign:
    """How the terms of one layer are drawn for the clients of one keep ratio in one round.

    ``pi``: marginal inclusion probabilities (exact, or Fog's approximation of Wallenius' for PriSM's draw);
    ``omega``: the multiplier of each term when it does not depend on the drawn set (``None`` for the ``+scaled``
    strategies); ``weights``: PriSM's per-draw probabilities ``p`` (``None`` otherwise).
    """

    strategy: str
    singular_values: np.ndarray
    n: int
    pi: np.ndarray
    omega: np.ndarray | None
    weights: np.ndarray | None = None
    sampler: str = "cps"
    _cps: Any = field(default=None, repr=False)

    def sample(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """One client's ``(sorted term indices, their multipliers ω)``."""
        lam = self.singular_values
        if self.strategy in ("topn", "topn+scaled", "nosharding"):
            idx = np.flatnonzero(self.pi >= 0.5)
        elif self.weights is not None:
            idx = _prism_draw(self.weights, self.n, rng)
        elif self.sampler == "cps":
            if self._cps is None:
                self._cps = cps_design(self.pi)
            idx = self._cps.sample(rng)
        elif self.sampler == "brewer":
            idx = sample_brewer(self.pi, rng)
        else:
            idx = sample_min_support(self.pi, rng)
        idx = np.asarray(idx, dtype=np.int64)
        if self.strategy.endswith("+scaled"):
            kept = float(np.sum(lam[idx] ** 2))
            scale = math.sqrt(float(np.sum(lam**2)) / kept) if kept > 0 else 1.0
            omega = np.full(idx.size, scale)
        else:
            omega = self.omega[idx].copy()
            omega[omega <= 0] = 1.0  # only for terms drawn with pi = 0 (degenerate all-zero spectra)
        return idx, omega


def _prism_draw(weights: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """PriSM's draw; when fewer than ``n`` weights are positive, all of them plus a uniform fill of the rest."""
    positive = np.flatnonzero(weights > 0)
    if positive.size >= n:
        return sample_numpy_choice(weights, n, rng)
    zero = np.flatnonzero(weights <= 0)
    fill = rng.choice(zero, n - positive.size, replace=False)
    return np.sort(np.concatenate((positive, fill)).astype(np.int64))


def _prism_weights(lam: np.ndarray, kappa: float | None, keep_ratio: float, weighting: str = "power") -> np.ndarray:
    """PriSM's per-draw distribution: Eq. (2) (``weighting="power"``) or the softmax of Sec. 4.5; uniform for an
    all-zero spectrum (which is also what the softmax gives there)."""
    if lam.max() <= 0:
        return np.full(lam.size, 1.0 / lam.size)
    if weighting == "softmax":
        return softmax_probabilities(lam)
    return prism_probabilities(lam, kappa, keep_ratio)


def check_weighting(weighting: Any, strategy: str, kappa: float | None) -> str:
    """Option ``weighting`` (PriSM Sec. 4.5, Table 5) validated against the strategy and ``kappa``; ``ValueError``
    naming what is accepted."""
    if not isinstance(weighting, str) or weighting not in WEIGHTINGS:
        raise ValueError(f"option weighting={weighting!r} is not valid; accepted: {', '.join(WEIGHTINGS)}")
    if weighting != "power":
        base, _ = parse_strategy(strategy)
        if not base.startswith("prism"):
            raise ValueError(f"option weighting={weighting!r} is not valid with strategy={strategy!r}; accepted: "
                             f"'power' (the default), or a PriSM strategy "
                             f"({', '.join(s for s in STRATEGIES if s.startswith('prism'))})")
        if kappa is not None:
            raise ValueError(f"option kappa={kappa!r} is not valid with weighting={weighting!r}; accepted: None (the "
                             f"softmax of the singular values has no exponent)")
    return weighting


def _prism_marginals(weights: np.ndarray, n: int) -> np.ndarray:
    positive = weights > 0
    m = int(positive.sum())
    if m >= n:
        return wallenius_inclusion(weights, n)
    pi = positive.astype(np.float64)
    pi[~positive] = (n - m) / (weights.size - m)
    return pi


def term_design(strategy: str, singular_values: Sequence[float] | np.ndarray | torch.Tensor, keep_ratio: float, *,
                clients: int = 1, kappa: float | None = None, sampler: str = "cps",
                schatten_p: float = 4.0, weighting: str = "power") -> TermDesign:
    """The :class:`TermDesign` of ``strategy`` (a base strategy or a ``+cliplr`` name) for one layer.

    ``singular_values``: the layer's spectrum ``λ`` (``N`` values); ``keep_ratio``: ``r`` (ignored by
    ``nosharding``, which keeps every term); ``clients``: ``C`` for ``collective``; ``weighting``: PriSM's
    per-draw distribution (:data:`WEIGHTINGS`; ``prism*`` strategies only). ``n = keep_count(N, r)``.
    """
    base, _ = parse_strategy(strategy)
    check_weighting(weighting, strategy, kappa)
    if sampler not in SAMPLERS:
        raise ValueError(f"option sampler={sampler!r} is not valid; accepted: {', '.join(SAMPLERS)}")
    if isinstance(singular_values, torch.Tensor):
        singular_values = singular_values.detach().to("cpu", torch.float64).numpy()
    lam = np.clip(np.asarray(singular_values, dtype=np.float64).reshape(-1), 0.0, None)
    if lam.size == 0 or not np.all(np.isfinite(lam)):
        raise ValueError(f"singular_values must be a non-empty finite 1-D array, got {lam!r}")
    size = lam.size
    n = size if base == "nosharding" else keep_count(size, keep_ratio)
    if base in ("topn", "topn+scaled"):
        order = np.argsort(-lam, kind="stable")
        pi = np.zeros(size)
        pi[order[:n]] = 1.0
        return TermDesign(base, lam, n, pi, np.ones(size) if base == "topn" else None, sampler=sampler)
    if base == "nosharding":
        return TermDesign(base, lam, n, np.ones(size), np.ones(size), sampler=sampler)
    if base.startswith("prism"):
        weights = _prism_weights(lam, kappa, keep_ratio, weighting)
        pi = _prism_marginals(weights, n)
        omega = None if base == "prism+scaled" else (unbiased_weights(pi) if base == "prism+wallenius"
                                                     else np.ones(size))
        return TermDesign(base, lam, n, pi, omega, weights, sampler)
    if base == "unbiased":
        pi = unbiased_inclusion(lam, n)
        return TermDesign(base, lam, n, pi, unbiased_weights(pi), sampler=sampler)
    if base == "collective":
        pi, omega = collective_inclusion(lam, n, clients)
        return TermDesign(base, lam, n, pi, omega, sampler=sampler)
    pi = schatten_inclusion(lam, n, schatten_p)  # base == "schatten"
    return TermDesign(base, lam, n, pi, unbiased_weights(pi), sampler=sampler)


# --------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------
def _has_batchnorm_statistics(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats for m in model.modules())


def _build(model_fn: Callable[..., nn.Module], norm: str) -> nn.Module:
    return model_fn(norm=norm) if norm else model_fn()


def _factors_dict(factors: Mapping[str, SpectralFactors]) -> dict[str, dict[str, torch.Tensor]]:
    return {name: {"u": f.u, "v": f.v, "singular_values": f.singular_values} for name, f in factors.items()}


def _group(keep_ratio: float) -> str:
    return f"{keep_ratio:g}"


def clip_gradients(model: nn.Module, tau: float) -> Callable[[], None]:
    """A ``before_step`` hook scaling the gradient of each term's ``u'_i``, ``v'_i`` by ``min(1, τ/ω_i)``."""
    scales = []
    for m in factorized_modules(model).values():
        s = torch.clamp(tau / m.omega.clamp_min(1e-30), max=1.0).detach()
        scales.append((m, s))

    def before_step() -> None:
        for m, s in scales:
            if m.u.grad is not None:
                m.u.grad.mul_(s.to(m.u.grad)[None, :])
            if m.v.grad is not None:
                m.v.grad.mul_(s.to(m.v.grad).view(-1, *([1] * (m.v.dim() - 1))))

    return before_step


def product_frobenius_sq(layer: nn.Module) -> torch.Tensor:
    """``‖U'_S diag(ω_S) V'_S‖_F²`` of a factorized layer, from the two ``k × k`` Gram matrices
    (``Σ_ij ω_i ω_j (U'ᵀU')_ij (V'V'ᵀ)_ij``), without forming the ``n × m`` product."""
    u, v = layer.u, layer.v.reshape(layer.v.shape[0], -1)
    omega = layer.omega.to(u.dtype)
    return ((u.T @ u) * (v @ v.T) * torch.outer(omega, omega)).sum()


def frobenius_decay_penalty(model: nn.Module, wd: float) -> Callable[[], torch.Tensor]:
    """Option ``factor_decay="frobenius"``: ``(wd/2) Σ_layers ‖U'_S diag(ω) V'_S‖_F²`` over ``model``'s factorized
    layers (their factors are then left out of the optimiser's weight decay)."""
    layers = list(factorized_modules(model).values())

    def penalty() -> torch.Tensor:
        return 0.5 * wd * sum(product_frobenius_sq(m) for m in layers)

    return penalty


def frobenius_penalty(model: nn.Module, beta: float) -> Callable[[], torch.Tensor]:
    """The regulariser ``(β/2) Σ_layers (‖U'_S‖_F² + ‖V'_S‖_F²)`` over the factorized layers of ``model``."""
    layers = list(factorized_modules(model).values())

    def penalty() -> torch.Tensor:
        total = sum(m.u.pow(2).sum() + m.v.pow(2).sum() for m in layers)
        return 0.5 * beta * total

    return penalty


# --------------------------------------------------------------------------------------------------
# the method
# --------------------------------------------------------------------------------------------------
class SpectralSharding(Method):
    """Spectral sub-models: PriSM and the spectral-sharding strategies (see the module docstring).

    Registered as ``spectral`` (option ``strategy``, default ``unbiased``) and under every strategy name of
    :data:`STRATEGIES` (``topn``, ``prism``, ``unbiased+cliplr``, ...), which fix the strategy.
    """

    name = "spectral"
    options: dict = {"strategy": "unbiased", "sampler": "cps", "kappa": None, "tau": 10.0, "frobenius_reg": 0.0,
                     "factor_decay": "weight", "schatten_p": 4.0, "sbn": True, "diagnostics": True,
                     "svd_solver": "exact", "weighting": "power"}
    # alternatives to the default path, versioned apart
    option_versions = {"factor_decay": 1, "svd_solver": 1, "weighting": 1}
    fixed_strategy: ClassVar[str | None] = None

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        cfg = self.config
        if self.fixed_strategy is not None and cfg["strategy"] != self.fixed_strategy:
            raise ValueError(f"method {self.name!r} fixes strategy={self.fixed_strategy!r}, got strategy="
                             f"{cfg['strategy']!r}; use method 'spectral' with option strategy to choose one")
        self.base, self.cliplr = parse_strategy(cfg["strategy"])
        if cfg["sampler"] not in SAMPLERS:
            raise ValueError(f"option sampler={cfg['sampler']!r} is not valid; accepted: {', '.join(SAMPLERS)}")
        cfg["kappa"] = _check_real(cfg["kappa"], "kappa", low=0.0, low_open=False, allow_none=True)
        cfg["tau"] = _check_real(cfg["tau"], "tau", low=0.0, low_open=True)
        cfg["frobenius_reg"] = _check_real(cfg["frobenius_reg"], "frobenius_reg", low=0.0, low_open=False)
        cfg["schatten_p"] = _check_real(cfg["schatten_p"], "schatten_p", low=1.0, low_open=True)
        for flag in ("sbn", "diagnostics"):
            if not isinstance(cfg[flag], bool):
                raise ValueError(f"option {flag}={cfg[flag]!r} is not valid; accepted: True or False")
        if cfg["factor_decay"] not in FACTOR_DECAYS:
            raise ValueError(f"option factor_decay={cfg['factor_decay']!r} is not valid; accepted: "
                             f"{', '.join(FACTOR_DECAYS)}")
        if cfg["svd_solver"] not in SVD_SOLVERS:
            raise ValueError(f"option svd_solver={cfg['svd_solver']!r} is not valid; accepted: "
                             f"{', '.join(SVD_SOLVERS)}")
        check_weighting(cfg["weighting"], cfg["strategy"], cfg["kappa"])

    # ----- server side -------------------------------------------------------------------------------
    def effective_keep_ratio(self, profile: ClientProfile) -> float:
        """The keep ratio a client trains at: its profile's, or 1 for ``nosharding``."""
        return 1.0 if self.base == "nosharding" else float(profile.keep_ratio)

    def design(self, lam: torch.Tensor | np.ndarray, keep_ratio: float, clients: int) -> TermDesign:
        """This method's :class:`TermDesign` for a layer with spectrum ``lam``."""
        cfg = self.config
        return term_design(self.base, lam, keep_ratio, clients=clients, kappa=cfg["kappa"], sampler=cfg["sampler"],
                           schatten_p=cfg["schatten_p"], weighting=cfg["weighting"])

    def refresh(self, weights: Mapping[str, torch.Tensor],
                specs: Mapping[str, LayerSpec]) -> dict[str, SpectralFactors]:
        """The orthogonal-space refresh: every decomposed layer's factors, by option ``svd_solver``."""
        return refresh_factors(weights, specs, self.config["svd_solver"])

    def init(self, ctx: ServerContext) -> ServerState:
        model = ctx.model_fn()
        norm = SBN_NORM if self.config["sbn"] and _has_batchnorm_statistics(model) else ""
        if norm:
            model = _build(ctx.model_fn, norm)
        specs = layer_specs(model)
        if not specs:
            raise ValueError(f"method {self.name!r} needs a model with a decomposable layer (a Linear / Conv2d that "
                             f"is neither the first nor the last such layer); the configured model has none")
        weights = clone_tensors(model.state_dict())
        return {"weights": weights, "specs": specs, "factors": _factors_dict(self.refresh(weights, specs)),
                "norm": norm, "diagnostics": []}

    def configure(self, state: ServerState, round: int, clients: Sequence[ClientProfile],
                  ctx: ServerContext) -> dict[int, Task]:
        specs: dict[str, LayerSpec] = state["specs"]
        factors = {name: SpectralFactors(**f) for name, f in state["factors"].items()}
        decomposed = {f"{name}.weight" for name in specs}
        dense = {k: v for k, v in state["weights"].items() if k not in decomposed}
        ratios = [self.effective_keep_ratio(p) for p in clients]
        group_sizes = Counter(ratios)
        designs: dict[tuple[str, float], TermDesign] = {}
        train = ctx.train_config(round)
        tasks: dict[int, Task] = {}
        for profile, r in zip(clients, ratios):
            rng = ctx.rng("spectral", round, profile.client_id)
            tensors = dict(dense)
            terms: dict[str, list[int]] = {}
            for name, spec in specs.items():
                key = (name, r)
                if key not in designs:
                    designs[key] = self.design(factors[name].singular_values, r, group_sizes[r])
                idx, omega = designs[key].sample(rng)
                sent = term_tensors(factors[name], idx, spec)
                tensors[f"{name}.u"] = sent["u"]
                tensors[f"{name}.v"] = sent["v"]
                tensors[f"{name}.omega"] = torch.as_tensor(omega, dtype=factors[name].u.dtype)
                terms[name] = [int(i) for i in idx]
            config = {"train": train, "keep_ratio": r, "norm": state["norm"], "terms": terms,
                      "tau": self.config["tau"] if self.cliplr else None,
                      "frobenius_reg": self.config["frobenius_reg"]}
            if self.config["factor_decay"] != "weight":  # the default leaves the task (and its bytes) as before
                config["factor_decay"] = self.config["factor_decay"]
            tasks[profile.client_id] = Task(profile.client_id, round, tensors, config)
        return tasks

    @staticmethod
    def aggregation_weights(updates: Sequence[Update]) -> list[float]:
        """Each update's weight in :meth:`aggregate`: its data size ``n_k``, or 1 for every update when no update
        reports any data."""
        sizes = [float(u.n_samples) for u in updates]
        return sizes if sum(sizes) > 0 else [1.0] * len(updates)

    def aggregate(self, state: ServerState, round: int, updates: Sequence[Update],
                  ctx: ServerContext) -> ServerState:
        if not updates:
            return state
        specs: dict[str, LayerSpec] = state["specs"]
        weights_in = state["weights"]
        decomposed = {f"{name}.weight" for name in specs}
        dense_names = [k for k in weights_in if k not in decomposed]
        sizes = self.aggregation_weights(updates)
        for u in updates:
            missing = [k for k in dense_names if k not in u.tensors]
            if missing or "terms" not in u.stats:
                raise ValueError(f"update of client {u.client_id} lacks {missing or 'stats[terms]'}; spectral "
                                 f"updates carry every non-decomposed tensor, each layer's u and v and their terms")
        averaged = weighted_average([{k: u.tensors[k] for k in dense_names} for u in updates], sizes)
        new_decomposed: dict[str, torch.Tensor] = {}
        coverage: dict[str, list[int]] = {}
        for name, spec in specs.items():
            f = state["factors"][name]
            u_glob, v_glob = f["u"].to(torch.float64).clone(), f["v"].to(torch.float64).clone()
            num_u, num_v = torch.zeros_like(u_glob), torch.zeros_like(v_glob)
            den = torch.zeros(u_glob.shape[1], dtype=torch.float64)
            count = torch.zeros(u_glob.shape[1], dtype=torch.int64)
            for upd, size in zip(updates, sizes):
                idx = torch.as_tensor(upd.stats["terms"][name], dtype=torch.int64)
                uu = upd.tensors[f"{name}.u"].to(torch.float64)
                vv = upd.tensors[f"{name}.v"].to(torch.float64).reshape(idx.numel(), -1)
                if uu.shape != (spec.out_features, idx.numel()) or vv.shape[1] != spec.in_features:
                    raise ValueError(f"client {upd.client_id}: {name}.u {tuple(uu.shape)} / {name}.v "
                                     f"{tuple(upd.tensors[f'{name}.v'].shape)} do not match {idx.numel()} terms "
                                     f"of a {spec.out_features}x{spec.in_features} layer")
                num_u[:, idx] += size * uu
                num_v[idx] += size * vv
                den[idx] += size
                count[idx] += 1
            trained = den > 0
            u_glob[:, trained] = num_u[:, trained] / den[trained]
            v_glob[trained] = num_v[trained] / den[trained, None]
            dtype = weights_in[f"{name}.weight"].dtype
            new_decomposed[f"{name}.weight"] = dense_weight(u_glob, v_glob, spec).to(dtype)
            if not torch.isfinite(new_decomposed[f"{name}.weight"]).all():
                raise FloatingPointError(
                    f"{self.name}: round {round}, layer {name!r}: the aggregated weight is not finite (local training "
                    f"diverged; the client's forward uses omega_i u'_i v'_i^T, so term i trains with an effective "
                    f"step ~omega_i^2 x lr): lower lr, or use a '+cliplr' strategy / a smaller option tau")
            coverage[name] = [int(c) for c in count]
        weights = {k: (new_decomposed[k] if k in new_decomposed else averaged[k]) for k in weights_in}
        with ctx.timed("svd_refresh"):  # the engine records it as the aggregate stage's part "svd_refresh"
            factors = {}
            for name in specs:  # and each layer's as "svd_refresh/<layer>": where the refresh's time goes
                with ctx.timed(f"svd_refresh/{name}"):
                    factors.update(self.refresh(weights, {name: specs[name]}))
        new_state = {**state, "weights": weights, "factors": _factors_dict(factors)}
        if self.config["diagnostics"]:
            new_state["diagnostics"] = [*state.get("diagnostics", []),
                                        self.round_diagnostics(state, round, updates, coverage)]
        return new_state

    def round_diagnostics(self, state: ServerState, round: int, updates: Sequence[Update],
                          coverage: Mapping[str, list[int]]) -> dict[str, Any]:
        """Effective rank of the spectra sampled from, kernel coverage and ANME per keep-ratio group."""
        lams = {name: f["singular_values"].to(torch.float64).numpy() for name, f in state["factors"].items()}
        groups = Counter(float(u.stats.get("keep_ratio", 1.0)) for u in updates)
        ranks = {name: (effective_rank(lam) if lam.sum() > 0 else 0.0) for name, lam in lams.items()}
        anmes = {_group(r): anme([self.design(lam, r, c).pi for lam in lams.values()])
                 for r, c in sorted(groups.items())}
        covered = {name: sum(1 for c in counts if c > 0) / max(1, len(counts)) for name, counts in coverage.items()}
        return {"round": int(round), "effective_rank": ranks, "coverage": dict(coverage), "covered": covered,
                "anme": anmes, "clients": {_group(r): int(c) for r, c in sorted(groups.items())}}

    def round_metrics(self, state: ServerState, round: int) -> dict[tuple[str, str], float]:
        """The round's diagnostics as history rows: ``effective_rank`` and ``covered_fraction`` per layer
        (group = layer name), ``anme`` per keep-ratio group."""
        diags = state.get("diagnostics") or []
        if not diags or diags[-1]["round"] != round:
            return {}
        d = diags[-1]
        rows = {("effective_rank", layer): float(v) for layer, v in d["effective_rank"].items()}
        rows.update({("covered_fraction", layer): float(v) for layer, v in d["covered"].items()})
        rows.update({("anme", group): float(v) for group, v in d["anme"].items()})
        return rows

    def evaluation_models(self, state: ServerState, ctx: ServerContext) -> dict[str, nn.Module]:
        model = _build(ctx.model_fn, state["norm"])
        model.load_state_dict(state["weights"])
        return {"global": model}

    # ----- client side -------------------------------------------------------------------------------
    def client_architecture(self, task: Task, ctx: ClientContext) -> nn.Module:
        """The client's sub-model for ``task``, untrained: the model with each decomposed layer factorized
        with as many terms as the task names for it."""
        cfg = task.config
        return factorize(_build(ctx.model_fn, cfg["norm"]), {name: len(idx) for name, idx in cfg["terms"].items()})

    def client_model(self, task: Task, ctx: ClientContext) -> nn.Module:
        """:meth:`client_architecture` with the task's tensors loaded and its ``ω`` set."""
        model = self.client_architecture(task, ctx)
        tensors = dict(task.tensors)
        omegas = {name: tensors.pop(f"{name}.omega") for name in task.config["terms"]}
        model.load_state_dict(tensors)
        set_omega(model, omegas)
        return model

    def local_update(self, task: Task, data: ClientDataset, ctx: ClientContext) -> Update:
        cfg = task.config
        terms: dict[str, list[int]] = cfg["terms"]
        model = self.client_model(task, ctx).to(ctx.device)
        before_step = clip_gradients(model, float(cfg["tau"])) if cfg.get("tau") else None
        penalties, undecayed = [], []
        beta = float(cfg.get("frobenius_reg") or 0.0)
        if beta > 0:
            penalties.append(frobenius_penalty(model, beta))
        wd = float(cfg["train"].get("weight_decay") or 0.0)
        if cfg.get("factor_decay", "weight") == "frobenius" and wd > 0:
            penalties.append(frobenius_decay_penalty(model, wd))
            undecayed = [p for m in factorized_modules(model).values() for p in (m.u, m.v)]
        regulariser = (lambda: sum(p() for p in penalties)) if penalties else None
        stats = train_epochs(model, data, cfg["train"], ctx.generator, device=ctx.device, regulariser=regulariser,
                             before_step=before_step, no_weight_decay=undecayed)
        return Update(task.client_id, clone_tensors(model.state_dict()), len(data),
                      {**stats, "keep_ratio": cfg["keep_ratio"], "terms": terms})


def _strategy_class(strategy: str) -> type[SpectralSharding]:
    ident = strategy.replace("+", "_")
    doc = (f"Spectral sub-models with strategy ``{strategy}`` (see :mod:`subfl.methods.spectral`); the same as "
           f"method ``spectral`` with ``strategy={strategy!r}``.")
    return type(f"Spectral_{ident}", (SpectralSharding,),
                {"name": strategy, "options": {**SpectralSharding.options, "strategy": strategy},
                 "fixed_strategy": strategy, "__module__": __name__, "__doc__": doc})


SPECTRAL_METHODS: dict[str, type[SpectralSharding]] = {
    SpectralSharding.name: SpectralSharding, **{s: _strategy_class(s) for s in STRATEGIES}}
"""Method name → class: ``spectral`` and one class per strategy name."""

__all__ = ["BASE_STRATEGIES", "FACTOR_DECAYS", "SAMPLERS", "SPECTRAL_METHODS", "STRATEGIES", "SpectralSharding",
           "TermDesign", "WEIGHTINGS", "check_weighting", "clip_gradients", "frobenius_decay_penalty",
           "frobenius_penalty", "parse_strategy", "product_frobenius_sq", "term_design"]
