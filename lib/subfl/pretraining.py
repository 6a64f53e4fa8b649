"""Pretraining CAFF's family of tiny transformers ``F_l`` (the weights CAFF finetunes), cached on disk.

CAFF (Pfeiffer et al., §4.1) pretrains GPT-style language models on OpenWebText and ViTs on down-scaled ImageNet,
then finetunes them federatedly (Shakespeare; CIFAR-10/100). Neither pretraining corpus is available offline;
the book's substitutes:

* **Language models** — the public-domain English corpus (``load_text("english_corpus")``: Gutenberg books and
  presidential addresses, 8.9 M characters; ``shared/data/PROVENANCE.md`` §4), tokenized with the SentencePiece
  model of :mod:`subfl.data.tokenizer` (trained on the same corpus). Objective: next-token cross-entropy over
  every position of random ``seq_len``-token windows of the first 90 % of the corpus; the last 10 % is held out
  (reported as ``eval_loss`` / perplexity). The downstream task (Shakespeare by role) overlaps the corpus only
  in style: the corpus's three Shakespeare plays (Caesar, Hamlet, Macbeth, from NLTK's Gutenberg selection) also
  appear in the Shakespeare data — a small overlap we accept and document (375 k characters, 4.2 % of the
  corpus, all inside its training 90 %).
* **ViTs** — the only colour-image data at hand is the CIFAR-10 copy (20,000 train images, 2,000 per class).
  Pretraining uses the five classes :data:`PRETRAIN_CLASSES` (airplane, automobile, bird, cat, deer; 10,000
  images) and the downstream federated task uses the other five, :data:`DOWNSTREAM_CLASSES` (dog, frog, horse,
  ship, truck; :func:`cifar10_classes`), so no image or class is seen in both. Each half holds vehicles and
  animals, so — as with ImageNet → CIFAR — pretraining sees related but different classes. It is a much
  smaller pretraining set than ImageNet; expect a smaller gain from pretraining than the paper reports.
  Augmentation: random 4-pixel-padded crops and horizontal flips.

Optimisation: AdamW (β = (0.9, 0.95), weight decay on matrices only), linear warm-up then cosine decay to
``min_lr_ratio · lr``, gradient clipping, optionally bfloat16 autocast (``precision``; the ViTs of the ``cpu`` scale).
Everything random comes from generators derived from ``seed``.

Scales (:func:`preset`; they change sizes, never the recipe):

====== ================ =============================================================================
scale  depths ``l``      size
====== ================ =============================================================================
ci     3                seconds: a handful of steps on short windows / few images, small tokenizer
cpu    3, 6, 9          up to an hour per family on a 2-core laptop (see ``PRESETS``)
paper  3, 6, 9, 12      a GPU: 20k steps of 64 × 256 tokens (LM) / 128 images (ViT)
====== ================ =============================================================================

Cache: ``artifact_dir("pretrained")/<key>/`` holds ``weights.pt`` (the state dict) and ``summary.json``; ``key``
hashes the config and :data:`PRETRAINING_VERSION` (bumped whenever pretraining computes something different), so
a change of behaviour invalidates old weights and a refactor does not. The cache is this machine's; a project that
wants the weights to outlive it keeps a copy (the book keeps its ``cpu``-scale models in its run store).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .data.base import ArrayData, FederatedDataset
from .data.datasets import load_dataset
from .data.tokenizer import TokenizerConfig, english_corpus_tokens, train_tokenizer
from .fl.rng import seed_sequence, torch_generator
from .models.transformers import TinyGPT, TinyViT, causal_lm_loss
from .artifacts import artifact_dir
from .files import write_atomically
from .locking import exclusive, lock_file_for

PRETRAINING_VERSION = 2
"""Version of the pretraining recipe (data, tokenizer, objective, schedule, models): part of the weights' cache key
and of the run key of every run that finetunes weights pretrained here."""

PRECISIONS = ("float32", "bfloat16")
"""``float32``: plain training; ``bfloat16``: forward and backward under ``torch.autocast`` in bfloat16 (weights,
gradients and AdamW state stay float32) — 1.6x faster per ViT step on a CPU with AVX-512 bf16."""

KINDS = ("lm", "vit")
"""``lm``: :class:`~subfl.models.transformers.TinyGPT`; ``vit``: :class:`~subfl.models.transformers.TinyViT`."""

PRETRAIN_CLASSES: tuple[int, ...] = (0, 1, 2, 3, 4)
"""CIFAR-10 classes the ViTs are pretrained on: airplane, automobile, bird, cat, deer."""

DOWNSTREAM_CLASSES: tuple[int, ...] = (5, 6, 7, 8, 9)
"""CIFAR-10 classes of the downstream (federated) task: dog, frog, horse, ship, truck."""


@dataclass(frozen=True)
class PretrainConfig:
    """Everything that determines one pretrained model (and its cache key)."""

    kind: str = "lm"
    layers: int = 3
    steps: int = 600
    batch_size: int = 16
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 60
    weight_decay: float = 0.1
    grad_clip: float | None = 1.0
    seed: int = 0
    device: str = "cpu"
    eval_batches: int = 8
    precision: str = "float32"
    # language model
    seq_len: int = 256
    context_length: int = 256
    embed_dim: int = 96
    heads: int = 3
    vocab_size: int = 2048
    tokenizer_max_chars: int | None = None
    # vit
    classes: tuple[int, ...] = PRETRAIN_CLASSES
    max_images: int | None = None
    patch_size: int = 4
    pool: str = "cls"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        for name in ("layers", "steps", "batch_size", "eval_batches", "seq_len", "context_length", "embed_dim",
                     "heads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.seq_len > self.context_length:
            raise ValueError(f"seq_len={self.seq_len} exceeds context_length={self.context_length}")
        if not self.lr > 0 or not 0 <= self.min_lr_ratio <= 1 or self.warmup_steps < 0 or self.weight_decay < 0:
            raise ValueError(f"need lr > 0, min_lr_ratio in [0, 1], warmup_steps >= 0, weight_decay >= 0; got "
                             f"lr={self.lr}, min_lr_ratio={self.min_lr_ratio}, warmup_steps={self.warmup_steps}, "
                             f"weight_decay={self.weight_decay}")
        if self.kind == "vit" and (not self.classes or any(not 0 <= c <= 9 for c in self.classes)):
            raise ValueError(f"classes must be CIFAR-10 class ids in [0, 9], got {self.classes!r}")
        object.__setattr__(self, "classes", tuple(int(c) for c in self.classes))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> "PretrainConfig":
        return dataclasses.replace(self, **changes)

    def tokenizer_config(self) -> TokenizerConfig:
        """The tokenizer the language model is trained with (and must be finetuned with)."""
        return TokenizerConfig(vocab_size=self.vocab_size, max_chars=self.tokenizer_max_chars)

    def key(self) -> str:
        """hash(config, :data:`PRETRAINING_VERSION`): the cache key."""
        text = json.dumps(self.to_dict(), sort_keys=True, default=str)
        return hashlib.sha256(f"{text}|pretraining v{PRETRAINING_VERSION}".encode()).hexdigest()

    def build_model(self) -> nn.Module:
        """The untrained architecture (deterministic initialisation from ``seed``)."""
        init_seed = int(seed_sequence(self.seed, "pretrain-init", self.kind, self.layers).generate_state(1)[0])
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(init_seed)
            if self.kind == "lm":
                return TinyGPT(self.vocab_size, self.layers, self.embed_dim, self.heads, self.context_length)
            return TinyViT(len(self.classes), 32, self.patch_size, 3, self.layers, self.embed_dim, self.heads,
                           pool=self.pool)


_MODEL_DEFAULTS = {"lm": dict(embed_dim=96, heads=3), "vit": dict(embed_dim=192, heads=6)}

PRESETS: dict[tuple[str, str], dict[str, Any]] = {
    ("lm", "ci"): dict(layers=(3,), steps=4, batch_size=4, seq_len=32, warmup_steps=1, eval_batches=2,
                       vocab_size=512, tokenizer_max_chars=300_000),
    # 2,400 steps of 16 x 256 tokens = 9.8 M tokens, about four passes over the corpus's training 90 %. The
    # earlier recipe (600 steps, one pass) left the deeper models the worse ones on held-out text (perplexity
    # 115 / 125 / 128 for l = 3 / 6 / 9), the reverse of what CAFF's Eq. 3 assumes. Held-out loss on 32 batches.
    ("lm", "cpu"): dict(layers=(3, 6, 9), steps=2400, batch_size=16, seq_len=256, lr=2e-3, warmup_steps=60,
                        eval_batches=32),
    ("lm", "paper"): dict(layers=(3, 6, 9, 12), steps=20_000, batch_size=64, seq_len=256, lr=6e-4,
                          warmup_steps=1000, eval_batches=50, device="cuda"),
    ("vit", "ci"): dict(layers=(3,), steps=3, batch_size=8, warmup_steps=1, eval_batches=2, max_images=200),
    # 4,000 steps of 32 images = 12.8 passes over the 10,000 pretraining images, in bfloat16 autocast: measured
    # 0.12 / 0.35 s per step for l = 3 / 9 on one core (fp32: 0.19 / 0.57), ~25 min for l = 3, 6, 9 on two cores.
    # The earlier recipe (800 steps, 2.5 passes) left F_3 at 0.535 on its own five classes and its full finetuning
    # at 0.41 on the downstream five: too weak for CAFF's CIFAR-10 tables.
    ("vit", "cpu"): dict(layers=(3, 6, 9), steps=4000, batch_size=32, lr=1e-3, warmup_steps=200, weight_decay=0.05,
                         eval_batches=40, precision="bfloat16"),
    ("vit", "paper"): dict(layers=(3, 6, 9, 12), steps=20_000, batch_size=128, lr=1e-3, warmup_steps=1000,
                           weight_decay=0.05, eval_batches=50, device="cuda"),
}
"""Per (kind, scale): the depths of the family and the config fields that differ from the defaults."""


def preset(kind: str, scale: str, layers: int | None = None, **overrides: Any) -> PretrainConfig:
    """The :class:`PretrainConfig` of ``scale`` for one depth (default: the scale's smallest), then ``overrides``."""
    if (kind, scale) not in PRESETS:
        raise ValueError(f"(kind, scale) must be one of {sorted(PRESETS)}, got {(kind, scale)!r}")
    values = {**_MODEL_DEFAULTS[kind], **PRESETS[(kind, scale)]}
    depths = values.pop("layers")
    values["layers"] = depths[0] if layers is None else layers
    return PretrainConfig(kind=kind, **{**values, **overrides})


def family_depths(kind: str, scale: str) -> tuple[int, ...]:
    """The depths ``l`` pretrained at ``scale``."""
    return tuple(PRESETS[(kind, scale)]["layers"])


def pretrained_dir(config: PretrainConfig) -> Path:
    """Where the weights of ``config`` are (or will be) cached."""
    return artifact_dir("pretrained") / f"{config.kind}-l{config.layers}-{config.key()[:24]}"


def _lr_at(config: PretrainConfig, step: int) -> float:
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    span = max(1, config.steps - config.warmup_steps)
    progress = min(1.0, (step - config.warmup_steps) / span)
    low = config.lr * config.min_lr_ratio
    return low + 0.5 * (config.lr - low) * (1 + math.cos(math.pi * progress))


def _optimizer(model: nn.Module, config: PretrainConfig) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    rest = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": config.weight_decay},
                              {"params": rest, "weight_decay": 0.0}], lr=config.lr, betas=(0.9, 0.95))


def cifar10_classes(classes: Sequence[int] = DOWNSTREAM_CLASSES, data_root: str | os.PathLike | None = None, *,
                    max_train: int | None = None, max_test: int | None = None) -> FederatedDataset:
    """CIFAR-10 restricted to ``classes`` (relabelled ``0 … len(classes) − 1`` in the given order); optional
    deterministic class-balanced caps ``max_train`` / ``max_test`` (first images of each class in file order
    after the loader's own ordering). The downstream task of the ViTs uses :data:`DOWNSTREAM_CLASSES`."""
    classes = tuple(int(c) for c in classes)
    if not classes or len(set(classes)) != len(classes) or any(not 0 <= c <= 9 for c in classes):
        raise ValueError(f"classes must be distinct CIFAR-10 class ids in [0, 9], got {classes!r}")
    full = load_dataset("cifar10", data_root)
    relabel = torch.full((10,), -1, dtype=torch.int64)
    relabel[list(classes)] = torch.arange(len(classes))
    splits = {}
    for split, cap in (("train", max_train), ("test", max_test)):
        data: ArrayData = getattr(full, split)
        labels = data.y.numpy()
        keep = []
        for c in classes:
            members = np.flatnonzero(labels == c)
            keep.append(members if cap is None else members[: max(1, cap // len(classes))])
        idx = np.sort(np.concatenate(keep))
        splits[split] = ArrayData(data.x[torch.from_numpy(idx)], relabel[data.y[torch.from_numpy(idx)]])
    names = tuple(full.class_names[c] for c in classes)
    return FederatedDataset(
        name="cifar10_classes", train=splits["train"], test=splits["test"], num_classes=len(classes),
        input_shape=full.input_shape, class_names=names,
        notes=f"{full.notes} Restricted to classes {list(names)} (relabelled 0-{len(classes) - 1}).",
        extra=dict(full.extra))


def load_cifar10_downstream(data_root: str | os.PathLike | None = None, verify: bool = True, *,
                            max_train: int | None = None, max_test: int | None = None) -> FederatedDataset:
    """The ``cifar10_downstream`` dataset (:mod:`subfl.data.names`, ``load_dataset("cifar10_downstream")``):
    :func:`cifar10_classes` of :data:`DOWNSTREAM_CLASSES`, the classes the ViTs were not pretrained on."""
    if not verify:
        raise ValueError("verify=False is not accepted by cifar10_downstream (its CIFAR-10 file is always checked)")
    return cifar10_classes(DOWNSTREAM_CLASSES, data_root, max_train=max_train, max_test=max_test)


def _augment(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Random 4-pixel-padded crop and horizontal flip of a batch (one draw per image)."""
    b, _, h, w = images.shape
    padded = torch.nn.functional.pad(images, (4, 4, 4, 4))
    dx = torch.randint(0, 9, (b,), generator=generator)
    dy = torch.randint(0, 9, (b,), generator=generator)
    flip = torch.rand(b, generator=generator) < 0.5
    out = torch.empty_like(images)
    for i in range(b):
        crop = padded[i, :, dy[i]:dy[i] + h, dx[i]:dx[i] + w]
        out[i] = crop.flip(-1) if flip[i] else crop
    return out


def _lm_data(config: PretrainConfig, data_root) -> tuple[FederatedDataset, Any]:
    tokenizer = train_tokenizer(config.tokenizer_config(), data_root)
    if tokenizer.vocab_size != config.vocab_size:  # pragma: no cover - SentencePiece gives exactly vocab_size
        raise ValueError(f"tokenizer has {tokenizer.vocab_size} ids, config asks for {config.vocab_size}")
    return english_corpus_tokens(tokenizer, seq_len=config.seq_len, data_root=data_root), tokenizer


def _vit_data(config: PretrainConfig, data_root) -> FederatedDataset:
    cap = config.max_images
    return cifar10_classes(config.classes, data_root, max_train=cap,
                           max_test=None if cap is None else max(len(config.classes), cap // 4))


def _batches(data: ArrayData, batch_size: int, generator: torch.Generator):
    n = len(data)
    while True:
        idx = torch.randint(0, n, (batch_size,), generator=generator)
        yield data.x[idx], data.y[idx]


@torch.no_grad()
def _evaluate(model: nn.Module, data: ArrayData, config: PretrainConfig) -> dict[str, float]:
    model.eval()
    n = min(len(data), config.eval_batches * config.batch_size)
    idx = torch.from_numpy(np.linspace(0, len(data) - 1, n).round().astype(np.int64))
    loss, correct, count = 0.0, 0, 0
    for start in range(0, n, config.batch_size):
        part = idx[start:start + config.batch_size]
        x, y = data.x[part].to(config.device), data.y[part].to(config.device)
        out = model(x)
        if config.kind == "lm":
            loss += float(causal_lm_loss(out, x, y)) * len(part)
            correct += int((out[:, -1].argmax(-1) == y).sum())
        else:
            loss += float(nn.functional.cross_entropy(out, y, reduction="sum"))
            correct += int((out.argmax(-1) == y).sum())
        count += len(part)
    result = {"eval_loss": loss / count, "eval_accuracy": correct / count}
    if config.kind == "lm":
        result["eval_perplexity"] = math.exp(min(result["eval_loss"], 50.0))
    return result


def train_from_scratch(config: PretrainConfig, data_root: str | os.PathLike | None = None,
                       progress: bool = False) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Pretrain ``config`` now (no cache): ``(state_dict on CPU, summary)``."""
    start = time.perf_counter()
    if config.kind == "lm":
        dataset, tokenizer = _lm_data(config, data_root)
        extra = {"tokenizer": str(tokenizer.path)}
    else:
        dataset, extra = _vit_data(config, data_root), {"class_names": list(_vit_class_names(config))}
    model = config.build_model().to(config.device)
    optimizer = _optimizer(model, config)
    generator = torch_generator(config.seed, "pretrain-batches", config.kind, config.layers)
    augment_generator = torch_generator(config.seed, "pretrain-augment", config.kind, config.layers)
    batches = _batches(dataset.train, config.batch_size, generator)
    losses = []
    model.train()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed_sequence(config.seed, "pretrain-global").generate_state(1)[0]))
        for step in range(config.steps):
            x, y = next(batches)
            if config.kind == "vit":
                x = _augment(x, augment_generator)
            x, y = x.to(config.device), y.to(config.device)
            for group in optimizer.param_groups:
                group["lr"] = _lr_at(config, step)
            with torch.autocast(torch.device(config.device).type, dtype=torch.bfloat16,
                                enabled=config.precision == "bfloat16"):
                out = model(x)
                loss = causal_lm_loss(out, x, y) if config.kind == "lm" else nn.functional.cross_entropy(out, y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if config.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            optimizer.step()
            losses.append(float(loss.detach()))
            if progress and (step % 50 == 0 or step == config.steps - 1):
                print(f"pretrain {config.kind} l={config.layers} step {step + 1}/{config.steps} loss {losses[-1]:.3f}",
                      flush=True)
    metrics = _evaluate(model, dataset.test, config)
    state = {k: v.detach().to("cpu").clone() for k, v in model.state_dict().items()}
    summary = {"config": config.to_dict(), "key": config.key(), "train_loss": losses,
               "final_train_loss": float(np.mean(losses[-max(1, len(losses) // 10):])), **metrics,
               "wall_time_s": time.perf_counter() - start, "dataset_notes": dataset.notes, **extra}
    return state, summary


def _vit_class_names(config: PretrainConfig) -> tuple[str, ...]:
    names = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
    return tuple(names[c] for c in config.classes)


def pretrain(config: PretrainConfig, data_root: str | os.PathLike | None = None, *, cache: bool = True,
             progress: bool = False) -> dict[str, torch.Tensor]:
    """The pretrained state dict of ``config``: read from the cache, or trained and stored there. With ``cache``, the
    training holds an exclusive lock (:func:`subfl.locking.exclusive`, bounded wait): processes that ask for the
    same missing model at once train it once; the others wait and read it."""
    if not cache:
        return train_from_scratch(config, data_root, progress)[0]
    folder = pretrained_dir(config)
    weights = folder / "weights.pt"
    with exclusive(lock_file_for(folder, artifact_dir("locks")), f"pretraining {folder.name}"):
        if weights.is_file():
            return torch.load(weights, map_location="cpu", weights_only=True)
        state, summary = train_from_scratch(config, data_root, progress)
        write_atomically(weights, lambda tmp: torch.save(state, tmp))
        (folder / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True, default=str) + "\n")
    return state


def pretrain_summary(config: PretrainConfig) -> dict[str, Any] | None:
    """The stored summary (loss curve, held-out loss, wall time) of a cached pretraining run, or None."""
    path = pretrained_dir(config) / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else None


def pretrain_family(kind: str = "lm", scale: str = "cpu", layers: Iterable[int] | None = None,
                    data_root: str | os.PathLike | None = None, *, progress: bool = False,
                    **overrides: Any) -> dict[int, dict[str, torch.Tensor]]:
    """``{l: state_dict}`` for every depth of the scale's family (or ``layers``), each cached separately."""
    depths = family_depths(kind, scale) if layers is None else tuple(layers)
    return {l: pretrain(preset(kind, scale, l, **overrides), data_root, progress=progress) for l in depths}


__all__ = ["DOWNSTREAM_CLASSES", "KINDS", "PRECISIONS", "PRESETS", "PRETRAIN_CLASSES", "PretrainConfig", "cifar10_classes",
           "family_depths", "preset", "pretrain", "pretrain_family", "pretrain_summary", "pretrained_dir",
           "train_from_scratch"]
