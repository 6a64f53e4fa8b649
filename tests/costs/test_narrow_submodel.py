"""PriSM's narrowed memory-efficient sub-model (Table 1's PriSM block): hand counts, ResNet-18 totals, memory."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from subfl.costs import count_parameters, forward_flops, saved_tensor_breakdown
from subfl.costs.narrow_submodel import (
    NARROW_COLUMNS,
    NarrowFactorizedConv2d,
    decomposed_parameters,
    dense_decomposed_parameters,
    narrow_analytic_costs,
    narrow_cost_table,
    narrow_ranks,
    narrow_submodel,
    narrow_submodel_costs,
)
from subfl.models import build_model

# ResNet-18 (CIFAR stem, width 1, 10 classes): output channels N of the 16 decomposed 3×3 convolutions, per stage
STAGES = (64, 128, 256, 512)
SUM_DENSE_3X3 = 10_985_472          # Σ N·C·9 over the 16 block convolutions
SUM_N_SQUARED = 4 * sum(n * n for n in STAGES)   # Σ N² over the same 16 layers: 1,392,640


@pytest.fixture(scope="module")
def resnet() -> nn.Module:
    torch.manual_seed(0)
    return build_model("resnet18", num_classes=10, input_shape=(3, 32, 32))


def test_one_layer_hand_count_of_parameters_macs_and_saved_tensors():
    """Conv_V 13 → 26 (3×3, stride 2) then Conv_U 26 → 26: 26·(13·9 + 26) = 3718 weights; on an 8×8 input the
    output is 4×4, so 16·3718 = 59,488 MACs per sample; one training forward keeps the two convolution inputs,
    2·(13·64 + 26·16)·4 = 9,984 bytes for a batch of 2."""
    layer = NarrowFactorizedConv2d(13, 26, 3, stride=2, padding=1)
    x = torch.randn(2, 13, 8, 8)
    assert layer.rank == 26
    assert count_parameters(layer) == 26 * (13 * 9 + 26) == 3718
    assert forward_flops(layer, x) == 2 * 2 * 16 * 3718          # 2 FLOPs per MAC, 2 samples
    assert layer(x).shape == (2, 26, 4, 4)
    saved = saved_tensor_breakdown(layer, x)
    assert sum(row.bytes for row in saved) == 4 * 2 * (13 * 64 + 26 * 16) == 9984


def test_ranks_are_keep_ratio_times_outputs_rounded_up(resnet):
    """Sec. 4.2's r = 0.x·N per layer: at 0.2 the stages keep 13, 26, 52 and 103 channels (12.8, 25.6, 51.2,
    102.4 rounded up); both layers of a stage (and its shortcut) keep the same number."""
    ranks = narrow_ranks(resnet, 0.2)
    assert ranks["conv1"] == 13
    for stage, expected in zip(("layer1", "layer2", "layer3", "layer4"), (13, 26, 52, 103)):
        assert {v for k, v in ranks.items() if k.startswith(stage)} == {expected}


def test_resnet18_sub_model_at_0_2_by_hand(resnet):
    """Decomposed layers at 0.2 with r = 13/26/52/103: layer1 4·13·(13·9+13) = 6,760; layer2 26·(13·9+26) +
    3·26·(26·9+26) = 23,998; layer3 52·(26·9+52) + 3·52·(52·9+52) = 95,992; layer4 103·(52·9+103) +
    3·103·(103·9+103) = 377,083; in all 503,833 (PriSM Table 1 prints 0.5 M). Every layer: 514,210."""
    sub = narrow_submodel(resnet, 0.2)
    assert decomposed_parameters(sub) == 6_760 + 23_998 + 95_992 + 377_083 == 503_833
    assert count_parameters(sub) == 514_210
    assert sub(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    assert count_parameters(resnet) == 11_173_962 and dense_decomposed_parameters(resnet) == SUM_DENSE_3X3


@pytest.mark.parametrize("keep_ratio, params, decomposed, macs", [
    (0.8, 8_069_338, 7_945_603, 403_818_820),
    (0.6, 4_553_472, 4_481_256, 227_405_064),
    (0.4, 2_027_370, 1_992_925, 102_028_818),
    (0.2, 514_210, 503_833, 25_861_750),
])
def test_resnet18_totals_measured_on_meta_equal_the_analytic_counts(resnet, keep_ratio, params, decomposed, macs):
    """Parameters and per-sample MACs (32×32 inputs) of the sub-model built on the meta device, from
    torch.utils.flop_counter, equal the formulas of narrow_analytic_costs."""
    sub = narrow_submodel(resnet, keep_ratio, device="meta")
    flops = forward_flops(sub, torch.zeros(2, 3, 32, 32, device="meta"))
    assert (count_parameters(sub), decomposed_parameters(sub), flops // 4) == (params, decomposed, macs)
    analytic = narrow_analytic_costs(keep_ratio)
    assert (analytic["params"], analytic["params_decomposed"], analytic["macs"]) == (params, decomposed, macs)


def test_unrounded_ranks_reproduce_table1_parameter_column():
    """With r = p·N unrounded, the decomposed layers hold p²·(Σ N·C·9 + Σ N²): 0.04·12,378,112 = 495,124.48 at
    0.2 (Table 1: 0.5 M, 4.5 % of the 10.99 M the dense model's decomposed layers hold) and 7.92 M at 0.8 (7.9 M,
    72 %)."""
    dense = narrow_analytic_costs(None, rounding="none")["params_decomposed"]
    assert dense == SUM_DENSE_3X3
    for p, paper_m, paper_pct in ((0.8, 7.9, 72), (0.6, 4.5, 41), (0.4, 2.0, 18), (0.2, 0.5, 4.5)):
        got = narrow_analytic_costs(p, rounding="none")["params_decomposed"]
        assert got == pytest.approx(p * p * (SUM_DENSE_3X3 + SUM_N_SQUARED))
        assert abs(got / 1e6 - paper_m) <= 0.05
        assert abs(100 * got / dense - paper_pct) <= (0.05 if paper_pct == 4.5 else 0.5)
    assert narrow_analytic_costs(0.2, rounding="none")["params_decomposed"] == pytest.approx(495_124.48)


def test_activation_memory_shrinks_with_the_keep_ratio():
    """Narrow width-0.25 ResNet-18, batch 2: the sub-model keeps less for the backward pass than the dense model
    at 0.2 (below 0.4×) and more at 0.8 than at 0.2; measured = analytic parameters and MACs at that width."""
    table = narrow_cost_table((0.8, 0.2), 2, width=0.25)
    assert list(table.columns) == list(NARROW_COLUMNS)
    by = table.set_index("model")
    assert by.loc["narrow 0.2×", "activations_ratio"] < 0.4
    assert by.loc["narrow 0.8×", "activations_mb"] > by.loc["narrow 0.2×", "activations_mb"]
    for r in (0.8, 0.2):
        analytic = narrow_analytic_costs(r, width=0.25)
        assert by.loc[f"narrow {r:g}×", "params"] == analytic["params"]
        assert by.loc[f"narrow {r:g}×", "macs"] == analytic["macs"]


def test_costs_of_a_batch_and_argument_checks(resnet):
    sub = narrow_submodel(resnet, 0.4)
    costs = narrow_submodel_costs(sub, torch.randn(2, 3, 32, 32), activations=False)
    assert costs["macs"] == 102_028_818 and costs["activation_bytes"] is None
    with pytest.raises(ValueError):
        narrow_submodel(resnet, 0.0)
    with pytest.raises(ValueError):
        narrow_analytic_costs(0.2, rounding="floor")
    with pytest.raises(TypeError):
        narrow_submodel(nn.Sequential(nn.Conv2d(3, 4, 3)), 0.5)
    with pytest.raises(ValueError):
        narrow_submodel_costs(sub, torch.zeros(()))
