"""What the similarity and compare stages report (layersim.reporting.similarity), without DVC: every cell with
its permutation null, hatched when not above it, and the diagonals with bootstrap intervals."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.patches import Rectangle

from layersim.similarity.comparison_intervals import diagonal_intervals
from layersim.similarity.comparisons import phang_comparisons, stacked_matrix
from layersim.similarity import cka_matrix, permutation_test
from layersim.similarity.inference.bootstrap import AUTO_INTERVAL, resample_rows
from layersim.experiments.compare import stacked_report
from layersim.experiments.similarity import phang_report
from layersim.reporting.similarity import blocks_metrics
from layersim.similarity.results import Uncertainty, layer_blocks

N, D = 80, 6


def _models(seeds: int = 2) -> dict[str, list[np.ndarray]]:
    """ORIG and fine-tuned seeds whose first two layers are ORIG's and whose others are independent noise."""
    rng = np.random.default_rng(0)
    orig = [rng.normal(size=(N, D)) for _ in range(4)]
    models = {"ORIG": orig}
    for i in range(1, seeds + 1):
        models[f"FT[{i}]"] = [layer + 0.1 * rng.normal(size=(N, D)) if k < 2 else rng.normal(size=(N, D))
                              for k, layer in enumerate(orig)]
    return models


def _report(models, measures=("linear_cka", "neuronsim"), **uncertainty):
    sizes = {label: len(layers) for label, layers in models.items()}
    settings = {"permutations": 40, "bootstrap": 30, **uncertainty}
    return phang_report(sizes, lambda m: stacked_matrix(m, models), list(measures), "test", layers=lambda: models,
                        uncertainty=Uncertainty(**settings), groups=np.arange(N) // 2)


def _hatched(figure) -> int:
    return sum(bool(isinstance(p, Rectangle) and p.get_hatch()) for ax in figure.axes for p in ax.patches)


def test_every_reported_cell_carries_its_null_and_chance_cells_are_hatched():
    models = _models()
    report = _report(models)
    for measure in ("linear_cka", "neuronsim"):
        ft_orig = report.metrics[measure]["ft_orig"]
        # Layers kept from ORIG are far above chance; the independent ones are not.
        assert ft_orig["p_value"]["layer_00"] < 0.05 and ft_orig["p_value"]["layer_01"] < 0.05
        assert ft_orig["p_value"]["layer_03"] > 0.05
        assert ft_orig["null_mean"]["layer_03"] == pytest.approx(ft_orig["diagonal"]["layer_03"], abs=0.1)
        if AUTO_INTERVAL[measure] is None:  # neuronsim: no interval method covered (benchmarks/bootstrap.py)
            assert "ci_low" not in ft_orig and "no bootstrap interval" in report.metrics[measure]["no_interval"]
        else:
            assert ft_orig["ci_low"]["layer_00"] <= ft_orig["diagonal"]["layer_00"] + 1e-9
    # Rows come in pairs of one example (groups): whole examples are permuted, linear CKA's at least 199 times.
    assert report.metrics["linear_cka"]["null"] == {"method": "block permutation", "permutations": 199}
    assert report.metrics["neuronsim"]["null"] == {"method": "block permutation", "permutations": 40}
    # The figure hatches exactly the cells whose p-value, corrected over its heatmap (BH by default), is at
    # least the significance level; every row with a p-value carries its corrected value but a layer against
    # itself (the ORIG–ORIG and FT–FT diagonals), which is no test.
    with_p = [row for row in report.rows if row["p_value"] is not None]
    itself = [row for row in with_p if row["comparison"] in ("ORIG–ORIG", "FT–FT") and row["y_layer"] == row["x_layer"]]
    assert itself and all(row["p_adjusted"] is None for row in itself)
    tested = [row for row in with_p if row not in itself]
    assert all(row["correction"] == "fdr_bh" and row["p_value"] <= row["p_adjusted"] <= 1 for row in tested)
    chance = sum(row["p_adjusted"] >= 0.05 for row in tested)
    assert chance > sum(row["p_value"] >= 0.05 for row in tested) and _hatched(report.figure) == chance
    uncorrected = _report(models, correction="none", bootstrap=0)
    assert _hatched(uncorrected.figure) == sum(row["p_value"] >= 0.05 for row in tested)
    plt.close("all")


def test_a_cell_null_is_the_per_pair_permutation_test():
    models = _models()
    report = _report(models, measures=("svcca",), bootstrap=0)
    row = next(r for r in report.rows if r["comparison"] == "FT–ORIG" and r["y_layer"] == 2 and r["x_layer"] == 3)
    single = permutation_test("svcca", models["FT[1]"][2], models["ORIG"][3], permutations=40, seed=0,
                              groups=np.arange(N) // 2)
    assert row["p_value"] == pytest.approx(single.p_value, abs=1e-6)
    assert row["null_mean"] == pytest.approx(single.null_mean, abs=1e-6)
    assert "ci_low" not in report.metrics["svcca"]["ft_orig"]  # bootstrap: 0 computes no interval
    # What each value was computed from: the rank (6), under the cap of one dimension per 10 examples (7).
    assert report.metrics["svcca"]["kept_dimensions"]["ORIG"] == [6, 6, 6, 6]
    plt.close("all")


def test_diagonal_rows_and_seed_spread():
    report = _report(_models(seeds=3), measures=("linear_cka",))
    comparisons = {row["comparison"] for row in report.diagonal_rows}
    assert comparisons == {"FT–ORIG", "FT[1]–FT[2]", "FT[i]–FT[j]"}
    spread = report.metrics["linear_cka"]["ft_pairs"]
    assert spread["pairs"] == 3 and spread["sd"]["layer_03"] >= 0.0
    ft12 = [row for row in report.diagonal_rows if row["comparison"] == "FT[1]–FT[2]"]
    assert all(row["low"] <= row["high"] for row in ft12)
    assert report.diagonal_figure is not None
    plt.close("all")


def test_chance_adjusted_on_request():
    report = _report(_models(), measures=("linear_cka",), adjusted=True, bootstrap=0)
    entry = report.metrics["linear_cka"]["ft_orig"]
    value, null = entry["diagonal"]["layer_02"], entry["null_mean"]["layer_02"]
    assert entry["adjusted"]["layer_02"] == pytest.approx((value - null) / (1 - null), abs=1e-5)
    plt.close("all")


def test_without_uncertainty_nothing_is_qualified():
    models = _models()
    sizes = {label: len(layers) for label, layers in models.items()}
    report = phang_report(sizes, lambda m: stacked_matrix(m, models), ["linear_cka"], "test")
    assert "null_mean" not in report.metrics["linear_cka"]["ft_orig"] and report.diagonal_figure is None
    assert _hatched(report.figure) == 0
    plt.close("all")


def test_stacked_report_qualifies_every_cell():
    models = _models()
    report = stacked_report(models, "linear_cka", "stacked", uncertainty=Uncertainty(permutations=10), pooling="cls")
    assert all(row["pooling"] == "cls" and 0.0 <= row["p_value"] <= 1.0 for row in report.rows)
    assert set(report.summary["FT[1]"]) == {"diagonal", "null_mean", "p_value"}
    assert report.summary["FT[1]"]["p_value"]["layer_03"] > 0.05 > report.summary["FT[1]"]["p_value"]["layer_00"]
    # One heatmap, one family: BH over its cells between two models; a model's own block is not tested.
    assert report.summary["correction"] == "fdr_bh"
    within = [row for row in report.rows if row["comparison"].split(" vs ")[0] == row["comparison"].split(" vs ")[1]]
    assert within and all(row["p_adjusted"] is None for row in within)
    assert _hatched(report.figure) == sum(row["p_adjusted"] is not None and row["p_adjusted"] >= 0.05
                                          for row in report.rows)
    plt.close("all")


def test_planted_blocks_of_layers_are_found_outlined_and_stable_over_seeds():
    """Each model's layers 0-2 share one signal and layers 3-5 another: ORIG–ORIG and FT–FT split into
    those two blocks, outlined on the heatmaps; both seeds split the same way (stability 1)."""
    rng = np.random.default_rng(1)
    models = {}
    for label in ("ORIG", "FT[1]", "FT[2]"):
        early, late = rng.normal(size=(N, D)), rng.normal(size=(N, D))
        models[label] = [(early if k < 3 else late) + 0.3 * rng.normal(size=(N, D)) for k in range(6)]
    sizes = {label: 6 for label in models}
    report = phang_report(sizes, lambda m: stacked_matrix(m, models), ["linear_cka"], "test")
    blocks = report.metrics["linear_cka"]["blocks"]
    for key in ("orig_orig", "ft_ft"):
        assert blocks[key]["num_blocks"] == 2 and blocks[key]["last_block_start"] == 3
        assert list(blocks[key]["block_of_layer"].values()) == [0, 0, 0, 1, 1, 1]
        assert blocks[key]["contrast"] > 0.5
    assert blocks["ft1_ft2"]["num_blocks"] == 1  # the seeds' signals are independent: no structure across them
    assert blocks["seed_stability"] == 1.0
    outlines = [p for ax in report.figure.axes for p in ax.patches if isinstance(p, Rectangle) and not p.get_fill()]
    assert len(outlines) == 4  # two blocks on each of ORIG–ORIG and FT–FT
    plt.close(report.figure)
    qualified = phang_report(sizes, lambda m: stacked_matrix(m, models), ["linear_cka"], "test", layers=lambda: models,
                             uncertainty=Uncertainty(permutations=5, bootstrap=12))
    for key in ("orig_orig", "ft_ft"):  # resamples of the examples split the same way
        assert qualified.metrics["linear_cka"]["blocks"][key]["bootstrap_stability"] == 1.0
    plt.close(qualified.figure)


def test_the_whole_self_matrices_come_back_for_every_bootstrap_resample():
    models = _models()
    comparisons = phang_comparisons(stacked_matrix("linear_cka", models), {k: 4 for k in models}, "ORIG",
                                    ["FT[1]", "FT[2]"])
    _, resampled = diagonal_intervals("linear_cka", models, comparisons, resamples=5, seed=3, whole=("ft_ft",))
    assert set(resampled) == {"ft_ft"} and resampled["ft_ft"].shape == (5, 4, 4)
    for matrix, rows in zip(resampled["ft_ft"], resample_rows(N, 5, 3)):
        np.testing.assert_allclose(matrix, cka_matrix([a[rows] for a in models["FT[1]"]]), atol=1e-9)


def test_an_undefined_layer_joins_no_block():
    """A layer constant over the examples (CLS at the embeddings) has NaN similarities: the blocks cover the
    other layers, numbered as in the matrix."""
    matrix = np.full((5, 5), 0.2)
    matrix[1:3, 1:3] = matrix[3:, 3:] = 0.9
    matrix[0, :] = matrix[:, 0] = np.nan
    found = layer_blocks(matrix)
    assert found.starts == (1, 3) and found.labels.tolist() == [-1, 0, 0, 1, 1]
    metrics = blocks_metrics(found)
    assert metrics["block_of_layer"] == {"layer_00": None, "layer_01": 0, "layer_02": 0, "layer_03": 1, "layer_04": 1}
    assert metrics["last_block_start"] == 3 and metrics["num_blocks"] == 2
