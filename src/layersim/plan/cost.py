"""What the plan counts of one stage (:mod:`layersim.plan.stages` fills it in per stage, :mod:`layersim.plan.timing`
turns it into seconds on a device)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StageCost:
    stage: str
    rows: int = 0          # examples (inputs) processed, or table rows written (extract)
    bytes: int = 0         # DVC-cached outputs, workspace copy
    flops: float = 0.0
    passes: int = 0        # batches × layers they run through (a training step: 3 × layers)
    compiled_passes: int = 0  # the part of passes in compiled training steps (finetune.compile): on a GPU, at its
                              # compiled pass time where measured
    train_flops: float = 0.0  # the part of flops in training steps (forward, backward)
    map_flops: float = 0.0    # the part of train_flops in align's maps (INN, MLP) trained on stored rows, vmapped
    head_steps: int = 0       # training steps of a small head on stored rows (truncate): a step's dispatch each
    head_flops: float = 0.0   # the part of flops in those steps (small products, not the model's layers)
    processes: int = 0     # stage processes DVC starts (one per matrix item)
    loads: int = 0         # models read from disk
    load_bytes: int = 0
    evaluations: int = 0   # similarity measures run on one pair of layers (one permutation or resample)
    heatmaps: int = 0      # figures with a value written in every cell
    host_flops: float = 0.0   # the part of flops that numpy runs on the host CPU (similarity measures, SVDs)
    small_flops: float = 0.0  # the part of host_flops in products too small for more than one thread
    svd_flops: float = 0.0    # the part of host_flops in float64 LAPACK SVDs (the weights stage)
    lapack_flops: float = 0.0  # the part of host_flops in float64 LAPACK work on small matrices besides SVDs (the
                               # weights stage's null: Householder frames, Cholesky QR, Gram matrices, eigh)
    # The part of host_flops and evaluations that the permutation nulls' engines run (torch, float64): on the host
    # in a CPU plan, on the GPU in a GPU plan (layersim.compute.device.analysis_on).
    analysis_flops: float = 0.0
    kernel_flops: float = 0.0  # the part of analysis_flops on permuted n × n kernels (gathers: memory-bound)
    analysis_evaluations: int = 0
    # Independent pieces the stage runs side by side, one thread each (layersim.compute.threads: the similarity stage's
    # poolings and its attention section): its small products reach that many of the host's threads.
    side_by_side: int = 1
    notes: list[str] = field(default_factory=list)

    def add(self, other: "StageCost") -> None:
        for name in ("rows", "bytes", "flops", "passes", "train_flops", "map_flops", "head_steps", "head_flops", "processes",
                     "loads", "load_bytes", "evaluations", "heatmaps", "host_flops", "small_flops", "svd_flops",
                     "lapack_flops", "analysis_flops", "kernel_flops", "analysis_evaluations"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.side_by_side = max(self.side_by_side, other.side_by_side)  # per process: tasks run one after another
