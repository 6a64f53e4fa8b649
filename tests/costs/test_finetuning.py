"""Resources of finetuning configurations F_l^t and LoRA (subfl.costs.finetuning), against hand counts."""
from __future__ import annotations

import pytest
import torch
from torch.utils import flop_counter

from subfl.costs.finetuning import (GFLOP, MB, TABLE_COLUMNS, cpu_attention_flop_formulas, example_batch,
                                    finetuning_cost, resource_table)
from subfl.models.transformers import TinyGPT, TinyViT

B, T, E, H, V = 4, 32, 96, 3, 128




def _gpt(layers: int) -> TinyGPT:
    torch.manual_seed(0)
    return TinyGPT(V, num_layers=layers, embed_dim=E, num_heads=H, context_length=T)


def hand_activation_bytes(t: int) -> int:
    """float32 tensors autograd keeps for one pre-LN block (t = 1) and the head + loss, by hand.

    Block: LN1 input (BTE) + mean/rstd (2·BT); q/k/v input = LN1 output (BTE, one tensor for the three maps);
    attention q, k, v, output (4·BTE) + log-sum-exp (BHT) — proj reads a view of the output; LN2 input (BTE) +
    2·BT; fc1 input (BTE); GELU input (4·BTE); fc2 input (4·BTE): 16·BTE + 4·BT + BHT.
    Head: final-LN input (BTE) + 2·BT, head input (BTE), log-softmax of the logits (BTV); int64 targets (BT)
    and the scalar loss.
    """
    floats = t * (16 * B * T * E + 4 * B * T + B * H * T) + 2 * B * T * E + 2 * B * T + B * T * V
    return 4 * floats + 8 * B * T + 4


def hand_flops(t: int) -> tuple[int, int]:
    """Forward: linears 2·BT·12E², attention (QKᵀ, AV, dense) 4·BT²E, head 2·BTEV. Backward of a trained block:
    weight + input gradients of its linears (2× forward) and PyTorch's SDPA backward (5 products, 10·BT²E); the
    head computes its weight gradient and — the final LayerNorm is trained — its input gradient."""
    forward = 24 * B * T * E * E + 4 * B * T * T * E + 2 * B * T * E * V
    backward = t * (48 * B * T * E * E + 10 * B * T * T * E) + 4 * B * T * E * V
    return forward, backward


@pytest.mark.parametrize("t", [1, 0])
def test_one_layer_model_matches_hand_count(t):
    model = _gpt(1)
    cost = finetuning_cost(model, example_batch(model, B), trainable_last_layers=t)
    params = V * E + T * E + (12 * E * E + 13 * E) + 2 * E + E * V
    trainable = t * (12 * E * E + 13 * E) + 2 * E + E * V
    assert cost["params"] == params and cost["trainable_params"] == trainable
    assert cost["weights"] == 4 * params
    assert cost["gradients"] == cost["upload"] == 4 * trainable
    assert cost["optimizer"] == 2 * 4 * trainable  # AdamW: two moments
    assert cost["activations"] == pytest.approx(hand_activation_bytes(t), rel=0.10)
    assert cost["memory"] == cost["weights"] + cost["gradients"] + cost["optimizer"] + cost["activations"]
    forward, backward = hand_flops(t)
    assert cost["forward_flops"] == pytest.approx(forward, rel=0.10)
    assert cost["backward_flops"] == pytest.approx(backward, rel=0.10)


def test_frozen_prefix_saves_nothing_for_backward():
    """F_3^1 keeps exactly the activations of F_1^1: the two frozen blocks before it save nothing."""
    deep, shallow = _gpt(3), _gpt(1)
    x = example_batch(deep, B)
    deep_cost = finetuning_cost(deep, x, trainable_last_layers=1)
    assert deep_cost["activations"] == finetuning_cost(shallow, x, trainable_last_layers=1)["activations"]
    forward, _ = hand_flops(1)
    per_block = 24 * B * T * E * E + 4 * B * T * T * E
    assert deep_cost["forward_flops"] == pytest.approx(forward + 2 * per_block, rel=0.10)  # frozen blocks run


def test_costs_grow_with_trained_layers_and_lora_keeps_every_activation():
    model = _gpt(3)
    table = resource_table({3: model}, example_batch(model, B), lora_ranks=(8, 2))
    assert list(table.columns) == list(TABLE_COLUMNS)
    freeze = table[table.scheme == "freeze"].set_index("trained")
    assert list(freeze.index) == [1, 2, 3]
    for column in ("activations_mb", "memory_mb", "upload_mb", "gflops"):
        assert freeze[column].is_monotonic_increasing and freeze[column].iloc[0] < freeze[column].iloc[-1]
    lora = table[table.scheme == "lora"].set_index("rank")
    # adapters sit in every block, so every block's input activations are kept: at least full training's
    assert (lora["activations_mb"] >= freeze.loc[3, "activations_mb"]).all()
    assert (lora["activations_mb"] > 1.5 * freeze.loc[1, "activations_mb"]).all()
    assert lora.loc[8, "upload_mb"] > lora.loc[2, "upload_mb"]
    row = freeze.loc[2]
    assert row.memory_mb == pytest.approx(row.weights_mb + row.gradients_mb + row.optimizer_mb + row.activations_mb)
    assert row.gflops == pytest.approx(row.forward_gflops + row.backward_gflops)
    cost = finetuning_cost(model, example_batch(model, B), trainable_last_layers=2)
    assert row.memory_mb == pytest.approx(cost["memory"] / MB) and row.gflops == pytest.approx(cost["flops"] / GFLOP)


def test_resource_table_with_batch_size_and_vit():
    torch.manual_seed(0)
    vit = TinyViT(5, image_size=8, patch_size=4, num_layers=2, embed_dim=12, num_heads=3)
    table = resource_table([vit], 3, trained_layers=[2])
    assert len(table) == 1 and table.layers.iloc[0] == 2 and table.trained.iloc[0] == 2
    assert table.activations_mb.iloc[0] > 0 and table.gflops.iloc[0] > 0
    assert example_batch(vit, 3).shape == (3, 3, 8, 8)
    assert example_batch(_gpt(1), 2).shape == (2, T)


def test_attention_formulas_are_registered_only_inside_the_block():
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    before = op in flop_counter.flop_registry
    with cpu_attention_flop_formulas():
        assert op in flop_counter.flop_registry
    assert (op in flop_counter.flop_registry) == before


def test_finetuning_cost_checks_arguments():
    model = _gpt(1)
    x = example_batch(model, 2)
    with pytest.raises(ValueError, match="exactly one"):
        finetuning_cost(model, x)
    with pytest.raises(ValueError, match="exactly one"):
        finetuning_cost(model, x, trainable_last_layers=1, lora_rank=2)
    before = [p.requires_grad for p in model.parameters()]
    finetuning_cost(model, x, lora_rank=2)
    assert [p.requires_grad for p in model.parameters()] == before and not hasattr(model.blocks[0].attn.q, "lora_A")
