"""Resumable fine-tuning and determinism of the finetune stage (issue: fault tolerance).

The real stage script runs in a subprocess on tiny-bert. A driver kills it with SIGKILL at a chosen
point — after optimizer step k (between the optimizer and scheduler updates of that step), or inside
the write of a training state, after the bytes are on disk but before the rename — and the stage is
then run again, as `dvc repro` would. The resumed run must end with the same safetensors bytes, the
same metrics file bytes and the same logged curves as a run that was never interrupted.
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
import yaml

from layersim.models.registry import weights_digest
from layersim.training.resume import STATE_FILE, TrainingCheckpoint, TrainingState
import fork_server
from dvc_project import repository_params, REPO, output

MAX_STEPS, CHECKPOINT_EVERY, KEEP_STATES = 24, 5, 3  # states kept at steps 6, 12 and 18

# Runs a stage script as __main__ after arranging a SIGKILL: KILL_AT_STEP=k dies right after the k-th
# optimizer step; KILL_IN_SAVE=k dies inside the k-th torch.save, once its bytes are written.
DRIVER = """
import os, runpy, signal, sys
import torch

def die():
    os.kill(os.getpid(), signal.SIGKILL)

def kill_after(owner, name, count):
    original, calls = getattr(owner, name), [0]
    def wrapper(*args, **kwargs):
        result = original(*args, **kwargs)
        calls[0] += 1
        if calls[0] == count:
            die()
        return result
    setattr(owner, name, wrapper)

if os.environ.get("KILL_AT_STEP"):
    kill_after(torch.optim.AdamW, "step", int(os.environ["KILL_AT_STEP"]))
if os.environ.get("KILL_IN_SAVE"):
    kill_after(torch, "save", int(os.environ["KILL_IN_SAVE"]))
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory, tiny_model_dir) -> Path:
    """A folder with params.yaml (tiny-bert, synth-negation, 24 steps, a state every 5), the task
    tables and the pretrained snapshot, as the download stages leave them."""
    root = tmp_path_factory.mktemp("resume")
    params = repository_params()
    params.update(model="tiny-bert", tasks=["synth-negation"], seeds=[1, 2])
    params["download"].update(generated_train_examples=96, generated_validation_examples=32)
    params["finetune"].update(batch_size=4, learning_rate=1e-3, warmup_steps=3, max_steps=MAX_STEPS, eval_every=6,
                              max_length=32, checkpoint_every=CHECKPOINT_EVERY, keep_states=KEEP_STATES)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (root / "driver.py").write_text(DRIVER)
    _run(root, [REPO / "stages/download_task.py", "synth-negation", root / "task"])
    os.symlink(tiny_model_dir("tiny-bert"), root / "pretrained")
    return root


def _run(root: Path, argv: list, **kill) -> subprocess.CompletedProcess:
    """The driver in a fork of the test process's server (tests/fork_server.py: a SIGKILL reads as one)."""
    env = fork_server.environment({**os.environ, "PYTHONPATH": str(REPO / "src"),
                                   **{k: str(v) for k, v in kill.items()}})
    return subprocess.run([fork_server.python(), root / "driver.py", *map(str, argv)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)


def finetune(root: Path, name: str, seed: int = 1, **kill) -> subprocess.CompletedProcess:
    """Run the finetune stage writing under root/<name>/; `kill` as the driver's environment."""
    run = root / name
    argv = [REPO / "stages/finetune.py", "--task", "synth-negation", "--seed", seed, "--pretrained",
            root / "pretrained", "--task-dir", root / "task", "--out", run / "checkpoint", "--states", run / "states",
            "--metrics",
            run / "metrics.json", "--live", run / "live", "--resume", run / "resume"]
    return _run(root, argv, **kill)


def finished(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, output(result)


def killed(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == -signal.SIGKILL, output(result)


def curves(run: Path) -> dict[str, list[tuple[str, str]]]:
    """Every dvclive curve as (step, value) rows; wall-clock timestamps differ between runs, so are left out."""
    folder = run / "live" / "plots" / "metrics"
    return {str(path.relative_to(folder)): [(row["step"], row[path.stem]) for row in csv.DictReader(
        path.open(), delimiter="\t")] for path in sorted(folder.rglob("*.tsv"))}


def assert_same_run(run: Path, reference: Path) -> None:
    weights = "model.safetensors"
    assert (run / "checkpoint" / weights).read_bytes() == (reference / "checkpoint" / weights).read_bytes()
    assert (run / "metrics.json").read_bytes() == (reference / "metrics.json").read_bytes()
    assert curves(run) == curves(reference)
    assert not (run / "resume").exists(), "a finished run keeps only its final checkpoint"
    # The kept states (finetune.keep_states): the same steps, the same bytes, the index naming the checkpoint.
    kept = sorted(str(p.relative_to(run / "states")) for p in (run / "states").rglob("*") if p.is_file())
    assert kept == sorted(str(p.relative_to(reference / "states")) for p in (reference / "states").rglob("*")
                          if p.is_file())
    assert kept == ["states.json", "step12/model.safetensors", "step18/model.safetensors", "step6/model.safetensors"]
    for name in kept:
        assert (run / "states" / name).read_bytes() == (reference / "states" / name).read_bytes(), name


@pytest.fixture(scope="module")
def reference(project) -> Path:
    finished(finetune(project, "reference"))
    return project / "reference"


def test_same_seed_gives_byte_identical_outputs(project, reference):
    finished(finetune(project, "again"))
    assert_same_run(project / "again", reference)
    assert len(curves(reference)["eval/accuracy.tsv"]) == MAX_STEPS // 6  # evaluated at 6, 12, 18, 24


def test_other_seed_gives_another_model(project, reference):
    finished(finetune(project, "seed2", seed=2))
    assert weights_digest(project / "seed2" / "checkpoint") != weights_digest(reference / "checkpoint")


@pytest.mark.parametrize("kill, resumed_from", [
    ({"KILL_AT_STEP": 13}, 10),   # mid-run: states at 5 and 10 were written, 11–13 are lost (kept state 12 redone)
    ({"KILL_AT_STEP": 3}, None),  # before the first state: starts over
    ({"KILL_IN_SAVE": 2}, 5),     # inside the write of the step-10 state: the step-5 state survives
], ids=["after-step-13", "after-step-3", "while-saving-step-10"])
def test_killed_run_resumes_to_identical_result(project, reference, kill, resumed_from):
    name = "-".join(f"{k}{v}" for k, v in kill.items()).lower()
    run = project / name
    killed(finetune(project, name, **kill))
    assert not (run / "checkpoint").exists() and not (run / "metrics.json").exists()
    state = run / "resume" / STATE_FILE
    if resumed_from is None:
        assert not state.exists()
    else:
        assert torch.load(state, weights_only=True)["step"] == resumed_from

    result = finetune(project, name)
    finished(result)
    if resumed_from is not None:
        assert f"resuming from {state} at step {resumed_from}" in result.stderr
    assert_same_run(run, reference)


def test_state_of_another_configuration_is_not_resumed(tmp_path):
    """A state saved under one fingerprint (params, seed, data) is discarded by a run with another."""
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    state = TrainingState.capture(7, model, optimizer, scheduler, torch.tensor(1.5), 2, [(5, {"train/loss": 0.3})])
    TrainingCheckpoint(tmp_path, {"seed": 1}).save(state)
    assert TrainingCheckpoint(tmp_path, {"seed": 1}).load(torch.device("cpu")).step == 7
    assert TrainingCheckpoint(tmp_path, {"seed": 2}).load(torch.device("cpu")) is None
    assert not (tmp_path / STATE_FILE).exists(), "a stale state is removed, not kept beside the new run"


def test_unreadable_state_starts_over(tmp_path):
    (tmp_path / STATE_FILE).write_bytes(b"not a torch file")
    (tmp_path / f".{STATE_FILE}.abc.tmp").write_bytes(b"partial")
    assert TrainingCheckpoint(tmp_path, {}).load(torch.device("cpu")) is None
    assert not tmp_path.exists(), "the unreadable state and the partial write are both removed"


@pytest.mark.integration
def test_dvc_repro_resumes_after_the_whole_pipeline_is_killed(tmp_path):
    """Pre-emption kills dvc and the stage together; the next `dvc repro` resumes from the saved state
    (DVC clears the dead process's lock, and the state lives outside the stage's outputs) and ends
    with the weights of a project copy that ran uninterrupted."""
    from dvc_project import dvc, make_project, run, tiny_params

    def configure(params):
        tiny_params(params, seeds=[1])
        params["finetune"].update(max_steps=160, checkpoint_every=10, eval_every=0)

    stage = "finetune@synth-negation-1"
    weights = Path("data/checkpoints/synth-negation/seed1/model/model.safetensors")
    state = Path("data/resume/tiny-bert/synth-negation/seed1") / STATE_FILE
    reference, preempted = tmp_path / "reference", tmp_path / "preempted"
    run(dvc("repro", stage), reference, make_project(reference, configure))

    env = make_project(preempted, configure, share_cache=False)  # else the run-cache restores the reference run
    victim = subprocess.Popen(dvc("repro", stage), cwd=preempted, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while not (preempted / state).exists():
            assert victim.poll() is None, "the run ended before it saved a training state"
            assert time.monotonic() < deadline, "no training state saved within 600 s of the start"
            time.sleep(0.05)
    finally:
        os.killpg(victim.pid, signal.SIGKILL)  # dvc and the stage script, as a pre-empted machine
        victim.wait()
    assert not (preempted / weights).exists()

    resumed = run(dvc("repro", stage), preempted, env)
    assert "resuming from" in resumed.stderr + resumed.stdout, output(resumed)
    assert (preempted / weights).read_bytes() == (reference / weights).read_bytes()
    assert not (preempted / state).parent.exists()
    assert "up to date" in run(dvc("status", stage), preempted, env).stdout


@pytest.mark.parametrize("name, method_from", [("finetune", "finetune.method"), ("finetune_compared", "the matrix")])
def test_finetune_stage_depends_on_every_finetune_param_but_checkpoint_every(name, method_from):
    """The stage's params in dvc.yaml list each key that changes the result, so a new key cannot be
    forgotten; checkpoint_every is left out, so changing it reruns no fine-tuning, and so is compare_methods (adding
    a method reruns no run of another). finetune_compared's method is its matrix item's, not finetune.method."""
    import dataclasses

    from layersim.params import FinetuneParams

    from dvc_yaml import params_keys

    keys = params_keys(yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"][name])
    declared = {key.removeprefix("finetune.") for key in keys if key.startswith("finetune.")}
    ignored = {"checkpoint_every", "compare_methods"} | ({"method"} if method_from == "the matrix" else set())
    assert declared == {f.name for f in dataclasses.fields(FinetuneParams)} - ignored
    assert "finetune" not in keys and "model" in keys


def test_a_state_path_that_is_a_folder_is_one_sentence_before_training(tmp_path):
    """Issue 49: it was an IsADirectoryError at the first save, after the steps before it had run."""
    from layersim.errors import LayersimError

    (tmp_path / STATE_FILE).mkdir()
    with pytest.raises(LayersimError, match=rf"the training state .*{STATE_FILE} is a folder, not a file; remove it"):
        TrainingCheckpoint(tmp_path, {"seed": 1}).load(torch.device("cpu"))
