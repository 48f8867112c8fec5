"""Atomic writers and checked readers for the tables, JSON and figures passed between stages.

Every writer writes to a temporary name in the destination folder and renames it into place, so
a crashed stage never leaves a file that looks finished (DESIGN.md, "Writes are atomic").
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from layersim.errors import LayersimError
from layersim.tasks import subsample

METADATA_KEY = b"layersim"

# Read once at import (single-threaded then): os.umask can only be read by setting it.
_UMASK = os.umask(0)
os.umask(_UMASK)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, *, is_dir: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling of `path`; on success rename it onto `path`, on error delete it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if is_dir:
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    else:
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        tmp = Path(name)
    try:
        yield tmp
        # mkstemp/mkdtemp create private files; give the result the permissions of a normal write.
        os.chmod(tmp, (0o777 if is_dir else 0o666) & ~_UMASK)
        if is_dir and path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        raise


def write_json(obj: Any, path: str | os.PathLike) -> None:
    """Write `obj` as stable, human-readable JSON (sorted keys, so reruns give identical bytes)."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n")


def write_figure(fig, path: str | os.PathLike, dpi: int = 150) -> None:
    """Save a matplotlib figure atomically as PNG."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=dpi, bbox_inches="tight")


def with_metadata(table: pa.Table, metadata: dict[str, Any]) -> pa.Table:
    """Attach layersim's JSON metadata to a table's schema."""
    return table.replace_schema_metadata({METADATA_KEY: json.dumps(metadata, sort_keys=True)})


def table_metadata(schema: pa.Schema, path: str | os.PathLike = "table") -> dict[str, Any]:
    """Read layersim's metadata from a schema, refusing files that carry none."""
    raw = (schema.metadata or {}).get(METADATA_KEY)
    if raw is None:
        raise LayersimError(f"{path} has no layersim metadata; it was not written by layersim, so it cannot be trusted.")
    return json.loads(raw)


def write_parquet(table: pa.Table, path: str | os.PathLike) -> None:
    """Write a whole table atomically."""
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


# --- activation tables -------------------------------------------------------------------------

def layer_column(layer: int) -> str:
    """Column name of a layer: 0 is the embeddings, k the output of the k-th transformer layer."""
    return f"layer_{layer:02d}"


def activation_schema(num_layers: int, hidden_size: int, label_type: pa.DataType, metadata: dict) -> pa.Schema:
    fields = [
        pa.field("example_id", pa.int64()),
        pa.field("choice", pa.int16()),
        pa.field("label", label_type),
    ]
    fields += [pa.field(layer_column(k), pa.list_(pa.float32(), hidden_size)) for k in range(num_layers + 1)]
    return pa.schema(fields, metadata={METADATA_KEY: json.dumps(metadata, sort_keys=True)})


class ActivationWriter:
    """Stream per-layer activations into one Parquet file, atomically.

    Use as a context manager; the file appears under its final name only if the block succeeds.
    Rows are buffered into row groups of about `rows_per_group`, so a reader gets few, large chunks.
    """

    def __init__(self, path: str | os.PathLike, *, num_layers: int, hidden_size: int,
                 label_type: pa.DataType, metadata: dict[str, Any], rows_per_group: int = 4096):
        self.schema = activation_schema(num_layers, hidden_size, label_type,
                                        {**metadata, "num_layers": num_layers, "hidden_size": hidden_size})
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.rows_per_group = rows_per_group
        self._path = path
        self._stack = contextlib.ExitStack()
        self._writer: pq.ParquetWriter | None = None
        self._pending: list[pa.Table] = []

    def __enter__(self) -> "ActivationWriter":
        with contextlib.ExitStack() as stack:
            tmp = stack.enter_context(atomic_path(self._path))
            self._writer = stack.enter_context(pq.ParquetWriter(tmp, self.schema))
            self._stack = stack.pop_all()
        return self

    def write(self, example_id: np.ndarray, choice: np.ndarray, label: np.ndarray,
              layers: list[np.ndarray]) -> None:
        """Append rows; `layers[k]` is a (rows, hidden) float32 array for layer k."""
        if len(layers) != self.num_layers + 1:
            raise LayersimError(f"expected {self.num_layers + 1} layer arrays, got {len(layers)}.")
        columns = [pa.array(example_id, pa.int64()), pa.array(choice, pa.int16()),
                   pa.array(label, self.schema.field("label").type)]
        for values in layers:
            flat = pa.array(np.ascontiguousarray(values, dtype=np.float32).reshape(-1))
            columns.append(pa.FixedSizeListArray.from_arrays(flat, self.hidden_size))
        self._pending.append(pa.Table.from_arrays(columns, schema=self.schema))
        if sum(t.num_rows for t in self._pending) >= self.rows_per_group:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            self._writer.write_table(pa.concat_tables(self._pending), row_group_size=1 << 30)
            self._pending = []

    def __exit__(self, *exc) -> bool | None:
        # Closing the writer, then renaming (success) or deleting (failure) the temporary file.
        if exc[0] is None:
            try:
                self._flush()
            except BaseException:
                self._stack.__exit__(*sys.exc_info())
                raise
        return self._stack.__exit__(*exc)


class ActivationTable:
    """A checked, lazily read activation table: metadata and ids up front, layers on demand."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.is_file():
            raise LayersimError(f"activation table {self.path} does not exist; run the extract stage first.")
        try:
            self._file = pq.ParquetFile(self.path)
        except (pa.ArrowInvalid, OSError) as err:
            raise LayersimError(f"activation table {self.path} is not a readable Parquet file ({err}).") from err
        self.metadata = table_metadata(self._file.schema_arrow, self.path)
        self.num_layers = int(self.metadata["num_layers"])
        self.hidden_size = int(self.metadata["hidden_size"])
        expected = ["example_id", "choice", "label"] + [layer_column(k) for k in range(self.num_layers + 1)]
        if self._file.schema_arrow.names != expected:
            raise LayersimError(f"activation table {self.path} has columns {self._file.schema_arrow.names}, "
                                f"expected {expected[:4]}…{expected[-1]} for {self.num_layers} layers.")
        ids = self._file.read(columns=["example_id", "choice"])
        self.example_id = ids.column("example_id").to_numpy()
        self.choice = ids.column("choice").to_numpy()

    @property
    def num_rows(self) -> int:
        return len(self.example_id)

    def labels(self) -> np.ndarray:
        return self._file.read(columns=["label"]).column("label").to_numpy()

    def layer(self, k: int) -> np.ndarray:
        """Layer k as an (n, hidden) float32 array."""
        if not 0 <= k <= self.num_layers:
            raise LayersimError(f"layer {k} is out of range for {self.path}; valid layers are 0..{self.num_layers}.")
        column = self._file.read(columns=[layer_column(k)]).column(0).combine_chunks()
        values = column.values.to_numpy(zero_copy_only=False)
        array = values.reshape(len(column), self.hidden_size)
        if not np.isfinite(array).all():
            row = int(np.argwhere(~np.isfinite(array))[0][0])
            raise LayersimError(f"{self.path} layer {k} holds a non-finite value at example_id "
                                f"{int(self.example_id[row])}.")
        return array

    def layers(self) -> list[np.ndarray]:
        return [self.layer(k) for k in range(self.num_layers + 1)]

    def check_comparable(self, other: "ActivationTable") -> None:
        """Refuse to compare two tables that do not hold the same examples in the same order."""
        for key in ("task", "split", "pooling"):
            if self.metadata.get(key) != other.metadata.get(key):
                raise LayersimError(f"cannot compare {self.path} and {other.path}: {key} differs "
                                    f"({self.metadata.get(key)!r} vs {other.metadata.get(key)!r}).")
        if not (np.array_equal(self.example_id, other.example_id) and np.array_equal(self.choice, other.choice)):
            raise LayersimError(f"cannot compare {self.path} and {other.path}: their example_id order differs.")


class AttentionTable:
    """Attention maps written by the extract stage (see layersim.extract.extract_attention)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.is_file():
            raise LayersimError(f"attention table {self.path} does not exist; set extract.attention_examples > 0 "
                                "and run the extract stage.")
        self._file = pq.ParquetFile(self.path)
        self.metadata = table_metadata(self._file.schema_arrow, self.path)
        self.num_layers = int(self.metadata["num_layers"])
        self.num_heads = int(self.metadata["num_heads"])
        keys = self._file.read(columns=["example_id", "choice", "query"])
        self.index = np.stack([keys.column(name).to_numpy().astype(np.int64) for name in keys.column_names], axis=1)
        # An attention row (one query's distribution over keys) starts where (example, choice, query) changes.
        changes = np.any(self.index[1:] != self.index[:-1], axis=1)
        self.row_starts = np.concatenate([[0], np.flatnonzero(changes) + 1]).astype(np.int64)
        # Rows of one (example, choice) are contiguous: they start where the first two keys change.
        starts = self.index[self.row_starts, :2]
        new_example = np.any(starts[1:] != starts[:-1], axis=1)
        self.example_starts = np.concatenate([[0], np.flatnonzero(new_example) + 1]).astype(np.int64)

    def layer(self, k: int) -> np.ndarray:
        """Layer k's (num_pairs, num_heads) float32 attention weights, k = 1 … num_layers."""
        if not 1 <= k <= self.num_layers:
            raise LayersimError(f"attention layer {k} is out of range for {self.path}; valid layers are "
                                f"1..{self.num_layers}.")
        column = self._file.read(columns=[layer_column(k)]).column(0).combine_chunks()
        return column.values.to_numpy(zero_copy_only=False).reshape(len(column), self.num_heads)

    def maps(self) -> list:
        """Every layer's attention as :class:`layersim.similarity.AttentionMaps`, layers 1 … L."""
        from layersim.similarity import AttentionMaps

        return [AttentionMaps(self.layer(k), self.row_starts, self.example_starts)
                for k in range(1, self.num_layers + 1)]

    def check_comparable(self, other: "AttentionTable") -> None:
        if not np.array_equal(self.index, other.index):
            raise LayersimError(f"cannot compare {self.path} and {other.path}: they hold different "
                                "(example, query) rows; extract both from the same examples and tokenizer.")


# --- task tables -------------------------------------------------------------------------------

def read_task_table(folder: str | os.PathLike, task, split: str, max_examples: int | None = None) -> pa.Table:
    """The normalized `split` table of `task` (a TaskSpec) from a download folder, checked; at most
    `max_examples` rows, the same seeded choice for every stage that asks."""
    path = Path(folder) / f"{split}.parquet"
    if not path.is_file():
        raise LayersimError(f"task table {path} does not exist; run the download_task stage for {task.name!r} first.")
    table = pq.read_table(path)
    meta = table_metadata(table.schema, path)
    if meta.get("task") != task.name or meta.get("split") != split:
        raise LayersimError(f"{path} holds task {meta.get('task')!r} split {meta.get('split')!r}, "
                            f"expected task {task.name!r} split {split!r}.")
    expected = ["example_id", *task.text_columns, "label"]
    if table.column_names != expected:
        raise LayersimError(f"{path} has columns {table.column_names}, expected {expected}.")
    return subsample(table, max_examples, seed=0)
