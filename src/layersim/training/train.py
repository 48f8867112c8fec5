"""Fine-tuning: a plain PyTorch loop (AdamW, linear warm-up then linear decay, dynamic padding).

A seed fixes the head's initialisation, the data order and dropout, so on CPU the same inputs give
the same weights — also across a kill and resume (see :mod:`layersim.training.resume`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import random
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from layersim.data.batching import EncodedTask, collate, encode_task
from layersim.training.convergence import (Convergence, Predictions, check_run, final_loss, learning_rate_setting,
                                          trivial_loss)
from layersim.compute.compiled import PAD_MULTIPLE, compiled, compiles
from layersim.compute.device import autocast, default_device, grad_scaler, resolve_precision, to_device
from layersim.compute.host_memory import reused_host_memory
from layersim.models.freezing import frozen_layers
from layersim.errors import LayersimError
from layersim.compute.training_steps import GradientSteps
from layersim.training.evaluate import METRICS, predict, prediction_metrics, predictions_from_logits, score
from layersim.models.registry import (MODEL_INFO_FILE, file_digest, load_task_model, load_tokenizer, model_info,
                                      verified_info, weights_digest)
from layersim.params import FinetuneParams
from layersim.training.adapters import is_adapted, merged, with_adapters
from layersim.training.resume import TrainingCheckpoint, TrainingState
from layersim.training.states import StateKeeper
from layersim.data.tasks import TaskSpec

cli_log = logging.getLogger("layersim")

# Called as log(step, {"train/loss": ..., "train/lr": ..., "eval/accuracy": ...}).
Logger = Callable[[int, dict[str, float]], None]


def live_logger(live) -> Logger:
    """A :data:`Logger` that writes every value to a dvclive ``Live`` at its step (None: a logger that drops them)."""
    def log(step: int, values: dict[str, float]) -> None:
        for name, value in (values.items() if live else ()):
            live.step = step
            live.log_metric(name, value)

    return log


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def make_optimizer(model: torch.nn.Module, params: FinetuneParams) -> torch.optim.Optimizer:
    """AdamW over the trainable weights (all of them but under LoRA, at finetune.lora.learning_rate if set); biases
    and LayerNorm weights get no weight decay. The fused kernel is ~10x faster than the default on CPU for a 22M-parameter encoder (0.024 s vs 0.24 s
    per step, measured)."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (no_decay if param.ndim < 2 else decay).append(param)
    groups = [{"params": decay, "weight_decay": params.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=learning_rate_setting(params)[1], fused=True)


def linear_warmup_decay(optimizer: torch.optim.Optimizer, warmup_steps: int, max_steps: int):
    """Learning rate rises linearly for `warmup_steps`, then falls linearly to 0 at `max_steps`."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return max(0.0, (max_steps - step) / max(1, max_steps - warmup_steps))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


class DataOrder:
    """Example indices of every step: a fresh seeded shuffle per epoch, cut into batches of `batch_size`.

    Generated lazily, an epoch at a time (the old epochs are dropped), so memory does not grow with the
    number of steps; ``order[step]`` is the same as concatenating every epoch's permutation up front."""

    def __init__(self, num_examples: int, batch_size: int, seed: int):
        self.num_examples, self.batch_size = num_examples, batch_size
        self._rng = np.random.default_rng(seed)
        self._epochs: dict[int, np.ndarray] = {}
        self._next_epoch = 0

    def _epoch(self, k: int) -> np.ndarray:
        while self._next_epoch <= k:
            self._epochs[self._next_epoch] = self._rng.permutation(self.num_examples)
            self._next_epoch += 1
        return self._epochs[k]

    def __getitem__(self, step: int) -> np.ndarray:
        start = step * self.batch_size
        first, last = start // self.num_examples, (start + self.batch_size - 1) // self.num_examples
        flat = np.concatenate([self._epoch(k) for k in range(first, last + 1)])
        for old in [k for k in self._epochs if k < first]:
            del self._epochs[old]
        offset = start - first * self.num_examples
        return flat[offset:offset + self.batch_size]


def data_order(num_examples: int, batch_size: int, max_steps: int, seed: int) -> np.ndarray:
    """Every step's example indices at once, (max_steps, batch_size): for small runs and tests; training
    uses :class:`DataOrder`, which gives the same rows lazily."""
    order = DataOrder(num_examples, batch_size, seed)
    return np.stack([order[step] for step in range(max_steps)])


def finetune(pretrained_dir: str | Path, spec: TaskSpec, train: EncodedTask, validation: EncodedTask,
             params: FinetuneParams, seed: int, *, log: Logger | None = None,
             device: torch.device | None = None, resume: TrainingCheckpoint | None = None,
             freeze: tuple[str, int] | None = None, timing: dict | None = None, checks: dict | None = None,
             keep: StateKeeper | None = None) -> tuple[torch.nn.Module, dict[str, float]]:
    """Fine-tune the encoder in `pretrained_dir` on `train`; return the model and final validation metrics.

    With `freeze` = (side, k), the bottom or top k layers are frozen while training
    (:func:`layersim.models.freezing.frozen_layers`). A `timing` dict receives ``train_seconds``: the wall time of
    the training steps, evaluations and saved states left out (of this process only, when resumed). A `checks`
    dict receives ``convergence``: the run's :class:`~layersim.training.convergence.Convergence` (:func:`convergence_of`).

    With `resume`, the full training state is saved there every `params.checkpoint_every` steps, and a
    run that finds a state saved by an identical earlier run (same fingerprint) continues from it: the
    logged history is replayed into `log`, and the result is bit-identical to an uninterrupted run.

    With `keep` (layersim.training.states), the encoder's weights after each of its steps are staged there; a resumed
    run keeps those staged up to its resume point and writes the later ones again.

    With ``params.method`` lora, LoRA adapters train (:mod:`layersim.training.adapters`) and the returned model has
    them merged into its weights: a plain task model like a fully fine-tuned one."""
    device = device or default_device()
    if params.batch_size > len(train):
        raise LayersimError(f"finetune.batch_size = {params.batch_size} is larger than the {len(train)} training "
                            f"examples of task {spec.name!r}; use at most {len(train)}, or more examples.")
    seed_everything(seed)
    tokenizer = load_tokenizer(pretrained_dir)
    model = load_task_model(pretrained_dir, spec).to(device)
    if params.method == "lora":  # after the head's seeded initialisation, so a seed's head is the same either way
        model = with_adapters(model, params.lora)
    optimizer = make_optimizer(model, params)
    scheduler = linear_warmup_decay(optimizer, params.warmup_steps, params.max_steps)
    order = DataOrder(len(train), params.batch_size, seed)
    sink = log or (lambda step, values: None)
    what = f"fine-tuning {spec.name} seed {seed}"
    rate_key, rate = learning_rate_setting(params)  # a LoRA run's own, finetune.lora.learning_rate
    hint = f"lower {rate_key} (now {rate:g}) or add warm-up steps"
    history: list[tuple[int, dict[str, float]]] = []

    def log(step: int, values: dict[str, float]) -> None:
        history.append((step, values))
        sink(step, values)

    log_every = max(1, min(50, params.max_steps // 100))
    start, running, count = 0, torch.zeros((), device=device), 0
    state = resume.load(device) if resume else None
    if state is not None:
        try:
            start, running, count = state.restore(model, optimizer, scheduler)
        except (RuntimeError, KeyError, ValueError, TypeError) as err:  # saved by another model or version
            cli_log.warning("discarded resume state at %s: it does not fit this model (%s); starting from step 0",
                            resume.path, str(err).splitlines()[0][:200])
            resume.clear()
            return finetune(pretrained_dir, spec, train, validation, params, seed, log=sink, device=device,
                            resume=resume, freeze=freeze, timing=timing, checks=checks, keep=keep)
        for step, values in state.history:
            log(step, values)
    if keep:
        keep.start(start)
    precision = resolve_precision(params.precision, device)
    # Compiled steps (finetune.compile): the same parameters, batches padded to a few static widths.
    stepped, multiple = (compiled(model, device), PAD_MULTIPLE) if compiles(params.compile, device) else (model, None)
    steps = GradientSteps(optimizer, scheduler, total=params.max_steps, device=device,
                          max_grad_norm=params.max_grad_norm, scaler=grad_scaler(device, precision))

    # Frozen layers (Wu et al. Table 1) stay frozen for the whole loop; the model is whole again after it. The
    # embedding table's gradient, allocated anew at every step, reuses the last step's pages (compute.host_memory).
    with frozen_layers(model, *freeze) if freeze else contextlib.nullcontext(), reused_host_memory():
        model.train()
        started, paused = time.perf_counter(), 0.0
        progress = tqdm(range(start, params.max_steps), desc=f"finetune {spec.name} seed {seed}", mininterval=2,
                        initial=start, total=params.max_steps)
        for step in progress:
            batch = to_device(collate(train, order[step], tokenizer, multiple=multiple, cap=params.max_length), device)
            with autocast(device, precision):
                loss = stepped(**batch).loss
            steps.take(loss, step + 1)
            running += loss.detach()
            count += 1
            done = step + 1
            if done % log_every == 0 or done == params.max_steps:
                # One host sync per logging window, not per step.
                steps.check(done, what, hint)
                mean_loss = float(running) / count
                progress.set_postfix(loss=f"{mean_loss:.4f}")
                log(done, {"train/loss": mean_loss, "train/lr": scheduler.get_last_lr()[0]})
                running, count = torch.zeros((), device=device), 0
            pause = time.perf_counter()
            if params.eval_every and done % params.eval_every == 0 and done != params.max_steps:
                log(done, _prefixed(evaluate_model(model, spec, validation, tokenizer, params, device)))
                model.train()
            if keep and keep.keeps(done):
                keep.save(done, model)
            if resume and params.checkpoint_every and done % params.checkpoint_every == 0 and done != params.max_steps:
                steps.check(done, what, hint)  # a diverged run leaves no state to resume
                resume.save(TrainingState.capture(done, model, optimizer, scheduler, running, count, history))
            paused += time.perf_counter() - pause
        if timing is not None:
            timing["train_seconds"] = round(time.perf_counter() - started - paused, 3)
    if is_adapted(model):  # the checkpoint, and the score reported for it, are of the plain merged model
        model = merged(model)
    predictions = predictions_from_logits(spec, predict(model, validation, tokenizer, params.eval_batch_size, device,
                                                        precision=resolve_precision(params.precision, device)))
    final = prediction_metrics(spec, predictions, validation.labels)
    log(params.max_steps, _prefixed(final))
    if checks is not None:  # the history holds every logged loss, those replayed from a resumed state included
        losses = [values["train/loss"] for _, values in history if "train/loss" in values]
        checks["convergence"] = convergence_of(spec, train, validation, losses, final, predictions)
    return model, final


def best_constant(spec: TaskSpec, train_labels: np.ndarray, validation_labels: np.ndarray) -> tuple[float, float]:
    """The best constant predictor on the validation labels, as (its prediction, its primary metric): the
    highest-scoring constant class (answer position for multiple choice; the first on a tie) — the majority for
    accuracy, always the positive class for F1 (QQP: 0.538, where the majority "not duplicate" scores 0) — and for
    regression the train split's mean, whose correlations METRICS gives as 0 (undefined for a constant)."""
    labels = np.asarray(validation_labels)
    if spec.regression:
        constants = [float(np.mean(train_labels))]
    else:
        constants = np.unique(np.concatenate([np.asarray(train_labels), labels]).astype(np.int64)).tolist()
    scores = [float(METRICS[spec.primary_metric](labels, np.full(len(labels), constant))) for constant in constants]
    best = int(np.argmax(scores))
    return constants[best], scores[best]


def trivial_score(spec: TaskSpec, train_labels: np.ndarray, validation_labels: np.ndarray) -> float:
    """The primary metric of the best constant predictor on the validation labels (:func:`best_constant`)."""
    return best_constant(spec, train_labels, validation_labels)[1]


def convergence_of(spec: TaskSpec, train: EncodedTask, validation: EncodedTask, losses: list[float],
                   metrics: dict[str, float], predictions: np.ndarray) -> Convergence:
    """The run's convergence check (layersim.training.convergence.check_run) from its logged training losses, its
    validation `metrics` and the `predictions` they score, against the trivial predictor fitted on the train split
    and the best constant's predictions of the same validation examples (the paired test)."""
    constant, baseline = best_constant(spec, train.labels, validation.labels)
    return check_run(spec.primary_metric, metrics[spec.primary_metric], baseline, final_loss(losses),
                     trivial_loss(train.labels, spec.regression,
                                  spec.num_choices if spec.format == "multiple_choice" else None),
                     sample=Predictions(np.asarray(validation.labels), np.asarray(predictions), constant))


def encoded_splits(task_dir: str | Path, spec: TaskSpec, tokenizer, max_length: int) -> tuple[EncodedTask, EncodedTask]:
    """The train and validation tables of a task, tokenized for fine-tuning."""
    from layersim.data.io import read_task_table

    return tuple(encode_task(read_task_table(task_dir, spec, split), spec, tokenizer, max_length)
                 for split in ("train", "validation"))


def with_method(params, method: str | None):
    """`params` (validated Params) for a run of `method`, one of finetune.compare_methods (None: finetune.method's
    run): the same settings, the other method."""
    if method is None:
        return params
    if method not in params.finetune.compare_methods:
        raise LayersimError(f"--method {method} is not one of finetune.compare_methods = "
                            f"{list(params.finetune.compare_methods)}; run the finetune_compared stage's items.")
    return dataclasses.replace(params, finetune=dataclasses.replace(params.finetune, method=method))


def run_fingerprint(base_dir: str | Path, task_dir: str | Path, spec: TaskSpec, params: FinetuneParams,
                    seed: int, *, compiled: bool = False) -> dict:
    """What determines a fine-tuning run's result; a saved training state resumes only a run with the
    same fingerprint. How often states are saved, and whether an unconverged run fails its stage, do not change
    the result, so they are left out; so are the LoRA settings of a full fine-tuning run, which keeps the
    fingerprint (and the resumable states) it had before finetune.method existed, and keep_states when it is 0
    (none kept; a run keeping states stages them beside its resumable state: layersim.training.states). A compiled
    run's steps round differently from eager ones: `compiled` (finetune.compile resolved on the run's device) is in
    the fingerprint when true, and the setting itself never (an eager run keeps its fingerprint)."""
    ignored = (("checkpoint_every", "require_convergence", "compare_methods", "compile")
               + (("method", "lora") if params.method == "full" else ()) + (("keep_states",) if not params.keep_states else ()))
    settings = {k: v for k, v in dataclasses.asdict(params).items() if k not in ignored}
    return ({"compiled": True} if compiled else {}) | {
        "task": spec.name, "seed": seed, "finetune": settings, "base_digest": model_info(base_dir)["digest"],
        "data": {split: file_digest(Path(task_dir) / f"{split}.parquet") for split in ("train", "validation")}}


def _prefixed(metrics: dict[str, float]) -> dict[str, float]:
    return {f"eval/{k}": v for k, v in metrics.items()}


def evaluate_model(model, spec: TaskSpec, validation: EncodedTask, tokenizer, params: FinetuneParams,
                   device: torch.device) -> dict[str, float]:
    return score(model, spec, validation, tokenizer, params.eval_batch_size, device,
                 precision=resolve_precision(params.precision, device))


def save_checkpoint(model, tokenizer, folder: Path, *, base_dir: str | Path, task: str, seed: int,
                    task_digest: str | None = None, convergence: dict | None = None, method: str = "full") -> None:
    """Weights (safetensors), config and tokenizer, plus layersim's info file, into `folder` (with the fine-tuning
    `method` when it is not full: a full run's info is what it was before methods existed); `task_digest`:
    of the task tables it was fine-tuned on (layersim.data.io.task_tables_digest), checked by later stages;
    `convergence`: the run's convergence record, which later stages' figures mark the run by. Nothing
    wall-clock or host-specific goes in: the folder is a DVC output that a rerun must reproduce byte for byte."""
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    base = verified_info(base_dir)
    info = {"name": base["name"], "source": "finetune", "base_digest": base["digest"], "task": task,
            "seed": seed, "task_digest": task_digest, "digest": weights_digest(folder)}
    if convergence is not None:
        info["convergence"] = convergence
    if method != "full":
        info["method"] = method
    (Path(folder) / MODEL_INFO_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
