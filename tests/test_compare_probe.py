"""The compare stage on one corpus at a time (layersim.experiments.compare.probe_result): a probe of several tasks
has every layer's rows centred within their task and a null that permutes examples only within their task."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from layersim.experiments.compare import Probe, centred_within, compare_representations, probe_result, probe_rows
from layersim.experiments.extract import Pooled
from layersim.params import parse_params
from layersim.similarity.results import Uncertainty
from layersim.similarity.stacked_results import stacked_result

TASKS, PER_TASK, WIDTH = 12, 100, 64
UNCERTAINTY = Uncertainty(permutations=99, bootstrap=0)


def _grouped(rng, tasks=TASKS, per_task=PER_TASK, width=WIDTH, noise=0.5):
    """The review's case: x = a_g + noise·e, y = b_g + noise·f, a, b, e, f independent; g each row's task."""
    task = np.repeat(np.arange(tasks), per_task)
    x = rng.normal(size=(tasks, width))[task] + noise * rng.normal(size=(len(task), width))
    y = rng.normal(size=(tasks, width))[task] + noise * rng.normal(size=(len(task), width))
    return x, y, task


def _keys(task: np.ndarray, choices: int = 1) -> np.ndarray:
    """(task, example id) of per-example rows, `choices` rows per example; ids restart in every task."""
    example = np.concatenate([np.arange(np.sum(task == t)) // choices for t in np.unique(task)])
    return np.column_stack([task, example]).astype(np.int64)


def _params(**similarity):
    return parse_params({"model": "tiny-bert", "tasks": ["synth-negation"], "seeds": [1],
                         "finetune": {"max_length": 32},
                         "similarity": {"measures": {"cls": ["linear_cka"]}, "attention_measures": [],
                                        "permutations": 99, "bootstrap": 0, "random_control": None, **similarity}})


def test_two_unrelated_models_of_a_twelve_task_probe_are_at_chance():
    """The review's oracle through the compare stage's own function: two models that share only the tasks'
    grouping (layer 0) are at their null; a layer that shares the examples (layer 1) stays far above it."""
    rng = np.random.default_rng(0)
    x, y, task = _grouped(rng)
    related = x + 0.5 * rng.normal(size=x.shape)
    probes = {"ORIG": Probe({"cls": [x, x]}, example_keys=_keys(task)),
              "FT:task": Probe({"cls": [y, related]}, example_keys=_keys(task))}
    summary = compare_representations(probes, _params()).metrics["cls"]["linear_cka"]["FT:task"]
    value, null_mean = summary["diagonal"]["layer_00"], summary["null_mean"]["layer_00"]
    assert abs(value - null_mean) < 0.01 and null_mean < 0.1
    assert summary["p_value"]["layer_00"] >= UNCERTAINTY.significance
    assert summary["diagonal"]["layer_01"] > 0.5 and summary["p_value"]["layer_01"] <= 0.01
    # Mixed as before (no task per row), the grouping alone looks like a strong relation.
    mixed = compare_representations({label: Pooled(p.layers) for label, p in probes.items()}, _params())
    before = mixed.metrics["cls"]["linear_cka"]["FT:task"]
    assert before["diagonal"]["layer_00"] > 0.7 and before["p_value"]["layer_00"] < 1e-3
    plt.close("all")


def test_a_probe_of_one_task_is_compared_as_before():
    rng = np.random.default_rng(1)
    x, y, task = _grouped(rng, tasks=1, per_task=60, width=8)
    layers = {"ORIG": [x, y], "FT:task": [y + rng.normal(size=y.shape), x]}
    new = compare_representations({label: Probe({"cls": v}, example_keys=_keys(task)) for label, v in layers.items()},
                                  _params())
    old = compare_representations({label: Pooled({"cls": v}) for label, v in layers.items()}, _params())
    assert new.metrics == old.metrics
    assert new.rows["plots", "matrices.json"] == old.rows["plots", "matrices.json"]
    result = probe_result(layers, "neuronsim", uncertainty=UNCERTAINTY, strata=None, groups=None)
    before = stacked_result(layers, "neuronsim", uncertainty=UNCERTAINTY)
    np.testing.assert_array_equal(result.matrix, before.matrix)
    np.testing.assert_array_equal(result.null.p_value, before.null.p_value)
    plt.close("all")


def test_the_rows_of_the_probe_name_their_task_and_example():
    """Per-example rows: the task's index and the example (choices of one example together); word rows: the first
    two of their keys (task, example). One task: no strata; one row per example: no groups."""
    layers = [np.zeros((6, 2))]
    keys = np.array([[0, 0], [0, 0], [0, 1], [0, 1], [1, 0], [1, 0]])  # two tasks of 2 choices; ids repeat
    _, strata, groups = probe_rows({"ORIG": Probe({"cls": layers}, example_keys=keys)}, "cls")
    np.testing.assert_array_equal(strata, [0, 0, 0, 0, 1, 1])
    np.testing.assert_array_equal(groups, [0, 0, 1, 1, 2, 2])
    one_task = np.column_stack([np.zeros(4), np.arange(4)]).astype(np.int64)
    _, strata, groups = probe_rows({"ORIG": Probe({"cls": [np.zeros((4, 2))]}, example_keys=one_task)}, "cls")
    assert strata is None and groups is None
    words = np.array([[0, 5, 0, 0, 0], [0, 5, 0, 0, 1], [1, 5, 0, 0, 0], [1, 7, 0, 1, 0]])
    other = words[[3, 1, 0]]  # another tokenizer: a word fewer, another order
    rows = np.arange(4.0)[:, None] * [1.0, 2.0]
    models, strata, groups = probe_rows({"ORIG": Probe({"tokens": [rows]}, words),
                                         "B": Probe({"tokens": [rows[[3, 1, 0]]]}, other)}, "tokens")
    np.testing.assert_array_equal(models["ORIG"][0], rows[[0, 1, 3]])  # lined up on the keys both hold
    np.testing.assert_array_equal(models["B"][0], rows[[0, 1, 3]])
    np.testing.assert_array_equal(strata, [0, 0, 1])
    np.testing.assert_array_equal(groups, [0, 0, 1])


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), tasks=st.integers(2, 5), per_task=st.integers(3, 9))
def test_centring_within_task(seed, tasks, per_task):
    """Every task's rows sum to zero in each feature; a shift of one task's rows changes nothing; the centred
    linear CKA is the CKA of the pooled within-task cross-covariance (hand-derived)."""
    rng = np.random.default_rng(seed)
    x, y, task = _grouped(rng, tasks=tasks, per_task=per_task, width=3, noise=1.0)
    [xc], [yc] = centred_within([x], task), centred_within([y], task)
    for t in range(tasks):
        np.testing.assert_allclose(xc[task == t].sum(axis=0), 0.0, atol=1e-9)
    shifted = x + rng.normal(size=(tasks, 3))[task] * 100
    np.testing.assert_allclose(centred_within([shifted], task)[0], xc, atol=1e-9)
    cross = sum(xc[task == t].T @ yc[task == t] for t in range(tasks))
    own_x = sum(xc[task == t].T @ xc[task == t] for t in range(tasks))
    own_y = sum(yc[task == t].T @ yc[task == t] for t in range(tasks))
    pooled = np.sum(cross**2) / np.sqrt(np.sum(own_x**2) * np.sum(own_y**2))
    result = probe_result({"x": [x], "y": [y]}, "linear_cka", strata=task)
    assert result.matrix[0, 1] == pytest.approx(pooled, rel=1e-9)
    moved = probe_result({"x": [shifted], "y": [y + rng.normal(size=(tasks, 3))[task]]}, "linear_cka", strata=task)
    assert moved.matrix[0, 1] == pytest.approx(pooled, rel=1e-9)
    # The order of the rows does not matter, so long as both models keep it.
    order = rng.permutation(len(task))
    again = probe_result({"x": [x[order]], "y": [y[order]]}, "linear_cka", strata=task[order])
    assert again.matrix[0, 1] == pytest.approx(pooled, rel=1e-9)


def test_a_layer_constant_within_every_task_stays_undefined():
    """A layer that differs between tasks only (no within-task information) is undefined after centring, not
    rounding residue of its task means."""
    task = np.repeat(np.arange(3), 5)
    layer = (np.array([[0.1, 0.7], [0.3, 0.2], [1e3, 0.1]])[task]).astype(np.float32)
    [centred] = centred_within([layer], task)
    assert centred.dtype == np.float32 and not centred.any()
    x = np.random.default_rng(0).normal(size=(15, 2))
    result = probe_result({"a": [layer, x], "b": [x]}, "linear_cka", strata=task)
    assert np.isnan(result.matrix[0]).all() and np.isfinite(result.matrix[1:, 1:]).all()


def test_the_figure_says_how_the_tasks_are_kept_apart():
    rng = np.random.default_rng(2)
    x, y, task = _grouped(rng, tasks=3, per_task=20, width=4)
    probes = {"ORIG": Probe({"cls": [x]}, example_keys=_keys(task)), "FT:task": Probe({"cls": [y]},
                                                                                      example_keys=_keys(task))}
    figure = compare_representations(probes, _params()).figures["plots", "cls.linear_cka.png"]
    title = figure.axes[0].get_title()
    assert "3 tasks" in title and "centred within each task" in title and "within their task" in title
    plt.close("all")


def test_the_attention_probe_names_each_maps_cluster(tiny_model_dir, tmp_path, one_torch_thread):
    """compare's attention probe returns, beside each layer's maps, the cluster of every map (the task table's
    cluster_id, in the maps' order): the attention null's blocks."""
    import pyarrow as pa

    from layersim.compute.device import resolve_device
    from layersim.data import io
    from layersim.data.io import read_task_table
    from layersim.data.tasks import generated_table, get_task
    from layersim.experiments.compare import probe_attention

    spec = get_task("synth-negation")
    table = generated_table(spec, "validation", 12, seed=0)
    shared = pa.array(np.arange(12) // 3 + 100, pa.int64())  # four texts, three examples each
    io.write_parquet(table.set_column(table.column_names.index("cluster_id"), "cluster_id", shared),
                     tmp_path / "validation.parquet")
    params = parse_params({"model": "tiny-bert", "tasks": ["synth-negation"], "seeds": [1],
                           "finetune": {"max_length": 32}, "compare": {"probe_examples": 10},
                           "extract": {"attention_examples": 10}})
    maps, clusters = probe_attention(tiny_model_dir("tiny-bert"), params, {"synth-negation": tmp_path},
                                     resolve_device("cpu"), tmp_path)
    probed = read_task_table(tmp_path, spec, "validation", 10)
    assert len(maps) == 3 and len(maps[0].example_row_starts()) == 10  # tiny-bert: 3 layers
    np.testing.assert_array_equal(clusters, probed.column("cluster_id").to_numpy())
    assert len(np.unique(clusters)) < 10


def test_the_compare_stage_tests_its_attention_heatmap(tiny_model_dir, tmp_path, one_torch_thread):
    """compare_models end to end on tiny-bert as ORIG, its random-init control and a fine-tuned copy (here the same
    weights): the attention heatmap's rows carry every between-model cell's p-value, the layer-k-against-ORIG cells
    their intervals, and the details what the null moved; FT's layer k, ORIG's own weights, is above chance."""
    import shutil

    from layersim.data import io
    from layersim.data.layout import finetuned, task_tables
    from layersim.data.tasks import generated_table, get_task
    from layersim.experiments.compare import compare_models

    spec = get_task("synth-negation")
    tables = task_tables(tmp_path / "tasks", spec.name)
    tables.mkdir(parents=True)
    io.write_parquet(generated_table(spec, "validation", 40, seed=0), tables / "validation.parquet")
    shutil.copytree(tiny_model_dir("tiny-bert"), finetuned(tmp_path / "checkpoints" / spec.name, 1))
    params = parse_params({"model": "tiny-bert", "tasks": [spec.name], "seeds": [1], "finetune": {"max_length": 32},
                           "compare": {"probe_examples": 40, "models": []}, "extract": {"attention_examples": 40},
                           "similarity": {"measures": {"cls": ["linear_cka"]}, "attention_measures": ["jensen_shannon"],
                                          "permutations": 19, "bootstrap": 20, "random_control": 0}})
    out = compare_models(tiny_model_dir("tiny-bert"), tmp_path / "checkpoints", tmp_path / "compared",
                         tmp_path / "tasks", params)
    attention = out.metrics["attention"]
    ft = attention["jensen_shannon"][f"FT:{spec.name}"]
    assert set(ft) == {"diagonal", "null_mean", "p_value", "ci_low", "ci_high"}
    assert all(p == pytest.approx(1 / 20) for p in ft["p_value"].values())  # the same weights: every draw below
    assert attention["null_unit"]["examples"] == 40 and attention["null_unit"]["movable"] > 0
    rows = [row for row in out.rows["plots", "matrices.json"] if row["pooling"] == "attention"]
    owners = [row["comparison"].split(" vs ") for row in rows]
    assert all((row["p_value"] is None) == (a == b) for row, (a, b) in zip(rows, owners))
    assert sum(row["ci_low"] is not None for row in rows) == 2 * 3  # RANDOM's and FT's layers against ORIG's
    assert out.figures["plots", "attention.jensen_shannon.png"].texts
    plt.close("all")
