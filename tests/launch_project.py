"""A DVC project of this pipeline's shape whose "fine-tunes" wait instead of computing, for `layersim launch`
tests and benchmarks/scaleout.py: one download, a matrix of train items that each sleep (so more workers than
cores still run in parallel) and record the CUDA_VISIBLE_DEVICES they saw, one extract per item and a
compare over all of them. Marker files make a node fail, or kill the Ray worker running it, once. With
LAUNCH_RUNS set, each stage appends `<node> <LAUNCH_NODE> start|end` lines to that file (wherever it runs: a
clone, another Ray node), which counts how often each node ran and where; :class:`RayNodes` is a cluster of
several Ray nodes on this host to run it on."""

from __future__ import annotations

import contextlib
import json
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

import fork_server
from dvc_project import REPO, dvc, project_env, repository_params_text, run

WORK = '''"""Stage commands of the launch test project."""
import json, os, sys, time
from pathlib import Path
''' + fork_server.ANCESTORS + '''

step, item = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "")


def mark(event):
    if os.environ.get("LAUNCH_RUNS"):
        with open(os.environ["LAUNCH_RUNS"], "a") as runs:
            runs.write(f"{os.environ['DVC_STAGE']} {os.environ.get('LAUNCH_NODE', '-')} {event}\\n")


mark("start")
Path("logs").mkdir(exist_ok=True)
seconds = float(Path("sleep.txt").read_text())
if step == "download":
    Path("data").mkdir(exist_ok=True)
    Path("data/corpus.txt").write_text("corpus\\n")
elif step == "train":
    if Path(f"fail-{item}").exists():
        sys.exit(f"train {item}: told to fail")
    if Path(f"kill-{item}").exists() and not Path(f"killed-{item}").exists():
        Path(f"killed-{item}").write_text("")
        for parent in ancestors():  # the Ray worker running this node: the one whose command line names it
            if "default_worker" in " ".join(parent.cmdline()) or parent.name().startswith("ray::"):
                parent.kill()
                sys.exit(f"train {item}: killed its Ray worker")
        sys.exit(f"train {item}: no Ray worker above this process")
    start = time.time()
    time.sleep(seconds)
    Path(f"logs/train-{item}.json").write_text(json.dumps(
        {"devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "start": start, "end": time.time()}))
    Path("data/train").mkdir(parents=True, exist_ok=True)
    Path(f"data/train/{item}.txt").write_text(Path("data/corpus.txt").read_text() + f"trained {item}\\n")
elif step == "extract":
    Path("data/extract").mkdir(parents=True, exist_ok=True)
    Path(f"data/extract/{item}.txt").write_text(Path(f"data/train/{item}.txt").read_text().upper())
elif step == "compare":
    Path("data/compare.txt").write_text("".join(sorted(p.read_text() for p in Path("data/extract").glob("*.txt"))))
mark("end")
'''


def make_launch_project(dest: Path, items: list[str], seconds: float) -> dict:
    """The project in `dest` (a committed git repository with DVC initialised); returns its environment."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "work.py").write_text(WORK)
    (dest / "sleep.txt").write_text(f"{seconds}\n")
    (dest / "params.yaml").write_text(repository_params_text())  # `layersim launch` reads its `launch` section
    (dest / ".gitignore").write_text("/data/\n/logs/\n/fail-*\n/kill-*\n/killed-*\n")
    stages = {
        "download": {"cmd": "python work.py download", "deps": ["work.py"], "outs": ["data/corpus.txt"]},
        "finetune": {"matrix": {"name": items}, "cmd": "python work.py train ${item.name}",
                     "deps": ["work.py", "sleep.txt", "data/corpus.txt"], "outs": ["data/train/${item.name}.txt"]},
        "extract": {"matrix": {"name": items}, "cmd": "python work.py extract ${item.name}",
                    "deps": ["work.py", "data/train/${item.name}.txt"], "outs": ["data/extract/${item.name}.txt"]},
        "compare": {"cmd": "python work.py compare",
                    "deps": ["work.py", *[f"data/extract/{item}.txt" for item in items]],
                    "outs": ["data/compare.txt"]},
    }
    (dest / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}, sort_keys=False))
    env = project_env(dest)
    env["PYTHONPATH"] = str(REPO / "src")
    run(["git", "init", "-q", "-b", "main"], dest, env)
    run(dvc("init", "-q"), dest, env)
    run(dvc("config", "core.autostage", "false"), dest, env)
    run(["git", "add", "-A"], dest, env)
    run(["git", "commit", "-qm", "launch test project"], dest, env)
    return env


def parsed_lock(root: Path) -> dict:
    """dvc.lock's stages as a dict (order-free: shared mode writes them in the order nodes finish)."""
    return yaml.safe_load((root / "dvc.lock").read_text())["stages"]


def free_ports(count: int) -> list[int]:
    """Ports nothing listens on now (the OS's choice), so clusters of parallel tests and other users never meet."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for one in sockets:
            one.bind(("127.0.0.1", 0))
        return [one.getsockname()[1] for one in sockets]
    finally:
        for one in sockets:
            one.close()


def ray_command() -> str:
    """Ray's command line next to this interpreter (a venv's own), else the one on PATH."""
    beside = Path(sys.executable).parent / "ray"
    return str(beside) if beside.exists() else (shutil.which("ray") or "ray")


class RayNodes:
    """A Ray cluster of several nodes on this host, as docs/scale-out.md starts one on several machines: a head
    and workers, each `ray start --block` in its own process session with its own CPUs, fake GPUs, ports and
    temp dir, token authentication on with the token in a file every node reads. Each node's processes see
    LAUNCH_NODE=<its name>. `kill(name)` is a host dying (its Ray processes and everything they started);
    `stop()` ends exactly this cluster's processes (never `ray stop`, which ends every Ray on the host)."""

    def __init__(self, env: dict):
        self.base = Path(tempfile.mkdtemp(prefix="lsray-", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
        token = self.base / "token"
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
        self.env = {**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token), "RAY_USAGE_STATS_ENABLED": "0"}
        self.port = free_ports(1)[0]
        self.address = f"127.0.0.1:{self.port}"
        self.nodes: dict[str, subprocess.Popen] = {}

    def start(self, name: str, *, cpus: int = 1, gpus: int = 1) -> None:
        """A node: the first one started is the head."""
        ports = free_ports(6)
        argv = [ray_command(), "start", "--block", "--node-ip-address=127.0.0.1",
                f"--num-cpus={cpus}", f"--num-gpus={gpus}", f"--temp-dir={self.base / name}",
                f"--node-manager-port={ports[0]}", f"--object-manager-port={ports[1]}",
                f"--dashboard-agent-listen-port={ports[2]}", f"--dashboard-agent-grpc-port={ports[3]}",
                f"--metrics-export-port={ports[4]}", f"--runtime-env-agent-port={ports[5]}"]
        if not self.nodes:
            # Notice a dead node within seconds, not Ray's default ~30 s, so its tasks are retried soon.
            config = json.dumps({"health_check_period_ms": 1000, "health_check_failure_threshold": 3,
                                 "health_check_timeout_ms": 1000})
            argv += ["--head", f"--port={self.port}", "--include-dashboard=false", f"--system-config={config}"]
        else:
            argv += [f"--address={self.address}"]
        with open(self.base / f"{name}.log", "w") as log:
            self.nodes[name] = subprocess.Popen(argv, env={**self.env, "LAUNCH_NODE": name}, stdout=log,
                                                stderr=subprocess.STDOUT, start_new_session=True)

    def wait_until_alive(self, count: int, timeout: float = 120.0) -> None:
        """Until the cluster has `count` live nodes (a driver's view, as `layersim launch` connects)."""
        probe = ("import sys, time, ray; ray.init(address=sys.argv[1], log_to_driver=False); end = time.time() + "
                 f"{timeout}\nwhile sum(n['Alive'] for n in ray.nodes()) != {count} and time.time() < end: "
                 "time.sleep(0.5)\nsys.exit(sum(n['Alive'] for n in ray.nodes()) != " f"{count})")
        with tempfile.TemporaryFile("w+") as out:
            driver = subprocess.Popen([sys.executable, "-c", probe, self.address], env=self.env, stdout=out,
                                      stderr=subprocess.STDOUT)
            end = time.monotonic() + timeout + 60
            while driver.poll() is None and time.monotonic() < end and not any(p.poll() for p in self.nodes.values()):
                time.sleep(0.5)  # a node that exited (a bad flag, a refused token) fails now, not after the timeout
            if driver.poll() is None:
                driver.kill()
            if driver.wait() != 0:
                out.seek(0)
                logs = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in self.base.glob("*.log"))
                raise AssertionError(f"the Ray cluster did not reach {count} nodes:\n{out.read()[-3000:]}\n{logs}")

    def kill(self, name: str) -> None:
        """SIGKILL the node's processes and everything they started (its tasks' dvc and stage processes too,
        which live in their own sessions): what a host's death does to them."""
        import psutil

        process = self.nodes.pop(name)
        try:
            tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            tree = []
        for one in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                one.kill()
        psutil.wait_procs(tree, timeout=30)
        process.wait()

    def stop(self) -> None:
        for name in reversed(list(self.nodes)):  # workers first, the head last
            self.kill(name)
        shutil.rmtree(self.base, ignore_errors=True)


def runs(path: Path) -> list[tuple[str, str, str]]:
    """The `<node> <Ray node name> start|end` lines the stages appended to LAUNCH_RUNS."""
    return [tuple(line.split()) for line in path.read_text().splitlines()] if path.exists() else []
