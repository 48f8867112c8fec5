"""Bootstrap intervals over examples (layersim.similarity.inference.bootstrap)."""

from __future__ import annotations

import numpy as np
import pytest

from layersim.errors import LayersimError
from scipy.special import ndtr, ndtri

from layersim.similarity import linear_cka, similarity, similarity_matrix
from layersim.similarity._cca_core import dimension_cap
from layersim.similarity.inference.bootstrap import (INTERVALS, JACKKNIFE_BLOCKS, acceleration, bootstrap_pairs, interval_of,
                                           jackknife_rows, resample_rows)
from layersim.similarity.inference.bootstrap_matrix import WeightedCKA, bootstrap_matrix


def _dependent(rng, n: int, d: int = 5, noise: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    x = rng.normal(size=(n, d))
    mixing = np.linspace(0.2, 1.5, d * d).reshape(d, d)  # a fixed map: the same population for every draw
    return x, x @ mixing + noise * rng.normal(size=(n, d))


def test_a_measure_that_is_exact_on_every_resample_has_a_zero_width_interval():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 4))
    result = bootstrap_pairs("linear_cka", [x], [3 * x + 1], resamples=20)
    assert result.estimate[0] == pytest.approx(1.0)
    assert result.low[0] == pytest.approx(1.0) and result.high[0] == pytest.approx(1.0)


def test_groups_of_one_row_are_the_plain_bootstrap():
    plain = resample_rows(30, 5, seed=3)
    grouped = resample_rows(30, 5, seed=3, groups=np.arange(30) * 7)
    for a, b in zip(plain, grouped):
        np.testing.assert_array_equal(a, b)


def test_groups_are_drawn_whole():
    groups = np.repeat([4, 9, 1, 7], [3, 1, 5, 2])
    for rows in resample_rows(len(groups), 20, seed=0, groups=groups):
        drawn, counts = np.unique(groups[rows], return_counts=True)
        sizes = dict(zip(*np.unique(groups, return_counts=True)))
        assert all(count % sizes[g] == 0 for g, count in zip(drawn, counts))
        assert len(rows) >= 4  # four groups drawn, each of at least one row


@pytest.mark.integration  # a calibration over hundreds of draws: the full tier's
def test_interval_covers_the_population_value_and_narrows_with_more_examples():
    """Coverage of the 95% interval over independent draws from one population (its CKA from 200,000 rows),
    at a generous floor; and the width shrinks about as 1/sqrt(n)."""
    rng = np.random.default_rng(1)
    population = linear_cka(*_dependent(rng, 200_000))
    covered, widths = 0, []
    for _ in range(40):
        x, y = _dependent(rng, 400)
        result = bootstrap_pairs("linear_cka", [x], [y], resamples=200, seed=int(rng.integers(1 << 30)))
        covered += result.low[0] <= population <= result.high[0]
        widths.append(result.high[0] - result.low[0])
    assert covered >= 32, covered  # 95% nominal; 32/40 fails only if coverage is clearly below ~90%
    x, y = _dependent(rng, 6400)
    wide = bootstrap_pairs("linear_cka", [x], [y], resamples=200)
    assert 2.0 < np.median(widths) / (wide.high[0] - wide.low[0]) < 8.0  # 16× the rows: about 4× narrower


def test_same_seed_same_interval_and_pairs_share_resamples():
    rng = np.random.default_rng(2)
    x, y = _dependent(rng, 100)
    first = bootstrap_pairs("svcca", [x, x], [y, y], resamples=30, seed=5, interval="percentile")
    again = bootstrap_pairs("svcca", [x], [y], resamples=30, seed=5, interval="percentile")
    assert np.isfinite(first.low).all()
    np.testing.assert_array_equal(first.low, [again.low[0]] * 2)
    np.testing.assert_array_equal(first.high, [again.high[0]] * 2)


def test_an_undefined_pair_gives_nan_and_the_others_are_kept():
    rng = np.random.default_rng(3)
    x, y = _dependent(rng, 60)
    result = bootstrap_pairs("linear_cka", [np.ones((60, 3)), x], [y, y], resamples=10)
    assert np.isnan([result.estimate[0], result.low[0], result.high[0]]).all()
    assert np.isfinite([result.estimate[1], result.low[1], result.high[1]]).all()


def test_bounded_measures_stay_in_range():
    rng = np.random.default_rng(4)
    result = bootstrap_pairs("linear_cka", [rng.normal(size=(40, 10))], [rng.normal(size=(40, 10))], resamples=50)
    assert 0.0 <= result.low[0] <= result.high[0] <= 1.0


@pytest.mark.parametrize("kwargs,message", [
    ({"resamples": 1}, "resamples = 1 is invalid"),
    ({"level": 1.0}, "level = 1.0 is invalid"),
    ({"groups": np.zeros(3)}, "one group id per row"),
])
def test_bad_arguments_are_refused(kwargs, message):
    x = np.random.default_rng(5).normal(size=(20, 3))
    with pytest.raises(LayersimError, match=message):
        bootstrap_pairs("linear_cka", [x], [x], **kwargs)


def test_layers_must_pair_up():
    x = np.random.default_rng(6).normal(size=(20, 3))
    with pytest.raises(LayersimError, match="as many x layers as y layers"):
        bootstrap_pairs("linear_cka", [x, x], [x])
    with pytest.raises(LayersimError, match="valid similarity measures"):
        bootstrap_pairs("cka", [x], [x])


# --- interval methods, the jackknife and the dimension cap ---


def test_every_method_contains_its_centre_and_names_itself():
    rng = np.random.default_rng(7)
    x, y = _dependent(rng, 40)
    for interval, named in zip(INTERVALS, ("basic", *INTERVALS[1:])):  # "auto" is basic for linear CKA
        result = bootstrap_pairs("linear_cka", [x, y], [y, x @ x.T @ y], resamples=40, seed=1, interval=interval)
        assert result.method == named
        assert np.all((result.low <= result.centre) & (result.centre <= result.high))


def test_auto_is_the_measured_method_and_none_for_the_cca_measures():
    """The CCA measures' resamples are biased up, their estimates down: no method covered (the module doc)."""
    x, y = _dependent(np.random.default_rng(7), 40)
    found = [bootstrap_pairs(name, [x], [y], resamples=3) for name in ("svcca", "pwcca", "linear_cka")]
    assert [r.method for r in found] == ["none", "none", "basic"]
    assert np.isnan(found[0].low[0]) and "no interval" in found[0].note and found[2].note is None


def test_basic_percentile_and_bca_from_known_resamples():
    """Resamples 0..99 (uniform), estimate 60: percentile takes their quantiles, basic mirrors them about the
    estimate, BCa moves the levels by z0 = Φ⁻¹(0.605) (60 below, one tie) and with no acceleration."""
    values = np.arange(100.0)
    low, high, centre = interval_of(60.0, values, None, 0.9, "percentile")
    assert (low, high, centre) == pytest.approx((4.95, 94.05, 49.5))
    low, high, centre = interval_of(60.0, values, None, 0.9, "basic")
    assert (low, high, centre) == pytest.approx((120 - 94.05, 120 - 4.95, 70.5))
    z0 = ndtri(0.605)
    low, high, centre = interval_of(60.0, values, np.ones(5), 0.9, "bca")
    expected = np.quantile(values, ndtr(2 * z0 + ndtri([0.05, 0.95, 0.5])))
    assert (low, high, centre) == pytest.approx(tuple(expected))
    assert low < 60.0 < high


def test_acceleration_is_the_jackknife_skewness():
    jack = np.array([0.0, 0.0, 0.0, 3.0])  # d = mean − θ_(b) = (0.75, 0.75, 0.75, −2.25)
    d = jack.mean() - jack
    assert acceleration(jack) == pytest.approx(np.sum(d ** 3) / (6 * np.sum(d ** 2) ** 1.5))
    assert acceleration(jack) < 0 and acceleration(np.full(5, 2.0)) == 0.0 and acceleration(None) == 0.0


def test_an_estimate_beyond_every_resample_is_flagged_not_infinite():
    low, high, _ = interval_of(5.0, np.linspace(0, 1, 50), None, 0.95, "bca")
    assert np.isfinite([low, high]).all() and high < 5.0
    from layersim.similarity.inference.bootstrap import BootstrapResult
    result = BootstrapResult(np.array([5.0, 0.5, np.nan]), np.array([0.0] * 3), np.array([1.0] * 3), 2, 0.95)
    np.testing.assert_array_equal(result.excludes_estimate, [True, False, False])


def test_jackknife_blocks_delete_every_group_exactly_once():
    groups = np.repeat(np.arange(30), np.arange(30) % 4 + 1)
    subsets = jackknife_rows(len(groups), seed=2, groups=groups)
    assert len(subsets) == JACKKNIFE_BLOCKS
    deleted = np.concatenate([np.setdiff1d(np.arange(len(groups)), kept) for kept in subsets])
    np.testing.assert_array_equal(np.sort(deleted), np.arange(len(groups)))  # each row deleted once
    for kept in subsets:  # whole groups, never part of one
        assert set(np.unique(groups[kept])).isdisjoint(np.setdiff1d(groups, groups[kept]))
    assert len(jackknife_rows(7, seed=0)) == 7  # fewer rows than blocks: delete-one


def test_cca_resamples_keep_the_full_samples_dimension_cap():
    """Whole groups of unequal size make resamples of other row counts; each keeps ⌊(n − 1)/10⌋ of all rows."""
    rng = np.random.default_rng(8)
    x, y = _dependent(rng, 95, d=12)
    groups = np.repeat(np.arange(40), np.arange(40) % 4 + 1)[:95]
    result = bootstrap_pairs("svcca", [x], [y], resamples=4, seed=3, groups=groups, interval="basic")
    for value, rows in zip(result.values[:, 0], resample_rows(95, 4, 3, groups)):
        assert value == pytest.approx(similarity("svcca", x[rows], y[rows], max_dims=dimension_cap(95)), abs=1e-12)


def test_an_unknown_interval_is_refused():
    x = np.random.default_rng(5).normal(size=(20, 3))
    with pytest.raises(LayersimError, match="bootstrap interval"):
        bootstrap_pairs("linear_cka", [x], [x], interval="studentized")


# --- the whole matrix ---


def _layers(rng, n: int, d: int, num: int = 4) -> list[np.ndarray]:
    out, h = [], rng.normal(size=(n, d))
    for _ in range(num):
        h = h + 0.8 * rng.normal(size=(n, d))
        out.append(h.copy())
    return out


@pytest.mark.parametrize("n,d", [(24, 40), (150, 4)])  # sample space (n small, wide) and feature space
@pytest.mark.parametrize("grouped", [False, True])
def test_each_resampled_matrix_is_the_matrix_of_the_resampled_rows(n, d, grouped):
    rng = np.random.default_rng(9)
    xs = _layers(rng, n, d)
    ys = [xs[2], rng.normal(size=(n, 3))]
    groups = rng.integers(0, n // 3, n) if grouped else None
    assert WeightedCKA(xs, None).gram == (n == 24)
    for others in (None, ys):
        result = bootstrap_matrix("linear_cka", xs, others, resamples=3, seed=4, groups=groups)
        np.testing.assert_allclose(result.estimate, similarity_matrix("linear_cka", xs, others), atol=1e-12)
        for matrix, rows in zip(result.values, resample_rows(n, 3, 4, groups)):
            again = similarity_matrix("linear_cka", [a[rows] for a in xs], None if others is None else
                                      [a[rows] for a in others])
            np.testing.assert_allclose(matrix, again, atol=1e-10)


def test_other_measures_recompute_the_matrix_and_share_resamples_with_the_pairs():
    rng = np.random.default_rng(10)
    xs = _layers(rng, 60, 5, num=3)
    matrix = bootstrap_matrix("neuronsim", xs, resamples=6, seed=5)
    pairs = bootstrap_pairs("neuronsim", [xs[0], xs[2]], [xs[1], xs[0]], resamples=6, seed=5)
    np.testing.assert_allclose(matrix.values[:, 0, 1], pairs.values[:, 0], atol=1e-12)
    np.testing.assert_allclose(matrix.values[:, 2, 0], pairs.values[:, 1], atol=1e-12)
    np.testing.assert_allclose(matrix.low[[0, 2], [1, 0]], pairs.low, atol=1e-12)


def test_matrix_intervals_contain_their_estimates_and_repeat_with_the_seed():
    rng = np.random.default_rng(11)
    xs = _layers(rng, 300, 6)
    first = bootstrap_matrix("linear_cka", xs, resamples=60, seed=6)
    assert first.estimate.shape == first.low.shape == (4, 4) and first.values.shape == (60, 4, 4)
    assert not first.excludes_estimate.any()
    off = ~np.eye(4, dtype=bool)
    assert np.all(first.low[off] < first.high[off])
    again = bootstrap_matrix("linear_cka", xs, resamples=60, seed=6)
    np.testing.assert_array_equal(first.low, again.low)
    other = bootstrap_matrix("linear_cka", xs, resamples=60, seed=7)
    assert not np.array_equal(first.low, other.low)


def test_a_constant_layer_gives_nan_cells_in_the_matrix():
    rng = np.random.default_rng(12)
    xs = _layers(rng, 50, 3, num=2) + [np.ones((50, 2))]
    result = bootstrap_matrix("linear_cka", xs, resamples=5)
    assert np.isnan(result.estimate[2]).all() and np.isnan(result.low[:, 2]).all()
    assert np.isfinite(result.low[:2, :2]).all()
