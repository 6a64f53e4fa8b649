"""The refresh solvers of subfl.models.spectral_refresh: the Gram-matrix SVD against LAPACK's, in numbers."""
from __future__ import annotations

import pytest
import torch

from subfl.models import build_model
from subfl.models.factorized import decompose_weights, layer_specs, svd_factors
from subfl.models.spectral_refresh import SVD_SOLVERS, gram_svd_factors, refresh_factors, solver_function


def _matrix(n, m, decades=3.0, seed=0):
    """An (n, m) float64 matrix with singular values 10^0 ... 10^-decades, log-spaced, random singular vectors."""
    g = torch.Generator().manual_seed(seed)
    k = min(n, m)
    u, _ = torch.linalg.qr(torch.randn(n, k, generator=g, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(m, k, generator=g, dtype=torch.float64))
    lam = torch.logspace(0, -decades, k, dtype=torch.float64)
    return (u * lam) @ v.T, lam


@pytest.mark.parametrize("n,m", [(64, 576), (512, 256), (100, 100)])
def test_gram_solver_matches_lapack_on_a_three_decade_spectrum(n, m):
    w, lam = _matrix(n, m)
    gram, exact = gram_svd_factors(w), svd_factors(w)
    assert gram.u.shape == exact.u.shape == (n, min(n, m)) and gram.v.shape == exact.v.shape == (min(n, m), m)
    # singular values: relative error ~ eps * (lam_1 / lam_i)^2 = 2.2e-16 * 1e6 at the smallest
    assert ((gram.singular_values - lam).abs() / lam).max().item() < 1e-8
    assert ((exact.singular_values - lam).abs() / lam).max().item() < 1e-10
    # the product reproduces W, and every rank-one term u'_i v'_i^T is LAPACK's (sign-free)
    assert (gram.u @ gram.v - w).abs().max().item() < 1e-12
    terms = torch.einsum("ni,im->inm", gram.u, gram.v) - torch.einsum("ni,im->inm", exact.u, exact.v)
    assert terms.abs().amax(dim=(1, 2)).max().item() < 1e-9
    # U and V are orthonormal once sqrt(lambda) is divided out
    root = gram.singular_values.sqrt()
    u, vt = gram.u / root, gram.v / root[:, None]
    eye = torch.eye(min(n, m), dtype=torch.float64)
    assert (u.T @ u - eye).abs().max().item() < 1e-9 and (vt @ vt.T - eye).abs().max().item() < 1e-9


def test_terms_below_the_gram_noise_are_zero():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(50, 5, generator=g, dtype=torch.float64) @ torch.randn(5, 80, generator=g, dtype=torch.float64)
    gram = gram_svd_factors(w)
    assert int((gram.singular_values > 0).sum()) == 5          # rank 5 exactly; LAPACK returns ~1e-14 there
    assert gram.u[:, 5:].abs().max().item() == 0 and gram.v[5:].abs().max().item() == 0
    assert (gram.u @ gram.v - w).abs().max().item() < 1e-10 * w.abs().max().item()
    assert torch.allclose(gram.singular_values[:5], torch.linalg.svdvals(w)[:5], rtol=1e-10)


def test_dtype_and_descending_order_follow_the_exact_solver():
    w = torch.randn(32, 72, generator=torch.Generator().manual_seed(2))
    gram = gram_svd_factors(w)
    assert gram.u.dtype == gram.v.dtype == torch.float32
    assert bool((gram.singular_values[:-1] >= gram.singular_values[1:]).all())
    assert (gram.u @ gram.v - w).abs().max().item() < 1e-5
    assert torch.allclose(gram.singular_values, svd_factors(w).singular_values, rtol=1e-5)


def test_refresh_of_a_resnet_matches_per_layer_and_exact_is_decompose_weights():
    model = build_model("resnet18", num_classes=10, input_shape=(3, 32, 32), width=0.25)
    specs = layer_specs(model)
    weights = model.state_dict()
    exact, gram = refresh_factors(weights, specs, "exact"), refresh_factors(weights, specs, "gram")
    reference = decompose_weights(weights, specs)
    assert list(gram) == list(specs) and len(specs) == 19
    for name in specs:
        assert torch.equal(exact[name].u, reference[name].u) and torch.equal(exact[name].v, reference[name].v)
        w = weights[f"{name}.weight"].reshape(specs[name].out_features, specs[name].in_features)
        assert (gram[name].u @ gram[name].v - w).abs().max().item() < 1e-6
        assert torch.allclose(gram[name].singular_values, exact[name].singular_values, rtol=1e-4, atol=1e-7)


def test_bad_input_names_the_parameter():
    assert SVD_SOLVERS == ("exact", "gram")
    with pytest.raises(ValueError, match="svd_solver='qr' is not valid; accepted: exact, gram"):
        solver_function("qr")
    with pytest.raises(ValueError, match="svd_solver"):
        refresh_factors({}, {}, "lapack")
    with pytest.raises(ValueError, match="matrix must be a 2-D tensor"):
        gram_svd_factors(torch.ones(3))
    model = build_model("mlp", num_classes=3, input_shape=(1, 4, 4), hidden=(12, 10))
    specs = layer_specs(model)
    with pytest.raises(ValueError, match="weights lack"):
        refresh_factors({}, specs, "gram")
