"""params.yaml's ``user_tasks``: tasks the user declares on their own files or on a hub dataset, by name.

    user_tasks:
      reviews:                              # the name to list in tasks: [reviews]
        train: user_data/reviews.csv        # .csv, .tsv, .jsonl or .parquet, inside user_data/
        validation: user_data/reviews_dev.csv
        text: [review]
        label: stars
      imdb:                                 # a hub dataset, read like the registry's tasks (locked in layersim.lock)
        dataset: stanfordnlp/imdb           # owner/name
        config: plain_text                  # its config (null: the dataset's only one, "default")
        splits: {train: train, validation: test}
        text: [text]
        label: label
        label_names: [neg, pos]             # class 0 first: a hub split's labels are indices

The name reaches dvc.yaml's commands (``${item.task}``), so it is held to a rule that no shell reads as
syntax (docs/params-safety.md); the file paths and column names never reach a shell (download_task depends
on the whole user_data/ folder).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from layersim.errors import LayersimError
from layersim.params.rules import SEED, Bound, check_value, fail, knob, shown

FORMATS = ("single", "pair", "multiple_choice")  # layersim.data.tasks.FORMATS (checked by a test)
# layersim.training.evaluate.METRICS (checked by a test); what each kind of task can be scored by.
CLASSIFICATION_METRICS, REGRESSION_METRICS = ("accuracy", "f1", "mcc"), ("pearson", "spearman")
USER_DATA = "user_data"  # layersim.data.tasks.user.USER_DATA
# A task name: lower case (a folder name on every file system), no shell syntax, not an option.
NAME = r"[a-z0-9][a-z0-9_-]{0,63}"
_PATH = rf"{USER_DATA}/([A-Za-z0-9_][A-Za-z0-9_.-]*/)*[A-Za-z0-9_][A-Za-z0-9_.-]*\.(csv|tsv|jsonl|parquet)"
_COLUMN_CHARS = 200


def _file(key: str, value: Any) -> str | None:
    if value is None and key.endswith(".validation"):
        return None
    if not isinstance(value, str) or not re.fullmatch(_PATH, value) or ".." in value or len(value) > 500:
        raise fail(key, value, f"a file inside {USER_DATA}/ ending in .csv, .tsv, .jsonl or .parquet, each part of "
                               "the path made of letters, digits and . _ - (e.g. user_data/reviews.csv); "
                               f"download_task depends on {USER_DATA}/, so an edit to the file reruns it")
    return value


def _dataset(key: str, value: Any) -> str | None:
    if value is None:
        return None
    from layersim.models.registry import _name_problem

    if not isinstance(value, str) or _name_problem(value):
        raise fail(key, value, "a Hugging Face dataset id written owner/name (each part of letters, digits, '-', "
                               "'_' and '.'), e.g. stanfordnlp/imdb")
    return value


def _config(key: str, value: Any) -> str | None:
    if value is not None and not (isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}", value)):
        raise fail(key, value, "the name of one of the dataset's configs (letters, digits, _ . -), or null for a "
                               "dataset with one")
    return value


def _splits(key: str, value: Any) -> dict[str, str]:
    from layersim.data.tasks.spec import SPLITS

    ok = (isinstance(value, dict) and set(value) == set(SPLITS)
          and all(isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}", v) for v in value.values()))
    if not ok:
        raise fail(key, value, "a mapping of train and validation to the dataset's split names, e.g. {train: train, "
                               "validation: test}")
    if value["train"] == value["validation"]:
        raise LayersimError(f"params.yaml: {key} reads the split {value['train']!r} as both train and validation; a "
                            "task is scored on rows it was not trained on: name two different splits of the dataset, "
                            "e.g. {train: train, validation: test}.")
    return dict(value)


def _revision(key: str, value: Any) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_./-]{0,199}", value) or ".." in value:
        raise fail(key, value, "a revision of the dataset: refs/convert/parquet (the hub's Parquet export), a "
                               "branch, tag or commit")
    return value


def _column(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value or len(value) > _COLUMN_CHARS:
        raise fail(key, value, f"a column name of the file (1 to {_COLUMN_CHARS} characters)")
    return value


def _group(key: str, value: Any) -> str | None:
    return None if value is None else _column(key, value)


def _text(key: str, value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise fail(key, value, "a list of the columns that hold the text, in the format's order (single: [text]; "
                               "pair: [first, second]; multiple_choice: [context, choice 1, …, choice k])")
    return tuple(_column(key, name) for name in value)


def _label_names(key: str, value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    ok = (isinstance(value, list) and len(value) >= 2 and all(isinstance(v, str) and v for v in value)
          and len(set(value)) == len(value))
    if not ok:
        raise fail(key, value, "null (the sorted labels of the training rows) or a list of at least two distinct "
                               "names, class 0 first; a label that is a whole number is an index into it")
    return tuple(value)


def _metrics(key: str, value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    from layersim.params.rules import check_names

    return check_names(key, value, CLASSIFICATION_METRICS + REGRESSION_METRICS)


@dataclass(frozen=True)
class UserTaskParams:
    train: str | None = knob(None, "the training rows: a .csv, .tsv (no quoting), .jsonl or .parquet file inside "
                                   "user_data/ (or dataset)", check=_file)
    dataset: str | None = knob(None, "instead of files: a hub dataset, owner/name, read from its Parquet export like "
                                     "the registry's tasks and locked in layersim.lock", check=_dataset)
    config: str | None = knob(None, "with dataset: its config (null: a dataset with one)", check=_config)
    splits: dict = knob({"train": "train", "validation": "validation"}, "with dataset: its split read as train and "
                        "the one read as validation", check=_splits)
    revision: str = knob("refs/convert/parquet", "with dataset: the revision read (the Parquet export's "
                         "<config>/<split>/*.parquet files)", check=_revision)
    validation: str | None = knob(None, "the validation rows, a file like train (null: validation_fraction of "
                                        "train's rows, a seeded draw)", check=_file)
    validation_fraction: float | None = knob(None, "with no validation file: the share of train's rows held out "
                                                   "for validation", Bound(lambda v: 0 < v < 1, "a number in (0, 1)"))
    split_seed: int = knob(0, "seed of that draw", SEED)
    format: str = knob("single", "single (one text), pair (two texts), multiple_choice (a context and k choices)",
                       names=FORMATS)
    text: tuple[str, ...] | None = knob(None, "the columns holding the text, in the format's order (null: text; "
                                              "text_a, text_b)", check=_text)
    label: str = knob("label", "the column holding the label: a class name or index, or a number for regression",
                      check=_column)
    regression: bool = knob(False, "the label is a number to predict (scored by pearson, spearman)")
    label_names: tuple[str, ...] | None = knob(None, "class names, class 0 first (null: the training rows' "
                                                     "distinct labels, sorted)", check=_label_names)
    group: str | None = knob(None, "a column whose equal values mark examples that share a text (a premise id, or "
                                   "the premise column itself): the nulls and intervals move them together (null: "
                                   "every example independent)", check=_group)
    metrics: tuple[str, ...] | None = knob(None, "scores, the first the headline: accuracy, f1 (two classes), mcc; "
                                                 "pearson, spearman for regression (null: accuracy, or pearson and "
                                                 "spearman)", check=_metrics)


_FIELDS = {f.name: f for f in dataclasses.fields(UserTaskParams)}


def check_user_tasks(key: str, value: Any, registry: Any) -> dict[str, Any]:
    """user_tasks: a mapping of new task names to their declarations → name → TaskSpec."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise fail(key, value, "a mapping of task names to declarations, e.g. {reviews: {train: user_data/r.csv, "
                               "validation_fraction: 0.2, text: [review], label: stars}}")
    specs = {}
    for name, raw in value.items():
        if not isinstance(name, str) or not re.fullmatch(NAME, name):
            raise LayersimError(f"params.yaml: {key} has the task name {shown(name)}, which is invalid; a name is 1 to "
                                "64 lower-case letters, digits, _ and -, starting with a letter or digit (it becomes "
                                "a folder and a word of dvc.yaml's commands).")
        if name in registry:
            raise LayersimError(f"params.yaml: {key} has the task name {name!r}, which is a registry task; give "
                                "yours another name.")
        specs[name] = _spec(f"{key}.{name}", name, raw)
    return specs


def _spec(key: str, name: str, raw: Any):
    from layersim.data.tasks import TaskSpec, UserSource

    if not isinstance(raw, dict) or ("train" in raw) == ("dataset" in raw):
        raise fail(key, raw, "a mapping with either train: user_data/<file> (e.g. {train: user_data/r.csv, "
                             "validation_fraction: 0.2}) or dataset: owner/name (a hub dataset), not both")
    unknown = [k for k in raw if k not in _FIELDS]
    if unknown:
        raise LayersimError(f"params.yaml: unknown key '{key}.{str(unknown[0])[:100]}'; valid keys are: "
                            f"{', '.join(_FIELDS)}.")
    d = UserTaskParams(**{k: check_value(f"{key}.{k}", _FIELDS[k], v) for k, v in raw.items()})
    hub_keys, file_keys = ("config", "splits", "revision"), ("validation", "validation_fraction", "split_seed")
    wrong = [k for k in (file_keys if d.dataset else hub_keys) if k in raw]
    if wrong:
        raise LayersimError(f"params.yaml: {key}.{wrong[0]} belongs to a task on "
                            f"{'files' if d.dataset else 'a hub dataset'}, but this one reads "
                            f"{'hub dataset ' + repr(d.dataset) if d.dataset else 'files'}; remove it.")
    if d.dataset is not None:
        return _hub_spec(key, name, d)
    if (d.validation is None) == (d.validation_fraction is None):
        raise LayersimError(f"params.yaml: {key} needs exactly one of validation (a file) and validation_fraction "
                            "(a share of train's rows); give one of them.")
    if d.validation == d.train:
        raise LayersimError(f"params.yaml: {key}.validation is the train file {d.train!r}; a task is scored on rows "
                            "it was not trained on: give another file or use validation_fraction.")
    text, metrics = _columns_and_metrics(key, d)
    multiple = d.format == "multiple_choice"
    source = UserSource(d.train, d.validation, tuple(text), d.label, d.validation_fraction, d.split_seed, d.group)
    return TaskSpec(name, d.format, tuple(metrics), d.label_names or (), regression=d.regression,
                    num_choices=len(text) - 1 if multiple else 0, user=source, shared=d.group)


def _hub_spec(key: str, name: str, d: UserTaskParams):
    """A user task on a hub dataset: the registry's hub path (HubSource), with the user's columns."""
    from layersim.data.tasks import HubSource, TaskSpec

    text, metrics = _columns_and_metrics(key, d)
    multiple = d.format == "multiple_choice"
    if not (d.regression or multiple or d.label_names):
        raise LayersimError(f"params.yaml: {key} reads hub dataset {d.dataset!r}, whose labels are class indices; "
                            "list its class names in label_names, class 0 first.")
    targets = {"single": ("text",), "pair": ("text_a", "text_b")}.get(d.format)
    columns: dict = dict(zip(targets, text)) if targets else {"context": text[0], "choices": tuple(text[1:])}
    hub = HubSource(d.dataset, d.config, {**columns, "label": d.label}, splits=dict(d.splits), revision=d.revision)
    return TaskSpec(name, d.format, tuple(metrics), d.label_names or (), regression=d.regression,
                    num_choices=len(text) - 1 if multiple else 0, hub=hub, shared=d.group)


def _columns_and_metrics(key: str, d: UserTaskParams) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The text columns and metrics of a declaration, checked against its format and kind."""
    from layersim.data.tasks import TEXT_COLUMNS

    multiple = d.format == "multiple_choice"
    text = d.text or (None if multiple else TEXT_COLUMNS[d.format])
    want = {"single": "1 column", "pair": "2 columns", "multiple_choice": "a context and at least 2 choices"}
    if text is None or len(text) != {"single": 1, "pair": 2}.get(d.format, len(text)) or (multiple and len(text) < 3):
        raise LayersimError(f"params.yaml: {key}.text = {shown(list(text or ()))} does not fit format {d.format!r}, "
                            f"which reads {want[d.format]}; list the columns in that order.")
    if d.label in text:
        raise LayersimError(f"params.yaml: {key}.label = {d.label!r} is also a text column; name the column that "
                            "holds the label.")
    if d.group is not None and d.group == d.label:
        raise LayersimError(f"params.yaml: {key}.group = {d.group!r} is the label column; name the column whose equal "
                            "values mark examples that share a text (e.g. a premise id or the premise itself).")
    kind, allowed = (("regression", REGRESSION_METRICS) if d.regression else ("multiple choice", ("accuracy", "mcc"))
                     if multiple else ("classification", CLASSIFICATION_METRICS))
    metrics = d.metrics or (REGRESSION_METRICS if d.regression else ("accuracy",))
    wrong = [m for m in metrics if m not in allowed]
    if wrong:
        raise LayersimError(f"params.yaml: {key}.metrics has {wrong[0]!r}, which cannot score {kind}; use "
                            f"{', '.join(allowed)}.")
    if d.label_names is not None and (d.regression or multiple):
        raise LayersimError(f"params.yaml: {key}.label_names is set, but a {kind} task has no class names; remove it.")
    if d.regression and multiple:
        raise LayersimError(f"params.yaml: {key} is multiple_choice with regression: true; a choice is a class, so "
                            "set regression: false.")
    if "f1" in metrics and d.label_names is not None and len(d.label_names) != 2:
        raise LayersimError(f"params.yaml: {key}.metrics has f1, which scores two classes, but label_names has "
                            f"{len(d.label_names)}; use accuracy or mcc.")
    return tuple(text), tuple(metrics)
