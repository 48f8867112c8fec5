"""The hub path, offline: every paper task is read by the same code the download stage runs
(`layersim.data.tasks.hub_table`), from a folder laid out like the hub's Parquet export
(`<owner>/<name>/<config>/<split>/0000.parquet`, LAYERSIM_HUB_MIRROR), with each dataset's own column
names and types as published — written out here, not read from the registry, so a wrong column or
config in the registry fails."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from layersim.errors import LayersimError
from layersim.data.tasks import HUB_MIRROR_ENV, PAPER_TASKS, get_task, hub_table

ROOT = Path(__file__).resolve().parents[1]

# task → (repository, export folder, {our split: hub split}, the hub's rows for each split)
def _glue(config, first, second=None, label=(0, 1, 1), regression=False):
    texts = {first: ["first a", "first b", "first c"]}
    if second:
        texts[second] = ["second a", "second b", "second c"]
    label_type = pa.float32() if regression else pa.int64()
    return pa.table({**{k: pa.array(v) for k, v in texts.items()},
                     "label": pa.array([float(v) for v in label] if regression else list(label), label_type),
                     "idx": pa.array([0, 1, 2], pa.int32())})


HUB = {
    "cola": ("nyu-mll/glue", "cola", {}, _glue("cola", "sentence")),
    "mnli": ("nyu-mll/glue", "mnli", {"validation": "validation_matched"},
             _glue("mnli", "premise", "hypothesis", label=(0, 1, 2))),
    "mrpc": ("nyu-mll/glue", "mrpc", {}, _glue("mrpc", "sentence1", "sentence2")),
    "qnli": ("nyu-mll/glue", "qnli", {}, _glue("qnli", "question", "sentence")),
    "qqp": ("nyu-mll/glue", "qqp", {}, _glue("qqp", "question1", "question2")),
    "rte": ("nyu-mll/glue", "rte", {}, _glue("rte", "sentence1", "sentence2")),
    "sst2": ("nyu-mll/glue", "sst2", {}, _glue("sst2", "sentence")),
    "stsb": ("nyu-mll/glue", "stsb", {}, _glue("stsb", "sentence1", "sentence2", label=(0.5, 3.2, 5.0),
                                             regression=True)),
    "boolq": ("aps/super_glue", "boolq", {}, _glue("boolq", "question", "passage")),
    "yelp_polarity": ("fancyzhx/yelp_polarity", "plain_text", {"validation": "test"},
                      pa.table({"label": pa.array([0, 1, 1], pa.int64()), "text": ["bad", "good", "great"]})),
    # HellaSwag publishes its label as a string.
    "hellaswag": ("Rowan/hellaswag", "default", {}, pa.table({
        "ind": [1, 2, 3], "activity_label": ["a", "b", "c"], "ctx_a": ["x", "y", "z"], "ctx_b": ["", "", ""],
        "ctx": ["context a", "context b", "context c"],
        "endings": [[f"ending {i}{j}" for j in range(4)] for i in range(3)],
        "source_id": ["s", "s", "s"], "split": ["train"] * 3, "split_type": ["indomain"] * 3,
        "label": ["2", "0", "3"]})),
    "cosmosqa": ("allenai/cosmos_qa", "default", {}, pa.table({
        "id": ["q1", "q2", "q3"], "context": ["story a", "story b", "story c"],
        "question": ["why a?", "why b?", "why c?"],
        **{f"answer{k}": [f"answer {i}{k}" for i in range(3)] for k in range(4)},
        "label": pa.array([1, 3, 0], pa.int32())})),
}


@pytest.fixture
def mirror(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "hub"
    for repository, folder, renamed, table in HUB.values():
        for split in ("train", "validation"):
            path = root / repository / folder / renamed.get(split, split) / "0000.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists():
                pq.write_table(table, path)
    monkeypatch.setenv(HUB_MIRROR_ENV, str(root))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return root


def test_every_paper_task_has_a_layout_here():
    assert set(HUB) == set(PAPER_TASKS)


@pytest.mark.parametrize("task", PAPER_TASKS)
def test_each_paper_task_loads_from_the_hub_layout(mirror, task):
    spec = get_task(task)
    repository, folder, renamed, raw = HUB[task]
    for split in ("train", "validation"):
        table = hub_table(spec, split)
        assert table.column("example_id").to_pylist() == [0, 1, 2]
        assert table.column_names == ["example_id", "cluster_id", *spec.text_columns, "label"]
        assert table.schema.field("label").type == spec.label_type
        source = json.loads(table.schema.metadata[b"layersim"])["source"]
        assert source == {"hub": repository, "config": spec.hub.config, "split": renamed.get(split, split),
                          "files": f"{folder}/{renamed.get(split, split)}/*.parquet", "revision": f"mirror {mirror}"}
        rows = table.to_pylist()
        labels = [row["label"] for row in rows]
        expected = raw.column("label").to_pylist()
        assert labels == pytest.approx([float(v) for v in expected]) if spec.regression else \
            labels == [int(v) for v in expected]
        if spec.format == "multiple_choice":
            assert all(len(row["choices"]) == spec.num_choices for row in rows)
            assert rows[0]["context"] in ("context a", "story a why a?")
        else:
            assert rows[0][spec.text_columns[0]] in ("first a", "bad")


def test_a_missing_dataset_names_the_task_folder_and_files(mirror):
    spec = get_task("rte")
    (mirror / "nyu-mll/glue/rte/validation/0000.parquet").unlink()
    with pytest.raises(LayersimError) as error:
        hub_table(spec, "validation")
    message = str(error.value)
    assert message.startswith(f"could not download task 'rte' from the hub mirror {mirror / 'nyu-mll/glue'} "
                              f"({HUB_MIRROR_ENV}), files rte/validation/*.parquet: ")
    assert message.endswith("without network use an offline task: synth-negation, synth-roles, synth-similarity, "
                            "synth-choice.") and "\n" not in message


def test_download_stage_reads_the_hub_layout(mirror, tmp_path):
    """The real stage, as dvc.yaml runs it, with a pinned revision in params (ignored by a mirror)."""
    params = tmp_path / "params.yaml"
    params.write_text("model: tiny-bert\ntasks: [boolq]\nseeds: [1]\n"
                      "finetune: {max_length: 64}\ndownload: {revisions: {boolq: 0123abcd}}\n")
    out = tmp_path / "tasks" / "boolq"
    result = subprocess.run([sys.executable, str(ROOT / "stages" / "download_task.py"), "--params", str(params),
                             "boolq", str(out)], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    train = pq.read_table(out / "train.parquet")
    assert train.column("text_a").to_pylist() == ["first a", "first b", "first c"]
    assert train.column("text_b").to_pylist() == ["second a", "second b", "second c"]


@pytest.mark.parametrize("revisions, message", [
    ({"synth-negation": "main"}, "download.revisions has the task 'synth-negation', which has no hub dataset"),
    ({"rte": "../main"}, "download.revisions.rte = '../main' is invalid"),
    ({"rte": "main; rm -rf /"}, "download.revisions.rte = 'main; rm -rf /' is invalid"),
    ({"rte": 3}, "download.revisions.rte = 3 is invalid"),
    (["rte"], "download.revisions = ['rte'] is invalid"),
])
def test_bad_revisions_are_refused(tmp_path, revisions, message):
    from layersim.params import load_params

    path = tmp_path / "params.yaml"
    path.write_text(json.dumps({"model": "tiny-bert", "tasks": ["rte"], "seeds": [1],
                                "download": {"revisions": revisions}}))
    with pytest.raises(LayersimError) as error:
        load_params(path)
    assert message in str(error.value)


def test_an_unreachable_hub_model_names_the_model_and_revision(tmp_path, monkeypatch):
    from layersim.models.registry import snapshot_model

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache: nothing to fall back on
    with pytest.raises(LayersimError) as error:
        snapshot_model("layersim-test/not-in-any-cache", tmp_path / "model")
    message = str(error.value)
    assert message.startswith("could not download model 'layersim-test/not-in-any-cache' from the Hugging Face hub "
                              "(layersim-test/not-in-any-cache at revision 'main'): ")
    assert "without network use an offline model: " in message and "tiny-bert" in message and "\n" not in message
