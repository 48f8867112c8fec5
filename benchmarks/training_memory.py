"""Fine-tuning with and without reused host memory (layersim.compute.host_memory): CPU seconds, system seconds and
page faults of the quickstart's training run, and whether both give the same weights bit for bit.

The quickstart's recipe (minilm-l6 on synth-similarity, batch 16, lr 1e-4, 20 warm-up steps, max_length 64, 2,000
train and 300 validation examples) trains for `--steps` steps (no evaluation before the end) in a fresh interpreter
per run, the old way (glibc's defaults: the embedding table's 47 MB gradient mapped and page-faulted afresh every
step) and the new one alternating, `--rounds` times each. Each run reports its training call's CPU seconds (user and
system, getrusage), its minor page faults and a digest of the trained weights; the table gives each run, the median
of each way and the ratio new / old. One torch thread by default: on a shared 2-core machine CPU seconds are the
steady figure (benchmarks/finetune.py says why).

    python benchmarks/training_memory.py                 # 60 steps, 2 rounds (about 2 minutes alone)
    python benchmarks/training_memory.py --steps 200     # the quickstart's whole run
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

import argparse
import contextlib
import dataclasses
import hashlib
import json
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

WAYS = ("old", "new")


def child(args) -> None:
    """One training run the `args.way` way; prints its measurements as one JSON line."""
    import torch

    torch.set_num_threads(args.threads)
    from layersim.data.batching import encode_task
    from layersim.data.tasks import generated_table, get_task
    from layersim.models.registry import load_tokenizer
    from layersim.params import FinetuneParams
    from layersim.training import train

    if args.way == "old":  # glibc's defaults: what the loop did before layersim.compute.host_memory
        train.reused_host_memory = contextlib.nullcontext
    spec, folder = get_task("synth-similarity"), Path(args.model_dir)
    tokenizer = load_tokenizer(folder)
    splits = [encode_task(generated_table(spec, split, n, seed=0), spec, tokenizer, 64)
              for split, n in (("train", 2000), ("validation", 300))]
    params = dataclasses.replace(FinetuneParams(), batch_size=16, learning_rate=1e-4, warmup_steps=20,
                                 max_steps=args.steps, eval_every=0, max_length=64)
    before = resource.getrusage(resource.RUSAGE_SELF)
    model, metrics = train.finetune(folder, spec, *splits, params, 1, device=torch.device("cpu"))
    after = resource.getrusage(resource.RUSAGE_SELF)
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode() + tensor.contiguous().numpy().tobytes())
    print(json.dumps({"user": after.ru_utime - before.ru_utime, "system": after.ru_stime - before.ru_stime,
                      "faults": after.ru_minflt - before.ru_minflt, "weights": digest.hexdigest()[:16],
                      "score": metrics[spec.primary_metric]}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="training steps per run (the quickstart: 200)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each way, alternating")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument("--way", choices=WAYS, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.way:
        return child(args)

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from plan_accuracy import busy, matmul_gflops_per_cpu_second

    from layersim.models.registry import snapshot_model

    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    cpu = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines() if line.startswith("Model name")), "?")
    print(f"CPU: {cpu}, {os.cpu_count()} cores; 2048² float32 matmul {matmul_gflops_per_cpu_second():.0f} GFLOP/s per CPU "
          f"second on one thread; "
          f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {busy()}")
    print(f"minilm-l6 on synth-similarity, batch 16, {args.steps} steps, {args.threads} thread(s), "
          f"{args.rounds} rounds\n")
    runs: dict[str, list[dict]] = {way: [] for way in WAYS}
    with tempfile.TemporaryDirectory(prefix="layersim-bench-") as tmp:
        model_dir = Path(tmp) / "model"
        snapshot_model("minilm-l6", model_dir)
        for r in range(args.rounds):
            for way in WAYS if r % 2 == 0 else WAYS[::-1]:  # neither way always first
                out = subprocess.run([sys.executable, __file__, "--way", way, "--model-dir", str(model_dir),
                                      "--steps", str(args.steps), "--threads", str(args.threads)],
                                     capture_output=True, text=True, check=True).stdout
                runs[way].append(json.loads(out.strip().splitlines()[-1]))
                row = runs[way][-1]
                print(f"  round {r + 1} {way}: {row['user']:6.1f} s user {row['system']:5.1f} s system "
                      f"{row['faults']:>9,} faults  weights {row['weights']}  score {row['score']:.4f}", flush=True)
    median = {way: {key: statistics.median(row[key] for row in runs[way]) for key in ("user", "system", "faults")}
              for way in WAYS}
    for way in WAYS:
        m = median[way]
        print(f"{way}: median {m['user'] + m['system']:6.1f} CPU s ({m['user']:.1f} user + {m['system']:.1f} "
              f"system), {m['faults']:,.0f} page faults")
    cpu_seconds = {way: median[way]["user"] + median[way]["system"] for way in WAYS}
    digests = {row["weights"] for way in WAYS for row in runs[way]}
    print(f"new / old CPU seconds: {cpu_seconds['new'] / cpu_seconds['old']:.3f}; system seconds: "
          f"{median['new']['system'] / max(median['old']['system'], 1e-9):.3f}; weights identical in every run: "
          f"{'yes' if len(digests) == 1 else 'NO'}")
    print(f"load after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {busy()}")


if __name__ == "__main__":
    main()
