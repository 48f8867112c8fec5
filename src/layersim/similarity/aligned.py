"""ReSi's rotation-aligned measures beside :mod:`layersim.similarity.shape` (Klabunde et al. 2025, their definitions):
size-and-shape Procrustes and the aligned cosine similarity, as similarities.

* **size_and_shape** (the Procrustes size-and-shape distance, Dryden & Mardia; Williams et al. 2021's rotation-
  invariant metric without the scale normalisation; ReSi's ``procrustes_size_and_shape_distance``): both layers
  centred, *not* scaled, ``d² = min_Q ‖Xc − Yc Q‖²_F = ‖Xc‖²_F + ‖Yc‖²_F − 2 ‖Xcᵀ Yc‖_*`` over orthogonal ``Q``
  (widths may differ: ReSi's zero padding changes neither norm). Reported as the similarity

      s = 1 − d² / (‖Xc‖²_F + ‖Yc‖²_F) = 2 ‖Xcᵀ Yc‖_* / (‖Xc‖²_F + ‖Yc‖²_F)      in [0, 1],

  1 iff ``Yc`` is a rotation of ``Xc`` (same size); ``d² = (1 − s)(‖Xc‖² + ‖Yc‖²)`` (:func:`size_and_shape_distance`).
  A row permutation leaves both norms alone, so a permutation p-value of ``s`` is that of ``d``. Invariant to
  rotations and reflections of either side, translation and permutations of neurons; **not** to scaling one side
  (that is its difference from ``procrustes``, which normalises the size away): ``s(X, cX) = 2c / (1 + c²)``.
* **aligned_cosine** (Hamilton, Leskovec & Jurafsky 2016's aligned embeddings; ReSi's ``aligned_cossim``): ``x``
  rotated onto ``y`` by the orthogonal Procrustes solution ``Q = U Vᵀ`` of ``Xᵀ Y = U S Vᵀ`` (the data as given,
  not centred, as ReSi), then the mean over examples of the cosine between ``x_i Q`` and ``y_i``, in [−1, 1]. With
  ReSi's zero padding ``‖x_i Q‖ = ‖x_i‖``, so ``cos_i = x_i U Vᵀ y_iᵀ / (‖x_i‖ ‖y_i‖)``: symmetric. Where
  ``Xᵀ Y`` is rank-deficient (fewer examples than neurons) the rotation is not unique on its null directions; here
  they are left unrotated (``U``, ``V`` over the singular values above rank tolerance; scipy's choice is
  arbitrary there). Examples whose row is zero on either side have no cosine and are left out of the mean, as ReSi.
  Invariant to rotations and to scaling either side, and to permutations of neurons; not to translation.

Cost: size_and_shape, one SVD per layer ``O(n d min(n, d))`` and a pair ``O(n r_x r_y + r³)`` (the nuclear norm of
the ``r_x × r_y`` product of the compressed layers); aligned_cosine, a pair ``O(n d_x d_y + d³)`` (product, SVD and
the per-row cosines). Nulls: size_and_shape row-permutes the compressed y side (a product engine); aligned_cosine
realigns for every permutation (the generic engine, ``permutations`` times the pair's cost).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from layersim.compute.linalg import default_rtol, numerical_rank
from layersim.similarity._common import Named, centre, named_lists, validated
from layersim.similarity._pairs import fill_matrix
from layersim.similarity.inference._host_engines import rows_engine
from layersim.similarity.inference._device_engines import ProductEngine, torch


# --- size-and-shape Procrustes ---


@dataclass(frozen=True)
class _Sized:
    c: np.ndarray  # the centred layer in at most min(n, d) columns (inner products kept up to a rotation)
    sq_norm: float  # ‖Xc‖²_F


def _sized(name: str, a: np.ndarray) -> _Sized:
    c = centre(name, a, "size-and-shape Procrustes")
    if c.shape[1] > c.shape[0]:
        u, s, _ = np.linalg.svd(c, full_matrices=False)
        c = u * s
    return _Sized(c, float(np.sum(c * c)))


def _sized_all(named: Named) -> list[_Sized]:
    return [_sized(name, a) for name, a in validated(named, "size-and-shape Procrustes")]


def _size_and_shape_value(a: _Sized, b: _Sized) -> float:
    nuclear = np.linalg.svd(a.c.T @ b.c, compute_uv=False).sum()
    return float(np.clip(2.0 * nuclear / (a.sq_norm + b.sq_norm), 0.0, 1.0))


def size_and_shape(x: np.ndarray, y: np.ndarray) -> float:
    """``2 ‖Xcᵀ Yc‖_* / (‖Xc‖² + ‖Yc‖²)`` = ``1 − d² / (‖Xc‖² + ‖Yc‖²)``, d the size-and-shape Procrustes distance."""
    return float(_size_and_shape([("x", x)], [("y", y)])[0, 0])


def size_and_shape_distance(x: np.ndarray, y: np.ndarray) -> float:
    """The Procrustes size-and-shape distance ``min_Q ‖Xc − Yc Q‖_F`` (ReSi's, unscaled)."""
    a, b = _sized_all([("x", x), ("y", y)])
    return float(np.sqrt(max(0.0, (1.0 - _size_and_shape_value(a, b)) * (a.sq_norm + b.sq_norm))))


def size_and_shape_matrix(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray] | None = None) -> np.ndarray:
    """[i, j] = :func:`size_and_shape` ``(xs[i], ys[j])``; each layer centred and compressed once."""
    return _size_and_shape(*named_lists(xs, ys))


def _size_and_shape(x_named: Named, y_named: Named | None) -> np.ndarray:
    stats = _sized_all(x_named + (y_named or []))
    sx, sy = stats[: len(x_named)], (None if y_named is None else stats[len(x_named):])
    return fill_matrix(sx, sy, _size_and_shape_value, symmetric=True)


def size_and_shape_engine(x_named: Named, y_named: Named | None, cells: np.ndarray) -> ProductEngine:
    """The permutation null: ``2 ‖Xcᵀ Yc[π]‖_* / (‖Xc‖² + ‖Yc‖²)`` per cell."""
    stats = _sized_all(x_named + (y_named or []))
    sx = stats[: len(x_named)]
    sy = sx if y_named is None else stats[len(x_named):]

    def reduce(i, j, blocks):
        return (2.0 * torch.linalg.svdvals(blocks).sum(dim=-1) / (sx[i].sq_norm + sy[j].sq_norm)).clamp(0.0, 1.0)

    return ProductEngine(cells, [s.c for s in sx], [s.c for s in sy], reduce)


# --- aligned cosine similarity ---


@dataclass(frozen=True)
class _Rows:
    a: np.ndarray  # the layer as given, float64
    norms: np.ndarray  # each example's row norm


def _rows(named: Named) -> list[_Rows]:
    out = []
    for name, a in validated(named, "aligned cosine similarity"):
        centre(name, a, "aligned cosine similarity")  # a layer the same for every example is refused, as elsewhere
        a = np.asarray(a, dtype=np.float64)
        out.append(_Rows(a, np.linalg.norm(a, axis=1)))
    return out


def _aligned_cosine_value(x: _Rows, y: _Rows) -> float:
    u, s, vt = np.linalg.svd(x.a.T @ y.a, full_matrices=False)
    rank = numerical_rank(s, default_rtol(*x.a.shape))
    inner = np.einsum("ik,ik->i", x.a @ u[:, :rank], y.a @ vt[:rank].T)
    defined = (x.norms > 0) & (y.norms > 0)
    return float(np.clip(np.mean(inner[defined] / (x.norms[defined] * y.norms[defined])), -1.0, 1.0))


def aligned_cosine(x: np.ndarray, y: np.ndarray) -> float:
    """The mean cosine between each example's row of ``x``, rotated onto ``y`` (orthogonal Procrustes), and its row
    of ``y``, in [−1, 1] (see the module docstring)."""
    return float(_aligned_cosine([("x", x)], [("y", y)])[0, 0])


def aligned_cosine_matrix(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray] | None = None) -> np.ndarray:
    """[i, j] = :func:`aligned_cosine` ``(xs[i], ys[j])``; each layer's row norms computed once."""
    return _aligned_cosine(*named_lists(xs, ys))


def _aligned_cosine(x_named: Named, y_named: Named | None) -> np.ndarray:
    stats = _rows(x_named + (y_named or []))
    sx, sy = stats[: len(x_named)], (None if y_named is None else stats[len(x_named):])
    return fill_matrix(sx, sy, _aligned_cosine_value, symmetric=True)


def aligned_cosine_engine(x_named: Named, y_named: Named | None, cells: np.ndarray):
    """The permutation null: the rotation found again for every permuted ``y`` (the generic engine)."""
    validated(x_named + (y_named or []), "aligned cosine similarity")
    return rows_engine(x_named, y_named, cells, _rows, _aligned_cosine_value,
                       lambda rows, perm, inverse: _Rows(rows.a[perm], rows.norms[perm]))
