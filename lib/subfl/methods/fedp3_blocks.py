"""FedP3's ResNet-18 block ablation: layer-subset training with some blocks never assigned.

FedP3 (Yi et al., ICLR 2024) reports four ResNet-18 rows on CIFAR-10 and CIFAR-100 at global pruning ratio P = 0.9
— "−B2−B3 (full)", "−B2 (part)", "−B3 (part)" and "Full" — and defines them in Sec. 4.2: of ResNet-18's four
blocks of four layers, "−B2−B3 (full)" prunes all of B2 or B3, one of the two at random, and sends the rest of the
model to the server; "−B2 (part)" / "−B3 (part)" prune the first or the last two layers of the block; "Full" prunes
no block. The paper drops the pruned layers. This module implements an approximation of those rows, stated here and
on the book page:

* the model is ResNet-18 grouped into blocks (option ``grouping="block"`` of :class:`~subfl.methods.fedp3.FedP3`:
  the stem ``conv1``, the eight ``BasicBlock`` s ``layer1.0`` … ``layer4.1``, and the FFC ``fc``); "B2" and "B3" are
  the stages ``layer2`` and ``layer3`` (two ``BasicBlock`` s of two layers each);
* "−X" removes X from the pool of units the server assigns to clients: an excluded block is **never trained** — it
  stays at its initial weights, is still part of every forward pass, and, like every unit a client does not train,
  is sent globally pruned to the client. The paper drops it from the model instead;
* "full" excludes both stages at once, where the paper prunes one of the two at random; "part" always excludes the
  stage's second ``BasicBlock`` (``layer2.1`` / ``layer3.1``, its last two layers: the first one holds the stage's
  down-sampling shortcut, without which the stage changes no shapes to speak of), where the paper prunes the first
  or the last two layers;
* "Full" excludes nothing.

Option ``excluded`` (a sequence of unit names or module-path prefixes: ``"layer2"`` names ``layer2.0`` and
``layer2.1``) is all this class adds to :class:`~subfl.methods.fedp3.FedP3`; every other option is FedP3's. The
FFC cannot be excluded (FedP3 always trains it), a name that matches no unit is an error, and so is excluding every
unit. Clients then draw their k units (option ``layers``) from the remaining pool, so the rows differ in how often
each remaining block is trained as well as in which blocks are trained — a confound the paper's rows share if they
are built this way.

Kept in a module of its own so that the cached runs of :mod:`subfl.methods.fedp3` keep their cache keys.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..fl.method import ServerContext
from .fedp3 import FEDP3_PRESETS, FedP3


def matches_unit(unit_name: str, pattern: str) -> bool:
    """Whether ``pattern`` names unit ``unit_name`` itself or a module-path prefix of it (``"layer2"`` matches
    ``"layer2.0"`` but not ``"layer20"``)."""
    return unit_name == pattern or unit_name.startswith(pattern + ".")


def _check_excluded(value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Sequence) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"option excluded must be a sequence of unit names or module-path prefixes "
                         f"(e.g. ['layer2', 'layer3.1']), got {value!r}")
    return tuple(value)


class FedP3BlockAblation(FedP3):
    """FedP3 (default: OPU2's k = 2, block units, P = 0.9) whose server never assigns the units named by option
    ``excluded`` (see the module docstring)."""

    name = "fedp3-blocks"
    version = 2
    """2: the personalised evaluation scores each client's deployed (globally pruned, P = 0.9 by default) model,
    where version 1 scored the dense global model (FedP3's ``global_keep`` option version covers only runs that set
    P away from FedP3's default 1)."""
    options: dict = {**FedP3.options, "layers": FEDP3_PRESETS["opu2"], "grouping": "block", "global_keep": 0.9,
                     "excluded": ()}

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.config["excluded"] = _check_excluded(self.config["excluded"])

    def _structure(self, ctx: ServerContext) -> dict[str, Any]:
        if self._structure_cache is None:
            structure = super()._structure(ctx)
            units, final = structure["units"], structure["final"]
            patterns = self.config["excluded"]
            names = [u.name for u in units]
            for pattern in patterns:
                if matches_unit(final.name, pattern):
                    raise ValueError(f"option excluded names the FFC {final.name!r}, which FedP3 always trains")
                if not any(matches_unit(n, pattern) for n in names):
                    raise ValueError(f"option excluded: {pattern!r} matches no unit; units: {', '.join(names)}")
            dropped = {n for n in names if any(matches_unit(n, p) for p in patterns)}
            if len(dropped) == len(names):
                raise ValueError(f"option excluded leaves no unit to assign besides the FFC (excluded: {list(patterns)})")
            self._structure_cache = {
                **structure, "units": [u for u in units if u.name not in dropped],
                "excluded_units": [n for n in names if n in dropped],
                "unit_of_key": {k: u for k, u in structure["unit_of_key"].items() if u not in dropped}}
        return self._structure_cache

    def excluded_units(self, ctx: ServerContext) -> list[str]:
        """Names of the units the server never assigns (in model order)."""
        return list(self._structure(ctx)["excluded_units"])


__all__ = ["FedP3BlockAblation", "matches_unit"]
