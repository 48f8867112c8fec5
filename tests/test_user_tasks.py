"""User tasks (params.yaml's user_tasks): declared on the user's files, written by download_task as the
registry's task-table contract, and every bad file refused with one sentence before anything is written."""

from __future__ import annotations

import importlib.util
import json
from argparse import Namespace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, reject, settings
from hypothesis import strategies as st

from layersim.errors import LayersimError
from layersim.data.io.task_tables import read_task_table
from layersim.data.layout import task_tables
from layersim.params import MIN_EXAMPLES, parse_params
from layersim.params import user_tasks as declared
from layersim.data.tasks import FORMATS, TASKS, get_task
from layersim.data.tasks import user as user_module
from layersim.data.tasks.user_files import MAX_FIELD_CHARS

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("download_task_stage", REPO / "stages" / "download_task.py")
download_task = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(download_task)


def _params(user_tasks: dict, tasks: list[str] | None = None):
    return parse_params({"model": "tiny-bert", "tasks": tasks or list(user_tasks), "seeds": [1],
                         "finetune": {"max_length": 32}, "user_tasks": user_tasks})


def _csv(rows: list[list], header=("sentence", "label")) -> str:
    return "\n".join([",".join(header), *(",".join(map(str, row)) for row in rows)]) + "\n"


TRAIN = [[f"sentence number {i}", "pos" if i % 2 else "neg"] for i in range(20)]
DEV = [[f"held out {i}", "neg" if i % 3 else "pos"] for i in range(12)]
CSV_TASK = {"train": "user_data/train.csv", "validation": "user_data/dev.csv", "text": ["sentence"]}
HUB_TASK = {"dataset": "owner/reviews", "text": ["sentence"], "label_names": ["neg", "pos"]}


@pytest.fixture
def project(tmp_path, monkeypatch):
    """An empty repository root (the working directory) with a user_data/ folder."""
    (tmp_path / "user_data").mkdir()
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    parse_params({"model": "minilm-l6", "tasks": ["synth-negation"], "seeds": [1]})  # no user tasks left behind


def _write(files: dict[str, str | bytes]) -> None:
    for name, content in files.items():
        path = Path("user_data") / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")


def _download(name: str, params) -> Path:
    out = task_tables("data/tasks", name)
    download_task.main(Namespace(task=name, out=out), params)
    return out


# --- good files ------------------------------------------------------------------------------------

def test_a_csv_task_is_the_task_table_contract(project):
    _write({"train.csv": _csv(TRAIN), "dev.csv": _csv(DEV)})
    params = _params({"mine": CSV_TASK})
    out = _download("mine", params)
    spec = get_task("mine")  # label names read back from the table: the training rows' sorted names
    assert spec.label_names == ("neg", "pos") and spec.num_labels == 2 and spec.metrics == ("accuracy",)
    train = read_task_table(out, spec, "train")  # the checked reader every later stage uses
    assert train.column("example_id").to_pylist() == list(range(20))
    assert train.column("label").to_pylist() == [i % 2 for i in range(20)]
    assert train.column("text").to_pylist()[3] == "sentence number 3"
    meta = json.loads(pq.read_schema(out / "validation.parquet").metadata[b"layersim"])
    assert meta["task"] == "mine" and meta["format"] == "single" and meta["label_names"] == ["neg", "pos"]
    import hashlib
    files = meta["source"]["user_files"]
    assert files["validation"]["path"] == "user_data/dev.csv"
    assert files["validation"]["sha256"] == hashlib.sha256(Path("user_data/dev.csv").read_bytes()).hexdigest()


def test_a_tsv_pair_regression_task(project):
    rows = "\n".join(f"first {i}\tsecond \"{i}\t{i / 4}" for i in range(15))  # TSV: quotes are text
    _write({"t.tsv": "a\tb\tscore\n" + rows + "\n", "d.tsv": "a\tb\tscore\n" + rows + "\n"})
    _download("sts", _params({"sts": {"train": "user_data/t.tsv", "validation": "user_data/d.tsv", "format": "pair",
                                      "text": ["a", "b"], "label": "score", "regression": True}}))
    spec = get_task("sts")
    assert spec.regression and spec.metrics == ("pearson", "spearman") and spec.num_labels == 1
    table = read_task_table(task_tables("data/tasks", "sts"), spec, "validation")
    assert table.column("text_b").to_pylist()[2] == 'second "2' and table.column("label").to_pylist()[5] == 1.25
    assert table.schema.field("label").type == pa.float64()


def test_jsonl_multiple_choice_and_parquet_with_declared_names(project):
    lines = [json.dumps({"q": f"question {i}", "a": "x", "b": "y", "c": "z", "answer": i % 3}) for i in range(12)]
    _write({"mc.jsonl": "\n".join(lines) + "\n\n", "mc_dev.jsonl": "\n".join(lines)})
    pq.write_table(pa.table({"text": [f"t{i}" for i in range(40)], "label": [i % 2 for i in range(40)]}),
                   "user_data/p.parquet")
    params = _params({"mc": {"train": "user_data/mc.jsonl", "validation": "user_data/mc_dev.jsonl",
                             "format": "multiple_choice", "text": ["q", "a", "b", "c"], "label": "answer"},
                      "pq": {"train": "user_data/p.parquet", "validation_fraction": 0.3,
                             "label_names": ["no", "yes"], "metrics": ["mcc", "accuracy"]}})
    _download("mc", params)
    _download("pq", params)
    mc = get_task("mc")
    assert mc.num_choices == 3 and mc.num_labels == 1
    table = read_task_table(task_tables("data/tasks", "mc"), mc, "train")
    assert table.column("choices").to_pylist()[0] == ["x", "y", "z"]
    assert table.column("label").to_pylist()[:4] == [0, 1, 2, 0]
    pq_spec = get_task("pq")
    assert pq_spec.label_names == ("no", "yes") and pq_spec.primary_metric == "mcc"
    rows = {s: read_task_table(task_tables("data/tasks", "pq"), pq_spec, s).column("example_id").to_pylist()
            for s in ("train", "validation")}
    assert len(rows["validation"]) == 12 and sorted(rows["train"] + rows["validation"]) == list(range(40))


def test_a_group_column_or_a_shared_text_makes_the_clusters(project):
    """user_tasks.<name>.group: rows with equal values share a cluster (the first such example's id), whether the
    column is a group label or one of the text columns (a premise repeated across hypotheses)."""
    rows = [[f"premise {i // 3}", f"hypothesis {i}", f"g{i // 3}", i % 2] for i in range(24)]
    header = ("premise", "hypothesis", "group", "label")
    _write({"train.csv": _csv(rows, header), "dev.csv": _csv(rows[:12], header)})
    task = {"train": "user_data/train.csv", "validation": "user_data/dev.csv", "format": "pair",
            "text": ["premise", "hypothesis"]}
    params = _params({"by_group": {**task, "group": "group"}, "by_text": {**task, "group": "premise"},
                      "alone": task})
    for name in ("by_group", "by_text", "alone"):
        _download(name, params)
    clusters = {name: read_task_table(task_tables("data/tasks", name), get_task(name), "validation")
                .column("cluster_id").to_pylist() for name in ("by_group", "by_text", "alone")}
    assert clusters["by_group"] == clusters["by_text"] == [3 * (i // 3) for i in range(12)]
    assert clusters["alone"] == list(range(12))
    assert get_task("by_text").shared == "premise" and get_task("alone").shared is None


def test_the_seeded_split_is_reproducible_and_the_seed_matters(project):
    _write({"all.csv": _csv([[f"s {i}", i % 2] for i in range(40)])})

    def validation_ids(seed: int) -> list[int]:
        spec = _params({"s": {"train": "user_data/all.csv", "validation_fraction": 0.25, "split_seed": seed,
                              "text": ["sentence"]}}).user_tasks["s"]
        return user_module.user_tables(spec)["validation"].column("example_id").to_pylist()

    assert validation_ids(0) == validation_ids(0) and len(validation_ids(0)) == 10
    assert validation_ids(0) != validation_ids(1)


@settings(max_examples=25, deadline=None, derandomize=True)  # the same 25 draws on every run
@given(st.lists(st.sampled_from(["b", "a", "c d", "é"]), min_size=20, max_size=40).filter(lambda v: len(set(v)) > 1))
def test_label_ids_index_the_sorted_names_of_the_training_rows(tmp_path_factory, labels):
    root = tmp_path_factory.mktemp("prop")
    (root / "user_data").mkdir()
    (root / "user_data/t.csv").write_text(_csv([[f"x{i}", v] for i, v in enumerate(labels)]), encoding="utf-8")
    spec = _params({"p": {"train": "user_data/t.csv", "validation_fraction": 0.5,
                          "text": ["sentence"]}}).user_tasks["p"]
    import os
    cwd = os.getcwd()
    os.chdir(root)
    try:
        tables = user_module.user_tables(spec)
    except LayersimError as err:  # a draw can leave one class in the training half: refused, never mislabelled
        assert "at least two classes" in str(err)
        reject()  # not counted: Hypothesis draws until 25 splits were made and checked
    finally:
        os.chdir(cwd)
    names = json.loads(tables["train"].schema.metadata[b"layersim"])["label_names"]
    assert names == sorted(set(labels))
    for table in tables.values():
        got = [names[k] for k in table.column("label").to_pylist()]
        assert got == [labels[i] for i in table.column("example_id").to_pylist()]


def test_whole_number_labels_are_classes_and_declared_names_index_them(project):
    _write({"t.csv": _csv([[f"s{i}", f"{i % 3}.0"] for i in range(12)]),
            "d.csv": _csv([[f"d{i}", i % 3] for i in range(10)])})
    tables = user_module.user_tables(_params({"n": {**CSV_TASK, "train": "user_data/t.csv",
                                                    "validation": "user_data/d.csv"}}).user_tasks["n"])
    assert json.loads(tables["train"].schema.metadata[b"layersim"])["label_names"] == ["0", "1", "2"]
    assert tables["validation"].column("label").to_pylist()[:3] == [0, 1, 2]


# --- bad files: one sentence each, before anything is written ---------------------------------------

_LONG = "w" * (MAX_FIELD_CHARS + 1)
_NUMBERS = [[f"d{i}", i % 2] for i in range(12)]
_THREE = [[f"s{i}", ["a", "b", "c"][i % 3]] for i in range(12)]
BAD_FILES = [
    ("missing file", {"dev.csv": _csv(DEV)}, {}, ["user_tasks.mine.train", "user_data/train.csv does not exist"]),
    ("zero bytes", {"train.csv": "", "dev.csv": _csv(DEV)}, {}, ["user_data/train.csv is empty (0 bytes)"]),
    ("header only", {"train.csv": "sentence,label\n", "dev.csv": _csv(DEV)}, {},
     ["user_data/train.csv holds no rows", "train split"]),
    ("no text column", {"train.csv": _csv(TRAIN, ("text", "label")), "dev.csv": _csv(DEV)}, {},
     ["user_data/train.csv has no column 'sentence'", "'text', 'label'"]),
    ("no label column", {"train.csv": _csv(TRAIN), "dev.csv": _csv(DEV, ("sentence", "y"))}, {},
     ["user_data/dev.csv has no column 'label'", "'sentence', 'y'"]),
    ("empty text column", {"train.csv": _csv([["", "pos"]] * 12), "dev.csv": _csv(DEV)}, {},
     ["column 'sentence' is empty in all 12 rows"]),
    ("empty label column", {"train.csv": _csv([[f"s{i}", ""] for i in range(12)]), "dev.csv": _csv(DEV)}, {},
     ["label column 'label' is empty in all 12 rows"]),
    ("one empty text", {"train.csv": _csv(TRAIN[:2] + [["  ", "pos"]] + TRAIN[3:]), "dev.csv": _csv(DEV)}, {},
     ["user_data/train.csv row 3 has no text in column 'sentence'"]),
    ("one missing label", {"train.csv": _csv(TRAIN[:3] + [["x", ""]] + TRAIN[4:]), "dev.csv": _csv(DEV)}, {},
     ["row 4 has no label in column 'label'"]),
    ("mixed label types", {"train.csv": _csv([["a", 1], ["b", "pos"]] + TRAIN), "dev.csv": _csv(DEV)}, {},
     ["mixes label types", "row 2 has the name 'pos'", "row 1 the number 1"]),
    ("one class", {"train.csv": _csv([[f"s{i}", "pos"] for i in range(12)]), "dev.csv": _csv(DEV)}, {},
     ["has the label 'pos'", "at least two classes"]),
    ("extra field", {"train.csv": _csv(TRAIN[:2]) + "a,b,c\n" + _csv(TRAIN[2:])[15:], "dev.csv": _csv(DEV)}, {},
     ["user_data/train.csv line 4 has 3 field(s), the header 2"]),
    ("unclosed quote", {"train.csv": _csv(TRAIN) + '"never closed,pos\n', "dev.csv": _csv(DEV)}, {},
     ["user_data/train.csv line 22 has 1 field(s)"]),
    ("not utf-8", {"train.csv": _csv(TRAIN[:1]).encode() + "caf\u00e9,pos\n".encode("latin-1"), "dev.csv": _csv(DEV)},
     {}, ["user_data/train.csv is not UTF-8: line 3 has the byte 0xe9", "save the file as UTF-8"]),
    ("huge field", {"train.csv": _csv(TRAIN[:5] + [[_LONG, "pos"]] + TRAIN[5:]), "dev.csv": _csv(DEV)}, {},
     ["row 6 column 'sentence' holds 100,001 characters", "unclosed quote"]),
    ("label outside declared names", {"train.csv": _csv(TRAIN), "dev.csv": _csv(DEV + [["x", "neutral"]])},
     {"label_names": ["neg", "pos"]}, ["dev.csv row 13 has the label 'neutral'", "declared label_names (neg, pos)",
                                       "user_tasks.mine.label_names"]),
    ("index outside declared names", {"train.csv": _csv([[f"s{i}", i % 3] for i in range(12)]),
                                      "dev.csv": _csv(_NUMBERS)},
     {"label_names": ["neg", "pos"]}, ["train.csv row 3 has the label 2", "class index must be 0 to 1"]),
    ("validation label unseen in train", {"train.csv": _csv(TRAIN), "dev.csv": _csv(DEV[:4] + [["x", "meh"]])}, {},
     ["dev.csv row 5 has the label 'meh'", "training rows' labels (neg, pos)"]),
    ("fractional class", {"train.csv": _csv([[f"s{i}", i / 2] for i in range(12)]), "dev.csv": _csv(_NUMBERS)}, {},
     ["train.csv row 2 has the label 0.5", "set regression: true"]),
    ("names and numbers across files", {"train.csv": _csv([[f"s{i}", i % 2] for i in range(12)]),
                                        "dev.csv": _csv(DEV)}, {}, ["names in one file and numbers in the other"]),
    ("regression on names", {"train.csv": _csv(TRAIN), "dev.csv": _csv(DEV)}, {"regression": True},
     ["train.csv row 1 has the label 'neg', not a finite number"]),
    ("regression on nan", {"train.jsonl": "".join(json.dumps({"sentence": f"s{i}", "label": i}) + "\n"
                                                   for i in range(11)) + '{"sentence": "x", "label": NaN}\n',
                           "dev.csv": _csv([[f"d{i}", i] for i in range(12)])},
     {"train": "user_data/train.jsonl", "regression": True}, ["train.jsonl row 12 has the label nan"]),
    ("constant regression labels", {"train.csv": _csv([[f"s{i}", 3] for i in range(12)]),
                                    "dev.csv": _csv([[f"s{i}", i] for i in range(12)])},
     {"regression": True}, ["every training label", "is 3", "labels that vary"]),
    ("bad json line", {"train.jsonl": '{"sentence": "a", "label": 1}\n{"sentence": "b", label: 0}\n',
                       "dev.csv": _csv(DEV)}, {"train": "user_data/train.jsonl"},
     ["user_data/train.jsonl line 2 is not valid JSON"]),
    ("json line not an object", {"train.jsonl": '{"sentence": "a", "label": 1}\n[1, 2]\n', "dev.csv": _csv(DEV)},
     {"train": "user_data/train.jsonl"}, ["train.jsonl line 2 holds a JSON list, not an object"]),
    ("json text not a string", {"train.jsonl": "".join(json.dumps({"sentence": i, "label": i % 2}) + "\n"
                                                       for i in range(12)), "dev.csv": _csv(DEV)},
     {"train": "user_data/train.jsonl"}, ["train.jsonl row 1 column 'sentence' holds 0, not text"]),
    ("corrupt parquet", {"train.parquet": b"PAR1 this is not parquet", "dev.csv": _csv(DEV)},
     {"train": "user_data/train.parquet"}, ["user_data/train.parquet is not a readable Parquet file"]),
    ("column named twice", {"train.csv": _csv(TRAIN, ("sentence", "sentence")), "dev.csv": _csv(DEV)}, {},
     ["names the column 'sentence' twice"]),
    ("too few rows", {"train.csv": _csv(TRAIN), "dev.csv": _csv(DEV[:4])}, {},
     ["the validation split of user task 'mine' (user_data/dev.csv) has 4 rows, fewer than 10"]),
    ("split leaves validation empty", {"train.csv": _csv(TRAIN)}, {"validation": None, "validation_fraction": 0.01},
     ["validation_fraction = 0.01 of the 20 rows of user_data/train.csv leaves the validation split empty"]),
    ("f1 with three classes", {"train.csv": _csv(_THREE), "dev.csv": _csv(_THREE)}, {"metrics": ["f1"]},
     ["asks for f1, which scores two classes, but it has 3 (a, b, c)"]),
    ("tsv extra tab", {"train.tsv": "sentence\tlabel\n" + "".join(f"s{i}\t{i % 2}\n" for i in range(5)) + "a\tb\t1\n",
                       "dev.csv": _csv(DEV)}, {"train": "user_data/train.tsv"},
     ["user_data/train.tsv line 7 has 3 field(s), the header 2", "a tab too many"]),
    ("group value missing", {"train.csv": _csv([[f"s{i}", i % 2, "" if i == 4 else i // 3] for i in range(12)],
                                               ("sentence", "label", "g")),
                             "dev.csv": _csv([[f"d{i}", i % 2, i] for i in range(12)], ("sentence", "label", "g"))},
     {"group": "g"}, ["train.csv row 5 has no value in the group column 'g'"]),
    ("group column absent", {"train.csv": _csv(TRAIN), "dev.csv": _csv(DEV)}, {"group": "premise"},
     ["user_data/train.csv has no column 'premise'"]),
    ("choice index out of range", {"t.jsonl": "".join(json.dumps({"q": "q", "a": "x", "b": "y", "label": i % 3}) + "\n"
                                                      for i in range(12))},
     {"train": "user_data/t.jsonl", "validation": None, "validation_fraction": 0.5, "format": "multiple_choice",
      "text": ["q", "a", "b"]}, ["t.jsonl row 3 has the label 2", "choice index must be 0 to 1"]),
]


def test_there_are_at_least_twenty_bad_file_cases():
    assert len(BAD_FILES) >= 20


@pytest.mark.parametrize(("files", "change", "fragments"), [case[1:] for case in BAD_FILES],
                         ids=[case[0] for case in BAD_FILES])
def test_a_bad_file_is_one_sentence_and_nothing_is_written(project, files, change, fragments):
    _write(files)
    params = _params({"mine": {**CSV_TASK, **change}})
    with pytest.raises(LayersimError) as caught:
        _download("mine", params)
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message, message
    assert "\n" not in message and message.endswith(".")
    assert not Path("data").exists(), "nothing is written, not even the output's parent folder"


def test_a_link_out_of_user_data_is_refused(project, tmp_path_factory):
    outside = tmp_path_factory.mktemp("outside") / "train.csv"
    outside.write_text(_csv(TRAIN))
    Path("user_data/train.csv").symlink_to(outside)
    _write({"dev.csv": _csv(DEV)})
    with pytest.raises(LayersimError, match="leads out of user_data/"):
        _download("mine", _params({"mine": CSV_TASK}))
    assert not Path("data").exists()


# --- the declaration in params.yaml -------------------------------------------------------------------

BAD_DECLARATIONS = [
    ({"x;touch PWNED": CSV_TASK}, "task name 'x;touch PWNED', which is invalid"),
    ({"-rf": CSV_TASK}, "task name '-rf', which is invalid"),
    ({"Mine": CSV_TASK}, "lower-case"),
    ({"rte": CSV_TASK}, "'rte', which is a registry task"),
    ({"m": {**CSV_TASK, "train": "../secret.csv"}}, "user_tasks.m.train = '../secret.csv' is invalid"),
    ({"m": {**CSV_TASK, "train": "/etc/passwd.csv"}}, "a file inside user_data/"),
    ({"m": {**CSV_TASK, "train": "user_data/../x.csv"}}, "user_tasks.m.train"),
    ({"m": {**CSV_TASK, "train": "user_data/x.xlsx"}}, ".csv, .tsv, .jsonl or .parquet"),
    ({"m": {**CSV_TASK, "validation_fraction": 0.2}}, "exactly one of validation"),
    ({"m": {**CSV_TASK, "validation": None}}, "exactly one of validation"),
    ({"m": {**CSV_TASK, "validation": CSV_TASK["train"]}}, "is the train file"),
    ({"m": {**CSV_TASK, "format": "pair"}}, "does not fit format 'pair', which reads 2 columns"),
    ({"m": {**CSV_TASK, "format": "multiple_choice", "text": ["q", "a"]}}, "a context and at least 2 choices"),
    ({"m": {**CSV_TASK, "format": "triple"}}, "user_tasks.m.format = 'triple' is invalid"),
    ({"m": {**CSV_TASK, "label": "sentence"}}, "is also a text column"),
    ({"m": {**CSV_TASK, "metrics": ["pearson"]}}, "'pearson', which cannot score classification"),
    ({"m": {**CSV_TASK, "metrics": ["bleu"]}}, "user_tasks.m.metrics has 'bleu'"),
    ({"m": {**CSV_TASK, "regression": True, "label_names": ["a", "b"]}}, "a regression task has no class names"),
    ({"m": {**CSV_TASK, "label_names": ["a"]}}, "at least two distinct names"),
    ({"m": {**CSV_TASK, "label_names": ["a", "b", "c"], "metrics": ["f1"]}}, "f1, which scores two classes"),
    ({"m": {**CSV_TASK, "validation_fraction": 1.0, "validation": None}}, "a number in (0, 1)"),
    ({"m": {**CSV_TASK, "lable": "y"}}, "unknown key 'user_tasks.m.lable'"),
    ({"m": {**CSV_TASK, "group": "label"}}, "group = 'label' is the label column"),
    ({"m": {**CSV_TASK, "group": ["a"]}}, "user_tasks.m.group = ['a'] is invalid"),
    ({"m": {"validation_fraction": 0.2}}, "either train: user_data/<file>"),
    ({"m": {**HUB_TASK, "splits": {"train": "train", "validation": "train"}}},
     "user_tasks.m.splits reads the split 'train' as both train and validation; a task is scored on rows it was not "
     "trained on: name two different splits"),
    ({"m": {**HUB_TASK, "splits": {"validation": "train"}}},  # issue 62: only validation named
     "user_tasks.m.splits = {'validation': 'train'} is invalid; it must be a mapping of train and validation to the "
     "dataset's split names, e.g. {train: train, validation: test}."),
    ([1, 2], "user_tasks = [1, 2] is invalid"),
]


@pytest.mark.parametrize(("user_tasks", "fragment"), BAD_DECLARATIONS)
def test_a_bad_declaration_is_refused_by_params_validation(user_tasks, fragment):
    with pytest.raises(LayersimError) as caught:
        parse_params({"model": "minilm-l6", "tasks": ["synth-negation"], "seeds": [1], "user_tasks": user_tasks})
    assert fragment in str(caught.value) and str(caught.value).startswith("params.yaml:")


def test_a_file_in_tasks_points_at_user_tasks_and_unknown_names_mention_them():
    with pytest.raises(LayersimError, match=r"'path/to/my\.csv', a file rather than a task name; move the file into "
                                            r"user_data/.*train: user_data/my\.csv.* list 'my' in tasks"):
        parse_params({"model": "minilm-l6", "tasks": ["path/to/my.csv"], "seeds": [1]})
    with pytest.raises(LayersimError, match="did you mean 'mine'.*declared under user_tasks"):
        _params({"mine": CSV_TASK}, tasks=["mien"])


def test_user_tasks_are_those_of_the_params_last_read():
    assert _params({"mine": CSV_TASK}).tasks == ("mine",) and get_task("mine").user.train == "user_data/train.csv"
    parse_params({"model": "minilm-l6", "tasks": ["synth-negation"], "seeds": [1]})
    with pytest.raises(LayersimError, match="unknown task 'mine'"):
        get_task("mine")


def test_declared_vocabularies_are_the_librarys():
    from layersim.training.evaluate import METRICS

    assert set(declared.CLASSIFICATION_METRICS + declared.REGRESSION_METRICS) == set(METRICS)
    assert declared.FORMATS == FORMATS and declared.USER_DATA == user_module.USER_DATA
    assert user_module.MIN_ROWS == MIN_EXAMPLES
    assert not any(__import__("re").fullmatch(declared.NAME, name) is None for name in TASKS)  # registry-shaped names


def test_a_hub_task_with_two_different_splits_is_accepted():
    """The boundary of the same-split refusal: any two different split names pass."""
    spec = _params({"m": {**HUB_TASK, "splits": {"train": "train", "validation": "test"}}}).user_tasks["m"]
    assert spec.hub.splits == {"train": "train", "validation": "test"}
