"""Bootstrap resamples of k-NN Jaccard and RSA: copies of one example never agree by construction
(layersim.similarity.inference.bootstrap.resampled_options, neighbours.py, rsa.py), and "auto" follows the measured table."""

from __future__ import annotations

import numpy as np
import pytest

from layersim.similarity import similarity
from layersim.similarity.inference.bootstrap import (AUTO_INTERVAL, CLAIM_DRAWS, COPY_AWARE, COVERED,
                                                     MEASURED_COVERAGE,
                                                     NOT_MEASURED, bootstrap_pairs, chosen_interval, covering_method,
                                                     no_interval_note, resample_draws, resample_rows)
from layersim.similarity.inference.bootstrap_matrix import bootstrap_matrix
from layersim.similarity.neighbours import knn_jaccard, neighbours
from layersim.similarity.registry import MEASURES
from layersim.similarity.rsa import rsa


def _knn_design(rng, n: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """The review's §3 k-NN check: d = 20, Y = X + 1.5·noise."""
    x = rng.normal(size=(n, 20))
    return x, x + 1.5 * rng.normal(size=(n, 20))


@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("metric", ["cosine", "euclidean"])
def test_every_row_twice_is_the_original_knn_jaccard(k, metric):
    """Each row copied twice is the same sample with every weight doubled: the nearest 2k rows of other
    sources are the nearest k sources, each twice, so k-NN Jaccard with 2k equals the original's with k."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(25, 4)), rng.normal(size=(25, 4))
    y[:, :2] += x[:, :2]
    rows = np.repeat(np.arange(25), 2)
    twice = knn_jaccard(x[rows], y[rows], k=2 * k, metric=metric, sources=rows)
    assert twice == pytest.approx(knn_jaccard(x, y, k=k, metric=metric), abs=1e-12)
    # Counted as neighbours, each row's copy is shared by both layers: agreement made by the copying.
    assert knn_jaccard(x[rows], y[rows], k=2 * k, metric=metric) > twice


@pytest.mark.parametrize("compare", ["spearman", "pearson", "cosine"])
def test_every_row_twice_is_the_original_rsa(compare):
    """Every pair of sources appears 4 times, the pairs of copies (dissimilarity 0 in both) are left out:
    Pearson and cosine of values repeated 4 times, and Spearman of ranks 4r − 1.5, are the original's."""
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(20, 6)), rng.normal(size=(20, 6))
    y += 0.5 * x
    rows = np.repeat(np.arange(20), 2)
    assert rsa(x[rows], y[rows], compare=compare, sources=rows) == pytest.approx(rsa(x, y, compare=compare),
                                                                                 abs=1e-12)
    if compare != "cosine":  # zeros add nothing to an uncentred cosine; they move a correlation's mean
        assert rsa(x[rows], y[rows], compare=compare) > rsa(x, y, compare=compare) + 0.01


def test_every_row_its_own_source_is_the_plain_value():
    x, y = _knn_design(np.random.default_rng(2), 60)
    own = np.arange(60)
    assert knn_jaccard(x, y, k=5, sources=own) == knn_jaccard(x, y, k=5)
    assert rsa(x, y, sources=own) == rsa(x, y)


def test_a_rows_copies_are_never_its_neighbours():
    x, _ = _knn_design(np.random.default_rng(3), 80)
    rows = resample_rows(80, 1, seed=4)[0]
    found = neighbours("x", x[rows], k=7, sources=rows)  # labels source · k + copy number
    assert not np.any(found // 7 == rows[:, None])


def test_resamples_tell_the_measure_their_source_rows_for_grouped_and_matrix_routes():
    """With example groups, whole examples are drawn: copies of a row are the rows of equal source index,
    in bootstrap_pairs and bootstrap_matrix alike; k-NN Jaccard is also told each row's draw, so a row's example
    drawn again is not its neighbourhood (tests/test_cluster_copies.py)."""
    rng = np.random.default_rng(5)
    x, y = _knn_design(rng, 90)
    groups = np.repeat(np.arange(30), 3)
    result = bootstrap_pairs("knn_jaccard", [x], [y], resamples=3, seed=6, groups=groups, k=4)
    for value, rows in zip(result.values[:, 0], resample_rows(90, 3, 6, groups)):
        draws = resample_draws(rows, groups)
        assert value == pytest.approx(knn_jaccard(x[rows], y[rows], k=4, sources=rows, draws=draws), abs=1e-12)
    matrix = bootstrap_matrix("rsa", [x, y], resamples=3, seed=6, groups=groups)
    for values, rows in zip(matrix.values, resample_rows(90, 3, 6, groups)):
        assert values[0, 1] == pytest.approx(rsa(x[rows], y[rows], sources=rows), abs=1e-12)


def test_too_few_other_sources_is_undefined_not_a_copy():
    x = np.random.default_rng(7).normal(size=(6, 3))
    rows = np.array([0, 0, 0, 0, 1, 2])  # row 0 has only 2 rows of other sources
    assert np.isnan(knn_jaccard(x[rows], x[rows], k=3, sources=rows))


@pytest.mark.parametrize("name,design", [("knn_jaccard", "knn"), ("rsa", "independent")])
def test_the_reviews_designs_get_intervals_that_contain_their_estimate(name, design):
    """§3: k-NN (n = 200, d = 20, Y = X + 1.5·noise; before: estimate 0.067, resample mean 0.121, both intervals
    beside it) and RSA (n = 150, d = 30, independent; before: resample mean 0.018 against −0.002)."""
    rng = np.random.default_rng(8)
    x, y = _knn_design(rng) if design == "knn" else (rng.normal(size=(150, 30)), rng.normal(size=(150, 30)))
    for interval in ("basic", "percentile"):
        result = bootstrap_pairs(name, [x], [y], resamples=200, seed=9, interval=interval)
        assert result.low[0] <= result.estimate[0] <= result.high[0], interval
        # the resamples sit about the estimate, not above it: within a third of the interval's width
        assert abs(np.mean(result.values) - result.estimate[0]) < (result.high[0] - result.low[0]) / 3


@pytest.mark.integration  # a calibration over hundreds of draws: the full tier's
def test_knn_interval_covers_the_population_value():
    """A small-n version of benchmarks/bootstrap.py --coverage (200 repeats there): 40 samples of n = 100
    from the §3 design; the population's k-NN Jaccard with the same neighbourhood share (k = 5 of 99 others:
    k = 505 of 9,999 on 10,000 rows). 95% nominal; at least 33 of 40 fails with probability < 0.01 at 0.95 and
    ≈ 0.13 at 0.87, so a coverage well under 0.9 (before the fix: ~0) fails."""
    rng = np.random.default_rng(10)
    px, py = _knn_design(rng, 10_000)
    truth = knn_jaccard(px, py, k=505)
    covered = 0
    for _ in range(40):
        pick = rng.choice(10_000, 100, replace=False)
        result = bootstrap_pairs("knn_jaccard", [px[pick]], [py[pick]], resamples=100,
                                 seed=int(rng.integers(1 << 30)), k=5)
        covered += result.low[0] <= truth <= result.high[0]
    assert covered >= 33, covered


def test_auto_names_a_measured_method_or_none_for_every_measure():
    from layersim.similarity.attention import HEAD_MEASURES

    assert set(AUTO_INTERVAL) == set(MEASURES) | set(HEAD_MEASURES)  # the attention maps' head measures too
    assert COPY_AWARE <= set(MEASURES)
    assert all(chosen_interval(m, "auto") in ("basic", "percentile", None) for m in AUTO_INTERVAL)
    assert chosen_interval("rsa", "percentile") == "percentile"


def test_a_measure_without_a_measured_method_gets_no_interval_and_a_note(monkeypatch):
    monkeypatch.setitem(AUTO_INTERVAL, "procrustes", None)
    x, y = _knn_design(np.random.default_rng(11), 40)
    result = bootstrap_pairs("procrustes", [x], [y], resamples=5)
    assert result.method == "none" and "no interval" in result.note
    assert np.isnan([result.low[0], result.high[0]]).all()
    assert result.estimate[0] == pytest.approx(similarity("procrustes", x, y))
    assert result.values.shape == (5, 1)  # the resamples are still there for callers that use them
    explicit = bootstrap_pairs("procrustes", [x], [y], resamples=5, interval="basic")
    assert explicit.note is None and np.isfinite(explicit.low[0])


@pytest.mark.parametrize("designs, chosen", [
    ({"review": (0.93, 0.96)}, "percentile"),                          # both within COVERED: the nearer 0.95
    ({"review": (0.94, 0.96)}, "basic"),                               # equally near: basic
    ({"review": (0.80, 0.88)}, "percentile"),                          # only percentile within
    ({"review": (0.885, 0.50)}, "basic"),                              # linear CKA's measured pair
    ({"review": (0.84, 0.995)}, None),                                 # too narrow and too wide: none
    ({"review": (0.94, 0.95), "premises": (0.0, 0.0)}, None),          # covers on one design only: none
    ({"review": (0.95, 0.95), "premises": (0.88, 0.93)}, "percentile"),  # nearer 0.95 where it is worst
    ({"review": (0.95, 0.95, 199)}, None),                             # a first look grants no method
    ({"review": (0.95, 0.95), "premises": (0.95, 0.95, 50)}, None),
])
def test_covering_method_takes_the_covering_method_nearest_nominal(designs, chosen):
    coverage = {design: {"basic": c[0], "percentile": c[1], "draws": c[2] if len(c) > 2 else CLAIM_DRAWS}
                for design, c in designs.items()}
    assert covering_method(coverage) == chosen


@pytest.mark.parametrize("measure", sorted(MEASURED_COVERAGE))
def test_auto_follows_the_measured_coverage_table(measure):
    """Issue 65's measures: "auto" is the method whose measured coverage is within COVERED on every design (nearest
    0.95), and a measure with none gets no interval with its measured numbers as the reason."""
    coverage = MEASURED_COVERAGE[measure]
    method = chosen_interval(measure, "auto")
    assert measure not in NOT_MEASURED and method == covering_method(coverage)
    x, y = _knn_design(np.random.default_rng(12), 60)
    result = bootstrap_pairs(measure, [x], [y], resamples=5)
    if method is None:
        assert all(any(not COVERED[0] <= c[m] <= COVERED[1] or c["draws"] < CLAIM_DRAWS for c in coverage.values())
                   for m in ("basic", "percentile"))
        assert result.method == "none" and result.note == no_interval_note(measure)
        assert all(f"{design}: basic {c['basic']:.3f}, percentile {c['percentile']:.3f} over {c['draws']} draws"
                   in result.note for design, c in coverage.items())
    else:
        assert all(COVERED[0] <= c[method] <= COVERED[1] and c["draws"] >= CLAIM_DRAWS for c in coverage.values())
        assert result.method == method and result.note is None and result.low[0] <= result.high[0]


def test_a_measure_not_measured_yet_says_so(monkeypatch):
    import layersim.similarity.inference.interval_choice as interval_choice

    assert all(chosen_interval(m, "auto") is None for m in NOT_MEASURED)
    monkeypatch.setattr(interval_choice, "NOT_MEASURED", NOT_MEASURED | {"gulp"})
    assert "measured yet" in no_interval_note("gulp") and "measured yet" not in no_interval_note("cknna")
