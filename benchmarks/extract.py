"""Extraction throughput: the extract stage's work against a bare forward pass over the same batches.

"extract" is ``layersim.experiments.extract.extract_activations`` writing all three poolings (cls, mean, last)
of every layer to Parquet through ``ActivationWriter``; "forward" runs the same encoder over the same
batches (same collate, ``torch.inference_mode``, ``output_hidden_states=True``) and discards the
result. Both run in the same process on the same data, interleaved, and the median of the
repetitions is reported, so the ratio is what matters on a shared machine, not the absolute seconds.

Pooling and Parquet writing should cost under 10 % of the forward pass. Two estimates are printed:
end to end (extract / forward − 1, from the interleaved medians) and a per-batch breakdown (collate,
forward, pooling, Parquet write timed separately within one pass), which is steadier when other
processes share the CPU.

The built-in tasks have short inputs (about 10 tokens for synth-negation), which makes the forward
pass cheap and this overhead as large as it gets; longer inputs only make the forward pass dearer.

torch runs one thread by default: on a small shared machine (2 cores, other jobs running) two
intra-op threads spin against each other and everything else, which made the forward pass 4x slower
and its timings erratic in our measurements. ``--threads 0`` keeps torch's own choice.

    python benchmarks/extract.py                    # minilm-l6, synth-negation, 512 examples, batch 32
    python benchmarks/extract.py --quick            # minilm-l6, 128 examples, 2 repetitions
    python benchmarks/extract.py --task synth-choice --model tiny-bert --threads 0
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")  # progress bars would interleave with the table

import argparse
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
import transformers

from layersim.data.batching import encode_task, sequential_batches
from layersim.experiments.extract import extract_activations, pool_layers
from layersim.data.io import ActivationTable, ActivationWriter
from layersim.models.registry import load_encoder, load_tokenizer, snapshot_model
from layersim.params import EXAMPLE_POOLINGS as POOLINGS  # the per-example poolings measured in docs/performance.md
from layersim.data.tasks import generated_table, get_task

CPU = torch.device("cpu")


@torch.inference_mode()
def forward_only(encoder, tokenizer, encoded, batch_size: int) -> None:
    """The baseline: what extraction must do anyway, collate and a forward pass, results discarded."""
    for _, batch in sequential_batches(encoded, batch_size, tokenizer, with_labels=False):
        batch = {k: v.reshape(-1, v.shape[-1]) for k, v in batch.items()}
        encoder(**batch, output_hidden_states=True)


def extract(encoder, tokenizer, spec, encoded, batch_size: int, folder: Path) -> dict[str, Path]:
    outputs = {q: folder / f"bench.{q}.parquet" for q in POOLINGS}
    metadata = {"model": "bench", "run": "orig", "task": spec.name, "split": "validation"}
    extract_activations(encoder, tokenizer, spec, encoded, outputs, metadata, batch_size, CPU)
    return outputs


@torch.inference_mode()
def breakdown(encoder, tokenizer, spec, encoded, batch_size: int, folder: Path) -> dict[str, float]:
    """The extract loop again, each part timed on its own: seconds of collate, forward, pool, write."""
    config = encoder.config
    times = dict.fromkeys(("collate", "forward", "pool", "write"), 0.0)
    special_ids = tokenizer.all_special_ids
    choices = encoded.num_choices
    writers = {q: ActivationWriter(folder / f"breakdown.{q}.parquet", num_layers=config.num_hidden_layers,
                                   hidden_size=config.hidden_size, label_type=spec.label_type,
                                   metadata={"run": "breakdown", "pooling": q}) for q in POOLINGS}
    start = time.perf_counter()
    for writer in writers.values():
        writer.__enter__()
    times["write"] += time.perf_counter() - start
    batches = sequential_batches(encoded, batch_size, tokenizer, with_labels=False)
    while True:
        t0 = time.perf_counter()
        item = next(batches, None)
        t1 = time.perf_counter()
        times["collate"] += t1 - t0
        if item is None:
            break
        indices, batch = item
        batch = {k: v.reshape(-1, v.shape[-1]) for k, v in batch.items()}
        hidden_states = encoder(**batch, output_hidden_states=True).hidden_states
        t2 = time.perf_counter()
        layers = pool_layers(hidden_states, batch["input_ids"], batch["attention_mask"], POOLINGS, special_ids)
        example_id = np.repeat(encoded.example_id[indices], choices)
        choice = np.tile(np.arange(choices, dtype=np.int16), len(indices))
        labels = np.repeat(encoded.labels[indices], choices)
        t3 = time.perf_counter()
        for pooling, writer in writers.items():
            writer.write(example_id, choice, labels, layers[pooling])
        t4 = time.perf_counter()
        times["forward"] += t2 - t1
        times["pool"] += t3 - t2
        times["write"] += t4 - t3
    start = time.perf_counter()
    for writer in writers.values():
        writer.__exit__(None, None, None)  # the last row group, the footer, the rename
    times["write"] += time.perf_counter() - start
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm-l6", help="an offline model (default minilm-l6)")
    parser.add_argument("--task", default="synth-negation", help="a built-in synth-* task (default synth-negation)")
    parser.add_argument("--examples", type=int, help="validation examples (default 512; quick 128)")
    parser.add_argument("--batch-size", type=int, default=32, help="as params.yaml extract.batch_size (32)")
    parser.add_argument("--repeats", type=int, help="interleaved repetitions (default 3; quick 2)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (default 1, see above; 0: torch's own choice)")
    parser.add_argument("--quick", action="store_true", help="128 examples, 2 repetitions")
    args = parser.parse_args()
    n = args.examples or (128 if args.quick else 512)
    repeats = args.repeats or (2 if args.quick else 3)
    if args.threads:
        torch.set_num_threads(args.threads)

    spec = get_task(args.task)
    with tempfile.TemporaryDirectory(prefix="layersim-bench-") as tmp:
        folder = Path(tmp)
        snapshot_model(args.model, folder / "model")
        tokenizer = load_tokenizer(folder / "model")
        encoder = load_encoder(folder / "model").eval()
        table = generated_table(spec, "validation", n, seed=0)
        encoded = encode_task(table, spec, tokenizer, max_length=256)
        rows = n * encoded.num_choices
        lengths = [len(r["input_ids"]) for f in encoded.features for r in f]
        config = encoder.config

        print(f"{os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}; torch {torch.__version__}, "
              f"transformers {transformers.__version__}, pyarrow {pa.__version__}, numpy {np.__version__}, "
              f"Python {platform.python_version()}")
        print(f"{args.model} ({config.num_hidden_layers} layers, hidden {config.hidden_size}) on {spec.name}: "
              f"{n} examples ({rows} rows), {np.mean(lengths):.1f} tokens per row on average (max {max(lengths)}), "
              f"batch {args.batch_size}; poolings {', '.join(POOLINGS)}; {repeats} interleaved repetitions\n")

        forward_only(encoder, tokenizer, encoded, args.batch_size)  # warm-up: allocator, kernels, caches
        runs: dict[str, list[float]] = {"forward": [], "extract": []}
        parts: list[dict[str, float]] = []
        for _ in range(repeats):
            start = time.perf_counter()
            forward_only(encoder, tokenizer, encoded, args.batch_size)
            runs["forward"].append(time.perf_counter() - start)
            start = time.perf_counter()
            outputs = extract(encoder, tokenizer, spec, encoded, args.batch_size, folder)
            runs["extract"].append(time.perf_counter() - start)
            parts.append(breakdown(encoder, tokenizer, spec, encoded, args.batch_size, folder))
        written = ActivationTable(outputs["mean"])
        if written.num_rows != rows:
            raise SystemExit(f"extract wrote {written.num_rows} rows, expected {rows}")
        size = sum(p.stat().st_size for p in outputs.values())

    forward, full = statistics.median(runs["forward"]), statistics.median(runs["extract"])
    header = f"{'run':<10} {'median [s]':>11} {'examples/s':>11}   all runs [s]"
    print(header)
    print("-" * len(header))
    for name, seconds in (("forward", forward), ("extract", full)):
        spread = " ".join(f"{s:.2f}" for s in runs[name])
        print(f"{name:<10} {seconds:>11.2f} {n / seconds:>11.1f}   {spread}")
    print(f"\nextract / forward: {full / forward:.3f}x  ->  end-to-end overhead {100 * (full / forward - 1):+.1f} %"
          f"  (3 Parquet tables, {size / 2**20:.1f} MiB)")

    median_parts = {k: statistics.median(p[k] for p in parts) for k in parts[0]}
    total = sum(median_parts.values())
    print("\nbreakdown (median per part over the repetitions, one instrumented pass each):")
    for name, seconds in median_parts.items():
        print(f"  {name:<8} {seconds:>8.3f} s  {100 * seconds / total:>5.1f} % of the pass  "
              f"{100 * seconds / median_parts['forward']:>6.1f} % of forward")
    overhead = (median_parts["pool"] + median_parts["write"]) / median_parts["forward"]
    verdict = "within" if overhead < 0.10 else "OVER"
    print(f"\npooling + Parquet write = {100 * overhead:.1f} % of the forward pass ({verdict} the 10 % goal)")


if __name__ == "__main__":
    main()
