"""Tests for params.yaml validation (layersim.params) and how a stage script reports bad params."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dvc_project import repository_params

from layersim.errors import LayersimError
from layersim.params import (MAX_SEED, MIN_MAX_LENGTH, MODEL_HIDDEN_SIZE, MODEL_MAX_LENGTH, DownloadParams,
                             ExtractParams, FinetuneParams, Params, SimilarityParams, load_params, parse_params)
from layersim.params.measure_sizes import check_measure_sizes
from layersim.data.tasks import PAPER_TASKS

REPO = Path(__file__).parents[1]
PARAMS_YAML = REPO / "params.yaml"

# A small, valid document; every malformed case below changes one thing in it.
BASE = {
    "model": "tiny-bert",
    "tasks": ["synth-negation", "synth-choice"],
    "seeds": [1, 2],
    "download": {"max_train_examples": None, "generated_train_examples": 100},
    "finetune": {"batch_size": 4, "learning_rate": 1e-5, "warmup_steps": 10, "max_steps": 100,
                 "eval_every": 0, "max_length": 64},
    "extract": {"poolings": ["cls", "mean"], "batch_size": 8},
    "similarity": {"measures": {"cls": ["linear_cka", "svcca"]}, "attention_measures": ["pearson"]},
}


def _doc(**changes) -> dict:
    """BASE with top-level keys replaced; a value of `_DROP` removes the key."""
    doc = copy.deepcopy(BASE)
    for key, value in changes.items():
        if value is _DROP:
            del doc[key]
        else:
            doc[key] = value
    return doc


def _section(section: str, **changes) -> dict:
    doc = copy.deepcopy(BASE)
    doc[section] = {**doc.get(section, {}), **changes}
    return doc


_DROP = object()


def _write(tmp_path: Path, doc, name: str = "params.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


# --- the repository's params.yaml ------------------------------------------------------------------


def _repository_params(tmp_path: Path) -> Params:
    """The committed params.yaml (the quickstart, a DVC experiment, leaves its own values in the working tree)."""
    from dvc_project import repository_params_text

    path = tmp_path / "params.yaml"
    path.write_text(repository_params_text())
    return load_params(path)


def _defaults(model: str) -> dict:
    """Every section's dataclass defaults as params read them for `model` ('head' and 'auto' made concrete)."""
    from layersim.params.model_kind import resolve_model_kind
    from layersim.params.schema import SECTIONS

    return resolve_model_kind(model, {name: cls() for name, cls in SECTIONS.items()})


def test_repository_params_hold_the_paper_configuration(tmp_path: Path) -> None:
    params = _repository_params(tmp_path)
    assert isinstance(params, Params)
    assert params.model == "roberta-base"
    assert params.tasks == PAPER_TASKS
    assert len(params.tasks) == 12
    assert params.seeds == (1, 2)
    ft = params.finetune
    assert ft.batch_size == 4
    assert isinstance(ft.learning_rate, float) and ft.learning_rate == pytest.approx(1e-5, rel=1e-12)
    assert ft.warmup_steps == 1000
    assert ft.max_steps == 10000
    assert params.extract.poolings == ("cls", "mean", "tokens")  # head: RoBERTa's <s>; last only where a measure reads it
    assert params.extract.max_tokens == 20000
    assert params.similarity == _defaults("roberta-base")["similarity"]
    assert dict(params.similarity.measures) == {"cls": ("linear_cka",), "tokens": ("linear_cka", "svcca", "pwcca",
                                                                                   "neuronsim")}
    assert params.truncate.head == "own"  # auto: Phang et al.'s own head, which a RoBERTa head can copy
    assert params.download.max_train_examples is None
    assert params.download.max_validation_examples is None


def test_repository_params_match_the_dataclass_defaults(tmp_path: Path) -> None:
    """params.yaml and the code defaults tell the same story (the paper values), as read for its model."""
    params, defaults = _repository_params(tmp_path), _defaults("roberta-base")
    assert params.download == DownloadParams()
    assert params.finetune == FinetuneParams()
    assert params.extract == defaults["extract"]
    assert params.similarity == defaults["similarity"]
    assert params.truncate == defaults["truncate"]


def test_missing_sections_take_defaults() -> None:
    # minilm-l6: the default finetune.max_length (256) is too long for the tiny models' 130 positions.
    params = parse_params({"model": "minilm-l6", "tasks": ["synth-roles"], "seeds": [0]})
    assert params.finetune == FinetuneParams()
    assert params.extract == _defaults("minilm-l6")["extract"]
    assert params.similarity == _defaults("minilm-l6")["similarity"]
    assert params.download == DownloadParams()
    # A section written with no body (`finetune:`) is YAML null: also the defaults.
    assert parse_params({**BASE, "model": "minilm-l6", "finetune": None}).finetune == FinetuneParams()
    assert parse_params({**BASE, "model": "minilm-l6", "finetune": {}}).finetune == FinetuneParams()


def test_base_document_is_valid(tmp_path: Path) -> None:
    params = load_params(_write(tmp_path, BASE))
    assert params.model == "tiny-bert"
    assert params.tasks == ("synth-negation", "synth-choice")
    assert params.seeds == (1, 2)
    assert params.finetune.max_steps == 100
    assert params.finetune.eval_every == 0
    assert params.finetune.max_length == 64
    assert params.finetune.eval_batch_size == FinetuneParams().eval_batch_size  # not given: default
    assert params.extract.batch_size == 8
    assert params.download.generated_train_examples == 100
    assert params.similarity.poolings == ("cls",)
    assert params.similarity.measures == {"cls": ("linear_cka", "svcca")}
    assert params.similarity.attention_measures == ("pearson",)


def test_float_fields_accept_integers() -> None:
    params = parse_params(_section("finetune", weight_decay=0, learning_rate=1))
    assert params.finetune.weight_decay == 0.0 and isinstance(params.finetune.weight_decay, float)
    assert params.finetune.learning_rate == 1.0 and isinstance(params.finetune.learning_rate, float)


def test_repeated_measure_of_a_pooling_is_rejected() -> None:
    value = ["linear_cka", "svcca", "linear_cka"]
    with pytest.raises(LayersimError) as info:
        parse_params(_section("similarity", measures={"cls": value}))
    assert str(info.value) == (f"params.yaml: similarity.measures.cls = {value!r} is invalid; it must be a list "
                               "without repeated names ('linear_cka' is given twice).")


@pytest.mark.parametrize("section,key,value", [
    ("extract", "poolings", ["mean", "cls", "mean"]),
    ("similarity", "attention_measures", ["pearson", "pearson"]),
    ("align", "methods", ["inn", "linear", "inn"]),
])
def test_repeated_names_are_rejected(section: str, key: str, value: list) -> None:
    """Like tasks, seeds and compare.models: a repeated name is most likely a typo for another one."""
    with pytest.raises(LayersimError) as info:
        parse_params(_section(section, **{key: value}))
    assert str(info.value) == (f"params.yaml: {section}.{key} = {value!r} is invalid; it must be a list without "
                               f"repeated names ({value[-1]!r} is given twice).")


# --- malformed documents ---------------------------------------------------------------------------

MALFORMED = [
    # (id, document, fragments that the message must contain)
    ("model-list", _doc(model=["tiny-bert", "tiny-roberta"]), ["model", "tiny-bert", "tiny-roberta"]),
    ("model-unknown", _doc(model="roberta-bas"), ["'roberta-bas'", "roberta-base", "owner/name"]),
    ("model-number", _doc(model=3), ["model", "3"]),
    ("task-unknown", _doc(tasks=["synth-negation", "mnli-mm"]), ["'mnli-mm'", "mnli", "cosmosqa"]),
    ("tasks-empty", _doc(tasks=[]), ["tasks", "[]", "non-empty"]),
    ("tasks-string", _doc(tasks="synth-negation"), ["tasks", "'synth-negation'", "list"]),
    ("tasks-duplicate", _doc(tasks=["synth-roles", "synth-choice", "synth-roles"]), ["tasks", "repeated"]),
    ("seeds-negative", _doc(seeds=[1, -2]), ["seeds", "-2", "non-negative"]),
    ("seeds-string", _doc(seeds=["1", 2]), ["seeds", "'1'"]),
    ("seeds-bool", _doc(seeds=[True, 2]), ["seeds", "True"]),
    ("seeds-duplicate", _doc(seeds=[3, 3]), ["seeds", "[3, 3]", "repeated"]),
    ("seeds-empty", _doc(seeds=[]), ["seeds", "[]"]),
    ("seeds-scalar", _doc(seeds=1), ["seeds", "1", "list"]),
    ("missing-model", _doc(model=_DROP), ["'model'", "missing"]),
    ("missing-tasks", _doc(tasks=_DROP), ["'tasks'", "missing"]),
    ("missing-seeds", _doc(seeds=_DROP), ["'seeds'", "missing"]),
    ("batch-zero", _section("finetune", batch_size=0), ["finetune.batch_size", "= 0", "positive"]),
    ("batch-negative", _section("finetune", batch_size=-4), ["finetune.batch_size", "-4", "positive"]),
    ("batch-float", _section("finetune", batch_size=2.5), ["finetune.batch_size", "2.5", "integer"]),
    ("batch-string", _section("finetune", batch_size="4"), ["finetune.batch_size", "'4'", "integer"]),
    ("batch-bool", _section("finetune", batch_size=True), ["finetune.batch_size", "True", "integer"]),
    ("lr-zero", _section("finetune", learning_rate=0), ["finetune.learning_rate", "= 0", "positive"]),
    ("lr-negative", _section("finetune", learning_rate=-1e-5), ["finetune.learning_rate", "-1e-05", "positive"]),
    ("lr-word", _section("finetune", learning_rate="fast"), ["finetune.learning_rate", "'fast'", "number"]),
    ("lr-bool", _section("finetune", learning_rate=True), ["finetune.learning_rate", "True", "number"]),
    ("warmup-equals-max", _section("finetune", warmup_steps=100, max_steps=100),
     ["finetune.warmup_steps", "finetune.max_steps", "100"]),
    ("warmup-above-max", _section("finetune", warmup_steps=1000, max_steps=10),
     ["finetune.warmup_steps = 1000", "finetune.max_steps = 10"]),
    ("warmup-negative", _section("finetune", warmup_steps=-1), ["finetune.warmup_steps", "-1", "non-negative"]),
    ("eval-every-negative", _section("finetune", eval_every=-5), ["finetune.eval_every", "-5", "non-negative"]),
    ("weight-decay-negative", _section("finetune", weight_decay=-0.1), ["finetune.weight_decay", "-0.1"]),
    ("max-length-null", _section("finetune", max_length=None), ["finetune.max_length", "None", "integer"]),
    ("max-examples-zero", _section("extract", max_examples=0), ["extract.max_examples", "0", "positive"]),
    ("max-train-negative", _section("download", max_train_examples=-1), ["download.max_train_examples", "-1"]),
    ("unknown-section-key", _section("finetune", lr=1e-5),
     ["finetune.lr", "batch_size", "learning_rate", "warmup_steps", "max_steps", "eval_every"]),
    ("unknown-extract-key", _section("extract", pooling="cls"), ["extract.pooling", "poolings", "max_examples"]),
    ("unknown-top-level", _doc(trian={"batch_size": 4}), ["'trian'", "finetune", "model", "similarity"]),
    ("section-list", _doc(finetune=[{"batch_size": 4}]), ["finetune", "mapping"]),
    ("section-scalar", _doc(similarity="cls"), ["similarity", "'cls'", "mapping"]),
    ("poolings-unknown", _section("extract", poolings=["cls", "max"]), ["extract.poolings", "'max'", "cls", "mean"]),
    ("poolings-empty", _section("extract", poolings=[]), ["extract.poolings", "[]", "non-empty"]),
    ("poolings-string", _section("extract", poolings="cls"), ["extract.poolings", "'cls'", "list"]),
    ("similarity-pooling-unknown", _section("similarity", measures={"max": ["svcca"]}),
     ["similarity.measures", "'max'", "cls", "mean", "last", "tokens"]),
    ("measure-unknown", _section("similarity", measures={"cls": ["cka"]}),
     ["similarity.measures.cls", "'cka'", "linear_cka", "pwcca", "neuronsim"]),
    ("measures-empty", _section("similarity", measures={}), ["similarity.measures", "a mapping of poolings"]),
    ("measures-of-pooling-empty", _section("similarity", measures={"cls": []}), ["similarity.measures.cls", "non-empty"]),
    ("attention-measure-unknown", _section("similarity", attention_measures=["js"]),
     ["similarity.attention_measures", "'js'", "jensen_shannon", "matrix_norm"]),
    ("svcca-variance-above-one", _section("similarity", svcca_variance=1.5), ["similarity.svcca_variance", "1.5", "(0, 1]"]),
    ("rbf-scale-zero", _section("similarity", rbf_sigma_scale=0), ["similarity.rbf_sigma_scale", "positive"]),
    ("document-list", ["model", "tiny-bert"], ["mapping", "list"]),
    ("document-string", "roberta-base", ["mapping", "str"]),
    ("document-empty", None, ["mapping", "NoneType"]),
]


@pytest.mark.parametrize("doc, fragments", [pytest.param(d, f, id=i) for i, d, f in MALFORMED])
def test_malformed_params(doc, fragments: list[str], tmp_path: Path) -> None:
    with pytest.raises(LayersimError) as info:
        parse_params(copy.deepcopy(doc))
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert "\n" not in message  # one sentence, one line

    # Through a YAML file the same document gives the same error.
    with pytest.raises(LayersimError) as from_file:
        load_params(_write(tmp_path, doc))
    assert str(from_file.value) == message


def test_enough_malformed_cases() -> None:
    assert len(MALFORMED) >= 20
    assert len({case[0] for case in MALFORMED}) == len(MALFORMED)


def test_malformed_yaml_text(tmp_path: Path) -> None:
    """Values as a person types them in YAML."""
    path = tmp_path / "params.yaml"
    path.write_text("model: tiny-bert\ntasks: [synth-roles]\nseeds: [1]\nfinetune:\n  batch_size: true\n")
    with pytest.raises(LayersimError, match=r"finetune\.batch_size = True"):
        load_params(path)
    # YAML 1.2, as DVC reads it: `yes` is a string, not a boolean.
    path.write_text("model: tiny-bert\ntasks: [synth-roles]\nseeds: [1]\nfinetune:\n  batch_size: yes\n")
    with pytest.raises(LayersimError, match=r"finetune\.batch_size = 'yes' is invalid; it must be an integer"):
        load_params(path)


def test_load_params_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope" / "params.yaml"
    with pytest.raises(LayersimError) as info:
        load_params(path)
    assert str(path) in str(info.value)
    assert "does not exist" in str(info.value)


@pytest.mark.parametrize("text", ["model: [tiny-bert\n", "model: tiny-bert\n  tasks: : [x]\n", "a: b\n\t- c\n"])
def test_load_params_invalid_yaml(text: str, tmp_path: Path) -> None:
    path = tmp_path / "params.yaml"
    path.write_text(text)
    with pytest.raises(LayersimError) as info:
        load_params(path)
    assert str(path) in str(info.value)
    assert "YAML" in str(info.value)


# --- hub ids as models -----------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["owner/name", "FacebookAI/roberta-large", "google/electra-small-discriminator"])
def test_hub_id_accepted_as_model(model: str) -> None:
    assert parse_params(_doc(model=model)).model == model


@pytest.mark.parametrize("model", ["owner/", "/name", "a/b/c", "/", "roberta"])
def test_malformed_hub_id_rejected(model: str) -> None:
    with pytest.raises(LayersimError) as info:
        parse_params(_doc(model=model))
    assert repr(model) in str(info.value)
    assert "owner/name" in str(info.value)


# --- YAML 1.2 floats, cross-field and non-finite checks ---------------------------------------------


def test_exponent_without_dot_is_a_float(tmp_path: Path) -> None:
    doc = yaml.safe_dump(BASE, sort_keys=False).replace("learning_rate: 1.0e-05", "learning_rate: 2e-05")
    assert "learning_rate: 2e-05" in doc
    path = tmp_path / "params.yaml"
    path.write_text(doc)
    assert load_params(path).finetune.learning_rate == pytest.approx(2e-5)


def test_similarity_pooling_must_be_extracted() -> None:
    doc = _section("extract", poolings=["mean"])
    with pytest.raises(LayersimError, match="similarity.measures has the pooling 'cls'"):
        parse_params(doc)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_learning_rate_rejected(value: float) -> None:
    with pytest.raises(LayersimError, match="finetune.learning_rate"):
        parse_params(_section("finetune", learning_rate=value))


# --- a stage script with bad params ----------------------------------------------------------------


def _stage_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), env.get("PYTHONPATH")]))
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    return env


def test_stage_with_bad_params_fails_cleanly(tmp_path: Path) -> None:
    bad = _write(tmp_path, _doc(model="no-such-model"), "bad.yaml")
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "stages/download_model.py", "--params", str(bad), str(out)],
        cwd=REPO, env=_stage_env(), capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines, "nothing on stderr"
    assert lines[-1].startswith("error: ")
    assert "'no-such-model'" in lines[-1]
    assert "roberta-base" in lines[-1]  # lists the valid names
    assert sum(line.startswith("error:") for line in lines) == 1
    assert "Traceback" not in result.stderr
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]  # no temporary left either


def test_attention_measures_need_attention_maps() -> None:
    doc = _section("extract", attention_examples=0)
    with pytest.raises(LayersimError, match=r"similarity.attention_measures = \['pearson'\] needs attention maps"):
        parse_params(doc)
    doc["similarity"]["attention_measures"] = []
    assert parse_params(doc).similarity.attention_measures == ()
    doc["align"] = {**doc.get("align", {}), "attention": True}
    with pytest.raises(LayersimError, match=r"align.attention = true needs attention maps, but "
                                            r"extract.attention_examples = 0"):
        parse_params(doc)


def test_default_align_methods_are_every_registered_map() -> None:
    from layersim.align import MAPS
    from layersim.params import ALIGN_METHODS

    assert ALIGN_METHODS == tuple(MAPS)


def test_measure_names_are_the_registries() -> None:
    from layersim.params.vocabulary import HEAD_MEASURE_NAMES, MEASURE_NAMES
    from layersim.similarity import HEAD_MEASURES, MEASURES

    assert (MEASURE_NAMES, HEAD_MEASURE_NAMES) == (tuple(MEASURES), tuple(HEAD_MEASURES))


@pytest.mark.parametrize("section,values,expected", [
    ("align", {"methods": ["linear", "flow"]}, ["align.methods", "'flow'", "inn", "mlp", "svcca"]),
    ("align", {"pooling": "max"}, ["align.pooling", "'max'", "mean"]),
    ("align", {"steps": 0}, ["align.steps", "positive"]),
    ("compare", {"models": ["no-such-model"]}, ["no-such-model", "roberta-base", "minilm-l6"]),
    ("compare", {"models": "tiny-bert"}, ["compare.models", "list"]),
    ("compare", {"models": ["tiny-bert", "tiny-bert"]}, ["compare.models", "repeated"]),
])
def test_align_and_compare_errors(section, values, expected) -> None:
    with pytest.raises(LayersimError) as err:
        parse_params(_section(section, **values))
    for part in expected:
        assert part in str(err.value)


def test_compare_models_must_not_repeat_the_model() -> None:
    doc = _section("compare", models=["tiny-roberta", "tiny-bert"])
    with pytest.raises(LayersimError, match="repeats model = 'tiny-bert'"):
        parse_params(doc)


def test_align_pooling_must_be_extracted() -> None:
    doc = _section("align", pooling="last")
    with pytest.raises(LayersimError, match="align.pooling = 'last' is not among extract.poolings"):
        parse_params(doc)


def test_align_pooling_is_per_example_and_max_tokens_positive() -> None:
    # Align maps per-example representations; words ("tokens") are a similarity and compare pooling only.
    with pytest.raises(LayersimError, match=r"align.pooling = 'tokens' is invalid; it must be one of head, cls, mean, last\."):
        parse_params(_section("align", pooling="tokens"))
    for bad in (0, -5, 1.5, None, True):
        with pytest.raises(LayersimError, match=r"extract.max_tokens = .* is invalid"):
            parse_params(_section("extract", max_tokens=bad))
    doc = _section("extract", poolings=["cls", "tokens"], max_tokens=17)
    doc["similarity"] = {"measures": {"cls": ["linear_cka"], "tokens": ["svcca"]}}
    doc["align"] = {"pooling": "cls"}
    params = parse_params(doc)
    assert params.extract.max_tokens == 17 and params.similarity.poolings == ("cls", "tokens")


# --- limits that come from the models, and the edges of the allowed ranges ---------------------------


@pytest.mark.parametrize("name", sorted(MODEL_MAX_LENGTH))
def test_model_hidden_size_is_the_models_width(name: str, tiny_model_dir) -> None:
    from transformers import AutoConfig

    assert AutoConfig.from_pretrained(tiny_model_dir(name)).hidden_size == MODEL_HIDDEN_SIZE[name]


def test_a_measure_that_cannot_run_on_the_known_sizes_is_refused_at_validation() -> None:
    """mixedsim regresses on every neuron, so it needs more rows than neurons: params fix both for a registry
    model and a built-in task (or extract.max_examples), so validation refuses it before any work."""
    doc = _section("similarity", measures={"cls": ["mixedsim"]})
    doc["download"]["generated_validation_examples"] = 30  # tiny-bert is 32 wide
    with pytest.raises(LayersimError, match=r"similarity.measures.cls has 'mixedsim', which cannot run on task "
                                            r"'synth-negation' with model 'tiny-bert': mixedsim cannot be computed "
                                            r"on n = 30 examples"):
        check_measure_sizes(parse_params(doc))
    doc["download"]["generated_validation_examples"] = 40
    check_measure_sizes(parse_params(doc))
    doc["similarity"]["measures"] = {"tokens": ["mixedsim"]}  # words: how many is known only after extraction
    doc["download"]["generated_validation_examples"] = 30
    doc["extract"]["poolings"] = ["cls", "mean", "tokens"]
    check_measure_sizes(parse_params(doc))


@pytest.mark.parametrize("name", sorted(MODEL_MAX_LENGTH))
def test_model_max_length_is_what_the_model_can_encode(name: str, tiny_model_dir, one_torch_thread) -> None:
    """MODEL_MAX_LENGTH is spelled out so that validation loads no model; here the real encoders check
    it: an input of that many tokens runs, one token more overflows the position embeddings."""
    import torch

    from layersim.models.registry import load_encoder, load_tokenizer

    folder = tiny_model_dir(name)
    encoder, tokenizer = load_encoder(folder).eval(), load_tokenizer(folder)
    token = tokenizer.convert_tokens_to_ids("the")
    assert token != tokenizer.pad_token_id
    limit = MODEL_MAX_LENGTH[name]
    with torch.no_grad():
        encoder(input_ids=torch.full((1, limit), token))
        with pytest.raises((IndexError, RuntimeError)):
            encoder(input_ids=torch.full((1, limit + 1), token))


def test_max_length_bounds_accepted_at_the_edges() -> None:
    assert parse_params(_section("finetune", max_length=MIN_MAX_LENGTH)).finetune.max_length == MIN_MAX_LENGTH
    assert parse_params(_section("finetune", max_length=130)).finetune.max_length == 130  # tiny-bert: 130 positions
    doc = _section("finetune", max_length=512)
    doc["model"] = "minilm-l6"
    assert parse_params(doc).finetune.max_length == 512
    doc["model"] = "FacebookAI/roberta-base"  # a hub model: its limit is not known offline, nothing is checked
    assert parse_params(doc).finetune.max_length == 512


def test_allowed_edges_of_the_step_rules() -> None:
    # eval_every may equal max_steps (then, like 0, only the final evaluation runs).
    assert parse_params(_section("finetune", eval_every=100, max_steps=100)).finetune.eval_every == 100
    # checkpoint_every may exceed max_steps: like 0, a run that short saves no intermediate state.
    assert parse_params(_section("finetune", checkpoint_every=1000, max_steps=100)).finetune.checkpoint_every == 1000
    assert parse_params(_section("finetune", checkpoint_every=0)).finetune.checkpoint_every == 0


@pytest.mark.parametrize("value", [0, 0.0, 0.5, 0.999])
def test_tolerance_in_the_unit_interval_accepted(value: float) -> None:
    params = parse_params({**_section("truncate", tolerance=value), "skip": {"tolerance": value}})
    assert params.truncate.tolerance == params.skip.tolerance == value


def test_seed_range_edges_accepted() -> None:
    params = parse_params({**_doc(seeds=[0, MAX_SEED]), "align": {"seed": MAX_SEED}})
    assert params.seeds == (0, MAX_SEED) and params.align.seed == MAX_SEED


def test_one_seed_is_enough() -> None:
    """FT[1]–FT[2] and the FT[1]→FT[2] alignment need two seeds; with one, similarity and align leave
    them out (and the DVC workflow tests run the whole pipeline with seeds: [1])."""
    assert parse_params(_doc(seeds=[7])).seeds == (7,)


def test_keys_that_are_not_strings_are_reported_not_crashed_on() -> None:
    with pytest.raises(LayersimError, match=r"unknown key 1;"):
        parse_params({**BASE, 1: "x", "trian": {}})
    with pytest.raises(LayersimError, match=r"unknown key 'finetune\.2'"):
        parse_params(_section("finetune", **{"2": 3}))


@pytest.mark.parametrize("text, expected", [
    ("model: tiny-bert\nmodel: tiny-roberta\ntasks: [synth-roles]\nseeds: [1]\n",
     "model is given twice (line 1 = tiny-bert, line 2 = tiny-roberta)"),
    ("model: tiny-bert\ntasks: [synth-roles]\nseeds: [1]\nalign:\n  steps: 5\n  seed: 1\n  steps: 6\n",
     "align.steps is given twice (line 5 = 5, line 7 = 6)"),
    ("model: tiny-bert\ntasks: [synth-roles]\nseeds: [1]\nextract: {batch_size: 2}\nextract:\n  batch_size: 4\n",
     "extract is given twice (line 4, line 5)"),
])
def test_repeated_yaml_keys_rejected(text: str, expected: str, tmp_path: Path) -> None:
    """PyYAML silently keeps the last of two equal keys; a params file that says two things is an error."""
    path = tmp_path / "params.yaml"
    path.write_text(text)
    with pytest.raises(LayersimError) as info:
        load_params(path)
    assert str(info.value) == f"{path}: {expected}; each key may appear only once."


def test_errors_name_the_file_that_was_read(tmp_path: Path) -> None:
    path = _write(tmp_path, _section("skip", tolerance=2), "experiment.yaml")
    with pytest.raises(LayersimError) as info:
        load_params(path)
    assert str(info.value).startswith(f"{path}: skip.tolerance = 2 is invalid;")


TRICKY_SCALARS = ["010", "0o10", "0x1f", "1_000", "2e-5", "1.0e-5", "1e3", "yes", "no", "on", "off", "y", "1:00",
                  "1:30:00", ".inf", "-.inf", ".nan", "~", "null", "True", "FALSE", "0b11", "+5", "-0", "2001-12-14"]


@pytest.mark.parametrize("scalar", TRICKY_SCALARS)
def test_params_are_read_exactly_as_dvc_reads_them(scalar: str, tmp_path: Path) -> None:
    """YAML 1.1 and 1.2 differ on these (`010` is 8 or 10, `1:00` is 60 or a string, `yes` true or a string);
    DVC records what its own parser reads, so the stages must read the same value, or refuse what DVC
    refuses (libyaml's scanner, which ruamel.yaml.clib gives both, refuses `[1:00]`)."""
    import math

    from dvc.utils.serialize import parse_yaml as dvc_parse_yaml
    from dvc.utils.serialize import YAMLFileCorruptedError

    from layersim.params import parse_yaml

    text = f"value: {scalar}\nlist: [{scalar}]\n"
    try:
        dvcs = dvc_parse_yaml(text, "p.yaml")
    except YAMLFileCorruptedError:
        with pytest.raises(LayersimError, match="is not valid YAML"):
            parse_yaml(tmp_path / "p.yaml", text)
        return
    ours = parse_yaml(tmp_path / "p.yaml", text)
    assert type(ours["value"]) is type(dvcs["value"])
    if isinstance(ours["value"], float) and math.isnan(ours["value"]):
        assert math.isnan(dvcs["value"])
    else:
        assert ours == dvcs


def test_a_leading_zero_is_decimal_as_in_dvc(tmp_path: Path) -> None:
    """`max_steps: 010` trains 10 steps, as `dvc params diff` shows (YAML 1.1 would read 8)."""
    path = tmp_path / "params.yaml"
    path.write_text("model: tiny-bert\ntasks: [synth-roles]\nseeds: [1]\n"
                    "finetune: {max_steps: 010, warmup_steps: 02, eval_every: 0, max_length: 064}\n")
    params = load_params(path)
    assert (params.finetune.max_steps, params.finetune.warmup_steps, params.finetune.max_length) == (10, 2, 64)


def test_validating_params_imports_no_torch() -> None:
    """Every stage validates params.yaml first; that must not pay torch's seconds of import."""
    import subprocess
    import sys

    code = ("import sys; from layersim.params import load_params; load_params('params.yaml'); "
            "print(sorted(m for m in ('torch', 'transformers', 'datasets', 'layersim.similarity') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1],
                            capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_docs_params_md_is_generated_from_the_schema() -> None:
    """docs/params.md is what `python -m layersim.params` prints: regenerate it after changing a key."""
    from layersim.params import describe

    assert (REPO / "docs" / "params.md").read_text() == describe()


def test_every_key_of_params_yaml_is_declared_with_a_doc() -> None:
    """One place per key: the repository's params.yaml has exactly the declared keys, each with a doc."""
    import dataclasses

    from layersim.params.schema import SECTIONS

    document = repository_params()
    for name, cls in SECTIONS.items():
        declared = {spec.name: spec for spec in dataclasses.fields(cls)}
        assert set(document[name]) == set(declared), name
        assert all(spec.metadata["doc"] for spec in declared.values())


# --- decoders and XLNet: the token their own heads read ------------------------------------------------


def test_last_token_heads_are_the_layer_stacks_families() -> None:
    """validate spells out, torch-free, which families' heads read the last token; the layer-stack table knows."""
    from layersim.models.layer_stacks import FAMILIES
    from layersim.params.validate import DECODERS, LAST_TOKEN_HEADS

    assert set(LAST_TOKEN_HEADS) == {name for name, family in FAMILIES.items() if family.head_token == "last"}
    assert set(DECODERS) == set(LAST_TOKEN_HEADS) - {"xlnet"}


def _decoder_doc(model: str = "tiny-gpt2", **extract) -> dict:
    doc = _doc(model=model, tasks=["synth-negation"], truncate={"head": "fresh"})
    doc["extract"] = {**doc["extract"], "poolings": ["last", "mean"], **extract}
    doc["similarity"] = {"measures": {"last": ["linear_cka"]}, "attention_measures": []}
    return doc


@pytest.mark.parametrize("model", ["tiny-gpt2", "tiny-llama", "tiny-xlnet", "qwen2.5-0.5b"])
def test_a_last_token_model_takes_last_and_refuses_cls(model: str) -> None:
    assert parse_params(_decoder_doc(model)).extract.poolings == ("last", "mean")
    with pytest.raises(LayersimError, match=rf"extract.poolings has 'cls', but model '{re.escape(model)}' is a "
                                            r"\w+ model, whose head reads the last non-pad token"):
        parse_params(_decoder_doc(model, poolings=["cls", "last", "mean"]))
    with pytest.raises(LayersimError, match=r"extract.poolings = \['mean'\] must include 'last' \(or 'head'\); the "
                                            r"truncate stage"):
        parse_params(_decoder_doc(model, poolings=["mean"]) | {"similarity": {"measures": {"mean": ["linear_cka"]}}})


def test_an_encoder_still_needs_cls() -> None:
    with pytest.raises(LayersimError, match=r"extract.poolings = \['last', 'mean'\] must include 'cls'"):
        parse_params(_decoder_doc("tiny-deberta-v2"))


def test_a_compared_decoder_refuses_cls_measures() -> None:
    doc = _section("compare", models=["tiny-gpt2"])
    with pytest.raises(LayersimError, match="similarity.measures has 'cls', but 'tiny-gpt2' of compare.models is a "
                                            "gpt2 model"):
        parse_params(doc)
    doc["extract"]["poolings"] = ["cls", "mean"]
    doc["similarity"]["measures"] = {"mean": ["linear_cka"]}
    assert parse_params(doc).compare.models == ("tiny-gpt2",)


def test_a_decoder_refuses_multiple_choice() -> None:
    doc = _decoder_doc("tiny-llama")
    doc["tasks"] = ["synth-negation", "synth-choice"]
    with pytest.raises(LayersimError, match="task 'synth-choice' is multiple choice, which model 'tiny-llama' "
                                            r"\(a llama decoder\) cannot fine-tune"):
        parse_params(doc)
    parse_params(_decoder_doc("tiny-xlnet") | {"tasks": ["synth-choice"]})  # XLNet has a multiple-choice head


@pytest.mark.parametrize("name", sorted(n for n in MODEL_HIDDEN_SIZE if n.startswith("tiny-")))
def test_model_shape_reads_every_familys_names(name: str, tiny_model_dir) -> None:
    """model_shape reads the config class's names: GPT-2's n_embd, DistilBERT's dim, XLNet's d_model are widths."""
    from layersim.models.registry import model_shape

    from layersim.models.registry import MODELS
    from layersim.models.tiny_configs import HIDDEN, LAYERS

    layers = (MODELS[name].shape or (HIDDEN, LAYERS))[1]
    assert model_shape(tiny_model_dir(name)) == {"num_layers": layers, "hidden_size": MODEL_HIDDEN_SIZE[name]}


def test_truncate_own_head_is_refused_where_it_cannot_be_copied(tiny_model_dir) -> None:
    """OWN_HEAD_ARCHITECTURES are the families whose head own_head copies: the others are refused in params."""
    from layersim.data.tasks import get_task
    from layersim.models.registry import load_task_model
    from layersim.models.task_heads import own_head
    from layersim.models.tiny_configs import ARCHITECTURES
    from layersim.params.validate import OWN_HEAD_ARCHITECTURES

    copied = set()
    for arch in ARCHITECTURES:
        try:
            own_head(load_task_model(tiny_model_dir(f"tiny-{arch}"), get_task("synth-negation")))
            copied.add(arch)
        except LayersimError:
            pass
    assert copied == set(OWN_HEAD_ARCHITECTURES)
    doc = _decoder_doc("tiny-deberta-v2", poolings=["cls", "mean"]) | {"truncate": {"head": "own"}}
    doc["similarity"] = {"measures": {"cls": ["linear_cka"]}, "attention_measures": []}
    with pytest.raises(LayersimError, match=r"truncate.head = 'own', but the task head of model 'tiny-deberta-v2' "
                                            r"\(a deberta-v2 model\) cannot be copied yet"):
        parse_params(doc)
