"""Run the stale nodes of the pipeline as Ray tasks, DVC still doing every stage's work.

Each node is one Ray task whose arguments are its upstream tasks' results, so Ray starts it once its
inputs exist and never when one of them failed; the scheduling, GPU pinning (``CUDA_VISIBLE_DEVICES`` per
task) and retries of tasks whose worker died are Ray's. A task runs ``dvc --wait-for-lock repro -s <node>``:

- ``shared`` workspace (one host): in the user's workspace. DVC releases its repo lock while a stage's
  command runs and holds per-path locks on deps and outs, so concurrent stages are safe on one host.
- ``clone`` workspace (several hosts, where DVC's PID-based locks cannot see other hosts' processes):
  in a clone of the committed HEAD per task attempt, under the workspace's ``.dvc/tmp/launch/clones`` (on the
  filesystem every host shares, so the head can remove what a dead host left) and sharing the workspace's DVC
  cache and run-cache; upstream results are restored there from the run-cache by ``dvc repro <node>``. The
  head then runs ``dvc repro <the finished nodes>`` in the workspace with ``$SHELL`` set to a script that
  refuses: DVC runs a stage's command through ``$SHELL`` only when its run-cache has no result for the
  stage's command, deps and params, so every node is restored ("Stage … is cached - skipping run, checking
  out outputs") and dvc.lock written for the requested subgraph only, in DAG order, or the head stops
  naming the node instead of computing it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from layersim_launch.graph import Node

WORKSPACES = ("shared", "clone")
LOG_DIR = Path(".dvc") / "tmp" / "launch"  # DVC and git ignore .dvc/tmp; one log per node: <node>.log
CLONES = LOG_DIR / "clones"                # clone workspace: <launch id>/<node>-<random>, one per task attempt
PARAMS = "params.yaml"                     # what DVC's params read and `layersim launch -S` sets
# $SHELL of the head's restoring `dvc repro` (clone workspace): DVC calls it only to run a stage's command.
REFUSE_SHELL = """#!/bin/sh
echo "layersim launch: the run-cache holds no result for $DVC_STAGE, so the head would compute it; not running it" >&2
exit 97
"""


@dataclass(frozen=True)
class Resources:
    gpu_stages: tuple[str, ...]
    num_gpus: float
    num_cpus: float
    retries: int

    def of(self, node: Node) -> dict:
        if node.stage in self.gpu_stages:
            return {"num_gpus": self.num_gpus, "num_cpus": 0}
        return {"num_cpus": self.num_cpus}


@dataclass(frozen=True)
class NodeResult:
    address: str
    status: str               # "done", "failed" (its stage failed) or "skipped" (an upstream node did not finish)
    seconds: float
    devices: str | None       # CUDA_VISIBLE_DEVICES the task saw (None: unset)
    host: str
    log: str
    cause: str | None = None  # failed: the exit status; skipped: the upstream node that failed
    node: str | None = None   # the Ray node (its id) that ran it


@dataclass(frozen=True)
class Clones:
    """What a clone-workspace node needs (None in the shared workspace): the commit its clone checks out, the
    folder of this launch's clones (on the filesystem every host shares) and the workspace's DVC cache."""
    commit: str
    folder: str
    cache: str


class NodeFailed(RuntimeError):
    def __init__(self, result: NodeResult):
        super().__init__(f"{result.address} failed ({result.cause}); its log: {result.log}")
        self.result = result


class RestoreFailed(RuntimeError):
    """The head could not restore a finished node from the run-cache (clone workspace)."""


def log_path(root: str | Path, address: str) -> Path:
    return Path(root) / LOG_DIR / f"{address}.log"


def dvc_command() -> list[str]:
    """`dvc` as this interpreter's module, so a task finds the same DVC whatever PATH the worker has."""
    return [sys.executable, "-m", "dvc"]


def run_node(address: str, root: str, clones: Clones | None, *upstream: NodeResult) -> NodeResult:
    """The body of one Ray task (Ray passes the upstream results once they exist). A node whose upstream
    did not finish is skipped: results, not exceptions, carry failures (they cross processes as plain data).
    It runs in the workspace at `root` (shared workspace) or in a clone of its own (`clones`)."""
    import socket

    import ray

    log, record = log_path(root, address), Path(root) / LOG_DIR / f"{address}.pgid"
    devices, host = os.environ.get("CUDA_VISIBLE_DEVICES"), socket.gethostname()
    node = ray.get_runtime_context().get_node_id()
    blocked = next((up for up in upstream if up.status != "done"), None)
    if blocked is not None:
        origin = blocked.address if blocked.status == "failed" else blocked.cause
        return NodeResult(address, "skipped", 0.0, devices, host, str(log), origin, node)
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(log, "a") as out:
        out.write(f"--- {address} on {host} (Ray node {node}), CUDA_VISIBLE_DEVICES={devices}\n")
        out.flush()
        _stop_earlier_attempt(record, host)
        if clones is None:
            code = _run_group([*dvc_command(), "--wait-for-lock", "repro", "-s", address], Path(root), out,
                              record, host)
        else:
            code = _run_in_clone(address, Path(root), clones, out, record, host)
    return NodeResult(address, "done" if code == 0 else "failed", time.perf_counter() - start, devices, host,
                      str(log), None if code == 0 else f"exit status {code}", node)


def _run_group(argv: list[str], cwd: Path, out, record: Path, host: str) -> int:
    """Run `argv` as the leader of its own process group, recorded in `record` until it ends: if this task's
    worker dies, a retry on the same host stops the whole group (dvc and the stage it runs) before starting
    again, instead of meeting its locks (DVC drops lock entries of processes that no longer exist)."""
    process = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    record.write_text(f"{host} {process.pid}\n")
    code = process.wait()
    record.unlink(missing_ok=True)
    return code


def _stop_earlier_attempt(record: Path, host: str, timeout: float = 60.0) -> None:
    """Stop what an earlier attempt of this node left running on this host (its worker died, its process
    group did not), and wait until it is gone."""
    import signal

    if not record.exists():
        return
    recorded_host, pgid = record.read_text().split()
    record.unlink(missing_ok=True)
    if recorded_host != host:
        return  # another machine's processes died with it (clone workspace)
    try:
        os.killpg(int(pgid), signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(int(pgid), 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)


def _run_in_clone(address: str, root: Path, clones: Clones, out, record: Path, host: str) -> int:
    """`dvc repro <node>` in a throwaway clone of the commit that uses the workspace's cache: upstream stages
    are restored from the shared run-cache, this node runs and its outputs and run-cache entry land in
    the shared cache. The clone is removed however the attempt ends, except when its worker dies: then the
    head removes it (:func:`launch`)."""
    from dvc.config import ConfigError

    folder = Path(clones.folder)
    folder.mkdir(parents=True, exist_ok=True)
    clone = Path(tempfile.mkdtemp(prefix=f"{address}-", dir=folder))
    try:
        for argv, cwd in [(["git", "clone", "--quiet", "--shared", "--no-checkout", str(root), str(clone)], folder),
                          (["git", "checkout", "--quiet", clones.commit], clone)]:
            out.flush()
            code = _run_group(argv, cwd, out, record, host)
            if code != 0:
                return code
        try:
            shutil.copy2(folder / PARAMS, clone / PARAMS)  # HEAD's, or with `layersim launch -S`
            use_cache(clone, clones.cache)
        except (OSError, ConfigError) as error:
            out.write(f"layersim launch: cannot prepare the clone {clone}: {error}\n")
            return 1
        out.flush()
        return _run_group([*dvc_command(), "--wait-for-lock", "repro", address], clone, out, record, host)
    finally:
        shutil.rmtree(clone, ignore_errors=True)


def cache_dir(root: Path) -> str:
    """The workspace's DVC cache folder (`dvc cache dir`), which every clone of a launch shares."""
    found = subprocess.run([*dvc_command(), "cache", "dir"], cwd=root, capture_output=True, text=True)
    if found.returncode != 0 or not found.stdout.strip():
        raise ValueError(f"--workspace clone needs the workspace's DVC cache, but `dvc cache dir` in {root} failed: "
                         f"{(found.stderr.strip().splitlines() or ['no output'])[-1]}")
    return found.stdout.strip()


def use_cache(project: Path, cache: str) -> None:
    """`dvc cache dir --local <cache>` in `project`, through DVC's own config code (which quotes the path) instead
    of a second DVC process per node."""
    from dvc.config import Config

    with Config(dvc_dir=str(project / ".dvc")).edit("local") as conf:
        conf["cache"]["dir"] = cache


def launch(root: Path, nodes: list[Node], resources: Resources, *, workspace: str = "shared",
           report: Callable[[str], None] = print, commit: str | None = None) -> list[NodeResult]:
    """Submit every node (upstream first) to the connected Ray cluster and wait for all of them.

    A failed node stops its descendants (they are skipped) while the others finish; then
    :class:`NodeFailed` names the first failure and its log. Clone workspace: the finished nodes are then
    restored into the workspace from the run-cache (:class:`RestoreFailed` where one cannot be) and the
    clones removed. Returns each node's result in the order they finished; `report` gets one line per
    finished node. Clone workspace: `commit` (default: HEAD, which must hold every change) is what each clone
    checks out, with the workspace's params.yaml over it where that differs (`layersim launch -S`).
    """
    import ray

    if workspace not in WORKSPACES:
        raise ValueError(f"workspace must be one of {', '.join(WORKSPACES)}, got {workspace!r}")
    clones = None
    if workspace == "clone":
        commit, cache = commit or committed_head(root), cache_dir(root)
        (root / CLONES).mkdir(parents=True, exist_ok=True)
        clones = Clones(commit, tempfile.mkdtemp(prefix="", dir=root / CLONES), cache)  # this launch's folder
        shutil.copy2(root / PARAMS, Path(clones.folder) / PARAMS)  # HEAD's, or with the -S values the head set
    try:
        results = _run_all(ray, root, nodes, resources, clones, report)
    finally:
        if clones is not None:  # what the attempts whose worker died left there
            shutil.rmtree(clones.folder, ignore_errors=True)
            with contextlib.suppress(OSError):
                (root / CLONES).rmdir()  # unless another launch's clones are there
    failed = [r for r in results if r.status == "failed"]
    if workspace == "clone":
        order = {node.address: i for i, node in enumerate(nodes)}  # upstream first, as `dvc repro` writes dvc.lock
        done = sorted((r.address for r in results if r.status == "done"), key=order.__getitem__)
        if done:
            _restore_on_head(root, done, report)
    if failed:
        raise NodeFailed(failed[0])
    return results


def _run_all(ray, root: Path, nodes: list[Node], resources: Resources, clones: Clones | None,
             report: Callable[[str], None]) -> list[NodeResult]:
    remote = ray.remote(run_node)
    refs, address_of = {}, {}
    for node in nodes:
        upstream = [refs[name] for name in node.upstream if name in refs]
        ref = remote.options(name=node.address, max_retries=resources.retries, retry_exceptions=False,
                             **resources.of(node)).remote(node.address, str(root), clones, *upstream)
        refs[node.address], address_of[ref] = ref, node.address
    results, pending = [], list(refs.values())
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        try:
            result = ray.get(done[0])
        except ray.exceptions.RayError as error:  # its worker died more than `retries` times, or an upstream one's
            address = address_of[done[0]]
            result = NodeResult(address, "failed", 0.0, None, "", str(log_path(root, address)), type(error).__name__)
        results.append(result)
        if result.status == "done":
            report(f"done    {result.address} in {result.seconds:.1f} s"
                   + (f" (CUDA_VISIBLE_DEVICES={result.devices})" if result.devices is not None else ""))
        elif result.status == "failed":
            report(f"FAILED  {result.address} ({result.cause}): {result.log}")
        else:
            report(f"skipped {result.address}: upstream {result.cause} failed")
    return results


def _restore_on_head(root: Path, addresses: list[str], report: Callable[[str], None]) -> None:
    """Check out the finished nodes' outputs into the workspace from the shared run-cache and write their
    dvc.lock entries, computing nothing (see the module's docstring); their output goes to restore.log."""
    shell, log = root / LOG_DIR / "refuse-shell.sh", root / LOG_DIR / "restore.log"
    shell.parent.mkdir(parents=True, exist_ok=True)
    shell.write_text(REFUSE_SHELL)
    shell.chmod(0o755)
    report(f"restoring {len(addresses)} finished nodes into the workspace from the run-cache (dvc repro)")
    with open(log, "w") as out:
        code = subprocess.run([*dvc_command(), "--wait-for-lock", "repro", *addresses], cwd=root,
                              env={**os.environ, "SHELL": str(shell)}, stdout=out, stderr=subprocess.STDOUT).returncode
    if code != 0:
        text = log.read_text()
        refused = [line.split("for ", 1)[1].split(",")[0] for line in text.splitlines()
                   if line.startswith("layersim launch: the run-cache holds no result for ")]
        why = (f"the run-cache holds no result for {refused[0]} (its outputs are not in the shared DVC cache)"
               if refused else f"`dvc repro` exited with status {code}")
        raise RestoreFailed(f"the head could not restore the finished nodes into the workspace: {why}; its log: "
                            f"{log}. Nothing was computed on the head; check that every host uses the "
                            "workspace's DVC cache (`dvc cache dir`), then run `layersim launch` again.")


def committed_head(root: Path) -> str:
    """The commit clone mode runs; the workspace must hold nothing uncommitted that the stages read."""
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                           capture_output=True, text=True, check=True).stdout.strip()
    if dirty:
        raise ValueError("--workspace clone runs the committed HEAD, but the workspace has uncommitted changes "
                         f"({dirty.splitlines()[0].strip()} …); commit them or use --workspace shared.")
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                          check=True).stdout.strip()
