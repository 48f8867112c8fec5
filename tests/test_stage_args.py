"""dvc.yaml's commands carry no params value: @model, @task and @seed are filled in by the stage's own parser
from the validated params and the matrix item DVC names in DVC_STAGE (layersim.params.stage_args)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from dvc_project import repository_params, tiny_params
from dvc_yaml import GUARD_CD, command
from layersim import cli
from layersim.errors import LayersimError
from layersim.params import load_params
from layersim.params.stage_args import fill_placeholders, matrix_item

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def params_file(tmp_path: Path) -> Path:
    doc = tiny_params(repository_params(), model="tiny-bert", tasks=["synth-negation", "synth-roles"], seeds=[1, 12])
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_no_stage_command_interpolates_a_params_value() -> None:
    """DVC runs `cmd` in a shell: a `${...}` there is a params value in shell code (docs/params-safety.md). The one
    exception, the path guard's `cd ${params_guard.root}`, comes from the guard's own file, loaded only by a stage
    whose vars name it (params.yaml cannot redefine it: DVC refuses a key defined twice)."""
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    interpolated = {name: stage["cmd"] for name, stage in stages.items() if "${" in command(stage)}
    assert interpolated == {}
    guarded = {name for name, stage in stages.items() if stage["cmd"].startswith(GUARD_CD)}
    assert guarded and all(stages[name]["vars"] == ["params-must-be-plain-names.yaml"] for name in guarded)


def test_placeholders_take_the_validated_values_of_the_item_dvc_runs(params_file: Path) -> None:
    params = load_params(params_file)
    argv = ["--task", "@task", "--seed", "@seed", "--out", "data/checkpoints/@model/@task/seed@seed", "--x", "@seeds"]
    assert fill_placeholders(argv, params, "finetune@synth-roles-12") == [
        "--task", "synth-roles", "--seed", "12", "--out", "data/checkpoints/tiny-bert/synth-roles/seed12", "--x",
        "@seeds"]
    assert fill_placeholders(["@task", "data/tasks/@task"], params, "download_task@synth-negation") == [
        "synth-negation", "data/tasks/synth-negation"]
    # @model alone needs no matrix item; the stage's address may carry its dvc.yaml's path
    assert fill_placeholders(["data/models/@model/pretrained"], params, None) == ["data/models/tiny-bert/pretrained"]
    assert matrix_item("sub/dvc.yaml:extract@synth-roles", params, with_seed=False) == {"task": "synth-roles"}


@pytest.mark.parametrize("stage, fragment", [
    (None, r"DVC_STAGE environment variable \(unset here\)"),
    ("finetune", r"DVC_STAGE environment variable \(finetune here\)"),
    ("finetune@synth-roles-3", r"DVC_STAGE = 'finetune@synth-roles-3' names no single matrix item .*synth-roles-12"),
    ("finetune@synth-roles-12;touch PWNED", "names no single matrix item"),
])
def test_an_item_that_params_does_not_hold_is_refused(params_file: Path, stage, fragment: str) -> None:
    with pytest.raises(LayersimError, match=fragment):
        fill_placeholders(["--task", "@task", "--seed", "@seed"], load_params(params_file), stage)


def test_the_stage_parser_fills_in_before_parsing(params_file: Path, monkeypatch) -> None:
    """--seed is an int: the placeholder is replaced before argparse converts it."""
    monkeypatch.setenv("DVC_STAGE", "finetune@synth-negation-12")
    p = cli.parser("test")
    p.add_argument("--seed", type=int)
    p.add_argument("--out", type=Path)
    args = p.parse_args(["--params", str(params_file), "--seed", "@seed", "--out", "ckpt/@model/@task"])
    assert (args.seed, args.out) == (12, Path("ckpt/tiny-bert/synth-negation"))


def test_a_hostile_value_stops_the_parser_with_one_line(params_file: Path, monkeypatch, capsys) -> None:
    params_file.write_text(params_file.read_text().replace("model: tiny-bert", "model: 'a/b;touch PWNED;#'"))
    monkeypatch.setenv("DVC_STAGE", "download_model")
    monkeypatch.setattr(sys, "argv", ["download_model.py", "--params", str(params_file), "data/models/@model/x"])
    p = cli.parser("test")
    p.add_argument("out")
    with pytest.raises(SystemExit) as exited:
        p.parse_args()
    err = capsys.readouterr().err
    assert exited.value.code == 1 and len(err.splitlines()) == 1, err
    assert err.startswith("error: params.yaml: model = 'a/b;touch PWNED;#' is not a valid"), err
