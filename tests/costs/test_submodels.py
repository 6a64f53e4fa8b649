"""Spectral sub-model costs (PriSM Table 1): hand-counted parameters and MACs, measured = analytic, monotonicity."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from subfl.costs import count_parameters
from subfl.costs.submodels import (
    PRISM_KEEP_RATIOS,
    TABLE_COLUMNS,
    analytic_costs,
    check_keep_ratio,
    spectral_submodel,
    submodel_cost_table,
    submodel_costs,
    submodel_layers,
    submodel_ranks,
)
from subfl.models import build_model
from subfl.models.factorized import FactorizedConv2d, decompose, layer_specs

INPUT = (1, 5, 5)


def tiny() -> nn.Sequential:
    """Stem Conv(1→2, 3×3) | Conv(2→4, 3×3, no bias) | Conv(4→6, 1×1) | Flatten | Linear(150→3), 5×5 maps.

    Factorized: the two middle convolutions (first and last layers stay dense). Terms: min(4, 2·9) = 4 and
    min(6, 4·1) = 4.
    """
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.Conv2d(2, 4, 3, padding=1, bias=False),
                         nn.Conv2d(4, 6, 1), nn.Flatten(), nn.Linear(150, 3))


# hand counts (25 output positions per sample in every convolution)
DENSE_PARAMS = (2 * 9 + 2) + (4 * 2 * 9) + (6 * 4 + 6) + (150 * 3 + 3)          # 20 + 72 + 30 + 453 = 575
DENSE_MACS = 25 * 2 * 9 + 25 * 4 * 18 + 25 * 6 * 4 + 150 * 3                     # 450 + 1800 + 600 + 450 = 3300


def factorized_params(n1: int, n2: int) -> int:
    """Conv 2→4 3×3 with n1 terms: n1·(2·9 + 4); conv 4→6 1×1 with n2 terms: n2·(4 + 6) + 6 (bias)."""
    return 20 + n1 * (18 + 4) + n2 * (4 + 6) + 6 + 453


def factorized_macs(n1: int, n2: int) -> int:
    return 450 + 25 * n1 * (18 + 4) + 25 * n2 * (4 + 6) + 450


def test_hand_counts_agree_with_torch_on_the_dense_and_the_factorized_model():
    """The hand counts above, checked against torch itself: the parameters of the built modules and the FLOPs
    ``torch.utils.flop_counter`` measures (2 per multiply-accumulate; biases are not counted as FLOPs)."""
    from torch.utils.flop_counter import FlopCounterMode

    def measured(model: nn.Module) -> tuple[int, int]:
        with FlopCounterMode(display=False) as counter:
            model(torch.zeros(1, *INPUT))
        return sum(p.numel() for p in model.parameters()), counter.get_total_flops()

    assert measured(tiny()) == (DENSE_PARAMS, 2 * DENSE_MACS) == (575, 6600)
    full = spectral_submodel(tiny(), 1.0)  # every term of both decomposed layers kept
    assert measured(full) == (factorized_params(4, 4), 2 * factorized_macs(4, 4)) == (607, 8200)


def test_layers_and_ranks():
    model = tiny()
    assert submodel_layers(model) == ["1", "2"]
    assert submodel_layers(model, pointwise=False) == ["1"]
    assert submodel_ranks(model, 0.5) == {"1": 2, "2": 2}
    assert submodel_ranks(model, 0.3) == {"1": 2, "2": 2}      # ⌈0.3·4⌉ = 2
    assert submodel_ranks(model, 0.2) == {"1": 1, "2": 1}      # ⌈0.8⌉ = 1
    assert submodel_ranks(model, 1.0) == {"1": 4, "2": 4}
    assert submodel_ranks(model, 0.5, pointwise=False) == {"1": 2}


def test_factorized_conv_parameters_n_times_cin_k2_plus_cout():
    sub = spectral_submodel(tiny(), 0.5)
    layer = sub.get_submodule("1")
    assert isinstance(layer, FactorizedConv2d)
    assert tuple(layer.v.shape) == (2, 2, 3, 3) and tuple(layer.u.shape) == (4, 2)
    assert count_parameters(layer) == 2 * (2 * 3 * 3 + 4) == 44
    assert count_parameters(sub.get_submodule("2")) == 2 * (4 + 6) + 6
    assert count_parameters(sub) == factorized_params(2, 2)


def test_analytic_costs_by_hand():
    model = tiny()
    assert analytic_costs(model, input_shape=INPUT) == {"params": 575, "macs": 3300, "terms": 0, "total_terms": 8}
    half = analytic_costs(model, 0.5, input_shape=INPUT)
    assert (half["params"], half["macs"], half["terms"]) == (factorized_params(2, 2), factorized_macs(2, 2), 4)
    full = analytic_costs(model, 1.0, input_shape=INPUT)
    assert (full["params"], full["macs"]) == (factorized_params(4, 4), factorized_macs(4, 4))
    dense_pointwise = analytic_costs(model, 0.5, pointwise=False, input_shape=INPUT)
    assert (dense_pointwise["params"], dense_pointwise["macs"]) == (20 + 44 + 30 + 453, 450 + 1100 + 600 + 450)


@pytest.mark.parametrize("ratio", [None, 0.2, 0.5, 1.0])
def test_measured_equals_analytic_on_the_tiny_model(ratio):
    model = tiny()
    module = model if ratio is None else spectral_submodel(model, ratio)
    measured = submodel_costs(module, torch.randn(3, *INPUT), activations=False)
    analytic = analytic_costs(model, ratio, input_shape=INPUT)
    assert (measured["params"], measured["macs"]) == (analytic["params"], analytic["macs"])
    assert measured["activation_bytes"] is None


def test_keep_ratio_one_is_the_factorized_full_model():
    model = tiny().eval()
    sub = spectral_submodel(model, 1.0).eval()
    specs = layer_specs(model)
    assert {name: m.rank for name, m in sub.named_modules() if isinstance(m, FactorizedConv2d)} == {
        name: spec.num_terms for name, spec in specs.items()}
    x = torch.randn(4, *INPUT)
    with torch.no_grad():
        assert torch.allclose(sub(x), model(x), atol=1e-5)
    assert count_parameters(sub) == analytic_costs(model, 1.0, input_shape=INPUT)["params"]


def test_submodel_holds_the_top_terms_and_leaves_the_model_alone():
    model = tiny()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    factors = decompose(model)
    sub = spectral_submodel(model, 0.5, factors=factors)
    layer = sub.get_submodule("1")
    assert torch.equal(layer.u, factors["1"].u[:, :2])
    assert torch.equal(layer.v.reshape(2, -1), factors["1"].v[:2])
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    zeros = spectral_submodel(model, 0.5, with_weights=False)
    assert count_parameters(zeros) == count_parameters(sub) and not zeros.get_submodule("1").u.detach().any()


def test_resnet18_parameter_counts_by_hand():
    """Full-width CIFAR ResNet-18: 16 factorized 3×3 convolutions and 3 factorized 1×1 shortcuts."""
    convs = ([(64, 64, 3)] * 4 + [(64, 128, 3)] + [(128, 128, 3)] * 3 + [(64, 128, 1)]
             + [(128, 256, 3)] + [(256, 256, 3)] * 3 + [(128, 256, 1)]
             + [(256, 512, 3)] + [(512, 512, 3)] * 3 + [(256, 512, 1)])

    def extra(ratio: float, pointwise: bool = True) -> int:
        total = 0
        for c, n, k in convs:
            if k == 1 and not pointwise:
                continue
            terms = math.ceil(ratio * min(n, c * k * k) - 1e-9)
            total += terms * (c * k * k + n) - n * c * k * k
        return total

    model = build_model("resnet18", num_classes=10, input_shape=(3, 32, 32))
    assert len(submodel_layers(model)) == 19 and len(submodel_layers(model, pointwise=False)) == 16
    assert analytic_costs(model)["params"] == 11_173_962
    for ratio in (1.0, *PRISM_KEEP_RATIOS):
        assert analytic_costs(model, ratio)["params"] == 11_173_962 + extra(ratio)
        assert analytic_costs(model, ratio, pointwise=False)["params"] == 11_173_962 + extra(ratio, False)
    assert analytic_costs(model, 1.0)["params"] == 12_652_618
    assert analytic_costs(model, 0.2)["params"] == 2_565_002


def test_table_is_monotone_in_keep_ratio_and_measured_matches_analytic():
    table = submodel_cost_table((0.8, 0.5, 0.2), batch_size=2, width=0.125, input_shape=(3, 16, 16))
    assert list(table.columns) == list(TABLE_COLUMNS)
    assert list(table.model) == ["dense", "factorized", "sub-model 0.8×", "sub-model 0.5×", "sub-model 0.2×"]
    assert (table.params == table.params_analytic).all() and (table.macs == table.macs_analytic).all()
    factorized = table.iloc[1:]  # keep ratios 1, 0.8, 0.5, 0.2
    for column in ("terms", "params", "macs", "activations_mb"):
        values = factorized[column].astype(float).tolist()
        assert all(a > b for a, b in zip(values, values[1:])), column
    assert table.params_ratio.iloc[0] == 1.0 and table.activations_ratio.iloc[0] == 1.0
    assert table.params.iloc[1] > table.params.iloc[0]  # all terms cost more than the dense layer
    analytic_only = submodel_cost_table((0.5,), width=0.125, input_shape=(3, 16, 16), measure=False)
    assert analytic_only.params.isna().all() and analytic_only.activations_mb.isna().all()
    assert analytic_only.params_analytic.tolist() == table.params_analytic.iloc[[0, 1, 3]].tolist()


def test_model_by_name():
    sub = spectral_submodel("resnet18", 0.2, width=0.125, with_weights=False)
    assert count_parameters(sub) == analytic_costs("resnet18", 0.2, width=0.125)["params"]
    with pytest.raises(ValueError, match="name"):
        spectral_submodel("resnet99", 0.2)
    with pytest.raises(TypeError, match="model"):
        spectral_submodel(42, 0.2)


@pytest.mark.parametrize("bad", [0, 0.0, -0.1, 1.5, float("nan"), True, "0.5", None])
def test_bad_keep_ratio_names_the_parameter(bad):
    with pytest.raises(ValueError, match="keep_ratio"):
        check_keep_ratio(bad)
    with pytest.raises(ValueError, match="keep_ratio"):
        spectral_submodel(tiny(), bad)
    with pytest.raises(ValueError, match="keep_ratio"):
        submodel_ranks(tiny(), bad)
    if bad is not None:  # None asks analytic_costs for the dense model
        with pytest.raises(ValueError, match="keep_ratio"):
            analytic_costs(tiny(), bad, input_shape=INPUT)


def test_other_bad_arguments_name_the_parameter():
    with pytest.raises(ValueError, match="keep_ratios"):
        submodel_cost_table((0.5, 0.0), model=tiny(), input_shape=INPUT)
    with pytest.raises(ValueError, match="batch_size"):
        submodel_cost_table((0.5,), batch_size=0, model=tiny(), input_shape=INPUT)
    with pytest.raises(ValueError, match="pointwise"):
        submodel_layers(tiny(), pointwise="no")
    with pytest.raises(ValueError, match="example_input"):
        submodel_costs(tiny(), torch.zeros(0, *INPUT))
