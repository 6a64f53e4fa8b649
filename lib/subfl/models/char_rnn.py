"""A one-layer character LSTM for next-character prediction (Shakespeare), built from plain ``Linear`` layers.

FLANC's Shakespeare experiments (Mei et al., NeurIPS 2022, Fig. 3 and Table 1) train a one-layer character
RNN at four widths. ``torch.nn.LSTM`` stores the four gates of a layer in one ``(4H, ·)`` matrix, so the leading
``h`` rows of a narrower copy would be gates *i* and *f* of the wide one, not the first ``h`` units of every
gate; width slicing (:mod:`subfl.models.slicing`) and neural composition (:mod:`subfl.models.composed`) would
need special cases. Here every gate map is its own ``Linear`` layer, so both apply unchanged:

``embedding(vocab → 8) → input_map: Linear(8 → H) → LSTM cell (H units) over the sequence → classifier:
Linear(H → vocab)`` applied to the last hidden state, with ``H = scaled_channels(256, width)`` and the cell

* ``i, f, o = σ(x_gate(z_t) + h_gate(h_{t−1}))``, ``g = tanh(x_g(z_t) + h_g(h_{t−1}))`` for the four gates, each
  ``x_gate: Linear(H → H)`` (bias) and ``h_gate: Linear(H → H)`` (no bias), where ``z_t = input_map(e_t)``;
* ``c_t = f ⊙ c_{t−1} + i ⊙ g``, ``h_t = o ⊙ tanh(c_t)`` (the standard LSTM cell; ``h_0 = c_0 = 0``).

The embedding size (8, as in the LEAF Shakespeare model) does not scale with the width, so the embedding is
never sliced. The input map adds a learned ``8 → H`` projection in front of the gates: the input path of every
gate is ``x_gate ∘ input_map``, a product of two linear maps, which computes what a standard LSTM's ``8 → H``
input weights compute (both have rank ≤ 8). A sub-model whose hidden units outside its width are zero computes
exactly what the narrow model computes: a unit with zero weights in and out has ``g = 0``, so its cell and
hidden state stay 0.

The input is a ``(batch, seq_len)`` tensor of character ids; the output ``(batch, num_classes)`` logits of the
next character (``num_classes`` = vocabulary size). At width 1 with an 80-character vocabulary: 548,816
parameters (embedding 640, input map 2,304, gates 263,168 + 262,144, classifier 20,560).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from .norm import check_input_shape, check_num_classes, check_width, scaled_channels

EMBEDDING_DIM = 8
"""Size of the character embedding (LEAF's Shakespeare model); not scaled by the width."""

HIDDEN = 256
"""Hidden units of the cell at width 1."""

GATES = ("input", "forget", "cell", "output")
"""The LSTM gates, in the order their ``Linear`` layers are registered."""


def per_forward_map(layer: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """``layer`` as the map the recurrence applies at every step of one forward pass.

    A layer whose matrix is *built* from other parameters — one whose ``weight`` is a method, as in FLANC's
    :class:`~subfl.models.composed.ComposedLinear` — builds it here, once per forward, instead of once per time
    step: the steps then share one matrix, and its gradient reaches the basis and coefficients once, summed over
    the steps (the same gradient up to floating-point summation order). Any other layer is returned unchanged,
    so a plain ``Linear`` or a factorised layer computes exactly what it computed before.
    """
    weight = getattr(layer, "weight", None)
    if weight is None or isinstance(weight, torch.Tensor) or not callable(weight):
        return layer
    matrix, bias = weight(), getattr(layer, "bias", None)
    return lambda h: F.linear(h, matrix, bias)


class CharLSTM(nn.Module):
    """One-layer character LSTM with one ``Linear`` per gate map (see the module docstring).

    Args:
        num_classes: vocabulary size (inputs are ids in ``[0, num_classes)``; outputs are next-character logits).
        input_shape: ``(seq_len,)``.
        width: multiplier of the hidden size (:func:`~subfl.models.norm.scaled_channels` of 256).
        norm: only ``"none"`` (a recurrent cell has no normalisation layer here).
    """

    def __init__(self, num_classes: int, input_shape: tuple[int, ...] = (80,), *, width: float = 1.0,
                 norm: str = "none") -> None:
        super().__init__()
        num_classes = check_num_classes(num_classes)
        (seq_len,) = check_input_shape(input_shape, rank=1)
        width = check_width(width)
        if norm != "none":
            raise ValueError(f"norm={norm!r} is not accepted by CharLSTM; accepted: 'none'")
        self.width, self.norm, self.seq_len = width, norm, seq_len
        hidden = scaled_channels(HIDDEN, width)
        self.hidden_size = hidden
        self.embedding = nn.Embedding(num_classes, EMBEDDING_DIM)
        self.input_map = nn.Linear(EMBEDDING_DIM, hidden)
        self.x_gates = nn.ModuleDict({g: nn.Linear(hidden, hidden) for g in GATES})
        self.h_gates = nn.ModuleDict({g: nn.Linear(hidden, hidden, bias=False) for g in GATES})
        self.classifier = nn.Linear(hidden, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.dim() != 2 or tokens.shape[1] != self.seq_len:
            raise ValueError(f"tokens must have shape (batch, {self.seq_len}), got {tuple(tokens.shape)}")
        z = self.input_map(self.embedding(tokens))                     # (B, T, H)
        x_parts = {g: layer(z) for g, layer in self.x_gates.items()}  # input paths of all steps at once
        h_maps = {g: per_forward_map(layer) for g, layer in self.h_gates.items()}
        h = z.new_zeros(tokens.shape[0], self.hidden_size)
        c = torch.zeros_like(h)
        for t in range(self.seq_len):
            pre = {g: x_parts[g][:, t] + h_map(h) for g, h_map in h_maps.items()}
            c = torch.sigmoid(pre["forget"]) * c + torch.sigmoid(pre["input"]) * torch.tanh(pre["cell"])
            h = torch.sigmoid(pre["output"]) * torch.tanh(c)
        return self.classifier(h)


__all__ = ["EMBEDDING_DIM", "GATES", "HIDDEN", "CharLSTM", "per_forward_map"]
