"""dvc.yaml's stages as the tests read them, from the project root: a stage whose outputs hold params values runs
in its path guard's folder (params-guard/, or params-guard/owner/ for a model of owner/name,
docs/params-safety.md), so its command starts with `cd ${params_guard.root} && ` and each of its paths and its params
file with `${params_guard.root}/`, the way back to the root that the guard's own file gives (never a params value:
params.yaml cannot redefine it)."""

from __future__ import annotations

from layersim_launch.dvc_cache import from_root as lock_path  # noqa: F401 - a dvc.lock path from the root

GUARD_ROOT = "${params_guard.root}"
GUARD_CD = f"cd {GUARD_ROOT} && "


def command(stage: dict) -> str:
    """The stage's command as run from the project root: without the guard's `cd`."""
    return stage["cmd"].removeprefix(GUARD_CD)


def from_root(path: str) -> str:
    """A path of the stage (a dep, an output) relative to the project root."""
    return path.removeprefix(f"{GUARD_ROOT}/")



def params_keys(stage: dict) -> list[str]:
    """The params.yaml keys the stage lists: as plain entries, or under the root's params.yaml reached through the
    guard's way back (`${params_guard.root}/params.yaml: [keys]`)."""
    keys = []
    for entry in stage.get("params") or ():
        if isinstance(entry, str):
            keys.append(entry)
        else:
            (file, listed), = entry.items()
            assert from_root(file) == "params.yaml", file
            keys += listed or []
    return keys
