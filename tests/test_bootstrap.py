"""Bootstrap intervals over examples (layersim.similarity.bootstrap)."""

from __future__ import annotations

import numpy as np
import pytest

from layersim.errors import LayersimError
from layersim.similarity import linear_cka
from layersim.similarity.bootstrap import bootstrap_pairs, resample_rows


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
    first = bootstrap_pairs("svcca", [x, x], [y, y], resamples=30, seed=5)
    again = bootstrap_pairs("svcca", [x], [y], resamples=30, seed=5)
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
