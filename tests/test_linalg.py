"""The shared numerical core (layersim.compute.linalg): one rank rule, one SVCCA variance rule, one
standardiser, used alike by the similarity measures, the alignment maps and the heads."""

import numpy as np
import pytest

from layersim.align import SVCCAMap
from layersim.errors import LayersimError
from layersim.compute.linalg import (Standardizer, canonical_pairs, numerical_rank, thin_svd, variance_rank)
from layersim.similarity import canonical_correlations, kept_dimensions


def test_variance_rank_keeps_the_fewest_components_reaching_the_threshold():
    s = np.sqrt([50.0, 30.0, 15.0, 5.0])  # variance shares 0.5, 0.3, 0.15, 0.05
    assert variance_rank(s, 0.5) == 1  # reached exactly by the first
    assert variance_rank(s, 0.51) == 2
    assert variance_rank(s, 0.8) == 2
    assert variance_rank(s, 0.95) == 3
    assert variance_rank(s, 0.99) == 4
    assert variance_rank(s, 1.0) == 4
    assert variance_rank(s, 1e-9) == 1
    assert variance_rank(np.array([]), 0.99) == 0


def test_numerical_rank_and_thin_svd():
    assert numerical_rank(np.array([2.0, 1.0, 1e-20]), 1e-12) == 2
    assert numerical_rank(np.array([0.0, 0.0]), 1e-12) == 0
    assert numerical_rank(np.array([]), 1e-12) == 0
    rng = np.random.default_rng(0)
    a = rng.normal(size=(20, 3)) @ rng.normal(size=(3, 6))  # rank 3
    q, s, r = thin_svd(a)
    assert q.shape == (20, 3) and s.shape == (3,) and r.shape == (6, 3)
    np.testing.assert_allclose((q * s) @ r.T, a, atol=1e-10)
    assert thin_svd(np.zeros((4, 3)))[1].size == 0


def test_canonical_pairs_are_the_measures_canonical_correlations():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(60, 5))
    y = x[:, :3] @ rng.normal(size=(3, 4)) + 0.5 * rng.normal(size=(60, 4))
    qx = thin_svd(x - x.mean(0))[0]
    qy = thin_svd(y - y.mean(0))[0]
    a, rho, bt = canonical_pairs(qx, qy)
    np.testing.assert_allclose(rho, canonical_correlations(x, y), atol=1e-12)
    # The canonical variates are orthonormal and correlate pairwise by rho.
    np.testing.assert_allclose((qx @ a).T @ (qy @ bt.T), np.diag(rho), atol=1e-12)


@pytest.mark.parametrize("threshold", [0.5, 0.8, 0.95, 0.99, 1.0])
def test_svcca_map_and_svcca_measure_keep_the_same_directions(threshold):
    """The map works on standardised rows; on rows already standardised, it keeps exactly as many
    directions as the svcca measure does (one variance rule, not two)."""
    rng = np.random.default_rng(2)
    raw = rng.normal(size=(200, 12)) @ np.diag(np.linspace(3.0, 0.1, 12)) @ rng.normal(size=(12, 12))
    x = Standardizer().fit(raw).transform(raw)
    y = rng.normal(size=(200, 6))
    fitted = SVCCAMap(variance_threshold=threshold).fit(x, y)
    assert fitted.kept_[0] == kept_dimensions(x, "svcca", variance_threshold=threshold, max_dims=None)


def test_standardizer_population_scale_and_constant_columns():
    a = np.array([[1.0, 5.0, 2.0], [3.0, 5.0, 4.0], [5.0, 5.0, 9.0]])
    s = Standardizer().fit(a)
    np.testing.assert_allclose(s.mean_, [3.0, 5.0, 5.0])
    np.testing.assert_allclose(s.scale_, [np.sqrt(8 / 3), 1.0, np.std([2.0, 4.0, 9.0])])
    z = s.transform(a)
    np.testing.assert_allclose(z.mean(0), 0.0, atol=1e-15)
    np.testing.assert_allclose(z[:, [0, 2]].std(0), 1.0)
    np.testing.assert_allclose(z[:, 1], 0.0)  # constant column: centred, not blown up
    np.testing.assert_allclose(s.inverse_transform(z), a)
    with pytest.raises(LayersimError, match=r"shape \(3,\)"):
        Standardizer().fit(np.ones(3))


def test_standardizer_over_batches_equals_one_fit() -> None:
    rng = np.random.default_rng(5)
    a = rng.standard_normal((301, 7)) * 3 + 1e4  # a large mean: a naive sum of squares loses the variance
    a[:, 2] = 7.0                                # a constant column keeps scale 1
    whole = Standardizer().fit(a)
    batched = Standardizer().fit_batches([a[:100], a[100:101], a[101:101], a[101:]])
    np.testing.assert_allclose(batched.mean_, whole.mean_, rtol=1e-13)
    np.testing.assert_allclose(batched.scale_, whole.scale_, rtol=1e-9)
    assert batched.scale_[2] == 1.0
    with pytest.raises(LayersimError, match="at least one row"):
        Standardizer().fit_batches([])
