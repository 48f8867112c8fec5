"""Tests for layersim.data.io: activation tables (round trip, schema, refusals) and atomic writes."""

from __future__ import annotations

import json
import math
import os
import re
import stat
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from layersim.data import io
from layersim.errors import LayersimError
from layersim.data.io import ActivationTable, ActivationWriter

NUM_LAYERS = 3
HIDDEN = 5
META = {"model": "tiny-bert", "digest": "abc123", "run": "orig", "pooling": "cls", "task": "synth-negation",
        "split": "validation"}


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _batch(rng: np.random.Generator, ids: list[int], dtype=np.float32) -> dict:
    n = len(ids)
    return {
        "example_id": np.asarray(ids, dtype=np.int64),
        "choice": np.zeros(n, dtype=np.int16),
        "label": np.asarray([i % 2 for i in ids], dtype=np.int64),
        "layers": [rng.standard_normal((n, HIDDEN)).astype(dtype) for _ in range(NUM_LAYERS + 1)],
    }


def _write(path: Path, batches: list[dict], rows_per_group: int = 4096, **meta) -> None:
    with ActivationWriter(path, num_layers=NUM_LAYERS, hidden_size=HIDDEN, label_type=pa.int64(),
                          metadata={**META, **meta}, rows_per_group=rows_per_group) as writer:
        for b in batches:
            writer.write(b["example_id"], b["choice"], b["label"], b["layers"])


def _only_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# --- activation tables: round trip ----------------------------------------------------------------

def test_small_batches_are_buffered_into_one_row_group(tmp_path):
    rng = np.random.default_rng(1)
    path = tmp_path / "acts.parquet"
    _write(path, [_batch(rng, [0, 1]), _batch(rng, [2]), _batch(rng, [3, 4])])
    assert pq.ParquetFile(path).num_row_groups == 1
    np.testing.assert_array_equal(ActivationTable(path).example_id, [0, 1, 2, 3, 4])


def test_activation_round_trip_two_row_groups(tmp_path):
    rng = np.random.default_rng(0)
    first = _batch(rng, [10, 3, 7])
    second = _batch(rng, [42, 1])
    path = tmp_path / "acts.parquet"
    _write(path, [first, second], rows_per_group=3)  # the first batch fills a row group

    assert _only_files(tmp_path) == ["acts.parquet"]  # no temporary left behind
    assert pq.ParquetFile(path).num_row_groups == 2

    table = ActivationTable(path)
    assert table.metadata == {**META, "num_layers": NUM_LAYERS, "hidden_size": HIDDEN}
    assert table.num_layers == NUM_LAYERS and table.hidden_size == HIDDEN
    assert table.metadata["pooling"] == "cls"
    assert table.num_rows == 5
    np.testing.assert_array_equal(table.example_id, [10, 3, 7, 42, 1])
    assert table.example_id.dtype == np.int64
    np.testing.assert_array_equal(table.choice, np.zeros(5))
    assert table.choice.dtype == np.int16
    np.testing.assert_array_equal(table.labels(), [0, 1, 1, 0, 1])
    for k in range(NUM_LAYERS + 1):
        got = table.layer(k)
        assert got.dtype == np.float32
        assert got.shape == (5, HIDDEN)
        np.testing.assert_array_equal(got, np.concatenate([first["layers"][k], second["layers"][k]]))
    layers = table.layers()
    assert len(layers) == NUM_LAYERS + 1
    np.testing.assert_array_equal(layers[2], table.layer(2))


def test_clusters_round_trip_and_default_to_the_example(tmp_path):
    """cluster_id as written (examples sharing a text); without one, each example its own; the unit's words."""
    rng = np.random.default_rng(3)
    shared, alone = tmp_path / "shared.parquet", tmp_path / "alone.parquet"
    batch = _batch(rng, [0, 1, 2, 3])
    with ActivationWriter(shared, num_layers=NUM_LAYERS, hidden_size=HIDDEN, label_type=pa.int64(),
                          metadata={**META, "shared": "premise"}) as writer:
        writer.write(batch["example_id"], batch["choice"], batch["label"], batch["layers"],
                     cluster_id=np.array([0, 0, 2, 0]))
    _write(alone, [batch])
    np.testing.assert_array_equal(ActivationTable(shared).cluster_id, [0, 0, 2, 0])
    np.testing.assert_array_equal(ActivationTable(alone).cluster_id, [0, 1, 2, 3])
    assert ActivationTable(shared).null_unit() == "examples sharing their premise"
    assert ActivationTable(alone).null_unit() == "example"
    with pytest.raises(LayersimError, match="row 1 is in cluster 0 vs 1"):
        ActivationTable(shared).check_comparable(ActivationTable(alone))


def test_a_table_without_clusters_asks_for_a_re_run(tmp_path):
    """A table written before cluster_id existed is refused in one sentence that names the stages to re-run."""
    path = tmp_path / "old.parquet"
    _write(path, [_batch(np.random.default_rng(4), [0, 1])])
    old = pq.read_table(path)
    pq.write_table(old.drop_columns(["cluster_id"]).replace_schema_metadata(old.schema.metadata), path)
    with pytest.raises(LayersimError, match="no cluster_id column.*re-run the download_task and extract stages"):
        ActivationTable(path)


def test_activation_schema_types(tmp_path):
    path = tmp_path / "acts.parquet"
    _write(path, [_batch(np.random.default_rng(1), [0, 1])])
    schema = pq.read_schema(path)
    assert schema.names == ["example_id", "cluster_id", "choice", "label", "layer_00", "layer_01", "layer_02",
                            "layer_03"]
    assert schema.field("example_id").type == pa.int64()
    assert schema.field("cluster_id").type == pa.int64()
    assert schema.field("choice").type == pa.int16()
    assert schema.field("label").type == pa.int64()
    expected = pa.list_(pa.float32(), HIDDEN)
    assert pa.types.is_fixed_size_list(schema.field("layer_00").type)
    for name in schema.names[4:]:
        assert schema.field(name).type == expected, name
    assert json.loads(schema.metadata[b"layersim"])["num_layers"] == NUM_LAYERS


def test_activation_float64_input_stored_as_float32_and_float_labels(tmp_path):
    rng = np.random.default_rng(2)
    b = _batch(rng, [5, 6, 7], dtype=np.float64)
    labels = np.array([0.5, 4.25, 3.0])
    path = tmp_path / "reg.parquet"
    with ActivationWriter(path, num_layers=NUM_LAYERS, hidden_size=HIDDEN, label_type=pa.float64(),
                          metadata=META) as writer:
        writer.write(b["example_id"], np.array([0, 1, 2], np.int16), labels, b["layers"])
    table = ActivationTable(path)
    np.testing.assert_array_equal(table.labels(), labels)
    np.testing.assert_array_equal(table.choice, [0, 1, 2])
    for k in range(NUM_LAYERS + 1):
        np.testing.assert_array_equal(table.layer(k), b["layers"][k].astype(np.float32))


def test_writer_refuses_wrong_number_of_layers(tmp_path):
    b = _batch(np.random.default_rng(3), [0])
    path = tmp_path / "acts.parquet"
    with pytest.raises(LayersimError, match="expected 4 layer arrays, got 3"):
        with ActivationWriter(path, num_layers=NUM_LAYERS, hidden_size=HIDDEN, label_type=pa.int64(),
                              metadata=META) as writer:
            writer.write(b["example_id"], b["choice"], b["label"], b["layers"][:3])
    assert _only_files(tmp_path) == []


# --- atomicity ----------------------------------------------------------------------------------

def test_writer_exception_leaves_nothing(tmp_path):
    b = _batch(np.random.default_rng(4), [0, 1])
    path = tmp_path / "acts.parquet"
    with pytest.raises(RuntimeError, match="boom"):
        with ActivationWriter(path, num_layers=NUM_LAYERS, hidden_size=HIDDEN, label_type=pa.int64(),
                              metadata=META) as writer:
            writer.write(b["example_id"], b["choice"], b["label"], b["layers"])
            raise RuntimeError("boom")
    assert not path.exists()
    assert _only_files(tmp_path) == []


def test_writer_file_has_normal_permissions(tmp_path):
    path = tmp_path / "acts.parquet"
    _write(path, [_batch(np.random.default_rng(5), [0])])
    assert _mode(path) == 0o666 & ~_umask()


def test_atomic_dir_error_leaves_nothing(tmp_path):
    target = tmp_path / "ckpt"
    with pytest.raises(ValueError, match="half-written"):
        with io.atomic_path(target, is_dir=True) as tmp:
            assert tmp.is_dir() and tmp.parent == tmp_path and tmp != target
            (tmp / "weights.bin").write_bytes(b"\0" * 10)
            raise ValueError("half-written")
    assert _only_files(tmp_path) == []


def test_atomic_dir_error_keeps_existing_folder(tmp_path):
    target = tmp_path / "ckpt"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with pytest.raises(ValueError):
        with io.atomic_path(target, is_dir=True) as tmp:
            (tmp / "new.txt").write_text("new")
            raise ValueError("fail")
    assert _only_files(tmp_path) == ["ckpt"]
    assert _only_files(target) == ["old.txt"]


def test_atomic_dir_replaces_existing_folder(tmp_path):
    target = tmp_path / "ckpt"
    target.mkdir()
    (target / "stale.txt").write_text("stale")
    (target / "sub").mkdir()
    with io.atomic_path(target, is_dir=True) as tmp:
        (tmp / "fresh.txt").write_text("fresh")
    assert _only_files(tmp_path) == ["ckpt"]
    assert _only_files(target) == ["fresh.txt"]
    assert (target / "fresh.txt").read_text() == "fresh"
    assert _mode(target) == 0o777 & ~_umask()


def test_atomic_file_creates_parent_and_normal_permissions(tmp_path):
    path = tmp_path / "a" / "b" / "x.txt"
    with io.atomic_path(path) as tmp:
        assert tmp.parent == path.parent and tmp != path
        assert not path.exists()
        tmp.write_text("hello")
    assert path.read_text() == "hello"
    assert _only_files(path.parent) == ["x.txt"]
    assert _mode(path) == 0o666 & ~_umask()


def test_atomic_file_error_keeps_previous_content(tmp_path):
    path = tmp_path / "x.txt"
    path.write_text("previous")
    with pytest.raises(KeyboardInterrupt):
        with io.atomic_path(path) as tmp:
            tmp.write_text("partial")
            raise KeyboardInterrupt
    assert path.read_text() == "previous"
    assert _only_files(tmp_path) == ["x.txt"]


def test_write_parquet_atomic_and_permissions(tmp_path):
    path = tmp_path / "t.parquet"
    io.write_parquet(io.with_metadata(pa.table({"a": [1, 2]}), {"task": "x"}), path)
    assert _only_files(tmp_path) == ["t.parquet"]
    assert _mode(path) == 0o666 & ~_umask()
    assert io.table_metadata(pq.read_schema(path)) == {"task": "x"}


# --- JSON --------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_write_json_refuses_non_finite(tmp_path, bad):
    path = tmp_path / "m.json"
    with pytest.raises(ValueError):
        io.write_json({"ok": 1.0, "nested": {"bad": bad}}, path)
    assert _only_files(tmp_path) == []


def test_write_json_stable_bytes_and_permissions(tmp_path):
    obj = {"b": [1, 2.5, None], "a": {"z": "ü", "y": True}}
    reordered = {"a": {"y": True, "z": "ü"}, "b": [1, 2.5, None]}
    io.write_json(obj, tmp_path / "1.json")
    io.write_json(obj, tmp_path / "2.json")
    io.write_json(reordered, tmp_path / "3.json")
    first = (tmp_path / "1.json").read_bytes()
    assert first == (tmp_path / "2.json").read_bytes() == (tmp_path / "3.json").read_bytes()
    assert first.endswith(b"\n")
    assert json.loads(first) == obj
    assert _only_files(tmp_path) == ["1.json", "2.json", "3.json"]
    assert _mode(tmp_path / "1.json") == 0o666 & ~_umask()


# --- refusals ----------------------------------------------------------------------------------

def test_table_missing_file(tmp_path):
    with pytest.raises(LayersimError, match="does not exist"):
        ActivationTable(tmp_path / "nope.parquet")


def test_table_not_parquet(tmp_path):
    path = tmp_path / "junk.parquet"
    path.write_bytes(b"this is not parquet")
    with pytest.raises(LayersimError, match="not a readable Parquet file"):
        ActivationTable(path)


def test_table_without_layersim_metadata(tmp_path):
    path = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"example_id": pa.array([0, 1], pa.int64())}), path)
    with pytest.raises(LayersimError, match="no layersim metadata"):
        ActivationTable(path)


def test_layer_out_of_range(tmp_path):
    path = tmp_path / "acts.parquet"
    _write(path, [_batch(np.random.default_rng(6), [0, 1])])
    table = ActivationTable(path)
    table.layer(0)
    table.layer(NUM_LAYERS)
    for k in (NUM_LAYERS + 1, -1):
        with pytest.raises(LayersimError, match=re.escape(f"layer {k} is out of range")) as info:
            table.layer(k)
        assert f"0..{NUM_LAYERS}" in str(info.value)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_value_named(tmp_path, bad):
    rng = np.random.default_rng(7)
    first, second = _batch(rng, [11, 12, 13]), _batch(rng, [21, 17, 23])
    second["layers"][2][1, 4] = bad  # example_id 17, in the second row group
    path = tmp_path / "acts.parquet"
    _write(path, [first, second])
    table = ActivationTable(path)
    np.testing.assert_array_equal(table.layer(1)[3:], second["layers"][1])  # other layers still load
    with pytest.raises(LayersimError, match=r"layer 2 holds a non-finite value at example_id 17\b"):
        table.layer(2)


def test_check_comparable(tmp_path):
    rng = np.random.default_rng(8)
    base = _batch(rng, [0, 1, 2])
    _write(tmp_path / "a.parquet", [base])
    _write(tmp_path / "b.parquet", [_batch(rng, [0, 1, 2])], run="seed0")  # another run: comparable
    shuffled = _batch(rng, [0, 2, 1])
    _write(tmp_path / "order.parquet", [shuffled])
    _write(tmp_path / "task.parquet", [_batch(rng, [0, 1, 2])], task="synth-roles")
    _write(tmp_path / "pool.parquet", [_batch(rng, [0, 1, 2])], pooling="mean")
    _write(tmp_path / "split.parquet", [_batch(rng, [0, 1, 2])], split="train")

    a = ActivationTable(tmp_path / "a.parquet")
    a.check_comparable(ActivationTable(tmp_path / "b.parquet"))
    a.check_comparable(a)
    with pytest.raises(LayersimError, match="example_id order differs"):
        a.check_comparable(ActivationTable(tmp_path / "order.parquet"))
    with pytest.raises(LayersimError, match=r"task differs \('synth-negation' vs 'synth-roles'\)"):
        a.check_comparable(ActivationTable(tmp_path / "task.parquet"))
    with pytest.raises(LayersimError, match=r"pooling differs \('cls' vs 'mean'\)"):
        a.check_comparable(ActivationTable(tmp_path / "pool.parquet"))
    with pytest.raises(LayersimError, match="split differs"):
        a.check_comparable(ActivationTable(tmp_path / "split.parquet"))


def test_check_comparable_different_length(tmp_path):
    rng = np.random.default_rng(9)
    _write(tmp_path / "a.parquet", [_batch(rng, [0, 1, 2])])
    _write(tmp_path / "b.parquet", [_batch(rng, [0, 1])])
    with pytest.raises(LayersimError, match="example_id order differs"):
        ActivationTable(tmp_path / "a.parquet").check_comparable(ActivationTable(tmp_path / "b.parquet"))
