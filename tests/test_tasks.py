"""Tests for the task registry (layersim.data.tasks) and the checked task-table reader (layersim.data.io).

The hub tests build, for every paper task, a small Parquet file with exactly the column names and
dtypes of the dataset on the Hugging Face hub, load it through `datasets` the way `hub_table` does
(`dataset.data.table`), and check the normalized table of docs/architecture.md "Data contracts". No network.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from layersim.data import io
from layersim.errors import LayersimError
from layersim.data.tasks import (PAPER_TASKS, TASKS, TEXT_COLUMNS, generated_table, get_task, normalize_hub_table,
                                 subsample)
from layersim.data.tasks.generated import GENERATED_TASKS

PAPER = ("cola", "mnli", "mrpc", "qnli", "qqp", "rte", "sst2", "stsb", "boolq", "yelp_polarity",
         "hellaswag", "cosmosqa")


def _meta(table: pa.Table) -> dict:
    raw = (table.schema.metadata or {}).get(b"layersim")
    assert raw is not None, "normalized table carries no layersim metadata"
    return json.loads(raw)


# --- registry --------------------------------------------------------------------------------------


def test_paper_tasks_are_the_twelve_of_the_paper() -> None:
    assert PAPER_TASKS == PAPER
    for name in PAPER:
        assert get_task(name).hub is not None, name


def test_registry_holds_paper_and_generated_tasks_only() -> None:
    assert set(TASKS) == set(PAPER) | set(GENERATED_TASKS)
    for name, spec in TASKS.items():
        assert spec.name == name
        assert spec.format in TEXT_COLUMNS


@pytest.mark.parametrize(
    "name, fmt, metrics",
    [
        ("cola", "single", ("mcc",)),
        ("mnli", "pair", ("accuracy",)),
        ("mrpc", "pair", ("f1", "accuracy")),
        ("qnli", "pair", ("accuracy",)),
        ("qqp", "pair", ("f1", "accuracy")),
        ("rte", "pair", ("accuracy",)),
        ("sst2", "single", ("accuracy",)),
        ("stsb", "pair", ("pearson", "spearman")),
        ("boolq", "pair", ("accuracy",)),
        ("yelp_polarity", "single", ("accuracy",)),
        ("hellaswag", "multiple_choice", ("accuracy",)),
        ("cosmosqa", "multiple_choice", ("accuracy",)),
    ],
)
def test_paper_task_format_and_metrics(name: str, fmt: str, metrics: tuple[str, ...]) -> None:
    spec = get_task(name)
    assert spec.format == fmt
    assert spec.metrics == metrics
    assert spec.primary_metric == metrics[0]
    assert spec.text_columns == TEXT_COLUMNS[fmt]


def test_classification_tasks_have_label_names_and_int_labels() -> None:
    for name in ("cola", "mrpc", "qnli", "qqp", "rte", "sst2", "boolq", "yelp_polarity"):
        spec = get_task(name)
        assert len(spec.label_names) == 2 and spec.num_labels == 2, name
        assert not spec.regression and spec.label_type == pa.int64(), name
    mnli = get_task("mnli")
    assert mnli.label_names == ("entailment", "neutral", "contradiction")
    assert mnli.num_labels == 3


def test_stsb_is_regression_with_float_labels() -> None:
    spec = get_task("stsb")
    assert spec.regression is True
    assert spec.label_type == pa.float64()
    assert spec.num_labels == 1
    assert set(spec.metrics) == {"pearson", "spearman"}


@pytest.mark.parametrize("name", ["hellaswag", "cosmosqa"])
def test_multiple_choice_tasks_have_four_choices(name: str) -> None:
    spec = get_task(name)
    assert spec.format == "multiple_choice"
    assert spec.num_choices == 4
    assert spec.num_labels == 1  # one score per choice
    assert spec.text_columns == ("context", "choices")


def test_hub_splits() -> None:
    assert get_task("mnli").hub.splits["validation"] == "validation_matched"
    assert get_task("mnli").hub.splits["train"] == "train"
    # Yelp Polarity has no validation split; the paper evaluates on test.
    assert get_task("yelp_polarity").hub.splits["validation"] == "test"
    assert get_task("rte").hub.splits == {"train": "train", "validation": "validation"}


def test_hub_sources() -> None:
    glue = [n for n in PAPER if n not in ("boolq", "yelp_polarity", "hellaswag", "cosmosqa")]
    for name in glue:
        assert get_task(name).hub.path == "nyu-mll/glue"
        assert get_task(name).hub.config == name
    assert (get_task("boolq").hub.path, get_task("boolq").hub.config) == ("aps/super_glue", "boolq")
    assert get_task("hellaswag").hub.path == "Rowan/hellaswag"
    assert get_task("cosmosqa").hub.path == "allenai/cosmos_qa"


@pytest.mark.parametrize(
    "name, fmt, regression, num_choices",
    [
        ("synth-negation", "single", False, 0),
        ("synth-roles", "pair", False, 0),
        ("synth-similarity", "pair", True, 0),
        ("synth-choice", "multiple_choice", False, 4),
    ],
)
def test_generated_tasks_one_per_format(name: str, fmt: str, regression: bool, num_choices: int) -> None:
    spec = get_task(name)
    assert spec.hub is None
    assert spec.format == fmt
    assert spec.regression is regression
    assert spec.num_choices == num_choices
    assert spec.label_type == (pa.float64() if regression else pa.int64())


@pytest.mark.parametrize("bad", ["RTE", "rte ", "glue/rte", "sst-2", "", "nope"])
def test_get_task_unknown_name(bad: str) -> None:
    with pytest.raises(LayersimError) as info:
        get_task(bad)
    message = str(info.value)
    assert repr(bad) in message
    for valid in ("cola", "cosmosqa", "synth-choice", "yelp_polarity"):
        assert valid in message


@pytest.mark.parametrize("bad", [["rte"], None, 3, ("rte",)])
def test_get_task_non_string(bad: object) -> None:
    with pytest.raises(LayersimError) as info:
        get_task(bad)
    message = str(info.value)
    assert repr(bad) in message
    assert "rte" in message and "synth-negation" in message


# --- hub tables ------------------------------------------------------------------------------------

S = pa.string()


def _glue_single() -> tuple[pa.Table, dict]:
    table = pa.table({
        "sentence": pa.array(["the cat sat .", "cat the sat on", "we left ."], S),
        "label": pa.array([1, 0, 1], pa.int64()),
        "idx": pa.array([10, 11, 12], pa.int32()),
    })
    return table, {"text": ["the cat sat .", "cat the sat on", "we left ."], "label": [1, 0, 1]}


def _glue_pair(col_a: str, col_b: str, labels: list, label_type=pa.int64()) -> tuple[pa.Table, dict]:
    a = ["first a", "second a", "third a", "fourth a"]
    b = ["first b", "second b", "third b", "fourth b"]
    table = pa.table({
        col_a: pa.array(a, S),
        col_b: pa.array(b, S),
        "label": pa.array(labels, label_type),
        "idx": pa.array([7, 3, 9, 1], pa.int32()),
    })
    return table, {"text_a": a, "text_b": b, "label": labels}


def _boolq() -> tuple[pa.Table, dict]:
    q = ["is the sky blue", "do cats bark", "is water wet"]
    p = ["The sky is blue by day.", "Cats meow; dogs bark.", "Water makes things wet."]
    table = pa.table({  # aps/super_glue boolq column order
        "question": pa.array(q, S),
        "passage": pa.array(p, S),
        "idx": pa.array([0, 1, 2], pa.int32()),
        "label": pa.array([1, 0, 1], pa.int64()),
    })
    return table, {"text_a": q, "text_b": p, "label": [1, 0, 1]}


def _yelp() -> tuple[pa.Table, dict]:
    text = ["great food", "awful service", "ok i guess", "would return"]
    table = pa.table({"label": pa.array([1, 0, 0, 1], pa.int64()), "text": pa.array(text, S)})
    return table, {"text": text, "label": [1, 0, 0, 1]}


def _hellaswag() -> tuple[pa.Table, dict]:
    endings = [
        ["runs away .", "sits down .", "eats a cake .", "flies off ."],
        ["paints a wall .", "jumps .", "sleeps .", "sings a song ."],
        ["a", "b", "c", "d"],
    ]
    ctx_a = ["A man is in a park.", "A woman holds a brush.", "Someone"]
    ctx_b = ["he", "she", "then"]
    ctx = [f"{x} {y}" for x, y in zip(ctx_a, ctx_b)]
    table = pa.table({  # Rowan/hellaswag column names and dtypes; label is a string
        "ind": pa.array([4, 8, 15], pa.int32()),
        "activity_label": pa.array(["Running", "Painting", "Misc"], S),
        "ctx_a": pa.array(ctx_a, S),
        "ctx_b": pa.array(ctx_b, S),
        "ctx": pa.array(ctx, S),
        "endings": pa.array(endings, pa.list_(S)),
        "source_id": pa.array(["activitynet~v_1", "activitynet~v_2", "wikihow~3"], S),
        "split": pa.array(["val", "val", "val"], S),
        "split_type": pa.array(["indomain", "zeroshot", "indomain"], S),
        "label": pa.array(["2", "0", "3"], S),
    })
    return table, {"context": ctx, "choices": endings, "label": [2, 0, 3]}


def _cosmosqa() -> tuple[pa.Table, dict]:
    context = ["I went to the shop.", "It rained all day.", "She passed the exam."]
    question = ["Why did I go?", "What happened next?", "How did she feel?"]
    answers = [[f"answer {k} of {i}" for k in range(4)] for i in range(3)]
    table = pa.table({  # allenai/cosmos_qa column names and dtypes
        "id": pa.array(["3Q9S", "3A7Y", "3X0T"], S),
        "context": pa.array(context, S),
        "question": pa.array(question, S),
        **{f"answer{k}": pa.array([a[k] for a in answers], S) for k in range(4)},
        "label": pa.array([3, 0, 1], pa.int32()),
    })
    expected_context = [f"{c} {q}" for c, q in zip(context, question)]
    return table, {"context": expected_context, "choices": answers, "label": [3, 0, 1]}


HUB_TABLES = {
    "cola": _glue_single,
    "sst2": _glue_single,
    "mnli": lambda: _glue_pair("premise", "hypothesis", [0, 2, 1, 0]),
    "mrpc": lambda: _glue_pair("sentence1", "sentence2", [1, 0, 1, 1]),
    "qnli": lambda: _glue_pair("question", "sentence", [0, 1, 1, 0]),
    "qqp": lambda: _glue_pair("question1", "question2", [0, 0, 1, 1]),
    "rte": lambda: _glue_pair("sentence1", "sentence2", [1, 0, 0, 1]),
    "stsb": lambda: _glue_pair("sentence1", "sentence2", [0.0, 3.2, 5.0, 1.75], pa.float32()),
    "boolq": _boolq,
    "yelp_polarity": _yelp,
    "hellaswag": _hellaswag,
    "cosmosqa": _cosmosqa,
}


def test_every_paper_task_has_a_hub_fixture() -> None:
    assert set(HUB_TABLES) == set(PAPER_TASKS)


def _through_datasets(table: pa.Table, tmp_path: Path) -> pa.Table:
    """Write `table` as Parquet and load it back the way `hub_table` sees a hub dataset."""
    import datasets

    path = tmp_path / "hub.parquet"
    pq.write_table(table, path)
    dataset = datasets.load_dataset("parquet", data_files=str(path), split="train",
                                    cache_dir=str(tmp_path / "hf-cache"))
    loaded = dataset.data.table
    assert isinstance(loaded, pa.Table)
    assert loaded.column_names == table.column_names
    return loaded


@pytest.mark.parametrize("name", PAPER)
def test_normalize_hub_table(name: str, tmp_path: Path) -> None:
    spec = get_task(name)
    hub, expected = HUB_TABLES[name]()
    loaded = _through_datasets(hub, tmp_path)
    table = normalize_hub_table(spec, loaded, "validation")

    n = hub.num_rows
    assert table.column_names == ["example_id", "cluster_id", *spec.text_columns, "label"]
    assert table.num_rows == n
    shared = hub.column(spec.shared).to_pylist() if spec.shared else list(range(n))
    clusters = table.column("cluster_id").to_pylist()
    assert all((shared[i] == shared[j]) == (clusters[i] == clusters[j]) for i in range(n) for j in range(n))
    assert table.schema.field("example_id").type == pa.int64()
    assert table.column("example_id").to_pylist() == list(range(n))  # not the hub's idx/ind/id
    assert table.schema.field("label").type == (pa.float64() if name == "stsb" else pa.int64())
    for column in spec.text_columns:
        want_type = pa.list_(pa.string()) if column == "choices" else pa.string()
        assert table.schema.field(column).type == want_type, column
        assert table.column(column).to_pylist() == expected[column], column
    labels = table.column("label").to_pylist()
    if name == "stsb":
        # float32 on the hub: compare at float32 precision.
        np.testing.assert_allclose(labels, expected["label"], rtol=1e-6)
        assert all(isinstance(v, float) for v in labels)
    else:
        assert labels == expected["label"]
        assert all(type(v) is int for v in labels)

    meta = _meta(table)
    assert meta["task"] == name
    assert meta["split"] == "validation"
    assert meta["format"] == spec.format
    assert meta["metrics"] == list(spec.metrics)
    assert meta["label_names"] == list(spec.label_names)
    assert meta["regression"] is spec.regression
    assert meta["source"]["hub"] == spec.hub.path
    # The hub's own schema metadata (e.g. b"huggingface") is not carried over.
    assert set(table.schema.metadata) == {b"layersim"}


@pytest.mark.parametrize("name, column", [("mnli", "premise"), ("qnli", "question")])
def test_examples_sharing_a_text_share_a_cluster(name: str, column: str) -> None:
    """Several hypotheses of one premise (or sentences of one question) form one cluster, keyed by the first
    example that has the text; other examples stay clusters of their own."""
    hub, _ = HUB_TABLES[name]()
    shared = ["one premise", "another", "one premise", "one premise"]
    hub = hub.set_column(hub.column_names.index(column), column, pa.array(shared, S))
    table = normalize_hub_table(get_task(name), hub, "validation")
    assert table.column("cluster_id").to_pylist() == [0, 1, 0, 0]
    assert _meta(table)["shared"] == column


def test_clusters_count_only_the_declared_column() -> None:
    """A task that declares nothing shared (RTE) keeps every example its own cluster, repeated texts or not."""
    hub, _ = HUB_TABLES["rte"]()
    hub = hub.set_column(0, "sentence1", pa.array(["same"] * 4, S))
    table = normalize_hub_table(get_task("rte"), hub, "validation")
    assert table.column("cluster_id").to_pylist() == table.column("example_id").to_pylist()


def test_normalize_hub_table_records_given_split_and_source() -> None:
    spec = get_task("rte")
    hub, _ = _glue_pair("sentence1", "sentence2", [1, 0, 0, 1])
    source = {"hub": "nyu-mll/glue", "config": "rte", "split": "train", "revision": "abc"}
    meta = _meta(normalize_hub_table(spec, hub, "train", source))
    assert meta["split"] == "train"
    assert meta["source"] == source


def test_hellaswag_string_labels_become_ints() -> None:
    hub, _ = _hellaswag()
    table = normalize_hub_table(get_task("hellaswag"), hub, "validation")
    assert table.column("label").type == pa.int64()
    assert table.column("label").to_pylist() == [2, 0, 3]
    assert table.column("choices").to_pylist()[0] == ["runs away .", "sits down .", "eats a cake .", "flies off ."]


@pytest.mark.parametrize(
    "name, drop",
    [("cola", "sentence"), ("mnli", "hypothesis"), ("boolq", "passage"), ("hellaswag", "endings"),
     ("hellaswag", "ctx"), ("cosmosqa", "answer2"), ("cosmosqa", "question"), ("stsb", "label")],
)
def test_hub_table_missing_column(name: str, drop: str) -> None:
    hub, _ = HUB_TABLES[name]()
    hub = hub.drop_columns([drop])
    with pytest.raises(LayersimError) as info:
        normalize_hub_table(get_task(name), hub, "validation")
    message = str(info.value)
    assert repr(drop) in message
    assert repr(name) in message


@pytest.mark.parametrize("count", [3, 5])
def test_hub_table_wrong_number_of_choices(count: int) -> None:
    hub, _ = _hellaswag()
    endings = [[f"e{k}" for k in range(4)], [f"e{k}" for k in range(count)], [f"e{k}" for k in range(4)]]
    hub = hub.set_column(hub.column_names.index("endings"), "endings", pa.array(endings, pa.list_(S)))
    with pytest.raises(LayersimError) as info:
        normalize_hub_table(get_task("hellaswag"), hub, "validation")
    message = str(info.value)
    assert "4" in message and str(count) in message


def test_normalize_hub_table_refuses_generated_task() -> None:
    hub, _ = _glue_single()
    with pytest.raises(LayersimError, match="synth-negation"):
        normalize_hub_table(get_task("synth-negation"), hub, "validation")


# --- generated tables ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", GENERATED_TASKS)
@pytest.mark.parametrize("split", ["train", "validation"])
def test_generated_table(name: str, split: str) -> None:
    spec = get_task(name)
    table = generated_table(spec, split, 12, seed=3)
    assert table.column_names == ["example_id", "cluster_id", *spec.text_columns, "label"]
    assert table.column("cluster_id").to_pylist() == list(range(12))  # generated examples share nothing
    assert table.num_rows == 12
    assert table.column("example_id").type == pa.int64()
    assert table.column("example_id").to_pylist() == list(range(12))
    assert table.schema.field("label").type == spec.label_type
    for column in spec.text_columns:
        if column == "choices":
            assert table.schema.field(column).type == pa.list_(pa.string())
            assert all(len(c) == spec.num_choices for c in table.column(column).to_pylist())
        else:
            assert table.schema.field(column).type == pa.string()
            assert all(isinstance(t, str) and t for t in table.column(column).to_pylist())
    labels = table.column("label").to_pylist()
    if spec.regression:
        assert all(0.0 <= v <= 5.0 for v in labels)
    elif spec.format == "multiple_choice":
        assert all(0 <= v < spec.num_choices for v in labels)
    else:
        assert all(0 <= v < len(spec.label_names) for v in labels)

    meta = _meta(table)
    assert (meta["task"], meta["split"], meta["format"]) == (name, split, spec.format)
    assert meta["source"] == {"generator": name, "seed": 3, "num_examples": 12}
    assert meta["metrics"] == list(spec.metrics)

    again = generated_table(spec, split, 12, seed=3)
    assert again.equals(table, check_metadata=True)


# --- subsample -------------------------------------------------------------------------------------


def _numbered(n: int) -> pa.Table:
    return pa.table({"example_id": pa.array(np.arange(n), pa.int64()),
                     "text": pa.array([f"row {i}" for i in range(n)])})


def test_subsample_keeps_count_and_order() -> None:
    table = _numbered(100)
    small = subsample(table, 10, seed=0)
    ids = small.column("example_id").to_pylist()
    assert small.num_rows == 10
    assert len(set(ids)) == 10
    assert ids == sorted(ids)
    assert ids != list(range(10))  # a draw, not the head of the table
    # Rows stay whole: text matches its id.
    assert small.column("text").to_pylist() == [f"row {i}" for i in ids]
    assert small.column_names == table.column_names


def test_subsample_is_deterministic_and_seeded() -> None:
    table = _numbered(200)
    a = subsample(table, 20, seed=5)
    assert a.equals(subsample(table, 20, seed=5))
    draws = {tuple(subsample(table, 20, seed=s).column("example_id").to_pylist()) for s in range(5)}
    assert len(draws) > 1


@pytest.mark.parametrize("limit", [None, 50, 51, 10_000])
def test_subsample_identity(limit: int | None) -> None:
    table = _numbered(50)
    assert subsample(table, limit, seed=1).equals(table)


def test_subsample_keeps_schema_metadata() -> None:
    table = generated_table(get_task("synth-roles"), "validation", 30, seed=0)
    small = subsample(table, 7, seed=0)
    assert small.num_rows == 7
    assert _meta(small) == _meta(table)


# --- io.read_task_table ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", GENERATED_TASKS)
def test_read_task_table_round_trip(name: str, tmp_path: Path) -> None:
    spec = get_task(name)
    table = generated_table(spec, "validation", 9, seed=2)
    io.write_parquet(table, tmp_path / "validation.parquet")
    assert [p.name for p in tmp_path.iterdir()] == ["validation.parquet"]  # no temporary left behind
    read = io.read_task_table(tmp_path, spec, "validation")
    assert read.equals(table)
    assert _meta(read) == _meta(table)


def test_read_task_table_round_trip_hub(tmp_path: Path) -> None:
    spec = get_task("cosmosqa")
    hub, _ = _cosmosqa()
    table = normalize_hub_table(spec, hub, "train")
    io.write_parquet(table, tmp_path / "train.parquet")
    assert io.read_task_table(tmp_path, spec, "train").equals(table)


def test_read_task_table_refuses_other_task(tmp_path: Path) -> None:
    table = generated_table(get_task("synth-roles"), "validation", 5, seed=0)
    io.write_parquet(table, tmp_path / "validation.parquet")
    # synth-similarity has the same columns, so only the metadata can tell them apart.
    with pytest.raises(LayersimError) as info:
        io.read_task_table(tmp_path, get_task("synth-similarity"), "validation")
    assert "'synth-roles'" in str(info.value) and "'synth-similarity'" in str(info.value)


def test_read_task_table_refuses_other_split(tmp_path: Path) -> None:
    spec = get_task("synth-negation")
    io.write_parquet(generated_table(spec, "train", 5, seed=0), tmp_path / "validation.parquet")
    with pytest.raises(LayersimError) as info:
        io.read_task_table(tmp_path, spec, "validation")
    assert "'train'" in str(info.value) and "'validation'" in str(info.value)


def test_read_task_table_missing_file(tmp_path: Path) -> None:
    with pytest.raises(LayersimError) as info:
        io.read_task_table(tmp_path / "rte", get_task("rte"), "validation")
    message = str(info.value)
    assert "download_task" in message
    assert "validation.parquet" in message
    assert "'rte'" in message


def test_read_task_table_refuses_table_without_metadata(tmp_path: Path) -> None:
    spec = get_task("synth-negation")
    table = generated_table(spec, "validation", 5, seed=0).replace_schema_metadata(None)
    pq.write_table(table, tmp_path / "validation.parquet")
    with pytest.raises(LayersimError, match="metadata"):
        io.read_task_table(tmp_path, spec, "validation")


def test_read_task_table_refuses_wrong_columns(tmp_path: Path) -> None:
    spec = get_task("synth-roles")
    table = generated_table(spec, "validation", 5, seed=0)
    io.write_parquet(table.drop_columns(["text_b"]), tmp_path / "validation.parquet")
    with pytest.raises(LayersimError, match="text_b"):
        io.read_task_table(tmp_path, spec, "validation")


def test_read_task_table_refuses_a_table_without_clusters(tmp_path: Path) -> None:
    """A task table written before cluster_id existed: one sentence naming the column and the stage to re-run."""
    spec = get_task("synth-roles")
    io.write_parquet(generated_table(spec, "validation", 5, seed=0).drop_columns(["cluster_id"]),
                     tmp_path / "validation.parquet")
    with pytest.raises(LayersimError, match="cluster_id.*re-run the download_task stage"):
        io.read_task_table(tmp_path, spec, "validation")


def test_unreachable_hub_points_to_the_builtin_tasks():
    # conftest sets HF_HUB_OFFLINE=1, which makes the hub unreachable at once.
    from layersim.data.tasks import hub_table

    with pytest.raises(LayersimError) as info:
        hub_table(get_task("rte"), "train")
    message = str(info.value)
    assert "'rte'" in message and "hub" in message and "synth-negation" in message
