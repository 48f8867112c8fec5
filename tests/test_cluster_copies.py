"""Neighbourhood measures under a cluster bootstrap (layersim.similarity.neighbours.Copies, resample_draws): a cluster
drawn twice does not give a row its cluster-mates twice among its neighbours; rows resampled one by one are as before,
bit for bit; the invariances hold on resamples."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layersim.similarity import get_measure, similarity
from layersim.similarity.inference.bootstrap import (DRAW_AWARE, bootstrap_pairs, resample_draws, resample_rows,
                                                     resampled_options)
from layersim.similarity.inference.bootstrap_matrix import bootstrap_matrix
from layersim.similarity.knn_measures import neighbourhood
from layersim.similarity.neighbours import Copies, knn_jaccard, neighbours

NEIGHBOUR_MEASURES = ("knn_jaccard", "mutual_knn", "rank_similarity", "second_order_cosine", "cknna")


def _premises(rng, premises: int = 30, hypotheses: int = 3, width: int = 20, signal: float = 0.5):
    """benchmarks/calibration.py's shared-premise design (d = 20), 30 premises by default: x = a_p + e,
    y = signal·x·A + b_p + f."""
    premise = np.repeat(np.arange(premises), hypotheses)
    x = rng.normal(size=(premises, width))[premise] + rng.normal(size=(len(premise), width))
    y = signal * x @ rng.normal(size=(width, width)) / np.sqrt(width)
    y += rng.normal(size=(premises, width))[premise] + rng.normal(size=(len(premise), width))
    return x, y, premise


def _lists(measure: str, a: np.ndarray, k: int, sources, draws=None) -> np.ndarray:
    """Each row's neighbours as row indices of the resample (knn_jaccard's labels are sources, so its lists are
    checked through knn_measures' equal rule: both read Copies)."""
    if measure == "knn_jaccard":
        return neighbours("a", a, k, sources=sources, draws=draws) // k  # labels source · k + copy: the sources
    return neighbourhood("a", a, k, sources, draws=draws).nearest


def test_a_cluster_drawn_twice_gives_a_row_its_mate_once():
    """The exact case: three clusters of two rows on a circle, cluster 0 drawn twice (rows 0–3), k = 2. Told only
    the sources, row 0's two nearest are both copies of its mate (source 1): a neighbourhood made by the resampling,
    the same in every layer. Told the draws too, its mate once and the nearest row of another cluster."""
    angles = np.radians([0.0, 1.0, 20.0, 21.0, 50.0, 51.0])
    sample = np.column_stack([np.cos(angles), np.sin(angles)])
    rows, draws = np.array([0, 1, 0, 1, 2, 3, 4, 5]), np.array([0, 0, 1, 1, 2, 2, 3, 3])
    a = sample[rows]
    sources_only = neighbourhood("a", a, 2, rows).nearest
    assert sorted(rows[sources_only[0]]) == [1, 1]  # the cause: the mate's copy in the other draw
    with_draws = neighbourhood("a", a, 2, rows, draws=draws).nearest
    assert list(with_draws[0]) == [1, 4] and list(with_draws[2]) == [3, 4]  # the mate in its own draw, then source 2
    assert sorted(neighbours("a", a, 2, sources=rows, draws=draws)[0] // 2) == [1, 2]


def test_the_cause_inflates_mutual_knn_and_draws_remove_it():
    """On shared-premise rows (30 premises × 3), resampled premise by premise: told only the sources, mutual k-NN's
    resamples lie far above the sample's value (premise-mates counted once per draw of their premise, in both
    layers); told the draws, they centre on it. Before the fix the gap was ~0.07 at spread ~0.01."""
    rng = np.random.default_rng(0)
    x, y, premise = _premises(rng, premises=100)
    estimate = similarity("mutual_knn", x, y, k=10)
    pair = get_measure("mutual_knn").pair
    sources_only, with_draws = [], []
    for rows in resample_rows(len(x), 30, seed=1, groups=premise):
        sources_only.append(pair(x[rows], y[rows], k=10, sources=rows))
        with_draws.append(pair(x[rows], y[rows], k=10, sources=rows, draws=resample_draws(rows, premise)))
    assert np.mean(sources_only) - estimate > 0.04
    assert abs(np.mean(with_draws) - estimate) < 0.02 < 0.04 < np.mean(sources_only) - np.mean(with_draws)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), size=st.integers(1, 4), k=st.integers(1, 5),
       measure=st.sampled_from(["knn_jaccard", "mutual_knn"]))
def test_no_row_meets_a_copy_of_itself_or_of_its_cluster_in_another_draw(seed, size, k, measure):
    """Any cluster resample: a row's list holds no copy of itself and no row of its cluster's other draws; its own
    draw's mates at most once each. (knn_measures' four measures share one neighbourhood: mutual_knn stands for
    them.)"""
    rng = np.random.default_rng(seed)
    groups = np.repeat(np.arange(12), size)[rng.permutation(12 * size)]  # clusters of `size` rows, interleaved
    sample = rng.normal(size=(len(groups), 3))
    rows = resample_rows(len(groups), 1, seed, groups)[0]
    draws = resample_draws(rows, groups)
    if not Copies.of(rows, draws).fewest_candidates() >= k:
        assert np.isnan(get_measure(measure).pair(sample[rows], sample[rows], k=k, sources=rows, draws=draws))
        return
    found = _lists(measure, sample[rows], k, rows, draws)
    # knn_jaccard's lists name sources: compare clusters and sources; knn_measures' name rows: compare draws too
    found_sources = found if measure == "knn_jaccard" else rows[found]
    assert not np.any(found_sources == rows[:, None])  # never a copy of itself
    same_cluster = groups[found_sources] == groups[rows][:, None]
    if measure != "knn_jaccard":
        assert not np.any(same_cluster & (draws[found] != draws[:, None]))  # never its cluster's other draws
    mates = np.where(same_cluster, found_sources, -1)
    for r in range(len(rows)):  # each mate at most once (its own draw's copy)
        taken = mates[r][mates[r] >= 0]
        assert len(taken) == len(set(taken.tolist()))


@pytest.mark.parametrize("measure", NEIGHBOUR_MEASURES)
def test_without_copies_the_value_is_unchanged_bit_for_bit(measure):
    """Every row its own source and its own draw is the plain value; rows resampled one by one (no draws) are the
    same as each row its own draw; and groups of one row each give the example bootstrap's values exactly."""
    rng = np.random.default_rng(1)
    x, y, _ = _premises(rng)
    pair, own = get_measure(measure).pair, np.arange(len(x))
    assert pair(x, y, k=6, sources=own, draws=own) == pair(x, y, k=6)
    rows = resample_rows(len(x), 1, seed=2)[0]
    assert (pair(x[rows], y[rows], k=6, sources=rows, draws=np.arange(len(rows)))
            == pair(x[rows], y[rows], k=6, sources=rows))
    plain = bootstrap_pairs(measure, [x], [y], resamples=4, seed=3, interval="basic", k=6)
    singletons = bootstrap_pairs(measure, [x], [y], resamples=4, seed=3, groups=own * 7, interval="basic", k=6)
    np.testing.assert_array_equal(singletons.values, plain.values)


@pytest.mark.parametrize("measure", NEIGHBOUR_MEASURES)
def test_invariances_hold_on_a_cluster_resample(measure):
    """A rotation (a reflection included) and an isotropic scaling of either layer leave a clustered resample's value
    as they leave the sample's (and, for knn_jaccard, which centres, a translation)."""
    rng = np.random.default_rng(4)
    x, y, premise = _premises(rng)
    rows = resample_rows(len(x), 1, seed=5, groups=premise)[0]
    options = {"k": 6, "sources": rows, "draws": resample_draws(rows, premise)}
    pair = get_measure(measure).pair
    value = pair(x[rows], y[rows], **options)
    rotation = np.linalg.qr(rng.normal(size=(x.shape[1], x.shape[1])))[0]
    moved = 3.0 * y @ rotation + (0.7 if measure == "knn_jaccard" else 0.0)
    assert pair(x[rows], moved[rows], **options) == pytest.approx(value, abs=1e-12)
    assert pair(y[rows], x[rows], **options) == pytest.approx(value, abs=1e-12)  # symmetric


def test_resample_draws_are_whole_copies_of_the_drawn_clusters():
    """In resample_rows' order (draws together) and in a matrix resample's sorted order alike, the rows sharing a
    draw are one whole copy of one cluster, and a cluster drawn w times has w draws."""
    rng = np.random.default_rng(6)
    groups = rng.permutation(np.repeat(np.arange(10), [1, 2, 3, 1, 2, 3, 1, 2, 3, 4]))
    for rows in resample_rows(len(groups), 5, seed=7, groups=groups):
        for order in (rows, np.sort(rows)):
            draws = resample_draws(order, groups)
            for d in np.unique(draws):
                held = order[draws == d]
                assert sorted(held.tolist()) == np.flatnonzero(groups == groups[held[0]]).tolist()
            times = {g: np.sum(order == np.flatnonzero(groups == g)[0]) for g in np.unique(groups)}
            assert all(len(np.unique(draws[groups[order] == g])) == w for g, w in times.items())


def test_the_bootstrap_tells_neighbourhood_measures_the_draws_in_both_routes():
    rng = np.random.default_rng(8)
    x, y, premise = _premises(rng)
    assert DRAW_AWARE == set(NEIGHBOUR_MEASURES)
    assert "draws" not in resampled_options("rsa", {}, np.arange(5), np.arange(5))  # RSA: sources only
    assert "draws" not in resampled_options("mutual_knn", {}, np.arange(5))  # no groups: rows one by one
    pairs = bootstrap_pairs("cknna", [x], [y], resamples=3, seed=9, groups=premise, interval="basic", k=5)
    matrix = bootstrap_matrix("cknna", [x], [y], resamples=3, seed=9, groups=premise, interval="basic", k=5)
    for value, cell, rows in zip(pairs.values[:, 0], matrix.values[:, 0, 0], resample_rows(len(x), 3, 9, premise)):
        expected = get_measure("cknna").pair(x[rows], y[rows], k=5, sources=rows, draws=resample_draws(rows, premise))
        assert value == pytest.approx(expected, abs=1e-12) and cell == pytest.approx(expected, abs=1e-12)


def test_too_few_candidates_counts_the_clusters_other_draws():
    """Row 0's cluster {0, 1} drawn three times leaves each of its rows 1 mate and 2 rows of another cluster."""
    x = np.random.default_rng(10).normal(size=(4, 3))
    rows, draws = np.array([0, 1, 0, 1, 0, 1, 2, 3]), np.array([0, 0, 1, 1, 2, 2, 3, 3])
    assert Copies.of(rows, draws).fewest_candidates() == 3
    assert np.isnan(knn_jaccard(x[rows], x[rows], k=4, sources=rows, draws=draws))
    assert np.isfinite(knn_jaccard(x[rows], x[rows], k=3, sources=rows, draws=draws))


def _rank_similarity_by_hand(x, y, k, sources, groups, draws):
    """Wang et al.'s rank similarity on a resample read as the weighted sample it is, in plain loops: row i's
    candidates are the rows of other sources outside its cluster's other draws, nearest (cosine) first, ties to the
    lower row; a source drawn w times so fills w places, and each neighbour's rank counts every copy ahead of it."""
    total = 0.0
    for i in range(len(sources)):
        lists = []
        for layer in (x, y):
            units = layer / np.linalg.norm(layer, axis=1, keepdims=True)
            candidates = [j for j in range(len(sources)) if sources[j] != sources[i]
                          and not (groups[sources[j]] == groups[sources[i]] and draws[j] != draws[i])]
            lists.append(sorted(candidates, key=lambda j: (-float(units[i] @ units[j]), j))[:k])
        shared = set(lists[0]) & set(lists[1])
        if shared:
            ranks = [(lists[0].index(j) + 1, lists[1].index(j) + 1) for j in shared]
            total += (sum(2 / ((1 + abs(r - s)) * (r + s)) for r, s in ranks)
                      / sum(1 / m for m in range(1, len(shared) + 1)))
    return total / len(sources)


@pytest.mark.parametrize("clustered", [False, True])
def test_rank_similarity_on_a_resample_ranks_every_copy_ahead(clustered):
    """Its bootstrap values are the measure of the weighted sample (docs/reading-the-numbers.md: why its resamples
    still sit above its estimate, benchmarks/rank_bias.py): each copy of a row ahead of a neighbour puts it one place
    lower, in both layers, for rows resampled one by one and clusters alike."""
    rng = np.random.default_rng(11)
    x, y, premise = _premises(rng, premises=12)
    groups = premise if clustered else np.arange(len(x))
    for rows in resample_rows(len(x), 3, seed=12, groups=groups if clustered else None):
        draws = resample_draws(rows, groups) if clustered else np.arange(len(rows))
        value = get_measure("rank_similarity").pair(x[rows], y[rows], k=4, sources=rows,
                                                    draws=draws if clustered else None)
        assert value == pytest.approx(_rank_similarity_by_hand(x[rows], y[rows], 4, rows, groups, draws), abs=1e-12)
