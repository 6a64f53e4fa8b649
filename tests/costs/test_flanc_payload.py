"""FLANC's per-round payload under the constructions FLANC's text allows, against Table 1's communication column
(0.5M / 1.2M / 2.4M / 4.0M for ResNet-18, 33K / 63K / 98K / 136K for the Fashion-MNIST CNN)."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from subfl.costs import flanc_payload as fp
from subfl.methods.flanc import flanc_parameter_counts
from subfl.models import build_model
from subfl.models.composed import composition_plan, residual_block_of

WIDTHS = (0.25, 0.5, 0.75, 1.0)


def sent(model: str, c: fp.Construction) -> list[int]:
    family = fp.FAMILIES[model](WIDTHS, input_layer=c.input_layer)
    return [r["sent"] for r in fp.payload(family, c)]


@pytest.mark.parametrize("model, shape", [("resnet18", (3, 32, 32)), ("flanc_cnn", (1, 28, 28))])
def test_library_construction_equals_the_library_count(model, shape):
    library = flanc_parameter_counts(model, input_shape=shape)
    analytic = fp.payload(fp.FAMILIES[model](WIDTHS), fp.LIBRARY)
    keys = ("width", "dense", "basis", "coefficients", "other", "sent")
    assert [{k: r[k] for k in keys} for r in library] == [{k: r[k] for k in keys} for r in analytic]


def test_resnet18_library_payload_is_below_table1_from_half_width_on():
    assert sent("resnet18", fp.LIBRARY) == [532_250, 1_090_858, 2_019_130, 3_317_066]
    printed = [fp.printed(v, "resnet18") for v in sent("resnet18", fp.LIBRARY)]
    assert printed == pytest.approx([0.5e6, 1.1e6, 2.0e6, 3.3e6])  # Table 1: 0.5M, 1.2M, 2.4M, 4.0M


def test_r1_per_residual_block_reproduces_table1_resnet18():
    block = fp.Construction("block", scope="block")
    assert sent("resnet18", block) == [526_874, 1_214_506, 2_357_818, 3_956_810]
    assert sent("resnet18", fp.RELEASED) == [530_858, 1_219_594, 2_362_986, 3_956_810]  # + 64-channel stem
    for c in (block, fp.RELEASED):
        values = sent("resnet18", c)
        values.append(sum(values) / 4)
        assert [fp.printed(v, "resnet18") for v in values] == pytest.approx([0.5e6, 1.2e6, 2.4e6, 4.0e6, 2.0e6])


def test_the_difference_is_r1_of_the_second_conv_of_each_stages_first_block():
    family = fp.resnet18_family()
    layer, block = fp.sizes(family, fp.LIBRARY), fp.sizes(family, fp.Construction("b", scope="block"))
    changed = {n: (layer[n], block[n]) for n in layer if layer[n] != block[n]}
    assert changed == {"layer2.0.conv2": ((16, 32), (8, 32)), "layer3.0.conv2": ((32, 64), (16, 64)),
                       "layer4.0.conv2": ((64, 128), (32, 128))}
    # at p = 1: coefficients R2·(T/R1)·T double, the basis 9·R1·R2 halves; T = 128, 256, 512
    extra = sum(t // 4 * (t // (t // 16)) * t - t // 4 * (t // (t // 8)) * t for t in (128, 256, 512))
    fewer = sum(9 * (t // 8) * (t // 4) - 9 * (t // 16) * (t // 4) for t in (128, 256, 512))
    assert (extra, fewer) == (688_128, 48_384)
    assert sent("resnet18", fp.Construction("b", scope="block"))[3] - sent("resnet18", fp.LIBRARY)[3] == 639_744


def test_cnn_head_width_decides_table1_fashion_mnist():
    assert sent("flanc_cnn", fp.LIBRARY) == [26_858, 54_986, 91_306, 135_818]
    fixed = sent("flanc_cnn", replace(fp.LIBRARY, input_layer="fixed"))
    assert fixed == [33_482, 63_498, 97_610, 135_818] == sent("flanc_cnn", fp.RELEASED)
    fixed.append(sum(fixed) / 4)  # 82,602
    assert [fp.printed(v, "flanc_cnn") for v in fixed] == [33e3, 63e3, 98e3, 136e3, 83e3]  # Table 1, exactly


def test_candidate_tables_name_the_matching_constructions():
    resnet = {r["construction"]: r for r in fp.candidate_table("resnet18")}
    assert len(resnet) == 12
    assert sorted(n for n, r in resnet.items() if r["matches"]) == sorted([fp.RELEASED.label, "R₁ per residual block"])
    assert resnet[fp.LIBRARY.label]["agree"] == 1  # only width ¼ rounds to the printed 0.5M
    assert resnet["both directions counted"]["w1"] == 2 * 3_317_066
    assert resnet["R₂ = 50 % of full-width output"]["w0.25"] == 1_049_626
    cnn = fp.candidate_table("flanc_cnn")
    assert len(cnn) == 8 and [r["construction"] for r in cnn if r["matches"]] == [
        "input layer (head) at full width, as in the released code"]


def test_grid_has_one_family_of_matches_per_model():
    resnet = fp.grid("resnet18")
    assert len(resnet) == 432
    matches = [r for r in resnet if r["matches"]]
    assert len(matches) == 4  # stem scaled / fixed × 1×1 shortcuts dense / composed
    assert all("0.125·S_full per block, R₂ 0.25·T_full" in r["construction"] and "count all, ×1" in r["construction"]
               for r in matches)
    cnn = [r for r in fp.grid("flanc_cnn") if r["matches"]]
    assert len(cnn) == 8 and {(r["w0.25"], r["w1"]) for r in cnn} == {(33_482, 135_818)}
    assert all("input layer fixed" in r["construction"] for r in cnn)


def test_dense_column():
    cnn = {r["input layer"]: r for r in fp.dense_table("flanc_cnn")}
    assert [cnn["fixed"][k] for k in ("w0.25", "w0.5", "w0.75", "w1")] == [43_978, 105_738, 185_930, 284_554]
    assert cnn["fixed"]["agree"] == 4 and fp.printed(43_978, "flanc_cnn") == 44e3  # Table 1 prints 43K
    assert cnn["scaled"]["w0.25"] == 29_674 and cnn["scaled"]["agree"] == 1
    resnet = {r["input layer"]: r for r in fp.dense_table("resnet18")}
    assert resnet["scaled"]["w1"] == 11_173_962 and resnet["scaled"]["agree"] == 4  # 11.2M, printed 11.1M
    assert resnet["fixed"]["w0.25"] == 710_826


def test_library_r1_scope_block_matches_the_analytic_count():
    for compose_1x1 in (False, True):
        c = fp.Construction("b", scope="block", compose_1x1=compose_1x1)
        assert [r["sent"] for r in flanc_parameter_counts("resnet18", r1_scope="block",
                                                          compose_1x1=compose_1x1)] == sent("resnet18", c)
    with torch.device("meta"):
        dense = {p: build_model("resnet18", num_classes=10, input_shape=(3, 32, 32), width=p) for p in WIDTHS}
    plan = composition_plan(dense, r1_scope="block")
    assert [plan[f"layer{s}.0.conv2"].r1 for s in (2, 3, 4)] == [8, 16, 32]
    assert [plan[f"layer{s}.1.conv2"].r1 for s in (2, 3, 4)] == [16, 32, 64]
    assert plan["layer2.0.conv2"].coefficient_shape(1.0) == (32, 16 * 128)
    assert residual_block_of(dense[1.0], "layer2.0.shortcut.0") == "layer2.0"
    assert residual_block_of(dense[1.0], "fc") == ""
    with pytest.raises(ValueError, match="r1_scope"):
        composition_plan(dense, r1_scope="stage")
    # the FLANC CNN has no residual block: both scopes give the same plan
    assert [r["sent"] for r in flanc_parameter_counts("flanc_cnn", r1_scope="block")] == sent("flanc_cnn", fp.LIBRARY)


def test_bad_constructions():
    with pytest.raises(ValueError, match="scope"):
        fp.Construction("x", scope="stage")
    with pytest.raises(ValueError, match="directions"):
        fp.Construction("x", directions=3)
    with pytest.raises(ValueError, match="r2_fraction"):
        fp.Construction("x", r2_fraction=0.0)
    with pytest.raises(ValueError, match="model"):
        fp.candidate_table("vgg11")
