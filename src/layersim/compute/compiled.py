"""Training steps that are not bound by kernel launches: the model compiled (``finetune.compile``).

A training step of a base-sized encoder at the papers' batch of 4 launches some hundreds of small kernels, and on a
GPU the launches, not the arithmetic, set its time (benchmarks/gpu_check.py measured 29-36 ms a step on an H200
where the arithmetic takes a few). ``torch.compile`` fuses the forward and backward into fewer kernels, and with
``mode="reduce-overhead"`` replays each as a CUDA graph: one launch per graph. A graph holds one input shape, so a
compiled run pads every batch to a multiple of :data:`PAD_MULTIPLE` tokens (capped at ``max_length``): a handful of
shapes, each compiled once. Padding is masked, so the loss is that of the dynamically padded batch up to float
rounding; the recipe (batch, learning rate, steps, data order) is unchanged.

On the CPU a step of a small model is bound by its arithmetic and a compile costs about a minute, so ``auto`` is
eager there; ``on`` compiles anyway (inductor, which needs a C++ compiler)."""

from __future__ import annotations

import torch

from layersim.errors import LayersimError

COMPILE_SETTINGS = ("auto", "on", "off")  # finetune.compile (layersim.params.vocabulary spells them out: a test checks)
PAD_MULTIPLE = 64
CPU_BACKEND = "inductor"  # tests substitute a cheaper backend to check the wiring


def compiles(setting: str, device: torch.device) -> bool:
    """Whether a run with ``finetune.compile = setting`` on `device` compiles its training steps."""
    if setting not in COMPILE_SETTINGS:
        raise LayersimError(f"finetune.compile = {setting!r} is not one of {', '.join(COMPILE_SETTINGS)}.")
    return setting == "on" or (setting == "auto" and device.type == "cuda")


def compiled(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """`model` compiled for training steps: the same parameters (an optimizer built on `model` trains it), CUDA
    graphs on a GPU. Shapes are static (``dynamic=False``): the batches come padded to a few lengths."""
    if device.type == "cuda":
        return torch.compile(model, mode="reduce-overhead", dynamic=False)
    return torch.compile(model, backend=CPU_BACKEND, dynamic=False)

