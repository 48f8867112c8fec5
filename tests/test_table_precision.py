"""extract.table_precision (issue 53): activation tables stored in float16 are read back as float32 (upcast before any
arithmetic), within float16's rounding of what was written; a value beyond float16's range is refused in one sentence
instead of being stored as inf; and the disk plan counts two bytes a value."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from layersim.compute import disk
from layersim.data.io import ActivationTable, ActivationWriter
from layersim.data.io.activations import VALUE_TYPES
from layersim.errors import LayersimError

LAYERS, HIDDEN = 2, 16


def _write(path, layers, precision):
    rows = len(layers[0])
    with ActivationWriter(path, num_layers=LAYERS, hidden_size=HIDDEN, label_type=pa.int64(),
                          metadata={"pooling": "cls"}, precision=precision, rows_per_group=32) as writer:
        writer.write(np.arange(rows), np.zeros(rows, np.int16), np.zeros(rows, np.int64), layers)


def test_a_float16_table_reads_back_as_float32_within_its_rounding(tmp_path):
    rng = np.random.default_rng(0)
    layers = [rng.normal(scale=10.0 ** k, size=(100, HIDDEN)).astype(np.float32) for k in range(LAYERS + 1)]
    _write(tmp_path / "half.parquet", layers, "float16")
    _write(tmp_path / "full.parquet", layers, "float32")
    half, full = ActivationTable(tmp_path / "half.parquet"), ActivationTable(tmp_path / "full.parquet")
    for k, written in enumerate(layers):
        for read in (half.layer(k), half.layer_of_row_groups(k, list(range(len(half.row_groups())))),
                     np.concatenate([b[0] for b in half.iter_batches(rows=30, layers=[k])])):
            assert read.dtype == np.float32
            np.testing.assert_allclose(read, written, rtol=2.0 ** -11, atol=0)  # float16's half an ulp
        np.testing.assert_array_equal(full.layer(k), written)
    assert (tmp_path / "half.parquet").stat().st_size < 0.6 * (tmp_path / "full.parquet").stat().st_size


def test_a_value_beyond_float16s_range_is_refused_in_one_sentence(tmp_path):
    layers = [np.zeros((3, HIDDEN), np.float32) for _ in range(LAYERS + 1)]
    layers[1][2, 5] = -7e4
    with pytest.raises(LayersimError, match=r"^layer 1 holds a value of magnitude 7e\+04, beyond float16's 65504, so "
                                            r"table .* cannot be stored in half precision; set extract.table_precision"):
        _write(tmp_path / "big.parquet", layers, "float16")
    assert list(tmp_path.iterdir()) == []  # nothing left under the final name


def test_params_name_every_stored_type_and_the_plan_counts_its_bytes():
    from layersim.params.vocabulary import TABLE_PRECISIONS

    assert TABLE_PRECISIONS == tuple(VALUE_TYPES)
    assert disk.table_bytes(10, 12, 768, "float16") * 2 == disk.table_bytes(10, 12, 768) == 10 * 13 * 768 * 4
