"""Numerical pieces shared by the similarity measures, the alignment maps and the task heads: the rank
rule, the SVCCA variance rule, thin SVDs, canonical pairs, the train-row standardiser, and how many
threads NumPy's BLAS may use.

One home for each, so "rank", "SVCCA" and "standardised" mean the same thing in
:mod:`layersim.similarity` (which compares bases of the examples' space) and :mod:`layersim.align`
(which needs directions in feature space to build a map).
"""

from __future__ import annotations

import numpy as np
from threadpoolctl import threadpool_limits

from layersim.errors import LayersimError

_EPS = float(np.finfo(np.float64).eps)


def default_rtol(num_examples: int, width: int) -> float:
    """Relative singular-value tolerance below which a direction counts as absent (rank deficiency).

    NumPy's ``matrix_rank`` rule for float64 arithmetic: ``max(n, d) · eps``.
    """
    return max(num_examples, width) * _EPS


def numerical_rank(singular_values: np.ndarray, rtol: float) -> int:
    """How many of the (descending) ``singular_values`` exceed ``rtol`` times the largest."""
    s = np.asarray(singular_values)
    if s.size == 0 or not s[0] > 0:
        return 0
    return int(np.count_nonzero(s > rtol * s[0]))


def variance_rank(singular_values: np.ndarray, variance_threshold: float) -> int:
    """The SVCCA variance rule (Raghu et al. 2017): the *fewest* top principal components whose
    squared singular values reach ``variance_threshold`` of the total (at least one; a threshold of
    1.0 keeps every one given). Wu et al.'s code keeps those strictly below it, one fewer."""
    explained = np.cumsum(np.asarray(singular_values, dtype=np.float64) ** 2)
    if explained.size == 0:
        return 0
    return min(explained.size, int(np.searchsorted(explained, variance_threshold * explained[-1])) + 1)


def thin_svd(a: np.ndarray, rtol: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``a = Q diag(S) Rᵀ`` truncated to the numerical rank (:func:`default_rtol` unless given);
    returns (Q, S, R), with zero columns for a zero matrix."""
    q, s, rt = np.linalg.svd(a, full_matrices=False)
    rank = numerical_rank(s, default_rtol(*a.shape) if rtol is None else rtol)
    return q[:, :rank], s[:rank], rt[:rank].T


def canonical_pairs(q_x: np.ndarray, q_y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CCA between two orthonormal bases of the examples' space (``n x r_x``, ``n x r_y``):
    ``q_xᵀ q_y = A diag(ρ) Bᵀ``. Returns (A, ρ, Bᵀ), ρ descending and clipped to [0, 1]; the canonical
    variates are ``q_x A`` and ``q_y B``."""
    a, rho, bt = np.linalg.svd(q_x.T @ q_y, full_matrices=False)
    np.clip(rho, 0.0, 1.0, out=rho)
    return a, rho, bt


def canonical_correlations_of(q_x: np.ndarray, q_y: np.ndarray) -> np.ndarray:
    """Only the ρ of :func:`canonical_pairs` (no singular vectors computed)."""
    return np.clip(np.linalg.svd(q_x.T @ q_y, compute_uv=False), 0.0, 1.0)


class Standardizer:
    """Per-column ``(a - mean) / std`` with statistics from the rows given to :meth:`fit`.

    Attributes (after ``fit``): ``mean_`` and ``scale_``, float64 arrays of shape ``(hidden,)``;
    ``scale_`` is the population standard deviation, with 1.0 for columns constant on those rows
    (dividing by rounding residue would blow them up).
    """

    def fit(self, a: np.ndarray) -> Standardizer:
        a = np.asarray(a, dtype=np.float64)
        if a.ndim != 2 or a.shape[0] == 0:
            raise LayersimError(f"standardising needs a (rows, hidden) array with at least one row, got shape {a.shape}.")
        self._set(a.mean(axis=0), a.std(axis=0))
        return self

    def fit_batches(self, batches) -> Standardizer:
        """:meth:`fit` over rows that arrive in (rows, hidden) batches, merging each batch's mean and
        sum of squared deviations (Chan et al.), so memory is one batch and no precision is lost to
        subtracting large squares."""
        count, mean, squares = 0, None, None
        for a in batches:
            a = np.asarray(a, dtype=np.float64)
            if a.shape[0] == 0:
                continue
            m = a.mean(axis=0)
            s = np.square(a - m).sum(axis=0)
            if mean is None:
                count, mean, squares = len(a), m, s
                continue
            total = count + len(a)
            delta = m - mean
            mean = mean + delta * (len(a) / total)
            squares = squares + s + np.square(delta) * (count * len(a) / total)
            count = total
        if mean is None:
            raise LayersimError("standardising needs at least one row, got none.")
        self._set(mean, np.sqrt(squares / count))
        return self

    def _set(self, mean: np.ndarray, std: np.ndarray) -> None:
        self.mean_ = mean
        tiny = std <= 1e-12 * np.maximum(np.abs(mean), 1.0)
        self.scale_ = np.where(tiny, 1.0, std)

    def transform(self, a: np.ndarray) -> np.ndarray:
        return (np.asarray(a, dtype=np.float64) - self.mean_) / self.scale_

    def inverse_transform(self, a: np.ndarray) -> np.ndarray:
        return np.asarray(a, dtype=np.float64) * self.scale_ + self.mean_


def blas_on_calling_thread() -> threadpool_limits:
    """A context in which NumPy's BLAS and LAPACK run on the calling thread only.

    NumPy's BLAS (OpenBLAS) and torch each keep a pool of worker threads that spin for a while after a call
    before they sleep, so code that alternates the two (the neural alignment maps: NumPy standardising and
    whitening, torch training and transforming) has each pool's spinning threads take the cores the other
    needs. On a 2-core machine an INN transform of 1,000 rows right after a NumPy product took 73 ms instead
    of 14 (12 ms + 2 ms alone), a thin 1,000 × 384 SVD then the transform 137 ms instead of 62; with NumPy's
    BLAS on the calling thread the same pairs took 16 and 54 ms (the SVD alone no slower: 42 vs 50 ms).
    Torch's own threads are left as they are. SciPy's LAPACK is a library of its own (scipy-openblas), which a limit
    reaches only if it is loaded when the limit is set: it is imported first."""
    import scipy.linalg  # noqa: F401 (loads SciPy's BLAS, so that the limit covers it)

    return threadpool_limits(limits=1, user_api="blas")
