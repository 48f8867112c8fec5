"""Truncation and skipping (Phang et al. §4, §4.1): exact identities and small known cases."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from layersim.data.batching import encode_task
from layersim.models.encoders import all_spans, exit_at, num_layers, skip_span
from layersim.training.evaluate import predict
from layersim.training.heads import HeadParams, majority_baseline, train_head
from layersim.models.registry import load_task_model, load_tokenizer
from layersim.data.tasks import generated_table, get_task
from layersim.experiments.truncation import (exit_logits, fewest_layers_within, primary_score, span_logits, span_scores,
                                             span_summary, untuned_scores)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CPU = torch.device("cpu")




def _task_model(tiny_model_dir, arch: str, task: str, examples: int):
    """A tiny task model (its head seeded), its tokenizer and `examples` encoded validation examples."""
    spec = get_task(task)
    folder = tiny_model_dir(arch)
    torch.manual_seed(0)
    model = load_task_model(folder, spec).eval()
    tokenizer = load_tokenizer(folder)
    return spec, model, tokenizer, encode_task(generated_table(spec, "validation", examples, seed=0), spec, tokenizer, 32)


@pytest.mark.parametrize("arch,task", [("tiny-bert", "synth-negation"), ("tiny-roberta", "synth-choice"),
                                       ("tiny-albert", "synth-similarity"), ("tiny-electra", "synth-roles")])
def test_untuned_exit_at_last_layer_is_the_full_model(tiny_model_dir, arch, task):
    spec, model, tokenizer, encoded = _task_model(tiny_model_dir, arch, task, 24)
    full = predict(model, encoded, tokenizer, 8, CPU)
    with exit_at(model, num_layers(model)):
        exited = predict(model, encoded, tokenizer, 8, CPU)
    np.testing.assert_array_equal(full, exited)  # the same predictions, bit for bit
    scores = untuned_scores(model, spec, encoded, tokenizer, 8, CPU)
    assert len(scores) == num_layers(model) + 1
    assert scores[-1] == primary_score(spec, full, encoded.labels)


def test_span_scores_cover_every_span(tiny_model_dir):
    spec, model, tokenizer, encoded = _task_model(tiny_model_dir, "tiny-bert", "synth-negation", 16)
    full, scores = span_scores(model, spec, encoded, tokenizer, 8, CPU)
    assert full == primary_score(spec, predict(model, encoded, tokenizer, 8, CPU), encoded.labels)
    assert list(scores) == all_spans(3) and len(scores) == 6
    assert all(0.0 <= s <= 1.0 for s in scores.values())


@pytest.mark.parametrize("arch", ["tiny-gpt2", "tiny-deberta-v2", "tiny-bert"])
def test_every_exit_and_span_equals_running_the_model_so_truncated(tiny_model_dir, arch):
    """One pass per batch (a copied first-token head, or for decoders and DeBERTa the model itself per exit) gives
    what exit_at(k) and skip_span(i, j) give, for a head that reads the last token too."""
    spec, model, tokenizer, encoded = _task_model(tiny_model_dir, arch, "synth-negation", 12)
    exits = exit_logits(model, encoded, tokenizer, 4, CPU)
    full, spans = span_logits(model, encoded, tokenizer, 4, CPU)
    np.testing.assert_array_equal(exits[-1], full)
    for k in (0, 1, num_layers(model)):
        with exit_at(model, k):
            np.testing.assert_array_equal(exits[k], predict(model, encoded, tokenizer, 4, CPU))
    for i, j in ((1, 1), (2, num_layers(model)), (1, num_layers(model))):
        with skip_span(model, i, j):
            np.testing.assert_array_equal(spans[i, j], predict(model, encoded, tokenizer, 4, CPU))
    assert not np.allclose(exits[0], full)  # the exits differ: the test can tell them apart


def test_fresh_head_learns_a_separable_classification():
    spec = get_task("synth-negation")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((800, 4)).astype(np.float32)
    y = (x[:, 0] * x[:, 1] > 0).astype(np.int64)  # XOR-like: a linear head cannot, the tanh layer can
    head = train_head(spec, x[:600], y[:600], HeadParams(epochs=100, learning_rate=1e-2, dropout=0.0), seed=0)
    assert primary_score(spec, head.logits(x[600:]), y[600:]) > 0.85


def test_fresh_head_regression_and_multiple_choice():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((300, 8)).astype(np.float32)
    target = 2.0 * x[:, 0] - x[:, 3]
    reg = get_task("synth-similarity")
    head = train_head(reg, x[:200], target[:200], HeadParams(epochs=100, dropout=0.0), seed=0)
    assert head.logits(x[200:]).shape == (100, 1)
    assert primary_score(reg, head.logits(x[200:]), target[200:]) > 0.9
    mc = get_task("synth-choice")
    rows = rng.standard_normal((200 * 4, 8)).astype(np.float32)
    answer = rng.integers(0, 4, 200)
    rows[np.arange(200) * 4 + answer, 2] += 4.0  # the right choice stands out on feature 2
    head = train_head(mc, rows[:600], answer[:150], HeadParams(epochs=60, dropout=0.0), seed=0)
    logits = head.logits(rows[600:])
    assert logits.shape == (50, 4) and primary_score(mc, logits, answer[150:]) > 0.95


def test_fresh_heads_are_deterministic_under_a_seed():
    spec = get_task("synth-negation")
    x = np.random.default_rng(2).standard_normal((64, 8)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    a = train_head(spec, x, y, HeadParams(epochs=3), seed=5).logits(x)
    b = train_head(spec, x, y, HeadParams(epochs=3), seed=5).logits(x)
    c = train_head(spec, x, y, HeadParams(epochs=3), seed=6).logits(x)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_majority_baseline():
    single = get_task("synth-negation")
    logits = majority_baseline(single, np.array([1, 1, 0]), np.array([0, 1, 1, 1]))
    assert primary_score(single, logits, np.array([0, 1, 1, 1])) == 0.75
    reg = get_task("synth-similarity")
    assert np.all(majority_baseline(reg, np.array([1.0, 3.0]), np.zeros(5)) == 2.0)


def test_fewest_layers_and_span_summary_small_cases():
    assert fewest_layers_within([0.5, 0.6, 0.895, 0.9], full=0.9, tolerance=0.01) == 2
    assert fewest_layers_within([0.5, 0.6, 0.7], full=0.9, tolerance=0.01) == 2  # nothing within: keep all
    scores = {(1, 1): 0.89, (2, 2): 0.5, (3, 3): 0.9, (1, 2): 0.7, (2, 3): 0.6, (1, 3): 0.3}
    summary = span_summary(scores, full=0.9, tolerance=0.01)
    assert summary["worst_single_layer"] == {"layer": 2, "score": 0.5}
    assert summary["largest_span_within_tolerance"] == {"first": 3, "last": 3, "length": 1, "score": 0.9}
    assert span_summary({(1, 1): 0.1}, full=0.9, tolerance=0.01)["largest_span_within_tolerance"] is None


def test_a_folder_without_a_fine_tuned_head_is_refused(tiny_model_dir):
    from layersim.errors import LayersimError
    from layersim.models.registry import load_finetuned

    with pytest.raises(LayersimError) as info:
        load_finetuned(tiny_model_dir("tiny-bert"), get_task("synth-negation"))
    assert "no head fine-tuned on task 'synth-negation'" in str(info.value)


def test_truncation_summary_of_a_small_exact_case() -> None:
    from layersim.experiments.truncation import truncation_summary

    per_seed = {"untuned": [[0.5, 0.7, 0.9], [0.5, 0.9, 0.9]], "tuned": [[0.6, 0.8, 0.9], [0.6, 0.8, 0.9]]}
    metrics, rows = truncation_summary(per_seed, [0.9, 0.9], 0.5, [1, 2], 0.05, "accuracy")
    assert metrics["full"] == 0.9 and metrics["majority_baseline"] == 0.5
    assert metrics["untuned"] == {"layer_00": 0.5, "layer_01": 0.8, "layer_02": 0.9}
    assert metrics["fewest_layers_untuned_within_tolerance"] == 2 and metrics["droppable_top_layers_untuned"] == 0
    assert len(rows) == 2 * 2 * 3 and rows[0] == {"series": "untuned seed 1", "variant": "untuned", "seed": 1,
                                                  "layer": 0, "score": 0.5, "converged": True}
    assert len({row["series"] for row in rows}) == 2 * 2  # one curve per variant and seed (DVC draws one line each)
    # Two seeds: their range, and no interval over seeds.
    assert metrics["over_seeds"]["untuned"]["seed_range"] == {"layer_00": 0.0, "layer_01": 0.2, "layer_02": 0.0}
    assert "seed_ci_low" not in metrics["over_seeds"]["untuned"]


def test_truncation_summary_gives_a_t_interval_over_three_seeds() -> None:
    from layersim.experiments.truncation import truncation_summary

    # Full-model scores 0.7, 0.8, 0.9: mean 0.8, sd 0.1, t(0.975, 2) = 4.302653 → 0.8 ± 4.302653 · 0.1 / √3.
    per_seed = {"untuned": [[0.5, 0.7], [0.5, 0.8], [0.5, 0.9]], "tuned": [[0.6, 0.7], [0.6, 0.8], [0.6, 0.9]]}
    metrics, _ = truncation_summary(per_seed, [0.7, 0.8, 0.9], 0.5, [1, 2, 3], 0.05, "accuracy")
    half = 4.302653 * 0.1 / 3 ** 0.5
    full = metrics["over_seeds"]["full"]
    assert full["seed_mean"] == pytest.approx(0.8) and full["seed_sd"] == pytest.approx(0.1)
    assert (full["seed_ci_low"], full["seed_ci_high"]) == (pytest.approx(0.8 - half, abs=1e-6),
                                                           pytest.approx(0.8 + half, abs=1e-6))
    untuned = metrics["over_seeds"]["untuned"]
    assert untuned["seed_sd"]["layer_00"] == 0.0 and untuned["seed_ci_high"]["layer_01"] == pytest.approx(0.8 + half,
                                                                                                        abs=1e-6)


def test_truncation_summary_leaves_a_flagged_seed_out_of_the_converged_only_mean() -> None:
    from layersim.experiments.truncation import truncation_summary

    per_seed = {"untuned": [[0.5, 0.8], [0.5, 0.9], [0.3, 0.3]], "tuned": [[0.6, 0.8], [0.6, 0.9], [0.2, 0.4]]}
    metrics, rows = truncation_summary(per_seed, [0.8, 0.9, 0.3], 0.5, [1, 2, 3], 0.05, "accuracy", flagged=[3])
    assert metrics["full"] == pytest.approx(2.0 / 3)  # the headline stays the all-runs mean
    full, untuned = metrics["over_seeds"]["full"], metrics["over_seeds"]["untuned"]
    assert full["seed_mean_converged"] == pytest.approx(0.85) and full["seeds_converged"] == 2
    assert untuned["seed_mean_converged"] == pytest.approx({"layer_00": 0.5, "layer_01": 0.85})
    assert untuned["seed_mean"]["layer_01"] == pytest.approx(2.0 / 3, abs=1e-6)
    assert {row["seed"] for row in rows if not row["converged"]} == {3}


# --- skip predicted from similarity (layersim.similarity.pruning) ---


def _turned_layers(angles, rows=5):
    """Layers 0 … L of `rows` points in the plane, each turned by angles[k − 1] at layer k: layer k's Block
    Influence is 1 − cos(angles[k − 1]), span (i, j)'s angular distance the angles of i..j summed, over π."""
    turned = np.concatenate([[0.0], np.cumsum(angles)])
    radius = np.arange(1.0, rows + 1)[:, None]
    return [(radius * np.array([[np.cos(t), np.sin(t)]])).astype(np.float32) for t in turned]


def test_pruning_records_are_checked_before_use(tmp_path):
    from layersim.data.io import write_json
    from layersim.errors import LayersimError
    from layersim.experiments.pruning_states import PruningStates, measured_rows, read_pruning_record
    from layersim.similarity.pruning import measures_from_record, pruning_measures

    layers = _turned_layers([0.2, 0.7, 0.1], rows=7)
    states = PruningStates(3, "first")  # each row a one-token sequence: both measures average over the rows
    states.update([torch.tensor(a)[:, None] for a in layers], torch.ones(7, 1), torch.zeros(7, dtype=torch.long))
    path = tmp_path / "seed1.pruning.json"
    write_json({"run": "seed1", "task": "t", **states.record()}, path)
    record = read_pruning_record(path, {"run": "seed1", "task": "t"})
    measures = measures_from_record(record, 3)
    np.testing.assert_allclose(measures.angular, pruning_measures(layers).angular, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(measures.block_influence(), 1 - np.cos([0.2, 0.7, 0.1]), rtol=1e-5)
    assert set(measured_rows(record)) == {"block_influence", "angular_distance"}
    with pytest.raises(LayersimError, match="holds 3 layers but the model has 4"):
        measures_from_record(record, 4)
    with pytest.raises(LayersimError, match="has run = 'seed1', expected 'seed2'"):
        read_pruning_record(path, {"run": "seed2"})
    with pytest.raises(LayersimError, match="seed2.pruning.json does not exist"):
        read_pruning_record(tmp_path / "seed2.pruning.json", {})


def test_skip_predictions_of_a_constructed_model():
    import json

    from layersim.experiments.truncation import skip_predictions
    from layersim.reporting.headlines import details_to_metrics, metrics_to_details, skip_headline
    from layersim.reporting.pruning_plots import prediction_scatter
    from layersim.similarity.pruning import pruning_measures

    angles = [0.3, 0.05, 0.6]  # layer 2 changes least: both rules pick it first
    measures = [pruning_measures(_turned_layers(angles)), pruning_measures(_turned_layers(angles, rows=3))]
    spans = all_spans(3)
    # Seed 1's score falls with the summed angle (what Gromov predicts); seed 2 is seed 1 shifted down.
    seed1 = {(i, j): 0.9 - sum(angles[i - 1:j]) / 2 for i, j in spans}
    per_seed = [seed1, {span: score - 0.1 for span, score in seed1.items()}]
    prediction, per_seed_values, mean_values = skip_predictions(measures, per_seed, {"block_influence": "rows"})
    assert prediction["rows"] == {"block_influence": "rows"}
    angular = prediction["angular_distance"]
    assert angular["all_spans"] == 1.0 and angular["spans"] == 6
    assert angular["by_length"]["length_1"] == {"spearman": 1.0, "spans": 3}  # no p-value: spans share layers
    assert angular["by_length"]["length_2"]["spearman"] is None  # two spans: too few to rank
    assert angular["within_length"] == 1.0  # the one length with a rho
    baselines = prediction["baselines"]
    assert baselines["length_only"]["all_spans"] > 0.5  # longer spans score worse here, as in any model
    assert {"within_length", "within_length_low", "within_length_high", "all_spans", "beyond_position",
            "beyond_position_low", "beyond_position_high"} == set(baselines["random_layer"])
    assert baselines["position_only"]["within_length"] == -0.5  # single layers scored 0.75, 0.875, 0.6 by depth
    assert angular["beyond_position"] is None  # no length has the 4 spans a partial rho needs
    # Summed BI orders the single layers as the angles do, so it ranks them perfectly too.
    assert prediction["block_influence"]["by_length"]["length_1"]["spearman"] == 1.0
    picked = prediction["picked"]
    assert picked["length_1"]["angular_distance"] == picked["length_1"]["best"] == {"span": "2-2", "score": 0.825}
    assert picked["length_2"]["angular_distance"]["span"] == "1-2" == picked["length_2"]["best"]["span"]  # 0.35 < 0.65
    assert picked["length_1"]["block_influence_layers"] == "2"
    assert per_seed_values[0][(2, 3)]["angular_distance"] == pytest.approx(0.65 / np.pi, abs=1e-6)
    assert per_seed_values[1][(1, 1)]["block_influence"] == pytest.approx(1 - np.cos(0.3), abs=1e-6)
    assert mean_values["angular_distance"][(1, 3)] == pytest.approx(0.95 / np.pi, abs=1e-6)
    # The metrics hold only finite JSON, and the headline comes back from the details rows.
    full = {"largest_span_within_tolerance": None, "prediction": prediction}
    details = json.loads(json.dumps(metrics_to_details(full), allow_nan=False))
    headline = skip_headline(details_to_metrics(details))
    assert headline == skip_headline(full) == {
        "longest_skippable_span": 0, "skip_prediction_angular": 1.0,
        "skip_prediction_block_influence": prediction["block_influence"]["within_length"],
        "skip_prediction_random_layer": baselines["random_layer"]["within_length"],
        "skip_prediction_random_layer_high": baselines["random_layer"]["within_length_high"],
        "skip_prediction_position_only": -0.5, "skip_prediction_angular_beyond_position": None,
        "skip_prediction_block_influence_beyond_position": None,
        "skip_prediction_random_layer_beyond_position_high": None}
    import matplotlib.pyplot as plt

    figure = prediction_scatter({s: float(np.mean([p[s] for p in per_seed])) for s in spans}, mean_values,
                                prediction, 0.85, "accuracy", "test")
    assert len(figure.axes) == 3  # two panels and the colour bar
    assert figure.axes[0].get_title().startswith("within-length ρ = 1.00 (random layers 95 %: ")
    plt.close(figure)


def test_head_scores_on_chosen_layers_are_those_layers_scores(extracted):
    """head_scores' `layers` (benchmarks/head_rows.py --layers): each chosen layer's head is the one the full sweep
    trains there, under the same seed."""
    from layersim.data.io import ActivationTable
    from layersim.experiments.truncation import head_scores

    table = ActivationTable(extracted / "activations" / "seed1.cls.parquet")
    spec, params = get_task("synth-negation"), HeadParams(epochs=3, batch_size=16, holdout=0.2, patience=2)
    every = head_scores(spec, table, table, params, seed=4)
    assert len(every) == table.num_layers + 1
    assert head_scores(spec, table, table, params, seed=4, layers=[2, 0]) == pytest.approx([every[2], every[0]])
