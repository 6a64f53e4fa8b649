"""FedP3 (subfl.methods.fedp3) and its networks (subfl.models.fedp3_nets)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from subfl import privacy
from subfl.data.base import ArrayData
from subfl.experiments import make_config, run_experiment
from subfl.fl.training import ClientDataset, LocalTraining
from subfl.fl.types import ClientProfile, Update
from subfl.methods import METHODS, make_method
from subfl.fl.method import ClientContext, ServerContext
from subfl.methods.fedp3 import (FEDP3_PRESETS, _LocalPruning, decode_pruned, encode_pruned, group_name, kept_count, kept_units,
                                 layer_units, magnitude_mask, model_layers)
from subfl.models import build_model
from subfl.models.fedp3_nets import FedP3CNN, FedP3MLP, build_fedp3_net
from .helpers import Factory






def _ctx(factory, num_clients=4, rounds=3, **training) -> ServerContext:
    return ServerContext(model_fn=factory, training=LocalTraining(**{"lr": 0.1, "batch_size": 8, **training}),
                         rounds=rounds, seed=0, num_classes=factory.kwargs["num_classes"],
                         input_shape=factory.kwargs["input_shape"], num_clients=num_clients)


def _client_data(n=24, shape=(1, 8, 8), classes=10, seed=0) -> ClientDataset:
    g = torch.Generator().manual_seed(seed)
    data = ArrayData(torch.randn((n, *shape), generator=g), torch.randint(classes, (n,), generator=g))
    return ClientDataset(data, np.arange(n))


def _cctx(factory, seed=0) -> ClientContext:
    return ClientContext(factory, torch.Generator().manual_seed(seed), "cpu", "classification", 10)


# ----- networks ---------------------------------------------------------------------------------------
def test_fedp3_cnn_matches_table_4():
    net = build_fedp3_net("fedp3_cnn", num_classes=10, input_shape=(3, 32, 32))
    assert net.flat_features == 1600  # 64·5·5: valid 5x5 convs, 32 → 28 → 14 → 10 → 5
    shapes = [tuple(p.shape) for n, p in net.named_parameters() if n.endswith("weight")]
    assert shapes == [(64, 3, 5, 5), (64, 64, 5, 5), (1024, 1600), (1024, 1024), (10, 1024)]
    assert sum(p.numel() for p in net.parameters()) == 2_806_602
    assert net(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    half = FedP3CNN(10, (3, 32, 32), width=0.25)
    assert (half.conv1.out_channels, half.fc1.in_features, half.fc2.out_features) == (16, 400, 256)
    with pytest.raises(ValueError, match="too small"):
        FedP3CNN(10, (1, 8, 8))
    assert FedP3CNN(10, (1, 8, 8), padding=2)(torch.zeros(1, 1, 8, 8)).shape == (1, 10)  # digits


def test_fedp3_mlp_is_784_1024_1024_1024():
    net = build_fedp3_net("fedp3_mlp", num_classes=26, input_shape=(1, 28, 28))
    shapes = [tuple(p.shape) for n, p in net.named_parameters() if n.endswith("weight")]
    assert shapes == [(1024, 784), (1024, 1024), (1024, 1024), (26, 1024)]
    assert [tuple(p.shape) for n, p in FedP3MLP(26, width=0.5).named_parameters() if n.endswith("weight")][0] == (512, 784)
    with pytest.raises(ValueError, match="not accepted"):
        build_fedp3_net("fedp3_mlp", num_classes=10, input_shape=(1, 28, 28), padding=2)
    with pytest.raises(ValueError, match="not a FedP3 network"):
        build_fedp3_net("lenet", num_classes=10, input_shape=(1, 28, 28))


# ----- layers and units -------------------------------------------------------------------------------
def _covers_state_once(model, units, final):
    keys = [k for u in [*units, final] for k in u.keys]
    return sorted(keys) == sorted(model.state_dict()) and len(keys) == len(set(keys))


def test_layers_of_the_papers_nets_and_resnet18():
    cnn = build_fedp3_net("fedp3_cnn", num_classes=10, input_shape=(3, 32, 32))
    units, final = layer_units(cnn)
    assert [u.name for u in units] == ["conv1", "conv2", "fc1", "fc2"] and final.name == "fc3"
    assert units[0].keys == ("conv1.weight", "conv1.bias")
    resnet = build_model("resnet18", num_classes=10, input_shape=(3, 8, 8), width=0.0625)
    expected = {"layer": 20, "block": 9, "stage": 5}  # + the FFC: 21, 10, 6 units
    for grouping, count in expected.items():
        units, final = layer_units(resnet, grouping)
        assert len(units) == count and final.name == "fc" and _covers_state_once(resnet, units, final)
    layers = {layer.name: layer for layer in model_layers(resnet)}
    assert layers["conv1"].keys[-1] == "bn1.num_batches_tracked" and layers["conv1"].output == "bn1"
    assert layers["layer2.0.shortcut.0"].output == "layer2.0.shortcut.1"
    blocks, _ = layer_units(resnet, "block")
    assert [u.name for u in blocks][:3] == ["conv1", "layer1.0", "layer1.1"]
    assert len(blocks[3].layers) == 3  # layer2.0: conv1, conv2 and the projection shortcut
    assert group_name("layer3.1.conv2", "stage") == "layer3"


def test_presets_registered_with_their_k():
    assert {"fedp3", *FEDP3_PRESETS} <= set(METHODS)
    assert {name: make_method(name).config["layers"] for name in FEDP3_PRESETS} == {
        "lowerb": (1,), "opu2": (2,), "opu3": (3,), "opu123": (1, 2, 3), "opu23": (2, 3)}
    with pytest.raises(ValueError, match="trains layers"):
        make_method("opu2", layers=3)
    for bad in (dict(layers=-1), dict(global_keep=0.0), dict(aggregation="median"), dict(local_pruning="random"),
                dict(q=1.5), dict(ldp={"clip": 1}), dict(clip_norm=0.0), dict(net="lenet"), dict(grouping="row")):
        with pytest.raises(ValueError):
            make_method("fedp3", **bad)


def test_assignment_ffc_always_plus_k_uniform_layers():
    factory = Factory("mlp", hidden=(8, 8, 8, 8))  # 4 assignable units + FFC
    ctx = _ctx(factory, num_clients=10)
    method = make_method("opu123")
    method.init(ctx)
    draws = [method.assign(r, c, ctx) for r in range(1, 41) for c in range(10)]
    assert all(d[-1] == "layers.9" for d in draws)  # the FFC
    sizes = [len(d) - 1 for d in draws]
    assert set(sizes) == {1, 2, 3}
    assert abs(np.mean(sizes) - 2.0) < 0.15  # k uniform on {1, 2, 3}
    counts = {}
    for d in draws:
        for u in d[:-1]:
            counts[u] = counts.get(u, 0) + 1
    assert set(counts) == {"layers.1", "layers.3", "layers.5", "layers.7"}
    assert max(counts.values()) / min(counts.values()) < 1.3  # each unit equally likely (400 draws)
    assert draws == [method.assign(r, c, ctx) for r in range(1, 41) for c in range(10)]  # (seed, round, client)
    cyclic = make_method("opu2", assignment="cyclic")
    cyclic.init(ctx)
    assert cyclic.assign(1, 0, ctx) == cyclic.assign(7, 0, ctx) == ["layers.1", "layers.3", "layers.9"]
    assert cyclic.assign(1, 9, ctx) == ["layers.1", "layers.7", "layers.9"]  # d = ⌊9·4/10⌋ = 3, then 0


# ----- global pruning ---------------------------------------------------------------------------------
@pytest.mark.parametrize("keep", [0.3, 0.5, 0.9, 0.01])
def test_global_pruning_keeps_the_requested_fraction_of_largest_weights(keep):
    factory = Factory("mlp", hidden=(64, 32))
    ctx = _ctx(factory)
    method = make_method("lowerb", global_keep=keep)
    state = method.init(ctx)
    task = method.configure(state, 1, [ClientProfile(0)], ctx)[0]
    trained = set(task.config["trained_units"])
    dense = decode_pruned(task.tensors, {k: v.shape for k, v in state["weights"].items()})
    for name, original in state["weights"].items():
        unit = name.rpartition(".")[0]
        if unit in trained or original.dim() < 2:
            assert name not in task.config["pruned"] and torch.equal(task.tensors[name], original)
            continue
        n = original.numel()
        kept = int((dense[name] != 0).sum())
        assert abs(kept - keep * n) <= 1 and kept == kept_count(n, keep)
        threshold = original.abs().flatten().sort(descending=True).values[kept - 1]
        assert bool((original.abs()[dense[name] != 0] >= threshold).all())  # the largest magnitudes
        assert torch.equal(dense[name][dense[name] != 0], original[dense[name] != 0])
        sent = task.tensors[name].numel() * 4 + sum(task.tensors[name + s].numel() * task.tensors[name + s].element_size()
                                                   for s in ("@mask", "@index") if name + s in task.tensors)
        assert sent == 4 * kept + min(math.ceil(n / 8), 4 * kept)  # honest bytes: values + compact mask
        assert (name + "@index" in task.tensors) == (keep == 0.01)


def test_encode_decode_roundtrip_and_mask_form():
    w = torch.randn(40, 50, generator=torch.Generator().manual_seed(3))
    for keep, suffix in ((0.5, "@mask"), (0.02, "@index")):
        mask = magnitude_mask(w, keep)
        wire = encode_pruned("w", w, mask)
        assert set(wire) == {"w", "w" + suffix}
        assert torch.equal(decode_pruned(wire, {"w": w.shape})["w"], torch.where(mask, w, torch.zeros(())))
    assert kept_count(10, 0.3) == 3 and kept_count(7, 0.01) == 1 and kept_count(5, 1.0) == 5


# ----- upload only trained layers (ledger) and end to end ---------------------------------------------
def test_ledger_shows_only_trained_layers_uploaded_and_pruned_download(tmp_path):
    cfg = make_config("lowerb", "digits", "mlp", scale="ci", method_options={"global_keep": 0.25})
    result = run_experiment(cfg, tmp_path / "lowerb", cache=False)
    ledger = result.ledger
    up = ledger[(ledger.direction == "up") & (ledger.name != "__config__")]
    per_upload = up.groupby(["round", "client"]).name.apply(lambda s: sorted({n.rpartition(".")[0] for n in s}))
    assert len(per_upload) == cfg.rounds * cfg.clients_per_round
    for units in per_upload:  # one of the 2 hidden layers + the FFC (layers.5)
        assert len(units) == 2 and units[-1] == "layers.5" and units[0] in ("layers.1", "layers.3")
    down = ledger[ledger.direction == "down"]
    assert down.name.str.endswith("@mask").any()
    fedavg = run_experiment(cfg.replace(method="fedavg", method_options={}), tmp_path / "fedavg", cache=False)
    assert result.summary["upload_bytes"] < 0.8 * fedavg.summary["upload_bytes"]
    assert result.summary["download_bytes"] < 0.8 * fedavg.summary["download_bytes"]
    rows = result.history[result.history.metric == "unit_clients"]
    assert set(rows[rows.group == "layers.5"].value) == {float(cfg.clients_per_round)}
    assert result.final() > 0.3


def test_end_to_end_every_option_and_determinism(tmp_path):
    options = {"local_pruning": "uniform", "aggregation": "attention", "global_keep": 0.5, "layers": (0, 1),
               "noise_multiplier": 0.3, "clip_norm": 5.0}
    cfg = make_config("fedp3", "digits", "mlp", scale="ci", method_options=options)
    a = run_experiment(cfg, tmp_path / "a", cache=False)
    b = run_experiment(cfg, tmp_path / "b", cache=False)
    assert a.history.equals(b.history)
    eps = a.history[(a.history.metric == "ldp_epsilon") & (a.history.group == "max")].value.tolist()
    assert len(eps) == cfg.rounds and eps[-1] > 0 and eps == sorted(eps)
    assert np.isfinite(a.final())


# ----- local pruning ----------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["uniform", "ordered_dropout"])
def test_local_pruning_trains_only_the_leading_units(mode, monkeypatch):
    factory = Factory("mlp", hidden=(20, 20))
    ctx = _ctx(factory, local_steps=1, batch_size=24)
    method = make_method("fedp3", layers=2, local_pruning=mode, q=0.3, od_widths=(0.25, 0.5, 0.75, 1.0))
    state = method.init(ctx)
    task = method.configure(state, 1, [ClientProfile(0, keep_ratio=0.5)], ctx)[0]
    assert task.config["od_widths"] == [0.25, 0.5]  # capped by the keep ratio
    draws = []
    original = _LocalPruning.draw

    def spy(self):
        draws.append(original(self))
        return draws[-1]

    monkeypatch.setattr("subfl.methods.fedp3._LocalPruning.draw", spy)
    update = method.local_update(task, _client_data(24), _cctx(factory))
    assert len(draws) == 1
    p = draws[0]
    if mode == "uniform":
        assert 0.3 <= p <= 1.0
    else:
        assert p in (0.25, 0.5) and update.stats["local_p_counts"] == {f"{p:g}": 1}
    k = kept_units(20, p)
    changed = {name: update.tensors[f"{name}.weight"] != state["weights"][f"{name}.weight"]
               for name in ("layers.1", "layers.3", "layers.5")}
    for name in ("layers.1", "layers.3"):  # both hidden layers trained, pruned to their leading k units
        rows = changed[name].any(dim=1)
        assert rows[:k].sum() >= k // 2 and not rows[k:].any()  # (a kept unit may be a dead ReLU)
    for name in ("layers.3", "layers.5"):  # inputs from dropped units get no gradient either
        assert not changed[name].any(dim=0)[k:].any()


# ----- aggregation ------------------------------------------------------------------------------------
def _aggregation_setup(**options):
    factory = Factory("mlp", num_classes=2, input_shape=(1, 2, 2), hidden=(3, 3))  # units layers.1, layers.3, FFC
    ctx = _ctx(factory)
    method = make_method("fedp3", **options)
    state = method.init(ctx)
    w = state["weights"]

    def upload(cid, units, value):
        return Update(cid, {k: torch.full_like(v, value) for k, v in w.items() if k.rpartition(".")[0] in units}, 10)

    updates = [upload(0, ("layers.1", "layers.5"), 1.0), upload(1, ("layers.1", "layers.3", "layers.5"), 2.0),
               upload(2, ("layers.5",), 4.0)]
    return method, state, ctx, updates


def test_simple_and_weighted_aggregation_numbers():
    method, state, ctx, updates = _aggregation_setup(aggregation="simple")
    new = method.aggregate(state, 1, updates, ctx)["weights"]
    assert torch.allclose(new["layers.1.weight"], torch.full((3, 4), 1.5))  # (1 + 2) / 2
    assert torch.allclose(new["layers.3.weight"], torch.full((3, 3), 2.0))  # client 1 alone
    assert torch.allclose(new["layers.5.bias"], torch.full((2,), 7 / 3))  # (1 + 2 + 4) / 3
    method, state, ctx, updates = _aggregation_setup(aggregation="weighted")
    new = method.aggregate(state, 1, updates, ctx)["weights"]
    assert torch.allclose(new["layers.1.weight"], torch.full((3, 4), (2 * 1 + 3 * 2) / 5))  # m = 2, 3 → 1.6
    assert torch.allclose(new["layers.5.bias"], torch.full((2,), (2 * 1 + 3 * 2 + 1 * 4) / 6))  # m = 2, 3, 1 → 2
    lone = [Update(0, {k: v for k, v in updates[2].tensors.items()}, 10)]
    kept = method.aggregate(state, 1, lone, ctx)["weights"]
    assert torch.equal(kept["layers.1.weight"], state["weights"]["layers.1.weight"])  # nobody trained it


def test_attention_limits_and_scores():
    for prior, expected in (("simple", 7 / 3), ("weighted", 2.0)):
        method, state, ctx, updates = _aggregation_setup(aggregation="attention", attention_prior=prior,
                                                          attention_temperature=1e9)
        new = method.aggregate(state, 1, updates, ctx)["weights"]
        assert torch.allclose(new["layers.5.bias"], torch.full((2,), expected), atol=1e-5)  # τ → ∞: the prior
    method, state, ctx, _ = _aggregation_setup(aggregation="attention", attention_temperature=0.5)
    w = state["weights"]
    unit = [u for u in method._structure(ctx)["units"] if u.name == "layers.1"][0]
    direction = {k: torch.ones_like(w[k]) for k in unit.keys}
    ups = [Update(c, {k: w[k] + s * direction[k] for k in unit.keys}, 1) for c, s in ((0, 1.0), (1, 1.0), (2, -1.0))]
    weights = method.unit_weights(unit, ups, w, [1, 1, 1])
    # mean update = (1/3)·direction: cosines (1, 1, −1); softmax((1, 1, −1)/0.5)
    expected = np.exp(np.array([2.0, 2.0, -2.0]))
    assert np.allclose(weights, expected / expected.sum())
    assert weights.sum() == pytest.approx(1.0) and weights[2] < 0.01


# ----- LDP --------------------------------------------------------------------------------------------
def test_ldp_update_is_clipped_noised_and_accounted():
    factory = Factory("mlp", hidden=(16,))
    ctx = _ctx(factory, local_steps=3, lr=0.5)
    data = _client_data(24)
    clipped = make_method("fedp3", layers=1, clip_norm=0.01, noise_multiplier=0.0)
    state = clipped.init(ctx)
    task = clipped.configure(state, 1, [ClientProfile(0)], ctx)[0]
    update = clipped.local_update(task, data, _cctx(factory))
    delta = torch.cat([(update.tensors[k] - state["weights"][k]).flatten() for k in update.tensors])
    assert update.stats["ldp"]["update_norm"] > 0.01 and float(delta.norm()) == pytest.approx(0.01, rel=1e-4)
    noisy = make_method("fedp3", layers=1, ldp={"clip_norm": 0.01, "noise_multiplier": 2.0, "sample_rate": 0.5})
    state = noisy.init(ctx)
    task = noisy.configure(state, 1, [ClientProfile(0)], ctx)[0]
    update = noisy.local_update(task, data, _cctx(factory))
    delta = torch.cat([(update.tensors[k] - state["weights"][k]).flatten() for k in update.tensors])
    assert float(delta.std()) == pytest.approx(0.02, rel=0.1)  # σC = 2·0.01 dominates the clipped update
    assert update.stats["ldp"]["effective_noise_multiplier"] == 1.0  # sensitivity 2C
    for rnd in (1, 2, 3):
        state = noisy.aggregate(state, rnd, [update], ctx)
    (eps, delta_), = noisy.privacy_spent(state).values()
    assert delta_ == 1e-5 and eps == pytest.approx(privacy.epsilon(1.0, 0.5, 3, 1e-5))


def test_ldp_dpsgd_steps_and_epsilon():
    factory = Factory("mlp", hidden=(16,))
    ctx = _ctx(factory, local_epochs=1, batch_size=6)
    method = make_method("fedp3", layers=1, ldp_mechanism="dpsgd", noise_multiplier=1.0, clip_norm=1.0)
    state = method.init(ctx)
    task = method.configure(state, 1, [ClientProfile(0)], ctx)[0]
    update = method.local_update(task, _client_data(24), _cctx(factory))
    info = update.stats["ldp"]
    assert info["sample_rate"] == 0.25 and info["steps"] == 4  # q = 6/24, one epoch = 1/q steps
    assert all(torch.isfinite(t).all() for t in update.tensors.values())
    state = method.aggregate(state, 1, [update], ctx)
    (eps, _), = method.privacy_spent(state).values()
    assert eps == pytest.approx(privacy.epsilon(1.0, 0.25, 4, 1e-5))
    bn = Factory("mlp", hidden=(16,), norm="bn")
    ctx = _ctx(bn, local_epochs=1, batch_size=6)
    method = make_method("fedp3", layers=1, ldp_mechanism="dpsgd")
    state = method.init(ctx)
    task = method.configure(state, 1, [ClientProfile(0)], ctx)[0]
    with pytest.raises(ValueError, match="BatchNorm"):
        method.local_update(task, _client_data(24), _cctx(bn))


def test_block_grouping_on_resnet18_uploads_whole_blocks():
    factory = Factory("resnet18", input_shape=(3, 8, 8))
    factory.width = 0.0625
    ctx = _ctx(factory, local_steps=1, batch_size=8)
    method = make_method("lowerb", grouping="block", global_keep=0.5, local_pruning="uniform")
    state = method.init(ctx)
    task = method.configure(state, 1, [ClientProfile(3)], ctx)[3]
    block = task.config["trained_units"][0]
    update = method.local_update(task, _client_data(16, shape=(3, 8, 8)), _cctx(factory))
    units = {u.name: u for u in method._structure(ctx)["units"]}
    assert set(update.tensors) == set(units[block].keys) | {"fc.weight", "fc.bias"}  # the whole block + FFC
    new = method.aggregate(state, 1, [update], ctx)["weights"]
    untouched = [k for k in state["weights"] if k not in update.tensors]
    assert all(torch.equal(new[k], state["weights"][k]) for k in untouched)
    assert any(not torch.equal(new[k], state["weights"][k]) for k in update.tensors if k.endswith("weight"))


def test_net_option_builds_the_papers_cnn(tmp_path):
    cfg = make_config("opu2", "digits", "mlp", scale="ci",
                      method_options={"net": "fedp3_cnn", "net_options": {"padding": 2}, "global_keep": 0.5})
    result = run_experiment(cfg, tmp_path / "cnn", cache=False)
    weights = result.state()["weights"]
    assert [k for k in weights if k.endswith("weight")] == [f"{n}.weight" for n in
                                                           ("conv1", "conv2", "fc1", "fc2", "fc3")]
    assert tuple(weights["fc1.weight"].shape) == (1024, 256)  # 64 channels · 2·2 on padded 8x8 digits
    up = result.ledger[(result.ledger.direction == "up") & (result.ledger.name != "__config__")]
    assert up.groupby(["round", "client"]).name.apply(lambda s: len({n.rpartition(".")[0] for n in s})).eq(3).all()
    assert np.isfinite(result.final())


# ----- personalised evaluation: the deployed model --------------------------------------------------------
@pytest.mark.parametrize("keep", [0.5, 0.9])
def test_deployed_model_is_what_configure_sends(keep):
    """Sec. 2 / Alg. 2 line 3: the client deploys P_i(x) — its assigned units dense, every other weight tensor
    magnitude-pruned to P; exactly the dense form of the task configure builds."""
    factory = Factory("mlp", hidden=(64, 32))
    ctx = _ctx(factory)
    method = make_method("lowerb", global_keep=keep)
    state = method.init(ctx)
    for rnd, cid in ((1, 0), (2, 3), (3, 1)):
        profile = ClientProfile(cid)
        deployed = method.deployed_model(state, rnd, profile, ctx).state_dict()
        task = method.configure(state, rnd, [profile], ctx)[cid]
        sent = decode_pruned(task.tensors, {k: v.shape for k, v in state["weights"].items()})
        assert set(deployed) == set(sent)
        for name in sent:
            assert torch.equal(deployed[name], sent[name]), name
        trained = set(task.config["trained_units"])
        pruned = [n for n in deployed if n.rpartition(".")[0] not in trained and deployed[n].dim() >= 2]
        assert pruned and pruned == task.config["pruned"]
        for name in pruned:
            n = deployed[name].numel()
            assert int((deployed[name] != 0).sum()) == kept_count(n, keep)  # e.g. 2048 of 4096 at P = 0.5
        assert state["weights"] is not deployed  # the global weights are left dense
        assert all(bool((t != 0).all()) for n, t in state["weights"].items() if t.dim() >= 2)


def test_personalised_models_are_the_global_model_at_p_1_and_group_names_kept():
    factory = Factory("mlp", hidden=(64, 32))
    ctx = _ctx(factory)
    dense = make_method("lowerb")
    state = dense.init(ctx)
    models = dense.evaluation_models(state, ctx)
    assert dense.personalized_models(state, 1, ClientProfile(0), models, ctx) is models
    pruned = make_method("lowerb", global_keep="profile")
    out = pruned.personalized_models(state, 1, ClientProfile(2, keep_ratio=0.25), models, ctx)
    assert set(out) == {"global"} and out["global"] is not models["global"]
    zeros = sum(int((t == 0).sum()) for t in out["global"].state_dict().values())
    assert zeros >= 0.75 * 64 * 64 - 1  # the pruned hidden layer: 3/4 of its 4096 entries are zero
    # the option version keys only runs with P < 1: runs at the default keep their keys
    assert "method:lowerb.global_keep" not in type(dense).behaviour_versions({"global_keep": 1.0})
    assert type(dense).behaviour_versions({"global_keep": 0.5})["method:lowerb.global_keep"] == 1


def test_local_accuracy_scores_each_clients_deployed_model(tmp_path):
    """The engine's local_accuracy is the unweighted mean over clients of their deployed models' local accuracy,
    which at P = 0.25 differs from the dense global model's."""
    from subfl.experiments.runner import client_splits, prepare_data, server_context
    from subfl.fl import evaluate

    cfg = make_config("lowerb", "digits", "mlp", scale="ci", partition="dirichlet", alpha=0.5, num_clients=6,
                      clients_per_round=3, rounds=3, local_test_fraction=0.3, method_options={"global_keep": 0.25})
    res = run_experiment(cfg, tmp_path / "run", cache=False)
    dataset, _, parts = prepare_data(cfg)
    _, local = client_splits(cfg, parts)
    ctx = server_context(cfg, dataset)
    method = make_method(cfg.method, **dict(cfg.method_options))
    state = {"weights": res.state()["weights"]}
    profiles = cfg.heterogeneity_setting.profiles(cfg.num_clients, cfg.seed, cfg.rounds)
    deployed = [evaluate(method.deployed_model(state, cfg.rounds, profiles[i], ctx), dataset.train.subset(idx))
                ["accuracy"] for i, idx in enumerate(local)]
    dense_model = method.evaluation_models(state, ctx)["global"]
    dense = [evaluate(dense_model, dataset.train.subset(idx))["accuracy"] for idx in local]
    assert res.final("local_accuracy") == pytest.approx(float(np.mean(deployed)), abs=1e-12)
    assert abs(float(np.mean(deployed)) - float(np.mean(dense))) > 1e-3
    assert res.final("accuracy") == pytest.approx(evaluate(dense_model, dataset.test)["accuracy"], abs=1e-12)
