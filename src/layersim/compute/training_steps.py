"""The optimisation step shared by every training loop (fine-tuning, fresh heads, INN/MLP maps), and its
divergence check: a NaN or infinite loss stops training with an error instead of producing a model that
is saved and scored as a success.

The step of the first non-finite loss is tracked on the device (no host sync per step) and checked
once per logging window or epoch."""

from __future__ import annotations

import torch

from layersim.errors import LayersimError


class NonFiniteLoss(LayersimError):
    """Training diverged: the loss became NaN or infinite."""


class GradientSteps:
    """Backward, optional clipping of the gradients' total norm, optimizer step, scheduler step (if any),
    gradients cleared; and the first step (1-based, or epoch for loops that check per epoch) whose loss
    was not finite, kept on the loss's device. With a `scaler` (fp16), the loss is scaled for backward
    and the gradients unscaled before clipping and stepping; steps whose scaled gradients overflowed
    are skipped by the scaler, as usual for fp16."""

    def __init__(self, optimizer: torch.optim.Optimizer, scheduler=None, *, total: int,
                 device: torch.device | str | None = None, max_grad_norm: float = 0.0,
                 scaler: torch.amp.GradScaler | None = None):
        self.optimizer, self.scheduler = optimizer, scheduler
        self.max_grad_norm, self.scaler = max_grad_norm, scaler
        self.first_bad = torch.full((), total + 1, device=device)

    def take(self, loss: torch.Tensor, step: int) -> None:
        """One optimisation step on `loss`, counted as `step` for the divergence check."""
        self.first_bad = mark_non_finite(self.first_bad, loss.detach(), step)
        if self.scaler is None:
            loss.backward()
            self._clip()
            self.optimizer.step()
        else:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.optimizer)
            self._clip()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        if self.scheduler is not None:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _clip(self) -> None:
        if self.max_grad_norm:
            parameters = [p for group in self.optimizer.param_groups for p in group["params"]]
            torch.nn.utils.clip_grad_norm_(parameters, self.max_grad_norm)

    def diverged_at(self, done: int) -> int | None:
        """The first step up to `done` whose loss was not finite, or None (one host sync)."""
        step = int(self.first_bad)
        return step if step <= done else None

    def check(self, done: int, what: str, hint: str) -> None:
        """Raise NonFiniteLoss if a step up to `done` had a non-finite loss."""
        check_finite_loss(self.first_bad, done, what, hint)


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
