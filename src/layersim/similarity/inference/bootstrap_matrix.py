"""Bootstrap intervals for every cell of a layer × layer similarity matrix.

::

    bootstrap_matrix("linear_cka", layers)                  # (L, L) low/high per cell, 200 resamples
    bootstrap_matrix("svcca", ft_layers, orig_layers, groups=example_ids)

The resamples, jackknife blocks, interval methods and the CCA measures' fixed dimension cap are those of
:func:`layersim.similarity.inference.bootstrap.bootstrap_pairs`, whose module docstring says what the intervals are.

Linear CKA costs about one matrix per resample, whatever the number of cells: a resample that draws row
``a`` ``w_a`` times is a weighting of the distinct rows, and every HSIC it needs is a block of the weighted
cross-covariance ``Bᵀ B`` of the stacked layers, ``B = √w ⊙ (Z − 1 μ_wᵀ)`` over the ~63% of rows drawn
(one syrk for the whole matrix; :func:`weighted_cka`). Few rows and wide layers take the sample-space form
instead: each layer's centred Gram is computed once, and a resample re-centres it with the weights on the
drawn rows and takes all inner products in one product, ``O(L² n²)`` with no ``d`` at all. The other
measures recompute the matrix on the resampled rows (``similarity_matrix``), so their cost is one matrix
per resample; k-NN Jaccard, RSA and the neighbourhood measures are told which rows are copies of one example and
leave them out (:func:`~layersim.similarity.inference.bootstrap.resampled_options`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from layersim.errors import LayersimError
from layersim.similarity._cka_kernels import GRAM_BYTES_LIMIT, _add_panel, _normalise, _panel_hsic, _panels, _product_dtype
from layersim.similarity._common import blas_threads_for, centre
from layersim.similarity.inference.bootstrap import (BootstrapResult, _group_members, check_arguments, finish, fixed_cap,
                                           jackknife_rows, resample_rows, resampled,
                                           resampled_options)
from layersim.similarity.cka import is_constant
from layersim.similarity.registry import get_measure

# A layer whose weighted self-HSIC falls below this share of its full-sample one is constant on the resample.
CONSTANT_SHARE = 1e-20


def bootstrap_matrix(name: str, xs: Sequence[np.ndarray], ys: Sequence[np.ndarray] | None = None, *,
                     resamples: int = 200, seed: int = 0, groups: np.ndarray | None = None, level: float = 0.95,
                     interval: str = "auto", **options) -> BootstrapResult:
    """The bootstrap interval of every cell of ``similarity_matrix(name, xs, ys, **options)``.

    Returns a :class:`~layersim.similarity.inference.bootstrap.BootstrapResult` whose ``estimate``, ``low``, ``high``
    and ``centre`` are ``(len(xs), len(ys))`` (``len(xs)`` squared for ``ys=None``) and ``values`` is
    ``(resamples, len(xs), len(ys))``; the resamples are those of ``bootstrap_pairs`` with the same seed and
    groups. A layer constant on all rows gets NaN cells; one constant on a resample, NaN there.
    """
    options, interval = check_arguments(name, options, resamples, level, interval)
    if not len(xs) or (ys is not None and not len(ys)):
        raise LayersimError("bootstrap_matrix needs at least one x layer and, when ys is given, one y layer.")
    num_rows = len(xs[0])
    if any(len(a) != num_rows for a in (*xs, *(ys or ()))):
        raise LayersimError("bootstrap_matrix needs every layer on the same examples (the same number of rows).")
    if groups is not None:
        _group_members(num_rows, groups)  # refused before any work
    options = fixed_cap(name, options, num_rows)
    if name == "linear_cka" and not options:
        compute = WeightedCKA(xs, ys)
    else:
        compute = _Recomputed(name, xs, ys, options, groups)
    estimate = compute(None)
    with blas_threads_for(num_rows, max(a.shape[1] for a in (*xs, *(ys or ())))):
        values = np.stack([compute(np.bincount(rows, minlength=num_rows))
                           for rows in resample_rows(num_rows, resamples, seed, groups)])
        jackknife = None if interval != "bca" else np.stack(
            [compute(np.bincount(rows, minlength=num_rows)) for rows in jackknife_rows(num_rows, seed, groups)])
    return finish(name, estimate, values, jackknife, level, interval)


class WeightedCKA:
    """Linear CKA between ``xs`` and ``ys`` (None: ``xs``) on the rows drawn ``counts`` times each, every cell
    from one product (see the module docstring); ``counts=None`` is every row once."""

    def __init__(self, xs: Sequence[np.ndarray], ys: Sequence[np.ndarray] | None):
        index: dict[int, int] = {}
        for a in (*xs, *(ys or ())):  # the distinct arrays, by identity, as the pairs bootstrap does
            index.setdefault(id(a), len(index))
        arrays = {index[id(a)]: a for a in (*xs, *(ys or ()))}
        self.defined = [k for k in range(len(index)) if not is_constant(arrays[k])]
        position = {k: p for p, k in enumerate(self.defined)}
        self.x = [position.get(index[id(a)], -1) for a in xs]
        self.y = self.x if ys is None else [position.get(index[id(a)], -1) for a in ys]
        layers = [arrays[k] for k in self.defined]
        self.n = n = len(xs[0])
        widths = [a.shape[1] for a in layers]
        # Per resample: gram re-centres L Grams and takes their L²/2 inner products; feature one syrk.
        self.gram = bool(layers) and 8.0 * len(layers) * n * n <= GRAM_BYTES_LIMIT / 2 and \
            (len(layers) ** 2 / 2 + 6 * len(layers)) * n * n < n * sum(widths) ** 2 / 2
        centred = [centre(f"layer {k}", a, "CKA") for k, a in enumerate(layers)]
        if self.gram:
            self.grams = np.stack([c @ c.T for c in centred])
        else:
            self.offsets = np.concatenate([[0], np.cumsum(widths)]).astype(np.int64)
            self.stacked = np.concatenate(centred, axis=1) if layers else np.zeros((n, 0))
            self.dtype = _product_dtype("auto", layers, n * float(sum(widths)) ** 2 / 2)
        self.full_self = np.diag(self._hsic(None)) if layers else np.zeros(0)

    def __call__(self, counts: np.ndarray | None) -> np.ndarray:
        square = np.full((len(self.defined) + 1,) * 2, np.nan)  # the last row and column: undefined layers
        if self.defined:
            hsic = self._hsic(counts)
            self_terms = np.diag(hsic).copy()
            constant = self_terms <= CONSTANT_SHARE * self.full_self
            with np.errstate(divide="ignore", invalid="ignore"):
                cka = _normalise(hsic, self_terms, self_terms, True)
            cka[constant] = np.nan
            cka[:, constant] = np.nan
            square[:-1, :-1] = cka
        return square[np.ix_(self.x, self.y)]

    def _hsic(self, counts: np.ndarray | None) -> np.ndarray:
        """Unnormalised HSIC of every pair of defined layers (upper triangle at least) on the weighted rows."""
        drawn = slice(None) if counts is None else counts > 0
        weights = np.ones(self.n) if counts is None else counts[drawn]
        roots, total = np.sqrt(weights), weights.sum()
        if self.gram:
            # One copy of the drawn rows' Grams, then in place: these passes over L·m² entries are the cost.
            picked = np.flatnonzero(drawn) if counts is not None else np.arange(self.n)
            kernels = self.grams.take(picked, axis=1).take(picked, axis=2)
            rows = kernels @ weights / total  # the weighted mean of each Gram row
            kernels -= rows[:, :, None]
            kernels -= rows[:, None, :] - (rows @ weights / total)[:, None, None]
            kernels *= np.outer(roots, roots)
            scaled = kernels.reshape(len(kernels), -1)
            return scaled @ scaled.T  # syrk
        z = self.stacked[drawn]
        b = ((z - weights @ z / total) * roots[:, None]).astype(self.dtype)
        hsic = np.zeros((len(self.defined),) * 2)
        offsets = self.offsets
        for first, stop in _panels(offsets):
            panel = np.empty((offsets[stop] - offsets[first], offsets[-1] - offsets[first]))
            _add_panel(panel, b, offsets[first], offsets[stop], overwrite=True)
            _panel_hsic(hsic, panel, offsets, first, stop)
        return hsic


class _Recomputed:
    """Any measure's matrix recomputed on the resampled rows (layers constant there give NaN cells)."""

    def __init__(self, name: str, xs: Sequence[np.ndarray], ys: Sequence[np.ndarray] | None, options: dict,
                 groups: np.ndarray | None = None):
        self.name, self.xs, self.ys, self.options = name, list(xs), None if ys is None else list(ys), options
        self.groups = groups

    def __call__(self, counts: np.ndarray | None) -> np.ndarray:
        rows = np.arange(len(self.xs[0])) if counts is None else np.repeat(np.arange(len(counts)), counts)
        xs = self.xs if counts is None else resampled(self.name, self.xs, rows)
        ys = xs if self.ys is None else self.ys if counts is None else resampled(self.name, self.ys, rows)
        options = self.options if counts is None else resampled_options(self.name, self.options, rows, self.groups)
        ok_x = [k for k, a in enumerate(xs) if not is_constant(a)]
        ok_y = ok_x if self.ys is None else [k for k, a in enumerate(ys) if not is_constant(a)]
        out = np.full((len(xs), len(ys)), np.nan)
        if ok_x and ok_y:  # options checked by check_arguments; `sources` is the resample's, not a user's
            out[np.ix_(ok_x, ok_y)] = get_measure(self.name).matrix(
                [xs[k] for k in ok_x], None if self.ys is None else [ys[k] for k in ok_y], **options)
        return out
