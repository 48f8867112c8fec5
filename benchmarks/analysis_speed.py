"""The similarity stage's analysis on this machine against a baseline commit's, side by side in one run.

The workload is the quickstart's similarity stage at its sizes (params.yaml's quickstart settings): ORIG and three
fine-tuned seeds of MiniLM-L6 (7 layers × 384 each, stacked: 28 layers), 600 word rows of 38 examples for the
`tokens` measures (linear CKA with its block permutations, SVCCA, PWCCA, neuronsim: 100 permutations, 199 for linear
CKA's block null) and 300 CLS rows for linear CKA's exact null; the cells the stage reports (Phang et al.'s
comparisons). Layers are random residual-stream-like float32 arrays (the arithmetic is the shapes', not the values').

Each side runs in its own interpreter with PYTHONPATH at its source tree (the baseline: `git archive` of
`--baseline`), alternating A, B, A, B… `--repeats` times, so load on a shared machine falls on both; the ratio of the
medians is the result. The machine is printed first (lscpu model, torch's float32 2048² matmul on one thread and on
all: the plan's own measure).

    python benchmarks/analysis_speed.py --baseline ddc5a28      # this checkout against the commit before the torch path
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# One timed run of the workload, printed as JSON by a child interpreter (whose layersim is the side's).
WORKLOAD = r"""
import json, sys, time
import numpy as np
from layersim.similarity.comparisons import phang_cells, stacked_null

def layers(n, seed):
    rng = np.random.default_rng(seed)
    h = rng.normal(size=(n, 384)).astype(np.float32)
    out = []
    for _ in range(7):
        h = h + 0.7 * rng.normal(size=(n, 384)).astype(np.float32)
        out.append(h.copy())
    return out

def models(n):
    base = layers(n, 0)
    runs = {"ORIG": base}
    for seed in (1, 2, 3):
        noise = layers(n, seed)
        runs[f"FT[{seed}]"] = [b + 0.5 * e for b, e in zip(base, noise)]
    return runs

sizes = {name: 7 for name in ("ORIG", "FT[1]", "FT[2]", "FT[3]")}
cells = phang_cells(sizes, "ORIG", ["FT[1]", "FT[2]", "FT[3]"])
words, cls = models(600), models(300)
lengths = np.random.default_rng(9).integers(14, 19, size=38)
groups = np.repeat(np.arange(38), lengths)[:600]
timings = {}
start = time.perf_counter()
stacked_null("linear_cka", cls, permutations=100, seed=0, cells=cells)
timings["cls linear_cka (exact)"] = time.perf_counter() - start
for measure in ("linear_cka", "svcca", "pwcca", "neuronsim"):
    start = time.perf_counter()
    stacked_null(measure, words, permutations=100, seed=0, cells=cells, groups=groups)
    timings[f"tokens {measure}"] = time.perf_counter() - start
print(json.dumps(timings))
"""


def baseline_tree(ref: str, folder: Path) -> Path:
    archive = folder / "baseline.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(archive), ref, "src"], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(folder / "baseline", filter="data")
    return folder / "baseline" / "src"


def run_side(src: Path) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(src))
    out = subprocess.run([sys.executable, "-c", WORKLOAD], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="the git commit to compare this checkout with")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each side, alternating")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from plan_accuracy import machine, matmul_gflops_per_cpu_second

    for line in machine(matmul_gflops_per_cpu_second()):
        print(line)
    with tempfile.TemporaryDirectory() as tmp:
        sides = {"baseline": baseline_tree(args.baseline, Path(tmp)), "this checkout": ROOT / "src"}
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
        for _ in range(args.repeats):
            for name, src in sides.items():
                runs[name].append(run_side(src))
    parts = list(runs["baseline"][0])
    print(f"{'part':28s} {'baseline s':>11s} {'this s':>9s} {'ratio':>7s}   (medians of {args.repeats})")
    totals = {}
    for name in sides:
        totals[name] = statistics.median(sum(run.values()) for run in runs[name])
    for part in parts:
        old = statistics.median(run[part] for run in runs["baseline"])
        new = statistics.median(run[part] for run in runs["this checkout"])
        print(f"{part:28s} {old:11.2f} {new:9.2f} {new / old:7.2f}")
    print(f"{'all':28s} {totals['baseline']:11.2f} {totals['this checkout']:9.2f} "
          f"{totals['this checkout'] / totals['baseline']:7.2f}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
