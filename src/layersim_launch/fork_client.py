"""The client side of layersim_launch.fork_server: :class:`ForkServer` starts a server and writes the `python` shim
that hands it the commands (:data:`SHIM`), and the test process's server (:data:`SERVER`) with its helpers. What a
forked child differs in from a fresh interpreter, and when a command runs afresh instead, is in fork_server's
docstring."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from layersim_launch import fork_server
from layersim_launch.fork_server import (FORK_LOG, FORKED, IMPORT_TIME_PREFIXES, PER_COMMAND, READY_SECONDS,
                                         SHARED_SERVER)

SHIM = '''#!{python} -S
# `python` for stage commands: runs them in a fork of layersim_launch/fork_server.py's server.
import json, os, signal, socket, struct, sys, time
REAL, SOCKET, LOG, PREFIXES, PER_COMMAND = {python!r}, {socket!r}, {log!r}, {prefixes!r}, {per_command!r}
SERVER_PID, READY_SECONDS = {server_pid!r}, {ready_seconds!r}
args = sys.argv[1:]

def fresh(why):
    with open(LOG, "a") as log:  # every fresh start, with its reason: tests/conftest.py counts them after the run
        log.write(json.dumps({{"fresh": args, "why": why, "cwd": os.getcwd()}}) + "\\n")
    os.execv(REAL, [REAL] + args)

plain = bool(args) and (args[0] == "-m" and len(args) > 1 or not args[0].startswith("-"))
if not plain:
    fresh("not `python <script>` or `python -m <module>`")
if os.environ.get("LAYERSIM_FORK_SERVER") == "0":
    fresh("LAYERSIM_FORK_SERVER=0")
# While the server imports (its first seconds), wait for it: a fresh interpreter would spend as long importing the
# same stack, beside the server's own imports on the same cores.
deadline = time.monotonic() + READY_SECONDS
while True:
    try:
        with open(SOCKET + ".env") as file:
            server = json.load(file)
        break
    except OSError:
        pass
    try:
        with open(f"/proc/{{SERVER_PID}}/stat") as stat:
            alive = stat.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        alive = False
    if not alive:
        fresh("the server is gone")
    if time.monotonic() > deadline:
        fresh(f"the server was still importing after {{READY_SECONDS}} s")
    time.sleep(0.1)
names = set(server["compared"]) | {{k for k in os.environ if k.startswith(PREFIXES)}}
differ = sorted(k for k in names - set(server["set_by_imports"]) - set(PER_COMMAND)
                if os.environ.get(k) != server["compared"].get(k))
# unset or "random" asks for any hash seed, the server's included; a number asks for that one
if os.environ.get("PYTHONHASHSEED", "random") not in ("random", "", str(server["hash_seed"])):
    differ.append("PYTHONHASHSEED")
if differ:
    fresh("import-time variables differ: " + " ".join(differ))
connection = socket.socket(socket.AF_UNIX)
try:
    connection.connect(SOCKET)
except OSError:
    fresh("the server refused the connection")
request = json.dumps({{"argv": args, "cwd": os.getcwd(), "env": dict(os.environ)}}).encode()
socket.send_fds(connection, [struct.pack("!Q", len(request))], [0, 1, 2])
connection.sendall(request)
reader = connection.makefile("r")
child = int(reader.readline() or 0)
if child:
    def forward(signum, frame):
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, forward)
status = reader.readline()
if not status:
    sys.exit(1)  # the server went away
code = int(status)
if code < 0:  # die as the child did
    if -code not in (signal.SIGKILL, signal.SIGSTOP):
        signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
sys.exit(code)
'''


def _hash_seed(environ: dict) -> int:
    """The starting process's PYTHONHASHSEED where it set one (to replay a run), else a fresh one for this run."""
    seed = environ.get("PYTHONHASHSEED", "")
    if seed.isdigit():
        return int(seed)
    import random

    return random.SystemRandom().randrange(1, 2 ** 32)  # 0 would turn hash randomization off


def _alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, exited but not yet reaped, does not), as the shim judges its server."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False


class ForkServer:
    """A server started on first use and stopped at exit; or, with `adopt`, the one SHARED_SERVER names (started
    by pytest-xdist's controller for all its workers: one import of the stack per run instead of one per worker)."""

    def __init__(self, log: Path | None = None, adopt: bool = False) -> None:
        self.folder: Path | None = None  # made when the server starts
        self.process: subprocess.Popen | None = None  # None for an adopted server: another process owns it
        self.log = log  # FORK_LOG's file; unset: the starting process's FORK_LOG, else one in the server's folder
        self.hash_seed: int | None = None  # the server's, and so every child's, PYTHONHASHSEED
        self.pid: int | None = None
        self.adopt = adopt

    def shared(self) -> str:
        """SHARED_SERVER's value for this (started) server."""
        return json.dumps({"folder": str(self.folder), "pid": self.pid, "hash_seed": self.hash_seed})

    @property
    def socket(self) -> str:
        return str(self.folder / "server.sock")

    def shim_folder(self, environ: dict) -> str:
        """Start the server (in the background: until it is ready, a shim waits for it) with the
        import-time variables of `environ`, and return the folder of the `python` shim."""
        if self.folder is None and self.adopt and os.environ.get(SHARED_SERVER):
            shared = json.loads(os.environ[SHARED_SERVER])
            self.folder, self.pid, self.hash_seed = Path(shared["folder"]), shared["pid"], shared["hash_seed"]
        if self.folder is None:
            self.folder = Path(tempfile.mkdtemp(prefix="layersim-fork-"))
            self.log = Path(self.log or os.environ.get(FORK_LOG) or self.folder / "fork.log")
            self.hash_seed = _hash_seed(environ)
            with open(self.log, "a") as log:
                log.write(json.dumps({"server_hash_seed": self.hash_seed,
                                      "worker": os.environ.get("PYTEST_XDIST_WORKER", "")}) + "\n")
            env = {key: value for key, value in environ.items() if key != "PYTHONPATH"}
            env["PYTHONHASHSEED"] = str(self.hash_seed)
            self.process = subprocess.Popen([sys.executable, fork_server.__file__, self.socket, str(self.log)], env=env,
                                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL, start_new_session=True)
            self.pid = self.process.pid
            shim = self.folder / "bin" / "python"
            shim.parent.mkdir()
            shim.write_text(SHIM.format(python=sys.executable, socket=self.socket, log=str(self.log),
                                        prefixes=IMPORT_TIME_PREFIXES, per_command=PER_COMMAND,
                                        server_pid=self.pid, ready_seconds=READY_SECONDS))
            shim.chmod(0o755)
            import atexit
            atexit.register(self.stop)
        return str(self.folder / "bin")

    def environment(self, environ: dict) -> dict:
        """`environ` with this server's `python` first on PATH (unless LAYERSIM_FORK_SERVER=0)."""
        if environ.get("LAYERSIM_FORK_SERVER") == "0":
            return environ
        return {**environ, "PATH": self.shim_folder(environ) + os.pathsep + environ.get("PATH", "")}

    def wait_ready(self, timeout: float) -> None:
        import time

        deadline = time.monotonic() + timeout
        while not os.path.exists(self.socket + ".env"):
            if not _alive(self.pid):  # its own or, adopted, the controller's
                raise RuntimeError(f"the fork server (pid {self.pid}) is gone")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the fork server was not ready in {timeout} s")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            import shutil
            shutil.rmtree(self.folder, ignore_errors=True)
            self.process = None


SERVER = ForkServer(adopt=True)


# The process-tree lookup for a script run as a stage: pasted into such scripts (they cannot import tests/).
ANCESTORS = f'''
def ancestors():
    """This process's parents, as in a fresh interpreter: a child of this server starts from its shim."""
    import os, psutil
    child, _, shim = os.environ.get({FORKED!r}, "").partition(":")
    return psutil.Process(int(shim) if child == str(os.getpid()) else None).parents()
'''


def python() -> str:
    """The interpreter for a command run with dvc_project.project_env's environment: the shim once the test
    process's server is started (it runs the real interpreter itself when it must), else this one."""
    if SERVER.folder is None or os.environ.get("LAYERSIM_FORK_SERVER") == "0":
        return sys.executable
    return str(SERVER.folder / "bin" / "python")


def environment(environ: dict) -> dict:
    """`environ` with the test process's fork server's `python` first on PATH."""
    return SERVER.environment(environ)
