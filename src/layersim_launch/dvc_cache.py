"""DVC's cache checked against dvc.lock: no run or push uses bytes an in-place edit changed (docs/experiments.md,
"Sharing results").

The project links DVC's cache into the workspace (`.dvc/config`: ``cache.type = hardlink,symlink``), so an output
file and its cache object are one file. As root (as in most containers) the read-only bit does not stop a write, and
an in-place edit of an output (``echo >> config.json``, pandas rewriting a table to its own path) changes the cache
object itself. DVC does not look again: a rerun of the stage finds the object already there and links the damaged
bytes back, ``dvc status`` is clean, and ``dvc push`` uploads them (its ``cache.verify`` is not applied when a stage's
outputs are committed). A cache object is named by the md5 of its bytes, so its damage is found by hashing it
again: :func:`damaged_files` does, for every file of every output that dvc.lock records, and
:func:`refuse_damaged` turns what it finds into one sentence. Every stage DVC runs checks before it starts
(layersim.cli.run_stage), ``layersim push`` before ``dvc push``, ``layersim launch`` and the run scripts before they
start, git's pre-push hook before ``git push`` (:func:`main`; the hook: layersim_launch.sharing); a stage DVC restores
from its run-cache runs no code, so a ``dvc repro`` that only restores does not look, nor does a plain ``dvc push``:
DVC has no hook there. The colleague's pull is guarded by DVC itself (the remote's ``verify = true``, which
``layersim push`` requires, rehashes what it downloads and keeps no object whose bytes do not match its name). DVC's
own check of a local object trusts its read-only mode, which root's edit leaves as it was. A copying cache
(``cache.type reflink,copy``) would make the edit impossible but, without reflinks, doubles the bytes: the links stay
the default (docs/experiments.md, "Sharing results", weighs it).

A verified object's stamp (inode, size, modification and change times) is kept in the cache folder, so that an
object is hashed again only after something wrote to it: the change time cannot be set back by a user. As git does
for its index, an object changed within the last seconds (the file system's clock is coarse) is not remembered.

It reads DVC's files (dvc.lock, the config files, the cache folder) and imports nothing of DVC but where its config
files live, so a stage pays milliseconds for it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

from layersim.errors import LayersimError

OBJECTS = Path("files") / "md5"  # DVC 3's objects, named by the md5 of their bytes
STAMPS = "layersim-verified.json"  # in the cache folder: one record for every workspace that shares the cache
DIR_SUFFIX = ".dir"
LOCK_READS = 5  # tries at a dvc.lock that DVC may be rewriting
RACY_NS = 2_000_000_000  # an object changed this recently is hashed again next time: a write in the same clock tick


@dataclass(frozen=True)
class Damaged:
    """An output file (its workspace path) whose cache object no longer hashes to its name."""
    path: str
    cache_object: Path


def config_files(root: str | os.PathLike) -> list[tuple[Path, dict]]:
    """DVC's config files of the project at `root` that exist, as (path, sections), in DVC's precedence:
    .dvc/config.local, .dvc/config, the user's, the system's."""
    from configobj import ConfigObj
    from dvc.dirs import global_config_dir, system_config_dir  # where DVC looks: two functions, no DVC repo code

    dvc_dir = Path(root) / ".dvc"
    paths = (dvc_dir / "config.local", dvc_dir / "config", Path(global_config_dir()) / "config",
             Path(system_config_dir()) / "config")
    return [(path, ConfigObj(str(path))) for path in paths if path.is_file()]


def cache_folder(root: str | os.PathLike) -> Path:
    """DVC's cache folder of the project at `root`: ``cache.dir`` of the first of DVC's config files that sets it
    (relative to the file's folder), else .dvc/cache."""
    for path, sections in config_files(root):
        folder = sections.get("cache", {}).get("dir")
        if folder:
            return (path.parent / folder).resolve()
    return Path(root) / ".dvc" / "cache"


def _object_path(cache: Path, md5: str) -> Path:
    return cache / OBJECTS / md5[:2] / md5[2:]


def from_root(path: str) -> str:
    """An output's path in dvc.lock (relative to its stage's wdir) from the project root: the path guard's stages (every
    stage whose outputs hold params values) run in params-guard/ or params-guard/owner/ (docs/params-safety.md),
    and each of their paths climbs back first."""
    parts = path.split("/")
    while parts and parts[0] == "..":
        parts.pop(0)
    return "/".join(parts)


def locked_files(root: str | os.PathLike, cache: Path) -> dict[Path, list[str]]:
    """Cache object → the output files dvc.lock records with those bytes, for every output of every stage whose
    object the cache holds (a directory's files listed by its .dir object, which is itself checked)."""
    import yaml

    lock = Path(root) / "dvc.lock"
    if not lock.is_file():
        return {}
    # libyaml's loader where PyYAML has it: the paper configuration's dvc.lock is read before every stage
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    for attempt in range(LOCK_READS):  # DVC rewrites dvc.lock in place: a stage run beside it may catch it half-written
        try:
            stages = (yaml.load(lock.read_text(), Loader=loader) or {}).get("stages", {})
            break
        except yaml.YAMLError as err:
            if attempt == LOCK_READS - 1:
                raise LayersimError(f"{lock} cannot be read ({str(err).splitlines()[0]}), so DVC's cache cannot be "
                                    "checked against it; run dvc status to see what DVC makes of it.") from None
            time.sleep(0.5)
    found: dict[Path, list[str]] = {}
    for entry in stages.values():
        for out in entry.get("outs", []):
            md5 = out.get("md5")
            if out.get("hash") != "md5" or not md5:
                continue
            obj = _object_path(cache, md5)
            if not obj.is_file():  # not cached (cache: false), or not pulled yet
                continue
            path = from_root(out["path"])
            found.setdefault(obj, []).append(path)
            if md5.endswith(DIR_SUFFIX):
                try:
                    listing = json.loads(obj.read_bytes())
                except ValueError:
                    continue  # its own hash no longer matches: reported as damaged
                for item in listing:
                    part = _object_path(cache, item["md5"])
                    if part.is_file():
                        found.setdefault(part, []).append(f"{path}/{item['relpath']}")
    return found


def file_md5(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "md5").hexdigest()


def _stamp(path: Path) -> list[int]:
    info = path.stat()
    return [info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns]


def damaged_files(root: str | os.PathLike) -> list[Damaged]:
    """Every output file of dvc.lock whose cache object's bytes no longer hash to its name, sorted by path;
    objects unchanged since they were last verified (their stamp) are not read again."""
    cache = cache_folder(root)
    objects = locked_files(root, cache)
    if not objects:
        return []
    stamps_file = cache / STAMPS
    try:
        stamps = json.loads(stamps_file.read_text())
    except (OSError, ValueError):
        stamps = {}
    damaged, remembered = [], dict(stamps)
    for obj, paths in objects.items():
        key, stamp = str(obj.relative_to(cache)), _stamp(obj)
        if stamps.get(key) == stamp:
            continue
        if file_md5(obj) == (obj.parent.name + obj.name).removesuffix(DIR_SUFFIX):
            if time.time_ns() - max(stamp[2:]) > RACY_NS:
                remembered[key] = stamp
        else:
            remembered.pop(key, None)
            damaged += [Damaged(path, obj) for path in paths]
    if remembered != stamps:
        _write_stamps(stamps_file, remembered)
    return sorted(damaged, key=lambda d: d.path)


def _write_stamps(path: Path, stamps: dict) -> None:
    """Atomically (several stages may check at once: the last writer wins, a lost stamp costs one hash)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(stamps, sort_keys=True))
        os.replace(tmp, path)
    except OSError:  # a read-only cache: nothing is remembered, every check hashes again
        tmp.unlink(missing_ok=True)


def refuse_damaged(root: str | os.PathLike, before: str) -> None:
    """One sentence naming every damaged output file and its cache object, and how to repair them, if any;
    `before`: what the check guards ("this stage runs", "dvc push")."""
    damaged = damaged_files(root)
    if not damaged:
        return
    root = Path(root)

    def shown(path: Path | str) -> str:
        path = Path(path)
        return str(path.relative_to(root.resolve())) if path.is_absolute() and path.is_relative_to(root.resolve()) \
            else str(path)

    files = ", ".join(f"{d.path} (cache object {shown(d.cache_object)})" for d in damaged)
    # A directory's listing (.dir) is no workspace file: only its object goes.
    removal = " ".join(shlex.quote(p) for p in dict.fromkeys(
        [*(d.path for d in damaged if not d.cache_object.name.endswith(DIR_SUFFIX)),
         *(shown(d.cache_object) for d in damaged)]))
    raise LayersimError(
        f"DVC's cache holds other bytes than dvc.lock records for {files}: an output was edited in place through "
        f"its link into the cache (refused before {before}, which would pass the changed bytes on); remove the "
        f"damaged copies "
        f"(rm -f {removal}) and run dvc repro (or dvc pull, where a remote holds good ones) to write them again; a "
        "remote that a plain dvc push sent them to keeps them until you delete them there (files/md5/<the object's "
        "name>).")


def main(argv: list[str] | None = None) -> int:
    """``python -m layersim_launch.dvc_cache [ROOT] [--before WHAT]``: the check on its own, exit status 1 with the
    sentence. quickstart.sh and smallest.sh run it before `dvc exp run` (whose stages restored from the run-cache run
    no stage code), git's pre-push hook before `git push` (layersim_launch.sharing)."""
    import argparse
    import sys

    p = argparse.ArgumentParser(prog="python -m layersim_launch.dvc_cache", description=main.__doc__.splitlines()[0])
    p.add_argument("root", nargs="?", default=".", help="the DVC workspace (default: here)")
    p.add_argument("--before", default="dvc exp run", help="what the check guards, for the sentence")
    args = p.parse_args(argv)
    try:
        refuse_damaged(args.root, args.before)
    except LayersimError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
