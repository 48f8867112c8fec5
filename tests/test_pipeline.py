"""Integration: the real `dvc repro` of the whole pipeline on a tiny model, in a temporary git repo."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from dvc_project import built_project, dry_run_stages, dvc, run, tiny_params
from layersim.reporting import headlines
from layersim.similarity.inference.bootstrap import AUTO_INTERVAL
from layersim.experiments.freeze import freeze_headline as headlines_of_freeze
from layersim.experiments.weights import weights_headline
from layersim.data.io import ActivationTable, AttentionTable, stage_details, stage_metrics, task_tables

TASK = "synth-negation"
SEEDS = [1, 2]

pytestmark = pytest.mark.integration


def _details(root: Path, stage: str, task: str | None = None) -> dict:
    """Every value a stage computed, from its details plot data (its metrics file holds the headline)."""
    return headlines.details_to_metrics(json.loads(_details_path(root, stage, task).read_text()))


def _details_path(root: Path, stage: str, task: str | None) -> Path:
    return stage_details(root / "plots/details", stage, task) if task else root / f"plots/details/{stage}.json"


def _configure(params: dict) -> None:
    tiny_params(params, model="tiny-bert", tasks=[TASK], seeds=SEEDS)
    params["extract"].update(attention_examples=60)
    measures = ["linear_cka", "svcca", "pwcca", "neuronsim"]
    params["similarity"].update(measures={"cls": measures, "tokens": measures})
    params["compare"].update(models=["tiny-roberta"], probe_examples=20)
    # Every kind of pair; tiny-bert-seed1/2 stand in for MultiBERTs (tiny-bert from other init seeds).
    params["align"].update(pairs=[["FT1", "FT2"], ["ORIG", "FT1"], ["tiny-bert-seed1", "tiny-bert-seed2"],
                                  ["tiny-bert-seed2", "ORIG"]], attention=True,
                           pretraining_models=["tiny-bert", "tiny-bert-seed1"])  # tests/test_pretraining_seeds.py
    # Wu's recipe (its own unfrozen run, 3 epochs) is tested in tests/test_freezing.py; here the finetune stage's
    # runs are the unfrozen baseline.
    params["freeze"].update(recipe="finetune")
    # Issue 52: LoRA (rank 2) beside full fine-tuning, the same seeds, in this one experiment.
    params["finetune"].update(compare_methods=["lora"])
    params["finetune"]["lora"].update(rank=2)
    params["finetune"].update(keep_states=2)  # of max_steps 6: the states of steps 2 and 4 (the dynamics stage)


@pytest.fixture(scope="module")
def project(tmp_path_factory, built_projects) -> tuple[Path, dict]:
    """A copy of this repository (its git-tracked and not-ignored files) as a fresh git repo, with
    params.yaml set to a tiny model and a small built-in task, after `dvc repro` (built once per test run:
    tests/test_incremental.py starts from the same project)."""
    dest = tmp_path_factory.mktemp("project")
    env, first_repro = built_project(built_projects, dest, _configure, "pipeline")
    return dest, {"env": env, "first_repro": first_repro}


def test_repro_writes_every_declared_output(project):
    root, state = project
    tasks = task_tables(root / "data" / "tasks", TASK)
    assert (tasks / "train.parquet").is_file() and (tasks / "validation.parquet").is_file()
    assert (root / "data/models/tiny-bert/pretrained/model.safetensors").is_file()
    for seed in SEEDS:
        checkpoint = root / f"data/checkpoints/tiny-bert/{TASK}/seed{seed}/model"
        assert (checkpoint / "model.safetensors").is_file() and (checkpoint / "config.json").is_file()
        metrics = json.loads((root / f"metrics/finetune/{TASK}/seed{seed}/metrics.json").read_text())
        assert set(metrics) == {"accuracy", "convergence"} and 0.0 <= metrics["accuracy"] <= 1.0
        verdict = metrics["convergence"]  # the check's numbers, whatever the tiny run's verdict
        assert {"converged", "score", "baseline", "final_train_loss", "trivial_loss"} <= set(verdict)
        assert verdict["score"] == pytest.approx(metrics["accuracy"], abs=1e-6)
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
    for pooling in ("cls", "mean", "last", "tokens"):
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
    for pooling in ("cls", "tokens"):
        assert set(similarity[pooling]) == {"linear_cka", "svcca", "pwcca", "neuronsim", "localization", "rows"}
        for measure in ("linear_cka", "svcca", "pwcca", "neuronsim"):
            summary = similarity[pooling][measure]
            cca = {"kept_dimensions"} if measure in ("svcca", "pwcca") else set()
            # "family": the headline claims' correction; "no_interval": no interval method covers for the measure.
            uncovered = {"no_interval"} if AUTO_INTERVAL[measure] is None else set()
            assert set(summary) == {"orig_orig", "ft_orig", "ft_ft", "ft1_ft2", "orig_random", "ft_random", "null",
                                    "blocks", "correction", "family", "lora_orig", "lora_ft"} | cca | uncovered
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
        assert (root / f"plots/diagonals/{TASK}/curves/{pooling}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        # trained models only, and finetune.method's: the LoRA runs change no localization score
        assert set(similarity[pooling]["localization"]) == {"ORIG", "FT[1]", "FT[2]"}
        assert (root / f"plots/similarity/{TASK}/heatmaps/{pooling}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (root / f"plots/localization/{TASK}/curves/{pooling}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        rows = json.loads((root / f"plots/similarity/{TASK}/heatmaps/{pooling}.json").read_text())
        assert {row["comparison"] for row in rows} == {"ORIG–ORIG", "FT–ORIG", "FT–FT", "FT[1]–FT[2]", "ORIG–RANDOM",
                                                       "FT–RANDOM", "LoRA–ORIG", "LoRA–FT"}
        assert {row["measure"] for row in rows} == {"linear CKA", "SVCCA", "PWCCA", "neuronsim"}
        assert all(0.0 <= row["p_value"] <= 1.0 for row in rows if row["p_value"] is not None)
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
    assert set(compare["attention"]["jensen_shannon"]) == {"RANDOM", f"FT:{TASK}"}
    assert sorted(compare["attention"]["jensen_shannon"][f"FT:{TASK}"]["diagonal"]) == ["layer_01", "layer_02", "layer_03"]
    plots = root / "plots/compare"
    for name in ("cls.linear_cka.png", "tokens.neuronsim.png", "attention.jensen_shannon.png"):
        assert (plots / name).read_bytes()[:4] == b"\x89PNG", name
    assert (root / "plots/localization/compare/tokens.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((root / "plots/localization/compare/localization.json").read_text())
    rows = json.loads((plots / "matrices.json").read_text())
    assert {row["comparison"] for row in rows} >= {"ORIG vs tiny-roberta", f"FT:{TASK} vs ORIG"}
    assert json.loads((root / "data/compare/models/models.json").read_text()) == ["tiny-roberta"]


def test_align_reports_every_method_layer_and_reference(project):
    root, _ = project
    align = _details(root, "align", TASK)
    methods = {"linear", "cca", "svcca", "pwcca", "inn", "mlp"}
    assert align["pooling"] == "mean" and align["train_rows"] == 100 and align["validation_rows"] == 60
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
        assert (root / f"plots/align/{TASK}/{name}").read_bytes()[:4] == b"\x89PNG", name
    rows = json.loads((root / f"plots/align/{TASK}/errors.json").read_text())
    assert len(rows) == 4 * 4 * len(methods)


def test_truncate_and_skip_agree_with_the_fine_tuned_models(project):
    root, _ = project
    finetuned = [json.loads((root / f"metrics/finetune/{TASK}/seed{seed}/metrics.json").read_text())["accuracy"]
                 for seed in SEEDS]
    truncate = _details(root, "truncate", TASK)
    assert truncate["metric"] == "accuracy"
    # Exiting after the last layer is the full model: the same score the finetune stage measured.
    assert truncate["full"] == pytest.approx(sum(finetuned) / len(finetuned), abs=1e-6)
    assert truncate["untuned"]["layer_03"] == pytest.approx(truncate["full"], abs=1e-6)
    for variant in ("untuned", "tuned", "tuned_orig"):
        assert sorted(truncate[variant]) == ["layer_00", "layer_01", "layer_02", "layer_03"]
    assert 0 <= truncate["droppable_top_layers_untuned"] <= 3 and 0 <= truncate["droppable_top_layers_tuned"] <= 3
    skip = _details(root, "skip", TASK)
    assert sorted(skip["spans"]) == ["1-1", "1-2", "1-3", "2-2", "2-3", "3-3"]
    assert skip["full"] == pytest.approx(truncate["full"], abs=1e-6)
    assert 1 <= skip["worst_single_layer"]["layer"] <= 3
    for stage in ("truncate", "skip"):
        assert (root / f"plots/{stage}/{TASK}/{stage}.png").read_bytes()[:4] == b"\x89PNG"
        assert json.loads((root / f"plots/{stage}/{TASK}/{stage}.json").read_text())


def test_export_writes_a_plain_checkpoint_that_keeps_the_score(project):
    """The exported model loads with transformers alone, has the layers it names, scores on validation what
    truncate / skip measured for that choice (first seed), and its choice is within tolerance on the train
    examples it was made on."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    root, state = project
    export = _details(root, "export", TASK)
    exported, full = export["exported"], export["full"]
    folder = root / f"data/export/tiny-bert/{TASK}/model"
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    kept = str(exported["kept_layers"]).split(",")
    assert model.config.num_hidden_layers == exported["layers"] == len(kept) <= full["layers"] == 3
    assert exported["train"] >= full["train"] - export["tolerance"]
    finetuned = json.loads((root / f"metrics/finetune/{TASK}/seed{SEEDS[0]}/metrics.json").read_text())["accuracy"]
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
    table = pq.read_table(root / f"data/tasks/{TASK}/splits/validation.parquet").to_pydict()
    import torch

    with torch.no_grad():
        batch = tokenizer(table["text"], padding=True, truncation=True, max_length=32, return_tensors="pt")
        predicted = model(**batch).logits.argmax(-1).numpy()
    assert (predicted == table["label"]).mean() == pytest.approx(exported["validation"], abs=1e-6)
    assert "speedup" not in export  # wall clock: in timings/, outside every output DVC hashes
    if f"Running stage 'export@{TASK}'" in state["first_repro"]:  # not restored from the run-cache: it timed
        timings = json.loads((root / f"timings/export/{TASK}.json").read_text())
        assert timings["speedup"]["batch_1"] > 0 and timings["speedup"]["batch_32"] > 0
    assert model.config.id2label == {0: "negative", 1: "positive"} and tokenizer.model_max_length == 32
    headline = json.loads((root / f"metrics/export/{TASK}/metrics.json").read_text())
    assert headline == headlines.export_headline(export)
    assert (root / f"plots/export/{TASK}/export.png").read_bytes()[:4] == b"\x89PNG"


def test_report_is_one_offline_page_that_states_the_stage_results(project):
    root, _ = project
    page = (root / "report/index.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "http" not in page  # nothing to fetch
    assert len(re.findall(r'src="data:image/png;base64,', page)) >= 8  # heatmaps, diagonals, curves, export, ...
    export = _details(root, "export", TASK)
    assert f"{export['exported']['layers']} / {export['full']['layers']}" in page
    assert f"{export['exported']['parameters'] / export['full_parameters']:.0%}" in page
    top = _details(root, "similarity", TASK)["cls"]["linear_cka"]["ft_orig"]
    assert f"{top['last_layer']:.3f} (null {top['null_mean']['layer_03']:.3f})" in page


def test_freeze_scores_each_configuration_next_to_the_unfrozen_run(project):
    """Wu et al. Table 1 on the 3-layer tiny model: layers [4, 6] of 12 become 1 and 2 of 3."""
    root, state = project
    freeze = _details(root, "freeze", TASK)
    assert freeze["metric"] == "accuracy" and freeze["num_layers"] == 3
    finetuned = [json.loads((root / f"metrics/finetune/{TASK}/seed{seed}/metrics.json").read_text())["accuracy"]
                 for seed in SEEDS]
    assert freeze["unfrozen"]["score"] == pytest.approx(sum(finetuned) / len(finetuned), abs=1e-6)
    assert "train_seconds" not in freeze["unfrozen"]  # wall clock: in timings/, outside every output DVC hashes
    ran = all(f"Running stage '{stage}'" in state["first_repro"] for stage in (f"freeze@{TASK}", f"finetune@{TASK}-1"))
    timings = json.loads((root / f"timings/freeze/{TASK}.json").read_text()) if ran else None
    for label, side, layers in (("bottom1", "bottom", 1), ("bottom2", "bottom", 2), ("top1", "top", 1),
                                ("top2", "top", 2)):
        entry = freeze[label]
        assert (entry["side"], entry["layers"]) == (side, layers) and set(entry["seeds"]) == {"1", "2"}
        assert 0.0 <= entry["score"] <= 1.0 and (timings is None or timings[label]["steps_per_second_ratio"] > 0)
        assert entry["score_change"] == pytest.approx(entry["score"] - freeze["unfrozen"]["score"], abs=1e-5)
    headline = json.loads((root / f"metrics/freeze/{TASK}/metrics.json").read_text())
    assert headline == headlines_of_freeze(freeze)
    assert set(headline) == {"bottom1", "bottom2", "top1", "top2", "not_converged"}
    # Runs (frozen and unfrozen) that did not learn the task, counted: each entry says how many of its own.
    assert headline["not_converged"] == sum(freeze[label]["not_converged"] for label in ("bottom1", "bottom2", "top1",
                                                                                         "top2", "unfrozen"))
    rows = json.loads((root / f"plots/freeze/{TASK}/freeze.json").read_text())
    assert len(rows) == len(SEEDS) * 5
    assert (root / f"plots/freeze/{TASK}/freeze.png").read_bytes()[:4] == b"\x89PNG"


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
    headline = json.loads((root / f"metrics/weights/{TASK}/metrics.json").read_text())
    mean = lambda chosen: round(sum(row["intruders"] for row in chosen) / len(chosen), 6)  # noqa: E731
    assert headline["method"] == "full" and headline["intruders_per_adapted_matrix"] == mean(full)
    assert headline["max_update_rank_adapted"] == max(row["update_rank"] for row in full)
    compared = headline["compared"]["lora"]
    assert compared["max_update_rank_adapted"] <= 2
    assert compared["intruders_per_frozen_matrix"] == 0
    assert compared["intruders_per_adapted_matrix"] == mean([row for row in lora if row["adapted"]])
    assert (root / f"plots/weights/{TASK}/intruders.png").read_bytes()[:4] == b"\x89PNG"


def test_compared_method_runs_reach_similarity_with_nulls_and_intervals(project):
    """finetune.compare_methods (issue 52): finetune_compared wrote each LoRA run's checkpoint and metrics beside the
    full runs', extract its validation tables only (no train tables: only similarity reads them), and similarity
    compares LoRA with ORIG and with FT in the same heatmap set, each diagonal with its null and interval."""
    root, _ = project
    for seed in SEEDS:
        info = json.loads((root / f"data/checkpoints/tiny-bert/{TASK}/lora/seed{seed}/model/layersim_model.json").read_text())
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


def test_dynamics_follow_every_kept_state_from_orig_to_the_final_model(project):
    """The finetune stage kept the states of steps 2 and 4 (keep_states 2 of 6 steps); the dynamics stage compares
    every point (ORIG at step 0, the states, the final model at 6) with ORIG and the final model, per layer: one row
    per seed × point × reference per layer file, ORIG at step 0 and the final model at the end equal to themselves."""
    root, _ = project
    for seed, folder in [(seed, folder) for seed in SEEDS for folder in (f"seed{seed}", f"lora/seed{seed}")]:
        states = root / f"data/states/tiny-bert/{TASK}/{folder}/states"
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
    assert headline["top_layer_half_way_step"] in (None, 2, 3, 4, 5, 6)  # a mean over the seeds' kept points
    assert (root / f"plots/dynamics/{TASK}/dynamics.png").read_bytes()[:4] == b"\x89PNG"


def test_second_repro_has_nothing_to_do(project):
    root, state = project
    out = run(dvc("repro"), root, state["env"])
    assert "Running stage" not in out.stdout
    status = run(dvc("status"), root, state["env"])
    assert "up to date" in status.stdout.lower()


def test_metrics_are_visible_to_dvc(project):
    root, state = project
    shown = json.loads(run(dvc("metrics", "show", "--json"), root, state["env"]).stdout)
    workspace = json.dumps(shown)
    assert f"metrics/similarity/{TASK}/metrics.json" in workspace and "ft_orig_top" in workspace
    assert "metrics/summary.json" in workspace and "inn_advantage" in workspace


def test_metrics_files_hold_their_headline_and_details_hold_the_rest(project):
    """Each metrics file is exactly its stage's headline, recomputed from the details plot data (so every
    value that is not in the metrics file is in the details), and the summary is the mean of the
    per-task headlines."""
    root, _ = project
    significance = yaml.safe_load((root / "params.yaml").read_text())["similarity"]["significance"]
    expected = {
        ("similarity", TASK): headlines.similarity_headline(_details(root, "similarity", TASK), significance),
        ("truncate", TASK): headlines.truncate_headline(_details(root, "truncate", TASK)),
        ("skip", TASK): headlines.skip_headline(_details(root, "skip", TASK)),
        ("align", TASK): headlines.align_headline(_details(root, "align", TASK)),
        ("compare", None): headlines.compare_headline(_details(root, "compare"), "cls", "linear_cka"),
    }
    for (stage, task), headline in expected.items():
        metrics = stage_metrics(root / "metrics", stage, task) if task else root / f"metrics/{stage}.json"
        assert json.loads(metrics.read_text()) == headline, stage
        rows = json.loads(_details_path(root, stage, task).read_text())
        assert headlines.metrics_to_details(headlines.details_to_metrics(rows)) == rows  # nothing lost in the rows
    assert set(expected["similarity", TASK]["cls"]) == {"linear_cka", "svcca", "pwcca", "neuronsim"}
    assert set(expected["align", TASK]["finetuning_seeds"]) == {"linear", "cca", "svcca", "pwcca", "inn", "mlp",
                                                            "inn_advantage"}
    assert set(expected["compare", None]["cls"]["linear_cka"]) == {"RANDOM", f"FT:{TASK}", "tiny-roberta",
                                                              "tiny-roberta (random init)"}
    summary = json.loads((root / "metrics/summary.json").read_text())["mean"]
    finetuned = [json.loads((root / f"metrics/finetune/{TASK}/seed{seed}/metrics.json").read_text())["accuracy"]
                 for seed in SEEDS]
    assert summary["accuracy"] == pytest.approx(sum(finetuned) / len(finetuned), abs=1e-6)
    assert summary["ft_orig_top"] == expected["similarity", TASK]["cls"]["linear_cka"]["ft_orig_top"]
    assert summary["skip_span"] == expected["skip", TASK]["longest_skippable_span"]
    blocks = _details(root, "similarity", TASK)["cls"]["linear_cka"]["blocks"]
    last_block = json.loads((root / "plots/summary/last_block.json").read_text())
    assert {(row["task"], row["comparison"], row["last_block_start"]) for row in last_block} == {
        (TASK, "ORIG–ORIG", blocks["orig_orig"]["last_block_start"]), (TASK, "FT–FT", blocks["ft_ft"]["last_block_start"])}
    assert (root / "plots/summary/last_block.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("section,key,value,stages", [
    ("similarity", "measures", ["mixedsim"], [f"similarity@{TASK}", "compare", "summary", "report"]),
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
