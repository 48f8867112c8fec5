"""Training-side faults of a careless or hostile run, each a clear one-line error that saves nothing, or a
correct result: a diverging loss (fine-tuning, fresh heads, INN/MLP maps), output folders that overlap,
a resume state from another version or cut short, sizes that would allocate without bound, a batch
larger than the data, and temporaries left by a killed run."""

from __future__ import annotations

import os
import runpy
import socket
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from dvc_project import repository_params, REPO, tiny_params
from layersim.training import train
from layersim.data.batching import encode_task
from layersim.compute.training_steps import NonFiniteLoss
from layersim.errors import LayersimError
from layersim.training.heads import HeadParams, train_head
from layersim.models.registry import load_tokenizer
from layersim.params import FinetuneParams
from layersim.training.resume import STATE_FILE, TrainingCheckpoint
from layersim.data.tasks import generated_table, get_task

CPU = torch.device("cpu")
TASK = "synth-negation"
pytestmark = pytest.mark.usefixtures("one_torch_thread")
SMALL = FinetuneParams(batch_size=8, learning_rate=1e-3, warmup_steps=1, max_steps=6, eval_every=0, max_length=32,
                       eval_batch_size=16, checkpoint_every=2)


def _sets(folder: Path, n_train: int = 32, n_val: int = 16):
    spec = get_task(TASK)
    tokenizer = load_tokenizer(folder)
    return (spec, encode_task(generated_table(spec, "train", n_train, seed=0), spec, tokenizer, 32),
            encode_task(generated_table(spec, "validation", n_val, seed=0), spec, tokenizer, 32))


# --- the data order: lazy, identical to the eager one ----------------------------------------------------

@pytest.mark.parametrize("n, batch, steps", [(10, 4, 7), (8, 4, 6), (5, 5, 9), (7, 3, 20), (3, 8, 5)])
def test_lazy_data_order_is_the_concatenated_epoch_permutations(n, batch, steps) -> None:
    rng = np.random.default_rng(11)
    epochs = -(-steps * batch // n)
    eager = np.concatenate([rng.permutation(n) for _ in range(epochs)])[:steps * batch].reshape(steps, batch)
    order = train.DataOrder(n, batch, 11)
    np.testing.assert_array_equal(np.stack([order[s] for s in range(steps)]), eager)


def test_a_huge_number_of_steps_allocates_nothing_up_front() -> None:
    """max_steps 10**12 used to allocate the whole order (8 TB); now an epoch at a time, old ones dropped."""
    order = train.DataOrder(num_examples=100, batch_size=32, seed=0)
    for step in range(50):
        assert sorted(order[step]) == sorted(set(order[step]))  or len(order[step]) == 32
    assert len(order._epochs) <= 2
    assert np.all(order[49] < 100)


# --- divergence ----------------------------------------------------------------------------------------

def test_a_diverging_fine_tuning_stops_with_the_step_and_saves_nothing(tiny_model_dir, tmp_path) -> None:
    folder = tiny_model_dir("tiny-bert")
    spec, train_set, val_set = _sets(folder)
    resume = TrainingCheckpoint(tmp_path / "resume", {"run": 1})
    with pytest.raises(NonFiniteLoss, match=r"fine-tuning synth-negation seed 1: the training loss became NaN "
                                                  r"or infinite at step \d; nothing was saved.*lower "
                                                  r"finetune.learning_rate \(now 1e\+10\)"):
        train.finetune(folder, spec, train_set, val_set, replace(SMALL, learning_rate=1e10), 1, device=CPU,
                       resume=resume)
    assert not (tmp_path / "resume").exists(), "a diverged run leaves no state to resume"


def test_the_finetune_stage_writes_nothing_for_a_diverging_run(tiny_model_dir, tmp_path, monkeypatch, capsys) -> None:
    params = tiny_params(repository_params(), tasks=[TASK])
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    # A diverging optimizer (params bound the learning rate, so divergence is simulated): NaN weights after
    # the second step make the third step's loss NaN.
    step, calls = torch.optim.AdamW.step, [0]

    def diverging_step(self, *args, **kwargs):
        result = step(self, *args, **kwargs)
        calls[0] += 1
        if calls[0] == 2:
            with torch.no_grad():
                for group in self.param_groups:
                    for weight in group["params"]:
                        weight.fill_(float("nan"))
        return result

    monkeypatch.setattr(torch.optim.AdamW, "step", diverging_step)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(REPO / "stages/download_task.py"), TASK, "task"])
    runpy.run_path(sys.argv[0], run_name="__main__")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    monkeypatch.setattr(sys, "argv", [str(REPO / "stages/finetune.py"), "--task", TASK, "--seed", "1", "--pretrained",
                                      str(tiny_model_dir("tiny-bert")), "--task-dir", "task", "--out", "ckpt",
                                      "--metrics", "m.json", "--live", "live", "--resume", "resume"])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(sys.argv[0], run_name="__main__")
    assert exited.value.code == 1
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("error: fine-tuning synth-negation seed 1: the training loss became NaN or infinite "
                            "at step 3; nothing was saved")
    after = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if not str(p.relative_to(tmp_path)).startswith("live"))
    assert after == before, "no checkpoint, metrics or resume state"


def test_a_diverging_fresh_head_is_an_error() -> None:
    spec = get_task(TASK)
    rng = np.random.default_rng(0)
    features, labels = rng.normal(size=(40, 8)).astype(np.float32), rng.integers(0, 2, 40)
    with pytest.raises(LayersimError, match=r"fresh head for task 'synth-negation': the loss became NaN or infinite "
                                            r"in epoch \d+; lower truncate.head_learning_rate \(now 1e\+37\)"):
        train_head(spec, features, labels, HeadParams(epochs=5, learning_rate=1e37, batch_size=8), seed=0)


@pytest.mark.parametrize("method", ["inn", "mlp"])
def test_a_diverging_neural_map_is_an_error(method: str) -> None:
    from layersim.align import make_map

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(60, 6)), rng.normal(size=(60, 6))
    with pytest.raises(LayersimError, match=r"training diverged: the loss became (nan|inf) at step \d+ of 20; lower "
                                            r"align.learning_rate"):
        make_map(method, steps=20, learning_rate=1e30, seed=0).fit(x, y)


def test_a_batch_larger_than_the_training_set_is_refused(tiny_model_dir) -> None:
    folder = tiny_model_dir("tiny-bert")
    spec, train_set, val_set = _sets(folder, n_train=20)
    with pytest.raises(LayersimError, match=r"finetune.batch_size = 64 is larger than the 20 training examples of "
                                            r"task 'synth-negation'; use at most 20"):
        train.finetune(folder, spec, train_set, val_set, replace(SMALL, batch_size=64), 1, device=CPU)


# --- output folders --------------------------------------------------------------------------------------

@pytest.mark.parametrize("out, resume", [("run", "run"), ("data/mymodel/t/seed1", "data/resume/../mymodel/t/seed1"),
                                         ("run", "run/resume"), ("run/ckpt", "run")])
def test_finetune_refuses_overlapping_out_and_resume(out, resume, tmp_path, monkeypatch, capsys) -> None:
    """`model: ../mymodel` by hand made --out and --resume one folder: clearing the resume state deleted the
    checkpoint just written. Now refused before any work, and nothing is touched."""
    params = tiny_params(repository_params(), tasks=[TASK])
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "keep.txt").write_text("precious")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(REPO / "stages/finetune.py"), "--task", TASK, "--seed", "1", "--pretrained",
                                      "p", "--task-dir", "t", "--out", out, "--metrics", "m.json", "--live", "l",
                                      "--resume", resume])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(sys.argv[0], run_name="__main__")
    assert exited.value.code == 1
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith(f"error: --out {out} and --resume {resume} are the same folder or inside one another")
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == ["params.yaml", "run", "run/keep.txt"]


def test_clearing_a_resume_state_deletes_only_its_own_files(tmp_path) -> None:
    folder = tmp_path / "shared"
    folder.mkdir()
    (folder / STATE_FILE).write_bytes(b"state")
    (folder / "model.safetensors").write_bytes(b"weights")
    TrainingCheckpoint(folder, {}).clear()
    assert sorted(p.name for p in folder.iterdir()) == ["model.safetensors"]
    (folder / "model.safetensors").unlink()
    TrainingCheckpoint(folder, {}).clear()
    assert not folder.exists(), "an emptied folder of its own is removed"


# --- resume states that cannot be resumed ------------------------------------------------------------------

def _saved_state(tiny_model_dir, tmp_path) -> tuple[Path, dict]:
    folder = tiny_model_dir("tiny-bert")
    spec, train_set, val_set = _sets(folder)
    checkpoint = TrainingCheckpoint(tmp_path / "resume", {"run": 1})
    real_clear = TrainingCheckpoint.clear
    TrainingCheckpoint.clear = lambda self: None  # keep the state a finished run would delete
    try:
        train.finetune(folder, spec, train_set, val_set, SMALL, 1, device=CPU, resume=checkpoint)
    finally:
        TrainingCheckpoint.clear = real_clear
    return checkpoint.path, torch.load(checkpoint.path, weights_only=True)


@pytest.mark.parametrize("damage, reason", [
    (lambda state: state.pop("history"), "it lacks history"),
    (lambda state: state.update(format=0), "it has format 0, this version reads format 1"),
    (lambda state: state.update(step="6"), "its step has the wrong type"),
    (lambda state: state["rng"].pop("numpy"), "its random-number state is incomplete"),
    (lambda state: state.update(extra=1), "it has unknown entries extra"),
])
def test_an_incompatible_resume_state_is_discarded_with_a_log_line(damage, reason, tiny_model_dir, tmp_path, caplog):
    path, state = _saved_state(tiny_model_dir, tmp_path)
    damage(state)
    torch.save(state, path)
    with caplog.at_level("WARNING", logger="layersim"):
        assert TrainingCheckpoint(path.parent, {"run": 1}).load(CPU) is None
    assert f"discarded resume state at {path}: {reason}; starting from step 0" in caplog.text
    assert not path.exists()


def test_a_garbage_resume_state_is_discarded_and_the_run_completes(tiny_model_dir, tmp_path, caplog) -> None:
    folder = tiny_model_dir("tiny-bert")
    spec, train_set, val_set = _sets(folder)
    (tmp_path / "resume").mkdir()
    (tmp_path / "resume" / STATE_FILE).write_bytes(b"\x00garbage" * 10)
    with caplog.at_level("WARNING", logger="layersim"):
        model, metrics = train.finetune(folder, spec, train_set, val_set, SMALL, 1, device=CPU,
                                        resume=TrainingCheckpoint(tmp_path / "resume", {"run": 1}))
    assert "ignoring unreadable training state" in caplog.text
    reference, expected = train.finetune(folder, spec, train_set, val_set, SMALL, 1, device=CPU)
    assert metrics == expected
    for (name, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items()):
        assert torch.equal(a, b), name


# --- temporaries ----------------------------------------------------------------------------------------

def test_temporaries_of_a_killed_run_are_removed_when_the_stage_starts(tmp_path, monkeypatch, capsys) -> None:
    """A killed writer leaves `.<name>.<host>-<pid>-<random>.tmp`; the next run of the stage removes it at
    start, even when the run then fails before writing anything."""
    params = tiny_params(repository_params(), tasks=[TASK])
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    dead = 2**22 + 12345  # above the default pid_max: no such process
    leftover = tmp_path / f".ckpt.{socket.gethostname()}-{dead}-abc.tmp"
    leftover.mkdir()
    (leftover / "model.safetensors").write_bytes(b"half")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(REPO / "stages/finetune.py"), "--task", TASK, "--seed", "1", "--pretrained",
                                      "missing", "--task-dir", "missing", "--out", "ckpt", "--metrics", "m.json",
                                      "--live", "live", "--resume", "resume"])
    with pytest.raises(SystemExit):
        runpy.run_path(sys.argv[0], run_name="__main__")
    assert not leftover.exists()
    assert os.listdir(tmp_path) == ["params.yaml"]
