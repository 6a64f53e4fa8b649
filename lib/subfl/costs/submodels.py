"""Costs of the spectral sub-models of PriSM / OrthDrop clients: parameters, MACs and activation memory.

PriSM (Niu et al., "Overcoming resource constraints in federated learning: large models can be trained with
only weak clients", TMLR 2023, §3) holds every decomposed layer in its SVD basis, ``W = Σ_i λ_i u_i v_iᵀ``
(:mod:`subfl.models.factorized`): a ``k×k`` convolution with ``N`` outputs and ``C`` inputs becomes a ``k×k``
convolution with ``n`` outputs (the principal kernels ``v_i``) followed by a ``1×1`` convolution ``n → N``
(the ``u_i``). A client with keep ratio ``r`` trains ``n = ⌈r·T⌉`` of the ``T = min(N, C·k²)`` terms of every
decomposed layer (:func:`~subfl.sampling.keep_count`); PriSM draws them with ``p_i ∝ λ_i^κ`` (Eq. 2),
OrthDrop keeps the top ``n`` — the *shape* of the sub-model, and therefore every cost on this page, is the same
for both.

Which layers (the library's rule, :func:`~subfl.models.factorized.decomposable_layers`): every convolution and
linear layer except the first (stem) and the last (classifier). For the CIFAR ResNet-18 that is the 16 ``3×3``
convolutions of the residual blocks and the three ``1×1`` projection shortcuts. PriSM's released code keeps
the ``1×1`` shortcuts dense; ``pointwise=False`` reproduces that convention.

Per decomposed layer with ``n`` kept terms (``m = C·k_h·k_w``, output ``H'×W'``):

* parameters ``n·(m + N)`` (+ ``N`` for a bias) instead of ``N·m`` (+ ``N``);
* multiply-accumulates per sample ``H'·W'·n·(m + N)`` instead of ``H'·W'·N·m`` (a linear layer: ``n·(m + N)``
  instead of ``N·m`` per input row).

Measured costs (:func:`submodel_costs`) come from the modules themselves: :func:`~subfl.costs.count_parameters`,
:func:`~subfl.costs.forward_flops` (``torch.utils.flop_counter``; convolutions and matrix products only, one
multiply-add = 2 FLOPs, :func:`~subfl.costs.macs`) and :func:`~subfl.costs.activation_memory_bytes` (the
tensors autograd keeps for the backward pass of one training forward, measured with saved-tensor hooks).
Analytic costs (:func:`analytic_costs`) apply the formulas above to the layer shapes, so the two columns check
each other.

PriSM's memory-efficient sub-model (Eq. 5, a client also computes only the first output channels of each layer)
is costed in :mod:`subfl.costs.constant_channels` (layers: :mod:`subfl.models.output_subset`).
"""
from __future__ import annotations

import copy
import numbers
from collections.abc import Mapping, Sequence

import pandas as pd
import torch
from torch import nn

from ..models.factorized import (
    LayerSpec,
    SpectralFactors,
    build_submodel,
    decompose,
    decomposable_layers,
    factorize,
    layer_specs,
)
from ..models.registry import build_model
from ..sampling import keep_count
from .flops import forward_flops, isolated_training_step, macs
from .memory import activation_memory_bytes
from .params import count_parameters

MB = 1e6
"""Bytes per MB in :func:`submodel_cost_table` (decimal megabytes, as elsewhere in :mod:`subfl.costs`)."""

PRISM_KEEP_RATIOS: tuple[float, ...] = (0.8, 0.6, 0.4, 0.2)
"""The keep ratios of PriSM's Table 1 (sub-models of 0.8×, 0.6×, 0.4× and 0.2× the principal kernels)."""

TABLE_COLUMNS: tuple[str, ...] = (
    "model", "keep_ratio", "terms", "terms_fraction", "params", "params_analytic", "params_ratio", "macs",
    "macs_analytic", "macs_ratio", "activations_mb", "activations_ratio")
"""Columns of :func:`submodel_cost_table` (``*_ratio``: relative to the dense model)."""


# --------------------------------------------------------------------------------------------------
# argument checks
# --------------------------------------------------------------------------------------------------
def check_keep_ratio(keep_ratio: object, name: str = "keep_ratio") -> float:
    """``keep_ratio`` as a float if it is a real number in ``(0, 1]``; ``ValueError`` naming ``name`` otherwise."""
    ok = isinstance(keep_ratio, numbers.Real) and not isinstance(keep_ratio, bool)
    if not ok or not 0.0 < float(keep_ratio) <= 1.0:
        raise ValueError(f"{name}={keep_ratio!r} is not valid; accepted: a real number in (0, 1]")
    return float(keep_ratio)


def _check_positive_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < 1:
        raise ValueError(f"{name}={value!r} is not valid; accepted: a positive integer")
    return int(value)


def _resolve_model(model: nn.Module | str, num_classes: int, input_shape: Sequence[int], width: float) -> nn.Module:
    if isinstance(model, str):
        return build_model(model, num_classes=num_classes, input_shape=tuple(input_shape), width=width)
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module or a model name, got {type(model).__name__}")
    return model


# --------------------------------------------------------------------------------------------------
# which layers, how many terms
# --------------------------------------------------------------------------------------------------
def submodel_layers(model: nn.Module, *, pointwise: bool = True) -> list[str]:
    """The layers a spectral client trains factorized: :func:`~subfl.models.factorized.decomposable_layers`.

    ``pointwise=False`` leaves the ``1×1`` convolutions dense (PriSM's released code does so for ResNet's
    projection shortcuts); linear layers and larger kernels are kept either way.
    """
    if not isinstance(pointwise, bool):
        raise ValueError(f"pointwise={pointwise!r} is not valid; accepted: True or False")
    names = decomposable_layers(model)
    if pointwise:
        return names
    specs = layer_specs(model, names)
    return [name for name, spec in specs.items() if not (spec.kind == "conv2d" and spec.weight_shape[2:] == (1, 1))]


def submodel_ranks(model: nn.Module, keep_ratio: float, *, pointwise: bool = True) -> dict[str, int]:
    """Terms per factorized layer of a keep-ratio-``r`` client: ``n = ⌈r·T⌉`` with ``T = min(N, C·k²)``.

    ``keep_ratio = 1`` keeps every term (the factorized full model).
    """
    r = check_keep_ratio(keep_ratio)
    specs = layer_specs(model, submodel_layers(model, pointwise=pointwise))
    return {name: keep_count(spec.num_terms, r) for name, spec in specs.items()}


def spectral_submodel(model: nn.Module | str, keep_ratio: float = 1.0, *, pointwise: bool = True,
                      factors: Mapping[str, SpectralFactors] | None = None, with_weights: bool = True,
                      num_classes: int = 10, input_shape: Sequence[int] = (3, 32, 32),
                      width: float = 1.0) -> nn.Module:
    """The factorized sub-model a client with keep ratio ``r`` trains (a new module; ``model`` is unchanged).

    ``model``: a dense model, or a name for :func:`~subfl.models.build_model` (then ``num_classes``,
    ``input_shape`` and ``width`` are used). Every layer of :func:`submodel_layers` becomes a
    :class:`~subfl.models.factorized.FactorizedConv2d` / ``FactorizedLinear`` with ``⌈r·T⌉`` terms; the other
    layers stay dense.

    With ``with_weights=True`` the sub-model holds the top ``n`` terms of the dense weights' SVD (OrthDrop's
    sub-model, and the shape of every PriSM sub-model of that keep ratio): ``factors`` (from
    :func:`~subfl.models.factorized.decompose`) saves recomputing the SVD. ``with_weights=False`` leaves the
    factors at zero (every cost is the same; no SVD is computed).
    """
    dense = _resolve_model(model, num_classes, input_shape, width)
    ranks = submodel_ranks(dense, keep_ratio, pointwise=pointwise)
    if not with_weights:
        return factorize(copy.deepcopy(dense), ranks)
    if factors is None:
        factors = decompose(dense, list(ranks))
    missing = sorted(set(ranks) - set(factors))
    if missing:
        raise ValueError(f"factors lack the layers {missing}; pass decompose(model) or leave factors=None")
    return build_submodel(dense, factors, {name: list(range(n)) for name, n in ranks.items()})


# --------------------------------------------------------------------------------------------------
# analytic costs
# --------------------------------------------------------------------------------------------------
def _output_positions(model: nn.Module, input_shape: Sequence[int]) -> dict[str, int]:
    """Per Conv2d / Linear layer: output positions per sample (``H'·W'``, or the rows a linear layer maps)."""
    positions: dict[str, int] = {}
    handles = []

    def record(name: str):
        def hook(module: nn.Module, args, output: torch.Tensor) -> None:
            if isinstance(module, nn.Conv2d):
                positions[name] = int(output.shape[-2] * output.shape[-1])
            else:
                positions[name] = int(output[0].numel() // output.shape[-1]) if output.dim() > 1 else 1
        return hook

    for name, module in model.named_modules():
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            handles.append(module.register_forward_hook(record(name)))
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    try:
        with isolated_training_step(model), torch.no_grad():
            model.eval()
            model(torch.zeros(1, *input_shape, device=device))
    finally:
        for handle in handles:
            handle.remove()
    return positions


def _dense_layer_macs(module: nn.Module, positions: int) -> int:
    """Positions × weight size: ``H'·W'·N·(C/groups)·k_h·k_w`` (convolution), ``rows·N·m`` (linear)."""
    return positions * int(module.weight.numel())


def _factorized_layer_macs(spec: LayerSpec, rank: int, positions: int) -> int:
    return positions * int(rank) * (spec.in_features + spec.out_features)


def analytic_costs(model: nn.Module | str, keep_ratio: float | None = None, *, pointwise: bool = True,
                   input_shape: Sequence[int] = (3, 32, 32), num_classes: int = 10,
                   width: float = 1.0) -> dict[str, int]:
    """Parameters and per-sample MACs of the dense model (``keep_ratio=None``) or of its keep-ratio sub-model,
    from the layer shapes alone.

    A factorized layer with ``n`` terms counts ``n·(m + N)`` parameters (+ bias) and ``H'·W'·n·(m + N)`` MACs
    per sample; dense convolutions ``H'·W'·N·(C/groups)·k_h·k_w``, linear layers ``N·m`` per input row; the
    other parameters (norms, dense layers) are taken from the dense model. MACs count only convolutions and
    linear maps, like :class:`torch.utils.flop_counter.FlopCounterMode` (biases, norms, activations and pooling
    are not counted). ``H'·W'`` comes from one forward pass of a single zero sample through the dense model.

    Returns ``{"params", "macs", "terms", "total_terms"}`` (kept and available terms over the factorized layers).
    """
    dense = _resolve_model(model, num_classes, input_shape, width)
    ranks = {} if keep_ratio is None else submodel_ranks(dense, keep_ratio, pointwise=pointwise)
    specs = layer_specs(dense, submodel_layers(dense, pointwise=pointwise))
    positions = _output_positions(dense, input_shape)
    params = count_parameters(dense)
    total_macs = 0
    for name, module in dense.named_modules():
        if not isinstance(module, (nn.Conv2d, nn.Linear)):
            continue
        if name in ranks:
            spec = specs[name]
            params += spec.factorized_parameters(ranks[name]) - spec.dense_parameters()
            total_macs += _factorized_layer_macs(spec, ranks[name], positions[name])
        else:
            total_macs += _dense_layer_macs(module, positions[name])
    return {"params": int(params), "macs": int(total_macs), "terms": int(sum(ranks.values())),
            "total_terms": int(sum(spec.num_terms for spec in specs.values()))}


# --------------------------------------------------------------------------------------------------
# measured costs and the table
# --------------------------------------------------------------------------------------------------
def submodel_costs(model: nn.Module, example_input: torch.Tensor, *, activations: bool = True) -> dict[str, int]:
    """Measured costs of ``model`` on the batch ``example_input``.

    ``params``: :func:`~subfl.costs.count_parameters`; ``macs``: multiply-accumulates **per sample** of one
    forward pass (:func:`~subfl.costs.forward_flops` / batch size, halved by :func:`~subfl.costs.macs`);
    ``activation_bytes``: :func:`~subfl.costs.activation_memory_bytes` of one training forward on the whole
    batch (``None`` with ``activations=False``).
    """
    if not isinstance(example_input, torch.Tensor) or example_input.dim() < 1 or example_input.shape[0] < 1:
        raise ValueError("example_input must be a batched tensor with at least one sample")
    batch = int(example_input.shape[0])
    flops = forward_flops(model, example_input)
    return {"params": count_parameters(model), "macs": macs(flops) // batch,
            "activation_bytes": activation_memory_bytes(model, example_input) if activations else None}


def submodel_cost_table(keep_ratios: Sequence[float] = PRISM_KEEP_RATIOS, batch_size: int = 32, *,
                        model: nn.Module | str = "resnet18", num_classes: int = 10,
                        input_shape: Sequence[int] = (3, 32, 32), width: float = 1.0, pointwise: bool = True,
                        measure: bool = True, seed: int = 0) -> pd.DataFrame:
    """PriSM Table 1 style: costs of the dense model, the factorized full model and the keep-ratio sub-models.

    Rows: ``"dense"`` (the original model), ``"factorized"`` (every term, ``r = 1``: the server's model in the
    SVD basis) and one ``"sub-model r×"`` row per entry of ``keep_ratios`` (the shape PriSM and OrthDrop clients
    train, :func:`spectral_submodel`). Columns: :data:`TABLE_COLUMNS` — kept terms over all factorized layers,
    parameters (measured and :func:`analytic_costs`), per-sample MACs (measured and analytic), and the
    activation memory of one training forward on a batch of ``batch_size`` random inputs (float32, MB =
    10⁶ bytes); ``*_ratio`` columns are relative to the dense model (the dense row's ``terms`` is the total
    number of terms of the factorized layers).

    ``measure=False`` fills only the analytic columns (no forward pass; the measured ones are missing).
    """
    ratios = [check_keep_ratio(r, "keep_ratios entry") for r in keep_ratios]
    batch_size = _check_positive_int(batch_size, "batch_size")
    dense = _resolve_model(model, num_classes, input_shape, width)
    param = next(dense.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    generator = torch.Generator().manual_seed(int(seed))
    example = torch.randn(batch_size, *input_shape, generator=generator).to(device)

    entries: list[tuple[str, float | None, nn.Module | None]] = [("dense", None, dense)]
    for label, r in [("factorized", 1.0)] + [(f"sub-model {r:g}×", r) for r in ratios]:
        module = spectral_submodel(dense, r, pointwise=pointwise, with_weights=False) if measure else None
        entries.append((label, r, module))

    rows = []
    for label, r, module in entries:
        analytic = analytic_costs(dense, r, pointwise=pointwise, input_shape=input_shape)
        measured = submodel_costs(module, example) if measure else {"params": None, "macs": None,
                                                                      "activation_bytes": None}
        total = analytic["total_terms"]
        terms = total if r is None else analytic["terms"]
        rows.append({"model": label, "keep_ratio": 1.0 if r is None else r, "terms": terms,
                     "terms_fraction": terms / total if total else float("nan"),
                     "params": measured["params"], "params_analytic": analytic["params"],
                     "macs": measured["macs"], "macs_analytic": analytic["macs"],
                     "activations_mb": (None if measured["activation_bytes"] is None
                                        else measured["activation_bytes"] / MB)})
    table = pd.DataFrame(rows)
    table["params_ratio"] = table["params_analytic"] / table["params_analytic"].iloc[0]
    table["macs_ratio"] = table["macs_analytic"] / table["macs_analytic"].iloc[0]
    activations = table["activations_mb"].astype(float)
    table["activations_ratio"] = activations / activations.iloc[0]
    return table[list(TABLE_COLUMNS)]


__all__ = ["MB", "PRISM_KEEP_RATIOS", "TABLE_COLUMNS", "analytic_costs", "check_keep_ratio", "spectral_submodel",
           "submodel_cost_table", "submodel_costs", "submodel_layers", "submodel_ranks"]
