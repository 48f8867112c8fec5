"""Orthogonal Procrustes and Williams et al.'s (2021) shape metrics, as similarities.

Williams, Kunz, Kornblith & Linderman 2021, "Generalized shape metrics on neural representations" (netrep's
``LinearMetric``): each layer is centred and partially whitened at its own scale, as netrep does,
``X̃ = Xc Z_α`` with ``Z_α = V diag(α + (1 − α) λ^(−1/2)) Vᵀ`` from ``Xcᵀ Xc = V diag(λ) Vᵀ`` (netrep's
``whiten``: eigenvalues of the raw sum of squares clipped below at :data:`EIGVAL_TOL`, ``α = 1`` no whitening,
``α = 0`` full, CCA-like whitening). The best rotation aligning the two (the orthogonal Procrustes problem)
leaves the cosine

    s_α = ‖X̃ᵀ Ỹ‖_* / (‖X̃‖_F ‖Ỹ‖_F)      (nuclear norm: the sum of singular values)

which is what the registry reports (``procrustes``: α = 1; ``shape_metric``: any α), a similarity in [0, 1]
that is 1 for a layer against itself and unchanged by rotations of either side (and by isotropic scaling at
α = 0 and α = 1; see below). The
distances are functions of it: netrep's angular shape metric ``θ = arccos s_α`` (``score_method="angular"``,
:func:`angular_shape_distance`) and the Procrustes distance between the normalised representations
``sqrt(2 − 2 s_α)`` (:func:`procrustes_distance`; Ding et al. 2021's "Procrustes" at α = 1). Both decrease in
``s_α``, so a permutation p-value of ``s_α`` is that of the distance (small distance = large similarity) and a
percentile interval maps through them end for end.

Conventions against netrep: widths may differ (netrep zero-pads the narrower side, which changes neither the
nuclear norm nor the norms, so nothing is padded here); ``s_α`` = ``cos`` of netrep's
``LinearMetric(alpha, center_columns=True).fit_score(X, Y)`` on the data as given, for every α. Whitening at
the data's own scale means that for ``0 < α < 1`` the mix of whitened and raw directions depends on the
layer's scale and its row count (λ is a sum over rows): α is not linear in "how much whitening", and
multiplying a layer by a constant changes ``s_α`` there, in netrep as here. With ``n − 1 ≤ d`` rows a fully
whitened layer spans every centred direction, so at α = 0 every pair scores 1: α < 1 is refused there.

Everything is a function of the centred second moments ``Xcᵀ Xc``, ``Xcᵀ Yc``, ``Ycᵀ Yc``, so the streamed route
(:func:`shape_moments_matrix`, from :class:`~layersim.similarity.moments.LayerMoments`) needs memory in the
widths only, and a row permutation of ``Y`` only permutes the rows of ``Ỹ`` (:func:`shape_engine`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from layersim.errors import LayersimError
from layersim.similarity._common import Named, centre, named_lists, validated
from layersim.similarity.inference._device_engines import ProductEngine, torch
from layersim.similarity._pairs import fill_matrix

EIGVAL_TOL = 1e-7  # netrep's whiten(eigval_tol=1e-7), applied to the eigenvalues of the raw Xcᵀ Xc


def check_alpha(alpha) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 <= alpha <= 1.0:
        raise LayersimError(f"alpha must be a number in [0, 1] (1: rotations only, Procrustes; 0: full "
                            f"whitening, CCA-like), got {alpha!r}.")
    return float(alpha)


def whitening(cov: np.ndarray, alpha: float) -> np.ndarray:
    """netrep's partial whitening ``Z_α`` of data whose (uncentred-sum) covariance is ``cov`` (d × d); the
    identity at α = 1 (netrep returns early there too). netrep's variance-preserving rescale is a scalar, so
    it cancels in ``s_α`` and is left out."""
    if alpha > 1 - EIGVAL_TOL:
        return np.eye(cov.shape[0])
    lam, v = np.linalg.eigh(cov)
    d = alpha + (1 - alpha) * np.maximum(lam, EIGVAL_TOL) ** -0.5
    return (v * d) @ v.T


def check_rows(name: str, rows: int, width: int, alpha: float) -> None:
    """Refuse partial whitening (α < 1) of a layer with rows − 1 ≤ neurons (the module docstring says why)."""
    if alpha <= 1 - EIGVAL_TOL and rows - 1 <= width:
        raise LayersimError(f"shape_metric with alpha = {alpha:g} < 1 needs more examples than neurons + 1, but "
                            f"{name} has {rows} rows and {width} neurons (whitened, every pair would score 1 at "
                            f"alpha 0); use alpha = 1 (procrustes) or at least {width + 2} examples.")


def _compressed(name: str, a: np.ndarray, alpha: float) -> np.ndarray:
    """``X̃ / ‖X̃‖_F`` in at most min(n, d) columns: its left singular vectors times singular values, which
    keep every inner product ``X̃ᵀ Ỹ`` up to an orthogonal map, so the nuclear norms are the same."""
    centred = centre(name, a, "shape metric")
    if alpha <= 1 - EIGVAL_TOL:  # whitened at the layer's own scale, as netrep's whiten
        check_rows(name, *centred.shape, alpha)
        centred = centred @ whitening(centred.T @ centred, alpha)
    centred = centred / np.linalg.norm(centred)
    if centred.shape[1] <= centred.shape[0]:
        return centred
    u, s, _ = np.linalg.svd(centred, full_matrices=False)
    return u * s


def _nuclear(product: np.ndarray) -> float:
    return float(np.clip(np.linalg.svd(product, compute_uv=False).sum(), 0.0, 1.0))


def _stats(named: Named, alpha: float) -> list[np.ndarray]:
    return [_compressed(name, a, alpha) for name, a in validated(named, "shape metric")]


def shape_similarity(x: np.ndarray, y: np.ndarray, *, alpha: float = 1.0) -> float:
    """``s_α = cos θ``: the cosine of Williams et al.'s angular shape metric (see the module docstring)."""
    alpha = check_alpha(alpha)
    a, b = _stats([("x", x), ("y", y)], alpha)
    return _nuclear(a.T @ b)


def procrustes(x: np.ndarray, y: np.ndarray) -> float:
    """``‖X̃ᵀ Ỹ‖_*`` of the centred, unit-Frobenius-norm layers = ``1 − d²/2``, d the Procrustes distance."""
    return shape_similarity(x, y, alpha=1.0)


def angular_shape_distance(x: np.ndarray, y: np.ndarray, *, alpha: float = 1.0) -> float:
    """Williams et al.'s angular shape metric ``arccos s_α`` in [0, π/2] (netrep's default score)."""
    return float(np.arccos(shape_similarity(x, y, alpha=alpha)))


def procrustes_distance(x: np.ndarray, y: np.ndarray, *, alpha: float = 1.0) -> float:
    """The Procrustes distance ``min_Q ‖X̃ − Ỹ Q‖_F = sqrt(2 − 2 s_α)`` between the normalised layers,
    in [0, √2]."""
    return float(np.sqrt(max(0.0, 2.0 - 2.0 * shape_similarity(x, y, alpha=alpha))))


def shape_matrix(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray] | None = None, *,
                 alpha: float = 1.0) -> np.ndarray:
    """[i, j] = :func:`shape_similarity` ``(xs[i], ys[j])``; each layer normalised and whitened once."""
    alpha = check_alpha(alpha)
    x_named, y_named = named_lists(xs, ys)
    stats = _stats(x_named + (y_named or []), alpha)
    sx, sy = stats[: len(x_named)], (None if y_named is None else stats[len(x_named):])
    return fill_matrix(sx, sy, lambda a, b: _nuclear(a.T @ b), symmetric=True)


def procrustes_matrix(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray] | None = None) -> np.ndarray:
    """:func:`shape_matrix` at α = 1."""
    return shape_matrix(xs, ys, alpha=1.0)


def shape_engine(x_named: Named, y_named: Named | None, cells: np.ndarray, *, alpha: float = 1.0) -> ProductEngine:
    """The permutation-null engine: per cell the nuclear norm of ``X̃ᵀ Ỹ[π]`` (the normalised, whitened rows
    permuted)."""
    alpha = check_alpha(alpha)
    stats = _stats(x_named + (y_named or []), alpha)
    sx = stats[: len(x_named)]
    sy = sx if y_named is None else stats[len(x_named):]
    return ProductEngine(cells, sx, sy, lambda i, j, blocks: torch.linalg.svdvals(blocks).sum(dim=-1).clamp(0.0, 1.0))


def procrustes_engine(x_named: Named, y_named: Named | None, cells: np.ndarray) -> ProductEngine:
    return shape_engine(x_named, y_named, cells, alpha=1.0)


def shape_moments_matrix(moments, xs: Sequence[int], ys: Sequence[int] | None = None, *,
                         alpha: float = 1.0) -> np.ndarray:
    """The streamed route: [a, b] = ``s_α`` of stacked layers xs[a], ys[b] of a
    :class:`~layersim.similarity.moments.LayerMoments`, from its centred cross-products alone
    (``X̃ᵀ Ỹ = Z_x Σ_xy Z_y``, each ``Z`` the raw-scale whitening scaled so that ``‖Xc Z‖_F = 1``); equal to
    :func:`shape_matrix` on the rows (to rounding)."""
    alpha = check_alpha(alpha)
    same = ys is None
    ys = list(xs) if same else list(ys)
    transforms: dict[int, np.ndarray] = {}

    def transform(k: int) -> np.ndarray:  # Z_k scaled so that ‖Xc_k Z_k‖_F = 1
        if k not in transforms:
            cov = moments.block(k, k)
            total = float(np.trace(cov))
            if not total > 0:
                raise LayersimError(f"layers[{k}] is constant across examples, so its shape metric is undefined; "
                                    "drop that layer or check how it was extracted.")
            check_rows(f"layers[{k}]", moments.num_rows, cov.shape[0], alpha)
            z = whitening(cov, alpha) / np.sqrt(total)  # at the layer's own scale, as netrep
            transforms[k] = z / np.sqrt(max(float(np.einsum("ij,ij->", z, cov @ z)), np.finfo(float).tiny))
        return transforms[k]

    out = np.empty((len(xs), len(ys)))
    for a, i in enumerate(xs):
        for b, j in enumerate(ys):
            if same and b < a:
                out[a, b] = out[b, a]
            elif same and a == b:
                transform(i)  # a constant layer still raises
                out[a, b] = 1.0
            else:
                out[a, b] = _nuclear(transform(i).T @ moments.block(i, j) @ transform(j))
    return out
