"""What a task is (:class:`TaskSpec`: format, metrics, labels, where its rows come from) and how its rows are
normalized into a task table. Apart from the package's __init__ so that :mod:`layersim.data.tasks.user`, which
the package imports back, can import these without importing the package."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

# The hub's Parquet conversion of every public dataset (see the module docstring).
PARQUET_EXPORT = "refs/convert/parquet"

FORMATS = ("single", "pair", "multiple_choice")
SPLITS = ("train", "validation")
TEXT_COLUMNS = {"single": ("text",), "pair": ("text_a", "text_b"), "multiple_choice": ("context", "choices")}


@dataclass(frozen=True)
class HubSource:
    """Where a paper task lives on the hub and how its columns map to the normalized table.

    `columns` maps each normalized column to a hub column, or to a tuple of hub columns that are
    joined with a space (text) or gathered into a list (``choices``). `config` is the dataset's config,
    which names its folder in the Parquet export ("default" for a dataset without configs).
    """

    path: str
    config: str | None
    columns: dict[str, str | tuple[str, ...]]
    splits: dict[str, str] = field(default_factory=lambda: {"train": "train", "validation": "validation"})
    revision: str = PARQUET_EXPORT

    def data_files(self, split: str) -> str:
        """The Parquet files of one normalized split, relative to the dataset's root at `revision`."""
        return f"{self.config or 'default'}/{self.splits[split]}/*.parquet"


@dataclass(frozen=True)
class UserSource:
    """Where a user task's rows are (params.yaml's user_tasks; read by :mod:`layersim.data.tasks.user`): its files,
    paths inside the repository, or one file split by a seeded draw; and which columns hold the text (in the
    format's order: text; text_a, text_b; context, choice 1 … choice k) and the label."""

    train: str
    validation: str | None
    text: tuple[str, ...]
    label: str
    validation_fraction: float | None = None
    split_seed: int = 0
    group: str | None = None  # a column whose identical values mark examples that share a text (TaskSpec.shared)


@dataclass(frozen=True)
class TaskSpec:
    name: str
    format: str
    metrics: tuple[str, ...]
    label_names: tuple[str, ...] = ()
    regression: bool = False
    num_choices: int = 0
    hub: HubSource | None = None
    user: UserSource | None = None  # a task declared in params.yaml (user_tasks), read from the user's files
    # What examples share, so that they are not independent (a premise with several hypotheses, a question with
    # several sentences, a context with several questions): the source column (hub or user file) whose identical
    # values make one cluster (:func:`cluster_ids`). None: every example its own cluster.
    shared: str | None = None

    @property
    def num_labels(self) -> int:
        """Output units of the task head: 1 for regression and multiple choice (one score per choice)."""
        if self.regression or self.format == "multiple_choice":
            return 1
        return len(self.label_names)

    @property
    def primary_metric(self) -> str:
        return self.metrics[0]

    @property
    def text_columns(self) -> tuple[str, ...]:
        return TEXT_COLUMNS[self.format]

    @property
    def label_type(self) -> pa.DataType:
        return pa.float64() if self.regression else pa.int64()


def task_metadata(spec: TaskSpec, split: str, source: dict) -> dict:
    return {"task": spec.name, "format": spec.format, "split": split, "label_names": list(spec.label_names),
            "metrics": list(spec.metrics), "regression": spec.regression, "shared": spec.shared, "source": source}


def cluster_ids(example_id: np.ndarray, shared: list | None = None) -> np.ndarray:
    """Each example's cluster (int64): the example_id of the first example, in table order, whose `shared` value
    (one per example: a premise, a question, a group label) is the same; with None, every example its own. The
    nulls and bootstrap intervals move a cluster's rows together (layersim.similarity.inference.exchangeability)."""
    example_id = np.asarray(example_id, dtype=np.int64)
    if shared is None:
        return example_id.copy()
    first: dict = {}
    return np.array([first.setdefault(value, e) for value, e in zip(shared, example_id.tolist())], dtype=np.int64)


def _normalized(spec: TaskSpec, columns: dict[str, list], split: str, source: dict,
                example_id: np.ndarray | None = None, shared: list | None = None) -> pa.Table:
    """The normalized table of `columns` (text columns and label); `shared`: each example's value of what it
    shares with others (spec.shared's column), None when the task declares nothing."""
    n = len(columns["label"])
    example_id = np.arange(n) if example_id is None else np.asarray(example_id)
    arrays = {"example_id": pa.array(example_id, pa.int64()),
              "cluster_id": pa.array(cluster_ids(example_id, shared), pa.int64())}
    for name in spec.text_columns:
        arrays[name] = pa.array(columns[name], pa.list_(pa.string()) if name == "choices" else pa.string())
    arrays["label"] = pa.array(columns["label"], spec.label_type)
    table = pa.table(arrays)
    return table.replace_schema_metadata({b"layersim": json.dumps(task_metadata(spec, split, source), sort_keys=True)})
