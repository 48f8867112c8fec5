"""The compare stage's work (layersim.experiments.compare.compare_models) on two tiny architectures of different
widths and depths — tiny-gpt2 (hidden 32, 3 layers) and tiny-llama-h48-l2 (hidden 48, 2 layers) — each stacked
with a random-init control of its own architecture (Wu et al. Figures 1, 8 and 9), in one matrix."""

from __future__ import annotations

import json
import shutil

import matplotlib.pyplot as plt
import numpy as np
import pytest

from layersim.data.io import finetuned, task_tables, write_parquet
from layersim.data.tasks import generated_table, get_task
from layersim.experiments.compare import compare_models, compared_folders, random_init_label
from layersim.models.registry import MODELS, model_shape
from layersim.params import parse_params

TASK = "synth-negation"
BASE, OTHER = "tiny-gpt2", "tiny-llama-h48-l2"
# Stacking order and layers per model, embeddings included: gpt2 3 + 1, llama 2 + 1.
SIZES = {"ORIG": 4, "RANDOM": 4, f"FT:{TASK}": 4, OTHER: 3, random_init_label(OTHER): 3}


def _params(random_control: int | None = 0):
    return parse_params({"model": BASE, "tasks": [TASK], "seeds": [1], "finetune": {"max_length": 32},
                         "extract": {"poolings": ["last", "mean"], "batch_size": 8},
                         "compare": {"models": [OTHER], "probe_examples": 12}, "truncate": {"head": "fresh"},
                         "similarity": {"measures": {"mean": ["linear_cka"]}, "attention_measures": [],
                                        "permutations": 20, "bootstrap": 0, "random_control": random_control}})


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tiny_model_dir):
    """The stage's input folders, from the session's snapshots (tests/conftest.py); the pretrained model stands in
    for the fine-tuned one."""
    root = tmp_path_factory.mktemp("compare_architectures")
    shutil.copytree(tiny_model_dir(BASE), root / "pretrained")
    shutil.copytree(tiny_model_dir(BASE), finetuned(root / "checkpoints" / TASK, 1))
    shutil.copytree(tiny_model_dir(OTHER), root / "compared" / OTHER)
    task_tables(root / "tasks", TASK).mkdir(parents=True)
    write_parquet(generated_table(get_task(TASK), "validation", 12, 0), task_tables(root / "tasks", TASK) / "validation.parquet")
    return root


def _matrix(rows: list[dict]) -> np.ndarray:
    """The stacked matrix back from its plot rows (one per cell; "comparison" names the row and column model)."""
    starts = dict(zip(SIZES, np.cumsum([0, *SIZES.values()])))
    size = sum(SIZES.values())
    matrix = np.full((size, size), np.nan)
    for row in rows:
        y_model, x_model = row["comparison"].split(" vs ")
        matrix[starts[y_model] + row["y_layer"], starts[x_model] + row["x_layer"]] = row["similarity"]
    return matrix


def test_the_other_model_has_another_width_and_depth(folders):
    assert model_shape(folders / "compared" / OTHER) == {"num_layers": 2, "hidden_size": 48}
    assert model_shape(folders / "pretrained") == {"num_layers": 3, "hidden_size": 32}
    assert MODELS[OTHER].architecture == "llama"


def test_two_architectures_of_different_widths_stack_with_their_random_init_controls(folders):
    out = compare_models(folders / "pretrained", folders / "checkpoints", folders / "compared", folders / "tasks",
                         _params())
    rows = out.rows["plots", "matrices.json"]
    assert {row["pooling"] for row in rows} == {"mean"}
    matrix = _matrix(rows)
    assert matrix.shape == (18, 18) and np.isfinite(matrix).all()  # every cell of every block was written
    np.testing.assert_allclose(matrix, matrix.T, rtol=0, atol=1e-6)  # linear CKA is symmetric
    starts = dict(zip(SIZES, np.cumsum([0, *SIZES.values()])))
    for label, size in SIZES.items():  # each model against itself: 1 on the diagonal
        own = matrix[starts[label]:starts[label] + size, starts[label]:starts[label] + size]
        np.testing.assert_allclose(np.diag(own), 1.0, rtol=0, atol=1e-6)
    # The controls are other weights: no layer of a model is its control's same layer.
    for model, control in ((("ORIG", "RANDOM")), (OTHER, random_init_label(OTHER))):
        cross = matrix[starts[model]:starts[model] + SIZES[model], starts[control]:starts[control] + SIZES[control]]
        assert np.all(np.diag(cross) < 1 - 1e-3)
    # The summary against ORIG: the same depth by diagonal, another depth by each layer's best match.
    summary = out.metrics["mean"]["linear_cka"]
    assert [key for key in summary if key != "correction"] == [label for label in SIZES if label != "ORIG"]
    assert sorted(summary[OTHER]["best_match"]) == sorted(summary[random_init_label(OTHER)]["best_match"]) == [
        "layer_00", "layer_01", "layer_02"]
    assert sorted(summary["RANDOM"]["diagonal"]) == [f"layer_{k:02d}" for k in range(4)]
    # The figure names every block: each model, and each control as "<name> (random init)".
    figure = out.figures["plots", "mean.linear_cka.png"]
    axes = [axis for ax in figure.axes for axis in (ax, *ax.child_axes)]  # block names: on secondary axes
    labels = {tick.get_text() for ax in axes for tick in ax.get_xticklabels() + ax.get_yticklabels()}
    assert set(SIZES) <= labels
    assert f"{OTHER} and their random inits" in figure.axes[0].get_title()
    json.dumps(out.metrics)  # metrics stay plain JSON
    plt.close("all")


def test_without_a_control_seed_no_control_is_stacked(tmp_path):
    folders, controls = compared_folders(tmp_path / "p", tmp_path / "c", tmp_path / "m", _params(None))
    assert list(folders) == ["ORIG", f"FT:{TASK}", OTHER] and controls == {}
    folders, controls = compared_folders(tmp_path / "p", tmp_path / "c", tmp_path / "m", _params(3))
    assert list(folders) == list(SIZES)
    assert controls == {"RANDOM": tmp_path / "p", random_init_label(OTHER): tmp_path / "m" / OTHER}
