"""PriSM's memory-efficient ResNet sub-model with narrowed layers: the sub-model Table 1's PriSM block counts.

PriSM (Niu et al., TMLR 2023) builds a client's sub-model in two steps (Sec. 3.2.1). Each decomposed convolution
keeps ``r`` of its principal kernels (Eqs. 2–3) and runs as two convolutions, ``Conv_V`` (the kept kernels ``v_i``,
``k×k``, producing ``r`` maps) followed by ``Conv_U`` (the ``1×1`` mixing by the ``u_i``). The memory-efficient
form then lets ``Conv_U`` produce only ``r`` output channels from its ``r`` inputs, i.e. it keeps the leading ``r``
entries of every kept ``u_i``; the other entries stay on the server (they are put back at aggregation, Eq. 5).
Sec. 4.2 fixes ``r = keep_ratio · N`` for a layer with ``N`` output channels.

Since every layer now emits only ``r`` channels, the layer after it receives ``r`` channels, not ``N``. This
module builds that network as real, narrower modules, so a layer's ``Conv_V`` holds ``r × r_in × k × k`` weights
(``r_in``: the kept channels of the previous layer) and its ``Conv_U`` ``r × r``. What the paper does not
spell out, and this module decides (the CIFAR ResNet-18 of :mod:`subfl.models.resnet`):

* **ranks**: ``r = ⌈keep_ratio · N⌉`` (:func:`~subfl.sampling.keep_count`) for every layer, the same rule as the
  library's other sub-models. Layers of one stage share ``N`` and hence ``r``, so the residual additions line up:
  an identity shortcut carries the block input's ``r`` channels, which the block's second layer also produces.
* **stem** (the first ``3×3`` convolution on the image) is not decomposed (the library's rule and the authors'
  released code); it sees all image channels and produces ``⌈keep_ratio · 64⌉`` channels.
* **projection shortcuts** (``1×1``) are not decomposed either (as in the released code); they are narrowed to
  ``r_in → r`` so the addition matches.
* **classifier**: sees the last stage's ``r`` channels, produces every class.
* **norms**: one per kept channel.

:func:`narrow_submodel` builds it (weights are the untrained initialisation: no cost depends on them);
:func:`narrow_submodel_costs` measures its parameters (:func:`~subfl.costs.count_parameters`), MACs per sample
(:func:`~subfl.costs.forward_flops`, halved) and the activation memory of one training forward
(:func:`~subfl.costs.activation_memory_bytes`, saved-tensor hooks); :func:`narrow_analytic_costs` gives the same
parameters and MACs from the formulas above, with an unrounded ``r`` as an option (Table 1's rounding is not
stated); :func:`narrow_cost_table` lays out the dense model and the sub-models side by side.

Against Table 1 of the paper (ResNet-18, CIFAR-10, batch 32; PriSM block at 0.8×/0.6×/0.4×/0.2×: 7.9/4.5/2/0.5 M
parameters, 72/41/18/4.5 % of the full model). The decomposed layers alone with ``r = keep_ratio · N`` unrounded
hold ``keep_ratio² · (Σ N·C·k² + Σ N²)`` = 7.92/4.46/1.98/0.495 M, 72.1/40.6/18.0/4.51 % of the dense model's
10.99 M decomposed weights: every printed cell to its rounding. The built module (every layer, ``r`` rounded
up) holds 8.07/4.55/2.03/0.514 M (72.2/40.8/18.1/4.60 % of 11.17 M). MACs at 32×32 inputs: 72.7/40.9/18.4/4.66 %
of the dense model's 0.555 G per sample, against Table 1's 73/42/20/5.6 %.
"""
from __future__ import annotations

import copy
from collections.abc import Sequence

import pandas as pd
import torch
from torch import nn

from ..models.registry import build_model
from ..models.resnet import BasicBlock, CifarResNet
from ..sampling import keep_count
from .flops import forward_flops, macs
from .memory import activation_memory_bytes
from .params import count_parameters
from .submodels import MB, PRISM_KEEP_RATIOS, check_keep_ratio

NARROW_COLUMNS: tuple[str, ...] = (
    "model", "keep_ratio", "params", "params_decomposed", "params_ratio", "params_decomposed_ratio", "macs",
    "macs_ratio", "activations_mb", "activations_ratio")
"""Columns of :func:`narrow_cost_table` (``*_ratio``: relative to the dense model's value)."""


class NarrowFactorizedConv2d(nn.Module):
    """One decomposed convolution of PriSM's memory-efficient sub-model: ``Conv_V`` then ``Conv_U``.

    ``v``: ``rank`` kernels of size ``in_channels × k × k`` (stride and padding of the dense layer); ``u``: a
    ``1×1`` convolution ``rank → rank`` (the leading ``rank`` entries of each kept ``u_i``). Parameters:
    ``rank · (in_channels · k² + rank)`` (+ ``rank`` for a bias); MACs per output position the same count
    without the bias.
    """

    def __init__(self, in_channels: int, rank: int, kernel_size: int | tuple[int, int], stride=1, padding=0,
                 *, bias: bool = False, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.v = nn.Conv2d(in_channels, rank, kernel_size, stride=stride, padding=padding, bias=False,
                           device=device)
        self.u = nn.Conv2d(rank, rank, 1, bias=bias, device=device)

    @property
    def rank(self) -> int:
        return self.v.out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.u(self.v(x))


def _norm_like(norm: nn.Module, channels: int, device) -> nn.Module:
    if isinstance(norm, nn.BatchNorm2d):
        return nn.BatchNorm2d(channels, eps=norm.eps, momentum=norm.momentum, affine=norm.affine,
                              track_running_stats=norm.track_running_stats, device=device)
    if isinstance(norm, nn.Identity):
        return nn.Identity()
    raise ValueError(f"narrow_submodel supports BatchNorm2d or no normalisation, not {type(norm).__name__}")


def _resolve(model: CifarResNet | str, num_classes: int, input_shape: Sequence[int], width: float) -> CifarResNet:
    if isinstance(model, str):
        model = build_model(model, num_classes=num_classes, input_shape=tuple(input_shape), width=width)
    if not isinstance(model, CifarResNet):
        raise TypeError(f"narrow_submodel needs a CIFAR ResNet (subfl.models.resnet), got {type(model).__name__}")
    return model


def narrow_ranks(model: CifarResNet | str, keep_ratio: float, *, num_classes: int = 10,
                 input_shape: Sequence[int] = (3, 32, 32), width: float = 1.0) -> dict[str, int]:
    """Kept channels ``r = ⌈keep_ratio · N⌉`` of every convolution of the sub-model, by layer name."""
    r = check_keep_ratio(keep_ratio)
    dense = _resolve(model, num_classes, input_shape, width)
    return {name: keep_count(m.out_channels, r) for name, m in dense.named_modules() if isinstance(m, nn.Conv2d)}


def narrow_submodel(model: CifarResNet | str, keep_ratio: float, *, num_classes: int = 10,
                    input_shape: Sequence[int] = (3, 32, 32), width: float = 1.0,
                    device: torch.device | str | None = None) -> CifarResNet:
    """PriSM's memory-efficient sub-model of a CIFAR ResNet at ``keep_ratio`` (a new module; ``model`` unchanged).

    ``model``: a :class:`~subfl.models.resnet.CifarResNet` or a model name for :func:`~subfl.models.build_model`
    (then ``num_classes``, ``input_shape`` and ``width`` are used). The result runs the dense model's forward with
    every convolution, norm and the classifier replaced as the module docstring lists: the ``3×3`` block
    convolutions become :class:`NarrowFactorizedConv2d` (``r_in → r → r``), the stem and the ``1×1`` shortcuts
    narrowed dense convolutions, the classifier ``r → classes``. ``device``: where the new layers live
    (``"meta"`` to size a model without memory). Weights are fresh initialisations.
    """
    r = check_keep_ratio(keep_ratio)
    dense = _resolve(model, num_classes, input_shape, width)
    sub = copy.deepcopy(dense).to("meta")   # the structure only; every layer with weights is replaced below

    def kept(channels: int) -> int:
        return keep_count(channels, r)

    def narrow_conv(conv: nn.Conv2d, decompose: bool) -> nn.Module:
        c_in = conv.in_channels if conv is dense.conv1 else kept(conv.in_channels)  # the stem sees the image
        out = kept(conv.out_channels)
        if decompose:
            return NarrowFactorizedConv2d(c_in, out, conv.kernel_size, conv.stride, conv.padding,
                                          bias=conv.bias is not None, device=device)
        return nn.Conv2d(c_in, out, conv.kernel_size, stride=conv.stride, padding=conv.padding,
                         bias=conv.bias is not None, device=device)

    sub.conv1 = narrow_conv(dense.conv1, decompose=False)
    sub.bn1 = _norm_like(dense.bn1, kept(dense.conv1.out_channels), device)
    for stage in ("layer1", "layer2", "layer3", "layer4"):
        for block, dense_block in zip(getattr(sub, stage), getattr(dense, stage)):
            assert isinstance(dense_block, BasicBlock)
            block.conv1 = narrow_conv(dense_block.conv1, decompose=True)
            block.bn1 = _norm_like(dense_block.bn1, kept(dense_block.conv1.out_channels), device)
            block.conv2 = narrow_conv(dense_block.conv2, decompose=True)
            block.bn2 = _norm_like(dense_block.bn2, kept(dense_block.conv2.out_channels), device)
            if isinstance(dense_block.shortcut, nn.Sequential):
                conv, norm = dense_block.shortcut
                block.shortcut = nn.Sequential(narrow_conv(conv, decompose=False),
                                               _norm_like(norm, kept(conv.out_channels), device))
    sub.fc = nn.Linear(kept(dense.fc.in_features), dense.fc.out_features, bias=dense.fc.bias is not None,
                       device=device)
    return sub


def decomposed_parameters(sub: nn.Module) -> int:
    """Parameters of the :class:`NarrowFactorizedConv2d` layers only (``Conv_V`` and ``Conv_U`` of the decomposed
    convolutions; no stem, shortcuts, norms or classifier)."""
    return int(sum(count_parameters(m) for m in sub.modules() if isinstance(m, NarrowFactorizedConv2d)))


def narrow_submodel_costs(sub: nn.Module, example_input: torch.Tensor, *, activations: bool = True) -> dict:
    """Measured costs of a (sub-)model on the batch ``example_input``.

    ``params``: every parameter; ``params_decomposed``: :func:`decomposed_parameters` (0 for a dense model, whose
    counterpart is :func:`dense_decomposed_parameters`); ``macs``: multiply-accumulates per sample of one forward (``torch.utils.flop_counter``,
    convolutions and matrix products only); ``activation_bytes``: the tensors autograd keeps for the backward
    pass after one training forward and the loss on the whole batch (``None`` with ``activations=False``).
    """
    if not isinstance(example_input, torch.Tensor) or example_input.dim() < 1 or example_input.shape[0] < 1:
        raise ValueError("example_input must be a batched tensor with at least one sample")
    batch = int(example_input.shape[0])
    return {"params": count_parameters(sub), "params_decomposed": decomposed_parameters(sub),
            "macs": macs(forward_flops(sub, example_input)) // batch,
            "activation_bytes": activation_memory_bytes(sub, example_input) if activations else None}


def dense_decomposed_parameters(dense: CifarResNet) -> int:
    """Weights of the dense model's convolutions that the sub-model decomposes (the ``3×3`` block convolutions)."""
    return int(sum(m.weight.numel() + (0 if m.bias is None else m.bias.numel())
                   for name, m in dense.named_modules()
                   if isinstance(m, nn.Conv2d) and name != "conv1" and "shortcut" not in name))


def narrow_analytic_costs(keep_ratio: float | None, *, rounding: str = "ceil", num_classes: int = 10,
                          input_shape: Sequence[int] = (3, 32, 32), width: float = 1.0) -> dict[str, float]:
    """Parameters and per-sample MACs of the sub-model of ResNet-18 from the layer shapes alone.

    ``keep_ratio=None``: the dense model. Otherwise every convolution keeps ``r(N)`` of its ``N`` outputs:
    ``rounding="ceil"`` is :func:`~subfl.sampling.keep_count` (what :func:`narrow_submodel` builds);
    ``rounding="none"`` takes ``r = keep_ratio · N`` unrounded (fractional counts, a reading of Sec. 4.2's
    ``r = 0.x × N``). A decomposed ``k×k`` layer counts ``r · (r_in·k² + r)`` weights and as many MACs per output
    position; the stem ``r · C_img · k²``; a ``1×1`` shortcut ``r · r_in``; the classifier ``r_last · classes``
    (+ bias); each BatchNorm ``2 r``. Returns ``{"params", "params_decomposed", "macs", "macs_decomposed"}``.
    """
    if rounding not in ("ceil", "none"):
        raise ValueError(f"rounding={rounding!r} is not valid; accepted: 'ceil' or 'none'")
    dense = build_model("resnet18", num_classes=num_classes, input_shape=tuple(input_shape), width=width)
    p = None if keep_ratio is None else check_keep_ratio(keep_ratio)

    def kept(n: int) -> float:
        if p is None:
            return n
        return keep_count(n, p) if rounding == "ceil" else p * n

    positions: dict[str, int] = {}
    def record(name: str):
        def hook(module: nn.Module, args, output: torch.Tensor) -> None:
            positions[name] = int(output.shape[-2] * output.shape[-1])
        return hook

    hooks = [m.register_forward_hook(record(name)) for name, m in dense.named_modules() if isinstance(m, nn.Conv2d)]
    try:
        with torch.no_grad():
            dense.eval()
            dense(torch.zeros(1, *input_shape))
    finally:
        for h in hooks:
            h.remove()
    params = params_dec = total_macs = macs_dec = 0.0
    for name, m in dense.named_modules():
        if isinstance(m, nn.Conv2d):
            k2 = m.kernel_size[0] * m.kernel_size[1]
            out = kept(m.out_channels)
            if name == "conv1":
                w = out * m.in_channels * k2
            elif "shortcut" in name:
                w = out * kept(m.in_channels)
            else:
                w = out * m.in_channels * k2 if p is None else out * (kept(m.in_channels) * k2 + out)
                params_dec += w
                macs_dec += w * positions[name]
            params += w + (0 if m.bias is None else out)
            total_macs += w * positions[name]
        elif isinstance(m, nn.BatchNorm2d):
            params += 2 * kept(m.num_features)
        elif isinstance(m, nn.Linear):
            w = kept(m.in_features) * m.out_features
            params += w + (0 if m.bias is None else m.out_features)
            total_macs += w
    return {"params": params, "params_decomposed": params_dec, "macs": total_macs, "macs_decomposed": macs_dec}


def narrow_cost_table(keep_ratios: Sequence[float] = PRISM_KEEP_RATIOS, batch_size: int = 32, *,
                      width: float = 1.0, num_classes: int = 10, input_shape: Sequence[int] = (3, 32, 32),
                      activations: bool = True, seed: int = 0) -> pd.DataFrame:
    """Table 1's PriSM block for the library's ResNet-18: the dense model and the narrowed sub-models.

    Rows ``"dense"`` and ``"narrow r×"`` per keep ratio; columns :data:`NARROW_COLUMNS`: parameters (all, and of
    the decomposed convolutions only), MACs per sample at ``input_shape``, activation memory of one training
    forward on ``batch_size`` random inputs (float32, MB = 10⁶ bytes; missing with ``activations=False``), each
    also relative to the dense model.
    """
    ratios = [check_keep_ratio(r, "keep_ratios entry") for r in keep_ratios]
    torch.manual_seed(seed)
    dense = build_model("resnet18", num_classes=num_classes, input_shape=tuple(input_shape), width=width)
    x = torch.randn(batch_size, *input_shape, generator=torch.Generator().manual_seed(seed))
    rows = []
    for label, r in [("dense", None)] + [(f"narrow {r:g}×", r) for r in ratios]:
        net = dense if r is None else narrow_submodel(dense, r)
        costs = narrow_submodel_costs(net, x, activations=activations)
        if r is None:
            costs["params_decomposed"] = dense_decomposed_parameters(dense)
        rows.append({"model": label, "keep_ratio": 1.0 if r is None else r, "params": costs["params"],
                     "params_decomposed": costs["params_decomposed"], "macs": costs["macs"],
                     "activations_mb": None if costs["activation_bytes"] is None else costs["activation_bytes"] / MB})
    table = pd.DataFrame(rows)
    base = table.iloc[0]
    table["params_ratio"] = table.params / base.params
    table["params_decomposed_ratio"] = table.params_decomposed / base.params_decomposed
    table["macs_ratio"] = table.macs / base.macs
    table["activations_ratio"] = table.activations_mb.astype(float) / float(base.activations_mb or float("nan"))
    return table[list(NARROW_COLUMNS)]


__all__ = ["NARROW_COLUMNS", "NarrowFactorizedConv2d", "decomposed_parameters", "dense_decomposed_parameters",
           "narrow_analytic_costs", "narrow_cost_table", "narrow_ranks", "narrow_submodel", "narrow_submodel_costs"]
