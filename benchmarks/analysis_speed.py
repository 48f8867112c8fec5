"""The quickstart's analysis (the similarity and compare stages' nulls) on this machine against a baseline commit's,
side by side in one run.

The workload is the quickstart's at its sizes (quickstart.sh's params): ORIG, three fine-tuned seeds of MiniLM-L6 and
the random-init control (7 layers × 384 each, stacked: 35 layers; 6 attention layers of 12 heads). The similarity
stage: Phang et al.'s cells (`phang_cells`, with RANDOM); 600 word rows in examples of 15 for the `tokens` measures
(linear CKA's block null at its 199 permutations, SVCCA and neuronsim at `similarity.permutations` = 20); 300 CLS rows
for linear CKA's exact null; the Jensen–Shannon attention null over 50 examples (`extract.attention_examples`) of
8–15 words, 20 permutations. The compare stage: every cell of the stacked matrix (its nulls test all), 450 word rows
of its 30 probe examples for linear CKA's block null, SVCCA and neuronsim (the longest part: a 384 × 450 × 13,440 GEMM
per row of cells and permutation), and the attention null over those 30 examples. Layers are
random residual-stream-like float32 arrays, attention random softmax maps (the arithmetic is the shapes', not the
values'; the null's partners depend on the lengths, drawn as above).

Each side runs in its own interpreter with PYTHONPATH at its source tree (the baseline: `git archive` of
`--baseline`), on one thread (OMP_NUM_THREADS=1, torch.set_num_threads(1); `--threads 2` for the stages' own two),
alternating A, B, A, B… `--repeats` times, so load on a shared machine falls on both; each part is timed in CPU seconds
(time.process_time), the steadier figure on a loaded machine, and the ratio of the medians is the result; with more
than one thread the wall seconds' medians follow (what using both cores buys). Both sides' nulls are compared too: the
largest difference of any null mean or p-value between them is printed (the same permutations: equal to rounding).
The machine is printed first (lscpu model, torch's float32 2048² matmul: the plan's own measure).

    python benchmarks/analysis_speed.py --baseline e0d61fa      # this checkout against the commit before the speed-ups
    python benchmarks/analysis_speed.py --baseline 966d1d9 --threads 2 --parts "compare tokens neuronsim"
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

# One timed run of the workload, printed as JSON by a child interpreter (whose layersim is the side's): CPU seconds per
# part, and the nulls' means and p-values (saved to the path in argv[1]) for the comparison of the two sides.
WORKLOAD = r"""
import json, sys, time
import numpy as np
import torch
torch.set_num_threads(int(sys.argv[3]))
from layersim.similarity.attention import AttentionMaps
from layersim.similarity.comparisons import phang_cells, stacked_null
from layersim.similarity.inference.attention_null import attention_stacked_null

LABELS = ("ORIG", "FT[1]", "FT[2]", "FT[3]", "RANDOM")

def layers(n, seed, count=7):
    rng = np.random.default_rng(seed)
    h = rng.normal(size=(n, 384)).astype(np.float32)
    out = []
    for _ in range(count):
        h = h + 0.7 * rng.normal(size=(n, 384)).astype(np.float32)
        out.append(h.copy())
    return out

def models(n):
    base = layers(n, 0)
    runs = {"ORIG": base}
    for seed in (1, 2, 3):
        runs[f"FT[{seed}]"] = [b + 0.5 * e for b, e in zip(base, layers(n, seed))]
    runs["RANDOM"] = layers(n, 7)
    return runs

def attention(examples, seed):
    lengths = np.random.default_rng(seed).integers(8, 16, size=examples)
    def layer(k):
        rng = np.random.default_rng(1000 * seed + k)
        maps = []
        for t in lengths:
            e = np.exp(2 * rng.normal(size=(12, t, t)))
            maps.append((e / e.sum(-1, keepdims=True)).astype(np.float32))
        return AttentionMaps.from_maps(maps)
    return {label: [layer(6 * m + l) for l in range(6)] for m, label in enumerate(LABELS)}

sizes = {label: 7 for label in LABELS}
phang = phang_cells(sizes, "ORIG", ["FT[1]", "FT[2]", "FT[3]"])
phang_attention = phang_cells({label: 6 for label in LABELS}, "ORIG", ["FT[1]", "FT[2]", "FT[3]"])
words, cls, probe = models(600), models(300), models(450)  # (made before the clock starts)
word_groups, probe_groups = np.repeat(np.arange(40), 15), np.repeat(np.arange(30), 15)
similarity_maps, compare_maps = attention(50, 1), attention(30, 2)
PARTS = {
    "similarity cls linear_cka (exact)": lambda: stacked_null("linear_cka", cls, permutations=20, seed=0, cells=phang),
    **{f"similarity tokens {m}": (lambda m=m: stacked_null(m, words, permutations=20, seed=0, cells=phang,
                                                           groups=word_groups)) for m in ("linear_cka", "svcca", "neuronsim")},
    "similarity attention jensen_shannon": lambda: attention_stacked_null(
        "jensen_shannon", similarity_maps, permutations=20, seed=0, cells=phang_attention),
    **{f"compare tokens {m}": (lambda m=m: stacked_null(m, probe, permutations=20, seed=0, groups=probe_groups))
       for m in ("linear_cka", "svcca", "neuronsim")},
    "compare attention jensen_shannon": lambda: attention_stacked_null("jensen_shannon", compare_maps, permutations=20,
                                                                       seed=0),
}
if sys.argv[2] == "--list":
    print(json.dumps(list(PARTS)))
    sys.exit()
start, wall = time.process_time(), time.perf_counter()
null = PARTS[sys.argv[2]]()
seconds = [time.process_time() - start, time.perf_counter() - wall]
np.savez(sys.argv[1], mean=null.null_mean, p=null.p_value)
print(json.dumps(seconds))
"""


def baseline_tree(ref: str, folder: Path) -> Path:
    archive = folder / "baseline.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(archive), ref, "src"], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(folder / "baseline", filter="data")
    return folder / "baseline" / "src"


def run_side(src: Path, part: str, nulls: Path, threads: int = 1):
    env = dict(os.environ, PYTHONPATH=str(src), OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    out = subprocess.run([sys.executable, "-c", WORKLOAD, str(nulls), part, str(threads)], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="the git commit to compare this checkout with")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each side, alternating, per part")
    parser.add_argument("--parts", nargs="*", help="only these parts (default: all; --parts alone lists them)")
    parser.add_argument("--threads", type=int, default=1, help="torch's and BLAS's threads per side (default 1)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import numpy as np
    from plan_accuracy import machine, matmul_gflops_per_cpu_second

    parts = run_side(ROOT / "src", "--list", Path(os.devnull))
    if args.parts is not None and not args.parts:
        print("\n".join(parts))
        return
    unknown = sorted(set(args.parts or ()) - set(parts))
    if unknown:
        raise SystemExit(f"unknown parts {unknown}; the parts are: {', '.join(parts)}")
    for line in machine(matmul_gflops_per_cpu_second()):
        print(line, flush=True)
    threads = f"{args.threads} thread{'s' if args.threads > 1 else ''}"
    wall = f"  wall: {'baseline':>9s} {'this':>9s} {'ratio':>7s}" if args.threads > 1 else ""
    print(f"{f'part (CPU seconds, {threads})':40s} {'baseline':>9s} {'this':>9s} {'ratio':>7s}{wall}  largest Δ "
          f"of the nulls' means and p-values (medians of {args.repeats} runs a side, alternating)", flush=True)
    totals = {}
    with tempfile.TemporaryDirectory() as tmp:
        sides = {"baseline": baseline_tree(args.baseline, Path(tmp)), "this checkout": ROOT / "src"}
        for part in args.parts or parts:
            seconds: dict[str, list[float]] = {name: [] for name in sides}
            walls: dict[str, list[float]] = {name: [] for name in sides}
            for _ in range(args.repeats):
                for name, src in sides.items():
                    cpu, elapsed = run_side(src, part, Path(tmp) / f"{name}.npz", args.threads)
                    seconds[name].append(cpu)
                    walls[name].append(elapsed)
            old, new = np.load(Path(tmp) / "baseline.npz"), np.load(Path(tmp) / "this checkout.npz")
            same = all(np.array_equal(np.isnan(old[k]), np.isnan(new[k])) for k in old.files)
            delta = max(float(np.nanmax(np.abs(old[k] - new[k]), initial=0.0)) for k in old.files)
            before, after = (statistics.median(seconds[name]) for name in sides)
            totals[part] = before, after
            wall_before, wall_after = (statistics.median(walls[name]) for name in sides)
            wall = (f"  wall: {wall_before:9.2f} {wall_after:9.2f} {wall_after / wall_before:7.2f}"
                    if args.threads > 1 else "")
            print(f"{part:40s} {before:9.2f} {after:9.2f} {after / before:7.2f}{wall}  {delta:.2g}"
                  f"{'' if same else ' (undefined cells differ!)'}", flush=True)
    for stage in ("similarity", "compare", ""):
        chosen = [v for k, v in totals.items() if k.startswith(stage)]
        if chosen:
            before, after = sum(b for b, _ in chosen), sum(a for _, a in chosen)
            print(f"{(stage or 'all') + ' (the parts above)':40s} {before:9.2f} {after:9.2f} {after / before:7.2f}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
