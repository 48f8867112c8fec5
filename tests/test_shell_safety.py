"""No params value runs as shell code: a hostile value given through the real `dvc exp run -S` is refused by
the check_params stage, which DVC runs before any command that interpolates params values
(docs/params-safety.md); and local model folders come only through the explicit form local/<folder>."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from dvc_project import dvc, make_project, output, run, tiny_params
from layersim.errors import LayersimError
from layersim.models.registry import get_model, model_info, snapshot_model


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("hostile")
    env = make_project(root, lambda params: tiny_params(params))
    return root, env


@pytest.mark.integration
@pytest.mark.parametrize("setting", [
    "model='x/y;touch PWNED;#'",
    "model='$(touch PWNED)/y'",
    "model='a/`touch PWNED`'",
    "tasks=['synth-negation;touch PWNED']",
    "compare.models=['a/b;touch PWNED']",
])
def test_dvc_exp_run_with_a_hostile_value_runs_no_command(project, setting: str) -> None:
    root, env = project
    result = run(dvc("exp", "run", "-S", setting), root, env, check=False)
    assert result.returncode != 0, output(result)
    assert not (root / "PWNED").exists() and not list(root.rglob("PWNED")), "a params value ran as a command"
    assert "Running stage 'check_params'" in result.stdout, output(result)
    ran = [line for line in result.stdout.splitlines() if line.startswith("Running stage")]
    assert ran == ["Running stage 'check_params':"], output(result)  # no other command started
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "PWNED" in errors[0] and ("not a valid" in errors[0] or "not a known" in errors[0])
    run(["git", "checkout", "--", "params.yaml"], root, env)


@pytest.fixture(scope="module")
def built(project) -> tuple[Path, dict]:
    """The project after its gate and downloads ran, so that `repro -s` of a later stage finds its deps: the
    state in which `-s` skips the gate (check_params) and, before placeholders, ran a hostile command."""
    root, env = project
    run(dvc("repro", "download_model", "download_task"), root, env)
    return root, env


@pytest.mark.integration
@pytest.mark.parametrize("key, value, command", [
    ("model", "a/b;touch PWNED;#", ["-s", "download_model"]),
    ("model", "$(touch PWNED)/y", ["--single-item", "download_model"]),
    ("tasks", ["synth-negation;touch PWNED"], ["--single-item", "download_task@synth-negation;touch PWNED"]),
    ("seeds", ["1;touch PWNED"], ["-s", "finetune@synth-negation-1;touch PWNED"]),
])
def test_repro_single_item_skips_the_gate_yet_runs_no_params_value(built, key, value, command) -> None:
    """`dvc repro -s` runs the stage's command without the gate; the command holds placeholders, not the value,
    and the stage refuses the value before it reads or writes anything."""
    root, env = built
    params = yaml.safe_load((root / "params.yaml").read_text())
    (root / "params.yaml").write_text(yaml.safe_dump({**params, key: value}, sort_keys=False))
    try:
        result = run(dvc("repro", *command), root, env, check=False)
    finally:
        run(["git", "checkout", "--", "params.yaml"], root, env)
    assert result.returncode != 0, output(result)
    assert not list(root.rglob("PWNED")), "a params value ran as a command"
    ran = [line for line in result.stdout.splitlines() if line.startswith("Running stage")]
    assert len(ran) == 1 and "check_params" not in ran[0], output(result)  # the gate was skipped: the stage ran
    assert "PWNED" not in "".join(line for line in result.stdout.splitlines() if line.startswith("> "))
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith("error: params.yaml: ") and "PWNED" in errors[0], output(result)


@pytest.mark.parametrize("name, fragment", [
    ("x/y;touch PWNED;#", "breaks the rule"),
    ("../mymodel", "is not a Hugging Face hub id .* but a path; .* name it local/<folder>"),
    ("a/b/c", "not of the form owner/name"),
    ("owner/name.git", "ends in .git"),
    ("-owner/name", "breaks the rule"),
    ("owner/name-", "breaks the rule"),
    ("local/a b", "not a valid local model"),
    ("local/..", "not a valid local model"),
])
def test_model_names_follow_the_hub_id_rules(name: str, fragment: str) -> None:
    with pytest.raises(LayersimError, match=fragment):
        get_model(name)


@pytest.mark.parametrize("name", ["FacebookAI/roberta-base", "google/electra-base-discriminator", "a/b", "A.b_c/d-1.2"])
def test_real_hub_ids_are_accepted(name: str) -> None:
    spec = get_model(name)
    assert (spec.source, spec.hub_id) == ("hub", name)


def test_a_local_folder_is_snapshotted_through_the_explicit_form(tmp_path, monkeypatch, tiny_model_dir) -> None:
    import shutil

    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny_model_dir("tiny-bert"), tmp_path / "models" / "my-encoder")
    info = snapshot_model("local/my-encoder", tmp_path / "snapshot")
    assert info["source"] == "local" and info["revision"] == "local folder models/my-encoder"
    assert model_info(tmp_path / "snapshot")["digest"] == info["digest"]
    assert (tmp_path / "snapshot" / "model.safetensors").read_bytes() == \
        (tiny_model_dir("tiny-bert") / "model.safetensors").read_bytes()


def test_a_local_model_must_exist_inside_models(tmp_path, monkeypatch, tiny_model_dir) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LayersimError, match=r"needs a transformers model folder at models/absent/"):
        snapshot_model("local/absent", tmp_path / "snapshot")
    (tmp_path / "models").mkdir()
    os.symlink(tiny_model_dir("tiny-bert"), tmp_path / "models" / "elsewhere")
    with pytest.raises(LayersimError, match=r"leads outside models/"):
        snapshot_model("local/elsewhere", tmp_path / "snapshot")
    assert not (tmp_path / "snapshot").exists()
