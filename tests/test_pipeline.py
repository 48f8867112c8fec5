"""Integration: the real `dvc repro` of the whole pipeline on a tiny model, in a temporary git repo."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from layersim.io import ActivationTable

REPO = Path(__file__).resolve().parents[1]
TASK = "synth-negation"
SEEDS = [1, 2]

pytestmark = pytest.mark.integration


def run(cmd: list[str], cwd: Path, env: dict, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


def dvc(*args: str) -> list[str]:
    return [sys.executable, "-m", "dvc", *args]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> tuple[Path, dict]:
    """A copy of this repository (its git-tracked and not-ignored files) as a fresh git repo, with
    params.yaml set to a tiny model and a small built-in task."""
    dest = tmp_path_factory.mktemp("project")
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, files):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params.update(model="tiny-bert", tasks=[TASK], seeds=SEEDS)
    params["download"].update(generated_train_examples=200, generated_validation_examples=60)
    params["finetune"].update(batch_size=8, learning_rate=1e-3, warmup_steps=2, max_steps=6, eval_every=3,
                              max_length=32)
    params["extract"].update(max_train_examples=100)
    params["truncate"].update(head_epochs=2)
    (dest / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = {**os.environ, "PYTHONPATH": str(dest / "src"), "HF_HUB_OFFLINE": "1", "DVC_NO_ANALYTICS": "1",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    env.pop("DVC_ROOT", None)
    run(["git", "init", "-q"], dest, env)
    run(["git", "add", "-A"], dest, env)
    run(["git", "commit", "-qm", "copy"], dest, env)
    repro = run(dvc("repro"), dest, env)
    return dest, {"env": env, "first_repro": repro.stdout + repro.stderr}


def test_repro_writes_every_declared_output(project):
    root, state = project
    tasks = root / "data" / "tasks" / TASK
    assert (tasks / "train.parquet").is_file() and (tasks / "validation.parquet").is_file()
    assert (root / "data/models/tiny-bert/pretrained/model.safetensors").is_file()
    for seed in SEEDS:
        checkpoint = root / f"data/checkpoints/tiny-bert/{TASK}/seed{seed}"
        assert (checkpoint / "model.safetensors").is_file() and (checkpoint / "config.json").is_file()
        metrics = json.loads((root / f"metrics/finetune/{TASK}/seed{seed}.json").read_text())
        assert metrics["task"] == TASK and metrics["seed"] == seed and 0.0 <= metrics["accuracy"] <= 1.0
        curve = root / f"dvclive/finetune/{TASK}/seed{seed}/plots/metrics/train/loss.tsv"
        assert len(curve.read_text().splitlines()) > 1
    activations = root / f"data/activations/tiny-bert/{TASK}"
    orig = ActivationTable(activations / "orig.cls.parquet")
    assert orig.num_layers == 3 and orig.hidden_size == 32 and orig.num_rows == 60
    for pooling in ("cls", "mean"):
        reference = ActivationTable(activations / f"orig.{pooling}.parquet")
        for run_name in ("orig", "seed1", "seed2"):
            table = ActivationTable(activations / f"{run_name}.{pooling}.parquet")
            assert table.metadata["run"] == run_name and table.metadata["pooling"] == pooling
            reference.check_comparable(table)
    similarity = json.loads((root / f"metrics/similarity/{TASK}.json").read_text())
    assert set(similarity) == {"orig_orig", "ft_orig", "ft_ft", "ft1_ft2"}
    assert similarity["ft_ft"]["diagonal"]["layer_03"] == pytest.approx(1.0)
    assert 0.0 <= similarity["ft_orig"]["last_layer"] <= 1.0
    assert (root / f"plots/similarity/{TASK}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = json.loads((root / f"plots/similarity/{TASK}.json").read_text())
    assert {row["comparison"] for row in rows} == {"ORIG–ORIG", "FT–ORIG", "FT–FT", "FT[1]–FT[2]"}


def test_truncate_and_skip_agree_with_the_fine_tuned_models(project):
    root, _ = project
    finetuned = [json.loads((root / f"metrics/finetune/{TASK}/seed{seed}.json").read_text())["accuracy"]
                 for seed in SEEDS]
    truncate = json.loads((root / f"metrics/truncate/{TASK}.json").read_text())
    assert truncate["metric"] == "accuracy"
    # Exiting after the last layer is the full model: the same score the finetune stage measured.
    assert truncate["full"] == pytest.approx(sum(finetuned) / len(finetuned), abs=1e-6)
    assert truncate["untuned"]["layer_03"] == pytest.approx(truncate["full"], abs=1e-6)
    for variant in ("untuned", "tuned", "tuned_orig"):
        assert sorted(truncate[variant]) == ["layer_00", "layer_01", "layer_02", "layer_03"]
    assert 0 <= truncate["droppable_top_layers_untuned"] <= 3
    skip = json.loads((root / f"metrics/skip/{TASK}.json").read_text())
    assert sorted(skip["spans"]) == ["1-1", "1-2", "1-3", "2-2", "2-3", "3-3"]
    assert skip["full"] == pytest.approx(truncate["full"], abs=1e-6)
    assert 1 <= skip["worst_single_layer"]["layer"] <= 3
    for stage in ("truncate", "skip"):
        assert (root / f"plots/{stage}/{TASK}.png").read_bytes()[:4] == b"\x89PNG"
        assert json.loads((root / f"plots/{stage}/{TASK}.json").read_text())


def test_second_repro_has_nothing_to_do(project):
    root, state = project
    out = run(dvc("repro"), root, state["env"])
    assert "Running stage" not in out.stdout
    status = run(dvc("status"), root, state["env"])
    assert "up to date" in status.stdout.lower()


def test_metrics_are_visible_to_dvc(project):
    root, state = project
    shown = json.loads(run(dvc("metrics", "show", "--json"), root, state["env"]).stdout)
    workspace = json.dumps(shown)
    assert f"metrics/similarity/{TASK}.json" in workspace and "ft_orig" in workspace


@pytest.mark.parametrize("section,key,value,stage", [
    ("similarity", "pooling", "mean", "similarity"),
    ("truncate", "head_epochs", 3, "truncate"),
    ("skip", "tolerance", 0.05, "skip"),
])
def test_changing_an_analysis_param_reruns_only_its_stage(project, section, key, value, stage):
    root, state = project
    params_path = root / "params.yaml"
    original = params_path.read_text()
    params = yaml.safe_load(original)
    params[section][key] = value
    params_path.write_text(yaml.safe_dump(params, sort_keys=False))
    try:
        dry = run(dvc("repro", "--dry"), root, state["env"]).stdout
        assert f"Running stage '{stage}@{TASK}'" in dry
        for other in ("download_model", "download_task", "finetune", "extract", "similarity", "truncate", "skip"):
            if other != stage:
                assert f"Running stage '{other}" not in dry
    finally:
        params_path.write_text(original)
