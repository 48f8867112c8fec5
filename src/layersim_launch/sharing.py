"""What layersim adds to DVC's sharing so that bytes an in-place edit changed never reach a colleague
(docs/experiments.md, "Sharing results").

A plain `dvc push` runs no layersim code and DVC has no hook there, so it uploads a cache object that an edit through
its hardlink changed (layersim_launch.dvc_cache) under its old name. Two things keep those bytes from a colleague:

- the remote's ``verify = true`` in .dvc/config, the config file git carries to the colleague: their `dvc pull`
  rehashes every object it downloads and keeps none whose bytes differ from its name. `layersim push` refuses a
  remote without it (:func:`refuse_unverified_remote`), so that a project shared the documented way carries it;
- git's pre-push hook, which `layersim install-hook` writes (:func:`install_hook`): `git push`, which takes the
  commit that names the outputs to the colleague, first runs the cache check and stops at a damaged object, naming the
  file, whatever pushed the bytes before it.
"""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

from layersim.errors import LayersimError
from layersim_launch.dvc_cache import config_files

SHARED_CONFIG = Path(".dvc") / "config"  # the one DVC config file that git carries
HOOK_MARK = "# layersim: DVC's cache checked against dvc.lock first (layersim install-hook; docs/experiments.md)"
TRUE = ("true", "1", "yes", "on")


def pushed_remote(root: str | os.PathLike, dvc_args: list[str]) -> str | None:
    """The remote `dvc push <dvc_args>` uploads to: its -r / --remote, else core.remote of the first of DVC's config
    files that sets it; None where none is named (DVC then says so itself)."""
    for i, arg in enumerate(dvc_args):
        if arg in ("-r", "--remote") and i + 1 < len(dvc_args):
            return dvc_args[i + 1]
        if arg.startswith("--remote="):
            return arg.partition("=")[2]
        if arg.startswith("-r") and not arg.startswith("--") and len(arg) > 2:
            return arg[2:]
    for _, sections in config_files(root):
        name = sections.get("core", {}).get("remote")
        if name:
            return name
    return None


def refuse_unverified_remote(root: str | os.PathLike, dvc_args: list[str]) -> None:
    """One sentence when the remote `dvc push <dvc_args>` uploads to has no ``verify = true`` in .dvc/config: a
    colleague's pull from it would keep whatever bytes it finds there."""
    name = pushed_remote(root, dvc_args)
    if name is None:
        return
    shared = Path(root) / SHARED_CONFIG
    sections = dict(next((s for path, s in config_files(root) if path == shared), {}))
    if str(sections.get(f'remote "{name}"', {}).get("verify", "")).strip().lower() in TRUE:
        return
    raise LayersimError(
        f"the remote '{name}' does not set verify true in .dvc/config, the config file git carries to a colleague, "
        "so their dvc pull would keep bytes that do not match their names (a plain dvc push uploads an output edited "
        f"in place as it is); run dvc remote modify {name} verify true, commit .dvc/config and run layersim push "
        "again.")


def _hooks_folder(root: Path) -> Path:
    """Where git looks for the repository's hooks (core.hooksPath, a worktree's common folder)."""
    try:
        found = subprocess.run(["git", "rev-parse", "--git-path", "hooks"], cwd=root, capture_output=True, text=True,
                               check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as err:
        detail = getattr(err, "stderr", "") or str(err)
        raise LayersimError(f"{root} is not a git repository that git can read ({detail.strip().splitlines()[-1]}); "
                            "run layersim install-hook in the project's git checkout.") from None
    return root / found


def install_hook(root: str | os.PathLike) -> Path:
    """Git's pre-push hook of the repository at `root`, with the cache check as its first command (this Python, so
    that the hook finds layersim whatever the shell's PATH); another hook's lines (DVC's `dvc install`) stay after it.
    Running it again replaces the check's line. Returns the hook's path."""
    root = Path(root).resolve()
    hook = _hooks_folder(root) / "pre-push"
    check = f"{shlex.quote(sys.executable)} -m layersim_launch.dvc_cache --before 'git push' || exit 1"
    lines = hook.read_text().splitlines() if hook.is_file() else []
    if HOOK_MARK in lines:  # ours already: its check line follows the mark
        at = lines.index(HOOK_MARK)
        del lines[at:at + 2]
    start = 1 if lines and lines[0].startswith("#!") else 0
    if start == 0:
        lines.insert(0, "#!/bin/sh")
        start = 1
    lines[start:start] = [HOOK_MARK, check]
    hook.parent.mkdir(parents=True, exist_ok=True)
    hook.write_text("\n".join(lines) + "\n")
    hook.chmod(hook.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return hook
