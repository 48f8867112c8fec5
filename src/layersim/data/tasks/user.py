"""User tasks: the normalized tables of a task declared in params.yaml (``user_tasks``) from the user's files.

Every file is read and every value checked before a table is built, so a bad file is one sentence and
nothing is written (the download_task stage writes only what :func:`user_tables` returns). The tables
are the registry's contract (docs/architecture.md, "Task table"); their metadata's source names each
file with its SHA-256. A label is a name or a number: names map to their index in the declared
label_names (or in the sorted names of the training rows when none are declared), whole numbers are
class indices (or, undeclared, sorted and numbered from 0); a regression label is any finite number.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa

from layersim.errors import LayersimError
from layersim.data.tasks.spec import SPLITS, TaskSpec, _normalized
from layersim.data.tasks.user_files import read_columns

USER_DATA = "user_data"  # the folder that holds every user task's files: a dependency of download_task
MIN_ROWS = 10  # per split, as layersim.params.MIN_EXAMPLES (a test keeps the two equal)


def _missing(value) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _check_text(path: Path, values: dict[str, list], text: tuple[str, ...]) -> None:
    for name in text:
        column = values[name]
        if all(_missing(v) for v in column):
            raise LayersimError(f"{path} column {name!r} is empty in all {len(column)} rows; name the column that "
                                "holds the text in params.yaml (text).")
        for row, value in enumerate(column, 1):
            if _missing(value):
                raise LayersimError(f"{path} row {row} has no text in column {name!r}; fill it or remove the row.")
            if not isinstance(value, str):
                raise LayersimError(f"{path} row {row} column {name!r} holds {value!r}, not text; quote it as a "
                                    "string.")


def _check_group(path: Path, column: list, name: str) -> None:
    """Every row names its group (user_tasks.<name>.group): a row without one would silently be a group alone."""
    for row, value in enumerate(column, 1):
        if _missing(value):
            raise LayersimError(f"{path} row {row} has no value in the group column {name!r}; fill it (rows with the "
                                "same value share a text) or remove the row.")


def _group_key(value):
    """A group value as a dictionary key: itself, or its JSON text (a list or object read from JSON lines)."""
    return value if isinstance(value, (str, int, float, bool)) else json.dumps(value, sort_keys=True)


def _label_kind(value) -> tuple[str, object]:
    """('text', name) or ('number', int | float) of one label as read (CSV gives strings)."""
    if isinstance(value, bool):
        return "text", str(value).lower()
    if isinstance(value, (int, float)):
        return "number", value
    if isinstance(value, str):
        text = value.strip()
        for parse in (int, float):
            try:
                return "number", parse(text)
            except ValueError:
                pass
        return "text", text
    return "other", value


def _labels(path: Path, column: list, name: str) -> tuple[str, list]:
    """The labels of one file and their kind ('text' or 'number'); missing or mixed labels are refused."""
    if all(_missing(v) for v in column):
        raise LayersimError(f"{path} label column {name!r} is empty in all {len(column)} rows; name the column "
                            "that holds the labels in params.yaml (label).")
    kinds, parsed, first = set(), [], {}
    for row, value in enumerate(column, 1):
        if _missing(value):
            raise LayersimError(f"{path} row {row} has no label in column {name!r}; fill it or remove the row.")
        kind, label = _label_kind(value)
        if kind == "other":
            raise LayersimError(f"{path} row {row} has the label {value!r} in column {name!r}, neither a name nor a "
                                "number; write one of those.")
        first.setdefault(kind, (row, label))
        kinds.add(kind)
        parsed.append(label)
    if len(kinds) > 1:
        (row_n, number), (row_t, text) = first["number"], first["text"]
        raise LayersimError(f"{path} column {name!r} mixes label types: row {row_t} has the name {text!r}, row {row_n} "
                            f"the number {number!r}; use names throughout or numbers throughout.")
    return kinds.pop(), parsed


def _class_ids(path: Path, spec: TaskSpec, kind: str, labels: list, names: tuple[str, ...],
               declared: bool) -> np.ndarray:
    """Class indices of `labels` given the label names (declared or from the training rows): a name is
    looked up; a whole number is the index itself when names are declared (or choices counted), else
    looked up as written."""
    indexed = kind == "number" and (declared or spec.format == "multiple_choice")
    if kind == "number":
        labels = [_whole(path, label, row) for row, label in enumerate(labels, 1)]
    if indexed:
        what = "choice" if spec.format == "multiple_choice" else "class"
        for row, label in enumerate(labels, 1):
            if not 0 <= label < len(names):
                raise LayersimError(f"{path} row {row} has the label {label}, but a {what} index must be 0 to "
                                    f"{len(names) - 1} ({len(names)} {what}s); fix the row or user_tasks.{spec.name}.")
        return np.asarray(labels, dtype=np.int64)
    index = {name: k for k, name in enumerate(names)}
    among = "the declared label_names" if declared else "the training rows' labels"
    for row, label in enumerate(labels, 1):
        if str(label) not in index:
            raise LayersimError(f"{path} row {row} has the label {label!r}, which is not among {among} "
                                f"({', '.join(names)}); add it to user_tasks.{spec.name}.label_names or fix the row.")
    return np.array([index[str(label)] for label in labels], dtype=np.int64)


def _whole(path: Path, label, row: int) -> int:
    if not (math.isfinite(label) and float(label).is_integer()):
        raise LayersimError(f"{path} row {row} has the label {label!r}, not a class (a whole number or a name); "
                            "set regression: true for numeric targets.")
    return int(label)


def _regression(path: Path, kind: str, labels: list) -> np.ndarray:
    for row, label in enumerate(labels, 1):
        if kind != "number" or not math.isfinite(label):
            raise LayersimError(f"{path} row {row} has the label {label!r}, not a finite number; a regression task "
                                "needs numeric labels (or set regression: false).")
    return np.asarray(labels, dtype=np.float64)


def _files(spec: TaskSpec) -> dict[str, Path]:
    source = spec.user
    files = {"train": Path(source.train)}
    if source.validation is not None:
        files["validation"] = Path(source.validation)
    root = Path(USER_DATA).resolve()
    for split, path in files.items():
        if path.exists() and root not in path.resolve().parents:
            raise LayersimError(f"user_tasks.{spec.name}.{split}: {path} leads out of {USER_DATA}/ (a link?); put "
                                f"the file itself inside {USER_DATA}/, which download_task depends on.")
    return files


def _split(spec: TaskSpec, n: int) -> dict[str, np.ndarray]:
    """Row indices of train and validation when one file is split by a seeded draw (each in file order)."""
    source = spec.user
    count = int(round(source.validation_fraction * n))
    if count == 0 or count == n:
        which = "validation" if count == 0 else "train"
        raise LayersimError(f"user_tasks.{spec.name}.validation_fraction = {source.validation_fraction} of the "
                            f"{n} rows of {source.train} leaves the {which} split empty; change the fraction or add "
                            "rows.")
    chosen = np.random.default_rng(source.split_seed).permutation(n)[:count]
    mask = np.zeros(n, dtype=bool)
    mask[chosen] = True
    return {"train": np.flatnonzero(~mask), "validation": np.flatnonzero(mask)}


def _source(spec: TaskSpec, files: dict[str, Path]) -> dict:
    from layersim.models.registry import file_digest

    source = spec.user
    record = {"user_files": {split: {"path": str(path), "sha256": file_digest(path)} for split, path in files.items()},
              "text_columns": list(source.text), "label_column": source.label, "group_column": source.group}
    if source.validation is None:
        record["split"] = {"validation_fraction": source.validation_fraction, "seed": source.split_seed}
    return record


def user_tables(spec: TaskSpec) -> dict[str, pa.Table]:
    """The normalized train and validation tables of user task `spec`, every file read and checked first;
    label names from the training rows when params.yaml declares none. Example ids are row indices in
    their file (0-based), so they stay the same when other rows change."""
    source = spec.user
    files = _files(spec)
    wanted = tuple(dict.fromkeys((*source.text, source.label, *([source.group] if source.group else []))))
    raw = {split: read_columns(path, wanted, f"user_tasks.{spec.name}.{split}") for split, path in files.items()}
    for split, values in raw.items():
        rows = len(values[source.label])
        if rows == 0:
            raise LayersimError(f"{files[split]} holds no rows (the {split} split of {spec.name!r} would be empty); "
                                "add rows.")
        _check_text(files[split], values, source.text)
        if source.group:
            _check_group(files[split], values[source.group], source.group)
    parsed = {split: _labels(files[split], values[source.label], source.label) for split, values in raw.items()}
    kinds = {kind for kind, _ in parsed.values()}
    if len(kinds) > 1:
        raise LayersimError(f"user task {spec.name!r} has label names in one file and numbers in the other "
                            f"({', '.join(f'{files[s]}: {k}s' for s, (k, _) in parsed.items())}); use one kind.")
    names, declared = spec.label_names, bool(spec.label_names)
    if not spec.regression and spec.format != "multiple_choice" and not names:
        kind, train_labels = parsed["train"]
        if kind == "number":
            train_labels = [_whole(files["train"], label, row) for row, label in enumerate(train_labels, 1)]
        names = tuple(map(str, sorted(set(train_labels))))
        spec = dataclasses.replace(spec, label_names=names)
        if len(names) < 2:
            _one_class(spec, files["train"], names[0])
    if spec.format == "multiple_choice":
        names = tuple(map(str, range(spec.num_choices)))
    ids = {split: (_regression(files[split], kind, labels) if spec.regression else
                   _class_ids(files[split], spec, kind, labels, names, declared))
           for split, (kind, labels) in parsed.items()}
    if source.validation is None:
        rows = _split(spec, len(ids["train"]))
        raw = {split: {c: [raw["train"][c][i] for i in rows[split]] for c in wanted} for split in SPLITS}
        ids = {split: ids["train"][rows[split]] for split in SPLITS}
        where = {split: rows[split] for split in SPLITS}
    else:
        where = {split: np.arange(len(ids[split])) for split in SPLITS}
    _check_sizes_and_classes(spec, files, ids)
    record = _source(spec, files)
    tables = {}
    for split in SPLITS:
        columns = {target: raw[split][column] for target, column in _targets(spec)}
        if spec.format == "multiple_choice":
            columns = {"context": columns["context"],
                       "choices": [list(c) for c in zip(*(raw[split][c] for c in source.text[1:]))]}
        columns["label"] = ids[split].tolist()
        shared = [_group_key(v) for v in raw[split][source.group]] if source.group else None
        tables[split] = _normalized(spec, columns, split, record, example_id=where[split], shared=shared)
    return tables


def _targets(spec: TaskSpec) -> list[tuple[str, str]]:
    """(normalized column, user column) of the text columns; multiple choice's choices are gathered apart."""
    if spec.format == "multiple_choice":
        return [("context", spec.user.text[0])]
    return list(zip(spec.text_columns, spec.user.text))


def _check_sizes_and_classes(spec: TaskSpec, files: dict[str, Path], ids: dict[str, np.ndarray]) -> None:
    for split in SPLITS:
        where = files.get(split, files["train"])
        if len(ids[split]) < MIN_ROWS:
            raise LayersimError(f"the {split} split of user task {spec.name!r} ({where}) has {len(ids[split])} rows, "
                                f"fewer than {MIN_ROWS}: too few to score or compare; add rows.")
    train = ids["train"]
    if spec.regression:
        if np.all(train == train[0]):
            raise LayersimError(f"every training label of user task {spec.name!r} ({files['train']}) is "
                                f"{train[0]:g}; a regression task needs labels that vary.")
        return
    if spec.format != "multiple_choice" and len(np.unique(train)) < 2:
        _one_class(spec, files["train"], spec.label_names[int(train[0])])
    if "f1" in spec.metrics and len(spec.label_names) != 2:
        raise LayersimError(f"user task {spec.name!r} asks for f1, which scores two classes, but it has "
                            f"{len(spec.label_names)} ({', '.join(spec.label_names)}); use accuracy or mcc.")


def _one_class(spec: TaskSpec, path: Path, only: str) -> None:
    raise LayersimError(f"every training row of user task {spec.name!r} ({path}) has the label {only!r}; a "
                        "classifier needs at least two classes.")


def labels_from_table(spec: TaskSpec, path: Path) -> TaskSpec:
    """`spec` with the label names that the download_task stage took from the data (its table's metadata),
    when that table exists; else `spec` as declared."""
    if not path.is_file():
        return spec
    import pyarrow.parquet as pq

    meta = json.loads((pq.read_schema(path).metadata or {}).get(b"layersim", b"{}"))
    if meta.get("task") != spec.name:
        return spec
    return dataclasses.replace(spec, label_names=tuple(meta.get("label_names", ())))
