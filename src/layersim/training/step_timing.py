"""What freezing layers saves in training time, measured interleaved in one process.

Timing separate runs compares two processes at different times on a machine others share: a busy minute
shows up as a saving. Here one model takes training steps in blocks of `block` steps, the configurations
(unfrozen and each frozen one) alternating block by block on the same batches, so that a slow spell slows
every configuration's block of that round alike. Each round reverses the previous round's order (no
configuration always runs first after a switch), a first warm-up round is not counted, and the cost of a
configuration is the median over rounds of its block's time divided by the unfrozen block's time in the same
round. The steps are real training steps (forward, backward, clipping, AdamW step: frozen parameters have no
gradient and are skipped by the optimizer) on batches collated and moved to the device before the clock runs.
The model's weights change as the blocks train them; the cost of a step does not depend on their values.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Mapping, Sequence

import torch

from layersim.compute.device import autocast, grad_scaler, resolve_precision, to_device
from layersim.compute.host_memory import reused_host_memory
from layersim.compute.training_steps import GradientSteps
from layersim.data.batching import EncodedTask, collate
from layersim.data.tasks import TaskSpec
from layersim.models.freezing import frozen_layers
from layersim.models.registry import load_task_model, load_tokenizer
from layersim.params import FinetuneParams
from layersim.training.train import DataOrder, make_optimizer, seed_everything

UNFROZEN = "unfrozen"
WARMUP_ROUNDS = 1  # first calls (allocator, kernel choice) are slower: one round not counted


def interleaved_timing(blocks: Mapping[str, Callable[[range], None]], *, block: int, rounds: int, warmup: int = WARMUP_ROUNDS,
                       clock: Callable[[], float] = time.perf_counter, sync: Callable[[], None] = lambda: None,
                       ) -> dict[str, list[float]]:
    """Seconds of each configuration's block in each counted round. ``blocks[name](steps)`` runs the training
    steps `steps` (a range of step indices, the batches to use) for configuration `name`; in round r every
    configuration runs the same steps ``r·block … (r+1)·block − 1``, in the order of `blocks` in even rounds
    and reversed in odd ones. `sync` waits for the device (CUDA runs asynchronously) before the clock is read."""
    names = list(blocks)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for r in range(warmup + rounds):
        steps = range(r * block, (r + 1) * block)
        for name in names if r % 2 == 0 else names[::-1]:
            sync()
            start = clock()
            blocks[name](steps)
            sync()
            if r >= warmup:
                seconds[name].append(clock() - start)
    return seconds


def time_ratios(seconds: Mapping[str, Sequence[float]], baseline: str = UNFROZEN) -> dict[str, dict[str, float]]:
    """Per configuration other than `baseline`: ``time_ratio``, the median over rounds of its block's time over
    the baseline's block time in the same round (0.76: 24 % less time per step), and
    ``steps_per_second_ratio``, its inverse (1.32: 32 % more training steps per second)."""
    ratios = {}
    for name, times in seconds.items():
        if name != baseline:
            ratio = statistics.median(t / base for t, base in zip(times, seconds[baseline], strict=True))
            ratios[name] = {"time_ratio": round(ratio, 4), "steps_per_second_ratio": round(1 / ratio, 4)}
    return ratios


def time_frozen_steps(pretrained_dir, spec: TaskSpec, train: EncodedTask, params: FinetuneParams, seed: int,
                      configs: Mapping[str, tuple[str, int]], *, block: int, rounds: int, device: torch.device,
                      ) -> tuple[dict[str, list[float]], list[int]]:
    """Block seconds of the unfrozen model and of each frozen configuration (name → (side, k)), interleaved
    (:func:`interleaved_timing`) on the first ``(rounds + 1) × block`` batches (one warm-up round) of `seed`'s data order with the
    recipe `params`; and the padded length of every sequence of the counted batches (for the FLOPs count)."""
    seed_everything(seed)
    tokenizer = load_tokenizer(pretrained_dir)
    model = load_task_model(pretrained_dir, spec).to(device).train()
    optimizer = make_optimizer(model, params)
    precision = resolve_precision(params.precision, device)
    steps = GradientSteps(optimizer, None, total=(rounds + WARMUP_ROUNDS) * block, device=device,
                          max_grad_norm=params.max_grad_norm, scaler=grad_scaler(device, precision))
    order = DataOrder(len(train), params.batch_size, seed)
    batches = [to_device(collate(train, order[step], tokenizer), device) for step in range((rounds + WARMUP_ROUNDS) * block)]

    def runner(freeze: tuple[str, int] | None) -> Callable[[range], None]:
        def run(step_range: range) -> None:
            with frozen_layers(model, *freeze) if freeze else contextlib.nullcontext():
                for step in step_range:
                    with autocast(device, precision):
                        loss = model(**batches[step]).loss
                    steps.take(loss, step + 1)
        return run

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    blocks = {UNFROZEN: runner(None)} | {name: runner(freeze) for name, freeze in configs.items()}
    with reused_host_memory():  # as the training loop runs its steps (layersim.training.train.finetune)
        seconds = interleaved_timing(blocks, block=block, rounds=rounds, sync=sync)
    counted = batches[WARMUP_ROUNDS * block:]
    lengths = [int(b["input_ids"].shape[-1]) for b in counted for _ in range(b["input_ids"][..., 0].numel())]
    return seconds, lengths

