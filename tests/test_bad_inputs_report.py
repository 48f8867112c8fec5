"""The report stage on outputs that are not what the stages write: one sentence naming the file and the fix."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest
import yaml

from dvc_project import repository_params, tiny_params
from layersim.errors import LayersimError
from layersim.reporting.headlines import metrics_to_details
from layersim.reporting.page import Layout, build_report

REPO = Path(__file__).resolve().parents[1]
DETAILS = {"cls": {"linear_cka": {"ft_orig": {"last_layer": 0.8}}}}


def _outputs(root: Path) -> Layout:
    (root / "metrics/finetune/rte/seed1").mkdir(parents=True)
    (root / "metrics/finetune/rte/seed1/metrics.json").write_text(json.dumps({"accuracy": 0.625}))
    (root / "plots/details/similarity/rte").mkdir(parents=True)
    (root / "plots/details/similarity/rte/values.json").write_text(json.dumps(metrics_to_details(DETAILS)))
    return Layout(root / "metrics", root / "plots/details", root / "plots")


@pytest.mark.parametrize("relative", ["metrics/finetune/rte/seed1/metrics.json", "plots/details/similarity/rte/values.json"])
@pytest.mark.parametrize("content", [b"accuracy: 0.625\n", b"{\"accuracy\": 0.6", b"\xff\xfe\x00"])
def test_a_file_that_is_not_json_is_named(tmp_path: Path, relative: str, content: bytes) -> None:
    layout = _outputs(tmp_path)
    (tmp_path / relative).write_bytes(content)
    with pytest.raises(LayersimError) as raised:
        build_report("tiny-bert", ["rte"], [1], 0.05, ("cls", "linear_cka"), layout)
    message = str(raised.value)
    assert message.startswith(f"cannot read the metrics file {tmp_path / relative} (") and "\n" not in message
    assert message.endswith("re-run the stage that writes it.")


def test_the_stage_prints_one_error_line(tmp_path: Path, monkeypatch, capsys) -> None:
    _outputs(tmp_path)
    (tmp_path / "metrics/finetune/rte/seed1/metrics.json").write_text("<html>not json</html>")
    doc = tiny_params(repository_params(), tasks=["rte"], seeds=[1])
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(REPO / "stages/report.py"), "--metrics-dir", "metrics", "--details-dir",
                                      "plots/details", "--plots-dir", "plots", "--out", "report/index.html"])
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(sys.argv[0], run_name="__main__")
    err = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 1 and len(err) == 1, err
    assert err[0].startswith("error: cannot read the metrics file metrics/finetune/rte/seed1/metrics.json (Expecting value")
    assert not (tmp_path / "report").exists()
