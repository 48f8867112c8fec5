"""Measures of the layers' Euclidean distance matrices: distance correlation and the RSM norm difference.

Each layer gives the ``n × n`` matrix of Euclidean distances between its examples' rows,
``D_ab = ‖x_a − x_b‖`` (not squared; unchanged by a translation, a rotation or a permutation of the neurons).

**Distance correlation** (Székely, Rizzo & Bakirov 2007, "Measuring and testing dependence by correlation of
distances", Ann. Statist., eq. 2.8–2.10): with ``A = H D_x H`` and ``B = H D_y H`` the double-centred distance
matrices (``A_ab = D_ab − D̄_a· − D̄_·b + D̄_··``), the sample distance covariance is the V-statistic
``dCov²_n(x, y) = (1/n²) Σ_ab A_ab B_ab`` and

    distance_correlation(x, y) = sqrt( dCov²_n(x, y) / sqrt(dCov²_n(x, x) · dCov²_n(y, y)) ),

the *standard* (biased, V-statistic) estimator, in [0, 1] (``dCov²_n ≥ 0``, their Theorem 1), which is what
``dcor.distance_correlation`` and ReSi compute; not the bias-corrected ``u_distance_correlation_sqr``. It is 1 for
a layer against itself and unchanged by ``x → a + b x C`` for any vector ``a``, scalar ``b ≠ 0`` and orthogonal
``C`` (their Theorem 3), on either side, so also by isotropic scaling (ReSi declares it not invariant to scaling,
which it is). A per-neuron scale or any other invertible map moves it.

**RSM norm difference** (Klabunde et al. 2023's survey, §"RSM-based measures"; ReSi's ``RSMNormDifference``):
the distance ``‖D_x − D_y‖_F`` between the two distance matrices, here with the Frobenius norm (ReSi's code takes
``np.linalg.norm(S − S', ord=2)`` of the square matrices, the spectral norm: docs/peers.md measures the
difference; :func:`rsm_difference_norm` gives both). It is a distance in the data's units, so the registry reports
the decreasing map

    rsm_norm(x, y) = 1 − ‖D_x − D_y‖_F / sqrt(‖D_x‖_F² + ‖D_y‖_F²),

in [0, 1] (distances are non-negative, so ``(p − q)² ≤ p² + q²`` entry by entry), 1 for equal distance matrices,
0 only for distance matrices with disjoint supports. A permutation of ``y``'s rows leaves ``‖D_y‖_F`` unchanged, so
the null's p-values are those of the raw distance. Invariant to rotations, translations and neuron permutations
(ReSi declares it not invariant to translations, which Euclidean distances are); *not* to isotropic scaling of one
side, which changes the distances themselves: that is the measure's nature (two layers are alike only if their
distances agree in size too).

Cost: the distance matrix of each layer, ``n² d`` multiply-adds and ``8 n²`` bytes (kept for every layer of a
matrix and of its null engine), so both refuse more than :data:`DISTANCE_MAX_ROWS` rows before anything is
allocated (:func:`check_distance_sizes`); a pair is one ``n²`` inner product. No streamed route (every pair of rows
is needed). A row permutation ``π`` of ``y`` permutes its matrices as ``D[π][:, π]``, so the null engines are
a :class:`~layersim.similarity.inference._device_engines.KernelEngine` on the prepared matrices. A bootstrap resample's
copies of one example sit at distance 0 from each other in every layer, which is what the V-statistic on the
resampled (weighted) sample is: no copy handling is needed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from layersim.errors import LayersimError, unknown_name
from layersim.similarity._common import Named, centre, named_lists, validated
from layersim.similarity._pairs import fill_matrix
from layersim.similarity.inference._device_engines import KernelEngine, analysis_device, on_device

# Above this many rows every distance matrix is > 200 MB and a matrix of 39 layers > 8 GB (as RSA's limit).
DISTANCE_MAX_ROWS = 5_000
NORMS = ("frobenius", "spectral")


def check_distance_sizes(num_rows: int, width: int, name: str) -> None:
    """Refuse more than :data:`DISTANCE_MAX_ROWS` rows before anything is allocated (``Measure.check_sizes``)."""
    if num_rows > DISTANCE_MAX_ROWS:
        raise LayersimError(
            f"distance_correlation and rsm_norm on n = {num_rows} examples would hold an n x n distance matrix per "
            f"layer ({8 * num_rows ** 2 / 2 ** 30:.1f} GiB each), above their limit of {DISTANCE_MAX_ROWS} rows; use "
            "fewer examples (extract.max_examples) or a measure that streams (linear_cka, svcca, procrustes).")


def distance_matrix(name: str, a: np.ndarray, measure: str = "distance matrix") -> np.ndarray:
    """``D_ab = ‖a_a − a_b‖`` (float64, zero diagonal, symmetric); raises for a constant layer."""
    check_distance_sizes(a.shape[0], a.shape[1], name)
    c = centre(name, a, measure)  # centred first: the same distances, less cancellation in ‖a‖² + ‖b‖² − 2⟨a, b⟩
    squares = np.einsum("ij,ij->i", c, c)
    out = squares[:, None] + squares[None, :] - 2.0 * (c @ c.T)
    np.maximum(out, 0.0, out=out)
    np.sqrt(out, out=out)
    np.fill_diagonal(out, 0.0)
    return (out + out.T) / 2  # exactly symmetric


def _double_centred_unit(name: str, a: np.ndarray) -> np.ndarray:
    """``H D H / ‖H D H‖_F``."""
    d = distance_matrix(name, a, "distance correlation")
    d -= d.mean(axis=0, keepdims=True)
    d -= d.mean(axis=1, keepdims=True)
    norm = np.linalg.norm(d)
    if not norm > 0:  # n = 2 and the like: every double-centred entry 0
        raise LayersimError(f"{name}'s double-centred distance matrix is 0 (n = {a.shape[0]} rows), so its distance "
                            "correlation is undefined; use more examples.")
    return d / norm


def _dcor(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(np.clip(np.einsum("ij,ij->", a, b), 0.0, 1.0)))


def _dcor_stats(named: Named) -> list[np.ndarray]:
    return [_double_centred_unit(name, a) for name, a in validated(named, "distance correlation", min_rows=3)]


def distance_correlation(x: np.ndarray, y: np.ndarray) -> float:
    """Székely et al.'s sample distance correlation (the V-statistic; see the module docstring), in [0, 1]."""
    return _dcor(*_dcor_stats([("x", x), ("y", y)]))


def distance_correlation_matrix(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray] | None = None) -> np.ndarray:
    """[i, j] = :func:`distance_correlation` ``(xs[i], ys[j])``; each layer's double-centred distances made once."""
    x_named, y_named = named_lists(xs, ys)
    stats = _dcor_stats(x_named + (y_named or []))
    sx, sy = stats[: len(x_named)], (None if y_named is None else stats[len(x_named):])
    return fill_matrix(sx, sy, _dcor, symmetric=True)


def distance_correlation_engine(x_named: Named, y_named: Named | None, cells: np.ndarray) -> KernelEngine:
    """The permutation-null engine: each cell ``sqrt(⟨A, B[π][:, π]⟩)`` of the unit double-centred matrices."""
    stats = _dcor_stats(x_named + (y_named or []))
    kx = np.stack(stats[: len(x_named)])
    ky = kx if y_named is None else np.stack(stats[len(x_named):])
    return KernelEngine(cells, kx, ky, lambda inner, perms: inner.clamp(0.0, 1.0).sqrt())


def _rsm_stats(named: Named) -> list[np.ndarray]:
    return [distance_matrix(name, a, "RSM norm difference") for name, a in validated(named, "RSM norm difference")]


def _rsm_similarity(a: np.ndarray, b: np.ndarray) -> float:
    scale = np.sqrt(np.einsum("ij,ij->", a, a) + np.einsum("ij,ij->", b, b))
    return float(np.clip(1.0 - np.linalg.norm(a - b) / scale, 0.0, 1.0))


def rsm_difference_norm(x: np.ndarray, y: np.ndarray, *, norm: str = "frobenius") -> float:
    """The distance ``‖D_x − D_y‖`` between the Euclidean distance matrices, in the data's units: ``"frobenius"``
    (what :func:`rsm_norm` maps to a similarity) or ``"spectral"`` (the largest singular value, as ReSi's code)."""
    if norm not in NORMS:
        raise unknown_name("RSM norm", norm, NORMS)
    a, b = _rsm_stats([("x", x), ("y", y)])
    return float(np.linalg.norm(a - b, ord="fro" if norm == "frobenius" else 2))


def rsm_norm(x: np.ndarray, y: np.ndarray) -> float:
    """``1 − ‖D_x − D_y‖_F / sqrt(‖D_x‖_F² + ‖D_y‖_F²)``: the RSM norm difference as a similarity in [0, 1]."""
    return _rsm_similarity(*_rsm_stats([("x", x), ("y", y)]))


def rsm_norm_matrix(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray] | None = None) -> np.ndarray:
    """[i, j] = :func:`rsm_norm` ``(xs[i], ys[j])``; each layer's distance matrix made once."""
    x_named, y_named = named_lists(xs, ys)
    stats = _rsm_stats(x_named + (y_named or []))
    sx, sy = stats[: len(x_named)], (None if y_named is None else stats[len(x_named):])
    return fill_matrix(sx, sy, _rsm_similarity, symmetric=True)


def rsm_norm_engine(x_named: Named, y_named: Named | None, cells: np.ndarray) -> KernelEngine:
    """The permutation-null engine: ``‖D_x − D_y[π][:, π]‖_F² = ‖D_x‖² + ‖D_y‖² − 2⟨D_x, D_y[π][:, π]⟩`` from one
    inner product per cell (rounding of order ``sqrt(ε)`` where the similarity is near 1, against the pair
    function's direct difference; permuted values are far from it)."""
    stats = _rsm_stats(x_named + (y_named or []))
    kx = np.stack(stats[: len(x_named)])
    ky = kx if y_named is None else np.stack(stats[len(x_named):])
    sq_x = np.einsum("kij,kij->k", kx, kx)
    sq_y = sq_x if y_named is None else np.einsum("kij,kij->k", ky, ky)
    total = on_device(sq_x[:, None] + sq_y[None, :], analysis_device())

    def finish(inner, perms):
        return (1.0 - (1.0 - 2.0 * inner / total).clamp(min=0.0).sqrt()).clamp(0.0, 1.0)

    return KernelEngine(cells, kx, ky, finish)

