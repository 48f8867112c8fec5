"""layersim.lock without a hub: what the download stages read from it, how sync and refresh change it, and
how a revision resolves (a stub in place of huggingface_hub.HfApi). tests/test_hub_server.py runs the same
code against a served hub, new commits included."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import fork_server
import pytest
import yaml

from dvc_yaml import from_root
from layersim.params import lockfile
from layersim.errors import LayersimError
from layersim.params.lockfile import locked_model_revision, locked_task_revision, read_lock, update, write_lock
from layersim.params import load_params
from layersim.data.tasks import HUB_MIRROR_ENV, get_task

ROOT = Path(__file__).resolve().parents[1]
A, B, C = "a" * 40, "b" * 40, "c" * 40
EXPORT = "refs/convert/parquet"


def _params(tmp_path, **extra):
    params = {"model": "roberta-base", "tasks": ["rte", "synth-negation"], "seeds": [1],
              "finetune": {"max_length": 64}, **extra}
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return load_params(path)


@pytest.fixture
def hub(monkeypatch):
    """A fake hub: (repository, revision) → commit, which `hub_commit` is replaced by; `asked` lists the calls."""
    commits = {("FacebookAI/roberta-base", "main"): A, ("nyu-mll/glue", EXPORT): B}
    asked = []

    def resolve(repo_id, repo_type, revision, kind, name):
        asked.append(name)
        return commits[(repo_id, revision)]

    monkeypatch.setattr(lockfile, "hub_commit", resolve)
    return SimpleNamespace(commits=commits, asked=asked)


def test_offline_sources_need_no_entry(tmp_path):
    lock = tmp_path / "none.lock"
    assert locked_model_revision("tiny-bert", lock) is None
    assert locked_model_revision("minilm-l6", lock) is None
    assert locked_task_revision(get_task("synth-negation"), None, lock) is None
    assert not lock.exists()


def test_a_hub_model_without_an_entry_is_refused_with_the_command(tmp_path):
    lock = tmp_path / "layersim.lock"
    with pytest.raises(LayersimError) as error:
        locked_model_revision("roberta-base", lock)
    assert str(error.value) == (f"model 'roberta-base' has no commit in {lock}; run `python -m layersim.params.lockfile sync` "
                                f"to record the commit it resolves to now (or `refresh roberta-base` to move it) and "
                                f"commit {lock}; sync asks the Hugging Face hub, so it needs the network (offline, pick "
                                "an offline model or task instead: tiny-*, minilm-l6, local/<folder>, synth-*, user "
                                "files).")


@pytest.mark.parametrize("entry, message", [
    ({"dataset": "nyu-mll/glue", "config": "rte", "revision": EXPORT, "commit": B},
     f"locks task 'rte' as {{'dataset': 'nyu-mll/glue', 'config': 'rte', 'revision': '{EXPORT}'}}, but params.yaml "
     f"asks for {{'dataset': 'nyu-mll/glue', 'config': 'rte', 'revision': '{C}'}}"),
    ({"dataset": "nyu-mll/glue", "config": "rte", "revision": C, "commit": "main"},
     "locks task 'rte' at 'main', which is not a 40-digit commit"),
])
def test_an_entry_that_does_not_match_params_is_refused(tmp_path, entry, message):
    lock = tmp_path / "layersim.lock"
    write_lock({"models": {}, "tasks": {"rte": entry}}, lock)
    with pytest.raises(LayersimError) as error:
        locked_task_revision(get_task("rte"), C, lock)  # download.revisions: {rte: C}
    assert message in str(error.value) and "python -m layersim.params.lockfile sync" in str(error.value)


def test_the_locked_commit_is_what_the_stage_reads(tmp_path, monkeypatch):
    lock = tmp_path / "layersim.lock"
    write_lock({"models": {"roberta-base": {"hub_id": "FacebookAI/roberta-base", "revision": "main", "commit": A}},
                "tasks": {"rte": {"dataset": "nyu-mll/glue", "config": "rte", "revision": EXPORT, "commit": B}}}, lock)
    assert locked_model_revision("roberta-base", lock) == A
    assert locked_task_revision(get_task("rte"), None, lock) == B
    monkeypatch.setenv(HUB_MIRROR_ENV, str(tmp_path))  # a mirror folder has no commits: the lock is not read
    assert locked_task_revision(get_task("rte"), "v1", tmp_path / "absent.lock") == "v1"


@pytest.mark.parametrize("text, message", [
    ("{not json", "cannot be read (Expecting property name enclosed in double quotes)"),
    ('{"version": 2, "models": {}, "tasks": {}}', "is not a layersim lock of version 1"),
    ("[]", "is not a layersim lock of version 1"),
])
def test_a_damaged_lock_is_one_sentence(tmp_path, text, message):
    lock = tmp_path / "layersim.lock"
    lock.write_text(text)
    with pytest.raises(LayersimError) as error:
        read_lock(lock)
    assert message in str(error.value) and str(lock) in str(error.value) and "\n" not in str(error.value)


def test_sync_records_what_is_missing_and_keeps_the_rest(tmp_path, hub):
    lock = tmp_path / "layersim.lock"
    params = _params(tmp_path)
    assert update(params, lock) == [f"model roberta-base: {A[:12]} (main)", f"task rte: {B[:12]} ({EXPORT})"]
    written = read_lock(lock)
    assert written["models"]["roberta-base"]["commit"] == A and written["tasks"]["rte"]["commit"] == B
    assert set(written["tasks"]) == {"rte"}  # synth-negation is generated offline: no entry

    hub.commits.update({("FacebookAI/roberta-base", "main"): C, ("nyu-mll/glue", EXPORT): C})  # the hub moves
    hub.asked.clear()
    before = lock.read_bytes()
    assert update(params, lock) == [] and hub.asked == [] and lock.read_bytes() == before  # sync never moves

    assert update(params, lock, refresh=True, names=("rte",)) == [f"task rte: {B[:12]} -> {C[:12]} ({EXPORT})"]
    assert read_lock(lock)["models"]["roberta-base"]["commit"] == A  # not named: not moved
    assert update(params, lock, refresh=True) == [f"model roberta-base: {A[:12]} -> {C[:12]} (main)"]


def test_a_new_pin_or_model_is_resolved_and_old_entries_are_kept(tmp_path, hub):
    lock = tmp_path / "layersim.lock"
    update(_params(tmp_path), lock)
    hub.commits[("nyu-mll/glue", "v2")] = C
    hub.commits[("google/electra-base-discriminator", "main")] = A
    params = _params(tmp_path, model="electra-base", download={"revisions": {"rte": "v2"}})
    assert update(params, lock) == [f"model electra-base: {A[:12]} (main)", f"task rte: {B[:12]} -> {C[:12]} (v2)"]
    assert set(read_lock(lock)["models"]) == {"roberta-base", "electra-base"}  # another experiment may read it
    with pytest.raises(LayersimError, match="'cola' is not a hub model or hub task of params.yaml; the ones it "
                                            "names are: electra-base, rte."):
        update(params, lock, refresh=True, names=("cola",))


class _Api:
    """huggingface_hub.HfApi as far as hub_commit uses it."""

    def __init__(self, *args, **kwargs):
        pass

    def list_repo_refs(self, repo_id, repo_type, include_pull_requests=False):
        ref = lambda name, full, sha: SimpleNamespace(name=name, ref=full, target_commit=sha)  # noqa: E731
        return SimpleNamespace(branches=[ref("main", "refs/heads/main", A)], tags=[ref("v1", "refs/tags/v1", B)],
                               converts=[ref("parquet", EXPORT, C)], pull_requests=None)

    def repo_info(self, repo_id, repo_type, revision):
        return SimpleNamespace(sha=A if A.startswith(revision) else None)


@pytest.mark.parametrize("revision, commit", [("main", A), ("refs/heads/main", A), ("v1", B), (EXPORT, C),
                                              ("aaaaaaa", A), (A, A)])
def test_a_revision_resolves_as_the_hub_names_it(monkeypatch, revision, commit):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "HfApi", _Api)
    assert lockfile.hub_commit("o/d", "dataset", revision, "task", "t") == commit


@pytest.mark.parametrize("revision, message", [
    ("parquet", f"task 't': o/d has no revision 'parquet'; it has main, v1, {EXPORT} (or give a commit)."),
    ("dev", f"task 't': o/d has no revision 'dev'; it has main, v1, {EXPORT} (or give a commit)."),
    ("bbbbbbb", "answered commit None, which is not 'bbbbbbb'"),
])
def test_an_unknown_revision_is_refused(monkeypatch, revision, message):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "HfApi", _Api)
    with pytest.raises(LayersimError) as error:
        lockfile.hub_commit("o/d", "dataset", revision, "task", "t")
    assert message in str(error.value)


def test_download_stages_depend_on_the_lock():
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    for name in ("download_model", "download_compared", "download_paired", "download_task"):
        assert "layersim.lock" in map(from_root, stages[name]["deps"]), name
    assert read_lock(ROOT / "layersim.lock")["version"] == 1  # the repository ships a lock the stages can read


def test_the_stage_refuses_an_unlocked_hub_model_before_writing(tmp_path):
    (tmp_path / "params.yaml").write_text("model: roberta-base\ntasks: [synth-negation]\nseeds: [1]\n")
    (tmp_path / "layersim.lock").write_text(json.dumps(lockfile.empty_lock()))
    env = fork_server.environment(dict(os.environ))
    result = subprocess.run([fork_server.python(), str(ROOT / "stages" / "download_model.py"), "out"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 1
    assert result.stderr.strip() == ("error: model 'roberta-base' has no commit in layersim.lock; run `python -m "
                                     "layersim.params.lockfile sync` to record the commit it resolves to now (or `refresh "
                                     "roberta-base` to move it) and commit layersim.lock; sync asks the Hugging Face hub, "
                                     "so it needs the network (offline, pick an offline model or task instead: tiny-*, "
                                     "minilm-l6, local/<folder>, synth-*, user files).")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["layersim.lock", "params.yaml"]


def test_sync_mends_an_entry_whose_commit_is_malformed(tmp_path, hub):
    """The download stage's remedy for a malformed commit is `sync`, so sync must re-resolve it (issue 49: it kept it)."""
    lock = tmp_path / "layersim.lock"
    params = _params(tmp_path)
    update(params, lock)
    damaged = read_lock(lock)
    damaged["models"]["roberta-base"]["commit"] = "not-a-commit"
    lockfile.write_lock(damaged, lock)
    assert update(params, lock) == [f"model roberta-base: not-a-commit -> {A[:12]} (main)"]
    assert locked_model_revision("roberta-base", lock) == A


def test_a_lock_that_cannot_be_written_or_nests_too_deep_is_one_sentence(tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")  # even root cannot write inside a file: the OSError any user can meet
    with pytest.raises(LayersimError, match=r"layersim.lock cannot be written \(\w[\w ]*\); run the command where you can write"):
        lockfile.write_lock(lockfile.empty_lock(), blocked / "layersim.lock")
    deep = tmp_path / "deep.lock"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(LayersimError, match=r"deep.lock cannot be read \(RecursionError\); restore it from git"):
        read_lock(deep)


def test_sync_locks_what_it_can_and_names_what_it_could_not(tmp_path, hub, monkeypatch, capsys):
    """Issue 64: a hub dataset as a user's task, under a default model the user's hub (a mirror) does not hold: the
    task is locked, the model named with its cause, and the command fails."""
    def resolve(repo_id, repo_type, revision, kind, name):
        if kind == "model":
            raise LayersimError(f"could not download model {name!r} from the Hugging Face hub: 404 Not Found; "
                                "without network use an offline model: tiny-bert.")
        return B

    monkeypatch.setattr(lockfile, "hub_commit", resolve)
    lock = tmp_path / "layersim.lock"
    with pytest.raises(lockfile.NotLocked) as error:
        update(_params(tmp_path), lock)
    assert error.value.changes == [f"task rte: {B[:12]} ({EXPORT})"]
    assert str(error.value) == (f"1 hub entry of params.yaml could not be locked ({lock} holds the 1 written and the "
                                "rest as they were): could not download model 'roberta-base' from the Hugging Face "
                                "hub: 404 Not Found; without network use an offline model: tiny-bert.")
    assert read_lock(lock)["tasks"]["rte"]["commit"] == B and read_lock(lock)["models"] == {}

    assert lockfile.main(["sync", "--params", str(tmp_path / "params.yaml"), "--lock", str(lock)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: 1 hub entry of params.yaml could not be locked")  # rte: locked before


def test_sync_needs_only_the_names_params_yaml_reads(tmp_path, hub, capsys):
    """A params.yaml the stages refuse for another reason (a max_length too long for the model) is locked all the
    same, with that reason noted."""
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"model": "tiny-bert", "tasks": ["rte"], "seeds": [1],
                                      "finetune": {"max_length": 4096}}))
    lock = tmp_path / "layersim.lock"
    assert lockfile.main(["sync", "--params", str(params), "--lock", str(lock)]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == f"task rte: {B[:12]} ({EXPORT})" and read_lock(lock)["tasks"]["rte"]["commit"] == B
    assert err.startswith("note: params.yaml: finetune.max_length = 4096 is too long for model 'tiny-bert'")
    params.write_text(yaml.safe_dump({"model": "tiny-bert", "tasks": ["no-such-task"], "seeds": [1]}))
    assert lockfile.main(["sync", "--params", str(params), "--lock", str(lock)]) == 1  # a name it cannot read
    assert "error: params.yaml: tasks has 'no-such-task', which is not a known task" in capsys.readouterr().err


@pytest.mark.parametrize("mirror", [None, "/srv/hub"])
def test_a_download_with_the_hub_switched_off_names_the_switch_and_the_mirror(monkeypatch, mirror):
    """Issue 64: under smallest.sh (HF_HUB_OFFLINE=1) a hub task said only "Couldn't reach ... (OfflineModeIsEnabled)"."""
    import datasets

    from layersim.data.tasks import hub_table

    def offline(path, **kwargs):  # what datasets raises offline (a dataset in its cache would load instead)
        raise ConnectionError(f"Couldn't reach '{path}' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    if mirror:
        monkeypatch.setenv(HUB_MIRROR_ENV, mirror)
    else:
        monkeypatch.delenv(HUB_MIRROR_ENV, raising=False)
    with pytest.raises(LayersimError) as error:
        hub_table(get_task("rte"), "validation")
    message = str(error.value)
    switched_off = ("HF_HUB_OFFLINE=1 and HF_DATASETS_OFFLINE=1 are set (quickstart.sh and smallest.sh set them), so "
                    f"the hub is never asked: unset it to download, or set {HUB_MIRROR_ENV} to a folder laid out like "
                    "the hub; without network use an offline task: ")
    assert (switched_off in message) == (mirror is None), message  # a mirror folder is no hub: the switch is no cause
    assert "\n" not in message
