"""What stages read, checked: model folders against the digest of their weights, config and tokenizer,
the tokenizer against the model, checkpoints against the task tables they were fine-tuned on,
activation tables against the checkpoints' shape; corrupted files and a full disk are one line naming
the file, never a traceback or a silently wrong result."""

from __future__ import annotations

import errno
import json
import runpy
import shutil
import sys
from pathlib import Path

import matplotlib
import pyarrow.parquet as pq
import pytest
import yaml

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from dvc_project import repository_params, REPO, tiny_params  # noqa: E402
from layersim.data import io  # noqa: E402
from layersim.errors import LayersimError  # noqa: E402
from layersim.models.registry import (MODEL_INFO_FILE, load_encoder, load_tokenizer, model_info,  # noqa: E402
                             verified_info, weights_digest)
from layersim.data.tasks import generated_table, get_task  # noqa: E402

TASK = "synth-negation"


@pytest.fixture
def model_copy(tiny_model_dir, tmp_path) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir("tiny-bert"), folder)
    return folder


def _rewrite_digest(folder: Path) -> None:
    """As if the stage that wrote the folder had written it so: the recorded digest matches the files."""
    info = model_info(folder)
    (folder / MODEL_INFO_FILE).write_text(json.dumps({**info, "digest": weights_digest(folder)}))


def test_a_flipped_weight_bit_is_refused(model_copy) -> None:
    weights = model_copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-100] ^= 0x01
    weights.write_bytes(bytes(data))
    with pytest.raises(LayersimError, match=rf"model folder {model_copy}: its files changed since they were written "
                                            r"\(digest \w{12}, recorded \w{12}\); re-run the stage that wrote it"):
        load_encoder(model_copy)


def test_a_removed_tokenizer_file_is_refused_by_the_digest(model_copy) -> None:
    (model_copy / "tokenizer.json").unlink()
    with pytest.raises(LayersimError, match=r"its files changed since they were written"):
        load_tokenizer(model_copy)


def test_a_tokenizer_that_does_not_fit_the_model_is_refused(model_copy) -> None:
    """Written without its tokenizer files, a folder loads a handful of special tokens: every word [UNK]."""
    for name in ("tokenizer.json", "vocab.txt"):
        (model_copy / name).unlink(missing_ok=True)
    _rewrite_digest(model_copy)
    with pytest.raises(LayersimError, match=rf"the tokenizer of {model_copy} (has \d+ tokens but the model's embedding "
                                            r"has \d+: it is not this model's tokenizer|cannot be loaded)"):
        load_tokenizer(model_copy)


def test_a_truncated_weights_file_is_one_line(model_copy) -> None:
    weights = model_copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    _rewrite_digest(model_copy)
    with pytest.raises(LayersimError, match=rf"the weights in {model_copy} cannot be loaded \(.+\); re-run the stage"):
        load_encoder(model_copy)


@pytest.mark.parametrize("content, detail", [("{not json", "cannot be read"), ("[1, 2]", "holds a list, not a JSON object"),
                                             ("", "cannot be read")])
def test_a_garbage_info_file_is_one_line(model_copy, content: str, detail: str) -> None:
    (model_copy / MODEL_INFO_FILE).write_text(content)
    with pytest.raises(LayersimError, match=rf"model info file {model_copy / MODEL_INFO_FILE} {detail}"):
        verified_info(model_copy)


def test_a_garbage_config_is_one_line(model_copy) -> None:
    (model_copy / "config.json").write_bytes(b"\xff\xfe garbage")
    _rewrite_digest(model_copy)
    with pytest.raises(LayersimError, match=rf"model config {model_copy / 'config.json'} cannot be read"):
        load_encoder(model_copy)


def test_a_missing_model_folder_is_one_line_not_a_hub_lookup(tmp_path) -> None:
    with pytest.raises(LayersimError, match=r"is not a layersim model folder .*run the download or finetune stage"):
        load_tokenizer(tmp_path / "missing")


def _task_folder(folder: Path) -> Path:
    spec = get_task(TASK)
    for split in ("train", "validation"):
        pq.write_table(generated_table(spec, split, 20, seed=0), folder / f"{split}.parquet")
    return folder


def _checkpoints(tmp_path: Path, tiny_model_dir, task_digest: str) -> Path:
    for seed in (1, 2):
        folder = io.finetuned(tmp_path / "checkpoints", seed)
        shutil.copytree(tiny_model_dir("tiny-bert"), folder)
        info = model_info(folder)
        (folder / MODEL_INFO_FILE).write_text(json.dumps({**info, "source": "finetune", "task": TASK,
                                                          "base_digest": "b" * 64, "task_digest": task_digest}))
    return tmp_path / "checkpoints"


def test_a_task_table_edited_after_fine_tuning_is_refused(tmp_path, tiny_model_dir) -> None:
    tasks = tmp_path / "task"
    tasks.mkdir()
    _task_folder(tasks)
    checkpoints = _checkpoints(tmp_path, tiny_model_dir, io.task_tables_digest(tasks))
    assert io.run_expectations(checkpoints, [1, 2], tasks)["seed1"]["task_digest"] == io.task_tables_digest(tasks)
    table = pq.read_table(tasks / "validation.parquet")
    pq.write_table(table.slice(0, 19), tasks / "validation.parquet")  # one label fewer, edited by hand
    with pytest.raises(LayersimError, match=rf"checkpoint {io.finetuned(checkpoints, 1)} was fine-tuned on other task tables "
                                            rf"than {tasks} holds now .*; re-run the finetune stage"):
        io.run_expectations(checkpoints, [1, 2], tasks)


def test_an_activation_table_of_another_width_is_refused(tmp_path, tiny_model_dir) -> None:
    """Matching run, task and digest metadata, but written at another hidden size than the checkpoint's."""
    from fake_tables import write_activations

    checkpoints = _checkpoints(tmp_path, tiny_model_dir, "t" * 64)
    known = io.run_expectations(checkpoints, [1, 2])
    path = tmp_path / "seed1.cls.parquet"
    write_activations(path, run="seed1", digest=known["seed1"]["model_digest"])  # 2 layers of width 4
    with pytest.raises(LayersimError, match=r"has (num_layers 2, expected 3|hidden_size 4, expected 32)"):
        io.ActivationTable(path, expect={"run": "seed1", **{k: v for k, v in known["seed1"].items() if k != "task_digest"}})


def _disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_while_writing_json_is_one_line_and_leaves_nothing(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(Path, "write_text", _disk_full)
    with pytest.raises(LayersimError, match=rf"no space left on the device while writing {tmp_path / 'm.json'}; free "
                                            r"some space and run the stage again"):
        io.write_json({"a": 1}, tmp_path / "m.json")
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_while_writing_a_figure_is_one_line_and_leaves_nothing(tmp_path, monkeypatch) -> None:
    fig = plt.figure()
    monkeypatch.setattr(Path, "write_bytes", _disk_full)
    with pytest.raises(LayersimError, match=rf"no space left on the device while writing {tmp_path / 'f.png'}"):
        io.write_figure(fig, tmp_path / "f.png")
    plt.close(fig)
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_in_a_stage_is_one_error_line(tmp_path, monkeypatch, capsys) -> None:
    params = tiny_params(repository_params(), tasks=[TASK])
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(Path, "write_text", _disk_full)
    monkeypatch.setattr(sys, "argv", [str(REPO / "stages/check_params.py"), "data/params.checked"])
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(sys.argv[0], run_name="__main__")
    assert exited.value.code == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith("error: no space left on the device while writing data/params.checked")
    assert "Traceback" not in "\n".join(lines)
    assert list((tmp_path / "data").iterdir()) == []


# safetensors' save_file reports a full disk as its own error type, the OS error number only in the text
# (the words are those of a real save onto a full tmpfs).
SAFETENSORS_DISK_FULL = "Error while serializing: I/O error: No space left on device (os error 28)"


def _safetensors_error(message: str):
    from safetensors import SafetensorError

    def save_file(*args, **kwargs):
        raise SafetensorError(message)
    return save_file


def test_a_full_disk_in_safetensors_is_one_line_and_leaves_nothing(tmp_path) -> None:
    with pytest.raises(LayersimError, match=rf"^no space left on the device while writing {tmp_path / 'ckpt'}; free "
                                            r"some space and run the stage again"):
        with io.atomic_path(tmp_path / "ckpt", is_dir=True) as tmp:
            (tmp / "config.json").write_text("{}")
            _safetensors_error(SAFETENSORS_DISK_FULL)()
    assert list(tmp_path.iterdir()) == []


def test_another_safetensors_error_is_not_called_a_full_disk(tmp_path) -> None:
    from safetensors import SafetensorError

    with pytest.raises(SafetensorError, match=r"Permission denied \(os error 13\)"):
        with io.atomic_path(tmp_path / "ckpt", is_dir=True):
            _safetensors_error("Error while serializing: I/O error: Permission denied (os error 13)")()
    assert list(tmp_path.iterdir()) == []


# torch.save's zip writer on a full disk: a RuntimeError without the OS error (the words of a real one, issue 49).
TORCH_SAVE_FAILED = "[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"


@pytest.mark.parametrize("free, full", [(4096, True), (10 << 30, False)])
def test_a_torch_save_that_fails_on_a_nearly_full_volume_is_called_a_full_disk(tmp_path, monkeypatch, free, full):
    """The resume state (torch.save) on a full disk: a RuntimeError is the full-disk sentence only when the volume
    has (almost) no space left, else it passes through as it is."""
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda folder: usage(free + 1, 1, free))
    with pytest.raises(LayersimError if full else RuntimeError) as raised:
        with io.atomic_path(tmp_path / "state.pt"):
            raise RuntimeError(TORCH_SAVE_FAILED)
    assert str(raised.value).startswith("no space left on the device") == full
    assert list(tmp_path.iterdir()) == []


def test_the_finetune_stage_on_a_full_disk_is_one_line_and_leaves_no_checkpoint(tiny_model_dir, tmp_path,
                                                                                 monkeypatch, capsys) -> None:
    import transformers.modeling_utils

    pretrained = tiny_model_dir("tiny-bert")  # snapshotted before saving fails
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(tiny_params(repository_params(), tasks=[TASK])))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(REPO / "stages/download_task.py"), TASK, "task"])
    runpy.run_path(sys.argv[0], run_name="__main__")
    # transformers' save_pretrained writes config.json first, then the weights through this name
    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", _safetensors_error(SAFETENSORS_DISK_FULL))
    monkeypatch.setattr(sys, "argv", [str(REPO / "stages/finetune.py"), "--task", TASK, "--seed", "1", "--pretrained",
                                      str(pretrained), "--task-dir", "task", "--out", "ckpt", "--metrics", "m.json",
                                      "--live", "live"])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(sys.argv[0], run_name="__main__")
    assert exited.value.code == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1] == ("error: no space left on the device while writing ckpt; free some space and run the stage "
                         "again (the partial file was removed, earlier outputs are intact).")
    assert "Traceback" not in "\n".join(lines)
    left = sorted(path.name for path in tmp_path.iterdir())
    assert left == ["live", "params.yaml", "task"], "no checkpoint, no metrics, no temporary"


def test_a_full_disk_under_dvc_says_what_dvc_removed(tmp_path, monkeypatch, capsys) -> None:
    """DVC removes a stage's outputs before its command runs (dvc.stage.Stage.run → remove_outs): under DVC the
    sentence must not call them intact, and names the command that brings back the ones dvc.lock records."""
    params = tiny_params(repository_params(), tasks=[TASK])
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DVC_STAGE", "check_params")
    monkeypatch.setattr(Path, "write_text", _disk_full)
    monkeypatch.setattr(sys, "argv", [str(REPO / "stages/check_params.py"), "data/params.checked"])
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(sys.argv[0], run_name="__main__")
    assert exited.value.code == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: no space left on the device while writing data/params.checked; free some space and run the stage "
        "again (the partial file was removed, and DVC had removed this stage's earlier outputs before it ran: `dvc "
        "checkout check_params` restores the ones dvc.lock records from the cache).")


@pytest.mark.parametrize("stage, after", [
    (None, "which running it again rewrites"),
    ("finetune@synth-negation-1", "and DVC had removed this stage's earlier outputs before it ran: `dvc checkout "
                                  "finetune@synth-negation-1` restores"),
])
def test_a_full_disk_outside_an_atomic_write_claims_no_partial_file_removed(stage, after, tmp_path, monkeypatch,
                                                                           capsys) -> None:
    """An OSError that did not pass through layersim.data.io (a library writing its own file): nothing removed it."""
    import argparse
    import errno

    from layersim.cli import run_stage

    (tmp_path / "params.yaml").write_text(yaml.safe_dump(tiny_params(repository_params(), tasks=[TASK])))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DVC_STAGE", raising=False)
    if stage:
        monkeypatch.setenv("DVC_STAGE", stage)

    def main(args, params):
        raise OSError(errno.ENOSPC, "No space left on device", "dvclive/plots/metrics/train/loss.tsv")

    with pytest.raises(SystemExit):
        run_stage(main, argparse.Namespace(params=Path("params.yaml")), quiet_transformers=False)
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("error: no space left on the device while writing dvclive/plots/metrics/train/loss.tsv; "
                           "free some space and run the stage again (a file it was writing may be cut short, ")
    assert after in line and "intact" not in line and "was removed" not in line
