"""Factorized layers (subfl.models.factorized) and spectral sub-model methods (subfl.methods.spectral)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from subfl.costs import count_parameters, forward_flops
from subfl.data.base import ArrayData
from subfl.experiments import make_config, run_experiment
from subfl.fl.training import ClientDataset, LocalTraining, train_epochs
from subfl.fl.types import ClientProfile, Update
from subfl.methods import METHODS, make_method
from subfl.fl.method import ClientContext, ServerContext
from subfl.methods.spectral import (STRATEGIES, WEIGHTINGS, clip_gradients, frobenius_decay_penalty,
                                    product_frobenius_sq, term_design)
from subfl.models import build_model
from subfl.models.factorized import (FactorizedConv2d, FactorizedLinear, build_submodel, decomposable_layers,
                                     decompose, dense_weight, factorize, factorized_modules, layer_specs, read_factors,
                                     set_omega)
from subfl.sampling import (collective_inclusion, keep_count, prism_probabilities, sample_numpy_choice,
                            softmax_probabilities, unbiased_inclusion, wallenius_inclusion)
from .helpers import Factory






def _ctx(factory, num_clients=3, input_shape=(1, 8, 8), **kw) -> ServerContext:
    return ServerContext(model_fn=factory, training=LocalTraining(lr=0.05, batch_size=8, local_steps=2), rounds=2,
                         seed=0, num_classes=10, input_shape=input_shape, num_clients=num_clients, **kw)


SMALL_MLP = Factory("mlp", input_shape=(1, 4, 4), num_classes=3, hidden=(12, 10))  # 16 -> 12 -> 10 -> 3


# ----- factorized layers -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name,shape,width", [("mlp", (1, 8, 8), 1.0), ("cnn", (1, 8, 8), 0.25),
                                              ("resnet18", (3, 32, 32), 0.125)])
def test_full_index_set_reproduces_dense_model(name, shape, width):
    model = Factory(name, width=width, input_shape=shape)().eval()
    layers = decomposable_layers(model)
    factors = decompose(model)
    sub = build_submodel(model, factors, {n: range(factors[n].num_terms) for n in layers}).eval()
    x = torch.randn(4, *shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (model(x) - sub(x)).abs().max().item() < 1e-5
    modules = dict(model.named_modules())
    for n, (u, v) in read_factors(sub).items():
        w = modules[n].weight
        assert (dense_weight(u, v, w.shape) - w).abs().max().item() < 1e-5


def test_first_and_last_layers_stay_dense():
    assert decomposable_layers(Factory("cnn", width=0.25)()) == ["conv2", "fc1"]
    assert decomposable_layers(Factory("mlp")()) == ["layers.3"]
    names = decomposable_layers(Factory("resnet18", width=0.125, input_shape=(3, 32, 32))())
    assert "conv1" not in names and "fc" not in names and len(names) == 19  # 16 3x3 convs + 3 shortcuts


def test_svd_factors_absorb_root_singular_values():
    model = Factory("cnn", width=0.25)()
    f = decompose(model)["conv2"]  # 16 outputs, 8*5*5 = 200 inputs
    lam = f.singular_values
    assert f.u.shape == (16, 16) and f.v.shape == (16, 200)
    assert torch.all(lam[:-1] >= lam[1:])
    assert torch.allclose(f.u.T @ f.u, torch.diag(lam), atol=1e-5)
    assert torch.allclose(f.v @ f.v.T, torch.diag(lam), atol=1e-5)


def test_submodel_layers_omega_and_conv_shapes():
    model = Factory("cnn", width=0.25)()
    f = decompose(model)
    sub = build_submodel(model, f, {"conv2": [0, 3, 5], "fc1": [1]}, {"conv2": [1.0, 2.0, 3.0], "fc1": [4.0]})
    layers = factorized_modules(sub)
    assert isinstance(layers["conv2"], FactorizedConv2d) and isinstance(layers["fc1"], FactorizedLinear)
    assert layers["conv2"].v.shape == (3, 8, 5, 5) and layers["conv2"].u.shape == (16, 3)
    assert layers["conv2"].omega.tolist() == [1.0, 2.0, 3.0]
    assert not layers["conv2"].omega.requires_grad
    assert "conv2.omega" not in sub.state_dict()  # never uploaded
    # the sub-model's weight is sum_{i in S} omega_i u'_i v'_i^T
    expected = sum(w * torch.outer(f["conv2"].u[:, i], f["conv2"].v[i]) for i, w in zip([0, 3, 5], [1, 2, 3]))
    assert torch.allclose(layers["conv2"].dense_weight().reshape(16, -1), expected, atol=1e-5)
    with pytest.raises(ValueError, match="omega"):
        set_omega(sub, {"fc1": [1.0, 2.0]})
    with pytest.raises(ValueError, match="not decomposable"):
        factorize(Factory("cnn", width=0.25)(), {"conv1": 2})


@pytest.mark.parametrize("r", [0.2, 0.4, 1.0])
def test_submodel_params_and_flops(r):
    model = Factory("mlp")()  # 64 -> 200 -> 200 -> 10; only the 200x200 layer is decomposed
    f = decompose(model)
    k = keep_count(200, r)
    sub = build_submodel(model, f, {"layers.3": range(k)})
    spec = layer_specs(model)["layers.3"]
    assert spec.factorized_parameters(k) == k * 400 + 200
    dense_rest = (64 * 200 + 200) + (200 * 10 + 10)
    assert count_parameters(sub) == dense_rest + k * 400 + 200
    x = torch.randn(5, 1, 8, 8)
    assert forward_flops(sub, x) == 2 * 5 * (64 * 200 + k * 200 + 200 * k + 200 * 10)
    if r == 0.2:  # 40 terms: 16,000 weights in place of 40,000
        assert count_parameters(sub) < count_parameters(model)
        assert forward_flops(sub, x) < forward_flops(model, x)


# ----- strategies --------------------------------------------------------------------------------------------
LAM = np.random.default_rng(0).permutation(np.linspace(3.0, 0.05, 64) ** 2)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("r", [0.07, 0.2, 0.25, 0.4, 1.0])
def test_index_set_sizes(strategy, r):
    rng = np.random.default_rng(1)
    for size in (16, 64):
        lam = LAM[:size]
        design = term_design(strategy, lam, r, clients=3)
        for _ in range(3):
            idx, omega = design.sample(rng)
            n = size if strategy == "nosharding" else math.ceil(size * r - 1e-9)
            assert len(idx) == len(set(idx.tolist())) == n == len(omega)
            assert idx.min() >= 0 and idx.max() < size and np.all(omega > 0)


@pytest.mark.parametrize("sampler", ["cps", "brewer", "min_support"])
def test_unbiased_omega_is_inverse_inclusion(sampler):
    design = term_design("unbiased", LAM, 0.25, sampler=sampler)
    pi = unbiased_inclusion(LAM, 16)
    assert np.allclose(design.pi, pi)
    idx, omega = design.sample(np.random.default_rng(2))
    assert len(idx) == 16 and np.allclose(omega, 1.0 / pi[idx])


def test_topn_picks_the_largest_terms():
    idx, omega = term_design("topn", LAM, 0.25).sample(np.random.default_rng(0))
    assert sorted(idx.tolist()) == sorted(np.argsort(-LAM)[:16].tolist())
    assert np.all(omega == 1.0)


def _scaled_submodel_norms(strategy: str) -> tuple[float, float]:
    """Frobenius norms of an MLP layer's 0.2× sub-model drawn by ``strategy`` (with its ω) and of the dense layer."""
    model = Factory("mlp")()
    f = decompose(model)["layers.3"]
    idx, omega = term_design(strategy, f.singular_values, 0.2).sample(np.random.default_rng(4))
    sub = build_submodel(model, {"layers.3": f}, {"layers.3": idx}, {"layers.3": omega})
    w_sub = factorized_modules(sub)["layers.3"].dense_weight()
    return torch.linalg.norm(w_sub).item(), torch.linalg.norm(model.layers[3].weight).item()


def test_topn_scaled_keeps_topn_terms_and_the_layers_frobenius_norm():
    """Top-n + Scaled (spectral sharding Sec. 4.1): Top-n's n largest terms, each with ω = √(Σλ² / Σ_{i∈S} λ²); for
    λ = (4, 3, 2, 1) and r = 0.5, S = {0, 1} and ω = √(30 / 25) = 1.0954…; the sub-model keeps ‖W‖_F."""
    lam = np.array([3.0, 4.0, 1.0, 2.0])
    idx, omega = term_design("topn+scaled", lam, 0.5).sample(np.random.default_rng(0))
    assert idx.tolist() == [0, 1]
    np.testing.assert_allclose(omega, [math.sqrt(30 / 25)] * 2, rtol=1e-15)
    top_idx, _ = term_design("topn", lam, 0.5).sample(np.random.default_rng(1))
    assert idx.tolist() == top_idx.tolist()
    sub_norm, dense_norm = _scaled_submodel_norms("topn+scaled")
    assert sub_norm == pytest.approx(dense_norm, rel=1e-5)
    assert make_method("topn+scaled+cliplr").cliplr and not make_method("topn+scaled").cliplr


def test_collective_wallenius_and_scaled_multipliers():
    c = 4
    d = term_design("collective", LAM, 0.2, clients=c)
    idx, omega = d.sample(np.random.default_rng(3))
    assert np.allclose(omega, c / (1 + (c - 1) * d.pi[idx]))
    d = term_design("prism+wallenius", LAM, 0.2)
    weights = (LAM / LAM.max()) ** 4.0  # kappa = 4 for r <= 0.2 (PriSM)
    pi = wallenius_inclusion(weights / weights.sum(), 13)
    assert np.allclose(d.pi, pi)
    idx, omega = d.sample(np.random.default_rng(3))
    assert np.allclose(omega, 1.0 / pi[idx])
    # prism+scaled: the sub-model keeps the Frobenius norm of W
    sub_norm, dense_norm = _scaled_submodel_norms("prism+scaled")
    assert sub_norm == pytest.approx(dense_norm, rel=1e-5)


def test_prism_weighting_softmax_uses_the_softmax_of_the_singular_values():
    """Option weighting='softmax' (PriSM Sec. 4.5, Table 5): the per-draw p of every prism strategy is the softmax
    of the raw singular values, here (ln 4, ln 2, 0, 0, 0) -> (4, 2, 1, 1, 1) / 9; the marginals are the Wallenius
    means of that p and prism+wallenius's ω their inverses."""
    lam = np.array([np.log(4.0), np.log(2.0), 0.0, 0.0, 0.0])
    for strategy in ("prism", "prism+scaled", "prism+wallenius", "prism+wallenius+cliplr"):
        d = term_design(strategy, lam, 0.4, weighting="softmax")  # n = 2 of 5
        np.testing.assert_allclose(d.weights, np.array([4, 2, 1, 1, 1]) / 9, rtol=1e-14)
        np.testing.assert_allclose(d.pi, wallenius_inclusion(d.weights, 2), rtol=1e-12)
    np.testing.assert_allclose(term_design("prism+wallenius", lam, 0.4, weighting="softmax").omega,
                               1 / wallenius_inclusion(np.array([4, 2, 1, 1, 1]) / 9, 2), rtol=1e-12)
    # the method passes the option to its designs; the draw is PriSM's (same generator state, same terms)
    method = make_method("prism", weighting="softmax")
    d = method.design(LAM, 0.2, clients=1)
    np.testing.assert_allclose(d.weights, softmax_probabilities(LAM), rtol=1e-14)
    idx, omega = d.sample(np.random.default_rng(7))
    assert idx.tolist() == sample_numpy_choice(softmax_probabilities(LAM), 13, np.random.default_rng(7)).tolist()
    assert len(idx) == 13 and np.all(omega == 1.0)


def test_prism_design_inclusion_probabilities_match_its_draws_with_softmax_weights():
    """What the design claims (pi: Fog's approximation of the Wallenius means, used by prism+wallenius and the
    ANME diagnostic) against 20k of its own draws, n = 8 of N = 40, softmax of a spectrum spread over [0, 5]:
    each frequency within 4 binomial standard errors (at most 0.014 here) plus 0.01, the bound on Fog's error
    against the exact means for this spectrum (measured 0.005); the exact means within 4 standard errors."""
    lam = np.random.default_rng(5).permutation(np.linspace(0.0, 5.0, 40))
    d = term_design("prism", lam, 0.2, weighting="softmax")
    assert d.n == 8
    exact = wallenius_inclusion(d.weights, d.n, method="exact")
    rng = np.random.default_rng(0)
    draws = 20_000
    counts = np.zeros(lam.size)
    for _ in range(draws):
        counts[d.sample(rng)[0]] += 1
    freq = counts / draws
    se = np.sqrt(exact * (1 - exact) / draws)
    assert np.all(np.abs(freq - exact) <= 4 * se + 3 / draws)
    assert np.all(np.abs(freq - d.pi) <= 4 * se + 0.01)
    assert d.pi.sum() == pytest.approx(8, abs=1e-9) and d.pi.max() == pytest.approx(exact.max(), abs=0.01)


def test_prism_weighting_default_leaves_prism_unchanged():
    """The default weighting='power' is PriSM's Eq. (2): the same weights, marginals and draws as before the option
    existed (p ∝ λ^4 at r = 0.2), and no version in the run key unless the option is set away from it."""
    assert WEIGHTINGS == ("power", "softmax") and make_method("prism").config["weighting"] == "power"
    default, explicit = term_design("prism", LAM, 0.2), term_design("prism", LAM, 0.2, weighting="power")
    np.testing.assert_array_equal(default.weights, prism_probabilities(LAM, kappa=4.0))
    np.testing.assert_array_equal(default.weights, explicit.weights)
    np.testing.assert_array_equal(default.pi, explicit.pi)
    a, b = default.sample(np.random.default_rng(3)), explicit.sample(np.random.default_rng(3))
    assert a[0].tolist() == b[0].tolist() == sample_numpy_choice(prism_probabilities(LAM, kappa=4.0), 13,
                                                                  np.random.default_rng(3)).tolist()
    # uniform (kappa = 0) and softmax differ from PriSM and from each other on this spectrum (λ in [0.0025, 9])
    uniform, soft = term_design("prism", LAM, 0.2, kappa=0.0), term_design("prism", LAM, 0.2, weighting="softmax")
    assert uniform.pi.max() == pytest.approx(13 / 64) and soft.pi.max() > 0.9 and default.pi.max() > 0.9
    assert np.abs(soft.pi - default.pi).max() > 0.1
    prism = METHODS["prism"]
    assert prism.behaviour_versions({}) == prism.behaviour_versions({"weighting": "power"}) == {"method:prism": 1}
    assert prism.behaviour_versions({"weighting": "softmax"}) == {"method:prism": 1, "method:prism.weighting": 1}
    assert METHODS["prism+memory"].behaviour_versions({"weighting": "softmax"})["method:prism+memory.weighting"] == 1


@pytest.mark.parametrize("method, options, match", [
    ("prism", dict(weighting="softmx"), r"option weighting='softmx' is not valid; accepted: power, softmax"),
    ("prism", dict(weighting=None), r"option weighting=None is not valid; accepted: power, softmax"),
    ("prism", dict(weighting="softmax", kappa=2.0), r"option kappa=2.0 is not valid with weighting='softmax'"),
    ("prism", dict(weighting="softmax", kappa=0.0), r"option kappa=0.0 is not valid with weighting='softmax'"),
    ("unbiased", dict(weighting="softmax"),
     r"weighting='softmax' is not valid with strategy='unbiased'; accepted: 'power'.*prism\+scaled"),
    ("spectral", dict(strategy="topn", weighting="softmax"), r"not valid with strategy='topn'"),
])
def test_prism_weighting_rejects_bad_values(method, options, match):
    with pytest.raises(ValueError, match=match):
        make_method(method, **options)


def test_term_design_rejects_a_weighting_the_strategy_cannot_use():
    with pytest.raises(ValueError, match=r"weighting='softmax' is not valid with strategy='collective'"):
        term_design("collective", LAM, 0.2, clients=2, weighting="softmax")
    with pytest.raises(ValueError, match=r"option weighting='uniform' is not valid; accepted: power, softmax"):
        term_design("prism", LAM, 0.2, weighting="uniform")
    assert make_config("prism", "digits", "mlp", scale="ci", method_options={"weighting": "softmax"})
    with pytest.raises(ValueError, match="weighting"):
        make_config("prism", "digits", "mlp", scale="ci", method_options={"weighting": "exp"})


def _submodel_with_omega() -> torch.nn.Module:
    """A sub-model of layers.3 with three terms carrying ω = 1, 20, 100 (their +cliplr scales: 1, 0.5, 0.1)."""
    model = Factory("mlp")()
    return build_submodel(model, decompose(model), {"layers.3": [0, 1, 2]}, {"layers.3": [1.0, 20.0, 100.0]})


def test_clip_gradients_scales_by_min_one_tau_over_omega():
    sub = _submodel_with_omega()
    layer = factorized_modules(sub)["layers.3"]
    layer.u.grad, layer.v.grad = torch.ones_like(layer.u), torch.ones_like(layer.v)
    clip_gradients(sub, 10.0)()
    assert layer.u.grad[0].tolist() == pytest.approx([1.0, 0.5, 0.1])
    assert layer.v.grad[:, 0].tolist() == pytest.approx([1.0, 0.5, 0.1])


def test_options_are_validated():
    for bad in [dict(sampler="poisson"), dict(kappa=-1), dict(tau=0), dict(frobenius_reg=-0.1), dict(sbn="yes"),
                dict(strategy="top-k"), dict(schatten_p=1), dict(svd_solver="qr"), dict(factor_decay="l2")]:
        with pytest.raises(ValueError, match=next(iter(bad))):
            make_method("spectral", **bad)
    with pytest.raises(ValueError, match="fixes strategy"):
        make_method("prism", strategy="topn")
    with pytest.raises(ValueError, match="unknown option"):
        make_method("topn", width=2)
    assert {"topn", "topn+scaled", "prism", "prism+scaled", "prism+wallenius", "prism+wallenius+cliplr", "unbiased", "collective",
            "schatten", "nosharding", "unbiased+cliplr", "spectral"} <= set(METHODS)
    assert make_method("unbiased+cliplr", sampler="brewer").cliplr


# ----- server pipeline ---------------------------------------------------------------------------------------
def _echo_updates(tasks, sizes, edit=None):
    """Updates that return what was sent (minus omega), optionally edited per client."""
    updates = []
    for (cid, task), n in zip(sorted(tasks.items()), sizes):
        tensors = {k: v.clone() for k, v in task.tensors.items() if not k.endswith(".omega")}
        if edit is not None:
            edit(cid, tensors, task.config["terms"])
        updates.append(Update(cid, tensors, n, {"loss": 0.0, "keep_ratio": task.config["keep_ratio"],
                                                "terms": task.config["terms"]}))
    return updates


def test_unchanged_clients_leave_the_model_unchanged():
    method = make_method("unbiased")
    ctx = _ctx(SMALL_MLP)
    state = method.init(ctx)
    profiles = [ClientProfile(0, 0.2), ClientProfile(1, 0.4), ClientProfile(2, 0.4)]
    tasks = method.configure(state, 1, profiles, ctx)
    new = method.aggregate(state, 1, _echo_updates(tasks, [5, 7, 9]), ctx)
    for k, v in state["weights"].items():
        assert torch.allclose(new["weights"][k], v, atol=1e-6), k
    diag = new["diagnostics"][-1]
    json.dumps(diag)
    assert diag["round"] == 1 and diag["clients"] == {"0.2": 1, "0.4": 2}
    assert sum(diag["coverage"]["layers.3"]) == keep_count(10, 0.2) + 2 * keep_count(10, 0.4)
    assert 0 < diag["anme"]["0.4"] <= 1 and diag["effective_rank"]["layers.3"] > 1


def _manual_update(state, cid, terms, n, du=0.0, dv=0.0, bias=None):
    """A client's update holding terms ``terms`` of layers.3 shifted by (du, dv), the rest as sent."""
    f = state["factors"]["layers.3"]
    tensors = {k: v.clone() for k, v in state["weights"].items() if k != "layers.3.weight"}
    tensors["layers.3.u"] = f["u"][:, terms] + du
    tensors["layers.3.v"] = f["v"][terms] + dv
    if bias is not None:
        tensors["layers.1.bias"] = torch.full_like(tensors["layers.1.bias"], bias)
    return Update(cid, tensors, n, {"keep_ratio": 0.2, "terms": {"layers.3": list(terms)}})


def test_aggregation_averages_each_term_over_the_clients_that_trained_it():
    method = make_method("topn")
    ctx = _ctx(SMALL_MLP)
    state = method.init(ctx)
    updates = [_manual_update(state, 0, [0, 1], 4, du=1.0, dv=-1.0, bias=0.0),
               _manual_update(state, 1, [0, 2], 4, du=3.0, dv=-3.0, bias=1.0),
               _manual_update(state, 2, [1, 2], 4, du=10.0, dv=-10.0, bias=2.0)]
    new = method.aggregate(state, 1, updates, ctx)
    u = state["factors"]["layers.3"]["u"].double().clone()
    v = state["factors"]["layers.3"]["v"].double().clone()
    shift = {0: (1.0 + 3.0) / 2, 1: (1.0 + 10.0) / 2, 2: (3.0 + 10.0) / 2}  # each term: 2 of 3 equal clients
    for i, d in shift.items():
        u[:, i] += d
        v[i] -= d
    expected = (u @ v).float()  # terms 3..9: nobody trained them, unchanged
    assert torch.allclose(new["weights"]["layers.3.weight"], expected, atol=1e-5)
    assert torch.allclose(new["weights"]["layers.1.bias"], torch.full((12,), 1.0))  # FedAvg of 0, 1, 2
    assert new["diagnostics"][-1]["coverage"]["layers.3"] == [2, 2, 2] + [0] * 7
    # the refreshed SVD of the new weights reproduces them
    f = new["factors"]["layers.3"]
    assert torch.allclose(f["u"] @ f["v"], expected, atol=1e-5)


def test_aggregation_weights_by_data_size():
    method = make_method("topn")
    ctx = _ctx(SMALL_MLP)
    state = method.init(ctx)
    tasks = method.configure(state, 1, [ClientProfile(0, 0.1), ClientProfile(1, 0.1)], ctx)  # term 0 only

    def edit(cid, tensors, terms):
        tensors["layers.3.u"] = torch.full_like(tensors["layers.3.u"], float(cid))
        tensors["layers.3.v"] = torch.ones_like(tensors["layers.3.v"])

    new = method.aggregate(state, 1, _echo_updates(tasks, [1, 3], edit), ctx)
    u, v = state["factors"]["layers.3"]["u"].double().clone(), state["factors"]["layers.3"]["v"].double().clone()
    u[:, 0], v[0] = 0.75, 1.0  # (1*0 + 3*1) / 4
    assert torch.allclose(new["weights"]["layers.3.weight"], (u @ v).float(), atol=1e-5)
    updates = _echo_updates(tasks, [1, 3], edit)
    assert method.aggregation_weights(updates) == [1.0, 3.0]
    for upd in updates:
        upd.n_samples = 0
    assert method.aggregation_weights(updates) == [1.0, 1.0]  # no data reported: every update counts once


def test_resnet_client_trains_factorized_convs_with_static_bn():
    factory = Factory("resnet18", width=0.125, input_shape=(3, 32, 32))
    ctx = _ctx(factory, num_clients=1, input_shape=(3, 32, 32))
    method = make_method("unbiased+cliplr", frobenius_reg=1e-3)
    state = method.init(ctx)
    assert state["norm"] == "bn_nostats" and not any("running_mean" in k for k in state["weights"])
    task = method.configure(state, 1, [ClientProfile(0, 0.25)], ctx)[0]
    assert task.tensors["layer1.0.conv1.v"].shape == (keep_count(8, 0.25), 8, 3, 3)
    g = torch.Generator().manual_seed(0)
    data = ClientDataset(ArrayData(torch.randn(8, 3, 32, 32, generator=g), torch.randint(0, 10, (8,), generator=g)),
                         np.arange(8))
    update = method.local_update(task, data, ClientContext(factory, torch.Generator().manual_seed(1)))
    assert math.isfinite(update.stats["loss"]) and update.stats["steps"] == 2
    sent = {k: v for k, v in task.tensors.items() if not k.endswith(".omega")}
    assert {k: v.shape for k, v in update.tensors.items()} == {k: v.shape for k, v in sent.items()}
    assert not torch.equal(update.tensors["layer2.0.conv1.u"], sent["layer2.0.conv1.u"])  # trained
    new = method.aggregate(state, 1, [update], ctx)
    assert set(new["weights"]) == set(state["weights"])


# ----- end to end --------------------------------------------------------------------------------------------
def _run(method, tmp_path, tag, **kw):
    cfg = make_config(method, "digits", kw.pop("model", "mlp"), scale="ci", **kw)
    return run_experiment(cfg, tmp_path / tag, cache=False, progress=False)


def test_uploads_hold_only_the_clients_terms(tmp_path):
    res = _run("topn", tmp_path, "a", heterogeneity="0.2:0.5,0.4:0.5", clients_per_round=4, rounds=1)
    ledger = res.ledger[res.ledger.name != "__config__"]
    up = ledger[ledger.direction == "up"]
    assert not up.name.str.endswith(".omega").any()
    keep = {}
    model = build_model("mlp", num_classes=10, input_shape=(1, 8, 8))
    dense_rest = sum(p.numel() for n, p in model.named_parameters() if n != "layers.3.weight") * 4
    for client, rows in up.groupby("client"):
        k = int(rows[rows.name == "layers.3.u"]["shape"].iloc[0].split("x")[1])
        keep[client] = k
        assert int(rows.bytes.sum()) == dense_rest + k * (200 + 200) * 4
    sizes = {k: int(up[up.client == c].bytes.sum()) for c, k in keep.items()}
    assert sorted(keep.values()) == [40, 40, 80, 80] and sizes[40] < sizes[80]


@pytest.mark.parametrize("method,model,per_round", [("topn", "cnn", 2), ("prism", "mlp", 2), ("unbiased", "mlp", 2),
                                                    ("collective", "mlp", 4)])
def test_end_to_end_runs_are_deterministic(method, model, per_round, tmp_path):
    kw = dict(heterogeneity="0.2:0.5,0.4:0.5", model=model, clients_per_round=per_round)
    a, b = _run(method, tmp_path, "a", **kw), _run(method, tmp_path, "b", **kw)
    acc = a.curve("accuracy")
    assert list(acc["round"]) == [1, 2] and acc.value.between(0, 1).all()
    assert a.history.equals(b.history)
    assert a.ledger.equals(b.ledger)


def test_nosharding_is_close_to_fedavg(tmp_path):
    nosh = _run("nosharding", tmp_path, "n", rounds=4).final()
    fedavg = _run("fedavg", tmp_path, "f", rounds=4).final()
    assert fedavg > 0.7 and abs(nosh - fedavg) < 0.1


@pytest.mark.parametrize("method", ["prism", "unbiased+cliplr"])
def test_gram_refresh_trains_the_same_model_as_the_exact_svd(method, tmp_path):
    """Option svd_solver='gram' changes only how the refresh decomposes W (signs of terms, float rounding), so two
    rounds from the same seed end at the same weights to rounding and score the same accuracy."""
    kw = dict(heterogeneity="0.2:0.5,0.4:0.5", rounds=2)
    exact = _run(method, tmp_path, "exact", **kw)
    gram = _run(method, tmp_path, "gram", method_options={"svd_solver": "gram"}, **kw)
    assert abs(gram.final() - exact.final()) <= 0.01
    a, b = exact.state()["weights"], gram.state()["weights"]
    worst = max((a[k].double() - b[k].double()).abs().max().item() for k in a if a[k].is_floating_point())
    assert worst < 1e-5


def test_resumed_run_equals_uninterrupted_run(tmp_path):
    cfg = make_config("prism", "digits", "mlp", scale="ci", heterogeneity="0.2:0.5,0.4:0.5")
    whole = run_experiment(cfg, tmp_path / "whole", cache=False, progress=False)
    run_experiment(cfg, tmp_path / "resumed", cache=False, progress=False, stop_after_round=1)
    resumed = run_experiment(cfg, tmp_path / "resumed", cache=False, progress=False)
    assert resumed.summary["resumed_from_round"] == 1
    assert resumed.history.equals(whole.history)


def test_diagnostics_reach_the_history(tmp_path):
    from subfl.experiments import make_config, run_experiment

    cfg = make_config("prism", "digits", "mlp", scale="ci", rounds=2, heterogeneity="0.5",
                      model_options={"hidden": (32, 32)})
    h = run_experiment(cfg, tmp_path / "d", cache=False).history
    ranks = h[h.metric == "effective_rank"]
    assert set(ranks["round"]) == {1, 2} and (ranks.value > 1).all()
    anme_rows = h[h.metric == "anme"]
    assert set(anme_rows.group) == {"0.5"} and ((anme_rows.value > 0) & (anme_rows.value <= 1)).all()


def test_collective_solves_its_design_per_keep_ratio_group():
    """Mixed keep ratios (PriSM Table 3, spectral Table 1 "mixed"): each group of clients sharing a keep ratio gets
    Theorem 3.2's design for its own size C — a lone 0.2 client (C = 1) the truncated SVD with omega = 1, each of
    three 0.4 clients omega_i = 3 / (1 + 2 pi_i)."""
    method = make_method("collective")
    ctx = _ctx(SMALL_MLP, num_clients=4)
    state = method.init(ctx)
    lam = state["factors"]["layers.3"]["singular_values"].numpy()
    profiles = [ClientProfile(0, 0.2), ClientProfile(1, 0.4), ClientProfile(2, 0.4), ClientProfile(3, 0.4)]
    tasks = method.configure(state, 1, profiles, ctx)
    alone = tasks[0]
    assert sorted(alone.config["terms"]["layers.3"]) == sorted(np.argsort(-lam)[:keep_count(10, 0.2)].tolist())
    assert alone.tensors["layers.3.omega"].tolist() == [1.0] * keep_count(10, 0.2)
    pi, omega = collective_inclusion(lam, keep_count(10, 0.4), clients=3)
    for cid in (1, 2, 3):
        idx = tasks[cid].config["terms"]["layers.3"]
        assert len(idx) == keep_count(10, 0.4) == 4
        assert np.allclose(tasks[cid].tensors["layers.3.omega"].numpy(), omega[idx], rtol=1e-5)
    _, omega_all = collective_inclusion(lam, 4, clients=4)  # one design for all four would differ
    assert not np.allclose(omega, omega_all)



def _term_steps(optimizer: str, cliplr: bool) -> list[float]:
    """How far each term's v'_i moves in ten local steps (same data, same batches)."""
    sub = _submodel_with_omega()
    layer = factorized_modules(sub)["layers.3"]
    before = layer.v.detach().clone()
    g = torch.Generator().manual_seed(0)
    data = ClientDataset(ArrayData(torch.randn(64, 1, 8, 8, generator=g), torch.randint(0, 10, (64,), generator=g)),
                         np.arange(64))
    config = LocalTraining(optimizer=optimizer, lr=1e-3, batch_size=16, local_steps=10).round_config(0, 1)
    train_epochs(sub, data, config, torch.Generator().manual_seed(1),
                 before_step=clip_gradients(sub, 10.0) if cliplr else None)
    return (layer.v.detach() - before).norm(dim=1).tolist()


def test_clipped_learning_rate_cancels_under_adam_but_not_under_sgd():
    """The Shakespeare page runs Unbiased / Collective without +cliplr because every client uses Adam there: a
    constant per-term gradient factor min(1, τ/ω_i) cancels in Adam's m / (√v + ε), so +cliplr changes nothing
    (up to ε); with SGD it scales term i's steps by that factor."""
    adam, adam_clipped = _term_steps("adam", False), _term_steps("adam", True)
    assert min(adam) > 1e-3                                   # every term moved
    assert adam_clipped == pytest.approx(adam, rel=1e-4)      # ... and by the same amount with +cliplr
    sgd, sgd_clipped = _term_steps("sgd", False), _term_steps("sgd", True)
    ratios = [clipped / plain for clipped, plain in zip(sgd_clipped, sgd)]  # measured 0.957, 0.524, 0.106
    assert ratios == pytest.approx([1.0, 0.5, 0.1], rel=0.1)  # the scales (the trajectories interact a little)


# ----- factor_decay="frobenius" (PriSM's released code's Frobenius decay) --------------------------------------
def test_product_frobenius_norm_matches_the_dense_weight():
    spec = layer_specs(build_model("cnn", num_classes=10, input_shape=(1, 8, 8), width=0.25))
    name = next(n for n, s in spec.items() if s.kind == "conv2d")
    layer = FactorizedConv2d(spec[name], 3)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        layer.u.copy_(torch.randn(layer.u.shape, generator=g))
        layer.v.copy_(torch.randn(layer.v.shape, generator=g))
    layer.omega = torch.tensor([1.0, 2.5, 0.5])
    expected = float(layer.dense_weight().detach().pow(2).sum())
    assert float(product_frobenius_sq(layer).detach()) == pytest.approx(expected, rel=1e-5)


def test_frobenius_decay_gradients_are_the_released_codes():
    sub = factorize(SMALL_MLP(), {"layers.3": 4})
    layer = factorized_modules(sub)["layers.3"]
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in sub.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    wd = 0.01
    frobenius_decay_penalty(sub, wd)().backward()
    u, v = layer.u.detach(), layer.v.detach()
    # utils/frob.py: grad_U += wd * U V Vᵀ, grad_V += wd * Uᵀ U V (ω = 1); nothing else is penalised
    assert torch.allclose(layer.u.grad, wd * u @ v @ v.T, atol=1e-6)
    assert torch.allclose(layer.v.grad, wd * u.T @ u @ v, atol=1e-6)
    first = next(m for m in sub.modules() if isinstance(m, torch.nn.Linear))  # the dense first layer
    assert first.weight.grad is None and layer.bias.grad is None


def test_factor_decay_frobenius_changes_only_the_factors_step():
    """One SGD step (lr 0.1, wd 0.01, no momentum) of the same client from the same task: with
    ``factor_decay="frobenius"`` every non-factor parameter moves exactly as with weight decay, and a factor's step
    differs by lr·wd·(u' − (U'DV')(DV')ᵀ) — the weight-decay term swapped for the Frobenius-decay one, with ω = 1/π
    of the unbiased design in D."""
    lr, wd = 0.1, 0.01
    ctx = ServerContext(model_fn=SMALL_MLP, training=LocalTraining(lr=lr, batch_size=8, local_steps=1,
                                                                    weight_decay=wd), rounds=2, seed=0,
                        num_classes=3, input_shape=(1, 4, 4), num_clients=1)
    g = torch.Generator().manual_seed(2)
    data = ClientDataset(ArrayData(torch.randn(8, 1, 4, 4, generator=g), torch.randint(0, 3, (8,), generator=g)),
                         np.arange(8))
    out = {}
    for decay in ("weight", "frobenius"):
        method = make_method("unbiased", factor_decay=decay)
        state = method.init(ctx)
        task = method.configure(state, 1, [ClientProfile(0, 0.5)], ctx)[0]
        out[decay] = method.local_update(task, data, ClientContext(SMALL_MLP, torch.Generator().manual_seed(3)))
    assert "factor_decay" not in make_method("unbiased").configure(state, 1, [ClientProfile(0, 0.5)], ctx)[0].config
    assert task.config["factor_decay"] == "frobenius"
    name = next(iter(task.config["terms"]))
    u0, v0, omega = task.tensors[f"{name}.u"], task.tensors[f"{name}.v"], task.tensors[f"{name}.omega"]
    assert not torch.allclose(omega, torch.ones_like(omega))  # the unbiased design's ω = 1/π
    weight, frob = out["weight"].tensors, out["frobenius"].tensors
    for key in weight:
        if key not in (f"{name}.u", f"{name}.v"):
            assert torch.allclose(weight[key], frob[key], atol=1e-6), key
    w_omega = u0 * omega @ v0  # U' D V'
    assert torch.allclose(frob[f"{name}.u"] - weight[f"{name}.u"],
                          -lr * wd * (w_omega @ (omega[:, None] * v0).T - u0), atol=1e-6)
    assert torch.allclose(frob[f"{name}.v"] - weight[f"{name}.v"],
                          -lr * wd * ((u0 * omega).T @ w_omega - v0), atol=1e-6)


def test_the_svd_refresh_is_timed_as_a_part_of_aggregate_and_changes_no_result(tmp_path):
    """The spectral methods time their SVD refresh on the engine's clock (``ctx.timed``): every aggregated round
    has an ``aggregate/svd_refresh`` timing no longer than its ``aggregate``, and within it one part per decomposed
    layer (the MLP's ``layers.3``) that together take no longer than the whole refresh; FedAvg, which refreshes nothing, has
    none; the timing never enters the history (the golden runs' digests are unchanged by it)."""
    res = _run("prism", tmp_path, "p", heterogeneity="0.5", clients_per_round=2, rounds=3)
    t = res.timings.pivot_table(index="round", columns="stage", values="seconds")
    assert list(t.index) == [1, 2, 3] and t["aggregate/svd_refresh"].notna().all()
    assert ((t["aggregate/svd_refresh"] > 0) & (t["aggregate/svd_refresh"] <= t["aggregate"])).all()
    layers = [c for c in t.columns if c.startswith("aggregate/svd_refresh/")]   # one part per decomposed layer
    assert layers == ["aggregate/svd_refresh/layers.3"]   # the MLP's one decomposed layer
    assert ((t[layers] > 0).all(axis=1) & (t[layers].sum(axis=1) <= t["aggregate/svd_refresh"])).all()
    assert not any("svd" in m for m in res.history.metric.unique())
    plain = _run("fedavg", tmp_path, "f", clients_per_round=2, rounds=2)
    assert not any("/" in s for s in plain.timings.stage.unique())
