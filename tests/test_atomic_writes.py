"""Atomic outputs (issue 7.5): every writer — Parquet tables, activation tables, JSON, PNG figures,
safetensors checkpoints — interrupted mid-write, by an exception or by SIGKILL, leaves no file that
looks finished: the final path is absent (or still holds the previous complete result), and anything
left over is a hidden ``.<name>.*.tmp`` that no reader opens and the next write removes."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from layersim.data import io
from layersim.errors import LayersimError
from layersim.data.io import ActivationTable, ActivationWriter

ROOT = Path(__file__).resolve().parents[1]
HIDDEN = 4
META = {"model": "tiny-bert", "model_digest": "d0", "run": "orig", "task": "synth-negation", "split": "validation",
        "pooling": "cls"}


class Interrupted(Exception):
    """Stands for a failure in the middle of a write: a full disk, a crash in a library."""


def files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def assert_only_hidden_temporaries(folder: Path, final: Path, allowed: set[str] = frozenset()) -> list[Path]:
    """Everything in `folder` but `allowed` is a hidden temporary of `final`; return those."""
    leftovers = [p for p in folder.iterdir() if p.name not in allowed]
    for p in leftovers:
        assert p.name.startswith(f".{final.name}.") and p.name.endswith(".tmp"), p.name
    return leftovers


def write_activations(path: Path, batches: int = 3, rows: int = 4, rows_per_group: int = 4, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    with ActivationWriter(path, num_layers=2, hidden_size=HIDDEN, label_type=pa.int64(), metadata=META,
                          rows_per_group=rows_per_group) as writer:
        for b in range(batches):
            ids = np.arange(b * rows, (b + 1) * rows)
            writer.write(ids, np.zeros(rows, np.int16), ids % 2,
                         [rng.standard_normal((rows, HIDDEN)).astype(np.float32) for _ in range(3)])


# --- interrupted by an exception ------------------------------------------------------------------

@pytest.mark.parametrize("previous", [False, True])
def test_write_parquet_interrupted(tmp_path, monkeypatch, previous):
    path = tmp_path / "validation.parquet"
    table = io.with_metadata(pa.table({"example_id": pa.array(range(100), pa.int64())}), {"task": "t"})
    if previous:
        io.write_parquet(table.slice(0, 7), path)
    original = pq.ParquetWriter.write_table

    def partial(self, table, *args, **kwargs):
        original(self, table.slice(0, 10), *args, **kwargs)  # some rows reach the file, then it fails
        raise Interrupted("disk full")

    monkeypatch.setattr(pq.ParquetWriter, "write_table", partial)
    with pytest.raises(Interrupted):
        io.write_parquet(table, path)
    monkeypatch.undo()
    assert files(tmp_path) == (["validation.parquet"] if previous else [])
    if previous:
        assert pq.read_table(path).num_rows == 7


@pytest.mark.parametrize("error", [Interrupted("encoder crashed"), KeyboardInterrupt()])
def test_activation_writer_interrupted_after_a_row_group(tmp_path, error):
    path = tmp_path / "orig.cls.parquet"
    write_activations(path, batches=1, seed=1)
    before = path.read_bytes()
    rng = np.random.default_rng(2)
    with pytest.raises(type(error)):
        with ActivationWriter(path, num_layers=2, hidden_size=HIDDEN, label_type=pa.int64(), metadata=META,
                              rows_per_group=2) as writer:
            for b in range(3):  # row groups of 2 are flushed to the temporary file
                writer.write(np.arange(2) + 2 * b, np.zeros(2, np.int16), np.zeros(2, np.int64),
                             [rng.standard_normal((2, HIDDEN)) for _ in range(3)])
            raise error
    assert files(tmp_path) == ["orig.cls.parquet"]
    assert path.read_bytes() == before


@pytest.mark.parametrize("previous", [False, True])
def test_write_json_interrupted(tmp_path, monkeypatch, previous):
    path = tmp_path / "metrics.json"
    if previous:
        io.write_json({"score": 0.5}, path)
    original = Path.write_text

    def partial(self, text, *args, **kwargs):
        original(self, text[: len(text) // 2], *args, **kwargs)
        raise Interrupted("disk full")

    monkeypatch.setattr(Path, "write_text", partial)
    with pytest.raises(Interrupted):
        io.write_json({"score": 0.75, "layers": list(range(50))}, path)
    monkeypatch.undo()
    assert files(tmp_path) == (["metrics.json"] if previous else [])
    if previous:
        assert json.loads(path.read_text()) == {"score": 0.5}


@pytest.mark.parametrize("previous", [False, True])
def test_write_figure_interrupted(tmp_path, monkeypatch, previous):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = tmp_path / "heatmap.png"
    fig, ax = plt.subplots()
    ax.imshow(np.eye(3))
    if previous:
        io.write_figure(fig, path)
    before = path.read_bytes() if previous else None

    def partial(target, *args, **kwargs):
        header = b"\x89PNG\r\n\x1a\n" + b"\0" * 64  # a PNG header, then nothing
        target.write(header) if hasattr(target, "write") else Path(target).write_bytes(header)
        raise Interrupted("renderer crashed")

    monkeypatch.setattr(fig, "savefig", partial)
    with pytest.raises(Interrupted):
        io.write_figure(fig, path)
    plt.close(fig)
    assert files(tmp_path) == (["heatmap.png"] if previous else [])
    if previous:
        assert path.read_bytes() == before


def _download_model_stage():
    spec = importlib.util.spec_from_file_location("download_model_stage", ROOT / "stages" / "download_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("previous", [False, True])
def test_checkpoint_interrupted_in_save_pretrained(tmp_path, monkeypatch, previous):
    """The download_model stage writes a safetensors snapshot; a failure half-way through the weights leaves
    no folder that a later stage would load (or the previous snapshot, untouched)."""
    from transformers import PreTrainedModel

    stage = _download_model_stage()
    out = tmp_path / "models" / "pretrained"
    args = argparse.Namespace(out=out, compared=False, paired=False)
    params = SimpleNamespace(model="tiny-bert", compare=SimpleNamespace(models=()))
    if previous:
        stage.main(args, params)
        before = {p.name: p.read_bytes() for p in out.iterdir()}

    def partial(self, folder, *a, **kw):
        Path(folder, "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{\"__metadata__\"")
        raise Interrupted("disk full while saving the weights")

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", partial)
    with pytest.raises(Interrupted):
        stage.main(args, params)
    assert files(out.parent) == (["pretrained"] if previous else [])
    if previous:
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_folder_kept_when_the_final_rename_fails(tmp_path, monkeypatch):
    target = tmp_path / "ckpt"
    with io.atomic_path(target, is_dir=True) as tmp:
        (tmp / "model.safetensors").write_bytes(b"old weights")
    original = os.replace

    def failing(src, dst):
        if Path(src).name.startswith(".ckpt.") and not Path(src).name.endswith("_old.tmp"):
            raise Interrupted("rename failed")
        original(src, dst)

    monkeypatch.setattr(io.atomic.os, "replace", failing)
    with pytest.raises(Interrupted):
        with io.atomic_path(target, is_dir=True) as tmp:
            (tmp / "model.safetensors").write_bytes(b"new weights")
    monkeypatch.undo()
    assert files(tmp_path) == ["ckpt"]
    assert (target / "model.safetensors").read_bytes() == b"old weights"


# --- interrupted by SIGKILL -----------------------------------------------------------------------

def _killed_child(code: str, cwd: Path) -> None:
    """Run `code` in a fresh interpreter that SIGKILLs itself where the code says KILL()."""
    prelude = "import os, signal\nKILL = lambda: os.kill(os.getpid(), signal.SIGKILL)\n"
    result = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], cwd=cwd, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == -signal.SIGKILL, result.stderr


KILLED_ACTIVATION_WRITER = """
    import numpy as np, pyarrow as pa
    from layersim.data.io import ActivationWriter
    meta = {meta!r}
    with ActivationWriter("orig.cls.parquet", num_layers=2, hidden_size=4, label_type=pa.int64(), metadata=meta,
                          rows_per_group=2) as writer:
        for b in range(5):
            ids = np.arange(2 * b, 2 * b + 2)
            writer.write(ids, np.zeros(2, np.int16), ids % 2, [np.ones((2, 4), np.float32)] * 3)
            if b == 3:
                KILL()  # four row groups are in the temporary file, its footer is not
"""


@pytest.mark.parametrize("previous", [False, True])
def test_activation_writer_killed_mid_write(tmp_path, previous):
    path = tmp_path / "orig.cls.parquet"
    if previous:
        write_activations(path, seed=3)
        before = path.read_bytes()
    _killed_child(KILLED_ACTIVATION_WRITER.format(meta=META), tmp_path)

    leftovers = assert_only_hidden_temporaries(tmp_path, path, {"orig.cls.parquet"} if previous else set())
    assert len(leftovers) == 1 and leftovers[0].stat().st_size > 0  # the killed writer's rows
    if previous:
        assert path.read_bytes() == before
        assert ActivationTable(path).num_rows == 12
    else:
        assert not path.exists()
        with pytest.raises(LayersimError, match="does not exist; run the extract stage first"):
            ActivationTable(path)
    # What a stage globs for never includes the temporary; opened by name, it is refused as truncated.
    assert [p.name for p in tmp_path.glob("*.parquet")] == (["orig.cls.parquet"] if previous else [])
    with pytest.raises(LayersimError, match="truncated or corrupt"):
        ActivationTable(leftovers[0])

    # The next write to the same path removes what the killed writer left.
    write_activations(path, seed=4)
    assert files(tmp_path) == ["orig.cls.parquet"]
    assert ActivationTable(path).num_rows == 12


KILLED_SNAPSHOT = """
    from layersim.data.io import atomic_path
    from layersim.models.registry import snapshot_model
    with atomic_path("pretrained", is_dir=True) as tmp:
        snapshot_model("tiny-bert", tmp)
        KILL()  # weights, config and tokenizer are written; the folder is not renamed into place
"""


def test_checkpoint_folder_killed_mid_write(tmp_path):
    _killed_child(KILLED_SNAPSHOT, tmp_path)
    assert not (tmp_path / "pretrained").exists()
    leftovers = assert_only_hidden_temporaries(tmp_path, tmp_path / "pretrained")
    assert len(leftovers) == 1 and (leftovers[0] / "model.safetensors").is_file()
    with io.atomic_path(tmp_path / "pretrained", is_dir=True) as tmp:
        (tmp / "model.safetensors").write_bytes(b"weights")
    assert files(tmp_path) == ["pretrained"]


# --- stale temporaries ----------------------------------------------------------------------------

def test_only_temporaries_of_dead_writers_on_this_host_are_removed(tmp_path):
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(finished.stdout)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        names = {"dead": f".x.json.{io._HOST}-{dead}-abc.tmp",
                 "dead_folder": f".x.json.{io._HOST}-{dead}-def.tmp",
                 "live": f".x.json.{io._HOST}-{sleeper.pid}-ghi.tmp",
                 "other_host": f".x.json.elsewhere-{dead}-jkl.tmp",
                 "other_file": f".x.json.bak.{io._HOST}-{dead}-mno.tmp"}
        for key, name in names.items():
            if key == "dead_folder":
                (tmp_path / name).mkdir()
                (tmp_path / name / "part").write_text("partial")
            else:
                (tmp_path / name).write_text("partial")
        io.write_json({"a": 1}, tmp_path / "x.json")
        assert files(tmp_path) == sorted(["x.json", names["live"], names["other_host"], names["other_file"]])
    finally:
        sleeper.kill()
        sleeper.wait()
