"""Too few permutations for similarity.significance (and the correction over a heatmap's cells): refused by params
validation when no cell could ever be above chance, refused or warned by the stage before any permutation when
the correction over the cells makes it impossible or needs many cells at the smallest p-value."""

from __future__ import annotations

import pytest

from dvc_project import repository_params, tiny_params
from layersim.errors import LayersimError
from layersim.params import parse_params
from layersim.similarity.results import Uncertainty


def _doc(permutations: int, significance: float, measures: dict) -> dict:
    doc = tiny_params(repository_params())
    doc["similarity"].update(permutations=permutations, significance=significance, measures=measures)
    return doc


def test_a_smallest_p_value_at_the_level_is_refused_with_the_minimum() -> None:
    # 1/(18 + 1) = 0.0526 ≥ 0.05; 1/(19 + 1) = 0.05 is not below it either; 1/21 < 0.05
    with pytest.raises(LayersimError) as raised:
        parse_params(_doc(19, 0.05, {"cls": ["linear_cka", "svcca"]}))
    assert str(raised.value) == (
        "params.yaml: similarity.permutations = 19 cannot reach similarity.significance = 0.05: the smallest p-value "
        "of 19 permutations is 1/20, so no cell of svcca could ever be above chance; use at least 20 permutations.")
    assert parse_params(_doc(20, 0.05, {"cls": ["linear_cka", "svcca"]})).similarity.permutations == 20
    assert parse_params(_doc(5, 0.05, {"cls": ["linear_cka"]})).similarity.permutations == 5  # exact null


def test_a_level_beyond_the_largest_permutation_count_is_refused() -> None:
    with pytest.raises(LayersimError, match=r"similarity.significance = 1e-05 is out of reach of svcca: it needs at "
                                            r"least 100000 permutations, more than the 10,000"):
        parse_params(_doc(10_000, 1e-5, {"cls": ["svcca"]}))


def test_the_correction_over_the_cells_is_checked_before_any_permutation() -> None:
    # holm's first step needs 1/(B + 1) < 0.05 / 64: B ≥ 1280 for a lone cell of a 64-cell heatmap
    holm = Uncertainty(1000, 0, 0, 0.05, False, "holm")
    with pytest.raises(LayersimError, match=r"similarity.correction = holm over the 64 cells of a heatmap needs "
                                            r"similarity.permutations ≥ \d+ .* but it is 1000; raise it, or use fdr_bh"):
        holm.check_reach(64, ["svcca"], "similarity (cls)")
    bh = Uncertainty(100, 0, 0, 0.05, False, "fdr_bh")  # BH: cells together at p = 1/101 can pass
    warning = bh.check_reach(64, ["svcca"], "similarity (cls)")
    assert warning.startswith("similarity (cls): with fdr_bh over the 64 cells of a heatmap and 100 permutations, a "
                              "cell of svcca is above chance only together with at least")
    assert Uncertainty(10_000, 0, 0, 0.05, False, "holm").check_reach(64, ["svcca"], "x") is None
    assert holm.check_reach(64, [], "x") is None  # linear CKA alone: exact p-values
