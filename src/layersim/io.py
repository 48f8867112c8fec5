"""Atomic writers and checked readers for the tables, JSON and figures passed between stages.

Every writer writes to a temporary name in the destination folder and renames it into place, so
a crashed stage never leaves a file that looks finished (docs/architecture.md, "Writes are atomic").

Every reader checks what it opens before using it (docs/architecture.md, "Data contracts"): Parquet pages carry
CRC checksums that are verified as they are read, the row count written into the footer must match
the data, schema and metadata must fit the contract, callers can state which task, split, run and
weights they expect, and non-finite activations are reported with their layer and example.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import re
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from layersim.errors import LayersimError
from layersim.tasks import subsample
from layersim.words import WORD_FIELDS, check_keys

METADATA_KEY = b"layersim"
# A second footer entry, written only when a writer finishes: the row count the file must hold.
INTEGRITY_KEY = b"layersim.integrity"

# Read once at import (single-threaded then): os.umask can only be read by setting it.
_UMASK = os.umask(0)
os.umask(_UMASK)

# Temporaries are named .<name>.<host>-<pid>-<random>.tmp: hidden, never a result's name, and a later
# write to the same path can tell that the process which left one behind is gone.
_HOST = re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname()) or "host"


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def remove_stale_temporaries(path: str | os.PathLike) -> list[Path]:
    """Delete the temporaries of `path` left by writers on this host whose process is gone (killed
    mid-write); return what was deleted. Temporaries of live writers are left alone."""
    path = Path(path)
    prefix = f".{path.name}."
    removed = []
    if not path.parent.is_dir():
        return removed
    for entry in path.parent.iterdir():
        name = entry.name
        if not (name.startswith(prefix) and name.endswith(".tmp")):
            continue
        parts = name[len(prefix):-len(".tmp")].rsplit("-", 2)
        if len(parts) == 3 and parts[0] == _HOST and parts[1].isdigit() and not _process_alive(int(parts[1])):
            _remove(entry)
            removed.append(entry)
    return removed


def _fsync(path: Path) -> None:
    """Flush a file, or a folder's entries, to disk, so that a rename never lands before the data."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot fsync a folder
        pass
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    if path.is_dir():
        for folder, _, files in os.walk(path):
            for name in files:
                _fsync(Path(folder) / name)
            _fsync(Path(folder))
    else:
        _fsync(path)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, *, is_dir: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling of `path`; on success rename it onto `path`, on error delete it.

    The temporary is hidden (``.<name>.<host>-<pid>-<random>.tmp``); one left by a writer that was
    killed is deleted by the next atomic write to the same path. An existing folder at `path` is
    moved aside and replaced by a rename, so at no moment does a half-deleted folder sit at `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    prefix = f".{path.name}.{_HOST}-{os.getpid()}-"
    if is_dir:
        tmp = Path(tempfile.mkdtemp(prefix=prefix, suffix=".tmp", dir=path.parent))
    else:
        fd, name = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=path.parent)
        os.close(fd)
        tmp = Path(name)
    try:
        yield tmp
        # mkstemp/mkdtemp create private files; give the result the permissions of a normal write.
        os.chmod(tmp, (0o777 if is_dir else 0o666) & ~_UMASK)
        _fsync_tree(tmp)
        if is_dir and path.is_dir() and not path.is_symlink():
            old = tmp.with_name(tmp.name[:-len(".tmp")] + "_old.tmp")
            os.replace(path, old)
            try:
                os.replace(tmp, path)
            except BaseException:
                os.replace(old, path)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
        _fsync(path.parent)
    except OSError as err:
        _remove(tmp)
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            raise LayersimError(f"no space left on the device while writing {path}; free some space and run the "
                                "stage again (the partial file was removed, earlier outputs are intact).") from err
        raise
    except BaseException:
        _remove(tmp)
        raise


def write_json(obj: Any, path: str | os.PathLike) -> None:
    """Write `obj` as stable, human-readable JSON (sorted keys, so reruns give identical bytes)."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n")


def write_figure(fig, path: str | os.PathLike, dpi: int = 150) -> None:
    """Save a matplotlib figure atomically as PNG."""
    # Rendered in memory, then written: a full disk then fails as the OSError it is (PIL's PNG writer
    # turns it into "'_idat' object has no attribute 'fileno'").
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    with atomic_path(path) as tmp:
        tmp.write_bytes(buffer.getvalue())


def with_metadata(table: pa.Table, metadata: dict[str, Any]) -> pa.Table:
    """Attach layersim's JSON metadata to a table's schema."""
    return table.replace_schema_metadata({METADATA_KEY: json.dumps(metadata, sort_keys=True)})


def table_metadata(schema: pa.Schema, path: str | os.PathLike = "table") -> dict[str, Any]:
    """Read layersim's metadata from a schema, refusing files that carry none."""
    raw = (schema.metadata or {}).get(METADATA_KEY)
    if raw is None:
        raise LayersimError(f"{path} has no layersim metadata; it was not written by layersim, so it cannot be trusted.")
    try:
        metadata = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        raise LayersimError(f"{path} has corrupt layersim metadata ({err}); re-run the stage that wrote it.") from err
    if not isinstance(metadata, dict):
        raise LayersimError(f"{path} has layersim metadata {metadata!r}, expected a JSON object; "
                            "re-run the stage that wrote it.")
    return metadata


def _integrity(num_rows: int) -> dict[bytes, bytes]:
    return {INTEGRITY_KEY: json.dumps({"num_rows": int(num_rows)}).encode()}


def _dictionary_columns(schema: pa.Schema) -> list[str]:
    """Parquet column paths that keep dictionary encoding: all but floating-point values."""
    paths = []
    for field in schema:
        leaf, path = field.type, field.name
        while pa.types.is_list(leaf) or pa.types.is_large_list(leaf) or pa.types.is_fixed_size_list(leaf):
            leaf, path = leaf.value_type, path + ".list.element"
        if not pa.types.is_floating(leaf):
            paths.append(path)
    return paths


def _parquet_writer(path: Path, schema: pa.Schema) -> pq.ParquetWriter:
    # CRC32 per page: a flipped bit in the data is an error when it is read, not a silent wrong number.
    # No dictionary for floating-point columns (activations, attention weights): their values hardly
    # repeat, so a dictionary only costs time (4-10x slower writes, measured) and space before Parquet
    # falls back to plain encoding.
    return pq.ParquetWriter(path, schema, write_page_checksum=True, use_dictionary=_dictionary_columns(schema))


def write_parquet(table: pa.Table, path: str | os.PathLike) -> None:
    """Write a whole table atomically, with page checksums and its row count in the footer."""
    with atomic_path(path) as tmp:
        with _parquet_writer(tmp, table.schema) as writer:
            writer.write_table(table)
            writer.add_key_value_metadata(_integrity(table.num_rows))


# --- checked reading -----------------------------------------------------------------------------

def _detail(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0].rstrip(".") if text else type(err).__name__


def _describe(data_type: pa.DataType) -> str:
    """A type as the data contract writes it: fixed_size_list<float>[768], list<string>, int64."""
    if pa.types.is_fixed_size_list(data_type):
        return f"fixed_size_list<{_describe(data_type.value_type)}>[{data_type.list_size}]"
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        return f"list<{_describe(data_type.value_type)}>"
    return str(data_type)


class _ParquetReader:
    """A Parquet file opened for reading with page checksums verified; every pyarrow error while opening
    or reading becomes a LayersimError that names the file and the stage that rewrites it."""

    def __init__(self, path: Path, kind: str, stage: str):
        self.path, self.kind, self.stage = path, kind, stage
        if not path.is_file():
            raise LayersimError(f"{kind} {path} does not exist; run the {stage} stage first.")
        with self.translating():
            self.file = pq.ParquetFile(path, page_checksum_verification=True)
            self.schema = self.file.schema_arrow
            self.num_rows = self.file.metadata.num_rows
            footer = self.file.metadata.metadata or {}
        self.metadata = table_metadata(self.schema, path)
        # The footer holds layersim's metadata twice: as a Parquet key and inside the Arrow schema.
        copy = footer.get(METADATA_KEY)
        if copy is not None and copy != self.schema.metadata.get(METADATA_KEY):
            raise self.corrupt("the two copies of its layersim metadata in the footer differ")
        raw = footer.get(INTEGRITY_KEY)
        if raw is not None:  # tables written before page checksums carry no row count
            try:
                recorded = int(json.loads(raw)["num_rows"])
            except (ValueError, KeyError, TypeError) as err:
                raise self.corrupt(f"unreadable row count {raw!r}") from err
            if recorded != self.num_rows:
                raise LayersimError(f"{kind} {path} holds {self.num_rows} rows but was written with {recorded}; "
                                    f"it is truncated or corrupt, so re-run the {stage} stage.")

    def corrupt(self, detail: str) -> LayersimError:
        return LayersimError(f"{self.kind} {self.path} is not a readable Parquet file, it is truncated or corrupt "
                             f"({detail}); delete it and re-run the {self.stage} stage.")

    @contextlib.contextmanager
    def translating(self) -> Iterator[None]:
        try:
            yield
        except (PermissionError, FileNotFoundError, IsADirectoryError) as err:  # the file is fine, access is not
            raise LayersimError(f"{self.kind} {self.path} cannot be read ({_detail(err)}).") from err
        except (pa.ArrowException, OSError, EOFError) as err:
            # ArrowInvalid: no footer (cut short), bad thrift; OSError: a page's CRC does not match.
            raise self.corrupt(_detail(err)) from err

    def read(self, columns: list[str]) -> pa.Table:
        with self.translating():
            table = self.file.read(columns=columns)
        if table.num_rows != self.num_rows:
            raise self.corrupt(f"read {table.num_rows} rows of {columns[0]}, the footer says {self.num_rows}")
        return table

    def check_types(self, expected: Mapping[str, pa.DataType], why: str = "") -> None:
        """Refuse columns other than `expected` (in order) or of other types."""
        names = self.schema.names
        if names != list(expected):
            shown = list(expected) if len(expected) <= 8 else [*list(expected)[:4], "…", list(expected)[-1]]
            raise LayersimError(f"{self.kind} {self.path} has columns {names}, expected {shown}{why}; "
                                f"re-run the {self.stage} stage.")
        for name, want in expected.items():
            got = self.schema.field(name).type
            if got != want:  # list types compare equal whatever their child field is called
                raise LayersimError(f"{self.kind} {self.path} column {name} has type {_describe(got)}, expected "
                                    f"{_describe(want)}{why}; re-run the {self.stage} stage.")

    def check_expected(self, expect: Mapping[str, Any] | None) -> None:
        for key, want in (expect or {}).items():
            got = self.metadata.get(key)
            if got != want:
                raise LayersimError(f"{self.kind} {self.path} has {key} {got!r}, expected {want!r}; it was swapped "
                                    f"with another table or is stale, so re-run the {self.stage} stage.")


def _metadata_int(reader: _ParquetReader, key: str, minimum: int) -> int:
    value = reader.metadata.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise LayersimError(f"{reader.kind} {reader.path} has {key} {value!r} in its metadata, expected an integer "
                            f">= {minimum}; re-run the {reader.stage} stage.")
    return value


def first_non_finite(array: np.ndarray) -> int | None:
    """Index of the first row of a 2-D array that holds NaN or ±inf, or None (one pass, no copy kept)."""
    finite = np.isfinite(array)
    if finite.all():
        return None
    return int(np.argmin(finite.reshape(len(array), -1).all(axis=1)))


# --- activation tables -------------------------------------------------------------------------

def layer_column(layer: int) -> str:
    """Column name of a layer: 0 is the embeddings, k the output of the k-th transformer layer."""
    return f"layer_{layer:02d}"


def activation_schema(num_layers: int, hidden_size: int, label_type: pa.DataType, metadata: dict) -> pa.Schema:
    # A "tokens" table (layersim.words) has one row per word, keyed by segment and word too.
    words = list(WORD_FIELDS) if metadata.get("pooling") == "tokens" else []
    fields = [pa.field("example_id", pa.int64()), pa.field("choice", pa.int16()), *words, pa.field("label", label_type)]
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
        self.num_rows = 0

    def __enter__(self) -> "ActivationWriter":
        with contextlib.ExitStack() as stack:
            tmp = stack.enter_context(atomic_path(self._path))
            self._writer = stack.enter_context(_parquet_writer(tmp, self.schema))
            self._stack = stack.pop_all()
        return self

    def write(self, example_id: np.ndarray, choice: np.ndarray, label: np.ndarray,
              layers: list[np.ndarray], segment: np.ndarray | None = None, word: np.ndarray | None = None) -> None:
        """Append rows; `layers[k]` is a (rows, hidden) float32 array for layer k. A "tokens" table (and only
        one) takes each row's `segment` and `word` too."""
        if len(layers) != self.num_layers + 1:
            raise LayersimError(f"expected {self.num_layers + 1} layer arrays, got {len(layers)}.")
        words = "word" in self.schema.names
        if words != (segment is not None and word is not None):
            raise LayersimError(f"segment and word are {'required for' if words else 'invalid in'} table {self._path}; "
                                "they are given for, and only for, pooling 'tokens'.")
        rows = len(example_id)
        keys = [pa.array(segment, pa.int16()), pa.array(word, pa.int32())] if words else []
        columns = [pa.array(example_id, pa.int64()), pa.array(choice, pa.int16()), *keys,
                   pa.array(label, self.schema.field("label").type)]
        for k, values in enumerate(layers):
            values = np.ascontiguousarray(values, dtype=np.float32)
            if values.shape != (rows, self.hidden_size):
                raise LayersimError(f"layer {k} has shape {values.shape}, expected ({rows}, {self.hidden_size}) "
                                    f"for {rows} rows of hidden size {self.hidden_size}.")
            columns.append(pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), self.hidden_size))
        self._pending.append(pa.Table.from_arrays(columns, schema=self.schema))
        self.num_rows += rows
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
                # Only a finished file gets its row count: a reader checks it against the footer.
                self._writer.add_key_value_metadata(_integrity(self.num_rows))
            except BaseException:
                self._stack.__exit__(*sys.exc_info())
                raise
        return self._stack.__exit__(*exc)


class ActivationTable:
    """A checked, lazily read activation table: metadata and ids up front, layers on demand.

    Opening checks the schema against the contract (one fixed_size_list<float32>[hidden_size] column
    per layer, as many as the metadata's num_layers), the row count written with the file, and, with
    `expect`, metadata values the caller knows: e.g. ``{"task": "rte", "split": "validation",
    "run": "seed1", "pooling": "cls", "model_digest": <digest of the weights>}``. Every page is
    checksummed as it is read; a corrupt or truncated file is a LayersimError that says so."""

    def __init__(self, path: str | os.PathLike, expect: Mapping[str, Any] | None = None):
        self.path = Path(path)
        self._reader = _ParquetReader(self.path, "activation table", "extract")
        self._file = self._reader.file
        self.metadata = self._reader.metadata
        self.num_layers = _metadata_int(self._reader, "num_layers", 0)
        self.hidden_size = _metadata_int(self._reader, "hidden_size", 1)
        label = self._reader.schema.field("label").type if "label" in self._reader.schema.names else pa.int64()
        if label not in (pa.int64(), pa.float64()):
            label = pa.int64()  # reported by check_types below
        self.words = self.metadata.get("pooling") == "tokens"
        self._reader.check_types(
            {"example_id": pa.int64(), "choice": pa.int16(), **{f.name: f.type for f in WORD_FIELDS if self.words},
             "label": label}
            | {layer_column(k): pa.list_(pa.float32(), self.hidden_size) for k in range(self.num_layers + 1)},
            f" for num_layers {self.num_layers} and hidden_size {self.hidden_size} in its metadata")
        self.check(expect)
        ids = self._reader.read(["example_id", "choice", *(["segment", "word"] if self.words else [])])
        self.example_id = ids.column("example_id").to_numpy()
        self.choice = ids.column("choice").to_numpy()
        # Word rows (pooling "tokens"): segment and word index, unique per (example_id, choice, segment, word).
        self.segment = ids.column("segment").to_numpy() if self.words else None
        self.word = ids.column("word").to_numpy() if self.words else None
        if self.words:
            check_keys(self.keys(), lambda row: f"activation table {self.path} row {row}")

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
        values = column.values.to_numpy(zero_copy_only=False)
        return self.check_finite(k, values.reshape(len(column), self.hidden_size))

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
                    values = column.flatten().to_numpy(zero_copy_only=False)
                    arrays.append(self.check_finite(k, values.reshape(len(column), self.hidden_size), start))
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


class AttentionTable:
    """Attention maps written by the extract stage (see layersim.extract.extract_attention)."""

    def __init__(self, path: str | os.PathLike, expect: Mapping[str, Any] | None = None):
        self.path = Path(path)
        if not self.path.is_file():
            raise LayersimError(f"attention table {self.path} does not exist; set extract.attention_examples > 0 "
                                "and run the extract stage.")
        self._reader = _ParquetReader(self.path, "attention table", "extract")
        self._file = self._reader.file
        self.metadata = self._reader.metadata
        self.num_layers = _metadata_int(self._reader, "num_layers", 1)
        self.num_heads = _metadata_int(self._reader, "num_heads", 1)
        self._reader.check_types(
            {"example_id": pa.int64(), "choice": pa.int16(), "query": pa.int16(), "key": pa.int16()}
            | {layer_column(k): pa.list_(pa.float32(), self.num_heads) for k in range(1, self.num_layers + 1)},
            f" for num_layers {self.num_layers} and num_heads {self.num_heads} in its metadata")
        self._reader.check_expected(expect)
        keys = self._reader.read(["example_id", "choice", "query"])
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
        column = self._reader.read([layer_column(k)]).column(0).combine_chunks()
        weights = column.values.to_numpy(zero_copy_only=False).reshape(len(column), self.num_heads)
        row = first_non_finite(weights)
        if row is not None:
            example, choice, query = (int(v) for v in self.index[row])
            raise LayersimError(f"{self.path} attention layer {k} holds a non-finite weight at example_id {example} "
                                f"(choice {choice}, query token {query}, row {row}); the encoder overflowed, so fix "
                                "that and re-run the extract stage.")
        return weights

    def check_comparable(self, other: "AttentionTable") -> None:
        if not np.array_equal(self.index, other.index):
            raise LayersimError(f"cannot compare {self.path} and {other.path}: they hold different "
                                "(example, query) rows; extract both from the same examples and tokenizer.")


def run_expectations(checkpoints: str | os.PathLike, seeds, task_dir: str | os.PathLike | None = None
                     ) -> dict[str, dict[str, Any]]:
    """Run name → the metadata its activation tables must hold, from the fine-tuned checkpoints
    ``checkpoints/seed<k>/`` (each verified against its files): the digest of the weights they were extracted
    from ("orig": the pretrained weights the seeds were fine-tuned from), the digest of the task tables, and
    the model's num_layers and hidden_size. With `task_dir`, the checkpoints must have been fine-tuned on
    the task tables it holds now (a table edited by hand and one stage re-run alone would mix versions)."""
    from layersim.models import model_shape, verified_info

    now = task_tables_digest(task_dir) if task_dir is not None else None
    expect, bases, tasks = {}, {}, {}
    for seed in seeds:
        folder = Path(checkpoints) / f"seed{seed}"
        info = verified_info(folder)
        run = f"seed{seed}"
        bases[run], tasks[run] = info.get("base_digest"), info.get("task_digest")
        if now is not None and tasks[run] != now:
            raise LayersimError(f"checkpoint {folder} was fine-tuned on other task tables than {task_dir} holds now "
                                f"(digest {str(tasks[run])[:12]}, now {now[:12]}); re-run the finetune stage.")
        expect[run] = {"model_digest": info.get("digest"), "task_digest": tasks[run], **model_shape(folder)}
    for what, values in (("pretrained weights", bases), ("task tables", tasks)):
        if len(set(values.values())) > 1:
            raise LayersimError(f"the checkpoints in {checkpoints} were fine-tuned from different {what} "
                                f"({', '.join(f'{run}: {str(d)[:12]}' for run, d in values.items())}), expected "
                                "one; re-run the finetune stage.")
    first = next(iter(expect.values()))
    expect["orig"] = {**first, "model_digest": next(iter(bases.values()))}
    return expect


# --- task tables -------------------------------------------------------------------------------

def task_tables_digest(folder: str | os.PathLike) -> str:
    """SHA-256 over a task folder's tables (train and validation, names and bytes): recorded by finetune
    and extract, and checked by every stage after them against the tables they read."""
    import hashlib

    from layersim.models import file_digest

    digest = hashlib.sha256()
    for split in ("train", "validation"):
        path = Path(folder) / f"{split}.parquet"
        if not path.is_file():
            raise LayersimError(f"task table {path} does not exist; run the download_task stage first.")
        digest.update(f"{split}\0{file_digest(path)}\n".encode())
    return digest.hexdigest()


def read_task_table(folder: str | os.PathLike, task, split: str, max_examples: int | None = None) -> pa.Table:
    """The normalized `split` table of `task` (a TaskSpec) from a download folder, checked; at most
    `max_examples` rows, the same seeded choice for every stage that asks."""
    path = Path(folder) / f"{split}.parquet"
    if not path.is_file():
        raise LayersimError(f"task table {path} does not exist; run the download_task stage for {task.name!r} first.")
    reader = _ParquetReader(path, "task table", "download_task")
    meta = reader.metadata
    if meta.get("task") != task.name or meta.get("split") != split:
        raise LayersimError(f"{path} holds task {meta.get('task')!r} split {meta.get('split')!r}, "
                            f"expected task {task.name!r} split {split!r}; re-run the download_task stage.")
    text = {name: pa.list_(pa.string()) if name == "choices" else pa.string() for name in task.text_columns}
    reader.check_types({"example_id": pa.int64(), **text, "label": task.label_type}, f" for task {task.name!r}")
    table = reader.read(reader.schema.names)
    for name in table.column_names:
        if table.column(name).null_count:
            raise LayersimError(f"task table {path} column {name} has {table.column(name).null_count} missing "
                                "values, expected none; re-run the download_task stage.")
    ids = table.column("example_id").to_numpy()
    unique, counts = np.unique(ids, return_counts=True)
    if len(unique) != len(ids):
        raise LayersimError(f"task table {path} holds example_id {int(unique[counts > 1][0])} more than once, "
                            "expected unique ids; re-run the download_task stage.")
    row = first_non_finite(table.column("label").to_numpy())
    if row is not None:
        raise LayersimError(f"task table {path} holds a non-finite label at example_id {int(ids[row])}, expected a "
                            "number; re-run the download_task stage.")
    return subsample(table, max_examples, seed=0)
