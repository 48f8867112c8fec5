"""SVCCA, PWCCA, mean CCA, neuronsim and mixedsim from second moments only: the centred cross-products
``Σ_ij = Xc_iᵀ Xc_j`` of every pair of layers, gathered in one pass over the examples' rows
(:class:`~layersim.similarity.cka_streaming.LinearCKAAccumulator`, the same pass as streaming linear CKA),
so that their L × L matrices need memory in the layers' widths, not in the number of examples.

Every quantity the in-memory measures take from the n-row data is a function of these d × d blocks:

* whitening: with ``Σ_ii = V diag(s²) Vᵀ`` (eigenvalues descending), ``Qx = Xc V S⁻¹`` is the orthonormal basis
  of the SVD route (its singular values ``s``, the same rank, variance and dimension cuts), never formed:
  only ``T = V S⁻¹`` (d × r) is kept;
* canonical correlations: the singular values of ``Qxᵀ Qy = Txᵀ Σ_xy Ty``;
* PWCCA's weights: ``Qxᵀ Xc = Txᵀ Σ_xx``;
* neuronsim: the correlation of neurons a, b is ``Σ_xy[a, b] / sqrt(Σ_xx[a, a] Σ_yy[b, b])``;
* mixedsim: ``‖Qyᵀ xc_a‖ = ‖Tyᵀ Σ_yx[:, a]‖``.

Accuracy: an eigendecomposition of ``Σ`` resolves singular values down to about ``sqrt(eps) · s_max``, not
``eps · s_max`` as an SVD of the data does, so directions below :data:`MOMENT_RTOL` (1e-6) of the largest
singular value count as absent here (activations are float32: below ~1e-7 they are rounding anyway). For
layers whose singular values all lie above it the matrices equal the in-memory ones to ~1e-9 (measured in
tests/test_moments.py); a rank-deficient layer (duplicated or dependent neurons) loses the same directions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from layersim.errors import LayersimError, unknown_name
from layersim.compute.linalg import default_rtol, numerical_rank, variance_rank
from layersim.similarity._common import CONSTANT_RTOL
from layersim.similarity._cca_core import check_max_dims, dimension_cap
from layersim.similarity.cka_streaming import SAMPLE_ROWS, LinearCKAAccumulator
from layersim.similarity.neurons import check_mixedsim_sizes

MOMENT_MEASURES = ("svcca", "pwcca", "mean_cca", "neuronsim", "mixedsim")
MOMENT_RTOL = 1e-6  # relative singular value below which a direction is absent (see the module docstring)


@dataclass(frozen=True)
class _Whitened:
    t: np.ndarray              # (d, r): Q = Xc T
    coords: np.ndarray | None  # (r, d) = Qᵀ Xc, for PWCCA's weights


class LayerMoments:
    """The centred cross-products of stacked layers, gathered from row batches (or arrays in memory)."""

    def __init__(self, accumulator: LinearCKAAccumulator):
        if accumulator.num_rows < 2:
            raise LayersimError(f"the moments hold {accumulator.num_rows} rows; the measures need at least 2 examples.")
        self._acc = accumulator
        self.num_rows = accumulator.num_rows
        self.widths = accumulator.widths
        self._kept: dict[int, np.ndarray] = {}
        self._whitened: dict[tuple, _Whitened] = {}

    @classmethod
    def of_layers(cls, layers: Sequence[np.ndarray], batch_rows: int = 8192,
                  sample_rows: int = SAMPLE_ROWS) -> "LayerMoments":
        """The moments of layers held in memory (each (n, d_k), rows aligned), gathered in float64, with the
        accumulator's row sample of `sample_rows` rows (0: none, so the rotation null rotates)."""
        acc = LinearCKAAccumulator(precision="float64", sample_rows=sample_rows)
        rows = layers[0].shape[0] if len(layers) else 0
        for start in range(0, max(rows, 1), batch_rows):
            acc.update([a[start:start + batch_rows] for a in layers])
        return cls(acc)

    def block(self, i: int, j: int) -> np.ndarray:
        """``Xc_iᵀ Xc_j`` (float64, d_i × d_j) for stacked layers i and j."""
        return self._acc.centred_block(i, j)

    def kept(self, i: int) -> np.ndarray:
        """Mask of layer i's non-constant neurons (the rule of layersim.similarity's constant_columns)."""
        if i not in self._kept:
            centred_sq = np.diag(self.block(i, i)).clip(min=0.0)
            mean = self._acc.layer_mean(i)
            self._kept[i] = ~(centred_sq <= CONSTANT_RTOL**2 * (centred_sq + self.num_rows * mean * mean))
            if not self._kept[i].any():
                raise LayersimError(f"layers[{i}] is constant across examples (every neuron), so its similarity is "
                                    "undefined; drop that layer or check how it was extracted.")
        return self._kept[i]

    def _cov(self, i: int) -> np.ndarray:
        """Σ_ii with constant neurons' rows and columns set to zero (as the in-memory measures zero them)."""
        cov = self.block(i, i).copy()
        dropped = ~self.kept(i)
        cov[dropped, :] = 0.0
        cov[:, dropped] = 0.0
        return cov

    def whitened(self, i: int, *, variance_threshold: float | None, rtol: float | None, max_dims,
                 keep_coords: bool = False) -> _Whitened:
        key = (i, variance_threshold, rtol, max_dims, keep_coords)
        if key not in self._whitened:
            cov = self._cov(i)
            eigenvalues, vectors = np.linalg.eigh(cov)
            order = np.argsort(eigenvalues)[::-1]
            s = np.sqrt(np.clip(eigenvalues[order], 0.0, None))
            vectors = vectors[:, order]
            d = cov.shape[0]
            tol = max(default_rtol(self.num_rows, d) if rtol is None else rtol, MOMENT_RTOL)
            rank = numerical_rank(s, tol)
            if variance_threshold is not None:
                rank = variance_rank(s[:rank], variance_threshold)
            cap = dimension_cap(self.num_rows, max_dims)
            if cap is not None:
                rank = min(rank, cap)
            t = vectors[:, :rank] / s[:rank]
            self._whitened[key] = _Whitened(t, t.T @ cov if keep_coords else None)
        return self._whitened[key]


def _canonical(moments: LayerMoments, i: int, j: int, wi: _Whitened, wj: _Whitened, uv: bool):
    product = wi.t.T @ moments.block(i, j) @ wj.t
    if not uv:
        return np.clip(np.linalg.svd(product, compute_uv=False), 0.0, 1.0)
    u, rho, vt = np.linalg.svd(product, full_matrices=False)
    return u, np.clip(rho, 0.0, 1.0), vt


def pwcca_weights(variates_dot_neurons: np.ndarray) -> np.ndarray:
    """PWCCA's weight of each canonical variate: the sum of |its inner product with each neuron|."""
    return np.abs(variates_dot_neurons).sum(axis=1)


def weighted_correlation(weights: np.ndarray, rho: np.ndarray) -> float:
    """PWCCA: the canonical correlations averaged with their variates' weights."""
    return float(np.clip(weights @ rho / weights.sum(), 0.0, 1.0))


def _pw(variates_dot_neurons: np.ndarray, rho: np.ndarray) -> float:
    return weighted_correlation(pwcca_weights(variates_dot_neurons), rho)


def moments_matrix(name: str, moments: LayerMoments, xs: Sequence[int], ys: Sequence[int] | None = None, *,
                   variance_threshold: float | None = None, rtol: float | None = None,
                   max_dims: int | str | None = "auto") -> np.ndarray:
    """The matrix [a, b] = measure(layer xs[a], layer ys[b]) of the stacked layers of `moments` (ys None: xs
    against themselves, diagonal exactly 1), with the options of the in-memory measure (``variance_threshold``:
    SVCCA's, required, and PWCCA's, optional; ``max_dims``: the CCA family's dimension cap)."""
    options = basis_options(name, moments, list(xs) if ys is None else ys, variance_threshold=variance_threshold,
                            rtol=rtol, max_dims=max_dims)
    same = ys is None
    ys = list(xs) if same else list(ys)
    pair = _PAIRS[name]
    out = np.empty((len(xs), len(ys)))
    for a, i in enumerate(xs):
        for b, j in enumerate(ys):
            if same and a == b:
                out[a, b] = 1.0
            elif same and b < a:
                continue  # filled with [b, a]
            elif same and name == "pwcca":  # both directions from one SVD
                out[a, b], out[b, a] = _pwcca_both(moments, i, j, options)
            else:
                out[a, b] = pair(moments, i, j, options)
                if same:
                    out[b, a] = out[a, b] if name in ("svcca", "mean_cca") else pair(moments, j, i, options)
    return out


def basis_options(name: str, moments: LayerMoments, ys: Sequence[int], *, variance_threshold: float | None,
                  rtol: float | None, max_dims) -> dict:
    """The options of :meth:`LayerMoments.whitened` that measure `name` uses (each measure's own cuts), after
    checking the measure's name and options against the column layers `ys`."""
    if name not in MOMENT_MEASURES:
        raise unknown_name("measure computed from moments", name, MOMENT_MEASURES)
    if name == "svcca" and variance_threshold is None:
        raise LayersimError("svcca needs a variance_threshold in (0, 1]; use mean_cca or pwcca for plain CCA.")
    check_max_dims(max_dims)
    for k in ys if name == "mixedsim" else ():
        check_mixedsim_sizes(moments.num_rows, moments.widths[k], f"layers[{k}]")
    return dict(variance_threshold=variance_threshold if name in ("svcca", "pwcca") else None, rtol=rtol,
                max_dims=None if name in ("mixedsim", "neuronsim") else max_dims)


def _svcca(m: LayerMoments, i: int, j: int, options) -> float:
    return float(_canonical(m, i, j, m.whitened(i, **options), m.whitened(j, **options), uv=False).mean())


def _mean_cca(m: LayerMoments, i: int, j: int, options) -> float:
    return float(np.mean(_canonical(m, i, j, m.whitened(i, **options), m.whitened(j, **options), uv=False) ** 2))


def _pwcca(m: LayerMoments, i: int, j: int, options) -> float:
    wi = m.whitened(i, keep_coords=True, **options)
    u, rho, _ = _canonical(m, i, j, wi, m.whitened(j, **options), uv=True)
    return _pw(u.T @ wi.coords, rho)


def _pwcca_both(m: LayerMoments, i: int, j: int, options) -> tuple[float, float]:
    """PWCCA weighted by layer i's neurons and by layer j's, from one SVD."""
    wi, wj = m.whitened(i, keep_coords=True, **options), m.whitened(j, keep_coords=True, **options)
    u, rho, vt = _canonical(m, i, j, wi, wj, uv=True)
    return _pw(u.T @ wi.coords, rho), _pw(vt @ wj.coords, rho)


def neuron_match(correlations: np.ndarray) -> float:
    """neuronsim from the correlations [a, b] of x's neurons a with y's neurons b: each x neuron's best |r|,
    averaged over x's neurons."""
    return min(float(np.abs(correlations).max(axis=1).mean()), 1.0)


def explained_share(fractions: np.ndarray) -> float:
    """mixedsim from ‖Qyᵀ xc_a‖ / ‖xc_a‖ per x neuron a (the share of its norm in y's span), averaged."""
    return float(np.minimum(fractions, 1.0).mean())


def neuron_stds(m: LayerMoments, i: int) -> np.ndarray:
    """The centred norms of layer i's kept (non-constant) neurons."""
    return np.sqrt(np.diag(m.block(i, i))[m.kept(i)])


def _neuronsim(m: LayerMoments, i: int, j: int, options) -> float:
    cross = m.block(i, j)[np.ix_(m.kept(i), m.kept(j))]
    return neuron_match(cross / np.outer(neuron_stds(m, i), neuron_stds(m, j)))


def _mixedsim(m: LayerMoments, i: int, j: int, options) -> float:
    wj = m.whitened(j, **options)
    projected = wj.t.T @ m.block(j, i)[:, m.kept(i)]          # Qyᵀ xc_a for each kept neuron a of x
    return explained_share(np.linalg.norm(projected, axis=0) / neuron_stds(m, i))


_PAIRS = {"svcca": _svcca, "pwcca": _pwcca, "mean_cca": _mean_cca, "neuronsim": _neuronsim, "mixedsim": _mixedsim}
