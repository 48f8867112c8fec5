"""GradientSteps: the optimisation step shared by fine-tuning, fresh heads and INN/MLP maps."""

import pytest
import torch

from layersim.compute.training_steps import GradientSteps, NonFiniteLoss


def test_a_step_updates_clears_gradients_and_schedules():
    weight = torch.nn.Parameter(torch.tensor([1.0]))
    optimizer = torch.optim.SGD([weight], lr=0.5)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (s + 1))
    steps = GradientSteps(optimizer, scheduler, total=3)
    steps.take((weight**2).sum(), 1)  # gradient 2w = 2: w = 1 - 0.5 * 2 = 0
    assert weight.item() == pytest.approx(0.0) and weight.grad is None
    assert scheduler.get_last_lr() == [pytest.approx(0.25)]
    assert steps.diverged_at(1) is None


def test_the_first_non_finite_step_is_remembered_and_raised():
    weight = torch.nn.Parameter(torch.tensor([1.0]))
    steps = GradientSteps(torch.optim.SGD([weight], lr=0.1), total=5)
    steps.take(weight.sum(), 1)
    steps.take(weight.sum() * float("nan"), 2)
    steps.take(weight.sum() * float("inf"), 3)
    assert steps.diverged_at(1) is None and steps.diverged_at(3) == 2
    with pytest.raises(NonFiniteLoss, match=r"^run x: the training loss became NaN or infinite at step 2; nothing "
                                            r"was saved\. The run diverged: lower it\.$"):
        steps.check(3, "run x", "lower it")
    steps.check(1, "run x", "lower it")  # step 2 is not done yet at 1


def test_clipping_bounds_the_gradients_total_norm():
    """With max_grad_norm, an SGD step moves the parameters by lr x the clipped gradient: its norm is
    max_grad_norm, not the raw gradient's 5."""
    for max_norm, moved in ((0.0, 5.0), (1.0, 1.0), (10.0, 5.0)):
        param = torch.nn.Parameter(torch.zeros(2))
        steps = GradientSteps(torch.optim.SGD([param], lr=1.0), total=1, max_grad_norm=max_norm)
        steps.take((param * torch.tensor([3.0, 4.0])).sum(), 1)  # gradient (3, 4): norm 5
        assert torch.linalg.vector_norm(param.detach()).item() == pytest.approx(moved)
