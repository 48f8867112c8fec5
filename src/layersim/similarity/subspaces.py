"""ReSi's measures of what one layer's span predicts of another's (Klabunde et al. 2025, their definitions):
linear regression, GULP and the eigenspace overlap score, as similarities.

Every layer is centred first; ``Qx`` is an orthonormal basis of the centred ``x`` (rank-truncated at ``rtol``, as
the CCA family: :func:`layersim.similarity.cca.whiten`).

* **linear_regression** (Kornblith et al. 2019's R²_LR; ReSi's ``linear_reg``): the share of ``x``'s variance the
  least-squares fit (with intercept) from all of ``y`` explains, ``R² = ‖Qyᵀ Xc‖²_F / ‖Xc‖²_F`` in [0, 1];
  asymmetric, the first argument is the regressand (as mixedsim, whose per-neuron ``sqrt(R²)`` it weights by each
  neuron's variance instead of averaging). Invariant to translation, permutations and isotropic scaling of either
  side, orthogonal maps of ``x`` and any invertible linear map of ``y``; not to an invertible map of ``x``.
* **gulp** (Boix-Adserà, Lawrence, Stepaniants & Rigollet 2022, "GULP: a prediction-based metric between
  representations"; ReSi's ``gulp``, which copies the authors' ``predictor_dist``): each layer is centred and scaled
  so that its covariance ``Σ = Xcᵀ Xc / ‖Xc‖²_F`` has trace 1 (the authors' normalisation), and
  ``H_x = Xc (Xcᵀ Xc + λ ‖Xc‖²_F I)⁻¹ Xcᵀ`` is its ridge-regression hat matrix (``ridge`` = λ). GULP's squared
  distance is ``d²_λ = ‖H_x − H_y‖²_F = tr H_x² + tr H_y² − 2 tr H_x H_y``, in [0, rank_x + rank_y]; reported as
  the similarity ``s = 1 − d²_λ / (tr H_x² + tr H_y²) = 2 tr(H_x H_y) / (tr H_x² + tr H_y²)`` in [0, 1], 1 iff the
  hat matrices agree. A row permutation leaves ``tr H²`` alone, so a permutation p-value of ``s`` is that of ``d``;
  ``d²_λ = (1 − s)(tr H_x² + tr H_y²)`` (:func:`gulp_distance`). With ``λ = 0`` the hat matrices are the
  projections onto the spans and ``d²_0 = r_x + r_y − 2 Σ ρ²`` (ρ the canonical correlations), i.e. ``s`` is
  ``2 Σρ² / (r_x + r_y)``: the R² of regressing either layer's whitened form on the other (linear regression on
  ``Qx`` and ``Qy``), symmetrised; invariant to any invertible linear map of either side. With ``λ > 0``: to
  orthogonal maps, isotropic scaling, translation and permutations only.
* **eigenspace_overlap** (May, Zhang, Dao & Ré 2019, "On the downstream performance of compressed word
  embeddings"): ``‖Qxᵀ Qy‖²_F / max(r_x, r_y)`` in [0, 1] (``Σ ρ² / max(r_x, r_y)``); symmetric, invariant to
  invertible linear maps of either side, translation included.

Sizes: once a layer spans every centred direction (width ≥ n − 1) its span, and its λ = 0 hat matrix, is the same
for every such layer, so each of these compares it as 1 with anything that wide: linear_regression needs
``n ≥ d + 2`` for the regressor ``y``, eigenspace_overlap for both sides, gulp for both at λ = 0 (a ridge λ > 0
keeps it defined), refused in one sentence before any work (:func:`check_regression_sizes`).

Cost: one SVD (or pivoted QR) per layer, ``O(n d min(n, d))``; a pair is one product ``O(n r_x r_y)``. The
permutation nulls row-permute the y-side basis (:class:`~layersim.similarity.inference._device_engines.ProductEngine`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from layersim.compute.linalg import default_rtol, numerical_rank
from layersim.errors import LayersimError, unknown_name
from layersim.similarity._cca_core import METHODS, _principal_directions, whiten
from layersim.similarity._common import Named, centre, check_rtol, named_lists, validated
from layersim.similarity._pairs import fill_matrix
from layersim.similarity.inference._device_engines import ProductEngine, _sum_of_squares


def check_regression_sizes(measure: str):
    """A ``check_sizes(num_rows, width, name)`` refusing a layer at least ``num_rows − 1`` wide for `measure` (the
    module docstring says why)."""

    def check(num_rows: int, width: int, name: str = "y") -> None:
        if width >= num_rows - 1:
            raise LayersimError(
                f"{measure} cannot be computed on n = {num_rows} examples with {name} of width d = {width}: a layer "
                f"that wide spans every centred direction, so it would compare as 1 with any other; use at least "
                f"{width + 2} examples (e.g. a larger extract.max_examples, or None for all) or another measure"
                + (" (or gulp with a ridge > 0)" if measure == "gulp" else "") + "."
            )

    return check


check_linear_regression_sizes = check_regression_sizes("linear_regression")
check_eigenspace_sizes = check_regression_sizes("eigenspace_overlap")


def _check(method: str, rtol: float | None) -> None:
    if method not in METHODS:
        raise unknown_name("regression method", method, METHODS)
    check_rtol(rtol)


def _basis(name: str, a: np.ndarray, measure: str, method: str, rtol: float | None) -> np.ndarray:
    check_regression_sizes(measure)(*a.shape, name)
    return whiten(name, a, measure, method=method, rtol=rtol).q


# --- linear regression ---


@dataclass(frozen=True)
class _Regression:
    z: np.ndarray | None  # the centred layer over its Frobenius norm (the regressand side)
    q: np.ndarray | None  # an orthonormal basis of the centred layer (the regressor side)


def _normalised(name: str, a: np.ndarray, measure: str) -> np.ndarray:
    c = centre(name, a, measure)
    return c / np.linalg.norm(c)


def linear_regression(x: np.ndarray, y: np.ndarray, *, method: str = "svd", rtol: float | None = None) -> float:
    """R² of the least-squares prediction of ``x`` (all its neurons, with intercept) from ``y``:
    ``‖Qyᵀ Xc‖²_F / ‖Xc‖²_F`` in [0, 1]; asymmetric (see the module docstring)."""
    return float(_linear_regression([("x", x)], [("y", y)], method, rtol)[0, 0])


def _regression_stats(x_named: Named, y_named: Named | None, method: str, rtol: float | None):
    _check(method, rtol)
    checked = validated(x_named + (y_named or []), "linear_regression")
    x_checked, y_checked = checked[: len(x_named)], checked[len(x_named):]
    both = y_named is None
    for name, a in x_checked if both else y_checked:  # every regressor, before any work
        check_linear_regression_sizes(*a.shape, name)
    sx = [_Regression(_normalised(name, a, "linear_regression"),
                      _basis(name, a, "linear_regression", method, rtol) if both else None) for name, a in x_checked]
    sy = None if both else [_Regression(None, _basis(name, a, "linear_regression", method, rtol))
                            for name, a in y_checked]
    return sx, sy


def linear_regression_matrix(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray] | None = None, *,
                             method: str = "svd", rtol: float | None = None) -> np.ndarray:
    """[i, j] = :func:`linear_regression` ``(xs[i], ys[j])``; each layer normalised and its basis found once."""
    return _linear_regression(*named_lists(xs, ys), method, rtol)


def _linear_regression(x_named: Named, y_named: Named | None, method: str, rtol: float | None) -> np.ndarray:
    sx, sy = _regression_stats(x_named, y_named, method, rtol)
    return fill_matrix(sx, sy, lambda a, b: min(float(np.sum((b.q.T @ a.z) ** 2)), 1.0), symmetric=False)


def linear_regression_engine(x_named: Named, y_named: Named | None, cells: np.ndarray, *, method: str = "svd",
                             rtol: float | None = None) -> ProductEngine:
    """The permutation null: ``‖Qy[π]ᵀ Xc‖² / ‖Xc‖²`` per cell."""
    sx, sy = _regression_stats(x_named, y_named, method, rtol)
    sy = sx if sy is None else sy
    return ProductEngine(cells, [s.z for s in sx], [s.q for s in sy],
                         lambda i, j, blocks: _sum_of_squares(i, j, blocks).clamp(max=1.0))


# --- GULP ---


def check_ridge(ridge) -> float:
    if isinstance(ridge, bool) or not isinstance(ridge, (int, float)) or not np.isfinite(ridge) or ridge < 0:
        raise LayersimError(f"ridge must be a finite number ≥ 0 (GULP's λ, on covariances of trace 1; 0: plain "
                            f"least squares), got {ridge!r}.")
    return float(ridge)


@dataclass(frozen=True)
class _Hat:
    b: np.ndarray  # (n, r): H = b bᵀ, the layer's (ridge) hat matrix
    self_inner: float  # tr H²


def _hat(name: str, a: np.ndarray, ridge: float, rtol: float | None) -> _Hat:
    if ridge == 0.0:
        q = _basis(name, a, "gulp", "svd", rtol)
        return _Hat(q, float(q.shape[1]))
    c = centre(name, a, "GULP")
    u, s = _principal_directions(c)
    rank = numerical_rank(s, default_rtol(*c.shape) if rtol is None else rtol)
    e = s[:rank] ** 2 / np.sum(s[:rank] ** 2)  # the trace-1 covariance's eigenvalues
    w = e / (e + ridge)
    return _Hat(np.ascontiguousarray(u[:, :rank] * np.sqrt(w)), float(np.sum(w * w)))


def _hats(named: Named, ridge: float, rtol: float | None) -> list[_Hat]:
    checked = validated(named, "GULP")
    if ridge == 0.0:
        for name, a in checked:  # before any work
            check_regression_sizes("gulp")(*a.shape, name)
    return [_hat(name, a, ridge, rtol) for name, a in checked]


def _gulp_value(a: _Hat, b: _Hat) -> float:
    return float(np.clip(2.0 * np.sum((a.b.T @ b.b) ** 2) / (a.self_inner + b.self_inner), 0.0, 1.0))


def gulp(x: np.ndarray, y: np.ndarray, *, ridge: float = 0.0, rtol: float | None = None) -> float:
    """``2 tr(H_x H_y) / (tr H_x² + tr H_y²)`` = ``1 − d²_λ / (tr H_x² + tr H_y²)``: GULP's distance as a
    similarity in [0, 1] (see the module docstring)."""
    return float(_gulp([("x", x)], [("y", y)], ridge, rtol)[0, 0])


def gulp_distance(x: np.ndarray, y: np.ndarray, *, ridge: float = 0.0, rtol: float | None = None) -> float:
    """GULP's squared distance ``d²_λ = ‖H_x − H_y‖²_F`` (Boix-Adserà et al.'s, ReSi's ``gulp``)."""
    check_rtol(rtol)
    a, b = _hats([("x", x), ("y", y)], check_ridge(ridge), rtol)
    return (1.0 - _gulp_value(a, b)) * (a.self_inner + b.self_inner)


def gulp_matrix(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray] | None = None, *, ridge: float = 0.0,
                rtol: float | None = None) -> np.ndarray:
    """[i, j] = :func:`gulp` ``(xs[i], ys[j])``; each layer's hat-matrix factor computed once."""
    return _gulp(*named_lists(xs, ys), ridge, rtol)


def _gulp(x_named: Named, y_named: Named | None, ridge: float, rtol: float | None) -> np.ndarray:
    ridge = check_ridge(ridge)
    check_rtol(rtol)
    stats = _hats(x_named + (y_named or []), ridge, rtol)
    sx, sy = stats[: len(x_named)], (None if y_named is None else stats[len(x_named):])
    return fill_matrix(sx, sy, _gulp_value, symmetric=True)


def gulp_engine(x_named: Named, y_named: Named | None, cells: np.ndarray, *, ridge: float = 0.0,
                rtol: float | None = None) -> ProductEngine:
    """The permutation null: ``‖B_xᵀ B_y[π]‖²`` per cell (``H = B Bᵀ``), over the permutation-free ``tr H²``."""
    ridge = check_ridge(ridge)
    check_rtol(rtol)
    stats = _hats(x_named + (y_named or []), ridge, rtol)
    sx = stats[: len(x_named)]
    sy = sx if y_named is None else stats[len(x_named):]

    def reduce(i, j, blocks):
        return (2.0 * _sum_of_squares(i, j, blocks) / (sx[i].self_inner + sy[j].self_inner)).clamp(0.0, 1.0)

    return ProductEngine(cells, [s.b for s in sx], [s.b for s in sy], reduce)


# --- eigenspace overlap ---


def _overlap(a: np.ndarray, b: np.ndarray) -> float:
    return min(float(np.sum((a.T @ b) ** 2)) / max(a.shape[1], b.shape[1]), 1.0)


def _spans(named: Named, method: str, rtol: float | None) -> list[np.ndarray]:
    _check(method, rtol)
    checked = validated(named, "eigenspace_overlap")
    for name, a in checked:  # before any work
        check_eigenspace_sizes(*a.shape, name)
    return [_basis(name, a, "eigenspace_overlap", method, rtol) for name, a in checked]


def eigenspace_overlap(x: np.ndarray, y: np.ndarray, *, method: str = "svd", rtol: float | None = None) -> float:
    """May et al.'s eigenspace overlap score ``‖Qxᵀ Qy‖²_F / max(r_x, r_y)`` of the centred layers, in [0, 1]."""
    return float(_eigenspace_overlap([("x", x)], [("y", y)], method, rtol)[0, 0])


def eigenspace_overlap_matrix(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray] | None = None, *,
                              method: str = "svd", rtol: float | None = None) -> np.ndarray:
    """[i, j] = :func:`eigenspace_overlap` ``(xs[i], ys[j])``; each layer's basis found once."""
    return _eigenspace_overlap(*named_lists(xs, ys), method, rtol)


def _eigenspace_overlap(x_named: Named, y_named: Named | None, method: str, rtol: float | None) -> np.ndarray:
    stats = _spans(x_named + (y_named or []), method, rtol)
    sx, sy = stats[: len(x_named)], (None if y_named is None else stats[len(x_named):])
    return fill_matrix(sx, sy, _overlap, symmetric=True)


def eigenspace_overlap_engine(x_named: Named, y_named: Named | None, cells: np.ndarray, *, method: str = "svd",
                              rtol: float | None = None) -> ProductEngine:
    """The permutation null: ``‖Qxᵀ Qy[π]‖² / max(r_x, r_y)`` per cell."""
    stats = _spans(x_named + (y_named or []), method, rtol)
    sx = stats[: len(x_named)]
    sy = sx if y_named is None else stats[len(x_named):]

    def reduce(i, j, blocks):
        return (_sum_of_squares(i, j, blocks) / max(blocks.shape[-2:])).clamp(max=1.0)

    return ProductEngine(cells, sx, sy, reduce)
