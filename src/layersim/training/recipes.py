"""The fine-tuning recipes the freeze stage can run (`freeze.recipe`).

``wu``: Wu et al. (2020) fine-tuned with the Hugging Face defaults of their time (run_glue / Trainer):
AdamW with batch 8, learning rate 5e-5, Adam epsilon 1e-8 and betas (0.9, 0.999), no weight decay, no
warm-up, a linear decay to 0, gradients clipped to norm 1.0, 3 epochs. Epochs become steps from the train
split's size: ``max_steps = 3 × ⌈n / 8⌉``, Hugging Face's count. One difference: HF ends each epoch on a
partial batch, while layersim's data order (:class:`layersim.training.train.DataOrder`) keeps every batch
full and runs on into the next epoch's shuffle, so the run sees ``8 × max_steps`` examples, up to 3 × 7 more
than 3 epochs. The sequence length, evaluation batch, precision and convergence rule stay the finetune
section's (Wu's max_seq_length, 128, is a tokenization setting, not part of the optimisation recipe).

``finetune``: the finetune section's recipe, exactly (the finetune stage's run of a seed is then the
unfrozen run of that recipe and seed).

Either way the frozen runs evaluate only at the end and keep no resumable state: neither changes a run's
result (evaluation runs without dropout or any random draw)."""

from __future__ import annotations

import dataclasses
import math

from layersim.errors import unknown_name
from layersim.params import FinetuneParams

RECIPES = ("wu", "finetune")

# Hugging Face's defaults as Wu et al. ran them. Adam's epsilon (1e-8) and betas are torch's AdamW defaults,
# which layersim.training.train.make_optimizer keeps.
WU_BATCH_SIZE = 8
WU_LEARNING_RATE = 5e-5
WU_ADAM_EPSILON = 1e-8
WU_EPOCHS = 3
WU_MAX_GRAD_NORM = 1.0


def wu_steps(num_train: int) -> int:
    """Hugging Face's optimisation steps for 3 epochs of batch 8: ``3 × ⌈n / 8⌉``."""
    return WU_EPOCHS * math.ceil(num_train / WU_BATCH_SIZE)


def freeze_recipe(recipe: str, finetune: FinetuneParams, num_train: int) -> FinetuneParams:
    """The FinetuneParams of `recipe` for a task with `num_train` training examples (see the module doc)."""
    if recipe not in RECIPES:
        raise unknown_name("freeze recipe", recipe, RECIPES, "wu: Hugging Face's defaults as Wu et al. ran them; "
                                                             "finetune: the finetune section's recipe")
    # Wu et al. froze layers of full fine-tuning: the frozen and unfrozen runs train every unfrozen weight, whatever
    # finetune.method (the gate refuses recipe finetune with lora, whose unfrozen runs would be LoRA's).
    quiet = dataclasses.replace(finetune, eval_every=0, checkpoint_every=0, method="full")
    if recipe == "finetune":
        return quiet
    return dataclasses.replace(quiet, batch_size=WU_BATCH_SIZE, learning_rate=WU_LEARNING_RATE, warmup_steps=0,
                               max_steps=wu_steps(num_train), weight_decay=0.0, max_grad_norm=WU_MAX_GRAD_NORM)


def recipe_record(recipe: str, params: FinetuneParams) -> dict:
    """What a recipe ran, for the stage's details: its name and the optimisation settings it used."""
    keys = ("batch_size", "learning_rate", "warmup_steps", "max_steps", "weight_decay", "max_grad_norm")
    return {"name": recipe, "adam_epsilon": WU_ADAM_EPSILON} | {key: getattr(params, key) for key in keys}
