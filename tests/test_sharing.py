"""Integration: the documented sharing steps, run as they are written, and two clean runs giving one dvc.lock.

The steps are read out of docs/experiments.md (the first bash block under "Sharing results" that adds a
remote): the owner's part runs in a tiny project after `dvc repro`, the colleague's part (after "# a
colleague") in a fresh folder. Only the placeholders are replaced: the remote folder and `<repo>` (a bare git
repository the project pushes to). The colleague's clone must then hold every output with `dvc status` clean;
`dvc repro --force` there reruns every stage for real, and dvc.lock must not change: no output DVC hashes
holds a wall-clock or host-specific value.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from dvc_project import REPO, built_project, dvc, output, project_env, run, with_venv_commands
from test_dvc_workflows import _configure  # the same tiny project, built once per test run

pytestmark = pytest.mark.integration

REMOTE_PLACEHOLDER = "/mnt/shared/layersim-dvc"
COLLEAGUE = "# a colleague"
SHARING_PAGE = "docs/experiments.md"


def sharing_steps() -> tuple[str, str]:
    """The owner's and the colleague's commands from the docs' sharing block, as written."""
    page = (REPO / SHARING_PAGE).read_text(encoding="utf-8")
    section = page[page.index("## Sharing results"):]
    section = section[:section.index("\n## ", 1)]
    blocks = [b for b in re.findall(r"^```bash\n(.*?)^```", section, re.S | re.M) if "dvc remote add" in b]
    assert blocks, f"{SHARING_PAGE}: the sharing section has no bash block that adds a remote"
    owner, colleague = blocks[0].split(COLLEAGUE)
    assert REMOTE_PLACEHOLDER in owner and "<repo>" in colleague, blocks[0]
    return owner, colleague


def _shell(script: str, cwd: Path, env: dict) -> None:
    """Run the documented lines with bash, stopping at the first that fails (as a user would notice)."""
    run(["bash", "-euo", "pipefail", "-c", script], cwd, env)


def _lock_outs(root: Path) -> dict[str, dict]:
    """Every stage's outputs in dvc.lock: {stage: {path: md5}}."""
    lock = yaml.safe_load((root / "dvc.lock").read_text())
    return {stage: {out["path"]: out.get("md5") for out in entry.get("outs", [])}
            for stage, entry in lock["stages"].items()}


@pytest.fixture(scope="module")
def shared(tmp_path_factory, built_projects) -> dict:
    """The documented steps on the tiny pipeline: repro, then the owner's block, then the colleague's."""
    where = tmp_path_factory.mktemp("sharing")
    root = where / "project"
    env, _ = built_project(built_projects, root, _configure, "workflows")  # after its `dvc repro`
    env = with_venv_commands(env)
    origin = where / "origin.git"  # the git server the colleague clones from; `git push` goes there
    run(["git", "init", "-q", "--bare", "-b", "main", str(origin)], where, env)
    run(["git", "remote", "add", "origin", str(origin)], root, env)
    run(["git", "push", "-q", "-u", "origin", "main"], root, env)

    owner, colleague = sharing_steps()
    _shell(owner.replace(REMOTE_PLACEHOLDER, str(where / "dvc-remote")), root, env)
    desk = where / "colleague"
    desk.mkdir()
    clone_env = {**project_env(desk), "PATH": env["PATH"]}
    _shell(colleague.replace("<repo>", str(origin)), desk, clone_env)
    clone_name = re.search(r"git clone <repo> (\S+)", colleague).group(1)
    return {"root": root, "env": env, "clone": desk / clone_name, "clone_env": clone_env}


def test_the_commit_leaves_nothing_behind(shared):
    """The documented `git add` list holds every file the pipeline wrote that git should carry."""
    status = run(["git", "status", "--porcelain"], shared["root"], shared["env"])
    assert status.stdout == "", status.stdout


def test_the_colleague_gets_every_output_and_a_clean_status(shared):
    clone, env = shared["clone"], shared["clone_env"]
    outs = _lock_outs(clone)
    assert outs == _lock_outs(shared["root"])
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
        changed = {stage: sorted(path for path, md5 in paths.items() if _lock_outs(shared["root"])[stage][path] != md5)
                   for stage, paths in _lock_outs(clone).items()}
        pytest.fail(f"dvc.lock changed on a clean rerun: {({s: p for s, p in changed.items() if p})}\n"
                    + run(["git", "diff", "--stat"], clone, env).stdout)
    assert run(["git", "status", "--porcelain", "--", "dvc.lock"], clone, env).stdout == ""
