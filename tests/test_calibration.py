"""Calibrated tails of the nulls: linear CKA's exact skewness (layersim.similarity.inference._rv) against every
permutation and against sampled ones, the false-positive rate of the exact route on Gaussian and t(3) data,
the streamed route's row sample, and neuronsim's streamed null on heavy-tailed neurons."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from layersim.similarity import (LayerMoments, LinearCKAAccumulator, permutation_matrix, permutation_test,
                                 rotation_null, streamed_linear_cka_null)
from layersim.similarity.inference import _rv
from layersim.similarity.inference._null_engines import ENGINES


def _exact_moments(x, y):
    """Mean, variance and skewness of the exact route for one pair."""
    n = len(x)
    xc, yc = x - x.mean(0), y - y.mean(0)
    (tx, ty), (sx, sy) = _rv.row_traces([("x", x), ("y", y)])
    mean, var = _rv.moments(n, tx, np.sum((xc.T @ xc) ** 2), sx, ty, np.sum((yc.T @ yc) ** 2), sy)
    inv = _rv.cubic_invariants([("x", x), ("y", y)])
    return mean, var, _rv.skewness(n, inv[:1], inv[1:], np.array([[var]]))[0, 0]


def _rv_values(x, y, perms):
    xc, yc = x - x.mean(0), y - y.mean(0)
    k, l_ = xc @ xc.T, yc @ yc.T
    return np.array([np.sum(k * l_[np.ix_(p, p)]) for p in perms]) / np.sqrt(np.sum(k * k) * np.sum(l_ * l_))


@pytest.mark.parametrize("dx, dy, power", [(2, 3, 1), (5, 9, 2), (1, 1, 1), (3, 3, 3)])
def test_skewness_equals_full_enumeration_at_n7(dx, dy, power):
    rng = np.random.default_rng(dx * 10 + dy)
    x, y = rng.standard_t(3, size=(7, dx)), rng.standard_t(3, size=(7, dy)) ** power
    values = _rv_values(x, y, itertools.permutations(range(7)))
    mean, var, skew = _exact_moments(x, y)
    assert mean == pytest.approx(values.mean(), rel=1e-10) and var == pytest.approx(values.var(), rel=1e-9)
    assert skew == pytest.approx(np.mean((values - values.mean()) ** 3) / values.var() ** 1.5, rel=1e-8)


@pytest.mark.parametrize("n", [4, 5])
def test_skewness_equals_full_enumeration_below_six_rows_without_a_warning(n):
    """Patterns of more distinct indices than rows have no instance (their (n)_k is 0): their terms are left out,
    not divided by zero (numpy's warning, and a non-finite skewness the Pearson fit replaced by 0)."""
    import warnings

    rng = np.random.default_rng(n)
    x, y = rng.standard_t(3, size=(n, 2)), rng.standard_t(3, size=(n, 3)) ** 2
    values = _rv_values(x, y, itertools.permutations(range(n)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, var, skew = _exact_moments(x, y)
    assert skew == pytest.approx(np.mean((values - values.mean()) ** 3) / values.var() ** 1.5, rel=1e-8)


def test_skewness_matches_sampled_permutations_at_n200():
    rng = np.random.default_rng(3)
    x, y = rng.standard_t(3, size=(200, 10)), rng.standard_t(3, size=(200, 6))
    draws = 6000
    values = _rv_values(x, y, (rng.permutation(200) for _ in range(draws)))
    mean, var, skew = _exact_moments(x, y)
    z = (values - values.mean()) / values.std()
    sampled = np.mean(z ** 3)
    standard_error = np.sqrt(np.var(z ** 3 - 3 * z) / draws)  # delta method for the sample skewness
    assert skew > 1.0  # heavy tails: far from the gamma's 2 sd / mean (~0.3 here)
    assert abs(sampled - skew) < 4 * standard_error
    assert abs(values.mean() - mean) < 4 * np.sqrt(var / draws)


def _false_positives(dist: str, n: int, d: int, draws: int, seed: int) -> np.ndarray:
    """p-values of the exact route on `draws` independent pairs, 10 pairs per permutation_matrix call."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(draws // 10):
        sample = (lambda: rng.standard_t(3, size=(n, d))) if dist == "t3" else (lambda: rng.normal(size=(n, d)))
        xs, ys = [sample() for _ in range(10)], [sample() for _ in range(10)]
        out.append(np.diag(permutation_matrix("linear_cka", xs, ys, cells=np.eye(10, dtype=bool)).p_value))
    return np.concatenate(out)


# 1,500 t(3) draws per shape: the full tier's (integration); the 500 Gaussian ones stay in the fast tier.
@pytest.mark.parametrize("dist, draws", [pytest.param("t3", 1500, marks=pytest.mark.integration), ("gaussian", 500)])
@pytest.mark.parametrize("n, d", [(40, 100), (60, 55), (150, 15)])
def test_exact_linear_cka_is_calibrated_at_alpha_001(dist, draws, n, d):
    p = _false_positives(dist, n, d, draws, seed=n)
    assert np.all((p >= 0) & (p <= 1))
    # Expected 0.01 (SE 0.0026 at 1,500 draws); the gamma-skew fit gave 0.021-0.035 on t(3) (review).
    assert np.mean(p <= 0.01) <= 0.016 if dist == "t3" else np.mean(p <= 0.01) <= 0.024
    assert 0.025 <= np.mean(p <= 0.05) <= 0.075


def _accumulate(layers, sample_rows, batch=37, seed=0):
    acc = LinearCKAAccumulator(precision="float64", sample_rows=sample_rows, seed=seed)
    for start in range(0, len(layers[0]), batch):
        acc.update([a[start:start + batch] for a in layers])
    return acc


def test_row_sample_is_every_row_then_a_seeded_uniform_reservoir():
    rng = np.random.default_rng(0)
    layers = [rng.normal(size=(300, 4)), rng.normal(size=(300, 3))]
    np.testing.assert_array_equal(_accumulate(layers, 300).sample(1), layers[1])
    small = [_accumulate(layers, 50, batch=b, seed=4) for b in (7, 300)]
    np.testing.assert_array_equal(small[0].sample(0), small[1].sample(0))  # one draw per row, whatever the batches
    chosen = [np.flatnonzero((layers[0] == row).all(1))[0] for row in small[0].sample(0)]
    assert len(set(chosen)) == 50 and max(chosen) > 250  # distinct rows, from the whole table
    np.testing.assert_array_equal(small[0].sample(1), layers[1][chosen])  # whole rows: every layer
    with pytest.raises(Exception, match="sample_rows must be an integer >= 0, got -1"):
        LinearCKAAccumulator(sample_rows=-1)


def test_streamed_linear_cka_null_equals_exact_route_while_the_sample_holds_every_row():
    rng = np.random.default_rng(1)
    layers = [rng.standard_t(3, size=(120, 8)), rng.standard_t(3, size=(120, 30)), rng.normal(size=(120, 5))]
    streamed = streamed_linear_cka_null(_accumulate(layers, 200))
    in_memory = permutation_matrix("linear_cka", layers, exact=True)
    np.testing.assert_allclose(streamed.p_value, in_memory.p_value, atol=1e-10)
    np.testing.assert_allclose(streamed.null_p95, in_memory.null_p95, rtol=1e-10)
    gamma = streamed_linear_cka_null(_accumulate(layers, 0))  # no sample: the gamma's skewness
    assert not np.allclose(gamma.p_value, in_memory.p_value, atol=1e-4)
    np.testing.assert_allclose(gamma.null_mean, in_memory.null_mean, rtol=1e-10)


def _permutation_draws(x, y, draws):
    engine, rng = ENGINES["neuronsim"]([("x", x)], [("y", y)], np.ones((1, 1), bool)), np.random.default_rng(9)
    return np.array([engine.values(rng.permutation(len(x)))[0, 0] for _ in range(draws)])


def test_neuronsim_streamed_null_on_t3_neurons_follows_the_permutation_null():
    rng = np.random.default_rng(0)
    x, y = rng.standard_t(3, size=(300, 20)), rng.standard_t(3, size=(300, 20))
    # The sample holds every row: exactly the permutation test.
    whole = rotation_null("neuronsim", LayerMoments.of_layers([x, y]), [0], [1], draws=200, seed=2)
    direct = permutation_test("neuronsim", x, y, permutations=200, seed=2)
    assert (whole.method, whole.p_value[0, 0], whole.null_p95[0, 0]) == ("permutation", direct.p_value,
                                                                          direct.null_p95)
    # A 150-row sample: rotations at n = 300 with the sample's permutation tails.
    reference = _permutation_draws(x, y, 1000)
    sd = reference.std()
    for rows, within in [(150, 0.35), (0, None)]:
        null = rotation_null("neuronsim", LayerMoments(_accumulate([x, y], rows)), [0], [1], draws=400, seed=1)
        shift_mean = (null.null_mean[0, 0] - reference.mean()) / sd
        shift_p95 = (null.null_p95[0, 0] - np.percentile(reference, 95)) / sd
        if within:
            assert abs(shift_mean) < within and abs(shift_p95) < within
        else:  # plain rotations (no sample) are too narrow on heavy tails: why the sample is kept
            assert shift_p95 < -0.5
