"""FedHM (subfl.methods.fedhm): rank-ratio choice on a hand-made resource table, the truncated SVD factors, dense
aggregation by hand, the ledger of a run in the engine, and a run through run_experiment."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from subfl.costs.params import parameter_bytes
from subfl.experiments import make_config, run_experiment
from subfl.fl.engine import EngineSettings, run_simulation
from subfl.fl.profiles import Heterogeneity
from subfl.fl.types import ClientProfile, Update
from subfl.methods import METHODS
from subfl.methods.fedhm import (FedHM, dense_update, factorized_layer_names, fedhm_resource_table,
                                 layer_ranks, low_rank_model, ratio_rows, truncated_factors)
from subfl.methods.finetuning_common import assign_largest, DeviceBudget
from subfl.models import build_model
from subfl.models.factorized import layer_specs

from .test_caff import V, Factory, _ctx, _lm_dataset, _pretrained


# ----- rank-ratio choice ---------------------------------------------------------------------------------------
def hand_table() -> list[dict]:
    """Ratios 0.5 and 0.25 cost the same (a tie); a row of another depth is ignored."""
    rows = [dict(layers=3, rank_ratio=1.0, memory_mb=20, upload_mb=2.0, gflops=4.0),
            dict(layers=3, rank_ratio=0.5, memory_mb=18, upload_mb=1.5, gflops=3.0),
            dict(layers=3, rank_ratio=0.25, memory_mb=18, upload_mb=1.5, gflops=3.0),
            dict(layers=3, rank_ratio=0.125, memory_mb=12, upload_mb=0.5, gflops=1.0)]
    rows.append(dict(layers=6, rank_ratio=0.125, memory_mb=1, upload_mb=0.01, gflops=0.1))
    return rows


def test_ratio_is_the_largest_that_fits_all_three_budgets():
    rows = ratio_rows(hand_table(), (1.0, 0.5, 0.25, 0.125), layers=3)
    assert sorted(rows) == [0.125, 0.25, 0.5, 1.0] and rows[0.125]["memory_mb"] == 12
    assert assign_largest(rows, DeviceBudget("a", memory_mb=19), "FedHM rank ratio", "rank_ratio") == 0.5          # 0.5 and 0.25 tie at 18 MB -> 0.5
    assert assign_largest(rows, DeviceBudget("b", memory_mb=18), "FedHM rank ratio", "rank_ratio") == 0.5          # a cost equal to the budget fits
    assert assign_largest(rows, DeviceBudget("c", memory_mb=17.9), "FedHM rank ratio", "rank_ratio") == 0.125
    assert assign_largest(rows, DeviceBudget("d", upload_mb=2, gflops=2.9), "FedHM rank ratio", "rank_ratio") == 0.125   # compute binds
    assert assign_largest(rows, DeviceBudget("e"), "FedHM rank ratio", "rank_ratio") == 1.0                          # least constrained: dense
    with pytest.raises(ValueError, match=r"device weak cannot train any FedHM rank ratio of \[1.0, 0.5, 0.25, 0.125\]"
                                         r": the smallest exceeds upload \(needs 0.5 MB for rank_ratio=0.125, "
                                         r"has 0.2 MB\)"):
        assign_largest(rows, DeviceBudget("weak", upload_mb=0.2), "FedHM rank ratio", "rank_ratio")
    method = FedHM(pretrained=_pretrained(), resource_table=hand_table(), budgets={"0.5": {"memory_mb": 19}, "1": {}})
    ctx = _ctx()
    state = method.init(ctx)
    tasks = method.configure(state, 1, [ClientProfile(0, keep_ratio=0.5), ClientProfile(1)], ctx)
    assert tasks[0].config["rank_ratio"] == 0.5 and tasks[1].config["rank_ratio"] == 1.0
    # z = ceil(0.5 * min(n, m)): q is 12 x 12 -> 6, fc1 48 x 12 -> 6; the dense device gets W itself
    assert tasks[0].tensors["blocks.0.attn.q.u"].shape == (12, 6)
    assert tasks[0].tensors["blocks.0.mlp.fc1.v"].shape == (6, 12)
    assert "blocks.0.attn.q.weight" not in tasks[0].tensors and "blocks.0.attn.q.weight" in tasks[1].tensors
    with pytest.raises(ValueError, match=r"device 5 cannot train any FedHM rank ratio .* memory \(needs 12 MB"):
        method.configure(state, 1, [ClientProfile(5, memory_mb=4)], ctx)


# ----- factors ------------------------------------------------------------------------------------------------------
def test_rank_z_factors_are_the_truncated_svd():
    w = torch.randn(8, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    sigma = torch.linalg.svdvals(w)
    for z in (1, 2, 4, 5):
        u, v = truncated_factors(w, z)
        assert u.shape == (8, z) and v.shape == (z, 5)
        error = float(((w - u @ v) ** 2).sum())
        assert error == pytest.approx(float((sigma[z:] ** 2).sum()), rel=1e-9, abs=1e-12)   # Eckart-Young
    # sqrt(S) goes to both sides: U' = U sqrt(S), V' = sqrt(S) V^T, so U'^T U' = V' V'^T = S
    assert torch.allclose(u.T @ u, torch.diag(sigma)) and torch.allclose(v @ v.T, torch.diag(sigma))
    with pytest.raises(ValueError, match="rank must be an int in"):
        truncated_factors(w, 6)
    # the payload of a device holds exactly these factors of the global weights
    method = FedHM(pretrained=_pretrained(), rank_ratios=(1.0, 0.25), resource_table=hand_table()[0:3:2])
    ctx = _ctx()
    state = method.init(ctx)
    task = method.configure(state, 1, [ClientProfile(0, upload_mb=1.6)], ctx)[0]
    assert task.config["ranks"]["blocks.1.mlp.fc2"] == 3                          # ceil(0.25 * min(12, 48))
    u, v = truncated_factors(state["weights"]["blocks.1.mlp.fc2.weight"], 3)
    assert torch.equal(task.tensors["blocks.1.mlp.fc2.u"], u) and torch.equal(task.tensors["blocks.1.mlp.fc2.v"], v)
    assert layer_ranks(layer_specs(Factory()(), ["blocks.0.mlp.fc1"]), 0.125) == {"blocks.0.mlp.fc1": 2}   # 1.5 -> 2


# ----- aggregation ----------------------------------------------------------------------------------------------------
def test_server_averages_the_rebuilt_dense_weights_by_data_size():
    model = Factory()(layers=2)
    specs = layer_specs(model, factorized_layer_names(model))
    assert len(specs) == 12 and "head" not in specs
    g = torch.Generator().manual_seed(3)
    u, v = torch.randn(12, 2, generator=g), torch.randn(2, 12, generator=g)
    dense_w = torch.randn(12, 12, generator=g)
    factored = {"blocks.0.attn.q.u": u, "blocks.0.attn.q.v": v, "blocks.0.attn.q.bias": torch.ones(12),
                "head.weight": torch.ones(V, 12)}
    rebuilt = dense_update(factored, specs)
    assert set(rebuilt) == {"blocks.0.attn.q.weight", "blocks.0.attn.q.bias", "head.weight"}
    assert torch.allclose(rebuilt["blocks.0.attn.q.weight"], u @ v)
    method = FedHM(pretrained="none")
    state = {"weights": model.state_dict(), "layers": 2, "last_round": []}
    updates = [Update(0, factored, 1, {"rank_ratio": 0.25, "group": "0.25"}),
               Update(1, {"blocks.0.attn.q.weight": dense_w, "blocks.0.attn.q.bias": torch.zeros(12),
                          "head.weight": torch.zeros(V, 12)}, 3, {"rank_ratio": 1.0, "group": "1"})]
    new = method.aggregate(state, 1, updates, _ctx())
    w = new["weights"]
    assert torch.allclose(w["blocks.0.attn.q.weight"], (1 * u @ v + 3 * dense_w) / 4, atol=1e-6)
    assert torch.allclose(w["blocks.0.attn.q.bias"], torch.full((12,), 0.25))     # (1 * 1 + 3 * 0) / 4
    assert torch.allclose(w["head.weight"], torch.full((V, 12), 0.25))
    assert torch.equal(w["token_embedding.weight"], model.state_dict()["token_embedding.weight"])   # frozen
    assert method.round_metrics(new, 1) == {("rank_ratio", "global"): 0.625, ("rank_ratio", "0.25"): 0.25,
                                            ("rank_ratio", "1"): 1.0}


# ----- in the engine ------------------------------------------------------------------------------------------------
def _trained_bytes(ratio: float) -> int:
    model = Factory()(layers=3)
    return parameter_bytes(low_rank_model(model, layer_ranks(layer_specs(model, factorized_layer_names(model)), ratio)),
                           trainable_only=True)


def test_ledger_upload_bytes_are_the_trained_parameters():
    low, full = _trained_bytes(0.25), _trained_bytes(1.0)
    # dense: every parameter but the token (32 x 12) and position (8 x 12) embeddings; rank 0.25: z = 3 everywhere,
    # q, k, v, proj 3 * (12 + 12), fc1 / fc2 3 * (12 + 48), plus every bias, LayerNorm and the head
    n_dense = sum(p.numel() for p in Factory()(layers=3).parameters()) - (V + 8) * 12
    biases_norms_head = 3 * (4 * 12 + 48 + 12) + 7 * 2 * 12 + V * 12
    assert full == 4 * n_dense and low == 4 * (3 * (4 * 3 * 24 + 2 * 3 * 60) + biases_norms_head)
    method = FedHM(pretrained=_pretrained(), rank_ratios=(1.0, 0.25),
                   budgets={"0.5": {"upload_mb": (low + full) / 2e6}, "1": {}})
    ctx = _ctx()
    data = _lm_dataset()
    parts = np.array_split(np.arange(len(data.train)), 4)
    heterogeneity = Heterogeneity((0.5, 1.0), (0.5, 0.5))
    result = run_simulation(method, data, parts, heterogeneity, ctx,
                            EngineSettings(rounds=2, clients_per_round=4, seed=0), progress=False)
    table = {row["rank_ratio"]: row for row in result.state["table"]}
    assert table[0.25]["upload_mb"] * 1e6 == pytest.approx(low) and table[1.0]["upload_mb"] * 1e6 == pytest.approx(full)
    groups = {p.client_id: p.group for p in heterogeneity.profiles(4, 0, 1)}
    ledger = result.ledger.to_frame()
    up = ledger[(ledger.direction == "up") & (ledger.name != "__config__")]
    for (round_, client), rows in up.groupby(["round", "client"]):
        weak = groups[client] == "0.5"
        assert rows.bytes.sum() == (low if weak else full)
        assert not rows.name.str.contains("embedding").any()
        names = set(rows.name)
        assert ("blocks.2.mlp.fc1.u" in names) == weak and ("blocks.2.mlp.fc1.weight" in names) != weak
    final = result.state["weights"]
    assert torch.equal(final["token_embedding.weight"], _pretrained()[3]["token_embedding.weight"])
    assert not torch.equal(final["blocks.0.attn.q.weight"], _pretrained()[3]["blocks.0.attn.q.weight"])
    history = result.history.to_frame()
    ratios = history[history.metric == "rank_ratio"].set_index(["round", "group"]).value
    assert ratios.loc[(2, "0.5")] == 0.25 and ratios.loc[(2, "1")] == 1.0 and ratios.loc[(2, "global")] == 0.625


def test_run_experiment_end_to_end():
    model = build_model("tiny_vit", num_classes=10, input_shape=(1, 8, 8), layers=2, embed_dim=12, heads=3)
    table = fedhm_resource_table(model, (1.0, 0.25), torch.zeros(8, 1, 8, 8)).set_index("rank_ratio")
    budget = float(table.upload_mb.mean())                  # between ratio 0.25 and the dense model
    cfg = make_config("fedhm", "digits", "tiny_vit", scale="ci", heterogeneity="0.5:0.5,1.0:0.5",
                      clients_per_round=4, max_train_samples=64, max_test_samples=32, optimizer="adamw", lr=1e-3,
                      batch_size=8, local_steps=1, model_options={"layers": 2, "embed_dim": 12, "heads": 3},
                      method_options={"pretrained": "none", "rank_ratios": (1.0, 0.25),
                                      "budgets": {"0.5": {"upload_mb": budget}, "1": {}}})
    result = run_experiment(cfg, cache=False)
    assert result.summary["rounds"] == 2 and 0.0 <= result.summary["final_accuracy"] <= 1.0
    ratios = result.history[result.history.metric == "rank_ratio"].set_index(["round", "group"]).value
    assert ratios.loc[(2, "0.5")] == 0.25 and ratios.loc[(2, "1")] == 1.0


# ----- options ------------------------------------------------------------------------------------------------------
def test_options_are_checked():
    assert METHODS["fedhm"] is FedHM and FedHM().rank_ratios == (1.0, 0.5, 0.25, 0.125)
    assert FedHM(rank_ratios=[0.25, 1]).rank_ratios == (1.0, 0.25)
    for bad in ((), (0.5, 0.5), (0.0,), (1.5,), "0.5", (True,)):
        with pytest.raises(ValueError, match=r"option rank_ratios must be a non-empty sequence of distinct numbers "
                                             r"in \(0, 1\]"):
            FedHM(rank_ratios=bad)
    with pytest.raises(ValueError, match="option budgets must be a dict"):
        FedHM(budgets="0.5")
    with pytest.raises(ValueError, match="option architecture must be an int"):
        FedHM(architecture=0)
    with pytest.raises(ValueError, match="fedhm needs pretrained weights"):
        FedHM().init(_ctx())
    with pytest.raises(ValueError, match=r"resource_table has no row for rank_ratio=\[0.75\]"):
        FedHM(pretrained=_pretrained(), rank_ratios=(1.0, 0.75), resource_table=hand_table()).init(_ctx())
