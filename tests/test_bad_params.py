"""Malformed params files fed to the real stage entry points: every stage validates the whole params
file first, exits 1 with one `error: ...` line that names the key, the bad value and what is allowed,
and writes nothing — no output, no temporary.

Each stage runs the command that dvc.yaml gives it (with `--params <bad file>`), in an empty scratch
folder as its working directory, so its outputs would land there. Most cases run in-process (the
script executed as `__main__` by runpy: importing torch once instead of once per case); a few run as
real subprocesses to prove the command line itself behaves.
"""

from __future__ import annotations

import runpy
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import fork_server
import pytest
import yaml

from dvc_project import repository_params, project_env, tiny_params
from dvc_yaml import command
from layersim.params import load_params

REPO = Path(__file__).resolve().parents[1]
MODEL, TASK, SEED = "tiny-bert", "synth-negation", 1
BAD = "bad-params.yaml"


def _stage_commands() -> dict[str, list[str]]:
    """dvc.yaml's command of every stage (one matrix item), as argv after `python`, its placeholders filled in
    as given by hand (no DVC interpolation: `${` never appears in a command, docs/params-safety.md)."""
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    commands = {}
    for name, stage in stages.items():
        assert "${" not in command(stage), f"{name}: a params value interpolated into its command: {stage['cmd']}"
        cmd = command(stage).replace("@model", MODEL).replace("@task", TASK).replace("@method", "lora")
        cmd = cmd.replace("@seed", str(SEED))
        argv = shlex.split(cmd)
        assert argv[0] == "python", cmd
        commands[name] = argv[1:]
    return commands


COMMANDS = _stage_commands()


def _base() -> dict:
    """The repository's params.yaml shrunk as the integration tests shrink it: a valid document."""
    return tiny_params(repository_params(), model=MODEL, tasks=[TASK], seeds=[1, 2])


def _set(**changes) -> Callable[[dict], None]:
    """Set dotted keys (`finetune__batch_size=...` for finetune.batch_size) in the document."""
    def apply(doc: dict) -> None:
        for dotted, value in changes.items():
            *sections, key = dotted.split("__")
            target = doc
            for section in sections:
                target = target[section]
            target[key] = value
    return apply


def _text(doc: dict) -> str:
    return yaml.safe_dump(doc, sort_keys=False).replace("tasks: BOMB", f"tasks: {_alias_bomb()}")


def _edit_text(edit: Callable[[str], str]) -> Callable[[dict], str]:
    return lambda doc: edit(_text(doc))


FOLDER = object()  # a change that returns it makes the params "file" a folder


def _alias_bomb(levels: int = 9) -> str:
    """A YAML list of 9 references to a list of 9 references … (9**levels strings if expanded, under 1 KB of
    text): each level defines its anchor inline as the first item, so that every key stays a valid one."""
    node = "&a0 [x, x, x, x, x, x, x, x, x]"
    for k in range(1, levels):
        node = f"&a{k} [{node}, {', '.join([f'*a{k - 1}'] * 8)}]"
    return node


# (id, stage, change: a function that edits the document in place or returns the file's text,
#  fragments of the message: the key, the bad value as printed, what is allowed)
CASES = [
    ("device-unknown", "finetune", _set(device="tpu"),
     ["device = 'tpu'", "auto, cpu, cuda or cuda:N"]),
    ("device-shell", "extract", _set(device="cuda; rm -rf ~"),
     ["device = 'cuda; rm -rf ~'", "auto, cpu, cuda or cuda:N"]),
    ("precision-unknown", "skip", _set(finetune__precision="fp8"),
     ["finetune.precision = 'fp8'", "auto, fp32, bf16, fp16"]),
    ("negative-grad-norm", "freeze", _set(finetune__max_grad_norm=-1.0),
     ["finetune.max_grad_norm = -1.0", "a non-negative number"]),
    ("bool-for-int", "download_task", _set(finetune__batch_size=True),
     ["finetune.batch_size = True", "must be an integer"]),
    ("string-for-number", "download_model", _set(finetune__learning_rate="0.001"),
     ["finetune.learning_rate = '0.001'", "must be a number"]),
    ("float-for-int", "download_compared", _set(finetune__max_steps=10000.0),
     ["finetune.max_steps = 10000.0", "must be an integer"]),
    ("nested-list-tasks", "finetune", _set(tasks=[[TASK]]),
     [f"tasks = [['{TASK}']]", "a non-empty list of task names"]),
    ("nested-list-measures", "extract", _set(similarity__measures={"tokens": [["linear_cka", "svcca"]]}),
     ["similarity.measures.tokens has ['linear_cka', 'svcca']", "each entry must be one of", "linear_cka"]),
    ("repeated-task", "similarity", _set(tasks=[TASK, "synth-roles", TASK]),
     ["tasks = ", f"'{TASK}' is given twice", "without repeated names"]),
    ("repeated-measure", "compare", _set(similarity__measures={"cls": ["linear_cka", "svcca", "linear_cka"]}),
     ["similarity.measures.cls = ['linear_cka', 'svcca', 'linear_cka']", "'linear_cka' is given twice"]),
    ("repeated-yaml-key", "truncate",
     _edit_text(lambda text: text.replace("finetune:\n", "finetune:\n  learning_rate: 0.1\n", 1)),
     ["finetune.learning_rate is given twice", "= 0.1", "= 0.001", "each key may appear only once"]),
    ("section-as-list", "skip", _set(finetune=[{"batch_size": 8}]),
     ["finetune = [{'batch_size': 8}]", "must be a mapping of keys to values"]),
    ("document-is-a-list", "align", _edit_text(lambda text: "- model: tiny-bert\n- tasks: [synth-negation]\n"),
     ["params.yaml must be a mapping of sections", "got list"]),
    ("document-empty", "download_task", _edit_text(lambda text: "# nothing yet\n"),
     ["params.yaml must be a mapping of sections", "got NoneType"]),
    ("zero-batch", "download_model", _set(extract__batch_size=0),
     ["extract.batch_size = 0", "a positive integer"]),
    ("negative-seed", "finetune_pretrained", _set(seeds=[1, -3]),
     ["seeds = [1, -3]", "non-negative integers"]),
    ("negative-learning-rate", "download_compared", _set(align__learning_rate=-0.001),
     ["align.learning_rate = -0.001", "a positive number"]),
    ("too-few-synthetic-rows", "align", _set(align__synthetic_rows=2),
     ["align.synthetic_rows = 2", "at least 3"]),
    ("tolerance-one", "finetune", _set(truncate__tolerance=1),
     ["truncate.tolerance = 1 ", "a number in [0, 1)", "0–1 scale"]),
    ("tolerance-in-points", "extract", _set(skip__tolerance=5),
     ["skip.tolerance = 5 ", "a number in [0, 1)"]),
    ("tolerance-negative", "similarity", _set(skip__tolerance=-0.01),
     ["skip.tolerance = -0.01", "a number in [0, 1)"]),
    ("warmup-not-below-steps", "compare", _set(finetune__warmup_steps=6),
     ["finetune.warmup_steps = 6", "smaller than finetune.max_steps = 6"]),
    ("eval-every-past-the-end", "truncate", _set(finetune__eval_every=10),
     ["finetune.eval_every = 10", "finetune.max_steps = 6", "at most max_steps, or 0"]),
    ("freeze-seed-not-fine-tuned", "freeze", _set(freeze__seeds=[3]),
     ["freeze.seeds = [3] has seeds that are not in seeds = [1, 2]", "or null for all"]),
    ("freeze-layers-out-of-twelve", "freeze", _set(freeze__layers=[4, 13]),
     ["freeze.layers = [4, 13] is invalid", "distinct integers from 1 to 12"]),
    ("align-pair-beyond-seeds", "download_paired", _set(align__pairs=[["ORIG", "FT3"]]),
     ["align.pairs has 'FT3', but seeds = [1, 2] holds 2 seed(s)", "use FT1 to FT2"]),
    ("align-pair-misspelt-model", "download_paired", _set(align__pairs=[["ORIG", "multibert-1"]]),
     ["align.pairs has 'multibert-1', which is not a known model", "did you mean 'multiberts-1'?"]),
    ("align-pair-of-two-widths", "align", _set(align__pairs=[["ORIG", "minilm-l6"]]),
     ["align.pairs has [ORIG, minilm-l6], of widths 32 and 384", "the same width"]),
    ("align-pair-not-a-pair", "align", _set(align__pairs=[["FT1", "FT2", "ORIG"]]),
     ["align.pairs = [['FT1', 'FT2', 'ORIG']] is invalid", "[source, target] pairs"]),
    ("truncate-head-unknown", "truncate", _set(truncate__head="tuned"),
     ["truncate.head", "'tuned'", "own", "fresh"]),
    ("no-similarity-measures", "summary", _set(similarity__measures={}),
     ["similarity.measures = {} is invalid", "a mapping of poolings (head, cls, mean, last, tokens) to lists of measures"]),
    ("model-misspelt", "skip", _set(model="tiny-bret"),
     ["model = 'tiny-bret' is not a known model", "did you mean 'tiny-bert'?", "roberta-base", "owner/name"]),
    ("task-misspelt", "align", _set(tasks=["synth-negaton"]),
     ["tasks has 'synth-negaton', which is not a known task", f"did you mean '{TASK}'?", "cosmosqa"]),
    ("compare-repeats-model", "download_task", _set(compare__models=["tiny-roberta", MODEL]),
     ["compare.models = ['tiny-roberta', 'tiny-bert'] repeats model = 'tiny-bert'", "only the other encoders"]),
    ("finetune-method-unknown", "finetune", _set(finetune__method="qlora"),
     ["finetune.method = 'qlora'", "one of full, lora"]),
    ("lora-rank-zero", "finetune", _set(finetune__method="lora", finetune__lora__rank=0),
     ["finetune.lora.rank = 0", "a positive integer"]),
    ("lora-rank-beyond-width", "finetune", _set(finetune__method="lora", finetune__lora__rank=4096),
     ["finetune.lora.rank = 4096 is larger than the hidden size 32 of model 'tiny-bert'", "use a rank from 1 to 32"]),
    ("compared-lora-rank-beyond-width", "similarity", _set(finetune__compare_methods=["lora"],
                                                           finetune__lora__rank=33),
     ["finetune.lora.rank = 33 is larger than the hidden size 32 of model 'tiny-bert'"]),
    ("lora-dropout-one", "extract", _set(finetune__lora__dropout=1.0),
     ["finetune.lora.dropout = 1.0", "a number in [0, 1)"]),
    ("lora-key-misspelt", "finetune", _set(finetune__lora__rnak=4),
     ["unknown key 'finetune.lora.rnak'", "did you mean finetune.lora.rank?", "valid keys of finetune.lora"]),
    ("lora-not-a-mapping", "summary", _set(finetune__lora=8),
     ["finetune.lora = 8", "a mapping of keys to values"]),
    ("lora-target-unknown-role", "finetune", _set(finetune__lora__target_modules=["query", "c_attn"]),
     ["finetune.lora.target_modules has 'c_attn'", "query, key, value, attention_output, intermediate, output"]),
    ("lora-target-not-a-list", "finetune", _set(finetune__lora__target_modules="all"),
     ["finetune.lora.target_modules = 'all'", "auto (query and value) or a non-empty list"]),
    ("lora-on-xlnet", "finetune", _set(model="tiny-xlnet", finetune__method="lora"),
     ["finetune method lora cannot adapt model 'tiny-xlnet'", "use method: full"]),
    ("compared-lora-on-xlnet", "finetune", _set(model="tiny-xlnet", finetune__compare_methods=["lora"]),
     ["finetune method lora cannot adapt model 'tiny-xlnet'", "no lora in compare_methods"]),
    ("compare-methods-holds-method", "finetune_compared", _set(finetune__compare_methods=["full", "lora"]),
     ["finetune.compare_methods = ['full', 'lora'] holds finetune.method = full", "list only other methods"]),
    ("compare-methods-unknown", "finetune", _set(finetune__compare_methods=["qlora"]),
     ["finetune.compare_methods has 'qlora'", "full, lora"]),
    ("compare-methods-not-a-list", "finetune", _set(finetune__compare_methods="lora"),
     ["finetune.compare_methods = 'lora'", "a list drawn from full, lora"]),
    ("lora-with-freeze-recipe-finetune", "freeze", _set(finetune__method="lora", freeze__recipe="finetune"),
     ["freeze.recipe = finetune reuses the finetune stage's runs", "use freeze.recipe: wu, or method: full"]),
    ("compare-repeats-model-by-hub-id", "download_model",
     _set(model="minilm-l6", compare__models=["sentence-transformers/all-MiniLM-L6-v2"]),
     ["compare.models = ['sentence-transformers/all-MiniLM-L6-v2'] repeats model = 'minilm-l6'"]),
    ("key-misspelt", "download_compared", _set(finetune__learnig_rate=1e-3),
     ["unknown key 'finetune.learnig_rate'", "did you mean finetune.learning_rate?", "valid keys of finetune"]),
    ("key-in-wrong-section", "finetune", _set(finetune__poolings=["cls"]),
     ["unknown key 'finetune.poolings'", "did you mean extract.poolings?"]),
    ("section-key-at-top-level", "extract", _set(learning_rate=1e-3),
     ["unknown key 'learning_rate'", "did you mean finetune.learning_rate or align.learning_rate?",
      "valid top-level keys"]),
    ("max-length-beyond-positions", "similarity", _set(finetune__max_length=256),
     ["finetune.max_length = 256 is too long for model 'tiny-bert'", "at most 130"]),
    ("max-length-beyond-compared-model", "compare", _set(finetune__max_length=130, compare__models=["tiny-roberta"]),
     ["finetune.max_length = 130", "too long for 'tiny-roberta' of compare.models", "at most 129"]),
    ("max-length-too-short", "truncate", _set(finetune__max_length=2),
     ["finetune.max_length = 2", "at least 8"]),
    ("seed-too-large", "skip", _set(seeds=[1, 2**32]),
     ["seeds = [1, 4294967296]", "from 0 to 4294967295"]),
    ("align-seed-negative", "align", _set(align__seed=-1),
     ["align.seed = -1", "a non-negative integer"]),
    ("svcca-variance-zero", "download_task", _set(similarity__svcca_variance=0),
     ["similarity.svcca_variance = 0 ", "a number in (0, 1]"]),
    ("rbf-landmarks-one", "download_task", _set(similarity__rbf_landmarks=1),
     ["similarity.rbf_landmarks = 1 ", "at least 2 (a kernel needs two points)"]),
    ("launch-stage-unknown", "download_task", _set(launch__gpu_stages=["finetune", "finetun"]),
     ["launch.gpu_stages has 'finetun'", "did you mean 'finetune'?"]),
    ("probe-examples-null", "download_model", _set(compare__probe_examples=None),
     ["compare.probe_examples = None", "must be an integer"]),
    ("pooling-not-extracted", "download_compared",
     _set(extract__poolings=["cls", "mean"], similarity__measures={"last": ["linear_cka"]}),
     ["similarity.measures has the pooling 'last'", "extract.poolings = ['cls', 'mean']"]),
    ("unknown-measure", "finetune", _set(similarity__measures={"cls": ["linear_ck"]}),
     ["similarity.measures.cls has 'linear_ck'", "did you mean 'linear_cka'?", "pwcca"]),
    ("measures-as-a-list", "similarity", _set(similarity__measures=["linear_cka", "svcca"]),
     ["similarity.measures = ['linear_cka', 'svcca']", "a mapping of poolings", "tokens"]),
    ("measures-unknown-pooling", "compare", _set(similarity__measures={"word": ["svcca"]}),
     ["similarity.measures has the pooling 'word'", "cls, mean, last, tokens"]),
    ("similarity-poolings-removed", "extract", _set(similarity__poolings=["cls"]),
     ["similarity.poolings is no longer a key", "keys of similarity.measures"]),
    ("intruder-threshold-zero", "weights", _set(weights__threshold=0),
     ["weights.threshold = 0", "a number in (0, 1]"]),
    ("keep-every-step", "dynamics", _set(finetune__keep_states=6),
     ["finetune.keep_states = 6 must be smaller than finetune.max_steps = 6"]),
    ("grounding-no-bootstrap", "grounding", _set(grounding__bootstrap=0),
     ["grounding.bootstrap = 0", "a positive integer"]),
    ("grounding-unknown-measure", "grounding", _set(grounding__measures=["mutual_nn"]),
     ["grounding.measures has 'mutual_nn'", "did you mean 'mutual_knn'?", "cknna"]),
    ("no-permutations", "similarity", _set(similarity__permutations=0),
     ["similarity.permutations = 0", "a positive integer"]),
    ("significance-above-one", "compare", _set(similarity__significance=5),
     ["similarity.significance = 5", "a number in (0, 1]"]),
    ("localization-unknown", "similarity", _set(similarity__localization="z"),
     ["similarity.localization = 'z'", "one of raw, zscore"]),
    ("chance-adjusted-string", "similarity", _set(similarity__chance_adjusted="yes"),
     ["similarity.chance_adjusted = 'yes'", "true or false"]),
    ("bootstrap-negative", "compare", _set(similarity__bootstrap=-1),
     ["similarity.bootstrap = -1", "a non-negative integer"]),
    # The file itself: read as DVC reads it (YAML 1.2), whatever bytes it holds.
    ("yaml11-sexagesimal", "finetune", _edit_text(lambda text: text.replace("max_steps: 6", "max_steps: 1:00")),
     ["finetune.max_steps = '1:00'", "must be an integer"]),
    ("yaml11-on-for-true", "check_params",
     _edit_text(lambda text: text.replace("chance_adjusted: false", "chance_adjusted: on")),
     ["similarity.chance_adjusted = 'on'", "true or false"]),
    ("not-utf8", "download_task", lambda doc: _text(doc).encode("utf-8").replace(b"# ", b"\xff ") + b"# caf\xe9\n",
     [f"{BAD} is not UTF-8 text", "byte 0xe9", "save it as UTF-8"]),
    ("params-is-a-folder", "truncate", lambda doc: FOLDER,
     [f"{BAD} is a folder, not a file"]),
    ("nested-1000-deep", "align", _edit_text(lambda text: text + "extra: " + "[" * 1000 + "]" * 1000 + "\n"),
     [f"{BAD} nests more than 100 levels deep", "at most three"]),
    ("integer-of-5000-digits", "skip",
     _edit_text(lambda text: text.replace("max_steps: 6", "max_steps: " + "9" * 5000)),
     [f"{BAD} has a value that cannot be read", "thousands of digits"]),
    ("integer-of-400-digits-for-a-number", "compare", _set(finetune__learning_rate=10**400),
     ["finetune.learning_rate = 100000000000000000...000000", "must be a finite number"]),
    ("alias-bomb", "download_model", _set(tasks="BOMB"),
     ["tasks = [[[...], [...],", "a non-empty list of task names"]),
    ("long-model-name", "download_compared", _set(model="m" * 100_000),
     ["model = 'mmmmmmmmm", "m...mmm"]),
    # Sizes: every size param has a bound far above any real run, and the example counts a floor.
    ("max-steps-10-to-the-12", "finetune", _set(finetune__max_steps=10**12),
     ["finetune.max_steps = 1000000000000", "at most 100,000,000"]),
    ("batch-size-10-to-the-9", "extract", _set(finetune__batch_size=10**9),
     ["finetune.batch_size = 1000000000", "at most 65,536"]),
    ("head-epochs-10-to-the-9", "truncate", _set(truncate__head_epochs=10**9),
     ["truncate.head_epochs = 1000000000", "at most 10,000"]),
    ("permutations-10-to-the-9", "similarity", _set(similarity__permutations=10**9),
     ["similarity.permutations = 1000000000", "at most 10,000"]),
    ("generated-examples-10-to-the-12", "download_task", _set(download__generated_train_examples=10**12),
     ["download.generated_train_examples = 1000000000000", "at most 10,000,000"]),
    ("inn-depth-huge", "align", _set(align__inn_depth=10**6), ["align.inn_depth = 1000000", "at most 256"]),
    ("one-validation-example", "similarity", _set(extract__max_examples=1),
     ["extract.max_examples = 1 ", "at least 10", "nothing to compare or score"]),
    ("two-generated-examples", "download_task", _set(download__generated_validation_examples=2),
     ["download.generated_validation_examples = 2 ", "at least 10"]),
    ("five-word-rows", "extract", _set(extract__max_tokens=5), ["extract.max_tokens = 5 ", "at least 10"]),
    # Values that would be shell code in dvc.yaml's commands: refused by the check_params stage, which runs
    # before any command that interpolates them (tests/test_shell_safety.py runs the real `dvc exp run`).
    ("model-shell-injection", "check_params", _set(model="x/y;touch PWNED;#"),
     ["model = 'x/y;touch PWNED;#' is not a valid Hugging Face hub id", "'y;touch PWNED;#' breaks the rule"]),
    ("model-command-substitution", "download_model", _set(model="$(touch PWNED)/y"),
     ["model = '$(touch PWNED)/y' is not a valid Hugging Face hub id", "owner/name"]),
    ("model-parent-folder", "finetune", _set(model="../mymodel"),
     ["model = '../mymodel' is not a Hugging Face hub id (owner/name) but a path", "local/<folder>"]),
    ("model-path-with-dots", "extract", _set(model="a/../b"), ["model = 'a/../b'", "not of the form owner/name"]),
    ("local-model-parent", "similarity", _set(model="local/.."),
     ["model = 'local/..' is not a valid local model", "models/<folder>/", "no '..'"]),
    ("compared-model-backticks", "compare", _set(compare__models=["a/b`touch PWNED`"]),
     ["compare.models has 'a/b`touch PWNED`', which is not a valid Hugging Face hub id"]),
    ("hub-id-too-long", "truncate", _set(model="o/" + "n" * 97),
     ["is not a valid Hugging Face hub id", "at most 96 characters"]),
    ("hub-id-double-dash", "skip", _set(model="a--b/c"), ["'a--b' breaks the rule", "without '--' or '..'"]),
    ("task-shell-injection", "check_params", _set(tasks=["synth-negation;touch PWNED"]),
     ["tasks has 'synth-negation;touch PWNED', which is not a known task"]),
    ("seed-shell-injection", "download_task", _set(seeds=["1;touch PWNED"]),
     ["seeds = ['1;touch PWNED']", "a non-empty list of non-negative integers"]),
    ("export-timing-zero", "export", _set(export__timing_examples=0),
     ["export.timing_examples = 0", "a positive"]),
    ("export-selection-as-text", "export", _set(export__selection_examples="all"),
     ["export.selection_examples = 'all'", "integer"]),
    ("report-significance-above-one", "report", _set(similarity__significance=1.5),
     ["similarity.significance = 1.5"]),
    ("not-yaml", "extract", _edit_text(lambda text: text + "finetune:\n\t- batch_size 8\n"),
     # the scanner's own words ("found character '\\t' that cannot start any token"; libyaml's, with
     # ruamel.yaml.clib: "found character that cannot start any token") and where
     [f"{BAD} is not valid YAML", "found character", "that cannot start any token at line "]),
]


def _write_bad(folder: Path, change) -> Path:
    doc = _base()
    text = change(doc)
    path = folder / BAD
    if text is FOLDER:
        path.mkdir()
    elif isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text if isinstance(text, str) else _text(doc))
    return path


def _argv(stage: str, params: Path) -> list[str]:
    script, *rest = COMMANDS[stage]
    return [str(REPO / script), *rest, "--params", str(params)]


def _assert_one_error_line(stderr: str, fragments: list[str]) -> str:
    lines = stderr.strip().splitlines()
    assert lines and lines[-1].startswith("error: "), stderr
    assert sum(line.startswith("error:") for line in lines) == 1, stderr
    assert "Traceback" not in stderr
    message = lines[-1]
    assert len(message) < 1000, f"an unbounded message ({len(message)} characters)"
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


def _assert_nothing_written(folder: Path) -> None:
    """The scratch working directory holds only the params file: no output and no temporary."""
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) == [BAD]


def _run_in_process(stage: str, params: Path, folder: Path, monkeypatch, capsys) -> tuple[int, str]:
    monkeypatch.chdir(folder)
    monkeypatch.setattr(sys, "argv", _argv(stage, params))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(sys.argv[0], run_name="__main__")
    return exited.value.code, capsys.readouterr().err


def test_the_base_document_is_valid(tmp_path: Path) -> None:
    """Every case below breaks one thing in a document that is otherwise valid."""
    path = tmp_path / "params.yaml"
    path.write_text(_text(_base()))
    assert load_params(path).model == MODEL


def test_enough_distinct_cases() -> None:
    assert len(CASES) >= 60
    assert len({case[0] for case in CASES}) == len(CASES)
    assert {case[1] for case in CASES} == set(COMMANDS), "every stage of dvc.yaml meets a malformed file"


@pytest.mark.parametrize("stage, change, fragments", [pytest.param(s, c, f, id=i) for i, s, c, f in CASES])
def test_stage_rejects_malformed_params(stage, change, fragments, tmp_path, monkeypatch, capsys) -> None:
    bad = _write_bad(tmp_path, change)
    code, stderr = _run_in_process(stage, bad, tmp_path, monkeypatch, capsys)
    assert code == 1, stderr
    _assert_one_error_line(stderr, fragments)
    _assert_nothing_written(tmp_path)


def test_the_same_command_with_valid_params_writes(tmp_path, monkeypatch, capsys) -> None:
    """The control: the command the cases run does write its output when the params are fine, so
    "nothing written" above is the validation's doing."""
    doc = _base()
    doc["download"].update(generated_train_examples=20, generated_validation_examples=10)
    good = tmp_path / BAD
    good.write_text(_text(doc))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", _argv("download_task", good))
    runpy.run_path(sys.argv[0], run_name="__main__")
    import pyarrow.parquet as pq

    splits = tmp_path / f"data/tasks/{TASK}/splits"
    assert sorted(path.name for path in splits.iterdir()) == ["train.parquet", "validation.parquet"]
    # The sizes the document asks for, both classes in each split, and every example once.
    for split, rows in (("train", 20), ("validation", 10)):
        table = pq.read_table(splits / f"{split}.parquet").to_pydict()
        assert len(table["text"]) == rows and set(table["label"]) == {0, 1}, split
        assert sorted(table["example_id"]) == list(range(rows)) and all(table["text"]), split


# A few cases through the real command line, each its own process (a fork of the test process's server:
# tests/fork_server.py).
SUBPROCESS_CASES = ["bool-for-int", "repeated-yaml-key", "task-misspelt"]  # download_task, truncate, align


@pytest.mark.parametrize("case_id", SUBPROCESS_CASES)
def test_command_line_exits_nonzero_with_one_error_line(case_id: str, tmp_path: Path) -> None:
    _, stage, change, fragments = next(case for case in CASES if case[0] == case_id)
    bad = _write_bad(tmp_path, change)
    result = subprocess.run([fork_server.python(), *_argv(stage, bad)], cwd=tmp_path, env=project_env(REPO),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr
    _assert_one_error_line(result.stderr, fragments)
    _assert_nothing_written(tmp_path)


def test_a_params_file_nested_100000_deep_is_one_sentence_not_a_crash(tmp_path):
    """YAML's C parser crashes on such a file with no message (issue 49): it is refused before any parser sees it."""
    from layersim.params import load_params
    from layersim.errors import LayersimError

    path = tmp_path / "params.yaml"
    path.write_text("model: tiny-bert\ntasks: " + "[" * 100_000 + "]" * 100_000 + "\nseeds: [1]\n")
    with pytest.raises(LayersimError, match=r"params.yaml nests more than 100 levels deep; params.yaml needs at most"):
        load_params(path)


def test_an_rbf_bandwidth_that_makes_every_value_undefined_is_refused():
    from layersim.params import parse_params
    from layersim.errors import LayersimError

    doc = {"model": "tiny-bert", "tasks": ["synth-negation"], "seeds": [1], "finetune": {"max_length": 64},
           "similarity": {"rbf_sigma_scale": 1e-300}}
    with pytest.raises(LayersimError, match=r"similarity.rbf_sigma_scale = 1e-300 is invalid; it must be a number "
                                            r"from 0.001 to 1000"):
        parse_params(doc)
