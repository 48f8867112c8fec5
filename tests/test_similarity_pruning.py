"""The similarity stage's layer-pruning outputs: each run's Block Influence per layer (ShortGPT) and angular
distance between layers l and l + n (Gromov et al.), computed by layersim.similarity.pruning from the tables the
stage reads, as plot rows and one figure (tables of tests/test_every_measure.py: ORIG and two seeds, 2 layers)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest

from layersim.data.io import ActivationTable
from layersim.experiments.similarity import pruning_pooling, task_similarity
from layersim.reporting.pruning_plots import angular_grid
from layersim.similarity.pruning import pruning_measures

from test_every_measure import _params, extracted
from test_integrity import TASK

__all__ = ["extracted"]  # the tables fixture, shared with tests/test_every_measure.py

RUNS = {"orig": "ORIG", "seed1": "FT[1]", "seed2": "FT[2]"}


def test_each_run_gets_the_library_measures_of_its_table(extracted):
    out = task_similarity(extracted / "activations", extracted / "checkpoints", TASK, _params("linear_cka"))
    influence, angular = out.rows["pruning", "block_influence.json"], out.rows["pruning", "angular_distance.json"]
    assert {row["pooling"] for row in influence + angular} == {"cls"}  # the only pooling the stage reads here
    assert [row["model"] for row in influence][::2] == list(RUNS.values())
    for run, label in RUNS.items():
        expected = pruning_measures(ActivationTable(extracted / "activations" / f"{run}.cls.parquet").layers())
        mine = [row for row in influence if row["model"] == label]
        assert [row["layer"] for row in mine] == [1, 2]
        np.testing.assert_allclose([row["block_influence"] for row in mine], expected.block_influence(), atol=5e-7)
        cells = {(row["layer"], row["length"]): row["angular_distance"] for row in angular if row["model"] == label}
        assert set(cells) == {(0, 1), (1, 1), (0, 2)}  # start layer l, span length n, l + n ≤ 2
        for (start, length), value in cells.items():
            assert value == pytest.approx(expected.angular_distance(length)[start], abs=5e-7)
    figure = out.figures["pruning", "pruning.png"]
    assert [ax.get_title() for ax in figure.axes[1:4]] == list(RUNS.values())  # a heatmap per run
    plt.close("all")


def test_left_out_when_not_asked_for(extracted):
    out = task_similarity(extracted / "activations", extracted / "checkpoints", TASK, _params("linear_cka"),
                          pruning=False)
    assert not [key for key in [*out.rows, *out.figures] if key[0] == "pruning"]
    plt.close("all")


def test_the_tables_read_are_tokens_then_mean_then_the_first_listed():
    assert pruning_pooling(["cls", "mean", "tokens"]) == "tokens"
    assert pruning_pooling(["cls", "mean"]) == "mean"
    assert pruning_pooling(["last", "cls"]) == "last"


def test_the_angular_grid_is_span_length_by_start_layer():
    # Layers 0, 1, 2 of one row turning by 90° then 45°: d(0, 1) = 1/2, d(1, 1) = 1/4, d(0, 2) = 3/4.
    layers = [np.array([[1.0, 0.0]]), np.array([[0.0, 1.0]]), np.array([[-1.0, 1.0]])]
    grid = angular_grid(pruning_measures(layers))
    np.testing.assert_allclose(grid, [[0.5, 0.25], [0.75, np.nan]], rtol=0, atol=1e-15)
