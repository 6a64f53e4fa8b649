"""Resources of finetuning a tiny transformer: CAFF's configurations ``F_l^t`` and LoRA, measured.

A configuration is a pretrained model ``F_l`` (``l`` blocks) trained in one of two ways
(:mod:`subfl.models.transformers`):

* ``freeze`` with ``t`` trained layers — CAFF's ``F_l^t``: the last ``t`` blocks, the final LayerNorm and the
  head train; embeddings and the first ``l − t`` blocks are frozen (:func:`freeze_for_finetuning`);
* ``lora`` with rank ``r`` — LoRA adapters on the blocks' linear maps; LayerNorms and head train (:func:`add_lora`).

For one mini-batch (the paper's constraints, CAFF §3 / §4.2):

* **peak memory** = weights (all parameters) + gradients (trainable parameters) + optimiser state (AdamW: two
  moments, 2× trainable) + activations autograd keeps for the backward pass. Activations are *measured* with the
  library's saved-tensor hooks (:func:`subfl.costs.training_memory`) on a real batch, not modelled: a frozen
  block before the first trained one saves nothing (no tensor in it requires grad), which is exactly why
  freezing saves memory and LoRA — whose adapters sit in every block — does not.
* **upload** = bytes of the trained parameters (what a device sends back; frozen ones never change).
* **FLOPs** per mini-batch = forward of the whole model (frozen part included) + backward of what autograd
  computes (weight gradients of trained parameters, activation gradients down to the first trained layer),
  counted by :class:`torch.utils.flop_counter.FlopCounterMode` through :func:`subfl.costs.training_flops` (so
  matrix products only; LayerNorm, GELU, softmax and the optimiser step are not counted).

Attention FLOPs. PyTorch's counter has formulas for the CUDA attention kernels but not for the CPU one
(``aten._scaled_dot_product_flash_attention_for_cpu``), so on a CPU it would silently count attention as 0.
:func:`cpu_attention_flop_formulas` registers PyTorch's own SDPA formulas for that kernel for the duration of a
measurement (and removes them afterwards): attention is counted as dense ``QKᵀ`` and ``AV`` products, causal
masking ignored (as PyTorch's formula does), i.e. ``4·B·T²·E`` forward and ``10·B·T²·E`` backward per block.

Units: MB = 10⁶ bytes (as the CLI reports traffic), GFLOPs = 10⁹ FLOPs (a multiply-add is 2 FLOPs).
"""
from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from ..models.transformers import LORA_TARGETS, add_lora, freeze_for_finetuning, transformer_blocks
from .flops import LossFn, default_loss, training_flops
from .memory import training_memory
from .params import count_parameters, parameter_bytes

MB = 1e6
"""Bytes per MB in every table of this module (decimal megabytes)."""

GFLOP = 1e9
"""FLOPs per GFLOP."""

SCHEMES = ("freeze", "lora")
"""The finetuning schemes :func:`finetuning_cost` measures."""

TABLE_COLUMNS = ("layers", "scheme", "trained", "rank", "params", "trainable_params", "weights_mb", "gradients_mb",
                 "optimizer_mb", "activations_mb", "memory_mb", "upload_mb", "forward_gflops", "backward_gflops",
                 "gflops")
"""Columns of :func:`resource_table`."""


def sequence_loss(output: torch.Tensor) -> torch.Tensor:
    """Loss used to measure costs: for logits ``(B, T, V)`` the mean cross-entropy over all ``B·T`` positions
    (the language model's training loss; target values do not change costs), otherwise
    :func:`~subfl.costs.flops.default_loss` (cross-entropy of ``(B, K)`` logits)."""
    if isinstance(output, torch.Tensor) and output.dim() == 3 and output.is_floating_point():
        flat = output.reshape(-1, output.shape[-1])
        return F.cross_entropy(flat, torch.zeros(flat.shape[0], dtype=torch.long, device=output.device))
    return default_loss(output)


@contextlib.contextmanager
def cpu_attention_flop_formulas() -> Iterator[None]:
    """Count ``aten._scaled_dot_product_flash_attention_for_cpu`` (and its backward) with PyTorch's SDPA
    formulas inside the block; the registrations are removed on exit (only those this call added)."""
    from torch.utils import flop_counter as fc

    added = []
    try:
        pairs = ((getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None), fc.sdpa_flop),
                 (getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None),
                  fc.sdpa_backward_flop))
        for op, formula in pairs:
            if op is not None and op not in fc.flop_registry:
                fc.flop_registry[op] = formula  # already shape-wrapped by register_flop_formula
                added.append(op)
        yield
    finally:
        for op in added:
            fc.flop_registry.pop(op, None)


def example_batch(model: nn.Module, batch_size: int = 16, length: int | None = None,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """A random mini-batch for ``model``: token ids ``(B, length)`` (``length`` defaults to the context
    length) for a language model, images ``(B, C, H, W)`` for a ViT. Costs depend on shapes, not values."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    generator = generator if generator is not None else torch.Generator().manual_seed(0)
    device = next(model.parameters()).device
    if hasattr(model, "token_embedding"):
        length = model.context_length if length is None else length
        ids = torch.randint(model.vocab_size, (batch_size, length), generator=generator)
        return ids.to(device)
    if hasattr(model, "patch_embedding"):
        conv = model.patch_embedding
        images = torch.randn((batch_size, conv.in_channels, model.image_size, model.image_size), generator=generator)
        return images.to(device)
    raise TypeError(f"example_batch knows TinyGPT and TinyViT, got {type(model).__name__}")


def _configured(model: nn.Module, scheme: str, trained: int | None, rank: int | None,
                targets: Iterable[str]) -> nn.Module:
    copy_ = copy.deepcopy(model)
    if scheme == "freeze":
        if trained is None:
            raise ValueError("scheme='freeze' needs trainable_last_layers")
        return freeze_for_finetuning(copy_, trained)
    if scheme == "lora":
        if rank is None:
            raise ValueError("scheme='lora' needs lora_rank")
        return add_lora(copy_, rank, targets)
    raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")


def finetuning_cost(model: nn.Module, example_input: torch.Tensor, *, trainable_last_layers: int | None = None,
                    lora_rank: int | None = None, lora_targets: Iterable[str] = LORA_TARGETS,
                    optimizer: str = "adamw", loss_fn: LossFn | None = None) -> dict[str, Any]:
    """Memory, upload and FLOPs of one training step of a finetuning configuration of ``model``.

    Give ``trainable_last_layers = t`` (CAFF's ``F_l^t``) *or* ``lora_rank = r`` (LoRA on ``lora_targets``).
    ``model`` is not changed (a copy is configured). ``loss_fn`` defaults to :func:`sequence_loss`.
    Returns bytes and FLOPs: ``layers, scheme, trained, rank, params, trainable_params, weights, gradients,
    optimizer, activations, memory`` (their sum), ``upload, forward_flops, backward_flops, flops``.
    """
    if (trainable_last_layers is None) == (lora_rank is None):
        raise ValueError("give exactly one of trainable_last_layers (freezing) and lora_rank (LoRA), got "
                         f"trainable_last_layers={trainable_last_layers!r}, lora_rank={lora_rank!r}")
    scheme = "freeze" if lora_rank is None else "lora"
    layers = len(transformer_blocks(model))
    configured = _configured(model, scheme, trainable_last_layers, lora_rank, lora_targets)
    return {
        "layers": layers, "scheme": scheme,
        "trained": trainable_last_layers if scheme == "freeze" else layers,
        "rank": lora_rank if scheme == "lora" else 0,
        **training_step_cost(configured, example_input, optimizer=optimizer, loss_fn=loss_fn),
    }


def training_step_cost(model: nn.Module, example_input: torch.Tensor, *, optimizer: str = "adamw",
                       loss_fn: LossFn | None = None) -> dict[str, int]:
    """Memory, upload and FLOPs of one training step of ``model`` *as it is configured* (its ``requires_grad``
    flags say what trains), measured as :func:`finetuning_cost` does — for configurations other than freezing
    and LoRA (e.g. a low-rank factorised model). ``loss_fn`` defaults to :func:`sequence_loss`. Returns bytes and
    FLOPs: ``params, trainable_params, weights, gradients, optimizer, activations, memory, upload,
    forward_flops, backward_flops, flops``."""
    loss_fn = loss_fn or sequence_loss
    memory = training_memory(model, example_input, optimizer, loss_fn)
    with cpu_attention_flop_formulas():
        flops = training_flops(model, example_input, loss_fn)
    return {
        "params": count_parameters(model), "trainable_params": count_parameters(model, trainable_only=True),
        "weights": memory["weights"], "gradients": memory["gradients"], "optimizer": memory["optimizer"],
        "activations": memory["activations"], "memory": memory["total"],
        "upload": parameter_bytes(model, trainable_only=True),
        "forward_flops": flops["forward"], "backward_flops": flops["backward"], "flops": flops["total"],
    }


def in_table_units(cost: Mapping[str, Any]) -> dict[str, float]:
    """The byte and FLOP entries of a cost dict in :func:`resource_table`'s units: ``params, trainable_params``,
    ``<component>_mb`` (MB) and ``forward_gflops, backward_gflops, gflops`` (GFLOPs)."""
    return {
        "params": cost["params"], "trainable_params": cost["trainable_params"],
        **{f"{k}_mb": cost[k] / MB for k in ("weights", "gradients", "optimizer", "activations", "memory", "upload")},
        "forward_gflops": cost["forward_flops"] / GFLOP, "backward_gflops": cost["backward_flops"] / GFLOP,
        "gflops": cost["flops"] / GFLOP,
    }


def _as_model_map(models: Mapping[int, nn.Module] | Sequence[nn.Module] | nn.Module) -> dict[int, nn.Module]:
    if isinstance(models, nn.Module):
        models = [models]
    items = list(models.values()) if isinstance(models, Mapping) else list(models)
    out: dict[int, nn.Module] = {}
    for model in items:
        layers = len(transformer_blocks(model))
        if layers in out:
            raise ValueError(f"two models have {layers} layers; give one model per depth")
        out[layers] = model
    return dict(sorted(out.items()))


def resource_table(models: Mapping[int, nn.Module] | Sequence[nn.Module] | nn.Module,
                   batch: torch.Tensor | int, *, trained_layers: Iterable[int] | None = None,
                   lora_ranks: Iterable[int] = (), lora_targets: Iterable[str] = LORA_TARGETS,
                   optimizer: str = "adamw", loss_fn: LossFn | None = None) -> pd.DataFrame:
    """One row per configuration: every ``F_l^t`` (``t`` in ``trained_layers``, default 1…l) and every LoRA rank,
    for each model (one per depth ``l``). Columns :data:`TABLE_COLUMNS` (MB, GFLOPs per mini-batch).

    ``batch`` is an example mini-batch for every model (same input kind), or a batch size: then each model
    gets :func:`example_batch` ``(model, batch)`` (full context for a language model).
    """
    rows = []
    lora_ranks = tuple(lora_ranks)
    for layers, model in _as_model_map(models).items():
        example = example_batch(model, batch) if isinstance(batch, int) else batch
        ts = range(1, layers + 1) if trained_layers is None else [t for t in trained_layers if 0 <= t <= layers]
        configs = [dict(trainable_last_layers=t) for t in ts] + [dict(lora_rank=r) for r in lora_ranks]
        for config in configs:
            cost = finetuning_cost(model, example, lora_targets=lora_targets, optimizer=optimizer, loss_fn=loss_fn,
                                   **config)
            rows.append({"layers": layers, "scheme": cost["scheme"], "trained": cost["trained"],
                         "rank": cost["rank"], **in_table_units(cost)})
    return pd.DataFrame(rows, columns=list(TABLE_COLUMNS))


__all__ = ["GFLOP", "MB", "SCHEMES", "TABLE_COLUMNS", "cpu_attention_flop_formulas", "example_batch",
           "finetuning_cost", "in_table_units", "resource_table", "sequence_loss", "training_step_cost"]
