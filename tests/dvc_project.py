"""Helpers for integration tests that run the real DVC pipeline in a temporary git repository.

``make_project(dest, configure)`` copies this repository (its git-tracked and not-ignored files) into
``dest``, lets ``configure`` edit the parsed params.yaml, and commits the copy to a fresh git repo.
``run`` and ``dvc`` run commands with their output captured and shown when they fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import fork_server
import yaml

REPO = Path(__file__).resolve().parents[1]
# Environment variable naming a DVC cache folder that every project of a test run shares: a stage that
# another project already ran with the same command, deps and params is restored from DVC's run-cache.
SHARED_CACHE = "LAYERSIM_TEST_DVC_CACHE"


def run(cmd: list[str], cwd: Path, env: dict, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``cmd`` in ``cwd``; on failure (with ``check``) raise with its stdout and stderr."""
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} failed ({result.returncode}) in {cwd}:\n"
                             f"--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}")
    return result


def dvc(*args: str) -> list[str]:
    """The command line of ``dvc <args>`` with this interpreter's DVC (through the fork server, once started)."""
    return [fork_server.python(), "-m", "dvc", *map(str, args)]


def output(result: subprocess.CompletedProcess) -> str:
    """stdout and stderr of a finished command, for assertion messages."""
    return f"--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"


def project_env(root: Path) -> dict:
    """Environment for commands in a project copy: offline, no analytics, a git identity, the copy's own
    ``src`` first on the path, and its stages' ``python`` run by the test process's fork server
    (tests/fork_server.py)."""
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "DVC_NO_ANALYTICS": "1", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    env.pop("DVC_ROOT", None)
    return fork_server.environment(env)


def with_venv_commands(env: dict) -> dict:
    """`env` with this interpreter's commands (dvc, ray) on PATH, as after `pip install` in a virtual
    environment, and the fork server's `python` still before them (else every stage imports torch anew)."""
    return fork_server.environment({**env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"})


def tiny_params(params: dict, *, model: str = "tiny-bert", tasks: list[str] = ("synth-negation",),
                seeds: list[int] = (1, 2)) -> dict:
    """Shrink the paper configuration in place to a tiny model and a small built-in task (seconds per stage)."""
    params.update(model=model, tasks=list(tasks), seeds=list(seeds))
    params["download"].update(generated_train_examples=200, generated_validation_examples=60)
    params["finetune"].update(batch_size=8, learning_rate=1e-3, warmup_steps=2, max_steps=6, eval_every=3,
                              max_length=32)
    params["extract"].update(max_train_examples=100)
    params["similarity"].update(permutations=20, bootstrap=20)
    params["truncate"].update(head_epochs=2)
    params["align"].update(steps=20, matrix_steps=5, synthetic_steps=20, synthetic_rows=200, inn_hidden=16,
                           mlp_hidden=16, batch_size=32)
    params.setdefault("export", {}).update(selection_examples=100, timing_examples=8, timing_repeats=1)
    return params


def _committed(name: str) -> str | None:
    """The file as HEAD holds it, or None outside a git checkout or for a file HEAD lacks."""
    found = subprocess.run(["git", "show", f"HEAD:{name}"], cwd=REPO, capture_output=True, text=True)
    return found.stdout if found.returncode == 0 else None


def _key_paths(doc, prefix: str = "") -> set[str]:
    if not isinstance(doc, dict):
        return set()
    return {f"{prefix}{key}" for key in doc} | {path for key, value in doc.items()
                                                for path in _key_paths(value, f"{prefix}{key}.")}


def repository_params_text() -> str:
    """params.yaml as committed. `bash quickstart.sh` is a DVC experiment: it leaves its own values (and its
    dvc.lock) in the working tree, which the tests must not inherit. A working tree whose params.yaml declares
    other keys than HEAD's (a key being added or removed) is read as it is."""
    working = (REPO / "params.yaml").read_text()
    committed = _committed("params.yaml")
    if committed is None or _key_paths(yaml.safe_load(committed)) != _key_paths(yaml.safe_load(working)):
        return working
    return committed


def repository_params() -> dict:
    return yaml.safe_load(repository_params_text())


def copy_repository(dest: Path) -> None:
    """Copy this repository's git-tracked and not-ignored files into ``dest``, with params.yaml as
    :func:`repository_params` reads it and dvc.lock as committed (an experiment run here rewrites both)."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, files):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    lock = _committed("dvc.lock")
    if lock is not None:
        (dest / "dvc.lock").write_text(lock)
    elif (dest / "dvc.lock").exists():
        (dest / "dvc.lock").unlink()
    (dest / "params.yaml").write_text(repository_params_text())


def make_project(dest: Path, configure: Callable[[dict], object], *, share_cache: bool = True) -> dict:
    """Copy the repository into ``dest``, edit its params with ``configure(params)``, and commit it to a
    fresh git repository. Returns the environment to run commands in it with. With `share_cache` (and a
    shared cache set up by tests/conftest.py) it uses the test run's one DVC cache and run-cache; a test
    that needs its stages to really run passes False."""
    copy_repository(dest)
    # The project links DVC's cache into the workspace (.dvc/config: cache.type hardlink,symlink). Tests damage
    # outputs in place on purpose, and share one cache: through a link that damage would reach the cache, so a
    # test project copies (DVC's default on ext4), as it did before the link; config.local outranks config.
    (dest / ".dvc" / "config.local").write_text("[cache]\n    type = copy\n")
    params = repository_params()
    configure(params)
    (dest / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = project_env(dest)
    run(["git", "init", "-q", "-b", "main"], dest, env)
    run(["git", "add", "-A"], dest, env)
    run(["git", "commit", "-qm", "copy"], dest, env)
    shared = os.environ.get(SHARED_CACHE)
    if shared and share_cache:  # one DVC cache, and so one run-cache, for every project of a test run (tests/conftest.py)
        run(dvc("cache", "dir", "--local", shared), dest, env)
    return env


def built_project(builds: Path, dest: Path, configure: Callable[[dict], object], name: str) -> tuple[dict, str]:
    """Copy into ``dest`` the project ``make_project(..., configure)`` after its first ``dvc repro`` (not
    committed); returns the copy's environment and that repro's output. The project is built once per test
    run, as ``builds/name``, under a file lock that every xdist worker shares (tests/conftest.py), so test
    modules that start from one configuration copy it instead of running its stages again. The build itself
    is never handed out: a module that edits its copy cannot change what another one copies."""
    from filelock import FileLock

    source, log = builds / name, builds / f"{name}.repro.log"
    with FileLock(str(builds / f"{name}.lock")):
        if not log.exists():  # a build that failed left no log: the next module tries again, and fails alike
            shutil.rmtree(source, ignore_errors=True)
            source.mkdir(parents=True)
            repro = run(dvc("repro"), source, make_project(source, configure))
            log.write_text(repro.stdout + repro.stderr)
    shutil.copytree(source, dest, symlinks=True, dirs_exist_ok=True)
    return project_env(dest), log.read_text()


def dry_run_stages(text: str) -> set[str]:
    """Names of the stages that ``dvc repro --dry`` (or ``dvc exp run --dry``) output says it would run."""
    return {line.split("'")[1] for line in text.splitlines() if line.startswith("Running stage")}


@contextmanager
def _dvc_repo(root: Path):
    """DVC's Python API (what `dvc status` and `dvc repro --dry` call) on the project at ``root``, in this
    process: test_incremental asks ~40 times, and a `dvc` process costs about a second more each time. DVC
    resolves stage paths against the working directory, so it is ``root`` for the duration."""
    from dvc.repo import Repo

    before = os.getcwd()
    os.chdir(root)
    try:
        with Repo(".") as repo:
            yield repo
    finally:
        os.chdir(before)


def stale_stages(root: Path) -> set[str]:
    """Stages that ``dvc status`` reports as changed themselves (their params, deps or outs)."""
    with _dvc_repo(root) as repo:
        return set(repo.status())


# The stage every other depends on (dvc.yaml): it validates params.yaml and its output never changes, so it
# is stale after any params change and reruns nothing after it.
GATE = "check_params"


def stages_to_rerun(root: Path) -> tuple[set[str], set[str]]:
    """The stages ``dvc status`` reports as changed, and those ``dvc repro`` would run: the changed ones and
    every stage downstream of them (``--dry --force-downstream``: a dry run cannot know that a rerun stage
    changes its outputs), but not downstream of the params gate, whose output is constant
    (tests/test_incremental.py checks that with a real repro). One DVC repo for both: its index is built once."""
    with _dvc_repo(root) as repo:
        stale = set(repo.status())
        targets = sorted(stale - {GATE})
        if not targets:
            return stale, stale
        would_run = repo.reproduce(targets, dry=True, force_downstream=True, downstream=True)
    return stale, {stage.addressing for stage in would_run} | (stale & {GATE})


@contextmanager
def edited_params(root: Path, **changes) -> Iterator[dict]:
    """params.yaml of the project at ``root`` with dotted keys set (``edited_params(root, **{"skip.tolerance":
    0.5})``) for the duration of the block, then restored byte for byte. Yields the edited params."""
    path = root / "params.yaml"
    original = path.read_text()
    params = yaml.safe_load(original)
    for dotted, value in changes.items():
        *sections, key = dotted.split(".")
        target = params
        for section in sections:
            target = target[section]
        target[key] = value
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    try:
        yield params
    finally:
        path.write_text(original)
