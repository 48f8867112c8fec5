"""What a test project is made of (tests/dvc_project.py): the repository as git lists it, never what a user's run left
in the working tree (issue 64: after `bash quickstart.sh` the README's test command found the quickstart's
environment records in its projects)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml

from dvc_project import REPO, copy_repository, repository_files, run_output_folders


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t"})


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_the_folders_a_run_writes_are_read_from_dvc_yaml():
    folders = run_output_folders(REPO)
    assert {"data", "metrics", "plots", "report", "timings", "environment"} <= folders
    assert not folders & {"src", "stages", "tests", "docs", "models", "user_data"}


def test_a_project_copy_holds_what_git_lists_and_nothing_a_run_left(tmp_path):
    """A checkout after `bash quickstart.sh`: its experiment's params.yaml and dvc.lock, the records that no
    .gitignore hides, DVC's .gitignore files, ignored outputs; and a developer's change, tracked or not yet added."""
    root, dest = tmp_path / "checkout", tmp_path / "copy"
    tracked = {"dvc.yaml": (REPO / "dvc.yaml").read_text(), ".gitignore": "/data/\n", "params.yaml": "model: a\n",
               "dvc.lock": "schema: '2.0'\n", "src/layersim/old.py": "", "environment/.gitkeep": "",
               "timings/.gitkeep": ""}
    _write(root, tracked)
    _git(root, "init", "-q", "-b", "main")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "c")
    developer = {"src/layersim/old.py": "changed = True\n", "src/layersim/new.py": "added = True\n",
                 "stages/new_stage.py": ""}
    user_run = {"params.yaml": "model: quickstart\n", "dvc.lock": "schema: '2.0'\nstages: {}\n",
                "environment/finetune@synth-similarity-1.json": "[]\n",
                "timings/finetune/synth-similarity/seed1.json": "{}\n",
                "metrics/.gitignore": "/finetune\n", "metrics/finetune/synth-similarity/seed1/metrics.json": "{}\n",
                "plots/.gitignore": "/similarity\n", "plots/summary.json": "{}\n", "report/index.html": "<p>\n",
                "dvclive/finetune/synth-similarity/seed1/metrics.json": "{}\n",
                "data/checkpoints/synth-similarity/seed1/model/config.json": "{}\n"}
    _write(root, {**developer, **user_run})

    assert repository_files(root) == sorted({*tracked, "src/layersim/new.py", "stages/new_stage.py"})
    dest.mkdir()
    copy_repository(dest, root)
    copied = sorted(str(path.relative_to(dest)) for path in dest.rglob("*") if path.is_file())
    assert copied == repository_files(root)
    assert (dest / "params.yaml").read_text() == "model: a\n" and (dest / "dvc.lock").read_text() == "schema: '2.0'\n"
    assert (dest / "src/layersim/old.py").read_text() == "changed = True\n"  # the working tree's, being changed


def test_a_project_copy_of_a_checkout_without_git_history_keeps_its_files(tmp_path):
    """No commit yet (a fresh `git init` of a download): params.yaml is read as it is, and no dvc.lock is made."""
    root, dest = tmp_path / "checkout", tmp_path / "copy"
    _write(root, {"dvc.yaml": yaml.safe_dump({"stages": {"s": {"cmd": "x", "outs": ["data/x"]}}}),
                  "params.yaml": "model: mine\n", "src/a.py": "", "data/x": ""})
    _git(root, "init", "-q", "-b", "main")
    dest.mkdir()
    copy_repository(dest, root)
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()) == ["dvc.yaml", "params.yaml",
                                                                                       "src/a.py"]
    assert (dest / "params.yaml").read_text() == "model: mine\n"
