"""The environment record each stage writes (environment/<stage>.json, layersim.data.run_environment): the running
interpreter's versions, written through the one function every stage goes through, invisible to what DVC hashes
and to `dvc exp show`'s columns."""

from __future__ import annotations

import argparse
import json
import platform
from importlib import metadata

import pytest
import yaml
from dvc.repo.metrics.show import _extract_metrics

import layersim
from dvc_project import REPO, dvc, make_project, output, repository_params_text, run, tiny_params
from layersim import cli
from layersim.data.run_environment import PACKAGES, record_path, write_environment_record


def _installed(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def _read(path) -> dict[str, str]:
    return dict(json.loads(path.read_text(encoding="utf-8")))


def test_a_stage_run_records_the_running_interpreters_versions(tmp_path, monkeypatch):
    """cli.run_stage, which every stage script calls, writes the record after the stage's work, under the
    stage name DVC passes in DVC_STAGE."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DVC_STAGE", "finetune@synth-negation-1")
    (tmp_path / "params.yaml").write_text(repository_params_text())
    ran = []
    cli.run_stage(lambda args, params: ran.append(not (tmp_path / "environment").exists()),
                  argparse.Namespace(params=tmp_path / "params.yaml"), quiet_transformers=False)
    assert ran == [True]  # written after the stage's own work, never before it
    record = _read(tmp_path / "environment" / "finetune@synth-negation-1.json")
    assert record["stage"] == "finetune@synth-negation-1"
    assert record["python"] == platform.python_version()
    assert record["layersim"] == layersim.__version__
    for name in ("torch", "transformers", "dvc", "numpy", "datasets", "pyarrow", "scikit-learn", "scipy",
                 "safetensors"):
        assert record[name] == _installed(name) != "not installed", name
    assert {"platform", "cpu", "gpu"} <= set(record)


def test_a_script_run_by_hand_writes_no_record(tmp_path, monkeypatch):
    monkeypatch.delenv("DVC_STAGE", raising=False)
    assert write_environment_record(root=tmp_path) is None
    assert not (tmp_path / "environment").exists()


@pytest.mark.parametrize("stage,name", [("finetune@rte-1", "finetune@rte-1.json"),
                                        ("sub/dvc.yaml:extract@rte", "extract@rte.json"),
                                        ("../../x", "_.._x.json"), ("a/b", "a_b.json")])
def test_the_record_stays_in_its_folder(tmp_path, stage, name):
    path = record_path(stage, tmp_path)
    assert path.parent == tmp_path / "environment" and path.name == name


def test_the_record_is_one_pair_a_line_and_adds_no_dvc_metrics_column(tmp_path):
    """A list of [name, value] pairs: `git diff` shows one changed line per changed version, and DVC's metrics
    reader (dvc exp show, dvc metrics show) takes nothing from it, where an object would add a string column per
    field and stage."""
    path = write_environment_record("summary", tmp_path)
    lines = path.read_text(encoding="utf-8").splitlines()
    pairs = json.loads(path.read_text(encoding="utf-8"))
    assert lines[0] == "[" and lines[-1] == "]" and len(lines) == len(pairs) + 2
    assert [name for name, _ in pairs][:3] == ["stage", "python", "layersim"]
    assert set(PACKAGES) <= {name for name, _ in pairs}
    assert _extract_metrics(pairs, str(path)) is None
    assert _extract_metrics(dict(pairs), str(path))  # what an object would have shown


def test_dvc_yaml_lists_the_folder_as_top_level_metrics():
    """Top-level metrics are what `dvc exp run` commits with each experiment without hashing them."""
    pipeline = yaml.safe_load((REPO / "dvc.yaml").read_text(encoding="utf-8"))
    assert "environment" in pipeline["metrics"]
    declared = json.dumps(pipeline["stages"])
    assert '"environment' not in declared  # no stage's output: DVC would hash it into dvc.lock
    # The folder is in git even before any stage ran: `git add ... environment` (docs/experiments.md) never fails,
    # and its one file is empty, so DVC reads no metric (and no error) from it.
    assert (REPO / "environment" / ".gitkeep").read_bytes() == b""


@pytest.mark.integration
def test_dvc_runs_write_records_that_change_nothing_dvc_hashes(tmp_path):
    """Two real runs of a matrix stage and the params gate: each writes its record, and a forced rerun leaves
    dvc.lock byte-identical and `dvc status` clean."""
    root = tmp_path / "project"
    env = make_project(root, tiny_params)
    targets = ["check_params", "download_task"]
    # Not from the run-cache, which the test run's projects share (a stage restored from it runs no command and
    # keeps the record it had, as docs/outputs.md says): in the full tier an earlier project has run these stages.
    run(dvc("repro", "--no-run-cache", *targets), root, env)
    records = sorted(p.name for p in (root / "environment").glob("*.json"))
    assert records == ["check_params.json", "download_task@synth-negation.json"], records
    first = _read(root / "environment" / "download_task@synth-negation.json")
    assert first["stage"] == "download_task@synth-negation" and first["dvc"] == _installed("dvc")
    lock = (root / "dvc.lock").read_text()
    (root / "environment" / "check_params.json").unlink()
    rerun = run(dvc("repro", "--force", *targets), root, env)
    assert "Running stage 'check_params'" in rerun.stdout, output(rerun)
    assert (root / "dvc.lock").read_text() == lock
    assert (root / "environment" / "check_params.json").exists()
    status = run(dvc("status", *targets), root, env)
    assert "up to date" in status.stdout.lower(), output(status)
