"""PriSM with trainable singular values (subfl.methods.prism_sigma)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from subfl.data.base import ArrayData
from subfl.experiments import make_config, run_experiment
from subfl.fl.training import ClientDataset, LocalTraining
from subfl.fl.types import ClientProfile
from subfl.methods import METHODS, make_method
from subfl.fl.method import ClientContext, ServerContext
from subfl.methods.prism_sigma import merged_state, split_singular_values
from subfl.models.factorized import build_submodel, decompose, factorized_modules
from .helpers import Factory

SMALL_MLP = Factory("mlp", input_shape=(1, 4, 4), num_classes=3, hidden=(12, 10))  # 16 -> 12 -> 10 -> 3
CNN = Factory("cnn", width=0.25, input_shape=(3, 16, 16))  # conv2 and fc1 decomposed


def _submodel(factory):
    model = factory()
    factors = decompose(model)
    return build_submodel(model, factors, {n: range(0, f.num_terms, 2) for n, f in factors.items()}), factors


def test_split_keeps_the_function_and_sets_sigma_to_the_singular_values():
    sub, factors = _submodel(CNN)
    sub.eval()
    x = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = sub(x)
    sigmas = split_singular_values(sub)
    assert set(sigmas) == {"conv2", "fc1"}
    for name, m in factorized_modules(sub).items():
        lam = factors[name].singular_values[::2]  # the sub-model holds every second term
        assert sigmas[name] == pytest.approx(lam.tolist(), rel=1e-4)
        u_dir = m.parametrizations.u.original.detach()
        assert u_dir.norm(dim=0) == pytest.approx(torch.ones(m.rank).tolist(), abs=1e-5)
        assert m.v.detach().reshape(m.rank, -1).norm(dim=1) == pytest.approx(torch.ones(m.rank).tolist(), abs=1e-5)
    with torch.no_grad():
        assert (sub(x) - before).abs().max().item() < 1e-4
    with pytest.raises(ValueError, match="layer 'conv2' already trains its singular values"):
        split_singular_values(sub)


def test_merge_undoes_the_split_and_keeps_the_sign_of_a_negative_sigma():
    sub, _ = _submodel(SMALL_MLP)
    original = {k: t.detach().clone() for k, t in sub.state_dict().items()}
    split_singular_values(sub)
    state = merged_state({k: t.detach().clone() for k, t in sub.state_dict().items()})
    assert set(state) == set(original)
    for key, tensor in original.items():
        assert torch.allclose(state[key], tensor, atol=1e-5), key
    # a trained sigma may change sign: the merged product keeps it, and the scale is split evenly
    layer = factorized_modules(sub)["layers.3"]
    with torch.no_grad():
        layer.parametrizations.u[0].sigma.copy_(torch.linspace(-2.0, 3.0, layer.rank))
        expected = layer.u @ layer.v  # u_dir diag(σ) v_dir
    state = merged_state(sub.state_dict())
    u, v = state["layers.3.u"].detach(), state["layers.3.v"].detach()
    assert torch.allclose(u @ v, expected, atol=1e-5)
    assert torch.allclose(u.norm(dim=0), v.norm(dim=1), atol=1e-5)
    u_dir = layer.parametrizations.u.original.detach()
    assert (torch.sign((u * u_dir).sum(dim=0)) == torch.sign(torch.linspace(-2.0, 3.0, layer.rank))).all()


def _one_step(method_name: str, lr: float):
    ctx = ServerContext(model_fn=SMALL_MLP, training=LocalTraining(lr=lr, batch_size=8, local_steps=1), rounds=2,
                        seed=0, num_classes=3, input_shape=(1, 4, 4), num_clients=1)
    g = torch.Generator().manual_seed(2)
    data = ClientDataset(ArrayData(torch.randn(8, 1, 4, 4, generator=g), torch.randint(0, 3, (8,), generator=g)),
                         np.arange(8))
    method = make_method(method_name)
    state = method.init(ctx)
    task = method.configure(state, 1, [ClientProfile(0, 0.5)], ctx)[0]
    return task, method.local_update(task, data, ClientContext(SMALL_MLP, torch.Generator().manual_seed(3)))


def test_one_sgd_step_moves_u_v_and_sigma_by_their_own_gradients():
    """One SGD step (no momentum, no decay) from the same task and batch. The function is the same before the step,
    so with A = ∂L/∂W: prism moves u′ᵢ by −lr·A v′ᵢ; prism+sigma moves uᵢ by −lr·σᵢ A vᵢ, vᵢ by −lr·σᵢ Aᵀuᵢ and
    σᵢ by −lr·uᵢᵀ A vᵢ (unit uᵢ, vᵢ, σᵢ = λᵢ). A is read off the prism step; every other tensor moves alike."""
    lr = 0.1
    task, prism = _one_step("prism", lr)
    task_sigma, sigma = _one_step("prism+sigma", lr)
    assert task.config["terms"] == task_sigma.config["terms"]
    name = "layers.3"
    u0, v0 = task.tensors[f"{name}.u"].double(), task.tensors[f"{name}.v"].double()
    root = u0.norm(dim=0)  # √λᵢ (balanced factors: ‖u′ᵢ‖ = ‖v′ᵢ‖)
    assert torch.allclose(root, v0.norm(dim=1), rtol=1e-5)
    a_v = (u0 - prism.tensors[f"{name}.u"].double()) / (lr * root)        # A vᵢ
    a_t_u = (v0 - prism.tensors[f"{name}.v"].double()) / (lr * root[:, None])  # Aᵀ uᵢ
    lam, u_dir, v_dir = root**2, u0 / root, v0 / root[:, None]
    sigma_new = lam - lr * (u_dir * a_v).sum(dim=0)
    expected = (u_dir - lr * lam * a_v) * sigma_new @ (v_dir - lr * lam[:, None] * a_t_u)
    merged = sigma.tensors[f"{name}.u"].double() @ sigma.tensors[f"{name}.v"].double()
    assert torch.allclose(merged, expected, atol=1e-5)
    plain = prism.tensors[f"{name}.u"].double() @ prism.tensors[f"{name}.v"].double()
    assert (merged - plain).abs().max().item() > 1e-4  # the parameterisation changes the step
    assert set(sigma.tensors) == set(prism.tensors)
    for key in prism.tensors:
        if key not in (f"{name}.u", f"{name}.v"):
            assert torch.allclose(sigma.tensors[key], prism.tensors[key], atol=1e-6), key


def test_method_is_registered_and_validates_its_options():
    assert METHODS["prism+sigma"].fixed_strategy == "prism"
    with pytest.raises(ValueError, match="factor_decay='frobenius' is not valid for method 'prism\\+sigma'"):
        make_method("prism+sigma", factor_decay="frobenius")
    with pytest.raises(ValueError, match="method 'prism\\+sigma' fixes strategy='prism'"):
        make_method("prism+sigma", strategy="prism+wallenius+cliplr")


def test_a_run_trains_and_uploads_plain_factors(tmp_path):
    cfg = make_config("prism+sigma", "digits", "mlp", scale="ci", heterogeneity="0.2", clients_per_round=2)
    result = run_experiment(cfg, tmp_path / "run", cache=False, progress=False)
    assert not result.diverged and result.final("accuracy") > 0
    prism = run_experiment(cfg.replace(method="prism"), tmp_path / "prism", cache=False, progress=False)

    def uploaded_tensors(run):  # the JSON config's length is left out: it carries the client's loss, whose digits vary
        up = run.ledger.query("direction == 'up' and name != '__config__'")
        columns = ["round", "client", "name", "shape", "dtype", "bytes"]
        return up[columns].sort_values(columns[:3]).reset_index(drop=True)   # the order of the tensors aside

    tensors = uploaded_tensors(result)
    assert len(tensors) > 0 and tensors["bytes"].sum() > 100_000
    pd.testing.assert_frame_equal(tensors, uploaded_tensors(prism))
