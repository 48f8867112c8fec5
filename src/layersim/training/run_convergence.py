"""A fine-tuning run's convergence, checked once training ends and before anything is written: an unconverged
run warns, or with finetune.require_convergence fails and leaves no checkpoint or metrics
(layersim.training.convergence)."""

from __future__ import annotations

from pathlib import Path

from layersim.training.convergence import Convergence, enforce


def checked_convergence(check: Convergence, task: str, seed: int, pretrained: str | Path, finetune, log) -> dict:
    """`check`'s record for the checkpoint and metrics, once :func:`enforce` has passed the run, which it names by
    task, seed and base model, and by method unless it is full fine-tuning (the advice then names that method's
    params)."""
    method = "" if finetune.method == "full" else f" with {finetune.method}"
    enforce(check, f"fine-tuning {task} seed {seed} from {pretrained}{method}", finetune, log)
    return check.record()
