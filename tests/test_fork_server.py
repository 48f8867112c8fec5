"""The integration tests' fork server (tests/fork_server.py) runs a stage command as `python` would."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import fork_server

pytestmark = pytest.mark.integration

SCRIPT = """
import os, subprocess, sys
import reported  # from PYTHONPATH
print("argv", sys.argv[1:], "cwd", os.path.basename(os.getcwd()), "var", os.environ.get("STAGE_VAR"), reported.VALUE)
print("stdin", sys.stdin.read().strip())
print("to stderr", file=sys.stderr)
print("child", subprocess.run(["echo", "ok"], capture_output=True, text=True).stdout.strip())
print("forked", "torch" in sys.modules)  # imported before this script asked for it: the server's child
if len(sys.argv) > 2:
    raise ValueError("a failing stage")
sys.exit(int(sys.argv[1]))
"""


STARTED_EARLY: dict[str, object] = {}  # shim_env's first command, started while its server still imported


@pytest.fixture(scope="module")
def shim_env(tmp_path_factory) -> Iterator[dict]:
    folder = tmp_path_factory.mktemp("fork")
    (folder / "lib").mkdir()
    (folder / "lib" / "reported.py").write_text("VALUE = 42\n")
    (folder / "stage.py").write_text(SCRIPT)
    # its own server (the test process's one has the environment of its first user) and log
    server = fork_server.ForkServer(log=folder / "fork.log")
    env = server.environment({**os.environ, "HF_HUB_OFFLINE": "1", "LAYERSIM_FORK_SERVER": "1"})
    env = {**env, "PYTHONPATH": str(folder / "lib"), "STAGE_VAR": "set", "CWD": str(folder),
           "HASH_SEED": str(server.hash_seed), "FORK_LOG": str(server.log)}
    STARTED_EARLY.update(ready_before=os.path.exists(server.socket + ".env"),
                         result=shell("python stage.py 0", env, input=""))
    server.wait_ready(240)
    yield env
    server.stop()


def fresh_starts(env: dict) -> list[dict]:
    """The fresh starts the server's log holds: {"fresh": argv, "why": reason, "cwd": folder}."""
    lines = Path(env["FORK_LOG"]).read_text().splitlines()
    return [entry for entry in map(json.loads, lines) if "fresh" in entry]


def shell(command: str, env: dict, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, shell=True, cwd=env["CWD"], env=env, capture_output=True, text=True, **kwargs)


def test_a_script_sees_its_arguments_folder_environment_and_streams(shim_env):
    result = shell("python stage.py 3", shim_env, input="hello\n")
    assert result.returncode == 3, result.stderr
    assert result.stdout.splitlines() == ["argv ['3'] cwd " + Path(shim_env["CWD"]).name + " var set 42",
                                          "stdin hello", "child ok", "forked True"]
    assert result.stderr == "to stderr\n"


def test_a_command_started_while_the_server_imports_waits_and_runs_forked(shim_env):
    result = STARTED_EARLY["result"]
    assert STARTED_EARLY["ready_before"] is False  # the server had not finished importing when it started
    assert result.returncode == 0 and result.stdout.splitlines()[-1] == "forked True", result.stdout + result.stderr


def test_a_shim_whose_server_died_while_importing_runs_a_fresh_interpreter(tmp_path):
    server = fork_server.ForkServer(log=tmp_path / "fork.log")
    env = server.environment({**os.environ, "LAYERSIM_FORK_SERVER": "1"})
    server.process.kill()  # before its imports end
    server.process.wait()
    (tmp_path / "probe.py").write_text("import sys\nprint('torch' in sys.modules)\n")
    try:
        result = subprocess.run(["python", "probe.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                                timeout=60)
    finally:
        server.stop()
    assert result.stdout.strip() == "False", result.stderr
    assert [entry["why"] for entry in map(json.loads, (tmp_path / "fork.log").read_text().splitlines())
            if "fresh" in entry] == ["the server is gone"]


def test_pythonbreakpoint_is_read_by_the_child_at_each_breakpoint(shim_env):
    """Ray sets PYTHONBREAKPOINT in its workers: a command with another value keeps the fork, and the child's
    breakpoint() calls the hook that value names, as in a fresh interpreter."""
    (Path(shim_env["CWD"]) / "hook.py").write_text(
        "import sys\nbreakpoint('hooked')\nprint('forked', 'torch' in sys.modules)\n")
    result = shell("python hook.py", {**shim_env, "PYTHONBREAKPOINT": "builtins.print"}, input="")
    assert result.stdout.splitlines() == ["hooked", "forked True"], result.stdout + result.stderr


def test_the_preloaded_objects_are_frozen_and_a_stage_s_own_cycles_are_collected(shim_env):
    """The server froze its imports' objects (gc.freeze, so a child's collections do not copy its heap); a cycle
    the stage makes is still collected, its finalizer run, as in a fresh interpreter."""
    (Path(shim_env["CWD"]) / "cycle.py").write_text(
        "import gc, sys, weakref\nclass Node:\n    pass\n"
        "a, b = Node(), Node()\na.other, b.other = b, a\nweakref.finalize(a, print, 'collected')\ndel a, b\n"
        "print('frozen', gc.get_freeze_count() > 100_000)\ngc.collect()\nprint('forked', 'torch' in sys.modules)\n")
    result = shell("python cycle.py", shim_env, input="")
    assert result.stdout.splitlines() == ["frozen True", "collected", "forked True"], result.stdout + result.stderr


def test_an_uncaught_exception_prints_its_traceback_and_exits_1(shim_env):
    result = shell("python stage.py 0 fail", shim_env, input="")
    assert result.returncode == 1
    assert "ValueError: a failing stage" in result.stderr and "Traceback" in result.stderr


@pytest.mark.parametrize("name, value", [
    ("HF_HUB_OFFLINE", "0"),  # a prefix the server compares whatever its imports looked up
    ("MPLCONFIGDIR", "{cwd}"),  # matplotlib reads these at import: the server saw its imports look them up
    ("TMPDIR", "{cwd}"),
    ("HOME", "{cwd}"),
    ("SKLEARN_ASSUME_FINITE", "1"),
    ("PYTHONWARNINGS", "error"),  # the interpreter reads it at start
    ("PYTHONHASHSEED", "other")])  # a seed other than the server's: only a fresh interpreter has it
def test_a_different_import_time_variable_gets_a_fresh_interpreter_and_a_log_line(shim_env, name, value):
    value = str(int(shim_env["HASH_SEED"]) % 1000 + 1) if value == "other" else value.format(cwd=shim_env["CWD"])
    result = shell("python stage.py 0", {**shim_env, name: value}, input="")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "forked False"
    assert fresh_starts(shim_env)[-1]["why"] == f"import-time variables differ: {name}"


@pytest.mark.parametrize("hash_seed", ["random", "server's"])
def test_a_hash_seed_the_server_has_keeps_the_fork(shim_env, hash_seed):
    """`random` (or none) asks for any seed, the server's included."""
    seed = shim_env["HASH_SEED"] if hash_seed == "server's" else hash_seed
    result = shell("python stage.py 0", {**shim_env, "PYTHONHASHSEED": seed}, input="")
    assert result.stdout.splitlines()[-1] == "forked True", result.stdout + result.stderr


HASHES = "import sys; print('torch' in sys.modules, hash('layersim'), hash(('a', 'b')))"


def test_a_child_hashes_with_the_server_s_logged_seed(shim_env):
    """A fork keeps its server's hash secret: the seed the log names, so a fresh interpreter replays it."""
    (Path(shim_env["CWD"]) / "hashes.py").write_text(HASHES)
    forked = shell("python hashes.py", shim_env)
    logged = [json.loads(line) for line in Path(shim_env["FORK_LOG"]).read_text().splitlines()][0]
    replayed = subprocess.run([sys.executable, "-c", HASHES], capture_output=True, text=True,
                              env={**shim_env, "PYTHONHASHSEED": str(logged["server_hash_seed"])})
    assert forked.stdout.split()[0] == "True" and replayed.stdout.split()[0] == "False"
    assert forked.stdout.split()[1:] == replayed.stdout.split()[1:]


DRAWS = """
import random, sys
import numpy, torch
print("torch" in sys.modules, random.random(), numpy.random.random(), torch.rand(1).item())
"""


def test_each_child_draws_from_fresh_global_random_states(shim_env):
    """Unseeded draws differ from child to child, as from one fresh interpreter to the next: a stage that forgot
    to seed an RNG gives different outputs on every run, in the tests too."""
    (Path(shim_env["CWD"]) / "draws.py").write_text(DRAWS)
    first, second = (shell("python draws.py", shim_env).stdout.split() for _ in range(2))
    assert first[0] == second[0] == "True", (first, second)
    assert all(a != b for a, b in zip(first[1:], second[1:])), (first, second)


THREADS = """
import sys
forked = "torch" in sys.modules
import numpy, scipy.linalg, torch
from threadpoolctl import threadpool_info
print(forked, torch.get_num_threads(), sorted({pool["num_threads"] for pool in threadpool_info()}))
"""


@pytest.mark.parametrize("threads", ["1", None])
def test_a_thread_count_is_set_in_the_child_as_a_fresh_interpreter_would(shim_env, threads):
    """Ray gives each task OMP_NUM_THREADS=1: the child still runs forked, with torch's and every BLAS/OpenMP
    pool at that count; without the variable, at the default a fresh interpreter starts with."""
    (Path(shim_env["CWD"]) / "threads.py").write_text(THREADS)
    env = {key: value for key, value in shim_env.items() if key not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    if threads:
        env["OMP_NUM_THREADS"] = threads
    fresh = subprocess.run([sys.executable, "threads.py"], cwd=env["CWD"], env=env, capture_output=True, text=True)
    forked = shell("python threads.py", env)
    assert forked.returncode == 0, forked.stderr
    assert fresh.stdout.startswith("False ") and forked.stdout.startswith("True "), (fresh.stdout, forked.stdout)
    assert forked.stdout.split(" ", 1)[1] == fresh.stdout.split(" ", 1)[1]


def test_a_forked_stage_finds_its_ancestors_from_the_shim(shim_env):
    """A script that looks for the process running it (launch tests kill the Ray worker above a stage) sees
    the same parents as in a fresh interpreter: the shim's, not the server's."""
    (Path(shim_env["CWD"]) / "parents.py").write_text(fork_server.ANCESTORS + "\nimport os, sys\n"
                                                     "print('torch' in sys.modules, ancestors()[0].pid, os.getppid())")
    for server, forked in (("1", "True"), ("0", "False")):
        result = subprocess.run(["python", "parents.py"], cwd=shim_env["CWD"], capture_output=True, text=True,
                                env={**shim_env, "LAYERSIM_FORK_SERVER": server})
        was_forked, parent, direct_parent = result.stdout.split()
        assert was_forked == forked and int(parent) == os.getpid(), result.stdout + result.stderr
        assert (int(direct_parent) == os.getpid()) == (server == "0")  # a forked child's own parent is the server


def test_other_command_lines_get_the_real_interpreter_and_a_log_line(shim_env):
    result = shell("python -c 'import sys; print(sys.argv[1:], \"torch\" in sys.modules)' a", shim_env)
    assert result.stdout == "['a'] False\n"
    assert fresh_starts(shim_env)[-1] == {"fresh": ["-c", 'import sys; print(sys.argv[1:], "torch" in sys.modules)',
                                                    "a"], "why": "not `python <script>` or `python -m <module>`",
                                          "cwd": shim_env["CWD"]}


def test_a_module_runs_as_with_python_m(shim_env):
    result = shell("python -m json.tool", shim_env, input='{"a": 1}')
    assert result.returncode == 0 and result.stdout.split() == ["{", '"a":', "1", "}"]


def test_a_stage_killed_by_a_signal_reads_as_killed_by_it(shim_env, tmp_path):
    (tmp_path / "suicide.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    result = subprocess.run(["python", "suicide.py"], cwd=tmp_path, env=shim_env, capture_output=True)
    assert result.returncode == -signal.SIGKILL


def test_killing_the_command_kills_the_forked_stage(shim_env, tmp_path):
    (tmp_path / "sleeper.py").write_text("import os, time\nopen('pid', 'w').write(str(os.getpid()))\ntime.sleep(300)\n")
    shim = subprocess.Popen(["python", "sleeper.py"], cwd=tmp_path, env=shim_env)
    deadline = time.monotonic() + 60
    while not (tmp_path / "pid").exists() or not (tmp_path / "pid").read_text():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    stage = int((tmp_path / "pid").read_text())
    assert stage != shim.pid  # a forked child, not the shim itself
    shim.send_signal(signal.SIGKILL)
    shim.wait()
    deadline = time.monotonic() + 30
    while _alive(stage):
        assert time.monotonic() < deadline, "the forked stage outlived its command"
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as file:
            return file.read().split()[2] != "Z"
    except FileNotFoundError:
        return False

