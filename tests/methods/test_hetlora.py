"""HetLoRA (subfl.methods.hetlora): rank choice on a hand-made resource table, truncation and zero-padded
aggregation by hand, the ledger of a run in the engine, and a run through run_experiment."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from subfl.costs.finetuning import resource_table
from subfl.costs.params import parameter_bytes
from subfl.experiments import make_config, run_experiment
from subfl.fl.engine import EngineSettings, run_simulation
from subfl.fl.profiles import Heterogeneity
from subfl.fl.types import ClientProfile, Update
from subfl.methods import METHODS
from subfl.methods.finetuning_common import assign_largest, DeviceBudget
from subfl.methods.hetlora import HetLoRA, lora_model, lora_rows, padded_average, truncate_lora
from subfl.models import build_model
from subfl.models.transformers import LoRALinear

from .test_caff import CONTEXT, V, Factory, _ctx, _lm_dataset, _pretrained


# ----- rank choice ---------------------------------------------------------------------------------------------
def hand_table() -> list[dict]:
    """Ranks 6 and 12 cost the same (a tie); a freeze row and a row of another depth are ignored."""
    rows = [dict(layers=3, scheme="lora", rank=3, memory_mb=13, upload_mb=0.3, gflops=1.0),
            dict(layers=3, scheme="lora", rank=6, memory_mb=16, upload_mb=0.6, gflops=1.5),
            dict(layers=3, scheme="lora", rank=12, memory_mb=16, upload_mb=0.6, gflops=1.5),
            dict(layers=3, scheme="lora", rank=24, memory_mb=34, upload_mb=2.4, gflops=3.0)]
    rows.append(dict(layers=3, scheme="freeze", rank=0, memory_mb=1, upload_mb=0.01, gflops=0.1))
    rows.append(dict(layers=6, scheme="lora", rank=3, memory_mb=1, upload_mb=0.01, gflops=0.1))
    return rows


def test_rank_is_the_largest_that_fits_all_three_budgets():
    rows = lora_rows(hand_table(), (24, 12, 6, 3), layers=3)
    assert sorted(rows) == [3, 6, 12, 24] and rows[3]["memory_mb"] == 13       # the other depth's row is dropped
    assert assign_largest(rows, DeviceBudget("a", memory_mb=20), "LoRA rank", "rank") == 12          # 6 and 12 tie at 16 MB -> 12
    assert assign_largest(rows, DeviceBudget("b", memory_mb=16), "LoRA rank", "rank") == 12          # a cost equal to the budget fits
    assert assign_largest(rows, DeviceBudget("c", memory_mb=15.9), "LoRA rank", "rank") == 3
    assert assign_largest(rows, DeviceBudget("d", upload_mb=2.4, gflops=1.4), "LoRA rank", "rank") == 3   # compute binds
    assert assign_largest(rows, DeviceBudget("e"), "LoRA rank", "rank") == 24
    with pytest.raises(ValueError, match=r"device weak cannot train any LoRA rank of \[24, 12, 6, 3\]: the smallest "
                                         r"exceeds memory \(needs 13 MB for rank=3, has 5 MB\)"):
        assign_largest(rows, DeviceBudget("weak", memory_mb=5, gflops=2), "LoRA rank", "rank")
    with pytest.raises(ValueError, match=r"no row for rank=\[8\]"):
        lora_rows(hand_table(), (8, 3), layers=3)


def test_configure_gives_each_group_its_rank_and_names_an_infeasible_client():
    method = HetLoRA(pretrained=_pretrained(), resource_table=hand_table(),
                     budgets={"0.5": {"memory_mb": 20}, "1": {}, "tiny": {"upload_mb": 0.1}})
    ctx = _ctx()
    state = method.init(ctx)
    assert state["layers"] == 3 and state["max_rank"] == 24
    assert state["weights"]["blocks.0.attn.q.lora_A"].shape == (24, 12)
    tasks = method.configure(state, 1, [ClientProfile(0, keep_ratio=0.5), ClientProfile(1)], ctx)
    assert tasks[0].config["rank"] == 12 and tasks[1].config["rank"] == 24
    assert tasks[0].tensors["blocks.2.mlp.fc1.lora_A"].shape == (12, 12)      # r x in
    assert tasks[0].tensors["blocks.2.mlp.fc1.lora_B"].shape == (48, 12)      # out x r
    with pytest.raises(ValueError, match=r"device 7 cannot train any LoRA rank .* upload \(needs 0.3 MB for rank=3, "
                                         r"has 0.1 MB\)"):
        method.configure(state, 1, [ClientProfile(7, group="tiny")], ctx)
    # the profile's own field wins over its group's budget
    assert method.configure(state, 1, [ClientProfile(3, group="1", memory_mb=13)], ctx)[3].config["rank"] == 3


# ----- truncation and zero-padded aggregation ----------------------------------------------------------------
def test_truncation_takes_the_leading_rows_of_a_and_columns_of_b():
    weights = {"x.lora_A": torch.arange(8.0).reshape(4, 2), "x.lora_B": torch.arange(12.0).reshape(3, 4),
               "x.weight": torch.ones(3, 2)}
    cut = truncate_lora(weights, 2)
    assert torch.equal(cut["x.lora_A"], torch.tensor([[0.0, 1.0], [2.0, 3.0]]))
    assert torch.equal(cut["x.lora_B"], torch.tensor([[0.0, 1.0], [4.0, 5.0], [8.0, 9.0]]))
    assert cut["x.weight"] is weights["x.weight"]


def test_zero_padded_aggregation_weights_by_hand():
    # server rank R = 4; devices of ranks 2, 1, 2 with 1, 2, 3 samples and constant factors 1, 2, 4
    weights = {"x.lora_A": torch.full((4, 2), 10.0), "x.lora_B": torch.full((3, 4), 10.0),
               "norm.weight": torch.zeros(3), "x.weight": torch.full((3, 2), 7.0)}
    ranks, sizes, values = (2, 1, 2), (1, 2, 3), (1.0, 2.0, 4.0)
    updates = [({"x.lora_A": torch.full((r, 2), v), "x.lora_B": torch.full((3, r), v),
                 "norm.weight": torch.full((3,), v)}, n) for r, n, v in zip(ranks, sizes, values)]
    out = padded_average(weights, updates)
    a, b = out["x.lora_A"], out["x.lora_B"]
    assert torch.allclose(a[0], torch.full((2,), (1 * 1 + 2 * 2 + 3 * 4) / 6))   # all three: 17/6
    assert torch.allclose(a[1], torch.full((2,), (1 * 1 + 3 * 4) / 4))           # 2 of 3 (ranks 2): 3.25
    assert torch.equal(a[2:], torch.full((2, 2), 10.0))                          # nobody: unchanged
    assert torch.allclose(b[:, 1], torch.full((3,), 3.25)) and torch.equal(b[:, 2:], torch.full((3, 2), 10.0))
    assert torch.allclose(out["norm.weight"], torch.full((3,), 17 / 6))
    assert torch.equal(out["x.weight"], weights["x.weight"])                     # frozen: never uploaded
    method = HetLoRA(pretrained="none")
    state = {"weights": weights, "layers": 1, "max_rank": 4, "last_round": []}
    new = method.aggregate(state, 1, [Update(i, t, n, {"rank": r, "group": g}) for i, ((t, n), r, g)
                                      in enumerate(zip(updates, ranks, ("1", "0.5", "1")))], None)
    assert torch.allclose(new["weights"]["x.lora_A"], a)
    assert method.round_metrics(new, 1) == {("lora_rank", "global"): 5 / 3, ("lora_rank", "0.5"): 1.0,
                                            ("lora_rank", "1"): 2.0}
    with pytest.raises(ValueError, match="not a leading block"):
        padded_average(weights, [({"x.lora_A": torch.zeros(5, 2)}, 1)])


def test_evaluation_model_applies_the_full_rank_adapters():
    model = lora_model(Factory()(layers=2), 4, seed=1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, LoRALinear):
                m.lora_B.normal_(0, 0.1, generator=torch.Generator().manual_seed(2))
    method = HetLoRA(pretrained="none", ranks=(4, 2))
    evaluated = method.evaluation_models({"weights": model.state_dict(), "layers": 2, "max_rank": 4}, _ctx())["global"]
    dense = Factory()(layers=2)
    merged = {k: v for k, v in model.state_dict().items() if ".lora_" not in k}
    for name, m in model.named_modules():
        if isinstance(m, LoRALinear):
            merged[f"{name}.weight"] = m.weight + m.lora_B @ m.lora_A       # scaling alpha / r = 1
    dense.load_state_dict(merged)
    x = torch.randint(V, (2, CONTEXT), generator=torch.Generator().manual_seed(0))
    assert torch.allclose(evaluated(x), dense(x), atol=1e-5)


# ----- in the engine ------------------------------------------------------------------------------------------------
def _trained_bytes(rank: int) -> int:
    return parameter_bytes(lora_model(Factory()(layers=3), rank), trainable_only=True)


def test_ledger_upload_bytes_are_the_trained_parameters():
    small, large = _trained_bytes(2), _trained_bytes(4)      # LoRA factors + every LayerNorm + head
    method = HetLoRA(pretrained=_pretrained(), ranks=(4, 2), budgets={"0.5": {"upload_mb": (small + large) / 2e6},
                                                                      "1": {}})
    ctx = _ctx()
    data = _lm_dataset()
    parts = np.array_split(np.arange(len(data.train)), 4)
    heterogeneity = Heterogeneity((0.5, 1.0), (0.5, 0.5))
    result = run_simulation(method, data, parts, heterogeneity, ctx, EngineSettings(rounds=2, clients_per_round=4,
                                                                                    seed=0), progress=False)
    table = {row["rank"]: row for row in result.state["table"]}
    assert table[2]["upload_mb"] * 1e6 == pytest.approx(small) and table[4]["upload_mb"] * 1e6 == pytest.approx(large)
    groups = {p.client_id: p.group for p in heterogeneity.profiles(4, 0, 1)}
    ledger = result.ledger.to_frame()
    up = ledger[(ledger.direction == "up") & (ledger.name != "__config__")]
    for (round_, client), rows in up.groupby(["round", "client"]):
        rank = 2 if groups[client] == "0.5" else 4
        assert rows.bytes.sum() == (small if rank == 2 else large)
        assert set(rows.name) == {n for n, p in lora_model(Factory()(layers=3), rank).named_parameters()
                                  if p.requires_grad}
        assert rows.name.str.contains("lora_|ln1|ln2|norm|head").all()
    # float32 entries at rank 2: per unit of rank, A rows + B columns of q, k, v, proj (12 + 12), fc1 (12 + 48) and
    # fc2 (48 + 12) in 3 blocks = 648; LayerNorms ln1, ln2 of 3 blocks + the final one, weight and bias = 7 * 2 * 12;
    # head 32 x 12 (no bias)
    assert small == 4 * (2 * 648 + 7 * 2 * 12 + V * 12) == 7392
    final = result.state["weights"]
    assert torch.equal(final["blocks.1.attn.q.weight"], _pretrained()[3]["blocks.1.attn.q.weight"])   # frozen
    assert not torch.equal(final["blocks.1.attn.q.lora_B"], torch.zeros(12, 4))
    history = result.history.to_frame()
    ranks = history[history.metric == "lora_rank"].set_index(["round", "group"]).value
    assert ranks.loc[(2, "global")] == 3.0 and ranks.loc[(2, "0.5")] == 2.0 and ranks.loc[(2, "1")] == 4.0


def test_run_experiment_end_to_end():
    model = build_model("tiny_vit", num_classes=10, input_shape=(1, 8, 8), layers=2, embed_dim=12, heads=3)
    table = resource_table({2: model}, 8, trained_layers=(), lora_ranks=(4, 2)).set_index("rank")
    budget = float(table.upload_mb.mean())                  # between rank 2 and rank 4
    cfg = make_config("hetlora", "digits", "tiny_vit", scale="ci", heterogeneity="0.5:0.5,1.0:0.5",
                      clients_per_round=4, max_train_samples=64, max_test_samples=32, optimizer="adamw", lr=1e-3,
                      batch_size=8, local_steps=1, model_options={"layers": 2, "embed_dim": 12, "heads": 3},
                      method_options={"pretrained": "none", "ranks": (4, 2),
                                      "budgets": {"0.5": {"upload_mb": budget}, "1": {}}})
    result = run_experiment(cfg, cache=False)
    assert result.summary["rounds"] == 2 and 0.0 <= result.summary["final_accuracy"] <= 1.0
    ranks = result.history[result.history.metric == "lora_rank"].set_index(["round", "group"]).value
    assert ranks.loc[(2, "0.5")] == 2.0 and ranks.loc[(2, "1")] == 4.0


# ----- options ------------------------------------------------------------------------------------------------------
def test_options_are_checked():
    assert METHODS["hetlora"] is HetLoRA and HetLoRA().ranks == (24, 12, 6, 3)
    assert HetLoRA(ranks=[3, 12]).ranks == (12, 3)
    for bad in ((), (3, 3), (0,), (2.5,), "12", (True,)):
        with pytest.raises(ValueError, match="option ranks must be a non-empty sequence of distinct ints"):
            HetLoRA(ranks=bad)
    with pytest.raises(ValueError, match="option budgets must be a dict"):
        HetLoRA(budgets=[1])
    with pytest.raises(ValueError, match="option architecture must be an int"):
        HetLoRA(architecture="3")
    with pytest.raises(ValueError, match="unknown option"):
        HetLoRA(rank=3)
    with pytest.raises(ValueError, match="hetlora needs pretrained weights"):
        HetLoRA().init(_ctx())
    with pytest.raises(ValueError, match="pretrained must be a mapping, 'ci', 'cpu', 'paper' or 'none'"):
        HetLoRA(pretrained="imagenet").init(_ctx())
    with pytest.raises(ValueError, match=r"no pretrained weights for depth 4 .* available depths: \[2, 3\]"):
        HetLoRA(pretrained=_pretrained(), architecture=4).init(_ctx())
