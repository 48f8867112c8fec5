"""Multiple-comparison correction of the heatmaps' chance hatching (layersim.similarity.inference.correction): BH and
Holm against values worked out by hand, NaN cells left out of the family, what a sampled null's smallest
p-value lets each declare, and the hatching, plot rows, metrics and headline that use it."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.patches import Rectangle

from layersim.errors import LayersimError
from layersim.reporting.headlines import similarity_headline
from layersim.params.schema import SimilarityParams
from layersim.similarity import NullMatrix
from layersim.similarity.inference.correction import (CORRECTIONS, adjusted_p_values, at_chance, between_model_cells,
                                            cells_needed, declares, family_size, permutations_needed,
                                            self_comparison_cells)
from layersim.experiments.similarity import phang_report
from layersim.similarity.results import Uncertainty, correct_claims

NAN = math.nan
# One heatmap's p-values (FT layer × ORIG layer); NaN: cells without a test (e.g. an undefined layer).
P = np.array([[0.001, 0.015, NAN],
              [0.04, 0.045, NAN],
              [NAN, NAN, 0.5]])
# By hand, m = 5 tests. BH: sorted p · m / rank = .005, .0375, .0667, .05625, .5, then the running minimum
# from the largest down: .005, .0375, .05625, .05625, .5.
BH = np.array([[0.005, 0.0375, NAN],
               [0.05625, 0.05625, NAN],
               [NAN, NAN, 0.5]])
# Holm: sorted p · (m − rank + 1) = .005, .06, .12, .09, .5, then the running maximum: .005, .06, .12, .12, .5.
HOLM = np.array([[0.005, 0.06, NAN],
                 [0.12, 0.12, NAN],
                 [NAN, NAN, 0.5]])


def test_adjusted_p_values_equal_the_hand_computed_ones():
    np.testing.assert_allclose(adjusted_p_values(P, "fdr_bh"), BH, rtol=1e-12)
    np.testing.assert_allclose(adjusted_p_values(P, "holm"), HOLM, rtol=1e-12)
    np.testing.assert_array_equal(adjusted_p_values(P, "none"), P)
    # At α = 0.05: uncorrected hatches one cell, BH three, Holm four; NaN cells never.
    assert at_chance(P, "none", 0.05).sum() == 1
    np.testing.assert_array_equal(at_chance(P, "fdr_bh", 0.05), [[0, 0, 0], [1, 1, 0], [0, 0, 1]])
    np.testing.assert_array_equal(at_chance(P, "holm", 0.05), [[0, 1, 0], [1, 1, 0], [0, 0, 1]])


@pytest.mark.parametrize("method", CORRECTIONS)
def test_adjusted_p_values_properties(method):
    rng = np.random.default_rng(3)
    p = rng.uniform(size=(6, 7)) ** 3
    p[2, 3] = NAN
    q = adjusted_p_values(p, method)
    finite = np.isfinite(p)
    assert np.isnan(q[~finite]).all() and (q[finite] >= p[finite]).all() and (q[finite] <= 1).all()
    order = np.argsort(p[finite])
    assert (np.diff(q[finite][order]) >= 0).all()  # the order of the p-values is kept
    # NaN cells are not tests: the same finite p-values alone give the same adjusted values.
    np.testing.assert_allclose(adjusted_p_values(p[finite], method), q[finite])
    assert adjusted_p_values(np.full((2, 2), NAN), method).shape == (2, 2)


def test_the_schema_offers_every_correction():
    assert SimilarityParams().correction == "fdr_bh"
    import dataclasses
    field = next(f for f in dataclasses.fields(SimilarityParams) if f.name == "correction")
    assert field.metadata["names"] == CORRECTIONS


def test_unknown_correction_is_refused():
    with pytest.raises(LayersimError, match="unknown correction 'bonferroni'; valid corrections are: fdr_bh, holm"):
        adjusted_p_values(P, "bonferroni")


def test_what_a_sampled_null_lets_each_correction_declare():
    # The smallest p of B draws is 1/(B + 1): uncorrected, it must be below α (B ≥ 20 at α = 0.05).
    assert permutations_needed("none", 0.05, 169) == 20 and not declares("none", 0.05, 19, 169)
    # Holm's first step: 1/(B + 1) < α/m, so 169/(B + 1) < 0.05, B + 1 > 3380.
    assert permutations_needed("holm", 0.05, 169) == permutations_needed("holm", 0.05, 169, 169) == 3380
    # BH: a lone cell as Holm; all m cells at the floor as uncorrected; k cells when m/(k(B + 1)) < α.
    assert permutations_needed("fdr_bh", 0.05, 169) == 3380 and permutations_needed("fdr_bh", 0.05, 169, 169) == 20
    assert cells_needed("fdr_bh", 0.05, 100, 169) == 34  # 169/(34·101) = 0.0492 < 0.05 ≤ 169/(33·101)
    assert cells_needed("holm", 0.05, 100, 169) is None and cells_needed("none", 0.05, 100, 169) == 1
    for method in CORRECTIONS:
        needed = permutations_needed(method, 0.05, 25)
        assert declares(method, 0.05, needed, 25) and not declares(method, 0.05, needed - 1, 25)


def test_the_stage_check_refuses_holm_that_cannot_declare_and_warns_for_bh():
    with pytest.raises(LayersimError, match=r"similarity.correction = holm over the 169 cells .* needs "
                                            r"similarity.permutations ≥ 3380 .* but it is 100; raise it"):
        Uncertainty(permutations=100, correction="holm").check_reach(169, ["svcca"], "similarity (cls)")
    warning = Uncertainty(permutations=100).check_reach(169, ["svcca"], "similarity (cls)")
    assert "at least 33 others at the smallest p-value 1/101" in warning and "needs 3380 permutations" in warning
    assert Uncertainty(permutations=100, correction="holm").check_reach(169, [], "x") is None  # exact nulls only
    assert Uncertainty(permutations=5000, correction="holm").check_reach(169, ["svcca"], "x") is None


def _report(correction: str):
    """A two-model Phang report whose FT–ORIG null has the p-values P (a stand-in null, as the streamed route
    hands over), the other panels none."""
    sizes = {"ORIG": 3, "FT[1]": 3}
    rng = np.random.default_rng(0)
    matrix = rng.uniform(0.2, 0.8, size=(6, 6))
    np.fill_diagonal(matrix, 1.0)
    p_value = np.full((6, 6), NAN)
    p_value[3:, :3] = P

    def null(measure, cells, permutations, seed):
        return NullMatrix(matrix, np.full((6, 6), 0.1), np.full((6, 6), 0.2), p_value, permutations, "permutation")

    return phang_report(sizes, lambda measure: matrix, ["svcca"], "test", streamed_null=null,
                        uncertainty=Uncertainty(permutations=999, correction=correction))


@pytest.mark.parametrize("correction, expected, hatched", [("fdr_bh", BH, {(1, 0), (1, 1), (2, 2)}),
                                                           ("holm", HOLM, {(0, 1), (1, 0), (1, 1), (2, 2)}),
                                                           ("none", P, {(2, 2)})])
def test_hatching_plot_rows_metrics_and_headline_follow_the_correction(correction, expected, hatched):
    report = _report(correction)
    ft_orig = next(ax for ax in report.figure.axes if ax.get_title() == "FT–ORIG")
    drawn = {(round(r.get_y() + 0.5), round(r.get_x() + 0.5)) for r in ft_orig.patches
             if isinstance(r, Rectangle) and r.get_hatch()}
    assert drawn == hatched
    name = {"fdr_bh": "Benjamini–Hochberg q", "holm": "Holm-adjusted p", "none": "uncorrected"}[correction]
    assert any(name in text.get_text() for text in report.figure.texts)  # the note names the correction
    rows = [r for r in report.rows if r["comparison"] == "FT–ORIG" and r["p_value"] is not None]
    assert len(rows) == 5 and all(r["correction"] == correction for r in rows)
    for r in rows:
        assert r["p_value"] == pytest.approx(P[r["y_layer"], r["x_layer"]])
        assert r["p_adjusted"] == pytest.approx(expected[r["y_layer"], r["x_layer"]], abs=1e-6)
    metrics = report.metrics["svcca"]
    assert metrics["correction"] == correction
    assert metrics["ft_orig"]["p_adjusted"] == pytest.approx(
        {f"layer_0{k}": expected[k, k] for k in range(3)}, abs=1e-6)
    full = {"cls": report.metrics}
    assert correct_claims(full, correction) == 3  # as the similarity stage does: the claims as one family
    headline = similarity_headline(full, 0.05)["cls"]["svcca"]
    # The first FT–ORIG diagonal layer at chance: layer 1 once corrected (q = .05625, .12), layer 2 uncorrected.
    assert headline["ft_orig_chance_from"] == (2 if correction == "none" else 1)
    assert headline["ft_orig_chance_correction"] == correction
    plt.close("all")


def test_params_refuse_permutations_that_no_cell_can_pass():
    from layersim.params import parse_params

    def parsed(permutations, measures):
        return parse_params({"model": "tiny-bert", "tasks": ["synth-negation"], "seeds": [1],
                             "finetune": {"max_length": 32},
                             "similarity": {"measures": {"cls": measures}, "permutations": permutations}})

    with pytest.raises(LayersimError) as info:
        parsed(10, ["linear_cka", "svcca"])
    assert str(info.value) == ("params.yaml: similarity.permutations = 10 cannot reach similarity.significance = 0.05: "
                               "the smallest p-value of 10 permutations is 1/11, so no cell of svcca could ever be "
                               "above chance; use at least 20 permutations.")
    assert parsed(20, ["svcca"]).similarity.permutations == 20  # 1/21 < 0.05
    assert parsed(10, ["linear_cka"]).similarity.permutations == 10  # its exact null needs no permutations
    assert permutations_needed("none", 0.05, 1) == 20  # the library's bound agrees


def test_trivial_cells_are_left_out_of_the_family():
    # The review's case: 150 trivially related cells at p = 1e-9, one cell at 0.04, 18 at 0.5.
    p = np.array([1e-9] * 150 + [0.04] + [0.5] * 18)
    trivial = np.arange(p.size) < 150
    # All 169 as one family: 0.04 · 169/151 = 0.0448 (the 0.5 cells' q is 0.5 · 169/169 and above).
    assert adjusted_p_values(p, "fdr_bh")[150] == pytest.approx(0.04 * 169 / 151)
    # Among the 19 tested cells: 0.04 · 19/1 = 0.76, then the running minimum takes the 0.5 cells' 0.5 · 19/19.
    q = adjusted_p_values(p, "fdr_bh", tested=~trivial)
    assert q[150] == pytest.approx(0.5) and np.isnan(q[trivial]).all()
    assert not at_chance(p, "fdr_bh", 0.05, tested=~trivial)[trivial].any()  # not tested: never hatched
    assert at_chance(p, "fdr_bh", 0.05, tested=~trivial)[150]


def test_a_symmetric_pair_is_one_test_and_the_diagonal_none():
    # A self-comparison of 3 layers: the diagonal is a layer with itself; [i, j] and [j, i] are one test.
    p = np.array([[1e-12, 0.01, 0.02],
                  [0.011, 1e-12, 0.03],
                  [0.021, 0.031, 1e-12]])
    tested = self_comparison_cells(3)
    # A pair's p is the larger of its two cells': .011, .021, .031. Holm over the m = 3 pairs: .011·3, .021·2,
    # .031·1 = .033, .042, .031; running max .033, .042, .042.
    expected = np.array([[NAN, 0.033, 0.042], [0.033, NAN, 0.042], [0.042, 0.042, NAN]])
    np.testing.assert_allclose(adjusted_p_values(p, "holm", tested, symmetric=True), expected, rtol=1e-12)
    # Asymmetric: the six off-diagonal cells are six tests (the smallest, .01, is multiplied by 6).
    assert adjusted_p_values(p, "holm", tested)[0, 1] == pytest.approx(0.06)
    assert (adjusted_p_values(p, "fdr_bh", tested, symmetric=True)[tested] >= p[tested]).all()
    assert family_size(tested, symmetric=True) == 3 and family_size(tested) == 6
    with pytest.raises(LayersimError, match="tested has shape"):
        adjusted_p_values(p, "holm", tested[:2])


def test_between_model_cells_leave_each_models_own_block_out():
    cells = between_model_cells([2, 3])
    assert not cells[:2, :2].any() and not cells[2:, 2:].any() and cells[:2, 2:].all() and cells[2:, :2].all()


def test_the_heatmaps_families_in_the_phang_and_stacked_results():
    from layersim.similarity.results import phang_result
    from layersim.similarity.stacked_results import stacked_result

    rng = np.random.default_rng(5)
    base = rng.normal(size=(40, 6))
    models = {label: [base @ rng.normal(size=(6, 6)) + noise * rng.normal(size=(40, 6)) for noise in (0.5, 3.0)]
              for label in ("ORIG", "FT[1]")}
    uncertainty = Uncertainty(permutations=20, bootstrap=0, correction="holm")  # linear CKA: exact moments
    stacked = stacked_result(models, "linear_cka", uncertainty=uncertainty)
    p, q = stacked.null.p_value, stacked.p_adjusted
    # Within one model: not tested (NaN, never hatched); between them, the 2 × 2 pairs once, as their own family.
    assert np.isnan(q[:2, :2]).all() and np.isnan(q[2:, 2:]).all() and not stacked.at_chance[:2, :2].any()
    np.testing.assert_allclose(q[:2, 2:], adjusted_p_values(np.fmax(p[:2, 2:], p[2:, :2].T), "holm"), rtol=1e-12)
    np.testing.assert_allclose(q[2:, :2], q[:2, 2:].T, rtol=1e-12)  # linear CKA is symmetric: a pair once
    result = phang_result("linear_cka", stacked.matrix, {"ORIG": 2, "FT[1]": 2}, models=models,
                          uncertainty=uncertainty)
    by_key = {c.key: c for c in result.comparisons}
    for key in ("orig_orig", "ft_ft"):  # a layer against itself is no test; the two off-diagonal cells are one
        c = by_key[key]
        pair = max(c.p_value[0, 1], c.p_value[1, 0])
        assert np.isnan(np.diag(c.p_adjusted)).all() and c.p_adjusted[0, 1] == c.p_adjusted[1, 0] == pair
    ft_orig = by_key["ft_orig"]  # FT layer k against ORIG layer k is a question: every cell is tested
    np.testing.assert_allclose(ft_orig.p_adjusted, adjusted_p_values(ft_orig.p_value, "holm"), rtol=1e-12)


def _details(p_values_by_measure, correction="fdr_bh"):
    return {"cls": {measure: {"correction": correction,
                              "ft_orig": {"last_layer": 0.5,
                                          "p_value": {f"layer_{k:02d}": p for k, p in enumerate(ps)}},
                              "ft_random": {"last_layer": 0.1, "p_value": {"layer_00": 0.9, "layer_01": 0.3}}}
                    for measure, ps in p_values_by_measure.items()}}


def test_the_headline_claims_are_one_family_across_measures_and_poolings():
    full = _details({"linear_cka": [0.001, 0.02], "svcca": [0.004, 0.03]})
    full["tokens"] = _details({"linear_cka": [0.01, 0.5]}, "fdr_bh")["cls"]
    assert correct_claims(full, "fdr_bh") == 9  # as the similarity stage does, before the headline reads it
    headline = similarity_headline(full, 0.05)
    # The family: the FT–ORIG diagonals (6 cells) and FT–RANDOM's top layer (3 cells), m = 9. BH by hand on
    # .001 .004 .01 .02 .03 .3 .3 .3 .5: p·9/rank = .009 .018 .03 .045 .054 .45 .3857 .3375 .5, running minimum
    # from the top: .009 .018 .03 .045 .054 .3375 .3375 .3375 .5.
    assert headline["family"] == {"correction": "fdr_bh", "tests": 9}
    assert headline["cls"]["linear_cka"]["ft_orig_top_p_adjusted"] == pytest.approx(0.045)
    assert headline["cls"]["svcca"]["ft_orig_top_p_adjusted"] == pytest.approx(0.054)
    assert headline["tokens"]["linear_cka"]["ft_orig_top_p_adjusted"] == pytest.approx(0.5)
    assert headline["cls"]["svcca"]["ft_random_top_p_adjusted"] == pytest.approx(0.3375)
    # svcca's layer 1 (p = .03, below 0.05 alone) is at chance in the headline family (q = .054).
    assert headline["cls"]["svcca"]["ft_orig_chance_from"] == 1
    assert headline["cls"]["linear_cka"]["ft_orig_chance_from"] is None
    assert headline["cls"]["svcca"]["ft_orig_chance_correction"] == "fdr_bh"
    # The heatmap's own p-values are untouched; without the family (details of an older stage) the raw ones.
    assert "p_family" not in _details({"svcca": [0.1]})["cls"]["svcca"]["ft_orig"]
    assert similarity_headline(_details({"svcca": [0.01, 0.06]}), 0.05)["cls"]["svcca"]["ft_orig_chance_from"] == 1
