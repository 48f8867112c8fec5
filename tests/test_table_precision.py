"""extract.table_precision (issues 53, 61): activation tables stored in float16 or as 24-bit integers are read back as
float32 (decoded before any arithmetic), within the stored type's rounding of each value's distance from its column's
offset: each neuron is stored as residuals about its mean, scaled by a power of two, per row group
(layersim.data.io.stored), so neither a tiny neuron (underflow), nor a value beyond 65504 (overflow), nor the small
variation of a neuron far from zero is lost; `auto`, the default, stores word rows as 24-bit integers and the other
tables as float16 (table_encoding, the one rule); tables written before scales stay readable; and the disk plan counts
each encoding's bytes a value."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from layersim.data import disk
from layersim.data.io import ActivationTable, ActivationWriter
from layersim.data.io.activations import VALUE_TYPES, activation_schema, layer_column
from layersim.data.io.parquet import integrity_footer, parquet_writer
from layersim.data.io.stored import AUTO, BYTES_PER_VALUE, SCALES_KEY, exponents, round_trip, table_encoding
from layersim.errors import LayersimError

LAYERS, HIDDEN = 2, 16


def _close(read, written, blocks=(slice(None),)):
    """`read` within float16's half ulp of each value's residual about its block's column mean (and float32's
    rounding of the sum)."""
    for rows in blocks:
        residual = written[rows] - written[rows].astype(np.float64).mean(axis=0)
        bound = 2.0 ** -11 * np.abs(residual) + 2.0 ** -23 * np.abs(written[rows])
        assert (np.abs(read[rows].astype(np.float64) - written[rows]) <= bound * (1 + 1e-6)).all()


def _write(path, layers, precision, batch=20):
    rows = len(layers[0])
    with ActivationWriter(path, num_layers=LAYERS, hidden_size=HIDDEN, label_type=pa.int64(),
                          metadata={"pooling": "cls"}, precision=precision, rows_per_group=32) as writer:
        for start in range(0, rows, batch):  # as extract writes, a batch at a time: row groups of 40 rows
            part = slice(start, start + batch)
            writer.write(np.arange(rows)[part], np.zeros(rows, np.int16)[part], np.zeros(rows, np.int64)[part],
                         [x[part] for x in layers])


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
            _close(read, written, [slice(0, 40), slice(40, 80), slice(80, 100)])  # the row groups
        np.testing.assert_array_equal(full.layer(k), written)
    for precision in VALUE_TYPES:  # half (float16) or three quarters (int24) of the layers' bytes, scales included
        _write(tmp_path / f"{precision}.parquet", layers, precision, batch=100)
    for precision, share in (("float16", 0.6), ("int24", 0.85)):
        path = tmp_path / f"{precision}.parquet"
        assert _layer_bytes(path) + len(_footer_scales(path)) < share * _layer_bytes(tmp_path / "float32.parquet")


def _layer_bytes(path) -> int:
    """The stored bytes of the layer columns (the key columns are the same in every precision)."""
    meta = pq.ParquetFile(path).metadata
    return sum(meta.row_group(g).column(c).total_compressed_size for g in range(meta.num_row_groups)
               for c in range(meta.num_columns) if meta.row_group(g).column(c).path_in_schema.startswith("layer_"))


def _footer_scales(path) -> bytes:
    return (pq.ParquetFile(path).metadata.metadata or {}).get(SCALES_KEY, b"")


def _read_every_way(table, k):
    return (table.layer(k), table.layer_of_row_groups(k, list(range(len(table.row_groups())))),
            np.concatenate([b[0] for b in table.iter_batches(rows=30, layers=[k])]))


def test_tiny_and_huge_neurons_keep_float16s_relative_precision(tmp_path):
    # Plain float16 flushes magnitudes below 6e-8 to zero and stores those above 65504 as inf; scaled per neuron,
    # each keeps 11 significant bits, in every row group (whose scales differ: the second group is 1000× larger).
    rng = np.random.default_rng(1)
    scale = np.array([1e-9, 1e-30, 1e-3, 1.0, 1e5, 3e30, *np.ones(HIDDEN - 6)], np.float32)
    layers = [(rng.normal(size=(100, HIDDEN)) * scale).astype(np.float32) for _ in range(LAYERS + 1)]
    layers[1][50:] *= 1000
    layers[2][:, 7] = 0.0  # a dead neuron stays exactly zero
    _write(tmp_path / "half.parquet", layers, "float16")
    table = ActivationTable(tmp_path / "half.parquet")
    assert table.precision == "float16" and len(table.row_groups()) == 3
    for k, written in enumerate(layers):
        for read in _read_every_way(table, k):
            assert read.dtype == np.float32 and np.isfinite(read).all()
            _close(read, written, [slice(0, 40), slice(40, 80), slice(80, 100)])
            assert (read[:, :6] != 0).all()  # no tiny neuron flushed to zero
    assert not table.layer(2)[:, 7].any()
    _close(round_trip(layers[0], "float16"), layers[0])


def test_a_neuron_far_from_zero_keeps_its_variation():
    # MiniLM's CLS rows: neurons about 10 that vary by 1e-3 across examples. Plain float16 (steps of 2^-7 there)
    # keeps none of that variation; stored about its mean, the centred column is kept to float16's precision.
    rng = np.random.default_rng(3)
    values = (10 + 1e-3 * rng.normal(size=(500, 4))).astype(np.float32)
    centred = values - values.mean(axis=0)
    kept = round_trip(values, "float16")
    assert np.abs((kept - kept.mean(axis=0)) - centred).max() <= 2.0 ** -11 * np.abs(centred).max() + 1e-5 * 2 ** -10
    plain = values.astype(np.float16).astype(np.float32)
    assert (np.ptp(plain, axis=0) == 0).all()  # every neuron a constant


def test_each_residuals_largest_magnitude_is_scaled_to_just_below_two_to_the_fifteen():
    values = np.array([[3.0, -1e-9, 0.0, 65504.0 * 4]], np.float32)
    scaled = np.abs(values) / 2.0 ** exponents(values).astype(float)
    assert ((scaled[0, [0, 1, 3]] >= 2 ** 14) & (scaled[0, [0, 1, 3]] < 2 ** 15)).all() and scaled[0, 2] == 0


def test_a_float16_table_written_before_scales_reads_as_stored(tmp_path):
    rng = np.random.default_rng(2)
    layers = [rng.normal(size=(40, HIDDEN)).astype(np.float32) for _ in range(LAYERS + 1)]
    schema = activation_schema(LAYERS, HIDDEN, pa.int64(), {"pooling": "cls", "num_layers": LAYERS,
                                                           "hidden_size": HIDDEN}, "float16")
    columns = [pa.array(np.arange(40)), pa.array(np.arange(40)), pa.array(np.zeros(40, np.int16)),
               pa.array(np.zeros(40, np.int64))]  # example_id, cluster_id, choice, label
    columns += [pa.FixedSizeListArray.from_arrays(pa.array(x.astype(np.float16).reshape(-1)), HIDDEN) for x in layers]
    with parquet_writer(tmp_path / "old.parquet", schema) as writer:
        writer.write_table(pa.Table.from_arrays(columns, schema=schema))
        writer.add_key_value_metadata(integrity_footer(40))
    table = ActivationTable(tmp_path / "old.parquet")
    assert table.precision == "float16 unscaled"
    for k, written in enumerate(layers):
        np.testing.assert_array_equal(table.layer(k), written.astype(np.float16).astype(np.float32))


def test_scales_that_do_not_fit_the_table_are_refused_naming_the_extract_stage(tmp_path):
    layers = [np.ones((40, HIDDEN), np.float32) for _ in range(LAYERS + 1)]
    _write(tmp_path / "half.parquet", layers, "float16")
    source = pa.parquet.ParquetFile(tmp_path / "half.parquet")
    footer = dict(source.metadata.metadata)
    footer[SCALES_KEY] = footer[SCALES_KEY].replace(b'"rows": [40]', b'"rows": [41]')
    schema = source.schema_arrow
    with parquet_writer(tmp_path / "bad.parquet", schema) as writer:
        writer.write_table(source.read())
        writer.add_key_value_metadata({k: v for k, v in footer.items() if k != b"ARROW:schema"})
    with pytest.raises(LayersimError, match=r"bad.parquet holds scales for 41 rows of 3 columns of width 16, not its 40 "
                                            r"rows of 3 of width 16; it is corrupt, so re-run the extract stage\.$"):
        ActivationTable(tmp_path / "bad.parquet")
    assert layer_column(0) in schema.names


def test_params_name_every_setting_and_the_plan_counts_each_encodings_bytes():
    from layersim.data.io import stored
    from layersim.params.vocabulary import TABLE_PRECISIONS

    assert TABLE_PRECISIONS == stored.TABLE_PRECISIONS and set(BYTES_PER_VALUE) == set(VALUE_TYPES)
    assert disk.table_bytes(10, 12, 768, "float16") * 2 == disk.table_bytes(10, 12, 768) == 10 * 13 * 768 * 4
    assert disk.table_bytes(10, 12, 768, "int24") == 10 * 13 * 768 * 3


def test_auto_stores_word_rows_as_24_bit_integers_and_every_other_table_as_float16():
    assert table_encoding(AUTO, "tokens") == "int24"
    for kind in ("cls", "mean", "last", "attention"):
        assert table_encoding(AUTO, kind) == "float16"
    for precision in ("float32", "float16"):  # a named precision: every table alike
        assert {table_encoding(precision, kind) for kind in ("tokens", "cls", "attention")} == {precision}
    # int24 is fixed point: every activation table, but attention weights keep float16's bits of each weight
    kinds = ("tokens", "cls", "mean", "attention")
    assert [table_encoding("int24", kind) for kind in kinds] == ["int24"] * 3 + ["float16"]
    with pytest.raises(LayersimError, match=r"^table precision 'bfloat16' is not one of auto, float32, float16, "
                                            r"int24\.$"):
        table_encoding("bfloat16", "tokens")


@pytest.mark.parametrize("precision", ["float16", "int24"])
def test_a_column_of_1e_minus_8_survives_and_one_of_1e6_or_1e30_does_not_overflow(precision):
    # Unscaled float16 flushes 1e-8 to 0 and turns 1e6 into inf; scaled per column, each keeps the encoding's bits:
    # float16 11 significant bits of each residual, int24 2^-23 of the column's largest residual.
    rng = np.random.default_rng(4)
    scale = np.array([1e-8, 1e-8, 1e6, 1e30], np.float32)
    values = (rng.normal(size=(300, 4)) * scale + np.array([0, 3e-8, 1e6, 0], np.float32)).astype(np.float32)
    kept = round_trip(values, precision)
    assert kept.dtype == np.float32 and np.isfinite(kept).all() and (kept != 0).all()
    residual = values - values.astype(np.float64).mean(axis=0)
    if precision == "float16":
        bound = 2.0 ** -11 * np.abs(residual)
    else:
        bound = 2.0 ** -23 * np.abs(residual).max(axis=0)
    assert (np.abs(kept.astype(np.float64) - values) <= bound + 2.0 ** -23 * np.abs(values)).all()
    np.testing.assert_allclose(np.std(kept, axis=0), np.std(values, axis=0), rtol=1e-3)  # the variation survives


def test_an_int24_table_reads_back_within_two_to_the_minus_23_of_each_columns_largest(tmp_path):
    rng = np.random.default_rng(5)
    scale = np.array([1e-9, 1e-3, 1.0, 1e5, 3e30, *np.ones(HIDDEN - 5)], np.float32)
    layers = [(rng.normal(size=(100, HIDDEN)) * scale + 10).astype(np.float32) for _ in range(LAYERS + 1)]
    layers[1][50:] *= 1000
    layers[2][:, 7] = 0.0
    _write(tmp_path / "int24.parquet", layers, "int24")
    table = ActivationTable(tmp_path / "int24.parquet")
    assert table.precision == "int24" and len(table.row_groups()) == 3
    groups = [slice(0, 40), slice(40, 80), slice(80, 100)]
    for k, written in enumerate(layers):
        backwards = table.layer_of_row_groups(k, [2, 0])  # row groups in any order decode with their own scales
        np.testing.assert_array_equal(backwards, np.concatenate([table.layer(k)[groups[2]], table.layer(k)[groups[0]]]))
        for read in _read_every_way(table, k):
            assert read.dtype == np.float32 and np.isfinite(read).all()
            for rows in groups:
                residual = written[rows] - written[rows].astype(np.float64).mean(axis=0)
                bound = 2.0 ** -23 * np.abs(residual).max(axis=0) + 2.0 ** -23 * np.abs(written[rows])
                assert (np.abs(read[rows].astype(np.float64) - written[rows]) <= bound * (1 + 1e-6)).all()
    assert not table.layer(2)[:, 7].any()


def test_extract_stores_each_pooling_as_auto_says(tiny_model_dir, tmp_path):
    from layersim.data.batching import encode_task
    from layersim.data.tasks import generated_table, get_task
    from layersim.experiments.extract import extract_activations
    from layersim.models.registry import load_encoder, load_tokenizer

    folder, spec = tiny_model_dir("tiny-bert"), get_task("synth-similarity")
    tokenizer = load_tokenizer(folder)
    encoded = encode_task(generated_table(spec, "validation", 6, seed=1), spec, tokenizer, max_length=64, words=True)
    read = {}
    for precision in ("float32", AUTO, "int24"):
        out = {q: tmp_path / f"{precision}.{q}.parquet" for q in ("cls", "tokens")}
        extract_activations(load_encoder(folder), tokenizer, spec, encoded, out, {"run": "orig", "task": spec.name},
                            batch_size=4, device=torch.device("cpu"), precision=precision)
        read[precision] = {q: ActivationTable(path) for q, path in out.items()}
    assert {q: t.precision for q, t in read[AUTO].items()} == {"cls": "float16", "tokens": "int24"}
    assert {q: t.precision for q, t in read["int24"].items()} == {"cls": "int24", "tokens": "int24"}
    for q, table in read[AUTO].items():
        for k in range(table.num_layers + 1):
            full, kept = read["float32"][q].layer(k), table.layer(k)
            residual = np.abs(full - full.astype(np.float64).mean(axis=0)).max(axis=0)
            # half a unit in the last place: float16's is at most 2^-11 of the column's largest residual, int24's 2^-23
            step = 2.0 ** (-11 if q == "cls" else -23)
            assert (np.abs(kept.astype(np.float64) - full) <= step * residual + 2.0 ** -22 * np.abs(full)).all()


def test_attention_maps_stored_in_float16_read_back_within_their_rounding(tiny_model_dir, tmp_path):
    from layersim.data.batching import encode_task
    from layersim.data.io import AttentionTable
    from layersim.data.tasks import generated_table, get_task
    from layersim.experiments.extract import extract_attention
    from layersim.models.registry import load_encoder, load_tokenizer

    folder, spec = tiny_model_dir("tiny-bert"), get_task("synth-similarity")
    tokenizer = load_tokenizer(folder)
    encoded = encode_task(generated_table(spec, "validation", 6, seed=1), spec, tokenizer, max_length=128)
    tables = {}
    for precision in ("float32", "float16", AUTO, "int24"):  # auto and int24: attention maps as float16
        extract_attention(load_encoder(folder), tokenizer, encoded, tmp_path / f"{precision}.parquet",
                          {"run": "orig", "task": spec.name}, batch_size=2, device=torch.device("cpu"),
                          precision=precision)
        tables[precision] = AttentionTable(tmp_path / f"{precision}.parquet")
    assert [t.precision for t in tables.values()] == ["float32", "float16", "float16", "float16"]
    np.testing.assert_array_equal(tables["float32"].index, tables["float16"].index)
    for k in range(1, tables["float32"].num_layers + 1):
        for same in (AUTO, "int24"):
            np.testing.assert_array_equal(tables[same].layer(k), tables["float16"].layer(k))
    for k in range(1, tables["float32"].num_layers + 1):
        full, half = tables["float32"].layer(k), tables["float16"].layer(k)
        assert half.dtype == np.float32 and (full > 0).all() and (half > 0).all()  # softmax: no weight flushed to 0
        np.testing.assert_allclose(half, full, rtol=2.0 ** -11, atol=0)
