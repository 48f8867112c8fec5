"""Hub tables whose labels are text (a mirror or CSV export): the task's label names become class indices, digits
their numbers, anything else one sentence naming the value and the valid names (layersim.data.tasks.hub_labels)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from layersim.data.tasks import get_task, normalize_hub_table
from layersim.errors import LayersimError

SOURCE = {"hub": "nyu-mll/glue", "config": "rte", "revision": "mirror /srv/hub"}


def _rte(labels: list) -> pa.Table:
    n = len(labels)
    return pa.table({"sentence1": [f"a{k}" for k in range(n)], "sentence2": [f"b{k}" for k in range(n)],
                     "label": labels})


def test_label_names_and_digits_become_class_indices() -> None:
    table = normalize_hub_table(get_task("rte"), _rte(["not_entailment", "entailment", "1", " 0 ", "entailment"]),
                                "train", SOURCE)
    assert table.column("label").to_pylist() == [1, 0, 1, 0, 0]
    assert table.schema.field("label").type == pa.int64()
    assert normalize_hub_table(get_task("rte"), _rte([1, 0]), "train", SOURCE).column("label").to_pylist() == [1, 0]


@pytest.mark.parametrize("labels, shown", [
    (["entailment", "contradiction"], "'contradiction'"),
    (["Entailment"], "'Entailment'"),  # label names are matched exactly, as the task declares them
    ([None], "None"),
])
def test_another_label_is_one_sentence_with_the_valid_names(labels, shown: str) -> None:
    with pytest.raises(LayersimError) as raised:
        normalize_hub_table(get_task("rte"), _rte(labels), "validation", SOURCE)
    assert str(raised.value) == (
        f"the validation table of task 'rte' (nyu-mll/glue, read from the mirror /srv/hub) has label {shown}, which "
        "is not a class index or one of its label names (entailment, not_entailment); fix that file, or point "
        "LAYERSIM_HUB_MIRROR at a copy of the dataset whose labels are those.")


def test_regression_labels_are_numbers_even_as_text() -> None:
    spec = get_task("stsb")
    table = pa.table({"sentence1": ["a", "b"], "sentence2": ["c", "d"], "label": ["3.5", "1"]})
    assert normalize_hub_table(spec, table, "train", SOURCE).column("label").to_pylist() == [3.5, 1.0]
    bad = pa.table({"sentence1": ["a"], "sentence2": ["c"], "label": ["similar"]})
    with pytest.raises(LayersimError, match=r"has label 'similar', which is not a number; fix that file"):
        normalize_hub_table(spec, bad, "train", SOURCE)


@pytest.mark.parametrize("labels, shown", [([0, 1, 3], "3"), ([-1, 0], "-1"), (["6"], "6")])
def test_a_label_outside_the_tasks_classes_is_refused_before_it_is_written(labels, shown: str) -> None:
    """Written as is, -1 … 6 for two classes would stop fine-tuning with an index error (issue 49)."""
    with pytest.raises(LayersimError) as raised:
        normalize_hub_table(get_task("rte"), _rte(labels), "train", SOURCE)
    assert str(raised.value) == (
        f"the train table of task 'rte' (nyu-mll/glue, read from the mirror /srv/hub) has label {shown}, outside the "
        "task's 2 classes (0 … 1); fix that file, or declare the labels it uses.")


@pytest.mark.parametrize("column", ["sentence1", "sentence2"])
def test_a_missing_text_is_refused_before_it_is_written(column: str) -> None:
    """Issue 49: a mirror table with null texts was written, and fine-tuning then said to re-run download_task,
    which wrote the same table."""
    table = _rte([0, 1, 0])
    table = table.set_column(table.column_names.index(column), column, pa.array(["x", None, "z"]))
    with pytest.raises(LayersimError) as raised:
        normalize_hub_table(get_task("rte"), table, "train", SOURCE)
    assert str(raised.value) == (
        f"the train table of task 'rte' (nyu-mll/glue, read from the mirror /srv/hub) has None in text column "
        f"{column!r} (row 1), not a text; fix that file, or point LAYERSIM_HUB_MIRROR at a copy of the dataset whose "
        "texts are all present.")


def test_a_mirror_table_without_rows_is_one_sentence(tmp_path, monkeypatch) -> None:
    """Issue 49: an empty Parquet split of a hub mirror was a DatasetGenerationError traceback from datasets."""
    import pyarrow.parquet as pq

    from layersim.data.tasks import HUB_MIRROR_ENV, hub_table

    folder = tmp_path / "nyu-mll" / "glue" / "rte" / "train"
    folder.mkdir(parents=True)
    pq.write_table(_rte([]).cast(pa.schema([("sentence1", pa.string()), ("sentence2", pa.string()),
                                            ("label", pa.int64())])), folder / "0000.parquet")
    monkeypatch.setenv(HUB_MIRROR_ENV, str(tmp_path))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(LayersimError, match=r"the train files of task 'rte' \(.*glue, rte/train/\*\.parquet\) cannot be "
                                            r"read: .*; a split needs a Parquet table with at least one row"):
        hub_table(get_task("rte"), "train")
