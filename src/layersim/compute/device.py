"""Where tensors live and in what precision the models run: the one place that knows devices.

- :func:`resolve_device` turns the ``device`` param (``auto``, ``cpu``, ``cuda``, ``cuda:N``) into a
  torch device; ``auto`` is the first GPU when there is one. On a GPU, float32 matrix products may use
  TF32 (Ampere and newer), which keeps float32 storage and ranges but rounds products' inputs to 10
  mantissa bits.
- :func:`resolve_precision` turns ``finetune.precision`` (``auto``, ``fp32``, ``bf16``, ``fp16``) into
  one of the three: ``auto`` is bf16 on a GPU that has it and fp32 everywhere else (CPU included).
- :func:`autocast` runs a forward pass in that precision (``torch.autocast``; weights stay float32);
  :func:`grad_scaler` gives fp16 its loss scaler (bf16 and fp32 need none).
- :func:`to_device` copies a batch of host tensors to the device: from pinned memory and without
  blocking on a GPU, a plain move on the CPU.
- :func:`analysis_on` sets, for the code inside it, the device on which the similarity measures' permutation nulls
  run (:func:`analysis_device` reads it; the CPU unless a stage says otherwise), and :func:`analysis_batch` how many
  permutations of a given size fit that device's memory at once.
"""

from __future__ import annotations

import contextlib
import contextvars

import torch

from layersim.errors import LayersimError

PRECISIONS = ("fp32", "bf16", "fp16")
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_device(name: str = "auto") -> torch.device:
    """The torch device the ``device`` param names; raises if it names a GPU this machine lacks."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as err:
        raise LayersimError(f"device = {name!r} is not a device; use auto, cpu, cuda or cuda:N.") from err
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise LayersimError(f"device = {name!r} but this machine has no CUDA GPU that torch can use; "
                                "use auto or cpu.")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise LayersimError(f"device = {name!r} but this machine has {torch.cuda.device_count()} GPU(s): "
                                f"use cuda:0 … cuda:{torch.cuda.device_count() - 1}.")
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    elif device.type != "cpu":
        raise LayersimError(f"device = {name!r} is not supported; use auto, cpu, cuda or cuda:N.")
    return device


def default_device() -> torch.device:
    return resolve_device("auto")


def resolve_precision(precision: str, device: torch.device) -> str:
    """fp32, bf16 or fp16 for `device`; ``auto`` is bf16 on a GPU that supports it, fp32 otherwise."""
    if precision == "auto":
        gpu_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
        return "bf16" if gpu_bf16 else "fp32"
    if precision not in PRECISIONS:
        raise LayersimError(f"precision = {precision!r} is not one of auto, {', '.join(PRECISIONS)}.")
    if precision == "fp16" and device.type != "cuda":
        raise LayersimError("precision = 'fp16' needs a CUDA GPU (its loss scaling is a GPU feature); "
                            "on the CPU use bf16 or fp32.")
    return precision


def autocast(device: torch.device, precision: str):
    """A context that runs the forward passes inside it in `precision` (fp32: nothing changes)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=_DTYPES[precision])


def grad_scaler(device: torch.device, precision: str) -> torch.amp.GradScaler | None:
    """fp16's dynamic loss scaler; None for fp32 and bf16, whose range needs no scaling."""
    return torch.amp.GradScaler(device.type) if precision == "fp16" else None


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """A batch of host tensors on `device`; to a GPU through pinned memory without blocking the host."""
    if device.type == "cuda":
        return {k: v.pin_memory().to(device, non_blocking=True) for k, v in batch.items()}
    return {k: v.to(device) for k, v in batch.items()}


_ANALYSIS_DEVICE: contextvars.ContextVar[torch.device] = contextvars.ContextVar("analysis_device",
                                                                             default=torch.device("cpu"))
# Bytes one batch of permutations may take on the CPU: the permuted copy of the stacked y-side layers and one row
# layer's products with it stay within the last-level caches' reach of a few hundred MB, as numpy's loop over single
# permutations did (quickstart: 16 permutations of 600 word rows × 7 layers × 384 at a time).
CPU_BATCH_BYTES = 256 << 20
# The share of a GPU's free memory one batch may take (the rest: the stage's tables and torch's workspace).
GPU_BATCH_SHARE = 0.25


@contextlib.contextmanager
def analysis_on(device: torch.device):
    """Inside this context the similarity measures' null engines compute on `device` (float64 throughout)."""
    token = _ANALYSIS_DEVICE.set(torch.device(device))
    try:
        yield
    finally:
        _ANALYSIS_DEVICE.reset(token)


def analysis_device() -> torch.device:
    """The device :func:`analysis_on` set (the CPU outside any such context)."""
    return _ANALYSIS_DEVICE.get()


def analysis_batch(bytes_per_item: float, items: int, device: torch.device | None = None) -> int:
    """How many of `items` (permutations, resamples) of `bytes_per_item` each to compute at once on `device`
    (default :func:`analysis_device`): at least one, at most `items`."""
    device = analysis_device() if device is None else device
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        budget = GPU_BATCH_SHARE * free
    else:
        budget = CPU_BATCH_BYTES
    return int(max(1, min(items, budget // max(1.0, bytes_per_item))))
