"""FLANC: neural composition (subfl.models.composed) and the method (subfl.methods.flanc)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from subfl.data.base import ArrayData
from subfl.experiments import make_config, run_experiment
from subfl.fl.training import ClientDataset, LocalTraining
from subfl.fl.types import ClientProfile, Update
from subfl.methods import METHODS, make_method
from subfl.fl.method import ClientContext, ServerContext
from subfl.methods.flanc import FLANC, client_width, flanc_parameter_counts
from subfl.models import build_model
from subfl.models.composed import (ComposedConv2d, ComposedLinear, FlancCNN, build_composed_models, build_dense_model,
                                   compose_weight, composition_plan, orthogonality_penalty, orthonormal_columns)
from functools import partial
from .helpers import Factory as _Factory

Factory = partial(_Factory, builder=build_dense_model)

WIDTHS = (0.25, 0.5, 0.75, 1.0)






def _ctx(factory, num_clients=4, rounds=2, **kw) -> ServerContext:
    return ServerContext(model_fn=factory, training=LocalTraining(lr=0.1, batch_size=8), rounds=rounds, seed=0,
                         num_classes=10, input_shape=(1, 8, 8), num_clients=num_clients, **kw)


# ----- composition: Eqs. (1)-(2), Fig. 2 --------------------------------------------------------------
def test_compose_weight_conv_equals_explicit_fig2_loops():
    g = torch.Generator().manual_seed(0)
    r1, r2, kh, kw, S, T = 2, 3, 2, 3, 6, 5  # G = S / R1 = 3 groups; a non-square kernel catches transpositions
    G = S // r1
    V = torch.randn(r1 * kh * kw, r2, generator=g, dtype=torch.float64)
    U = torch.randn(r2, G * T, generator=g, dtype=torch.float64)
    expected = torch.zeros(T, S, kh, kw, dtype=torch.float64)
    for t in range(T):
        for grp in range(G):
            for r in range(r1):
                for a in range(kh):
                    for b in range(kw):
                        expected[t, grp * r1 + r, a, b] = sum(V[r * kh * kw + a * kw + b, j] * U[j, t * G + grp]
                                                              for j in range(r2))
    W = compose_weight(V, U, T, S, (kh, kw))
    assert W.shape == (T, S, kh, kw)
    assert torch.allclose(W, expected, atol=1e-12)
    # input channels 0..1 (group 0) of output channel 4 use the coefficients in column 4·G + 0 = 12
    assert torch.allclose(W[4, 0:2].reshape(-1), V @ U[:, 12])
    # the composed module is a convolution with that kernel
    layer = ComposedConv2d(S, T, (kh, kw), r1, r2, padding=1).double()
    with torch.no_grad():
        layer.basis.copy_(V)
        layer.coefficients.copy_(U)
    x = torch.randn(2, S, 5, 4, generator=g, dtype=torch.float64)
    assert torch.allclose(layer(x), F.conv2d(x, expected, padding=1), atol=1e-12)


def test_compose_weight_linear_equals_explicit_loops():
    g = torch.Generator().manual_seed(1)
    r1, r2, S, T = 3, 2, 9, 4
    G = S // r1
    V = torch.randn(r1, r2, generator=g, dtype=torch.float64)
    U = torch.randn(r2, G * T, generator=g, dtype=torch.float64)
    expected = torch.tensor([[sum(V[s % r1, j] * U[j, t * G + s // r1] for j in range(r2)) for s in range(S)]
                             for t in range(T)], dtype=torch.float64)
    W = compose_weight(V, U, T, S, 1)
    assert W.shape == (T, S) and torch.allclose(W, expected, atol=1e-12)
    layer = ComposedLinear(S, T, r1, r2, bias=True).double()
    with torch.no_grad():
        layer.basis.copy_(V)
        layer.coefficients.copy_(U)
        layer.bias.fill_(0.5)
    x = torch.randn(3, S, generator=g, dtype=torch.float64)
    assert torch.allclose(layer(x), x @ expected.T + 0.5, atol=1e-12)
    with pytest.raises(ValueError, match="R1=3 does not divide"):
        compose_weight(V, U, T, 10, 1)


# ----- orthogonality: Eq. (3) --------------------------------------------------------------------------
def test_orthogonality_penalty_zero_for_orthonormal_basis_only():
    g = torch.Generator().manual_seed(2)
    Q = orthonormal_columns(18, 5, g, dtype=torch.float64)  # (R1·k², R2) = (2·9, 5)
    assert float(orthogonality_penalty([Q])) < 1e-24
    assert float((Q @ Q.T - torch.eye(18, dtype=torch.float64)).pow(2).sum()) == pytest.approx(13.0)  # wrong Gram: 18-5
    assert float(orthogonality_penalty([2 * Q])) == pytest.approx(9.0 * 5)  # ‖4I − I‖² = 9·R2
    assert float(orthogonality_penalty([2 * Q], reduction="mean")) == pytest.approx(9.0 * 5 / 25)
    assert float(orthogonality_penalty([Q, 2 * Q])) == pytest.approx(45.0)  # summed over layers
    R = torch.randn(18, 5, generator=g, dtype=torch.float64)
    assert float(orthogonality_penalty([R])) > 1.0


# ----- plans and parameter counts ------------------------------------------------------------------------
def test_resnet18_plan_matches_released_code_sizes():
    with torch.device("meta"):
        dense = {p: build_model("resnet18", num_classes=10, input_shape=(3, 32, 32), width=p) for p in WIDTHS}
    plan = composition_plan(dense)
    assert len(plan) == 16  # the 3×3 convolutions of the 8 BasicBlocks; stem, shortcuts and fc stay dense
    assert "conv1" not in plan and "fc" not in plan and not any("shortcut" in n for n in plan)
    # released code: R1 = round(0.125·in_base), R2 = round(0.25·out_base)
    assert (plan["layer1.0.conv1"].r1, plan["layer1.0.conv1"].r2) == (8, 16)
    assert (plan["layer2.0.conv1"].r1, plan["layer2.0.conv1"].r2) == (8, 32)
    assert (plan["layer2.0.conv2"].r1, plan["layer2.0.conv2"].r2) == (16, 32)
    assert (plan["layer4.1.conv2"].r1, plan["layer4.1.conv2"].r2) == (64, 128)
    assert plan["layer4.1.conv2"].basis_shape == (576, 128)
    assert plan["layer4.1.conv2"].coefficient_shape(0.25) == (128, 2 * 128)  # G = 128/64, T = 128
    assert len(composition_plan(dense, compose_1x1=True)) == 19  # + the three projection shortcuts
    with pytest.raises(ValueError, match="r1=5"):
        composition_plan(dense, r1=5)


def test_parameter_counts_resnet18_dense_per_width():
    rows = {r["width"]: r for r in flanc_parameter_counts("resnet18", WIDTHS)}
    dense = {p: rows[p]["dense"] for p in WIDTHS}
    assert dense == {0.25: 701_466, 0.5: 2_797_610, 0.75: 6_288_442, 1.0: 11_173_962}
    paper = {0.25: 0.7, 0.5: 2.8, 0.75: 6.3, 1.0: 11.1}  # FLANC Table 1 (millions)
    for p in WIDTHS:
        assert abs(dense[p] / 1e6 - paper[p]) < 0.1
    assert len({r["basis"] for r in rows.values()}) == 1 and rows[1.0]["basis"] == 343_296
    for r in rows.values():
        assert r["sent"] == r["basis"] + r["coefficients"] + r["other"]
        assert r["sent"] < r["dense"]
    assert rows[0.25]["sent"] < rows[0.5]["sent"] < rows[1.0]["sent"]
    assert rows[1.0]["coefficients"] == 2_785_280


def test_flanc_cnn_family_shares_one_basis():
    models, plan = build_composed_models("flanc_cnn", WIDTHS, num_classes=10, input_shape=(1, 28, 28),
                                         generator=torch.Generator().manual_seed(0))


    assert sum(t.numel() for t in FlancCNN(10).parameters()) == 284_554
    assert list(plan) == ["conv1", "conv2"]  # head and classifier dense
    assert (plan["conv1"].r1, plan["conv1"].r2, plan["conv2"].r1, plan["conv2"].r2) == (8, 32, 16, 32)
    assert models[0.25].conv1.basis is models[1.0].conv1.basis
    assert models[0.25].conv1.coefficients.shape == (32, 2 * 32)  # G = 16/8, T = 32
    x = torch.randn(2, 1, 28, 28)
    assert all(m(x).shape == (2, 10) for m in models.values())
    with torch.no_grad():
        assert float(orthogonality_penalty([models[1.0].conv1.basis, models[1.0].conv2.basis])) < 1e-10


# ----- the method ------------------------------------------------------------------------------------
def test_registered_and_options_validated():
    assert METHODS["flanc"] is FLANC
    with pytest.raises(ValueError, match="ortho_reduction"):
        make_method("flanc", ortho_reduction="max")
    with pytest.raises(ValueError, match="widths"):
        make_method("flanc", widths=(0.0, 1.0))
    assert client_width(0.6, WIDTHS) == 0.5 and client_width(1.0, WIDTHS) == 1.0
    with pytest.raises(ValueError, match="fits no FLANC width"):
        client_width(0.2, WIDTHS)
    with pytest.raises(ValueError, match="fits no FLANC width"):
        make_method("flanc").init(_ctx(Factory("cnn", 0.25), heterogeneity_levels=(0.1, 1.0)))


def _constant_update(state, p, n, value, client):
    from subfl.methods.width import level_name

    lv = level_name(p)
    tensors = {k: torch.full_like(v, value) for part in ("bases",) for k, v in state[part].items()}
    tensors.update({k: torch.full_like(v, value) for k, v in state["coefficients"][lv].items()})
    tensors.update({k: torch.full_like(v, value) for k, v in state["others"][lv].items()})
    return Update(client, tensors, n, {"width": p})


def test_aggregation_weights_eq4():
    method, ctx = make_method("flanc"), _ctx(Factory("cnn", 0.25))
    state = method.init(ctx)
    updates = [_constant_update(state, 0.5, 1, 1.0, 0), _constant_update(state, 0.5, 3, 5.0, 1),
               _constant_update(state, 1.0, 4, 10.0, 2)]
    new = method.aggregate(state, 1, updates, ctx)
    for v in new["bases"].values():  # V over all participants, by data size: (1·1 + 3·5 + 4·10) / 8
        assert torch.allclose(v, torch.full_like(v, 7.0))
    for part in ("coefficients", "others"):
        for v in new[part]["0.5"].values():  # U_0.5 over the width-0.5 participants only: (1·1 + 3·5) / 4
            assert torch.allclose(v, torch.full_like(v, 4.0))
        for v in new[part]["1"].values():
            assert torch.allclose(v, torch.full_like(v, 10.0))
        for lv in ("0.25", "0.75"):  # no participant: unchanged
            assert all(torch.equal(new[part][lv][k], state[part][lv][k]) for k in state[part][lv])


def test_payloads_hold_bases_and_own_coefficients_only():
    method, ctx = make_method("flanc"), _ctx(Factory("cnn", 0.25))
    state = method.init(ctx)
    plan = method.plan(ctx, state["width"], state["norm"])
    assert list(plan) == ["conv2", "fc1"]
    assert float(orthogonality_penalty(state["bases"])) < 1e-10  # orthonormal initial bases
    tasks = method.configure(state, 1, [ClientProfile(0, 0.25), ClientProfile(1, 1.0)], ctx)
    g = torch.Generator().manual_seed(0)
    data = ArrayData(torch.randn(12, 1, 8, 8, generator=g), torch.randint(0, 10, (12,), generator=g))
    sizes = {}
    for cid, p in ((0, 0.25), (1, 1.0)):
        task = tasks[cid]
        assert task.config["width"] == p
        names = set(task.tensors)
        assert {"conv2.basis", "fc1.basis", "conv2.coefficients", "fc1.coefficients"} <= names
        assert not any(k.endswith("conv2.weight") or k == "fc1.weight" for k in names)
        assert task.tensors["conv2.coefficients"].shape == plan["conv2"].coefficient_shape(p)
        dense = Factory("cnn", 0.25)(width=0.25 * p)
        assert task.tensors["fc2.weight"].shape == dense.fc2.weight.shape  # classifier at width p
        cctx = ClientContext(ctx.model_fn, torch.Generator().manual_seed(cid))
        update = method.local_update(task, ClientDataset(data, np.arange(12)), cctx)
        assert list(update.tensors) and set(update.tensors) == names
        assert all(update.tensors[k].shape == task.tensors[k].shape for k in names)
        assert update.stats["width"] == p and update.stats["orthogonality"] >= 0
        sizes[p] = sum(t.numel() * t.element_size() for t in update.tensors.values())
    assert sizes[0.25] < sizes[1.0]


def test_resnet18_round_with_static_bn_and_dense_shortcuts():
    factory = Factory("resnet18", 0.125, input_shape=(3, 8, 8))
    method, ctx = make_method("flanc"), _ctx(factory)
    state = method.init(ctx)
    assert state["norm"] == "bn_nostats"  # sBN: no running statistics anywhere
    assert "layer2.0.shortcut.0.weight" in state["others"]["0.25"] and "conv1.weight" in state["others"]["1"]
    assert not any("running_mean" in k for lv in state["others"].values() for k in lv)
    tasks = method.configure(state, 1, [ClientProfile(0, 0.25), ClientProfile(1, 0.8)], ctx)
    assert tasks[1].config["width"] == 0.75
    g = torch.Generator().manual_seed(0)
    data = ArrayData(torch.randn(16, 3, 8, 8, generator=g), torch.randint(0, 10, (16,), generator=g))
    updates = [method.local_update(tasks[c], ClientDataset(data, np.arange(16)), ClientContext(factory, g))
               for c in (0, 1)]
    new = method.aggregate(state, 1, updates, ctx)
    assert not torch.equal(new["bases"]["layer1.0.conv1.basis"], state["bases"]["layer1.0.conv1.basis"])
    assert all(torch.equal(new["coefficients"]["1"][k], v) for k, v in state["coefficients"]["1"].items())
    models = method.evaluation_models(new, ctx)
    assert sorted(models) == ["0.25", "0.5", "0.75", "1", "global"]
    assert all(m(data.x[:4]).shape == (4, 10) for m in models.values())


def _e2e(tmp_path, tag):
    cfg = make_config("flanc", "digits", "cnn", scale="ci", heterogeneity="uniform:0.25,0.5,0.75,1.0",
                      clients_per_round=4)
    return cfg, run_experiment(cfg, tmp_path / tag, cache=False)


def test_end_to_end_per_width_rows_uploads_and_determinism(tmp_path):
    cfg, res = _e2e(tmp_path, "a")
    acc = res.history[res.history.metric == "accuracy"]
    for r in (1, 2):
        assert sorted(acc[acc["round"] == r].group) == sorted(["0.25", "0.5", "0.75", "1", "global"])
    final = acc[acc["round"] == 2].set_index("group").value
    assert final["global"] == final["1"] and final["global"] > 0.3  # 10 classes, chance 0.1
    assert len(res.history[res.history.metric == "basis_orthogonality"]) == 2
    levels = cfg.heterogeneity_setting.static_levels(cfg.num_clients, cfg.seed)
    up = res.ledger[(res.ledger.direction == "up") & (res.ledger.name != "__config__")]
    per_client = up[up["round"] == 1].groupby("client").bytes.sum()
    by_level = {float(levels[c]): int(b) for c, b in per_client.items()}
    assert by_level[0.25] < by_level[0.5] < by_level[0.75] < by_level[1.0]
    counts = {r["width"]: r["sent"] for r in flanc_parameter_counts("cnn", WIDTHS, input_shape=(1, 8, 8))}
    assert all(by_level[p] == 4 * counts[p] for p in WIDTHS)  # float32: V + U_p + width-p others
    names = set(up[up["round"] == 1].name)
    assert "conv2.basis" in names and "conv2.weight" not in names
    _e2e(tmp_path, "b")
    assert (tmp_path / "a/history.csv").read_bytes() == (tmp_path / "b/history.csv").read_bytes()
    assert (tmp_path / "a/ledger.csv").read_bytes() == (tmp_path / "b/ledger.csv").read_bytes()
