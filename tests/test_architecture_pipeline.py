"""Integration: the whole pipeline (`dvc repro`, every stage to report/index.html) on a tiny decoder (GPT-2), a
tiny Llama and a tiny DeBERTa-v2 with nothing set but the model and the tiny sizes (issue 48): the defaults name
points and heads by meaning (pooling `head`, truncate.head `auto`), so a decoder pools its last non-pad token where
an encoder pools CLS, trains fresh truncation heads, and align injects into its own head. The exported checkpoint
reloads in plain transformers with the truncated model's logits, bit for bit in fp32. The GPT-2 project also runs
compare with a Llama of another width and depth (Wu et al. Figures 1, 8 and 9)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dvc_project import dvc, make_project, run, tiny_params
from layersim.data.io import ActivationTable, read_task_table, stage_details, task_tables
from layersim.experiments.pruning_states import ANGULAR_ROWS, BLOCK_INFLUENCE_ROWS
from layersim.reporting import headlines

TASK = "synth-negation"
# The tiny-llama project reads its task from a hub dataset declared as a user task (user_tasks.<name>.dataset),
# served by olah on 127.0.0.1 (tests/hub_server.py) to the download stage, locked in layersim.lock; the rest of
# its pipeline runs offline. Its rows are synth-negation's, exported as the hub's Parquet conversion lays them out.
HUB_TASK, HUB_DATASET = "hub-negation", "layersim-tests/negation"
TASK_OF = {"tiny-llama": HUB_TASK}
SEEDS = [1]  # one seed: FT–FT is the seed against itself; the families, not the seeds, are under test
# Model → the pooling its own head reads (what `head` resolves to): a decoder has no CLS token.
HEAD_POOLING = {"tiny-gpt2": "last", "tiny-llama": "last", "tiny-deberta-v2": "cls"}
# Model → compare.models: another family, width (48, not 32) and depth (2 layers, not 3), in one project only.
COMPARED = {"tiny-gpt2": "tiny-llama-h48-l2"}

pytestmark = pytest.mark.integration


def _configure(model: str):
    def configure(params: dict) -> None:
        task = TASK_OF.get(model, TASK)
        tiny_params(params, model=model, tasks=[task], seeds=SEEDS)  # poolings, measures, heads: as committed
        params["similarity"]["measures"]["mean"] = ["linear_cka"]
        if task == HUB_TASK:
            params["user_tasks"] = {HUB_TASK: {"dataset": HUB_DATASET, "text": ["sentence"], "label": "label",
                                               "label_names": ["negative", "positive"]}}
        if model in COMPARED:
            params["compare"].update(models=[COMPARED[model]], probe_examples=20)
    return configure


@pytest.fixture(scope="module", params=sorted(HEAD_POOLING))
def project(request, tmp_path_factory) -> tuple[Path, str]:
    """A tiny project of one model after `dvc repro` of the whole pipeline: (root, model, task)."""
    model = request.param
    root = tmp_path_factory.mktemp(model)
    env = make_project(root, _configure(model))
    task = TASK_OF.get(model, TASK)
    if task == HUB_TASK:
        _download_from_local_hub(root, env, tmp_path_factory.mktemp("served"))
    run(dvc("repro"), root, env)
    assert "Data and pipelines are up to date" in run(dvc("status"), root, env).stdout
    return root, model, task


def _download_from_local_hub(root: Path, env: dict, served: Path) -> None:
    """Serve HUB_DATASET's Parquet export (synth-negation's rows under GLUE-like column names), lock it and run
    download_task through the real hub client code; the server is gone before the rest of the pipeline runs."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pytest.importorskip("olah", reason="the hub-served user task needs olah (pip install -e '.[dev]')")
    from hub_server import HubServer, commit_folder
    from layersim.data.tasks import generated_table, get_task

    repo = served / "datasets" / HUB_DATASET
    (repo / "README.md").parent.mkdir(parents=True)
    (repo / "README.md").write_text("# negation, as served in a test\n")
    commit_folder(repo, "card")
    (repo / "README.md").unlink()
    for split, n in (("train", 200), ("validation", 60)):
        rows = generated_table(get_task(TASK), split, n, seed=0)
        path = repo / "default" / split / "0000.parquet"
        path.parent.mkdir(parents=True)
        pq.write_table(pa.table({"sentence": rows.column("text"), "label": rows.column("label")}), path)
    commit = commit_folder(repo, "Update parquet files", ref="refs/convert/parquet")
    with HubServer(served, lifetime=600) as server:
        online = {**env, "HF_ENDPOINT": server.url, "HF_HOME": str(root / "hf-home"), "HF_HUB_OFFLINE": "0",
                  "HF_DATASETS_OFFLINE": "0"}
        online.pop("LAYERSIM_HUB_MIRROR", None)
        run([sys.executable, "-m", "layersim.params.lockfile", "sync"], root, online)
        assert json.loads((root / "layersim.lock").read_text())["tasks"][HUB_TASK]["commit"] == commit
        run(dvc("repro", f"download_task@{HUB_TASK}"), root, online)
    source = json.loads(pq.read_schema(root / f"data/tasks/{HUB_TASK}/splits/train.parquet").metadata[b"layersim"])["source"]
    assert (source["hub"], source["revision"]) == (HUB_DATASET, commit)


def test_the_whole_pipeline_reaches_the_report_with_the_models_head_points(project):
    root, model, task = project
    page = (root / "report/index.html").read_text(encoding="utf-8")
    head = HEAD_POOLING[model]
    assert f"Model {model}; tasks {task};" in page and f"on {head} points" in page
    assert (root / f"plots/similarity/{task}/heatmaps/{head}.png").is_file()
    injection = _details(root, "align", task)["injection"]
    # Injection into the target's own head (ORIG→FT[1] with one seed): the reference is the full fine-tuned model.
    assert injection["pair"] == "ORIG→FT[1]" and set(injection["methods"]) == {"linear", "cca", "svcca", "pwcca",
                                                                               "inn", "mlp"}
    assert injection["references"]["FT[1] itself"] == pytest.approx(_details(root, "truncate", task)["full"],
                                                                     abs=1e-6)


def _details(root: Path, stage: str, task: str | None = None) -> dict:
    path = stage_details(root / "plots/details", stage, task) if task else root / f"plots/details/{stage}.json"
    return headlines.details_to_metrics(json.loads(path.read_text()))


def test_extract_writes_the_pooling_the_models_head_reads(project):
    root, model, task = project
    head = HEAD_POOLING[model]
    activations = root / f"data/activations/{model}/{task}/tables"
    for run_name in ("orig", *(f"seed{seed}" for seed in SEEDS), "random"):
        for pooling in (head, "mean"):
            table = ActivationTable(activations / f"{run_name}.{pooling}.parquet")
            assert (table.num_layers, table.hidden_size, table.num_rows) == (3, 32, 60)
    assert (activations / f"train/orig.{head}.parquet").is_file()  # truncate's fresh heads train on it
    if head == "last":
        assert not list(activations.glob("*.cls.parquet"))


def test_similarity_is_finite_where_defined(project):
    root, model, task = project
    values = [row["value"] for row in json.loads((root / f"plots/details/similarity/{task}/values.json").read_text())]
    assert values and all(not isinstance(v, float) or math.isfinite(v) for v in values)  # None: undefined
    summary = _details(root, "similarity", task)
    for pooling in (HEAD_POOLING[model], "mean"):
        diagonal = summary[pooling]["linear_cka"]["ft_ft"]["diagonal"]
        assert diagonal["layer_03"] == pytest.approx(1.0)  # a seed's last layer against itself


def test_similarity_writes_each_runs_block_influence_and_angular_distances(project):
    root, model, task = project
    folder = root / f"plots/pruning/{task}"
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
    root, model, task = project
    if model not in COMPARED:
        pytest.skip("compare runs in the GPT-2 project only")
    other = COMPARED[model]
    layers = {"ORIG": 4, "RANDOM": 4, f"FT:{task}": 4, other: 3, f"{other} (random init)": 3}  # embeddings included
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
    root, _, task = project
    truncate, skip = _details(root, "truncate", task), _details(root, "skip", task)
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
    from layersim.params import load_params
    from layersim.training.evaluate import predict

    root, model, task = project
    exported = _details(root, "export", task)["exported"]
    folder = root / f"data/export/{task}/model"
    reloaded = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    families = {"tiny-gpt2": "gpt2", "tiny-llama": "llama", "tiny-deberta-v2": "deberta-v2"}
    assert reloaded.config.model_type == families[model]
    kept = [int(n) - 1 for n in str(exported["kept_layers"]).split(",")]
    assert reloaded.config.num_hidden_layers == len(kept) == exported["layers"]

    load_params(root / "params.yaml")  # registers the project's user tasks (hub-negation) with get_task
    spec = get_task(task)
    checkpoint = root / f"data/checkpoints/{task}/seed{SEEDS[0]}/model"
    tokenizer = load_tokenizer(checkpoint)
    encoded = encode_task(read_task_table(task_tables(root / "data/tasks", task), spec, "validation", None), spec, tokenizer, 32)
    cpu = torch.device("cpu")
    full = load_finetuned(checkpoint, spec)
    with run_layers(full, kept):
        truncated = predict(full, encoded, tokenizer, 8, cpu)
    np.testing.assert_array_equal(predict(reloaded, encoded, tokenizer, 8, cpu), truncated)
