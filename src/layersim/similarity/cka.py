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

Precision. Centring is always done in float64: float32 activations with a large mean lose most of
their digits when centred in float32. The products that follow are the whole cost, and they can
run in float32 (about twice as fast) with float64 accumulation: feature-space cross-products are
summed over row blocks of ``BLOCK_ROWS`` rows in float32 and the blocks added in float64, Gram
matrices (sums over one layer's neurons) are formed in float32 and combined in float64. That
agrees with the all-float64 computation to ~1e-7 on activations (benchmarks/similarity.py reports
the measured max |ΔCKA|), which is below the rounding already in float32 inputs. ``precision``
chooses: "float64", "float32", or "auto" (the default) = float32 only when every input is
float32 (or narrower) *and* the products are large (at least ``FLOAT32_MIN_WORK`` multiply-adds,
where float64 would take a noticeable fraction of a second); otherwise float64.

Streaming. :class:`LinearCKAAccumulator` computes the same L x L matrix from row batches, in
memory independent of the number of examples, for activation tables larger than memory.

Edge behaviour: CKA is undefined when a representation is constant across examples (all zero after
centring; HSIC(K, K) = 0). Rather than inventing a value (0? 1? NaN?) that would silently colour a
heatmap, both functions raise :class:`~layersim.errors.LayersimError` naming the constant input
(the accumulator can instead give such layers NaN rows and columns, as layersim.similarity.comparisons does).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from layersim.errors import unknown_name
from layersim.similarity._common import centred_and_constant, named_lists

from layersim.similarity._cka_kernels import (  # noqa: F401  (used by other measures and the tests)
    BLOCK_ROWS, FLOAT32_MIN_WORK, GRAM_BYTES_LIMIT, METHODS, PANEL_COLUMNS, PRECISIONS, SCRATCH_BYTES, _cka, _costs,
    _hsic_feature, _hsic_gram, _pick_method, _product_dtype)
from layersim.similarity.cka_streaming import LinearCKAAccumulator  # noqa: F401


def linear_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Linear CKA (Kornblith et al. 2019) between (n, d1) and (n, d2) arrays.

    Parameters
    ----------
    x : array of shape ``(num_examples x hidden_x)``
    y : array of shape ``(num_examples x hidden_y)``, rows aligned with ``x``; ``hidden_y`` may
        differ from ``hidden_x``. Any real dtype; centred in float64, products as for
        :func:`cka_matrix` with ``precision="auto"``.

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
    xs: Sequence[np.ndarray],
    ys: Sequence[np.ndarray] | None = None,
    *,
    method: str = "auto",
    precision: str = "auto",
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
    method : "auto", "gram" or "feature" (all exact; they agree to ~1e-10 in float64).
        * ``"gram"`` — sample space: one centred ``n x n`` Gram per layer, then every HSIC at once
          as one product of the flattened Grams, ``HSIC = G_x G_yᵀ``. Cost ~ ``L·n²·d + L²·n²``,
          memory ``8·L·n²`` bytes.
        * ``"feature"`` — feature space: ``HSIC_ij = ||Yc_jᵀ Xc_i||_F²`` from cross-products, one
          matrix product per row of the result (against all later layers at once), self-terms
          ``||Xc_iᵀ Xc_i||_F`` from the same products. Cost ~ ``n·(sum d)²/2``, memory ~ one
          centred copy of the activations.
        * ``"auto"`` — estimate both costs from the shapes and take the cheaper, but never
          ``"gram"`` when the stacked Grams would exceed ``GRAM_BYTES_LIMIT`` (1 GiB). Few
          examples and wide layers → gram; many examples → feature.
    precision : "auto", "float32" or "float64": the precision of the matrix products (centring and
        all sums are float64 either way). "float32" is about twice as fast and agrees with
        "float64" to ~1e-7; "auto" uses it only for float32 inputs and large products
        (``FLOAT32_MIN_WORK``), see the module docstring.

    Returns
    -------
    float64 array of shape ``(len(xs), len(ys))`` with values in [0, 1].

    Raises
    ------
    LayersimError
        For an unknown ``method`` or ``precision``, an empty ``xs`` or ``ys``, or any layer that is
        not 2-D, has a different number of rows, has fewer than 2 rows, has NaN/inf, or is constant
        across examples (the message names the layer, e.g. ``xs[3]``).
    """
    if method not in METHODS:
        raise unknown_name("method", method, METHODS)
    if precision not in PRECISIONS:
        raise unknown_name("precision", precision, PRECISIONS)
    x_named, y_named = named_lists(xs, ys)
    return _cka(x_named, y_named, method=method, precision=precision)


# --- validation ---


def is_constant(a: np.ndarray) -> bool:
    """Whether a ``(num_examples x hidden)`` representation is the same for every example, so that
    its CKA with anything is undefined (e.g. the CLS token's embedding-layer output)."""
    a = np.asarray(a)
    return a.size == 0 or centred_and_constant(a)[1]


# --- computation ---
