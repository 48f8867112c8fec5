"""Seeds as the unit of uncertainty (layersim.similarity.inference.seeds): per-seed FT[k]–ORIG diagonals read off the stacked
matrix, their mean, sd and t-interval over seeds beside the bootstrap interval over examples, and what two seeds
give instead."""

from __future__ import annotations

import math

import numpy as np
import pytest

from layersim.similarity.comparisons import phang_comparisons, stacked_matrix, summarize
from layersim.reporting.headlines import similarity_headline
from layersim.reporting.similarity_tables import similarity_tables
from layersim.compute.runs import converged_mean
from layersim.similarity.inference.seeds import over_seeds, seed_metrics

# t(0.975, 2 df) in closed form: with 2 df the CDF is 1/2 + t / (2·sqrt(2 + t²)), so t / sqrt(2 + t²) = 0.95.
T_975_2 = math.sqrt(2 * 0.95**2 / (1 - 0.95**2))


def test_three_seeds_give_the_hand_computed_t_interval():
    values = np.array([[0.50, 0.60], [0.70, 0.65], [0.90, 0.70]])  # 3 seeds × 2 layers
    spread = over_seeds(values)
    for layer in range(2):
        column = values[:, layer]
        mean = column.sum() / 3
        sd = math.sqrt(((column - mean) ** 2).sum() / 2)
        half = T_975_2 * sd / math.sqrt(3)
        assert spread.mean[layer] == pytest.approx(mean)
        assert spread.sd[layer] == pytest.approx(sd)
        assert (spread.low[layer], spread.high[layer]) == pytest.approx((mean - half, mean + half))
    assert spread.seeds == 3 and "n = 3 (2 df) on every layer" in spread.note


def test_two_seeds_give_values_and_range_and_say_why_there_is_no_interval():
    spread = over_seeds(np.array([[0.37], [0.77]]))
    assert spread.sd is None and spread.low is None and spread.high is None
    assert spread.range[0] == pytest.approx(0.40) and spread.mean[0] == pytest.approx(0.57)
    assert "at least 3 seeds" in spread.note
    one = over_seeds(np.array([[0.5]]))
    assert one.low is None and "no spread over seeds" in one.note


def test_identical_seeds_collapse_the_interval_and_undefined_layers_stay_undefined():
    values = np.array([[np.nan, 0.4, 0.2], [np.nan, 0.4, 0.9], [np.nan, 0.4, 0.5], [np.nan, 0.4, 0.1]])
    spread = over_seeds(values)
    assert np.isnan([spread.mean[0], spread.sd[0], spread.low[0], spread.high[0]]).all()
    assert spread.sd[1] == 0.0 and spread.low[1] == spread.high[1] == pytest.approx(0.4)
    # A wider confidence gives a wider interval around the same mean.
    wide = over_seeds(values, confidence=0.99)
    assert wide.low[2] < spread.low[2] < spread.mean[2] < spread.high[2] < wide.high[2]


def test_the_interval_is_clipped_to_the_measures_range():
    """Review §11c: CKA 0.97, 0.99, 0.999 give mean 0.98633, sd 0.014844, upper bound 0.98633 + 4.3027·0.014844/√3
    = 1.0232 unclipped; CKA's range [0, 1] caps it at 1 and leaves the lower bound alone."""
    values = np.array([[0.97], [0.99], [0.999]])
    assert over_seeds(values).high[0] == pytest.approx(1.0232, abs=1e-4)
    clipped = over_seeds(values, bounds=(0.0, 1.0))
    assert clipped.high[0] == 1.0 and clipped.low[0] == pytest.approx(over_seeds(values).low[0])
    assert "clipped to the measure's range [0, 1]" in clipped.note


def test_the_note_counts_the_seeds_defined_on_each_layer():
    values = np.array([[0.5, 0.6, 0.1], [0.7, np.nan, 0.2], [0.9, 0.8, np.nan]])  # layers 1, 2: two seeds each
    spread = over_seeds(values)
    assert "n = 3 (2 df) on 1 of 3 layers; 2 with n = 2" in spread.note
    assert np.isnan(spread.low[1:]).all() and np.isfinite(spread.low[0])


def test_the_converged_only_mean_leaves_the_flagged_runs_out():
    runs = {"FT[1]": np.array([0.8, 0.6]), "FT[2]": np.array([0.2, np.nan]), "FT[3]": np.array([0.6, 0.4])}
    assert converged_mean(runs, {"FT[2]"}) == pytest.approx([0.7, 0.5])
    assert converged_mean(runs) == pytest.approx([1.6 / 3, 0.5])  # all runs, NaN left out
    assert np.isnan(converged_mean(runs, set(runs))).all()
    assert converged_mean({1: 0.9, 2: 0.5}, {2}) == pytest.approx(0.9)   # scalars: freeze's scores per seed
    entry = seed_metrics(runs, list, flagged={"FT[2]"})
    assert entry["seed_mean_converged"] == pytest.approx([0.7, 0.5]) and entry["seeds_converged"] == 2
    assert entry["seed_mean"] == pytest.approx([1.6 / 3, 0.5])


def _models(seeds: int, rng: np.random.Generator, n: int = 60, width: int = 4) -> dict[str, list[np.ndarray]]:
    """ORIG's layer 1 kept by every seed with seed-specific noise (so the seeds disagree), layer 0 constant."""
    orig = [np.ones((n, width)), rng.normal(size=(n, width))]
    models = {"ORIG": orig}
    for k in range(1, seeds + 1):
        models[f"FT[{k}]"] = [orig[0], orig[1] + 0.3 * k * rng.normal(size=(n, width))]
    return models


def _summary(seeds: int) -> tuple[dict, np.ndarray]:
    models = _models(seeds, np.random.default_rng(seeds))
    sizes = {label: len(layers) for label, layers in models.items()}
    matrix = stacked_matrix("linear_cka", models)
    finetuned = [label for label in sizes if label != "ORIG"]
    summary = summarize(phang_comparisons(matrix, sizes, "ORIG", finetuned))
    top = np.array([matrix[2 + 2 * k + 1, 1] for k in range(seeds)])  # FT[k]'s layer 1 against ORIG's layer 1
    return summary, top


def test_seed_metrics_of_three_seeds_come_from_every_seeds_ft_orig_diagonal():
    summary, top = _summary(3)
    entry = summary["ft_orig"]
    assert entry["seeds"] == 3
    assert entry["last_layer"] == pytest.approx(top[0], abs=1e-6)  # FT is still the first seed
    assert [v["layer_01"] for v in entry["seed_values"].values()] == pytest.approx(top, abs=1e-6)
    mean, sd = top.mean(), top.std(ddof=1)
    half = T_975_2 * sd / math.sqrt(3)
    assert entry["seed_mean"]["layer_01"] == pytest.approx(mean, abs=1e-6)
    assert entry["seed_sd"]["layer_01"] == pytest.approx(sd, abs=1e-6)
    assert (entry["seed_ci_low"]["layer_01"], entry["seed_ci_high"]["layer_01"]) == pytest.approx(
        (mean - half, mean + half), abs=1e-6)
    assert entry["seed_mean"]["layer_00"] is None  # the constant layer has no similarity, for any seed
    headline = similarity_headline({"cls": {"linear_cka": summary}}, 0.05)["cls"]["linear_cka"]
    assert headline["ft_orig_top_seed_ci_low"] == entry["seed_ci_low"]["layer_01"]
    assert headline["ft_orig_top_seed_sd"] == entry["seed_sd"]["layer_01"]
    assert "ft_orig_top_seed_range" not in headline
    # The report leads with the seed-level value: mean ± sd [interval] (n seeds).
    row = similarity_tables({"cls": {"linear_cka": summary}}, 0.05)[0].rows[0]
    assert row[2].startswith(f"{mean:.3f} ± {sd:.3f} [") and row[2].endswith("(3 seeds)")


def test_two_seeds_report_both_values_and_their_range_but_no_interval():
    summary, top = _summary(2)
    entry = summary["ft_orig"]
    assert not {"seed_sd", "seed_ci_low", "seed_ci_high"} & set(entry)
    assert entry["seed_range"]["layer_01"] == pytest.approx(abs(top[1] - top[0]), abs=1e-6)
    assert "at least 3 seeds" in entry["seed_interval"]
    headline = similarity_headline({"cls": {"linear_cka": summary}}, 0.05)["cls"]["linear_cka"]
    assert "ft_orig_top_seed_ci_low" not in headline
    assert headline["ft_orig_top_seed_range"] == entry["seed_range"]["layer_01"]
    row = similarity_tables({"cls": {"linear_cka": summary}}, 0.05)[0].rows[0]
    assert f"{top[0]:.3f}, {top[1]:.3f}" in row[2] and "needs ≥ 3 seeds" in row[2]


def test_one_seed_says_there_is_no_spread():
    summary, _ = _summary(1)
    assert summary["ft_orig"]["seeds"] == 1 and "seed_mean" not in summary["ft_orig"]
    assert "no spread over seeds" in summary["ft_orig"]["seed_interval"]


# --- pairs of runs of different seeds (over_seed_pairs: the jackknife over seeds) ---


def test_the_jackknife_of_one_value_per_seed_is_the_t_interval():
    """Pairs (i, i), one per seed: leaving a seed out leaves the mean of the others, and the jackknife's se is sd/√n,
    so the interval is over_seeds' t-interval exactly."""
    from layersim.similarity.inference.seeds import over_seed_pairs

    values = np.array([[0.2, 0.5], [0.4, 0.55], [0.9, 0.6], [0.3, 0.52]])
    found, expected = over_seed_pairs({(i, i): row for i, row in enumerate(values)}), over_seeds(values)
    np.testing.assert_allclose(found.mean, expected.mean)
    np.testing.assert_allclose(found.low, expected.low)
    np.testing.assert_allclose(found.high, expected.high)
    assert found.seeds == 4 and found.pairs == 4


def test_pairs_sharing_seeds_get_a_jackknife_interval_and_a_difference_moves_with_a_shift():
    """FT[i]–FT[j] built from seed effects (value = e_i + e_j): the left-out means are hand-computable; a baseline
    shifted by c gives a difference of exactly −c with the same jackknife spread as the pairs' own."""
    from scipy.stats import t as student_t

    from layersim.similarity.inference.seeds import over_seed_pairs

    effects = np.array([0.1, 0.3, 0.8])
    pairs = {(i, j): np.array([effects[i] + effects[j]]) for i in range(3) for j in range(i + 1, 3)}
    found = over_seed_pairs(pairs)
    left_out = np.array([effects[1] + effects[2], effects[0] + effects[2], effects[0] + effects[1]])
    se = np.sqrt(2 / 3 * np.sum((left_out - left_out.mean()) ** 2))
    assert found.mean[0] == pytest.approx(2 * effects.mean())
    assert found.high[0] - found.mean[0] == pytest.approx(student_t.ppf(0.975, 2) * se)
    shifted = {key: value + 0.25 for key, value in pairs.items()}
    difference = over_seed_pairs(pairs, baseline=shifted)
    assert difference.mean[0] == pytest.approx(-0.25) and difference.sd is None
    assert difference.high[0] - difference.low[0] == pytest.approx(0.0, abs=1e-12)  # the same pairs: no spread left


def test_two_seeds_give_no_interval_over_pairs():
    from layersim.similarity.inference.seeds import over_seed_pairs

    found = over_seed_pairs({(0, 1): np.array([0.5]), (1, 0): np.array([0.7])})
    assert found.low is None and "needs at least 3" in found.note and found.mean[0] == pytest.approx(0.6)
