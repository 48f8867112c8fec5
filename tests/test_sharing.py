"""Integration: the documented sharing steps, run as they are written, and two clean runs giving one dvc.lock.

The steps are read out of docs/experiments.md (the first bash block under "Sharing results" that adds a
remote): the owner's part runs in a tiny project after `dvc repro`, the colleague's part (after "# a
colleague") in a fresh folder. Only the placeholders are replaced: the remote folder and `<repo>` (a bare git
repository the project pushes to). The colleague's clone must then hold every output with `dvc status` clean;
`dvc repro --force` there reruns every stage for real, and dvc.lock must not change: no output DVC hashes
holds a wall-clock or host-specific value.
"""

from __future__ import annotations

import difflib
import re

import pytest

from dvc_project import (REMOTE_PLACEHOLDER, built_project, configure_workflows, dvc, lock_outs, output, project_env,
                         run, sharing_steps, shell, with_venv_commands)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def shared(tmp_path_factory, built_projects) -> dict:
    """The documented steps on the tiny pipeline: repro, then the owner's block, then the colleague's."""
    where = tmp_path_factory.mktemp("sharing")
    root = where / "project"
    env, _ = built_project(built_projects, root, configure_workflows, "workflows")  # after its `dvc repro`
    env = with_venv_commands(env)
    origin = where / "origin.git"  # the git server the colleague clones from; `git push` goes there
    run(["git", "init", "-q", "--bare", "-b", "main", str(origin)], where, env)
    run(["git", "remote", "add", "origin", str(origin)], root, env)
    run(["git", "push", "-q", "-u", "origin", "main"], root, env)

    owner, colleague = sharing_steps()
    shell(owner.replace(REMOTE_PLACEHOLDER, str(where / "dvc-remote")), root, env)
    desk = where / "colleague"
    desk.mkdir()
    clone = desk / re.search(r"git clone <repo> (\S+)", colleague).group(1)
    # The clone's own src first on the path, as in every project: the folder above it has none, and the installed
    # package (an editable install of another checkout) would run other code than the clone's.
    clone_env = {**project_env(clone), "PATH": env["PATH"]}
    shell(colleague.replace("<repo>", str(origin)), desk, clone_env)
    return {"root": root, "env": env, "clone": clone, "clone_env": clone_env}


def test_the_commit_leaves_nothing_behind(shared):
    """The documented `git add` list holds every file the pipeline wrote that git should carry."""
    status = run(["git", "status", "--porcelain"], shared["root"], shared["env"])
    assert status.stdout == "", status.stdout


def test_the_colleague_gets_every_output_and_a_clean_status(shared):
    clone, env = shared["clone"], shared["clone_env"]
    outs = lock_outs(clone)
    assert outs == lock_outs(shared["root"])
    missing = [path for paths in outs.values() for path in paths if not (clone / path).exists()]
    assert not missing, missing
    status = run(dvc("status"), clone, env)
    assert "Data and pipelines are up to date." in status.stdout, output(status)
    assert (clone / ".dvc/config").read_text().count("remote = shared") == 1  # the default remote came with git


def test_two_clean_runs_give_the_same_dvc_lock(shared):
    """Every stage rerun for real in the colleague's clone (--force: no run-cache) hashes to the same dvc.lock:
    no DVC-hashed output holds a wall-clock or host-specific value (timings/ is no stage's output)."""
    clone, env = shared["clone"], shared["clone_env"]
    before = (clone / "dvc.lock").read_text()
    rerun = run(dvc("repro", "--force"), clone, env)
    assert "Running stage 'finetune@" in rerun.stdout, output(rerun)
    after = (clone / "dvc.lock").read_text()
    if after != before:
        changed = {stage: sorted(path for path, md5 in paths.items() if lock_outs(shared["root"])[stage][path] != md5)
                   for stage, paths in lock_outs(clone).items()}
        pytest.fail(f"dvc.lock changed on a clean rerun: {({s: p for s, p in changed.items() if p})}\n"
                    + "".join(difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                                   "dvc.lock (before)", "dvc.lock (after)")))
    assert run(["git", "status", "--porcelain", "--", "dvc.lock"], clone, env).stdout == ""
