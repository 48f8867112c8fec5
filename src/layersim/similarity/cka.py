"""Linear centred kernel alignment (CKA; Kornblith et al. 2019) between layer representations.

A representation is an array of shape ``(num_examples x hidden)``: one row per example, the same
examples in the same order on both sides. Widths may differ. With the linear kernels
``K = X Xᵀ`` and ``L = Y Yᵀ`` and the centring matrix ``H = I_n - 1 1ᵀ / n`` (Phang et al. 2021,
Appendix A)::

    HSIC(K, L) = tr(K H L H) / (n - 1)²
    CKA(X, Y)  = HSIC(K, L) / sqrt(HSIC(K, K) · HSIC(L, L))

The ``1 / (n - 1)²`` factors cancel, so they are never computed. Two exact ways to get the traces,
with ``Xc = H X`` (columns centred):

* sample space ("gram"): ``H K H = Xc Xcᵀ``, so ``tr(K H L H) = <Xc Xcᵀ, Yc Ycᵀ>_F`` — an inner
  product of two centred ``n x n`` Gram matrices;
* feature space ("feature"): ``tr(Xc Xcᵀ Yc Ycᵀ) = ||Ycᵀ Xc||_F²``, so
  ``CKA = ||Ycᵀ Xc||_F² / (||Xcᵀ Xc||_F · ||Ycᵀ Yc||_F)`` with no ``n x n`` matrix at all.

Everything is computed in float64 whatever the input dtype: float32 activations with a large mean
lose most of their digits when centred in float32.

Edge behaviour: CKA is undefined when a representation is constant across examples (all zero after
centring; HSIC(K, K) = 0). Rather than inventing a value (0? 1? NaN?) that would silently colour a
heatmap, both functions raise :class:`~layersim.errors.LayersimError` naming the constant input.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from layersim.errors import LayersimError, unknown_name
from layersim.similarity._common import centre, centred_and_constant, named_lists, validated

METHODS = ("auto", "feature", "gram")

# "auto" never stacks more centred Gram matrices than this (float64 bytes); beyond it the
# feature-space method is used even when it needs more arithmetic.
GRAM_BYTES_LIMIT = 1 << 30



def linear_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Linear CKA (Kornblith et al. 2019) between (n, d1) and (n, d2) arrays.

    Parameters
    ----------
    x : array of shape ``(num_examples x hidden_x)``
    y : array of shape ``(num_examples x hidden_y)``, rows aligned with ``x``; ``hidden_y`` may
        differ from ``hidden_x``. Any real dtype; computed in float64.

    Returns
    -------
    ``HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L))`` with ``K = X Xᵀ``, ``L = Y Yᵀ``, ``H = I - 11ᵀ/n``
    and ``HSIC(K, L) = tr(K H L H) / (n-1)²``, evaluated through whichever of the equivalent forms
    (``<H K H, H L H>_F`` or ``||Ycᵀ Xc||_F²``) is cheaper for these shapes. A value in [0, 1];
    invariant to orthogonal transforms, isotropic scaling and translation of either input.

    Raises
    ------
    LayersimError
        If an input is not 2-D, the row counts differ, there are fewer than 2 rows, an input has
        NaN/inf, or an input is constant across examples (CKA undefined; see the module docstring).
    """
    return float(_cka([("x", x)], [("y", y)], method="auto")[0, 0])


def cka_matrix(
    xs: Sequence[np.ndarray], ys: Sequence[np.ndarray] | None = None, *, method: str = "auto"
) -> np.ndarray:
    """All-pairs linear CKA: entry [i, j] = linear_cka(xs[i], ys[j]); ys=None means ys = xs (symmetric, computed once).

    Each layer's statistics (its centred Gram matrix, or its centred activations and
    ``||Xcᵀ Xc||_F``) are computed once, never per pair.

    Parameters
    ----------
    xs : sequence of arrays, each ``(num_examples x hidden_i)``; widths may differ between layers,
        the examples (rows) must be the same for all.
    ys : sequence of arrays like ``xs`` (same ``num_examples``), or None to compare ``xs`` with
        itself. Then only the upper triangle is computed and mirrored, so the result is exactly
        symmetric, and its diagonal is exactly 1.0.
    method : "auto", "gram" or "feature" (all exact; they agree to ~1e-10).
        * ``"gram"`` — sample space: one centred ``n x n`` Gram per layer, then every HSIC at once
          as one product of the flattened Grams, ``HSIC = G_x G_yᵀ``. Cost ~ ``L·n²·d + L²·n²``,
          memory ``8·L·n²`` bytes.
        * ``"feature"`` — feature space: ``HSIC_ij = ||Yc_jᵀ Xc_i||_F²`` from cross-products, one
          matrix product per row of the result, self-terms ``||Xc_iᵀ Xc_i||_F`` once per layer.
          Cost ~ ``L²·n·d²``, memory ~ the centred activations.
        * ``"auto"`` — estimate both costs from the shapes and take the cheaper, but never
          ``"gram"`` when the stacked Grams would exceed ``GRAM_BYTES_LIMIT`` (1 GiB). Few
          examples and wide layers → gram; many examples → feature.

    Returns
    -------
    float64 array of shape ``(len(xs), len(ys))`` with values in [0, 1].

    Raises
    ------
    LayersimError
        For an unknown ``method``, an empty ``xs`` or ``ys``, or any layer that is not 2-D, has a
        different number of rows, has fewer than 2 rows, has NaN/inf, or is constant across
        examples (the message names the layer, e.g. ``xs[3]``).
    """
    if method not in METHODS:
        raise unknown_name("method", method, METHODS)
    x_named, y_named = named_lists(xs, ys)
    return _cka(x_named, y_named, method=method)


# --- validation ---


def is_constant(a: np.ndarray) -> bool:
    """Whether a ``(num_examples x hidden)`` representation is the same for every example, so that
    its CKA with anything is undefined (e.g. the CLS token's embedding-layer output)."""
    a = np.asarray(a)
    return a.size == 0 or centred_and_constant(a)[1]


# --- computation ---


def _pick_method(num_examples: int, widths_x: Sequence[int], widths_y: Sequence[int] | None) -> str:
    """The "auto" rule: the method with fewer multiply-adds, gram only if its Grams fit the limit.

    ``widths_y`` None is the symmetric case (only the upper triangle is computed).
    """
    n = num_examples
    dx = np.asarray(widths_x, dtype=np.float64)  # float: products of big shapes overflow int64
    if widths_y is None:
        num_grams = len(dx)
        gram_cost = n * n * dx.sum() + len(dx) * (len(dx) + 1) / 2 * n * n
        feature_cost = n * (dx.sum() ** 2 + (dx**2).sum()) / 2  # sum over i <= j of n·d_i·d_j
    else:
        dy = np.asarray(widths_y, dtype=np.float64)
        num_grams = len(dx) + len(dy)
        gram_cost = n * n * (dx.sum() + dy.sum()) + len(dx) * len(dy) * n * n
        feature_cost = n * dx.sum() * dy.sum() + n * ((dx**2).sum() + (dy**2).sum())
    gram_bytes = 8.0 * num_grams * n * n
    return "gram" if gram_bytes <= GRAM_BYTES_LIMIT and gram_cost < feature_cost else "feature"


def _cka(
    x_named: list[tuple[str, np.ndarray]], y_named: list[tuple[str, np.ndarray]] | None, *, method: str
) -> np.ndarray:
    """Validate, pick the method, compute HSIC for all pairs, normalise.

    Inputs are (name used in error messages, array) pairs; ``y_named`` None is the symmetric case.
    """
    symmetric = y_named is None
    checked = validated(x_named + (y_named or []), "CKA")
    x_named, y_named = checked[: len(x_named)], checked[len(x_named) :]

    n = x_named[0][1].shape[0]
    if method == "auto":
        method = _pick_method(
            n, [a.shape[1] for _, a in x_named], None if symmetric else [a.shape[1] for _, a in y_named]
        )
    hsic_fn = _hsic_gram if method == "gram" else _hsic_feature
    hsic, self_x, self_y = hsic_fn(x_named, None if symmetric else y_named)

    # HSIC(K,K) = ||Xcᵀ Xc||_F² > 0 for every layer that passed centre; product of roots, not
    # root of product, so huge activations cannot overflow.
    cka = hsic / (np.sqrt(self_x)[:, None] * np.sqrt(self_y)[None, :])
    # Rounding can push a value a few ulps outside the mathematical range [0, 1].
    np.clip(cka, 0.0, 1.0, out=cka)
    if symmetric:
        upper = np.triu_indices(len(x_named), 1)
        cka[upper[::-1]] = cka[upper]  # mirror: exactly symmetric by construction
        np.fill_diagonal(cka, 1.0)  # CKA(X, X) = 1 exactly; constant layers were rejected above
    return cka


def _hsic_gram(
    x_named: list[tuple[str, np.ndarray]], y_named: list[tuple[str, np.ndarray]] | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sample space: HSIC_ij = <Xc_i Xc_iᵀ, Yc_j Yc_jᵀ>_F for all pairs as one matrix product.

    Returns (unnormalised HSIC matrix, HSIC(K_i, K_i) per x layer, HSIC(L_j, L_j) per y layer).
    """
    grams_x = _stacked_grams(x_named)
    if y_named is None:
        # A matrix times its own transpose: NumPy hands this to BLAS syrk, which computes one
        # triangle only and copies it to the other.
        hsic = grams_x @ grams_x.T
        self_x = np.diag(hsic).copy()
        return hsic, self_x, self_x
    grams_y = _stacked_grams(y_named)
    hsic = grams_x @ grams_y.T
    # Row-wise squared norms without materialising an (L, n²) temporary.
    return hsic, np.einsum("ij,ij->i", grams_x, grams_x), np.einsum("ij,ij->i", grams_y, grams_y)


def _stacked_grams(named: list[tuple[str, np.ndarray]]) -> np.ndarray:
    """Centred Gram ``H K H = Xc Xcᵀ`` of each layer, flattened to one row each: (L, n²)."""
    n = named[0][1].shape[0]
    grams = np.empty((len(named), n, n))
    for k, (name, a) in enumerate(named):
        centred = centre(name, a, "CKA")  # one layer's float64 copy alive at a time
        np.matmul(centred, centred.T, out=grams[k])
    return grams.reshape(len(named), n * n)


def _hsic_feature(
    x_named: list[tuple[str, np.ndarray]], y_named: list[tuple[str, np.ndarray]] | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Feature space: HSIC_ij = ||Yc_jᵀ Xc_i||_F², one product per row of the result.

    All y layers are centred once into one (n, sum d_j) array so that row i is a single product
    ``Xc_iᵀ [Yc_1 ... Yc_L]`` followed by per-block sums of squares.
    Returns (unnormalised HSIC matrix, HSIC(K_i, K_i) per x layer, HSIC(L_j, L_j) per y layer).
    """
    if y_named is None:
        stacked, offsets, _ = _stacked_centred(x_named)
        num = len(x_named)
        hsic = np.zeros((num, num))
        for i in range(num):
            # Upper triangle only: layer i against layers i..L-1 (the diagonal block included).
            block = stacked[:, offsets[i] : offsets[i + 1]].T @ stacked[:, offsets[i] :]
            hsic[i, i:] = _block_sq_norms(block, offsets[i:-1] - offsets[i])
        self_x = np.diag(hsic).copy()
        return hsic, self_x, self_x

    stacked_y, offsets_y, self_y = _stacked_centred(y_named)
    hsic = np.empty((len(x_named), len(y_named)))
    self_x = np.empty(len(x_named))
    for i, (name, a) in enumerate(x_named):
        centred = centre(name, a, "CKA")
        self_x[i] = _sq_norm(centred.T @ centred)
        hsic[i] = _block_sq_norms(centred.T @ stacked_y, offsets_y[:-1])
    return hsic, self_x, self_y


def _stacked_centred(named: list[tuple[str, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Centred layers side by side, (n, sum d), their column offsets, and ||Xcᵀ Xc||_F² of each."""
    widths = [a.shape[1] for _, a in named]
    offsets = np.concatenate([[0], np.cumsum(widths)])
    stacked = np.empty((named[0][1].shape[0], int(offsets[-1])))
    self_terms = np.empty(len(named))
    for k, (name, a) in enumerate(named):
        centred = centre(name, a, "CKA")
        self_terms[k] = _sq_norm(centred.T @ centred)
        stacked[:, offsets[k] : offsets[k + 1]] = centred
    return stacked, offsets, self_terms


def _block_sq_norms(block: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Squared Frobenius norm of each column block of ``block`` (blocks begin at ``starts``)."""
    # Every layer has width >= 1 (a zero-width layer is rejected as constant), so no block is empty.
    return np.add.reduceat(np.einsum("ij,ij->j", block, block), starts)


def _sq_norm(a: np.ndarray) -> float:
    return float(np.einsum("ij,ij->", a, a))
