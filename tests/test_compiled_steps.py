"""Compiled training steps (finetune.compile, layersim.compute.compiled): batches padded to a few static widths, the
model compiled, the recipe unchanged. On the CPU the wiring is checked with a cheap compiler backend (aot_eager:
the forward and backward traced as a compiled run traces them, run eagerly); what CUDA graphs save is measured by
benchmarks/gpu_check.py on a GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModel

from layersim.compute import compiled as compiled_module
from layersim.compute.compiled import compiles
from layersim.data.batching import collate, encode_task, pad_rows, padded_width
from layersim.data.tasks import generated_table, get_task
from layersim.errors import LayersimError
from layersim.models.registry import load_tokenizer, snapshot_model
from layersim.params import FinetuneParams
from layersim.params.vocabulary import COMPILE_SETTINGS
from layersim.training import train

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.mark.parametrize("longest,multiple,cap,width", [
    (1, None, None, 1), (37, None, 64, 37),          # no multiple: the batch's own longest
    (1, 64, None, 64), (64, 64, None, 64), (65, 64, None, 128),
    (65, 64, 100, 100),                               # never past max_length …
    (120, 64, 100, 120),                              # … unless the batch already is (the tokenizer's own max)
    (100, 64, 100, 100), (30, 8, 32, 32),
])
def test_padded_width(longest, multiple, cap, width):
    assert padded_width(longest, multiple, cap) == width


def test_compile_settings_by_device():
    assert compiled_module.COMPILE_SETTINGS == COMPILE_SETTINGS  # the params' spelling (no import across layers)
    assert [compiles(s, CPU) for s in COMPILE_SETTINGS] == [False, True, False]
    assert [compiles(s, CUDA) for s in COMPILE_SETTINGS] == [True, True, False]
    with pytest.raises(LayersimError, match=r"finetune.compile = 'yes' is not one of auto, on, off"):
        compiles("yes", CPU)


@pytest.mark.parametrize("side", ["right", "left"])
def test_padding_to_a_multiple_keeps_every_token_and_masks_the_rest(tiny_model_dir, side):
    tokenizer = load_tokenizer(tiny_model_dir("tiny-bert"))
    tokenizer.padding_side = side
    rng = np.random.default_rng(0)
    rows = [{"input_ids": rng.integers(5, 90, n).tolist(), "attention_mask": [1] * n} for n in (3, 17, 9)]
    tight, wide = pad_rows(rows, tokenizer), pad_rows(rows, tokenizer, 8, 64)
    assert tight["input_ids"].shape == (3, 17) and wide["input_ids"].shape == (3, 24)
    extra = 24 - 17
    kept = slice(None, 17) if side == "right" else slice(extra, None)
    assert torch.equal(wide["input_ids"][:, kept], tight["input_ids"])
    assert torch.equal(wide["attention_mask"][:, kept], tight["attention_mask"])
    padding = slice(17, None) if side == "right" else slice(None, extra)
    assert (wide["attention_mask"][:, padding] == 0).all()
    assert (wide["input_ids"][:, padding] == tokenizer.pad_token_id).all()


def test_multiple_choice_batches_pad_every_choice_to_the_same_width(tiny_model_dir):
    spec = get_task("synth-choice")
    tokenizer = load_tokenizer(tiny_model_dir("tiny-bert"))
    encoded = encode_task(generated_table(spec, "train", 8, seed=0), spec, tokenizer, 48)
    batch = collate(encoded, [0, 1, 2], tokenizer, multiple=32, cap=48)
    assert batch["input_ids"].shape[:2] == (3, encoded.num_choices)
    assert batch["input_ids"].shape[-1] in (32, 48)


@pytest.fixture(scope="module")
def no_dropout_bert(tiny_model_dir, tmp_path_factory):
    """tiny-bert without dropout: a padded batch draws other dropout masks than a tight one, so only without
    dropout are a compiled (padded) run and an eager one equal to float rounding."""
    source, root = tiny_model_dir("tiny-bert"), tmp_path_factory.mktemp("nodrop")
    local = root / "models" / "nodrop"  # through the local-model route: models/<folder> of the working directory
    AutoModel.from_pretrained(source, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0).save_pretrained(local)
    load_tokenizer(source).save_pretrained(local)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        snapshot_model("local/nodrop", root / "snapshot")
    return root / "snapshot"


@pytest.mark.parametrize("task", ["synth-negation", "synth-choice"])
def test_a_compiled_run_trains_as_the_eager_run_does(no_dropout_bert, monkeypatch, task):
    monkeypatch.setattr(compiled_module, "CPU_BACKEND", "aot_eager")
    traced = []
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kw: traced.append(kw) or real_compile(model, **kw))
    spec = get_task(task)
    tokenizer = load_tokenizer(no_dropout_bert)
    train_set = encode_task(generated_table(spec, "train", 32, seed=0), spec, tokenizer, 40)
    validation = encode_task(generated_table(spec, "validation", 16, seed=0), spec, tokenizer, 40)
    runs = {}
    for setting in ("off", "on"):
        logs: list = []
        params = FinetuneParams(batch_size=4, learning_rate=1e-3, warmup_steps=2, max_steps=8, eval_every=0,
                                max_length=40, compile=setting)
        model, metrics = train.finetune(no_dropout_bert, spec, train_set, validation, params, 0, device=CPU,
                                        log=lambda step, values: logs.append(values))
        runs[setting] = ([v["train/loss"] for v in logs if "train/loss" in v], metrics, model.state_dict())
    assert traced == [{"backend": "aot_eager", "dynamic": False}]  # compiled once, only when on
    (eager_losses, eager_metrics, eager_state), (losses, metrics, state) = runs["off"], runs["on"]
    np.testing.assert_allclose(losses, eager_losses, rtol=1e-4)
    assert metrics == pytest.approx(eager_metrics, abs=1e-6)
    # Adam divides by the gradient's running size, so a parameter whose gradient is near 0 moves by ±lr on a rounding
    # difference: the whole update is compared, not each entry.
    train.seed_everything(0)  # the head's initialisation, as the runs drew it
    start = train.load_task_model(no_dropout_bert, spec).state_dict()
    moved = {key: (state[key] - start[key], eager_state[key] - start[key]) for key in start}
    difference = sum(float((a - b).double().square().sum()) for a, b in moved.values()) ** 0.5
    update = sum(float(b.double().square().sum()) for _, b in moved.values()) ** 0.5
    assert update > 0 and difference / update < 1e-3


def test_the_fingerprint_of_an_eager_run_is_unchanged_and_a_compiled_one_differs(tmp_path, monkeypatch):
    monkeypatch.setattr(train, "model_info", lambda folder: {"digest": "base"})
    monkeypatch.setattr(train, "file_digest", lambda path: "data")
    spec = get_task("synth-negation")
    prints = [train.run_fingerprint("base", tmp_path, spec, FinetuneParams(compile=setting), 0)
              for setting in COMPILE_SETTINGS]
    assert prints[0] == prints[1] == prints[2] and "compile" not in prints[0]["finetune"]
    compiled_print = train.run_fingerprint("base", tmp_path, spec, FinetuneParams(), 0, compiled=True)
    assert compiled_print != prints[0] and {k: v for k, v in compiled_print.items() if k != "compiled"} == prints[0]
