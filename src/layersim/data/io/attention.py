"""Attention tables: one row per (example, choice, query token, key token), a list of heads per layer."""


import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from layersim.errors import LayersimError
from layersim.data.io.activations import layer_column
from layersim.data.io.parquet import ParquetReader, first_non_finite, metadata_int
from layersim.data.io.stored import SCALES_KEY, VALUE_TYPES, Scales, encoding, from_arrow


class AttentionTable:
    """Attention maps written by the extract stage (see layersim.experiments.extract.extract_attention)."""

    def __init__(self, path: str | os.PathLike, expect: Mapping[str, Any] | None = None):
        self.path = Path(path)
        if not self.path.is_file():
            raise LayersimError(f"attention table {self.path} does not exist; set extract.attention_examples > 0 "
                                "and run the extract stage.")
        self._reader = ParquetReader(self.path, "attention table", "extract")
        self._file = self._reader.file
        self.metadata = self._reader.metadata
        self.num_layers = metadata_int(self._reader, "num_layers", 1)
        self.num_heads = metadata_int(self._reader, "num_heads", 1)
        first = layer_column(1)
        stored = self._reader.schema.field(first).type if first in self._reader.schema.names else None
        value = next((t for t in VALUE_TYPES.values() if stored == pa.list_(t, self.num_heads)), pa.float32())
        columns = [layer_column(k) for k in range(1, self.num_layers + 1)]
        self._reader.check_types(
            {"example_id": pa.int64(), "choice": pa.int16(), "query": pa.int16(), "key": pa.int16()}
            | {column: pa.list_(value, self.num_heads) for column in columns},
            f" for num_layers {self.num_layers} and num_heads {self.num_heads} in its metadata")
        # Stored as float32, or float16 or int24 scaled per head (layersim.data.io.stored), decoded to float32 on
        # reading.
        footer = self._file.metadata.metadata or {}
        scaled = value == pa.binary(3) or (value == pa.float16() and SCALES_KEY in footer)
        self._scales = (Scales.from_footer(footer, self.path, columns, self.num_heads, self._reader.num_rows)
                        if value != pa.float32() else None)
        self.precision = encoding(value, scaled)
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

    @property
    def map_examples(self) -> np.ndarray:
        """The example_id of each (example, choice) map, in table order (a multiple-choice example's once a choice)."""
        return self.index[self.row_starts[self.example_starts], 0]

    def layer(self, k: int) -> np.ndarray:
        """Layer k's (num_pairs, num_heads) float32 attention weights, k = 1 … num_layers."""
        if not 1 <= k <= self.num_layers:
            raise LayersimError(f"attention layer {k} is out of range for {self.path}; valid layers are "
                                f"1..{self.num_layers}.")
        column = self._reader.read([layer_column(k)]).column(0).combine_chunks()
        weights = from_arrow(column.values).reshape(len(column), self.num_heads)
        if self._scales is not None:
            weights = self._scales.decode(layer_column(k), weights)
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
