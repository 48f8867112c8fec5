"""ReSi's grounding tests on layer × layer matrices (layersim.similarity.grounding) and the ranking of measures over
them; the grounding stage's work on fake activation tables (layersim.experiments.grounding)."""

from __future__ import annotations

import numpy as np
import pytest

from layersim.errors import LayersimError
from layersim.similarity.grounding import (monotonicity_conformity, monotonicity_correlation, rank_measures,
                                           separation_auprc, separation_chance, separation_per_layer)


def planted(num_layers: int, decay=lambda d: 1.0 - 0.1 * d) -> np.ndarray:
    """A matrix whose similarity falls strictly with layer distance."""
    i, j = np.indices((num_layers, num_layers))
    return decay(np.abs(i - j).astype(float))


@pytest.mark.parametrize("num_layers", [3, 7, 13])
def test_a_planted_monotone_matrix_scores_one_and_its_reverse_minus_one(num_layers):
    matrix = planted(num_layers)
    assert monotonicity_correlation(matrix) == pytest.approx(1.0)
    assert monotonicity_conformity(matrix) == 1.0
    assert monotonicity_correlation(planted(num_layers, lambda d: 0.1 * d)) == pytest.approx(-1.0)
    assert monotonicity_conformity(planted(num_layers, lambda d: 0.1 * d)) == 0.0


def test_any_strictly_decreasing_profile_scores_one_whatever_its_scale():
    """Spearman reads ranks only: a steep, a shallow and an exponential fall all score 1."""
    for decay in (lambda d: np.exp(-d), lambda d: 5 - 0.001 * d, lambda d: 1 / (1 + d)):
        assert monotonicity_correlation(planted(9, decay)) == pytest.approx(1.0)


def test_shuffled_matrices_score_about_zero():
    rng = np.random.default_rng(0)
    scores = [monotonicity_correlation(rng.permutation(planted(13).ravel()).reshape(13, 13)) for _ in range(200)]
    conformity = [monotonicity_conformity(rng.random((13, 13))) for _ in range(200)]
    assert abs(np.mean(scores)) < 0.03 and np.std(scores) < 0.2
    assert np.mean(conformity) == pytest.approx(0.5, abs=0.02)


def test_one_violation_is_counted_once_per_triple_and_direction():
    """Layers 0..3; swapping S[0, 2] and S[0, 3] breaks exactly the (0; 2, 3) triple forward (S[0, 1] stays above
    both): 1 of the 8 triples (4 forward, 4 backward) is out of order, and Spearman of row 0 forward drops."""
    matrix = planted(4)
    matrix[0, 2], matrix[0, 3] = matrix[0, 3], matrix[0, 2]
    assert monotonicity_conformity(matrix) == pytest.approx(7 / 8)
    # Row 0 forward: sims (0.9, 0.7, 0.8) against distances (1, 2, 3), Spearman −0.5 → 0.5; every other direction
    # with two layers or more (row 1 backward has one, row 3 backward three: 1) scores 1.
    assert monotonicity_correlation(matrix) == pytest.approx(np.mean([0.5, 1.0, 1.0, 1.0]))


def test_undefined_monotonicity_is_nan_and_a_matrix_too_small_is_refused():
    assert np.isnan(monotonicity_correlation(np.ones((5, 5))))  # constant rows: Spearman undefined everywhere
    nan = planted(5)
    nan[1, 3] = np.nan
    assert np.isnan(monotonicity_conformity(nan))
    with pytest.raises(LayersimError, match="at least 3 layers"):
        monotonicity_correlation(np.ones((2, 2)))
    with pytest.raises(LayersimError, match="square"):
        monotonicity_conformity(np.ones((3, 4)))


def test_auprc_of_a_perfect_separation_is_one_and_of_a_reversed_one_its_floor():
    assert separation_auprc([0.9, 0.8, 0.95], [0.1, 0.2, 0.3]) == 1.0
    # Positives last: precision at each positive's recall step is 1/4, 2/5, 3/6 → mean (Zhu's average precision).
    assert separation_auprc([0.1, 0.2, 0.3], [0.9, 0.8, 0.95]) == pytest.approx((1 / 4 + 2 / 5 + 3 / 6) / 3)
    assert separation_chance(3, 3) == 0.5
    assert np.isnan(separation_auprc([0.5], [np.nan])) and np.isnan(separation_auprc([], [0.1]))


@pytest.mark.parametrize("same, different", [(1, 2), (3, 3), (3, 6)])
def test_auprc_is_the_mean_precision_at_each_same_kind_pair_over_every_ordering(same, different):
    """Against the definition (no ties): for every placement of the same-kind pairs among all, the mean over them of
    the share of same-kind pairs ranked at or above each."""
    from itertools import combinations

    total = same + different
    for places in combinations(range(total), same):  # positions, 0 = most similar
        scores = -np.arange(total, dtype=float)
        expected = np.mean([(k + 1) / (place + 1) for k, place in enumerate(places)])
        positive = np.isin(np.arange(total), places)
        assert separation_auprc(scores[positive], scores[~positive]) == pytest.approx(expected)


def stacked(blocks: dict[str, np.ndarray], cross) -> tuple[np.ndarray, dict[str, int]]:
    """A stacked matrix of models with these own blocks, `cross(a, b)` the similarity of layer k of a and b at every
    pair of layers of two different models."""
    labels, size = list(blocks), len(next(iter(blocks.values())))
    matrix = np.zeros((size * len(labels),) * 2)
    for x, a in enumerate(labels):
        for y, b in enumerate(labels):
            matrix[x * size:(x + 1) * size, y * size:(y + 1) * size] = blocks[a] if a == b else cross(a, b)
    return matrix, {label: x * size for x, label in enumerate(labels)}


def test_seeds_closer_to_each_other_than_to_orig_separate_perfectly_at_every_layer():
    labels = ["ORIG", "FT[1]", "FT[2]", "FT[3]"]
    matrix, starts = stacked({label: planted(5) for label in labels},
                             lambda a, b: 0.5 if "ORIG" in (a, b) else 0.8)
    scores, same, different = separation_per_layer(matrix, starts, 5, "ORIG", labels[1:])
    assert (same, different) == (3, 3) and np.array_equal(scores, np.ones(5))
    reversed_matrix, starts = stacked({label: planted(5) for label in labels},
                                      lambda a, b: 0.8 if "ORIG" in (a, b) else 0.5)
    flipped, *_ = separation_per_layer(reversed_matrix, starts, 5, "ORIG", labels[1:])
    # Every seed pair below every FT–ORIG pair, all tied within their kind: one threshold reaches the first seed pair,
    # with every pair above it: precision 3 / 6.
    assert np.allclose(flipped, 0.5)


def test_an_asymmetric_measure_is_read_in_both_orders():
    """neuronsim(ft, orig) ≠ neuronsim(orig, ft): the pair's value is the mean of both orders, so neither order
    decides alone."""
    labels = ["ORIG", "FT[1]", "FT[2]"]
    matrix, starts = stacked({label: planted(3) for label in labels}, lambda a, b: 0.6)
    o, f1, f2 = starts["ORIG"], starts["FT[1]"], starts["FT[2]"]
    matrix[f1, f2], matrix[f2, f1] = 0.9, 0.5   # FT pair: 0.7 on average
    matrix[f1, o], matrix[o, f1] = 0.95, 0.3    # FT[1]–ORIG: 0.625, higher one way only
    scores, *_ = separation_per_layer(matrix, starts, 3, "ORIG", labels[1:])
    assert scores[0] == 1.0


def test_the_ranking_orders_measures_by_mean_rank_and_its_bootstrap_is_paired_and_seeded():
    units = {"monotonicity": {"good": [0.9, 0.95, 0.92], "mid": [0.5, 0.6, 0.55], "bad": [0.1, -0.1, 0.0]},
             "separation": {"good": [1.0, 1.0, 0.9, 1.0], "mid": [0.7, 0.8, 0.6, 0.7], "bad": [0.3, 0.4, 0.5, 0.2]}}
    ranking = rank_measures(units, 500, seed=3)
    assert ranking.mean_rank == {"good": 1.0, "mid": 2.0, "bad": 3.0}
    assert ranking.score["monotonicity"]["good"] == pytest.approx(np.mean([0.9, 0.95, 0.92]))
    low, high = ranking.interval["separation"]["mid"]
    assert 0.6 <= low <= 0.7 <= high <= 0.8
    assert ranking.top_share["good"] == 1.0 and ranking.rank_interval["good"] == (1.0, 1.0)
    assert rank_measures(units, 500, seed=3) == ranking


def test_a_measure_that_wins_one_test_and_loses_the_other_ties_and_nan_ranks_last():
    units = {"monotonicity": {"a": [0.9, 0.9], "b": [0.1, 0.2], "c": [np.nan, np.nan]},
             "separation": {"a": [0.2, 0.3], "b": [0.9, 1.0], "c": [0.1, np.nan]}}
    ranking = rank_measures(units, 200, seed=0)
    assert ranking.mean_rank["a"] == ranking.mean_rank["b"] == 1.5  # (1 + 2) / 2 each
    assert ranking.mean_rank["c"] == 3.0  # last on monotonicity (NaN) and on separation
    assert ranking.score["separation"]["c"] == 0.1  # the undefined layer is left out of the mean
    assert sum(ranking.top_share.values()) == pytest.approx(1.0)


def test_one_test_alone_ranks_and_no_test_is_refused():
    ranking = rank_measures({"monotonicity": {"a": [0.2], "b": [0.3]}}, 10, seed=0)
    assert ranking.tests == ("monotonicity",) and ranking.mean_rank == {"a": 2.0, "b": 1.0}
    with pytest.raises(LayersimError, match="no grounding test"):
        rank_measures({"monotonicity": {}}, 10, seed=0)
