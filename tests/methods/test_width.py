"""Width-sliced sub-models (subfl.models.slicing) and HeteroFL / FjORD / FedRolex (subfl.methods.width)."""
from __future__ import annotations

import math

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
from subfl.methods.width import _OrderedDropout, add_scaler, hidden_layers
from subfl.models import build_model
from subfl.models.slicing import (average_slices, coverage, extract, flatten_boundaries, leading_indices,
                                  leading_view, rolling_indices, scatter, state_shapes, window)
from .helpers import Factory






def _ctx(factory, num_clients=4, rounds=3, **kw) -> ServerContext:
    return ServerContext(model_fn=factory, training=LocalTraining(lr=0.1, batch_size=8), rounds=rounds, seed=0,
                         num_classes=10, input_shape=(1, 8, 8), num_clients=num_clients, **kw)


def _random_state(model):
    g = torch.Generator().manual_seed(1)
    return {k: (torch.randn(v.shape, generator=g) if v.is_floating_point() else v.clone())
            for k, v in model.state_dict().items()}


# ----- slicing -----------------------------------------------------------------------------------------
def test_window_wraps_around():
    assert window(8, 3, 6).tolist() == [6, 7, 0]
    assert window(8, 3).tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="keep"):
        window(4, 5)


@pytest.mark.parametrize("offset", [0, 5])
def test_extract_scatter_roundtrip_resnet18(offset):
    full = build_model("resnet18", num_classes=10, input_shape=(3, 8, 8), width=0.125)
    sub = build_model("resnet18", num_classes=10, input_shape=(3, 8, 8), width=0.0625)
    g = _random_state(full)
    ix = rolling_indices(g, sub.state_dict(), offset)
    s = extract(g, ix)
    assert state_shapes(s) == state_shapes(sub.state_dict())
    sub.load_state_dict(s)  # strict: names and shapes of the 0.0625-width ResNet-18
    assert ix["conv1.weight"][0].tolist() == ((offset + torch.arange(4)) % 8).tolist()  # 64·0.125 = 8 → 4 kept
    assert ix["conv1.weight"][1] is None and ix["fc.weight"][0] is None  # input channels / classes whole
    assert ix["bn1.running_mean"][0].tolist() == ix["conv1.weight"][0].tolist()
    assert ix["bn1.num_batches_tracked"] == ()
    back = scatter(s, ix, g)
    assert all(torch.equal(back[k], g[k]) for k in g)  # scatter(extract(g)) == g
    changed = {k: v + 1 if v.is_floating_point() else v for k, v in s.items()}
    again = extract(scatter(changed, ix, g), ix)
    assert all(torch.equal(again[k], changed[k]) for k in s)  # extract(scatter(s)) == s
    mask = coverage(ix, g)["layer1.0.conv1.weight"]
    assert int(mask.sum()) == 4 * 4 * 9  # 4 of 8 output and 4 of 8 input channels, 3×3 kernels


def test_leading_view_equals_leading_extract_and_is_a_view():
    full, sub = Factory("cnn", 0.25)(), Factory("cnn", 0.125)()
    g = _random_state(full)
    ix = leading_indices(g, sub.state_dict())
    s = extract(g, ix)
    shapes = state_shapes(sub.state_dict())
    for k in g:
        assert torch.equal(leading_view(g[k], shapes[k]), s[k])
    v = leading_view(g["fc1.weight"], shapes["fc1.weight"])
    v.add_(1.0)
    assert torch.equal(g["fc1.weight"][:64, :32], s["fc1.weight"] + 1)


def test_cnn_flatten_boundary_indices():
    full, sub = Factory("cnn", 0.25)(), Factory("cnn", 0.125)()  # conv2: 16 → 8 channels on a 2×2 map
    assert flatten_boundaries(full.state_dict()) == {"fc1.weight": ("conv2.weight", 16, 4)}
    ix = rolling_indices(full.state_dict(), sub.state_dict(), 13)
    channels = [13, 14, 15, 0, 1, 2, 3, 4]
    assert ix["conv2.weight"][0].tolist() == channels
    expected = [c * 4 + j for c in channels for j in range(4)]
    assert ix["fc1.weight"][1].tolist() == expected
    assert expected[:8] == [52, 53, 54, 55, 56, 57, 58, 59] and len(expected) == 32
    assert ix["fc1.weight"][0].tolist() == ((13 + torch.arange(64)) % 128).tolist()
    assert ix["fc2.weight"][0] is None
    # the leading slice of a flatten is the leading features
    assert leading_indices(full.state_dict(), sub.state_dict())["fc1.weight"][1].tolist() == list(range(32))


@pytest.mark.parametrize("name, shape, kwargs", [("cnn", (1, 8, 8), {}),
                                                 ("resnet18", (3, 8, 8), {"norm": "bn_nostats"})])
def test_sub_model_equals_global_model_with_the_rest_zeroed(name, shape, kwargs):
    """A rolling sub-model computes the same function as the global model whose entries outside the sub-model
    are zero: checks the flatten boundary and the consistency of channels across residual connections."""
    width = 0.25 if name == "cnn" else 0.125
    full = build_model(name, num_classes=10, input_shape=shape, width=width, **kwargs)
    sub = build_model(name, num_classes=10, input_shape=shape, width=width / 2, **kwargs)
    g = _random_state(full)
    ix = rolling_indices(g, sub.state_dict(), 7)
    masks = coverage(ix, g)
    zeroed = {k: torch.where(masks[k], v, torch.zeros_like(v)) if v.is_floating_point() else v for k, v in g.items()}
    full.load_state_dict(zeroed)
    sub.load_state_dict(extract(g, ix))
    x = torch.randn(4, *shape, generator=torch.Generator().manual_seed(2))
    full.eval(), sub.eval()
    with torch.no_grad():
        assert torch.allclose(full(x), sub(x), rtol=1e-4, atol=1e-4)


def test_average_slices_weights_one_over_c():
    g = {"w": torch.full((4, 4), -1.0), "n": torch.tensor(7)}
    subs = []
    for value, k in [(1.0, 2), (2.0, 3), (3.0, 3)]:
        s = {"w": torch.full((k, k), value), "n": torch.tensor(int(value))}
        subs.append((s, leading_indices(g, s), 10))  # equal data sizes
    out = average_slices(g, subs)["w"]
    assert out[0, 0].item() == pytest.approx((1 + 2 + 3) / 3)  # trained by c = 3 clients: weight 1/3 each
    assert out[2, 2].item() == pytest.approx((2 + 3) / 2)  # c = 2: weight 1/2
    assert out[1, 2].item() == pytest.approx(2.5)
    assert out[3, 3].item() == -1.0 and out[0, 3].item() == -1.0  # nobody trained it: server value kept
    assert average_slices(g, subs)["n"].item() == 2  # scalar buffer: (1+2+3)/3
    # data-size weights: n = (1, 3) on the shared entry
    two = [(subs[0][0], subs[0][1], 1), (subs[1][0], subs[1][1], 3)]
    assert average_slices(g, two)["w"][0, 0].item() == pytest.approx((1 * 1 + 3 * 2) / 4)


def test_heterofl_aggregate_uses_data_sizes_per_entry():
    method = make_method("heterofl")
    ctx = _ctx(Factory("mlp", hidden=(8,)), num_clients=3)
    state = method.init(ctx)
    g = state["weights"]
    updates = []
    for cid, (p, n, value) in enumerate([(0.25, 10, 1.0), (0.5, 10, 2.0), (1.0, 30, 4.0)]):
        shapes = state_shapes(build_model("mlp", num_classes=10, input_shape=(1, 8, 8), width=p, hidden=(8,))
                              .state_dict())
        updates.append(Update(cid, {k: torch.full(s, value) for k, s in shapes.items()}, n, {"keep_ratio": p}))
    new = method.aggregate(state, 1, updates, ctx)
    w = new["weights"]["layers.1.weight"]  # 8 hidden units: p=0.25 keeps 2, p=0.5 keeps 4
    assert w[0, 0].item() == pytest.approx((10 * 1 + 10 * 2 + 30 * 4) / 50)
    assert w[3, 0].item() == pytest.approx((10 * 2 + 30 * 4) / 40)
    assert w[7, 0].item() == pytest.approx(4.0)
    assert new["levels"] == [0.25, 0.5, 1.0]
    assert g["layers.1.weight"].shape == w.shape


# ----- methods -----------------------------------------------------------------------------------------
def test_methods_registered():
    assert {"heterofl", "fjord", "fedrolex"} <= set(METHODS)
    with pytest.raises(ValueError, match="roll"):
        make_method("fedrolex", roll="sideways")
    with pytest.raises(ValueError, match="widths"):
        make_method("fjord", widths=(0.0, 1.0))


def test_heterofl_requires_a_full_width_client():
    ctx = _ctx(Factory("mlp", hidden=(8,)), num_clients=2)
    with pytest.raises(ValueError, match="full-width"):
        make_method("heterofl", levels=(0.25, 0.5)).init(ctx)
    method = make_method("heterofl")
    state = method.init(ctx)
    with pytest.raises(ValueError, match=r"full-width.*\[0.25, 0.5\]"):
        method.configure(state, 1, [ClientProfile(0, 0.25), ClientProfile(1, 0.5)], ctx)
    assert len(method.configure(state, 1, [ClientProfile(0, 0.25), ClientProfile(1, 1.0)], ctx)) == 2
    make_method("fedrolex", levels=(0.25, 0.5)).init(ctx)  # FedRolex has no such requirement
    with pytest.raises(ValueError, match="full-width"):
        cfg = make_config("heterofl", "digits", "mlp", scale="ci", heterogeneity="uniform:0.25,0.5",
                          clients_per_round=4)
        run_experiment(cfg, cache=False)


def test_static_batch_norm_and_scaler():
    method, ctx = make_method("heterofl"), _ctx(Factory("resnet18", 0.125, input_shape=(3, 8, 8)))
    state = method.init(ctx)
    assert state["norm"] == "bn_nostats" and not any("running" in k for k in state["weights"])
    models = method.evaluation_models({**state, "levels": [0.5, 1.0]}, ctx)
    assert sorted(models) == ["0.5", "1", "global"]
    bns = [m for m in models["0.5"].modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert bns and not any(m.track_running_stats for m in bns)
    assert make_method("heterofl", sbn=False).init(ctx)["norm"] == ""
    # scaler: hidden outputs ÷ p in training, identity in evaluation
    mlp = build_model("mlp", num_classes=3, input_shape=(4,), width=1.0, hidden=(5,))
    assert hidden_layers(mlp) == [mlp.layers[1]]
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    plain_eval = mlp.eval()(x)
    handles = add_scaler(mlp, 0.25)
    fc1, fc2 = mlp.layers[1], mlp.layers[3]
    expected = F.linear(F.relu(F.linear(x, fc1.weight, fc1.bias) / 0.25), fc2.weight, fc2.bias)
    assert torch.allclose(mlp.train()(x), expected)
    assert torch.equal(mlp.eval()(x), plain_eval)
    for h in handles:
        h.remove()
    assert add_scaler(mlp, 1.0) == []


def _client_data(n=96, seed=0):
    g = torch.Generator().manual_seed(seed)
    data = ArrayData(torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g))
    return ClientDataset(data, np.arange(n))


@pytest.mark.parametrize("distill", [False, True])
def test_fjord_width_draws_stay_below_the_cap(distill):
    method = make_method("fjord", distill=distill)
    ctx = _ctx(Factory("cnn", 0.25))
    state = method.init(ctx)
    task = method.configure(state, 1, [ClientProfile(0, 0.6)], ctx)[0]
    assert task.config["width"] == 0.5 and task.config["widths"] == [0.25, 0.5]  # cap: largest width ≤ 0.6
    assert state_shapes(task.tensors) == state_shapes(Factory("cnn", 0.125)().state_dict())
    cctx = ClientContext(ctx.model_fn, torch.Generator().manual_seed(3))
    update = method.local_update(task, _client_data(), cctx)
    counts = update.stats["width_counts"]
    assert set(counts) == {"0.25", "0.5"}  # both drawn in 12 batches (probability 1 - 2^-11)
    assert all(float(q) <= 0.5 for q in counts) and sum(counts.values()) == update.stats["steps"] == 12
    assert state_shapes(update.tensors) == state_shapes(task.tensors)  # returns only the cap slice
    assert math.isfinite(update.stats["loss"])


def test_ordered_dropout_step_trains_only_the_drawn_slice():
    cap = Factory("cnn", 0.25)()
    before = {k: v.clone() for k, v in cap.state_dict().items()}
    skeleton = Factory("cnn", 0.0625)()  # width 0.25 of the cap
    net = _OrderedDropout(cap, 1.0, {0.25: skeleton}, [0.25], torch.Generator().manual_seed(0), False)
    x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
    opt = torch.optim.SGD(net.parameters(), lr=0.5)
    F.cross_entropy(net.train()(x), y).backward()
    opt.step()
    shapes = state_shapes(skeleton.state_dict())
    for k, v in cap.state_dict().items():
        inside = torch.zeros_like(v, dtype=torch.bool)
        leading_view(inside, shapes[k]).fill_(True)
        assert torch.equal(v[~inside], before[k][~inside]), k  # outside the 0.25-slice: untouched
        assert not torch.equal(v[inside], before[k][inside]), k  # inside: trained
    assert net.counts == {"0.25": 1}


@pytest.mark.parametrize("roll", ["unit", "window"])
def test_fedrolex_rolling_coverage(roll):
    method = make_method("fedrolex", roll=roll)
    full, sub = Factory("cnn", 0.25)(), Factory("cnn", 0.0625)()  # p = 0.25: K/k = 8/2, 16/4, 128/32
    g, s = state_shapes(full.state_dict()), state_shapes(sub.state_dict())
    boundaries = flatten_boundaries(g)
    assert method.slice_for({}, 1, g, s)["conv2.weight"][0].tolist() == [0, 1, 2, 3]  # round 1: leading slice
    assert method.slice_for({}, 2, g, s)["conv2.weight"][0].tolist() == ([1, 2, 3, 4] if roll == "unit"
                                                                         else [4, 5, 6, 7])
    checked = 0
    for name in g:
        for d, (big, small) in enumerate(zip(g[name], s[name])):
            if big == small:
                continue
            K, k = (boundaries[name][1], s[boundaries[name][0]][0]) if (d == 1 and name in boundaries) else (big, small)
            needed = math.ceil(K / k) if roll == "window" else K - k + 1
            for start in (1, 6):
                union = set()
                for r in range(start, start + needed):
                    union |= set(method.slice_for({}, r, g, s)[name][d].tolist())
                assert union == set(range(big)), (name, d, start)
                if roll == "unit" and needed > 1:  # tight: one round fewer misses a unit
                    fewer = set()
                    for r in range(start, start + needed - 1):
                        fewer |= set(method.slice_for({}, r, g, s)[name][d].tolist())
                    assert fewer != set(range(big))
            checked += 1
    assert checked == 9  # conv1 out + bias, conv2 out/in + bias, fc1 out/in + bias, fc2 in
    assert math.ceil(128 / 32) == 4 and 128 - 32 + 1 == 97  # the two bounds for fc1's 128 units


# ----- end to end --------------------------------------------------------------------------------------
LEVELS = ["0.25", "0.5", "0.75", "1"]


def _e2e(method, tmp_path, tag, **options):
    cfg = make_config(method, "digits", "mlp", scale="ci", heterogeneity="uniform:0.25,0.5,0.75,1.0",
                      clients_per_round=4, rounds=2, method_options=options)
    return cfg, run_experiment(cfg, tmp_path / tag, cache=False)


@pytest.mark.parametrize("method", ["heterofl", "fjord", "fedrolex"])
def test_end_to_end_per_width_rows_and_sliced_uploads(method, tmp_path):
    cfg, res = _e2e(method, tmp_path, "a")
    acc = res.history[res.history.metric == "accuracy"]
    for r in (1, 2):
        assert sorted(acc[acc["round"] == r].group) == sorted(LEVELS + ["global"])
    final = acc[acc["round"] == 2].set_index("group").value
    assert final["global"] == final["1"] and final["global"] > 0.3  # 10 classes, chance 0.1
    levels = cfg.heterogeneity_setting.static_levels(cfg.num_clients, cfg.seed)
    up = res.ledger[(res.ledger.direction == "up") & (res.ledger.name != "__config__")]
    per_client = up[up["round"] == 1].groupby("client").bytes.sum()
    by_level = {float(levels[c]): int(b) for c, b in per_client.items()}
    for p, nbytes in by_level.items():
        sub = build_model("mlp", num_classes=10, input_shape=(1, 8, 8), width=p)
        assert nbytes == sum(t.numel() * t.element_size() for t in sub.state_dict().values())
    assert by_level[0.25] < by_level[0.5] < by_level[1.0]
    assert by_level[0.25] == 4 * (64 * 50 + 50 + 50 * 50 + 50 + 50 * 10 + 10)  # hidden 200 → 50, float32


def test_runs_are_deterministic(tmp_path):
    _e2e("fjord", tmp_path, "a", distill=True)
    _e2e("fjord", tmp_path, "b", distill=True)
    assert (tmp_path / "a/history.csv").read_bytes() == (tmp_path / "b/history.csv").read_bytes()
    assert (tmp_path / "a/ledger.csv").read_bytes() == (tmp_path / "b/ledger.csv").read_bytes()
