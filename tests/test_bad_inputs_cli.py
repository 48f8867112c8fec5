"""The plan CLI and `layersim launch -S` answer bad input in one line naming the bad value and what is valid
(issue 62): no traceback, no negative or NaN times, an unknown key named with a did-you-mean."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from dvc_project import repository_params_text
from layersim.errors import LayersimError
from layersim.plan import __main__ as cli

REPO = Path(__file__).resolve().parents[1]
TINY = ["-S", "model=tiny-bert", "-S", "tasks=[synth-choice]", "-S", "finetune.max_length=64"]


@pytest.fixture
def params(tmp_path) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(repository_params_text())
    return path


def _plan(capsys, params: Path, *args: str) -> tuple[int, str]:
    code = cli.main(["--params", str(params), "--root", str(params.parent), "--device", "h100", *TINY, *args])
    captured = capsys.readouterr()
    return code, captured.err


@pytest.mark.parametrize("args, fragment", [
    (("--device-flops", "0"), "--device-flops 0 is invalid; give the device's effective FLOP/s, a positive finite"),
    (("--device-flops", "-1"), "--device-flops -1 is invalid"),
    (("--device-flops", "nan"), "--device-flops nan is invalid"),
    (("--device-flops", "inf"), "--device-flops inf is invalid"),
    (("--pass-seconds", "-5"), "--pass-seconds -5 is invalid; give the fixed seconds per batch and layer, a finite "
                               "number of at least 0"),
    (("--pass-seconds", "nan"), "--pass-seconds nan is invalid"),
    (("-S", "model=!!python/object/apply:os.system [\"echo x\"]"),
     "the value '!!python/object/apply:os.system [\"echo x\"]' is not plain YAML (could not determine a constructor"),
    (("-S", "tasks=[sst2"), "the value '[sst2' is not plain YAML"),
])
def test_a_bad_plan_argument_is_one_line(params, capsys, args, fragment):
    code, err = _plan(capsys, params, *args)
    assert code == 1 and fragment in err and err.startswith("layersim plan: ") and err.count("\n") == 1, err


def test_a_missing_params_file_is_one_line(tmp_path, capsys):
    code, err = _plan(capsys, tmp_path / "nowhere.yaml")
    assert code == 1 and err == f"layersim plan: {tmp_path / 'nowhere.yaml'} does not exist; run stages from the " \
                                "repository root.\n"


def test_a_python_tag_in_the_params_file_is_one_line(tmp_path, capsys):
    path = tmp_path / "params.yaml"
    path.write_text('model: !!python/object/apply:os.system ["echo pwned"]\n')
    code, err = _plan(capsys, path)
    assert code == 1 and "is not valid YAML (could not determine a constructor for the tag" in err
    assert "pwned" not in capsys.readouterr().out


def test_the_times_a_valid_device_gives_are_positive_and_finite(params, capsys):
    """The boundaries the check keeps: a pass time of 0, any positive throughput."""
    from layersim.params import parse_params
    from layersim.plan import known_seconds, plan, seconds

    costs = plan(parse_params(cli.overridden(params, TINY[1::2])), params.parent)
    for flops, pass_seconds in ((1.0, 0.0), (1e11, 1e-3), (5e14, None)):
        on = cli.device("h100", flops, pass_seconds)
        # A stage whose nulls' engines have no measured GPU figure has no time (None), its measured part one.
        assert all(math.isfinite(known_seconds(c, on)) and known_seconds(c, on) >= 0 for c in costs)
        assert all(seconds(c, on) in (None, known_seconds(c, on)) for c in costs)


def test_the_cli_runs_as_a_module_without_a_traceback(tmp_path):
    result = subprocess.run([sys.executable, "-m", "layersim.plan", "--params", str(tmp_path / "none.yaml"),
                             "--device-flops", "0"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr and result.stderr.count("\n") == 1


# --- layersim launch -S: DVC's "Invalid `--set-param` value" said as what is wrong ---

@pytest.mark.parametrize("override, message", [
    ("foo=1", "-S foo=1: unknown key 'foo'; valid top-level keys are: align, compare"),
    ("seedz=[1]", "-S seedz=[1]: unknown key 'seedz' (did you mean seeds?)"),
    ("finetune.learnig_rate=1e-4", "unknown key 'finetune.learnig_rate' (did you mean finetune.learning_rate?); "
                                   "valid keys of finetune are: "),
    ("finetune.lora.rnak=4", "unknown key 'finetune.lora.rnak' (did you mean finetune.lora.rank?)"),
])
def test_launch_names_an_unknown_key_with_a_did_you_mean(params, override, message):
    from layersim_launch.cli import set_params

    before = params.read_text()
    with pytest.raises(LayersimError) as error:
        set_params(params, ["model=tiny-bert", override])
    assert message in str(error.value) and "KEY=VALUE" not in str(error.value)
    assert params.read_text() == before  # nothing applied


def test_launch_says_how_to_add_a_valid_key_the_file_lacks(params):
    from layersim_launch.cli import set_params

    params.write_text(params.read_text().replace("  require_convergence:", "  # require_convergence:"))
    with pytest.raises(LayersimError, match=r"-S finetune.require_convergence=false: finetune.require_convergence is a "
                                            r"valid key but params.yaml does not hold it yet.*write -S "
                                            r"\+finetune.require_convergence=false"):
        set_params(params, ["finetune.require_convergence=false"])
    assert set_params(params, ["+finetune.require_convergence=false"]) is not None  # as the sentence says
    assert "require_convergence: false" in params.read_text()


# --- a value that climbs out of its folder: layersim launch says it in its own sentence before DVC reads dvc.yaml ---

CLIMBING = [  # (-S setting, the start of launch's sentence)
    ('tasks=["../../.."]', "error: params.yaml: tasks has '../../..', a file rather than a task name; "),
    ("model='../../models'", "error: params.yaml: model = '../../models' is not a Hugging Face hub id (owner/name) "
                             "but a path; "),
    ('seeds=["1/../../x"]', "error: params.yaml: seeds"),
]


@pytest.mark.parametrize("setting, sentence", CLIMBING)
@pytest.mark.parametrize("given", ["-S", "params.yaml"])
def test_launch_refuses_a_value_that_climbs_in_its_own_sentence(params, setting, sentence, given, capsys,
                                                               monkeypatch):
    """Issue 62: bare DVC commands stop such a value while they resolve dvc.yaml, in DVC's words (the path guard,
    docs/params-safety.md); `layersim launch` validates params.yaml first, with the -S applied, and names it, before
    it reads DVC's pipeline (here there is none to read) or starts Ray."""
    import layersim_launch.cli as launch_cli
    import layersim_launch.graph
    from dvc.utils.hydra import apply_overrides

    monkeypatch.setattr(layersim_launch.graph, "pipeline", lambda root: pytest.fail("DVC's pipeline read"))
    before = params.read_text()
    if given == "params.yaml":
        apply_overrides(params, [setting])
        before = params.read_text()
    overrides = ["-S", setting] if given == "-S" else []
    assert launch_cli.main(["launch", "--dry", "--root", str(params.parent), *overrides]) == 2
    error = capsys.readouterr().err
    assert error.startswith(sentence) and error.count("\n") == 1, error
    assert params.read_text() == before  # a refused -S leaves the file as it was
