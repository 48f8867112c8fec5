"""The similarity stage's layer-pruning outputs: each run's Block Influence per layer (ShortGPT) and angular
distance between layers l and l + n (Gromov et al.), read from the records extract writes beside the tables
(layersim.experiments.pruning_states), as plot rows and one figure (tables of tests/test_every_measure.py: ORIG
and two seeds, 2 layers; here each row stands for a one-token sequence, so both measures average over it)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest

import torch

from layersim.data.io import ActivationTable, write_json
from layersim.experiments.pruning_states import ANGULAR_ROWS, BLOCK_INFLUENCE_ROWS, PruningStates
from layersim.experiments.similarity import run_metadata, task_similarity
from layersim.reporting.pruning_plots import angular_grid
from layersim.similarity.pruning import pruning_measures

from fake_tables import TASK, similarity_params as _params

RUNS = {"orig": "ORIG", "seed1": "FT[1]", "seed2": "FT[2]"}


def _write_records(extracted) -> None:
    """Each run's pruning record, as extract writes it, from its table's rows as one-token sequences."""
    known = run_metadata(extracted / "checkpoints", (1, 2))
    for run in RUNS:
        layers = ActivationTable(extracted / "activations" / f"{run}.cls.parquet").layers()
        states = PruningStates(len(layers) - 1, "first")
        states.update([torch.tensor(a)[:, None] for a in layers], torch.ones(len(layers[0]), 1),
                      torch.zeros(len(layers[0]), dtype=torch.long))
        write_json({"task": TASK, "split": "validation", "run": run, **known[run], **states.record()},
                   extracted / "activations" / f"{run}.pruning.json")


def test_each_run_gets_the_measures_extract_wrote(extracted):
    _write_records(extracted)
    out = task_similarity(extracted / "activations", extracted / "checkpoints", TASK, _params("linear_cka"),
                          pruning=True)
    influence, angular = out.rows["pruning", "block_influence.json"], out.rows["pruning", "angular_distance.json"]
    assert {row["rows"] for row in influence} == {BLOCK_INFLUENCE_ROWS}  # what each measure averages over
    assert {row["rows"] for row in angular} == {ANGULAR_ROWS["first"]}
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


def test_a_missing_record_is_named(extracted, tmp_path):
    import shutil

    from layersim.errors import LayersimError

    shutil.copytree(extracted / "activations", tmp_path / "activations", ignore=shutil.ignore_patterns("*.json"))
    with pytest.raises(LayersimError, match=r"orig.pruning.json does not exist; re-run the extract stage"):
        task_similarity(tmp_path / "activations", extracted / "checkpoints", TASK, _params("linear_cka"), pruning=True)
    plt.close("all")


def test_the_angular_grid_is_span_length_by_start_layer():
    # Layers 0, 1, 2 of one row turning by 90° then 45°: d(0, 1) = 1/2, d(1, 1) = 1/4, d(0, 2) = 3/4.
    layers = [np.array([[1.0, 0.0]]), np.array([[0.0, 1.0]]), np.array([[-1.0, 1.0]])]
    grid = angular_grid(pruning_measures(layers))
    np.testing.assert_allclose(grid, [[0.5, 0.25], [0.75, np.nan]], rtol=0, atol=1e-15)
