"""PriSM with the singular values trained as parameters of their own (method ``prism+sigma``).

Paper: PriSM (Niu et al., "Overcoming resource constraints in federated learning: large models can be trained
with only weak clients", TMLR 2023). A PriSM client receives each sampled term of a decomposed layer as a left
vector uᵢ, a right vector vᵢ (a principal kernel) and its singular value σᵢ, trains all three, and merges σ into
the vectors after local training. The library's spectral methods (:mod:`subfl.methods.spectral`) instead train
u′ᵢ = uᵢ√σᵢ and v′ᵢ = vᵢ√σᵢ directly: the same sub-models, but not the same gradient steps. This method trains
PriSM's parameterisation; everything else is method ``prism`` (:class:`~subfl.methods.spectral.SpectralSharding`
with strategy ``prism``: SVD refresh, sampling p ∝ λ^κ, per-term averaging).

On the client, for every factorized layer with terms S:

1. **Split** (:func:`split_singular_values`): σᵢ = ‖u′ᵢ‖·‖v′ᵢ‖ (= λᵢ after the server's refresh), uᵢ = u′ᵢ/‖u′ᵢ‖,
   vᵢ = v′ᵢ/‖v′ᵢ‖ (a zero vector stays zero, with σᵢ = 0). σ becomes a trainable parameter through a
   :mod:`torch.nn.utils.parametrize` parametrization of ``u``: the layer computes with ``u · diag(σ)``, so its
   function, U diag(σ) diag(ω) V, is unchanged by the split.
2. **Train** as ``prism`` does (the optimiser's weight decay acts on u, v and σ alike).
3. **Merge** (:func:`merged_state`, on the uploaded state): u′ᵢ = sign(σᵢ)·√|σᵢ|·uᵢ, v′ᵢ = √|σᵢ|·vᵢ, which keeps the product
   u′ᵢ v′ᵢᵀ = σᵢ uᵢ vᵢᵀ and splits its scale evenly, the library's √λ convention. The update then holds ``u`` and
   ``v`` like a ``prism`` update and the server handles it unchanged.

Options: those of ``prism`` (:class:`~subfl.methods.spectral.SpectralSharding`), except that the strategy is fixed
to ``prism`` (no ``+cliplr``: its gradient scaling acts on the parameters ``u``, ``v`` that the parametrization
replaces) and ``factor_decay`` must be ``"weight"`` (the Frobenius decay leaves ``u``, ``v`` out of the optimiser's
decay by parameter, which the parametrized ``u`` is not).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch import nn
from torch.nn.utils import parametrize

from ..fl.training import ClientDataset
from ..fl.types import Task, Update
from ..models.factorized import factorized_modules
from ..fl.method import ClientContext
from .spectral import SpectralSharding


class ScaledColumns(nn.Module):
    """Parametrization ``u ↦ u · diag(σ)`` with a trainable ``σ`` (one value per column, i.e. per term)."""

    def __init__(self, sigma: torch.Tensor) -> None:
        super().__init__()
        self.sigma = nn.Parameter(sigma.detach().clone())

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return u * self.sigma


def _per_term(scale: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``scale`` (one value per term) shaped to multiply ``v`` (terms first, any trailing shape)."""
    return scale.view(-1, *([1] * (v.dim() - 1)))


def split_singular_values(model: nn.Module) -> dict[str, torch.Tensor]:
    """Give every factorized layer of ``model`` a trainable ``σ`` (see the module docstring, step 1), in place.

    Returns ``{layer: σ}`` as set (copies). The layers' function is unchanged (to float rounding)."""
    sigmas = {}
    for name, m in factorized_modules(model).items():
        if parametrize.is_parametrized(m, "u"):
            raise ValueError(f"layer {name!r} already trains its singular values")
        with torch.no_grad():
            nu, nv = m.u.norm(dim=0), m.v.reshape(m.rank, -1).norm(dim=1)
            sigma = nu * nv
            m.u.div_(torch.where(nu > 0, nu, torch.ones_like(nu)))  # a zero vector stays zero (σᵢ = 0)
            m.v.div_(_per_term(torch.where(nv > 0, nv, torch.ones_like(nv)), m.v))
        parametrize.register_parametrization(m, "u", ScaledColumns(sigma))
        sigmas[name] = sigma.clone()
    return sigmas


_ORIGINAL = ".parametrizations.u.original"
_SIGMA = ".parametrizations.u.0.sigma"


def merged_state(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The state dict of a split model (:func:`split_singular_values`) with ``σ`` merged (module docstring, step
    3): each ``<layer>.parametrizations.u.original`` / ``…u.0.sigma`` pair and ``<layer>.v`` become
    ``<layer>.u`` = sign(σ)√|σ|·u and ``<layer>.v`` = √|σ|·v; every other tensor is passed through."""
    layers = [k[: -len(_ORIGINAL)] for k in tensors if k.endswith(_ORIGINAL)]
    out = {k: t for k, t in tensors.items() if ".parametrizations.u." not in k}
    for name in layers:
        sigma, v = tensors[name + _SIGMA], tensors[f"{name}.v"]
        root = sigma.abs().sqrt()
        out[f"{name}.u"] = tensors[name + _ORIGINAL] * (torch.sign(sigma) * root)
        out[f"{name}.v"] = v * _per_term(root, v)
    return out


class PriSMTrainedSigma(SpectralSharding):
    """PriSM with σ trained as a parameter of its own on the client (see the module docstring)."""

    name = "prism+sigma"
    options: dict = {**SpectralSharding.options, "strategy": "prism"}
    fixed_strategy = "prism"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        if self.config["factor_decay"] != "weight":
            raise ValueError(f"option factor_decay={self.config['factor_decay']!r} is not valid for method "
                             f"{self.name!r}; accepted: 'weight' (σ is trained through a parametrization of u, "
                             f"which the Frobenius decay's parameter groups cannot name)")

    def client_model(self, task: Task, ctx: ClientContext) -> nn.Module:
        """PriSM's client model with every factorized layer split into directions and a trainable ``σ``."""
        model = super().client_model(task, ctx)
        split_singular_values(model)
        return model

    def local_update(self, task: Task, data: ClientDataset, ctx: ClientContext) -> Update:
        """PriSM's local update on the split model, with ``σ`` merged back into ``u``, ``v`` before upload."""
        update = super().local_update(task, data, ctx)
        return replace(update, tensors=merged_state(update.tensors))


__all__ = ["PriSMTrainedSigma", "ScaledColumns", "merged_state", "split_singular_values"]
