"""ReSi's difference statistics (Klabunde et al. 2025, their ``statistics.py``): the magnitude, concentricity and
uniformity differences, as similarities.

Each compares one number per layer, a summary of its rows, so the pairing of examples between the two layers plays
no part: **there is no permutation null** (shuffling the rows of ``y`` leaves every summary, and so the value,
unchanged: the null would be a point mass at the observed value), nor a bootstrap interval here; the registry
marks them (``Measure.no_null``) and the stages say "no null: a difference of summaries" instead of computing one.

Summaries of a layer ``R`` (``n × d``, rows ``r_i``, mean row ``r̄``), on the data as given (not centred):

* magnitude ``‖r̄‖₂``, the length of the mean row (ReSi's ``magnitude_difference``); invariant to rotations and
  permutations of neurons, not to translation or scaling;
* concentricity ``(1/n) Σ_i cos(r_i, r̄)`` (a zero row counts as cosine 0, as scikit-learn's cosine distance
  gives); invariant to rotations, permutations and isotropic scaling, not to translation;
* uniformity ``log((1/n²) Σ_{i,j} exp(−2 ‖r_i − r_j‖²))`` (Wang & Isola 2020's with t = 2, on the raw rows and
  with the ``i = j`` terms, as ReSi); invariant to rotations, permutations and translation, not to scaling. On rows
  far apart (squared distances ≳ 20, typical of raw transformer states) every off-diagonal term underflows and
  every layer's uniformity is ``log(1/n)``: the difference is then 0 whatever the layers.

The difference ``δ = |summary(x) − summary(y)|`` is reported as the similarity ``1 / (1 + δ)`` in (0, 1], 1 for
equal summaries, decreasing in δ (``δ = 1/s − 1``, :func:`summary_difference`).

Cost: magnitude and concentricity ``O(n d)`` per layer, uniformity ``O(n² d)`` (pairwise distances, a block of
rows at a time: memory ``O(block · n)``); a pair is a subtraction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from scipy.special import logsumexp

from layersim.similarity._common import Named, centre, named_lists, validated
from layersim.similarity._pairs import fill_matrix

NO_NULL = ("no null: a difference of summaries (one number per layer, which a permutation of the examples leaves "
           "unchanged), so neither a permutation null nor a bootstrap interval is computed")

UNIFORMITY_T = 2.0  # Wang & Isola's (and ReSi's) temperature
_BLOCK_ROWS = 1024


def magnitude(a: np.ndarray) -> float:
    """``‖r̄‖₂``: the length of the mean row."""
    return float(np.linalg.norm(np.asarray(a, dtype=np.float64).mean(axis=0)))


def concentricity(a: np.ndarray) -> float:
    """``(1/n) Σ_i cos(r_i, r̄)``: the mean cosine of the rows with their mean (0 for a zero row)."""
    a = np.asarray(a, dtype=np.float64)
    mean = a.mean(axis=0)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(mean)
    cos = np.divide(a @ mean, norms, out=np.zeros(len(a)), where=norms > 0)
    return float(np.mean(cos))


def uniformity(a: np.ndarray) -> float:
    """``log((1/n²) Σ_{i,j} exp(−t ‖r_i − r_j‖²))``, t = 2, by log-sum-exp a block of rows at a time."""
    a = np.asarray(a, dtype=np.float64)
    sq = np.einsum("ij,ij->i", a, a)
    blocks = []
    for start in range(0, len(a), _BLOCK_ROWS):
        part = a[start : start + _BLOCK_ROWS]
        dist = np.maximum(sq[start : start + _BLOCK_ROWS, None] + sq[None, :] - 2.0 * part @ a.T, 0.0)
        blocks.append(logsumexp(-UNIFORMITY_T * dist))
    return float(logsumexp(blocks) - 2.0 * np.log(len(a)))


SUMMARIES: dict[str, Callable[[np.ndarray], float]] = {
    "magnitude_difference": magnitude,
    "concentricity_difference": concentricity,
    "uniformity_difference": uniformity,
}


def _summaries(named: Named, measure: str) -> list[float]:
    out = []
    for name, a in validated(named, measure):
        centre(name, a, measure)  # a layer the same for every example is refused, as by every measure
        out.append(SUMMARIES[measure](a))
    return out


def _similarity(a: float, b: float) -> float:
    return 1.0 / (1.0 + abs(a - b))


def summary_difference(measure: str, x: np.ndarray, y: np.ndarray) -> float:
    """ReSi's difference ``|summary(x) − summary(y)|`` for `measure`, one of :data:`SUMMARIES`."""
    a, b = _summaries([("x", x), ("y", y)], measure)
    return abs(a - b)


def _pair(measure: str):
    def pair(x: np.ndarray, y: np.ndarray) -> float:
        a, b = _summaries([("x", x), ("y", y)], measure)
        return _similarity(a, b)
    pair.__doc__ = f"``1 / (1 + |δ|)`` of the {measure.replace('_', ' ')} of the two layers (module docstring)."
    return pair


def _matrix(measure: str):
    def matrix(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray] | None = None) -> np.ndarray:
        x_named, y_named = named_lists(xs, ys)
        values = _summaries(x_named + (y_named or []), measure)
        sx, sy = values[: len(x_named)], (None if y_named is None else values[len(x_named):])
        return fill_matrix(sx, sy, _similarity, symmetric=True)
    matrix.__doc__ = f"[i, j] = the {measure.replace('_', ' ')} similarity of ``(xs[i], ys[j])``; one summary per layer."
    return matrix


magnitude_difference, magnitude_difference_matrix = _pair("magnitude_difference"), _matrix("magnitude_difference")
concentricity_difference, concentricity_difference_matrix = (_pair("concentricity_difference"),
                                                             _matrix("concentricity_difference"))
uniformity_difference, uniformity_difference_matrix = _pair("uniformity_difference"), _matrix("uniformity_difference")
