"""Integration: `dvc repro` of extract → similarity → truncate → skip → export on a tiny decoder (GPT-2) and a
tiny DeBERTa-v2 (issue 37): a decoder pools its last non-pad token where an encoder pools CLS, and the exported
checkpoint reloads in plain transformers with the truncated model's logits, bit for bit in fp32. The GPT-2 project
also runs compare with a Llama of another width and depth (Wu et al. Figures 1, 8 and 9)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from dvc_project import dvc, make_project, run, tiny_params
from layersim.data.io import ActivationTable, read_task_table
from layersim.experiments.pruning_states import ANGULAR_ROWS, BLOCK_INFLUENCE_ROWS
from layersim.reporting import headlines

TASK = "synth-negation"
SEEDS = [1]  # one seed: FT–FT is the seed against itself; the families, not the seeds, are under test
STAGES = ("extract", "similarity", "truncate", "skip", "export")
# Model → the pooling its own head reads (truncate trains its fresh heads on it): a decoder has no CLS token.
HEAD_POOLING = {"tiny-gpt2": "last", "tiny-deberta-v2": "cls"}
# Model → compare.models: another family, width (48, not 32) and depth (2 layers, not 3), in one project only.
COMPARED = {"tiny-gpt2": "tiny-llama-h48-l2"}

pytestmark = pytest.mark.integration


def _configure(model: str):
    def configure(params: dict) -> None:
        tiny_params(params, model=model, tasks=[TASK], seeds=SEEDS)
        head = HEAD_POOLING[model]
        params["extract"].update(poolings=[head, "mean"], attention_examples=0)
        params["similarity"].update(measures={head: ["linear_cka"], "mean": ["linear_cka"]}, attention_measures=[])
        params["truncate"].update(head="fresh")  # own_head copies only BERT-family heads (OWN_HEAD_ARCHITECTURES)
        if model in COMPARED:
            params["compare"].update(models=[COMPARED[model]], probe_examples=20)
    return configure


@pytest.fixture(scope="module", params=sorted(HEAD_POOLING))
def project(request, tmp_path_factory) -> tuple[Path, str]:
    """A tiny project of one model after `dvc repro` of the five stages (and the stages they need)."""
    model = request.param
    root = tmp_path_factory.mktemp(model)
    env = make_project(root, _configure(model))
    run(dvc("repro", *STAGES, *(["compare"] if model in COMPARED else [])), root, env)
    return root, model


def _details(root: Path, name: str) -> dict:
    return headlines.details_to_metrics(json.loads((root / f"plots/details/{name}.json").read_text()))


def test_extract_writes_the_pooling_the_models_head_reads(project):
    root, model = project
    head = HEAD_POOLING[model]
    activations = root / f"data/activations/{model}/{TASK}"
    for run_name in ("orig", *(f"seed{seed}" for seed in SEEDS), "random"):
        for pooling in (head, "mean"):
            table = ActivationTable(activations / f"{run_name}.{pooling}.parquet")
            assert (table.num_layers, table.hidden_size, table.num_rows) == (3, 32, 60)
    assert (activations / f"train/orig.{head}.parquet").is_file()  # truncate's fresh heads train on it
    if head == "last":
        assert not list(activations.glob("*.cls.parquet"))


def test_similarity_is_finite_where_defined(project):
    root, model = project
    values = [row["value"] for row in json.loads((root / f"plots/details/similarity/{TASK}.json").read_text())]
    assert values and all(not isinstance(v, float) or math.isfinite(v) for v in values)  # None: undefined
    summary = _details(root, f"similarity/{TASK}")
    for pooling in (HEAD_POOLING[model], "mean"):
        diagonal = summary[pooling]["linear_cka"]["ft_ft"]["diagonal"]
        assert diagonal["layer_03"] == pytest.approx(1.0)  # a seed's last layer against itself


def test_similarity_writes_each_runs_block_influence_and_angular_distances(project):
    root, model = project
    folder = root / f"plots/pruning/{TASK}"
    influence = json.loads((folder / "block_influence.json").read_text())
    angular = json.loads((folder / "angular_distance.json").read_text())
    runs = ["ORIG", *(f"FT[{k}]" for k in range(1, len(SEEDS) + 1)), "RANDOM"]
    assert [(row["model"], row["layer"]) for row in influence] == [(run, k) for run in runs for k in (1, 2, 3)]
    assert {row["rows"] for row in influence} == {BLOCK_INFLUENCE_ROWS}  # every token, as extract wrote them
    assert {row["rows"] for row in angular} == {ANGULAR_ROWS["last" if HEAD_POOLING[model] == "last" else "first"]}
    assert len(angular) == len(runs) * 6  # (l, n) with l + n ≤ 3
    assert all(0 <= row["angular_distance"] <= 1 for row in angular)
    assert (folder / "pruning.png").read_bytes()[:4] == b"\x89PNG"


def test_compare_stacks_another_width_and_depth_with_random_init_controls(project):
    root, model = project
    if model not in COMPARED:
        pytest.skip("compare runs in the GPT-2 project only")
    other = COMPARED[model]
    layers = {"ORIG": 4, "RANDOM": 4, f"FT:{TASK}": 4, other: 3, f"{other} (random init)": 3}  # embeddings included
    rows = [row for row in json.loads((root / "plots/compare/matrices.json").read_text()) if row["pooling"] == "mean"]
    cells = {(row["comparison"], row["y_layer"], row["x_layer"]): row["similarity"] for row in rows}
    assert len(cells) == sum(layers.values()) ** 2  # one 18 x 18 matrix, every cell defined
    for a in layers:
        for b in layers:
            assert {(y, x) for (pair, y, x) in cells if pair == f"{a} vs {b}"} == {
                (y, x) for y in range(layers[a]) for x in range(layers[b])}
        assert all(cells[f"{a} vs {a}", k, k] == pytest.approx(1.0, abs=1e-5) for k in range(layers[a]))
    compare = _details(root, "compare")["mean"]["linear_cka"]
    # Another depth: each of its layers' best-matching ORIG layer (details rows give per-layer dicts back by field).
    assert set(compare[other]["best_match"]["layer"]) == {"layer_00", "layer_01", "layer_02"}
    assert (root / "plots/compare/mean.linear_cka.png").read_bytes()[:4] == b"\x89PNG"


def test_truncate_and_skip_score_every_exit_and_span(project):
    root, _ = project
    truncate, skip = _details(root, f"truncate/{TASK}"), _details(root, f"skip/{TASK}")
    assert sorted(skip["spans"]) == ["1-1", "1-2", "1-3", "2-2", "2-3", "3-3"]
    assert skip["full"] == pytest.approx(truncate["full"], abs=1e-6)


def test_the_export_reloads_in_plain_transformers_with_the_truncated_logits(project):
    """The export stage refuses a checkpoint whose fp32 logits differ from the truncated model's; here the
    same is checked from the files: plain transformers' reload against the fine-tuned model run on the kept
    layers (layersim.models.encoders.run_layers), both through the same batches."""
    from transformers import AutoModelForSequenceClassification

    from layersim.data.batching import encode_task
    from layersim.data.tasks import get_task
    from layersim.models.encoders import run_layers
    from layersim.models.registry import load_finetuned, load_tokenizer
    from layersim.training.evaluate import predict

    root, model = project
    exported = _details(root, f"export/{TASK}")["exported"]
    folder = root / f"data/export/{model}/{TASK}"
    reloaded = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    assert reloaded.config.model_type == {"tiny-gpt2": "gpt2", "tiny-deberta-v2": "deberta-v2"}[model]
    kept = [int(n) - 1 for n in str(exported["kept_layers"]).split(",")]
    assert reloaded.config.num_hidden_layers == len(kept) == exported["layers"]

    spec = get_task(TASK)
    checkpoint = root / f"data/checkpoints/{model}/{TASK}/seed{SEEDS[0]}"
    tokenizer = load_tokenizer(checkpoint)
    encoded = encode_task(read_task_table(root / f"data/tasks/{TASK}", spec, "validation", None), spec, tokenizer, 32)
    cpu = torch.device("cpu")
    full = load_finetuned(checkpoint, spec)
    with run_layers(full, kept):
        truncated = predict(full, encoded, tokenizer, 8, cpu)
    np.testing.assert_array_equal(predict(reloaded, encoded, tokenizer, 8, cpu), truncated)
