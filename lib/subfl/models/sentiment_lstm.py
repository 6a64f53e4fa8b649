"""A one-layer word LSTM sentiment classifier (IMDB, PriSM's Fig. 7), built on the character LSTM's cell.

PriSM (Niu et al., TMLR 2023, Fig. 7) trains an LSTM classifier on IMDB reviews. The architecture is the cell of
:class:`~subfl.models.char_rnn.CharLSTM` — one ``Linear`` per gate map, so width slicing (OrigDrop, SplitMix) and
factorization (PriSM, OrthDrop) apply to it unchanged — with a word embedding in front and a two-way classifier
on the last hidden state:

``embedding(vocab → E, id 0 = padding) → input_map: Linear(E → H) → LSTM cell (H units) over the review →
classifier: Linear(H → num_classes)``, ``H = scaled_channels(256, width)``.

The embedding size ``E`` (64 by default) does not scale with the width, and the padding id's embedding is fixed at
zero (reviews are left-padded, :func:`~subfl.data.load_dataset` ``"imdb"``). The decomposed layers are the eight
gate maps (the input map and the classifier are the first and last linear layers). The paper's own embedding and
hidden sizes (PriSM Table 8: embedding 1001 → 64, a 2-layer LSTM with hidden 256, FC 256 → 1) differ from
this library's choice.
"""
from __future__ import annotations

from torch import nn

from .char_rnn import CharLSTM

EMBEDDING_DIM = 64
"""Default size of the word embedding; not scaled by the width."""


class SentimentLSTM(CharLSTM):
    """Word-level LSTM classifier: the :class:`~subfl.models.char_rnn.CharLSTM` cell over word embeddings.

    Args:
        num_classes: number of labels (2 for IMDB).
        input_shape: ``(seq_len,)``, the review length in word ids.
        width: multiplier of the hidden size (:func:`~subfl.models.norm.scaled_channels` of 256).
        norm: only ``"none"``.
        vocab_size: number of word ids (the runner passes the dataset's vocabulary size).
        embedding_dim: size of the word embedding.
    """

    def __init__(self, num_classes: int, input_shape: tuple[int, ...] = (256,), *, width: float = 1.0,
                 norm: str = "none", vocab_size: int = 10000, embedding_dim: int = EMBEDDING_DIM) -> None:
        for name, value in (("vocab_size", vocab_size), ("embedding_dim", embedding_dim)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 2:
                raise ValueError(f"{name} must be an int >= 2, got {value!r}")
        super().__init__(vocab_size, input_shape, width=width, norm=norm)
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"num_classes must be an int >= 2, got {num_classes!r}")
        # same registration slots as the character model, so the gate maps stay the decomposed middle layers
        self.embedding = nn.Embedding(vocab_size, embedding_dim, padding_idx=0)
        self.input_map = nn.Linear(embedding_dim, self.hidden_size)
        self.classifier = nn.Linear(self.hidden_size, num_classes)


__all__ = ["EMBEDDING_DIM", "SentimentLSTM"]
