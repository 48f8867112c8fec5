"""Divergence checks shared by every training loop (fine-tuning, fresh heads): a NaN or infinite loss
stops training with an error instead of producing a model that is saved and scored as a success.

The step of the first non-finite loss is tracked on the device (no host sync per step) and checked
once per logging window or epoch."""

from __future__ import annotations

import torch

from layersim.errors import LayersimError


class NonFiniteLoss(LayersimError):
    """Training diverged: the loss became NaN or infinite."""


def check_finite_loss(first_bad: torch.Tensor, done: int, what: str, hint: str) -> None:
    """Raise if `first_bad` (the 1-based step of the first non-finite loss, or more than `done`) is a step
    already done. Checked once per logging window: one host sync, not one per step."""
    step = int(first_bad)
    if step <= done:
        raise NonFiniteLoss(f"{what}: the training loss became NaN or infinite at step {step}; nothing was saved. "
                            f"The run diverged: {hint}.")


def mark_non_finite(first_bad: torch.Tensor, loss: torch.Tensor, step: int) -> torch.Tensor:
    """`first_bad`, set to `step` if this is the first step whose loss is not finite (stays on the device)."""
    return torch.where(torch.isfinite(loss) | (first_bad <= step), first_bad, torch.full_like(first_bad, step))
