"""The experiment's report page: small exact cases of what it states, and that it is one offline file."""

from __future__ import annotations

import json
import re

import matplotlib.pyplot as plt
import pytest

from layersim.data.layout import finetune_metrics, stage_details
from layersim.reporting.headlines import metrics_to_details
from layersim.reporting.cells import block_spans
from layersim.reporting.page import Layout, build_report, export_facts, png, render, Table
from layersim.reporting.similarity_tables import similarity_tables


def _similarity(p_top: float) -> dict:
    layers = lambda *values: {f"layer_{k:02d}": v for k, v in enumerate(values)}  # noqa: E731
    entry = {"last_layer": 0.8, "null_mean": layers(None, 0.1, 0.7), "p_value": layers(None, 0.0, p_top),
             "ci_low": layers(None, 0.85, 0.75), "ci_high": layers(None, 0.95, 0.85)}
    blocks = {"ft_ft": {"block_of_layer": layers(None, 0, 1), "last_block_start": 2, "contrast": 0.2,
                        "bootstrap_stability": 0.9}, "seed_stability": 1.0}
    return {"cls": {"linear_cka": {"ft_orig": entry, "ft1_ft2": entry, "blocks": blocks}}}


def test_block_spans_turn_layer_labels_into_ranges():
    assert block_spans({"layer_00": None, "layer_01": 0, "layer_02": 0, "layer_03": 1, "layer_04": 1,
                        "layer_05": 1}) == "1–2 | 3–5"
    assert block_spans({"layer_00": 0, "layer_01": 0}) == "0–1"
    assert block_spans({"layer_01": 0, "layer_02": 1, "layer_03": 2}) == "1 | 2 | 3"
    assert block_spans({}) == ""


def test_a_top_layer_at_chance_is_said_to_be_chance():
    above, chance = similarity_tables(_similarity(0.01), 0.05)[0], similarity_tables(_similarity(0.3), 0.05)[0]
    assert [row[-1] for row in above.rows] == ["yes", "yes"]
    assert [row[-1] for row in chance.rows] == ["no: chance", "no: chance"]
    row = chance.rows[0]
    assert row[:9] == ["linear_cka", "FT–ORIG", "–", "0.800", "[0.750, 0.850]", "0.700", "0.300", "none",
                       "no: chance"]
    blocks = similarity_tables(_similarity(0.01), 0.05)[1]
    assert blocks.rows[0] == ["linear_cka", "FT–FT", "1 | 2", "2", "0.200", "0.900"]


def test_export_facts_state_the_choice_scores_and_size():
    export = {"metric": "accuracy", "tolerance": 0.01, "selection_examples": 500,
              "full": {"layers": 6, "train": 0.9, "validation": 0.85}, "full_parameters": 200,
              "exported": {"description": "exit after layer 4 of 6", "layers": 4, "train": 0.895, "validation": 0.84,
                           "parameters": 150}}
    facts = " ".join(export_facts(export))
    for fragment in ("exit after layer 4 of 6", "4 of 6 layers", "0.840 on validation", "0.850 for the full model",
                     "500 train examples", "Parameters: 75% of the full model's", "timings/export/"):
        assert fragment in facts
    assert "×" not in facts  # wall-clock speed-ups stay out of the page (it must hash the same on a rerun)
    assert export_facts(None) == []


def test_the_page_escapes_text_and_embeds_its_figures():
    fig, ax = plt.subplots()
    ax.plot([0, 1])
    from layersim.reporting.page import Figure, Section

    page = render("a <title>", ["x < y & z"], Table("t", ["h"], [["<b>"]]), [],
                  [Section("task <1>", ["fact"], [], [Figure("c", png(fig))])])
    assert "<title>a &lt;title&gt;</title>" in page and "x &lt; y &amp; z" in page and "&lt;b&gt;" in page
    assert len(re.findall(r'src="data:image/png;base64,', page)) == 1
    assert "http" not in page  # nothing to fetch: it renders offline


def test_build_report_reads_the_stage_outputs(tmp_path):
    """A minimal set of outputs (similarity and finetune only): the page names the task, its scores and the
    chance verdict, and leaves out the figures that are not there."""
    (tmp_path / "metrics/finetune/rte/seed1").mkdir(parents=True)
    (tmp_path / "metrics/finetune/rte/seed1/metrics.json").write_text(json.dumps({"accuracy": 0.625}))
    (tmp_path / "plots/details/similarity/rte").mkdir(parents=True)
    (tmp_path / "plots/details/similarity/rte/values.json").write_text(json.dumps(metrics_to_details(_similarity(0.3))))
    layout = Layout(tmp_path / "metrics", tmp_path / "plots/details", tmp_path / "plots")
    page = build_report("roberta-base", ["rte"], [1], 0.05, ("cls", "linear_cka"), layout)
    assert "seed 1 0.625" in page and "no: chance" in page and "roberta-base" in page
    assert "data:image/png" not in page


def test_a_skipped_span_survives_the_details_round_trip(tmp_path):
    """The export's choice goes through the details rows (lists would become per-layer rows) and the page
    still names it: a skipped span is stated under the truncation curve, which marks no exit."""
    from layersim.experiments.export import LayerChoice

    chosen = LayerChoice(3, 3, 2, 2)
    export = {"metric": "accuracy", "tolerance": 0.01, "selection_examples": 100,
              "full": {"layers": 3, "train": 0.9, "validation": 0.8},
              "exported": {**chosen.as_dict(), "train": 0.9, "validation": 0.8, "parameters": 60},
              "full_parameters": 80}
    truncate = {"metric": "accuracy", "full": 0.8, "majority_baseline": 0.5, "tolerance": 0.01,
                "droppable_top_layers_untuned": 0, "droppable_top_layers_tuned": 1}
    details = tmp_path / "plots/details"
    for stage, values in (("export", export), ("truncate", truncate)):
        stage_details(details, stage, "rte").parent.mkdir(parents=True)
        stage_details(details, stage, "rte").write_text(json.dumps(metrics_to_details(values)))
    (tmp_path / "plots/truncate/rte").mkdir(parents=True)
    (tmp_path / "plots/truncate/rte/truncate.json").write_text(json.dumps(
        [{"variant": v, "seed": 1, "layer": k, "score": 0.5 + 0.1 * k} for v in ("untuned", "tuned", "tuned_orig")
         for k in range(4)]))
    page = build_report("m", ["rte"], [1], 0.05, ("cls", "linear_cka"),
                        Layout(tmp_path / "metrics", details, tmp_path / "plots"))
    assert "here it skipped layers 2–2 instead" in page and "layers 2-2 of 3 skipped" in page
    assert "2 / 3" in page and "<td>75%</td>" in page


@pytest.mark.parametrize("model, noun", [("tiny-gpt2", "decoder"), ("tiny-bert", "encoder"), ("minilm-l6", "encoder"),
                                         ("someone/not-downloaded", "model")])
def test_the_truncation_caption_names_the_models_kind(tmp_path, monkeypatch, model, noun):
    """Issue 64: the caption said "encoder" for a decoder. (A hub model's kind is read from its download under the
    working folder: an empty one here.)"""
    from layersim.reporting.page import truncation_figure

    monkeypatch.chdir(tmp_path)
    (tmp_path / "plots/truncate/rte").mkdir(parents=True)
    (tmp_path / "plots/truncate/rte/truncate.json").write_text(json.dumps(
        [{"variant": v, "seed": 1, "layer": k, "score": 0.5 + 0.1 * k} for v in ("untuned", "tuned") for k in range(3)]))
    truncate = {"metric": "accuracy", "full": 0.8, "majority_baseline": 0.5}
    figure = truncation_figure(Layout(tmp_path / "metrics", tmp_path / "details", tmp_path / "plots"), "rte", truncate,
                               None, model=model)
    assert figure.caption.startswith(f"Score when the {noun} exits after layer k (Phang et al. Fig. 3)")


def test_the_page_names_the_runs_that_did_not_converge(tmp_path):
    """A stuck seed (its own check) and the overview's mean say which run did not converge and why."""
    from layersim.training.convergence import check_run

    folder = tmp_path / "metrics/finetune/synth-similarity"
    folder.mkdir(parents=True)
    for seed, (score, loss) in {1: (0.369, 3.1), 2: (0.768, 0.9)}.items():
        record = check_run("pearson", score, 0.0, loss, 3.125).record()
        finetune_metrics(folder, seed).parent.mkdir()
        finetune_metrics(folder, seed).write_text(json.dumps({"pearson": score, "spearman": score,
                                                             "convergence": record}))
    page = build_report("m", ["synth-similarity"], [1, 2], 0.05, ("cls", "linear_cka"),
                        Layout(tmp_path / "metrics", tmp_path / "plots/details", tmp_path / "plots"))
    assert "seed 1 0.369 (not converged), seed 2 0.768." in page
    assert "Seed 1 (FT[1]) did not converge: its final training loss 3.1 is 99% of the trivial predictor" in page
    assert "0.569 (1 of 2 runs not converged: seed 1)" in page
    assert "Seed 2 (FT[2]) did not converge" not in page


@pytest.mark.parametrize("comparisons", [1, 4, 5, 8])
def test_heatmap_and_curve_panels_wrap_four_to_a_row(comparisons):
    """Issue 64: a row of 8 heatmap panels was too wide for a 1,400 px page (shrunk below legibility). Past four,
    a measure's panels wrap onto further rows, sharing its colour bar; the per-layer curves likewise."""
    import numpy as np

    from layersim.reporting.plots import PANELS_PER_ROW, Curve, diagonal_curves, measure_grid

    names = [f"C{k}" for k in range(comparisons)]
    panels = {name: (np.full((3, 3), 0.5), "y layer", "x layer") for name in names}
    figure = measure_grid({"linear_cka": (panels, (0, 1)), "svcca": (panels, None)}, "t")
    heatmaps = [ax for ax in figure.axes if ax.get_title() in names]
    columns = min(comparisons, PANELS_PER_ROW)
    rows_per_measure = -(-comparisons // PANELS_PER_ROW)
    assert sorted(ax.get_title() for ax in heatmaps) == sorted(names * 2)
    assert len({round(ax.get_position().x0, 3) for ax in heatmaps}) == columns
    assert len({round(ax.get_position().y0, 3) for ax in heatmaps}) == 2 * rows_per_measure
    assert len(figure.axes) == 2 * rows_per_measure * columns + 2  # the grid, and a colour bar a measure
    assert figure.get_size_inches()[0] == pytest.approx(3.4 * columns + 0.8)
    plt.close(figure)

    curves = diagonal_curves({name: {"FT–ORIG": Curve(np.linspace(0, 1, 4))} for name in names}, "t")
    drawn = [ax for ax in curves.axes if ax.get_visible()]
    assert sorted(ax.get_title() for ax in drawn) == sorted(names)
    assert len({round(ax.get_position().x0, 3) for ax in drawn}) == columns
    assert curves.get_size_inches()[0] == pytest.approx(4.4 * columns)
    plt.close(curves)


def test_the_page_shows_a_compared_methods_scores_and_convergence_beside_the_full_runs(tmp_path):
    """finetune.compare_methods: [lora]: LoRA's runs (metrics/finetune/<task>/lora/seed<k>) get their scores and
    their own convergence sentences, LoRA[i] named; the full runs' sentences are unchanged."""
    from layersim.training.convergence import check_run

    folder = tmp_path / "metrics/finetune/synth-similarity"
    for method, scores in ((None, {1: (0.748, 0.9), 2: (0.787, 0.8)}), ("lora", {1: (0.775, 0.9), 2: (0.369, 3.1)})):
        for seed, (score, loss) in scores.items():
            path = finetune_metrics(folder, seed, method)
            path.parent.mkdir(parents=True)
            path.write_text(json.dumps({"pearson": score, "convergence": check_run("pearson", score, 0.0, loss,
                                                                                   3.125).record()}))
    layout = Layout(tmp_path / "metrics", tmp_path / "plots/details", tmp_path / "plots")
    page = build_report("m", ["synth-similarity"], [1, 2], 0.05, ("cls", "linear_cka"), layout, ("lora",))
    assert "Fine-tuned pearson: seed 1 0.748, seed 2 0.787." in page
    assert ("LoRA fine-tuning (finetune.compare_methods) pearson: seed 1 0.775, seed 2 0.369 (not converged)."
            in page)
    assert "Seed 2 (LoRA[2]) did not converge: its final training loss 3.1" in page and "(FT[2]) did not" not in page
    assert "LoRA fine-tuning" not in build_report("m", ["synth-similarity"], [1, 2], 0.05, ("cls", "linear_cka"),
                                                  layout)


def test_the_page_gives_the_intruder_counts_against_their_null_per_method_and_role(tmp_path):
    from layersim.data.layout import stage_metrics

    role = {"matrices": 6, "intruders_per_matrix": 0.333333, "null_per_matrix": 0.05, "p_value": 0.0099}
    headline = {"method": "full", "shared_roles": ["query", "value"], "intruders_per_adapted_matrix": 0.0,
                "intruders_per_adapted_matrix_null": 0.0, "intruders_p_value": 1.0,
                "intruders_per_shared_role_matrix": 0.0, "intruders_per_shared_role_matrix_null": 0.0,
                "intruders_shared_roles_p_value": 1.0,
                "compared": {"lora": {"intruders_per_adapted_matrix": 0.333333,
                                      "intruders_per_adapted_matrix_null": 0.05, "intruders_p_value": 0.0099,
                                      "intruders_per_shared_role_matrix": 0.333333,
                                      "intruders_per_shared_role_matrix_null": 0.05,
                                      "intruders_shared_roles_p_value": 0.0099, "by_role": {"query": role}}}}
    path = stage_metrics(tmp_path / "metrics", "weights", "rte")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(headline))
    page = build_report("m", ["rte"], [1], 0.05, ("cls", "linear_cka"),
                        Layout(tmp_path / "metrics", tmp_path / "plots/details", tmp_path / "plots"))
    assert "weights: intruder dimensions against a structureless update of the same size" in page
    assert "<td>LoRA</td><td>query</td><td>6</td><td>0.333</td><td>0.050</td><td>0.010</td>" in page
    assert "roles every method adapted (query, value)" in page
