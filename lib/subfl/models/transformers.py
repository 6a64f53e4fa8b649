"""Tiny transformers of CAFF (Pfeiffer, Ahmed, Khalili & Henkel, "Efficient Federated Finetuning of Tiny
Transformers with Resource-Constrained Devices"): a GPT-style causal language model and a ViT, both built
from the same pre-LN block, plus layer freezing and LoRA for finetuning.

Architectures (the family ``F_l``, ``l`` ∈ {3, 6, 9, 12} blocks):

=========== ============================================================================================
model       layout
=========== ============================================================================================
TinyGPT     token embedding (V×96) + learned position embedding (256×96) → ``l`` pre-LN blocks (3 heads
            of 32, MLP 96→384→96, GELU) → final LayerNorm → head (96→V, no bias). Causal attention.
            Input ``(B, T)`` token ids, ``T ≤ context_length``; output logits ``(B, T, V)``.
TinyViT     patch embedding (4×4 convolution, 3→192) + class token + learned position embedding
            ((1 + 64)×192 for 32×32 images) → ``l`` pre-LN blocks (6 heads of 32, MLP 192→768→192) →
            final LayerNorm → head (192→classes) on the class token (``pool="cls"``, default, as in
            ViT) or on the mean of the patch tokens (``pool="mean"``). Output ``(B, classes)``.
=========== ============================================================================================

A block is ``x + attn(ln1(x))`` then ``x + mlp(ln2(x))``; attention has separate ``q``, ``k``, ``v`` and
``proj`` linear maps (so LoRA can target each, and width slicing keeps q/k/v apart) and runs
:func:`torch.nn.functional.scaled_dot_product_attention`. Initialisation follows GPT-2: N(0, 0.02) for
linear and embedding weights, zero biases, the residual output maps (``proj``, ``fc2``) scaled by
``1/sqrt(2l)``. No buffers: a state dict holds parameters only.

Head: **untied** by default (``tie_weights=False``). CAFF freezes the token embedding but always trains the
head; with tied weights the two would be one matrix, so :func:`freeze_for_finetuning` and :func:`add_lora`
refuse tied models (``tie_weights=True`` exists for pretraining comparisons only).

Finetuning helpers:

* :func:`freeze_for_finetuning` ``(model, trainable_last_layers=t)`` — CAFF's ``F_l^t``: embeddings (token,
  position, patch, class token) and the first ``l − t`` blocks frozen; the last ``t`` blocks, the final
  LayerNorm and the head trained.
* :func:`add_lora` ``(model, rank, targets=...)`` — LoRA (Hu et al., ICLR 2022) on the blocks' linear maps:
  ``W x + (α/r)·B A x`` with ``A`` (r×in, Kaiming-uniform) and ``B`` (out×r, zero) trainable and ``W`` frozen;
  every LayerNorm and the head trained, embeddings frozen. ``α`` defaults to ``r`` (scaling 1).
* :func:`load_pretrained` — loads a pretrained state dict, dropping a head whose class count differs and
  cutting a longer position embedding to the model's context.
* :func:`causal_lm_loss` — next-token cross-entropy over every position of a window whose following token
  is ``y`` (the datasets' ``(x, y)`` convention).

Builders :func:`tiny_gpt` / :func:`tiny_vit` take the registry's ``(num_classes, input_shape, width=, norm=)``
signature; ``width`` scales the head dimension (``embed_dim = heads · scaled_channels(embed_dim/heads,
width)``), ``norm`` must be ``"none"`` (transformers always use LayerNorm).
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from .norm import check_width, scaled_channels

LAYER_DEPTHS: tuple[int, ...] = (3, 6, 9, 12)
"""The depths of CAFF's pretrained family ``F_l``."""

LORA_TARGETS: tuple[str, ...] = ("q", "k", "v", "proj", "fc1", "fc2")
"""Names of the linear maps of a block that :func:`add_lora` can adapt (all of them by default)."""

EMBEDDING_NAMES: tuple[str, ...] = ("token_embedding", "position_embedding", "patch_embedding", "cls_token",
                                    "pos_embedding")
"""Parameter-name prefixes of the input embeddings (frozen by both finetuning schemes)."""


# ------------------------------------------------------------------------------------------------
# building blocks
# ------------------------------------------------------------------------------------------------
class Attention(nn.Module):
    """Multi-head self-attention with separate ``q``, ``k``, ``v`` and output ``proj`` maps."""

    def __init__(self, embed_dim: int, num_heads: int, *, causal: bool, dropout: float = 0.0) -> None:
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim={embed_dim} must be a multiple of num_heads={num_heads}")
        self.num_heads, self.causal, self.dropout = num_heads, causal, float(dropout)
        self.q = nn.Linear(embed_dim, embed_dim)
        self.k = nn.Linear(embed_dim, embed_dim)
        self.v = nn.Linear(embed_dim, embed_dim)
        self.proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, e = x.shape
        h = self.num_heads

        def heads(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, t, h, e // h).transpose(1, 2)

        y = F.scaled_dot_product_attention(heads(self.q(x)), heads(self.k(x)), heads(self.v(x)),
                                           dropout_p=self.dropout if self.training else 0.0, is_causal=self.causal)
        return self.proj(y.transpose(1, 2).reshape(b, t, e))


class MLP(nn.Module):
    """``fc2(gelu(fc1(x)))`` with hidden size ``mlp_ratio · embed_dim``."""

    def __init__(self, embed_dim: int, hidden: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(embed_dim, hidden)
        self.fc2 = nn.Linear(hidden, embed_dim)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.fc2(F.gelu(self.fc1(x))))


class Block(nn.Module):
    """Pre-LN transformer block: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``."""

    def __init__(self, embed_dim: int, num_heads: int, *, causal: bool, mlp_ratio: float = 4.0,
                 dropout: float = 0.0) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(embed_dim)
        self.attn = Attention(embed_dim, num_heads, causal=causal, dropout=dropout)
        self.ln2 = nn.LayerNorm(embed_dim)
        self.mlp = MLP(embed_dim, int(round(mlp_ratio * embed_dim)), dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def _check_positive_int(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def _check_dropout(dropout: float) -> float:
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be a number in [0, 1), got {dropout!r}")
    return float(dropout)


def _init_gpt2(model: nn.Module, num_layers: int) -> None:
    """GPT-2 initialisation: N(0, 0.02) weights, zero biases, residual outputs scaled by 1/sqrt(2l)."""
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            std = 0.02 / math.sqrt(2 * num_layers) if name.endswith(("attn.proj", "mlp.fc2")) else 0.02
            nn.init.normal_(module.weight, 0.0, std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, 0.0, 0.02)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)


class TinyGPT(nn.Module):
    """GPT-style causal language model (see the module docstring).

    Args:
        vocab_size: number of token ids (and of output logits).
        num_layers: number of transformer blocks ``l``.
        embed_dim: model width (96 in CAFF).
        num_heads: attention heads (3 in CAFF).
        context_length: rows of the learned position embedding; the longest input (256 in CAFF).
        mlp_ratio: MLP hidden size / ``embed_dim``.
        dropout: dropout of attention weights and MLP outputs (0 by default).
        tie_weights: share the head's weight with the token embedding (not usable for CAFF finetuning).
    """

    def __init__(self, vocab_size: int, num_layers: int = 3, embed_dim: int = 96, num_heads: int = 3,
                 context_length: int = 256, mlp_ratio: float = 4.0, dropout: float = 0.0,
                 tie_weights: bool = False) -> None:
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("num_layers", num_layers), ("embed_dim", embed_dim),
                            ("num_heads", num_heads), ("context_length", context_length)):
            _check_positive_int(name, value)
        dropout = _check_dropout(dropout)
        self.vocab_size, self.context_length, self.tie_weights = vocab_size, context_length, bool(tie_weights)
        self.token_embedding = nn.Embedding(vocab_size, embed_dim)
        self.position_embedding = nn.Embedding(context_length, embed_dim)
        self.blocks = nn.ModuleList(Block(embed_dim, num_heads, causal=True, mlp_ratio=mlp_ratio, dropout=dropout)
                                    for _ in range(num_layers))
        self.norm = nn.LayerNorm(embed_dim)
        self.head = nn.Linear(embed_dim, vocab_size, bias=False)
        _init_gpt2(self, num_layers)
        if self.tie_weights:
            self.head.weight = self.token_embedding.weight

    @property
    def num_layers(self) -> int:
        return len(self.blocks)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.dim() != 2:
            raise ValueError(f"TinyGPT expects token ids of shape (B, T), got {tuple(tokens.shape)}")
        t = tokens.shape[1]
        if t > self.context_length:
            raise ValueError(f"input length {t} exceeds context_length={self.context_length}")
        positions = torch.arange(t, device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class TinyViT(nn.Module):
    """Vision transformer (see the module docstring).

    Args:
        num_classes: outputs of the head.
        image_size: side of the (square) input images.
        patch_size: side of a patch (4 in CAFF: 64 patches of a 32×32 image).
        in_channels: image channels.
        num_layers: number of transformer blocks ``l``.
        embed_dim: model width (192 in CAFF).
        num_heads: attention heads (6 in CAFF).
        mlp_ratio: MLP hidden size / ``embed_dim``.
        dropout: dropout of attention weights and MLP outputs (0 by default).
        pool: ``"cls"`` (head on the class token) or ``"mean"`` (head on the mean patch token; no class token).
    """

    POOLS = ("cls", "mean")

    def __init__(self, num_classes: int, image_size: int = 32, patch_size: int = 4, in_channels: int = 3,
                 num_layers: int = 3, embed_dim: int = 192, num_heads: int = 6, mlp_ratio: float = 4.0,
                 dropout: float = 0.0, pool: str = "cls") -> None:
        super().__init__()
        for name, value in (("num_classes", num_classes), ("image_size", image_size), ("patch_size", patch_size),
                            ("in_channels", in_channels), ("num_layers", num_layers), ("embed_dim", embed_dim),
                            ("num_heads", num_heads)):
            _check_positive_int(name, value)
        if image_size % patch_size:
            raise ValueError(f"image_size={image_size} must be a multiple of patch_size={patch_size}")
        if pool not in self.POOLS:
            raise ValueError(f"pool must be one of {self.POOLS}, got {pool!r}")
        dropout = _check_dropout(dropout)
        self.pool, self.image_size = pool, image_size
        num_patches = (image_size // patch_size) ** 2
        self.patch_embedding = nn.Conv2d(in_channels, embed_dim, patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if pool == "cls" else None
        self.pos_embedding = nn.Parameter(torch.zeros(1, num_patches + (pool == "cls"), embed_dim))
        self.blocks = nn.ModuleList(Block(embed_dim, num_heads, causal=False, mlp_ratio=mlp_ratio, dropout=dropout)
                                    for _ in range(num_layers))
        self.norm = nn.LayerNorm(embed_dim)
        self.head = nn.Linear(embed_dim, num_classes)
        _init_gpt2(self, num_layers)
        nn.init.normal_(self.pos_embedding, 0.0, 0.02)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, 0.0, 0.02)

    @property
    def num_layers(self) -> int:
        return len(self.blocks)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if images.dim() != 4 or images.shape[-1] != self.image_size or images.shape[-2] != self.image_size:
            raise ValueError(f"TinyViT expects images (B, C, {self.image_size}, {self.image_size}), "
                             f"got {tuple(images.shape)}")
        x = self.patch_embedding(images).flatten(2).transpose(1, 2)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = x + self.pos_embedding
        for block in self.blocks:
            x = block(x)
        x = self.norm(x)
        return self.head(x[:, 0] if self.pool == "cls" else x.mean(dim=1))


# ------------------------------------------------------------------------------------------------
# registry-style builders
# ------------------------------------------------------------------------------------------------
def _scaled_embed(embed_dim: int, heads: int, width: float) -> int:
    if embed_dim % heads:
        raise ValueError(f"embed_dim={embed_dim} must be a multiple of heads={heads}")
    return heads * scaled_channels(embed_dim // heads, check_width(width))


def _check_norm_none(norm: str | None) -> None:
    if norm not in (None, "none"):
        raise ValueError(f"norm={norm!r} is not accepted by the tiny transformers (they always use LayerNorm); "
                         f"accepted values: 'none'")


def tiny_gpt(num_classes: int, input_shape: Sequence[int], *, width: float = 1.0, norm: str | None = "none",
             vocab_size: int | None = None, layers: int = 3, embed_dim: int = 96, heads: int = 3,
             context_length: int | None = None, mlp_ratio: float = 4.0, dropout: float = 0.0,
             tie_weights: bool = False) -> TinyGPT:
    """:class:`TinyGPT` with the registry's signature. ``num_classes`` is the vocabulary size (the datasets'
    next-token convention); ``vocab_size``, when given, must equal it. ``input_shape = (T,)``;
    ``context_length`` defaults to ``max(256, T)``."""
    _check_norm_none(norm)
    if vocab_size is not None and vocab_size != num_classes:
        raise ValueError(f"vocab_size={vocab_size} differs from num_classes={num_classes}; a language model "
                         f"predicts one of its tokens, so they must be equal")
    if len(tuple(input_shape)) != 1:
        raise ValueError(f"tiny_gpt needs input_shape=(sequence length,), got {tuple(input_shape)}")
    context = max(256, int(input_shape[0])) if context_length is None else context_length
    return TinyGPT(num_classes, layers, _scaled_embed(embed_dim, heads, width), heads, context, mlp_ratio,
                   dropout, tie_weights)


def tiny_vit(num_classes: int, input_shape: Sequence[int], *, width: float = 1.0, norm: str | None = "none",
             layers: int = 3, embed_dim: int = 192, heads: int = 6, patch_size: int = 4, mlp_ratio: float = 4.0,
             dropout: float = 0.0, pool: str = "cls") -> TinyViT:
    """:class:`TinyViT` with the registry's signature; ``input_shape = (C, H, W)`` with ``H == W``."""
    _check_norm_none(norm)
    shape = tuple(input_shape)
    if len(shape) != 3 or shape[1] != shape[2]:
        raise ValueError(f"tiny_vit needs input_shape=(C, H, H), got {shape}")
    return TinyViT(num_classes, shape[1], patch_size, shape[0], layers, _scaled_embed(embed_dim, heads, width),
                   heads, mlp_ratio, dropout, pool)


# ------------------------------------------------------------------------------------------------
# finetuning: freezing, LoRA, pretrained weights, loss
# ------------------------------------------------------------------------------------------------
def transformer_blocks(model: nn.Module) -> nn.ModuleList:
    """The blocks of a tiny transformer (``model.blocks``); ``TypeError`` for other models."""
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.ModuleList) or not all(hasattr(model, a) for a in ("norm", "head")):
        raise TypeError(f"expected a tiny transformer with .blocks, .norm and .head, got {type(model).__name__}")
    return blocks


def _check_untied(model: nn.Module, what: str) -> None:
    if getattr(model, "tie_weights", False):
        raise ValueError(f"{what} needs an untied head (tie_weights=False): it freezes the token embedding but "
                         f"trains the head, which tie_weights=True makes one matrix")


def freeze_for_finetuning(model: nn.Module, trainable_last_layers: int) -> nn.Module:
    """Make ``model`` CAFF's ``F_l^t``: only the last ``t = trainable_last_layers`` blocks, the final LayerNorm
    and the head require grad; embeddings and the first ``l − t`` blocks are frozen. ``t = 0`` trains the
    head and final LayerNorm only. In place; returns ``model``."""
    blocks = transformer_blocks(model)
    _check_untied(model, "freeze_for_finetuning")
    num = len(blocks)
    if isinstance(trainable_last_layers, bool) or not isinstance(trainable_last_layers, int) \
            or not 0 <= trainable_last_layers <= num:
        raise ValueError(f"trainable_last_layers must be an int in [0, {num}] (the model has {num} blocks), "
                         f"got {trainable_last_layers!r}")
    model.requires_grad_(False)
    for block in blocks[num - trainable_last_layers:]:
        block.requires_grad_(True)
    model.norm.requires_grad_(True)
    model.head.requires_grad_(True)
    return model


def trained_block_indices(num_layers: int, trainable_last_layers: int) -> list[int]:
    """Indices of the blocks ``F_l^t`` trains: ``[l − t, …, l − 1]``."""
    return list(range(num_layers - trainable_last_layers, num_layers))


def trainable_parameter_names(model: nn.Module) -> list[str]:
    """Names (as in ``state_dict``) of the parameters that require grad."""
    return [name for name, p in model.named_parameters() if p.requires_grad]


class LoRALinear(nn.Linear):
    """A linear map with a LoRA adapter: ``W x + b + (alpha / rank) · B (A x)``.

    ``weight`` / ``bias`` keep their names (a pretrained state dict loads unchanged); ``lora_A`` (rank × in)
    is Kaiming-uniform initialised and ``lora_B`` (out × rank) zero, so the adapter starts as the identity
    change (Hu et al., ICLR 2022).
    """

    def __init__(self, in_features: int, out_features: int, rank: int, alpha: float | None = None,
                 bias: bool = True) -> None:
        super().__init__(in_features, out_features, bias=bias)
        _check_positive_int("rank", rank)
        self.rank = rank
        self.scaling = float(rank if alpha is None else alpha) / rank
        self.lora_A = nn.Parameter(torch.empty(rank, in_features))
        self.lora_B = nn.Parameter(torch.zeros(out_features, rank))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))

    @classmethod
    def from_linear(cls, linear: nn.Linear, rank: int, alpha: float | None = None) -> "LoRALinear":
        """A LoRA layer holding (copies of) ``linear``'s weight and bias."""
        layer = cls(linear.in_features, linear.out_features, rank, alpha, bias=linear.bias is not None)
        layer.to(device=linear.weight.device, dtype=linear.weight.dtype)
        with torch.no_grad():
            layer.weight.copy_(linear.weight)
            if linear.bias is not None:
                layer.bias.copy_(linear.bias)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias) + F.linear(F.linear(x, self.lora_A), self.lora_B) * self.scaling

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rank={self.rank}, scaling={self.scaling:g}"


def add_lora(model: nn.Module, rank: int, targets: Iterable[str] = LORA_TARGETS,
             alpha: float | None = None) -> nn.Module:
    """Replace the ``targets`` linear maps of every block by :class:`LoRALinear` and set what trains: the LoRA
    ``A``/``B`` matrices, every LayerNorm and the head; everything else (base weights and biases, embeddings)
    is frozen. In place; returns ``model``. ``targets`` ⊆ :data:`LORA_TARGETS`."""
    blocks = transformer_blocks(model)
    _check_untied(model, "add_lora")
    _check_positive_int("rank", rank)
    targets = tuple(targets)
    unknown = sorted(set(targets) - set(LORA_TARGETS))
    if unknown or not targets:
        raise ValueError(f"targets must be a non-empty subset of {LORA_TARGETS}, got {targets!r}")
    for block in blocks:
        for parent in (block.attn, block.mlp):
            for name in targets:
                child = getattr(parent, name, None)
                if isinstance(child, nn.Linear) and not isinstance(child, LoRALinear):
                    setattr(parent, name, LoRALinear.from_linear(child, rank, alpha))
    model.requires_grad_(False)
    for module in model.modules():
        if isinstance(module, LoRALinear):
            module.lora_A.requires_grad_(True)
            module.lora_B.requires_grad_(True)
        elif isinstance(module, nn.LayerNorm):
            module.requires_grad_(True)
    model.head.requires_grad_(True)
    return model


def load_pretrained(model: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> list[str]:
    """Load pretrained weights into ``model``; returns the names that were *not* loaded.

    Rules: a position embedding longer than the model's is cut to its leading rows; the head (``head.*``) is
    skipped when its shape differs (a new task's classes: it keeps its initialisation and is trained anyway);
    entries the model does not have (e.g. ``lora_*`` of an adapted model, or vice versa) are listed and
    skipped. Any other missing or mis-shaped tensor raises ``ValueError``.
    """
    own = model.state_dict()
    skipped, load = [], {}
    for name, target in own.items():
        if name not in state_dict:
            if ".lora_" in name:
                skipped.append(name)
                continue
            raise ValueError(f"the pretrained state dict lacks {name!r}; is it a model of another depth or kind?")
        value = state_dict[name]
        if value.shape == target.shape:
            load[name] = value
        elif name in ("position_embedding.weight", "pos_embedding") and value.dim() == target.dim() \
                and value.shape[-1] == target.shape[-1] and value.shape[-2] >= target.shape[-2]:
            load[name] = value[..., : target.shape[-2], :]
        elif name.startswith("head."):
            skipped.append(name)
        else:
            raise ValueError(f"pretrained {name!r} has shape {tuple(value.shape)}, the model {tuple(target.shape)}")
    skipped.extend(sorted(set(state_dict) - set(own)))
    model.load_state_dict({**own, **load})
    return skipped


def embed_inputs(model: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    """The sequence a tiny transformer feeds its first block — the part of its ``forward`` before the blocks.

    :class:`TinyGPT`: token embedding + position embedding, ``(B, T, E)``; :class:`TinyViT`: patch embeddings, the
    class token (``pool="cls"``) and the position embedding, ``(B, [1 +] P, E)``. ``model`` is any module with the
    attributes of one of them (``token_embedding``, ``position_embedding``, ``context_length``; or
    ``patch_embedding``, ``cls_token``, ``pos_embedding``, ``image_size``), e.g. a truncated copy of one.
    """
    if hasattr(model, "token_embedding"):
        if inputs.dim() != 2:
            raise ValueError(f"a language model expects token ids of shape (B, T), got {tuple(inputs.shape)}")
        t = inputs.shape[1]
        if t > model.context_length:
            raise ValueError(f"input length {t} exceeds context_length={model.context_length}")
        return model.token_embedding(inputs) + model.position_embedding(torch.arange(t, device=inputs.device))
    if hasattr(model, "patch_embedding"):
        size = model.image_size
        if inputs.dim() != 4 or inputs.shape[-1] != size or inputs.shape[-2] != size:
            raise ValueError(f"a ViT expects images (B, C, {size}, {size}), got {tuple(inputs.shape)}")
        x = model.patch_embedding(inputs).flatten(2).transpose(1, 2)
        if getattr(model, "cls_token", None) is not None:
            x = torch.cat([model.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        return x + model.pos_embedding
    raise TypeError(f"embed_inputs knows TinyGPT and TinyViT (or modules with their embeddings), "
                    f"got {type(model).__name__}")


def read_out(model: nn.Module, hidden: torch.Tensor, norm: nn.Module, head: nn.Module) -> torch.Tensor:
    """``head(norm(hidden))`` pooled as ``model``'s ``forward`` pools: every position of a language model
    (``(B, T, V)``), the class token or the mean token of a ViT (``model.pool``; ``(B, classes)``). With
    ``model.norm`` / ``model.head`` after the last block this is ``model``'s output; with other heads, an early exit."""
    x = norm(hidden)
    if hasattr(model, "token_embedding"):
        return head(x)
    return head(x[:, 0] if getattr(model, "pool", "cls") == "cls" else x.mean(dim=1))


def sequence_targets(tokens: torch.Tensor, next_token: torch.Tensor) -> torch.Tensor:
    """The target of every position of a window: ``tokens[:, 1:]`` followed by ``next_token``."""
    return torch.cat([tokens[:, 1:], next_token.reshape(-1, 1).to(tokens.dtype)], dim=1)


def causal_lm_loss(logits: torch.Tensor, tokens: torch.Tensor, next_token: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over all ``B·T`` positions of logits ``(B, T, V)``: position ``i``
    predicts ``tokens[:, i + 1]`` and the last position predicts ``next_token``."""
    targets = sequence_targets(tokens, next_token)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


__all__ = ["Attention", "Block", "EMBEDDING_NAMES", "LAYER_DEPTHS", "LORA_TARGETS", "LoRALinear", "MLP", "TinyGPT",
           "TinyViT", "add_lora", "causal_lm_loss", "embed_inputs", "freeze_for_finetuning", "load_pretrained",
           "read_out", "sequence_targets", "tiny_gpt", "tiny_vit", "trainable_parameter_names", "trained_block_indices",
           "transformer_blocks"]
