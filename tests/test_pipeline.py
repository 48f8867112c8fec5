"""Integration: the real `dvc repro` of the whole pipeline on a tiny model, in a temporary git repo."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml
from scipy import stats

from dvc_project import (PIPELINE_SEEDS, PIPELINE_TASK, assert_figure, built_project, check_freeze_outputs,
                         command_output, configure_pipeline, droppable_top_layers, dry_run_stages, dvc,
                         heatmap_diagonal, longest_skippable_span, rescored_accuracy, run)
from headline_docs import undocumented
from layersim.reporting import headlines
from layersim.similarity.inference.bootstrap import AUTO_INTERVAL
from layersim.data.io import ActivationTable, AttentionTable, stage_details, stage_metrics, task_tables
from layersim.training.convergence import SEED_GAP

TASK, SEEDS = PIPELINE_TASK, PIPELINE_SEEDS

pytestmark = pytest.mark.integration


def _details(root: Path, stage: str, task: str | None = None) -> dict:
    """Every value a stage computed, from its details plot data (its metrics file holds the headline)."""
    return headlines.details_to_metrics(json.loads(_details_path(root, stage, task).read_text()))


def _details_path(root: Path, stage: str, task: str | None) -> Path:
    return stage_details(root / "plots/details", stage, task) if task else root / f"plots/details/{stage}.json"


def _json(root: Path, relative: str):
    return json.loads((root / relative).read_text())


def _finetuned(root: Path, seed: int) -> dict:
    """The finetune stage's metrics file of `seed`."""
    return _json(root, f"metrics/finetune/{TASK}/seed{seed}/metrics.json")


def _flagged_seeds(root: Path) -> set[int]:
    """The seeds whose finetune run is flagged as not converged: its own check failed, or its score is more than
    SEED_GAP below the other seed's (layersim.training.convergence, two seeds)."""
    runs = {seed: _finetuned(root, seed) for seed in SEEDS}
    return {seed for seed in SEEDS if not runs[seed]["convergence"]["converged"] or any(
        runs[seed]["accuracy"] < runs[other]["accuracy"] - SEED_GAP for other in SEEDS if other != seed)}


def _params(root: Path) -> dict:
    return yaml.safe_load((root / "params.yaml").read_text())


def _benjamini_hochberg(p_values: list[float]) -> list[float]:
    """Benjamini–Hochberg adjusted p-values (q-values), in the input's order."""
    p = np.asarray(p_values, dtype=float)
    order = np.argsort(p)
    ranked = p[order] * len(p) / np.arange(1, len(p) + 1)
    ranked = np.minimum.accumulate(ranked[::-1])[::-1]
    adjusted = np.empty(len(p))
    adjusted[order] = np.minimum(ranked, 1.0)
    return adjusted.tolist()


@pytest.fixture(scope="module")
def project(tmp_path_factory, built_projects) -> tuple[Path, dict]:
    """A copy of this repository (its git-tracked and not-ignored files) as a fresh git repo, with
    params.yaml set to a tiny model and a small built-in task, after `dvc repro` (built once per test run:
    tests/test_incremental.py starts from the same project)."""
    dest = tmp_path_factory.mktemp("project")
    env, first_repro = built_project(built_projects, dest, configure_pipeline, "pipeline")
    return dest, {"env": env, "first_repro": first_repro}


def test_repro_writes_every_declared_output(project):
    root, state = project
    tasks = task_tables(root / "data" / "tasks", TASK)
    assert (tasks / "train.parquet").is_file() and (tasks / "validation.parquet").is_file()
    assert (root / "data/models/tiny-bert/pretrained/model.safetensors").is_file()
    validation_split = pq.read_table(tasks / "validation.parquet").to_pydict()
    train_labels = np.asarray(pq.read_table(tasks / "train.parquet").column("label").to_pylist())
    for seed in SEEDS:
        checkpoint = root / f"data/checkpoints/{TASK}/seed{seed}/model"
        assert (checkpoint / "model.safetensors").is_file() and (checkpoint / "config.json").is_file()
        metrics = _finetuned(root, seed)
        assert set(metrics) == {"accuracy", "convergence"}
        # The score is the checkpoint's own: re-scored here on the validation split with transformers alone.
        assert metrics["accuracy"] == pytest.approx(rescored_accuracy(checkpoint, validation_split), abs=1e-6)
        verdict = metrics["convergence"]  # the check's numbers, whatever the tiny run's verdict
        assert {"converged", "score", "baseline", "final_train_loss", "trivial_loss"} <= set(verdict)
        assert verdict["score"] == pytest.approx(metrics["accuracy"], abs=1e-6)
        # Its references, from the data: the best constant predictor's validation accuracy, and the loss of
        # predicting the train labels' shares (their entropy in nats).
        shares = np.bincount(validation_split["label"], minlength=2) / len(validation_split["label"])
        assert verdict["baseline"] == pytest.approx(shares.max(), abs=1e-6) and verdict["n"] == 60
        train_shares = np.bincount(train_labels, minlength=2) / len(train_labels)
        assert verdict["trivial_loss"] == pytest.approx(-(train_shares * np.log(train_shares)).sum(), abs=1e-5)
        assert verdict["converged"] == ("reason" not in verdict)
        curve = root / f"dvclive/finetune/{TASK}/seed{seed}/plots/metrics/train/loss.tsv"
        assert len(curve.read_text().splitlines()) > 1
    activations = root / f"data/activations/tiny-bert/{TASK}/tables"
    orig = ActivationTable(activations / "orig.cls.parquet")
    assert orig.num_layers == 3 and orig.hidden_size == 32 and orig.num_rows == 60
    validation = pq.read_table(tasks / "validation.parquet").column("text").to_pylist()
    words = ActivationTable(activations / "orig.tokens.parquet")
    assert words.num_rows == sum(len(text.split()) for text in validation)  # max_length 32 cuts no word here
    assert not (activations / "train/orig.tokens.parquet").exists()  # words: validation only
    assert not (activations / "orig.last.parquet").exists()  # extract.poolings' default: no stage reads `last`
    for pooling in ("cls", "mean", "tokens"):
        reference = ActivationTable(activations / f"orig.{pooling}.parquet")
        for run_name in ("orig", "seed1", "seed2", "random"):
            table = ActivationTable(activations / f"{run_name}.{pooling}.parquet")
            assert table.metadata["run"] == run_name and table.metadata["pooling"] == pooling
            reference.check_comparable(table)
    # The random-init control: validation only, its seed and base model recorded.
    control = ActivationTable(activations / "random.cls.parquet")
    assert control.metadata["init_seed"] == 0 and control.metadata["base_digest"] == orig.metadata["model_digest"]
    assert not (activations / "train/random.cls.parquet").exists()
    attention = AttentionTable(activations / "attention/orig.parquet")
    assert attention.num_layers == 3 and len(attention.example_starts) == 60

    similarity = _details(root, "similarity", TASK)
    assert set(similarity) == {"cls", "tokens", "attention"}
    # Attention maps' null: whole examples exchanged with examples of equal length (attention_null), in the family.
    attention_js = similarity["attention"]["jensen_shannon"]
    assert attention_js["null"] == {"method": "block permutation", "permutations": 20}
    assert "p_value" in attention_js["ft_orig"] and "p_family" in attention_js["ft_orig"]
    assert similarity["attention"]["null_unit"]["examples"] == 60
    assert similarity["attention"]["null_unit"]["movable"] > 0
    assert similarity["cls"]["null_unit"]["unit"] == "row" and similarity["tokens"]["null_unit"]["unit"] != "row"
    # extract.table_precision auto (params.yaml's default): word rows as 24-bit integers, example rows as float16.
    assert similarity["cls"]["table_precision"] == "float16" and similarity["tokens"]["table_precision"] == "int24"
    for pooling in ("cls", "tokens"):
        assert set(similarity[pooling]) == {"linear_cka", "svcca", "pwcca", "neuronsim", "localization", "rows",
                                            "null_unit", "table_precision"}
        # synth-negation's examples share nothing: the null moves examples (cls: rows; tokens: an example's words)
        assert similarity[pooling]["null_unit"]["rows"] > 0 and similarity[pooling]["null_unit"]["blocks"] > 0
        for measure in ("linear_cka", "svcca", "pwcca", "neuronsim"):
            summary = similarity[pooling][measure]
            cca = {"kept_dimensions"} if measure in ("svcca", "pwcca") else set()
            # "family": the headline claims' correction; "no_interval": no interval method covers for the measure.
            uncovered = {"no_interval"} if AUTO_INTERVAL[measure] is None else set()
            # "ft_orig_above_random": FT–ORIG's top minus FT–RANDOM's with its paired interval, where one covers
            above = set() if uncovered else {"ft_orig_above_random"}
            assert set(summary) == {"orig_orig", "ft_orig", "ft_ft", "ft1_ft2", "orig_random", "ft_random", "null",
                                    "blocks", "correction", "family", "lora_orig", "lora_ft"} | cca | uncovered | above
            assert summary["correction"] == "fdr_bh"  # the default: hatching corrected over each heatmap's cells
            assert summary["ft_orig"]["seeds"] == 2 and "seed_range" in summary["ft_orig"]  # no interval: 2 seeds
            assert 0.0 <= summary["orig_random"]["p_value"]["layer_03"] <= 1.0
            # Blocks of layers: every defined layer of ORIG–ORIG and FT–FT in one, the two seeds compared.
            for key in ("orig_orig", "ft_ft"):
                blocks = summary["blocks"][key]
                assert set(blocks["block_of_layer"]) == {"layer_00", "layer_01", "layer_02", "layer_03"}
                assert blocks["num_blocks"] == len({b for b in blocks["block_of_layer"].values() if b is not None})
                assert blocks["last_block_start"] in (0, 1, 2, 3)
                assert 0.0 <= blocks["bootstrap_stability"] <= 1.0
            assert 0.0 <= summary["blocks"]["seed_stability"] <= 1.0
            # One row per example (cls): rows shuffled, linear CKA's exact moments. Words (tokens): whole examples
            # shuffled, linear CKA's null sampled at least 199 times.
            if pooling == "cls":
                assert summary["null"]["method"] == ("exact" if measure == "linear_cka" else "permutation")
            else:
                assert summary["null"] == {"method": "block permutation",
                                           "permutations": 199 if measure == "linear_cka" else 20}
            assert summary["ft_ft"]["diagonal"]["layer_03"] == pytest.approx(1.0)
            assert 0.0 <= summary["ft_orig"]["last_layer"] <= 1.0
            # Every reported diagonal carries its null and, for FT–ORIG and FT[1]–FT[2], a bootstrap interval where
            # an interval method covers for the measure (bootstrap.AUTO_INTERVAL), else a note why not.
            for key in ("ft_orig", "ft1_ft2"):
                layer = summary[key]
                assert 0.0 <= layer["p_value"]["layer_03"] <= 1.0 and 0.0 <= layer["null_mean"]["layer_03"] <= 1.0
                if uncovered:
                    assert "ci_low" not in layer and "no bootstrap interval" in summary["no_interval"]
                else:
                    assert layer["ci_low"]["layer_03"] <= layer["ci_high"]["layer_03"]
            # The headline claims' family: FT–ORIG's p-values adjusted over every measure and pooling's claims.
            tested = {layer for layer, p in summary["ft_orig"]["p_value"].items() if p is not None}
            assert summary["family"]["tests"] >= 8 and set(summary["ft_orig"]["p_family"]) == tested
            assert "ci_low" not in summary["orig_orig"]
        diagonals = json.loads((root / f"plots/diagonals/{TASK}/curves/{pooling}.json").read_text())
        assert {row["comparison"] for row in diagonals} == {"FT–ORIG", "FT[1]–FT[2]", "LoRA–ORIG", "LoRA–FT"}
        # Every curve carries its null; a bootstrap band only where an interval method covers (linear CKA here).
        assert all("null_mean" in row for row in diagonals) and any({"low", "high"} <= set(row) for row in diagonals)
        assert_figure(root / f"plots/diagonals/{TASK}/curves/{pooling}.png")
        # trained models only, and finetune.method's: the LoRA runs change no localization score
        assert set(similarity[pooling]["localization"]) == {"ORIG", "FT[1]", "FT[2]"}
        assert_figure(root / f"plots/similarity/{TASK}/heatmaps/{pooling}.png")
        assert_figure(root / f"plots/localization/{TASK}/curves/{pooling}.png")
        rows = json.loads((root / f"plots/similarity/{TASK}/heatmaps/{pooling}.json").read_text())
        assert {row["comparison"] for row in rows} == {"ORIG–ORIG", "FT–ORIG", "FT–FT", "FT[1]–FT[2]", "ORIG–RANDOM",
                                                       "FT–RANDOM", "LoRA–ORIG", "LoRA–FT"}
        assert {row["measure"] for row in rows} == {"linear CKA", "SVCCA", "PWCCA", "neuronsim"}
        assert all(0.0 <= row["p_value"] <= 1.0 for row in rows if row["p_value"] is not None)
        # A sampled null of 20 draws (similarity.permutations) gives p = (1 + #{null >= observed}) / 21, for every
        # measure but linear CKA (cls: its exact moments, any value; tokens: 199 draws, below).
        sampled = [row["p_value"] for row in rows if row["measure"] != "linear CKA" and row["p_value"] is not None]
        assert sampled and {round(p * 21, 3) % 1 for p in sampled} == {0.0}
        if pooling == "tokens":  # the word heatmaps' null: whole sentences shuffled, 199 draws for linear CKA
            linear = [row for row in rows if row["measure"] == "linear CKA" and row["p_value"] is not None]
            assert {round(row["p_value"] * 200, 3) % 1 for row in linear} == {0.0}
            # FT's embedding layer is ORIG's but for a few steps: above chance even against whole-sentence swaps.
            embedding = next(row for row in linear if row["comparison"] == "FT–ORIG" and row["x_layer"] == 0
                             and row["y_layer"] == 0)
            assert embedding["p_value"] == pytest.approx(1 / 200) and embedding["p_adjusted"] < 0.05
    # CLS at the embedding layer is the same for every example: undefined, null, never NaN.
    assert similarity["cls"]["linear_cka"]["orig_orig"]["diagonal"]["layer_00"] is None
    assert similarity["attention"]["jensen_shannon"]["ft_ft"]["diagonal"]["layer_01"] == pytest.approx(1.0)
    assert "layer_00" not in similarity["attention"]["jensen_shannon"]["ft_ft"]["diagonal"]
    localization = json.loads((root / f"plots/localization/{TASK}/curves/localization.json").read_text())
    assert {row["model"] for row in localization} == {"ORIG", "FT[1]", "FT[2]"}  # not the random-init control
    # One row per trained model, pooling and defined layer (CLS at the embedding layer is not), the details' value.
    assert sorted((row["model"], row["pooling"], row["layer"]) for row in localization) == sorted(
        (model, pooling, layer) for model in ("ORIG", "FT[1]", "FT[2]") for pooling, layers in
        (("cls", (1, 2, 3)), ("tokens", (0, 1, 2, 3))) for layer in layers)
    for row in localization:
        assert row["series"] == f"{row['model']} {row['pooling']}"
        expected = similarity[row["pooling"]]["localization"][row["model"]][f"layer_{row['layer']:02d}"]
        assert row["localization"] == pytest.approx(expected, abs=1e-6)


def test_compare_stacks_base_fine_tuned_and_other_encoders(project):
    root, _ = project
    compare = _details(root, "compare")
    assert set(compare) == {"cls", "tokens", "attention"}
    linear = compare["tokens"]["linear_cka"]
    # Same depth as the base model: a per-layer diagonal; the other encoders too (tiny ones have 3 layers).
    assert set(linear) == {"RANDOM", f"FT:{TASK}", "tiny-roberta", "tiny-roberta (random init)", "correction"} and linear["correction"] == "fdr_bh"
    assert set(linear[f"FT:{TASK}"]["diagonal"]) == {"layer_00", "layer_01", "layer_02", "layer_03"}
    # Every diagonal value carries the null's mean and p-value.
    assert set(linear["tiny-roberta"]["p_value"]) == {"layer_00", "layer_01", "layer_02", "layer_03"}
    # Wu et al.'s localization averages over trained models only, not the random-init controls.
    assert set(compare["tokens"]["localization"]) == {"ORIG", f"FT:{TASK}", "tiny-roberta"}
    # Attention is compared only between models that share the base model's tokenizer.
    attention = compare["attention"]["jensen_shannon"]
    assert set(attention) == {"RANDOM", f"FT:{TASK}", "correction"}
    assert sorted(attention[f"FT:{TASK}"]["diagonal"]) == ["layer_01", "layer_02", "layer_03"]
    # The similarity stage's attention null and bootstrap (issue 63): every layer against ORIG's with its p-value and
    # interval, and what the null moved (whole examples of equal length).
    for key in ("p_value", "null_mean", "ci_low", "ci_high"):
        assert sorted(attention[f"FT:{TASK}"][key]) == ["layer_01", "layer_02", "layer_03"]
    assert compare["attention"]["null_unit"]["movable"] > 0
    plots = root / "plots/compare"
    for name in ("cls.linear_cka.png", "tokens.neuronsim.png", "attention.jensen_shannon.png"):
        assert_figure(plots / name)
    assert_figure(root / "plots/localization/compare/tokens.png")
    rows = json.loads((plots / "matrices.json").read_text())
    assert {row["comparison"] for row in rows} >= {"ORIG vs tiny-roberta", f"FT:{TASK} vs ORIG"}
    between = [row for row in rows if row["pooling"] == "attention" and row["measure"] == "Jensen–Shannon attention"
               and row["comparison"].split(" vs ")[0] != row["comparison"].split(" vs ")[1]]
    assert between and all(0 < row["p_value"] <= 1 and row["p_adjusted"] >= row["p_value"] for row in between)
    # Wu et al.'s localization, re-derived from the stacked matrices' plot rows: per trained model's layer, the mean
    # neuronsim to every other layer of the trained models (the random-init controls left out) minus the mean SVCCA.
    trained = ("ORIG", f"FT:{TASK}", "tiny-roberta")
    expected = {}
    for pooling in ("cls", "tokens"):
        cell = {}
        for row in rows:  # "row model vs column model"; y_layer is the row model's layer (reporting.plots.stacked_rows)
            if row["pooling"] == pooling and row["measure"] in ("neuronsim", "SVCCA"):
                first, second = row["comparison"].split(" vs ")
                cell[row["measure"], (first, row["y_layer"]), (second, row["x_layer"])] = row["similarity"]
        points = sorted({point for _, point, _ in cell if point[0] in trained})
        for point in points:
            neuron, sv = ([cell[measure, point, other] for other in points
                           if other != point and (measure, point, other) in cell] for measure in ("neuronsim", "SVCCA"))
            expected[point[0], pooling, point[1]] = np.mean(neuron) - np.mean(sv)
    localization = json.loads((root / "plots/localization/compare/localization.json").read_text())
    got = {(row["model"], row["pooling"], row["layer"]): row["localization"] for row in localization}
    assert got.keys() == expected.keys() and {model for model, _, _ in got} == set(trained)
    assert [got[key] for key in expected] == pytest.approx(list(expected.values()), abs=1e-5)
    assert json.loads((root / "data/compare/models/models.json").read_text()) == ["tiny-roberta"]


def test_align_reports_every_method_layer_and_reference(project):
    root, _ = project
    align = _details(root, "align", TASK)
    methods = {"linear", "cca", "svcca", "pwcca", "inn", "mlp"}
    assert align["pooling"] == "mean" and align["train_rows"] == 100 and align["validation_rows"] == 60
    assert align["table_precision"] == "float16"  # params.yaml's auto for example rows (layersim.data.io.stored)
    assert list(align["alignment"]) == ["FT[1]→FT[2]", "ORIG→FT[1]", "tiny-bert-seed1→tiny-bert-seed2",
                                        "tiny-bert-seed2→ORIG"]
    grouped = align["alignment_over_pairs"]
    assert list(grouped) == ["finetuning_seeds", "finetuning", "pretrained_models"]
    assert grouped["pretrained_models"]["pairs"] == "tiny-bert-seed1→tiny-bert-seed2; tiny-bert-seed2→ORIG"
    assert grouped["pretrained_models"]["num_pairs"] == 2
    for method in methods:  # mean ± sd over the two pretrained pairs, layer by layer
        both = [list(align["alignment"][pair][method].values()) for pair in grouped["pretrained_models"]["pairs"].split("; ")]
        stats = grouped["pretrained_models"][method]
        assert list(stats["mean"].values()) == pytest.approx([(a + b) / 2 for a, b in zip(*both)], abs=2e-6)
        assert list(stats["sd"].values()) == pytest.approx([abs(a - b) / 2 ** 0.5 for a, b in zip(*both)], abs=2e-6)
        assert grouped["finetuning"][method]["sd"] == {f"layer_{k:02d}": 0.0 for k in range(4)}
    assert json.loads((root / "data/align/models/models.json").read_text()) == ["tiny-bert-seed1", "tiny-bert-seed2",
                                                                               "tiny-bert"]
    # Attention weights (Ren Fig. 4 / 5b) for every pair, registry models (MultiBERTs' stand-ins) included,
    # layers 1…L.
    attention = align["attention_alignment"]
    assert list(attention) == ["FT[1]→FT[2]", "ORIG→FT[1]", "tiny-bert-seed1→tiny-bert-seed2",
                               "tiny-bert-seed2→ORIG"]
    assert min(attention["tiny-bert-seed1→tiny-bert-seed2"]["linear"].values()) > 0  # models of other init seeds
    for per_method in attention.values():
        assert set(per_method) == methods
        assert all(sorted(per_layer) == ["layer_01", "layer_02", "layer_03"] and min(per_layer.values()) >= 0
                   for per_layer in per_method.values())
    for per_method in align["alignment"].values():
        assert set(per_method) == methods
        for per_layer in per_method.values():
            assert sorted(per_layer) == ["layer_00", "layer_01", "layer_02", "layer_03"]
            assert all(value >= 0 for value in per_layer.values())
    assert set(align["synthetic_recovery"]) == methods
    assert align["synthetic_rows"] == 160  # every train and validation row: fewer than align.synthetic_rows
    linear_family = [align["synthetic_recovery"][m] for m in ("linear", "cca", "svcca", "pwcca")]
    assert align["synthetic_linear_over_inn"] == pytest.approx(min(linear_family) / align["synthetic_recovery"]["inn"],
                                                               abs=2e-3)
    injection = align["injection"]
    assert injection["pair"] == "FT[1]→FT[2]" and set(injection["methods"]) == methods
    finetuned = json.loads((root / f"metrics/finetune/{TASK}/seed2/metrics.json").read_text())["accuracy"]
    # FT[2]'s own CLS state fed back into its head is FT[2] itself: the fine-tuning score.
    assert injection["references"]["FT[2] itself"] == pytest.approx(finetuned, abs=1e-6)
    for name in ("errors.png", "synthetic.png", "layer_matrix.png", "injection.png"):
        assert_figure(root / f"plots/align/{TASK}/{name}")
    rows = json.loads((root / f"plots/align/{TASK}/errors.json").read_text())
    assert len(rows) == 4 * 4 * len(methods)


def test_truncate_and_skip_agree_with_the_fine_tuned_models(project):
    root, _ = project
    finetuned = [json.loads((root / f"metrics/finetune/{TASK}/seed{seed}/metrics.json").read_text())["accuracy"]
                 for seed in SEEDS]
    truncate = _details(root, "truncate", TASK)
    assert truncate["metric"] == "accuracy"
    assert truncate["head_train_rows"] == 100 and truncate["table_precision"] == "float16"  # as align's maps saw
    # Exiting after the last layer is the full model: the same score the finetune stage measured.
    assert truncate["full"] == pytest.approx(sum(finetuned) / len(finetuned), abs=1e-6)
    assert truncate["untuned"]["layer_03"] == pytest.approx(truncate["full"], abs=1e-6)
    for variant in ("untuned", "tuned", "tuned_orig"):
        assert sorted(truncate[variant]) == ["layer_00", "layer_01", "layer_02", "layer_03"]
    # The plot rows: one per variant, seed and exit layer 0..3 (the model's 3 layers and the embeddings); the details
    # hold their seed means, and the untuned exit after the last layer is each seed's own fine-tuned model.
    rows = _json(root, f"plots/truncate/{TASK}/truncate.json")
    variants = ("untuned", "tuned", "tuned_orig")
    assert sorted((row["variant"], row["seed"], row["layer"]) for row in rows) == sorted(
        (variant, seed, layer) for variant in variants for seed in SEEDS for layer in range(4))
    for row in rows:
        assert row["series"] == f"{row['variant']} seed {row['seed']}"
        assert row["converged"] == (row["seed"] not in _flagged_seeds(root))
        if row["variant"] == "untuned" and row["layer"] == 3:
            assert row["score"] == pytest.approx(finetuned[SEEDS.index(row["seed"])], abs=1e-6)
    for variant in variants:
        for layer in range(4):
            scores = [row["score"] for row in rows if row["variant"] == variant and row["layer"] == layer]
            assert truncate[variant][f"layer_{layer:02d}"] == pytest.approx(np.mean(scores), abs=2e-6)
    tolerance = _params(root)["truncate"]["tolerance"]
    assert truncate["tolerance"] == tolerance
    for variant in ("untuned", "tuned"):
        droppable = droppable_top_layers(rows, variant, truncate["full"], tolerance)
        assert truncate[f"droppable_top_layers_{variant}"] == droppable, variant
    skip = _details(root, "skip", TASK)
    assert sorted(skip["spans"]) == ["1-1", "1-2", "1-3", "2-2", "2-3", "3-3"]
    assert skip["full"] == pytest.approx(truncate["full"], abs=1e-6)
    # One row per seed and span [first, last] of the 3 layers; the details hold the seed means.
    spans = [(first, last) for first in (1, 2, 3) for last in range(first, 4)]
    rows = _json(root, f"plots/skip/{TASK}/skip.json")
    assert sorted((row["seed"], row["first"], row["last"]) for row in rows) == sorted(
        (seed, *span) for seed in SEEDS for span in spans)
    mean = {span: np.mean([row["score"] for row in rows if (row["first"], row["last"]) == span]) for span in spans}
    assert [skip["spans"][f"{first}-{last}"] for first, last in spans] == pytest.approx(
        [mean[span] for span in spans], abs=2e-6)
    singles = {first: mean[first, last] for first, last in spans if first == last}
    assert singles[skip["worst_single_layer"]["layer"]] == pytest.approx(min(singles.values()), abs=2e-6)
    longest = longest_skippable_span(rows, skip["full"], _params(root)["skip"]["tolerance"])
    assert (skip["largest_span_within_tolerance"] or {"length": 0})["length"] == longest
    for stage in ("truncate", "skip"):
        assert_figure(root / f"plots/{stage}/{TASK}/{stage}.png")


def test_export_writes_a_plain_checkpoint_that_keeps_the_score(project, tmp_path):
    """The exported model loads with transformers alone, has the layers it names, scores on validation what
    truncate / skip measured for that choice (first seed), and its choice is within tolerance on the train
    examples it was made on."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    root, state = project
    export = _details(root, "export", TASK)
    exported, full = export["exported"], export["full"]
    folder = root / f"data/export/{TASK}/model"
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    kept = str(exported["kept_layers"]).split(",")
    assert model.config.num_hidden_layers == exported["layers"] == len(kept) <= full["layers"] == 3
    assert exported["train"] >= full["train"] - export["tolerance"]
    finetuned = _finetuned(root, SEEDS[0])["accuracy"]
    assert full["validation"] == pytest.approx(finetuned, abs=1e-6)
    if exported["skipped_first"]:
        first, last = exported["skipped_first"], exported["skipped_last"]
        measured = {(r["first"], r["last"]): r["score"] for r in json.loads((root / f"plots/skip/{TASK}/skip.json").read_text())
                    if r["seed"] == SEEDS[0]}[(first, last)]
    else:
        measured = {r["layer"]: r["score"] for r in json.loads((root / f"plots/truncate/{TASK}/truncate.json").read_text())
                    if r["seed"] == SEEDS[0] and r["variant"] == "untuned"}[exported["exit_layer"]]
    assert exported["validation"] == pytest.approx(measured, abs=1e-6)
    # Re-scored here as a user would: its own tokenizer, one padded batch, argmax.
    tokenizer = AutoTokenizer.from_pretrained(folder)
    validation = pq.read_table(root / f"data/tasks/{TASK}/splits/validation.parquet").to_pydict()
    rescored = rescored_accuracy(folder, validation)
    assert rescored == pytest.approx(exported["validation"], abs=1e-6)
    assert "speedup" not in export  # wall clock: in timings/, outside every output DVC hashes
    # The timings file, from a run of the command (in a copy of the project when the first repro restored the stage
    # from the shared run-cache): each batch size's median seconds per batch of both models, and the speed-up, full
    # over exported, from them (each rounded to 6 digits: the ratio within what the rounding allows).
    timings = json.loads(command_output(root, state["env"], f"export@{TASK}", f"timings/export/{TASK}.json",
                                        tmp_path).read_text())
    assert sorted(timings["speedup"]) == sorted(timings["timing"]) == ["batch_1", "batch_32"]
    for size, speedup in timings["speedup"].items():
        seconds = {name: timings["timing"][size][name]["seconds_per_batch"] for name in ("full", "exported")}
        assert min(seconds.values()) > 0 and min(v["examples_per_second"] for v in timings["timing"][size].values()) > 0
        low = (seconds["full"] - 5e-7) / (seconds["exported"] + 5e-7)
        high = (seconds["full"] + 5e-7) / (seconds["exported"] - 5e-7)
        assert low - 5e-4 <= speedup <= high + 5e-4, (size, speedup, seconds)
    assert model.config.id2label == {0: "negative", 1: "positive"} and tokenizer.model_max_length == 32
    # The headline, from the reloaded model, the finetune stage's score and the re-scoring above.
    headline = json.loads((root / f"metrics/export/{TASK}/metrics.json").read_text())
    assert headline.keys() == {"layers", "full_layers", "validation_full", "validation_exported"}
    assert headline["layers"] == model.config.num_hidden_layers and headline["full_layers"] == 3
    assert headline["validation_full"] == pytest.approx(finetuned, abs=1e-6)
    assert headline["validation_exported"] == pytest.approx(rescored, abs=1e-6)
    assert_figure(root / f"plots/export/{TASK}/export.png")


def test_report_is_one_offline_page_that_states_the_stage_results(project):
    root, _ = project
    page = (root / "report/index.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "http" not in page  # nothing to fetch
    assert f"tasks {TASK};" in page and f'<h2 id="{TASK}">{TASK}</h2>' in page  # in the intro, and its section
    # Every figure of the task's section and the summary's, embedded as the stage wrote it, and the truncation
    # curves (redrawn with the exported model's exit): one image each.
    figures = [f"similarity/{TASK}/heatmaps/cls.png", f"diagonals/{TASK}/curves/cls.png",
               f"similarity/{TASK}/heatmaps/tokens.png", f"similarity/{TASK}/heatmaps/attention.png",
               f"diagonals/{TASK}/curves/attention.png", f"export/{TASK}/export.png", f"skip/{TASK}/skip.png",
               f"align/{TASK}/errors.png", f"freeze/{TASK}/freeze.png", f"weights/{TASK}/intruders.png",
               f"dynamics/{TASK}/dynamics.png", f"grounding/{TASK}/ranking/grounding.png", "summary/last_block.png"]
    for figure in figures:
        assert base64.b64encode((root / "plots" / figure).read_bytes()).decode("ascii") in page, figure
    assert len(re.findall(r'src="data:image/png;base64,', page)) == len(figures) + 1
    assert "Attention maps layer against layer; hatched cells: not above chance" in page  # their own null
    export = _details(root, "export", TASK)
    assert f"{export['exported']['layers']} / {export['full']['layers']}" in page
    assert f"{export['exported']['parameters'] / export['full_parameters']:.0%}" in page
    top = _details(root, "similarity", TASK)["cls"]["linear_cka"]["ft_orig"]
    assert f"{top['last_layer']:.3f} (null {top['null_mean']['layer_03']:.3f})" in page


def test_freeze_scores_each_configuration_next_to_the_unfrozen_run(project, tmp_path):
    """Wu et al. Table 1 on the 3-layer tiny model: layers [4, 6] of 12 become 1 and 2 of 3."""
    root, state = project
    freeze = _details(root, "freeze", TASK)
    assert freeze["metric"] == "accuracy" and freeze["num_layers"] == 3
    finetuned = {seed: _finetuned(root, seed) for seed in SEEDS}
    assert freeze["unfrozen"]["score"] == pytest.approx(np.mean([m["accuracy"] for m in finetuned.values()]), abs=1e-6)
    assert "train_seconds" not in freeze["unfrozen"]  # wall clock: in timings/, outside every output DVC hashes
    labels = ("bottom1", "bottom2", "top1", "top2")
    check_freeze_outputs(root, TASK, labels, examples=60,
                         unfrozen={seed: metrics["accuracy"] for seed, metrics in finetuned.items()})
    # The timings file, from a run of the command (in a copy of the project when the first repro restored the stage
    # from the shared run-cache): freeze.timing_rounds blocks of freeze.timing_steps steps per configuration, and
    # each frozen one's time ratio the median over rounds of its block's seconds over the unfrozen block's.
    settings = _params(root)["freeze"]
    timings = json.loads(command_output(root, state["env"], f"freeze@{TASK}", f"timings/freeze/{TASK}.json",
                                        tmp_path).read_text())
    assert set(timings) == {"block_steps", "unfrozen", *labels} and timings["block_steps"] == settings["timing_steps"]
    unfrozen = timings["unfrozen"]["block_seconds"]
    assert len(unfrozen) == settings["timing_rounds"] and min(unfrozen) > 0
    for label in labels:
        seconds = timings[label]["block_seconds"]
        assert len(seconds) == settings["timing_rounds"] and min(seconds) > 0
        ratios = [t / u for t, u in zip(seconds, unfrozen)]
        # The seconds are rounded to 0.1 ms: each ratio is off by at most this much, and so is their median.
        slack = max(r * (5e-5 / t + 5e-5 / u) for r, t, u in zip(ratios, seconds, unfrozen)) * 1.01 + 5e-5
        assert abs(timings[label]["time_ratio"] - float(np.median(ratios))) <= slack, (label, timings[label], slack)
        assert timings[label]["steps_per_second_ratio"] == pytest.approx(1 / timings[label]["time_ratio"], rel=1e-3)
    # The FLOPs saved, counted: freezing the top k layers skips only their weight gradients, k times one layer's;
    # freezing the bottom k also skips the gradient flowing into them and into the embeddings, so saves more.
    saved = {label: freeze[label]["backward_flops_saved"] for label in labels}
    assert 0 < saved["top1"] < saved["top2"] < saved["bottom2"] < 1
    assert saved["top1"] < saved["bottom1"] < saved["bottom2"]
    assert saved["top2"] == pytest.approx(2 * saved["top1"], abs=2e-6)
    assert_figure(root / f"plots/freeze/{TASK}/freeze.png")


def test_weights_compares_every_seeds_matrices_with_the_pretrained_ones(project):
    """The weights stage (issue 52): one row per (run, layer, matrix role), the full fine-tuning runs and the LoRA
    runs of finetune.compare_methods. Full: every matrix moved, at more than LoRA's rank. LoRA (rank 2, query and
    value): each adapted matrix's update has rank ≤ 2 and the others did not move at all (merged adapters only)."""
    root, _ = project
    rows = json.loads((root / f"plots/weights/{TASK}/changes.json").read_text())
    roles = ("query", "key", "value", "attention_output", "intermediate", "output")
    assert sorted((row.get("method", "full"), row["seed"], row["layer"], row["matrix"]) for row in rows) == sorted(
        (method, seed, layer, role) for method in ("full", "lora") for seed in SEEDS for layer in (1, 2, 3)
        for role in roles)
    full = [row for row in rows if "method" not in row]
    lora = [row for row in rows if row.get("method") == "lora"]
    for row in full:
        assert row["series"] == f"FT[{SEEDS.index(row['seed']) + 1}] {row['matrix']}" and row["adapted"]
        assert 0 <= row["intruders"] <= 10 and row["update_rank"] >= 1 and row["relative_update_norm"] > 0
    assert max(row["update_rank"] for row in full) > 8  # full fine-tuning's update is not low-rank
    for row in lora:
        assert row["series"] == f"LoRA[{SEEDS.index(row['seed']) + 1}] {row['matrix']}"
        assert row["adapted"] == (row["matrix"] in ("query", "value"))
        if row["adapted"]:
            assert 1 <= row["update_rank"] <= 2 and row["relative_update_norm"] > 0
        else:
            assert row["update_rank"] == 0 and row["relative_update_norm"] == 0 and row["intruders"] == 0
    # Each relative update norm, ‖W_ft − W_pre‖_F / ‖W_pre‖_F, from the two safetensors files in plain numpy (BERT's
    # names for the six roles; layer k is encoder layer k - 1); the update's rank at most the matrix's smaller side,
    # and a LoRA update's numerical rank (numpy's SVD, float32 tolerance) what the row says.
    from safetensors.numpy import load_file

    names = {"query": "attention.self.query", "key": "attention.self.key", "value": "attention.self.value",
             "attention_output": "attention.output.dense", "intermediate": "intermediate.dense",
             "output": "output.dense"}

    def matrix(weights: dict, layer: int, role: str) -> np.ndarray:
        name = f"encoder.layer.{layer - 1}.{names[role]}.weight"
        return next(value for key, value in weights.items() if key == name or key.endswith(f".{name}")).astype(float)

    pretrained = load_file(root / "data/models/tiny-bert/pretrained/model.safetensors")
    folders = {(row.get("method"), row["seed"]) for row in rows}
    finetuned = {(method, seed): load_file(root / f"data/checkpoints/{TASK}/"
                                           f"{method + '/' if method else ''}seed{seed}/model/model.safetensors")
                 for method, seed in folders}
    for row in rows:
        before = matrix(pretrained, row["layer"], row["matrix"])
        after = matrix(finetuned[row.get("method"), row["seed"]], row["layer"], row["matrix"])
        norm = np.linalg.norm(after - before) / np.linalg.norm(before)
        assert row["relative_update_norm"] == pytest.approx(norm, abs=2e-6), row
        assert row["update_rank"] <= min(before.shape), row
        if row.get("method") == "lora" and row["adapted"]:
            singular = np.linalg.svd(after - before, compute_uv=False)
            assert int((singular > singular[0] * 1e-3).sum()) <= 2, row
    # The headline, from the rows: full fine-tuning's every matrix adapted, none frozen; LoRA's under `compared`;
    # each count beside what the rotated-update null expects (the rows' means) and its p; the roles both adapted.
    headline = json.loads((root / f"metrics/weights/{TASK}/metrics.json").read_text())
    assert headline["method"] == "full" and headline["shared_roles"] == ["query", "value"]
    assert list(headline["compared"]) == ["lora"] and "intruders_per_frozen_matrix" not in headline
    draws = _params(root)["weights"]["null_draws"]
    for found, runs in ((headline, full), (headline["compared"]["lora"], lora)):
        adapted = [row for row in runs if row["adapted"]]
        shared = [row for row in adapted if row["matrix"] in ("query", "value")]
        assert found["intruders_per_adapted_matrix"] == pytest.approx(_mean(r["intruders"] for r in adapted), abs=2e-6)
        assert found["intruders_per_adapted_matrix_null"] == pytest.approx(
            _mean(r["intruders_null_mean"] for r in adapted), abs=2e-6)
        assert found["intruders_per_shared_role_matrix"] == pytest.approx(_mean(r["intruders"] for r in shared),
                                                                          abs=2e-6)
        assert 1 / (draws + 1) <= found["intruders_p_value"] <= 1 and 0 < found["intruders_shared_roles_p_value"] <= 1
        assert sorted(found["by_role"]) == sorted({r["matrix"] for r in adapted})  # the file's keys are sorted
        for role, test in found["by_role"].items():
            chosen = [r for r in adapted if r["matrix"] == role]
            assert test["matrices"] == len(chosen) and 0 < test["p_value"] <= 1
            assert test["intruders_per_matrix"] == pytest.approx(_mean(r["intruders"] for r in chosen), abs=2e-6)
        assert found["max_relative_update_norm"] == max(row["relative_update_norm"] for row in runs)
        assert found["max_update_rank_adapted"] == max(row["update_rank"] for row in adapted)
        assert all(0 <= r["intruders_p_value"] <= 1 and r["intruders_null_mean"] >= 0 for r in adapted)
    assert headline["compared"]["lora"]["intruders_per_frozen_matrix"] == 0.0
    # Every per-matrix value in the details: run label → role → value → layer.
    details = _details(root, "weights", TASK)
    for row in rows:
        entry = details[row["run"]][row["matrix"]]
        assert entry["intruders"][f"layer_{row['layer']:02d}"] == row["intruders"]
    assert_figure(root / f"plots/weights/{TASK}/intruders.png", min_size=(600, 300))


def test_compared_method_runs_reach_similarity_with_nulls_and_intervals(project):
    """finetune.compare_methods (issue 52): finetune_compared wrote each LoRA run's checkpoint and metrics beside the
    full runs', extract its validation tables only (no train tables: only similarity reads them), and similarity
    compares LoRA with ORIG and with FT in the same heatmap set, each diagonal with its null and interval."""
    root, _ = project
    for seed in SEEDS:
        info = json.loads((root / f"data/checkpoints/{TASK}/lora/seed{seed}/model/layersim_model.json").read_text())
        assert info["method"] == "lora" and info["seed"] == seed and info["source"] == "finetune"
        metrics = json.loads((root / f"metrics/finetune/{TASK}/lora/seed{seed}/metrics.json").read_text())
        assert "converged" in metrics["convergence"] and metrics.keys() > {"accuracy"}
        tables = root / f"data/activations/tiny-bert/{TASK}/tables"
        assert ActivationTable(tables / f"lora-seed{seed}.cls.parquet").metadata["run"] == f"lora-seed{seed}"
        assert not list((tables / "train").glob(f"lora-seed{seed}.*"))
    details = _details(root, "similarity", TASK)
    for pooling in ("cls", "tokens"):
        result = details[pooling]["linear_cka"]
        for key in ("lora_orig", "lora_ft"):
            entry = result[key]
            layers = sorted(entry["diagonal"])
            assert len(layers) == 4 and sorted(entry["p_value"]) == layers and sorted(entry["null_mean"]) == layers
            for layer in layers:  # undefined where FT–ORIG is (the CLS token's embedding is one constant vector)
                p_value, reference = entry["p_value"][layer], result["ft_orig"]["p_value"][layer]
                assert (p_value is None) == (reference is None) and (p_value is None or 0 <= p_value <= 1)
        assert sorted(result["lora_orig"]["seed_values"]) == ["LoRA[1]", "LoRA[2]"]
        assert sorted(result["lora_orig"]["ci_low"]) == sorted(result["lora_orig"]["diagonal"])
    headline = json.loads(stage_metrics(root / "metrics", "similarity", TASK).read_text())
    assert headline["cls"]["linear_cka"]["lora_orig_top"] == details["cls"]["linear_cka"]["lora_orig"]["last_layer"]
    page = (root / "report/index.html").read_text()
    assert "LoRA–ORIG" in page and "LoRA–FT" in page
    # LoRA's scores and convergence beside the full runs', and the weights' counts against their null.
    assert "LoRA fine-tuning (finetune.compare_methods) accuracy: seed 1 " in page
    assert "weights: intruder dimensions against a structureless update of the same size" in page


def test_dynamics_follow_every_kept_state_from_orig_to_the_final_model(project):
    """The finetune stage kept the states of steps 2 and 4 (keep_states 2 of 6 steps); the dynamics stage compares
    every point (ORIG at step 0, the states, the final model at 6) with ORIG and the final model, per layer: one row
    per seed × point × reference per layer file, ORIG at step 0 and the final model at the end equal to themselves."""
    root, _ = project
    for seed, folder in [(seed, folder) for seed in SEEDS for folder in (f"seed{seed}", f"lora/seed{seed}")]:
        states = root / f"data/states/{TASK}/{folder}/states"
        assert sorted(p.name for p in states.iterdir()) == ["states.json", "step2", "step4"]
        assert json.loads((states / "states.json").read_text())["steps"] == [2, 4]
    curves = root / f"plots/dynamics/{TASK}/curves"
    assert sorted(p.name for p in curves.iterdir()) == [f"layer_{k:02d}.json" for k in range(4)]
    for layer in range(4):
        rows = json.loads((curves / f"layer_{layer:02d}.json").read_text())
        # finetune.method's runs and the LoRA runs of finetune.compare_methods, each kept its states
        assert sorted((r["run"], r["seed"], r["step"], r["reference"]) for r in rows) == sorted(
            (f"{kind}[{i}]", seed, step, reference) for kind in ("FT", "LoRA") for i, seed in enumerate(SEEDS, start=1)
            for step in (0, 2, 4, 6) for reference in ("ORIG", "final"))
        for row in rows:
            assert row["layer"] == layer and row["series"] == f"{row['run']} (seed {row['seed']}) to {row['reference']}"
            if layer == 0:  # the CLS token's embedding is the same for every example: no similarity
                assert row["linear_cka"] is None
                continue
            if (row["step"], row["reference"]) in ((0, "ORIG"), (6, "final")):
                assert row["linear_cka"] == pytest.approx(1.0, abs=1e-6)
            assert 0.0 <= row["linear_cka"] <= 1.0 + 1e-6 and 0.0 <= row["p_value"] <= 1.0
            assert 0.0 <= row["null_mean"] < row["linear_cka"] and row["ci_low"] <= row["ci_high"]
    details = _details(root, "dynamics", TASK)
    assert details["pooling"] == "cls" and details["rows"] == 60
    assert details["seed1"]["to_orig"]["step6"]["linear_cka"]["layer_03"] == pytest.approx(
        _details(root, "similarity", TASK)["cls"]["linear_cka"]["ft_orig"]["diagonal"]["layer_03"], abs=1e-6)
    headline = json.loads((root / f"metrics/dynamics/{TASK}/metrics.json").read_text())
    assert headline["points"] == 4 and headline["pooling"] == "cls"
    # interpolated between the kept points (0, 2, 4, 6), a mean over the seeds with its sd and the grid beside it;
    # absent where no seed's top layer moved
    halves = [details[f"seed{seed}"]["half_way_step"]["layer_03"] for seed in SEEDS]
    found = [h for h in halves if h is not None]
    assert all(0 < h <= 6 for h in found)
    assert headline.get("top_layer_half_way_step") == (pytest.approx(np.mean(found), abs=2e-6) if found else None)
    if found:
        assert headline["top_layer_half_way_grid"] == 2
        assert ("top_layer_half_way_step_sd" in headline) == (len(found) >= 2)
    # the per-point p-values are adjusted as one family; the points that are their reference are no test
    assert details["family"]["correction"] == "fdr_bh" and details["family"]["tests"] > 0
    assert details["seed1"]["to_orig"]["step0"]["p_adjusted"]["layer_03"] is None
    assert details["seed1"]["to_orig"]["step2"]["p_adjusted"]["layer_03"] >= details["seed1"]["to_orig"]["step2"][
        "p_value"]["layer_03"]
    # Beside it, the size of the move: the top layer's final 1 − CKA to ORIG, mean over each method's seeds.
    for found, prefix in ((headline, "seed"), (headline["compared"]["lora"], "lora-seed")):
        assert found["top_layer_final_distance"] == pytest.approx(_mean(
            1 - details[f"{prefix}{seed}"]["to_orig"]["step6"]["linear_cka"]["layer_03"] for seed in SEEDS), abs=2e-6)
    assert (root / f"plots/dynamics/{TASK}/dynamics.png").read_bytes()[:4] == b"\x89PNG"


def test_grounding_ranks_every_measure_of_each_pooling_on_both_tests(project):
    """The grounding stage (enabled in this project): per pooling, every measure of similarity.measures with its
    layer monotonicity per trained run (the random-init control beside it) and its seeds-vs-fine-tuning AUPRC per
    layer, ranked; the table on the report page."""
    root, _ = project
    details = _details(root, "grounding", TASK)
    params = yaml.safe_load((root / "params.yaml").read_text())
    rows = json.loads((root / f"plots/grounding/{TASK}/ranking/ranking.json").read_text())
    assert details["enabled"] is True
    for pooling, measures in params["similarity"]["measures"].items():
        for measure in measures:
            entry = details[pooling][measure]
            assert set(entry["monotonicity"]["per_run"]) == {"ORIG", "FT[1]", "FT[2]"}  # LoRA's runs left out
            assert "random_control" in entry["monotonicity"]
            assert len(entry["separation"]["per_layer"]) == 3 + 1  # tiny-bert: embeddings and 3 layers
            # One seed pair, two FT–ORIG pairs: the seed pair at rank 1, 2 or 3 by chance.
            assert entry["separation"]["chance"] == pytest.approx((1 + 1 / 2 + 1 / 3) / 3, abs=1e-6)
        ranked = [row for row in rows if row["pooling"] == pooling]
        assert sorted(row["measure"] for row in ranked) == sorted(measures)
        assert [row["place"] for row in ranked] == list(range(1, len(measures) + 1))
    headline = json.loads((root / f"metrics/grounding/{TASK}/metrics.json").read_text())
    assert headline == {pooling: {m: details[pooling][m]["rank"]["mean_rank"] for m in measures}
                        for pooling, measures in params["similarity"]["measures"].items()}
    assert "Which measure to trust on this model" in (root / "report/index.html").read_text()


def test_second_repro_has_nothing_to_do(project):
    root, state = project
    out = run(dvc("repro"), root, state["env"])
    assert "Running stage" not in out.stdout
    status = run(dvc("status"), root, state["env"])
    assert "up to date" in status.stdout.lower()


def test_metrics_are_visible_to_dvc(project):
    root, state = project
    listed = run(dvc("metrics", "show", "--json"), root, state["env"])
    shown = json.loads(listed.stdout)
    workspace = json.dumps(shown)
    assert "failed to load" not in listed.stderr  # a non-metrics file in a metrics folder (timings/README.md was one)
    assert "timings/finetune" in workspace  # the training seconds, a folder listed under dvc.yaml's metrics
    assert f"metrics/similarity/{TASK}/metrics.json" in workspace and "ft_orig_top" in workspace
    assert "metrics/summary.json" in workspace and "inn_advantage" in workspace


def test_every_headline_key_written_is_in_the_documented_table(project):
    """docs/outputs.md's headline table (with what stands beside each key: tests/headline_docs.py) names every key of
    every metrics file the run wrote, the compared methods' and the pretrained models' included."""
    root, _ = project
    files = sorted(path.relative_to(root).as_posix() for path in (root / "metrics").rglob("*.json"))
    assert len(files) >= 14  # every stage's, the compared method's runs and align's pretrained models
    assert {file: undocumented(file, _json(root, file)) for file in files} == {file: [] for file in files}


MEASURE_LABELS = {"linear_cka": "linear CKA", "svcca": "SVCCA", "pwcca": "PWCCA", "neuronsim": "neuronsim",
                  "jensen_shannon": "Jensen–Shannon attention"}  # as the heatmaps' plot rows name them


def _similarity_headline(root: Path, significance: float) -> dict:
    """metrics/similarity/<task>/metrics.json as docs/outputs.md defines it, from the heatmaps' plot rows (FT–ORIG,
    FT–RANDOM and FT[1]–FT[2] of the first seed's model) and the details' per-seed values, with the headline claims'
    p-values (every defined FT–ORIG diagonal layer, and the top layer of FT[1]–FT[2], ORIG–RANDOM, FT–RANDOM, LoRA–ORIG
    and LoRA–FT, of every measure with a null and every pooling) Benjamini–Hochberg corrected here as one family."""
    details = _details(root, "similarity", TASK)
    measures = _params(root)["similarity"]["measures"]
    claims = []  # (pooling, measure, comparison key, layer, whether the top layer, raw p)
    expected: dict = {}
    for pooling in (*measures, "attention"):
        rows = _json(root, f"plots/similarity/{TASK}/heatmaps/{pooling}.json")
        names = measures.get(pooling, ["jensen_shannon"])
        for measure in names:
            label = MEASURE_LABELS[measure]
            diagonal = {key: heatmap_diagonal(rows, comparison, label) for key, comparison in
                        (("ft_orig", "FT–ORIG"), ("ft1_ft2", "FT[1]–FT[2]"), ("ft_random", "FT–RANDOM"))}
            top = max(diagonal["ft_orig"])
            seeds = details[pooling][measure]["ft_orig"]["seed_values"]
            assert seeds["FT[1]"][f"layer_{top:02d}"] == pytest.approx(diagonal["ft_orig"][top], abs=1e-6)
            per_seed = [values[f"layer_{top:02d}"] for values in seeds.values()]
            entry = {"ft_orig_top": diagonal["ft_orig"][top], "ft_orig_top_seed_mean": np.mean(per_seed),
                     "ft_orig_top_seed_range": max(per_seed) - min(per_seed),
                     "ft_orig_above_random_top": diagonal["ft_orig"][top] - diagonal["ft_random"][top]}
            # its paired bootstrap interval (the same resamples for both tops), for measures with an interval method
            above = details[pooling][measure].get("ft_orig_above_random")
            assert (above is not None) == (pooling != "attention" and AUTO_INTERVAL.get(measure) is not None)
            if above is not None:
                assert above["value"] == pytest.approx(entry["ft_orig_above_random_top"], abs=2e-6)
                assert above["ci_low"] < above["ci_high"] and above["ci_method"] == AUTO_INTERVAL[measure]
                entry |= {"ft_orig_above_random_top_ci_low": above["ci_low"],
                          "ft_orig_above_random_top_ci_high": above["ci_high"]}
            for key, comparison in (("lora_orig", "LoRA–ORIG"), ("lora_ft", "LoRA–FT")):  # finetune.compare_methods
                entry[f"{key}_top"] = heatmap_diagonal(rows, comparison, label)[top]
            # attention maps too: their null exchanges whole examples of equal length (attention_null)
            entry |= {"ft1_ft2_top": diagonal["ft1_ft2"][top], "ft_orig_chance_correction": "fdr_bh"}
            p_values = {(comparison, row["x_layer"]): row["p_value"] for row in rows if row["measure"] == label
                        and row["x_layer"] == row["y_layer"] for comparison in [row["comparison"]]}
            claims += [(pooling, measure, "ft_orig", layer, layer == top, p) for (comparison, layer), p
                       in sorted(p_values.items()) if comparison == "FT–ORIG" and p is not None]
            claims += [(pooling, measure, key, top, True, p_values[comparison, top]) for key, comparison in
                       (("ft1_ft2", "FT[1]–FT[2]"), ("orig_random", "ORIG–RANDOM"), ("ft_random", "FT–RANDOM"),
                        ("lora_orig", "LoRA–ORIG"), ("lora_ft", "LoRA–FT"))]  # compared methods': claims too
            expected.setdefault(pooling, {})[measure] = entry
    adjusted = _benjamini_hochberg([p for *_, p in claims])
    for (pooling, measure, key, layer, is_top, _), q in zip(claims, adjusted):
        entry = expected[pooling][measure]
        if key == "ft_orig" and q >= significance and entry.get("ft_orig_chance_from") is None:
            entry["ft_orig_chance_from"] = layer  # claims are in layer order
        if is_top:  # the plot rows' p-values are rounded to 6 digits, and BH multiplies them by up to the family size
            entry[f"{key}_top_p_adjusted"] = pytest.approx(q, abs=len(claims) * 1e-6)
    for pooling in (*measures, "attention"):
        for entry in expected[pooling].values():
            entry.setdefault("ft_orig_chance_from", None)
    expected["family"] = {"correction": "fdr_bh", "tests": len(claims)}
    return expected


def test_metrics_files_hold_their_headline_and_details_hold_the_rest(project):
    """Each metrics file holds its stage's headline as docs/outputs.md defines it, re-derived here from the stage's
    plot rows (and raw p-values); every value that is not in the metrics file is in the details; and the summary is
    the mean of the per-task headlines."""
    root, _ = project
    params = _params(root)
    similarity = _similarity_headline(root, params["similarity"]["significance"])
    # cls: 4 measures x (3 layers + 5 tops); tokens: 4 x (4 + 5); attention: 1 x (3 + 5), its null exchanging examples
    assert similarity["family"]["tests"] == 76
    full = _mean([_finetuned(root, seed)["accuracy"] for seed in SEEDS])
    truncate_rows = _json(root, f"plots/truncate/{TASK}/truncate.json")
    truncate = {variant: droppable_top_layers(truncate_rows, variant, full, params["truncate"]["tolerance"])
                for variant in ("untuned", "tuned")}
    # align: each method's held-out error (relative) over layers and the pairs of the first kind (fine-tuning seeds,
    # one pair), and the INN's advantage over the best other method.
    errors = _json(root, f"plots/align/{TASK}/errors.json")
    methods = ("linear", "cca", "svcca", "pwcca", "inn", "mlp")
    align = {method: _mean([row["relative_error"] for row in errors if row["kind"] == "finetuning_seeds"
                            and row["method"] == method]) for method in methods}
    align["inn_advantage"] = min(align[m] for m in methods if m != "inn") - align["inn"]
    # With align.pretraining_models: each method's error before and after fine-tuning, the mean over layers of the
    # details' per-layer means over pairs, and the injected scores (methods and references) as the details hold them.
    seeds = _details(root, "align", TASK)["pretraining_seeds"]
    pretraining = {f"{method}_{state}": _mean(seeds["alignment"][kind][method]["mean"].values())
                   for state, kind in (("before", "pretrained"), ("after", "finetuned")) for method in methods}
    pretraining |= {f"injected_{name.replace(' ', '_')}": value["mean"]
                    for name, value in {**seeds["injection"]["methods"], **seeds["injection"]["references"]}.items()}
    # compare: each model's mean over layers of its layer-k-against-ORIG's-layer-k similarity (cls, linear CKA).
    matrices = [row for row in _json(root, "plots/compare/matrices.json")
                if row["pooling"] == "cls" and row["measure"] == "linear CKA" and row["x_layer"] == row["y_layer"]]
    compared = ("RANDOM", f"FT:{TASK}", "tiny-roberta", "tiny-roberta (random init)")
    compare = {model: _mean([row["similarity"] for row in matrices if row["comparison"] == f"{model} vs ORIG"])
               for model in compared}
    skip_rows = _json(root, f"plots/skip/{TASK}/skip.json")
    skip = longest_skippable_span(skip_rows, full, params["skip"]["tolerance"])
    # skip's predictions: the within-length rho, the mean of the details' per-length Spearman rho weighted by spans - 1
    # (undefined lengths left out: fewer than 3 spans, or the measured seed-mean scores of the length all equal);
    # the random-layer baseline's seeded draws as the details hold them.
    prediction = _details(root, "skip", TASK)["prediction"]
    measured = {}
    for row in skip_rows:
        measured.setdefault(row["last"] - row["first"] + 1, {}).setdefault((row["first"], row["last"]), []).append(
            row["score"])
    skip_headline = {"longest_skippable_span": skip,
                     "skip_prediction_random_layer": prediction["baselines"]["random_layer"]["within_length"],
                     "skip_prediction_random_layer_high": prediction["baselines"]["random_layer"]["within_length_high"]}
    for suffix, predictor in (("angular", "angular_distance"), ("block_influence", "block_influence")):
        by_length = prediction[predictor]["by_length"]
        assert {f"length_{n}": by_length[f"length_{n}"]["spans"] for n in measured} == {
            f"length_{n}": len(spans) for n, spans in measured.items()} == {"length_1": 3, "length_2": 2, "length_3": 1}
        for n, spans in measured.items():
            if len(spans) < 3 or len({round(float(np.mean(scores)), 6) for scores in spans.values()}) == 1:
                assert by_length[f"length_{n}"]["spearman"] is None, (predictor, n)
        defined = [(entry["spearman"], entry["spans"] - 1) for entry in by_length.values()
                   if entry["spearman"] is not None]
        skip_headline[f"skip_prediction_{suffix}"] = (sum(rho * weight for rho, weight in defined)
                                                      / sum(weight for _, weight in defined)) if defined else None
    # depth alone: rho of the single layers' seed-mean scores with their position (the one length of 3 spans); no
    # length has the 4 spans a rho partial on position needs
    singles = sorted(measured[1].items())
    skip_headline |= {"skip_prediction_position_only": None if len({round(float(np.mean(v)), 6) for _, v in singles}) == 1
                      else float(stats.spearmanr([np.mean(v) for _, v in singles], [1, 2, 3])[0]),
                      "skip_prediction_angular_beyond_position": None,
                      "skip_prediction_block_influence_beyond_position": None,
                      "skip_prediction_random_layer_beyond_position_high": None}
    metrics = {stage: json.loads((stage_metrics(root / "metrics", stage, TASK)).read_text())
               for stage in ("similarity", "truncate", "skip", "align")}
    assert metrics["similarity"] == _approx_tree(similarity)
    assert metrics["truncate"] == {"untuned_droppable_top_layers": truncate["untuned"],
                                   "tuned_droppable_top_layers": truncate["tuned"]}
    assert metrics["skip"] == _approx_tree(skip_headline)
    assert metrics["align"] == _approx_tree({"finetuning_seeds": align, "pretraining_seeds": pretraining})
    assert json.loads((root / "metrics/compare.json").read_text()) == {"cls": {"linear_cka": _approx_tree(compare)}}
    for stage, task in (("similarity", TASK), ("truncate", TASK), ("skip", TASK), ("align", TASK), ("compare", None)):
        rows = json.loads(_details_path(root, stage, task).read_text())
        assert headlines.metrics_to_details(headlines.details_to_metrics(rows)) == rows  # nothing lost in the rows
    # The summary: with one task, each mean is that task's value.
    summary = json.loads((root / "metrics/summary.json").read_text())
    assert summary["mean"] == _approx_tree({
        "accuracy": full, "ft_orig_top": similarity["cls"]["linear_cka"]["ft_orig_top"],
        "untuned_drop": truncate["untuned"], "tuned_drop": truncate["tuned"], "skip_span": skip,
        "inn_advantage": align["inn_advantage"]})
    assert summary["finetune_runs"] == {"total": len(SEEDS), "not_converged": len(_flagged_seeds(root))}
    blocks = _details(root, "similarity", TASK)["cls"]["linear_cka"]["blocks"]
    last_block = json.loads((root / "plots/summary/last_block.json").read_text())
    assert {(row["task"], row["comparison"], row["last_block_start"]) for row in last_block} == {
        (TASK, "ORIG–ORIG", blocks["orig_orig"]["last_block_start"]), (TASK, "FT–FT", blocks["ft_ft"]["last_block_start"])}
    assert_figure(root / "plots/summary/last_block.png", min_size=(400, 300))


def _mean(values) -> float:
    return float(np.mean([v for v in values if v is not None]))


def _approx_tree(expected):
    """`expected` with every float compared as pytest.approx to 6 digits (what the stages round to)."""
    if isinstance(expected, dict):
        return {key: _approx_tree(value) for key, value in expected.items()}
    if isinstance(expected, (float, np.floating)):
        return pytest.approx(float(expected), abs=2e-6)
    return expected


@pytest.mark.parametrize("section,key,value,stages", [
    ("similarity", "measures", ["mixedsim"], [f"similarity@{TASK}", f"grounding@{TASK}", "compare", "summary", "report"]),
    ("grounding", "bootstrap", 50, [f"grounding@{TASK}"]),  # a dry run cannot know that its outputs change
    ("compare", "probe_examples", 10, ["compare"]),
    ("truncate", "head_epochs", 3, [f"truncate@{TASK}"]),
    ("skip", "tolerance", 0.05, [f"skip@{TASK}"]),
    ("align", "matrix_steps", 6, [f"align@{TASK}"]),
    ("weights", "threshold", 0.6, [f"weights@{TASK}"]),
])
def test_changing_an_analysis_param_reruns_only_its_stage(project, section, key, value, stages):
    root, state = project
    params_path = root / "params.yaml"
    original = params_path.read_text()
    params = yaml.safe_load(original)
    params[section][key] = value
    params_path.write_text(yaml.safe_dump(params, sort_keys=False))
    try:
        dry = run(dvc("repro", "--dry"), root, state["env"]).stdout
        assert dry_run_stages(dry) == set(stages) | {"check_params"}
    finally:
        params_path.write_text(original)


def test_plots_render_offline(project, tmp_path):
    """`dvc plots show` renders every declared plot into a page that loads nothing from the network."""
    root, state = project
    out = tmp_path / "rendered"
    run(dvc("plots", "show", "-o", str(out)), root, state["env"])
    page = (out / "index.html").read_text()
    remote = re.findall(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", page, flags=re.IGNORECASE)
    assert not remote, f"the rendered page loads remote resources: {remote}"
    assert "vegaEmbed" in page and "<script>" in page  # the libraries are inlined
    for plot in (f"plots/similarity/{TASK}/heatmaps/cls.json", f"plots/align/{TASK}/errors.json",
                 f"plots/truncate/{TASK}/truncate.json", f"dvclive/finetune/{TASK}/seed1/plots/metrics"):
        assert plot in page, plot
    images = [line for line in page.splitlines() if "<img" in line]
    assert any(f"{TASK}" in line and "skip" in line for line in images)
