"""SplitMix (subfl.methods.splitmix): narrow atoms, trained by the clients that afford them, evaluated as an ensemble."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from subfl.data.base import ArrayData
from subfl.experiments import make_config, run_experiment
from subfl.fl.training import ClientDataset, LocalTraining
from subfl.fl.types import ClientProfile, Update
from subfl.methods import make_method
from subfl.fl.method import ClientContext, ServerContext
from subfl.methods.splitmix import AtomEnsemble, affordable_atoms
from .helpers import Factory


def _ctx(num_clients=4) -> ServerContext:
    factory = Factory("cnn", input_shape=(1, 8, 8))
    return ServerContext(model_fn=factory, training=LocalTraining(lr=0.1, batch_size=8, local_steps=2), rounds=3,
                         seed=0, num_classes=10, input_shape=(1, 8, 8), num_clients=num_clients)


@pytest.mark.parametrize("r, k, m", [(0.2, 5, 1), (0.4, 5, 2), (0.6, 5, 3), (1.0, 5, 5), (0.3, 10, 3), (0.7, 10, 7),
                                     (0.5, 5, 2)])
def test_affordable_atoms_rounds_down(r, k, m):
    assert affordable_atoms(r, k) == m


def test_a_client_that_cannot_afford_an_atom_is_refused():
    with pytest.raises(ValueError, match="keep ratio 0.1 cannot afford one SplitMix atom of width 1/5: option atoms "
                                         "must be at least 10"):
        affordable_atoms(0.1, 5)
    with pytest.raises(ValueError, match="option atoms must be an integer"):
        make_method("splitmix", atoms=0)


def test_ensemble_is_the_mean_of_the_atoms_logits():
    atoms = [torch.nn.Linear(3, 2) for _ in range(3)]
    x = torch.randn(4, 3)
    expected = (atoms[0](x) + atoms[1](x) + atoms[2](x)) / 3
    torch.testing.assert_close(AtomEnsemble(atoms)(x), expected)


def test_atoms_are_narrow_and_independently_initialised():
    ctx = _ctx()
    method = make_method("splitmix", atoms=4)
    state = method.init(ctx)
    full = ctx.model_fn()
    atom = ctx.model_fn(width=0.25)
    assert method.atom_width(ctx) == 0.25
    per_atom = sum(t.numel() for k, t in state["weights"].items() if k.startswith("atoms.0."))
    assert per_atom == sum(t.numel() for t in atom.state_dict().values())
    assert per_atom < sum(t.numel() for t in full.state_dict().values()) / 4  # width 1/4 → well under 1/4 of it
    first = [k for k in state["weights"] if k.startswith("atoms.0.") and k.endswith("weight")][0]
    other = first.replace("atoms.0.", "atoms.1.")
    assert not torch.equal(state["weights"][first], state["weights"][other])
    assert state["weights"][first].std().item() == pytest.approx(state["weights"][other].std().item(), rel=0.3)


def test_clients_get_and_send_only_their_atoms_and_aggregation_is_per_atom():
    ctx = _ctx()
    method = make_method("splitmix", atoms=5)
    state = method.init(ctx)
    profiles = [ClientProfile(0, keep_ratio=0.4), ClientProfile(1, keep_ratio=0.2)]
    tasks = method.configure(state, 1, profiles, ctx)
    assert len(tasks[0].config["atoms"]) == 2 and len(tasks[1].config["atoms"]) == 1
    for task in tasks.values():
        assert {k.split(".")[1] for k in task.tensors} == {str(i) for i in task.config["atoms"]}
    g = torch.Generator().manual_seed(0)
    data = ClientDataset(ArrayData(torch.randn(16, 1, 8, 8, generator=g), torch.randint(10, (16,), generator=g)),
                         np.arange(16))
    updates = [method.local_update(t, data, ClientContext(ctx.model_fn, torch.Generator().manual_seed(c), "cpu",
                                                          "classification", 10)) for c, t in tasks.items()]
    assert set(updates[0].tensors) == set(tasks[0].tensors)
    # two hand-made updates of atom 2 with 10 and 30 samples: the server keeps 0.25·a + 0.75·b
    keys = [k for k in state["weights"] if k.startswith("atoms.2.") and state["weights"][k].is_floating_point()]
    a = Update(0, {k: torch.full_like(state["weights"][k], 1.0) for k in keys}, 10, {"atoms": [2]})
    b = Update(1, {k: torch.full_like(state["weights"][k], 5.0) for k in keys}, 30, {"atoms": [2]})
    new = method.aggregate(state, 1, [a, b], ctx)
    assert all(torch.allclose(new["weights"][k], torch.full_like(state["weights"][k], 4.0)) for k in keys)
    untouched = [k for k in state["weights"] if not k.startswith("atoms.2.")]
    assert all(torch.equal(new["weights"][k], state["weights"][k]) for k in untouched)
    assert method.round_metrics(new, 1)[("atom_clients", "2")] == 2.0


def test_splitmix_runs_end_to_end(tmp_path):
    cfg = make_config("splitmix", "digits", "cnn", scale="ci", rounds=3, heterogeneity="0.4",
                      method_options={"atoms": 5})
    result = run_experiment(cfg, tmp_path / "run", cache=False)
    assert 0.0 <= result.final() <= 1.0 and np.isfinite(result.final())
    h = result.history
    assert h[h.metric == "atoms_trained"].value.eq(2.0).all()
