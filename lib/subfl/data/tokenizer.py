"""Sub-word tokenizer for CAFF's tiny language models, and the token-window datasets built with it.

Tokenizer. A SentencePiece model (Kudo & Richardson, EMNLP 2018; ``pip install sentencepiece``, trains offline)
trained on the public-domain English corpus (``load_text("english_corpus")``, the book's stand-in for
OpenWebText). Defaults (:class:`TokenizerConfig`):

* ``vocab_size = 2048``. The head of a width-96 model has ``96·V`` parameters and CAFF always trains (and
  uploads) it: at V = 2048 it is 197 k parameters, about 1.8 transformer blocks (110 k each) — large enough to
  merge frequent words and sub-words (3.2 characters per token on this corpus), small enough that the head
  does not dwarf the trained blocks (GPT-2's 50 k vocabulary would give a 4.8 M-parameter head, 44 blocks).
* ``model_type = "bpe"``, ``character_coverage = 1.0`` (the corpus is English), ``byte_fallback = True``
  (a character never seen in training — Shakespeare's rare glyphs — becomes UTF-8 byte tokens, never ``<unk>``;
  256 of the ids are byte tokens). Ids 0, 1, 2 are ``<unk>``, ``<s>``, ``</s>`` (SentencePiece's defaults; the
  datasets here never insert ``<s>``/``</s>``). Text is NFKC-normalised (SentencePiece's ``nmt_nfkc``: e.g.
  ``½`` → ``1⁄2``), so :meth:`Tokenizer.decode` returns the normalised text.
* Training reads every non-empty line of the corpus as one sentence, unshuffled, on one thread
  (deterministic). ``max_chars`` trains on the leading characters only (for tests and the ``ci`` scale).

Newlines. SentencePiece treats its input as sentences without newlines, so texts are encoded line by line and
the lines' tokens concatenated; every line starts with SentencePiece's word-boundary marker, so a line break
reads as a space (as LEAF's Shakespeare turns newlines into spaces).

Cache. The trained model is stored under ``artifact_dir("tokenizers")/<corpus>-<type>-<V>-<key>/`` where
``key`` hashes the config, the corpus text and the SentencePiece version; the encoded English corpus (int32
ids) is cached next to it. Nothing is stored in the repository.

Datasets (next-token task, :class:`~subfl.data.base.TokenWindows`, ``y`` = the token after the window):

* :func:`english_corpus_tokens` — pretraining: windows over the encoded corpus, first 90 % of tokens train,
  last 10 % test (by position, as the character-level loader does).
* :func:`shakespeare_tokens` — finetuning: one user per (play, role) of ``shakespeare_by_role.json.gz`` (the
  LEAF-style split), each role's speeches joined with spaces, windows never cross roles, per-role 90/10 split in
  time order; ``groups`` = role index (use the ``natural`` partition).
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..artifacts import artifact_dir
from ..files import write_atomically
from .base import FederatedDataset, per_user_windows, token_windows
from .datasets import TEXT_CORPORA, load_text
from .manifest import manifest_entry, require_file, resolve_data_root, verify_file

MODEL_TYPES = ("bpe", "unigram")
"""SentencePiece model types accepted by :class:`TokenizerConfig`."""

SHAKESPEARE_FILE = "shakespeare_by_role.json.gz"


def _sentencepiece():
    try:
        import sentencepiece
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError("the CAFF tokenizer needs SentencePiece: pip install sentencepiece") from error
    return sentencepiece


@dataclass(frozen=True)
class TokenizerConfig:
    """What determines a trained tokenizer (see the module docstring for the defaults' rationale)."""

    corpus: str = "english_corpus"
    vocab_size: int = 2048
    model_type: str = "bpe"
    character_coverage: float = 1.0
    byte_fallback: bool = True
    max_chars: int | None = None

    def __post_init__(self) -> None:
        if self.corpus not in TEXT_CORPORA:
            raise ValueError(f"corpus must be one of {TEXT_CORPORA}, got {self.corpus!r}")
        if isinstance(self.vocab_size, bool) or not isinstance(self.vocab_size, int) or self.vocab_size < 300:
            raise ValueError(f"vocab_size must be an int >= 300 (256 byte tokens + specials + pieces), "
                             f"got {self.vocab_size!r}")
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"model_type must be one of {MODEL_TYPES}, got {self.model_type!r}")
        if not 0.9 <= self.character_coverage <= 1.0:
            raise ValueError(f"character_coverage must be in [0.9, 1], got {self.character_coverage!r}")
        if self.max_chars is not None and (isinstance(self.max_chars, bool) or not isinstance(self.max_chars, int)
                                           or self.max_chars < 1000):
            raise ValueError(f"max_chars must be an int >= 1000 or None, got {self.max_chars!r}")


def _lines(text: str) -> list[str]:
    return [line for line in (raw.strip() for raw in text.split("\n")) if line]


def _cache_dir() -> Path:
    return artifact_dir("tokenizers")


class Tokenizer:
    """A trained SentencePiece model: :meth:`encode` text to int64 ids, :meth:`decode` ids to text."""

    def __init__(self, model_file: str | os.PathLike, config: TokenizerConfig | None = None) -> None:
        spm = _sentencepiece()
        self.path = Path(model_file)
        self.config = config
        self.processor = spm.SentencePieceProcessor(model_file=str(self.path))

    @property
    def vocab_size(self) -> int:
        return int(self.processor.get_piece_size())

    @property
    def directory(self) -> Path:
        return self.path.parent

    def encode(self, text: str) -> np.ndarray:
        """Token ids (int64) of ``text``; lines are encoded separately and concatenated (module docstring)."""
        pieces = self.processor.encode(_lines(text), num_threads=1)
        if not pieces:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([np.asarray(p, dtype=np.int64) for p in pieces])

    def decode(self, ids: Any) -> str:
        """Text of a sequence of ids (a list, array or 1-D tensor)."""
        return self.processor.decode([int(i) for i in np.asarray(ids).reshape(-1)])

    def pieces(self, text: str) -> list[str]:
        """The sub-word pieces of ``text`` (for inspection)."""
        return [p for line in self.processor.encode(_lines(text), out_type=str) for p in line]

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, path={str(self.path)!r})"


def tokenizer_key(config: TokenizerConfig, text: str) -> str:
    """Hash of (config, corpus text, SentencePiece version): the tokenizer's cache key."""
    spm = _sentencepiece()
    h = hashlib.sha256(json.dumps(asdict(config), sort_keys=True).encode())
    h.update(hashlib.sha256(text.encode("utf-8")).digest())
    h.update(str(getattr(spm, "__version__", "?")).encode())
    return h.hexdigest()


def _training_text(config: TokenizerConfig, data_root: str | os.PathLike | None) -> str:
    text = load_text(config.corpus, data_root)
    return text if config.max_chars is None else text[: config.max_chars]


def train_tokenizer(config: TokenizerConfig | None = None, data_root: str | os.PathLike | None = None, *,
                    cache: bool = True) -> Tokenizer:
    """Train (or read back from the cache) the SentencePiece tokenizer of ``config`` on its corpus.

    Offline and deterministic (one thread, unshuffled input: the same pieces and scores every time). With
    ``cache=False`` a fresh model is trained into a new temporary folder (``Tokenizer.directory``; the caller's to
    delete) every call.
    """
    config = config or TokenizerConfig()
    spm = _sentencepiece()
    text = _training_text(config, data_root)
    key = tokenizer_key(config, text)
    name = f"{config.corpus}-{config.model_type}-{config.vocab_size}-{key[:16]}"
    target = _cache_dir() / name if cache else Path(tempfile.mkdtemp(prefix="subfl-tokenizer-"))
    model_file = target / "tokenizer.model"
    if cache and model_file.is_file():
        return Tokenizer(model_file, config)
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".tmp-", dir=target.parent))
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(_lines(text)), model_prefix=str(work / "tokenizer"),
            vocab_size=config.vocab_size, model_type=config.model_type,
            character_coverage=config.character_coverage, byte_fallback=config.byte_fallback,
            num_threads=1, input_sentence_size=0, shuffle_input_sentence=False, minloglevel=2)
        (work / "config.json").write_text(json.dumps({**asdict(config), "key": key}, indent=2, sort_keys=True))
        if target.exists():
            if cache and model_file.is_file():  # another process finished first
                return Tokenizer(model_file, config)
            shutil.rmtree(target)
        os.replace(work, target)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    return Tokenizer(model_file, config)


# ------------------------------------------------------------------------------------------------
# datasets
# ------------------------------------------------------------------------------------------------
def _check_int(name: str, value: Any, minimum: int, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}{' or None' if allow_none else ''}, got {value!r}")


def encoded_corpus(tokenizer: Tokenizer, name: str = "english_corpus",
                   data_root: str | os.PathLike | None = None) -> np.ndarray:
    """The whole corpus ``name`` as int64 token ids, cached (int32) next to the tokenizer's model."""
    if name not in TEXT_CORPORA:
        raise ValueError(f"name must be one of {TEXT_CORPORA}, got {name!r}")
    text = load_text(name, data_root)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
    path = tokenizer.directory / f"{name}-{digest}.npy"
    if path.is_file():
        return np.load(path).astype(np.int64)
    ids = tokenizer.encode(text)
    def save(tmp: Path) -> None:  # through a handle: np.save appends ".npy" to a path that lacks it
        with open(tmp, "wb") as fh:
            np.save(fh, ids.astype(np.int32), allow_pickle=False)

    write_atomically(path, save)
    return ids


def _vocab_names(tokenizer: Tokenizer) -> tuple[str, ...]:
    return tuple(tokenizer.processor.id_to_piece(i) for i in range(tokenizer.vocab_size))


def english_corpus_tokens(tokenizer: Tokenizer, seq_len: int = 256, stride: int = 1,
                          data_root: str | os.PathLike | None = None) -> FederatedDataset:
    """Pretraining data: ``seq_len``-token windows every ``stride`` tokens over the encoded English corpus; train
    windows read only the first 90 % of the tokens (targets included), test windows only the last 10 %."""
    _check_int("seq_len", seq_len, 1)
    _check_int("stride", stride, 1)
    ids = encoded_corpus(tokenizer, "english_corpus", data_root)
    text = torch.from_numpy(ids)
    cut = int(0.9 * len(ids))
    if cut - seq_len < 1 or len(ids) - cut - seq_len < 1:
        raise ValueError(f"seq_len={seq_len} is too long for {len(ids)} tokens")
    train = np.arange(0, cut - seq_len, stride, dtype=np.int64)
    test = np.arange(cut, len(ids) - seq_len, stride, dtype=np.int64)
    return FederatedDataset(
        name="english_corpus_tokens", train=token_windows(text, train, seq_len), test=token_windows(text, test, seq_len),
        num_classes=tokenizer.vocab_size, input_shape=(seq_len,), task="next_token",
        class_names=_vocab_names(tokenizer), vocab_size=tokenizer.vocab_size,
        notes=f"Public-domain English corpus (stand-in for OpenWebText) as {len(ids):,} SentencePiece tokens "
              f"(vocabulary {tokenizer.vocab_size}); x = {seq_len}-token windows every {stride} token(s), y = the "
              f"next token; first 90 % train, last 10 % test by position.",
        extra={"tokenizer": str(tokenizer.path), "tokens": int(len(ids))})


def shakespeare_roles(data_root: str | os.PathLike | None = None, verify: bool = True) -> tuple[list[str], list[str]]:
    """``(users, texts)`` of ``shakespeare_by_role.json.gz``: one (play, role) per user, its speeches joined with
    spaces and newlines turned into spaces (LEAF's preprocessing), in the file's order."""
    path = require_file(resolve_data_root(data_root), SHAKESPEARE_FILE)
    if verify:
        entry = manifest_entry(SHAKESPEARE_FILE)
        if entry is not None:
            verify_file(path, entry)
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        raw = json.load(handle)
    users = list(raw["users"])
    texts = [" ".join(s["text"] for s in raw["user_data"][u]["speeches"]).replace("\n", " ") for u in users]
    return users, texts


def shakespeare_tokens(tokenizer: Tokenizer, seq_len: int = 256, stride: int = 1, min_tokens: int | None = None,
                       max_users: int | None = None, data_root: str | os.PathLike | None = None,
                       verify: bool = True) -> FederatedDataset:
    """Finetuning data: LEAF-style Shakespeare by (play, role), tokenized; ``groups`` = role index.

    A role is kept when it has at least ``max(min_tokens, seq_len + stride + 1)`` tokens (two windows);
    ``max_users`` keeps the first kept roles in the file's order. Per role, windows start every ``stride``
    tokens, never cross into the next role, and the first ``max(1, int(0.9 n))`` go to train, the rest to test.
    """
    _check_int("seq_len", seq_len, 1)
    _check_int("stride", stride, 1)
    _check_int("min_tokens", min_tokens, 1, allow_none=True)
    _check_int("max_users", max_users, 1, allow_none=True)
    users, texts = shakespeare_roles(data_root, verify)
    needed = max(seq_len + stride + 1, min_tokens or 0)
    kept_users, encoded = [], []
    for user, text in zip(users, texts):
        ids = tokenizer.encode(text)
        if len(ids) >= needed:
            kept_users.append(user)
            encoded.append(ids)
        if max_users is not None and len(kept_users) == max_users:
            break
    if not kept_users:
        raise ValueError(f"no role has {needed} tokens; accepted: a smaller seq_len / min_tokens")
    text = torch.from_numpy(np.concatenate(encoded))
    lengths = np.array([len(e) for e in encoded], dtype=np.int64)
    data = per_user_windows(text, lengths, seq_len, stride)
    return FederatedDataset(
        name="shakespeare_tokens", train=data["train"], test=data["test"], num_classes=tokenizer.vocab_size,
        input_shape=(seq_len,), task="next_token", class_names=_vocab_names(tokenizer),
        vocab_size=tokenizer.vocab_size, group_names=tuple(kept_users),
        notes=f"LEAF-style Shakespeare by (play, role) from the Open Source Shakespeare edition, SentencePiece "
              f"tokens (vocabulary {tokenizer.vocab_size}): {len(kept_users)} roles with >= {needed} tokens, "
              f"{len(text):,} tokens, windows of {seq_len} every {stride}, per-role 90/10 split in time order; "
              f"groups = role index.",
        extra={"tokenizer": str(tokenizer.path), "user_tokens": tuple(int(n) for n in lengths)})


__all__ = ["MODEL_TYPES", "Tokenizer", "TokenizerConfig", "encoded_corpus", "english_corpus_tokens",
           "shakespeare_roles", "shakespeare_tokens", "tokenizer_key", "train_tokenizer"]


def load_shakespeare_tokens(data_root: str | os.PathLike | None = None, verify: bool = True, *,
                            vocab_size: int = 2048, tokenizer_max_chars: int | None = None, seq_len: int = 256,
                            stride: int = 1, min_tokens: int | None = None,
                            max_users: int | None = None) -> FederatedDataset:
    """The ``shakespeare_tokens`` dataset (:mod:`subfl.data.names`, ``load_dataset("shakespeare_tokens")``):
    :func:`shakespeare_tokens` with the English-corpus tokenizer ``TokenizerConfig(vocab_size,
    max_chars=tokenizer_max_chars)`` — the one a pretrained language model of the same ``vocab_size`` /
    ``tokenizer_max_chars`` was trained with (:meth:`subfl.pretraining.PretrainConfig.tokenizer_config`),
    which finetuning must reuse."""
    tokenizer = train_tokenizer(TokenizerConfig(vocab_size=vocab_size, max_chars=tokenizer_max_chars), data_root)
    return shakespeare_tokens(tokenizer, seq_len, stride, min_tokens, max_users, data_root, verify)
