"""PriSM's memory-efficient sub-model: output-subset layers (subfl.models.output_subset), the method
(subfl.methods.prism_memory) and the constant-channel memory it would save (subfl.costs.constant_channels)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from subfl.costs import activation_memory_bytes
from subfl.costs.constant_channels import constant_channel_memory, memory_efficient_cost_table
from subfl.data.base import ArrayData
from subfl.experiments import make_config, run_experiment
from subfl.fl.training import ClientDataset, LocalTraining
from subfl.fl.types import ClientProfile, Update
from subfl.methods import METHODS, make_method
from subfl.fl.method import ClientContext, ServerContext
from subfl.models.factorized import build_submodel, decompose, factorized_modules, layer_specs
from subfl.models.output_subset import OutputSubsetConv2d, OutputSubsetLinear, restrict_outputs
from subfl.sampling import keep_count
from .helpers import Factory

SMALL_MLP = Factory("mlp", input_shape=(1, 4, 4), num_classes=3, hidden=(12, 10))  # 16 -> 12 -> 10 -> 3
CNN = Factory("cnn", width=0.25, input_shape=(3, 16, 16))  # conv2 (16 channels) and fc1 (128 units) decomposed


def _ctx(factory, num_clients=3, input_shape=(1, 4, 4)) -> ServerContext:
    return ServerContext(model_fn=factory, training=LocalTraining(lr=0.05, batch_size=8, local_steps=2), rounds=2,
                         seed=0, num_classes=3, input_shape=input_shape, num_clients=num_clients)


def _half_terms_submodel(model):
    factors = decompose(model)
    return build_submodel(model, factors, {n: range(0, f.num_terms, 2) for n, f in factors.items()})


# ----- layers -----------------------------------------------------------------------------------------------
def test_output_subset_layers_compute_the_first_rows_and_zero_the_rest():
    model = CNN()
    sub = _half_terms_submodel(model).eval()
    full = {n: (m.u.detach().clone(), m) for n, m in factorized_modules(sub).items()}
    outputs = {"conv2": 5, "fc1": 32}
    x = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    # reference: the plain sub-model with the rows >= o of U' set to zero (the released code's masking)
    with torch.no_grad():
        for name, (u, m) in full.items():
            m.u[outputs[name]:] = 0.0
        expected = sub(x)
        for name, (u, m) in full.items():
            m.u.copy_(u)
    restricted = restrict_outputs(sub, outputs).eval()
    layers = factorized_modules(restricted)
    assert isinstance(layers["conv2"], OutputSubsetConv2d) and isinstance(layers["fc1"], OutputSubsetLinear)
    assert tuple(layers["conv2"].u.shape) == (5, layers["conv2"].rank)
    assert tuple(layers["fc1"].u.shape) == (32, layers["fc1"].rank)
    with torch.no_grad():
        assert (restricted(x) - expected).abs().max().item() < 1e-5
        conv_out = layers["conv2"](torch.randn(2, 8, 8, 8))
        bias = layers["conv2"].bias.view(1, -1, 1, 1).expand_as(conv_out)
        assert torch.equal(conv_out[:, 5:], bias[:, 5:])  # the other channels are the bias alone
        w = layers["conv2"].dense_weight()
        assert w.shape == model.conv2.weight.shape and torch.count_nonzero(w[5:]) == 0


def test_output_subset_layers_compute_chosen_rows_and_zero_the_rest():
    model = CNN()
    sub = _half_terms_submodel(model).eval()
    rows = {"conv2": [1, 4, 6, 13, 15], "fc1": list(range(0, 128, 4))}
    x = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    layers_before = factorized_modules(sub)
    kept_u = {n: m.u.detach()[rows[n]].clone() for n, m in layers_before.items()}
    with torch.no_grad():  # reference: the plain sub-model with every row outside R zeroed
        for n, m in layers_before.items():
            mask = torch.ones(m.u.shape[0], dtype=torch.bool)
            mask[rows[n]] = False
            m.u[mask] = 0.0
        expected = sub(x)
        for n, m in layers_before.items():
            m.u[rows[n]] = kept_u[n]
    restricted = restrict_outputs(sub, rows).eval()
    layers = factorized_modules(restricted)
    assert torch.equal(layers["conv2"].u.detach(), kept_u["conv2"])  # row a of u is row R[a] of U'
    assert "5 chosen of 16" in repr(layers["conv2"]) and "state_dict" not in repr(layers["conv2"])
    assert set(restricted.state_dict()) == set(sub.state_dict())  # the rows are not part of the state
    out = restricted(x)
    assert (out - expected).abs().max().item() < 1e-5
    conv_out = layers["conv2"](torch.randn(2, 8, 8, 8))
    others = [c for c in range(16) if c not in rows["conv2"]]
    bias = layers["conv2"].bias.view(1, -1, 1, 1).expand_as(conv_out)
    assert torch.equal(conv_out[:, others], bias[:, others])
    w = layers["conv2"].dense_weight()
    assert torch.count_nonzero(w[others]) == 0 and torch.count_nonzero(w[rows["conv2"]]) > 0
    out.sum().backward()  # gradients reach exactly the held rows
    assert layers["conv2"].u.grad.shape == (5, layers["conv2"].rank) and layers["conv2"].u.grad.abs().sum() > 0


def test_leading_rows_given_as_indices_are_the_leading_count():
    rows = restrict_outputs(_half_terms_submodel(CNN()), {"conv2": [0, 1, 2]})
    counted = restrict_outputs(_half_terms_submodel(CNN()), {"conv2": 3})
    layer = factorized_modules(rows)["conv2"]
    assert layer.rows is None and layer.outputs == 3 and torch.equal(layer.row_indices(), torch.arange(3))
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    assert torch.equal(rows.eval()(x), counted.eval()(x))


def test_restrict_outputs_rejects_bad_arguments():
    sub = _half_terms_submodel(CNN())
    with pytest.raises(ValueError, match="not factorized layers"):
        restrict_outputs(sub, {"conv1": 2})
    with pytest.raises(ValueError, match=r"outputs of layer 'conv2' must be an integer in \[1, 16\]"):
        restrict_outputs(sub, {"conv2": 17})
    with pytest.raises(ValueError, match="outputs of layer 'fc1'"):
        restrict_outputs(sub, {"fc1": 0})
    for bad in ([1, 1, 2], [3, 16], [-1, 2], [], [0.5, 1.5], "ab"):
        with pytest.raises(ValueError, match=r"distinct row indices in \[0, 15\]"):
            restrict_outputs(sub, {"conv2": bad})


# ----- the method ---------------------------------------------------------------------------------------------
def test_registered_and_options_validated():
    assert METHODS["prism+memory"]().config["strategy"] == "prism"
    for bad in (0, 1.5, True, float("nan"), "0.2"):
        with pytest.raises(ValueError, match="option output_keep"):
            make_method("prism+memory", output_keep=bad)
    assert make_method("prism+memory", output_keep=1).config["output_keep"] == 1.0
    assert make_method("prism+memory", strategy="topn").base == "topn"
    assert METHODS["prism+memory"]().config["output_rows"] == "leading"
    with pytest.raises(ValueError, match="option output_rows='first' is not valid; accepted: 'leading', 'random'"):
        make_method("prism+memory", output_rows="first")


@pytest.mark.parametrize("output_keep,expected", [(None, {0.2: 2, 0.4: 4}), (0.5, {0.2: 5, 0.4: 5})])
def test_configure_sends_the_first_rows_of_u(output_keep, expected):
    method = make_method("prism+memory", output_keep=output_keep)
    ctx = _ctx(SMALL_MLP)
    state = method.init(ctx)
    tasks = method.configure(state, 1, [ClientProfile(0, 0.2), ClientProfile(1, 0.4)], ctx)
    u = state["factors"]["layers.3"]["u"]
    for task, r in zip(tasks.values(), (0.2, 0.4)):
        terms = task.config["terms"]["layers.3"]
        assert len(terms) == keep_count(10, r)
        assert task.config["outputs"] == {"layers.3": expected[r]}
        assert torch.equal(task.tensors["layers.3.u"], u[: expected[r], terms])


def _echo(tasks, sizes, edit=None):
    updates = []
    for (cid, task), n in zip(sorted(tasks.items()), sizes):
        tensors = {k: v.clone() for k, v in task.tensors.items() if not k.endswith(".omega")}
        if edit is not None:
            edit(tensors)
        updates.append(Update(cid, tensors, n, {"keep_ratio": task.config["keep_ratio"],
                                                "terms": task.config["terms"]}))
    return updates


def test_unchanged_clients_leave_the_model_unchanged():
    method = make_method("prism+memory")
    ctx = _ctx(SMALL_MLP)
    state = method.init(ctx)
    tasks = method.configure(state, 1, [ClientProfile(c, r) for c, r in enumerate((0.2, 0.4, 0.4))], ctx)
    new = method.aggregate(state, 1, _echo(tasks, [5, 7, 9]), ctx)
    for k, v in state["weights"].items():
        assert torch.allclose(new["weights"][k], v, atol=1e-6), k


def test_aggregation_averages_the_held_rows_and_keeps_the_cached_ones():
    method = make_method("prism+memory", strategy="topn", output_keep=0.3)  # terms 0, 1; rows 0..2 of 10
    ctx = _ctx(SMALL_MLP)
    state = method.init(ctx)
    tasks = method.configure(state, 1, [ClientProfile(0, 0.2), ClientProfile(1, 0.2)], ctx)
    shifts = iter([(1.0, -1.0), (5.0, -3.0)])

    def edit(tensors):
        du, dv = next(shifts)
        tensors["layers.3.u"] += du
        tensors["layers.3.v"] += dv

    new = method.aggregate(state, 1, _echo(tasks, [1, 3], edit), ctx)
    u = state["factors"]["layers.3"]["u"].double().clone()
    v = state["factors"]["layers.3"]["v"].double().clone()
    u[:3, :2] += (1 * 1.0 + 3 * 5.0) / 4  # data-size weighted mean of the shifts, held rows only
    v[:2] += (1 * -1.0 + 3 * -3.0) / 4
    assert torch.allclose(new["weights"]["layers.3.weight"], (u @ v).float(), atol=1e-5)


def test_random_rows_are_uniform_distinct_and_fresh_each_round():
    method = make_method("prism+memory", output_rows="random", output_keep=0.3)  # 3 of layers.3's 10 rows
    ctx = _ctx(SMALL_MLP)
    state = method.init(ctx)
    u = state["factors"]["layers.3"]["u"]
    hits = np.zeros(10)
    draws = 0
    for rnd in (1, 2):
        tasks = method.configure(state, rnd, [ClientProfile(c, 0.2) for c in range(400)], ctx)
        for task in tasks.values():
            rows = task.config["outputs"]["layers.3"]
            assert len(rows) == 3 and rows == sorted(set(rows)) and all(0 <= j < 10 for j in rows)
            assert torch.equal(task.tensors["layers.3.u"], u[rows][:, task.config["terms"]["layers.3"]])
            hits[rows] += 1
            draws += 1
    # each row's inclusion frequency is 3/10; binomial sd over 800 draws is 0.016: allow 4 sd
    assert np.abs(hits / draws - 0.3).max() < 4 * math.sqrt(0.3 * 0.7 / draws)
    again = method.configure(state, 1, [ClientProfile(0, 0.2)], ctx)[0].config["outputs"]
    first, second = (method.configure(state, r, [ClientProfile(0, 0.2)], ctx)[0].config["outputs"] for r in (1, 2))
    assert again == first and first != second  # the same per (round, client), fresh across rounds


def _update(cid, n, tensors, terms, keep_ratio, outputs=None):
    stats = {"keep_ratio": keep_ratio, "terms": terms}
    if outputs is not None:
        stats["outputs"] = outputs
    return Update(cid, tensors, n, stats)


def test_random_rows_are_averaged_per_entry_over_the_clients_that_held_them():
    method = make_method("prism+memory", strategy="topn", output_rows="random", output_keep=0.3)  # terms 0, 1
    ctx = _ctx(SMALL_MLP)
    state = method.init(ctx)
    task = method.configure(state, 1, [ClientProfile(0, 0.2)], ctx)[0]
    u = state["factors"]["layers.3"]["u"].double().clone()
    v = state["factors"]["layers.3"]["v"].double().clone()
    terms = {"layers.3": [0, 1]}
    dense = {k: t for k, t in task.tensors.items() if k not in ("layers.3.u", "layers.3.v", "layers.3.omega")}
    updates = []
    for cid, (rows, du, dv, n) in enumerate((([0, 1, 2], 1.0, -1.0, 1), ([2, 3, 4], 5.0, -3.0, 3))):
        tensors = {**dense, "layers.3.u": (u[rows][:, :2] + du).float(), "layers.3.v": (v[:2] + dv).float()}
        updates.append(_update(cid, n, tensors, terms, 0.2, {"layers.3": rows}))
    new = method.aggregate(state, 1, updates, ctx)
    u[[0, 1], :2] += 1.0              # held by client 0 only
    u[2, :2] += (1 * 1.0 + 3 * 5.0) / 4  # held by both: data-size weighted
    u[[3, 4], :2] += 5.0              # held by client 1 only; rows 5..9 held by nobody keep their value
    v[:2] += (1 * -1.0 + 3 * -3.0) / 4
    assert torch.allclose(new["weights"]["layers.3.weight"], (u @ v).float(), atol=1e-5)
    del updates[0].stats["outputs"]
    with pytest.raises(ValueError, match=r"lacks stats\['outputs'\]\['layers.3'\]"):
        method.aggregate(state, 1, updates, ctx)


def test_heterogeneous_leading_rows_are_not_diluted_by_cached_values():
    # keep 0.2 holds rows 0..1 and terms 0..1; keep 0.4 holds rows 0..3 and terms 0..3 (topn, q = r)
    method = make_method("prism+memory", strategy="topn")
    ctx = _ctx(SMALL_MLP)
    state = method.init(ctx)
    tasks = method.configure(state, 1, [ClientProfile(0, 0.2), ClientProfile(1, 0.4)], ctx)
    assert [t.config["outputs"]["layers.3"] for t in tasks.values()] == [2, 4]
    shifts = iter([2.0, 6.0])

    def edit(tensors):
        tensors["layers.3.u"] += next(shifts)

    new = method.aggregate(state, 1, _echo(tasks, [1, 1], edit), ctx)
    u = state["factors"]["layers.3"]["u"].double().clone()
    v = state["factors"]["layers.3"]["v"].double()
    u[:2, :2] += 4.0   # entries both clients held: their mean
    u[2:4, :2] += 6.0  # held by the 0.4 client alone: its value (a per-term average with the cached rows gives 3)
    u[:4, 2:4] += 6.0  # terms 2, 3: the 0.4 client alone
    assert torch.allclose(new["weights"]["layers.3.weight"], (u @ v).float(), atol=1e-5)


def test_update_with_wrong_rows_is_rejected():
    method = make_method("prism+memory")
    ctx = _ctx(SMALL_MLP)
    state = method.init(ctx)
    tasks = method.configure(state, 1, [ClientProfile(0, 0.2)], ctx)

    def widen(tensors):
        tensors["layers.3.u"] = torch.zeros(10, tensors["layers.3.u"].shape[1])

    with pytest.raises(ValueError, match=r"layers.3.u has shape \(10, 2\), expected \(2, 2\) for its 2 outputs"):
        method.aggregate(state, 1, _echo(tasks, [1], widen), ctx)


def test_client_trains_only_the_rows_it_holds():
    factory = Factory("resnet18", width=0.125, input_shape=(3, 32, 32))
    ctx = _ctx(factory, num_clients=1, input_shape=(3, 32, 32))
    method = make_method("prism+memory", output_keep=0.5)
    state = method.init(ctx)
    task = method.configure(state, 1, [ClientProfile(0, 0.25)], ctx)[0]
    assert task.tensors["layer1.0.conv1.u"].shape == (4, keep_count(8, 0.25))
    g = torch.Generator().manual_seed(0)
    data = ClientDataset(ArrayData(torch.randn(8, 3, 32, 32, generator=g), torch.randint(0, 10, (8,), generator=g)),
                         np.arange(8))
    update = method.local_update(task, data, ClientContext(factory, torch.Generator().manual_seed(1)))
    assert math.isfinite(update.stats["loss"]) and task.config["outputs"]["layer1.0.conv1"] == 4
    sent = {k: v for k, v in task.tensors.items() if not k.endswith(".omega")}
    assert {k: v.shape for k, v in update.tensors.items()} == {k: v.shape for k, v in sent.items()}
    assert not torch.equal(update.tensors["layer2.0.conv1.u"], sent["layer2.0.conv1.u"])  # trained
    new = method.aggregate(state, 1, [update], ctx)
    assert set(new["weights"]) == set(state["weights"])


def test_end_to_end_uploads_fewer_rows_than_prism(tmp_path):
    runs = {}
    for method in ("prism", "prism+memory"):
        cfg = make_config(method, "digits", "mlp", scale="ci", clients_per_round=2, heterogeneity="0.2")
        runs[method] = run_experiment(cfg, tmp_path / method.replace("+", "_"), cache=False, progress=False)
    up = {m: r.ledger[(r.ledger.direction == "up") & (r.ledger.name == "layers.3.u")] for m, r in runs.items()}
    shape = {m: tuple(int(s) for s in u["shape"].iloc[0].split("x")) for m, u in up.items()}
    n_out = shape["prism"][0]
    assert shape["prism+memory"] == (keep_count(n_out, 0.2), shape["prism"][1])  # keep ratio 0.2
    assert runs["prism+memory"].curve("accuracy").value.between(0, 1).all()
    again = run_experiment(make_config("prism+memory", "digits", "mlp", scale="ci", clients_per_round=2,
                                       heterogeneity="0.2"),
                           tmp_path / "again", cache=False, progress=False)
    assert again.history.equals(runs["prism+memory"].history)


def test_end_to_end_random_rows_train_every_row(tmp_path):
    cfg = make_config("prism+memory", "digits", "mlp", scale="ci", clients_per_round=2, heterogeneity="0.2",
                      method_options=(("output_rows", "random"),))
    run = run_experiment(cfg, tmp_path / "random", cache=False, progress=False)
    up = run.ledger[(run.ledger.direction == "up") & (run.ledger.name == "layers.3.u")]
    assert {tuple(int(s) for s in shape.split("x"))[0] for shape in up["shape"]} == {keep_count(200, 0.2)}
    assert run.curve("accuracy").value.between(0, 1).all()
    again = run_experiment(cfg, tmp_path / "again", cache=False, progress=False)
    assert again.history.equals(run.history)


# ----- constant-channel memory -----------------------------------------------------------------------------
def test_constant_channel_bytes_of_a_known_model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6, bias=False), nn.ReLU(), nn.Linear(6, 2))
    with torch.no_grad():
        model[0].weight[3:] = 0.0  # features 3..5 are zero for every input
    x = torch.randn(5, 4)
    memory = constant_channel_memory(model, x)
    # ReLU keeps its (5, 6) output (the second linear saves the same tensor): 3 of its 6 columns are zero
    assert memory.constant == 3 * 5 * 4
    assert memory.total == activation_memory_bytes(model, x) and memory.needed == memory.total - 3 * 5 * 4
    with pytest.raises(ValueError, match="example_input"):
        constant_channel_memory(model, torch.tensor(1.0))


def test_constant_channel_bytes_of_the_memory_efficient_cnn():
    model = CNN()  # conv1 16x16 -> pool 8x8 -> conv2 (16 ch) 8x8 -> pool 4x4 -> fc1 (256 -> 128) -> fc2
    x = 0.01 * torch.rand(6, 3, 16, 16, generator=torch.Generator().manual_seed(0))  # logits far from saturating
    plain = _half_terms_submodel(model)
    sub = restrict_outputs(_half_terms_submodel(model), {"conv2": 4, "fc1": 32})
    with torch.no_grad():  # positive inputs and weights: no ReLU is dead; no bias: dropped outputs are exactly zero
        for net in (plain, sub):
            for p in net.parameters():
                p.abs_()
            for m in factorized_modules(net).values():
                m.bias.zero_()
    assert constant_channel_memory(plain, x).constant == 0
    memory = constant_channel_memory(sub, x)
    # ReLU after conv2 keeps (6, 16, 8, 8) with 12 zero channels; fc1 keeps its flattened (6, 256) input, whose
    # 12·16 columns from those channels are zero; the ReLU after fc1 keeps (6, 128) with 96 zero columns
    assert memory.constant == 4 * 6 * (12 * 8 * 8 + 12 * 4 * 4 + 96)
    assert memory.total == constant_channel_memory(plain, x).total  # stock modules keep every channel


def test_resnet18_memory_efficient_submodel_keeps_fewer_live_bytes():
    model = Factory("resnet18", width=0.125, input_shape=(3, 32, 32))(norm="bn_nostats")
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    specs = layer_specs(model)
    dense = constant_channel_memory(model, x)
    needed = {}
    for q in (0.25, 0.5):
        outputs = {n: keep_count(s.out_features, q) for n, s in specs.items()}
        sub = restrict_outputs(_half_terms_submodel(model), outputs)
        needed[q] = constant_channel_memory(sub, x).needed
    assert dense.constant == 0
    assert needed[0.25] < needed[0.5] < dense.total


def test_cost_table_counts_the_rows_of_u_each_variant_drops():
    table = memory_efficient_cost_table("cnn", 0.25, (0.25, 0.5), batch_size=4, width=0.25, input_shape=(3, 16, 16),
                                        norm=None).set_index("model")
    specs = layer_specs(CNN())  # conv2: 16 outputs, 200 terms -> 16; fc1: 128 outputs, 256 inputs -> 128 terms
    terms = {n: keep_count(s.num_terms, 0.25) for n, s in specs.items()}
    plain = table.loc["sub-model 0.25×"]
    for q in (0.25, 0.5):
        row = table.loc[f"memory-efficient, q = {q:g}"]
        dropped = sum((s.out_features - keep_count(s.out_features, q)) * terms[n] for n, s in specs.items())
        assert plain.params - row.params == dropped
        assert row.activations_mb == plain.activations_mb and row.needed_mb < plain.needed_mb
    assert table.loc["dense", "params_ratio"] == 1.0 and table.loc["dense", "macs_ratio"] == 1.0
    with pytest.raises(ValueError, match="output_keeps"):
        memory_efficient_cost_table("cnn", 0.25, (0.0,))
    with pytest.raises(ValueError, match="batch_size"):
        memory_efficient_cost_table("cnn", 0.25, batch_size=1)
