"""`layersim launch`: the pipeline's nodes as Ray tasks on a local cluster with fake GPUs, against a
serial `dvc repro` of the same project (tests/launch_project.py: nodes that wait instead of computing)."""

from __future__ import annotations

import ast
import csv
import io
import json
import sys
import time
from pathlib import Path

import fork_server
import pytest
import yaml

from dvc_project import (REPO, dvc, make_project, output, project_env, repository_params_text, run, tiny_params,
                         with_venv_commands)
from launch_project import make_launch_project, parsed_lock
from layersim.params.launch import STAGES

ITEMS = ["a", "b", "c", "d"]
SECONDS = 1.5  # each fine-tune's wait: long enough that two run at once on two fake GPUs


def _launch(root: Path, env: dict, *args: str):
    """`layersim launch` in `root`; the driver too is a fork of the test process's server (tests/fork_server.py)."""
    return run([fork_server.python(), "-m", "layersim_launch.cli", "launch", "--cpus", "2", *args], root, env,
               check=False)


def _status_clean(root: Path, env: dict) -> bool:
    return json.loads(run(dvc("status", "--json"), root, env).stdout or "{}") == {}


def test_the_launch_params_name_every_stage_of_the_pipeline():
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    assert set(STAGES) == set(stages)


def test_a_clone_takes_the_workspace_cache_dvc_reads_back(tmp_path):
    """Each clone-mode node points its clone at the workspace's cache (runner.use_cache, DVC's own config code):
    `dvc cache dir` there reads back the path the head found, spaces and a comment sign included."""
    from layersim_launch.runner import cache_dir, use_cache

    workspace, clone = tmp_path / "workspace", tmp_path / "clone"
    env = make_launch_project(workspace, ["a"], seconds=0)
    cache = tmp_path / "a cache #1"
    run(dvc("cache", "dir", "--local", str(cache)), workspace, env)
    found = cache_dir(workspace)
    assert found == str(cache)
    run(["git", "clone", "-q", str(workspace), str(clone)], tmp_path, env)
    use_cache(clone, found)
    assert run(dvc("cache", "dir"), clone, env).stdout.strip() == str(cache)
    with pytest.raises(ValueError, match="--workspace clone needs the workspace's DVC cache, but `dvc cache dir` in "):
        cache_dir(tmp_path)  # not a DVC project


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    root = tmp_path_factory.mktemp("serial")
    env = make_launch_project(root, ITEMS, seconds=SECONDS)
    run(dvc("repro"), root, env)
    return root


@pytest.mark.integration
def test_shared_workspace_runs_like_serial_with_one_gpu_per_concurrent_finetune(tmp_path, serial):
    root = tmp_path / "project"
    env = make_launch_project(root, ITEMS, seconds=SECONDS)
    result = _launch(root, env, "--gpus", "2")
    assert result.returncode == 0, output(result)
    assert _status_clean(root, env)
    assert parsed_lock(root) == parsed_lock(serial)
    assert "Unable to acquire lock" not in "".join(p.read_text() for p in (root / ".dvc/tmp/launch").glob("*.log"))
    runs = [json.loads((root / "logs" / f"train-{item}.json").read_text()) for item in ITEMS]
    assert {r["devices"] for r in runs} == {"0", "1"}
    overlapping = [(x, y) for i, x in enumerate(runs) for y in runs[i + 1:] if x["start"] < y["end"] and y["start"] < x["end"]]
    assert overlapping and all(x["devices"] != y["devices"] for x, y in overlapping)  # two at a time, each its own GPU
    assert "compare" in result.stdout and "nodes in" in result.stdout  # the per-node summary
    again = _launch(root, env, "--gpus", "2")
    assert again.returncode == 0 and "every stage is up to date" in again.stdout, output(again)


@pytest.mark.integration
def test_a_failed_node_stops_its_descendants_and_a_rerun_continues(tmp_path, serial):
    root = tmp_path / "project"
    env = make_launch_project(root, ITEMS, seconds=SECONDS)
    (root / "fail-b").write_text("")
    result = _launch(root, env, "--gpus", "2")
    assert result.returncode == 1, output(result)
    assert "finetune@b failed" in result.stderr and "finetune@b.log" in result.stderr
    assert "told to fail" in (root / ".dvc/tmp/launch/finetune@b.log").read_text()
    for item in ("a", "c", "d"):  # the nodes that did not need it finished
        assert (root / "data" / "extract" / f"{item}.txt").exists()
    assert not (root / "data" / "extract" / "b.txt").exists() and not (root / "data" / "compare.txt").exists()
    (root / "fail-b").unlink()
    again = _launch(root, env, "--gpus", "2")
    assert again.returncode == 0, output(again)
    ran = {line.split()[1] for line in again.stdout.splitlines() if line.startswith("done")}
    assert ran == {"finetune@b", "extract@b", "compare"}
    assert _status_clean(root, env) and parsed_lock(root) == parsed_lock(serial)


@pytest.mark.integration
def test_a_killed_worker_is_retried(tmp_path, serial):
    root = tmp_path / "project"
    env = make_launch_project(root, ITEMS, seconds=SECONDS)
    (root / "kill-c").write_text("")
    result = _launch(root, env, "--gpus", "2")
    assert result.returncode == 0, output(result)
    assert (root / "killed-c").exists()  # the first attempt took its worker down
    assert "killed its Ray worker" in (root / ".dvc/tmp/launch/finetune@c.log").read_text()
    assert _status_clean(root, env) and parsed_lock(root) == parsed_lock(serial)


@pytest.mark.integration
def test_clone_workspace_restores_every_stage_into_the_workspace(tmp_path, serial):
    root = tmp_path / "project"
    env = make_launch_project(root, ITEMS, seconds=SECONDS)
    result = _launch(root, env, "--gpus", "2", "--workspace", "clone")
    assert result.returncode == 0, output(result)
    assert _status_clean(root, env)
    assert (root / "dvc.lock").read_text() == (serial / "dvc.lock").read_text()  # written in DAG order by the head
    assert (root / "data" / "compare.txt").exists()
    dirty = root / "sleep.txt"
    dirty.write_text("3\n")
    refused = _launch(root, env, "--gpus", "2", "--workspace", "clone")
    assert refused.returncode == 2 and "uncommitted changes" in refused.stderr, output(refused)


def test_bad_flags_and_params_fail_before_ray_starts(tmp_path):
    root = tmp_path / "project"
    env = make_launch_project(root, ITEMS, seconds=0)
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["launch"]["gpu_stages"] = ["finetun"]
    (root / "params.yaml").write_text(yaml.safe_dump(params))

    def launch(*args):  # none of these starts Ray
        return _launch(root, env, *args)

    result = launch()
    assert result.returncode == 2 and "launch.gpu_stages" in result.stderr and "finetune" in result.stderr
    (root / "params.yaml").write_text(repository_params_text())
    dry = launch("--dry")
    assert dry.returncode == 0 and "finetune@a  {'num_gpus': 1.0, 'num_cpus': 0}" in dry.stdout, output(dry)
    assert "compare  {'num_gpus': 1.0, 'num_cpus': 0}" in dry.stdout  # its nulls run on the GPU
    assert "download  {'num_cpus': 1.0}" in dry.stdout
    no_gpus = launch("--gpus", "0")
    assert no_gpus.returncode == 2 and "ask for 1 GPU per task, but the Ray cluster has 0" in no_gpus.stderr
    assert not (root / "data").exists()  # nothing ran
    unknown = launch("finetune@zzz")
    assert unknown.returncode == 2 and "unknown node 'finetune@zzz'; the pipeline's nodes are: " in unknown.stderr
    only = launch("--dry", "extract@b")
    assert only.stdout.split("\n")[:3] == ["download  {'num_cpus': 1.0}", "finetune@b  {'num_gpus': 1.0, 'num_cpus': 0}",
                                             "extract@b  {'num_gpus': 1.0, 'num_cpus': 0}"], output(only)
    committed = (root / "params.yaml").read_text()
    bad = launch("-S", "seeds=[-1]")  # refused by the params check, before Ray, the file as it was
    assert bad.returncode == 2 and "error: params.yaml: seeds = [-1] is invalid" in bad.stderr, output(bad)
    unparsable = launch("-S", "seeds=[1,")
    assert unparsable.returncode == 2 and "-S seeds=[1, cannot be applied to params.yaml" in unparsable.stderr
    assert (root / "params.yaml").read_text() == committed
    dry_set = launch("--dry", "-S", "launch.num_gpus=0.5", "extract@b")  # as `dvc exp run -S`; --dry restores the file
    assert dry_set.returncode == 0 and "finetune@b  {'num_gpus': 0.5, 'num_cpus': 0}" in dry_set.stdout, output(dry_set)
    assert (root / "params.yaml").read_text() == committed
    cpu_only = launch("--dry", "--gpus", "0")
    assert cpu_only.returncode == 0 and "warning: 9 of these nodes (finetune@" in cpu_only.stderr, output(cpu_only)
    assert "ask for 1 GPU each (launch.gpu_stages), but the cluster has 0, so `layersim launch` would refuse to " \
        "start" in cpu_only.stderr
    negative = launch("--gpus", "-1")
    assert negative.returncode == 2 and "--gpus must be a non-negative number, got -1.0" in negative.stderr
    elsewhere = launch("--root", str(tmp_path), "--params", str(root / "params.yaml"))
    assert elsewhere.returncode == 2 and "cannot read the DVC pipeline in" in elsewhere.stderr, output(elsewhere)


# Put into a project copy's stages/finetune.py: with KILL_RAY_WORKER_AT_STEP=k, the first attempt kills the
# Ray worker running it (a preempted node) and then itself right after optimizer step k.
PREEMPT = fork_server.ANCESTORS + '''
import os as _os
if _os.environ.get("KILL_RAY_WORKER_AT_STEP") and not _os.path.exists("preempted"):
    import torch as _torch
    _step, _calls = _torch.optim.AdamW.step, [0]

    def _preempting_step(self, *args, **kwargs):
        out = _step(self, *args, **kwargs)
        _calls[0] += 1
        if _calls[0] == int(_os.environ["KILL_RAY_WORKER_AT_STEP"]):
            open("preempted", "w").close()
            for parent in ancestors():
                if "default_worker" in " ".join(parent.cmdline()) or parent.name().startswith("ray::"):
                    parent.kill()  # the nearest one: the raylet further up names default_worker.py too
                    break
            _os.kill(_os.getpid(), 9)
        return out

    _torch.optim.AdamW.step = _preempting_step
'''


def _finetune_project(root: Path) -> dict:
    def configure(params):
        tiny_params(params, seeds=[1])
        params["finetune"].update(max_steps=24, eval_every=12, checkpoint_every=5)
        params["launch"]["gpu_stages"] = []
    env = make_project(root, configure, share_cache=False)
    script = root / "stages" / "finetune.py"
    lines = script.read_text().splitlines(keepends=True)
    after_docstring = ast.parse("".join(lines)).body[0].end_lineno  # the code goes in after the whole docstring
    script.write_text("".join(lines[:after_docstring]) + PREEMPT + "".join(lines[after_docstring:]))
    run(["git", "commit", "-qam", "preemptible finetune"], root, env)
    return env


@pytest.mark.integration
def test_a_preempted_finetune_is_retried_and_resumes_to_the_same_model(tmp_path):
    """The real finetune stage (tiny-bert) under Ray: its worker dies after step 13, Ray retries the node,
    the stage resumes from its step-10 state and ends with the weights of an uninterrupted run."""
    node = "finetune@synth-negation-1"
    reference = tmp_path / "reference"
    # Ray gives a task as many BLAS/OpenMP threads as CPUs it asked for (1), which changes float sums' order.
    run(dvc("repro", node), reference, {**_finetune_project(reference), "OMP_NUM_THREADS": "1"})
    root = tmp_path / "project"
    env = {**_finetune_project(root), "KILL_RAY_WORKER_AT_STEP": "13"}
    result = _launch(root, env, node)
    assert result.returncode == 0, output(result)
    assert (root / "preempted").exists()
    log = (root / f".dvc/tmp/launch/{node}.log").read_text()
    assert log.count(f"--- {node}") == 2 and "at step 10" in log, log  # two attempts, the second resumed
    weights = Path("data/checkpoints/synth-negation/seed1/model/model.safetensors")
    assert (root / weights).read_bytes() == (reference / weights).read_bytes()
    status = json.loads(run(dvc("status", "--json", node), root, env).stdout or "{}")
    assert status == {}


# The recipe for sweeps of whole experiments (docs/scale-out.md): one `dvc queue start` per GPU, a pause between them.
QUEUE_WORKERS = 'for k in 0 1; do CUDA_VISIBLE_DEVICES=$k dvc queue start -j $((k + 1)); sleep 5; done'
# Each probe marks its start in a folder shared by the two experiments (outside their workspaces) and waits, up to 90 s,
# for the other's mark: two workers that run at once overlap however slowly a loaded machine starts them; one worker
# running both in turn leaves the first waiting out its 90 s alone, and the runs do not overlap.
PROBE = ("import json, os, pathlib, time; start = time.time(); marks = pathlib.Path(os.environ['PROBE_MARKS']); "
         "(marks / os.environ['CUDA_VISIBLE_DEVICES']).touch(); "
         "[time.sleep(0.5) for _ in range(180) if len(list(marks.iterdir())) < 2]; time.sleep(1); "
         "json.dump({'device': int(os.environ['CUDA_VISIBLE_DEVICES']), 'start': start, 'end': time.time()}, "
         "open('probe.json', 'w'))")


@pytest.mark.integration
def test_queued_experiments_run_one_worker_per_gpu(tmp_path):
    root = tmp_path / "sweep"
    root.mkdir()
    env = with_venv_commands(project_env(root))  # the workers are spawned as `dvc` from PATH
    env["PROBE_MARKS"] = str(tmp_path / "started")
    (tmp_path / "started").mkdir()
    (root / "params.yaml").write_text("name: base\n")
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"probe": {
        "cmd": f'{sys.executable} -c "{PROBE}"', "params": ["name"], "metrics": [{"probe.json": {"cache": False}}]}}}))
    for command in (["git", "init", "-q", "-b", "main"], dvc("init", "-q"), ["git", "add", "-A"],
                    ["git", "commit", "-qm", "sweep"]):
        run(command, root, env)
    for name in ("a", "b"):  # worker 1 is still busy with the first when worker 2 starts (5 s later)
        run(dvc("exp", "run", "--queue", "-S", f"name={name}", "-n", f"exp-{name}"), root, env)
    run(["bash", "-c", QUEUE_WORKERS], root, env)
    for _ in range(240):
        status = run(dvc("queue", "status"), root, env).stdout
        if not {"Queued", "Running"} & set(status.split()):
            break
        time.sleep(1)
    else:
        pytest.fail(f"the queued experiments had not finished after 240 s:\n{status}")
    rows = list(csv.DictReader(io.StringIO(run(dvc("exp", "show", "--csv"), root, env).stdout)))
    runs = [{k: float(row[k]) for k in ("device", "start", "end")} for row in rows if row["Experiment"]]
    assert len(runs) == 2, rows
    assert {r["device"] for r in runs} == {0, 1}
    overlapping = [(x, y) for i, x in enumerate(runs) for y in runs[i + 1:] if x["start"] < y["end"] and y["start"] < x["end"]]
    assert overlapping and all(x["device"] != y["device"] for x, y in overlapping)


def test_every_stage_can_be_restored_from_the_run_cache():
    """DVC 3 writes a run-cache entry only for a stage whose uncached outputs are all metrics or plots; clone mode
    restores every node on the head from the run-cache, so an uncached plain output (report/index.html was one)
    would stop every launch at its end."""
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    uncached = [(name, path) for name, stage in stages.items() for out in stage.get("outs", [])
                if isinstance(out, dict) for path, options in out.items() if (options or {}).get("cache") is False]
    assert uncached == []
