"""Every measure of layersim.similarity.MEASURES through the similarity and compare stages' code, with the
stages' own options (layersim.similarity.results.settings), nulls and intervals on: in memory, and streamed
from the tables' moments where the measure streams (the switch, layersim.similarity.comparisons.stream_layers, forced).
Tiny tables (3 models × 3 layers of width 4, 40 rows) keep it to seconds."""

from __future__ import annotations

import inspect

import matplotlib.pyplot as plt
import numpy as np
import pytest

from layersim.experiments import similarity_inputs
import layersim.experiments.similarity as similarity_task
from layersim.experiments.compare import compare_representations
from layersim.similarity.comparisons import STREAMABLE
from layersim.experiments.extract import Pooled
from layersim.similarity import MEASURES, MOMENT_MEASURES, permutation_matrix, permutation_test
from layersim.similarity.inference.bootstrap import AUTO_INTERVAL, bootstrap_pairs
from layersim.experiments.similarity import task_similarity

from fake_tables import ROWS, TASK, fake_runs as _layers, similarity_params as _params

# (measure, streamed): in memory every measure; streamed the ones whose matrix comes from moments.
CASES = [(m, False) for m in MEASURES] + [(m, True) for m in MEASURES if m in STREAMABLE]


def _check_values(measure: str, entry: dict, *, self_comparison: bool = False) -> None:
    low, high = MEASURES[measure].bounded
    values = list(entry["diagonal"].values())
    assert all(v is not None and low - 1e-9 <= v <= high + 1e-9 for v in values), values
    if self_comparison:  # every measure compares a layer with itself as 1
        assert values == pytest.approx([1.0] * len(values), abs=1e-6)


@pytest.mark.parametrize("measure, streamed", CASES)
def test_the_similarity_stage(measure, streamed, extracted, monkeypatch):
    if streamed:  # the stage streams by size; these tables are far too small to, unless forced
        monkeypatch.setattr(similarity_inputs, "stream_layers", lambda *args: True)
    warnings = []
    out = task_similarity(extracted / "activations", extracted / "checkpoints", TASK, _params(measure),
                          warn=lambda *args: warnings.append(args[0] % args[1:]))
    metrics = out.metrics["cls"][measure]
    _check_values(measure, metrics["orig_orig"], self_comparison=True)
    for key in ("ft_orig", "ft_ft", "ft1_ft2"):
        _check_values(measure, metrics[key], self_comparison=key == "ft_ft")
    rows = [row for row in out.rows["plots", "cls.json"] if row.get("p_value") is not None]
    has_null = "null" in metrics
    if MEASURES[measure].no_null:  # a difference of summaries: no null, no interval, said so
        assert not has_null and metrics["no_null"] == MEASURES[measure].no_null and not rows
        assert "ci_low" not in metrics["ft_orig"]
        assert any(MEASURES[measure].no_null in w for w in warnings)
        return
    # A null for every measure, but debiased CKA's and the shape metrics' when streamed (their permutations need
    # the rows): said so.
    assert has_null == (not (streamed and measure in ("debiased_cka", "procrustes", "shape_metric")))
    if not has_null:
        assert f"no permutation null for {measure}" in out.metrics["cls"]["null"] and not rows
        assert any(f"no permutation null for {measure}" in w for w in warnings)
        return
    expected = "exact" if measure == "linear_cka" else "permutation"
    # Streamed, the moment measures get a rotation null, or permutations of the rows when the accumulator kept
    # them all (layersim.similarity.inference.rotation_null), as it does for tables this small.
    allowed = {expected} | ({"rotation"} if streamed and measure in MOMENT_MEASURES else set())
    assert metrics["null"]["method"] in allowed and metrics["correction"] == "fdr_bh"
    # Exact p-values can be far below the 6 decimals of the plot rows (then 0); a sampled null's are multiples
    # of 1/(permutations + 1), the smallest 1/21.
    smallest = 0.0 if expected == "exact" else 1 / 21 - 1e-6
    # Self-comparisons (a layer against itself) are not tested: their p_adjusted is empty, every other cell's
    # is at least its own p-value.
    assert rows and all(smallest <= row["p_value"] <= 1 for row in rows)
    tested = [row for row in rows if row["p_adjusted"] is not None]
    assert tested and all(row["p_value"] <= row["p_adjusted"] <= 1 for row in tested)
    untested = {(row["comparison"], row["x_layer"], row["y_layer"]) for row in rows if row["p_adjusted"] is None}
    assert untested and all(x == y and comparison in ("ORIG–ORIG", "FT–FT") for comparison, x, y in untested)
    if expected != "exact":
        assert {round(row["p_value"] * 21, 4) % 1 for row in rows} == {0.0}
        assert any("a lone cell needs" in w for w in warnings)  # BH over 9 cells with 20 permutations: said
    # The FT–ORIG diagonal keeps ORIG's first layers: far from its independent last layer's p-value.
    p = metrics["ft_orig"]["p_value"]
    assert p["layer_00"] < 0.1 and p["layer_00"] < p["layer_02"]
    if streamed:
        assert "ci_low" not in metrics["ft_orig"] and "no bootstrap intervals" in out.metrics["cls"]["null"]
    elif AUTO_INTERVAL[measure] is None:  # no interval method covered for it (benchmarks/bootstrap.py): said why
        assert "ci_low" not in metrics["ft_orig"] and "no bootstrap interval" in metrics["no_interval"]
    else:
        for key in ("ft_orig", "ft1_ft2"):
            lows, highs = metrics[key]["ci_low"].values(), metrics[key]["ci_high"].values()
            assert all(np.isfinite(a) and np.isfinite(b) and a <= b for a, b in zip(lows, highs))
            assert metrics[key]["ci_method"] == AUTO_INTERVAL[measure]
    plt.close("all")


def test_rbf_cka_above_its_exact_rows_says_why_it_has_no_null(extracted):
    out = task_similarity(extracted / "activations", extracted / "checkpoints", TASK,
                          _params("rbf_cka", rbf_exact_max_rows=20, rbf_landmarks=10))
    metrics = out.metrics["cls"]["rbf_cka"]
    _check_values("rbf_cka", metrics["ft_orig"])
    assert "null" not in metrics and "ci_low" not in metrics["ft_orig"]
    assert metrics["no_null"].startswith("RBF CKA on 40 rows is Nyström-approximated (above "
                                         "similarity.rbf_exact_max_rows = 20)")
    plt.close("all")


@pytest.mark.parametrize("measure", MEASURES)
def test_the_compare_stage(measure):
    """compare_representations, the compare stage's work on the encoded probe: ORIG, a fine-tuned model and
    another encoder of a different width, every cell of one stacked heatmap with its null."""
    rng = np.random.default_rng(1)
    runs = _layers(rng)
    other = [rng.normal(size=(ROWS, 6)).astype(np.float32) for _ in range(2)]
    representations = {"ORIG": Pooled({"cls": runs["orig"]}), f"FT:{TASK}": Pooled({"cls": runs["seed1"]}),
                       "other": Pooled({"cls": other})}
    out = compare_representations(representations, _params(measure))
    summary = out.metrics["cls"][measure]
    _check_values(measure, summary[f"FT:{TASK}"])
    assert set(summary["other"]["best_match"]) == {"layer_00", "layer_01"}  # other depth: best matches
    rows = out.rows["plots", "matrices.json"]
    assert len(rows) == 8 * 8  # every cell defined
    assert all(row["similarity"] == pytest.approx(1.0, abs=1e-6) for row in rows
               if row["comparison"] == "ORIG vs ORIG" and row["x_layer"] == row["y_layer"])
    if MEASURES[measure].no_null:  # a difference of summaries: said so, no p-values
        assert summary["no_null"] == MEASURES[measure].no_null and not any("p_value" in row for row in rows)
        plt.close("all")
        return
    smallest = 0.0 if measure == "linear_cka" else 1 / 21 - 1e-6  # exact p-values can round to 0 (6 decimals)
    # Only cells between two models are tested (a model's own block is not in the family): their p_adjusted is
    # at least their p-value; the within-model cells keep their p-value and have none.
    assert all(smallest <= row["p_value"] <= 1 and row["correction"] == "fdr_bh" for row in rows)
    within = [row for row in rows if row["comparison"].split(" vs ")[0] == row["comparison"].split(" vs ")[-1]]
    between = [row for row in rows if row not in within]
    assert within and all(row["p_adjusted"] is None for row in within)
    assert between and all(row["p_value"] <= row["p_adjusted"] <= 1 for row in between)
    assert summary["correction"] == "fdr_bh"
    plt.close("all")


def test_no_measure_option_collides_with_the_drivers_keywords():
    """The null and bootstrap drivers pass a measure's options (**options) beside their own keywords (seed,
    permutations, ...): an option of the same name could never reach them (RBF CKA's Nyström seed was `seed`)."""
    own = {name for driver in (permutation_matrix, permutation_test, bootstrap_pairs)
           for name, parameter in inspect.signature(driver).parameters.items()
           if parameter.kind is not inspect.Parameter.VAR_KEYWORD}
    for name, measure in MEASURES.items():
        assert not own & set(measure.options), (name, own & set(measure.options))
