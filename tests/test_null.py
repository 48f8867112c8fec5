"""Tests for the permutation nulls (layersim.similarity.inference.null): calibration on independent data, power
on dependent data, matrix == per-pair for every measure, the exact RV moments of linear CKA against
sampled permutations, the bias at n < d, and the input errors."""

from __future__ import annotations

import re

import numpy as np
import pytest
from scipy.stats import kstest

from layersim.errors import LayersimError
from layersim.similarity import (MEASURES, NullMatrix, NullResult, chance_adjusted, permutation_matrix,
                                 permutation_test, similarity, similarity_matrix)
from layersim.similarity.inference import _rv
from layersim.similarity.inference._null_engines import cka_engine

# The measures with a null: not the differences of summaries (Measure.no_null; test_resi_measures.py checks the refusal).
NAMES = sorted(name for name, measure in MEASURES.items() if not measure.no_null)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


def _sampled(name: str) -> dict:
    return {"exact": False} if name == "linear_cka" else {}


@pytest.mark.parametrize("name, kwargs", [("linear_cka", {}), ("neuronsim", {"permutations": 50})])
def test_p_values_are_uniform_on_independent_data(rng, name, kwargs):
    p = [permutation_test(name, rng.normal(size=(60, 5)), rng.normal(size=(60, 4)), seed=k, **kwargs).p_value
         for k in range(200)]
    if name == "neuronsim":  # discrete p-values on a grid of 1/51: jitter within a step for the KS test
        p = np.array(p) - rng.uniform(0, 1 / 51, size=len(p))
    assert kstest(p, "uniform").pvalue > 0.001


@pytest.mark.parametrize("name", NAMES)
def test_dependent_data_is_significant(rng, name):
    x = rng.normal(size=(60, 5))
    y = x @ rng.normal(size=(5, 4)) + 0.05 * rng.normal(size=(60, 4))
    result = permutation_test(name, x, y, permutations=200)
    assert isinstance(result, NullResult)
    assert result.p_value < 0.01
    # k-NN Jaccard: the 5 → 4 projection moves many neighbours (adjusted ≈ 0.25), and more of their ranks (rank
    # similarity ≈ 0.16); the RSM norm sees the projection's change of scale too (≈ 0.11); the soft correlation match
    # pairs single neurons, which the projection mixes (adjusted ≈ 0.24).
    floor = {"knn_jaccard": 0.2, "rank_similarity": 0.1, "rsm_norm": 0.05, "soft_correlation_match": 0.2}.get(name, 0.3)
    assert result.observed > result.null_p95 and result.adjusted > floor
    assert result.observed == pytest.approx(similarity(name, x, y), abs=1e-10)


@pytest.mark.parametrize("name", NAMES)
def test_matrix_equals_per_pair_null(rng, name):
    n = 40
    xs = [rng.normal(size=(n, 4)), rng.normal(size=(n, 6)) ** 3, rng.normal(size=(n, 3))]
    ys = [xs[0] @ rng.normal(size=(4, 5)) + 0.5 * rng.normal(size=(n, 5)), rng.normal(size=(n, 7))]
    for y_side, mat_ys in [(ys, ys), (xs, None)]:
        m = permutation_matrix(name, xs, mat_ys, permutations=20, seed=7, **_sampled(name))
        assert isinstance(m, NullMatrix) and m.observed.shape == (3, len(y_side))
        np.testing.assert_allclose(m.observed, similarity_matrix(name, xs, y_side), atol=1e-10)
        for i, x in enumerate(xs):
            for j, y in enumerate(y_side):
                r = permutation_test(name, x, y, permutations=20, seed=7, **_sampled(name))
                got = (m.observed[i, j], m.null_mean[i, j], m.null_p95[i, j], m.p_value[i, j])
                np.testing.assert_allclose(got, (r.observed, r.null_mean, r.null_p95, r.p_value), atol=1e-12)
                assert r.permutations == m.permutations == 20 and r.method == m.method == "permutation"
    assert not np.allclose(m.null_mean, m.null_mean.T)  # ys=None: cell [i, j] shuffles xs[j], not symmetric


@pytest.mark.parametrize("name", ["linear_cka", "pwcca", "mixedsim"])
def test_cells_mask(rng, name):
    xs = [rng.normal(size=(30, 4)) for _ in range(3)]
    cells = np.array([[False, True, False], [False, False, False], [True, False, True]])
    m = permutation_matrix(name, xs, cells=cells, permutations=10)
    full = permutation_matrix(name, xs, permutations=10)
    for field in ("observed", "null_mean", "null_p95", "p_value"):
        got = getattr(m, field)
        assert np.isnan(got[~cells]).all()
        np.testing.assert_allclose(got[cells], getattr(full, field)[cells], atol=1e-12)


@pytest.mark.parametrize("n, dx, dy", [(30, 5, 8), (20, 40, 60), (40, 12, 3)])
def test_exact_moments_match_sampled_permutations(rng, n, dx, dy):
    x = rng.standard_t(4, size=(n, dx)) * np.linspace(0.2, 2, dx)
    y = rng.normal(size=(n, dy)) ** 2
    engine = cka_engine([("x", x)], [("y", y)], np.ones((1, 1), dtype=bool))
    perm_rng = np.random.default_rng(1)
    sampled = np.array([engine.values(perm_rng.permutation(n))[0, 0] for _ in range(2000)])
    exact = permutation_test("linear_cka", x, y)
    assert exact.method == "exact" and exact.permutations == 0
    xc, yc = x - x.mean(0), y - y.mean(0)
    kx, ky = np.sum(xc**2, 1), np.sum(yc**2, 1)
    mean, var = _rv.moments(n, kx.sum(), np.sum((xc.T @ xc) ** 2), kx @ kx, ky.sum(), np.sum((yc.T @ yc) ** 2), ky @ ky)
    # The mean, derived: with centred Gram matrices K and L (rows summing to 0), E over permutations π of
    # Σ_ij K_ij L_π(i)π(j) is tr K tr L / n on the diagonal plus (Σ_i≠j K_ij)(Σ_i≠j L_ij) / (n (n - 1)) off it,
    # and Σ_i≠j K_ij = -tr K: tr K tr L / (n - 1), over the permutation-invariant ‖K‖_F ‖L‖_F.
    derived = kx.sum() * ky.sum() / ((n - 1) * np.sqrt(np.sum((xc.T @ xc) ** 2) * np.sum((yc.T @ yc) ** 2)))
    assert exact.null_mean == pytest.approx(derived, rel=1e-10) and mean == pytest.approx(derived, rel=1e-10)
    sd = np.sqrt(var)
    assert abs(sampled.mean() - mean) < 4 * sd / np.sqrt(2000)
    assert sampled.std() == pytest.approx(sd, rel=0.08)
    assert exact.null_p95 == pytest.approx(np.percentile(sampled, 95), abs=0.25 * sd)
    sampled_p = permutation_test("linear_cka", x, y, exact=False, permutations=2000).p_value
    assert exact.p_value == pytest.approx(sampled_p, abs=0.05)


def test_exact_moments_are_those_of_every_permutation(rng):
    """n = 7: all 5,040 permutations of y's rows, linear CKA computed here in plain numpy; the exact null's mean is
    their mean, and its 95th percentile (a Pearson type III fitted to the moments) is near their 95th percentile."""
    import itertools

    n = 7
    x, y = rng.normal(size=(n, 3)) * [1.0, 2.0, 0.5], rng.standard_t(3, size=(n, 4))
    xc, yc = x - x.mean(0), y - y.mean(0)
    k = xc @ xc.T

    def cka(permuted: np.ndarray) -> float:
        gram = permuted @ permuted.T
        return float(np.sum(k * gram) / (np.linalg.norm(k) * np.linalg.norm(gram)))

    values = np.array([cka(yc[list(order)]) for order in itertools.permutations(range(n))])
    exact = permutation_test("linear_cka", x, y)
    assert exact.method == "exact" and exact.observed == pytest.approx(cka(yc), rel=1e-10)
    assert exact.null_mean == pytest.approx(values.mean(), rel=1e-10)
    assert exact.p_value == pytest.approx(np.mean(values >= exact.observed - 1e-12), abs=0.03)
    assert exact.null_p95 == pytest.approx(np.percentile(values, 95), abs=0.15 * values.std())


def test_exact_null_is_the_bias_at_n_below_d(rng):
    x, y = rng.normal(size=(277, 768)), rng.normal(size=(277, 768))
    result = permutation_test("linear_cka", x, y)
    assert result.observed > 0.7  # the bias the null is for
    assert result.null_mean == pytest.approx(result.observed, abs=0.01)
    assert abs(result.adjusted) < 0.05 and result.p_value > 0.01


def test_exact_matrix_and_point_mass(rng):
    raw = rng.normal(size=(10, 9))
    whitened = np.linalg.svd(raw - raw.mean(0), full_matrices=False)[0]  # centred, all singular values 1
    xs = [whitened, rng.normal(size=(10, 3))]
    m = permutation_matrix("linear_cka", xs)
    np.testing.assert_allclose(m.observed, similarity_matrix("linear_cka", xs), atol=1e-12)
    # xs[0] is whitened and spans every centred direction (K = H): every permutation gives the same value.
    assert m.null_mean[0, 1] == pytest.approx(m.observed[0, 1]) and m.null_p95[0, 1] == pytest.approx(m.null_mean[0, 1])
    assert m.p_value[0, 1] == 1.0
    # Sampled permutations of the same point mass: values equal up to rounding are ties, p = 1.
    sampled = permutation_matrix("linear_cka", xs, permutations=20, exact=False)
    assert sampled.p_value[0, 1] == 1.0 and sampled.p_value[1, 0] == 1.0
    assert permutation_test("linear_cka", np.arange(3.0)[:, None], np.array([[1.0], [3], [2]]),
                            permutations=5).method == "permutation"  # n < 4: no moments, sampled


def test_chance_adjusted():
    assert chance_adjusted(0.5, 0.5) == 0.0 and chance_adjusted(1.0, 0.3) == 1.0
    np.testing.assert_allclose(chance_adjusted(np.array([0.6, np.nan]), np.array([0.2, 0.1])), [0.5, np.nan])
    m = NullMatrix(np.array([[0.6]]), np.array([[0.2]]), np.array([[0.3]]), np.array([[0.01]]), 0, "exact")
    np.testing.assert_allclose(m.adjusted(), [[0.5]])


@pytest.mark.parametrize("call, message", [
    (lambda x: permutation_test("wasserstein", x, x),
     "unknown similarity measure 'wasserstein'; valid similarity measures are"),  # 'cka' now suggests cknna
    (lambda x: permutation_test("svcca", x, x, permutations=0), "permutations must be an integer >= 1, got 0."),
    (lambda x: permutation_matrix("pwcca", [x, x], cells=np.ones((2, 3), bool)),
     "cells must be a boolean array of shape (2, 2)"),
    (lambda x: permutation_matrix("pwcca", [x], cells=[[1]]), "cells must be a boolean array of shape (1, 1)"),
    (lambda x: permutation_test("svcca", x, x, exact=True), "exact=True is available only for linear_cka"),
    (lambda x: permutation_test("neuronsim", x, x, rtol=0.1), "unknown option 'rtol' for similarity measure"),
    (lambda x: permutation_test("pwcca", x, x, method="eig"), "unknown CCA method 'eig'"),
    (lambda x: permutation_test("linear_cka", x, np.ones((20, 2))), "y is constant across examples"),
    (lambda x: permutation_test("mean_cca", x, np.ones((20, 2)), exact=False), "y is constant across examples"),
])
def test_bad_inputs(rng, call, message):
    with pytest.raises(LayersimError, match=re.escape(message)):
        call(rng.normal(size=(20, 3)))


@pytest.mark.parametrize("name", NAMES)
def test_observed_equals_the_measure_with_its_defaults(name):
    """The null's observed values are the measure itself, defaults included (e.g. the CCA dimension cap)."""
    rng = np.random.default_rng(11)
    xs = [rng.normal(size=(60, 12)) for _ in range(2)]
    ys = [xs[0] @ rng.normal(size=(12, 12)) + rng.normal(size=(60, 12)), rng.normal(size=(60, 12))]
    null = permutation_matrix(name, xs, ys, permutations=3, exact=False if name == "linear_cka" else None)
    np.testing.assert_allclose(null.observed, similarity_matrix(name, xs, ys), atol=1e-9)
