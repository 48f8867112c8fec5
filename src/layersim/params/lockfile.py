"""layersim.lock: the hub commit of every model and dataset the experiment reads, like a package lock.

A branch moves (``main`` of a model, the ``refs/convert/parquet`` export of a dataset), so a name alone would
read other weights or rows next month. The lock maps each hub model and each hub task that params.yaml names
to the commit its revision resolved to when the lock was written; the download stages read exactly that
commit and never resolve a branch themselves, so a rerun (``dvc repro -f``, a fresh clone, a colleague) reads
what this run read, and nothing moves unless the lock is refreshed:

    python -m layersim.params.lockfile sync       # record what params.yaml names and the lock lacks (keeps the rest;
                                                  # what the hub cannot resolve is named, the others written)
    python -m layersim.params.lockfile refresh    # move every entry (or the names given) to its revision's commit now

The download stages depend on the file (dvc.yaml), so a refresh reruns them; an entry whose commit did not
move gives byte-identical outputs, so nothing after them reruns. Offline sources (tiny-*, minilm-l6,
local/<folder>, synth-*, user files) have no commit and no entry; with ``LAYERSIM_HUB_MIRROR`` the folder is
read instead of the hub, and the lock is not consulted.

Entries are keyed by the names params.yaml uses (a model name or hub id; a task name, since two tasks may read
one repository at different revisions) and record the repository, the revision asked for and the commit.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

from layersim.errors import LayersimError, hub_unreachable
from layersim.data.io import write_json
from layersim.models.registry import OFFLINE_CHOICES, get_model
from layersim.data.tasks import HUB_MIRROR_ENV, TaskSpec, get_task

LOCK_FILE = Path("layersim.lock")  # at the repository root, where the stages run
VERSION = 1
_COMMIT = re.compile(r"[0-9a-f]{40}")
_ABOUT = ("The hub commit each model and task is read at; written by `python -m layersim.params.lockfile sync` or "
          "`refresh`, read by the download stages. Commit it with the experiment.")
_REMEDY = ("run `python -m layersim.params.lockfile sync` to record the commit it resolves to now (or `refresh {name}` "
           "to move it) and commit {lock}; sync asks the Hugging Face hub, so it needs the network (offline, pick an "
           "offline model or task instead: tiny-*, minilm-l6, local/<folder>, synth-*, user files)")


def empty_lock() -> dict:
    return {"about": _ABOUT, "version": VERSION, "models": {}, "tasks": {}}


def read_lock(path: str | Path = LOCK_FILE) -> dict:
    """The lock at `path` (an empty one if there is no file); a file that is not a lock is one sentence."""
    path = Path(path)
    if not path.exists():
        return empty_lock()
    try:
        lock = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise LayersimError(f"{path} cannot be read ({getattr(err, 'msg', None) or type(err).__name__}); restore it "
                            "from git or write it again with `python -m layersim.params.lockfile refresh`.") from None
    if not (isinstance(lock, dict) and lock.get("version") == VERSION and isinstance(lock.get("models"), dict)
            and isinstance(lock.get("tasks"), dict)):
        raise LayersimError(f"{path} is not a layersim lock of version {VERSION} (an object with 'version', 'models' "
                            "and 'tasks'); restore it from git or write it again with "
                            "`python -m layersim.params.lockfile refresh`.")
    return lock


def write_lock(lock: dict, path: str | Path = LOCK_FILE) -> None:
    try:
        write_json({**lock, "about": _ABOUT, "version": VERSION}, path)  # sorted keys: a refresh diffs by entry
    except OSError as err:
        raise LayersimError(f"{path} cannot be written ({err.strerror or type(err).__name__}); run the command where "
                            "you can write the experiment's files (its repository's root).") from None


# --- what params.yaml reads from the hub -----------------------------------------------------------------

def model_want(name: str) -> dict | None:
    """What the lock must hold for model `name`: its repository and the revision asked for; None offline."""
    spec = get_model(name)
    if spec.source != "hub":
        return None
    return {"hub_id": spec.hub_id, "revision": spec.revision or "main"}


def task_want(spec: TaskSpec, revision: str | None = None) -> dict | None:
    """What the lock must hold for task `spec` read at `revision` (download.revisions; default the registry's
    export); None for a task that is not read from the hub."""
    if spec.hub is None:
        return None
    return {"dataset": spec.hub.path, "config": spec.hub.config, "revision": revision or spec.hub.revision}


def wanted(params) -> dict[str, dict[str, dict]]:
    """Every hub model and hub task that `params` names, with what its lock entry must hold."""
    from layersim.params import paired_models

    models = dict.fromkeys([params.model, *params.compare.models, *paired_models(params)])
    found: dict[str, dict[str, dict]] = {"models": {}, "tasks": {}}
    for name in models:
        if (want := model_want(name)) is not None:
            found["models"][name] = want
    for name in params.tasks:
        if (want := task_want(get_task(name), params.download.revisions.get(name))) is not None:
            found["tasks"][name] = want
    return found


# --- resolving a revision at the hub ---------------------------------------------------------------------

def hub_commit(repo_id: str, repo_type: str, revision: str, kind: str, name: str) -> str:
    """The commit that `revision` (a branch, tag, ``refs/...`` ref or commit) of the hub repository
    `repo_id` points to now. Named refs are looked up in the repository's refs (``list_repo_refs``: a ref
    whose name holds '/', such as ``refs/convert/parquet``, cannot be put in a revision URL everywhere);
    anything else (a commit, or its prefix) is asked of the repository's info at that revision."""
    from huggingface_hub import HfApi

    where = f"the Hugging Face hub ({repo_id} at revision {revision!r})"
    offline = OFFLINE_CHOICES if kind == "model" else _offline_tasks()
    mirror = HUB_MIRROR_ENV if kind == "task" else None  # a mirror folder stands in for hub datasets only
    api = HfApi()
    try:
        refs = api.list_repo_refs(repo_id, repo_type=repo_type, include_pull_requests=revision.startswith("refs/pr/"))
    except Exception as err:  # noqa: BLE001 - HTTP, offline-mode and connection errors of whichever HTTP client
        raise hub_unreachable(kind, name, err, offline, where, mirror) from err
    # Branches and tags answer to their short name too (main, v1.0); refs/convert/*, refs/pr/* only in full.
    named = {ref.ref: ref.target_commit for ref in [*refs.converts, *(refs.pull_requests or [])]}
    named |= {key: ref.target_commit for ref in [*refs.branches, *refs.tags] for key in (ref.ref, ref.name)}
    if revision in named:
        return named[revision]
    if not re.fullmatch(r"[0-9a-f]{4,40}", revision):
        names = [ref.name for ref in [*refs.branches, *refs.tags]] + [ref.ref for ref in refs.converts]
        raise LayersimError(f"{kind} {name!r}: {repo_id} has no revision {revision!r}; it has "
                            f"{', '.join(names) or 'no branches'} (or give a commit).")
    try:
        info = api.repo_info(repo_id, repo_type=repo_type, revision=revision)
    except Exception as err:  # noqa: BLE001 - as above; an unknown commit is the hub's 404
        raise hub_unreachable(kind, name, err, offline, where, mirror) from err
    if not info.sha or not info.sha.startswith(revision):
        raise LayersimError(f"{kind} {name!r}: {where} answered commit {info.sha!r}, which is not {revision!r}.")
    return info.sha


def _offline_tasks() -> tuple[str, ...]:
    from layersim.data.tasks.generated import GENERATED_TASKS

    return tuple(GENERATED_TASKS)


def _resolve(section: str, name: str, want: dict) -> dict:
    if section == "models":
        commit = hub_commit(want["hub_id"], "model", want["revision"], "model", name)
    else:
        commit = hub_commit(want["dataset"], "dataset", want["revision"], "task", name)
    return {**want, "commit": commit}


# --- what the download stages read -----------------------------------------------------------------------

def _entry(lock: dict, section: str, name: str) -> dict | None:
    entry = lock[section].get(name)
    return entry if isinstance(entry, dict) else None  # anything else was not written here: as if missing


def _locked(section: str, name: str, want: dict, path: Path) -> str:
    kind = section[:-1]
    entry = _entry(read_lock(path), section, name)
    remedy = _REMEDY.format(name=name, lock=path)
    if entry is None:
        raise LayersimError(f"{kind} {name!r} has no commit in {path}; {remedy}.")
    asked = {key: entry.get(key) for key in want}
    if asked != want:
        raise LayersimError(f"{path} locks {kind} {name!r} as {asked}, but params.yaml asks for {want}; {remedy}.")
    commit = entry.get("commit")
    if not isinstance(commit, str) or not _COMMIT.fullmatch(commit):
        raise LayersimError(f"{path} locks {kind} {name!r} at {commit!r}, which is not a 40-digit commit; {remedy}.")
    return commit


def locked_model_revision(name: str, path: str | Path = LOCK_FILE) -> str | None:
    """The commit the download stage reads model `name` at (None for an offline model)."""
    want = model_want(name)
    return None if want is None else _locked("models", name, want, Path(path))


def locked_task_revision(spec: TaskSpec, revision: str | None = None, path: str | Path = LOCK_FILE) -> str | None:
    """The commit the download stage reads hub task `spec` at, asked at `revision` (download.revisions);
    with ``LAYERSIM_HUB_MIRROR`` set, `revision` unchanged (a folder has no commits)."""
    want = task_want(spec, revision)
    if want is None or os.environ.get(HUB_MIRROR_ENV):
        return revision
    return _locked("tasks", spec.name, want, Path(path))


# --- sync and refresh ------------------------------------------------------------------------------------

def update(params, path: str | Path = LOCK_FILE, refresh: bool = False, names: tuple[str, ...] = ()) -> list[str]:
    """Bring the lock at `path` up to `params`: record every hub model and task it names whose entry is
    missing or asks for another repository or revision; with `refresh`, re-resolve those entries too (all of
    them, or only `names`), so each moves to its revision's commit now. Entries that params no longer names
    are kept (another experiment may read them). Returns one line per entry written."""
    path = Path(path)
    lock, want = read_lock(path), wanted(params)
    unknown = sorted(set(names) - set(want["models"]) - set(want["tasks"]))
    if unknown:
        raise LayersimError(f"{unknown[0]!r} is not a hub model or hub task of params.yaml; the ones it names are: "
                            f"{', '.join([*want['models'], *want['tasks']]) or 'none'}.")
    changes, failures = [], []
    for section in ("models", "tasks"):
        for name, asked in want[section].items():
            entry = _entry(lock, section, name)
            current = (entry is not None and {key: entry.get(key) for key in asked} == asked
                       and isinstance(entry.get("commit"), str) and bool(_COMMIT.fullmatch(entry["commit"])))
            if current and not (refresh and (not names or name in names)):
                continue
            try:
                new = _resolve(section, name, asked)
            except LayersimError as err:  # the others are locked all the same (a mirror may hold one dataset only)
                failures.append(str(err).rstrip("."))
                continue
            if new != entry:
                before = f"{str(entry.get('commit'))[:12]} -> " if entry and entry.get("commit") else ""
                changes.append(f"{section[:-1]} {name}: {before}{new['commit'][:12]} ({asked['revision']})")
            lock[section][name] = new
    if changes or not path.exists():
        write_lock(lock, path)
    if failures:
        raise NotLocked(changes, f"{len(failures)} hub entr{'y' if len(failures) == 1 else 'ies'} of params.yaml "
                                 f"could not be locked ({path} holds the {len(changes)} written and the rest as they "
                                 f"were): {'; '.join(failures)}.")
    return changes


class NotLocked(LayersimError):
    """Some entries could not be resolved; `changes` lists those written all the same."""

    def __init__(self, changes: list[str], message: str):
        super().__init__(message)
        self.changes = changes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m layersim.params.lockfile", description=__doc__.splitlines()[0])
    p.add_argument("command", choices=("sync", "refresh"),
                   help="sync: record what params.yaml names and the lock lacks; refresh: move entries to their "
                        "revision's commit now")
    p.add_argument("names", nargs="*", help="refresh only these models or tasks (default: every one params.yaml names)")
    p.add_argument("--params", type=Path, default=Path("params.yaml"), help="params file (default: params.yaml)")
    p.add_argument("--lock", type=Path, default=LOCK_FILE, help=f"lock file (default: {LOCK_FILE})")
    args = p.parse_args(argv)
    from layersim.params import load_params
    from layersim.params.validate import parse_sources

    try:
        if args.names and args.command == "sync":
            raise LayersimError("sync takes no names (it records every missing entry); use `refresh NAME` to move one.")
        try:
            params = load_params(args.params)
        except LayersimError as invalid:  # the lock needs only the names of what is read: lock them all the same
            params = load_params(args.params, parse_sources)
            print(f"note: {invalid} The stages will refuse params.yaml for that; the lock does not depend on it, "
                  "so it is written all the same.", file=sys.stderr)
        changes = update(params, args.lock, args.command == "refresh", tuple(args.names))
    except NotLocked as err:
        print(*err.changes, sep="\n", end="\n" if err.changes else "")
        print(f"error: {err}", file=sys.stderr)
        return 1
    except LayersimError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    for line in changes:
        print(line)
    print(f"{args.lock}: {len(changes)} entr{'y' if len(changes) == 1 else 'ies'} written"
          + (f"; commit {args.lock} with the experiment" if changes else ", up to date"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
