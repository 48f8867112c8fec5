"""The networks behind the neural alignment maps (:mod:`layersim.align.neural` explains the maths):
RealNVP affine coupling blocks and the flow built of them, the MLP, a random flow for synthetic ground
truths, and the one training loop both maps share (Adam on the mean squared error, warm-up then decay)."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn

from layersim.align.base import _non_negative_float, _positive_float, _positive_int
from layersim.errors import LayersimError
from layersim.compute.training_steps import GradientSteps

SCHEDULES = ("constant", "cosine", "linear")

# Fraction of the steps spent warming the learning rate up linearly from 0.
_WARMUP_FRACTION = 0.05



class AffineCoupling(nn.Module):
    """One RealNVP affine coupling block (see the module docstring): it keeps (conditions on) ``split``
    coordinates, the leading ones if ``keep_first`` else the trailing ones, and transforms the rest; the
    output is in the input's coordinate order, so a block at initialisation is exactly the identity.
    The halves are slices, not gathers: a permutation by index costs as much as the subnetwork here."""

    def __init__(self, dim: int, hidden: int, clamp: float, keep_first: bool = True, split: int | None = None):
        super().__init__()
        self.split = dim // 2 if split is None else int(split)
        if not 1 <= self.split < dim:
            raise LayersimError(f"a coupling block of width {dim} must keep between 1 and {dim - 1} coordinates, "
                                f"got {self.split}.")
        self.dim, self.clamp, self.keep_first = dim, clamp, keep_first
        self.subnet = nn.Sequential(nn.Linear(self.split, hidden), nn.GELU(), nn.Linear(hidden, 2 * (dim - self.split)))
        nn.init.zeros_(self.subnet[-1].weight)
        nn.init.zeros_(self.subnet[-1].bias)

    @property
    def permutation(self) -> torch.Tensor:
        """The coordinates in the block's order: the kept ones (first ``split``), then the transformed."""
        order = torch.arange(self.dim)
        cut = self.split if self.keep_first else self.dim - self.split
        return order if self.keep_first else torch.cat([order[cut:], order[:cut]])

    def _halves(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.keep_first:
            return x[..., : self.split], x[..., self.split :]
        cut = self.dim - self.split
        return x[..., cut:], x[..., :cut]

    def _join(self, kept: torch.Tensor, transformed: torch.Tensor) -> torch.Tensor:
        return torch.cat([kept, transformed] if self.keep_first else [transformed, kept], dim=-1)

    def _scale_shift(self, u1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s_raw, t = self.subnet(u1).chunk(2, dim=-1)
        return self.clamp * torch.tanh(s_raw / self.clamp), t

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u1, u2 = self._halves(x)
        s, t = self._scale_shift(u1)
        return self._join(u1, u2 * torch.exp(s) + t)

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        v1, v2 = self._halves(y)
        s, t = self._scale_shift(v1)
        return self._join(v1, (v2 - t) * torch.exp(-s))


class CouplingFlow(nn.Module):
    """``g(x) = C_depth ∘ … ∘ C_1(x Wᵀ + b)``: an optional dense linear layer then coupling blocks.

    Permutations and initial weights come from the global torch RNG; seed it first.

    Parameters
    ----------
    dim : width of input and output (>= 2).
    depth : number of coupling blocks.
    hidden : width of each block's subnetwork.
    clamp : bound on the log-scale, ``|s| <= clamp``.
    linear : whether to start with the learnt dense layer (initialised to the identity).
    """

    def __init__(self, dim: int, depth: int, hidden: int, clamp: float, linear: bool = True):
        super().__init__()
        if dim < 2:
            raise LayersimError(f"an invertible network needs width >= 2 to split into halves, got width {dim}.")
        self.linear = nn.Linear(dim, dim) if linear else None
        if self.linear is not None:
            with torch.no_grad():
                self.linear.weight.copy_(torch.eye(dim))
                self.linear.bias.zero_()
        self.blocks = nn.ModuleList(
            AffineCoupling(dim, hidden, clamp, keep_first=i % 2 == 0, split=alternating_split(dim, i))
            for i in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.linear is not None:
            x = self.linear(x)
        for block in self.blocks:
            x = block(x)
        return x

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        for block in reversed(self.blocks):
            y = block.inverse(y)
        if self.linear is not None:
            y = torch.linalg.solve(self.linear.weight, (y - self.linear.bias).T).T
        return y


def alternating_split(dim: int, block: int) -> int:
    """How many coordinates block ``block`` keeps: even blocks keep the leading ``⌊dim/2⌋`` coordinates and
    transform the trailing ``⌈dim/2⌉``; odd blocks keep the trailing ``⌈dim/2⌉`` and transform the leading
    ``⌊dim/2⌋``, so the half a block keeps is exactly the half the next block transforms (Ren et al. §3.4),
    for odd ``dim`` too."""
    return dim // 2 if block % 2 == 0 else dim - dim // 2


def random_flow(dim: int, *, depth: int = 4, hidden: int = 256, clamp: float = 2.0, scale: float = 1.0,
                seed: int = 0) -> CouplingFlow:
    """An untrained float64 :class:`CouplingFlow`: a random smooth bijection of ℝ^dim, the ground
    truth of :func:`~layersim.align.experiments.synthetic_recovery`.

    Its linear layer is a random rotation (Haar, zero bias), so no coordinate split is privileged;
    every coupling subnetwork layer gets weights ``N(0, scale² / fan_in)`` and zero biases, so
    ``s`` and ``t`` are O(scale) for standardised input: ``scale`` sets how far from linear the
    bijection is (0 gives the rotation alone).
    """
    dim = _positive_int("dim", dim)
    scale = _non_negative_float("scale", scale)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        flow = CouplingFlow(dim, _positive_int("depth", depth), _positive_int("hidden", hidden),
                            _positive_float("clamp", clamp), linear=True)
        with torch.no_grad():
            q, r = torch.linalg.qr(torch.randn(dim, dim, dtype=torch.float64))
            flow.linear.weight.copy_(q * torch.sign(torch.diagonal(r)))
            for block in flow.blocks:
                for layer in block.subnet:
                    if isinstance(layer, nn.Linear):
                        layer.weight.normal_(0.0, scale / math.sqrt(layer.in_features))
                        layer.bias.zero_()
    return flow.double().eval()


def mlp(dim_in: int, dim_out: int, depth: int, hidden: int) -> nn.Sequential:
    """``depth`` hidden GELU layers of width ``hidden`` between ``dim_in`` and ``dim_out``."""
    layers: list[nn.Module] = []
    width = dim_in
    for _ in range(depth):
        layers += [nn.Linear(width, hidden), nn.GELU()]
        width = hidden
    layers.append(nn.Linear(width, dim_out))
    return nn.Sequential(*layers)


# --- the shared training loop ---


def learning_rate_factor(schedule: str, step: int, steps: int) -> float:
    """Multiplier of the base learning rate at ``step`` (0-based) of ``steps``: linear warm-up over the
    first 5% of steps, then constant, cosine decay to 0, or linear decay to 0."""
    warmup = max(1, int(_WARMUP_FRACTION * steps))
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    if schedule == "linear":
        return 1.0 - progress
    return 1.0


# Stacked parameters (with their gradients and two Adam moments) of one batched fit at most this many
# bytes; larger groups are fitted in several batches.
_GROUP_BYTES = 2 * 2**30


def train_networks(modules: Sequence[nn.Module], xs: Sequence[np.ndarray], ys: Sequence[np.ndarray], *, steps: int,
                   batch_size: int, learning_rate: float, schedule: str, generator: torch.Generator,
                   learning_rate_factors: Callable[[str], float] = lambda name: 1.0,
                   device: torch.device = torch.device("cpu")) -> np.ndarray:
    """Adam on ``mean((module_k(x_k) − y_k)²)`` for several networks of one architecture at once, each on its
    own rows (equal row counts), over the same random mini-batches (each epoch a fresh permutation of the
    rows, drawn from ``generator``). The networks' parameters are stacked and run as one batched network
    (``torch.func.vmap``), so k fits cost about one step's overhead per step instead of k; each network's
    gradient is that of its own loss, and Adam works element by element, so each trains as it would alone.
    Float32 arithmetic on `device`; `modules` are trained in place (left on the CPU). A parameter's learning
    rate is ``learning_rate × learning_rate_factors(name)``.

    Returns each network's training loss at every step, float64 (len(modules), steps).
    """
    x = torch.stack([torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)) for a in xs]).to(device)
    y = torch.stack([torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)) for a in ys]).to(device)
    n = x.shape[1]
    batch = min(batch_size, n)
    stacked, _ = torch.func.stack_module_state([module.to(device) for module in modules])
    buffers = dict(modules[0].named_buffers())  # the coupling permutations: the same in every network
    template = copy.deepcopy(modules[0]).to("meta")

    def one(params, rows):
        return torch.func.functional_call(template, (params, buffers), (rows,))

    forward = torch.vmap(one)
    by_factor: dict[float, list[torch.Tensor]] = {}
    for name, tensor in stacked.items():
        by_factor.setdefault(learning_rate_factors(name), []).append(tensor)
    # foreach: the update as a few multi-tensor kernels, ~30% faster than the for-loop Adam on the CPU and bitwise
    # equal to it; fused=True is 3x faster but rounds a stacked network differently from the same network alone.
    optimizer = torch.optim.Adam([{"params": group, "lr": learning_rate * factor}
                                  for factor, group in by_factor.items()], lr=learning_rate, foreach=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: learning_rate_factor(schedule, s, steps))
    losses = torch.empty((len(modules), steps), device=device)
    gradient_steps = GradientSteps(optimizer, scheduler, total=steps, device=device)
    order, position = torch.randperm(n, generator=generator), 0
    for step in range(steps):
        if position + batch > n:
            order, position = torch.randperm(n, generator=generator), 0
        rows = order[position : position + batch].to(device)
        position += batch
        per_network = torch.mean((forward(stacked, x[:, rows]) - y[:, rows]) ** 2, dim=(1, 2))
        gradient_steps.take(per_network.sum(), step + 1)  # the sum: each network's own gradient
        losses[:, step] = per_network.detach()
    with torch.no_grad():
        for k, module in enumerate(modules):
            module.to("cpu")
            for name, tensor in module.named_parameters():
                tensor.copy_(stacked[name][k].cpu())
            module.eval()
    losses = losses.double().cpu().numpy()
    for k, history in enumerate(losses):
        check_loss_history(history, learning_rate, f" (network {k + 1} of {len(modules)})" if len(modules) > 1 else "")
    return losses


def check_loss_history(history: np.ndarray, learning_rate: float, which: str = "") -> None:
    """Raise a LayersimError when a training loss history (one value per step) went non-finite, or ended far above
    where it had been (a blow-up that stayed finite); `which` names the network in the message."""
    bad = np.flatnonzero(~np.isfinite(history))
    if len(bad):
        raise LayersimError(f"training diverged{which}: the loss became {history[bad[0]]} at step {bad[0] + 1} "
                            f"of {len(history)}; lower align.learning_rate (or the coupling clamp).")
    first, lowest, last = _loss_windows(history)
    if last > _NEGLIGIBLE_LOSS and (last > _BLOWUP * lowest or last > 2.0 * first):
        raise LayersimError(f"training blew up{which}: the loss ended at {last:.4g} after falling to {lowest:.4g} "
                            f"(it started at {first:.4g}), so the map is worse than the network had been; lower "
                            f"align.learning_rate (now {learning_rate:g}).")


# Training "blew up" when its loss ends this many times above its lowest (both averaged over 5% of the steps):
# at width 768 a learning rate of 3e-3 once jumped from 0.0009 to 0.5 and settled at 0.10, finite throughout.
_BLOWUP = 10.0
# A final loss below this (mean squared error of unit-variance targets) is no blow-up whatever it rose from: a map
# that starts exact (the identity start of a layer aligned with itself, loss ~1e-15) drifts to ~1e-7 in float32.
_NEGLIGIBLE_LOSS = 1e-4


def _loss_windows(history: np.ndarray) -> tuple[float, float, float]:
    """The mean training loss over the first 5% of the steps, its lowest such moving mean, and the last."""
    window = max(1, len(history) // 20)
    means = np.convolve(history, np.ones(window) / window, mode="valid")
    return float(means[0]), float(means.min()), float(means[-1])
