"""Tests of layersim.similarity.comparisons: stacked matrices, their blocks and the localization score."""

from __future__ import annotations

import numpy as np
import pytest

from layersim.similarity.comparison_intervals import seed_spread
from layersim.similarity.comparisons import (attention_measure_bounds, attention_measure_label, block, localization,
                                             measure_options, pair_summary, phang_cells, phang_comparisons,
                                             stacked_matrix, summarize)
from layersim.similarity import AttentionMaps, attention_similarity_matrix, similarity_matrix


def _models(rng: np.random.Generator, n: int = 80, width: int = 6) -> dict[str, list[np.ndarray]]:
    base = [rng.normal(size=(n, width)) for _ in range(3)]
    constant = np.ones((n, width))  # like CLS at the embedding layer
    return {
        "ORIG": [constant, *base],
        "FT[1]": [constant, base[0], base[1] + 0.3 * rng.normal(size=(n, width)), rng.normal(size=(n, width))],
        "FT[2]": [constant, base[0], base[1], rng.normal(size=(n, width))],
    }


@pytest.mark.parametrize("measure", ["linear_cka", "svcca", "pwcca", "neuronsim"])
def test_stacked_matrix_blocks_are_the_pairwise_matrices(measure):
    models = _models(np.random.default_rng(0))
    sizes = {name: len(layers) for name, layers in models.items()}
    matrix = stacked_matrix(measure, models)
    assert matrix.shape == (12, 12)
    for a in models:
        for b in models:
            want = similarity_matrix(measure, models[a][1:], models[b][1:])
            np.testing.assert_allclose(block(matrix, sizes, a, b)[1:, 1:], want, atol=1e-10)
            # The constant layer's row and column are undefined, not a number.
            assert np.isnan(block(matrix, sizes, a, b)[0]).all() and np.isnan(block(matrix, sizes, a, b)[:, 0]).all()


def test_phang_comparisons_pick_the_right_blocks():
    models = _models(np.random.default_rng(1))
    sizes = {name: len(layers) for name, layers in models.items()}
    matrix = stacked_matrix("linear_cka", models)
    comparisons = {c.key: c for c in phang_comparisons(matrix, sizes, "ORIG", ["FT[1]", "FT[2]"])}
    assert list(comparisons) == ["orig_orig", "ft_orig", "ft_ft", "ft1_ft2"]
    np.testing.assert_array_equal(comparisons["ft_orig"].matrix, block(matrix, sizes, "FT[1]", "ORIG"))
    np.testing.assert_array_equal(comparisons["ft1_ft2"].matrix, block(matrix, sizes, "FT[1]", "FT[2]"))
    # FT[1] and FT[2] share layer 1 exactly, and ORIG and FT[2] share layers 1 and 2.
    assert comparisons["ft1_ft2"].matrix[1, 1] == pytest.approx(1.0)
    summary = summarize(comparisons.values())
    assert summary["orig_orig"]["diagonal"]["layer_00"] is None
    assert summary["orig_orig"]["diagonal"]["layer_03"] == pytest.approx(1.0)
    assert summary["ft_orig"]["diagonal"]["layer_01"] == pytest.approx(1.0)
    assert summary["ft_orig"]["last_layer"] < 0.5  # independent random layers
    assert "offdiagonal_mean" in summary["ft_ft"] and "offdiagonal_mean" not in summary["ft_orig"]
    # A single fine-tuning seed: no FT[1]–FT[2].
    two = {k: models[k] for k in ("ORIG", "FT[1]")}
    keys = [c.key for c in phang_comparisons(stacked_matrix("linear_cka", two), {k: 4 for k in two}, "ORIG", ["FT[1]"])]
    assert keys == ["orig_orig", "ft_orig", "ft_ft"]


def test_localization_is_the_raw_difference_of_row_means_by_default():
    """Wu et al. §5.1: mean neuronsim minus mean svsim over the other layers, not standardised."""
    neuron = np.array([[1.0, 0.8, 0.2], [0.6, 1.0, 0.4], [0.1, 0.3, 1.0]])
    sv = np.array([[1.0, 0.5, 0.5], [0.5, 1.0, 0.9], [0.5, 0.9, 1.0]])
    scores = localization(neuron, sv, {"A": 2, "B": 1})
    np.testing.assert_allclose(np.concatenate([scores["A"], scores["B"]]), [0.0, -0.2, -0.5])


def test_localization_zscored_on_request():
    neuron = np.array([[1.0, 0.8, 0.2], [0.6, 1.0, 0.4], [0.1, 0.3, 1.0]])
    sv = np.array([[1.0, 0.5, 0.5], [0.5, 1.0, 0.9], [0.5, 0.9, 1.0]])
    scores = localization(neuron, sv, {"A": 2, "B": 1}, standardize=True)
    neuron_means = np.array([0.5, 0.5, 0.2])  # row means without the diagonal
    sv_means = np.array([0.5, 0.7, 0.7])

    def z(v):
        return (v - v.mean()) / v.std()

    want = z(neuron_means) - z(sv_means)
    np.testing.assert_allclose(np.concatenate([scores["A"], scores["B"]]), want)
    assert list(scores) == ["A", "B"] and len(scores["A"]) == 2


def test_localization_leaves_undefined_layers_out():
    rng = np.random.default_rng(2)
    neuron = rng.uniform(size=(4, 4))
    sv = rng.uniform(size=(4, 4))
    neuron[0, :] = neuron[:, 0] = np.nan
    sv[0, :] = sv[:, 0] = np.nan
    scores = localization(neuron, sv, {"M": 4})["M"]
    assert np.isnan(scores[0]) and np.isfinite(scores[1:]).all()
    np.testing.assert_allclose(scores[1:], localization(neuron[1:, 1:], sv[1:, 1:], {"M": 3})["M"])


def test_attention_layers_use_the_attention_measures():
    rng = np.random.default_rng(3)

    def maps(seed_shift: float) -> AttentionMaps:
        logits = [rng.normal(size=(2, 5, 5)) + seed_shift for _ in range(3)]
        return AttentionMaps.from_maps([np.exp(a) / np.exp(a).sum(-1, keepdims=True) for a in logits])

    models = {"ORIG": [maps(0), maps(0)], "FT[1]": [maps(1), maps(1)]}
    matrix = stacked_matrix("jensen_shannon", models)
    layers = models["ORIG"] + models["FT[1]"]
    np.testing.assert_allclose(matrix, attention_similarity_matrix("jensen_shannon", layers))
    assert np.isfinite(matrix).all()


def test_labels_and_options():
    assert attention_measure_label("jensen_shannon") == "Jensen–Shannon attention"
    assert attention_measure_label("linear_cka") == "linear CKA over heads"
    assert attention_measure_bounds("pearson") == (-1.0, 1.0)
    assert attention_measure_bounds("matrix_norm") is None
    assert attention_measure_bounds("svcca") == (0.0, 1.0)
    options = measure_options(rbf_sigma_scale=2.0, svcca_variance=0.9)
    assert options == {"rbf_cka": {"sigma_scale": 2.0}, "svcca": {"variance_threshold": 0.9}}
    assert measure_options(rbf_sigma_scale=1.0, svcca_variance=0.9, pwcca_variance=0.99)["pwcca"] == {
        "variance_threshold": 0.99}
    # The Nyström seed is the measure's landmark_seed: the null and bootstrap drivers take their own `seed`.
    assert measure_options(rbf_sigma_scale=1.0, svcca_variance=0.9, rbf_exact_max_rows=50, rbf_landmarks=20,
                           seed=4)["rbf_cka"] == {"sigma_scale": 1.0, "exact_max_rows": 50, "landmarks": 20,
                                                  "landmark_seed": 4}


def test_phang_cells_mark_exactly_the_reported_blocks():
    sizes = {"ORIG": 2, "FT[1]": 2, "FT[2]": 2}
    marker = np.arange(36.0).reshape(6, 6)
    cells = phang_cells(sizes, "ORIG", ["FT[1]", "FT[2]"])
    reported = np.concatenate([c.matrix.ravel() for c in phang_comparisons(marker, sizes, "ORIG", ["FT[1]", "FT[2]"])])
    np.testing.assert_array_equal(np.sort(marker[cells]), np.sort(reported))
    assert cells.sum() == 4 * 4


def test_seed_spread_is_mean_and_sd_over_every_pair_of_seeds():
    sizes = {"ORIG": 2, "FT[1]": 2, "FT[2]": 2, "FT[3]": 2}
    matrix = np.random.default_rng(7).uniform(size=(8, 8))
    mean, sd = seed_spread(matrix, sizes, ["FT[1]", "FT[2]", "FT[3]"])
    pairs = np.array([[matrix[2, 4], matrix[3, 5]], [matrix[2, 6], matrix[3, 7]], [matrix[4, 6], matrix[5, 7]]])
    np.testing.assert_allclose(mean, pairs.mean(0))
    np.testing.assert_allclose(sd, pairs.std(0, ddof=1))


def test_pair_summary_diagonal_for_equal_depth_best_match_otherwise():
    rng = np.random.default_rng(4)
    base = [rng.normal(size=(60, 5)) for _ in range(4)]
    models = {"ORIG": base, "FT": [b + 0.01 * rng.normal(size=b.shape) for b in base],
              "shallow": [base[3], base[1]]}  # a 2-layer model whose layers are ORIG's 3 and 1
    sizes = {name: len(layers) for name, layers in models.items()}
    summary = pair_summary(stacked_matrix("linear_cka", models), sizes, "ORIG")
    assert set(summary) == {"FT", "shallow"}
    assert all(v > 0.99 for v in summary["FT"]["diagonal"].values())
    best = summary["shallow"]["best_match"]
    assert best["layer_00"]["layer"] == 3 and best["layer_01"]["layer"] == 1
    assert best["layer_00"]["similarity"] == pytest.approx(1.0)


def test_ft_orig_carries_every_seeds_diagonal_and_random_comparisons_need_the_control():
    """FT is the first seed's model; per_seed holds FT[k]–ORIG's diagonal for every k, read off the stacked matrix.
    ORIG–RANDOM and FT–RANDOM appear only when the random-init control is stacked."""
    sizes = {"ORIG": 3, "FT[1]": 3, "FT[2]": 3, "FT[3]": 3}
    matrix = np.random.default_rng(8).uniform(size=(12, 12))
    comparisons = {c.key: c for c in phang_comparisons(matrix, sizes, "ORIG", ["FT[1]", "FT[2]", "FT[3]"])}
    assert set(comparisons) == {"orig_orig", "ft_orig", "ft_ft", "ft1_ft2"}
    per_seed = comparisons["ft_orig"].per_seed
    assert list(per_seed) == ["FT[1]", "FT[2]", "FT[3]"]
    for k, label in enumerate(per_seed, start=1):
        np.testing.assert_array_equal(per_seed[label], [matrix[3 * k + i, i] for i in range(3)])
    assert comparisons["orig_orig"].per_seed is None and comparisons["ft1_ft2"].per_seed is None
    with_control = {c.key: c for c in phang_comparisons(np.random.default_rng(9).uniform(size=(15, 15)),
                                                        sizes | {"RANDOM": 3}, "ORIG", ["FT[1]", "FT[2]", "FT[3]"])}
    assert {"orig_random", "ft_random"} <= set(with_control)
    assert with_control["ft_random"].x_label == "RANDOM layer" and list(with_control["ft_random"].per_seed) == [
        "FT[1]", "FT[2]", "FT[3]"]
