"""The permutation-null engines that run on the host, one permutation at a time, for measures whose per-pair work is
no product of per-layer matrices (:mod:`~layersim.similarity.inference._null_engines` holds the contract and the
batched device engines)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from layersim.similarity._common import Named
from layersim.similarity.inference._device_engines import _Engine


class RowsEngine(_Engine):
    """The generic engine, for measures whose per-pair work is no product of per-layer matrices (an optimal matching,
    a rotation followed by per-row cosines): every layer's statistics once, as the others, then per permutation the
    y-side statistics row-permuted (``permute(stats, perm, inverse)``: rows reordered, any stored row indices
    relabelled through ``inverse``, the inverse permutation, as the neighbourhood measures' lists need) and
    ``pair(sx, sy)`` recomputed for each requested cell, on the host, one permutation at a time. Exactly the measure on ``ys[j][π]`` (tests/test_device_null.py), at the
    cost of ``permutations`` times the pair work: block permutations (whole examples) need nothing more, since the
    drawn ``π`` is applied as given."""

    def __init__(self, cells: np.ndarray, x_stats: list, y_stats: list, pair: Callable, permute: Callable):
        super().__init__(cells)
        self.x_stats, self.y_stats, self.pair, self.permute = x_stats, y_stats, pair, permute

    def values(self, perm: np.ndarray | None) -> np.ndarray:
        out = np.full(self.cells.shape, np.nan)
        if perm is not None:
            perm = np.asarray(perm)
            inverse = np.empty_like(perm)
            inverse[perm] = np.arange(len(perm))
        for j in self.cols:
            sy = self.y_stats[j] if perm is None else self.permute(self.y_stats[j], perm, inverse)
            for i in np.flatnonzero(self.cells[:, j]):
                out[i, j] = self.pair(self.x_stats[i], sy)
        return out


def rows_engine(x_named: Named, y_named: Named | None, cells: np.ndarray, stats: Callable, pair: Callable,
                permute: Callable) -> RowsEngine:
    """A :class:`RowsEngine` whose statistics ``stats(named) -> list`` are computed for the layers a cell uses only
    (None for the others)."""
    rows, cols = set(np.flatnonzero(cells.any(axis=1)).tolist()), set(np.flatnonzero(cells.any(axis=0)).tolist())
    used_x = [item for k, item in enumerate(x_named) if k in rows or (y_named is None and k in cols)]
    computed = dict(zip([name for name, _ in used_x], stats(used_x))) if used_x else {}
    x_stats = [computed.get(name) for name, _ in x_named]
    if y_named is None:
        return RowsEngine(cells, x_stats, x_stats, pair, permute)
    used_y = [item for k, item in enumerate(y_named) if k in cols]
    computed_y = dict(zip([name for name, _ in used_y], stats(used_y))) if used_y else {}
    return RowsEngine(cells, x_stats, [computed_y.get(name) for name, _ in y_named], pair, permute)


class RecomputedEngine(_Engine):
    """The generic engine of a measure without one of its own: ``matrix(xs, ys[π])`` recomputed from the rows for
    every permutation (each y layer's statistics redone per draw, so a null costs ``permutations`` matrices). Exact
    for any measure; the registry gives it to every measure that declares no ``null_engine``."""

    def __init__(self, matrix: Callable, x_named: Named, y_named: Named | None, cells: np.ndarray, options: dict):
        super().__init__(cells)
        self.matrix, self.options = matrix, options
        self.xs = [np.asarray(a) for _, a in x_named]
        self.ys = self.xs if y_named is None else [np.asarray(a) for _, a in y_named]
        self.values(None)  # the measure's own input errors, before any permutation is drawn

    def values(self, perm: np.ndarray | None) -> np.ndarray:
        out = np.full(self.cells.shape, np.nan)
        if not self.cells.any():
            return out
        xs = [self.xs[i] for i in self.rows]
        ys = [self.ys[j] if perm is None else self.ys[j][perm] for j in self.cols]
        out[np.ix_(self.rows, self.cols)] = self.matrix(xs, ys, **self.options)
        out[~self.cells] = np.nan
        return out


def recomputed_engine(matrix: Callable) -> Callable[..., _Engine]:
    """An ``ENGINES`` entry for a measure whose matrix function is ``matrix``: :class:`RecomputedEngine`."""
    return lambda x_named, y_named, cells, **options: RecomputedEngine(matrix, x_named, y_named, cells, options)
