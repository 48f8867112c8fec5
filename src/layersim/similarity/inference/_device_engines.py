"""The device engines of the permutation null (:mod:`layersim.similarity.inference._null_engines` builds one per
measure): the batched torch machinery behind them.

* :class:`ProductEngine`: the y-side matrices of all layers stacked into one ``(n, Σ b_j)`` array, permuted once per
  permutation, and each x layer's ``A_iᵀ B[π]`` one GEMM against the whole stack; each cell then reduces its block.
* :class:`KernelEngine`: ``<K_i, L_j[π][:, π]>`` as ``<K_i[σ][:, σ], L_j>`` with ``σ = π⁻¹``, the side with fewer
  kernels in the requested cells gathered (one flat index per permutation), on the kernels' upper triangles.

Float64 torch on the analysis device (:func:`layersim.compute.device.analysis_on`), a batch of permutations at a time.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from layersim.compute.threads import on_threads
from layersim.errors import LayersimError

# A cell's reduction of its blocks: (i, j, blocks of shape (P, a_i, b_j)) -> the P values, as a tensor.
Reduce = Callable[[int, int, "torch.Tensor"], "torch.Tensor"]
# A whole-matrix finish of raw per-cell values (P, rows, cols), given the permutations (P, n) or None.
Finish = Callable[["torch.Tensor", "torch.Tensor | None"], "torch.Tensor"]


class _Torch:
    """torch, imported at its first use here (an engine built): the stages that only name the measures (the gate, the
    downloads, summary, report) start without it."""

    def __getattr__(self, name: str):
        import torch as module

        return getattr(module, name)


torch = _Torch()


def analysis_device():
    from layersim.compute.device import analysis_device as current

    return current()


def _offsets(widths) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(widths)]).astype(np.int64)


def on_device(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """A float64 copy of `a` on `device` (the engines' only precision)."""
    return torch.as_tensor(np.ascontiguousarray(a, dtype=np.float64), device=device)


class _Engine:
    """Base: the boolean ``cells`` mask and the ``values(perm)`` / ``values_batch(perms)`` contract (a subclass
    defines one of the two)."""

    def __init__(self, cells: np.ndarray):
        self.cells = cells
        self.rows = np.flatnonzero(cells.any(axis=1))
        self.cols = np.flatnonzero(cells.any(axis=0))

    def values(self, perm: np.ndarray | None) -> np.ndarray:
        return self.values_batch(None if perm is None else np.asarray(perm)[None])[0]

    def values_batch(self, perms: np.ndarray | None) -> np.ndarray:
        """``(P, len(xs), len(ys))`` for the ``P`` rows of `perms` (``(1, …)`` for None: the observed matrix)."""
        if perms is None:
            return self.values(None)[None]
        return np.stack([self.values(perm) for perm in perms])

    def bytes_per_permutation(self) -> float:
        """Device memory one permutation of a batch takes (0: the engine computes one at a time)."""
        return 0.0


class _DeviceEngine(_Engine):
    """An engine whose per-permutation work is torch on the analysis device: ``raw(perms)`` gives the
    ``(P, rows, cols)`` tensor there (NaN outside the cells); one copy back to the host per batch."""

    def __init__(self, cells: np.ndarray):
        super().__init__(cells)
        self.device = analysis_device()
        # Index tensors made once, not per batch of permutations.
        self._outside = torch.as_tensor(~cells, device=self.device)
        self._rows_t = torch.as_tensor(self.rows, device=self.device)
        self._cols_t = torch.as_tensor(self.cols, device=self.device)

    def values_batch(self, perms: np.ndarray | None) -> np.ndarray:
        index = None if perms is None else torch.as_tensor(np.asarray(perms, dtype=np.int64), device=self.device)
        out = self.raw(index)
        out[:, self._outside] = torch.nan
        return out.cpu().numpy()

    def raw(self, perms: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError

    def _empty(self, count: int) -> torch.Tensor:
        return torch.full((count, *self.cells.shape), torch.nan, dtype=torch.float64, device=self.device)


class ProductEngine(_DeviceEngine):
    """Cells from the blocks ``A_iᵀ B_j[π]``: x-side matrices ``a[i]`` (n, a_i), y-side ``b[j]``; ``reduce`` takes a
    cell's blocks for a batch of permutations, ``(P, a_i, b_j)``, to its ``P`` values."""

    def __init__(self, cells: np.ndarray, a: list[np.ndarray], b: list[np.ndarray], reduce: Reduce):
        super().__init__(cells)
        self.a = {int(i): on_device(a[i], self.device) for i in self.rows}  # only the layers a cell uses
        # Only the y layers a cell uses are stacked, permuted and multiplied.
        self.stack = on_device(np.concatenate([b[j] for j in self.cols], axis=1), self.device)
        offsets = _offsets([b[j].shape[1] for j in self.cols])
        self.span = {int(j): (offsets[k], offsets[k + 1]) for k, j in enumerate(self.cols)}
        self.reduce = reduce

    def bytes_per_permutation(self) -> float:
        n, width = self.stack.shape
        widest = max((a.shape[1] for a in self.a.values()), default=0)
        return 8.0 * (n + widest) * width  # the permuted stack and one row layer's products with it

    def raw(self, perms: torch.Tensor | None) -> torch.Tensor:
        bp = self.stack.unsqueeze(0) if perms is None else self.stack[perms]  # (P, n, Σ b_j)
        out = self._empty(len(bp))

        def row(i: int) -> torch.Tensor:
            js = np.flatnonzero(self.cells[i])
            at = self.a[i].T
            spans = [self.span[int(j)] for j in js]
            if 2 * len(js) > len(self.cols):
                prod = torch.matmul(at, bp)  # one batched GEMM against every stacked y layer at once
                blocks = [prod[:, :, start:stop] for start, stop in spans]
            else:
                blocks = [torch.matmul(at, bp[:, :, start:stop]) for start, stop in spans]
            return torch.stack([self.reduce(i, int(j), blk) for j, blk in zip(js, blocks)], dim=1)

        # On the CPU the rows run side by side, each single-threaded (layersim.compute.threads): the same values
        # whatever the number of threads, and no BLAS threads waiting on each other; a GPU takes them in turn.
        rows = [int(i) for i in self.rows]
        found = on_threads(row, rows) if self.device.type == "cpu" else {i: row(i) for i in rows}
        for i, values in found.items():
            out[:, i, torch.as_tensor(np.flatnonzero(self.cells[i]), device=self.device)] = values
        return out


class KernelEngine(_DeviceEngine):
    """Cells from ``<K_i, L_j[π][:, π]>_F`` of centred ``n x n`` kernels, then ``finish(inner, perms)``.

    ``<K, L[π][:, π]> = <K[σ][:, σ], L>`` with ``σ = π⁻¹``, so a permutation gathers the kernels of whichever side
    has fewer in the requested cells (the x side's by ``σ`` or the y side's by ``π``), each through one flat index
    per permutation shared by every kernel. The kernels are symmetric, so only the upper triangles are gathered and
    multiplied (the other side's off-diagonal entries counted twice): half the gather, the cost (memory-bound), and
    half the product."""

    def __init__(self, cells: np.ndarray, kx: np.ndarray, ky: np.ndarray, finish: Finish):
        super().__init__(cells)
        n = kx.shape[-1]
        self.n = n
        self.permute_x = len(self.rows) < len(self.cols)
        upper_a, upper_b = np.triu_indices(n)
        twice = np.where(upper_a == upper_b, 1.0, 2.0)
        kept, other = (kx[self.rows], ky[self.cols]) if self.permute_x else (ky[self.cols], kx[self.rows])
        for kernels in (kept, other):  # the triangles stand for the whole kernels only if they are symmetric
            asymmetry = np.abs(kernels - kernels.transpose(0, 2, 1)).max(initial=0.0)
            if asymmetry > 1e-9 * max(np.abs(kernels).max(initial=0.0), 1e-300):
                raise LayersimError(f"the kernel engine needs symmetric n x n kernels; these differ from their "
                                    f"transposes by up to {asymmetry:.3g}.")
        self.gathered_side = on_device(kept.reshape(len(kept), n * n), self.device)  # whole: gathered by index
        self.other_side = on_device(other[:, upper_a, upper_b] * twice, self.device)  # (kernels, n(n + 1)/2)
        self.upper = (torch.as_tensor(upper_a, device=self.device), torch.as_tensor(upper_b, device=self.device))
        self.finish = finish

    def bytes_per_permutation(self) -> float:
        # The gathered triangles and their flat index.
        return 8.0 * (len(self.gathered_side) + 1) * self.n * (self.n + 1) / 2

    def raw(self, perms: torch.Tensor | None) -> torch.Tensor:
        count = 1 if perms is None else len(perms)
        if perms is None:
            moved = torch.arange(self.n, device=self.device)[None]
        else:
            moved = torch.argsort(perms, dim=1) if self.permute_x else perms  # σ = π⁻¹ for the x side
        rows, cols = self.upper
        flat = (moved[:, rows] * self.n + moved[:, cols]).reshape(-1)  # entry (a, b), a ≤ b, of K[σ][:, σ]
        side = self.gathered_side
        gathered = side.index_select(1, flat).reshape(len(side) * count, -1)  # (kernel, permutation) rows
        products = torch.matmul(gathered, self.other_side.T).reshape(len(side), count, -1)  # (kernels, P, others)
        products = products.transpose(0, 1) if self.permute_x else products.permute(1, 2, 0)
        inner = self._empty(count)
        inner[:, self._rows_t[:, None], self._cols_t[None, :]] = products
        return self.finish(inner, perms)


def _sum_of_squares(i: int, j: int, blocks: torch.Tensor) -> torch.Tensor:
    return blocks.square().sum(dim=(-2, -1))
