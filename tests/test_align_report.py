"""The align stage's report, apart from the stage: run labels, pairs, and the metrics of a small exact case."""

from __future__ import annotations

import numpy as np
import pytest

from layersim.align_report import AlignReport, compared_pairs, method_options, run_labels
from layersim.params import AlignParams


def test_runs_and_pairs_follow_the_seeds() -> None:
    assert run_labels([3, 7]) == {"ORIG": "orig", "FT[1]": "seed3", "FT[2]": "seed7"}
    assert compared_pairs([3, 7]) == [("FT[1]", "FT[2]"), ("ORIG", "FT[1]")]
    assert compared_pairs([3]) == [("ORIG", "FT[1]")]


def test_method_options_come_from_the_align_params() -> None:
    p = AlignParams(ridge=0.5, inn_depth=2, steps=9)
    options = method_options(p)
    assert options["linear"] == {"ridge": 0.5}
    assert options["inn"]["depth"] == 2 and options["inn"]["steps"] == 9 and options["mlp"]["steps"] == 9


def test_metrics_of_a_small_report() -> None:
    matrix = np.array([[0.1, 0.5], [0.7, 0.3]])
    report = AlignReport(rows=[], errors={"FT[1]→FT[2]": {"linear": [0.2, 0.4]}}, recovery={"linear": 0.9},
                         matrix_pair=("FT[1]", "FT[2]"), matrix=matrix, injection={"methods": {}}, num_train=30,
                         num_rows=40)
    metrics = report.metrics("mean")
    assert metrics["train_rows"] == 30 and metrics["validation_rows"] == 10
    assert metrics["alignment"] == {"FT[1]→FT[2]": {"linear": {"layer_00": 0.2, "layer_01": 0.4}}}
    assert metrics["alignment_mean"]["FT[1]→FT[2]"]["linear"] == pytest.approx(0.3)
    assert metrics["layer_matrix_inn"] == {"pair": "FT[1]→FT[2]", "diagonal_mean": 0.2, "offdiagonal_mean": 0.6}
