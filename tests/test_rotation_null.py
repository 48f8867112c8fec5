"""The rotation null of the measures computed from streamed moments: its corner sampler is Haar, and its nulls
agree with the permutation null of the same data (to Monte-Carlo error) for every measure."""

from __future__ import annotations

import numpy as np
import pytest

from layersim.errors import LayersimError
from layersim.similarity import permutation_matrix
from layersim.similarity.moments import LayerMoments, moments_matrix
from layersim.similarity.inference.rotation_null import canonical_correlations_draw, haar_corner, rotation_null

MEASURES = [("svcca", {"variance_threshold": 0.99}), ("pwcca", {"variance_threshold": 0.99}), ("pwcca", {}),
            ("mean_cca", {}), ("neuronsim", {}), ("mixedsim", {})]


def _related_layers(n: int, widths, seed: int = 0) -> list[np.ndarray]:
    """Layers sharing a few latent directions, with unequal neuron scales and an offset."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((n, 4))
    return [np.tanh(base @ rng.standard_normal((4, d)) + 0.8 * rng.standard_normal((n, d))) * rng.uniform(0.5, 3, d)
            + 3.0 for d in widths]


def _qr_corner(dimension: int, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """The reference: a whole Haar matrix (QR of a Gaussian, signs fixed), then its corner."""
    q, r = np.linalg.qr(rng.standard_normal((dimension, dimension)))
    return (q * np.sign(np.diag(r)))[:rows, :cols]


@pytest.mark.parametrize("rows, cols", [(3, 4), (6, 4), (9, 9)])  # Bartlett's Wishart; few rows left; the whole
def test_the_corner_has_the_law_of_a_haar_matrix_corner(rows, cols):
    dimension, draws = 9, 4000
    rng = np.random.default_rng(1)
    got = np.stack([haar_corner(dimension, rows, cols, rng) for _ in range(draws)])
    want = np.stack([_qr_corner(dimension, rows, cols, rng) for _ in range(draws)])
    # Every entry has mean 0 and variance 1/dimension; entries are uncorrelated.
    np.testing.assert_allclose(got.mean(axis=0), 0.0, atol=5 / np.sqrt(dimension * draws))
    np.testing.assert_allclose((got ** 2).mean(axis=0), 1 / dimension, rtol=0.15)
    assert abs(np.mean(got[:, 0, 0] * got[:, -1, -1])) < 5 / (dimension * np.sqrt(draws))
    for statistic in (lambda b: np.linalg.svd(b, compute_uv=False).max(), lambda b: np.linalg.svd(b, compute_uv=False).sum()):
        a, b = np.array([statistic(x) for x in got]), np.array([statistic(x) for x in want])
        assert abs(a.mean() - b.mean()) < 5 * np.sqrt((a.var() + b.var()) / draws)
        assert abs(np.percentile(a, 90) - np.percentile(b, 90)) < 0.05
    if rows == cols == dimension:  # the whole matrix is orthogonal
        np.testing.assert_allclose(got[0] @ got[0].T, np.eye(dimension), atol=1e-10)


@pytest.mark.parametrize("dimension, rank_x, rank_y", [(40, 6, 9), (40, 9, 6), (30, 12, 12), (200, 50, 30),
                                                       (20, 12, 12)])  # the last: subspaces that must intersect
def test_the_tridiagonal_canonical_correlations_have_the_corners_law(dimension, rank_x, rank_y):
    """The Jacobi ensemble's tridiagonal model against the singular values of drawn corners: the mean and sd of
    their sum (SVCCA's statistic), the mean of the largest and of the smallest."""
    draws, rng = 3000, np.random.default_rng(2)
    got = np.array([canonical_correlations_draw(dimension, rank_x, rank_y, rng) for _ in range(draws)])
    want = np.array([np.linalg.svd(haar_corner(dimension, rank_x, rank_y, rng), compute_uv=False)
                     for _ in range(draws)])
    assert got.shape == want.shape == (draws, min(rank_x, rank_y))
    assert np.all(np.diff(got, axis=1) <= 0) and got.min() >= 0 and got.max() <= 1
    for a, b in ((got.sum(axis=1), want.sum(axis=1)), (got[:, 0], want[:, 0]), (got[:, -1], want[:, -1])):
        assert abs(a.mean() - b.mean()) < 5 * np.sqrt((a.var() + b.var()) / draws)
    assert got.sum(axis=1).std() == pytest.approx(want.sum(axis=1).std(), rel=0.1)


def test_a_corner_that_does_not_exist_is_refused():
    with pytest.raises(LayersimError, match="does not exist"):
        haar_corner(5, 6, 2, np.random.default_rng(0))


@pytest.mark.parametrize("name, options", MEASURES)
def test_the_rotation_null_agrees_with_the_permutation_null(name, options):
    """n = 300, widths 12, 9, 15: the null means and 95th percentiles per cell, 600 draws each, within Monte-Carlo
    error (the null's sd estimated from its spread); the observed values are moments_matrix's."""
    layers = _related_layers(300, [12, 9, 15])
    moments = LayerMoments.of_layers(layers, sample_rows=0)
    rotated = rotation_null(name, moments, [0, 1, 2], draws=600, seed=3, **options)
    permuted = permutation_matrix(name, layers, permutations=600, seed=3, **options)
    assert rotated.method == "rotation" and rotated.permutations == 600
    np.testing.assert_allclose(rotated.observed, moments_matrix(name, moments, [0, 1, 2], **options), atol=1e-12)
    np.testing.assert_allclose(rotated.observed, permuted.observed, atol=1e-9)
    sd = (permuted.null_p95 - permuted.null_mean) / 1.645
    assert np.all(np.abs(rotated.null_mean - permuted.null_mean) < 5 * sd * np.sqrt(2 / 600))
    assert np.all(np.abs(rotated.null_p95 - permuted.null_p95) < 0.5 * sd)
    assert np.all(rotated.p_value == 1 / 601)  # the layers are related: every draw falls below the observed


def test_mean_ccas_null_mean_is_the_larger_rank_over_n_minus_one():
    """E‖Qxᵀ H Qy‖²_F = r_x r_y / (n − 1) under a rotation as under a permutation, exactly."""
    layers = _related_layers(120, [6, 10])
    null = rotation_null("mean_cca", LayerMoments.of_layers(layers, sample_rows=0), [0], [1], draws=4000, seed=0)
    sd = (null.null_p95[0, 0] - null.null_mean[0, 0]) / 1.645
    assert null.null_mean[0, 0] == pytest.approx(10 / 119, abs=4 * sd / np.sqrt(4000))


def test_heavy_tailed_neurons():
    """The rotation null's limit: a permutation keeps each neuron's tails, a rotation makes every row Gaussian-like.
    On Student-t (3 dof) neurons at n = 1,000, 20 wide, neuronsim's rotation null (a max over single correlations)
    sits below the permutation null — by 0.38 sd in mean and 0.70 sd at p95 with these seeds, and about as much at
    n = 4,000 — while SVCCA and mixedsim, which pool over directions, agree to Monte-Carlo error."""
    rng = np.random.default_rng(0)
    layers = [rng.standard_t(3, size=(1000, 20)) * rng.uniform(0.5, 3, 20) for _ in range(2)]
    moments = LayerMoments.of_layers(layers, sample_rows=0)
    gaps = {}
    for name, options in (("svcca", {"variance_threshold": 0.99}), ("neuronsim", {}), ("mixedsim", {})):
        rotated = rotation_null(name, moments, [0], [1], draws=1000, seed=1, **options)
        permuted = permutation_matrix(name, [layers[0]], [layers[1]], permutations=1000, seed=1, **options)
        sd = (permuted.null_p95[0, 0] - permuted.null_mean[0, 0]) / 1.645
        gaps[name] = ((rotated.null_mean - permuted.null_mean)[0, 0] / sd, (rotated.null_p95 - permuted.null_p95)[0, 0] / sd)
    assert abs(gaps["svcca"][0]) < 0.2 and abs(gaps["mixedsim"][0]) < 0.2  # 2 sd of a 1,000-draw difference: 0.09
    assert -1.0 < gaps["neuronsim"][0] < -0.2 and -1.2 < gaps["neuronsim"][1] < -0.3


@pytest.mark.parametrize("name, options", MEASURES)
def test_independent_layers_are_rarely_called_related(name, options):
    """Under the null the p-values are about uniform: of 30 layers independent of x, about 5 % at p ≤ 0.05."""
    rng = np.random.default_rng(5)
    layers = [rng.standard_normal((150, 5)) for _ in range(31)]
    null = rotation_null(name, LayerMoments.of_layers(layers, sample_rows=0), [0], list(range(1, 31)), draws=99, seed=1, **options)
    assert np.mean(null.p_value <= 0.05) <= 0.2
    assert 0.3 < np.median(null.p_value) < 0.7


def test_cells_seed_and_bad_arguments():
    layers = _related_layers(200, [5, 7, 6])
    moments = LayerMoments.of_layers(layers, sample_rows=0)
    cells = np.array([[True, False, True], [False, True, False], [False, False, False]])
    a = rotation_null("svcca", moments, [0, 1, 2], draws=30, seed=7, cells=cells, variance_threshold=0.99)
    b = rotation_null("svcca", moments, [0, 1, 2], draws=30, seed=7, cells=cells, variance_threshold=0.99)
    np.testing.assert_array_equal(a.null_mean, b.null_mean)  # deterministic for a seed
    assert np.isnan(a.null_mean[~cells]).all() and np.isfinite(a.null_mean[cells]).all()
    with pytest.raises(LayersimError, match="draws must be an integer >= 1, got 0"):
        rotation_null("svcca", moments, [0, 1], draws=0, variance_threshold=0.99)
    with pytest.raises(LayersimError, match="observed must be the 2 × 2 matrix"):
        rotation_null("mean_cca", moments, [0, 1], draws=5, observed=np.zeros((3, 3)))
    with pytest.raises(LayersimError, match="linear_cka"):
        rotation_null("linear_cka", moments, [0, 1], draws=5)
