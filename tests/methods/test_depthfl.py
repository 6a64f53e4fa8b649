"""DepthFL (subfl.methods.depthfl): depth choice on a hand-made resource table, the early-exit model, the local loss
by hand, depth-wise aggregation, the ensemble, the ledger of a run in the engine, and a run through run_experiment."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from subfl.costs.params import parameter_bytes
from subfl.experiments import make_config, run_experiment
from subfl.fl.engine import EngineSettings, run_simulation
from subfl.fl.profiles import Heterogeneity
from subfl.fl.training import default_loss
from subfl.fl.types import ClientProfile, Update
from subfl.methods import METHODS
from subfl.methods.depthfl import (DepthFL, EarlyExitTransformer, ExitEnsemble, depth_payload,
                                   depth_rows, depthfl_loss, depthfl_resource_table, early_exit_model,
                                   log_mean_softmax, self_distillation)
from subfl.methods.fedhm import freeze_embeddings
from subfl.methods.finetuning_common import assign_largest, DeviceBudget
from subfl.models import build_model
from subfl.models.transformers import TinyViT, causal_lm_loss

from .test_caff import CONTEXT, V, Factory, _ctx, _lm_dataset, _pretrained


# ----- depth choice --------------------------------------------------------------------------------------------------
def hand_table() -> list[dict]:
    """Depths 2 and 3 of F_3 cost the same (a tie); a row of another depth ``layers`` is ignored."""
    return [dict(layers=3, depth=1, memory_mb=10, upload_mb=1.0, gflops=1.0),
            dict(layers=3, depth=2, memory_mb=14, upload_mb=2.0, gflops=2.0),
            dict(layers=3, depth=3, memory_mb=14, upload_mb=2.0, gflops=2.0),
            dict(layers=6, depth=1, memory_mb=1, upload_mb=0.1, gflops=0.1)]


def test_depth_is_the_largest_that_fits_all_three_budgets():
    rows = depth_rows(hand_table(), 3)
    assert sorted(rows) == [1, 2, 3] and rows[1]["memory_mb"] == 10          # the F_6 row is dropped
    assert assign_largest(rows, DeviceBudget("a", memory_mb=20), "DepthFL depth", "depth") == 3           # 2 and 3 tie at 14 MB -> 3
    assert assign_largest(rows, DeviceBudget("b", memory_mb=14), "DepthFL depth", "depth") == 3           # a cost equal to the budget fits
    assert assign_largest(rows, DeviceBudget("c", memory_mb=13.9), "DepthFL depth", "depth") == 1
    assert assign_largest(rows, DeviceBudget("d", memory_mb=30, upload_mb=5, gflops=1.5), "DepthFL depth", "depth") == 1   # compute binds
    assert assign_largest(rows, DeviceBudget("e"), "DepthFL depth", "depth") == 3
    with pytest.raises(ValueError, match=r"device weak cannot train any DepthFL depth of \[3, 2, 1\]: the smallest "
                                         r"exceeds memory \(needs 10 MB for depth=1, has 5 MB\)"):
        assign_largest(rows, DeviceBudget("weak", memory_mb=5, gflops=2), "DepthFL depth", "depth")
    with pytest.raises(ValueError, match=r"upload \(needs 1 MB for depth=1, has 0.5 MB\)"):
        assign_largest(rows, DeviceBudget("slow", upload_mb=0.5), "DepthFL depth", "depth")
    with pytest.raises(ValueError, match=r"no row for depth=\[3\]"):
        depth_rows(hand_table()[:2], 3)


def test_configure_sends_each_device_its_blocks_and_exits():
    method = DepthFL(pretrained=_pretrained(), resource_table=hand_table(),
                     budgets={"0.5": {"memory_mb": 12}, "1": {}, "tiny": {"upload_mb": 0.5}})
    ctx = _ctx()
    state = method.init(ctx)
    assert state["layers"] == 3
    # exits 1 and 2 start as copies of the pretrained final LayerNorm and head; exit 3 is that head
    pretrained = _pretrained()[3]
    for i in (1, 2):
        assert torch.equal(state["weights"][f"exits.{i}.head.weight"], pretrained["head.weight"])
        assert torch.equal(state["weights"][f"exits.{i}.norm.bias"], pretrained["norm.bias"])
    assert torch.equal(state["weights"]["head.weight"], pretrained["head.weight"])
    tasks = method.configure(state, 1, [ClientProfile(0, group="0.5"), ClientProfile(1, group="1")], ctx)
    assert tasks[0].config["depth"] == 1 and tasks[1].config["depth"] == 3
    assert tasks[0].config["distill_weight"] == 1.0 and tasks[0].config["temperature"] == 1.0
    shallow = set(tasks[0].tensors)
    assert {k.split(".")[0] for k in shallow} == {"token_embedding", "position_embedding", "blocks", "exits"}
    assert {k for k in shallow if k.startswith(("blocks", "exits"))} == \
        {k for k in state["weights"] if k.startswith(("blocks.0.", "exits.1."))}
    assert shallow == set(EarlyExitTransformer(Factory()(layers=3), 1).state_dict())
    assert set(tasks[1].tensors) == set(state["weights"])
    with pytest.raises(ValueError, match=r"device 7 cannot train any DepthFL depth .* upload \(needs 1 MB for "
                                         r"depth=1, has 0.5 MB\)"):
        method.configure(state, 1, [ClientProfile(7, group="tiny")], ctx)


# ----- the early-exit model -------------------------------------------------------------------------------------------
def test_the_last_exit_is_the_model_and_truncation_keeps_the_names():
    model = Factory()(layers=3)
    net = early_exit_model(model)
    x = torch.randint(V, (2, CONTEXT), generator=torch.Generator().manual_seed(0))
    outputs = net(x)
    assert len(outputs) == 3 and all(z.shape == (2, CONTEXT, V) for z in outputs)
    assert torch.allclose(outputs[-1], model(x), atol=1e-6)
    # exit 1 is the pretrained read-out applied after block 1
    h = model.token_embedding(x) + model.position_embedding(torch.arange(CONTEXT))
    assert torch.allclose(outputs[0], model.head(model.norm(model.blocks[0](h))), atol=1e-6)
    for depth in (1, 2, 3):
        assert set(EarlyExitTransformer(model, depth).state_dict()) == set(depth_payload(net.state_dict(), depth, 3))
    vit = TinyViT(10, image_size=8, in_channels=1, num_layers=2, embed_dim=12, num_heads=3, pool="mean")
    images = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    assert torch.allclose(early_exit_model(vit)(images)[-1], vit(images), atol=1e-6)
    with pytest.raises(ValueError, match=r"depth must be an int in \[1, 3\]"):
        EarlyExitTransformer(model, 4)


# ----- the local loss -------------------------------------------------------------------------------------------------
def _tiny_vit(layers: int) -> TinyViT:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        return TinyViT(4, image_size=8, in_channels=1, num_layers=layers, embed_dim=6, num_heads=2)


def test_one_exit_loss_is_the_plain_task_loss():
    images = torch.randn(5, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    y = torch.tensor([0, 1, 2, 3, 1])
    model = _tiny_vit(1)
    outputs = early_exit_model(model)(images)
    assert len(outputs) == 1
    loss = depthfl_loss(outputs, images, y, distill_weight=1.0, temperature=2.0)
    assert loss.item() == pytest.approx(default_loss(model(images), images, y).item(), abs=1e-6)
    assert loss.item() == pytest.approx(F.cross_entropy(model(images), y).item(), abs=1e-6)
    # a depth-1 device of a deeper model: its single exit's cross-entropy
    shallow = EarlyExitTransformer(_tiny_vit(3), 1)(images)
    assert depthfl_loss(shallow, images, y).item() == pytest.approx(F.cross_entropy(shallow[0], y).item(), abs=1e-6)
    # a language model: the next-token loss over every position
    gpt = Factory()(layers=1)
    tokens = torch.randint(V, (2, CONTEXT), generator=torch.Generator().manual_seed(2))
    nxt = torch.tensor([3, 7])
    lm = depthfl_loss(early_exit_model(gpt)(tokens), tokens, nxt)
    assert lm.item() == pytest.approx(causal_lm_loss(gpt(tokens), tokens, nxt).item(), abs=1e-6)


def _loss_by_hand(logits: list[np.ndarray], y: np.ndarray, weight: float, t: float) -> float:
    """Σ_i CE(z_i, y) + λ T² Σ_i mean_b KL(mean_{j≠i} softmax(z_j / T) ‖ softmax(z_i / T)), in float64."""
    def softmax(z):
        e = np.exp(z - z.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    rows = np.arange(len(y))
    ce = sum(-np.log(softmax(z)[rows, y]).mean() for z in logits)
    p = [softmax(z / t) for z in logits]
    kl = 0.0
    for i in range(len(p)):
        q = sum(p[j] for j in range(len(p)) if j != i) / (len(p) - 1)
        kl += (q * (np.log(q) - np.log(p[i]))).sum(axis=1).mean()
    return float(ce + weight * t * t * kl)


def test_two_exit_loss_by_hand():
    images = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    y = torch.tensor([2, 0, 3])
    net = early_exit_model(_tiny_vit(2))
    with torch.no_grad():      # distinct exits (exit 1 starts as a copy of the final head)
        net.exits["1"].head.weight.normal_(0, 1.0, generator=torch.Generator().manual_seed(5))
    z1, z2 = net(images)
    loss = depthfl_loss((z1, z2), images, y, distill_weight=0.5, temperature=2.0)
    a, b = z1.detach().double().numpy(), z2.detach().double().numpy()
    expected = _loss_by_hand([a, b], y.numpy(), 0.5, 2.0)
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    ce = F.cross_entropy(z1, y).item() + F.cross_entropy(z2, y).item()
    assert expected - ce > 1e-4                            # the distillation term is there
    assert depthfl_loss((z1, z2), images, y, distill_weight=0.0).item() == pytest.approx(ce, rel=1e-6)
    # three exits: each matches the mean of the other two
    logits = [torch.randn(4, 5, generator=torch.Generator().manual_seed(s)) for s in range(3)]
    targets = torch.tensor([0, 4, 2, 1])
    assert depthfl_loss(logits, torch.zeros(4), targets, distill_weight=1.0, temperature=1.0).item() == \
        pytest.approx(_loss_by_hand([z.double().numpy() for z in logits], targets.numpy(), 1.0, 1.0), rel=1e-5)
    # the teacher is detached: d/dz_1 of T² KL(q ‖ softmax(z_1 / T)) = T (softmax(z_1 / T) − q) / B
    u = torch.tensor([[1.0, -0.5, 0.2]], requires_grad=True)
    v = torch.tensor([[0.3, 0.9, -1.0]], requires_grad=True)
    self_distillation((u, v), temperature=2.0).backward()
    pu, pv = F.softmax(u.detach() / 2, dim=-1), F.softmax(v.detach() / 2, dim=-1)
    assert torch.allclose(u.grad, 2.0 * (pu - pv), atol=1e-6) and torch.allclose(v.grad, 2.0 * (pv - pu), atol=1e-6)


# ----- aggregation ----------------------------------------------------------------------------------------------------
def test_blocks_and_exits_are_averaged_over_the_devices_that_trained_them():
    weights = early_exit_model(Factory()(layers=3)).state_dict()

    def trained(depth: int) -> list[str]:
        return [k for k in depth_payload(weights, depth, 3) if k.startswith(("blocks", "exits", "norm", "head"))]

    # devices of depths 1, 2, 2 with 1, 3, 2 samples; constant tensors 1, 2, 4
    depths, sizes, values = (1, 2, 2), (1, 3, 2), (1.0, 2.0, 4.0)
    updates = [Update(i, {k: torch.full_like(weights[k], v) for k in trained(d)}, n, {"depth": d, "group": g})
               for i, (d, n, v, g) in enumerate(zip(depths, sizes, values, ("0.5", "1", "1")))]
    method = DepthFL(pretrained="none")
    new = method.aggregate({"weights": weights, "layers": 3, "last_round": []}, 1, updates, None)["weights"]
    everyone, two_of_three = (1 * 1 + 3 * 2 + 2 * 4) / 6, (3 * 2 + 2 * 4) / 5      # 2.5 and 2.8
    assert torch.allclose(new["blocks.0.attn.q.weight"], torch.full((12, 12), everyone))
    assert torch.allclose(new["exits.1.head.weight"], torch.full((V, 12), everyone))
    assert torch.allclose(new["blocks.1.mlp.fc1.bias"], torch.full((48,), two_of_three))
    assert torch.allclose(new["exits.2.norm.weight"], torch.full((12,), two_of_three))
    for name in ("blocks.2.attn.q.weight", "norm.weight", "head.weight", "token_embedding.weight"):
        assert torch.equal(new[name], weights[name])                 # nobody trained them: unchanged
    state = {"weights": new, "layers": 3, "last_round": [{"depth": d, "group": g}
                                                           for d, g in zip(depths, ("0.5", "1", "1"))]}
    assert method.round_metrics(state, 1) == {("trained_layers", "global"): 5 / 3, ("trained_layers", "0.5"): 1.0,
                                              ("trained_layers", "1"): 2.0}


# ----- evaluation -----------------------------------------------------------------------------------------------------
def test_global_model_is_the_ensemble_of_all_exits():
    net = early_exit_model(Factory()(layers=3))
    with torch.no_grad():
        for i in (1, 2):
            net.exits[str(i)].head.weight.normal_(0, 0.5, generator=torch.Generator().manual_seed(i))
    x = torch.randint(V, (4, CONTEXT), generator=torch.Generator().manual_seed(0))
    outputs = net(x)
    ensemble = ExitEnsemble(net)(x)
    mean = sum(F.softmax(z, dim=-1) for z in outputs) / 3
    assert torch.allclose(ensemble, torch.log(mean), atol=1e-5)
    assert torch.allclose(ensemble.exp().sum(-1), torch.ones(4, CONTEXT), atol=1e-5)
    assert torch.allclose(log_mean_softmax([outputs[0]]), F.log_softmax(outputs[0], dim=-1), atol=1e-6)
    method = DepthFL(pretrained="none")
    models = method.evaluation_models({"weights": net.state_dict(), "layers": 3}, _ctx())
    assert sorted(models) == ["exit1", "exit2", "exit3", "global"]
    assert torch.allclose(models["global"](x), ensemble, atol=1e-5)
    for i in (1, 2, 3):
        assert torch.allclose(models[f"exit{i}"](x), outputs[i - 1], atol=1e-5)
    plain = Factory()(layers=3)
    plain.load_state_dict({k: v for k, v in net.state_dict().items() if not k.startswith("exits.")})
    assert torch.allclose(models["exit3"](x), plain(x), atol=1e-5)        # exit l is the finetuned F_l


# ----- in the engine --------------------------------------------------------------------------------------------------
def _trained_bytes(depth: int) -> int:
    return parameter_bytes(freeze_embeddings(EarlyExitTransformer(Factory()(layers=3), depth)), trainable_only=True)


def test_ledger_upload_bytes_are_the_trained_blocks_and_exits():
    small, large = _trained_bytes(1), _trained_bytes(3)
    # float32 entries of a block of width 12: ln1, ln2 (2 x 24), q, k, v, proj (4 x 156), fc1 (12 x 48 + 48),
    # fc2 (48 x 12 + 12) = 1884; an exit: LayerNorm 24 + head 32 x 12 (no bias) = 408
    assert small == 4 * (1884 + 408) == 9168 and large == 3 * small
    method = DepthFL(pretrained=_pretrained(), budgets={"0.5": {"upload_mb": (small + 2 * small) / 2e6}, "1": {}})
    ctx = _ctx()
    data = _lm_dataset()
    parts = np.array_split(np.arange(len(data.train)), 4)
    heterogeneity = Heterogeneity((0.5, 1.0), (0.5, 0.5))
    result = run_simulation(method, data, parts, heterogeneity, ctx, EngineSettings(rounds=2, clients_per_round=4,
                                                                                    seed=0), progress=False)
    table = {row["depth"]: row for row in result.state["table"]}
    assert table[1]["upload_mb"] * 1e6 == pytest.approx(small) and table[3]["upload_mb"] * 1e6 == pytest.approx(large)
    groups = {p.client_id: p.group for p in heterogeneity.profiles(4, 0, 1)}
    ledger = result.ledger.to_frame()
    up = ledger[(ledger.direction == "up") & (ledger.name != "__config__")]
    assert len(up.groupby(["round", "client"])) == 8
    for (round_, client), rows in up.groupby(["round", "client"]):
        depth = 1 if groups[client] == "0.5" else 3
        assert rows.bytes.sum() == (small if depth == 1 else large)
        net = freeze_embeddings(EarlyExitTransformer(Factory()(layers=3), depth))
        assert set(rows.name) == {n for n, p in net.named_parameters() if p.requires_grad}
        assert not rows.name.str.contains("embedding").any()
    down = ledger[(ledger.direction == "down") & (ledger.name != "__config__")]
    shallow = down[(down["round"] == 1) & (down.client.map(groups) == "0.5")].groupby("client").bytes.sum()
    assert (shallow == small + 4 * (V * 12 + CONTEXT * 12)).all()         # + the frozen embeddings
    final = result.state["weights"]
    assert torch.equal(final["token_embedding.weight"], _pretrained()[3]["token_embedding.weight"])   # frozen
    assert not torch.equal(final["exits.1.head.weight"], _pretrained()[3]["head.weight"])
    history = result.history.to_frame()
    depths = history[history.metric == "trained_layers"].set_index(["round", "group"]).value
    assert depths.loc[(2, "global")] == 2.0 and depths.loc[(2, "0.5")] == 1.0 and depths.loc[(2, "1")] == 3.0
    accuracy_groups = set(history[history.metric == "accuracy"].group)
    assert accuracy_groups == {"global", "exit1", "exit2", "exit3"}


def test_run_experiment_end_to_end():
    model = build_model("tiny_vit", num_classes=10, input_shape=(1, 8, 8), layers=2, embed_dim=12, heads=3)
    table = depthfl_resource_table(model, torch.zeros(8, 1, 8, 8)).set_index("depth")
    budget = float(table.upload_mb.mean())                  # between depth 1 and depth 2
    cfg = make_config("depthfl", "digits", "tiny_vit", scale="ci", heterogeneity="0.5:0.5,1.0:0.5",
                      clients_per_round=4, max_train_samples=64, max_test_samples=32, optimizer="adamw", lr=1e-3,
                      batch_size=8, local_steps=1, model_options={"layers": 2, "embed_dim": 12, "heads": 3},
                      method_options={"pretrained": "none", "budgets": {"0.5": {"upload_mb": budget}, "1": {}}})
    result = run_experiment(cfg, cache=False)
    assert result.summary["rounds"] == 2 and 0.0 <= result.summary["final_accuracy"] <= 1.0
    depths = result.history[result.history.metric == "trained_layers"].set_index(["round", "group"]).value
    assert depths.loc[(2, "0.5")] == 1.0 and depths.loc[(2, "1")] == 2.0
    accuracy = result.history[result.history.metric == "accuracy"]
    assert set(accuracy.group) == {"global", "exit1", "exit2"}
    assert accuracy.value.between(0.0, 1.0).all()


# ----- options --------------------------------------------------------------------------------------------------------
def test_options_are_checked():
    assert METHODS["depthfl"] is DepthFL
    method = DepthFL(distill_weight=0, temperature=3)
    assert method.distill_weight == 0.0 and method.temperature == 3.0
    for bad in (-1, math.inf, "1", True, None):
        with pytest.raises(ValueError, match="option distill_weight must be a finite number >= 0"):
            DepthFL(distill_weight=bad)
    for bad in (0, -2.0, math.nan, "2", False):
        with pytest.raises(ValueError, match="option temperature must be a finite number > 0"):
            DepthFL(temperature=bad)
    with pytest.raises(ValueError, match="option budgets must be a dict"):
        DepthFL(budgets=[1])
    with pytest.raises(ValueError, match="option architecture must be an int"):
        DepthFL(architecture="3")
    with pytest.raises(ValueError, match="unknown option"):
        DepthFL(depth=3)
    with pytest.raises(ValueError, match="depthfl needs pretrained weights"):
        DepthFL().init(_ctx())
    with pytest.raises(ValueError, match=r"no pretrained weights for depth 4 .* available depths: \[2, 3\]"):
        DepthFL(pretrained=_pretrained(), architecture=4).init(_ctx())
    with pytest.raises(ValueError, match=r"resource_table lacks column\(s\) \['depth'\]"):
        DepthFL(pretrained=_pretrained(), resource_table=[dict(layers=3, memory_mb=1, upload_mb=1, gflops=1)]
                ).init(_ctx())
