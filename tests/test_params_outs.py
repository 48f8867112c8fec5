"""No params value makes DVC remove a user's file: DVC deletes a stage's outputs (and `dvc exp run` resets them)
before any command, the params gate included, can refuse a value, at the paths it makes from `${model}`,
`${item.task}` and `${item.seed}`. Every such path ends in a fixed leaf after its last `${…}`
(layersim.data.layout, docs/params-safety.md), so a value such as `../../user_data` names `user_data/splits`,
never `user_data/` itself. Checked on dvc.yaml, and with the real commands of issue 49 on untracked user files."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from dvc_project import dvc, make_project, output, run, tiny_params

REPO = Path(__file__).resolve().parents[1]
INTERPOLATION = re.compile(r"\$\{[^}]*\}")


def _declared_paths(stage: dict) -> list[str]:
    """Every path DVC removes or resets for a stage: its outs, metrics and plots (each a string or a one-key dict)."""
    return [entry if isinstance(entry, str) else next(iter(entry))
            for kind in ("outs", "metrics", "plots") for entry in stage.get(kind) or ()]


def test_every_output_named_by_a_params_value_ends_in_a_fixed_leaf():
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    interpolated = {(name, path) for name, stage in stages.items() for path in _declared_paths(stage)
                    if INTERPOLATION.search(path)}
    assert len(interpolated) > 30  # the matrix stages' outputs: the check below is not vacuous
    # After the last ${…} must come "/" and a whole fixed name: "${item.task}.json" or "seed${item.seed}" would
    # let a value end the path at a user's own file.
    loose = sorted((name, path) for name, path in interpolated
                   if not re.fullmatch(r"/[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*", INTERPOLATION.split(path)[-1]))
    assert loose == [], f"outputs whose last part holds a params value: {loose}"


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("outs-safety")
    env = make_project(root, lambda params: tiny_params(params))
    run(dvc("repro", "download_model"), root, env)  # so that `repro -s` of a later stage finds its deps
    return root, env


USER_FILES = ("user_data/train.csv", "models/notes.txt", "mine/thesis.tex")


def _plant(root: Path) -> None:
    for relative in USER_FILES:
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(f"the user's own {relative}\n")


@pytest.mark.integration
@pytest.mark.parametrize("changes, command", [
    # The README's way to set params, whole pipeline: before, it deleted user_data/ then stopped at DVC's overlap error.
    ({}, ["exp", "run", "-S", 'tasks=["../../user_data"]']),
    ({}, ["exp", "run", "-S", 'model="../.."', "-S", 'tasks=["mine"]']),
    ({}, ["exp", "run", "-S", 'seeds=["/../../../../../../mine"]']),
    ({"tasks": ["../../user_data"]}, ["repro"]),
    ({"tasks": ["../../user_data"]}, ["repro", "-s", "download_task@../../user_data"]),
    ({"tasks": ["../../models"]}, ["repro", "--single-item", "download_task@../../models"]),
    ({"model": "../..", "tasks": ["mine"]}, ["repro", "-s", "extract@mine"]),
    ({"model": "../..", "tasks": ["mine"]}, ["repro", "--downstream", "extract@mine"]),
])
def test_no_command_with_a_hostile_value_deletes_a_user_file(project, changes, command) -> None:
    root, env = project
    _plant(root)
    before = sorted(str(p.relative_to(root)) for p in (root / "user_data").rglob("*"))
    params = yaml.safe_load((root / "params.yaml").read_text())
    (root / "params.yaml").write_text(yaml.safe_dump({**params, **changes}, sort_keys=False))
    try:
        result = run(dvc(*command), root, env, check=False)
    finally:
        run(["git", "checkout", "--", "params.yaml"], root, env)
    assert result.returncode != 0, output(result)  # refused: by DVC, by the gate or by the stage
    for relative in USER_FILES:
        assert (root / relative).read_text() == f"the user's own {relative}\n", f"{relative} lost: {output(result)}"
    assert sorted(str(p.relative_to(root)) for p in (root / "user_data").rglob("*")) == before  # nothing lost or added
