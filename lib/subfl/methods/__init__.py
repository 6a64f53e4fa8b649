"""Federated methods, one module per family, each implementing :class:`~subfl.fl.method.Method`.

``METHODS`` maps the names usable in ``subfl run`` to classes; :func:`make_method` builds one with options.
"""
from __future__ import annotations

from typing import Any

from ..fl.method import ClientContext, Method, ServerContext, ServerState
from .fedavg import FedAvg
from .width import FedRolex, FjORD, HeteroFL
from .origdrop import OrigDrop
from .spectral import SPECTRAL_METHODS
from .prism_memory import MemoryEfficientPriSM
from .prism_narrow import NarrowPriSM
from .prism_sigma import PriSMTrainedSigma
from .flanc import FLANC
from .fedp3 import FEDP3_METHODS
from .fedp3_blocks import FedP3BlockAblation
from .caff import CAFF
from .hetlora import HetLoRA
from .fedhm import FedHM
from .depthfl import DepthFL
from .width_finetuning import FedRolexFinetuning, FjORDFinetuning, HeteroFLFinetuning
from .splitmix import SplitMix
from .update_probe import UpdateProbe

METHODS: dict[str, type[Method]] = {
    FedAvg.name: FedAvg,
    HeteroFL.name: HeteroFL, FjORD.name: FjORD, FedRolex.name: FedRolex,
    OrigDrop.name: OrigDrop,  # PriSM's original-space baseline (methods/origdrop.py)
    SplitMix.name: SplitMix,  # PriSM's ensemble baseline (methods/splitmix.py)
    **SPECTRAL_METHODS,  # spectral, topn, prism, prism+scaled, unbiased, collective, ... (methods/spectral.py)
    MemoryEfficientPriSM.name: MemoryEfficientPriSM,  # prism+memory: PriSM's Eq. 5 (methods/prism_memory.py)
    NarrowPriSM.name: NarrowPriSM,  # prism+narrow: Table 1's narrowed sub-model (methods/prism_narrow.py)
    PriSMTrainedSigma.name: PriSMTrainedSigma,  # prism+sigma: σ trained on the client (methods/prism_sigma.py)
    FLANC.name: FLANC,
    **FEDP3_METHODS,  # fedp3, lowerb, opu2, opu3, opu123, opu23 (methods/fedp3.py)
    FedP3BlockAblation.name: FedP3BlockAblation,  # FedP3's ResNet-18 block ablation (methods/fedp3_blocks.py)
    CAFF.name: CAFF,
    HetLoRA.name: HetLoRA,  # CAFF's LoRA baseline (methods/hetlora.py)
    FedHM.name: FedHM,  # CAFF's low-rank factorisation baseline (methods/fedhm.py)
    DepthFL.name: DepthFL,  # CAFF's depth-wise early-exit baseline (methods/depthfl.py)
    # CAFF's width-slicing baselines on pretrained transformers, head-aware (methods/width_finetuning.py)
    HeteroFLFinetuning.name: HeteroFLFinetuning, FjORDFinetuning.name: FjORDFinetuning,
    FedRolexFinetuning.name: FedRolexFinetuning,
    UpdateProbe.name: UpdateProbe,  # a method's server update against FedAvg's from the same state (methods/update_probe.py)
}


def register_method(cls: type[Method]) -> type[Method]:
    """Add a Method class to :data:`METHODS` under ``cls.name`` (usable as a decorator)."""
    if cls.name in METHODS and METHODS[cls.name] is not cls:
        raise ValueError(f"a method named {cls.name!r} is already registered")
    METHODS[cls.name] = cls
    return cls


def make_method(name: str, **options: Any) -> Method:
    """Instantiate the method registered as ``name``."""
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; accepted: {', '.join(sorted(METHODS))}")
    return METHODS[name](**options)


__all__ = ["METHODS", "ClientContext", "FedAvg", "Method", "ServerContext", "ServerState", "make_method",
           "register_method"]
