"""Layer-pruning measures (ShortGPT's Block Influence, Gromov et al.'s angular distance): hand-computed values,
exact identities, the spans each rule picks, and the rank correlation with measured skip scores."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from layersim.errors import LayersimError
from layersim.compute import angles
from layersim.similarity.pruning import (PruningAccumulator, angular_distance, block_influence, gromov_span,
                                         length_only_baseline, predicted_spans, prediction_rank_correlation,
                                         position_only_baseline, pruning_measures, random_layer_baseline, shortgpt_layers, shortgpt_span,
                                         span_droppability, streamed_pruning_measures, within_length)

# Two rows, two dimensions, layers 0 … 2. Row 1 turns by 90° then 90°; row 2 turns by 45° then stays.
HAND = [np.array([[1.0, 0.0], [1.0, 0.0]]),
        np.array([[0.0, 1.0], [1.0, 1.0]]),
        np.array([[-1.0, 0.0], [1.0, 1.0]])]


def test_block_influence_by_hand():
    # Layer 1: cosines 0 and 1/√2 → BI = 1 − (0 + 1/√2)/2. Layer 2: cosines 0 and 1 → BI = 1/2.
    np.testing.assert_allclose(block_influence(HAND), [1 - math.sqrt(2) / 4, 0.5], rtol=0, atol=1e-15)


def test_angular_distance_by_hand():
    # n = 1: (1/2 + 1/4)/2 and (1/2 + 0)/2; n = 2, layer 0 against 2: row 1 opposite (1), row 2 at 45° (1/4).
    np.testing.assert_allclose(angular_distance(HAND, 1), [0.375, 0.25], rtol=0, atol=1e-15)
    np.testing.assert_allclose(angular_distance(HAND, 2), [0.625], rtol=0, atol=1e-15)


def test_identical_orthogonal_and_opposite_rows_are_exact():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(5, 7))
    orthogonal = np.array([[1.0, 0.0], [0.0, 3.0]])
    assert angular_distance([x, x.copy()], 1)[0] == 0.0  # no 1.5e-8 from arccos(1 − ε)
    assert block_influence([x, x.copy()])[0] == 0.0
    assert angular_distance([orthogonal, orthogonal[:, ::-1]], 1)[0] == 0.5
    assert block_influence([orthogonal, orthogonal[:, ::-1]])[0] == 1.0
    assert angular_distance([x, -2.5 * x], 1)[0] == 1.0
    np.testing.assert_allclose(block_influence([x, -x]), [2.0], rtol=1e-15)


def test_matches_the_papers_formulas_on_random_data():
    rng = np.random.default_rng(1)
    layers = [rng.normal(size=(40, 6)) for _ in range(4)]
    unit = [a / np.linalg.norm(a, axis=1, keepdims=True) for a in layers]
    cos = lambda a, b: np.sum(unit[a] * unit[b], axis=1)  # noqa: E731
    np.testing.assert_allclose(block_influence(layers), [1 - cos(k - 1, k).mean() for k in (1, 2, 3)], rtol=1e-12)
    for n in (1, 2, 3):
        naive = [np.mean(np.arccos(np.clip(cos(l, l + n), -1, 1)) / np.pi) for l in range(4 - n)]
        np.testing.assert_allclose(angular_distance(layers, n), naive, rtol=1e-12)


def test_positive_row_scaling_changes_nothing():
    rng = np.random.default_rng(2)
    layers = [rng.normal(size=(30, 5)) for _ in range(4)]
    # Each row of each layer by its own positive factor, down to scales whose squares would underflow.
    scaled = [a * rng.choice([1e-200, 1e-3, 7.0, 1e150], size=(30, 1)) for a in layers]
    base, other = pruning_measures(layers), pruning_measures(scaled)
    np.testing.assert_allclose(other.angular, base.angular, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(other.cosine_distance, base.cosine_distance, rtol=1e-13, atol=1e-15)


def test_streamed_batches_equal_one_pass(monkeypatch):
    rng = np.random.default_rng(3)
    layers = [rng.normal(size=(25, 4)).astype(np.float32) for _ in range(3)]
    whole = pruning_measures(layers)
    monkeypatch.setattr(angles, "CHUNK_ROWS", 4)
    accumulator = PruningAccumulator(2)
    for rows in (slice(0, 7), slice(7, 8), slice(8, 25)):
        accumulator.update([a[rows] for a in layers])
    streamed = accumulator.result()
    np.testing.assert_allclose(streamed.angular, whole.angular, rtol=1e-13)
    np.testing.assert_allclose(streamed.cosine_distance, whole.cosine_distance, rtol=1e-13)
    np.testing.assert_array_equal(streamed.rows, np.full((3, 3), 25))
    # The same from an iterable of batches (an activation table's iter_batches), as the similarity stage reads.
    batches = ([a[rows] for a in layers] for rows in (slice(0, 7), slice(7, 8), slice(8, 25)))
    np.testing.assert_array_equal(streamed_pruning_measures(batches, 2).angular, streamed.angular)


def _turning(angles: list[float]) -> list[np.ndarray]:
    """Layers 0 … L of two rows in the plane, turned by angles[k − 1] at layer k (one row each way, so
    rotation direction plays no part): layer k's BI is 1 − cos(angles[k−1]), and with the angles summing to
    less than π the distance between layers l and l + n is their sum over the span, divided by π."""
    turned = np.concatenate([[0.0], np.cumsum(angles)])
    return [np.array([[math.cos(t), math.sin(t)], [3 * math.cos(t), -3 * math.sin(t)]]) for t in turned]


ANGLES = [0.1, 0.9, 0.2, 0.95]  # lowest two BIs: layers 1 and 3 — not contiguous


def test_spans_each_rule_picks_on_a_constructed_model():
    measures = pruning_measures(_turning(ANGLES))
    np.testing.assert_allclose(measures.block_influence(), 1 - np.cos(ANGLES), rtol=1e-12)
    np.testing.assert_allclose(measures.angular_distance(2), [1.0 / np.pi, 1.1 / np.pi, 1.15 / np.pi], rtol=1e-12)
    assert gromov_span(measures, 1) == (1, 1)
    assert gromov_span(measures, 2) == (1, 2)  # layers 1–2 turn 1.0 rad, 2–3 1.1, 3–4 1.15
    assert gromov_span(measures, 3) == (1, 3)  # 1.2 against 2.05
    assert gromov_span(measures, 4) == (1, 4)
    assert shortgpt_layers(measures, 2) == (1, 3)
    assert shortgpt_span(measures, 2) == (1, 2)  # BI sums .383, .398, .438
    assert shortgpt_layers(measures, 3) == (1, 2, 3)
    assert predicted_spans(measures)[1] == {"length": 2, "angular_distance": (1, 2),
                                            "block_influence_span": (1, 2), "block_influence_layers": (1, 3)}


def test_a_layer_that_changes_nothing_is_predicted_first():
    # Layer 3 is the identity: the one-layer span Gromov picks and the lowest BI, both exactly 0.
    measures = pruning_measures(_turning([0.3, 0.4, 0.0, 0.5]))
    assert gromov_span(measures, 1) == (3, 3) and measures.angular_distance(1)[2] == 0.0
    assert shortgpt_layers(measures, 1) == (3,) and shortgpt_span(measures, 1) == (3, 3)


def test_span_droppability_indexes_spans_from_one():
    measures = pruning_measures(_turning(ANGLES))
    dropping = span_droppability(measures)
    assert sorted(dropping["angular_distance"]) == [(i, j) for i in range(1, 5) for j in range(i, 5)]
    # Span (2, 3) runs layer 1's output into layer 4: the distance between layer_1 and layer_3.
    assert dropping["angular_distance"][(2, 3)] == pytest.approx(-(0.9 + 0.2) / np.pi, rel=1e-12)
    assert dropping["block_influence"][(2, 3)] == pytest.approx(-(2 - np.cos(0.9) - np.cos(0.2)), rel=1e-12)
    assert dropping["angular_distance"][(1, 4)] == pytest.approx(-sum(ANGLES) / np.pi, rel=1e-12)


SPANS = [(1, 1), (2, 2), (3, 3), (1, 2), (2, 3), (1, 3)]


def test_rank_correlation_by_hand():
    measured = dict(zip(SPANS, [0.9, 0.8, 0.7, 0.6, 0.5, 0.4]))
    predicted = dict(zip(SPANS, [6.0, 4.0, 5.0, 3.0, 2.0, 1.0]))  # spans (2,2) and (3,3) swapped
    result = prediction_rank_correlation(measured, predicted)
    # Spearman 1 − 6 Σd² / (m(m² − 1)): over 6 spans Σd² = 2 → 1 − 12/210; 3 single layers → 1 − 12/24.
    assert result["all"]["spearman"] == pytest.approx(1 - 12 / 210, rel=1e-12)
    assert result["all"]["spans"] == 6
    assert result["by_length"][1]["spearman"] == pytest.approx(0.5, rel=1e-12)
    # Two spans of length 2 and one of length 3: too few to rank, reported as NaN with the count.
    assert math.isnan(result["by_length"][2]["spearman"]) and result["by_length"][2]["spans"] == 2
    assert math.isnan(result["by_length"][3]["spearman"]) and result["by_length"][3]["spans"] == 1
    assert result["within_length"] == pytest.approx(0.5, rel=1e-12)  # the one length with a rho
    reversed_ = prediction_rank_correlation(measured, {s: -v for s, v in predicted.items()})
    assert reversed_["all"]["spearman"] == pytest.approx(-(1 - 12 / 210), rel=1e-12)


def test_rank_correlation_leaves_out_nan_and_constant_sides():
    measured = dict(zip(SPANS, [0.9, 0.8, 0.7, 0.6, 0.5, 0.4]))
    predicted = dict(zip(SPANS, [6.0, 5.0, float("nan"), 3.0, 2.0, 1.0]))
    result = prediction_rank_correlation(measured, predicted)
    assert result["all"] == {"spearman": pytest.approx(1.0), "spans": 5}  # no p-value: spans share layers
    assert math.isnan(result["by_length"][1]["spearman"]) and result["by_length"][1]["spans"] == 2
    constant = prediction_rank_correlation(measured, dict.fromkeys(SPANS, 1.0))
    assert math.isnan(constant["all"]["spearman"]) and constant["all"]["spans"] == 6
    assert math.isnan(constant["within_length"])  # no length has a rho


def test_within_length_weights_each_length_by_spans_minus_one():
    by_length = {1: {"spearman": 0.5, "spans": 5}, 2: {"spearman": -1.0, "spans": 3},
                 3: {"spearman": float("nan"), "spans": 2}}
    assert within_length(by_length) == pytest.approx((0.5 * 4 - 1.0 * 2) / 6, rel=1e-12)
    assert math.isnan(within_length({3: {"spearman": float("nan"), "spans": 2}}))


# The review's 12-layer case: the measured score falls with span length only (plus noise), as skipping more
# layers costs more in any model; a predictor summed over the span grows with length whatever it knows.
L12 = [(i, j) for i in range(1, 13) for j in range(i, 13)]


def _length_only_scores(rng) -> dict:
    return {(i, j): 0.9 - 0.04 * (j - i + 1) + rng.normal(0, 0.03) for i, j in L12}


@pytest.mark.integration  # a calibration over hundreds of draws: the full tier's
def test_random_per_layer_predictor_scores_zero_within_length():
    """Random U(0, 1) per-layer scores summed over each span: over all spans rho is high (the length effect),
    within length it is 0 ± 1/sqrt(sum(spans − 1)) per draw — the headline is the latter."""
    rng = np.random.default_rng(47)
    headline, pooled, covered = [], [], []
    for _ in range(200):
        measured, layer = _length_only_scores(rng), rng.uniform(size=12)
        result = prediction_rank_correlation(measured, {(i, j): -layer[i - 1:j].sum() for i, j in L12})
        headline.append(result["within_length"])
        pooled.append(result["all"]["spearman"])
        baseline = random_layer_baseline(measured)
        assert abs(baseline["within_length"]) < 0.15 and baseline["all_spans"] > 0.85
        covered.append(baseline["within_length_low"] <= headline[-1] <= baseline["within_length_high"])
    assert abs(np.mean(headline)) < 0.15 and abs(np.mean(headline)) < 3 * 0.125 / np.sqrt(200)
    assert np.mean(pooled) > 0.85  # what the old headline reported for the same predictor
    # Per draw: Spearman over m spans has null variance 1/(m − 1), and sum(m − 1) over lengths 1 … 10 is 65.
    assert np.std(headline) == pytest.approx(1 / np.sqrt(65), rel=0.2)
    assert np.mean(covered) == pytest.approx(0.95, abs=0.04)  # the baseline's 95 % range: the spread chance gives
    assert length_only_baseline(measured) > 0.9


def test_informative_predictor_scores_high_within_length():
    """A predictor that knows which spans of each length hurt less (the measured score's within-length part,
    plus noise), and knows nothing of length, scores high within length — above the random-layer range."""
    rng = np.random.default_rng(3)
    quality = {s: rng.normal(0, 0.03) for s in L12}
    measured = {(i, j): 0.9 - 0.04 * (j - i + 1) + quality[(i, j)] for i, j in L12}
    predicted = {s: quality[s] + rng.normal(0, 0.01) for s in L12}
    result = prediction_rank_correlation(measured, predicted)
    assert result["within_length"] > 0.8
    assert result["within_length"] > random_layer_baseline(measured)["within_length_high"]
    assert abs(result["all"]["spearman"]) < 0.5  # over all spans length swamps it


def _depth_driven_design(rng) -> tuple[dict, dict, dict]:
    """The fidelity review's (2026-11-28 §3b) position design on L12: a layer's weight falls with depth,
    w_l = e^(−(l−1)/4) times this model's jitter e^N(0, 0.5²), and skipping a span costs its summed weight
    (score 0.9 − 0.1·Σw + N(0, 0.02²)). Returns the measured scores and two predictors' droppability: one that
    knows only the generic depth trend (e^(−(l−1)/4) + N(0, 0.05²) per layer, blind to the jitter) and the
    oracle (this model's w)."""
    trend = np.exp(-np.arange(12) / 4)
    weight = trend * np.exp(rng.normal(0, 0.5, 12))
    measured = {(i, j): 0.9 - 0.1 * weight[i - 1:j].sum() + rng.normal(0, 0.02) for i, j in L12}
    depth = trend + rng.normal(0, 0.05, 12)
    return (measured, {(i, j): -depth[i - 1:j].sum() for i, j in L12},
            {(i, j): -weight[i - 1:j].sum() for i, j in L12})


@pytest.mark.integration  # a calibration over hundreds of draws: the full tier's
def test_a_depth_trend_scores_like_position_within_length_and_nothing_beyond_it():
    """Review §3b: within length, a predictor that knows only "deeper layers matter less" scores as high as
    position alone (review: 0.872 against 0.874), above the random-layer range; partial on position it scores
    ≈ 0 (within ±0.15), inside the random layers' range, while the oracle keeps a clear positive rho."""
    rng = np.random.default_rng(11)
    rows = []
    for _ in range(200):
        measured, depth, oracle = _depth_driven_design(rng)
        by_depth, by_oracle = prediction_rank_correlation(measured, depth), prediction_rank_correlation(measured, oracle)
        rows.append((by_depth["within_length"], position_only_baseline(measured), by_depth["beyond_position"],
                     by_oracle["beyond_position"]))
    within, position, beyond, oracle_beyond = np.array(rows).T
    assert abs(np.mean(within) - np.mean(position)) < 0.03 and np.mean(position) > 0.8, (within.mean(), position.mean())
    assert abs(np.mean(beyond)) < 0.15 and abs(np.median(beyond)) < 0.15, (beyond.mean(), np.median(beyond))
    assert np.mean(oracle_beyond) > 0.2 and np.mean(oracle_beyond > beyond) > 0.75, oracle_beyond.mean()
    chance = random_layer_baseline(measured)
    assert chance["within_length_high"] < np.mean(within)  # the random-layer range does not catch depth …
    assert chance["beyond_position_low"] < np.mean(beyond) < chance["beyond_position_high"]  # … partial on position does
    assert abs(chance["beyond_position"]) < 0.05


def test_the_rho_beyond_position_is_a_partial_rank_correlation():
    """Small exact cases: a predictor ranked as position is 0 beyond it; measured ranks that are position's
    leave it undefined; otherwise it is the textbook partial correlation of the ranks."""
    spans = [(i, i) for i in range(1, 7)]
    measured = dict(zip(spans, [0.3, 0.9, 0.2, 0.8, 0.4, 0.7]))
    assert prediction_rank_correlation(measured, {s: float(s[0]) for s in spans})["beyond_position"] == 0.0
    assert math.isnan(prediction_rank_correlation({s: -float(s[0]) for s in spans}, measured)["beyond_position"])
    predicted = dict(zip(spans, [0.1, 0.5, 0.3, 0.9, 0.2, 0.6]))
    r = np.corrcoef([stats.rankdata(list(measured.values())), stats.rankdata(list(predicted.values())), range(6)])
    partial = (r[0, 1] - r[0, 2] * r[1, 2]) / np.sqrt((1 - r[0, 2] ** 2) * (1 - r[1, 2] ** 2))
    assert prediction_rank_correlation(measured, predicted)["beyond_position"] == pytest.approx(partial, rel=1e-12)
    # three spans leave one degree of freedom: undefined, as within_length is for two
    first3 = spans[:3]
    assert math.isnan(prediction_rank_correlation({s: measured[s] for s in first3},
                                                  {s: predicted[s] for s in first3})["beyond_position"])


def test_random_layer_baseline_is_seeded_and_checked():
    measured = _length_only_scores(np.random.default_rng(0))
    assert random_layer_baseline(measured, draws=50) == random_layer_baseline(measured, draws=50)
    assert random_layer_baseline(measured, draws=50, seed=1) != random_layer_baseline(measured, draws=50)
    with pytest.raises(LayersimError, match="draws must be a positive integer"):
        random_layer_baseline(measured, draws=0)
    assert math.isnan(random_layer_baseline({(1, 1): float("nan")})["within_length"])


def test_zero_rows_have_no_angle():
    # Row 2 is zero in layer 1 only: left out of the pairs with layer 1, kept for layer 0 against layer 2.
    layers = [np.array([[1.0, 0.0], [1.0, 0.0]]), np.array([[0.0, 2.0], [0.0, 0.0]]),
              np.array([[0.0, 1.0], [-1.0, 0.0]])]
    measures = pruning_measures(layers)
    np.testing.assert_array_equal(measures.block_influence(), [1.0, 0.0])
    np.testing.assert_array_equal(measures.angular_distance(1), [0.5, 0.0])
    np.testing.assert_array_equal(measures.angular_distance(2), [0.75])  # (1/2 + 1)/2 over both rows
    np.testing.assert_array_equal(measures.rows, [[2, 1, 2], [1, 1, 1], [2, 1, 2]])


def test_an_all_zero_layer_gives_nan_and_is_never_picked():
    layers = _turning([0.3, 0.4, 0.5])
    layers[2] = np.zeros_like(layers[2])  # layers 2 and 3 have no defined BI, spans ending at 2 no distance
    measures = pruning_measures(layers)
    influence = measures.block_influence()
    assert np.isnan(influence[1:]).all() and influence[0] == pytest.approx(1 - np.cos(0.3))
    assert gromov_span(measures, 1) == (1, 1)
    assert gromov_span(measures, 2) == (2, 3)  # layer_1 against layer_3: 0.9 rad; layer_0 vs layer_2 undefined
    assert shortgpt_layers(measures, 1) == (1,) and shortgpt_layers(measures, 2) is None
    assert shortgpt_span(measures, 2) is None
    dropping = span_droppability(measures)["angular_distance"]
    assert np.isnan(dropping[(1, 2)]) and dropping[(2, 3)] == pytest.approx(-0.9 / np.pi)


@pytest.mark.parametrize("n", [0, 3, -1, 1.5, True, "2"])
def test_bad_span_length_is_one_sentence(n):
    with pytest.raises(LayersimError, match=r"span length n must be an integer from 1 to 2 .*got"):
        angular_distance(HAND, n)
    with pytest.raises(LayersimError, match="from 1 to 2"):
        shortgpt_layers(pruning_measures(HAND), n)


@pytest.mark.parametrize("layers,match", [
    (np.zeros((3, 2)), "single array"),
    ([np.zeros((3, 2))], "at least 2 arrays"),
    ([np.ones((3, 2)), np.ones((4, 2))], r"layers\[1\] has shape \(4, 2\)"),
    ([np.ones((3, 2)), np.ones((3, 3))], "same rows and width"),
    ([np.ones((3, 2)), np.ones(3)], r"layers\[1\] must be a 2-D"),
    ([np.ones((3, 2)), np.array([["a", "b"]] * 3)], "real numbers"),
    ([np.ones((3, 2)), np.array([[1.0, np.nan]] * 3)], r"layers\[1\] contains NaN or inf"),
    ([np.ones((0, 2)), np.ones((0, 2))], "at least one row"),
])
def test_bad_layers_are_refused(layers, match):
    with pytest.raises(LayersimError, match=match):
        block_influence(layers)


def test_accumulator_refuses_misuse():
    with pytest.raises(LayersimError, match="num_layers must be an integer of at least 1"):
        PruningAccumulator(0)
    accumulator = PruningAccumulator(2)
    with pytest.raises(LayersimError, match="seen no rows"):
        accumulator.result()
    with pytest.raises(LayersimError, match="holds 2 arrays but the accumulator was made for 3"):
        accumulator.update(HAND[:2])
    accumulator.update(HAND)
    with pytest.raises(LayersimError, match="earlier batches 2 columns"):
        accumulator.update([np.ones((1, 3))] * 3)


@pytest.mark.parametrize("measured,predicted,match", [
    ({}, {}, "holds no spans"),
    ({(2, 1): 0.5}, {(2, 1): 1.0}, r"span \(2, 1\) is not a \(first, last\) pair"),
    ({(0, 1): 0.5}, {(0, 1): 1.0}, "1-based"),
    ({(1, 1): 0.5, (1, 2): 0.4}, {(1, 1): 1.0}, r"span \(1, 2\) is missing from predicted"),
    ({(1, 1): 0.5}, {(1, 1): 1.0, (2, 2): 0.0}, r"span \(2, 2\) is missing from measured"),
])
def test_rank_correlation_refuses_mismatched_spans(measured, predicted, match):
    with pytest.raises(LayersimError, match=match):
        prediction_rank_correlation(measured, predicted)
