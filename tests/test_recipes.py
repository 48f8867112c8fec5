"""The README's two recipes, quickstart.sh and smallest.sh, set params that the pipeline accepts: their `-S`
overrides applied to params.yaml as `dvc exp run` applies them, then validated as a stage would."""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import fork_server
import pytest
import yaml
from dvc_project import repository_params, repository_params_text
from ruamel.yaml import YAML

from layersim.models.registry import MODELS
from layersim.params import parse_params

REPO = Path(__file__).resolve().parents[1]


def overrides(script: str) -> dict[str, object]:
    """The `-S key=value` pairs of a recipe's `dvc exp run` (or of the `params=(…)` array it passes to both the plan
    and `dvc exp run`), values parsed as YAML 1.2 (as DVC does)."""
    text = re.sub(r"\\\n", " ", (REPO / script).read_text())
    array = re.search(r"^params=\((.*?)^\)", text, re.S | re.M)
    command = array.group(1).replace("\n", " ") if array else \
        next(line for line in text.splitlines() if line.strip().startswith("dvc exp run"))
    words = shlex.split(command)
    parse = YAML(typ="safe").load  # YAML 1.2, as DVC reads -S values: 1e-4 is a number
    return dict((pair.split("=", 1)[0], parse(pair.split("=", 1)[1]))
                for flag, pair in zip(words, words[1:]) if flag == "-S")


def applied(script: str) -> dict:
    params = repository_params()
    for key, value in overrides(script).items():
        *parents, leaf = key.split(".")
        section = params
        for name in parents:
            assert name in section, f"{script}: -S {key} names no params.yaml section {name!r}"
            section = section[name]
        assert leaf in section, f"{script}: -S {key} names no params.yaml key"
        section[leaf] = value
    return params


@pytest.mark.parametrize("script", ["quickstart.sh", "smallest.sh"])
def test_the_recipe_sets_valid_params(script):
    params = parse_params(applied(script))
    assert params.tasks and params.seeds
    text = (REPO / script).read_text()  # the plan of the same params, printed before the run (issue 53)
    assert 'python -m layersim.plan --warm-starts "${params[@]}" -- "$@"' in text and 'python tools/exp_run.py "${params[@]}" "$@"' in text


def test_the_quickstart_has_seeds_enough_for_an_interval_and_a_pretrained_model():
    params = parse_params(applied("quickstart.sh"))
    assert len(params.seeds) >= 3  # a t-interval over seeds needs three
    assert params.model == "minilm-l6"
    assert "synth-negation" not in params.tasks  # at accuracy 1.000 from step 40: nothing to compare on it


def test_the_smallest_run_uses_a_tiny_model_and_a_handful_of_steps():
    params = parse_params(applied("smallest.sh"))
    assert params.model.startswith("tiny-") and params.finetune.max_steps <= 10


def test_overrides_are_read_from_the_dvc_command(tmp_path, monkeypatch):
    script = tmp_path / "recipe.sh"
    script.write_text("#!/bin/sh\n# -S comment=1\ndvc exp run \\\n  -S a.b=2 \\\n  -S 'c=[x,y]' \"$@\"\n")
    monkeypatch.setattr(__import__(__name__), "REPO", tmp_path)
    assert overrides("recipe.sh") == {"a.b": 2, "c": ["x", "y"]}


OFFLINE = sorted(name for name, spec in MODELS.items() if spec.source != "hub")


@pytest.mark.parametrize("script", ["quickstart.sh", "smallest.sh"])
@pytest.mark.parametrize("model", OFFLINE)
def test_every_offline_model_runs_the_recipe_with_no_other_setting(script, model):
    """`bash quickstart.sh -S model=<m>` (and smallest.sh): the params check passes for every offline model, encoder or
    decoder, with the points and heads its kind gives (issue 48); the architecture pipeline test runs three whole."""
    from layersim.params.measure_sizes import check_measure_sizes
    from layersim.params.model_kind import LAST_TOKEN_HEADS, OWN_HEAD_ARCHITECTURES, architecture

    params = parse_params({**applied(script), "model": model})
    check_measure_sizes(params)  # what the check_params stage adds to parsing
    head = "last" if architecture(model) in LAST_TOKEN_HEADS else "cls"
    assert head in params.extract.poolings and head in params.similarity.measures
    assert "cls" not in params.extract.poolings or head == "cls"
    assert params.truncate.head == ("own" if architecture(model) in OWN_HEAD_ARCHITECTURES else "fresh")


def _run_script(script: str, folder: Path, given: list[str]) -> subprocess.CompletedProcess:
    """`bash <script> <given>` in a folder of its own (params.yaml as committed), with a tools/exp_run.py that records
    its arguments in exp_run.args instead of running `dvc exp run`."""
    shutil.copy2(REPO / script, folder / script)
    (folder / "params.yaml").write_text(repository_params_text())
    (folder / "tools").mkdir()
    shutil.copy2(REPO / "tools" / "first_figure.py", folder / "tools")
    (folder / "tools" / "exp_run.py").write_text("import pathlib, sys\n"
                                                "pathlib.Path('exp_run.args').write_text('\\n'.join(sys.argv[1:]))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))}
    # The scripts' `python` (the plan, the first figures) forked from the test process's warm server, as their
    # `dvc exp run`'s stages are from theirs: 1-2 s a command instead of a fresh interpreter's imports.
    return subprocess.run(["bash", str(folder / script), *given], env=fork_server.environment(env),
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("script", ["quickstart.sh", "smallest.sh"])
def test_the_scripts_settings_reach_the_plan_it_prints_as_well_as_the_run(script, tmp_path):
    """Issue 64: `bash quickstart.sh -S model=tiny-gpt2` printed the plan of minilm-l6."""
    given = ["-S", "model=tiny-gpt2", "--set-param=seeds=[1]", "--name", "gpt2", "-S", "params.yaml:finetune.max_steps=300"]
    result = _run_script(script, tmp_path, given)
    assert result.returncode == 0, result.stderr
    assert "layersim plan: tiny-gpt2, 1 task(s), 1 seed(s), 300 steps" in result.stdout, result.stdout
    assert (tmp_path / "exp_run.args").read_text().splitlines()[-len(given):] == given  # the run gets them as given


@pytest.mark.parametrize("script", ["quickstart.sh", "smallest.sh"])
@pytest.mark.parametrize("setting, sentence", [
    ('tasks=["../../.."]', "layersim plan: params.yaml: tasks has '../../..', a file rather than a task name; "),
    ("model='../../models'", "layersim plan: params.yaml: model = '../../models' is not a Hugging Face hub id "),
    ('seeds=["1/../../x"]', "layersim plan: params.yaml: seeds"),
])
def test_a_value_that_climbs_is_refused_by_the_scripts_own_sentence_before_dvc_runs(script, setting, sentence,
                                                                                   tmp_path):
    """Issue 62: a value that climbs out of its folder stops DVC while it resolves dvc.yaml (docs/params-safety.md,
    the path guard), in DVC's words; through the README's scripts the plan, which reads the same -S first, refuses it
    in layersim's sentence naming the value, and `dvc exp run` never starts."""
    result = _run_script(script, tmp_path, ["-S", setting])
    assert result.returncode == 1, result.stdout
    assert result.stderr.strip().splitlines() == [result.stderr.strip()] and result.stderr.startswith(sentence), \
        result.stderr
    assert not (tmp_path / "exp_run.args").exists()


def first_figure_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("first_figure", REPO / "tools" / "first_figure.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_first_figures_page_reloads_while_the_run_goes_on_then_leads_to_the_full_report():
    first = first_figure_module()
    waiting = first.page([("ft1-orig.png", "FT[1]–ORIG")], "seed 2 of synth-similarity (fine-tuning)")
    assert 'http-equiv="refresh" content="15"' in waiting and "seed 2 of synth-similarity" in waiting
    assert '<img src="ft1-orig.png"' in waiting and "FT[1]–ORIG" in waiting
    done = first.page([], None)
    assert f'content="0; url={first.FULL_REPORT}"' in done and "Next:" not in done


def test_a_seed_counts_as_trained_only_once_its_run_writes_its_time_after_the_watcher_started(tmp_path):
    """A checkpoint restored from DVC's cache, or left by an earlier run, is not drawn: its timing file is older."""
    first = first_figure_module()
    timing = tmp_path / "seed1.json"
    assert not first.finished(timing, 0.0)  # no run has written it
    timing.write_text("{}")
    os.utime(timing, (1000.0, 1000.0))
    assert not first.finished(timing, 2000.0) and first.finished(timing, 1000.0)


@pytest.mark.integration
def test_a_first_experiment_prints_no_warning_about_outputs_never_made(tmp_path):
    """Issue 64: a fresh clone's `dvc exp run` opened with a "No file hash info found for '<path>'. It won't be
    created." per output (its checkout, before the run, of outputs that dvc.lock does not list yet); through
    tools/exp_run.py the experiment runs and is listed as before, without them."""
    from dvc_project import dvc, output, project_env, run

    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {
        "a": {"cmd": "mkdir -p data && echo ${x} > data/a.txt", "params": ["x"], "outs": ["data/a.txt"]},
        "b": {"cmd": "python copy_a.py", "deps": ["data/a.txt", "copy_a.py"], "outs": ["data/b.txt"]}}}))
    (tmp_path / "copy_a.py").write_text("import shutil\nshutil.copy('data/a.txt', 'data/b.txt')\n")
    (tmp_path / "params.yaml").write_text("x: 1\n")
    (tmp_path / ".gitignore").write_text("/data/\n")
    env = {**project_env(tmp_path), "LAYERSIM_FORK_LOG": str(tmp_path.parent / "exp_run_fork.log")}
    run(["git", "init", "-q", "-b", "main"], tmp_path, env)
    run(dvc("init", "-q"), tmp_path, env)
    run(["git", "add", "-A"], tmp_path, env)
    run(["git", "commit", "-qm", "fresh clone"], tmp_path, env)
    result = run([sys.executable, str(REPO / "tools" / "exp_run.py"), "-S", "x=2", "--name", "first"], tmp_path, env)
    assert "Running stage 'b'" in result.stdout and "No file hash info" not in output(result), output(result)
    assert (tmp_path / "data" / "b.txt").read_text() == "2\n"
    # its stages start in a fork of its own server's warm interpreter (layersim_launch.fork_server), which it stops
    forked = [json.loads(line) for line in (tmp_path.parent / "exp_run_fork.log").read_text().splitlines()]
    assert [entry["forked"] for entry in forked if "forked" in entry] == [["copy_a.py"]]
    assert not [entry for entry in forked if "fresh" in entry]
    shown = run(dvc("exp", "show", "--json"), tmp_path, env).stdout
    assert '"first"' in shown
    # The same run straight through DVC warns, once per output: what the filter hides is DVC's message, as written.
    run(["git", "checkout", "-q", "--", "."], tmp_path, env)
    run(["rm", "-rf", "data", "dvc.lock"], tmp_path, env)
    plain = run(dvc("exp", "run", "-S", "x=3"), tmp_path, env)
    assert output(plain).count("No file hash info found for ") == 2, output(plain)
