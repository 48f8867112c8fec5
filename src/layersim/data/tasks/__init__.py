"""The task registry: what "rte" or "synth-negation" means, and how to build its normalized table.

A normalized task table (docs/architecture.md, "Data contracts") has `example_id` (int64, stable), `cluster_id`
(int64: the first example_id of the examples that share what the task declares shared, ``TaskSpec.shared``: MNLI's
premise, QNLI's question, BoolQ's passage, HellaSwag's and CosmosQA's context, a user task's ``group`` column; the
example's own id otherwise), the text columns of its format, and `label` (int64, or float64 for regression):

==================  ==========================================
format              text columns
==================  ==========================================
``single``          ``text``
``pair``            ``text_a``, ``text_b``
``multiple_choice`` ``context``, ``choices`` (list<string>)
==================  ==========================================

Paper tasks (Phang et al. 2021, §2) come from the Hugging Face hub; built-in ``synth-*`` tasks are
generated offline (:mod:`layersim.data.tasks.generated`); user tasks, declared under ``user_tasks`` in
params.yaml, are read from the user's files (:mod:`layersim.data.tasks.user`).

Every paper task is read from the hub's Parquet export of the dataset (the ``refs/convert/parquet``
revision the dataset viewer publishes: ``<config>/<split>/NNNN.parquet``), not from its main branch:
hellaswag, cosmos_qa and super_glue were published with loading scripts, which ``datasets`` >= 4 no longer
runs, and the export gives every dataset the same layout and the same loading code. ``download.revisions``
pins a task to a commit of that export; the commit read is recorded in the task table's metadata. With
``LAYERSIM_HUB_MIRROR`` set to a folder laid out as ``<owner>/<name>/<config>/<split>/*.parquet``, the
same code reads that folder instead of the network (a cluster without internet, and the tests).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa

from layersim.errors import LayersimError, hub_unreachable, unknown_name
from layersim.data.tasks import generated
from layersim.data.tasks.spec import (FORMATS, PARQUET_EXPORT, SPLITS, TEXT_COLUMNS, HubSource,  # noqa: F401
                                      TaskSpec, UserSource, _normalized, task_metadata)

# A local folder laid out like the hub's Parquet exports, read instead of the hub when set.
HUB_MIRROR_ENV = "LAYERSIM_HUB_MIRROR"

def _glue(config: str, columns: dict, **kw) -> HubSource:
    return HubSource("nyu-mll/glue", config, columns, **kw)


_PAPER_TASKS = [
    TaskSpec("cola", "single", ("mcc",), ("unacceptable", "acceptable"),
             hub=_glue("cola", {"text": "sentence", "label": "label"})),
    TaskSpec("mnli", "pair", ("accuracy",), ("entailment", "neutral", "contradiction"),
             hub=_glue("mnli", {"text_a": "premise", "text_b": "hypothesis", "label": "label"},
                       splits={"train": "train", "validation": "validation_matched"}), shared="premise"),
    TaskSpec("mrpc", "pair", ("f1", "accuracy"), ("not_equivalent", "equivalent"),
             hub=_glue("mrpc", {"text_a": "sentence1", "text_b": "sentence2", "label": "label"})),
    TaskSpec("qnli", "pair", ("accuracy",), ("entailment", "not_entailment"),
             hub=_glue("qnli", {"text_a": "question", "text_b": "sentence", "label": "label"}), shared="question"),
    TaskSpec("qqp", "pair", ("f1", "accuracy"), ("not_duplicate", "duplicate"),
             hub=_glue("qqp", {"text_a": "question1", "text_b": "question2", "label": "label"})),
    TaskSpec("rte", "pair", ("accuracy",), ("entailment", "not_entailment"),
             hub=_glue("rte", {"text_a": "sentence1", "text_b": "sentence2", "label": "label"})),
    TaskSpec("sst2", "single", ("accuracy",), ("negative", "positive"),
             hub=_glue("sst2", {"text": "sentence", "label": "label"})),
    TaskSpec("stsb", "pair", ("pearson", "spearman"), regression=True,
             hub=_glue("stsb", {"text_a": "sentence1", "text_b": "sentence2", "label": "label"})),
    TaskSpec("boolq", "pair", ("accuracy",), ("false", "true"),
             hub=HubSource("aps/super_glue", "boolq", {"text_a": "question", "text_b": "passage", "label": "label"}),
             shared="passage"),
    # Yelp Polarity has no validation split, so its test split stands in for one. Phang et al. say only that they use
    # each task's validation examples, not which rows that meant for Yelp.
    TaskSpec("yelp_polarity", "single", ("accuracy",), ("negative", "positive"),
             hub=HubSource("fancyzhx/yelp_polarity", "plain_text", {"text": "text", "label": "label"},
                           splits={"train": "train", "validation": "test"})),
    TaskSpec("hellaswag", "multiple_choice", ("accuracy",), num_choices=4,
             hub=HubSource("Rowan/hellaswag", None, {"context": "ctx", "choices": "endings", "label": "label"}),
             shared="ctx"),
    TaskSpec("cosmosqa", "multiple_choice", ("accuracy",), num_choices=4,
             hub=HubSource("allenai/cosmos_qa", None,
                           {"context": ("context", "question"),
                            "choices": ("answer0", "answer1", "answer2", "answer3"), "label": "label"}),
             shared="context"),  # the passage alone: several questions are asked on one
]

_GENERATED_TASKS = [
    TaskSpec("synth-negation", "single", ("accuracy",), ("negative", "positive")),
    TaskSpec("synth-roles", "pair", ("accuracy", "f1"), ("different", "same")),
    TaskSpec("synth-similarity", "pair", ("pearson", "spearman"), regression=True),
    TaskSpec("synth-choice", "multiple_choice", ("accuracy",), num_choices=4),
]

TASKS: dict[str, TaskSpec] = {t.name: t for t in _PAPER_TASKS + _GENERATED_TASKS}
PAPER_TASKS: tuple[str, ...] = tuple(t.name for t in _PAPER_TASKS)
assert set(generated.GENERATED_TASKS) == {t.name for t in _GENERATED_TASKS}


# The user tasks of the params.yaml last validated (layersim.params registers them), by name.
_USER_TASKS: dict[str, TaskSpec] = {}
# Where the download_task stage writes each task's tables (dvc.yaml): a user task's label names, when
# params.yaml does not declare them, are read back from there (the task table's metadata).
TASKS_DIR = Path("data/tasks")


def register_user_tasks(specs: dict[str, TaskSpec]) -> None:
    """Make `specs` (every user task of one params.yaml) the user tasks that get_task knows."""
    clash = sorted(set(specs) & set(TASKS))
    if clash:
        raise LayersimError(f"user task {clash[0]!r} has the name of a registry task; give it another name.")
    _USER_TASKS.clear()
    _USER_TASKS.update(specs)


def known_tasks() -> list[str]:
    """Every task name get_task accepts: the registry's and the registered user tasks'."""
    return [*TASKS, *_USER_TASKS]


def get_task(name: object) -> TaskSpec:
    """The spec of a registered task or user task; an unknown name is an error listing the valid ones."""
    if isinstance(name, str) and name in TASKS:
        return TASKS[name]
    if not isinstance(name, str) or name not in _USER_TASKS:
        raise unknown_name("task", name, known_tasks())
    spec = _USER_TASKS[name]
    if spec.label_names or spec.regression or spec.format == "multiple_choice":
        return spec
    from layersim.data.layout import task_tables
    from layersim.data.tasks.user import labels_from_table  # label names taken from the data: read back

    return labels_from_table(spec, task_tables(TASKS_DIR, name) / "train.parquet")


# --- building normalized tables ------------------------------------------------------------------

def normalize_hub_table(spec: TaskSpec, hub_table: pa.Table, split: str, source: dict | None = None) -> pa.Table:
    """Map a table with the hub's column names to the normalized task table of `spec`."""
    if spec.hub is None:
        raise LayersimError(f"task {spec.name!r} is generated offline and has no hub source.")
    missing = sorted({c for v in spec.hub.columns.values() for c in ((v,) if isinstance(v, str) else v)}
                     - set(hub_table.column_names) | ({spec.shared} - set(hub_table.column_names) - {None}))
    if missing:
        raise LayersimError(f"the hub table for task {spec.name!r} lacks columns {missing}; "
                            f"it has {hub_table.column_names}.")
    rows = hub_table.to_pydict()
    source = source or {"hub": spec.hub.path, "config": spec.hub.config}
    mirror = str(source.get("revision", ""))
    where = (f"the {split} table of task {spec.name!r} ({source.get('hub')}"
             f"{', read from the ' + mirror if mirror.startswith('mirror ') else ''})")
    _check_texts(spec, rows, where)
    columns: dict[str, list] = {}
    for target, source_columns in spec.hub.columns.items():
        if isinstance(source_columns, str):
            values = rows[source_columns]
        elif target == "choices":
            values = [list(choice) for choice in zip(*(rows[c] for c in source_columns))]
        else:
            values = [" ".join(parts) for parts in zip(*(rows[c] for c in source_columns))]
        columns[target] = values
    columns["label"] = hub_labels(spec, columns["label"], where)
    if spec.format == "multiple_choice":
        bad = [len(c) for c in columns["choices"] if len(c) != spec.num_choices]
        if bad:
            raise LayersimError(f"task {spec.name!r} expects {spec.num_choices} choices per example, found {bad[0]}.")
    return _normalized(spec, columns, split, source, shared=None if spec.shared is None else rows[spec.shared])


def _check_texts(spec: TaskSpec, rows: dict[str, list], where: str) -> None:
    """Every text cell of the hub table's text columns is a text: a missing one (null) written as is would stop
    fine-tuning later with advice to download again, which reads the same file."""
    for target, source_columns in spec.hub.columns.items():
        for column in (() if target == "label" else (source_columns,) if isinstance(source_columns, str)
                       else source_columns):
            row = next((k for k, value in enumerate(rows[column]) if not _is_text(value)), None)
            if row is not None:
                raise LayersimError(f"{where} has {rows[column][row]!r} in text column {column!r} (row {row}), not a "
                                    f"text; fix that file, or point {HUB_MIRROR_ENV} at a copy of the dataset whose "
                                    "texts are all present.")


def _is_text(value) -> bool:
    """A text, or a list of texts (a multiple-choice task's endings in one column)."""
    return isinstance(value, str) or isinstance(value, list) and bool(value) and all(isinstance(v, str) for v in value)


def hub_labels(spec: TaskSpec, values: list, where: str) -> list:
    """The label column as class indices (or floats for regression). Exports differ: GLUE's Parquet holds
    indices, some mirrors and CSV exports the label names (`not_entailment`) or digits as text (`"1"`); a
    name of the task's labels becomes its index, anything else is one sentence naming the value."""
    names, out = spec.label_names, []
    for value in values:
        label = value.strip() if isinstance(value, str) else value
        if spec.regression and isinstance(label, (int, float, str)) and not isinstance(label, bool):
            try:
                out.append(float(label))
                continue
            except ValueError:
                pass
        elif isinstance(label, int) and not isinstance(label, bool):
            out.append(label)
            continue
        elif isinstance(label, str) and label.lstrip("-").isdigit():
            out.append(int(label))
            continue
        elif isinstance(label, str) and label in names:
            out.append(names.index(label))
            continue
        allowed = ("a number" if spec.regression else
                   "a class index" + (f" or one of its label names ({', '.join(names)})" if names else ""))
        raise LayersimError(f"{where} has label {value!r}, which is not {allowed}; fix that file, or point "
                            f"{HUB_MIRROR_ENV} at a copy of the dataset whose labels are those.")
    classes = spec.num_choices if spec.format == "multiple_choice" else len(names)
    outside = next((label for label in out if not spec.regression and classes and not 0 <= label < classes), None)
    if outside is not None:  # written as is, it would stop fine-tuning with an index error
        kind = "choices" if spec.format == "multiple_choice" else "classes"
        raise LayersimError(f"{where} has label {outside}, outside the task's {classes} {kind} (0 … {classes - 1}); "
                            "fix that file, or declare the labels it uses.")
    return out


def generated_table(spec: TaskSpec, split: str, num_examples: int, seed: int) -> pa.Table:
    """The normalized table of a built-in generated task."""
    columns = generated.generate(spec.name, split, num_examples, seed)
    return _normalized(spec, columns, split, {"generator": spec.name, "seed": seed, "num_examples": num_examples})


def hub_table(spec: TaskSpec, split: str, revision: str | None = None) -> pa.Table:
    """Read one split of a paper task from the hub's Parquet export (or the folder of
    ``LAYERSIM_HUB_MIRROR``) at `revision` (default: the registry's) and normalize it."""
    import datasets  # imported here: only the download stage needs it

    hub = spec.hub
    revision = revision or hub.revision
    mirror = os.environ.get(HUB_MIRROR_ENV)
    where = str(Path(mirror) / hub.path) if mirror else hub.path
    pattern = hub.data_files(split)
    try:
        dataset = datasets.load_dataset(where, data_files={split: pattern}, split=split,
                                        revision=None if mirror else revision)
    except datasets.exceptions.DatasetGenerationError as err:  # files found but unreadable: e.g. a table of 0 rows
        cause = err.__cause__ or err.__context__
        detail = str(cause).splitlines()[0] if cause else "it cannot be read as a table"
        raise LayersimError(f"the {split} files of task {spec.name!r} ({where}, {pattern}) cannot be read: {detail}; "
                            "a split needs a Parquet table with at least one row; fix or replace those files.") from None
    except (ConnectionError, OSError, ValueError) as err:
        place = (f"the hub mirror {where} ({HUB_MIRROR_ENV})" if mirror else
                 f"the Hugging Face hub ({hub.path} at revision {revision!r})")
        raise hub_unreachable("task", spec.name, err, generated.GENERATED_TASKS, f"{place}, files {pattern}",
                              mirror_env=HUB_MIRROR_ENV, from_hub=not mirror) from err
    source = {"hub": hub.path, "config": hub.config, "split": hub.splits[split], "files": pattern,
              "revision": f"mirror {mirror}" if mirror else _commit(hub.path, revision)}
    return normalize_hub_table(spec, dataset.data.table, split, source)


def _commit(path: str, revision: str) -> str:
    """The commit that `revision` of dataset `path` resolves to (recorded: a branch moves), or `revision`
    itself when the hub cannot say."""
    try:
        from huggingface_hub import HfApi

        return HfApi().dataset_info(path, revision=revision).sha or revision
    except Exception:  # noqa: BLE001 - the data is read; the commit is a record, not a requirement
        return revision


def subsample(table: pa.Table, max_examples: int | None, seed: int) -> pa.Table:
    """Keep at most `max_examples` rows, chosen by a seeded draw and kept in their original order."""
    if max_examples is None or table.num_rows <= max_examples:
        return table
    keep = np.sort(np.random.default_rng(seed).choice(table.num_rows, size=max_examples, replace=False))
    return table.take(pa.array(keep))
