"""`layersim launch` on a two-node Ray cluster started as docs/scale-out.md's recipe says (token authentication
on, the token handed to every node), on this host: a head and a worker, each `ray start` with its own CPUs,
one fake GPU, ports and temp dir (tests/launch_project.py's RayNodes). The worker dies (its processes and
the stages they started are killed) while it runs a fine-tune; the run must still end like a serial
`dvc repro`: every node ran to its end exactly once, nothing ran on the head's `dvc repro`, `dvc status`
clean, the same dvc.lock entries, no clone left behind."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import Counter

import pytest

from dvc_project import REPO, dvc, make_project, output, project_env, run, tiny_params
from launch_project import RayNodes, make_launch_project, parsed_lock, runs

pytestmark = pytest.mark.integration

ITEMS = ["a", "b", "c", "d"]
SECONDS = 3.0  # each fine-tune's wait: long enough to kill the worker in the middle of one


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    root = tmp_path_factory.mktemp("serial")
    env = make_launch_project(root, ITEMS, seconds=SECONDS)
    start = time.perf_counter()
    run(dvc("repro"), root, env)
    print(f"\nserial dvc repro: {time.perf_counter() - start:.1f} s")
    return root


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The head node (a worker joins in each test): every node's stages append to `cluster.runs`."""
    folder = tmp_path_factory.mktemp("cluster")
    env = {**project_env(folder), "PYTHONPATH": str(REPO / "src"), "LAUNCH_RUNS": str(folder / "runs.txt")}
    nodes = RayNodes(env)
    nodes.runs = folder / "runs.txt"
    try:
        nodes.start("head")
        nodes.wait_until_alive(1)
        yield nodes
    finally:
        nodes.stop()


def _kill_when_it_starts_a_finetune(cluster: RayNodes, name: str) -> tuple[threading.Event, list[str]]:
    """A thread that kills node `name` 1 s after a fine-tune started there once it finished another node (so
    that it has done some work for the run), until the returned event is set; `killed` gets that fine-tune."""
    killed: list[str] = []
    done = threading.Event()

    def watch():
        while not done.is_set():
            there = [line for line in runs(cluster.runs) if len(line) == 3 and line[1] == name]
            first_end = next((i for i, line in enumerate(there) if line[2] == "end"), len(there))
            started = [node for node, _, event in there[first_end:] if event == "start" and node.startswith("finetune@")]
            if started:
                time.sleep(1.0)  # mid-run: the fine-tune waits SECONDS
                killed.append(started[0])
                cluster.kill(name)
                return
            time.sleep(0.2)

    threading.Thread(target=watch, daemon=True).start()
    return done, killed


TARGETS = [f"extract@{item}" for item in ITEMS]  # clone mode: all but compare


@pytest.mark.parametrize("workspace,targets", [("shared", []), ("clone", TARGETS)])
def test_a_two_node_run_whose_worker_dies_ends_like_a_serial_one(tmp_path, serial, cluster, workspace, targets):
    root = tmp_path / "project"
    env = {**make_launch_project(root, ITEMS, seconds=SECONDS), **cluster.env, "LAUNCH_NODE": "driver"}
    worker = f"worker-{workspace}"
    cluster.runs.write_text("")
    cluster.start(worker)
    cluster.wait_until_alive(2)  # the head and this worker (the previous test's worker is dead)
    watching, killed = _kill_when_it_starts_a_finetune(cluster, worker)
    start = time.perf_counter()
    try:
        result = run([sys.executable, "-m", "layersim_launch.cli", "launch", "--address", cluster.address,
                      "--workspace", workspace, *targets], root, env, check=False)
    finally:
        seconds = time.perf_counter() - start
        watching.set()
        time.sleep(1.5)  # a kill under way ends
        if worker in cluster.nodes and not killed:
            cluster.kill(worker)  # so that the next test's cluster has two live nodes again
    assert result.returncode == 0, output(result)
    assert killed, f"the worker never started a fine-tune:\n{output(result)}"

    asked = set(parsed_lock(serial)) - ({"compare"} if targets else set())
    lines = [line for line in runs(cluster.runs) if len(line) == 3]
    starts = Counter(node for node, _, event in lines if event == "start")
    ended_on = {}
    for node, where, event in lines:
        if event == "end":
            assert node not in ended_on, f"{node} ran to its end twice: {lines}"
            ended_on[node] = where
    assert set(ended_on) == asked  # every node asked for ran to its end once, no other
    assert starts == Counter({node: 1 + (node == killed[0]) for node in asked}), lines  # the killed one was retried
    assert ended_on[killed[0]] == "head" and "driver" not in ended_on.values()  # nothing ran on the head's restore
    logs = root / ".dvc/tmp/launch"
    assert {p.stem for p in logs.glob("*.log")} >= asked  # <node>.log
    assert (logs / f"{killed[0]}.log").read_text().count(f"--- {killed[0]} on ") == 2  # two attempts
    assert not (logs / "clones").exists()  # the dead worker's clone too
    status = json.loads(run(dvc("status", "--json", *targets), root, env).stdout or "{}")
    assert status == {}
    expected = {node: entry for node, entry in parsed_lock(serial).items() if node in asked}
    assert parsed_lock(root) == expected  # the same hashes of every dep and out
    if workspace == "clone":
        assert "is cached - skipping run, checking out outputs" in (logs / "restore.log").read_text()
        assert not (root / "data/compare.txt").exists()  # not asked for, not computed
    per_node = Counter(ended_on.values())
    print(f"\n{workspace}: {len(asked)} nodes in {seconds:.1f} s, ran to the end on {dict(per_node)}; the worker "
          f"died running {killed[0]}; dvc.lock entries equal to serial's: {len(expected)}; load {os.getloadavg()}")


def test_the_head_refuses_to_compute_what_the_run_cache_lacks(tmp_path, monkeypatch):
    """Clone mode's last step on the head: a node the run-cache holds is checked out, one it lacks stops the
    launch naming it, and no stage command runs."""
    from layersim_launch.runner import RestoreFailed, _restore_on_head

    cache = tmp_path / "cache"
    first, second = tmp_path / "first", tmp_path / "second"
    for root in (first, second):
        env = make_launch_project(root, ITEMS, seconds=0)
        run(dvc("cache", "dir", "--local", str(cache)), root, env)
    monkeypatch.setenv("LAUNCH_RUNS", str(tmp_path / "runs.txt"))  # the head's `dvc repro` runs with this environment
    monkeypatch.setenv("DVC_NO_ANALYTICS", "1")
    run(dvc("repro", "download"), first, {**env, "LAUNCH_RUNS": str(tmp_path / "runs.txt")})
    lines: list[str] = []
    _restore_on_head(second, ["download"], lines.append)
    assert (second / "data/corpus.txt").read_text() == "corpus\n"
    with pytest.raises(RestoreFailed, match=r"the run-cache holds no result for finetune@a \("):
        _restore_on_head(second, ["download", "finetune@a"], lines.append)
    assert not (second / "data/train").exists()
    assert [line[0] for line in runs(tmp_path / "runs.txt") if line[2] == "start"] == ["download"]  # first's only
    assert set(parsed_lock(second)) == {"download"}
    assert lines[0] == "restoring 1 finished nodes into the workspace from the run-cache (dvc repro)"


def test_a_driver_without_the_token_mode_is_told_to_set_it(tmp_path, cluster):
    root = tmp_path / "project"
    env = {key: value for key, value in make_launch_project(root, ["a"], seconds=0).items()
           if not key.startswith("RAY_AUTH")}
    result = run([sys.executable, "-m", "layersim_launch.cli", "launch", "--address", cluster.address], root, env,
                 check=False)
    assert result.returncode == 2 and f"the Ray cluster at {cluster.address}" in result.stderr, output(result)
    assert "needs RAY_AUTH_MODE=token and the token here too" in result.stderr
    assert not (root / "data").exists()


def test_a_clone_mode_launch_of_the_tiny_pipeline_ends_with_the_report(tmp_path, cluster):
    """The real pipeline (tiny-bert, one seed), every stage, on the head and a worker, each node in its own clone:
    the head then restores every node from the shared run-cache, the stages whose outputs are all uncached
    (similarity, align, report, …) included, and nothing is left to run (issue 48)."""
    root = tmp_path / "project"

    def configure(params):  # every stage runs, each on little: the launch is under test, the stages elsewhere
        tiny_params(params, seeds=[1])
        params["similarity"].update(measures={"cls": ["linear_cka"]}, attention_measures=[])
        params["compare"].update(models=[], probe_examples=10)
        params["align"].update(methods=["linear"])
        params["freeze"].update(layers=[])
    env = {**make_project(root, configure, share_cache=False), **cluster.env, "LAUNCH_NODE": "driver"}
    cluster.start("worker-pipeline", cpus=1, gpus=1)
    cluster.wait_until_alive(2)
    try:
        result = run([sys.executable, "-m", "layersim_launch.cli", "launch", "--address", cluster.address,
                      "--workspace", "clone"], root, env, check=False)
    finally:
        cluster.kill("worker-pipeline")
    assert result.returncode == 0, output(result) + (root / ".dvc/tmp/launch/restore.log").read_text()
    assert "Data and pipelines are up to date." in run(dvc("status"), root, env).stdout
    page = (root / "report/index.html").read_text(encoding="utf-8")
    assert "Model tiny-bert; tasks synth-negation;" in page
    assert not (root / ".dvc/tmp/launch/clones").exists()
