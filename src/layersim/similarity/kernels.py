"""Kernel variants of CKA: RBF-kernel CKA and debiased linear CKA.

A representation is an array of shape ``(num_examples x hidden)``, rows aligned across inputs.

**RBF CKA** (Kornblith et al. 2019, §3): with ``K_ij = exp(-||x_i - x_j||² / (2σ²))`` and the
centring matrix ``H = I - 11ᵀ/n``,
``CKA = <HKH, HLH>_F / (||HKH||_F ||HLH||_F)``, in [0, 1] (both centred kernels are positive
semi-definite). The bandwidth is set per representation: ``σ = sigma_scale × median`` of the
Euclidean distances between distinct examples (the ``n(n-1)/2`` pairs ``i < j``; Kornblith et al.'s
code takes the median of all ``n²`` squared distances, diagonal zeros included, which comes out
slightly smaller). Invariant to orthogonal maps, isotropic scaling (σ scales with the data) and
translation; not to general invertible linear maps. Memory: one ``n x n`` float64 kernel per layer, so above
``exact_max_rows`` examples (default 10,000) the kernels are approximated by Nyström features
(:class:`NystromRBF`: ``landmarks`` seeded landmark examples per layer, default 1,500; the bandwidth rule
unchanged, its median over the million pairs of a seeded sample of rows): each kernel becomes the features'
Gram plus the diagonal they leave out, and CKA of those kernels is gathered in one pass over row blocks, in
memory independent of n; its error against the exact value is measured by ``benchmarks/similarity.py
--rbf`` (tests/test_rbf_approx.py checks it at small sizes).

**Debiased linear CKA** (Song et al. 2012's unbiased HSIC estimator, used for CKA by Nguyen et al.
2021): with the linear kernel of the centred data ``K = Xc Xcᵀ`` and ``K̃ = K - diag(K)``,

    HSIC_1(K, L) = [tr(K̃ L̃) + 1ᵀK̃1 · 1ᵀL̃1 / ((n-1)(n-2)) - 2/(n-2) · 1ᵀK̃L̃1] / (n(n-3))

and debiased CKA = ``HSIC_1(K, L) / sqrt(HSIC_1(K, K) HSIC_1(L, L))``. Because the data are centred
(``K1 = 0``), with ``k_i = ||xc_i||²`` the squared row norms, every term is cheap in feature space:
``tr(K̃L̃) = ||Xcᵀ Yc||_F² - kᵀl``, ``1ᵀK̃1 = -Σk``, ``1ᵀK̃L̃1 = kᵀl``. Unlike plain CKA it is not
biased upwards for ``n`` comparable to the widths: independent data give values near 0 (either
sign). It lies in [-1, 1] (HSIC_1 is an inner product of U-centred kernels, Székely & Rizzo 2014)
and needs ``n ≥ 4``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from layersim.errors import LayersimError, unknown_name
import layersim.similarity.cka as cka
from layersim.similarity._common import Named, centre, named_lists, validated

# An unbiased self-HSIC this small relative to the biased one counts as zero (no usable variation).
_SELF_HSIC_RTOL = 1e-12


# --- RBF CKA ---


# Above this many examples RBF CKA is approximated (Nyström) unless the caller sets exact_max_rows: the exact
# route holds an n x n float64 kernel per layer (800 MB at n = 10,000, 20 GB at 50,000).
RBF_EXACT_MAX_ROWS = 10_000
RBF_LANDMARKS = 1500       # Nyström landmarks per layer (a seeded sample of the examples)
MEDIAN_PAIRS = 1_000_000   # above this many distinct pairs the median distance is taken on a seeded sample of rows


def rbf_cka(x: np.ndarray, y: np.ndarray, sigma_scale: float = 1.0, *, exact_max_rows: int = RBF_EXACT_MAX_ROWS,
            landmarks: int = RBF_LANDMARKS, landmark_seed: int = 0) -> float:
    """CKA with Gaussian (RBF) kernels between (n, d1) and (n, d2) arrays.

    Parameters
    ----------
    x, y : arrays of shape ``(num_examples x hidden)``, rows aligned; widths may differ.
    sigma_scale : bandwidth multiplier, > 0: ``σ = sigma_scale × median pairwise distance``, per
        representation.

    Returns
    -------
    A value in [0, 1]; symmetric; 1 for ``rbf_cka(x, x)``.

    Raises
    ------
    LayersimError
        For bad shapes, fewer than 2 rows, NaN/inf, a constant input, a median pairwise distance of
        zero (more than half of the example pairs coincide), or a bad ``sigma_scale``.
    """
    return float(_rbf_cka([("x", x)], [("y", y)], sigma_scale, exact_max_rows, landmarks, landmark_seed)[0, 0])


def rbf_cka_matrix(
    xs: Sequence[np.ndarray],
    ys: Sequence[np.ndarray] | None = None,
    *,
    sigma_scale: float = 1.0,
    exact_max_rows: int = RBF_EXACT_MAX_ROWS,
    landmarks: int = RBF_LANDMARKS,
    landmark_seed: int = 0,
) -> np.ndarray:
    """All-pairs RBF CKA. Up to ``exact_max_rows`` examples exactly: each layer's centred kernel is built
    once (``8·n²`` bytes per layer) and all inner products are one matrix product of the stacked kernels.
    Above it, the Nyström approximation (:func:`nystrom_rbf_features`, ``landmarks`` per layer, seeded by
    ``landmark_seed``): each kernel is ``Φ Φᵀ`` for n x m features, and the matrix is linear CKA of the
    features, gathered in row blocks (memory in m, not n). (Not ``seed``: the null and bootstrap drivers pass
    a measure's options next to their own ``seed``.)"""
    return _rbf_cka(*named_lists(xs, ys), sigma_scale, exact_max_rows, landmarks, landmark_seed)


def _rbf_cka(x_named: Named, y_named: Named | None, sigma_scale: float, exact_max_rows: int = RBF_EXACT_MAX_ROWS,
             landmarks: int = RBF_LANDMARKS, seed: int = 0) -> np.ndarray:
    if not (isinstance(sigma_scale, (int, float)) and np.isfinite(sigma_scale) and sigma_scale > 0):
        raise LayersimError(f"sigma_scale must be a positive number, got {sigma_scale!r}.")
    for key, value in (("exact_max_rows", exact_max_rows), ("landmarks", landmarks)):
        if not (isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 2):
            raise LayersimError(f"{key} must be an integer of at least 2, got {value!r}.")
    checked = validated(x_named + (y_named or []), "RBF CKA")
    x_named, y_named = checked[: len(x_named)], (None if y_named is None else checked[len(x_named) :])
    if checked[0][1].shape[0] > exact_max_rows:
        return _nystrom_cka(x_named, y_named, sigma_scale, landmarks, seed)
    kx = _stacked_rbf(x_named, sigma_scale)
    if y_named is None:
        inner = kx @ kx.T
        norms = np.sqrt(np.diag(inner))
        out = inner / (norms[:, None] * norms[None, :])
        upper = np.triu_indices(len(x_named), 1)
        out[upper[::-1]] = out[upper]
        np.fill_diagonal(out, 1.0)
    else:
        ky = _stacked_rbf(y_named, sigma_scale)
        out = (kx @ ky.T) / (np.linalg.norm(kx, axis=1)[:, None] * np.linalg.norm(ky, axis=1)[None, :])
    return np.clip(out, 0.0, 1.0, out=out)


def _stacked_rbf(named, sigma_scale: float) -> np.ndarray:
    n = named[0][1].shape[0]
    out = np.empty((len(named), n * n))
    for k, (name, a) in enumerate(named):
        out[k] = centred_rbf_kernel(name, a, sigma_scale).ravel()
    return out


def _nystrom_cka(x_named: Named, y_named: Named | None, sigma_scale: float, landmarks: int, seed: int) -> np.ndarray:
    """RBF CKA from every layer's Nyström features with the kernel's diagonal restored, in row blocks.

    Each kernel is approximated by ``K̃ = Φ Φᵀ + D`` with ``D = diag(1 - ‖φ_i‖²)``: the Nyström part
    misses ``K - Φ Φᵀ`` (positive semi-definite), whose diagonal is known exactly because an RBF kernel's
    diagonal is 1 (the FITC correction of sparse Gaussian processes); restoring it cuts the largest error by
    a quarter to a third (0.0201 → 0.0155 at 1,000 landmarks, 0.0113 → 0.0079 at 1,500; n = 5,000,
    benchmarks/similarity.py --rbf). With ``H`` the centring matrix and ``Φc`` the
    centred features, ``tr(K̃_a H K̃_b H) = ‖Φcₐᵀ Φc_b‖²_F + Σ_i d_b,i ‖φcₐ,i‖² + Σ_i dₐ,i ‖φc_b,i‖²
    + (1 - 2/n) Σ_i dₐ,i d_b,i + (Σ dₐ)(Σ d_b)/n²``; every term is a sum over rows, so one pass gathers
    them and memory does not grow with n.
    """
    from layersim.similarity.cka_streaming import LinearCKAAccumulator

    named = x_named + (y_named or [])
    maps = [NystromRBF(name, a, sigma_scale, landmarks, seed) for name, a in named]
    n, num = named[0][1].shape[0], len(named)
    acc = LinearCKAAccumulator(precision="float32")  # float32 products: far below the approximation's error
    d_sums, dd, qd = np.zeros(num), np.zeros((num, num)), np.zeros((num, num))
    feature_sums = [np.zeros(m.rank) for m in maps]
    d_features = [np.zeros((num, m.rank)) for m in maps]  # Σ_i d_b,i φ_a,i, per layer a: row b
    for start in range(0, n, 4096):
        features = [m.features(a[start:start + 4096]) for m, (_, a) in zip(maps, named)]
        norms = np.stack([np.einsum("ij,ij->i", f, f) for f in features], axis=1)
        missing = np.maximum(1.0 - norms, 0.0)  # the diagonal Φ Φᵀ leaves out, ≥ 0 up to rounding
        d_sums += missing.sum(axis=0)
        dd += missing.T @ missing
        qd += norms.T @ missing
        for a, f in enumerate(features):
            feature_sums[a] += f.sum(axis=0)
            d_features[a] += missing.T @ f
        acc.update([f.astype(np.float32) for f in features])
    means = [total / n for total in feature_sums]
    # cross[a, b] = Σ_i d_b,i ‖φ_a,i - mean_a‖²
    cross = np.array([[qd[a, b] - 2.0 * d_features[a][b] @ means[a] + (means[a] @ means[a]) * d_sums[b]
                       for b in range(num)] for a in range(num)])
    hsic = acc.hsic() + cross + cross.T + (1.0 - 2.0 / n) * dd + np.outer(d_sums, d_sums) / n**2
    self_terms = np.sqrt(np.diag(hsic))
    whole = np.clip(hsic / np.outer(self_terms, self_terms), 0.0, 1.0)
    np.fill_diagonal(whole, 1.0)
    if y_named is None:
        return whole
    return whole[: len(x_named), len(x_named):]


class NystromRBF:
    """The Nyström feature map of one layer's RBF kernel: ``φ(x) = k(x, landmarks) K_mm^{-1/2}``, so that
    ``Φ Φᵀ = K_nm K_mm⁺ K_mn`` approximates the n x n kernel. The bandwidth follows the exact route's rule,
    ``σ = sigma_scale × median distance between distinct examples``, the median taken over all pairs up to
    :data:`MEDIAN_PAIRS` of them and above that over all pairs of a seeded sample of 1,414 rows (a million pairs); the landmarks are a seeded
    sample of the examples (without replacement). Rows are centred by the layer's mean first (distances
    do not change; the products lose fewer digits)."""

    def __init__(self, name: str, a: np.ndarray, sigma_scale: float, landmarks: int, seed: int):
        n = a.shape[0]
        self.mean = a.mean(axis=0, dtype=np.float64)
        rng = np.random.default_rng([seed, n])
        self.median = _median_distance(name, a, self.mean, rng)
        self.sigma = sigma_scale * self.median
        chosen = np.sort(rng.choice(n, min(landmarks, n), replace=False))
        self.landmarks = np.asarray(a[chosen], dtype=np.float64) - self.mean
        kernel = self._kernel(self.landmarks)
        eigenvalues, vectors = np.linalg.eigh(kernel)
        keep = eigenvalues > 1e-10 * eigenvalues.max()  # K_mm⁺ on its numerical range
        self.whitening = vectors[:, keep] / np.sqrt(eigenvalues[keep])
        self.rank = int(keep.sum())

    def _kernel(self, rows: np.ndarray) -> np.ndarray:
        sq = (np.einsum("ij,ij->i", rows, rows)[:, None] + np.einsum("ij,ij->i", self.landmarks, self.landmarks)[None, :]
              - 2.0 * rows @ self.landmarks.T)
        return np.exp(np.maximum(sq, 0.0) / (-2.0 * self.sigma * self.sigma))

    def features(self, rows: np.ndarray) -> np.ndarray:
        """(rows, rank) float64 features of some of the layer's examples."""
        return self._kernel(np.asarray(rows, dtype=np.float64) - self.mean) @ self.whitening


def _median_distance(name: str, a: np.ndarray, mean: np.ndarray, rng: np.random.Generator) -> float:
    """The median distance between distinct examples: over all pairs up to MEDIAN_PAIRS of them, above that
    over every pair of a seeded sample of rows with about MEDIAN_PAIRS pairs (one Gram product)."""
    n = a.shape[0]
    rows = n if n * (n - 1) // 2 <= MEDIAN_PAIRS else int((1 + np.sqrt(1 + 8 * MEDIAN_PAIRS)) / 2)  # 1,414 rows
    chosen = slice(None) if rows == n else np.sort(rng.choice(n, rows, replace=False))
    centred = np.asarray(a[chosen], dtype=np.float64) - mean
    gram = centred @ centred.T
    sq = np.diag(gram)[:, None] + np.diag(gram)[None, :] - 2.0 * gram
    median = float(np.median(np.sqrt(np.maximum(sq[np.triu_indices(rows, 1)], 0.0))))
    if not median > 0.0:
        raise LayersimError(
            f"{name} has a median pairwise distance of 0 (more than half of its example pairs are "
            "identical), so the RBF bandwidth is undefined; deduplicate the examples or use linear_cka."
        )
    return median


def centred_rbf_kernel(name: str, a: np.ndarray, sigma_scale: float = 1.0) -> np.ndarray:
    """``H K H`` for the RBF kernel of ``a`` with the median-distance bandwidth, (n, n) float64."""
    centred = centre(name, a, "RBF CKA")  # distances ignore translation; centring keeps them accurate
    gram = centred @ centred.T
    sq_norms = np.diag(gram).copy()
    sq_dist = sq_norms[:, None] + sq_norms[None, :] - 2.0 * gram
    np.maximum(sq_dist, 0.0, out=sq_dist)
    np.fill_diagonal(sq_dist, 0.0)
    upper = sq_dist[np.triu_indices(len(sq_dist), 1)]
    median = float(np.median(np.sqrt(upper)))
    if not median > 0.0:
        raise LayersimError(
            f"{name} has a median pairwise distance of 0 (more than half of its example pairs are "
            "identical), so the RBF bandwidth is undefined; deduplicate the examples or use linear_cka."
        )
    sigma = sigma_scale * median
    kernel = np.exp(sq_dist / (-2.0 * sigma * sigma))
    row_means = kernel.mean(axis=0)
    kernel -= row_means[:, None]
    kernel -= row_means[None, :]
    kernel += row_means.mean()
    return kernel


# --- debiased linear CKA ---


def debiased_cka(x: np.ndarray, y: np.ndarray, *, method: str = "auto") -> float:
    """Linear CKA with the unbiased HSIC estimator (Song et al. 2012; Nguyen et al. 2021).

    Parameters
    ----------
    x, y : arrays of shape ``(num_examples x hidden)``, rows aligned, at least 4 rows.
    method : how ``||Xcᵀ Yc||_F²`` is computed, as for :func:`layersim.similarity.cka_matrix`:
        "auto", "gram" (sample space) or "feature" (feature space); all exact.

    Returns
    -------
    A value in [-1, 1] (near 0, either sign, for independent data); symmetric; 1 for
    ``debiased_cka(x, x)``; invariant to orthogonal maps, isotropic scaling and translation.

    Raises
    ------
    LayersimError
        For bad shapes, fewer than 4 rows, NaN/inf, a constant input, or an input whose unbiased
        self-HSIC is not positive (too little variation for the estimator).
    """
    if method not in cka.METHODS:
        raise unknown_name("method", method, cka.METHODS)
    return float(_debiased_cka([("x", x)], [("y", y)], method)[0, 0])


def debiased_cka_matrix(
    xs: Sequence[np.ndarray],
    ys: Sequence[np.ndarray] | None = None,
    *,
    method: str = "auto",
) -> np.ndarray:
    """All-pairs debiased linear CKA. The cross terms ``||Xcᵀ Yc||_F²`` for all pairs come from the
    same machinery as :func:`layersim.similarity.cka_matrix` (``method`` "auto", "gram" or
    "feature"); the correction terms need only each layer's squared row norms."""
    if method not in cka.METHODS:
        raise unknown_name("method", method, cka.METHODS)
    return _debiased_cka(*named_lists(xs, ys), method)


def _debiased_cka(x_named: Named, y_named: Named | None, method: str) -> np.ndarray:
    checked = validated(x_named + (y_named or []), "debiased CKA", min_rows=4)
    x_named, y_named = checked[: len(x_named)], (None if y_named is None else checked[len(x_named) :])
    n = x_named[0][1].shape[0]

    # Row norms of the centred data; this also rejects constant layers with a debiased-CKA message.
    rows_x = np.stack([_sq_row_norms(name, a) for name, a in x_named])
    rows_y = rows_x if y_named is None else np.stack([_sq_row_norms(name, a) for name, a in y_named])
    if method == "auto":
        method = cka._pick_method(
            n, [a.shape[1] for _, a in x_named], None if y_named is None else [a.shape[1] for _, a in y_named]
        )
    hsic_fn = cka._hsic_gram if method == "gram" else cka._hsic_feature
    cross, self_x, self_y = hsic_fn(x_named, y_named)
    own_x = np.einsum("ij,ij->i", rows_x, rows_x)
    own_y = own_x if y_named is None else np.einsum("ij,ij->i", rows_y, rows_y)
    return debiased_from_sums(n, cross, rows_x @ rows_y.T, (self_x, own_x, rows_x.sum(1), [k for k, _ in x_named]),
                              None if y_named is None else (self_y, own_y, rows_y.sum(1), [k for k, _ in y_named]))


def streamed_debiased_cka(accumulator, layers: Sequence[int]) -> np.ndarray:
    """Debiased CKA between the given layers of a :class:`~layersim.similarity.LinearCKAAccumulator`, every
    pair, from the sums it gathered over row batches: the same matrix as :func:`debiased_cka_matrix` on the
    concatenated rows (to rounding), in memory independent of the number of examples."""
    n = accumulator.num_rows
    if n < 4:
        raise LayersimError(f"debiased CKA needs at least 4 examples, got {n}.")
    chosen = np.ix_(list(layers), list(layers))
    hsic = accumulator.hsic()[chosen]
    trace, products = accumulator.row_norm_products()
    products = products[chosen]
    picked = np.asarray(list(layers))
    return debiased_from_sums(n, hsic, products, (np.diag(hsic), np.diag(products), trace[picked],
                                                  [f"layers[{k}]" for k in picked]), None)


def debiased_from_sums(n: int, cross: np.ndarray, products: np.ndarray, x_sums: tuple, y_sums: tuple | None
                       ) -> np.ndarray:
    """Debiased CKA from sums over the examples, the same whether the rows were in memory or streamed:
    ``cross[a, b] = ‖Xc_aᵀ Yc_b‖²_F``, ``products[a, b] = Σ_i ‖xc_a,i‖² ‖yc_b,i‖²`` and per side
    ``(self-HSICs ‖Xcᵀ Xc‖²_F, Σ_i ‖xc_i‖⁴, Σ_i ‖xc_i‖², names)``; ``y_sums`` None: x against itself."""
    def unbiased(xty, kk, trace_x, trace_y):
        # n(n-3)·HSIC_1 (the common factor cancels in the ratio).
        return xty - n / (n - 2.0) * kk + np.outer(trace_x, trace_y) / ((n - 1.0) * (n - 2.0))

    def denominator(self_hsic, own, trace, names):
        value = np.diag(unbiased(np.diag(self_hsic), np.diag(own), trace, trace))
        return _checked_self(value, self_hsic, names)

    den_x = denominator(*x_sums)
    den_y = den_x if y_sums is None else denominator(*y_sums)
    num = unbiased(cross, products, x_sums[2], (x_sums if y_sums is None else y_sums)[2])
    out = num / (np.sqrt(den_x)[:, None] * np.sqrt(den_y)[None, :])
    if y_sums is None:
        upper = np.triu_indices(len(out), 1)
        out[upper[::-1]] = out[upper]
        np.fill_diagonal(out, 1.0)
    return np.clip(out, -1.0, 1.0, out=out)


def _sq_row_norms(name: str, a: np.ndarray) -> np.ndarray:
    centred = centre(name, a, "debiased CKA")
    return np.einsum("ij,ij->i", centred, centred)


def _checked_self(unbiased_self: np.ndarray, biased_self: np.ndarray, names) -> np.ndarray:
    for value, biased, name in zip(unbiased_self, biased_self, names):
        if not value > _SELF_HSIC_RTOL * biased:
            raise LayersimError(
                f"{name} has an unbiased self-HSIC of {value:.3g} (not positive), so its debiased CKA is "
                "undefined; it varies too little across the examples (use more examples or linear_cka)."
            )
    return unbiased_self
