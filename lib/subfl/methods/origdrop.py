"""OrigDrop: PriSM's baseline that drops channels in the original (not the spectral) space.

PriSM (Niu et al., TMLR 2023, §4) compares sampling in the SVD basis with two ways of training a fixed-size
part of the model: OrthDrop (the top singular directions: :mod:`subfl.methods.spectral`, strategy ``topn``) and
OrigDrop, a HeteroFL-style fixed subset of the original channels. Here OrigDrop is the width-slicing machinery of
:class:`~subfl.methods.width.WidthSlicing` with the leading slice (a client of keep ratio r trains the first
``⌊r·channels⌋`` channels of every hidden layer), without HeteroFL's two additions:

* no full-width client is required — with every client at r = 0.2 the channels outside the slice are never
  trained and keep their initial values;
* no scaler by default (option ``scaler``; HeteroFL's 1/r output scaling is not part of PriSM's description).

Static batch norm (``sbn``, default True) as in PriSM and HeteroFL. Evaluation as for every width-slicing method:
``"global"`` is the full-width server model (what PriSM evaluates), and every keep ratio's leading slice is
evaluated under its own group.
"""
from __future__ import annotations

from .width import WidthSlicing


class OrigDrop(WidthSlicing):
    """PriSM's OrigDrop: the fixed leading slice in the original space, no full-width client needed, no scaler."""

    name = "origdrop"
    options: dict = {"sbn": True, "scaler": False, "levels": None}
