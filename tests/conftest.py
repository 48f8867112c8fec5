"""Shared fixtures: offline model snapshots, made once per test session."""

from __future__ import annotations

import os

# Tests never use the network: the hub is unreachable at once instead of after retries.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# Under xdist each worker gets its share of the cores for torch's and the BLAS libraries' thread pools, and so
# does every stage it runs (the variable reaches them): two workers with a thread per core each spin against
# each other (two tiny pipelines' `dvc repro` side by side: 185 s with two threads each, 58 s with one).
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _WORKERS)))

from collections.abc import Callable
from pathlib import Path

import pytest


# The slowest test modules (measured), first. With `--dist loadfile` a module goes whole to one worker, in
# collection order (pyproject.toml turns off xdist's reordering by test count, which put these last): started
# first, they end close together, and the modules that copy a project another one builds (test_incremental,
# test_sharing: dvc_project.built_project) come after its builder. The two Ray modules, which wait most, start
# apart (the second about when the first ends), so that the spare worker fills one's waits, not both. The others
# keep pytest's order.
SLOWEST_FIRST = ("test_launch.py", "test_dvc_workflows.py", "test_pipeline.py", "test_incremental.py",
                 "test_architecture_pipeline.py", "test_launch_cluster.py", "test_user_task_pipeline.py",
                 "test_sharing.py", "test_fresh_interpreters.py", "test_browser.py", "test_hub_server.py",
                 "test_resume.py", "test_shell_safety.py",
                 "test_align.py", "test_fork_server.py", "test_rotation_null.py", "test_calibration.py")


# Modules whose tests run stage scripts (or DVC) through tests/fork_server.py, besides the integration tests.
FORK_SERVER_USERS = ("test_resume.py", "test_launch.py", "test_bad_params.py", "test_integrity.py", "test_lock.py",
                     "test_recipes.py")


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one worker more than cores where integration tests run. They spend a fifth of their time waiting
    (Ray nodes starting, stages that sleep on purpose, DVC's and git's I/O), which a spare worker fills (full tier on
    2 cores: 8 min 24 s with two workers, 7 min 49 s with three); the fast tier computes throughout. A count the
    user set (PYTEST_XDIST_AUTO_NUM_WORKERS) goes to xdist's own hook."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    cores = len(os.sched_getaffinity(0))
    return cores if "not integration" in (config.option.markexpr or "") else cores + 1


def pytest_collection_modifyitems(items):
    integration = any(item.get_closest_marker("integration") for item in items)
    # Without integration tests (the fast tier) the fork server's users come last: its imports take the first
    # ten seconds or so, and a stage run before it is ready waits for it.
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST) if integration or name not in FORK_SERVER_USERS}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
    if integration or any(item.path.name in FORK_SERVER_USERS for item in items):
        import fork_server  # start importing now, beside the first tests, so that it is ready when needed

        fork_server.SERVER.shim_folder(dict(os.environ))


def pytest_collection_finish(session):
    """What collection imported (torch, transformers, the test modules) is frozen out of the cyclic collector's
    sight: the tests' full collections then scan only what the tests made (the fast tier: 5 % less CPU)."""
    import gc

    gc.collect()
    gc.freeze()


def _run_folder(tmp_path_factory) -> Path:
    """A folder of this test run that every xdist worker shares (each worker's basetemp is inside it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def built_projects(tmp_path_factory) -> Path:
    """Where dvc_project.built_project builds each tiny project once per test run, for every worker."""
    folder = _run_folder(tmp_path_factory) / "built-projects"
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture(scope="session", autouse=True)
def shared_dvc_cache(tmp_path_factory):
    """One DVC cache (and run-cache) for every tiny project the integration tests build, on every worker:
    download and fine-tuning stages that two projects share run once per test run."""
    from dvc_project import SHARED_CACHE

    folder = _run_folder(tmp_path_factory) / "dvc-cache"
    folder.mkdir(exist_ok=True)
    previous = os.environ.get(SHARED_CACHE)
    os.environ[SHARED_CACHE] = str(folder)
    yield folder
    if previous is None:
        os.environ.pop(SHARED_CACHE, None)
    else:
        os.environ[SHARED_CACHE] = previous


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a test module: tiny models and small matrices gain nothing from intra-op
    threads, and on a shared CPU the hand-offs cost milliseconds per op. Restored afterwards."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Callable[[str], Path]:
    """A factory: ``tiny_model_dir("tiny-bert")`` gives the folder of that model's snapshot.

    Any offline model name works ("tiny-bert", "tiny-roberta", "tiny-albert", "tiny-electra",
    "minilm-l6"); each is snapshotted once per session and shared read-only by every test.
    """
    from layersim.models.registry import snapshot_model

    root = tmp_path_factory.mktemp("models")
    cache: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in cache:
            dest = root / name
            snapshot_model(name, dest)
            cache[name] = dest
        return cache[name]

    return get


# Skips CI accepts (LAYERSIM_NO_SILENT_SKIPS=1, set by .ci/run): a skip whose reason matches none of these fails the
# run, so a test that stops running because an import broke (olah, dvc-s3, moto, the browser) is noticed.
ALLOWED_SKIPS = {
    "compare runs in the GPT-2 project only": "one project of three compares models; the others skip that test",
    "could not import 'repsim'": "repsim builds a C++ extension: the oracles extra, not dev (pyproject.toml)",
    "could not import 'dcor'": "dcor needs numba (LLVM): the oracles extra, not dev (pyproject.toml)",
}


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get("LAYERSIM_NO_SILENT_SKIPS") != "1" or hasattr(session.config, "workerinput"):
        return  # only the controller judges, once every worker's reports are in
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    reasons = [str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
               for report in (reporter.stats.get("skipped", []) if reporter else [])]
    unexpected = sorted({reason for reason in reasons if not any(allowed in reason for allowed in ALLOWED_SKIPS)})
    if unexpected:
        reporter.write_line(f"error: {len(unexpected)} skip reason(s) not in tests/conftest.py's ALLOWED_SKIPS: "
                            + "; ".join(unexpected), red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_configure(config):
    """One fork-server log for the run (tests/fork_server.py's FORK_LOG): every xdist worker inherits the variable,
    so the server writes its hash seed and its shims their fresh starts there, for pytest_terminal_summary. Under
    xdist the controller starts the one server every worker's shims use (SHARED_SERVER): it imports the stack while
    the workers collect, once instead of once per worker."""
    import fork_server

    if hasattr(config, "workerinput"):
        return
    if not os.environ.get(fork_server.FORK_LOG):
        import tempfile

        os.environ[fork_server.FORK_LOG] = str(Path(tempfile.mkdtemp(prefix="layersim-fork-log-")) / "fork.log")
    if getattr(config.option, "numprocesses", None) and os.environ.get("LAYERSIM_FORK_SERVER") != "0":
        fork_server.SERVER.shim_folder(dict(os.environ))
        os.environ[fork_server.SHARED_SERVER] = fork_server.SERVER.shared()


def pytest_terminal_summary(terminalreporter, config):
    """The fork servers' hash seeds (to replay a run: PYTHONHASHSEED=<seed>) and every command their shims ran in
    a fresh interpreter instead, counted by reason: a stage that silently stopped running forked shows here."""
    import json
    from collections import Counter

    from fork_server import FORK_LOG

    log = Path(os.environ.get(FORK_LOG, ""))
    if hasattr(config, "workerinput") or not log.is_file():
        return
    entries = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    seeds = [f"{entry['worker'] or 'main'}: {entry['server_hash_seed']}" for entry in entries if "server_hash_seed" in entry]
    reasons = Counter(entry["why"] for entry in entries if "fresh" in entry)
    terminalreporter.write_sep("-", "fork server")
    terminalreporter.write_line(f"hash seeds (PYTHONHASHSEED replays one): {', '.join(seeds) or 'no server started'}")
    terminalreporter.write_line(f"{sum(reasons.values())} command(s) ran in a fresh interpreter ({log})"
                                + "".join(f"\n  {count} x {why}" for why, count in reasons.most_common()))


@pytest.fixture(scope="module")
def extracted(tmp_path_factory) -> Path:
    """Activation tables of orig, seed1 and seed2 (CLS) and the info files of the checkpoints they came from
    (tests/fake_tables.py), once per test module that asks."""
    from fake_tables import write_extracted

    return write_extracted(tmp_path_factory.mktemp("every_measure"))
