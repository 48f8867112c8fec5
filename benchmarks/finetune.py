"""Fine-tuning throughput: layersim's training loop against the Hugging Face ``transformers.Trainer``.

Both train the same model (the offline pretrained ``minilm-l6`` by default) from the same
initialisation on the same tokenized examples in the same order, so every step sees the same padded
batch (dynamic padding: layersim's ``collate`` vs ``DataCollatorWithPadding``). Both use
``torch.optim.AdamW(fused=True)`` (the Trainer's ``optim="adamw_torch_fused"``) with no weight decay
on biases and LayerNorm weights, the same learning rate, warm-up and linear decay over
``max_steps``, and no gradient clipping (the Trainer's default clips at 1.0; ours does not, so it
gets ``max_grad_norm=0``). Neither evaluates or saves during the timed window: ours runs the paper
configuration (evaluation every 1,000 steps, loss logged every 50) and the window ends long before
step 1,000; the Trainer has no evaluation, no saving, logs every 50 steps, and loads data in the
main process like ours (``dataloader_num_workers=0``). CPU only (``use_cpu=True``).

A global optimizer hook stamps the time after every ``optimizer.step()`` in either loop, so both are
timed the same way: ``--warmup`` steps untimed, then ``--steps`` timed steps, after which the hook
stops the run. The loops alternate for ``--repeats`` rounds and the median steps/s of each is
reported, with the ratio layersim / Trainer (goal: >= 1.0x).

Both loops run with one torch thread by default: on a small shared machine (2 cores, other jobs
running) two intra-op threads spin against each other and everything else, which made steps 4-10x
slower and run-to-run spread 5x in our measurements, drowning the difference between the loops.
``--threads 0`` keeps torch's own choice (one per core) for a dedicated machine.

    python benchmarks/finetune.py                  # minilm-l6, batch 4 and 16, 5 + 30 steps, 3 rounds
    python benchmarks/finetune.py --quick          # batch 4 only, 3 + 15 steps, 2 rounds
    python benchmarks/finetune.py --model tiny-bert --batch-sizes 4 --threads 0

Needs the ``bench`` extra (``pip install -e .[bench]``) for ``accelerate``, which ``Trainer`` uses.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")  # neither loop's progress bar in the output

import argparse
import dataclasses
import logging
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import transformers
from torch.optim.optimizer import register_optimizer_step_post_hook

from layersim.training import train
from layersim.data.batching import encode_task
from layersim.models.registry import load_task_model, load_tokenizer, snapshot_model
from layersim.params import FinetuneParams
from layersim.data.tasks import generated_table, get_task

CPU = torch.device("cpu")


class _Enough(Exception):
    """Raised by the step hook once the timed steps are done, to stop either loop there."""


class StepClock:
    """Time stamps after every optimizer step of any optimizer, while installed."""

    def __init__(self, total_steps: int):
        self.total_steps = total_steps
        self.stamps: list[float] = []
        self.optimizer = ""

    def __enter__(self) -> "StepClock":
        self._handle = register_optimizer_step_post_hook(self._hook)
        return self

    def _hook(self, optimizer, args, kwargs) -> None:
        self.stamps.append(time.perf_counter())
        if len(self.stamps) == 1:
            fused = optimizer.defaults.get("fused")
            self.optimizer = f"{type(optimizer).__module__}.{type(optimizer).__name__}(fused={fused})"
        if len(self.stamps) == self.total_steps:
            raise _Enough

    def __exit__(self, *exc) -> bool:
        self._handle.remove()
        return exc[0] is _Enough  # the planned stop is not an error

    def steps_per_second(self, warmup: int) -> float:
        if len(self.stamps) != self.total_steps:
            raise RuntimeError(f"the loop made {len(self.stamps)} optimizer steps, expected {self.total_steps}")
        return (self.total_steps - warmup) / (self.stamps[-1] - self.stamps[warmup - 1])


def run_layersim(model_dir: Path, spec, train_set, validation, params: FinetuneParams, seed: int,
                 warmup: int, steps: int) -> StepClock:
    with StepClock(warmup + steps) as clock:
        train.finetune(model_dir, spec, train_set, validation, params, seed, device=CPU)
    return clock


def run_trainer(model_dir: Path, spec, tokenizer, dataset: list[dict], params: FinetuneParams, seed: int,
                warmup: int, steps: int, output_dir: Path) -> StepClock:
    from transformers import DataCollatorWithPadding, Trainer, TrainingArguments
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    args = TrainingArguments(
        output_dir=str(output_dir), use_cpu=True, seed=seed,
        per_device_train_batch_size=params.batch_size, max_steps=params.max_steps,
        learning_rate=params.learning_rate, lr_scheduler_type="linear", warmup_steps=params.warmup_steps,
        weight_decay=params.weight_decay, optim="adamw_torch_fused", max_grad_norm=0.0,
        eval_strategy="no", save_strategy="no", logging_strategy="steps", logging_steps=50, report_to="none",
        disable_tqdm=True, train_sampling_strategy="sequential", dataloader_num_workers=0,
        dataloader_pin_memory=False, dataloader_drop_last=False)
    torch.manual_seed(seed)  # the same head initialisation as layersim's loop
    model = load_task_model(model_dir, spec)
    trainer = Trainer(model=model, args=args, train_dataset=dataset,
                      data_collator=DataCollatorWithPadding(tokenizer), processing_class=tokenizer)
    for callback in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(callback)
    with StepClock(warmup + steps) as clock:
        trainer.train()
    return clock


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm-l6", help="an offline model (default minilm-l6)")
    parser.add_argument("--task", default="synth-negation", help="a built-in synth-* task (default synth-negation)")
    parser.add_argument("--batch-sizes", type=int, nargs="+",
                        help="batch sizes to time (default 4 16: the paper's and the quickstart's; quick 4)")
    parser.add_argument("--warmup", type=int, help="untimed steps before timing (default 5; quick 3)")
    parser.add_argument("--steps", type=int, help="timed steps (default 30; quick 15)")
    parser.add_argument("--repeats", type=int, help="alternating rounds; the median is reported (default 3; quick 2)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (default 1, see above; 0: torch's own choice)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="batch 4 only, 3 + 15 steps, 2 rounds")
    args = parser.parse_args()
    batch_sizes = args.batch_sizes or ([4] if args.quick else [4, 16])
    warmup = args.warmup or (3 if args.quick else 5)
    steps = args.steps or (15 if args.quick else 30)
    repeats = args.repeats or (2 if args.quick else 3)
    if warmup < 1 or steps < 1:
        parser.error("--warmup and --steps must be at least 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    transformers.logging.set_verbosity_error()
    logging.getLogger("layersim").setLevel(logging.WARNING)

    import accelerate

    spec = get_task(args.task)
    print(f"{os.cpu_count()} CPUs, torch threads {threads}; torch {torch.__version__}, transformers "
          f"{transformers.__version__}, accelerate {accelerate.__version__}, numpy {np.__version__}, "
          f"Python {platform.python_version()}")
    results = []
    with tempfile.TemporaryDirectory(prefix="layersim-bench-") as tmp:
        folder = Path(tmp)
        model_dir = folder / "model"
        snapshot_model(args.model, model_dir)
        tokenizer = load_tokenizer(model_dir)
        # The paper's schedule (1,000 warm-up steps of 10,000, evaluation every 1,000): the timed
        # window is far from any evaluation. No resumable checkpoints (none without `resume`).
        base = FinetuneParams()
        if warmup + steps >= base.eval_every:
            parser.error(f"--warmup + --steps must stay below {base.eval_every}, layersim's first evaluation")
        train_set = encode_task(generated_table(spec, "train", 2000, seed=0), spec, tokenizer, base.max_length)
        validation = encode_task(generated_table(spec, "validation", 16, seed=0), spec, tokenizer, base.max_length)
        lengths = np.array([len(f[0]["input_ids"]) for f in train_set.features])
        print(f"{args.model} on {spec.name}: {len(train_set)} training examples, {lengths.mean():.1f} tokens on "
              f"average (max {lengths.max()}); lr {base.learning_rate:g}, {base.warmup_steps} warm-up steps of "
              f"{base.max_steps}; {warmup} untimed + {steps} timed steps, {repeats} alternating rounds\n")

        for batch_size in batch_sizes:
            params = dataclasses.replace(base, batch_size=batch_size)
            order = train.data_order(len(train_set), batch_size, params.max_steps, args.seed)[:warmup + steps]
            padded = lengths[order].max(axis=1).mean()
            # The Trainer reads the same examples in the same order: the same batches, the same padding.
            dataset = [{**train_set.features[i][0], "labels": int(train_set.labels[i])} for i in order.reshape(-1)]
            rates: dict[str, list[float]] = {"layersim": [], "Trainer": []}
            optimizers = {}
            for _ in range(repeats):
                torch.set_num_threads(threads)
                clock = run_layersim(model_dir, spec, train_set, validation, params, args.seed, warmup, steps)
                rates["layersim"].append(clock.steps_per_second(warmup))
                optimizers["layersim"] = clock.optimizer
                torch.set_num_threads(threads)
                clock = run_trainer(model_dir, spec, tokenizer, dataset, params, args.seed, warmup, steps,
                                    folder / "trainer")
                rates["Trainer"].append(clock.steps_per_second(warmup))
                optimizers["Trainer"] = clock.optimizer
            ours, theirs = statistics.median(rates["layersim"]), statistics.median(rates["Trainer"])
            results.append((batch_size, padded, ours, theirs))
            print(f"batch {batch_size} (padded length {padded:.1f} on average):")
            for name in rates:
                runs = " ".join(f"{r:.2f}" for r in rates[name])
                print(f"  {name:<9} {statistics.median(rates[name]):6.2f} steps/s   runs: {runs}   "
                      f"{optimizers[name]}")
            print(f"  layersim / Trainer: {ours / theirs:.2f}x\n", flush=True)
    if torch.get_num_threads() != threads:
        print(f"note: torch threads changed to {torch.get_num_threads()} during the runs")

    header = f"{'batch':>5} {'padded len':>10} {'layersim [steps/s]':>19} {'Trainer [steps/s]':>18} {'ratio':>7}"
    print(header)
    print("-" * len(header))
    for batch_size, padded, ours, theirs in results:
        print(f"{batch_size:>5} {padded:>10.1f} {ours:>19.2f} {theirs:>18.2f} {ours / theirs:>6.2f}x")


if __name__ == "__main__":
    main()
