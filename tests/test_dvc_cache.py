"""A cache that in-place edits poison (issue 62): DVC's cache checked against dvc.lock (layersim_launch.dvc_cache) before every
stage DVC runs and before `layersim push`, and the remote's `verify` keeping damaged bytes from a colleague's pull.

The unit tests build a cache and a dvc.lock by hand, as DVC 3 lays them out; the integration test runs the real
project under its default cache settings (hardlinks), edits outputs in place as root, and runs, pushes and pulls."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from layersim_launch import dvc_cache
from layersim_launch.dvc_cache import Damaged, damaged_files, refuse_damaged
from layersim.errors import LayersimError


def _md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def _store(cache: Path, data: bytes, suffix: str = "") -> str:
    oid = _md5(data) + suffix
    path = cache / "files" / "md5" / oid[:2] / oid[2:]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return oid


@pytest.fixture
def project(tmp_path) -> Path:
    """A project whose dvc.lock records a file output, a directory output of two files and an uncached metric,
    with the objects in .dvc/cache."""
    cache = tmp_path / ".dvc" / "cache"
    (tmp_path / ".dvc").mkdir()
    (tmp_path / ".dvc" / "config").write_text("[cache]\n    type = hardlink,symlink\n")
    files = {"config.json": b'{"a": 1}\n', "train.parquet": b"PAR1 rows PAR1"}
    listing = [{"md5": _store(cache, data), "relpath": name} for name, data in files.items()]
    folder = _store(cache, json.dumps(listing).encode(), ".dir")
    report = _store(cache, b"<html></html>")
    lock = {"schema": "2.0", "stages": {
        "download": {"cmd": "x", "outs": [{"path": "data/model", "hash": "md5", "md5": folder, "nfiles": 2}]},
        "report": {"cmd": "y", "deps": [{"path": "data/model", "hash": "md5", "md5": folder}],
                   "outs": [{"path": "report/index.html", "hash": "md5", "md5": report},
                            {"path": "metrics.json", "hash": "md5", "md5": _md5(b"{}")}]}}}
    (tmp_path / "dvc.lock").write_text(yaml.safe_dump(lock))
    return tmp_path


def _object(project: Path, data: bytes) -> Path:
    oid = _md5(data)
    return project / ".dvc" / "cache" / "files" / "md5" / oid[:2] / oid[2:]


def test_an_intact_cache_passes(project):
    assert damaged_files(project) == []
    refuse_damaged(project, "dvc push")


def test_an_object_edited_in_place_is_named_by_its_output_file(project):
    obj = _object(project, b'{"a": 1}\n')
    with obj.open("ab") as handle:  # what `echo >> config.json` does through a hardlink
        handle.write(b"\n")
    assert damaged_files(project) == [Damaged("data/model/config.json", obj)]
    with pytest.raises(LayersimError) as refused:
        refuse_damaged(project, "dvc push")
    message = str(refused.value)
    assert "data/model/config.json" in message and "refused before dvc push" in message
    assert f"rm -f data/model/config.json {obj.relative_to(project)}" in message


@pytest.mark.parametrize("climb", ["../", "../../"])
def test_a_stage_in_the_path_guards_folder_names_its_file_from_the_root(project, climb):
    """The path guard's stages run in params-guard/ or params-guard/owner/ (docs/params-safety.md): dvc.lock
    records their outputs from there; the sentence names them from the project root, as the user removes them."""
    lock = yaml.safe_load((project / "dvc.lock").read_text())
    lock["stages"]["download"]["outs"][0]["path"] = f"{climb}data/model"
    (project / "dvc.lock").write_text(yaml.safe_dump(lock))
    obj = _object(project, b'{"a": 1}\n')
    obj.write_bytes(b'{"a": 2}\n')
    assert damaged_files(project) == [Damaged("data/model/config.json", obj)]


def test_a_rewritten_file_output_and_a_damaged_listing_are_found(project):
    _object(project, b"<html></html>").write_bytes(b"<html>changed</html>")  # pandas-style rewrite to the same path
    listing = next((project / ".dvc" / "cache" / "files" / "md5").rglob("*.dir"))
    listing.write_bytes(listing.read_bytes()[:-5])
    found = damaged_files(project)
    assert [d.path for d in found] == ["data/model", "report/index.html"]
    with pytest.raises(LayersimError) as refused:
        refuse_damaged(project, "this stage runs")
    removal = str(refused.value).split("rm -f ")[1].split(")")[0].split()
    assert "data/model" not in removal  # a listing is no workspace file: only its object is removed
    assert "report/index.html" in removal and str(listing.relative_to(project)) in removal


def test_objects_not_in_the_cache_and_uncached_outputs_are_skipped(project):
    shutil.rmtree(project / ".dvc" / "cache" / "files" / "md5")  # a fresh clone before `dvc pull`
    assert damaged_files(project) == []
    (project / "dvc.lock").unlink()
    assert damaged_files(project) == []


def test_a_dvc_lock_that_stays_unreadable_is_one_sentence(project, monkeypatch):
    monkeypatch.setattr(dvc_cache.time, "sleep", lambda seconds: None)
    (project / "dvc.lock").write_text("stages: {download: [")
    with pytest.raises(LayersimError, match="dvc.lock cannot be read .*run dvc status"):
        damaged_files(project)


def test_an_object_is_hashed_again_only_after_a_write(project, monkeypatch):
    monkeypatch.setattr(dvc_cache, "RACY_NS", -1)  # the objects were written just now
    read = []
    hashing = dvc_cache.file_md5
    monkeypatch.setattr(dvc_cache, "file_md5", lambda path: read.append(path) or hashing(path))
    assert damaged_files(project) == [] and len(read) == 4  # the listing, its two files, the report
    read.clear()
    assert damaged_files(project) == [] and read == []
    obj = _object(project, b"PAR1 rows PAR1")
    obj.write_bytes(b"PAR1 rows PAR2")  # same size: the stamp's times and change time tell
    assert damaged_files(project) == [Damaged("data/model/train.parquet", obj)] and read == [obj]
    obj.write_bytes(b"PAR1 rows PAR1")
    assert damaged_files(project) == []


def test_a_just_written_object_is_not_remembered(project, monkeypatch):
    """Git's racy-clean rule: an edit within the file system's clock tick could leave the times as they were."""
    read = []
    hashing = dvc_cache.file_md5
    monkeypatch.setattr(dvc_cache, "file_md5", lambda path: read.append(path) or hashing(path))
    damaged_files(project)
    damaged_files(project)
    assert len(read) == 8


def test_the_cache_folder_follows_the_config(project, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("shared-cache")
    shutil.copytree(project / ".dvc" / "cache", elsewhere, dirs_exist_ok=True)
    shutil.rmtree(project / ".dvc" / "cache")
    assert damaged_files(project) == []  # nothing at .dvc/cache: nothing checked
    (project / ".dvc" / "config.local").write_text(f"[cache]\n    dir = {os.path.relpath(elsewhere, project / '.dvc')}\n")
    assert dvc_cache.cache_folder(project) == elsewhere.resolve()
    obj = elsewhere / "files" / "md5" / _md5(b"<html></html>")[:2] / _md5(b"<html></html>")[2:]
    obj.write_bytes(b"edited")
    assert damaged_files(project) == [Damaged("report/index.html", obj)]


def test_the_check_on_its_own_is_an_exit_status(project, capsys):
    assert dvc_cache.main([str(project)]) == 0
    _object(project, b"<html></html>").write_bytes(b"<html>edited</html>")
    assert dvc_cache.main([str(project)]) == 1
    assert "report/index.html" in capsys.readouterr().err


def test_layersim_push_checks_first_and_passes_its_other_arguments_to_dvc_push(project, monkeypatch, capsys):
    import subprocess
    from types import SimpleNamespace

    from layersim_launch import cli

    _add_remote(project, verify="true")
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda command, cwd: calls.append(command) or SimpleNamespace(returncode=0))
    assert cli.main(["push", "--root", str(project), "-r", "shared", "--jobs", "2"]) == 0
    assert calls[0][-5:] == ["push", "-r", "shared", "--jobs", "2"]
    _object(project, b'{"a": 1}\n').write_bytes(b'{"a": 2}\n')
    assert cli.main(["push", "--root", str(project)]) == 1 and len(calls) == 1
    error = capsys.readouterr().err
    assert error.startswith("error: DVC's cache holds other bytes") and "data/model/config.json" in error


def _add_remote(project: Path, name: str = "shared", verify: str | None = None, where: str = "config",
                default: bool = True) -> None:
    """A folder remote in one of the project's DVC config files, as `dvc remote add [-d]` and `dvc remote modify
    NAME verify` write it."""
    path = project / ".dvc" / where
    text = path.read_text() if path.is_file() else ""
    if default:
        text += f"[core]\n    remote = {name}\n"
    text += f"['remote \"{name}\"']\n    url = /mnt/shared/{name}\n"
    if verify is not None:
        text += f"    verify = {verify}\n"
    path.write_text(text)


@pytest.mark.parametrize("setup, args, refused", [
    ([{}], [], "shared"),                                                  # the default remote, verify unset
    ([{"verify": "false"}], [], "shared"),
    ([{"verify": "true", "where": "config.local"}], [], "shared"),         # the colleague's clone would not have it
    ([{"verify": "true"}, {"name": "backup", "default": False}], ["-r", "backup"], "backup"),
    ([{"verify": "true"}, {"name": "backup", "default": False}], ["--remote=backup"], "backup"),
    ([{"verify": "true"}, {"name": "backup", "default": False}], ["-rbackup"], "backup"),
])
def test_layersim_push_refuses_a_remote_that_lets_a_pull_keep_damaged_bytes(project, monkeypatch, capsys, setup,
                                                                            args, refused):
    """A plain `dvc push` uploads an object an edit changed under its old name; only the remote's `verify`, in the
    config file git carries, keeps it from a colleague's pull: `layersim push` refuses a remote without it."""
    import subprocess

    from layersim_launch import cli

    for remote in setup:
        _add_remote(project, **remote)
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda command, cwd: calls.append(command))
    assert cli.main(["push", "--root", str(project), *args]) == 1 and calls == []
    error = capsys.readouterr().err.strip()
    assert error == (f"error: the remote '{refused}' does not set verify true in .dvc/config, the config file git "
                     "carries to a colleague, so their dvc pull would keep bytes that do not match their names (a "
                     "plain dvc push uploads an output edited in place as it is); run dvc remote modify "
                     f"{refused} verify true, commit .dvc/config and run layersim push again.")


@pytest.mark.parametrize("setup, args, pushed", [
    ([{"verify": "true"}], [], "shared"),
    ([{"verify": "True"}, {"name": "backup", "default": False, "verify": "true"}], ["--remote", "backup"], "backup"),
    ([], [], None),  # no remote named: dvc push says so itself
])
def test_a_verifying_remote_is_pushed_to(project, monkeypatch, setup, args, pushed):
    import subprocess
    from types import SimpleNamespace

    from layersim_launch import cli, sharing

    for remote in setup:
        _add_remote(project, **remote)
    assert sharing.pushed_remote(project, args) == pushed
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda command, cwd: calls.append(command) or SimpleNamespace(returncode=0))
    assert cli.main(["push", "--root", str(project), *args]) == 0 and calls[0][-1 - len(args):] == ["push", *args]


def _git_init(folder: Path) -> None:
    import subprocess

    subprocess.run(["git", "init", "-q", str(folder)], check=True)


def test_install_hook_makes_git_push_run_the_check_first(project, capsys):
    """`layersim install-hook`: git's pre-push hook runs the cache check, exit status 1 with the sentence naming
    the file (git then pushes nothing); installing again keeps one check."""
    import subprocess

    from layersim_launch import cli
    from layersim_launch.sharing import HOOK_MARK

    _git_init(project)
    assert cli.main(["install-hook", "--root", str(project)]) == 0
    hook = project / ".git" / "hooks" / "pre-push"
    assert str(hook) in capsys.readouterr().out and os.access(hook, os.X_OK)
    assert cli.main(["install-hook", "--root", str(project)]) == 0
    assert hook.read_text().count(HOOK_MARK) == 1 and hook.read_text().startswith("#!/bin/sh\n")
    intact = subprocess.run([str(hook), "origin", "/srv/repo.git"], cwd=project, capture_output=True, text=True,
                            stdin=subprocess.DEVNULL)
    assert intact.returncode == 0, intact.stderr
    _object(project, b'{"a": 1}\n').write_bytes(b'{"a": 2}\n')
    refused = subprocess.run([str(hook), "origin", "/srv/repo.git"], cwd=project, capture_output=True, text=True,
                             stdin=subprocess.DEVNULL)
    assert refused.returncode == 1
    assert refused.stderr.startswith("error: DVC's cache holds other bytes than dvc.lock records for "
                                     "data/model/config.json") and "refused before git push" in refused.stderr


def test_install_hook_keeps_another_hooks_lines_after_the_check(project):
    """DVC's `dvc install` writes a pre-push hook of its own: the check goes first, its lines stay."""
    from layersim_launch.sharing import HOOK_MARK, install_hook

    _git_init(project)
    hook = project / ".git" / "hooks" / "pre-push"
    hook.write_text("#!/bin/sh\nexec dvc git-hook pre-push $@\n")
    assert install_hook(project) == hook.resolve()
    lines = hook.read_text().splitlines()
    assert lines[0] == "#!/bin/sh" and lines[1] == HOOK_MARK and "layersim_launch.dvc_cache" in lines[2]
    assert lines[3:] == ["exec dvc git-hook pre-push $@"]


def test_install_hook_outside_a_git_checkout_is_one_sentence(tmp_path, capsys, monkeypatch):
    from layersim_launch import cli

    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert cli.main(["install-hook", "--root", str(tmp_path)]) == 1
    error = capsys.readouterr().err
    assert error.startswith(f"error: {tmp_path} is not a git repository") and error.count("\n") == 1


TASK = "synth-negation"


def _tiny(params: dict) -> None:
    from dvc_project import tiny_params

    tiny_params(params, tasks=[TASK], seeds=[1])


@pytest.mark.integration
def test_an_output_edited_in_place_is_refused_by_the_next_run_and_push_and_never_reaches_a_pull(tmp_path):
    """Under the project's default cache settings (hardlinks; the test projects' copy setting removed), as root:
    `echo >> config.json` on the pretrained model's folder and pandas rewriting a task table to its own path change
    DVC's cache objects. A `dvc repro` that only restores runs no layersim code (DVC relinks the damaged objects);
    the next stage that runs, `layersim push` and, after a plain `dvc push`, `git push` (its hook from `layersim
    install-hook`) refuse, naming both files; the bytes the plain `dvc push` uploads never reach a colleague whose
    remote has the docs' `verify true`; the repair the message names gives back the original bytes and a push that
    passes."""
    import subprocess
    import sys

    import pandas as pd
    from dvc_project import dvc, make_project, output, run, with_venv_commands

    if os.geteuid() != 0:
        pytest.skip("as an ordinary user the read-only link refuses the edit (issue 62): nothing to poison")
    root, remote = tmp_path / "project", tmp_path / "remote"
    root.mkdir()
    env = make_project(root, _tiny, share_cache=False)
    (root / ".dvc" / "config.local").unlink()  # the project's own cache settings
    env = with_venv_commands(env)
    run(dvc("repro", "download_model", f"download_task@{TASK}"), root, env)
    config = root / "data/models/tiny-bert/pretrained/config.json"
    table = root / f"data/tasks/{TASK}/splits/train.parquet"
    assert config.stat().st_nlink == 2 and table.stat().st_nlink == 2  # each output is its cache object
    originals = {path: path.read_bytes() for path in (config, table)}
    run(dvc("remote", "add", "-d", "shared", remote), root, env)
    run(dvc("remote", "modify", "shared", "verify", "true"), root, env)
    run(["git", "add", "-A"], root, env)
    run(["git", "commit", "-qm", "results"], root, env)
    origin = tmp_path / "origin.git"  # the git server a colleague would clone from
    run(["git", "init", "-q", "--bare", "-b", "main", str(origin)], tmp_path, env)
    run(["git", "remote", "add", "origin", str(origin)], root, env)
    layersim = [sys.executable, "-m", "layersim_launch.cli"]
    run([*layersim, "install-hook"], root, env)

    inode = table.stat().st_ino
    with config.open("a") as handle:
        handle.write("\n")
    pd.read_parquet(table).to_parquet(table)
    assert table.stat().st_ino == inode and table.read_bytes() != originals[table]  # written through the link
    named = [str(path.relative_to(root)) for path in (config, table)]
    # A repro whose stages DVC restores from the run-cache runs no layersim code: the damaged objects are relinked.
    run(dvc("repro", "download_model", f"download_task@{TASK}"), root, env, check=False)

    # The next stage that runs: fine-tuning, which reads both (DVC first restores their stages from the run-cache,
    # running no code: the damaged objects are linked back as they are).
    repro = run(dvc("repro", f"finetune@{TASK}-1"), root, env, check=False)
    assert repro.returncode != 0 and f"Running stage 'finetune@{TASK}-1'" in repro.stdout, output(repro)
    refusal = next(line for line in repro.stderr.splitlines() if line.startswith("error: DVC's cache"))
    assert all(name in refusal for name in named), refusal
    assert "refused before this stage runs" in refusal
    assert not (root / f"data/checkpoints/{TASK}/seed1/model").exists()
    check = run([sys.executable, "-m", "layersim_launch.dvc_cache"], root, env, check=False)  # the run scripts' check
    assert check.returncode == 1 and all(name in check.stderr for name in named), output(check)

    push = run([*layersim, "push"], root, env, check=False)
    assert push.returncode == 1 and all(name in push.stderr for name in named), output(push)
    assert not remote.exists() or not any(remote.rglob("*")), "nothing may reach the remote"

    # Pushed anyway by plain `dvc push`: the colleague's pull (the remote's `verify` came with .dvc/config) rehashes
    # what it downloads and keeps none of the damaged bytes.
    run(dvc("push"), root, env)
    git_push = run(["git", "push", "-q", "origin", "main"], root, env, check=False)
    assert git_push.returncode != 0 and all(name in git_push.stderr for name in named), output(git_push)
    assert "refused before git push" in git_push.stderr
    assert run(["git", "branch", "-a"], origin, env).stdout == "", "the commit naming the outputs stays home"
    desk = tmp_path / "colleague"
    run(["git", "clone", "-q", str(root), str(desk)], tmp_path, env)
    pull = run(dvc("pull"), desk, env, check=False)
    assert pull.returncode != 0, output(pull)
    for path, data in originals.items():
        theirs = desk / path.relative_to(root)
        assert not theirs.exists() or theirs.read_bytes() == data, theirs
    assert damaged_files(desk) == []
    for obj in (desk / ".dvc" / "cache" / "files" / "md5").rglob("*"):
        if obj.is_file():
            assert _md5(obj.read_bytes()) == (obj.parent.name + obj.name).removesuffix(".dir"), obj

    # The repair the refusal names, then the same run: the original bytes, and a push that passes.
    removal = refusal.split("(rm -f ")[1].split(")")[0]
    subprocess.run(f"rm -f {removal}", shell=True, cwd=root, check=True)
    run(dvc("repro", "download_model", f"download_task@{TASK}"), root, env)
    assert {path: path.read_bytes() for path in originals} == originals
    assert damaged_files(root) == []
    assert run([*layersim, "push"], root, env).returncode == 0
    assert run(["git", "push", "-q", "origin", "main"], root, env).returncode == 0


@pytest.mark.integration
def test_under_the_copying_cache_an_edit_in_place_never_reaches_the_cache(tmp_path):
    """The setting that makes the edit impossible instead of found (docs/experiments.md, "Sharing results"): with
    `cache.type reflink,copy` (DVC's default; a copy where the filesystem has no reflinks, twice the bytes) the
    workspace file is no link, so `echo >> config.json`, as root or not, leaves the cache object whole, and a bare
    `dvc repro`, which runs no stage code, gives back the original bytes from it."""
    from dvc_project import dvc, make_project, output, run

    root = tmp_path / "project"
    root.mkdir()
    env = make_project(root, _tiny, share_cache=False)
    run(dvc("config", "--local", "cache.type", "reflink,copy"), root, env)
    run(dvc("repro", "download_model"), root, env)
    config = root / "data/models/tiny-bert/pretrained/config.json"
    original = config.read_bytes()
    assert config.stat().st_nlink == 1  # its own file, not the cache object
    with config.open("a") as handle:
        handle.write("\n")
    assert damaged_files(root) == []
    assert "modified" in run(dvc("status", "download_model"), root, env).stdout
    repro = run(dvc("repro", "download_model"), root, env)
    assert config.read_bytes() == original, output(repro)
    assert damaged_files(root) == []
