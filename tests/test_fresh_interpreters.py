"""Integration: stages rerun in fresh interpreters, under a hash seed no fork server of this run has, give the same
outputs as their forked run.

Every other integration test runs its stages in forks of tests/fork_server.py's server: the third-party stack
imported already, the server's hash secret, interpreter shutdown cut short. Here the tiny "workflows" project
(built forked, once per test run) reruns some stages the way a user's `dvc repro` runs them: `python` the real
interpreter, a PYTHONHASHSEED of its own. A stage whose output depends on the order of a set of strings, or that
needs an import the server made for it, or that crashes at interpreter exit, fails here; one that hangs at exit
fails by pytest-timeout (pyproject.toml). The stages chosen read and write parquet and JSON, run the measures
(scipy, sklearn) and draw figures (matplotlib): the libraries the server preloads.
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

import pytest

import fork_server
from dvc_project import WORKFLOWS_TASK as TASK, built_project, configure_workflows, lock_outs, output, project_env, run

pytestmark = pytest.mark.integration

STAGES = (f"download_task@{TASK}", f"similarity@{TASK}", "summary", "report")


def _server_hash_seeds() -> set[int]:
    """The hash seeds of this run's fork servers (FORK_LOG, tests/conftest.py): the forked outputs had one of them."""
    log = Path(os.environ.get(fork_server.FORK_LOG, ""))
    lines = log.read_text().splitlines() if log.is_file() else []
    return {entry["server_hash_seed"] for entry in map(json.loads, lines) if "server_hash_seed" in entry}


def fresh_env(root: Path) -> dict:
    """A user's environment for `root`: no fork server's shim on PATH (this interpreter's folder first, as in a
    virtual environment) and a hash seed that no fork server of this run has."""
    taken = _server_hash_seeds() | {fork_server.SERVER.hash_seed}
    seed = next(seed for seed in iter(lambda: random.randrange(1, 2 ** 32), None) if seed not in taken)
    return {**project_env(root), "LAYERSIM_FORK_SERVER": "0", "PYTHONHASHSEED": str(seed),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def test_stages_rerun_in_fresh_interpreters_give_the_forked_outputs(tmp_path, built_projects):
    root = tmp_path / "project"
    built_project(built_projects, root, configure_workflows, "workflows")
    forked = lock_outs(root)
    env = fresh_env(root)
    rerun = run([sys.executable, "-m", "dvc", "repro", "--force", "--single-item", *STAGES], root, env)
    for stage in STAGES:
        assert f"Running stage '{stage}'" in rerun.stdout, output(rerun)
    fresh = lock_outs(root)
    changed = {stage: paths for stage in STAGES
               if (paths := sorted(path for path, md5 in fresh[stage].items() if forked[stage].get(path) != md5))}
    assert not changed, (f"outputs differ from the forked run's (fresh interpreters, "
                         f"PYTHONHASHSEED={env['PYTHONHASHSEED']}): {changed}")
