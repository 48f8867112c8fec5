"""LoRA fine-tuning (finetune.method: lora; layersim.training.adapters): a tiny-bert run changes only the adapted
matrices of the encoder, by updates of rank at most finetune.lora.rank (read by the weight-space analysis), resumes
bit for bit, and leaves full fine-tuning's fingerprint as it was."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from layersim.data.batching import encode_task
from layersim.data.tasks import generated_table, get_task
from layersim.experiments.weights import weight_changes
from layersim.models.registry import load_encoder, load_task_model, load_tokenizer
from layersim.params import FinetuneParams
from layersim.params.schema import LoraParams
from layersim.training import train
from layersim.training.resume import TrainingCheckpoint

pytestmark = pytest.mark.usefixtures("one_torch_thread")

RANK = 2  # well below tiny-bert's width (32), so "rank <= r" is a real constraint
# A high learning rate: the adapters' updates must stand well above float32 rounding after a few steps.
LORA = FinetuneParams(batch_size=4, learning_rate=1e-2, warmup_steps=1, max_steps=8, eval_every=0, max_length=32,
                      method="lora", lora=LoraParams(rank=RANK, alpha=4.0, dropout=0.1, target_modules="auto"))


def _finetune(folder, params, seed=0, resume=None):
    spec = get_task("synth-negation")
    tokenizer = load_tokenizer(folder)
    splits = [encode_task(generated_table(spec, split, n, seed=0), spec, tokenizer, params.max_length)
              for split, n in (("train", 32), ("validation", 16))]
    return train.finetune(folder, spec, *splits, params, seed, device=torch.device("cpu"), resume=resume)


@pytest.fixture(scope="module")
def lora_run(tiny_model_dir):
    return _finetune(tiny_model_dir("tiny-bert"), LORA)


def test_lora_changes_only_the_adapted_matrices_and_the_head(tiny_model_dir, lora_run):
    model, metrics = lora_run
    assert type(model).__name__ == "BertForSequenceClassification"  # merged: a plain model, no peft wrapper
    assert not any("lora" in name for name in model.state_dict())
    pretrained = load_encoder(tiny_model_dir("tiny-bert")).state_dict()
    tuned = model.base_model.state_dict()
    changed = sorted(name for name in pretrained if not torch.equal(pretrained[name], tuned[name]))
    # and the pooler, which only the classification head reads: it trains with the head
    assert changed == sorted([f"encoder.layer.{i}.attention.self.{role}.weight" for i in range(3)
                              for role in ("query", "value")] + ["pooler.dense.bias", "pooler.dense.weight"])
    assert 0.0 <= metrics["accuracy"] <= 1.0
    train.seed_everything(0)  # the head fine-tuning started from: trained too, since a random head is no model
    start = load_task_model(tiny_model_dir("tiny-bert"), get_task("synth-negation"))
    assert not torch.equal(start.classifier.weight, model.classifier.weight)


def test_the_weight_space_analysis_finds_updates_of_rank_at_most_r(tiny_model_dir, lora_run):
    model, _ = lora_run
    changes = weight_changes(load_encoder(tiny_model_dir("tiny-bert")), model.base_model, k=10, threshold=0.5)
    ranks = {key: change.update_rank for key, change in changes.items()}
    adapted = {key: rank for key, rank in ranks.items() if key[1] in ("query", "value")}
    assert set(adapted.values()) <= set(range(1, RANK + 1)) and len(adapted) == 6
    assert {rank for key, rank in ranks.items() if key not in adapted} == {0}
    assert all(changes[key].relative_update_norm > 0 for key in adapted)


def test_a_lora_run_resumes_bit_for_bit(tiny_model_dir, lora_run, tmp_path, caplog):
    """A state saved at step 4 by a LoRA run (peft-wrapped model, adapters' optimizer moments) resumes to the
    uninterrupted run's weights."""
    folder = tiny_model_dir("tiny-bert")
    params = dataclasses.replace(LORA, checkpoint_every=4)
    state = TrainingCheckpoint(tmp_path / "resume", {"run": "lora"})
    _finetune(folder, params, resume=state)  # leaves its step-4 state: only the stage clears it
    assert state.path.is_file()
    with caplog.at_level("INFO", logger="layersim"):
        resumed, _ = _finetune(folder, params, resume=state)
    assert "at step 4" in caplog.text and "discarded" not in caplog.text
    expected = lora_run[0].state_dict()
    assert all(torch.equal(expected[name], value) for name, value in resumed.state_dict().items())


def test_full_fine_tuning_keeps_its_fingerprint_and_lora_settings_enter_only_a_lora_run(tiny_model_dir, tmp_path):
    spec, folder = get_task("synth-negation"), tiny_model_dir("tiny-bert")
    for split in ("train", "validation"):
        (tmp_path / f"{split}.parquet").write_bytes(b"")
    full = train.run_fingerprint(folder, tmp_path, spec, FinetuneParams(), 0)
    assert "method" not in full["finetune"] and "lora" not in full["finetune"]
    assert full == train.run_fingerprint(folder, tmp_path, spec, FinetuneParams(lora=LoraParams(rank=4)), 0)
    lora = train.run_fingerprint(folder, tmp_path, spec, FinetuneParams(method="lora"), 0)
    assert lora["finetune"]["lora"]["rank"] == 8


@pytest.mark.parametrize("method, own_rate, expected", [("lora", 3e-3, 3e-3), ("lora", None, 1e-2),
                                                        ("full", 3e-3, 1e-2)])
def test_lora_trains_at_its_own_learning_rate_when_one_is_set(tiny_model_dir, method, own_rate, expected):
    """finetune.lora.learning_rate: a LoRA run's optimizer starts from it (null: finetune.learning_rate); a full run
    ignores it, and so does its fingerprint."""
    settings = dataclasses.replace(LORA, method=method, lora=dataclasses.replace(LORA.lora, learning_rate=own_rate))
    model = load_task_model(tiny_model_dir("tiny-bert"), get_task("synth-negation"))
    if method == "lora":
        from layersim.training.adapters import with_adapters

        model = with_adapters(model, settings.lora)
    optimizer = train.make_optimizer(model, settings)
    assert {group["lr"] for group in optimizer.param_groups} == {expected}


def test_a_rank_wider_than_the_adapted_matrices_is_refused_before_training(tiny_model_dir):
    """The rank params cannot check (a model it does not know the width of) is checked on the matrices themselves:
    tiny-bert's query and value are 32 × 32, so rank 32 adapts and 33 is one sentence naming the matrix."""
    from layersim.errors import LayersimError
    from layersim.training.adapters import with_adapters

    model = load_task_model(tiny_model_dir("tiny-bert"), get_task("synth-negation"))
    with pytest.raises(LayersimError, match=r"finetune.lora.rank = 33 is larger than the narrowest adapted matrix "
                                            r"\(.*\.query, 32 wide\).*use a rank from 1 to 32\."):
        with_adapters(model, dataclasses.replace(LORA.lora, rank=33))
    assert with_adapters(model, dataclasses.replace(LORA.lora, rank=32)).peft_config["default"].r == 32
