"""Parquet with integrity: layersim's JSON metadata, a row count written only when a writer finishes, and a
checked reader (page CRCs, the row count, schema against the contract, expected metadata, non-finite
values) whose every failure is one line naming the file and the stage to re-run."""


import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from layersim.errors import LayersimError
from layersim.data.io.atomic import atomic_path


METADATA_KEY = b"layersim"
# A second footer entry, written only when a writer finishes: the row count the file must hold.
INTEGRITY_KEY = b"layersim.integrity"


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


def integrity_footer(num_rows: int) -> dict[bytes, bytes]:
    return {INTEGRITY_KEY: json.dumps({"num_rows": int(num_rows)}).encode()}


def _dictionary_columns(schema: pa.Schema) -> list[str]:
    """Parquet column paths that keep dictionary encoding: all but the stored values (floating point, or the 24-bit
    integers of layersim.data.io.stored)."""
    paths = []
    for field in schema:
        leaf, path = field.type, field.name
        while pa.types.is_list(leaf) or pa.types.is_large_list(leaf) or pa.types.is_fixed_size_list(leaf):
            leaf, path = leaf.value_type, path + ".list.element"
        if not (pa.types.is_floating(leaf) or pa.types.is_fixed_size_binary(leaf)):
            paths.append(path)
    return paths


def parquet_writer(path: Path, schema: pa.Schema) -> pq.ParquetWriter:
    # CRC32 per page: a flipped bit in the data is an error when it is read, not a silent wrong number.
    # No dictionary for floating-point columns (activations, attention weights): their values hardly
    # repeat, so a dictionary only costs time (4-10x slower writes, measured) and space before Parquet
    # falls back to plain encoding.
    return pq.ParquetWriter(path, schema, write_page_checksum=True, use_dictionary=_dictionary_columns(schema))


def write_parquet(table: pa.Table, path: str | os.PathLike, footer: dict[bytes, bytes] | None = None) -> None:
    """Write a whole table atomically, with page checksums and its row count (and `footer`'s entries) in the
    footer."""
    with atomic_path(path) as tmp:
        with parquet_writer(tmp, table.schema) as writer:
            writer.write_table(table)
            writer.add_key_value_metadata(integrity_footer(table.num_rows) | (footer or {}))


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


class ParquetReader:
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


def metadata_int(reader: ParquetReader, key: str, minimum: int) -> int:
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
