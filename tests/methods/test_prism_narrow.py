"""PriSM's narrowed sub-model (subfl.methods.prism_narrow): the entries a client holds, its training against the real
narrowed network of subfl.costs.narrow_submodel, the per-entry aggregation, and what travels."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from subfl.costs.narrow_submodel import NarrowFactorizedConv2d, narrow_submodel
from subfl.data.base import ArrayData
from subfl.experiments import make_config, run_experiment
from subfl.fl.method import ClientContext, ServerContext
from subfl.fl.training import ClientDataset, LocalTraining, train_epochs
from subfl.fl.types import ClientProfile, Update
from subfl.methods import make_method
from subfl.methods.prism_narrow import narrow_indices
from subfl.models.slicing import coverage, state_shapes
from subfl.sampling import keep_count
from .helpers import Factory

RESNET = Factory("resnet18", width=0.125, input_shape=(3, 32, 32), norm="bn_nostats")  # stages of 8/16/32/64
SMALL_MLP = Factory("mlp", input_shape=(1, 4, 4), num_classes=3, hidden=(12, 10))  # 16 -> 12 -> 10 -> 3


def _ctx(factory, input_shape=(1, 4, 4), num_classes=3) -> ServerContext:
    return ServerContext(model_fn=factory, training=LocalTraining(lr=0.05, batch_size=8, local_steps=2), rounds=2,
                         seed=0, num_classes=num_classes, input_shape=input_shape, num_clients=4)


def _held(indices, shapes):
    return {k: int(m.sum()) for k, m in coverage(indices, shapes).items()}


def test_held_entries_of_resnet18_are_the_narrowed_networks_tensors():
    dense = RESNET()
    indices = narrow_indices(dense.state_dict(), RESNET(width=0.125 * 0.25).state_dict(), 0.25)
    held = _held(indices, state_shapes(dense.state_dict()))
    assert held["conv1.weight"] == 2 * 3 * 9           # stem: ⌈0.25·8⌉ = 2 outputs of the 3 image channels
    assert held["layer1.0.conv1.weight"] == 2 * 2 * 9  # 2 outputs from 2 inputs
    assert held["layer2.0.conv1.weight"] == 4 * 2 * 9  # ⌈0.25·16⌉ = 4 from the 2 of stage 1
    assert held["layer2.0.shortcut.0.weight"] == 4 * 2
    assert held["layer4.1.bn2.weight"] == 16
    assert held["fc.weight"] == 10 * 16 and held["fc.bias"] == 10  # every class, the 16 kept features
    narrow = narrow_submodel(dense, 0.25)
    dense_only = [k for k in held if "conv" not in k or k.startswith("conv1") or "shortcut" in k]
    assert sum(held[k] for k in dense_only) == sum(p.numel() for k, p in narrow.named_parameters()
                                                   if k in dense_only)


def test_held_entries_follow_a_flatten_into_a_linear_layer():
    cnn = Factory("cnn", width=0.25, input_shape=(3, 16, 16))   # conv2: 16 channels on 4x4, fc1: 256 -> 128
    indices = narrow_indices(cnn().state_dict(), cnn(width=0.25 * 0.5).state_dict(), 0.5)
    assert indices["fc1.weight"][0].tolist() == list(range(64))
    assert indices["fc1.weight"][1].tolist() == list(range(8 * 16))   # ⌈0.5·16⌉ channels x 16 positions
    assert indices["fc2.weight"][0] is None                            # every class


def _copy_into_narrow(client, narrow):
    """The real narrowed ResNet with the client's held weights (ω folded into each Conv_U)."""
    with torch.no_grad():
        cs = dict(client.named_modules())
        factorized = {n for n, m in narrow.named_modules() if isinstance(m, NarrowFactorizedConv2d)}
        for name, module in narrow.named_modules():
            if name.rpartition(".")[0] in factorized:
                continue   # Conv_V / Conv_U of a decomposed layer: copied with the layer
            src = cs[name]
            if name in factorized:
                r, r_in = module.v.out_channels, module.v.in_channels
                module.v.weight.copy_(src.v[:, :r_in])
                module.u.weight.copy_((src.u * src.omega)[:r, :r, None, None])
            elif isinstance(module, torch.nn.Conv2d):   # the stem, or a shortcut (decomposed on the client)
                weight = src.weight if not hasattr(src, "v") else \
                    torch.einsum("ok,k...->o...", src.u * src.omega, src.v)
                module.weight.copy_(weight[:module.out_channels, :module.in_channels])
            elif isinstance(module, torch.nn.BatchNorm2d):
                module.weight.copy_(src.weight[:module.num_features])
                module.bias.copy_(src.bias[:module.num_features])
            elif isinstance(module, torch.nn.Linear):
                module.weight.copy_(src.weight[:, :module.in_features])
                module.bias.copy_(src.bias)


def test_the_zero_padded_client_trains_exactly_the_narrowed_network():
    """Logits, loss and every held gradient of the client equal those of subfl.costs.narrow_submodel's network
    with the same weights; the gradient of every entry the client does not hold is exactly zero."""
    ctx = _ctx(RESNET, (3, 32, 32), 10)
    method = make_method("prism+narrow", strategy="topn")
    state = method.init(ctx)
    task = method.configure(state, 1, [ClientProfile(0, 0.5)], ctx)[0]
    client = method.client_model(task, ClientContext(RESNET, torch.Generator().manual_seed(1))).train()
    narrow = narrow_submodel(RESNET(), 0.5).train()
    _copy_into_narrow(client, narrow)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(6, 3, 32, 32, generator=g), torch.randint(0, 10, (6,), generator=g)
    loss_client, loss_narrow = F.cross_entropy(client(x), y), F.cross_entropy(narrow(x), y)
    assert (client(x) - narrow(x)).abs().max().item() < 1e-4
    loss_client.backward()
    loss_narrow.backward()
    assert abs(loss_client.item() - loss_narrow.item()) < 1e-5
    conv = client.layer2[0].conv1   # Conv_V's gradient on the kept inputs equals the narrowed layer's
    r_in = narrow.layer2[0].conv1.v.in_channels
    assert torch.allclose(conv.v.grad[:, :r_in], narrow.layer2[0].conv1.v.weight.grad, atol=1e-5)
    assert torch.allclose(client.conv1.weight.grad[:4], narrow.conv1.weight.grad, atol=1e-5)
    assert torch.allclose(client.fc.weight.grad[:, :32], narrow.fc.weight.grad, atol=1e-5)
    dense = method.dense_indices(RESNET, 0.5, state["norm"])
    indices = method.task_indices(dense, task.config["terms"], dict(client.state_dict()))
    masks = coverage(indices, state_shapes(client.state_dict()))
    outside = sum(float((p.grad * ~masks[k]).abs().sum()) for k, p in client.named_parameters())
    assert outside == 0.0


def test_entries_outside_the_slices_stay_zero_under_momentum_and_weight_decay():
    ctx = _ctx(RESNET, (3, 32, 32), 10)
    method = make_method("prism+narrow")
    state = method.init(ctx)
    task = method.configure(state, 1, [ClientProfile(0, 0.25)], ctx)[0]
    client = method.client_model(task, ClientContext(RESNET, torch.Generator().manual_seed(1)))
    g = torch.Generator().manual_seed(0)
    data = ClientDataset(ArrayData(torch.randn(8, 3, 32, 32, generator=g), torch.randint(0, 10, (8,), generator=g)),
                         np.arange(8))
    before = {k: v.clone() for k, v in client.state_dict().items()}
    train_epochs(client, data, {**task.config["train"], "momentum": 0.9, "weight_decay": 0.01, "local_steps": 3},
                 torch.Generator().manual_seed(2))
    masks = coverage(method.task_indices(method.dense_indices(RESNET, 0.25, state["norm"]), task.config["terms"],
                                         before), state_shapes(before))
    after = client.state_dict()
    assert sum(float((after[k] * ~masks[k]).abs().sum()) for k in after) == 0.0
    assert not torch.equal(after["conv1.weight"], before["conv1.weight"])   # the held entries trained


def test_tasks_and_updates_carry_only_the_held_entries():
    ctx = _ctx(SMALL_MLP)
    method = make_method("prism+narrow", strategy="topn")
    state = method.init(ctx)
    task = method.configure(state, 1, [ClientProfile(0, 0.25)], ctx)[0]
    # 16 -> 12 -> 10 -> 3: keeps ⌈0.25·12⌉ = 3 and ⌈0.25·10⌉ = 3 units; layers.3 (12 -> 10) is decomposed
    shapes = {k: tuple(v.shape) for k, v in task.tensors.items()}
    assert shapes["layers.1.weight"] == (3, 16) and shapes["layers.1.bias"] == (3,)
    assert shapes["layers.3.u"] == (3, keep_count(10, 0.25)) and shapes["layers.3.v"] == (keep_count(10, 0.25), 3)
    assert shapes["layers.5.weight"] == (3, 3) and shapes["layers.5.bias"] == (3,)
    g = torch.Generator().manual_seed(0)
    data = ClientDataset(ArrayData(torch.randn(8, 1, 4, 4, generator=g), torch.randint(0, 3, (8,), generator=g)),
                         np.arange(8))
    update = method.local_update(task, data, ClientContext(SMALL_MLP, torch.Generator().manual_seed(1)))
    assert {k: tuple(v.shape) for k, v in update.tensors.items()} == {k: s for k, s in shapes.items()
                                                                      if not k.endswith(".omega")}


def _echo(tasks, sizes, shift):
    return [Update(cid, {k: v.clone() + (shift[cid] if k == "layers.1.bias" else 0.0)
                         for k, v in task.tensors.items() if not k.endswith(".omega")}, n,
                   {"keep_ratio": task.config["keep_ratio"], "terms": task.config["terms"]})
            for (cid, task), n in zip(sorted(tasks.items()), sizes)]


def test_every_entry_is_averaged_over_the_clients_that_held_it():
    ctx = _ctx(SMALL_MLP)
    method = make_method("prism+narrow", strategy="topn")
    state = method.init(ctx)
    tasks = method.configure(state, 1, [ClientProfile(0, 0.25), ClientProfile(1, 0.5)], ctx)
    new = method.aggregate(state, 1, _echo(tasks, [1, 3], {0: 1.0, 1: 5.0}), ctx)
    expected = state["weights"]["layers.1.bias"].clone()
    expected[:3] += (1 * 1.0 + 3 * 5.0) / 4   # held by both (⌈0.25·12⌉ = 3)
    expected[3:6] += 5.0                     # held by the 0.5 client only (⌈0.5·12⌉ = 6)
    assert torch.allclose(new["weights"]["layers.1.bias"], expected, atol=1e-6)
    unchanged = method.aggregate(state, 1, _echo(tasks, [1, 3], {0: 0.0, 1: 0.0}), ctx)
    for k, w in state["weights"].items():
        assert torch.allclose(unchanged["weights"][k], w, atol=1e-5), k
    assert unchanged["levels"] == [0.25, 0.5]


def test_the_narrowed_evaluation_model_zeroes_what_the_clients_do_not_hold():
    ctx = _ctx(SMALL_MLP)
    method = make_method("prism+narrow")
    state = {**method.init(ctx), "levels": [0.25]}
    models = method.evaluation_models(state, ctx)
    assert set(models) == {"global", "narrow 0.25"}
    w = models["narrow 0.25"].state_dict()
    assert w["layers.1.weight"][3:].abs().sum() == 0 and w["layers.1.weight"][:3].abs().sum() > 0
    assert w["layers.5.weight"][:, 3:].abs().sum() == 0 and torch.equal(w["layers.5.bias"],
                                                                          state["weights"]["layers.5.bias"])


def test_end_to_end_uploads_less_than_the_memory_efficient_submodel(tmp_path):
    runs = {}
    for method in ("prism+memory", "prism+narrow"):
        cfg = make_config(method, "digits", "mlp", scale="ci", clients_per_round=2, heterogeneity="0.25")
        runs[method] = run_experiment(cfg, tmp_path / method.replace("+", "_"), cache=False, progress=False)
    up = {m: r.ledger[r.ledger.direction == "up"].groupby("round").bytes.sum().iloc[0] for m, r in runs.items()}
    assert up["prism+narrow"] < 0.5 * up["prism+memory"]
    groups = set(runs["prism+narrow"].history.group)
    assert {"global", "narrow 0.25"} <= groups
    assert runs["prism+narrow"].curve("accuracy").value.between(0, 1).all()


def test_options_and_models_it_cannot_narrow_are_refused():
    with pytest.raises(ValueError, match="output_keep=0.5"):
        make_method("prism+narrow", output_keep=0.5)
    with pytest.raises(ValueError, match="output_rows='random'"):
        make_method("prism+narrow", output_rows="random")
    gn = Factory("cnn", width=0.25, input_shape=(3, 16, 16), norm="gn")
    with pytest.raises(ValueError, match="GroupNorm"):
        make_method("prism+narrow").dense_indices(gn, 0.5, "")
