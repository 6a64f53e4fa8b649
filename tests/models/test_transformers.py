"""Tiny transformers of CAFF (subfl.models.transformers): shapes, causality, freezing, LoRA, pretrained loading."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from subfl.models.transformers import (LAYER_DEPTHS, LORA_TARGETS, LoRALinear, TinyGPT, TinyViT, add_lora,
                                       causal_lm_loss, freeze_for_finetuning, load_pretrained, sequence_targets,
                                       tiny_gpt, tiny_vit, trainable_parameter_names, trained_block_indices)




def _gpt(layers=2, vocab=50, embed=12, heads=3, context=16, **kw) -> TinyGPT:
    torch.manual_seed(0)
    return TinyGPT(vocab, num_layers=layers, embed_dim=embed, num_heads=heads, context_length=context, **kw)


def _vit(layers=2, classes=5, embed=12, heads=3, **kw) -> TinyViT:
    torch.manual_seed(0)
    return TinyViT(classes, image_size=8, patch_size=4, num_layers=layers, embed_dim=embed, num_heads=heads, **kw)


def block_params(e: int) -> int:
    """Hand count of one pre-LN block: 2 LayerNorms (4E), q/k/v/proj (4E² + 4E), fc1 (4E² + 4E), fc2 (4E² + E)."""
    return 12 * e * e + 13 * e


# ----- architecture ---------------------------------------------------------------------------------------
def test_gpt_output_shape_and_parameter_count():
    v, e, t, l = 50, 12, 16, 2
    model = _gpt(layers=l, vocab=v, embed=e, context=t)
    out = model(torch.randint(v, (3, 10)))
    assert out.shape == (3, 10, v)
    expected = v * e + t * e + l * block_params(e) + 2 * e + e * v  # embeddings, blocks, final LN, untied head
    assert sum(p.numel() for p in model.parameters()) == expected
    assert model.num_layers == l and len(list(model.buffers())) == 0


def test_paper_sizes():
    assert LAYER_DEPTHS == (3, 6, 9, 12)
    gpt = tiny_gpt(2048, (256,), layers=3)
    assert gpt.token_embedding.weight.shape == (2048, 96) and gpt.position_embedding.weight.shape == (256, 96)
    assert gpt.blocks[0].attn.num_heads == 3 and gpt.blocks[0].mlp.fc1.out_features == 384
    assert sum(p.numel() for p in gpt.blocks[0].parameters()) == block_params(96) == 111_840
    vit = tiny_vit(10, (3, 32, 32), layers=6)
    assert vit.num_layers == 6 and vit.pos_embedding.shape == (1, 65, 192) and vit.blocks[0].attn.num_heads == 6
    assert vit(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_gpt_is_causal():
    model = _gpt().eval()
    x = torch.randint(50, (2, 12))
    y = x.clone()
    y[:, 7] = (y[:, 7] + 1) % 50
    a, b = model(x), model(y)
    assert torch.allclose(a[:, :7], b[:, :7], atol=1e-6)
    assert not torch.allclose(a[:, 7:], b[:, 7:])


def test_gpt_rejects_long_inputs():
    with pytest.raises(ValueError, match="context_length=16"):
        _gpt()(torch.zeros(1, 17, dtype=torch.long))


@pytest.mark.parametrize("pool", ["cls", "mean"])
def test_vit_shapes(pool):
    model = _vit(pool=pool)
    assert model(torch.randn(4, 3, 8, 8)).shape == (4, 5)
    assert (model.cls_token is not None) == (pool == "cls")
    assert model.pos_embedding.shape[1] == 4 + (pool == "cls")


def test_builders_check_arguments():
    with pytest.raises(ValueError, match="norm='bn'"):
        tiny_gpt(10, (8,), norm="bn")
    with pytest.raises(ValueError, match="vocab_size=11 differs"):
        tiny_gpt(10, (8,), vocab_size=11)
    assert tiny_gpt(10, (300,)).context_length == 300
    assert tiny_gpt(10, (8,), width=0.5).token_embedding.weight.shape[1] == 48  # 3 heads × 16
    with pytest.raises(ValueError, match="input_shape"):
        tiny_vit(10, (3, 32, 16))


# ----- freezing ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("t", [0, 1, 3])
def test_freeze_trains_last_blocks_norm_and_head(t):
    model = freeze_for_finetuning(_gpt(layers=3), t)
    names = trainable_parameter_names(model)
    blocks = {int(n.split(".")[1]) for n in names if n.startswith("blocks.")}
    assert blocks == set(trained_block_indices(3, t)) == set(range(3 - t, 3))
    assert {"norm.weight", "norm.bias", "head.weight"} <= set(names)
    assert not any(n.startswith(("token_embedding", "position_embedding")) for n in names)


def test_freeze_gradients_reach_only_trained_layers():
    model = freeze_for_finetuning(_gpt(layers=3), 1)
    x = torch.randint(50, (2, 8))
    causal_lm_loss(model(x), x, torch.randint(50, (2,))).backward()
    for name, p in model.named_parameters():
        assert (p.grad is not None) == p.requires_grad, name


def test_freeze_checks_arguments():
    with pytest.raises(ValueError, match=r"\[0, 2\]"):
        freeze_for_finetuning(_gpt(), 3)
    with pytest.raises(ValueError, match="untied head"):
        freeze_for_finetuning(_gpt(tie_weights=True), 1)
    with pytest.raises(TypeError):
        freeze_for_finetuning(torch.nn.Linear(2, 2), 1)


def test_vit_freeze_keeps_patch_embedding_and_tokens_frozen():
    model = freeze_for_finetuning(_vit(layers=2), 1)
    names = set(trainable_parameter_names(model))
    assert not names & {"patch_embedding.weight", "patch_embedding.bias", "cls_token", "pos_embedding"}
    assert {"head.weight", "head.bias", "blocks.1.mlp.fc2.weight"} <= names and "blocks.0.ln1.weight" not in names


# ----- LoRA -------------------------------------------------------------------------------------------------
def test_lora_starts_as_the_base_model_and_trains_adapters_norms_head():
    base = _gpt(layers=2)
    x = torch.randint(50, (2, 8))
    reference = base(x)
    model = add_lora(base, rank=2)
    assert torch.allclose(model(x), reference, atol=1e-6)  # B = 0: no change at initialisation
    names = set(trainable_parameter_names(model))
    lora = {n for n in names if ".lora_" in n}
    assert len(lora) == 2 * len(LORA_TARGETS) * 2  # A and B of 6 maps in 2 blocks
    rest = names - lora
    assert all(".ln" in n or n.startswith(("norm.", "head.")) for n in rest)
    assert "blocks.0.attn.q.weight" not in names and "token_embedding.weight" not in names
    e = 12  # trainable count: r·(in + out) per adapted map, 2 LayerNorms per block, final LN, head
    per_block = 2 * (4 * (e + e) + (e + 4 * e) + (4 * e + e)) + 4 * e
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == 2 * per_block + 2 * e + e * 50


def test_lora_targets_and_state_dict_names():
    model = add_lora(_gpt(layers=1), rank=3, targets=("q", "v"), alpha=6)
    q = model.blocks[0].attn.q
    assert isinstance(q, LoRALinear) and q.scaling == 2.0 and q.lora_A.shape == (3, 12)
    assert not isinstance(model.blocks[0].attn.k, LoRALinear)
    assert "blocks.0.attn.q.weight" in model.state_dict()  # base names unchanged: pretrained weights load
    with pytest.raises(ValueError, match="subset"):
        add_lora(_gpt(layers=1), rank=2, targets=("qkv",))


# ----- pretrained weights, loss -----------------------------------------------------------------------------
def test_load_pretrained_rules():
    source = _gpt(layers=2, context=16).state_dict()
    torch.manual_seed(1)
    target = TinyGPT(50, num_layers=2, embed_dim=12, num_heads=3, context_length=8)
    assert load_pretrained(target, source) == []
    assert torch.equal(target.position_embedding.weight, source["position_embedding.weight"][:8])
    assert torch.equal(target.blocks[1].mlp.fc1.weight, source["blocks.1.mlp.fc1.weight"])
    with pytest.raises(ValueError, match="lacks 'blocks.2"):
        load_pretrained(_gpt(layers=3), source)
    lora = add_lora(_gpt(layers=2), rank=2)
    skipped = load_pretrained(lora, source)
    assert skipped and all(".lora_" in n for n in skipped)


def test_load_pretrained_skips_a_head_of_other_classes():
    source = _vit(classes=5).state_dict()
    target = _vit(classes=3)
    head = target.head.weight.detach().clone()
    assert sorted(load_pretrained(target, source)) == ["head.bias", "head.weight"]
    assert torch.equal(target.head.weight, head)
    assert torch.equal(target.blocks[0].attn.q.weight, source["blocks.0.attn.q.weight"])


def test_causal_lm_loss_uses_every_position():
    tokens = torch.tensor([[1, 2, 3], [4, 5, 6]])
    nxt = torch.tensor([7, 8])
    assert sequence_targets(tokens, nxt).tolist() == [[2, 3, 7], [5, 6, 8]]
    logits = torch.randn(2, 3, 10)
    expected = F.cross_entropy(logits.reshape(6, 10), torch.tensor([2, 3, 7, 5, 6, 8]))
    assert torch.allclose(causal_lm_loss(logits, tokens, nxt), expected)
