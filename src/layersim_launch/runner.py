"""Run the stale nodes of the pipeline as Ray tasks, DVC still doing every stage's work.

Each node is one Ray task whose arguments are its upstream tasks' results, so Ray starts it once its
inputs exist and never when one of them failed; the scheduling, GPU pinning (``CUDA_VISIBLE_DEVICES`` per
task) and retries of tasks whose worker died are Ray's. A task runs ``dvc --wait-for-lock repro -s <node>``:

- ``shared`` workspace (one host): in the user's workspace. DVC releases its repo lock while a stage's
  command runs and holds per-path locks on deps and outs, so concurrent stages are safe on one host.
- ``clone`` workspace (several hosts, where DVC's PID-based locks cannot see other hosts' processes):
  in a clone of the committed HEAD per task, sharing the workspace's DVC cache (and run-cache) on a shared
  filesystem; upstream results are restored there from the run-cache by ``dvc repro <node>``. The head then
  runs a plain ``dvc repro`` in the workspace, which restores every stage from the run-cache and writes
  dvc.lock in DAG order.
"""

from __future__ import annotations

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
LOG_DIR = Path(".dvc") / "tmp" / "launch"  # DVC ignores .dvc/tmp; one log per node


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


class NodeFailed(RuntimeError):
    def __init__(self, result: NodeResult):
        super().__init__(f"{result.address} failed ({result.cause}); its log: {result.log}")
        self.result = result


def dvc_command() -> list[str]:
    """`dvc` as this interpreter's module, so a task finds the same DVC whatever PATH the worker has."""
    return [sys.executable, "-m", "dvc"]


def run_node(address: str, root: str, workspace: str, commit: str | None, *upstream: NodeResult) -> NodeResult:
    """The body of one Ray task (Ray passes the upstream results once they exist). A node whose upstream
    did not finish is skipped: results, not exceptions, carry failures (they cross processes as plain data)."""
    import socket

    log = Path(root) / LOG_DIR / f"{address.replace('@', '_at_')}.log"
    devices, host = os.environ.get("CUDA_VISIBLE_DEVICES"), socket.gethostname()
    blocked = next((up for up in upstream if up.status != "done"), None)
    if blocked is not None:
        origin = blocked.address if blocked.status == "failed" else blocked.cause
        return NodeResult(address, "skipped", 0.0, devices, host, str(log), origin)
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(log, "a") as out:
        out.write(f"--- {address} on {host}, CUDA_VISIBLE_DEVICES={devices}\n")
        out.flush()
        _stop_earlier_attempt(log.with_suffix(".pgid"), host)
        if workspace == "shared":
            code = _run_group([*dvc_command(), "--wait-for-lock", "repro", "-s", address], Path(root), out,
                              log.with_suffix(".pgid"), host)
        else:
            code = _run_in_clone(address, Path(root), commit, out, log.with_suffix(".pgid"), host)
    return NodeResult(address, "done" if code == 0 else "failed", time.perf_counter() - start, devices, host,
                      str(log), None if code == 0 else f"exit status {code}")


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


def _run_in_clone(address: str, root: Path, commit: str, out, record: Path, host: str) -> int:
    """`dvc repro <node>` in a throwaway clone of `commit` that uses the workspace's cache: upstream stages
    are restored from the shared run-cache, this node runs and its outputs and run-cache entry land in
    the shared cache."""
    cache = subprocess.run([*dvc_command(), "cache", "dir"], cwd=root, capture_output=True, text=True, check=True)
    with tempfile.TemporaryDirectory(prefix="layersim-launch-") as scratch:
        clone = Path(scratch) / "work"
        steps = [
            (["git", "clone", "--quiet", "--shared", "--no-checkout", str(root), str(clone)], Path(scratch)),
            (["git", "checkout", "--quiet", commit], clone),
            ([*dvc_command(), "cache", "dir", "--local", cache.stdout.strip()], clone),
            ([*dvc_command(), "--wait-for-lock", "repro", address], clone),
        ]
        for argv, cwd in steps:
            out.flush()
            code = _run_group(argv, cwd, out, record, host)
            if code != 0:
                return code
        shutil.rmtree(clone, ignore_errors=True)
    return 0


def launch(root: Path, nodes: list[Node], resources: Resources, *, workspace: str = "shared",
           report: Callable[[str], None] = print) -> list[NodeResult]:
    """Submit every node (upstream first) to the connected Ray cluster and wait for all of them.

    A failed node stops its descendants (they are skipped) while the others finish; then
    :class:`NodeFailed` names the first failure and its log. Returns each node's result in the order they
    finished; `report` gets one line per finished node.
    """
    import ray

    if workspace not in WORKSPACES:
        raise ValueError(f"workspace must be one of {', '.join(WORKSPACES)}, got {workspace!r}")
    commit = None
    if workspace == "clone":
        commit = _committed_head(root)
    remote = ray.remote(run_node)
    refs, address_of = {}, {}
    for node in nodes:
        upstream = [refs[name] for name in node.upstream if name in refs]
        ref = remote.options(name=node.address, max_retries=resources.retries, retry_exceptions=False,
                             **resources.of(node)).remote(node.address, str(root), workspace, commit, *upstream)
        refs[node.address], address_of[ref] = ref, node.address
    results, pending = [], list(refs.values())
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        try:
            result = ray.get(done[0])
        except ray.exceptions.RayError as error:  # its worker died more than `retries` times, or an upstream one's
            address = address_of[done[0]]
            log = Path(root) / LOG_DIR / f"{address.replace('@', '_at_')}.log"
            result = NodeResult(address, "failed", 0.0, None, "", str(log), type(error).__name__)
        results.append(result)
        if result.status == "done":
            report(f"done    {result.address} in {result.seconds:.1f} s"
                   + (f" (CUDA_VISIBLE_DEVICES={result.devices})" if result.devices is not None else ""))
        elif result.status == "failed":
            report(f"FAILED  {result.address} ({result.cause}): {result.log}")
        else:
            report(f"skipped {result.address}: upstream {result.cause} failed")
    failed = [r for r in results if r.status == "failed"]
    if failed:
        raise NodeFailed(failed[0])
    if workspace == "clone":
        report("restoring every stage into the workspace from the run-cache (dvc repro)")
        subprocess.run([*dvc_command(), "--wait-for-lock", "repro"], cwd=root, check=True)
    return results


def _committed_head(root: Path) -> str:
    """The commit clone mode runs; the workspace must hold nothing uncommitted that the stages read."""
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                           capture_output=True, text=True, check=True).stdout.strip()
    if dirty:
        raise ValueError("--workspace clone runs the committed HEAD, but the workspace has uncommitted changes "
                         f"({dirty.splitlines()[0].strip()} …); commit them or use --workspace shared.")
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                          check=True).stdout.strip()
