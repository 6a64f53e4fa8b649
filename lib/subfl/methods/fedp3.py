"""FedP3 (Yi, Gazagnadou, Richtárik & Lyu, "FedP3: Federated Personalized and Privacy-friendly Network Pruning
under Model Heterogeneity", ICLR 2024): a client trains only a subset of the layers of a globally pruned model.

One round (Algorithm 1 of the paper):

1. **Layer assignment** (server). A *unit* is what is assigned: by default one layer (see "What a layer is").
   The final FC layer (FFC, the classifier) is trained by every client; besides it, client ``c`` in round ``t``
   trains ``k`` of the other ``L`` units, drawn uniformly without replacement from a generator derived from
   (seed, "fedp3-layers", t, c) (:meth:`~subfl.fl.method.ServerContext.rng`). ``k`` is option ``layers``: an
   int, or a set of ints from which ``k`` is drawn uniformly first (clamped to ``L``). Named presets:

   ========= ==================== =====================================================
   method    ``layers``           paper
   ========= ==================== =====================================================
   lowerb    1                    LowerB: one layer + FFC
   opu2      2                    OPU2 ("overlapped uniform", two layers)
   opu3      3                    OPU3
   opu123    {1, 2, 3}            OPU123: k drawn per client and round
   opu23     {2, 3}               OPU23
   fedp3     option (default 2)   the generic method; every option below
   ========= ==================== =====================================================

   ``assignment="cyclic"`` replaces the random draw by the rule of the authors' public code: client ``c`` of
   ``N`` trains units ``d, d+1, …, d+k−1 (mod L)`` with ``d = ⌊c·L/N⌋``, the same every round.

2. **Global pruning, server → client** (option ``global_keep`` = P ∈ (0, 1], default 1: no pruning; or
   ``"profile"``: P = the client's :attr:`~subfl.fl.types.ClientProfile.keep_ratio`). In every unit the client does
   *not* train, each weight tensor (every floating-point parameter of rank ≥ 2: convolution / linear kernels)
   keeps its ``max(1, ⌊P·n⌋)`` entries of largest magnitude (per-tensor top-|w|; ties broken by
   :func:`torch.topk`) and the others are zero. Biases, normalisation parameters and buffers are sent whole (as
   the authors' code does: biases are not sparsified), and so are the units the client trains (it trains them
   dense). *What is sent* for a pruned tensor ``w`` of ``n`` entries with ``k`` kept: ``w`` = the ``k`` kept values
   (1-d, in flat-index order) plus either ``w@mask`` — the keep mask bit-packed into ``⌈n/8⌉`` uint8 bytes — or
   ``w@index`` — the ``k`` flat indices as int32 — whichever is smaller (the index list when ``k < n/32``). So the
   ledger's download bytes are honest: ``4k + min(⌈n/8⌉, 4k)`` instead of ``4n`` for float32. (The paper's
   ratios count parameters; ours count bytes, mask included.) The frozen pruned entries stay zero on the client.

3. **Local training with optional local pruning** (option ``local_pruning``). Only the assigned units and the FFC
   have ``requires_grad``; the rest of the (pruned) model is frozen. Local pruning acts on the *hidden* layers
   the client trains (not the FFC, whose outputs are the classes) and is FjORD-style ordered dropout of their
   output units: with keep fraction ``p`` a layer of ``n`` output units (channels of a convolution, features of
   a linear layer) keeps the leading ``max(1, ⌊p·n⌋)`` units — the leading slice
   :func:`~subfl.models.slicing.window` ``(n, k)`` — and the others output exactly zero (after the layer's
   normalisation, if it has one). That equals training the leading-slice sub-network of those layers
   (:func:`~subfl.models.slicing.leading_view`): the rows of dropped units and the next layer's columns that read
   them get zero gradient. ``p`` is drawn per local iteration (mini-batch):

   * ``"fixed"`` — no local pruning (p = 1);
   * ``"uniform"`` — ``p ~ U[q, 1]`` (option ``q``, default 0.5);
   * ``"ordered_dropout"`` — ``p`` uniform from ``od_widths`` ∩ (0, keep ratio] (default {¼, ½, ¾, 1}; the
     client's keep ratio caps it, as FjORD's does).

   Draws are reported in ``Update.stats`` (``local_p_mean``, and ``local_p_counts`` for ordered dropout). Evaluation
   uses the full width.

4. **Upload and aggregation.** A client uploads only the tensors of the units it trained (the ledger shows one
   set of rows per trained unit). Each unit is aggregated over the clients that trained it; units nobody trained
   keep the server's value. Option ``aggregation``, with ``S`` the clients that trained the unit and ``m_k`` the
   number of units client ``k`` trained (FFC included):

   * ``"simple"`` — ``θ = (1/|S|) Σ_{k∈S} θ_k`` (the library's default; the paper names no default: simple averaging
     is the first of the three options of its Alg. 3, line 3);
   * ``"weighted"`` — ``θ = Σ_k m_k θ_k / Σ_k m_k`` (clients that trained more layers weigh more; the authors' code
     divides by ``|S|`` instead of ``Σ m_k``, which does not sum to 1 — we normalise);
   * ``"attention"`` — ``θ = Σ_k a_k θ_k`` with ``a = softmax_k(log π_k + s_k / τ)``: prior ``π`` (option
     ``attention_prior``: ``"simple"`` — uniform — or ``"weighted"`` — ∝ m_k), temperature ``τ`` (option
     ``attention_temperature``, default 1) and a per-unit score of the client's update ``Δ_k = θ_k − θ`` (option
     ``attention_score``): ``"cosine"`` (default) ``s_k = cos(Δ_k, Σ_j π_j Δ_j)``, agreement with the mean
     update; or ``"distance"`` ``s_k = ‖Δ_k‖ / mean_j ‖Δ_j‖`` (FedAtt-like, Ji et al. 2019: farther clients weigh
     more). As ``τ → ∞`` the weights tend to ``π``: *simple and weighted are the limits* of attention with the
     corresponding prior (and exactly so when all scores are equal). The paper does not specify its attention
     aggregation; this parameterisation is ours.

5. **LDP-FedP3** (option ``ldp``: ``None``/``False`` = off, ``True`` = defaults, or a dict with the keys below;
   or the flat options ``clip_norm`` (C, default 1), ``noise_multiplier`` (σ, default 1), ``sample_rate`` (q),
   ``delta`` (δ, default 1e-5), ``ldp_mechanism`` (default ``"update"``); any flat one given turns LDP on):

   * ``"update"`` — the client's round uses a Poisson sample of its data (each record w.p. q; q defaults to 1),
     trains on it, then clips the *update it uploads* — ``Δ = θ_trained − θ_received`` over the floating-point
     parameters of its trained units, jointly — to L2 norm C and adds ``N(0, σ²C²)`` to every coordinate before
     upload (Gaussian mechanism). Buffers (BatchNorm statistics) are not uploaded under LDP. Record-level
     accounting: one sampled Gaussian mechanism per round with sensitivity 2C (two clipped updates differ by at
     most 2C; the update is not a sum of per-record terms), i.e. noise multiplier ``σ/2``, rate q.
   * ``"dpsgd"`` — DP-SGD in local training (Abadi et al. 2016): each step draws a Poisson batch with rate q
     (default ``batch_size / n_k``), clips every per-example gradient to C, adds ``N(0, σ²C²)`` to their sum and
     divides by the expected batch size ``q·n_k``; ``local_steps`` steps, else ``local_epochs·round(1/q)``.
     Accounting: noise multiplier σ, rate q, one composition per step. Needs per-example gradients, so models with
     BatchNorm are refused.

   The server accumulates every client's RDP (:mod:`subfl.privacy`, the sampled Gaussian mechanism of Mironov et
   al. 2019) over the rounds it took part in; :meth:`FedP3.privacy_spent` returns ``{client: (ε, δ)}`` and the
   history gets ``ldp_epsilon`` rows (groups ``max`` and ``mean`` over the clients seen so far).

What a layer is. :func:`model_layers` walks the ``state_dict`` in order; every convolution / linear module starts
a layer (its weight and bias), and a normalisation module (BatchNorm, GroupNorm, LayerNorm, InstanceNorm) whose
entries come right after a convolution / linear layer joins it (affine parameters and running statistics). Any
other module with parameters is a layer of its own. So the FedP3 CNN has 5 layers (conv1, conv2, fc1, fc2, fc3 =
FFC), the FedP3 MLP 4, ResNet-18 21 (stem conv+bn, 16 block convolutions with their BN, 3 projection shortcuts
with their BN, fc). Option ``grouping`` makes larger units: ``"block"`` — layers sharing the module path up to
its first numeric component (the child of an ``nn.Sequential``: a ResNet ``BasicBlock`` ``layer1.0`` with its
shortcut; 10 units in ResNet-18: stem, 8 blocks, fc), as in FedP3's block-wise ablation; ``"stage"`` — the first
path component (``layer1``…``layer4``). The FFC (the last linear layer) is always its own unit.

Evaluation: the global (dense) model on the global test set (``"global"``) and, with the experiment option
``local_test_fraction=0.3``, FedP3's personalised evaluation: each client's data is split once 70/30 into local
training and test sets, and the engine records ``local_accuracy`` — the mean over clients of the local test
accuracy of **the model the client deploys** (:meth:`FedP3.deployed_model`). Sec. 2 of the paper says the locally
deployed model is the globally pruned one, P_i(x) (Alg. 2 line 3), whatever the local pruning. After round t it is
the new global model with every unit client i was assigned in round t kept dense and every other weight tensor
magnitude-pruned to the client's ratio P, exactly as :meth:`FedP3.configure` would send it; at P = 1 it is the
global model (:func:`subfl.fl.engine.run_simulation` computes the mean).

Models: the paper's nets are in :mod:`subfl.models.fedp3_nets`; option ``net`` (``"fedp3_cnn"`` /
``"fedp3_mlp"``, with ``net_options``) makes the method build them itself with
:func:`~subfl.models.fedp3_nets.build_fedp3_net` (at the configured ``width``, for the dataset's classes and input
shape) instead of the experiment's ``model``.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from .. import privacy
from ..fl.rng import seed_sequence
from ..fl.training import ClientDataset, make_optimizer, train_epochs
from ..fl.types import ClientProfile, Task, Update
from ..models.fedp3_nets import FEDP3_NETS, build_fedp3_net
from ..models.slicing import window
from ..fl.method import ClientContext, Method, ServerContext, ServerState, clone_tensors
from .width import global_width, level_name

GROUPINGS = ("layer", "block", "stage")
ASSIGNMENTS = ("random", "cyclic")
LOCAL_PRUNINGS = ("fixed", "uniform", "ordered_dropout")
AGGREGATIONS = ("simple", "weighted", "attention")
ATTENTION_PRIORS = ("simple", "weighted")
ATTENTION_SCORES = ("cosine", "distance")
LDP_MECHANISMS = ("update", "dpsgd")
LDP_DEFAULTS = {"clip_norm": 1.0, "noise_multiplier": 1.0, "sample_rate": None, "delta": 1e-5, "mechanism": "update"}
MASK_SUFFIX, INDEX_SUFFIX = "@mask", "@index"

_COMPUTE = (nn.modules.conv._ConvNd, nn.Linear)
_NORMS = (nn.modules.batchnorm._BatchNorm, nn.GroupNorm, nn.LayerNorm, nn.modules.instancenorm._InstanceNorm)


# ----- layers and units ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Layer:
    """One layer: a convolution / linear module (``compute``) with the normalisation after it.

    ``keys``: its ``state_dict`` entries; ``output``: the module whose output is the layer's output (the
    normalisation if attached, else the compute module); ``axis``: the dimension of its output units.
    """

    name: str
    keys: tuple[str, ...]
    compute: str | None
    output: str | None
    axis: int
    units: int


@dataclass(frozen=True)
class Unit:
    """What is assigned to a client: one or more layers (see ``grouping``)."""

    name: str
    layers: tuple[Layer, ...]

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(k for layer in self.layers for k in layer.keys)


def model_layers(model: nn.Module) -> list[Layer]:
    """The layers of ``model`` in ``state_dict`` order (see the module docstring, "What a layer is")."""
    modules = dict(model.named_modules())
    entries: list[dict[str, Any]] = []
    index_of_owner: dict[str, int] = {}
    for key in model.state_dict():
        owner = key.rpartition(".")[0]
        if owner in index_of_owner:
            entries[index_of_owner[owner]]["keys"].append(key)
            continue
        module = modules.get(owner)
        if isinstance(module, _NORMS) and entries and entries[-1]["compute"] is not None \
                and entries[-1]["output"] == entries[-1]["compute"]:
            entries[-1]["keys"].append(key)
            entries[-1]["output"] = owner
            index_of_owner[owner] = len(entries) - 1
            continue
        compute = owner if isinstance(module, _COMPUTE) else None
        axis, units = 1, 0
        if isinstance(module, nn.Linear):
            axis, units = -1, module.out_features
        elif isinstance(module, nn.modules.conv._ConvNd):
            axis, units = 1, module.out_channels
        entries.append({"name": owner or key, "keys": [key], "compute": compute, "output": compute, "axis": axis,
                        "units": units})
        index_of_owner[owner] = len(entries) - 1
    return [Layer(e["name"], tuple(e["keys"]), e["compute"], e["output"], e["axis"], e["units"]) for e in entries]


def group_name(layer_name: str, grouping: str) -> str:
    """The unit a layer belongs to: itself (``"layer"``), its path up to the first numeric component
    (``"block"``: ``layer1.0.conv1`` → ``layer1.0``) or its first path component (``"stage"``)."""
    if grouping not in GROUPINGS:
        raise ValueError(f"grouping must be one of {GROUPINGS}, got {grouping!r}")
    parts = layer_name.split(".")
    if grouping == "stage":
        return parts[0]
    if grouping == "block":
        for i, part in enumerate(parts):
            if part.isdigit():
                return ".".join(parts[:i + 1])
    return layer_name


def layer_units(model: nn.Module, grouping: str = "layer") -> tuple[list[Unit], Unit]:
    """``(units, final)``: the assignable units in order and the FFC unit (the last linear layer; the last layer
    if the model has no linear layer)."""
    layers = model_layers(model)
    if not layers:
        raise ValueError("the model has no parameters to assign")
    linears = [i for i, layer in enumerate(layers) if layer.compute is not None and layer.axis == -1]
    final_index = linears[-1] if linears else len(layers) - 1
    final = Unit(layers[final_index].name, (layers[final_index],))
    groups: dict[str, list[Layer]] = {}
    for i, layer in enumerate(layers):
        if i != final_index:
            groups.setdefault(group_name(layer.name, grouping), []).append(layer)
    if final.name in groups:  # a unit may not share the FFC's name
        groups[f"{final.name}#group"] = groups.pop(final.name)
    return [Unit(name, tuple(ls)) for name, ls in groups.items()], final


# ----- global pruning and its wire format ------------------------------------------------------------------
def kept_count(numel: int, keep: float) -> int:
    """Entries a tensor of ``numel`` entries keeps at ratio ``keep``: ``max(1, ⌊keep·numel⌋)`` (at most numel)."""
    return max(1, min(int(numel), int(math.floor(float(keep) * int(numel) + 1e-9))))


def magnitude_mask(tensor: torch.Tensor, keep: float) -> torch.Tensor:
    """Boolean mask of the ``kept_count(n, keep)`` entries of largest ``|w|`` (per-tensor magnitude pruning)."""
    flat = tensor.detach().reshape(-1)
    mask = torch.zeros(flat.numel(), dtype=torch.bool)
    mask[torch.topk(flat.abs(), kept_count(flat.numel(), keep), sorted=False).indices] = True
    return mask.view(tensor.shape)


def encode_pruned(name: str, tensor: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Wire form of a pruned tensor: ``{name: kept values (1-d), name@mask: bit-packed mask}`` or, when smaller,
    ``{name: values, name@index: int32 flat indices}``."""
    flat_mask = mask.reshape(-1)
    values = tensor.detach().reshape(-1)[flat_mask].clone()
    n, k = flat_mask.numel(), int(values.numel())
    if 4 * k < (n + 7) // 8:
        return {name: values, name + INDEX_SUFFIX: torch.nonzero(flat_mask).reshape(-1).to(torch.int32)}
    packed = np.packbits(flat_mask.numpy().astype(np.uint8))
    return {name: values, name + MASK_SUFFIX: torch.from_numpy(packed)}


def decode_pruned(tensors: Mapping[str, torch.Tensor], shapes: Mapping[str, Sequence[int]]) -> dict[str, torch.Tensor]:
    """Dense tensors from a payload (inverse of :func:`encode_pruned`; zeros at pruned entries). ``shapes``: the
    dense shape of every name; names without a mask / index entry are returned as they are."""
    out = {}
    for name, value in tensors.items():
        if name.endswith(MASK_SUFFIX) or name.endswith(INDEX_SUFFIX):
            continue
        shape = tuple(shapes[name]) if name in shapes else tuple(value.shape)
        n = math.prod(shape)
        if name + MASK_SUFFIX in tensors:
            bits = np.unpackbits(tensors[name + MASK_SUFFIX].numpy(), count=n).astype(bool)
            index = torch.from_numpy(np.flatnonzero(bits))
        elif name + INDEX_SUFFIX in tensors:
            index = tensors[name + INDEX_SUFFIX].to(torch.int64)
        else:
            out[name] = value
            continue
        dense = torch.zeros(n, dtype=value.dtype)
        dense[index] = value
        out[name] = dense.view(shape)
    return out


# ----- local pruning ------------------------------------------------------------------------------------
def kept_units(units: int, p: float) -> int:
    """Output units a layer of ``units`` keeps at local keep fraction ``p``: ``max(1, ⌊p·units⌋)``."""
    return max(1, min(int(units), int(math.floor(float(p) * int(units) + 1e-9))))


class _LocalPruning(nn.Module):
    """Runs ``model`` with the leading ``⌊p·n⌋`` output units of each pruned layer kept; ``p`` drawn per forward
    pass in training mode (see the module docstring, step 3)."""

    def __init__(self, model: nn.Module, layers: Sequence[Layer], mode: str, q: float, widths: Sequence[float],
                 generator: torch.Generator) -> None:
        super().__init__()
        self.model = model
        self.mode, self.q, self.widths, self.generator = mode, float(q), [float(w) for w in widths], generator
        self.p = 1.0
        self.draws: list[float] = []
        modules = dict(model.named_modules())
        self._handles = [modules[layer.output].register_forward_hook(self._hook(layer)) for layer in layers]

    def _hook(self, layer: Layer) -> Callable:
        def hook(module: nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
            if self.p >= 1.0:
                return output
            k = kept_units(layer.units, self.p)
            mask = torch.zeros(layer.units, dtype=output.dtype, device=output.device)
            mask[window(layer.units, k).to(output.device)] = 1.0
            axis = layer.axis % output.dim()
            shape = [1] * output.dim()
            shape[axis] = layer.units
            return output * mask.view(shape)
        return hook

    def draw(self) -> float:
        """Draw this iteration's keep fraction ``p``."""
        if self.mode == "uniform":
            p = self.q + (1.0 - self.q) * float(torch.rand(1, generator=self.generator))
        else:
            p = self.widths[int(torch.randint(len(self.widths), (1,), generator=self.generator))]
        self.p = p
        self.draws.append(p)
        return p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.draw()
        else:
            self.p = 1.0
        return self.model(x)

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


# ----- option checking ----------------------------------------------------------------------------------
def _check_choice(value: Any, option: str, accepted: Sequence[str]) -> str:
    if value not in accepted:
        raise ValueError(f"option {option} must be one of {tuple(accepted)}, got {value!r}")
    return value


def _check_layers(value: Any) -> tuple[int, ...]:
    items = [value] if isinstance(value, (int, np.integer)) and not isinstance(value, bool) else value
    try:
        out = tuple(sorted({int(v) for v in items if not isinstance(v, bool) and int(v) == v and v >= 0}))
        ok = len(out) > 0 and len(out) == len({v for v in items})
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"option layers must be an int >= 0 or a non-empty sequence of distinct ints >= 0, "
                         f"got {value!r}")
    return out


def _check_fraction(value: Any, option: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < float(value) <= 1.0:
        raise ValueError(f"option {option} must be a number in (0, 1], got {value!r}")
    return float(value)


def _parse_ldp(config: Mapping[str, Any]) -> dict[str, Any] | None:
    ldp = config.get("ldp")
    flat = {"clip_norm": config.get("clip_norm"), "noise_multiplier": config.get("noise_multiplier"),
            "sample_rate": config.get("sample_rate"), "delta": config.get("delta"),
            "mechanism": config.get("ldp_mechanism")}
    flat = {k: v for k, v in flat.items() if v is not None}
    if ldp is None or ldp is False:
        if not flat:
            return None
        ldp = {}
    elif ldp is True:
        ldp = {}
    elif isinstance(ldp, Mapping):
        unknown = sorted(set(ldp) - set(LDP_DEFAULTS))
        if unknown:
            raise ValueError(f"option ldp has unknown key(s) {unknown}; accepted: {', '.join(LDP_DEFAULTS)}")
    else:
        raise ValueError(f"option ldp must be None, True/False or a dict with keys {', '.join(LDP_DEFAULTS)}, "
                         f"got {ldp!r}")
    out = {**LDP_DEFAULTS, **dict(ldp), **flat}
    out["mechanism"] = _check_choice(out["mechanism"], "ldp mechanism", LDP_MECHANISMS)
    if isinstance(out["clip_norm"], bool) or not isinstance(out["clip_norm"], (int, float)) or not out["clip_norm"] > 0:
        raise ValueError(f"option clip_norm must be a number > 0, got {out['clip_norm']!r}")
    sigma = out["noise_multiplier"]
    if isinstance(sigma, bool) or not isinstance(sigma, (int, float)) or not (sigma >= 0 and math.isfinite(sigma)):
        raise ValueError(f"option noise_multiplier must be a finite number >= 0, got {sigma!r}")
    if out["sample_rate"] is not None:
        out["sample_rate"] = _check_fraction(out["sample_rate"], "sample_rate")
    if isinstance(out["delta"], bool) or not isinstance(out["delta"], float) or not 0.0 < out["delta"] < 1.0:
        raise ValueError(f"option delta must be a float in (0, 1), got {out['delta']!r}")
    out["clip_norm"], out["noise_multiplier"] = float(out["clip_norm"]), float(sigma)
    return out


# ----- the method ---------------------------------------------------------------------------------------
class FedP3(Method):
    """FedP3: layer-subset training of a globally pruned model, with optional local pruning and LDP.

    See the module docstring for every option: ``layers``, ``assignment``, ``grouping``, ``global_keep``,
    ``local_pruning``, ``q``, ``od_widths``, ``aggregation``, ``attention_*``, ``ldp`` (+ flat ``clip_norm``,
    ``noise_multiplier``, ``sample_rate``, ``delta``, ``ldp_mechanism``), ``net``, ``net_options``.
    """

    name = "fedp3"
    options: dict = {
        "layers": 2, "assignment": "random", "grouping": "layer", "global_keep": 1.0,
        "local_pruning": "fixed", "q": 0.5, "od_widths": (0.25, 0.5, 0.75, 1.0),
        "aggregation": "simple", "attention_temperature": 1.0, "attention_prior": "simple",
        "attention_score": "cosine",
        "ldp": None, "clip_norm": None, "noise_multiplier": None, "sample_rate": None, "delta": None,
        "ldp_mechanism": None,
        "net": None, "net_options": None,
    }
    fixed_layers: tuple[int, ...] | None = None
    option_versions = {"global_keep": 1}
    """``global_keep`` 1: the personalised evaluation scores each client's deployed (globally pruned) model, where it
    scored the dense global model — a run with P < 1 records other ``local_accuracy`` values."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        c = self.config
        if self.fixed_layers is not None and "layers" in options and _check_layers(options["layers"]) != self.fixed_layers:
            raise ValueError(f"method {self.name!r} trains layers={list(self.fixed_layers)}; use method 'fedp3' "
                             f"to choose option layers")
        c["layers"] = _check_layers(c["layers"])
        _check_choice(c["assignment"], "assignment", ASSIGNMENTS)
        _check_choice(c["grouping"], "grouping", GROUPINGS)
        if c["global_keep"] != "profile":
            c["global_keep"] = _check_fraction(c["global_keep"], "global_keep")
        _check_choice(c["local_pruning"], "local_pruning", LOCAL_PRUNINGS)
        c["q"] = _check_fraction(c["q"], "q")
        try:
            widths = tuple(sorted({float(w) for w in c["od_widths"]}))
        except (TypeError, ValueError):
            widths = ()
        if not widths or any(not 0.0 < w <= 1.0 for w in widths):
            raise ValueError(f"option od_widths must be a non-empty sequence of numbers in (0, 1], "
                             f"got {c['od_widths']!r}")
        c["od_widths"] = widths
        _check_choice(c["aggregation"], "aggregation", AGGREGATIONS)
        _check_choice(c["attention_prior"], "attention_prior", ATTENTION_PRIORS)
        _check_choice(c["attention_score"], "attention_score", ATTENTION_SCORES)
        tau = c["attention_temperature"]
        if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not tau > 0:
            raise ValueError(f"option attention_temperature must be a number > 0, got {tau!r}")
        self.ldp = _parse_ldp(c)
        if c["net"] is not None and c["net"] not in FEDP3_NETS:
            raise ValueError(f"option net must be None or one of {tuple(FEDP3_NETS)}, got {c['net']!r}")
        if c["net_options"] is not None and not isinstance(c["net_options"], Mapping):
            raise ValueError(f"option net_options must be a dict or None, got {c['net_options']!r}")
        self._structure_cache: dict[str, Any] | None = None
        self._mask_cache: tuple[Mapping[str, torch.Tensor], float, dict[str, torch.Tensor]] | None = None

    # ----- models -------------------------------------------------------------------------------------
    def net_spec(self, ctx: ServerContext) -> dict[str, Any] | None:
        """The JSON description of the network option ``net`` (``None``: the experiment's model)."""
        if self.config["net"] is None:
            return None
        return {"name": self.config["net"], "num_classes": int(ctx.num_classes),
                "input_shape": [int(s) for s in ctx.input_shape], "width": global_width(ctx.model_fn),
                "options": dict(self.config["net_options"] or {})}

    @staticmethod
    def _build(spec: Mapping[str, Any] | None, model_fn: Callable[..., nn.Module]) -> nn.Module:
        if spec is None:
            return model_fn()
        return build_fedp3_net(spec["name"], num_classes=spec["num_classes"], input_shape=tuple(spec["input_shape"]),
                               width=spec["width"], **dict(spec["options"]))

    def _structure(self, ctx: ServerContext) -> dict[str, Any]:
        if self._structure_cache is None:
            model = self._build(self.net_spec(ctx), ctx.model_fn)
            units, final = layer_units(model, self.config["grouping"])
            self._structure_cache = {
                "units": units, "final": final,
                "params": {n for n, _ in model.named_parameters()},
                "unit_of_key": {k: u.name for u in [*units, final] for k in u.keys}}
        return self._structure_cache

    # ----- server side --------------------------------------------------------------------------------
    def init(self, ctx: ServerContext) -> ServerState:
        spec = self.net_spec(ctx)
        if spec is None:
            model = ctx.model_fn()
        else:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(int(seed_sequence(ctx.seed, "init").generate_state(1)[0]))
                model = self._build(spec, ctx.model_fn)
        self._structure(ctx)
        return {"weights": clone_tensors(model.state_dict()), "ldp_rdp": {}, "round_stats": {}}

    def assign(self, round: int, client_id: int, ctx: ServerContext) -> list[str]:
        """Names of the units client ``client_id`` trains in ``round``, FFC last (see step 1)."""
        structure = self._structure(ctx)
        units, final = structure["units"], structure["final"]
        n_units = len(units)
        ks = self.config["layers"]
        rng = ctx.rng("fedp3-layers", int(round), int(client_id))
        k = int(ks[int(rng.integers(len(ks)))]) if len(ks) > 1 else int(ks[0])
        k = min(k, n_units)
        if self.config["assignment"] == "cyclic":
            start = (int(client_id) * n_units) // max(1, int(ctx.num_clients))
            chosen = sorted({(start + i) % n_units for i in range(k)})
        else:
            chosen = sorted(int(i) for i in rng.choice(n_units, size=k, replace=False)) if k else []
        return [units[i].name for i in chosen] + [final.name]

    def global_keep(self, profile: ClientProfile) -> float:
        """The global pruning ratio P of a client (option ``global_keep``)."""
        value = self.config["global_keep"]
        return float(profile.keep_ratio) if value == "profile" else float(value)

    def local_widths(self, keep_ratio: float) -> list[float]:
        """Ordered-dropout widths a client of ``keep_ratio`` may draw (``od_widths`` ≤ keep ratio; the smallest
        width if none is)."""
        widths = [w for w in self.config["od_widths"] if w <= keep_ratio + 1e-12]
        return widths or [self.config["od_widths"][0]]

    def pruned_tensors(self, weights: Mapping[str, torch.Tensor], trained_units: set[str], keep: float,
                       ctx: ServerContext) -> list[str]:
        """Names of the tensors the server-to-client pruning P_i prunes for a client that trains ``trained_units``
        at ratio ``keep``: every floating-point weight of ≥ 2 dimensions outside those units (none at P = 1)."""
        structure = self._structure(ctx)
        if keep >= 1.0:
            return []
        return [name for name, tensor in weights.items()
                if structure["unit_of_key"].get(name) not in trained_units and name in structure["params"]
                and tensor.is_floating_point() and tensor.dim() >= 2]

    def deployed_model(self, state: ServerState, round: int, client: ClientProfile, ctx: ServerContext) -> nn.Module:
        """The model ``client`` deploys after ``round`` (Sec. 2, Alg. 2 line 3: P_i(x)): the global weights of
        ``state`` with the client's round-``round`` units dense and every other tensor of
        :meth:`pruned_tensors` magnitude-pruned to its ratio P (zeros at pruned entries) — what
        :meth:`configure` sends it."""
        weights = state["weights"]
        keep = self.global_keep(client)
        pruned = set(self.pruned_tensors(weights, set(self.assign(round, client.client_id, ctx)), keep, ctx))
        masked = self._masked_weights(weights, keep)
        model = self._build(self.net_spec(ctx), ctx.model_fn)
        model.load_state_dict({name: masked[name] if name in pruned else tensor for name, tensor in weights.items()})
        return model

    def _masked_weights(self, weights: Mapping[str, torch.Tensor], keep: float) -> dict[str, torch.Tensor]:
        """Every ≥ 2-d floating-point tensor of ``weights`` magnitude-pruned to ``keep`` — the same for every client
        of one ratio, so computed once per weights and ratio (the cache holds the weights it was computed from)."""
        cached = self._mask_cache
        if cached is None or cached[0] is not weights or cached[1] != keep:
            masked = {name: tensor * magnitude_mask(tensor, keep) for name, tensor in weights.items()
                      if tensor.is_floating_point() and tensor.dim() >= 2}
            self._mask_cache = cached = (weights, keep, masked)
        return cached[2]

    def configure(self, state: ServerState, round: int, clients: Sequence[ClientProfile],
                  ctx: ServerContext) -> dict[int, Task]:
        weights = state["weights"]
        tasks = {}
        for profile in clients:
            trained = self.assign(round, profile.client_id, ctx)
            trained_set = set(trained)
            keep = self.global_keep(profile)
            pruned = self.pruned_tensors(weights, trained_set, keep, ctx)
            tensors: dict[str, torch.Tensor] = {}
            for name, tensor in weights.items():
                if name in pruned:
                    tensors.update(encode_pruned(name, tensor, magnitude_mask(tensor, keep)))
                else:
                    tensors[name] = tensor.detach().clone()
            config = {"train": ctx.train_config(round), "trained_units": trained, "grouping": self.config["grouping"],
                      "global_keep": keep, "pruned": pruned, "keep_ratio": float(profile.keep_ratio),
                      "local_pruning": self.config["local_pruning"], "q": self.config["q"],
                      "od_widths": self.local_widths(float(profile.keep_ratio)), "ldp": self.ldp,
                      "net": self.net_spec(ctx)}
            tasks[profile.client_id] = Task(profile.client_id, round, tensors, config)
        return tasks

    def unit_weights(self, unit: Unit, updates: Sequence[Update], current: Mapping[str, torch.Tensor],
                     trained_counts: Sequence[int]) -> np.ndarray:
        """Aggregation weights (summing to 1) of the clients that trained ``unit`` (step 4)."""
        how = self.config["aggregation"]
        counts = np.asarray(trained_counts, dtype=float)
        if how == "simple":
            return np.full(len(updates), 1.0 / len(updates))
        if how == "weighted":
            return counts / counts.sum()
        prior = np.full(len(updates), 1.0 / len(updates)) if self.config["attention_prior"] == "simple" \
            else counts / counts.sum()
        keys = [k for k in unit.keys if current[k].is_floating_point() and all(k in u.tensors for u in updates)]
        if not keys or len(updates) == 1:
            return prior
        deltas = torch.stack([torch.cat([(u.tensors[k].to(torch.float64) - current[k].to(torch.float64)).reshape(-1)
                                         for k in keys]) for u in updates])
        norms = deltas.norm(dim=1)
        if self.config["attention_score"] == "cosine":
            mean = (torch.as_tensor(prior, dtype=torch.float64)[:, None] * deltas).sum(0)
            denominator = norms * mean.norm()
            scores = torch.where(denominator > 0, deltas @ mean / denominator.clamp_min(1e-300),
                                 torch.zeros_like(norms))
        else:
            scale = norms.mean()
            scores = norms / scale if scale > 0 else torch.zeros_like(norms)
        logits = np.log(prior) + scores.numpy() / float(self.config["attention_temperature"])
        logits -= logits.max()
        weights = np.exp(logits)
        return weights / weights.sum()

    def aggregate(self, state: ServerState, round: int, updates: Sequence[Update],
                  ctx: ServerContext) -> ServerState:
        structure = self._structure(ctx)
        current = state["weights"]
        unit_of_key = structure["unit_of_key"]
        trained = [{unit_of_key[k] for k in u.tensors} for u in updates]
        unknown = sorted({k for u in updates for k in u.tensors if k not in unit_of_key})
        if unknown:
            raise ValueError(f"updates hold tensors the global model does not have: {unknown[:5]}")
        new = dict(current)
        coverage: dict[str, int] = {}
        for unit in [*structure["units"], structure["final"]]:
            holders = [i for i, names in enumerate(trained) if unit.name in names]
            coverage[unit.name] = len(holders)
            if not holders:
                continue
            group = [updates[i] for i in holders]
            coefficients = self.unit_weights(unit, group, current, [len(trained[i]) for i in holders])
            for key in unit.keys:
                present = [(c, u.tensors[key]) for c, u in zip(coefficients, group) if key in u.tensors]
                if not present:
                    continue
                total = sum(c for c, _ in present)
                acc = sum((c / total) * t.detach().to("cpu", torch.float64) for c, t in present)
                target = current[key]
                new[key] = (acc.round() if not target.is_floating_point() else acc).to(target.dtype)
        total_numel = sum(t.numel() for t in current.values())
        upload = [sum(t.numel() for t in u.tensors.values()) / total_numel for u in updates]
        rdp = dict(state.get("ldp_rdp", {}))
        for u in updates:
            info = u.stats.get("ldp")
            if info:
                step = privacy.compute_rdp(info["effective_noise_multiplier"], info["sample_rate"], int(info["steps"]))
                rdp[u.client_id] = rdp.get(u.client_id, np.zeros(len(privacy.DEFAULT_ORDERS))) + step
        round_stats = {"coverage": coverage, "upload_fraction": float(np.mean(upload)) if upload else 0.0}
        return {**state, "weights": new, "ldp_rdp": rdp, "round_stats": round_stats}

    def privacy_spent(self, state: ServerState, delta: float | None = None) -> dict[int, tuple[float, float]]:
        """``{client: (ε, δ)}`` of every client that took part so far under LDP (RDP composed over its rounds,
        converted at ``delta``, default the option ``delta``)."""
        if delta is None:
            delta = (self.ldp or LDP_DEFAULTS)["delta"]
        return {int(c): (privacy.privacy_spent(r, privacy.DEFAULT_ORDERS, delta)[0], float(delta))
                for c, r in sorted(state.get("ldp_rdp", {}).items())}

    def round_metrics(self, state: ServerState, round: int) -> dict[tuple[str, str], float]:
        stats = state.get("round_stats") or {}
        out: dict[tuple[str, str], float] = {}
        for unit, count in stats.get("coverage", {}).items():
            out[("unit_clients", unit)] = float(count)
        if "upload_fraction" in stats:
            out[("upload_fraction", "mean")] = stats["upload_fraction"]
        if self.ldp is not None and state.get("ldp_rdp"):
            eps = [e for e, _ in self.privacy_spent(state).values()]
            out[("ldp_epsilon", "max")] = float(max(eps))
            out[("ldp_epsilon", "mean")] = float(np.mean(eps))
        return out

    def evaluation_models(self, state: ServerState, ctx: ServerContext) -> dict[str, nn.Module]:
        model = self._build(self.net_spec(ctx), ctx.model_fn)
        model.load_state_dict(state["weights"])
        return {"global": model}

    def personalized_models(self, state: ServerState, round: int, client: ClientProfile,
                            models: Mapping[str, nn.Module], ctx: ServerContext) -> Mapping[str, nn.Module]:
        """FedP3's personalised evaluation scores each client's deployed model (:meth:`deployed_model`); at P = 1
        that is the global model itself, returned without a copy."""
        if self.global_keep(client) >= 1.0:
            return models
        return {"global": self.deployed_model(state, round, client, ctx)}

    # ----- client side --------------------------------------------------------------------------------
    def local_update(self, task: Task, data: ClientDataset, ctx: ClientContext) -> Update:
        cfg = task.config
        model = self._build(cfg.get("net"), ctx.model_fn)
        template = model.state_dict()
        state = decode_pruned(task.tensors, {k: tuple(v.shape) for k, v in template.items()})
        model.load_state_dict(state)
        model.to(ctx.device)
        units, final = layer_units(model, cfg["grouping"])
        wanted = set(cfg["trained_units"])
        chosen = [u for u in [*units, final] if u.name in wanted]
        if len(chosen) != len(wanted):
            raise ValueError(f"task names units the model does not have: {sorted(wanted - {u.name for u in chosen})}")
        trained_keys = {k for u in chosen for k in u.keys}
        params = dict(model.named_parameters())
        for name, p in params.items():
            p.requires_grad_(name in trained_keys)
        trainable = [n for n in params if n in trained_keys]
        received = {n: params[n].detach().clone() for n in trainable}

        pruner = None
        if cfg["local_pruning"] != "fixed":
            hidden = [layer for u in chosen if u is not final for layer in u.layers
                      if layer.compute is not None and layer.units > 0]
            draws = torch.Generator().manual_seed(int(torch.randint(2**62, (1,), generator=ctx.generator)))
            pruner = _LocalPruning(model, hidden, cfg["local_pruning"], cfg["q"], cfg["od_widths"], draws)
        net = pruner if pruner is not None else model

        ldp = cfg.get("ldp")
        extra: dict[str, Any] = {}
        if ldp is not None and ldp["mechanism"] == "dpsgd":
            q = ldp["sample_rate"] or min(1.0, cfg["train"]["batch_size"] / max(1, len(data)))
            stats = _dpsgd_train(model, pruner, data, cfg["train"], trainable, ldp["clip_norm"],
                                 ldp["noise_multiplier"], q, ctx.generator, ctx.device)
            extra["ldp"] = {"mechanism": "dpsgd", "noise_multiplier": ldp["noise_multiplier"],
                            "effective_noise_multiplier": ldp["noise_multiplier"], "sample_rate": q,
                            "steps": stats["steps"], "clip_norm": ldp["clip_norm"]}
        else:
            local = data
            q = 1.0
            if ldp is not None and ldp["sample_rate"] is not None and ldp["sample_rate"] < 1.0:
                q = ldp["sample_rate"]
                keep = torch.rand(len(data), generator=ctx.generator) < q
                local = ClientDataset(data.data, data.indices[keep].numpy())
            stats = train_epochs(net, local, cfg["train"], ctx.generator, device=ctx.device,
                                 params=[params[n] for n in trainable])
        if pruner is not None:
            pruner.remove()
            extra["local_p_mean"] = float(np.mean(pruner.draws)) if pruner.draws else 1.0
            if cfg["local_pruning"] == "ordered_dropout":
                counts: dict[str, int] = {}
                for p in pruner.draws:
                    counts[level_name(p)] = counts.get(level_name(p), 0) + 1
                extra["local_p_counts"] = dict(sorted(counts.items(), key=lambda kv: float(kv[0])))

        trained_state = {k: v for k, v in model.state_dict().items() if k in trained_keys}
        if ldp is not None:
            trained_state = {k: trained_state[k] for k in trainable}  # parameters only: no buffers under LDP
        if ldp is not None and ldp["mechanism"] == "update":
            deltas = {k: trained_state[k].detach().to("cpu", torch.float64) - received[k].to("cpu", torch.float64)
                      for k in trainable}
            norm = math.sqrt(sum(float(d.pow(2).sum()) for d in deltas.values()))
            factor = min(1.0, ldp["clip_norm"] / norm) if norm > 0 else 1.0
            sigma = ldp["noise_multiplier"] * ldp["clip_norm"]
            trained_state = {}
            for k in trainable:
                noise = torch.randn(deltas[k].shape, generator=ctx.generator, dtype=torch.float64) * sigma
                trained_state[k] = (received[k].to("cpu", torch.float64) + deltas[k] * factor + noise).to(
                    received[k].dtype)
            extra["ldp"] = {"mechanism": "update", "noise_multiplier": ldp["noise_multiplier"],
                            "effective_noise_multiplier": ldp["noise_multiplier"] / 2.0, "sample_rate": q,
                            "steps": 1, "clip_norm": ldp["clip_norm"], "update_norm": norm}
        return Update(task.client_id, clone_tensors(trained_state), len(data),
                      {**stats, **extra, "trained_units": list(cfg["trained_units"]),
                       "keep_ratio": cfg["keep_ratio"], "global_keep": cfg["global_keep"]})


def _dpsgd_train(model: nn.Module, pruner: _LocalPruning | None, data: ClientDataset, config: Mapping[str, Any],
                 trainable: Sequence[str], clip_norm: float, noise_multiplier: float, sample_rate: float,
                 generator: torch.Generator, device: str) -> dict[str, float]:
    """DP-SGD (Abadi et al. 2016) on the ``trainable`` parameters: Poisson batches of rate ``sample_rate``,
    per-example gradients clipped to ``clip_norm``, ``N(0, σ²C²)`` added to their sum, divided by ``q·n``."""
    if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        raise ValueError("ldp mechanism 'dpsgd' needs per-example gradients, which BatchNorm does not have; use "
                         "norm='gn' or 'none', or ldp mechanism 'update'")
    from torch.func import functional_call, grad_and_value, vmap

    model.train()
    params = dict(model.named_parameters())
    optimizer = make_optimizer([params[n] for n in trainable], dict(config))
    n = len(data)
    steps = config.get("local_steps") or int(config.get("local_epochs", 1)) * max(1, round(1.0 / sample_rate))
    expected = max(sample_rate * n, 1e-12)

    def loss_one(weights: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, weights, (x.unsqueeze(0),))
        return F.cross_entropy(out, y.unsqueeze(0))

    per_example = vmap(grad_and_value(loss_one), in_dims=(None, 0, 0))
    total_loss, counted = 0.0, 0
    for _ in range(int(steps)):
        chosen = data.indices[torch.rand(n, generator=generator) < sample_rate]
        if pruner is not None:
            pruner.draw()
        summed = {k: torch.zeros_like(params[k]) for k in trainable}
        if len(chosen):
            x, y = data.data.x[chosen].to(device), data.data.y[chosen].to(device)
            grads, losses = per_example({k: params[k].detach() for k in trainable}, x, y)
            norms = torch.sqrt(sum(grads[k].reshape(len(chosen), -1).pow(2).sum(1) for k in trainable))
            factor = (clip_norm / (norms + 1e-12)).clamp(max=1.0)
            for k in trainable:
                summed[k] = torch.einsum("b,b...->...", factor, grads[k])
            total_loss += float(losses.sum())
            counted += len(chosen)
        optimizer.zero_grad(set_to_none=True)
        for k in trainable:
            noise = torch.randn(summed[k].shape, generator=generator) * (noise_multiplier * clip_norm)
            params[k].grad = (summed[k] + noise.to(summed[k].device)) / expected
        optimizer.step()
    return {"loss": total_loss / max(1, counted), "steps": int(steps)}


def _preset(name: str, layers: tuple[int, ...], paper_name: str) -> type[FedP3]:
    doc = (f"FedP3's {paper_name}: every client trains the FFC and k = {' or '.join(map(str, layers))} other "
           f"layer(s) per round; the same as method ``fedp3`` with ``layers={list(layers)}`` "
           f"(see :mod:`subfl.methods.fedp3`).")
    return type(paper_name.replace(" ", ""), (FedP3,),
                {"name": name, "options": {**FedP3.options, "layers": layers}, "fixed_layers": layers,
                 "__module__": __name__, "__doc__": doc})


FEDP3_PRESETS: dict[str, tuple[int, ...]] = {"lowerb": (1,), "opu2": (2,), "opu3": (3,), "opu123": (1, 2, 3),
                                             "opu23": (2, 3)}
"""Preset name → the set of k (layers besides the FFC) it trains."""

FEDP3_METHODS: dict[str, type[FedP3]] = {
    FedP3.name: FedP3,
    **{name: _preset(name, ks, {"lowerb": "LowerB"}.get(name, name.upper())) for name, ks in FEDP3_PRESETS.items()}}
"""Method name → class: ``fedp3`` and the presets ``lowerb``, ``opu2``, ``opu3``, ``opu123``, ``opu23``."""

__all__ = ["AGGREGATIONS", "FEDP3_METHODS", "FEDP3_PRESETS", "FedP3", "Layer", "Unit", "decode_pruned",
           "encode_pruned", "group_name", "kept_count", "kept_units", "layer_units", "magnitude_mask", "model_layers"]
