"""How long a plan's stages take on a stated device (issue 53). A stage's time is the sum of terms, each with its reason:

- **start**: every stage process starts an interpreter and imports its stack (layersim and pyarrow; numpy, scipy and
  matplotlib for the numeric stages; torch, transformers and dvclive for those that load a model), whatever the
  params: seconds per process, measured on the reference CPU (:data:`START_SECONDS`);
- **loads**: a model read from disk, its tokenizer with it: a fixed part and its bytes over the memory bandwidth, and
  in each process that loads one, transformers' imports of the architecture and the tokenizer at the first load;
- **compute**: the stage's matmul FLOPs (:mod:`layersim.plan.stages`) over the device's throughput times the share of
  it that the model's layers reach: a CPU's measured float32 matmul throughput (torch, 2048², torch's threads) times
  :data:`CPU_TRAIN_EFFICIENCY` for training steps, :data:`CPU_FORWARD_EFFICIENCY` for forward passes; a GPU's figures
  are effective already;
- **passes**: a fixed time per batch through one layer (a training step counting three): Python and kernel dispatch,
  which bounds small batches and small models (the tiny pipeline on a CPU, the paper's batch 4 on a GPU);
- **heads**: truncate's heads' training steps on stored rows: a step's dispatch (:data:`CPU_HEAD_STEP_SECONDS`; a layer
  pass on a GPU) and its small products at :data:`CPU_HEAD_EFFICIENCY` of the matmul's throughput;
- **evaluations**: the similarity and compare stages' per-cell work that is not arithmetic (a measure called on one pair
  of layers for one permutation: numpy calls, the centring), :data:`EVALUATION_SECONDS` each, and their heatmaps.

The constants of Python-level work (process starts, model loads' fixed part, layer passes, similarity cells, heatmaps)
were measured on a reference CPU; a CPU plan scales them by a short probe of such work timed on this machine
(:func:`python_probe_seconds`, the best of short repeats in the thread's CPU time, so that other jobs on the cores
barely change it) against its time there (:data:`REFERENCE_PROBE_SECONDS`), as it scales the arithmetic by the
matmul measured here.

The numpy work (the similarity measures in similarity and compare, weights' SVDs) runs on the host CPU: its FLOPs over
the host's matmul throughput, on one thread where its products are small (layersim.similarity._common.SMALL_PRODUCT:
numpy keeps them on the calling thread); the nulls' engines (torch, float64) at their measured shares of it
(:data:`CPU_ENGINE_EFFICIENCY`, :data:`CPU_KERNEL_EFFICIENCY`) in a CPU plan."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from layersim.errors import LayersimError
from layersim.plan.cost import StageCost
from layersim.plan.machine import (REFERENCE_PROBE_SECONDS, measured_cpu_flops, python_probe_seconds,  # noqa: F401
                                   sustained_cpu_flops)

# CPU seconds from a stage process's start to its first line of work and from its last to its exit, by the stack it
# imports: measured on the 2-core AMD EPYC these figures were taken on, as the processes that do nothing else
# (benchmarks/plan_accuracy.py --threads 1 on the quickstart, 2026-11-29, probe 1.0 ×): finetune_pretrained without
# models 7.6 s (torch, transformers, dvclive, the training modules; run_stage's check of DVC's cache, which hashes the
# outputs cached since the last stage; the environment record), download_compared and download_paired without
# models 1.8-2.0 s (layersim's command line and transformers, which run_stage imports to quiet it unless a stage
# asks not to), summary and report 1.4 and 1.5 s (layersim's command line, pyarrow, matplotlib: little work on the
# quickstart), check_params 2.1 s and grounding when off 2.8 s (numpy, scipy: the measures' registry, the analysis
# modules).
# Re-measured quiet (two fresh-interpreter quickstarts, 2026-11-29 17:30 and 17:52, probe 0.89-0.91 ×): summary 1.4
# and 1.6 s, report 1.7 and 1.9, check_params 2.1 and 1.6 (a light start), grounding when off 2.7 and 3.0.
START_SECONDS = {"light": 1.8, "transformers": 1.9, "numeric": 2.4, "model": 7.0}
# The same, for a stage forked by the run scripts' server (tools/exp_run.py; layersim_launch.fork_server), whose
# third-party imports are done: layersim's modules and the stage's own start (run_stage's cache check, the
# environment record), measured as the server's children on the quickstart (2026-11-29, same CPU, load 6, CPU
# seconds from the server's log): finetune_pretrained without models 0.52 (7.6 afresh), grounding when off 0.69,
# summary 0.82 with its little work.
# The first stages wait for the server's imports instead (its shim does), beside the plan and the first figure:
# forked too (check_params 0.3 s on the quickstart).
# Two quiet quickstarts (2026-11-29 afternoon, probe 0.91-0.92 ×): download_compared, download_paired and
# download_task 0.30-0.42 s, check_params 0.39-0.42 (its numpy and SciPy the server's: a start like theirs), summary and
# report 0.6-0.8 with their little work.
WARM_START_SECONDS = {"light": 0.75, "transformers": 0.4, "numeric": 0.7, "model": 0.6}
WARM_STACK = {"check_params": "transformers"}
# DVC's own time around each stage process it runs: the stage's dependencies and params checked, its outputs hashed
# and linked into the cache, dvc.lock read and written again (ruamel's YAML, half of it). On the quickstart (22 stage
# processes, 560 MB of outputs; 2026-11-29, quiet, the probe at 0.91-0.92 ×) `dvc exp run`, as the run scripts start
# it, spent 51.6 s between its stages (2.35 s a process: 2.5 on the reference CPU); `dvc repro` 34.6 s (1.65 s: 1.8).
# The plan counts the scripts' `dvc exp run`. It grows with dvc.lock (the paper configuration's hundreds of stage
# items): not modelled.
DVC_STAGE_SECONDS = 2.5
# download_model also snapshots the model: torch and the model's classes imported, its files copied and hashed
# (4.9 s measured against download_compared's 1.9); forked, with torch imported: 0.0-0.4 (download_model 0.79 s and
# 0.41 against the other downloads' 0.3-0.4 in two quickstarts, 2026-11-29).
SNAPSHOT_SECONDS = 3.0
WARM_SNAPSHOT_SECONDS = 0.2
STACK = {"check_params": "light", "download": "transformers", "summary": "light", "report": "light",
         "similarity": "numeric", "grounding": "numeric"}
# dynamics runs under the analysis device (torch) and imports transformers (run_stage): the model stack, as measured
# (16.1 CPU s in-process on the quickstart, its figure 2.4 of it).
LOAD_SECONDS = 0.1           # from_pretrained's fixed part once its modules are imported
FIRST_LOAD_SECONDS = 1.5     # the first load in a process imports the architecture's and the tokenizer's modules
# Measured on the same CPU (1 thread, against a 1-thread matmul in the same process): a MiniLM-L6 training step at batch
# 16 of 24 tokens, AdamW's update included, reaches 0.6-0.7 of the matmul's FLOP/s, its forward pass 0.82 at batch
# 16-32 of 24 tokens (0.91 at 64 tokens: longer inputs are planned up to 10 % long) (the backward's transposed
# products, the update and the elementwise work are slower per FLOP); a tiny-bert training step
# (width 32) costs about 1 ms a layer pass. A similarity cell's numpy calls besides its FLOPs: 0.5 ms (the tiny
# pipeline's similarity stage, 60 rows a cell: its CPU seconds less its start and heatmaps, over its 9,600 cells).
CPU_TRAIN_EFFICIENCY = 0.7
CPU_FORWARD_EFFICIENCY = 0.82
# align's INN and MLP maps train every layer's map in one vmapped step (batch 256 through widths of 128-512): about
# 0.55 of the matmul's rate on the 2-core AMD EPYC (the quickstart's align, four runs on 2026-11-29: 41 s of such steps
# for 3.1 TFLOP at 135 GFLOP/s, its dispatch counted apart; planned at the model's 0.7 it came out 0.72-0.81).
CPU_MAP_EFFICIENCY = 0.55
CPU_PASS_SECONDS = 1.0e-3
EVALUATION_SECONDS = 0.5e-3
# A head's training step on stored rows (layersim.training.heads.train_head; 1 thread, batch 64, 10 epochs of 2,700
# rows, against the probe's 3.0 ms): 1.5 ms at width 32, 1.9 at 128, 4.3 at 384, 9.0 at 768, 11.8 at 1024: a fixed
# 1.4 ms (two dense layers forward and backward, the loss, AdamW over four tensors: dispatch) and 6·h² FLOPs a row
# at 0.25-0.5 of the 2048² matmul's FLOP/s (products of 64 rows: the smaller, the further below it).
CPU_HEAD_STEP_SECONDS = 1.4e-3
CPU_HEAD_EFFICIENCY = 0.3
HEATMAP_SECONDS = 0.3        # a heatmap with a value written in each cell (matplotlib lays out every label)
# numpy's float64 SVD (LAPACK gesdd) against the float32 matmul on the same threads: 0.36 of its FLOP/s at 384 × 384,
# 0.22 at 1536 × 384 (measured, 2 threads): half for float64, the rest LAPACK's bidiagonalization (half BLAS-2).
SVD_EFFICIENCY = 0.3
# The similarity nulls' engines on a CPU (torch, float64, 1 thread, against the float32 2048² matmul's 76 GFLOP/s):
# their batched products of permuted stacks reach 25-29 GFLOP/s (481-600 rows × 384 against 21-28 stacked layers of
# 384; a float64 2048² product 34); the kernel engine's permutations (the upper triangles of K[σ][:, σ] for the
# smaller side's kernels, then one product) 0.093 of it on their counted FLOPs when every cell is tested (compare:
# 35 × 35 cells of 450 word rows, 199 permutations, 14.6 CPU s; benchmarks/analysis_speed.py, 2026-11-29, load 16),
# 0.25 on the similarity stage's Phang cells (fewer gathered kernels than counted; 600 rows, 9.7 CPU s).
CPU_ENGINE_EFFICIENCY = 0.37
CPU_KERNEL_EFFICIENCY = 0.093
# The weights stage's null (layersim.similarity.weight_space.rotated_null_cosines) at n = 384: dorgqr, a Cholesky QR,
# a Gram matrix and eigh's tridiagonalisation (half BLAS-2), in float64 on one thread each: 0.12-0.14 of the float32
# matmul's FLOP/s on MiniLM's three shapes (benchmarks/weights_null.py, 2026-11-29, AMD EPYC, load 4-10).
LAPACK_EFFICIENCY = 0.13
# Each thread's share of one thread's matmul rate that independent pieces on all of them sustain together
# (StageCost.side_by_side): the similarity stage's poolings side by side on 2 threads ran at 1.6 × one thread's rate
# on the 2-core AMD EPYC VM (its small products; the quickstart, 2026-11-29).
CPU_THREAD_SCALING = 0.8
CPU_BANDWIDTH = 10e9          # bytes/s a core streams (a checkpoint read from the page cache)

# What a GPU does, each figure as benchmarks/gpu_check.py measured it on one (gpu_figures.json beside this module: the
# value, the date, what was timed; null for a figure never measured, printed as unmeasured). On an H200 (2026-11-27,
# bf16 autocast, torch 2.11) a training step of batch 4 through RoBERTa-base (3 × 12 layer passes) took 29–36 ms at
# 128–256 tokens, RoBERTa-large's (3 × 24) 53–60 ms, whatever the FLOPs: launch-bound, about 0.8 ms a layer pass; the
# forward pass at batch 32 with every layer copied back reached 147 TFLOP/s (base) to 198 (large) at 256 tokens.
FIGURES_FILE = Path(__file__).with_name("gpu_figures.json")


@dataclass(frozen=True)
class Figure:
    """One measured figure of a GPU: its value (None: never measured) and the date it was measured."""
    value: float | None
    measured: str | None

    def note(self, unit: str) -> str:
        return "unmeasured" if self.value is None else f"{_human(self.value, unit)} (measured {self.measured})"


def gpu_figures(path: Path = FIGURES_FILE) -> dict[str, dict]:
    """Each GPU's figures by name (an entry "same_as" another GPU takes that one's, its machine line saying so)."""
    entries = {name: entry for name, entry in json.loads(path.read_text(encoding="utf-8")).items()
               if not name.startswith("_")}
    return {name: entries[entry["same_as"]] | {"machine": entry["machine"]} if "same_as" in entry else entry
            for name, entry in entries.items()}


GPUS = tuple(gpu_figures())
ASSUMED_GPU_CPU_FLOPS = 1e12  # a GPU machine's host CPU (16 cores or more) on numpy matmuls
ASSUMED_GPU_CPU_THREAD_FLOPS = 1e11  # … on one of its threads (this CPU's: 105 GFLOP/s)


@dataclass(frozen=True)
class Device:
    """Where the model stages run. `flops`: the throughput that `train_efficiency` and `forward_efficiency` are
    shares of (a CPU's measured matmul; a GPU's effective figure, shares 1); `pass_seconds`: the fixed time of a
    batch through one layer; `cpu_flops`: the host CPU's, for the numpy stages; `start_scale`: the process starts
    of :data:`START_SECONDS` scaled to this machine (1: the reference CPU)."""
    name: str
    flops: float
    pass_seconds: float
    cpu_flops: float
    basis: str   # where the figures come from
    train_efficiency: float = 1.0
    forward_efficiency: float = 1.0
    bandwidth: float = CPU_BANDWIDTH  # the host's, which reads the checkpoints (on a GPU machine too)
    cpu_thread_flops: float = 0.0     # the host CPU's on one thread (numpy's small products)
    python_scale: float = 1.0
    warm_starts: bool = False         # stages forked by a warm-stage server (WARM_START_SECONDS), not started cold
    # Where the similarity nulls' engines run (layersim.compute.device.analysis_on): None on a CPU plan (with the host's
    # numpy terms); on a GPU, its float64 throughput and per-cell cost there, each a Figure (possibly unmeasured).
    analysis_flops: Figure | None = None
    analysis_cell_seconds: Figure | None = None
    # A training step of a small head on stored rows (truncate's heads): its fixed part (None: a layer pass's) and the
    # share of `flops` its small products reach.
    head_step_seconds: float | None = None
    head_efficiency: float = 1.0
    # A GPU's layer pass in a compiled training step (finetune.compile: CUDA graphs); unmeasured: pass_seconds, the
    # eager figure, stands in (an upper bound).
    compiled_pass_seconds: Figure | None = None
    threads: int = 1  # the host's threads for independent pieces side by side (StageCost.side_by_side)
    map_efficiency: float = 1.0       # align's maps' training steps (StageCost.map_flops): a CPU's CPU_MAP_EFFICIENCY


def device(name: str = "cpu", flops: float | None = None, pass_seconds: float | None = None,
           python_scale: float | None = None) -> Device:
    """`flops` given: that throughput (a GPU's name, if given too, keeps its other figures); "cpu": this machine's
    matmul, measured now, with the CPU's efficiencies and pass time, and its Python-level work against the reference
    CPU's (`python_scale`: measured now by :func:`python_probe_seconds` unless given, or 1 with `flops` given); a
    GPU's name: its figures (gpu_figures.json). A throughput that is not a positive finite number, or a negative or
    non-finite pass time, is one sentence (the times would be negative, NaN or a division by zero)."""
    if flops is not None and not (isinstance(flops, (int, float)) and 0 < flops < math.inf):
        raise LayersimError(f"--device-flops {flops:g} is invalid; give the device's effective FLOP/s, a positive "
                            "finite number (e.g. 1e11 for a CPU, 5e14 for an H200).")
    if pass_seconds is not None and not (isinstance(pass_seconds, (int, float)) and 0 <= pass_seconds < math.inf):
        raise LayersimError(f"--pass-seconds {pass_seconds:g} is invalid; give the fixed seconds per batch and layer, a "
                            "finite number of at least 0 (e.g. 0.001).")
    if name in GPUS:
        figures = gpu_figures()[name]
        training, passes = (Figure(**{k: figures[key][k] for k in ("value", "measured")})
                            for key in ("training_flops", "pass_seconds"))
        compiled = Figure(**{k: figures["compiled_pass_seconds"][k] for k in ("value", "measured")})
        basis = (f"{figures['machine']}; training {training.note('FLOP/s')}, a layer pass {passes.note('s')}, "
                 f"a compiled training pass {compiled.note('s')}" + (" (the eager pass stands in)" if compiled.value is None else ""))
        return Device(name, flops or training.value, passes.value if pass_seconds is None else pass_seconds,
                      ASSUMED_GPU_CPU_FLOPS, basis if flops is None and pass_seconds is None else "given",
                      cpu_thread_flops=ASSUMED_GPU_CPU_THREAD_FLOPS,
                      analysis_flops=Figure(**{k: figures["analysis_flops"][k] for k in ("value", "measured")}),
                      analysis_cell_seconds=Figure(**{k: figures["analysis_cell_seconds"][k]
                                                      for k in ("value", "measured")}),
                      compiled_pass_seconds=compiled if pass_seconds is None else None)
    one = measured_cpu_flops(1, repeats=5) if flops is None else flops / max(1, _threads())
    cpu = sustained_cpu_flops(one) if flops is None else flops
    scale = python_scale if python_scale is not None else \
        python_probe_seconds() / REFERENCE_PROBE_SECONDS if flops is None else 1.0
    python = f"Python-level work at {scale:.2f}× the reference CPU's time"
    basis = f"torch float32 2048² matmul (sustained: sustained_cpu_flops) and {python}, measured now" \
        if flops is None else \
        f"given; {python}" if python_scale is not None else "given"
    return Device(name, cpu, CPU_PASS_SECONDS * scale if pass_seconds is None else pass_seconds, cpu, basis,
                  CPU_TRAIN_EFFICIENCY, CPU_FORWARD_EFFICIENCY, cpu_thread_flops=one, python_scale=scale,
                  map_efficiency=CPU_MAP_EFFICIENCY,
                  head_step_seconds=CPU_HEAD_STEP_SECONDS * scale, head_efficiency=CPU_HEAD_EFFICIENCY,
                  threads=_threads())


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def terms(cost: StageCost, on: Device) -> dict[str, float | None]:
    """The seconds of each term of `cost` on `on` (the module's docstring); None for a term that rests on a figure
    never measured (the nulls' engines on a GPU before benchmarks/gpu_check.py timed them there)."""
    forward = cost.flops - cost.host_flops - cost.train_flops - cost.head_flops
    on_gpu = on.analysis_flops is not None  # the nulls' engines run on the device, the rest of the numpy on the host
    host_flops = cost.host_flops - (cost.analysis_flops if on_gpu else 0.0)
    small_flops = cost.small_flops  # never the nulls' engines (batched torch products: the host's threads or the GPU)
    # On a CPU the nulls' engines are part of the host's work, in float64 (kernel gathers: memory-bound).
    engines = 0.0 if on_gpu else cost.analysis_flops
    kernels = 0.0 if on_gpu else cost.kernel_flops
    compute = ((cost.train_flops - cost.map_flops) / on.train_efficiency + cost.map_flops / on.map_efficiency
               + forward / on.forward_efficiency) / on.flops + \
        (small_flops / (on.cpu_thread_flops * _side_by_side(cost, on)) if small_flops else 0.0) + \
        (host_flops - small_flops - cost.svd_flops - cost.lapack_flops - engines) / on.cpu_flops + \
        cost.svd_flops / (on.cpu_flops * SVD_EFFICIENCY) + cost.lapack_flops / (on.cpu_flops * LAPACK_EFFICIENCY) + \
        (engines - kernels) / (on.cpu_flops * CPU_ENGINE_EFFICIENCY) + kernels / (on.cpu_flops * CPU_KERNEL_EFFICIENCY)
    stack = STACK.get(cost.stage, "model")
    start = cost.processes * (WARM_START_SECONDS[WARM_STACK.get(cost.stage, stack)] if on.warm_starts else
                              START_SECONDS[stack])
    if cost.stage == "download" and cost.processes:  # download_model snapshots the model
        start += WARM_SNAPSHOT_SECONDS if on.warm_starts else SNAPSHOT_SECONDS
    python = on.python_scale
    first = cost.processes * FIRST_LOAD_SECONDS if cost.loads else 0.0
    host_evaluations = cost.evaluations - (cost.analysis_evaluations if on_gpu else 0)
    out = {"start": start * python,
           "loads": (first + cost.loads * LOAD_SECONDS) * python + cost.load_bytes / on.bandwidth,
           "compute": compute, "passes": cost.passes * on.pass_seconds + _compiled_saving(cost, on),
           "heads": cost.head_steps * (on.pass_seconds if on.head_step_seconds is None else on.head_step_seconds)
           + cost.head_flops / (on.flops * on.head_efficiency),
           "evaluations": (host_evaluations * EVALUATION_SECONDS + cost.heatmaps * HEATMAP_SECONDS) * python}
    if on_gpu and cost.analysis_evaluations:
        rate, per_cell = on.analysis_flops.value, on.analysis_cell_seconds.value
        out["analysis"] = None if rate is None or per_cell is None else \
            cost.analysis_flops / rate + cost.analysis_evaluations * per_cell
    return out


def _side_by_side(cost: StageCost, on: Device) -> float:
    """How many one-thread rates a stage's small products reach: one, or its pieces side by side on the host's
    threads, each further thread at :data:`CPU_THREAD_SCALING` (all of them sustain that share of their sum)."""
    threads = min(cost.side_by_side, on.threads)
    return 1.0 if threads <= 1 else threads * CPU_THREAD_SCALING


def _compiled_saving(cost: StageCost, on: Device) -> float:
    """The compiled training steps' passes at the GPU's measured compiled pass time instead of the eager one (0 on a
    CPU, or while that figure is unmeasured)."""
    compiled = on.compiled_pass_seconds
    if compiled is None or compiled.value is None:
        return 0.0
    return cost.compiled_passes * (compiled.value - on.pass_seconds)


def seconds(cost: StageCost, on: Device) -> float | None:
    """The stage's time on `on`, or None when a term rests on an unmeasured figure."""
    values = terms(cost, on).values()
    return None if None in values else sum(values)


def dvc_seconds(costs: list[StageCost], on: Device) -> float:
    """DVC's own time between the stage processes of `costs` (:data:`DVC_STAGE_SECONDS` each, scaled by the probe)."""
    return sum(c.processes for c in costs) * DVC_STAGE_SECONDS * on.python_scale


def known_seconds(cost: StageCost, on: Device) -> float:
    """The part of the stage's time that rests on measured figures only (all of it where :func:`seconds` is not None)."""
    return sum(value for value in terms(cost, on).values() if value is not None)


def where(cost: StageCost, on: Device) -> str:
    """Where the stage's work runs on `on`: the device (models, nulls' engines), the host (numpy), or both."""
    device_work = cost.flops - cost.host_flops + (cost.analysis_flops if on.analysis_flops is not None else 0.0)
    host_work = cost.host_flops - (cost.analysis_flops if on.analysis_flops is not None else 0.0)
    if on.analysis_flops is None and not cost.train_flops and device_work == 0:
        return "host" if cost.flops else "-"
    parts = [name for name, work in (("device", device_work), ("host", host_work)) if work > 0]
    return "+".join(parts) or "-"


def _human(value: float, unit: str) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.1f} {prefix}{unit}"
    if unit == "s" and value < 1:
        return f"{value * 1e3:.2f} ms"
    return f"{value:g} {unit}"
