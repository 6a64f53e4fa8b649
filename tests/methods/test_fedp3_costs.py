"""FedP3 deploy / upload accounting (subfl.methods.fedp3_costs): hand-counted toy model, the paper's CNN, the wire
format against the method's own encoder, and the ledger audit on a real run."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch
from torch import nn

from subfl.methods.fedp3_costs import (
    PAPER_LAYER_SAVINGS,
    check_keep,
    check_layers,
    deployed_table,
    distribution_moments,
    expected_upload,
    kept_entries,
    layer_ratio_matches,
    pruned_tensor_bytes,
    subset_distribution,
    unit_sizes,
    unit_wire_bytes,
    upload_audit,
    upload_table,
)
from subfl.experiments import make_config, run_experiment
from subfl.methods.fedp3 import encode_pruned, magnitude_mask
from subfl.models import build_model


def toy() -> nn.Sequential:
    """Linear(2→3) | ReLU | Linear(3→4) | ReLU | Linear(4→2): units "0" (9 params), "2" (16) and the FFC "4" (10)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


# ----- hand-counted toy model -----------------------------------------------------------------------------
def test_unit_sizes_of_the_toy_model():
    sizes = unit_sizes(toy())
    assert sizes.unit.tolist() == ["0", "2", "4"]
    assert sizes.parameters.tolist() == [9, 16, 10]
    assert sizes.bytes.tolist() == [36, 64, 40]
    assert sizes.prunable.tolist() == [6, 12, 8]
    assert sizes.final.tolist() == [False, False, True]
    assert sizes.tensors[1] == ("2.weight", "2.bias")


def test_subset_distribution_by_hand():
    assert subset_distribution([9, 16], 1) == {9: Fraction(1, 2), 16: Fraction(1, 2)}
    # k = 1 or 2 with probability 1/2 each: {9}, {16} at 1/4 each, {9, 16} at 1/2
    assert subset_distribution([9, 16], (1, 2)) == {9: Fraction(1, 4), 16: Fraction(1, 4), 25: Fraction(1, 2)}
    assert subset_distribution([9, 16], 3) == {25: Fraction(1)}  # k clamped to the 2 units, as FedP3 does
    assert subset_distribution([9, 16], 0) == {0: Fraction(1)}  # only the FFC is trained
    three = subset_distribution([1, 2, 4], 2)  # {1,2}, {1,4}, {2,4}
    assert three == {3: Fraction(1, 3), 5: Fraction(1, 3), 6: Fraction(1, 3)}


def test_expected_upload_of_the_toy_model_by_hand():
    lowerb = expected_upload([9, 16], 10, 1)  # FFC (10) + one of 9 / 16
    assert lowerb["mean"] == 22.5 and lowerb["min"] == 19 and lowerb["max"] == 26
    assert lowerb["std"] == pytest.approx(3.5)
    assert lowerb["fraction"] == pytest.approx(9 / 14)  # 22.5 / 35
    both = expected_upload([9, 16], 10, (1, 2))  # 10 + 9/4 + 16/4 + 25/2 = 28.75
    assert both["mean"] == 28.75 and both["fraction"] == pytest.approx(23 / 28)
    assert distribution_moments({3: Fraction(1, 2), 5: Fraction(1, 2)}) == {"mean": 4.0, "std": 1.0, "min": 3.0,
                                                                          "max": 5.0}


def test_upload_table_of_the_toy_model():
    table = upload_table(toy(), {"lowerb": 1, "opu12": (1, 2)}).set_index("variant")
    assert table.loc["lowerb", "layers_up"] == 2 and table.loc["opu12", "layers_up"] == 2.5
    assert table.loc["lowerb", "layer_fraction"] == pytest.approx(2 / 3)
    assert table.loc["opu12", "layer_fraction"] == pytest.approx(5 / 6)
    assert table.loc["lowerb", "bytes_up"] == 90 and table.loc["opu12", "bytes_up"] == 115  # 4 bytes a parameter
    assert table.loc["lowerb", "byte_fraction"] == pytest.approx(9 / 14)
    assert (table.loc["lowerb", "bytes_min"], table.loc["lowerb", "bytes_max"]) == (76, 104)
    assert table.loc["lowerb", "paper_saving"] == 0.6 and np.isnan(table.loc["opu12", "paper_saving"])
    assert table.loc["opu12", "k"] == "{1, 2}"


# ----- the paper's CNN ------------------------------------------------------------------------------------
def test_cifar10_cnn_layer_counts_and_the_papers_layer_savings():
    cnn = build_model("fedp3_cnn", num_classes=10, input_shape=(3, 32, 32))
    sizes = unit_sizes(cnn)
    assert sizes.parameters.tolist() == [4864, 102464, 1639424, 1049600, 10250]
    assert sizes.parameters.sum() == 2_806_602
    table = upload_table(cnn).set_index("variant")
    for variant, saving in PAPER_LAYER_SAVINGS.items():  # 2, 3, 4 of 5 layers: 60 / 40 / 20 % saved
        assert 1 - table.loc[variant, "layer_fraction"] == pytest.approx(saving)
    # by parameters: FFC + a quarter of the other four layers, (10250 + 2796352/4) / 2806602
    assert table.loc["lowerb", "params_up"] == 709_338
    assert table.loc["lowerb", "param_fraction"] == pytest.approx(709_338 / 2_806_602)
    assert table.loc["opu123", "params_up"] == table.loc["opu2", "params_up"]  # E[k] = 2 either way


# ----- the wire format of global pruning -------------------------------------------------------------------
def test_pruned_tensor_bytes_by_hand():
    assert pruned_tensor_bytes(400, 0.5) == 200 * 4 + 50            # 200 values + 400-bit mask
    assert pruned_tensor_bytes(65536, 0.5) == 32768 * 4 + 8192
    assert pruned_tensor_bytes(10000, 0.001) == 10 * 4 + 10 * 4     # index list (40 B) beats the mask (1250 B)
    assert pruned_tensor_bytes(10, 1.0) == 40
    assert kept_entries(7, 0.01) == 1 and kept_entries(10, 0.3) == 3


@pytest.mark.parametrize("shape", [(6, 2), (64, 1, 5, 5), (300, 40), (1000, 100)])
@pytest.mark.parametrize("keep", [0.001, 0.03, 0.5, 0.9])
def test_pruned_tensor_bytes_equals_the_methods_encoder(shape, keep):
    weight = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    wire = encode_pruned("w", weight, magnitude_mask(weight, keep))
    assert sum(t.numel() * t.element_size() for t in wire.values()) == pruned_tensor_bytes(weight.numel(), keep)


def test_deployed_table_of_the_toy_model_by_hand():
    # P = 0.5: unit "0" untrained = 3 kept weights (12 B + 1 B mask) + bias 12 B = 25 B, 6 params kept;
    # unit "2" untrained = 6 kept (24 B + 2 B mask) + bias 16 B = 42 B, 10 params kept; the FFC is always dense.
    wire = unit_wire_bytes(toy(), 0.5)
    assert wire.pruned_bytes.tolist() == [25, 42, 40] and wire.dense_bytes.tolist() == [36, 64, 40]
    assert wire.kept_parameters.tolist() == [6, 10, 10]
    table = deployed_table(toy(), keeps=(1.0, 0.5), variants={"lowerb": 1}).set_index("keep")
    assert table.loc[1.0, "bytes_down"] == 140 and table.loc[1.0, "kept_parameters"] == 35
    # LowerB: 25 + 42 + 40 = 107 B plus 11 (unit "0" dense) or 22 (unit "2" dense)
    assert (table.loc[0.5, "bytes_down_min"], table.loc[0.5, "bytes_down_max"]) == (118, 129)
    assert table.loc[0.5, "bytes_down"] == 123.5
    assert table.loc[0.5, "kept_parameters"] == 30.5  # 26 + (3 or 6)
    assert table.loc[0.5, "kept_fraction"] == pytest.approx(30.5 / 35)


# ----- the ledger audit --------------------------------------------------------------------------------------
def _ledger(rows):
    import pandas as pd
    return pd.DataFrame([dict(zip(("round", "client", "direction", "name", "bytes"), r)) for r in rows])


def test_upload_audit_flags_partial_units_and_a_missing_ffc():
    rows = [(1, 0, "down", "0.weight", 13), (1, 0, "down", "0.weight@mask", 1), (1, 0, "down", "0.bias", 12),
            (1, 0, "down", "2.weight", 48), (1, 0, "down", "2.bias", 16), (1, 0, "down", "4.weight", 32),
            (1, 0, "down", "4.bias", 8), (1, 0, "down", "__config__", 99),
            (1, 0, "up", "2.weight", 48), (1, 0, "up", "2.bias", 16), (1, 0, "up", "4.weight", 32),
            (1, 0, "up", "4.bias", 8), (1, 0, "up", "__config__", 50),
            (1, 1, "up", "2.weight", 48), (1, 1, "up", "4.weight", 32)]
    audit = upload_audit(_ledger(rows), toy()).set_index("client")
    assert audit.loc[0, "units_up"] == ("2", "4") and audit.loc[0, "bytes_up"] == 104
    assert audit.loc[0, "bytes_down"] == 130
    assert audit.loc[0, "ffc_up"] and audit.loc[0, "whole_units"] and audit.loc[0, "up_is_dense_down"]
    assert audit.loc[0, "units_dense_down"] == ("2", "4")
    assert not audit.loc[1, "whole_units"] and audit.loc[1, "up_is_dense_down"] is None  # no download recorded
    missing_ffc = _ledger([(1, 0, "up", "0.weight", 24), (1, 0, "up", "0.bias", 12)])
    assert not upload_audit(missing_ffc, toy()).ffc_up.iloc[0]
    with pytest.raises(ValueError, match="does not have"):
        upload_audit(_ledger([(1, 0, "up", "9.weight", 4)]), toy())
    with pytest.raises(ValueError, match="columns"):
        upload_audit(_ledger([(1, 0, "up", "0.weight", 4)]).drop(columns="bytes"), toy())


def test_upload_audit_of_a_real_run(tmp_path):
    cfg = make_config("lowerb", "digits", "mlp", scale="ci", method_options={"global_keep": 0.5})
    result = run_experiment(cfg, tmp_path / "lowerb", cache=False)
    model = build_model("mlp", num_classes=10, input_shape=(1, 8, 8), width=cfg.width)
    audit = upload_audit(result.ledger, model)
    assert len(audit) == cfg.rounds * cfg.clients_per_round
    assert audit.ffc_up.all() and audit.whole_units.all() and audit.up_is_dense_down.all()
    assert set(audit.units_up) <= {("layers.1", "layers.5"), ("layers.3", "layers.5")}
    sizes = unit_sizes(model)
    final = int(sizes[sizes.final].bytes.iloc[0])
    support = {final + v for v in subset_distribution(sizes[~sizes.final].bytes.tolist(), 1)}
    assert set(audit.bytes_up) <= support
    wire = unit_wire_bytes(model, 0.5).set_index("unit")
    for units, down in zip(audit.units_up, audit.bytes_down):
        assert down == wire.pruned_bytes.sum() + sum(wire.dense_bytes[u] - wire.pruned_bytes[u] for u in units)


# ----- reading reported ratios --------------------------------------------------------------------------------
def test_layer_ratio_matches_by_hand():
    # sums of subsets of [2, 3, 6]: 2, 3, 6, 5, 8, 9, 11; ratio 1.5 = 3/2 = 9/6
    assert layer_ratio_matches([2, 3, 6], 1.5, 0) == [((1,), (0,), 1.5), ((1, 2), (2,), 1.5)]
    assert layer_ratio_matches([2, 3, 6], 100.0, 0.5) == []


# ----- bad arguments ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [-1, [], "2", True, [1, 1], [1.5], None])
def test_check_layers_rejects(bad):
    with pytest.raises(ValueError, match="layers"):
        check_layers(bad)


@pytest.mark.parametrize("bad", [0, 1.5, -0.1, True, "0.5"])
def test_check_keep_rejects(bad):
    with pytest.raises(ValueError, match="keep"):
        check_keep(bad)


def test_value_errors_name_the_parameter():
    with pytest.raises(ValueError, match="sizes"):
        subset_distribution([1, -2], 1)
    with pytest.raises(ValueError, match="max_subsets"):
        subset_distribution(list(range(30)), 10, max_subsets=1000)
    with pytest.raises(ValueError, match="final"):
        expected_upload([1, 2], -1, 1)
    with pytest.raises(ValueError, match="grouping"):
        unit_sizes(toy(), grouping="blocks")
    with pytest.raises(ValueError, match="numel"):
        pruned_tensor_bytes(0, 0.5)
    with pytest.raises(ValueError, match="keep"):
        deployed_table(toy(), keeps=(0.0,))
    with pytest.raises(ValueError, match="sizes"):
        layer_ratio_matches([], 1.0, 0.1)
    with pytest.raises(ValueError, match="at most 10"):
        layer_ratio_matches(list(range(1, 12)), 1.0, 0.1)
    with pytest.raises(ValueError, match="tolerance"):
        layer_ratio_matches([1, 2], 1.0, -1)
