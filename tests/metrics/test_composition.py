import numpy as np
import pytest
import torch

from subfl.metrics.composition import basis_gram, basis_usage, column_magnitudes, off_diagonal_energy


def test_usage_and_column_magnitudes_are_mean_absolute_values():
    u = torch.tensor([[1.0, -1.0, 4.0], [0.0, 2.0, -1.0]])  # R2 = 2 bases, 3 columns
    np.testing.assert_allclose(basis_usage(u), [2.0, 1.0])
    np.testing.assert_allclose(column_magnitudes(u), [0.5, 1.5, 2.5])


def test_gram_of_orthonormal_basis_is_identity():
    q, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(18, 6)))
    np.testing.assert_allclose(basis_gram(q, normalise=False), np.eye(6), atol=1e-12)
    assert off_diagonal_energy(basis_gram(q)) < 1e-12


def test_normalised_gram_is_cosine_similarity():
    v = np.array([[2.0, 1.0], [0.0, 1.0]])  # columns at 45 degrees, different lengths
    g = basis_gram(v)
    np.testing.assert_allclose(g, [[1.0, 2 ** -0.5], [2 ** -0.5, 1.0]])
    assert off_diagonal_energy(g) == pytest.approx(2 ** -0.5)
    np.testing.assert_allclose(basis_gram(v, normalise=False), [[4.0, 2.0], [2.0, 2.0]])


@pytest.mark.parametrize("bad", [np.ones(3), np.ones((0, 2))])
def test_bad_shapes_name_the_parameter(bad):
    with pytest.raises(ValueError, match="coefficients"):
        basis_usage(bad)
    with pytest.raises(ValueError, match="basis"):
        basis_gram(bad)


def test_zero_column_is_rejected_when_normalising():
    with pytest.raises(ValueError, match="zero column"):
        basis_gram(np.array([[1.0, 0.0], [0.0, 0.0]]))
