"""Containers shared by every dataset loader.

A loaded dataset is a :class:`FederatedDataset`: a train and a test :class:`ArrayData` held as tensors
in memory (every dataset in this book fits in RAM), plus what a model needs to know about it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


class TokenWindows:
    """Fixed-length windows over one encoded text, stored without copying them.

    Row ``i`` is ``text[starts[i] : starts[i] + length]``. Only the text (one int64 per character) and
    the window starts (one int64 per sample) are held, so 4.3 M windows of 80 tokens cost about 70 MB
    instead of the 2.8 GB a materialised ``(N, 80)`` int64 tensor would take. The starts need not be
    regular, which is what lets a dataset skip the windows that would cross a user boundary.

    It behaves like a read-only 2-D int64 tensor where the engine needs it to: ``len``, ``shape``,
    ``size``, ``dtype``, ``device``, ``ndim`` and ``to``. Indexing (``x[i]``, ``x[a:b]``, ``x[idx]``)
    returns a real :class:`torch.Tensor` holding just those rows (a batch); :meth:`select` returns a
    lazy :class:`TokenWindows` over a subset (what :meth:`ArrayData.subset` uses, so a client's share
    is never copied).
    """

    def __init__(self, text: torch.Tensor, starts: torch.Tensor, length: int) -> None:
        if not isinstance(text, torch.Tensor) or text.ndim != 1:
            raise ValueError(f"text must be a 1-D tensor of token ids, got {type(text).__name__} "
                             f"with shape {getattr(text, 'shape', None)}")
        starts = torch.as_tensor(starts, dtype=torch.int64, device=text.device)
        if starts.ndim != 1:
            raise ValueError(f"starts must be 1-D, got shape {tuple(starts.shape)}")
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise ValueError(f"length must be a positive int, got {length!r}")
        if len(starts) and (int(starts.min()) < 0 or int(starts.max()) + length > len(text)):
            raise ValueError(f"window starts must lie in [0, {len(text) - length}] for a text of "
                             f"{len(text)} tokens and windows of {length}, got "
                             f"[{int(starts.min())}, {int(starts.max())}]")
        self.text = text
        self.starts = starts
        self.length = length

    # --- tensor-like surface -------------------------------------------------------------------
    @property
    def shape(self) -> torch.Size:
        """``(number of windows, window length)``."""
        return torch.Size((len(self.starts), self.length))

    def size(self, dim: int | None = None) -> Any:
        """Like :meth:`torch.Tensor.size`."""
        return self.shape if dim is None else self.shape[dim]

    @property
    def ndim(self) -> int:
        """Always 2."""
        return 2

    @property
    def dtype(self) -> torch.dtype:
        """The token dtype (int64)."""
        return self.text.dtype

    @property
    def device(self) -> torch.device:
        """Where the text lives."""
        return self.text.device

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index: Any) -> torch.Tensor:
        """The selected windows as a real tensor: ``(length,)`` for an int, ``(n, length)`` otherwise."""
        rows = self.starts[_as_index(index)]
        if rows.ndim == 0:
            start = int(rows)
            return self.text[start:start + self.length]
        offsets = torch.arange(self.length, device=self.text.device)
        return self.text[rows.unsqueeze(-1) + offsets]

    def select(self, indices: Any) -> "TokenWindows":
        """A lazy subset: the windows at ``indices`` (no token is copied)."""
        rows = self.starts[_as_index(indices)]
        return TokenWindows(self.text, rows.reshape(-1), self.length)

    def to(self, *args: Any, **kwargs: Any) -> "TokenWindows":
        """Move (or cast) the underlying text and starts, as :meth:`torch.Tensor.to` would."""
        text = self.text.to(*args, **kwargs)
        return TokenWindows(text, self.starts.to(text.device), self.length)

    def materialize(self) -> torch.Tensor:
        """All windows as one contiguous ``(N, length)`` tensor (this does copy: N x length tokens)."""
        return self[:]

    def numpy(self) -> np.ndarray:
        """All windows as a numpy array (copies, like :meth:`materialize`)."""
        return self.materialize().cpu().numpy()

    def __repr__(self) -> str:
        return (f"TokenWindows(n={len(self)}, length={self.length}, text_tokens={len(self.text)}, "
                f"dtype={self.dtype}, device={self.device})")


def _as_index(index: Any) -> Any:
    """Numpy index arrays and lists become int64 tensors; ints and slices pass through."""
    if isinstance(index, np.ndarray):
        if index.dtype == bool:
            return torch.from_numpy(index)
        return torch.from_numpy(np.asarray(index, dtype=np.int64))
    if isinstance(index, (list, tuple)):
        return torch.as_tensor(index, dtype=torch.int64)
    return index


@dataclass(frozen=True)
class ArrayData:
    """Samples as tensors.

    ``x``: float32 images in NCHW (already normalised), or int64 token ids ``(N, T)`` (for the
    character-level next-token datasets a :class:`TokenWindows`, which indexes like a tensor).
    ``y``: int64 targets ``(N,)`` (class ids, or the next token for next-token tasks).
    ``groups``: int64 ``(N,)`` natural owner of each sample (writer, speaking role) or ``None``.
    """

    x: torch.Tensor | TokenWindows
    y: torch.Tensor
    groups: np.ndarray | None = None

    def __post_init__(self) -> None:
        if len(self.x) != len(self.y):
            raise ValueError(f"x and y differ in length: {len(self.x)} vs {len(self.y)}")
        if self.groups is not None and len(self.groups) != len(self.y):
            raise ValueError(f"groups has {len(self.groups)} entries, expected {len(self.y)}")

    def __len__(self) -> int:
        return len(self.y)

    def subset(self, indices: np.ndarray) -> "ArrayData":
        """The samples at ``indices`` (token windows stay lazy; tensors are indexed, i.e. copied)."""
        idx = torch.as_tensor(np.asarray(indices, dtype=np.int64))
        groups = None if self.groups is None else self.groups[np.asarray(indices, dtype=np.int64)]
        x = self.x.select(idx) if isinstance(self.x, TokenWindows) else self.x[idx]
        return ArrayData(x, self.y[idx], groups)

    @property
    def labels(self) -> np.ndarray:
        """Targets as a numpy array (what partitioners read)."""
        return self.y.numpy()


@dataclass(frozen=True)
class FederatedDataset:
    """A dataset ready for the engine.

    ``task`` is ``"classification"`` (one label per sample) or ``"next_token"`` (``y`` is the token that
    follows ``x``; accuracy is next-token accuracy and perplexity is reported too).
    ``input_shape`` is the shape of one sample of ``x`` (e.g. ``(1, 28, 28)`` or ``(80,)``).
    ``vocab_size`` is set for token tasks. ``group_names`` names the natural groups (writers, roles).
    """

    name: str
    train: ArrayData
    test: ArrayData
    num_classes: int
    input_shape: tuple[int, ...]
    task: str = "classification"
    class_names: tuple[str, ...] = ()
    vocab_size: int | None = None
    group_names: tuple[str, ...] = ()
    notes: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def in_channels(self) -> int:
        return int(self.input_shape[0]) if len(self.input_shape) == 3 else 1


def token_windows(text: torch.Tensor, starts: np.ndarray, seq_len: int,
                  groups: np.ndarray | None = None) -> ArrayData:
    """Next-token samples over one encoded ``text``: inputs ``text[s : s + seq_len]`` (lazy
    :class:`TokenWindows`), targets ``text[s + seq_len]``, for every start ``s`` in ``starts``."""
    starts_t = torch.from_numpy(np.asarray(starts, dtype=np.int64))
    return ArrayData(TokenWindows(text, starts_t, seq_len), text[starts_t + seq_len], groups)


def per_user_windows(text: torch.Tensor, lengths: np.ndarray, seq_len: int, stride: int,
                     train_fraction: float = 0.9) -> dict[str, ArrayData]:
    """Train/test next-token windows over users' texts concatenated in ``text`` (user ``u`` owns the next
    ``lengths[u]`` tokens): per user, windows start every ``stride`` tokens and never cross into the next user;
    the first ``max(1, int(train_fraction · n))`` go to ``"train"``, the rest to ``"test"``; ``groups`` = user."""
    lengths = np.asarray(lengths, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    parts: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {"train": ([], []), "test": ([], [])}
    for index, (offset, length) in enumerate(zip(offsets, lengths)):
        starts = offset + np.arange(0, length - seq_len, stride, dtype=np.int64)
        cut = max(1, int(train_fraction * len(starts)))
        for split, chosen in (("train", starts[:cut]), ("test", starts[cut:])):
            parts[split][0].append(chosen)
            parts[split][1].append(np.full(len(chosen), index, dtype=np.int64))
    return {split: token_windows(text, np.concatenate(s), seq_len, np.concatenate(g))
            for split, (s, g) in parts.items()}
