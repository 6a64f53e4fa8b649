"""PriSM's OrigDrop baseline (subfl.methods.origdrop): the leading slice, no full-width client, no scaler."""
from __future__ import annotations

import torch

from subfl.experiments import make_config, run_experiment
from subfl.methods import METHODS, make_method


def test_origdrop_is_registered_without_heterofls_requirements():
    method = make_method("origdrop")
    assert METHODS["origdrop"] is type(method)
    assert method.config["scaler"] is False and method.config["sbn"] is True


def test_homogeneous_keep_ratio_trains_only_the_leading_slice(tmp_path):
    cfg = make_config("origdrop", "digits", "mlp", scale="ci", heterogeneity="0.25", rounds=2, width=1.0,
                      model_options={"hidden": (16, 16)})
    res = run_experiment(cfg, tmp_path / "od", cache=False)  # heterofl would refuse: no full-width client
    final = res.state()["weights"]
    from subfl.experiments.runner import ModelFactory, prepare_data
    dataset, _, _ = prepare_data(cfg)
    init = ModelFactory(cfg, dataset)().state_dict()
    # hidden layers of 16 units at keep ratio 1/4: units 0-3 move, units 4-15 keep their initial values
    w0, w1 = init["layers.1.weight"], final["layers.1.weight"]
    assert not torch.equal(w1[:4], w0[:4])
    assert torch.equal(w1[4:], w0[4:])
    assert torch.equal(final["layers.3.weight"][:, 4:], init["layers.3.weight"][:, 4:])
    up = res.ledger[(res.ledger.direction == "up") & (res.ledger.name != "__config__")]
    per_client = up[up["round"] == 1].groupby("client").bytes.sum()
    assert set(per_client) == {4 * (64 * 4 + 4 + 4 * 4 + 4 + 4 * 10 + 10)}  # the 1/4-width MLP, float32
    acc = res.history[res.history.metric == "accuracy"]
    assert {"global", "0.25"} <= set(acc.group)
