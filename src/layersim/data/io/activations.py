"""Activation tables (one file per model, task, run and pooling; a fixed_size_list<float32>[hidden] column per
layer, or scaled float16 or 24-bit integers as extract.table_precision says, layersim.data.io.stored): the streaming writer and the checked,
lazily read table (docs/architecture.md, "Data contracts"). Every reader gets float32 whatever the file holds."""


import contextlib
import json
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from layersim.errors import LayersimError
from layersim.data.words import WORD_FIELDS, check_keys
from layersim.data.io.atomic import atomic_path
from layersim.data.io.stored import SCALES_KEY, VALUE_TYPES, Scales, encode, encoding, from_arrow, to_arrow
from layersim.data.io.parquet import (METADATA_KEY, ParquetReader, first_non_finite, integrity_footer, metadata_int,
                                      parquet_writer)


# --- activation tables -------------------------------------------------------------------------

def layer_column(layer: int) -> str:
    """Column name of a layer: 0 is the embeddings, k the output of the k-th transformer layer."""
    return f"layer_{layer:02d}"




def activation_schema(num_layers: int, hidden_size: int, label_type: pa.DataType, metadata: dict,
                      precision: str = "float32") -> pa.Schema:
    # A "tokens" table (layersim.data.words) has one row per word, keyed by segment and word too.
    words = list(WORD_FIELDS) if metadata.get("pooling") == "tokens" else []
    # cluster_id: the examples that share a text (the task table's, layersim.data.tasks.spec.cluster_ids), the unit
    # every null and bootstrap moves (layersim.similarity.inference.exchangeability).
    fields = [pa.field("example_id", pa.int64()), pa.field("cluster_id", pa.int64()), pa.field("choice", pa.int16()),
              *words, pa.field("label", label_type)]
    value = VALUE_TYPES[precision]
    fields += [pa.field(layer_column(k), pa.list_(value, hidden_size)) for k in range(num_layers + 1)]
    return pa.schema(fields, metadata={METADATA_KEY: json.dumps(metadata, sort_keys=True)})


class ActivationWriter:
    """Stream per-layer activations into one Parquet file, atomically.

    Use as a context manager; the file appears under its final name only if the block succeeds.
    Rows are buffered into row groups of about `rows_per_group`, so a reader gets few, large chunks.
    `precision` (a key of VALUE_TYPES) is what the values are stored as; float16 and int24 are scaled per neuron and
    row group (layersim.data.io.stored), their scales written into the footer with the row count.
    """

    def __init__(self, path: str | os.PathLike, *, num_layers: int, hidden_size: int,
                 label_type: pa.DataType, metadata: dict[str, Any], rows_per_group: int = 4096,
                 precision: str = "float32"):
        self.schema = activation_schema(num_layers, hidden_size, label_type,
                                        {**metadata, "num_layers": num_layers, "hidden_size": hidden_size}, precision)
        self.precision = precision
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.rows_per_group = rows_per_group
        self._path = path
        self._stack = contextlib.ExitStack()
        self._writer: pq.ParquetWriter | None = None
        self._pending: list[tuple[list[pa.Array], list[np.ndarray]]] = []  # key columns, float32 layers
        self._scales = Scales([layer_column(k) for k in range(num_layers + 1)], hidden_size)
        self.num_rows = 0

    def __enter__(self) -> "ActivationWriter":
        with contextlib.ExitStack() as stack:
            tmp = stack.enter_context(atomic_path(self._path))
            self._writer = stack.enter_context(parquet_writer(tmp, self.schema))
            self._stack = stack.pop_all()
        return self

    def write(self, example_id: np.ndarray, choice: np.ndarray, label: np.ndarray,
              layers: list[np.ndarray], segment: np.ndarray | None = None, word: np.ndarray | None = None,
              cluster_id: np.ndarray | None = None) -> None:
        """Append rows; `layers[k]` is a (rows, hidden) float32 array for layer k. A "tokens" table (and only
        one) takes each row's `segment` and `word` too. `cluster_id`: each row's cluster (None: its example)."""
        if len(layers) != self.num_layers + 1:
            raise LayersimError(f"expected {self.num_layers + 1} layer arrays, got {len(layers)}.")
        words = "word" in self.schema.names
        if words != (segment is not None and word is not None):
            raise LayersimError(f"segment and word are {'required for' if words else 'invalid in'} table {self._path}; "
                                "they are given for, and only for, pooling 'tokens'.")
        rows = len(example_id)
        keys = [pa.array(segment, pa.int16()), pa.array(word, pa.int32())] if words else []
        clusters = example_id if cluster_id is None else cluster_id
        if len(clusters) != rows:
            raise LayersimError(f"{len(clusters)} cluster ids for {rows} rows of table {self._path}; give one per row.")
        columns = [pa.array(example_id, pa.int64()), pa.array(clusters, pa.int64()), pa.array(choice, pa.int16()),
                   *keys, pa.array(label, self.schema.field("label").type)]
        checked = []
        for k, values in enumerate(layers):
            values = np.array(values, dtype=np.float32)  # a copy: the caller may reuse its buffer before the flush
            if values.shape != (rows, self.hidden_size):
                raise LayersimError(f"layer {k} has shape {values.shape}, expected ({rows}, {self.hidden_size}) "
                                    f"for {rows} rows of hidden size {self.hidden_size}.")
            checked.append(values)
        self._pending.append((columns, checked))
        self.num_rows += rows
        if sum(len(pending[0]) for pending, _ in self._pending) >= self.rows_per_group:
            self._flush()

    def _flush(self) -> None:
        # One row group, encoded as a block: its scales are its own columns' (layersim.data.io.stored).
        if self._pending:
            keys = [pa.concat_arrays(parts) for parts in zip(*(k for k, _ in self._pending))]
            columns, scales = [], []
            for layer in zip(*(v for _, v in self._pending)):
                stored, scale = encode(np.concatenate(layer), self.precision)
                columns.append(pa.FixedSizeListArray.from_arrays(to_arrow(stored, self.precision), self.hidden_size))
                scales.append(scale)
            if self.precision != "float32":
                self._scales.add(len(keys[0]), scales)
            self._writer.write_table(pa.Table.from_arrays(keys + columns, schema=self.schema), row_group_size=1 << 30)
            self._pending = []

    def __exit__(self, *exc) -> bool | None:
        # Closing the writer, then renaming (success) or deleting (failure) the temporary file.
        if exc[0] is None:
            try:
                self._flush()
                # Only a finished file gets its row count: a reader checks it against the footer.
                footer = integrity_footer(self.num_rows)
                self._writer.add_key_value_metadata(footer | (self._scales.footer() if self.precision != "float32"
                                                              else {}))
            except BaseException:
                self._stack.__exit__(*sys.exc_info())
                raise
        return self._stack.__exit__(*exc)


class ActivationTable:
    """A checked, lazily read activation table: metadata and ids up front, layers on demand, as float32.

    Opening checks the schema against the contract (one fixed_size_list<float32>[hidden_size] column
    per layer, or float16 in every layer, as many as the metadata's num_layers), the row count written with the file, and,
    with
    `expect`, metadata values the caller knows: e.g. ``{"task": "rte", "split": "validation",
    "run": "seed1", "pooling": "cls", "model_digest": <digest of the weights>}``. Every page is
    checksummed as it is read; a corrupt or truncated file is a LayersimError that says so."""

    def __init__(self, path: str | os.PathLike, expect: Mapping[str, Any] | None = None):
        self.path = Path(path)
        self._reader = ParquetReader(self.path, "activation table", "extract")
        self._file = self._reader.file
        self.metadata = self._reader.metadata
        self.num_layers = metadata_int(self._reader, "num_layers", 0)
        self.hidden_size = metadata_int(self._reader, "hidden_size", 1)
        label = self._reader.schema.field("label").type if "label" in self._reader.schema.names else pa.int64()
        if label not in (pa.int64(), pa.float64()):
            label = pa.int64()  # reported by check_types below
        self.words = self.metadata.get("pooling") == "tokens"
        first = layer_column(0)
        stored = self._reader.schema.field(first).type if first in self._reader.schema.names else None
        value = next((t for t in VALUE_TYPES.values() if stored == pa.list_(t, self.hidden_size)), pa.float32())
        if "example_id" in self._reader.schema.names and "cluster_id" not in self._reader.schema.names:
            raise LayersimError(f"activation table {self.path} has no cluster_id column (it was written before the "
                                "tables recorded which examples share a premise, question or context); re-run the "
                                "download_task and extract stages.")
        self._reader.check_types(
            {"example_id": pa.int64(), "cluster_id": pa.int64(), "choice": pa.int16(), **{f.name: f.type for f in WORD_FIELDS if self.words},
             "label": label}
            | {layer_column(k): pa.list_(value, self.hidden_size) for k in range(self.num_layers + 1)},
            f" for num_layers {self.num_layers} and hidden_size {self.hidden_size} in its metadata")
        # Scaled float16 and int24 carry their scales in the footer; float16 tables written before scales have none,
        # and are read as stored (their tiny values may be zeros: re-run the extract stage to store them scaled).
        footer = self._file.metadata.metadata or {}
        columns = [layer_column(k) for k in range(self.num_layers + 1)]
        scaled = value == pa.binary(3) or (value == pa.float16() and SCALES_KEY in footer)
        self._scales = Scales.from_footer(footer, self.path, columns, self.hidden_size, self._reader.num_rows) \
            if scaled else None
        self.precision = encoding(value, scaled)
        self.check(expect)
        ids = self._reader.read(["example_id", "cluster_id", "choice", *(["segment", "word"] if self.words else [])])
        self.example_id = ids.column("example_id").to_numpy()
        # The unit of every null and bootstrap: the rows of all examples that share a text (one example by default).
        self.cluster_id = ids.column("cluster_id").to_numpy()
        self.choice = ids.column("choice").to_numpy()
        # Word rows (pooling "tokens"): segment and word index, unique per (example_id, choice, segment, word).
        self.segment = ids.column("segment").to_numpy() if self.words else None
        self.word = ids.column("word").to_numpy() if self.words else None
        if self.words:
            check_keys(self.keys(), lambda row: f"activation table {self.path} row {row}")

    def null_unit(self) -> str:
        """What the nulls and intervals move as one block, in words: examples sharing the text the task declares
        shared (metadata's ``shared``, from the task table) when any do; an example otherwise."""
        shared = self.metadata.get("shared")
        clustered = len(np.unique(self.cluster_id)) < len(np.unique(self.example_id))
        return f"examples sharing their {shared}" if clustered and shared else "examples sharing a cluster" if \
            clustered else "example"

    def keys(self) -> np.ndarray:
        """(rows, 2) example_id, choice; (rows, 4) with segment and word for a tokens table, as int64."""
        columns = [self.example_id, self.choice] + ([self.segment, self.word] if self.words else [])
        return np.stack([np.asarray(c, np.int64) for c in columns], axis=1)

    @property
    def num_rows(self) -> int:
        return len(self.example_id)

    def check(self, expect: Mapping[str, Any] | None = None, **values: Any) -> None:
        """Refuse this table unless its metadata holds the `expect` (or keyword) values: a table swapped
        with another run's, task's or split's, or extracted from other weights (model_digest)."""
        self._reader.check_expected({**(expect or {}), **values})

    def check_examples(self, example_id: np.ndarray, num_choices: int = 1, source: str = "the task table") -> None:
        """Refuse this table unless its rows are `example_id` in this order, `num_choices` rows per example
        (choices 0, 1, …), as the extract stage writes them from the same task table."""
        if self.words:
            raise LayersimError(f"activation table {self.path} holds words (pooling 'tokens'), not examples; "
                                "valid poolings here are cls, mean and last.")
        want_ids = np.repeat(np.asarray(example_id, dtype=np.int64), num_choices)
        want_choice = np.tile(np.arange(num_choices, dtype=np.int16), len(example_id))
        if len(want_ids) != self.num_rows:
            raise LayersimError(f"activation table {self.path} holds {self.num_rows} rows, expected {len(want_ids)} "
                                f"({len(example_id)} examples × {num_choices} choices of {source}); "
                                "re-run the extract stage.")
        bad = np.flatnonzero((self.example_id != want_ids) | (self.choice != want_choice))
        if bad.size:
            row = int(bad[0])
            raise LayersimError(f"activation table {self.path} row {row} holds example_id {int(self.example_id[row])} "
                                f"choice {int(self.choice[row])}, expected example_id {int(want_ids[row])} choice "
                                f"{int(want_choice[row])} of {source}; its example order differs, so re-run the "
                                "extract stage.")

    def labels(self) -> np.ndarray:
        labels = self._reader.read(["label"]).column("label").to_numpy()
        row = first_non_finite(labels)
        if row is not None:
            raise LayersimError(f"activation table {self.path} holds a non-finite label ({labels[row]}) at example_id "
                                f"{int(self.example_id[row])}; re-run the download_task and extract stages.")
        return labels

    def check_finite(self, k: int, array: np.ndarray, first_row: int = 0) -> np.ndarray:
        """Return `array` (rows first_row… of layer k) if it is finite; else name the layer and the first
        example_id that holds NaN or ±inf."""
        row = first_non_finite(array)
        if row is not None:
            at = first_row + row
            value = array[row][~np.isfinite(array[row])][0]
            raise LayersimError(f"{self.path} layer {k} holds a non-finite value at example_id "
                                f"{int(self.example_id[at])} (row {at}, choice {int(self.choice[at])}, value {value}); "
                                "the encoder overflowed or fine-tuning diverged, so fix that and re-run the "
                                "extract stage.")
        return array

    def layer(self, k: int) -> np.ndarray:
        """Layer k as an (n, hidden) float32 array."""
        if not 0 <= k <= self.num_layers:
            raise LayersimError(f"layer {k} is out of range for {self.path}; valid layers are 0..{self.num_layers}.")
        column = self._reader.read([layer_column(k)]).column(0).combine_chunks()
        return self.check_finite(k, self._decode(k, column.values, len(column)))

    def row_groups(self) -> list[tuple[int, int]]:
        """(first row, rows) of each Parquet row group, in file order: the units read at random."""
        sizes = [self._file.metadata.row_group(g).num_rows for g in range(self._file.metadata.num_row_groups)]
        return list(zip(np.cumsum([0, *sizes[:-1]]).tolist(), sizes))

    def layer_of_row_groups(self, k: int, groups: list[int]) -> np.ndarray:
        """Layer k of the listed row groups (in that order) as an (n, hidden) float32 array."""
        if not 0 <= k <= self.num_layers:
            raise LayersimError(f"layer {k} is out of range for {self.path}; valid layers are 0..{self.num_layers}.")
        with self._reader.translating():
            column = self._file.read_row_groups(groups, columns=[layer_column(k)]).column(0).combine_chunks()
        spans, at, parts = self.row_groups(), 0, []
        for g in groups:  # each group unscaled and checked at its own rows, so an error names the right example
            first, size = spans[g]
            parts.append(self.check_finite(k, self._decode(k, column.values[at * self.hidden_size:
                                                                            (at + size) * self.hidden_size],
                                                           size, first), first))
            at += size
        return np.concatenate(parts) if parts else np.zeros((0, self.hidden_size), np.float32)

    def _decode(self, k: int, values: pa.Array, rows: int, first_row: int = 0) -> np.ndarray:
        """Rows first_row … first_row + rows of layer k, stored as the flat `values`, as (rows, hidden) float32."""
        stored = from_arrow(values).reshape(rows, self.hidden_size)
        return stored if self._scales is None else self._scales.decode(layer_column(k), stored, first_row)

    def layers(self) -> list[np.ndarray]:
        return [self.layer(k) for k in range(self.num_layers + 1)]

    def check_comparable(self, other: "ActivationTable") -> None:
        """Refuse to compare two tables that do not hold the same examples in the same order."""
        for key in ("task", "split", "pooling"):
            if self.metadata.get(key) != other.metadata.get(key):
                raise LayersimError(f"cannot compare {self.path} and {other.path}: {key} differs "
                                    f"({self.metadata.get(key)!r} vs {other.metadata.get(key)!r}).")
        mine, theirs = self.keys(), other.keys()
        if not np.array_equal(mine, theirs):
            if mine.shape != theirs.shape:
                detail = f"{self.num_rows} vs {other.num_rows} rows"
            else:
                row = int(np.flatnonzero((mine != theirs).any(axis=1))[0])
                detail = (f"row {row} holds example_id {int(self.example_id[row])} vs {int(other.example_id[row])}"
                          + (f", key {mine[row].tolist()} vs {theirs[row].tolist()}" if self.words else ""))
            what = "word keys (example_id, choice, segment, word)" if self.words else "example_id order"
            raise LayersimError(f"cannot compare {self.path} and {other.path}: their {what} differs "
                                f"({detail}); re-run the extract stage.")
        if not np.array_equal(self.cluster_id, other.cluster_id):
            row = int(np.flatnonzero(self.cluster_id != other.cluster_id)[0])
            raise LayersimError(f"cannot compare {self.path} and {other.path}: row {row} is in cluster "
                                f"{int(self.cluster_id[row])} vs {int(other.cluster_id[row])} (examples sharing a "
                                "text); re-run the extract stage.")

    def iter_batches(self, rows: int = 4096, layers: list[int] | tuple[int, ...] | None = None
                     ) -> Iterator[list[np.ndarray]]:
        """The layers (all, or those listed) `rows` examples at a time, in row order: per batch a list of
        (rows, hidden) float32 arrays, one per layer; the last batch holds what is left.

        Memory is one batch, not the table, so a computation can run over tables larger than memory
        (e.g. layersim.similarity.LinearCKAAccumulator). Batches of two tables with the same number of
        rows line up. Each batch is checked like layer(): NaN or ±inf names the layer and example_id."""
        if isinstance(rows, bool) or not isinstance(rows, (int, np.integer)) or rows < 1:
            raise LayersimError(f"rows must be a positive integer, got {rows!r}.")
        layers = list(range(self.num_layers + 1)) if layers is None else [int(k) for k in layers]
        for k in layers:
            if not 0 <= k <= self.num_layers:
                raise LayersimError(f"layer {k} is out of range for {self.path}; valid layers are "
                                    f"0..{self.num_layers}.")
        pending: list[list[np.ndarray]] = []  # rows read but not yet yielded, when pyarrow's batches
        count = start = 0                     # do not come in exactly `rows` rows
        # A reader of its own without pre-buffering: pyarrow keeps pre-buffered column chunks until the
        # reader closes, so iterating one that pre-buffers holds the whole file in memory by the end.
        with self._reader.translating(), pq.ParquetFile(self.path, pre_buffer=False,
                                                        page_checksum_verification=True) as reader:
            for batch in reader.iter_batches(batch_size=int(rows), columns=[layer_column(k) for k in layers]):
                arrays = []
                for k, column in zip(layers, batch.columns):
                    # flatten() honours the slice a batch may be of its chunk; no copy without nulls.
                    arrays.append(self.check_finite(k, self._decode(k, column.flatten(), len(column), start), start))
                start += batch.num_rows
                if not pending and batch.num_rows == rows:
                    yield arrays
                    continue
                pending.append(arrays)
                count += batch.num_rows
                while count >= rows:
                    merged = [np.concatenate(parts) for parts in zip(*pending)]
                    yield [m[:rows] for m in merged]
                    count -= rows
                    pending = [[m[rows:] for m in merged]] if count else []
        if count:
            yield [np.concatenate(parts) for parts in zip(*pending)]
        if start != self.num_rows:
            raise self._reader.corrupt(f"streamed {start} rows, the footer says {self.num_rows}")

