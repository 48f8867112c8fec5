"""Alignment errors between a mapped representation ``ŷ = g(x)`` and the target ``y``, and the
train/test split of rows that keeps the error honest.

* ``mse(ŷ, y) = mean_{i,j} (ŷ_ij − y_ij)²`` — Ren et al. 2023's "L2 distance" δ (their code takes
  ``torch.nn.MSELoss`` of the mapped and target representations), in y's units.
* ``relative_error(ŷ, y) = ||ŷ − y||_F / ||y − ȳ||_F`` with ``ȳ`` the column means of the rows
  given: 0 is a perfect map, 1 is no better than predicting each column's mean; unit-free, so
  layers and models with different activation scales are comparable (Ren et al.'s "relative
  reconstruction error").
"""

from __future__ import annotations

import numpy as np

from layersim.align.base import as_matrix
from layersim.errors import LayersimError


def _pair(y_hat: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    y_hat, y = as_matrix(y_hat, "y_hat"), as_matrix(y, "y")
    if y_hat.shape != y.shape:
        raise LayersimError(f"y_hat has shape {y_hat.shape} but y has shape {y.shape}; they must match.")
    return y_hat, y


def mse(y_hat: np.ndarray, y: np.ndarray) -> float:
    """Mean squared error over all entries of two ``(num_examples x hidden)`` arrays (float64)."""
    y_hat, y = _pair(y_hat, y)
    return float(np.mean((y_hat - y) ** 2))


def relative_error(y_hat: np.ndarray, y: np.ndarray) -> float:
    """``||ŷ − y||_F / ||y − mean(y)||_F`` (means per column, over the given rows).

    Raises
    ------
    LayersimError
        If the shapes differ, or ``y`` is constant over its rows (the denominator is 0).
    """
    y_hat, y = _pair(y_hat, y)
    spread = np.linalg.norm(y - y.mean(axis=0))
    if spread == 0.0:
        raise LayersimError("y is constant over its rows, so the relative error is undefined; "
                            "use mse, or more than one distinct row.")
    return float(np.linalg.norm(y_hat - y) / spread)


def train_test_split_rows(num_rows: int, test_fraction: float = 0.2, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A seeded random split of ``range(num_rows)`` into disjoint, sorted (train, test) index arrays.

    The test part has ``round(test_fraction · num_rows)`` rows, at least 1 and leaving at least 2
    for training.

    Raises
    ------
    LayersimError
        If ``num_rows < 3`` or ``test_fraction`` is not in (0, 1).
    """
    if isinstance(num_rows, bool) or not isinstance(num_rows, (int, np.integer)) or num_rows < 3:
        raise LayersimError(f"num_rows must be an integer >= 3 (2 training rows and 1 test row), got {num_rows!r}.")
    if isinstance(test_fraction, bool) or not isinstance(test_fraction, (int, float)) or not 0.0 < test_fraction < 1.0:
        raise LayersimError(f"test_fraction must be a number in (0, 1), got {test_fraction!r}.")
    num_test = min(max(1, round(test_fraction * num_rows)), num_rows - 2)
    order = np.random.default_rng(seed).permutation(num_rows)
    return np.sort(order[num_test:]), np.sort(order[:num_test])
