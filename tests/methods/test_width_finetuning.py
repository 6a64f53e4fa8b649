"""Width-slicing finetuning baselines of CAFF (subfl.methods.width_finetuning): head-aware indices, the width choice
on hand-made and measured resource tables, upload and aggregation by hand, FjORD's ordered dropout, and a run of each
method through run_experiment."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from subfl.costs.params import parameter_bytes
from subfl.experiments import make_config, run_experiment
from subfl.fl.training import ClientDataset, LocalTraining
from subfl.fl.types import ClientProfile, Update
from subfl.methods import METHODS
from subfl.fl.method import ClientContext, ServerContext
from subfl.methods.finetuning_common import assign_largest, DeviceBudget
from subfl.methods.width_finetuning import (FedRolexFinetuning, FjORDFinetuning, HeadAwareOrderedDropout,
                                            HeteroFLFinetuning, check_widths, head_aware_indices,
                                            head_channels, rolling_offset, width_model, width_resource_table,
                                            width_rows)
from subfl.models.slicing import extract, leading_indices, state_shapes, window
from subfl.models.transformers import EMBEDDING_NAMES, Attention, trainable_parameter_names

from .helpers import Factory
from .test_caff import _lm_dataset

V, CONTEXT = 32, 8            # the toy language data of test_caff
GPT = Factory("tiny_gpt", num_classes=V, input_shape=(CONTEXT,), embed_dim=12, heads=3, context_length=CONTEXT)
"""Tiny GPTs of width 12 (3 heads of 4 channels): width 0.5 -> 3 heads of 2 (E = 6), 0.25 -> 3 heads of 1 (E = 3)."""


def _ctx(**fields) -> ServerContext:
    training = LocalTraining(optimizer="adamw", lr=1e-2, batch_size=4, local_steps=2)
    return ServerContext(model_fn=GPT, training=training, rounds=2, seed=0, num_classes=V, input_shape=(CONTEXT,),
                         task="next_token", num_clients=4, **fields)


def _client_ctx(seed: int = 0) -> ClientContext:
    return ClientContext(model_fn=GPT, generator=torch.Generator().manual_seed(seed), task="next_token", num_classes=V)


def hand_table() -> list[dict]:
    """Widths 0.25 and 0.5 cost the same (a tie); a row of another depth is ignored."""
    return [dict(layers=2, width=0.125, memory_mb=10, upload_mb=0.1, gflops=1.0),
            dict(layers=2, width=0.25, memory_mb=12, upload_mb=0.2, gflops=2.0),
            dict(layers=2, width=0.5, memory_mb=12, upload_mb=0.2, gflops=2.0),
            dict(layers=2, width=1.0, memory_mb=30, upload_mb=0.8, gflops=8.0),
            dict(layers=3, width=0.125, memory_mb=1, upload_mb=0.01, gflops=0.1)]


def _method(cls=HeteroFLFinetuning, **options):
    return cls(**{"pretrained": "none", "architecture": 2, "resource_table": hand_table(), **options})


# ----- head-aware indices -------------------------------------------------------------------------------------------
def test_head_aware_slice_keeps_each_heads_own_leading_channels():
    kw = dict(num_classes=64, input_shape=(16,), layers=1)        # default tiny_gpt: 3 heads of 32 (E = 96)
    glob = Factory("tiny_gpt", **kw)()
    sub = Factory("tiny_gpt", **kw)(width=0.5)                    # 3 heads of 16 (E = 48)
    weights = glob.state_dict()
    cut = extract(weights, head_aware_indices(glob, sub))
    assert state_shapes(cut) == state_shapes(sub.state_dict())
    rows = torch.cat([torch.arange(h * 32, h * 32 + 16) for h in range(3)])    # [0..15, 32..47, 64..79]
    for part in ("q", "k", "v"):
        assert torch.equal(cut[f"blocks.0.attn.{part}.weight"], weights[f"blocks.0.attn.{part}.weight"][rows, :48])
        assert torch.equal(cut[f"blocks.0.attn.{part}.bias"], weights[f"blocks.0.attn.{part}.bias"][rows])
    assert torch.equal(cut["blocks.0.attn.proj.weight"], weights["blocks.0.attn.proj.weight"][:48, rows])
    assert torch.equal(cut["blocks.0.mlp.fc1.weight"], weights["blocks.0.mlp.fc1.weight"][:192, :48])
    assert torch.equal(cut["token_embedding.weight"], weights["token_embedding.weight"][:, :48])
    # the plain leading slice regroups heads: its head 1 would be the second half of global head 0
    plain = extract(weights, leading_indices(weights, sub.state_dict()))
    assert torch.equal(plain["blocks.0.attn.q.weight"], weights["blocks.0.attn.q.weight"][:48, :48])
    assert not torch.equal(plain["blocks.0.attn.q.weight"], cut["blocks.0.attn.q.weight"])
    assert not torch.equal(plain["blocks.0.attn.proj.weight"], cut["blocks.0.attn.proj.weight"])
    assert torch.equal(plain["blocks.0.mlp.fc2.weight"], cut["blocks.0.mlp.fc2.weight"])   # no head: the same


def test_rolling_head_aware_slice_rolls_within_each_head():
    assert head_channels(3, 4, 2).tolist() == [0, 1, 4, 5, 8, 9]
    assert head_channels(3, 4, 2, offset=3).tolist() == [3, 0, 7, 4, 11, 8]       # (3 + i) mod 4 in each head
    glob, sub = GPT(layers=1), GPT(layers=1, width=0.5)
    ix = head_aware_indices(glob, sub, offset=3)
    assert ix["blocks.0.attn.q.weight"][0].tolist() == [3, 0, 7, 4, 11, 8]
    assert ix["blocks.0.attn.q.weight"][1].tolist() == [3, 4, 5, 6, 7, 8]         # residual: window(12, 6, 3)
    assert ix["blocks.0.attn.proj.weight"][0].tolist() == [3, 4, 5, 6, 7, 8]
    assert ix["blocks.0.attn.proj.weight"][1].tolist() == [3, 0, 7, 4, 11, 8]
    assert ix["blocks.0.mlp.fc1.weight"][0].tolist() == window(48, 24, 3).tolist()
    # "window" roll, round 3 (r = 2): starts 2·6 mod 12 = 0 (residual) and 2·2 mod 4 = 0 (heads)
    ix = head_aware_indices(glob, sub, offset=rolling_offset(3, "window"))
    assert ix["blocks.0.attn.k.bias"][0].tolist() == [0, 1, 4, 5, 8, 9]
    assert rolling_offset(1) == 0 and rolling_offset(4) == 3


def test_full_width_slice_is_the_global_model():
    glob = GPT(layers=2)
    with torch.no_grad():
        for p in glob.parameters():
            p.normal_(0, 0.3, generator=torch.Generator().manual_seed(p.numel()))
    for offset in (0, 5):
        ix = head_aware_indices(glob, GPT(layers=2, width=1.0), offset)
        assert all(i is None for index in ix.values() for i in index)
        copy = GPT(layers=2)
        copy.load_state_dict(extract(glob.state_dict(), ix))
        x = torch.randint(V, (3, CONTEXT), generator=torch.Generator().manual_seed(1))
        assert torch.equal(copy(x), glob(x))


@pytest.mark.parametrize("offset", [0, 1])
def test_sliced_attention_is_the_global_attention_restricted_to_its_channels(offset):
    """Global attention with zero input on the residual channels the slice drops and zero q/k/v on the attention
    channels it drops computes, on the kept residual channels, what the sliced attention computes — once the global
    q is scaled by sqrt(d / d_s) = sqrt(2) to match the sub-model's 1/sqrt(d_s) attention temperature."""
    g = torch.Generator().manual_seed(0)
    glob, sub = Attention(12, 3, causal=True), Attention(6, 3, causal=True)
    with torch.no_grad():
        for p in glob.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    ix = head_aware_indices(glob, sub, offset)
    kept_attn, kept_res = ix["q.weight"][0], ix["q.weight"][1]
    dropped = torch.ones(12, dtype=torch.bool)
    dropped[kept_attn] = False
    with torch.no_grad():
        for part in (glob.q, glob.k, glob.v):
            part.weight[dropped] = 0.0
            part.bias[dropped] = 0.0
    sub.load_state_dict(extract(glob.state_dict(), ix))
    plain = Attention(6, 3, causal=True)
    plain.load_state_dict(extract(glob.state_dict(), leading_indices(glob.state_dict(), sub.state_dict())))
    with torch.no_grad():
        glob.q.weight.mul_(math.sqrt(2.0))
        glob.q.bias.mul_(math.sqrt(2.0))
    x_sub = torch.randn(2, 5, 6, generator=g)
    x = torch.zeros(2, 5, 12)
    x[..., kept_res] = x_sub
    expected = glob(x)[..., kept_res]
    assert torch.allclose(sub(x_sub), expected, atol=1e-5)
    assert not torch.allclose(plain(x_sub), expected, atol=1e-2)


# ----- width choice (CAFF appendix, Eq. 7) ----------------------------------------------------------------------------
def test_width_is_the_largest_that_fits_all_three_budgets():
    rows = width_rows(hand_table(), (1.0, 0.5, 0.25, 0.125), layers=2)
    assert sorted(rows) == [0.125, 0.25, 0.5, 1.0] and rows[0.125]["memory_mb"] == 10     # the depth-3 row dropped
    assert assign_largest(rows, DeviceBudget("a", memory_mb=20), "width", "width") == 0.5         # 0.25 and 0.5 tie at 12 MB -> 0.5
    assert assign_largest(rows, DeviceBudget("b", memory_mb=12), "width", "width") == 0.5         # a cost equal to the budget fits
    assert assign_largest(rows, DeviceBudget("c", memory_mb=11.9), "width", "width") == 0.125
    assert assign_largest(rows, DeviceBudget("d", upload_mb=1, gflops=1.5), "width", "width") == 0.125   # compute binds
    assert assign_largest(rows, DeviceBudget("e"), "width", "width") == 1.0
    with pytest.raises(ValueError, match=r"device weak cannot train any width of \[1.0, 0.5, 0.25, 0.125\]: the "
                                         r"smallest exceeds memory \(needs 10 MB for width=0.125, has 5 MB\)"):
        assign_largest(rows, DeviceBudget("weak", memory_mb=5, gflops=2), "width", "width")
    with pytest.raises(ValueError, match=r"no row for width=\[0.75\]"):
        width_rows(hand_table(), (0.75, 0.5), layers=2)


def test_configure_gives_each_group_its_width_and_names_an_infeasible_device():
    pretrained = {n: p + 0.01 for n, p in GPT(layers=2).state_dict().items()}
    method = _method(pretrained={2: pretrained},
                     budgets={"0.5": {"memory_mb": 20}, "1": {}, "tiny": {"upload_mb": 0.05}})
    ctx = _ctx()
    state = method.init(ctx)
    assert state["layers"] == 2 and state["weights"]["blocks.0.attn.q.weight"].shape == (12, 12)
    assert all(torch.equal(state["weights"][n], p) for n, p in pretrained.items())     # the pretrained F_2
    tasks = method.configure(state, 1, [ClientProfile(0, keep_ratio=0.5), ClientProfile(1)], ctx)
    assert tasks[0].config["width"] == 0.5 and tasks[1].config["width"] == 1.0
    assert tasks[0].tensors["blocks.1.attn.q.weight"].shape == (6, 6)
    assert tasks[0].tensors["blocks.1.mlp.fc1.weight"].shape == (24, 6)
    assert tasks[0].tensors["token_embedding.weight"].shape == (V, 6)            # frozen, but sent
    v_bias = state["weights"]["blocks.1.attn.v.bias"]
    assert torch.equal(tasks[0].tensors["blocks.1.attn.v.bias"], v_bias[[0, 1, 4, 5, 8, 9]])
    with pytest.raises(ValueError, match=r"device 7 cannot train any width .* upload \(needs 0.1 MB for "
                                         r"width=0.125, has 0.05 MB\)"):
        method.configure(state, 1, [ClientProfile(7, group="tiny")], ctx)
    # the profile's own budget wins over its group's
    assert method.configure(state, 1, [ClientProfile(3, group="1", gflops=2)], ctx)[3].config["width"] == 0.5


def test_measured_table_grows_with_width():
    batch = torch.randint(V, (4, CONTEXT), generator=torch.Generator().manual_seed(0))
    table = width_resource_table(GPT, 2, (0.25, 0.5, 1.0), batch)
    assert table.width.tolist() == [0.25, 0.5, 1.0] and (table.layers == 2).all()
    for column in ("memory_mb", "upload_mb", "gflops"):
        assert table[column].is_monotonic_increasing and table[column].is_unique, column
    # upload = trained float32 entries (embeddings frozen): per block 12E² + 13E (ln1, ln2, q, k, v, proj, fc1 E->4E,
    # fc2), final LayerNorm 2E, head V·E (no bias); E = 3, 6, 12
    for e, upload in zip((3, 6, 12), table.upload_mb):
        assert upload * 1e6 == 4 * (2 * (12 * e * e + 13 * e) + 2 * e + V * e)
    assert table.upload_mb.tolist()[1] * 1e6 == 4896 and table.upload_mb.tolist()[2] * 1e6 == 16704


# ----- upload and aggregation -------------------------------------------------------------------------------------
def test_upload_holds_the_trained_tensors_only():
    method = _method()
    ctx = _ctx()
    state = method.init(ctx)
    task = method.configure(state, 1, [ClientProfile(0, keep_ratio=0.5, memory_mb=20)], ctx)[0]
    data = _lm_dataset()
    update = method.local_update(task, ClientDataset(data.train, np.arange(16)), _client_ctx())
    assert not any(name.startswith(EMBEDDING_NAMES) for name in update.tensors)
    assert set(update.tensors) == set(trainable_parameter_names(width_model(GPT, 2, 0.5)))
    assert update.tensors["blocks.0.attn.q.weight"].shape == (6, 6) and update.stats["width"] == 0.5
    assert not torch.equal(update.tensors["head.weight"], task.tensors["head.weight"])          # it trained


def test_aggregation_averages_each_entry_over_the_devices_that_hold_it():
    method = _method()
    ctx = _ctx()
    state = method.init(ctx)
    server = state["weights"]
    small, smaller = width_model(GPT, 2, 0.5), width_model(GPT, 2, 0.25)
    const = lambda model, v: {n: torch.full(p.shape, v) for n, p in model.named_parameters() if p.requires_grad}  # noqa
    updates = [Update(0, const(small, 1.0), 1, {"width": 0.5, "group": "a"}),
               Update(1, const(smaller, 5.0), 3, {"width": 0.25, "group": "b"})]
    new = method.aggregate(state, 1, updates, ctx)
    q = new["weights"]["blocks.0.attn.q.weight"]
    # width 0.25 holds rows {0, 4, 8} x cols {0, 1, 2}; width 0.5 rows {0, 1, 4, 5, 8, 9} x cols {0..5}
    assert q[4, 2].item() == pytest.approx((1 * 1 + 3 * 5) / 4)           # both devices: 4.0
    assert q[5, 2].item() == 1.0 and q[0, 4].item() == 1.0                # width 0.5 only
    assert q[2, 0] == server["blocks.0.attn.q.weight"][2, 0]             # nobody (channel 2 of head 0)
    assert torch.equal(q[:, 6:], server["blocks.0.attn.q.weight"][:, 6:])
    assert torch.equal(new["weights"]["token_embedding.weight"], server["token_embedding.weight"])   # never uploaded
    assert new["levels"] == [0.25, 0.5]
    assert method.round_metrics(new, 1) == {("width", "global"): 0.375, ("width", "a"): 0.5, ("width", "b"): 0.25}
    models = method.evaluation_models(new, ctx)
    assert set(models) == {"0.25", "0.5", "global"}
    assert torch.equal(models["0.5"].state_dict()["blocks.0.attn.q.weight"], q[[0, 1, 4, 5, 8, 9], :6])
    # FedRolex in round 2 (offset 1): width 0.5 holds rows {1, 2, 5, 6, 9, 10} x cols {1..6}
    rolex = _method(FedRolexFinetuning)
    new = rolex.aggregate(state, 2, updates[:1], ctx)["weights"]["blocks.0.attn.q.weight"]
    assert new[1, 1].item() == 1.0 and new[2, 6].item() == 1.0 and new[10, 1].item() == 1.0
    assert new[0, 0] == server["blocks.0.attn.q.weight"][0, 0] and new[1, 0] == server["blocks.0.attn.q.weight"][1, 0]


# ----- FjORD's ordered dropout ----------------------------------------------------------------------------------------
def test_ordered_dropout_runs_and_trains_the_head_aware_leading_subnetwork():
    cap = width_model(GPT, 2, 0.5)
    with torch.no_grad():
        for p in cap.parameters():
            p.normal_(0, 0.3, generator=torch.Generator().manual_seed(p.numel()))
    skeleton = width_model(GPT, 2, 0.25)
    ix = head_aware_indices(cap, skeleton)
    net = HeadAwareOrderedDropout(cap, 0.5, {0.25: skeleton}, {0.25: ix}, [0.25, 0.5], torch.Generator())
    assert [n for n, _ in net.named_parameters()] == [f"cap_model.{n}" for n, _ in cap.named_parameters()]
    x = torch.randint(V, (2, CONTEXT), generator=torch.Generator().manual_seed(0))
    alone = width_model(GPT, 2, 0.25)
    alone.load_state_dict(extract(cap.state_dict(), ix))
    out = net.run(0.25, x)
    assert torch.allclose(out, alone(x), atol=1e-6)
    out.square().mean().backward()
    grad = cap.blocks[0].attn.q.weight.grad            # (6, 6); the 0.25 slice: rows {0, 2, 4} x cols {0, 1, 2}
    rows, cols = torch.tensor([0, 2, 4]), torch.arange(3)
    mask = torch.zeros(6, 6, dtype=torch.bool)
    mask[rows[:, None], cols] = True
    assert grad[mask].abs().sum() > 0 and grad[~mask].abs().sum() == 0
    assert cap.token_embedding.weight.grad is None                  # frozen


def test_fjord_update_draws_widths_up_to_its_cap():
    method = _method(FjORDFinetuning, widths=(1.0, 0.5, 0.25))
    ctx = _ctx()
    state = method.init(ctx)
    task = method.configure(state, 1, [ClientProfile(0, keep_ratio=0.5, memory_mb=20)], ctx)[0]
    assert task.config["width"] == 0.5 and task.config["widths"] == [0.25, 0.5]
    update = method.local_update(task, ClientDataset(_lm_dataset().train, np.arange(16)), _client_ctx())
    counts = update.stats["width_counts"]
    assert set(counts) <= {"0.25", "0.5"} and sum(counts.values()) == 2              # local_steps = 2
    assert update.tensors["blocks.0.attn.q.weight"].shape == (6, 6) and update.stats["width"] == 0.5
    assert not any(name.startswith(EMBEDDING_NAMES) for name in update.tensors)


# ----- end to end -----------------------------------------------------------------------------------------------------
def _vit_upload_bytes(width: float) -> int:
    factory = Factory("tiny_vit", num_classes=10, input_shape=(1, 8, 8), layers=2, embed_dim=12, heads=3)
    return parameter_bytes(width_model(factory, 2, width), trainable_only=True)


@pytest.mark.parametrize("name", ["heterofl-ft", "fjord-ft", "fedrolex-ft"])
def test_run_experiment_end_to_end(name, tmp_path):
    small, large = _vit_upload_bytes(0.5), _vit_upload_bytes(1.0)
    assert small < large
    cfg = make_config(name, "digits", "tiny_vit", scale="ci", heterogeneity="0.5:0.5,1.0:0.5",
                      clients_per_round=4, max_train_samples=64, max_test_samples=32, optimizer="adamw", lr=1e-3,
                      batch_size=8, local_steps=1, model_options={"layers": 2, "embed_dim": 12, "heads": 3},
                      method_options={"pretrained": "none", "widths": (1.0, 0.5, 0.25),
                                      "budgets": {"0.5": {"upload_mb": (small + large) / 2e6}, "1": {}}})
    result = run_experiment(cfg, tmp_path, cache=False)
    assert result.summary["rounds"] == 2 and 0.0 <= result.summary["final_accuracy"] <= 1.0
    widths = result.history[result.history.metric == "width"].set_index(["round", "group"]).value
    assert widths.loc[(2, "0.5")] == 0.5 and widths.loc[(2, "1")] == 1.0
    accuracy = result.history[result.history.metric == "accuracy"]
    assert {"global", "0.5", "1"} <= set(accuracy.group) and accuracy.value.between(0.0, 1.0).all()
    groups = {p.client_id: p.group for p in cfg.heterogeneity_setting.profiles(cfg.num_clients, cfg.seed, 1)}
    ledger = result.ledger
    up = ledger[(ledger.direction == "up") & (ledger.name != "__config__")]
    assert not up.name.str.contains("embedding|cls_token").any()
    per_client = up.groupby(["round", "client"]).bytes.sum()
    for (_, client), total in per_client.items():
        assert total == (small if groups[client] == "0.5" else large)
    assert {groups[c] for _, c in per_client.index} == {"0.5", "1"}


# ----- options --------------------------------------------------------------------------------------------------------
def test_options_are_checked():
    assert METHODS["heterofl-ft"] is HeteroFLFinetuning and METHODS["fjord-ft"] is FjORDFinetuning
    assert METHODS["fedrolex-ft"] is FedRolexFinetuning
    assert HeteroFLFinetuning().widths == (1.0, 0.5, 0.25, 0.125) and check_widths([0.5, 1]) == (1.0, 0.5)
    for bad in ((), (0.5, 0.5), (0,), (1.5,), "0.5", (True,), None):
        with pytest.raises(ValueError, match=r"option widths must be a non-empty sequence of distinct numbers in "
                                             r"\(0, 1\]"):
            FjORDFinetuning(widths=bad)
    with pytest.raises(ValueError, match=r"option roll must be one of \('unit', 'window'\)"):
        FedRolexFinetuning(roll="step")
    with pytest.raises(ValueError, match="unknown option"):
        HeteroFLFinetuning(roll="unit")
    with pytest.raises(ValueError, match="unknown option"):
        HeteroFLFinetuning(scaler=True)
    with pytest.raises(ValueError, match="option budgets must be a dict"):
        HeteroFLFinetuning(budgets=[1])
    with pytest.raises(ValueError, match="option architecture must be an int"):
        HeteroFLFinetuning(architecture="3")
    with pytest.raises(ValueError, match="heterofl-ft needs pretrained weights"):
        HeteroFLFinetuning().init(_ctx())
    with pytest.raises(ValueError, match=r"no pretrained weights for depth 4 .* available depths: \[2\]"):
        HeteroFLFinetuning(pretrained={2: GPT(layers=2).state_dict()}, architecture=4).init(_ctx())
    with pytest.raises(ValueError, match="differing"):
        head_aware_indices(GPT(layers=1), GPT(layers=2, width=0.5))
