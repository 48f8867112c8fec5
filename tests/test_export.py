"""The export of a smaller model: exact identities on the four tiny architectures and small choice cases."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from layersim.data.batching import encode_task
from layersim.models.encoders import num_layers, run_layers, smaller_copy
from layersim.errors import LayersimError
from layersim.training.evaluate import predict
from layersim.experiments.export import (EXPORT_INFO_FILE, TASK_INFO_FILE, LayerChoice, best_per_depth, choice_logits,
                                         choose_layers, exact_rescore, export_report, export_timings, load_exported,
                                         time_models, write_checkpoint)
from layersim.models.registry import load_task_model, load_tokenizer
from layersim.data.tasks import generated_table, get_task
from transformers import AutoTokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CPU = torch.device("cpu")
ARCHITECTURES = [("tiny-bert", "synth-negation"), ("tiny-roberta", "synth-choice"),
                 ("tiny-albert", "synth-similarity"), ("tiny-electra", "synth-roles")]


def _task_model(tiny_model_dir, arch: str, task: str, examples: int = 20):
    spec = get_task(task)
    folder = tiny_model_dir(arch)
    torch.manual_seed(0)
    model = load_task_model(folder, spec).eval()
    tokenizer = load_tokenizer(folder)
    encoded = encode_task(generated_table(spec, "validation", examples, seed=0), spec, tokenizer, 32)
    return spec, model, tokenizer, encoded


def test_layer_choices_keep_the_layers_they_name():
    assert LayerChoice(12, 12).kept == list(range(12))
    assert LayerChoice(12, 5).kept == [0, 1, 2, 3, 4] and LayerChoice(12, 5).depth == 5
    skipped = LayerChoice(12, 12, 3, 5)
    assert skipped.kept == [0, 1, 5, 6, 7, 8, 9, 10, 11] and skipped.depth == 9
    assert skipped.as_dict()["kept_layers"] == "1,2,6,7,8,9,10,11,12"
    assert (skipped.as_dict()["skipped_first"], skipped.as_dict()["skipped_last"]) == (3, 5)
    assert LayerChoice(12, 5).as_dict()["skipped_first"] is None
    assert "skipped" in skipped.describe() and "exit after layer 5" in LayerChoice(12, 5).describe()


def test_choose_layers_takes_the_fewest_layers_within_tolerance():
    full, exit2, exit1 = LayerChoice(4, 4), LayerChoice(4, 2), LayerChoice(4, 1)
    skip23, skip12 = LayerChoice(4, 4, 2, 3), LayerChoice(4, 4, 1, 2)
    scores = {full: 0.80, exit1: 0.50, exit2: 0.795, skip23: 0.797, skip12: 0.60}
    assert choose_layers(scores, 0.01) == skip23            # 2 layers both; the better score wins
    assert choose_layers({**scores, skip23: 0.795}, 0.01) == exit2  # a tie: the exit is the simpler model
    assert choose_layers(scores, 0.001) == full             # nothing shallower is close enough
    assert choose_layers(scores, 0.5) == exit1
    assert best_per_depth(scores) == {1: exit1, 2: skip23, 4: full}


@pytest.mark.parametrize("arch,task", ARCHITECTURES)
def test_every_choice_exported_reproduces_its_logits_exactly(tiny_model_dir, tmp_path, arch, task):
    """An exported checkpoint, loaded by transformers alone, computes bit for bit what the fine-tuned model
    computes with those layers (exit or skipped span), and has that many layers."""
    spec, model, tokenizer, encoded = _task_model(tiny_model_dir, arch, task)
    logits = choice_logits(model, encoded, tokenizer, 8, CPU)
    num = num_layers(model)
    assert len(logits) == num + (num - 1) * num // 2  # exits 1..L, spans i..j < L
    for choice, expected in logits.items():
        with run_layers(model, choice.kept):
            np.testing.assert_array_equal(predict(model, encoded, tokenizer, 8, CPU), expected)
        folder = tmp_path / f"{choice.exit_layer}-{choice.first}-{choice.last}"
        reloaded, score = write_checkpoint(model, tokenizer, choice, folder, spec, {"source": "test"},
                                           lambda m, e=expected: exact_rescore(m, e, spec, encoded, tokenizer, 8,
                                                                               CPU, "fp32"),
                                           max_length=32)
        fresh = load_exported(folder, spec)
        assert fresh.config.num_hidden_layers == choice.depth == num_layers(fresh)
        np.testing.assert_array_equal(predict(fresh, encoded, tokenizer, 8, CPU), expected)
        assert (folder / EXPORT_INFO_FILE).is_file() and (folder / "config.json").is_file()
    assert num_layers(model) == num  # the source model is untouched


def test_a_failed_check_leaves_no_export_behind(tiny_model_dir, tmp_path):
    spec, model, tokenizer, encoded = _task_model(tiny_model_dir, "tiny-bert", "synth-negation")
    logits = choice_logits(model, encoded, tokenizer, 8, CPU)
    choice = LayerChoice(3, 2)
    wrong = logits[LayerChoice(3, 3)]  # the full model's logits are not the truncated one's
    with pytest.raises(LayersimError, match="differ from the truncated model"):
        write_checkpoint(model, tokenizer, choice, tmp_path / "out", spec, {},
                         lambda m: exact_rescore(m, wrong, spec, encoded, tokenizer, 8, CPU, "fp32"), max_length=32)
    assert list(tmp_path.iterdir()) == []


def test_smaller_copy_refuses_an_empty_stack_and_bad_layers(tiny_model_dir):
    _, model, _, _ = _task_model(tiny_model_dir, "tiny-bert", "synth-negation")
    with pytest.raises(LayersimError, match="at least one layer"):
        smaller_copy(model, [])
    with pytest.raises(LayersimError, match="out of range|valid"):
        smaller_copy(model, [0, 7])


def test_time_models_times_every_model_on_the_same_batches(tiny_model_dir):
    _, model, tokenizer, encoded = _task_model(tiny_model_dir, "tiny-bert", "synth-negation", examples=6)
    small = smaller_copy(model, [0])
    timings = time_models({"full": model, "exported": small}, encoded, tokenizer, 2, CPU, "fp32", repeats=2)
    assert set(timings) == {"full", "exported"}
    for times in timings.values():
        assert times["seconds_per_batch"] > 0 and times["examples_per_second"] > 0


@pytest.mark.parametrize("arch,task", ARCHITECTURES)
def test_an_export_names_its_labels_inputs_and_max_length(tiny_model_dir, tmp_path, arch, task):
    """What a user needs to deploy it: the config's id2label / label2id are the task's label names, the
    tokenizer truncates at the training max length, and layersim_task.json gives the format and text columns."""
    spec, model, tokenizer, _ = _task_model(tiny_model_dir, arch, task, examples=4)
    write_checkpoint(model, tokenizer, LayerChoice(3, 2), tmp_path, spec, {}, lambda m: None, max_length=24)
    config = json.loads((tmp_path / "config.json").read_text())
    if spec.label_names:
        assert config["id2label"] == {str(i): name for i, name in enumerate(spec.label_names)}
        assert config["label2id"] == {name: i for i, name in enumerate(spec.label_names)}
    else:  # regression and multiple choice: one output unit, no class names
        assert not any(name in config.get("id2label", {}).values() for name in ("different", "same", "negative"))
    card = json.loads((tmp_path / TASK_INFO_FILE).read_text())
    assert (card["format"], card["text_columns"], card["max_length"]) == (spec.format, list(spec.text_columns), 24)
    assert card["label_names"] == list(spec.label_names) and card["regression"] == spec.regression
    assert AutoTokenizer.from_pretrained(tmp_path).model_max_length == 24
    assert model.config.id2label == {0: "LABEL_0", 1: "LABEL_1"} or spec.num_labels == 1  # the source is untouched


SNIPPET_PAGE = "docs/outputs.md"  # "The exported model"


def _docs_snippet() -> str:
    """The docs' example of predicting with an exported model, as a user would copy it."""
    page = (Path(__file__).resolve().parents[1] / SNIPPET_PAGE).read_text(encoding="utf-8")
    blocks = [textwrap.dedent(b) for b in re.findall(r"^( *)```python\n(.*?)^\1```", page, re.S | re.M)
              for b in [b[1]]]
    found = [b for b in blocks if "data/export/" in b and "id2label" in b]
    assert len(found) == 1, f"{SNIPPET_PAGE} should hold one python example that predicts with an exported model"
    return found[0]


def test_the_docs_snippet_predicts_label_names(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """The docs' snippet, run as it is (from the folder it names, relative to the repository root) on an
    exported tiny model, prints the task's label names, one per sentence."""
    code = _docs_snippet()
    folder = re.search(r'folder = "([^"]+)"', code).group(1)
    task = Path(folder).parent.name  # data/export/<task>/model
    spec, model, tokenizer, _ = _task_model(tiny_model_dir, "tiny-bert", task, examples=4)
    write_checkpoint(model, tokenizer, LayerChoice(3, 3), tmp_path / folder, spec, {}, lambda m: None, max_length=32)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, SNIPPET_PAGE, "exec"), {})
    printed = eval(capsys.readouterr().out.strip().splitlines()[-1])  # the list the snippet prints
    sentences = re.search(r"sentences = (\[.*\])", code).group(1)
    assert len(printed) == len(eval(sentences)) and set(printed) <= set(spec.label_names)


def test_timings_are_kept_apart_from_the_hashed_report(tiny_model_dir):
    """The stage's metrics hold no wall-clock value; the speed-ups are in export_timings alone."""
    spec, model, tokenizer, encoded = _task_model(tiny_model_dir, "tiny-bert", "synth-negation", examples=6)
    logits = choice_logits(model, encoded, tokenizer, 8, CPU)
    scores = {split: {c: 0.5 + 0.1 * c.depth for c in logits} for split in ("train", "validation")}
    chosen = LayerChoice(3, 2)
    metrics, _, _ = export_report(spec, scores, chosen, smaller_copy(model, chosen.kept), 0.7, model, seed=1,
                                  tolerance=0.5, examples=(6, 6))
    assert not {"timing", "speedup"} & set(metrics)
    times = {1: {"full": {"seconds_per_batch": 0.4, "examples_per_second": 2.5},
                 "exported": {"seconds_per_batch": 0.2, "examples_per_second": 5.0}}}
    assert export_timings(times)["speedup"] == {"batch_1": 2.0}
