"""FedP3's ResNet-18 block ablation (subfl.methods.fedp3_blocks)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from subfl.data.base import ArrayData
from subfl.fl.training import ClientDataset, LocalTraining
from subfl.fl.types import ClientProfile
from subfl.methods import make_method
from subfl.fl.method import ClientContext, ServerContext
from subfl.methods.fedp3 import magnitude_mask
from subfl.methods.fedp3_blocks import matches_unit
from .helpers import Factory


def _resnet_ctx(num_clients=40) -> tuple[Factory, ServerContext]:
    factory = Factory("resnet18", input_shape=(3, 8, 8), norm="bn_nostats")
    factory.width = 0.0625
    ctx = ServerContext(model_fn=factory, training=LocalTraining(lr=0.1, batch_size=8, local_steps=1), rounds=3,
                        seed=0, num_classes=10, input_shape=(3, 8, 8), num_clients=num_clients)
    return factory, ctx


def test_matches_unit_by_name_or_path_prefix():
    assert matches_unit("layer2.0", "layer2") and matches_unit("layer2.1", "layer2.1")
    assert not matches_unit("layer20", "layer2") and not matches_unit("layer2.1", "layer2.0")


def test_excluded_blocks_are_never_assigned_and_stay_at_init_pruned():
    factory, ctx = _resnet_ctx()
    method = make_method("fedp3-blocks", excluded=["layer2", "layer3.1"])
    state = method.init(ctx)
    assert method.excluded_units(ctx) == ["layer2.0", "layer2.1", "layer3.1"]
    tasks = method.configure(state, 1, [ClientProfile(c) for c in range(40)], ctx)
    assigned = [t.config["trained_units"] for t in tasks.values()]
    assert all(len(units) == 3 and units[-1] == "fc" for units in assigned)  # OPU2: two blocks + the FFC
    drawn = {u for units in assigned for u in units[:-1]}
    assert drawn == {"conv1", "layer1.0", "layer1.1", "layer3.0", "layer4.0", "layer4.1"}  # 40 clients: all six drawn
    # an excluded block's convolutions reach every client pruned to P = 0.9 (the default), like any untrained unit
    task = tasks[0]
    assert "layer2.1.conv1.weight" in task.config["pruned"]
    kept = int(magnitude_mask(state["weights"]["layer2.1.conv1.weight"], 0.9).sum())
    assert kept == round(0.9 * state["weights"]["layer2.1.conv1.weight"].numel())


def test_aggregation_leaves_excluded_blocks_untouched():
    factory, ctx = _resnet_ctx(num_clients=3)
    method = make_method("fedp3-blocks", excluded=["layer2", "layer3"], layers=3)
    state = method.init(ctx)
    tasks = method.configure(state, 1, [ClientProfile(c) for c in range(3)], ctx)
    g = torch.Generator().manual_seed(0)
    data = ClientDataset(ArrayData(torch.randn(16, 3, 8, 8, generator=g), torch.randint(10, (16,), generator=g)),
                         np.arange(16))
    updates = [method.local_update(t, data, ClientContext(factory, torch.Generator().manual_seed(c), "cpu",
                                                          "classification", 10)) for c, t in tasks.items()]
    assert all(not any(k.startswith(("layer2.", "layer3.")) for k in u.tensors) for u in updates)
    new = method.aggregate(state, 1, updates, ctx)["weights"]
    frozen = [k for k in state["weights"] if k.startswith(("layer2.", "layer3."))]
    assert len(frozen) == 4 * 6 + 2 * 3  # 4 blocks × (2 convs + 2 BN weight/bias) + 2 shortcuts × (conv + BN weight/bias)
    assert all(torch.equal(new[k], state["weights"][k]) for k in frozen)
    assert not torch.equal(new["fc.weight"], state["weights"]["fc.weight"])


@pytest.mark.parametrize("excluded, match", [
    ("layer2", "sequence"), (["fc"], "FFC"), (["layer9"], "matches no unit"),
    (["conv1", "layer1", "layer2", "layer3", "layer4"], "leaves no unit")])
def test_bad_exclusions_are_refused(excluded, match):
    _, ctx = _resnet_ctx()
    with pytest.raises(ValueError, match=match):
        make_method("fedp3-blocks", excluded=excluded).init(ctx)


def test_every_block_unpruned_is_fedavg(tmp_path):
    """With all nine blocks assigned (k = 9), nothing excluded and P = 1, equal-size iid clients: FedAvg exactly.
    (Equal sizes matter: FedP3's simple mean and FedAvg's n_k weights differ otherwise.)"""
    from subfl.experiments import make_config, run_experiment

    common = dict(scale="ci", rounds=2, width=0.0625, norm="bn_nostats", partition="iid", max_train_samples=400)
    probe = run_experiment(make_config("fedp3-blocks", "digits", "resnet18", **common,
                                       method_options={"layers": [9], "global_keep": 1.0}), tmp_path / "a", cache=False)
    fedavg = run_experiment(make_config("fedavg", "digits", "resnet18", **common), tmp_path / "b", cache=False)
    assert probe.summary["client_samples"]["min"] == probe.summary["client_samples"]["max"] == 100
    a, b = probe.state()["weights"], fedavg.state()["weights"]
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in b)
