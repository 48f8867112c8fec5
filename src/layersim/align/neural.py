"""Neural alignment maps: an invertible network (Ren et al. 2023, §3.4) and a plain MLP baseline.

Both are trained the same way (one shared loop, :func:`train_network`): Adam on the mean squared
distance between ``g(x_s)`` and ``y_s`` over mini-batches of the standardised training rows
(Ren eq. 10 with δ = mean squared error), with a learning-rate schedule (linear warm-up over the
first 5% of steps, then cosine decay to 0 by default).

**INN** (``inn``): a RealNVP-style flow (Dinh et al. 2016) written out here in plain PyTorch::

    g(x) = C_D ∘ … ∘ C_1 (x Wᵀ + b)

* whitening — the INN's input is the standardised X whitened with its training rows' correlation
  matrix ``C``, shrunk towards the identity: ``x ↦ x (C + r I)^(-1/2)`` with ``r = 1e-2``
  (``whiten=True``, the default). A fixed invertible linear map, so the flow is the same family of
  bijections; it only conditions the training: real representations are strongly correlated (a
  LayerNorm output even has an exactly constant direction), and Adam then crawls along the
  low-variance directions. Recovering a known random INN from 20,000 MiniLM sentence vectors, the
  held-out error fell from 0.020 to 0.008 (5,000 steps at 3e-3). The shrinkage keeps a direction of
  (near-)zero training variance from being amplified more than ``1/√r`` = 10×.
* ``x Wᵀ + b`` — a learnt dense linear layer (in the role of Glow's invertible 1x1 convolution,
  Kingma & Dhariwal 2018). By default it starts at the ridge-regularised least-squares map from
  standardised X to standardised Y (ridge 1e-2 relative to unit variance), so the flow starts as
  (almost) linear regression and the couplings learn the non-linear remainder; it trains at
  ``linear_learning_rate_factor`` (0.1) times the learning rate, as full-rate Adam steps on its
  d² entries undo the least-squares start within a few dozen steps. Without such a layer the
  couplings would have to build a general rotation out of shears. ``W`` is invertible unless
  training drives it singular, which the squared loss does not favour; ``inverse`` checks.
* ``C_i`` — an affine coupling block (Ren eqs. 11–12). The coordinates are split into two halves,
  the first ``k = ⌊d/2⌋`` and the last ``d − k = ⌈d/2⌉``, and the blocks alternate roles: even
  blocks keep (condition on) the first half and transform the last, odd blocks keep the last half
  and transform the first. So the half a block keeps is exactly the half the next one transforms,
  and with two or more blocks every coordinate both conditions some block and is transformed by
  some block — also for odd ``d``, where the halves differ in size by one (keeping ``k`` coordinates
  in every block would leave coordinate ``d − 1`` conditioning none). Writing ``u₁`` for the kept
  and ``u₂`` for the transformed coordinates of a block's input ``u``, and keeping the input's
  coordinate order in the output::

      v₁ = u₁
      v₂ = u₂ ⊙ exp(s(u₁)) + t(u₁),     s = clamp · tanh(s_raw / clamp)

  ``(s_raw, t)`` come from one subnetwork ``Linear(|u₁|, hidden) → GELU → Linear(hidden, 2 |u₂|)``
  whose last layer starts at zero, so each block starts as the identity. The bounded log-scale
  keeps ``exp(±s)`` within ``exp(±clamp)``.
* inverse — exact, block by block: ``u₂ = (v₂ − t(v₁)) ⊙ exp(−s(v₁))``, ``u₁ = v₁``; then
  ``x = (y − b) W⁻ᵀ``, then the whitening undone, ``x (C + r I)^(1/2)``. The network trains in float32 but is kept
  and evaluated in float64 after fitting, so ``inverse(transform(x))`` reconstructs x to float64
  rounding times the conditioning of the flow (~1e-12 relative in practice).

An INN is a bijection of ℝᵈ, so it needs ``d_x = d_y``; ``fit`` raises otherwise (reduce the
wider side first, e.g. with PCA, if you must compare different widths).

**MLP** (``mlp``): ``Linear(d_x, h) → GELU → [Linear(h, h) → GELU] x (depth − 1) → Linear(h, d_y)``,
Ren's "non-bijective NN" sanity check; any widths, no inverse.

Determinism: the initial weights and the batch order come from ``seed`` (the global torch RNG
state is saved and restored around ``fit``), so equal seeds give equal maps on the same machine
and thread count.

Hand-written rather than FrEIA: the flow is ~60 lines, needs no extra dependency, and keeps the
float64 inverse and the least-squares start under our control.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence

import numpy as np
import scipy.linalg
import torch
from torch import nn

from layersim.align.base import AlignmentMap, ArrayMemo, _non_negative_float, _positive_float, _positive_int
from layersim.device import resolve_device
from layersim.errors import LayersimError, unknown_name
from layersim.linalg import blas_on_calling_thread
from layersim.training_steps import GradientSteps

SCHEDULES = ("constant", "cosine", "linear")
LINEAR_INITS = ("identity", "least_squares")

# Fraction of the steps spent warming the learning rate up linearly from 0.
_WARMUP_FRACTION = 0.05

# Shrinkage (relative to unit feature variance) of the INN's input whitening, (C + r I)^(-1/2): see the docstring.
_WHITENING_SHRINKAGE = 1e-2

# Ridge (relative to unit feature variance) of the least-squares start of the INN's linear layer:
# keeps the start invertible when X is rank-deficient, and generalised better than 1e-3 or 1e-1
# on held-out rows in the synthetic-recovery experiment.
_INIT_RIDGE = 1e-2


# --- the networks ---


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

    Parameters
    ----------
    dim : width of input and output (>= 2).
    depth : number of coupling blocks.
    hidden : width of each block's subnetwork.
    clamp : bound on the log-scale, ``|s| <= clamp``.
    linear : whether to start with the learnt dense layer (initialised to the identity).

    Permutations and initial weights come from the global torch RNG; seed it first.
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
        which = f" (network {k + 1} of {len(modules)})" if len(modules) > 1 else ""
        bad = np.flatnonzero(~np.isfinite(history))
        if len(bad):
            raise LayersimError(f"training diverged{which}: the loss became {history[bad[0]]} at step {bad[0] + 1} "
                                f"of {steps}; lower align.learning_rate (or the coupling clamp).")
        first, lowest, last = _loss_windows(history)
        if last > _BLOWUP * lowest or last > 2.0 * first:
            raise LayersimError(f"training blew up{which}: the loss ended at {last:.4g} after falling to {lowest:.4g} "
                                f"(it started at {first:.4g}), so the map is worse than the network had been; lower "
                                f"align.learning_rate (now {learning_rate:g}).")
    return losses


# Training "blew up" when its loss ends this many times above its lowest (both averaged over 5% of the steps):
# at width 768 a learning rate of 3e-3 once jumped from 0.0009 to 0.5 and settled at 0.10, finite throughout.
_BLOWUP = 10.0


def _loss_windows(history: np.ndarray) -> tuple[float, float, float]:
    """The mean training loss over the first 5% of the steps, its lowest such moving mean, and the last."""
    window = max(1, len(history) // 20)
    means = np.convolve(history, np.ones(window) / window, mode="valid")
    return float(means[0]), float(means.min()), float(means[-1])


class NeuralMap(AlignmentMap):
    """A map given by a trained torch module; subclasses build the module in ``_build(dx, dy, xs, ys)``.

    Maps with the same options fitted on rows of the same shapes train together
    (:func:`~layersim.align.base.fit_maps`), with the same result as one at a time up to float32 rounding.

    Attributes (after ``fit``): ``module_`` — the trained network in float64 (eval mode);
    ``loss_history_`` — the training MSE (standardised units) at every step.
    """

    batched_over_pairs = True

    def __init__(self, depth: int, hidden: int, steps: int, learning_rate: float, schedule: str,
                 batch_size: int, seed: int, device: str):
        self.depth = _positive_int("depth", depth)
        self.hidden = _positive_int("hidden", hidden)
        self.steps = _positive_int("steps", steps)
        self.learning_rate = _positive_float("learning_rate", learning_rate)
        if schedule not in SCHEDULES:
            raise unknown_name("schedule", schedule, SCHEDULES)
        self.schedule = schedule
        self.batch_size = _positive_int("batch_size", batch_size)
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise LayersimError(f"seed must be a non-negative integer, got {seed!r}.")
        self.seed = int(seed)
        if not isinstance(device, str):
            raise LayersimError(f"device must be a device name (auto, cpu, cuda or cuda:N), got {device!r}.")
        self.device = device

    def _build(self, xs: np.ndarray, ys: np.ndarray) -> nn.Module:
        raise NotImplementedError

    def _learning_rate_factor(self, name: str) -> float:
        """The learning rate of parameter `name`, as a fraction of ``learning_rate``."""
        return 1.0

    def transform(self, x: np.ndarray) -> np.ndarray:
        with blas_on_calling_thread():  # NumPy and torch take turns here (see linalg.blas_on_calling_thread)
            return super().transform(x)

    def inverse(self, y: np.ndarray) -> np.ndarray:
        with blas_on_calling_thread():
            return super().inverse(y)

    @classmethod
    def _fit_group(cls, maps: Sequence[NeuralMap], data: Sequence[tuple[np.ndarray, np.ndarray]]) -> None:
        """Fit maps of this class together, in batches of equal options and shapes (within _GROUP_BYTES)."""
        with blas_on_calling_thread():  # NumPy and torch take turns here (see linalg.blas_on_calling_thread)
            cls._train_group(maps, cls._network_inputs(maps, data))

    @classmethod
    def _network_inputs(cls, maps: Sequence[NeuralMap], data: Sequence[tuple[np.ndarray, np.ndarray]]
                        ) -> Sequence[tuple[np.ndarray, np.ndarray]]:
        """The (x, y) rows the networks train on, from the standardised ones: the same by default."""
        return data

    @classmethod
    def _train_group(cls, maps: Sequence[NeuralMap], data: Sequence[tuple[np.ndarray, np.ndarray]]) -> None:
        groups: dict[tuple, list[int]] = {}
        for k, (fitted, (xs, ys)) in enumerate(zip(maps, data)):
            key = (tuple(sorted(fitted.get_params().items())), xs.shape, ys.shape)
            groups.setdefault(key, []).append(k)
        for members in groups.values():
            modules = []
            for k in members:
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(maps[k].seed)
                    modules.append(maps[k]._build(*data[k]))
            size = sum(p.numel() for p in modules[0].parameters()) * 4 * 4  # weights, gradients, Adam moments
            per_batch = max(1, _GROUP_BYTES // size)
            for first in range(0, len(members), per_batch):
                chunk = members[first:first + per_batch]
                first_map = maps[chunk[0]]
                histories = train_networks(
                    modules[first:first + per_batch], [data[k][0] for k in chunk], [data[k][1] for k in chunk],
                    steps=first_map.steps, batch_size=first_map.batch_size, learning_rate=first_map.learning_rate,
                    schedule=first_map.schedule, generator=torch.Generator().manual_seed(first_map.seed),
                    learning_rate_factors=first_map._learning_rate_factor, device=resolve_device(first_map.device))
                for k, module, history in zip(chunk, modules[first:first + per_batch], histories):
                    maps[k].loss_history_ = history
                    maps[k].module_ = module.double().eval()

    @torch.no_grad()
    def _transform(self, xs: np.ndarray) -> np.ndarray:
        return self.module_(torch.from_numpy(xs)).numpy()


class INNMap(NeuralMap):
    """Ren et al.'s INN alignment: a RealNVP coupling flow trained to send X's rows onto Y's.

    Parameters
    ----------
    depth : int, default 4 — coupling blocks.
    hidden : int, default 256 — width of each block's subnetwork.
    clamp : float, default 2.0 — bound on each log-scale, ``s = clamp · tanh(s_raw / clamp)``.
    linear_init : "least_squares" (default) or "identity" — start of the dense linear layer: the
        ridge-regularised (1e-2) least-squares map between the standardised training rows, or the
        identity.
    linear_learning_rate_factor : float >= 0, default 0.1 — the linear layer's learning rate as a
        fraction of ``learning_rate`` (0 freezes it at its start).
    whiten : bool, default True — train on the standardised X whitened with its shrunk training
        correlation (see the module docstring); False trains on the standardised X itself.
    steps : int, default 600 — Adam steps (mini-batches), not epochs.
    learning_rate : float, default 1e-3 — peak learning rate.
    schedule : "cosine" (default), "linear" or "constant" — after a 5% linear warm-up.
    batch_size : int, default 256 — rows per step (all rows if fewer).
    seed : int, default 0 — initial weights and batch order.
    device : str, default "auto" — where it trains (auto, cpu, cuda, cuda:N; layersim.device); the fitted
        map is kept and applied on the CPU in float64.

    Attributes (after ``fit``, besides :class:`NeuralMap`'s): ``whitening_``, ``unwhitening_`` — the input's
    whitening and its inverse (d x d; the identity with ``whiten=False``); ``linear_start_`` — the linear
    layer's least-squares start (d x d, with ``linear_init="least_squares"``).

    Requires ``d_x = d_y``. ``inverse`` is exact (see the module docstring); it raises if the linear
    layer is singular (e.g. Y has a column that is constant on the training rows).
    Defaults fit n = 1,200 training rows of width 384 in about 10 s on one CPU thread.
    """

    name = "inn"

    def __init__(self, depth: int = 4, hidden: int = 256, clamp: float = 2.0, linear_init: str = "least_squares",
                 linear_learning_rate_factor: float = 0.1, whiten: bool = True,
                 steps: int = 600, learning_rate: float = 1e-3, schedule: str = "cosine", batch_size: int = 256,
                 seed: int = 0, device: str = "auto"):
        super().__init__(depth, hidden, steps, learning_rate, schedule, batch_size, seed, device)
        if not isinstance(whiten, (bool, np.bool_)):
            raise LayersimError(f"whiten must be true or false, got {whiten!r}.")
        self.whiten = bool(whiten)
        self.linear_learning_rate_factor = _non_negative_float("linear_learning_rate_factor",
                                                               linear_learning_rate_factor)
        self.clamp = _positive_float("clamp", clamp)
        if linear_init not in LINEAR_INITS:
            raise unknown_name("linear_init", linear_init, LINEAR_INITS)
        self.linear_init = linear_init

    def _check_widths(self, dx: int, dy: int) -> None:
        if dx != dy:
            raise LayersimError(f"the 'inn' map is a bijection, so x and y need equal widths, got {dx} and {dy}; "
                                "use 'linear', 'cca', 'svcca', 'pwcca' or 'mlp', or reduce the wider side first.")
        if dx < 2:
            raise LayersimError(f"the 'inn' map needs width >= 2 to split into halves, got width {dx}.")

    def _build(self, xs: np.ndarray, ys: np.ndarray) -> nn.Module:
        flow = CouplingFlow(xs.shape[1], self.depth, self.hidden, self.clamp, linear=True)
        if self.linear_init == "least_squares":  # linear_start_ comes from _network_inputs
            with torch.no_grad():
                flow.linear.weight.copy_(torch.from_numpy(self.linear_start_.T))
        return flow

    def _learning_rate_factor(self, name: str) -> float:
        return self.linear_learning_rate_factor if name.startswith("linear.") else 1.0

    @classmethod
    def _network_inputs(cls, maps: Sequence[NeuralMap], data: Sequence[tuple[np.ndarray, np.ndarray]]
                        ) -> Sequence[tuple[np.ndarray, np.ndarray]]:
        # One NetworkInput per distinct xs (a row of the layer × layer matrix shares one), whitened or not.
        known = {True: ArrayMemo(lambda xs: NetworkInput(xs, whiten=True)),
                 False: ArrayMemo(lambda xs: NetworkInput(xs, whiten=False))}
        out = []
        for fitted, (xs, ys) in zip(maps, data):
            inputs = known[fitted.whiten](xs)
            fitted.whitening_, fitted.unwhitening_ = inputs.whitening, inputs.unwhitening
            if fitted.linear_init == "least_squares":
                fitted.linear_start_ = inputs.least_squares(ys)
            out.append((inputs.rows, ys))
        return out

    def _transform(self, xs: np.ndarray) -> np.ndarray:
        return super()._transform(xs @ self.whitening_)

    @torch.no_grad()
    def _inverse(self, ys: np.ndarray) -> np.ndarray:
        singular = torch.linalg.svdvals(self.module_.linear.weight)
        if not singular[-1] > singular[0] * 1e-12:
            raise LayersimError("the INN's linear layer became singular during training, so this map has no "
                                "inverse; refit with a different seed or linear_learning_rate_factor=0.")
        return self.module_.inverse(torch.from_numpy(ys)).numpy() @ self.unwhitening_


class NetworkInput:
    """What the INN trains on for one X (standardised rows ``xs``): its whitening (see the module docstring) or the
    identity, the rows it gives, and the ridge least-squares map from those rows (the linear layer's start),
    with one factorisation shared by every Y it is solved for."""

    def __init__(self, xs: np.ndarray, whiten: bool):
        identity = np.eye(xs.shape[1])
        self.whitening, self.unwhitening = shrunk_whitening(xs) if whiten else (identity, identity)
        self.rows = xs @ self.whitening if whiten else xs
        self._factor = None

    def least_squares(self, ys: np.ndarray) -> np.ndarray:
        """``argmin ||rows M − ys||² / n + _INIT_RIDGE ||M||²`` (d x d_y)."""
        n, d = self.rows.shape
        if self._factor is None:
            self._factor = scipy.linalg.cho_factor(self.rows.T @ self.rows / n + _INIT_RIDGE * np.eye(d))
        return scipy.linalg.cho_solve(self._factor, self.rows.T @ ys / n)


def shrunk_whitening(xs: np.ndarray, shrinkage: float = _WHITENING_SHRINKAGE) -> tuple[np.ndarray, np.ndarray]:
    """``(C + r I)^(-1/2)`` and its inverse ``(C + r I)^(1/2)``, both symmetric, for standardised rows ``xs``
    with correlation ``C = xsᵀxs / n`` and shrinkage ``r``: ``xs @ first`` has (nearly) identity covariance."""
    eigenvalues, vectors = np.linalg.eigh(xs.T @ xs / xs.shape[0])
    root = np.sqrt(np.clip(eigenvalues, 0.0, None) + shrinkage)
    return (vectors / root) @ vectors.T, (vectors * root) @ vectors.T


class MLPMap(NeuralMap):
    """Ren et al.'s non-bijective sanity check: a GELU MLP trained like :class:`INNMap`.

    Parameters
    ----------
    depth : int, default 2 — hidden layers.
    hidden : int, default 512 — their width.
    steps, learning_rate, schedule, batch_size, seed, device : as for :class:`INNMap` (same defaults).

    Any widths; no inverse.
    """

    name = "mlp"

    def __init__(self, depth: int = 2, hidden: int = 512, steps: int = 600, learning_rate: float = 1e-3,
                 schedule: str = "cosine", batch_size: int = 256, seed: int = 0, device: str = "auto"):
        super().__init__(depth, hidden, steps, learning_rate, schedule, batch_size, seed, device)

    def _build(self, xs: np.ndarray, ys: np.ndarray) -> nn.Module:
        return mlp(xs.shape[1], ys.shape[1], self.depth, self.hidden)
