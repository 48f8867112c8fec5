"""Neuron-level similarities (Wu et al. 2020, §3.1–3.2 and Appendix A.1–A.2): neuronsim and mixedsim.

A representation is an array of shape ``(num_examples x hidden)``; a neuron is one column.

* **neuronsim** (after Bau et al. 2019): for each neuron ``x_k`` of ``x``, the largest absolute
  Pearson correlation with any single neuron of ``y``, ``max_k' |ρ(x_k, y_k')|``; averaged over
  the neurons of ``x``. High when the two layers have pairs of neurons that behave alike, so it
  rewards *localised* information. Asymmetric: ``neuronsim(x, y)`` averages over ``x``'s neurons.
* **mixedsim**: for each neuron ``x_k``, the multiple correlation ``R`` of the least-squares
  regression of ``x_k`` on all neurons of ``y`` with an intercept — Wu et al.'s "r-value", the
  norm of the prediction over the norm of the (centred) regressand, which for least squares is
  ``sqrt(R²)``; averaged over the neurons of ``x``. With ``Qy`` an orthonormal basis of the
  centred ``y`` (see :mod:`layersim.similarity.cca`), ``R_k = ||Qyᵀ xc_k|| / ||xc_k||``.
  Asymmetric.

Constant neurons have no correlation: they are **dropped** from ``x`` (not averaged over) and from
``y`` (never matched); the per-neuron functions report which neurons were kept. An input whose
neurons are all constant is an error.

Rank and sample size for mixedsim: the in-sample fit of a regression on ``r`` independent
directions has ``E[R²] = r / (n - 1)`` even for unrelated data, and once ``y`` spans all ``n - 1``
directions of the centred example space every neuron is fitted exactly (``R² = 1``). So mixedsim
needs ``n ≥ d_y + 2`` examples for a ``d_y``-wide ``y``, judged on the width (not the rank), so that
the same check can be made from sizes alone before any data are loaded
(:func:`check_mixedsim_sizes`, :func:`layersim.similarity.check_computable`); a narrower ``y``
raises :class:`~layersim.errors.LayersimError` up front rather than returning a meaningless 1. Keep
the number of examples well above the width of ``y``. No ridge regulariser is applied (Wu et al. use
ordinary least squares); linearly dependent neurons of ``y`` are handled by the rank truncation.

Invariances: both are invariant to permutations of either side's neurons, to translation and to
rescaling individual neurons (any non-zero factor, sign included); mixedsim also to any invertible
linear map of ``y``. Neither is invariant to rotations of ``x`` (nor neuronsim to rotations of
``y``). Bias for independent data: neuronsim ≈ ``sqrt(2 ln(2 d_y) / n)``, mixedsim ≈
``sqrt(d_y / (n - 1))``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from layersim.errors import LayersimError, unknown_name
from layersim.similarity._common import (
    centre_drop_constant,
    check_rtol,
    Named,
    named_lists,
    validated,
)
from layersim.similarity._pairs import fill_matrix
from layersim.similarity.cca import METHODS, Basis, whiten


class NeuronScores(NamedTuple):
    """Per-neuron scores of ``x`` against ``y``; constant neurons of ``x`` are left out."""

    values: np.ndarray  # (k,) float64 in [0, 1]
    neurons: np.ndarray  # (k,) int64: column index in x of each value
    matches: np.ndarray | None  # (k,) int64: neuronsim's best-matching column of y; None for mixedsim


@dataclass(frozen=True)
class Standardised:
    """One layer's non-constant neurons, centred and scaled to unit norm, and their column indices."""

    name: str
    z: np.ndarray  # (n, k)
    neurons: np.ndarray  # (k,) int64


def standardise(name: str, a: np.ndarray, measure: str) -> Standardised:
    centred, kept = centre_drop_constant(name, a, measure)
    z = centred[:, kept]
    z /= np.linalg.norm(z, axis=0)
    return Standardised(name, z, np.flatnonzero(kept))


# --- neuronsim ---


def neuronsim_per_neuron(x: np.ndarray, y: np.ndarray) -> NeuronScores:
    """For each non-constant neuron of ``x``, the largest ``|Pearson r|`` with a neuron of ``y``.

    Returns
    -------
    :class:`NeuronScores` with ``values[k] = max_j |ρ(x[:, neurons[k]], y[:, j])|`` and
    ``matches[k]`` that ``j`` (the first one on ties).

    Raises
    ------
    LayersimError
        For bad shapes, fewer than 2 rows, NaN/inf, or an input whose neurons are all constant.
    """
    checked = validated([("x", x), ("y", y)], "neuronsim")
    sx, sy = standardise(*checked[0], "neuronsim"), standardise(*checked[1], "neuronsim")
    corr = np.abs(sx.z.T @ sy.z)
    best = corr.argmax(axis=1)
    values = np.minimum(corr[np.arange(len(best)), best], 1.0)
    return NeuronScores(values, sx.neurons, sy.neurons[best])


def neuronsim(x: np.ndarray, y: np.ndarray) -> float:
    """Wu et al.'s neuronsim: the mean over ``x``'s (non-constant) neurons of the largest absolute
    Pearson correlation with any neuron of ``y``. In [0, 1]; asymmetric; 1 for ``neuronsim(x, x)``.

    See :func:`neuronsim_per_neuron` for the per-neuron values and the errors.
    """
    return float(_neuronsim([("x", x)], [("y", y)])[0, 0])


def _neuronsim_both(sx: Standardised, sy: Standardised) -> tuple[float, float]:
    corr = np.abs(sx.z.T @ sy.z)
    return min(float(corr.max(axis=1).mean()), 1.0), min(float(corr.max(axis=0).mean()), 1.0)


def neuronsim_matrix(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray] | None = None) -> np.ndarray:
    """All-pairs neuronsim: [i, j] = ``neuronsim(xs[i], ys[j])``. Each layer is standardised once;
    a pair is one product ``Zxᵀ Zy``, which for ys=None also gives the [j, i] entry."""
    return _neuronsim(*named_lists(xs, ys))


def _neuronsim(x_named: Named, y_named: Named | None) -> np.ndarray:
    checked = validated(x_named + (y_named or []), "neuronsim")
    sx = [standardise(name, a, "neuronsim") for name, a in checked[: len(x_named)]]
    sy = None if y_named is None else [standardise(name, a, "neuronsim") for name, a in checked[len(x_named) :]]
    return fill_matrix(sx, sy, lambda a, b: _neuronsim_both(a, b)[0], symmetric=False, pair_both=_neuronsim_both)


# --- mixedsim ---


@dataclass(frozen=True)
class _MixedStats:
    x: Standardised | None  # the layer as the regressand side
    y: Basis | None  # the layer as the regressor side


def check_mixedsim_sizes(num_rows: int, width: int, name: str = "y") -> None:
    """Raise a LayersimError unless mixedsim can regress on a ``width``-wide layer with ``num_rows``
    examples: a least-squares fit with intercept on ``d`` neurons is exact (R² = 1) for every
    regressand once ``d ≥ n - 1``, so mixedsim needs ``num_rows ≥ width + 2``."""
    if width >= num_rows - 1:
        raise LayersimError(
            f"mixedsim cannot be computed on n = {num_rows} examples with {name} of width d = {width}: regressing a "
            f"neuron on d neurons (and an intercept) fits exactly (R² = 1) unless n ≥ d + 2, so use at least "
            f"{width + 2} examples (e.g. a larger extract.max_examples, or None for all) or another measure "
            "(e.g. neuronsim, linear_cka or svcca)."
        )


def _regressor_basis(name: str, a: np.ndarray, method: str, rtol: float | None) -> Basis:
    n, d = a.shape
    check_mixedsim_sizes(n, d, name)  # before any work; rank <= min(d, n - 1) < n - 1 after it
    return whiten(name, a, "mixedsim", method=method, rtol=rtol)


def _mixed_values(sx: Standardised, by: Basis) -> np.ndarray:
    # ||Qᵀ z|| for unit-norm z: the norm of the least-squares prediction over the norm of z.
    return np.minimum(np.linalg.norm(by.q.T @ sx.z, axis=0), 1.0)


def mixedsim_per_neuron(
    x: np.ndarray, y: np.ndarray, *, method: str = "svd", rtol: float | None = None
) -> NeuronScores:
    """For each non-constant neuron of ``x``, the multiple correlation ``R = sqrt(R²)`` of its
    least-squares regression (with intercept) on all neurons of ``y``.

    Parameters
    ----------
    x, y : arrays of shape ``(num_examples x hidden)``, rows aligned.
    method : ``"svd"`` or ``"qr"``: how the orthonormal basis of the centred ``y`` is found.
    rtol : rank tolerance for ``y`` (see :func:`layersim.similarity.canonical_correlations`).

    Returns
    -------
    :class:`NeuronScores` (``matches`` is None).

    Raises
    ------
    LayersimError
        For bad shapes, fewer than 2 rows, NaN/inf, an all-constant input, or a ``y`` at least
        ``n - 1`` neurons wide (every fit would be exact; see the module docstring).
    """
    _check(method, rtol)
    checked = validated([("x", x), ("y", y)], "mixedsim")
    check_mixedsim_sizes(*checked[1][1].shape, "y")
    sx = standardise(*checked[0], "mixedsim")
    by = _regressor_basis(*checked[1], method, rtol)
    return NeuronScores(_mixed_values(sx, by), sx.neurons, None)


def mixedsim(x: np.ndarray, y: np.ndarray, *, method: str = "svd", rtol: float | None = None) -> float:
    """Wu et al.'s mixedsim: the mean over ``x``'s (non-constant) neurons of the multiple correlation
    of regressing that neuron on all of ``y``. In [0, 1]; asymmetric; 1 for ``mixedsim(x, x)``.

    See :func:`mixedsim_per_neuron` for the parameters and errors.
    """
    return float(_mixedsim([("x", x)], [("y", y)], method, rtol)[0, 0])


def mixedsim_matrix(
    xs: Sequence[np.ndarray],
    ys: Sequence[np.ndarray] | None = None,
    *,
    method: str = "svd",
    rtol: float | None = None,
) -> np.ndarray:
    """All-pairs mixedsim: [i, j] = ``mixedsim(xs[i], ys[j])``. Each layer is standardised (as
    regressand) and whitened (as regressor) once; a pair is one product ``Qyᵀ Zx``."""
    return _mixedsim(*named_lists(xs, ys), method, rtol)


def _mixedsim(x_named: Named, y_named: Named | None, method: str, rtol: float | None) -> np.ndarray:
    _check(method, rtol)
    checked = validated(x_named + (y_named or []), "mixedsim")
    x_checked, y_checked = checked[: len(x_named)], checked[len(x_named) :]
    both = y_named is None
    for name, a in x_checked if both else y_checked:  # every regressor layer, before any work
        check_mixedsim_sizes(*a.shape, name)
    sx = [
        _MixedStats(standardise(name, a, "mixedsim"), _regressor_basis(name, a, method, rtol) if both else None)
        for name, a in x_checked
    ]
    sy = None if both else [_MixedStats(None, _regressor_basis(name, a, method, rtol)) for name, a in y_checked]

    def pair(a: _MixedStats, b: _MixedStats) -> float:
        return float(_mixed_values(a.x, b.y).mean())

    return fill_matrix(sx, sy, pair, symmetric=False)


def _check(method: str, rtol: float | None) -> None:
    if method not in METHODS:
        raise unknown_name("regression method", method, METHODS)
    check_rtol(rtol)
