"""Neuron-matching similarities: hard and soft correlation match.

``r_kl`` is the Pearson correlation of neuron ``k`` of ``x`` with neuron ``l`` of ``y`` (constant neurons dropped,
as :mod:`layersim.similarity.neurons` does); widths ``d_x``, ``d_y`` may differ.

* **hard_correlation_match** (Li, Yosinski, Clune, Lipson & Hopcroft 2015, "Convergent learning", their bipartite
  matching; ReSi's ``hard_correlation_match``): the one-to-one matching of neurons that maximises the summed
  (signed) correlation, ``scipy.optimize.linear_sum_assignment``; the mean correlation over the ``min(d_x, d_y)``
  matched pairs, in [−1, 1]. Symmetric.
* **soft_correlation_match** (Khosla & Williams 2023, "Soft matching distance: a metric on neural representations
  that captures single-neuron tuning"): the optimal transport plan ``P ≥ 0`` with row sums ``1/d_x`` and column sums
  ``1/d_y`` maximising ``Σ P_kl r_kl``; the value ``Σ P_kl r_kl`` in [−1, 1]. On z-scored neurons
  ``‖z_k − z_l‖² = 2 − 2 r_kl`` (unit-norm centred columns), so Khosla & Williams's soft-matching distance is
  ``sqrt(2 − 2 s)`` (:func:`soft_matching_distance`) and its p-value that of ``s``. Symmetric. Solved exactly: as an
  assignment on neurons replicated to ``lcm(d_x, d_y)`` rows and columns (:func:`transport_plan`; at equal widths a
  permutation is optimal, so it equals hard_correlation_match), or the transport LP (``scipy.optimize.linprog``,
  HiGHS) when that is too large. ReSi's ``soft_correlation_match`` is not this transport but the mean of the best
  correlations in both directions (docs/peers.md).

Relation to neuronsim (Wu et al.'s, after Bau et al.): neuronsim lets every neuron of ``x`` pick its best
``|r|`` in ``y`` without constraint (many-to-one, sign ignored, averaged over ``x``: asymmetric); the soft match
constrains the same choice to a balanced transport plan and the hard match to a one-to-one pairing, both on signed
``r``. So ``soft_correlation_match(x, y) ≤ mean_k max_l r_kl ≤ neuronsim(x, y)``, with the hard match equal to the
soft one at equal widths.

Invariances: translation, permutations of either side's neurons and scaling them by positive factors (isotropic
scaling included); not rotations (a rotation mixes neurons), nor a neuron's sign flip (signed correlations).

Cost: standardising a layer ``O(n d)``; a pair the correlation product ``O(n d_x d_y)``, then the assignment
``O(d³)`` (hard; soft while ``lcm(d_x, d_y) ≤ 4096``: ``O(lcm³)``, 0.3 s at 768 × 384) or the transport LP in
``d_x d_y`` variables (soft, other widths: ~40 s at 768 × 383 on one core). Their nulls redo the matching for every permutation (the generic engine: ``permutations`` times that).
"""

from __future__ import annotations

from collections.abc import Sequence

import math

import numpy as np
import scipy.optimize
import scipy.sparse

from layersim.errors import LayersimError
from layersim.similarity._common import Named, named_lists, validated
from layersim.similarity._pairs import fill_matrix
from layersim.similarity.inference._host_engines import rows_engine
from layersim.similarity.neurons import Standardised, standardise


def _standardised(named: Named, label: str) -> list[Standardised]:
    return [standardise(name, a, label) for name, a in validated(named, label)]


def _correlations(x: Standardised, y: Standardised) -> np.ndarray:
    return np.clip(x.z.T @ y.z, -1.0, 1.0)


def _hard_value(x: Standardised, y: Standardised) -> float:
    corr = _correlations(x, y)
    rows, cols = scipy.optimize.linear_sum_assignment(corr, maximize=True)
    return float(np.clip(corr[rows, cols].mean(), -1.0, 1.0))


# Up to this many rows of the replicated square problem, the transport is solved as an assignment (transport_plan).
REPLICATED_MAX = 4096


def transport_plan(corr: np.ndarray) -> np.ndarray:
    """The ``(d_x, d_y)`` plan ``P ≥ 0``, row sums ``1/d_x``, column sums ``1/d_y``, maximising ``Σ P r`` (exact).

    Each neuron of ``x`` copied ``L/d_x`` times and each of ``y`` ``L/d_y`` times (``L = lcm(d_x, d_y)``) turns
    the plans into the ``L × L`` doubly stochastic matrices over ``L`` (spread a plan's mass evenly over the copies;
    sum the copies back), whose optimum is a permutation (Birkhoff–von Neumann): an assignment, ``O(L³)``, while
    ``L ≤ REPLICATED_MAX`` (equal widths: ``L = d``; 768 and 384: 768); the transport LP otherwise."""
    dx, dy = corr.shape
    size = dx * dy // math.gcd(dx, dy)
    if size <= REPLICATED_MAX:
        rows, cols = scipy.optimize.linear_sum_assignment(
            np.repeat(np.repeat(corr, size // dx, axis=0), size // dy, axis=1), maximize=True)
        plan = np.zeros_like(corr)
        np.add.at(plan, (rows // (size // dx), cols // (size // dy)), 1.0 / size)
        return plan
    # P flattened row-major: row k's sum picks P[k, :], column l's P[:, l].
    row_sums = scipy.sparse.kron(scipy.sparse.eye(dx), np.ones((1, dy)))
    col_sums = scipy.sparse.kron(np.ones((1, dx)), scipy.sparse.eye(dy))
    a_eq = scipy.sparse.vstack([row_sums, col_sums]).tocsr()
    b_eq = np.concatenate([np.full(dx, 1.0 / dx), np.full(dy, 1.0 / dy)])
    result = scipy.optimize.linprog(-corr.ravel(), A_eq=a_eq, b_eq=b_eq, bounds=(0, None), method="highs")
    if result.status != 0:  # a feasible, bounded LP: only a solver failure lands here
        raise LayersimError(f"soft_correlation_match: the transport LP of a {dx} x {dy} correlation matrix failed "
                            f"({result.message}); report this with the layers' sizes.")
    return result.x.reshape(dx, dy)


def _soft_value(x: Standardised, y: Standardised) -> float:
    corr = _correlations(x, y)
    return float(np.clip(np.sum(transport_plan(corr) * corr), -1.0, 1.0))


def _matrix(x_named: Named, y_named: Named | None, value, label: str) -> np.ndarray:
    stats = _standardised(x_named + (y_named or []), label)
    sx, sy = stats[: len(x_named)], (None if y_named is None else stats[len(x_named):])
    return fill_matrix(sx, sy, value, symmetric=True)


def hard_correlation_match(x: np.ndarray, y: np.ndarray) -> float:
    """Mean correlation of the neurons matched one-to-one to maximise it (Li et al. 2015), in [−1, 1]."""
    return float(_matrix([("x", x)], [("y", y)], _hard_value, "hard_correlation_match")[0, 0])


def hard_correlation_match_matrix(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray] | None = None) -> np.ndarray:
    """[i, j] = :func:`hard_correlation_match` ``(xs[i], ys[j])``; each layer standardised once."""
    return _matrix(*named_lists(xs, ys), _hard_value, "hard_correlation_match")


def soft_correlation_match(x: np.ndarray, y: np.ndarray) -> float:
    """``Σ P_kl r_kl`` of the optimal balanced transport plan (Khosla & Williams 2023), in [−1, 1]."""
    return float(_matrix([("x", x)], [("y", y)], _soft_value, "soft_correlation_match")[0, 0])


def soft_matching_distance(x: np.ndarray, y: np.ndarray) -> float:
    """Khosla & Williams's soft-matching distance between the z-scored neurons, ``sqrt(2 − 2 s)``."""
    return float(np.sqrt(max(0.0, 2.0 - 2.0 * soft_correlation_match(x, y))))


def soft_correlation_match_matrix(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray] | None = None) -> np.ndarray:
    """[i, j] = :func:`soft_correlation_match` ``(xs[i], ys[j])``; each layer standardised once."""
    return _matrix(*named_lists(xs, ys), _soft_value, "soft_correlation_match")


def _engine(label: str, value):
    def engine(x_named: Named, y_named: Named | None, cells: np.ndarray):
        validated(x_named + (y_named or []), label)
        return rows_engine(x_named, y_named, cells, lambda named: _standardised(named, label), value,
                           lambda s, perm, inverse: Standardised(s.name, s.z[perm], s.neurons))
    engine.__doc__ = f"The permutation null of {label}: the matching solved again for every permutation."
    return engine


hard_correlation_match_engine = _engine("hard_correlation_match", _hard_value)
soft_correlation_match_engine = _engine("soft_correlation_match", _soft_value)
