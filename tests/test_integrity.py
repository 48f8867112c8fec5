"""Table integrity (issue 7.4): readers of task, activation and attention tables refuse corrupt,
truncated, mistyped and swapped files with one clear sentence, and name the layer and example of the
first non-finite activation."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import fork_server
import pytest

from layersim.data import io
from layersim.errors import LayersimError
from layersim.data.io import ActivationTable, ActivationWriter, AttentionTable, read_task_table
from layersim.models.registry import MODEL_INFO_FILE
from layersim.data.tasks import generated_table, get_task

from fake_tables import DIGESTS, HIDDEN, NUM_LAYERS, TASK, fake_model_folder, write_activations

ROOT = Path(__file__).resolve().parents[1]
CORRUPT = re.compile(r"is not a readable Parquet file, it is truncated or corrupt \(.+\); delete it and re-run "
                     r"the (extract|download_task) stage\.$")


def refusal(call, *args, **kwargs) -> str:
    """The LayersimError message of `call`, which must be one sentence naming a file."""
    with pytest.raises(LayersimError) as info:
        call(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message and message.endswith("."), message
    return message


def chunk_range(path: Path, column: str, row_group: int = 0) -> tuple[int, int]:
    """Byte range of a column chunk (dictionary page included) in a Parquet file."""
    meta = pq.ParquetFile(path).metadata.row_group(row_group)
    for i in range(meta.num_columns):
        chunk = meta.column(i)
        if chunk.path_in_schema.split(".")[0] == column:
            start = chunk.dictionary_page_offset or chunk.data_page_offset
            return start, start + chunk.total_compressed_size
    raise KeyError(column)


def flip_byte(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0xFF
    path.write_bytes(bytes(data))


def cut(path: Path, size: int) -> None:
    path.write_bytes(path.read_bytes()[:size])


# --- corruption -----------------------------------------------------------------------------------

@pytest.mark.parametrize("column", ["layer_01", "layer_02", "label"])
def test_flipped_byte_in_a_data_page_is_refused_when_read(tmp_path, column):
    path = tmp_path / "orig.cls.parquet"
    write_activations(path)
    _, end = chunk_range(path, column)
    flip_byte(path, end - 3)  # inside the last page's payload
    table = ActivationTable(path)  # ids are intact, so the file opens
    table.layer(0)  # and untouched columns still read
    call = table.labels if column == "label" else (lambda: table.layer(int(column[-2:])))
    message = refusal(call)
    assert CORRUPT.search(message) and str(path) in message and "CRC checksum" in message, message


def test_flipped_byte_in_example_ids_is_refused_on_open(tmp_path):
    path = tmp_path / "orig.cls.parquet"
    write_activations(path)
    _, end = chunk_range(path, "example_id")
    flip_byte(path, end - 2)
    message = refusal(ActivationTable, path)
    assert CORRUPT.search(message) and "CRC checksum" in message, message


def test_flipped_byte_in_the_layersim_metadata_is_refused(tmp_path):
    path = tmp_path / "orig.cls.parquet"
    write_activations(path)
    data = path.read_bytes()
    # The JSON sits in the footer twice (a Parquet key and inside the base64 Arrow schema); corrupt the first.
    at = data.index(b'"hidden_size": 4')
    path.write_bytes(data[:at] + b'"hidden_size"; 4' + data[at + 16:])
    message = refusal(ActivationTable, path)
    assert str(path) in message and ("corrupt" in message or "metadata" in message), message


def test_task_table_with_a_flipped_byte_is_refused(tmp_path):
    spec = get_task(TASK)
    io.write_parquet(generated_table(spec, "validation", 40, seed=0), tmp_path / "validation.parquet")
    path = tmp_path / "validation.parquet"
    _, end = chunk_range(path, "text")
    flip_byte(path, end - 3)
    message = refusal(read_task_table, tmp_path, spec, "validation")
    assert CORRUPT.search(message) and "download_task" in message and "CRC checksum" in message, message


# --- truncation -----------------------------------------------------------------------------------

@pytest.mark.parametrize("keep", ["nothing", "magic", "half", "all_but_footer", "all_but_one_byte"])
def test_truncated_activation_table_is_refused(tmp_path, keep):
    path = tmp_path / "orig.cls.parquet"
    write_activations(path)
    size = path.stat().st_size
    footer = int.from_bytes(path.read_bytes()[-8:-4], "little") + 8
    cut(path, {"nothing": 0, "magic": 4, "half": size // 2, "all_but_footer": size - footer,
               "all_but_one_byte": size - 1}[keep])
    message = refusal(ActivationTable, path)
    assert CORRUPT.search(message) and str(path) in message, message


def test_truncated_task_table_is_refused(tmp_path):
    spec = get_task(TASK)
    io.write_parquet(generated_table(spec, "train", 30, seed=0), tmp_path / "train.parquet")
    cut(tmp_path / "train.parquet", (tmp_path / "train.parquet").stat().st_size * 2 // 3)
    message = refusal(read_task_table, tmp_path, spec, "train")
    assert CORRUPT.search(message) and "download_task" in message, message


def test_rows_missing_behind_a_rebuilt_footer_are_refused(tmp_path):
    """A file that lost its last row group but got a valid footer (a bad copy or repair tool) still says
    how many rows it was written with."""
    path = tmp_path / "orig.cls.parquet"
    write_activations(path, ids=range(6), rows_per_group=3)
    whole = pq.ParquetFile(path)
    assert whole.num_row_groups == 2
    first = whole.read_row_group(0)
    footer = whole.metadata.metadata
    with pq.ParquetWriter(tmp_path / "cut.parquet", first.schema, write_page_checksum=True) as writer:
        writer.write_table(first)
        writer.add_key_value_metadata({io.INTEGRITY_KEY: footer[io.INTEGRITY_KEY]})
    shutil.move(tmp_path / "cut.parquet", path)
    message = refusal(ActivationTable, path)
    assert message == (f"activation table {path} holds 3 rows but was written with 6; it is truncated or corrupt, "
                       "so re-run the extract stage.")


def test_row_count_is_recorded_in_the_footer(tmp_path):
    write_activations(tmp_path / "a.parquet", ids=range(7))
    io.write_parquet(generated_table(get_task(TASK), "validation", 11, seed=0), tmp_path / "validation.parquet")
    for name, rows in (("a.parquet", 7), ("validation.parquet", 11)):
        footer = pq.ParquetFile(tmp_path / name).metadata.metadata
        assert json.loads(footer[io.INTEGRITY_KEY]) == {"num_rows": rows}
    # ... without changing the layersim metadata readers see.
    assert io.INTEGRITY_KEY not in pq.read_schema(tmp_path / "a.parquet").metadata


def test_tables_without_a_row_count_are_still_read(tmp_path):
    """Tables written before row counts were recorded stay readable (DVC keeps them until a rerun)."""
    path = tmp_path / "old.parquet"
    written = write_activations(tmp_path / "new.parquet")
    pq.write_table(pq.read_table(tmp_path / "new.parquet"), path)
    assert io.INTEGRITY_KEY not in (pq.ParquetFile(path).metadata.metadata or {})
    np.testing.assert_array_equal(ActivationTable(path).layer(1), written["layers"][1])


# --- schema and metadata --------------------------------------------------------------------------

def _rewrite(path: Path, table: pa.Table, **metadata) -> None:
    meta = json.loads(table.schema.metadata[io.METADATA_KEY])
    io.write_parquet(io.with_metadata(table, {**meta, **metadata}), path)


def test_hidden_size_disagreeing_with_the_columns_is_refused(tmp_path):
    path = tmp_path / "orig.cls.parquet"
    write_activations(path)
    _rewrite(path, pq.read_table(path), hidden_size=HIDDEN + 1)
    message = refusal(ActivationTable, path)
    assert message == (f"activation table {path} column layer_00 has type fixed_size_list<float>[4], expected "
                       f"fixed_size_list<float>[5] for num_layers 2 and hidden_size 5 in its metadata; "
                       "re-run the extract stage.")


def test_num_layers_disagreeing_with_the_columns_is_refused(tmp_path):
    path = tmp_path / "orig.cls.parquet"
    write_activations(path)
    _rewrite(path, pq.read_table(path), num_layers=NUM_LAYERS + 1)
    message = refusal(ActivationTable, path)
    assert "has columns ['example_id', 'cluster_id', 'choice', 'label', 'layer_00', 'layer_01', 'layer_02']" in message
    assert "'layer_03']" in message and "num_layers 3" in message, message


@pytest.mark.parametrize("change", ["float64_layer", "int32_ids", "string_label", "num_layers_text"])
def test_wrong_types_are_refused(tmp_path, change):
    path = tmp_path / "orig.cls.parquet"
    write_activations(path)
    table = pq.read_table(path)
    if change == "float64_layer":
        column = table.column("layer_01").cast(pa.list_(pa.float64(), HIDDEN))
        table = table.set_column(5, "layer_01", column)
        expected = "column layer_01 has type fixed_size_list<double>[4], expected fixed_size_list<float>[4]"
    elif change == "int32_ids":
        table = table.set_column(0, "example_id", table.column("example_id").cast(pa.int32()))
        expected = "column example_id has type int32, expected int64"
    elif change == "string_label":
        table = table.set_column(3, "label", table.column("label").cast(pa.string()))
        expected = "column label has type string, expected int64"
    else:
        _rewrite(path, table, num_layers="2")
        expected = "has num_layers '2' in its metadata, expected an integer >= 0"
    if change != "num_layers_text":
        _rewrite(path, table)
    message = refusal(ActivationTable, path)
    assert expected in message and str(path) in message, message


def test_task_table_types_and_values_are_checked(tmp_path):
    spec = get_task("synth-similarity")  # regression: float64 labels
    table = generated_table(spec, "validation", 12, seed=0)
    path = tmp_path / "validation.parquet"

    io.write_parquet(table.set_column(4, "label", pa.array(np.arange(12))), path)
    assert "column label has type int64, expected double for task 'synth-similarity'" in refusal(
        read_task_table, tmp_path, spec, "validation")

    ids = table.column("example_id").to_numpy().copy()
    ids[5] = ids[2]
    io.write_parquet(table.set_column(0, "example_id", pa.array(ids)), path)
    assert refusal(read_task_table, tmp_path, spec, "validation") == (
        f"task table {path} holds example_id 2 more than once, expected unique ids; re-run the download_task stage.")

    labels = table.column("label").to_numpy().copy()
    labels[7] = np.nan
    io.write_parquet(table.set_column(4, "label", pa.array(labels)), path)
    assert refusal(read_task_table, tmp_path, spec, "validation") == (
        f"task table {path} holds a non-finite label at example_id 7, expected a number; re-run the download_task "
        "stage.")

    texts = table.column("text_a").to_pylist()
    texts[4] = None
    io.write_parquet(table.set_column(2, "text_a", pa.array(texts, pa.string())), path)
    assert refusal(read_task_table, tmp_path, spec, "validation") == (
        f"task table {path} column text_a has 1 missing values, expected none; re-run the download_task stage.")


# --- expectations: swapped and stale tables -------------------------------------------------------

@pytest.fixture
def extracted(tmp_path) -> Path:
    """A folder as the extract stage writes it: orig, seed1 and seed2, validation and train, CLS and mean,
    plus the info files of the fine-tuned checkpoints they came from."""
    folder = tmp_path / "activations"
    for run in DIGESTS:
        for pooling in ("cls", "mean"):
            write_activations(folder / f"{run}.{pooling}.parquet", run=run, pooling=pooling)
            write_activations(folder / "train" / f"{run}.{pooling}.parquet", ids=range(8), run=run, pooling=pooling,
                              split="train")
        if run != "orig":
            fake_model_folder(io.finetuned(tmp_path / "checkpoints", int(run.removeprefix("seed"))), run.encode(), source="finetune", task=TASK,
                              base_digest=DIGESTS["orig"])
    return folder


def expect(run: str, split: str = "validation", pooling: str = "cls", **more) -> dict:
    return {"task": TASK, "split": split, "run": run, "pooling": pooling, **more}


def test_expected_tables_open(extracted):
    known = io.run_expectations(extracted.parent / "checkpoints", [1, 2])
    assert {run: values["model_digest"] for run, values in known.items()} == DIGESTS
    for run in DIGESTS:
        ActivationTable(extracted / f"{run}.cls.parquet", expect=expect(run, **known[run]))
        ActivationTable(extracted / "train" / f"{run}.mean.parquet", expect=expect(run, "train", "mean"))


def test_seed1_renamed_as_seed2_is_refused(extracted):
    path = extracted / "seed2.cls.parquet"
    shutil.copy(extracted / "seed1.cls.parquet", path)
    message = refusal(ActivationTable, path, expect=expect("seed2", model_digest=DIGESTS["seed2"]))
    assert message == (f"activation table {path} has run 'seed1', expected 'seed2'; it was swapped with another "
                       "table or is stale, so re-run the extract stage.")


def test_pretrained_table_in_place_of_a_fine_tuned_one_is_refused(extracted):
    path = extracted / "seed1.cls.parquet"
    shutil.copy(extracted / "orig.cls.parquet", path)
    assert "has run 'orig', expected 'seed1'" in refusal(ActivationTable, path, expect=expect("seed1"))


def test_table_of_stale_weights_is_refused(extracted, tmp_path):
    """Right name and run, but extracted from weights other than the checkpoint's (fine-tuned again since)."""
    path = extracted / "seed1.cls.parquet"
    write_activations(path, run="seed1", digest="ee" * 32)
    known = io.run_expectations(tmp_path / "checkpoints", [1, 2])
    message = refusal(ActivationTable, path, expect=expect("seed1", model_digest=known["seed1"]["model_digest"]))
    assert message == (f"activation table {path} has model_digest '{'ee' * 32}', expected '{DIGESTS['seed1']}'; it "
                       "was swapped with another table or is stale, so re-run the extract stage.")


def test_table_of_another_task_split_or_pooling_is_refused(extracted, tmp_path):
    other = tmp_path / "other.parquet"
    write_activations(other, run="seed1", task="synth-roles")
    assert "has task 'synth-roles', expected 'synth-negation'" in refusal(ActivationTable, other,
                                                                        expect=expect("seed1"))
    train = extracted / "train" / "seed1.cls.parquet"
    assert "has split 'train', expected 'validation'" in refusal(ActivationTable, train, expect=expect("seed1"))
    mean = extracted / "seed1.mean.parquet"
    table = ActivationTable(mean)
    assert "has pooling 'mean', expected 'cls'" in refusal(table.check, pooling="cls")


def test_checkpoints_of_different_base_weights_are_refused(extracted, tmp_path):
    info_path = io.finetuned(tmp_path / "checkpoints", 2) / MODEL_INFO_FILE
    info = json.loads(info_path.read_text())
    info_path.write_text(json.dumps({**info, "base_digest": "ff" * 32}))
    message = refusal(io.run_expectations, tmp_path / "checkpoints", [1, 2])
    assert "were fine-tuned from different pretrained weights" in message and "re-run the finetune stage" in message


def test_attention_table_checks(tmp_path):
    heads, layers = 2, 2
    index = {"example_id": pa.array([4, 4, 4, 4, 9], pa.int64()), "choice": pa.array([0] * 5, pa.int16()),
             "query": pa.array([0, 0, 1, 1, 0], pa.int16()), "key": pa.array([0, 1, 0, 1, 0], pa.int16())}
    weights = np.full((5, heads), 0.5, np.float32)
    weights[4] = 1.0

    def write(path, layer_weights, **meta):
        columns = dict(index) | {io.layer_column(k): pa.FixedSizeListArray.from_arrays(
            pa.array(layer_weights.reshape(-1)), heads) for k in range(1, layers + 1)}
        metadata = {"run": "seed1", "task": TASK, "split": "validation", "num_layers": layers, "num_heads": heads,
                    "kind": "attention", **meta}
        io.write_parquet(io.with_metadata(pa.table(columns), metadata), path)

    path = tmp_path / "seed1.parquet"
    write(path, weights)
    table = AttentionTable(path, expect={"run": "seed1", "task": TASK, "split": "validation"})
    np.testing.assert_array_equal(table.layer(2), weights)
    assert "has run 'seed1', expected 'seed2'" in refusal(AttentionTable, path, expect={"run": "seed2"})

    write(path, weights, num_heads=3)
    assert "column layer_01 has type fixed_size_list<float>[2], expected fixed_size_list<float>[3]" in (
        refusal(AttentionTable, path))

    bad = weights.copy()
    bad[3, 1] = np.inf
    write(path, bad)
    assert refusal(AttentionTable(path).layer, 1) == (
        f"{path} attention layer 1 holds a non-finite weight at example_id 4 (choice 0, query token 1, row 3); the "
        "encoder overflowed, so fix that and re-run the extract stage.")

    cut(path, path.stat().st_size - 10)
    assert CORRUPT.search(refusal(AttentionTable, path))


# --- example order --------------------------------------------------------------------------------

def test_example_order_against_the_task_table(tmp_path):
    path = tmp_path / "orig.cls.parquet"
    write_activations(path, ids=(3, 1, 4, 5, 9))
    table = ActivationTable(path)
    table.check_examples(np.array([3, 1, 4, 5, 9]), 1, "validation.parquet")
    assert refusal(table.check_examples, np.array([3, 1, 5, 4, 9]), 1, "validation.parquet") == (
        f"activation table {path} row 2 holds example_id 4 choice 0, expected example_id 5 choice 0 of "
        "validation.parquet; its example order differs, so re-run the extract stage.")
    assert refusal(table.check_examples, np.array([3, 1, 4, 5]), 1, "validation.parquet") == (
        f"activation table {path} holds 5 rows, expected 4 (4 examples × 1 choices of validation.parquet); "
        "re-run the extract stage.")
    # A multiple-choice table holds one row per (example, choice).
    assert "expected 10 (5 examples × 2 choices" in refusal(table.check_examples, np.array([3, 1, 4, 5, 9]), 2)


def test_example_order_between_runs(tmp_path):
    write_activations(tmp_path / "orig.parquet", ids=(3, 1, 4, 5, 9))
    write_activations(tmp_path / "seed1.parquet", ids=(3, 1, 4, 9, 5), run="seed1")
    orig, seed1 = ActivationTable(tmp_path / "orig.parquet"), ActivationTable(tmp_path / "seed1.parquet")
    assert refusal(orig.check_comparable, seed1) == (
        f"cannot compare {tmp_path / 'orig.parquet'} and {tmp_path / 'seed1.parquet'}: their example_id order "
        "differs (row 3 holds example_id 5 vs 9); re-run the extract stage.")


# --- non-finite activations -----------------------------------------------------------------------

def test_first_non_finite_layer_and_example_are_named(tmp_path):
    path = tmp_path / "orig.cls.parquet"
    write_activations(path, ids=(3, 1, 4, 5, 9), nan_at=(1, 3))
    table = ActivationTable(path)
    table.layer(0)
    assert refusal(table.layers) == (
        f"{path} layer 1 holds a non-finite value at example_id 5 (row 3, choice 0, value nan); the encoder "
        "overflowed or fine-tuning diverged, so fix that and re-run the extract stage.")


def test_infinite_value_in_the_first_row_is_named(tmp_path):
    path = tmp_path / "orig.cls.parquet"
    written = write_activations(path, ids=(3, 1, 4))
    written["layers"][2][0, 0] = -np.inf
    written["layers"][2][2, 3] = np.nan
    with ActivationWriter(path, num_layers=NUM_LAYERS, hidden_size=HIDDEN, label_type=pa.int64(),
                          metadata={"run": "orig"}) as writer:
        writer.write(written["example_id"], np.zeros(3, np.int16), written["labels"], written["layers"])
    assert "layer 2 holds a non-finite value at example_id 3 (row 0, choice 0, value -inf)" in refusal(
        ActivationTable(path).layer, 2)


def test_non_finite_label_is_named(tmp_path):
    path = tmp_path / "orig.cls.parquet"
    written = write_activations(path, ids=(3, 1, 4), label_type=pa.float64())
    written["labels"][1] = np.nan
    with ActivationWriter(path, num_layers=NUM_LAYERS, hidden_size=HIDDEN, label_type=pa.float64(),
                          metadata={"run": "orig"}) as writer:
        writer.write(written["example_id"], np.zeros(3, np.int16), written["labels"], written["layers"])
    assert refusal(ActivationTable(path).labels) == (
        f"activation table {path} holds a non-finite label (nan) at example_id 1; re-run the download_task and "
        "extract stages.")


def test_writer_refuses_layers_of_the_wrong_shape(tmp_path):
    path = tmp_path / "a.parquet"
    with pytest.raises(LayersimError, match=re.escape("layer 1 has shape (2, 3), expected (2, 4) for 2 rows of "
                                                      "hidden size 4.")):
        with ActivationWriter(path, num_layers=NUM_LAYERS, hidden_size=HIDDEN, label_type=pa.int64(),
                              metadata={}) as writer:
            writer.write(np.arange(2), np.zeros(2, np.int16), np.zeros(2, np.int64),
                         [np.zeros((2, 4)), np.zeros((2, 3)), np.zeros((2, 4))])
    assert not path.exists()


# --- a stage refuses a swapped table --------------------------------------------------------------

def test_similarity_stage_refuses_a_swapped_seed(extracted, tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text(f"model: tiny-bert\ntasks: [{TASK}]\nseeds: [1, 2]\n"
                      "finetune: {max_length: 64}\n"
                      "similarity: {measures: {cls: [linear_cka]}, attention_measures: []}\n")
    shutil.copy(extracted / "seed1.cls.parquet", extracted / "seed2.cls.parquet")
    out = tmp_path / "out"
    result = subprocess.run(
        [fork_server.python(), str(ROOT / "stages" / "similarity.py"), "--params", str(params), "--task", TASK,
         "--activations", str(extracted), "--checkpoints", str(tmp_path / "checkpoints"),
         "--metrics", str(out / "m.json"), "--details", str(out / "d.json"), "--plots", str(out / "plots"),
         "--localization", str(out / "localization"), "--diagonals", str(out / "diagonals")], capture_output=True,
        text=True, cwd=tmp_path, timeout=300, env=fork_server.environment(dict(os.environ)))
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: activation table {extracted / 'seed2.cls.parquet'} has run 'seed1', expected 'seed2'; it was "
        "swapped with another table or is stale, so re-run the extract stage.")
    assert not out.exists() or not any(p for p in out.rglob("*") if p.is_file())
