"""The hub path, run here: the download stages (once through `dvc repro` in a project), through the real huggingface_hub / transformers / datasets
code and no LAYERSIM_HUB_MIRROR, against a hub on 127.0.0.1 (olah serving git repositories built below;
tests/hub_server.py says what olah serves and the one answer a proxy fixes). The registry's own names are
served: `bert-base-uncased` is google-bert/bert-base-uncased (here a tiny random BERT) and `sst2` is the
sst2 config of nyu-mll/glue's Parquet export (refs/convert/parquet, `<config>/<split>/0000.parquet`).

And the lock (layersim.lock): the served repositories get new commits; the locked run still reads the old
ones, and `python -m layersim.params.lockfile refresh` moves it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

# olah is a dev dependency: without it these tests fail at collection instead of being skipped unnoticed.
import olah  # noqa: E402, F401
from dvc_project import dvc, make_project, output, run, tiny_params  # noqa: E402
from hub_server import HubServer, commit_folder  # noqa: E402

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[1]
MODEL, MODEL_REPO = "bert-base-uncased", "google-bert/bert-base-uncased"
TASK, DATASET, EXPORT = "sst2", "nyu-mll/glue", "refs/convert/parquet"
PARAMS = f"model: {MODEL}\ntasks: [{TASK}]\nseeds: [1]\nfinetune: {{max_length: 64}}\n"


def _save_model(folder: Path, seed: int) -> None:
    """A tiny random BERT with the MiniLM tokenizer, as a hub repository holds it (save_pretrained)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from layersim.models.registry import packaged_minilm_dir, tiny_config

    tokenizer = AutoTokenizer.from_pretrained(packaged_minilm_dir())
    torch.manual_seed(seed)
    AutoModel.from_config(tiny_config("bert", len(tokenizer), tokenizer.pad_token_id)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def _save_export(folder: Path, labels: list[int]) -> None:
    """sst2 as the hub's Parquet export lays it out, with GLUE's own columns (sentence, label, idx)."""
    for split in ("train", "validation"):
        path = folder / TASK / split / "0000.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"sentence": [f"{split} sentence {i}" for i in range(len(labels))],
                                 "label": pa.array(labels, pa.int64()),
                                 "idx": pa.array(range(len(labels)), pa.int32())}), path)


def _weights(folder: Path) -> dict:
    from safetensors.numpy import load_file

    return load_file(folder / "model.safetensors")


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)


@pytest.fixture
def hub(tmp_path):
    """olah serving a model repository (branch main) and a dataset repository whose export ref holds sst2."""
    root = tmp_path / "served"
    model_repo, dataset_repo = root / "models" / MODEL_REPO, root / "datasets" / DATASET
    _save_model(model_repo, seed=0)
    commits = {"model": commit_folder(model_repo, "tiny bert")}
    (dataset_repo / "README.md").parent.mkdir(parents=True)
    (dataset_repo / "README.md").write_text("# glue, as served in a test\n")
    commit_folder(dataset_repo, "card")
    (dataset_repo / "README.md").unlink()  # the export's tree holds only the Parquet files, as the hub's does
    _save_export(dataset_repo, labels=[0, 1] * 6)
    commits["export"] = commit_folder(dataset_repo, "Update parquet files", ref=EXPORT)
    with HubServer(root, lifetime=600) as server:
        yield server, model_repo, dataset_repo, commits


def _run(args: list[str], cwd: Path, url: str) -> str:
    env = {**os.environ, "HF_ENDPOINT": url, "HF_HOME": str(cwd / "hf-home"), "HF_HUB_OFFLINE": "0",
           "HF_DATASETS_OFFLINE": "0", "HF_HUB_DISABLE_TELEMETRY": "1"}
    env.pop("LAYERSIM_HUB_MIRROR", None)
    result = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{args}:\n{result.stdout}\n{result.stderr[-4000:]}"
    return result.stdout


def _download(work: Path, url: str) -> tuple[dict, dict, pa.Table]:
    """Run both download stage scripts, as dvc.yaml does but in one process (seconds of imports saved); the
    model's info and weights, and the task's train table."""
    for out in ("model", "task"):
        shutil.rmtree(work / out, ignore_errors=True)
    stages = [[str(ROOT / "stages" / "download_model.py"), "model"],
              [str(ROOT / "stages" / "download_task.py"), TASK, "task"]]
    _run(["-c", "import runpy, sys\n"
                f"for argv in {stages!r}:\n"
                "    sys.argv = argv\n"
                "    runpy.run_path(argv[0], run_name='__main__')"], work, url)
    info = json.loads((work / "model" / "layersim_model.json").read_text())
    return info, _weights(work / "model"), pq.read_table(work / "task" / "train.parquet")


def test_locked_downloads_read_their_commit_until_refreshed(hub, tmp_path):
    server, model_repo, dataset_repo, first = hub
    work = tmp_path / "experiment"
    work.mkdir()
    (work / "params.yaml").write_text(PARAMS)

    out = _run(["-m", "layersim.params.lockfile", "sync"], work, server.url)
    lock = json.loads((work / "layersim.lock").read_text())
    assert lock["models"] == {MODEL: {"hub_id": MODEL_REPO, "revision": "main", "commit": first["model"]}}
    assert lock["tasks"] == {TASK: {"dataset": DATASET, "config": TASK, "revision": EXPORT, "commit": first["export"]}}
    assert "2 entries written" in out

    info, weights, train = _download(work, server.url)
    served = _weights(model_repo)
    assert info["source"] == "hub" and info["hub_id"] == MODEL_REPO and info["revision"] == first["model"]
    assert _same(weights, served)  # the served weights, bit for bit, through the tokenizer and model loaders
    assert train.column("text").to_pylist() == [f"train sentence {i}" for i in range(12)]
    assert train.column("label").to_pylist() == [0, 1] * 6
    source = json.loads(train.schema.metadata[b"layersim"])["source"]
    assert source["hub"] == DATASET and source["files"] == f"{TASK}/train/*.parquet"
    assert source["revision"] == first["export"]

    # The hub moves on: new weights on main, new labels in the export.
    _save_model(model_repo, seed=1)
    second = {"model": commit_folder(model_repo, "retrained")}
    _save_export(dataset_repo, labels=[1, 0] * 6)
    second["export"] = commit_folder(dataset_repo, "Update parquet files", ref=EXPORT)
    assert second != first and not _same(_weights(model_repo), served)

    info, weights, train = _download(work, server.url)  # a rerun: the lock still reads the first commits
    assert info["revision"] == first["model"] and _same(weights, served)
    assert train.column("label").to_pylist() == [0, 1] * 6

    out = _run(["-m", "layersim.params.lockfile", "refresh"], work, server.url)
    assert f"model {MODEL}: {first['model'][:12]} -> {second['model'][:12]} (main)" in out
    assert f"task {TASK}: {first['export'][:12]} -> {second['export'][:12]} ({EXPORT})" in out
    lock = json.loads((work / "layersim.lock").read_text())
    assert (lock["models"][MODEL]["commit"], lock["tasks"][TASK]["commit"]) == (second["model"], second["export"])

    info, weights, train = _download(work, server.url)  # refreshed: the new commits
    assert info["revision"] == second["model"] and _same(weights, _weights(model_repo))
    assert train.column("label").to_pylist() == [1, 0] * 6
    assert json.loads(train.schema.metadata[b"layersim"])["source"]["revision"] == second["export"]

    out = _run(["-m", "layersim.params.lockfile", "refresh"], work, server.url)  # nothing moved: the file is untouched
    assert "0 entries written" in out and json.loads((work / "layersim.lock").read_text()) == lock


def test_dvc_repro_downloads_the_model_and_the_task_from_the_hub(hub, tmp_path):
    """A project whose params name the registry's bert-base-uncased and sst2: `python -m layersim.params.lockfile
    sync`, then `dvc repro download_model download_task@sst2` with HF_ENDPOINT at the served hub, each stage in a
    fresh interpreter as a user runs it (the variables differ from the fork server's). The outputs are the served
    files: the weights bit for bit at the locked commit, every row of both splits of the export, and the lock's
    commits in their records; `dvc status` is clean for them afterwards."""
    server, model_repo, _, commits = hub
    root = tmp_path / "project"
    root.mkdir()

    def configure(params: dict) -> None:
        tiny_params(params, model=MODEL, tasks=[TASK], seeds=[1])

    env = make_project(root, configure, share_cache=False)  # the run-cache could restore instead of downloading
    env = {**env, "HF_ENDPOINT": server.url, "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_OFFLINE": "0",
           "HF_DATASETS_OFFLINE": "0", "HF_HUB_DISABLE_TELEMETRY": "1"}
    env.pop("LAYERSIM_HUB_MIRROR", None)
    run([sys.executable, "-m", "layersim.params.lockfile", "sync"], root, env)
    lock = json.loads((root / "layersim.lock").read_text())
    assert lock["models"][MODEL]["commit"] == commits["model"] and lock["tasks"][TASK]["commit"] == commits["export"]
    repro = run(dvc("repro", "download_model", f"download_task@{TASK}"), root, env)
    for stage in ("download_model", f"download_task@{TASK}"):
        assert f"Running stage '{stage}'" in repro.stdout, output(repro)

    model = root / f"data/models/{MODEL}/pretrained"
    info = json.loads((model / "layersim_model.json").read_text())
    assert (info["source"], info["hub_id"], info["revision"]) == ("hub", MODEL_REPO, commits["model"])
    assert _same(_weights(model), _weights(model_repo))
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(model).get_vocab() == AutoTokenizer.from_pretrained(model_repo).get_vocab()
    splits = root / f"data/tasks/{TASK}/splits"
    for split in ("train", "validation"):
        table = pq.read_table(splits / f"{split}.parquet")
        assert table.column("text").to_pylist() == [f"{split} sentence {i}" for i in range(12)], split
        assert table.column("label").to_pylist() == [0, 1] * 6, split
        source = json.loads(table.schema.metadata[b"layersim"])["source"]
        assert (source["hub"], source["revision"]) == (DATASET, commits["export"])
        assert source["files"] == f"{TASK}/{split}/*.parquet"
    status = run(dvc("status", "download_model", f"download_task@{TASK}"), root, env)
    assert "up to date" in status.stdout.lower(), output(status)
