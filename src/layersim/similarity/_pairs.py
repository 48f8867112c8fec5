"""The all-pairs loop shared by the matrix functions: per-layer statistics in, a matrix out.

Each measure splits its work into ``stats(layer)`` — everything that depends on one layer only
(centred data, orthonormal bases, standardised neurons, kernels), computed once per layer — and a
cheap ``pair(stats_x, stats_y)``. This module only arranges the pairs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def fill_matrix(
    x_stats: Sequence[Any],
    y_stats: Sequence[Any] | None,
    pair: Callable[[Any, Any], float],
    *,
    symmetric: bool,
    pair_both: Callable[[Any, Any], tuple[float, float]] | None = None,
) -> np.ndarray:
    """Entry [i, j] = ``pair(x_stats[i], y_stats[j])``.

    ``y_stats`` None compares the x layers with themselves: the diagonal is exactly 1 (every
    measure here gives 1 for a layer against itself), a symmetric measure computes the upper
    triangle and mirrors it, an asymmetric one computes both directions of each unordered pair —
    with one call of ``pair_both`` (returning ``(value_ij, value_ji)``) when the measure can share
    the work between the two directions.
    """
    if y_stats is not None:
        out = np.empty((len(x_stats), len(y_stats)))
        for i, sx in enumerate(x_stats):
            for j, sy in enumerate(y_stats):
                out[i, j] = pair(sx, sy)
        return out
    num = len(x_stats)
    out = np.empty((num, num))
    np.fill_diagonal(out, 1.0)
    for i in range(num):
        for j in range(i + 1, num):
            if symmetric:
                out[i, j] = out[j, i] = pair(x_stats[i], x_stats[j])
            elif pair_both is not None:
                out[i, j], out[j, i] = pair_both(x_stats[i], x_stats[j])
            else:
                out[i, j] = pair(x_stats[i], x_stats[j])
                out[j, i] = pair(x_stats[j], x_stats[i])
    return out
