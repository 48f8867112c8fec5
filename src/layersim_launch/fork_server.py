"""A fork server: stage processes without the import bill, for the run scripts and the integration tests.

Every DVC stage is its own `python stages/<stage>.py` process, and a stage spends seconds of CPU importing torch,
transformers and scipy before its first line of work (about 6 s of one core per model stage on a 2-core machine of
~90 GFLOP/s: about 100 s over the quickstart's 20 stage runs; the integration tier starts ~170 of them). Here one
server process imports that third-party stack once and forks a child per stage command: the child takes the
command's stdin/stdout/stderr, working directory, environment and arguments, and runs the script as `python` would.
`dvc repro` and `dvc exp run` stay real: DVC runs each stage's `python ...` through the shell, and a `python` shim
first on PATH hands the command to the server. tools/exp_run.py (quickstart.sh, smallest.sh) starts one for its
`dvc exp run` (layersim_launch.fork_client.ForkServer); the integration tests one per test run (tests/fork_server.py: under xdist,
started by its controller), whose own `python -m dvc` commands (tests/dvc_project.py) go through the shim too.

What the child differs in from a fresh interpreter, and why that is safe for the stages:
- the third-party modules are imported already (never `layersim`: each project copy has its own on
  PYTHONPATH, which the child puts on sys.path as a fresh interpreter would; and code edited while a run goes on is
  read as a fresh stage would read it);
- variables read at import time are the server's: every one that the preloaded modules looked up by name
  while the server imported them (HF_*, HOME, TMPDIR, MPLCONFIGDIR, LANG, SKLEARN_*, ...: recorded then), and
  every HF_*, TORCH*, OMP_*, ... (C code reads these, unseen by the recording). The shim only uses the server when
  the command's values equal the server's, and runs the real interpreter otherwise (a test with a hub endpoint
  of its own, say), as it does for any command that is not `python <script>` or `python -m <module>`. While the
  server is still importing, a shim waits for it (up to READY_SECONDS). Every fresh start is logged with its
  reason (FORK_LOG; tests/conftest.py prints the counts after the run), and every forked command with its wall-clock
  and CPU seconds (a forked stage keeps the server's command line, so a tool that tells stages apart by it reads
  these instead). Kinds a child honours itself: torch's thread count from OMP_NUM_THREADS / MKL_NUM_THREADS (Ray
  sets it for each task), CUDA_VISIBLE_DEVICES, and those read when used (READ_WHEN_USED: PYTHONBREAKPOINT, the
  terminal size);
- the hash secret is the server's: a fork cannot change it. The server starts with a PYTHONHASHSEED drawn at
  random for each run (or the one the starting process has), logged in FORK_LOG, so string-set order still
  differs from run to run, a failure can be replayed (PYTHONHASHSEED=<seed> python -m pytest ...), and a test
  can run a stage afresh under another seed (a command with another PYTHONHASHSEED gets a fresh interpreter);
- the global RNGs (random, numpy's legacy one, torch's) are reseeded from the OS in each child, as a fresh
  interpreter seeds them: no stage starts from the state the server's imports left;
- interpreter shutdown is cut short (non-daemon threads and atexit handlers run, then os._exit): a crash in
  module teardown goes unseen here (tests/test_fresh_interpreters.py runs stages afresh for that);
- the preloaded objects are frozen (gc.freeze): the cyclic collector never traverses them, so a child's
  collections scan only what the stage made (and do not copy the server's pages); nothing a stage creates is
  exempt.
What a stage computes is the same either way (tests/test_fork_server.py; the quickstart's outputs, by dvc.lock's
hashes). Killing the shim kills its child (the child watches the shim's socket), so a test that kills a stage or a
whole `dvc repro` sees the stage die. Set LAYERSIM_FORK_SERVER=0 to run every stage in a fresh process.
"""

from __future__ import annotations

import json
import os
import socket
import sys

# Environment variables that libraries read when imported, besides those the server sees its imports look up (C
# code's getenv, which the recording misses, or a variable the server's environment lacks): a command whose values
# differ from the server's runs in a fresh interpreter; PYTHON*, LANG and LC_* the interpreter itself reads at
# start (warnings, bytecode, stdio encoding). (Not TOKENIZERS_PARALLELISM: read when first used, and layersim.cli
# sets it in whichever test process runs a stage in-process.)
IMPORT_TIME_PREFIXES = ("HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TORCH", "PYTORCH_", "CUDA_", "OMP_", "MKL_",
                        "OPENBLAS_", "NUMEXPR_", "MPLBACKEND", "DATASETS_", "KMP_", "PYTHON", "LANG", "LC_")
# Exceptions a child can honour itself: torch's thread count (what Ray sets for each task: a child calls
# torch.set_num_threads, as torch does at start from these), and the GPUs a process may see (read when CUDA
# starts, which the server never does).
CHILD_SETS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES")
# Read when used, from the child's own environment, not at start: sys.breakpointhook looks PYTHONBREAKPOINT up at
# each breakpoint() (Ray sets it in every worker, so without this every stage a Ray node ran started afresh), and
# shutil.get_terminal_size COLUMNS and LINES at each call (xdist's workers have them, its controller not; the one
# preloaded module that keeps the size from import time is accelerate's interactive `accelerate config` menu).
READ_WHEN_USED = ("PYTHONBREAKPOINT", "COLUMNS", "LINES")
# Never compared: what differs from command to command and a child takes from its own command (where it runs,
# its path, its streams' buffering), and PYTHONHASHSEED, which the shim judges by itself (see SHIM).
PER_COMMAND = ("PATH", "PWD", "OLDPWD", "SHLVL", "_", "PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONHASHSEED", *CHILD_SETS,
               *READ_WHEN_USED)
READY_SECONDS = 120.0  # how long a shim waits for the server's imports (they take 10–30 s) before running fresh
FORK_LOG = "LAYERSIM_FORK_LOG"  # a file: one JSON line per server started (its hash seed) and per fresh start
SHARED_SERVER = "LAYERSIM_FORK_SERVER_SHARED"  # JSON {folder, pid, hash_seed}: the xdist controller's server
FORKED = "LAYERSIM_FORKED"  # "<child pid>:<shim pid>" in a forked child's environment (see ancestors())
# The families of the tiny models the tests build (layersim.models.tiny_configs): transformers imports a
# family's modules when a model of it is first loaded.
FAMILIES = ("albert", "bert", "deberta_v2", "distilbert", "electra", "gpt2", "llama", "mistral", "modernbert",
            "qwen2", "roberta", "xlm_roberta", "xlnet")
# What the stages and DVC import besides layersim: the modules a stage's child imported that the server had
# not (LAYERSIM_FORK_MODULES=<file> lists them), grouped by package.
PRELOAD = ("torch", "torch._dynamo", "torch.utils.flop_counter", "transformers", "transformers.modeling_utils",
           "transformers.models.auto.modeling_auto", "transformers.models.auto.tokenization_auto",
           *(f"transformers.models.{family}.modeling_{family}" for family in FAMILIES), "tokenizers",
           "scipy.stats", "scipy.linalg", "sklearn.linear_model", "pandas", "pyarrow", "pyarrow.parquet",
           "matplotlib", "matplotlib.pyplot", "matplotlib.backends.backend_agg", "PIL.Image", "safetensors.torch",
           "huggingface_hub.serialization", "datasets", "dvclive", "yaml", "tqdm", "tqdm.contrib.logging",
           "filelock", "numpy", "cProfile", "peft", "transformers.models.bert.tokenization_bert_fast",
           "PIL.PngImagePlugin", "PIL.JpegImagePlugin", "PIL.GifImagePlugin", "PIL.BmpImagePlugin",
           "PIL.PpmImagePlugin",
           # `python -m dvc` (dvc_project.dvc runs DVC through the server too)
           "dvc.cli", "dvc.cli.parser", "dvc.repo", "dvc.repo.reproduce", "dvc.repo.fetch", "dvc.repo.plots",
           "dvc.repo.index", "dvc.repo.experiments", "dvc.repo.metrics.show", "dvc.repo.params.show", "dvc.lock",
           "dvc.render.converter.vega", "dvc.stage", "dvc.stage.cache", "dvc.fs", "dvc.scm", "dvc_http",
           "dvc_data.index", "dvc_data.fs", "scmrepo.git", "scmrepo.git.backend.pygit2", "pygit2", "dulwich.worktree",
           "flufl.lock", "zc.lockfile", "networkx", "dvc_render")


def compared_env(environ, read_at_import) -> dict:
    """The variables a command must share with the server to run forked: {name: value, or None where unset}."""
    names = {key for key in environ if key.startswith(IMPORT_TIME_PREFIXES)} | set(read_at_import)
    return {name: environ.get(name) for name in sorted(names - set(PER_COMMAND))}


def _names_looked_up(action) -> set[str]:
    """The environment variables that `action()` looks up by name (os.environ[...], .get, `in`, os.getenv).
    Copies of the whole environment (dict(os.environ), .copy(), .items()) look up no name: skipped, else every
    variable the test process has (PYTEST_CURRENT_TEST, say) would have to match."""
    from _collections_abc import ItemsView, ValuesView

    environ_type = type(os.environ)
    getitem, keys = environ_type.__getitem__, environ_type.keys
    copying = {ItemsView.__iter__.__code__, ValuesView.__iter__.__code__, environ_type.copy.__code__}
    names: set[str] = set()
    copy_order: list[str] = []  # dict(os.environ) calls keys(), then reads each key in that order

    def recording_keys(self):
        copy_order[:] = reversed(list(self))
        return keys(self)

    def recording_getitem(self, key):
        if copy_order and copy_order[-1] == key:
            copy_order.pop()
        elif sys._getframe(1).f_code not in copying:
            copy_order.clear()
            names.add(key)
        return getitem(self, key)

    environ_type.__getitem__, environ_type.keys = recording_getitem, recording_keys
    try:
        action()
    finally:
        environ_type.__getitem__, environ_type.keys = getitem, keys
    return names


def _serve_forever(listener: socket.socket) -> None:
    import signal

    shims: dict[int, socket.socket] = {}  # child → its shim's connection, kept to report a death by a signal

    def reap(signum, frame) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            connection = shims.pop(pid, None)
            if connection is not None:
                if os.WIFSIGNALED(status):  # the child could not say so itself
                    try:
                        connection.sendall(f"{-os.WTERMSIG(status)}\n".encode())
                    except OSError:
                        pass
                connection.close()

    signal.signal(signal.SIGCHLD, reap)
    starter = os.getppid()
    listener.settimeout(2.0)
    while True:
        try:
            connection, _ = listener.accept()
        except TimeoutError:
            if os.getppid() != starter:  # the process that started it is gone (killed, say): so is the server
                os._exit(0)
            continue
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})  # reap only children already in `shims`
        pid = os.fork()
        if pid == 0:
            listener.close()
            for other in shims.values():
                other.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the stage's own subprocess calls wait for theirs
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
            _run_child(connection)  # never returns
        shims[pid] = connection
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})


def _set_threads(environ) -> None:
    """The thread pools (torch's, OpenMP's, the BLAS libraries numpy and scipy load) as a fresh interpreter
    would start them under `environ`; the server itself started without OMP_NUM_THREADS / MKL_NUM_THREADS,
    so one thread per core is already every pool's default."""
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        value = environ.get(key, "")
        if value.isdigit() and int(value) > 0:
            import torch
            from threadpoolctl import threadpool_limits

            torch.set_num_threads(int(value))
            threadpool_limits(limits=int(value))
            return


def _reseed_global_rngs() -> None:
    """Seed the global RNGs from the OS, as a fresh interpreter does: else every child starts from the state the
    server's imports left, and a stage that draws unseeded numbers gives the same ones in every test."""
    import random

    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    if "torch" in sys.modules:
        sys.modules["torch"].seed()


def _run_child(connection: socket.socket) -> None:
    import time

    started = time.monotonic()
    import atexit
    import io
    import runpy
    import signal
    import struct
    import threading
    import traceback

    try:
        header, fds, _, _ = socket.recv_fds(connection, 8, 3)
        size, = struct.unpack("!Q", header)
        payload = b""
        while len(payload) < size:
            chunk = connection.recv(size - len(payload))
            if not chunk:
                raise EOFError("the shim went away")
            payload += chunk
        request = json.loads(payload)
        for target, fd in zip((0, 1, 2), fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        _set_threads(os.environ)
        _reseed_global_rngs()
        # The shim stands where this process would in a real process tree (its parents are the stage's): a
        # test that looks up the stage's ancestors (the Ray worker running it) starts from there.
        shim, _, _ = struct.unpack("3i", connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                               struct.calcsize("3i")))
        os.environ[FORKED] = f"{os.getpid()}:{shim}"
        unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8",
                                      line_buffering=os.isatty(1), write_through=unbuffered)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                      errors="backslashreplace", line_buffering=True)
        os.setsid()  # a group of its own: the watcher below takes down what the stage started, too
        connection.sendall(f"{os.getpid()}\n".encode())
    except BaseException:
        os._exit(70)

    def watch_the_shim() -> None:  # the shim is gone (killed): so is this stage and what it started
        try:
            while connection.recv(1):
                pass
        except OSError:
            pass
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch_the_shim, daemon=True).start()

    argv = request["argv"]
    pythonpath = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    code = 0
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path[:] = [os.getcwd(), *pythonpath, *BASE_PATH]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path[:] = [os.path.dirname(os.path.abspath(argv[0])), *pythonpath, *BASE_PATH]
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exit_:
        if exit_.code is None:
            code = 0
        elif isinstance(exit_.code, int):
            code = exit_.code
        else:
            print(exit_.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        code = 130
    except BaseException:
        traceback.print_exc()
        code = 1
    if os.environ.get("LAYERSIM_FORK_MODULES"):  # what a stage imported that the server had not: PRELOAD's list
        with open(os.environ["LAYERSIM_FORK_MODULES"], "a") as file:
            file.writelines(f"{name}\n" for name in sorted(set(sys.modules) - PRELOADED)
                            if not name.startswith(("layersim", "__main__")))
    try:
        threading._shutdown()  # as the interpreter does at exit: wait for non-daemon threads
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            if not stream.closed:  # a script may close its stdout (json.tool does)
                stream.flush()
    except BaseException:
        traceback.print_exc()
        code = code or 1
    _log_forked(argv, started)
    try:
        connection.sendall(f"{code}\n".encode())
    finally:
        os._exit(code & 0xFF)


def _log_forked(argv: list[str], started: float) -> None:
    """The command's wall-clock and CPU seconds (its own and its waited-for children's) in FORK_LOG's file."""
    import resource
    import time

    if not LOG[0]:
        return
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    try:
        with open(LOG[0], "a") as log:
            log.write(json.dumps({"forked": argv[:2] if argv[0] == "-m" else argv[:1],
                                  "stage": os.environ.get("DVC_STAGE", ""),  # set when DVC runs it
                                  "wall": round(time.monotonic() - started, 3),
                                  "cpu": round(sum(u.ru_utime + u.ru_stime for u in usage), 3)}) + "\n")
    except OSError:
        pass


BASE_PATH: list[str] = []
PRELOADED: set[str] = set()
LOG: list[str] = [""]  # FORK_LOG's file, where each child logs its seconds


def serve(socket_path: str, log: str = "") -> None:
    """The server's main: import the stack, then listen at `socket_path` and fork a child per request; each child
    appends its seconds to `log` (FORK_LOG's file)."""
    LOG[0] = log
    import gc
    import importlib
    import warnings

    BASE_PATH[:] = [entry for entry in sys.path[1:] if entry not in os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    for key in CHILD_SETS:  # the children set these themselves (_set_threads)
        os.environ.pop(key, None)
    before_imports = dict(os.environ)  # an import may set variables of its own
    filters = list(warnings.filters)

    def preload() -> None:
        for name in PRELOAD:
            try:
                importlib.import_module(name)
            except Exception:  # an optional dependency missing: its stages import it themselves
                pass

    read_at_import = _names_looked_up(preload)
    warnings.filters[:] = filters
    PRELOADED.update(sys.modules)
    assert "layersim" not in sys.modules, "the server must not import layersim: each project has its own"
    # The preloaded objects go to the collector's permanent generation (what gc.freeze is for, before forking):
    # a child's full collection would otherwise traverse them all, writing to their headers, and copy every page
    # of the server's heap (test_pipeline's stages: 18 % more CPU, twice the page faults). Nothing they hold is
    # garbage a stage could see collected.
    gc.collect()
    gc.freeze()
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(socket_path)
    listener.listen(64)
    marker = socket_path + ".env"
    with open(marker + ".tmp", "w") as file:
        # and the variables the imports set themselves (torch: TORCHINDUCTOR_CACHE_DIR), never compared: a test
        # process that has made the same imports has them too, and a fresh stage would set them alike
        json.dump({"compared": compared_env(before_imports, read_at_import),
                   "set_by_imports": sorted(key for key in os.environ if key not in before_imports),
                   "hash_seed": int(os.environ["PYTHONHASHSEED"])}, file)
    os.replace(marker + ".tmp", marker)  # the shims use the server from now on
    _serve_forever(listener)


if __name__ == "__main__":
    serve(*sys.argv[1:3])
