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
(the accumulator can instead give such layers NaN rows and columns, as layersim.comparisons does).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from layersim.errors import LayersimError, unknown_name
from layersim.similarity._common import (CONSTANT_RTOL, as_list, centre, centre_into, centred_and_constant,
                                         named_lists, validated)

METHODS = ("auto", "feature", "gram")
PRECISIONS = ("auto", "float32", "float64")

# "auto" never stacks more centred Gram matrices than this (float64 bytes); beyond it the
# feature-space method is used even when it needs more arithmetic.
GRAM_BYTES_LIMIT = 1 << 30

# precision="auto" uses float32 products only from this many multiply-adds on (~0.1–0.3 s in
# float64 on a laptop core): below it the time saved is not worth any digits.
FLOAT32_MIN_WORK = 1 << 32

# Rows per float32 product before it is added into the float64 sums. Rounding in a float32 sum of k
# products grows like sqrt(k)·6e-8; 4096 rows keeps each partial sum's error ~4e-6 relative (CKA
# itself ~3e-8, measured), while adding a partial sum into float64 costs ~1/4096 of its product.
BLOCK_ROWS = 4096

# Feature-space products take this many columns of the stacked layers at a time (see _panels).
PANEL_COLUMNS = 2048

# LinearCKAAccumulator shifts at most about this many bytes of rows at a time.
SCRATCH_BYTES = 1 << 28


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


def _costs(
    num_examples: int, widths_x: Sequence[int], widths_y: Sequence[int] | None
) -> tuple[float, float, float]:
    """Multiply-adds of the gram and feature methods, and the bytes of the stacked Grams.

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
    return float(gram_cost), float(feature_cost), 8.0 * num_grams * n * n


def _pick_method(num_examples: int, widths_x: Sequence[int], widths_y: Sequence[int] | None) -> str:
    """The "auto" rule: the method with fewer multiply-adds, gram only if its Grams fit the limit.

    ``widths_y`` None is the symmetric case (only the upper triangle is computed).
    """
    gram_cost, feature_cost, gram_bytes = _costs(num_examples, widths_x, widths_y)
    return "gram" if gram_bytes <= GRAM_BYTES_LIMIT and gram_cost < feature_cost else "feature"


def _product_dtype(precision: str, arrays: Sequence[np.ndarray], work: float) -> type:
    """The dtype the matrix products run in (see the module docstring for the "auto" rule)."""
    if precision == "auto":
        # Integers go to float64: float32 holds integers exactly only up to 2**24.
        narrow = all(a.dtype.kind == "f" and a.dtype.itemsize <= 4 for a in arrays)
        precision = "float32" if narrow and work >= FLOAT32_MIN_WORK else "float64"
    return np.float32 if precision == "float32" else np.float64


def _cka(
    x_named: list[tuple[str, np.ndarray]],
    y_named: list[tuple[str, np.ndarray]] | None,
    *,
    method: str,
    precision: str = "auto",
) -> np.ndarray:
    """Validate, pick the method and precision, compute HSIC for all pairs, normalise.

    Inputs are (name used in error messages, array) pairs; ``y_named`` None is the symmetric case.
    """
    symmetric = y_named is None
    checked = validated(x_named + (y_named or []), "CKA")
    x_named, y_named = checked[: len(x_named)], checked[len(x_named) :]

    n = x_named[0][1].shape[0]
    widths_x = [a.shape[1] for _, a in x_named]
    widths_y = None if symmetric else [a.shape[1] for _, a in y_named]
    if method == "auto":
        method = _pick_method(n, widths_x, widths_y)
    gram_cost, feature_cost, _ = _costs(n, widths_x, widths_y)
    dtype = _product_dtype(precision, [a for _, a in checked], gram_cost if method == "gram" else feature_cost)
    hsic_fn = _hsic_gram if method == "gram" else _hsic_feature
    hsic, self_x, self_y = hsic_fn(x_named, None if symmetric else y_named, dtype=dtype)
    return _normalise(hsic, self_x, self_y, symmetric)


def _normalise(hsic: np.ndarray, self_x: np.ndarray, self_y: np.ndarray, symmetric: bool) -> np.ndarray:
    """CKA from HSIC: divide by the self-terms, clip to [0, 1], mirror and set the diagonal if symmetric."""
    # HSIC(K,K) = ||Xcᵀ Xc||_F² > 0 for every non-constant layer; product of roots, not root of
    # product, so huge activations cannot overflow.
    cka = hsic / (np.sqrt(self_x)[:, None] * np.sqrt(self_y)[None, :])
    # Rounding can push a value a few ulps outside the mathematical range [0, 1].
    np.clip(cka, 0.0, 1.0, out=cka)
    if symmetric:
        upper = np.triu_indices(len(cka), 1)
        cka[upper[::-1]] = cka[upper]  # mirror: exactly symmetric by construction
        np.fill_diagonal(cka, 1.0)  # CKA(X, X) = 1 exactly; constant layers were rejected before
    return cka


def _hsic_gram(
    x_named: list[tuple[str, np.ndarray]],
    y_named: list[tuple[str, np.ndarray]] | None,
    *,
    dtype: type = np.float64,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sample space: HSIC_ij = <Xc_i Xc_iᵀ, Yc_j Yc_jᵀ>_F for all pairs as one matrix product.

    Returns (unnormalised HSIC matrix, HSIC(K_i, K_i) per x layer, HSIC(L_j, L_j) per y layer).
    """
    grams_x = _stacked_grams(x_named, dtype)
    if y_named is None:
        # A matrix times its own transpose: NumPy hands this to BLAS syrk, which computes one
        # triangle only and copies it to the other.
        hsic = grams_x @ grams_x.T
        self_x = np.diag(hsic).copy()
        return hsic, self_x, self_x
    grams_y = _stacked_grams(y_named, dtype)
    hsic = grams_x @ grams_y.T
    # Row-wise squared norms without materialising an (L, n²) temporary.
    return hsic, np.einsum("ij,ij->i", grams_x, grams_x), np.einsum("ij,ij->i", grams_y, grams_y)


def _stacked_grams(named: list[tuple[str, np.ndarray]], dtype: type) -> np.ndarray:
    """Centred Gram ``H K H = Xc Xcᵀ`` of each layer, flattened to one float64 row each: (L, n²).

    A Gram entry sums only one layer's ``d`` products, so forming it in float32 is accurate; the
    HSIC sums over ``n²`` entries that follow stay in float64.
    """
    n = named[0][1].shape[0]
    grams = np.empty((len(named), n, n))
    part = None if dtype == np.float64 else np.empty((n, n), dtype=dtype)
    for k, (name, a) in enumerate(named):
        centred = centre(name, a, "CKA")  # one layer's float64 copy alive at a time
        if part is None:
            np.matmul(centred, centred.T, out=grams[k])
        else:
            low = centred.astype(dtype)
            del centred
            np.matmul(low, low.T, out=part)
            grams[k] = part
    return grams.reshape(len(named), n * n)


def _hsic_feature(
    x_named: list[tuple[str, np.ndarray]],
    y_named: list[tuple[str, np.ndarray]] | None,
    *,
    dtype: type = np.float64,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Feature space: HSIC_ij = ||Yc_jᵀ Xc_i||_F² from cross-products, then per-block sums of squares.

    The layers are centred once into one (n, sum d) array. Symmetric case: the upper triangle of
    ``Zᵀ Z`` for that stack ``Z``, a panel of rows at a time (see :func:`_panels`). Otherwise each
    panel of x layers against the whole y stack, and every layer's own ``||Xcᵀ Xc||_F²``. All
    cross-products are summed in float64 (see :func:`_add_cross`).
    Returns (unnormalised HSIC matrix, HSIC(K_i, K_i) per x layer, HSIC(L_j, L_j) per y layer).
    """
    if y_named is None:
        stacked, offsets = _stacked_centred(x_named, dtype)
        hsic = np.zeros((len(x_named), len(x_named)))
        panels = _panels(offsets)
        shapes = [(offsets[stop] - offsets[first], offsets[-1] - offsets[first]) for first, stop in panels]
        # One float64 sum and one scratch, sized for the largest panel, reused: fresh ones would be
        # page-faulted in again for every panel.
        sums = np.empty(max(rows * columns for rows, columns in shapes))
        part = None if dtype == np.float64 else np.empty(sums.size, dtype=dtype)
        for (first, stop), (rows, columns) in zip(panels, shapes):
            panel = sums[: rows * columns].reshape(rows, columns)
            _add_panel(panel, stacked, offsets[first], offsets[stop], part, overwrite=True)
            _panel_hsic(hsic, panel, offsets, first, stop)
        self_x = np.diag(hsic).copy()
        return hsic, self_x, self_x

    stacked_y, offsets_y = _stacked_centred(y_named, dtype)
    self_y = np.array([_sq_norm(_cross(part, part)) for part in _column_blocks(stacked_y, offsets_y)])
    hsic = np.empty((len(x_named), len(y_named)))
    self_x = np.empty(len(x_named))
    offsets_x = np.concatenate([[0], np.cumsum([a.shape[1] for _, a in x_named])])
    for first, stop in _panels(offsets_x):
        # One panel of x layers centred at a time: memory of one panel, products wide enough for BLAS.
        stacked_x, local = _stacked_centred(x_named[first:stop], dtype)
        for k, part in enumerate(_column_blocks(stacked_x, local)):
            self_x[first + k] = _sq_norm(_cross(part, part))
        cross = _cross(stacked_x, stacked_y)
        for k in range(stop - first):
            hsic[first + k] = _block_sq_norms(cross[local[k] : local[k + 1]], offsets_y[:-1])
    return hsic, self_x, self_y


def _stacked_centred(named: list[tuple[str, np.ndarray]], dtype: type) -> tuple[np.ndarray, np.ndarray]:
    """Centred layers side by side in ``dtype``, (n, sum d), and their column offsets."""
    widths = [a.shape[1] for _, a in named]
    offsets = np.concatenate([[0], np.cumsum(widths)])
    stacked = np.empty((named[0][1].shape[0], int(offsets[-1])), dtype=dtype)
    for k, (name, a) in enumerate(named):
        # Centred in float64, rounded to the product dtype only afterwards.
        centre_into(name, a, stacked[:, offsets[k] : offsets[k + 1]], "CKA")
    return stacked, offsets


def _column_blocks(stacked: np.ndarray, offsets: np.ndarray) -> list[np.ndarray]:
    return [stacked[:, offsets[k] : offsets[k + 1]] for k in range(len(offsets) - 1)]


def _panels(offsets: np.ndarray) -> list[tuple[int, int]]:
    """Consecutive layers grouped into panels of at least PANEL_COLUMNS columns (the last may be
    narrower): (first layer, stop layer) each. A panel's rows of the upper triangle of ``Zᵀ Z`` are
    one product with itself (syrk) and one with all later columns (GEMM); narrow layers one by one
    would make thin products that run far below the BLAS peak. Small stacks are a single panel."""
    panels, first = [], 0
    num = len(offsets) - 1
    while first < num:
        stop = first + 1
        while stop < num and offsets[stop] - offsets[first] < PANEL_COLUMNS:
            stop += 1
        panels.append((first, stop))
        first = stop
    return panels


def _panel_hsic(hsic: np.ndarray, panel: np.ndarray, offsets: np.ndarray, first: int, stop: int) -> None:
    """Fill rows first..stop-1 of the upper triangle of ``hsic`` from a panel's centred cross-products
    (columns from the panel's first layer on)."""
    for i in range(first, stop):
        rows = panel[offsets[i] - offsets[first] : offsets[i + 1] - offsets[first], offsets[i] - offsets[first] :]
        hsic[i, i:] = _block_sq_norms(rows, offsets[i:-1] - offsets[i])


def _add_panel(
    out: np.ndarray, z: np.ndarray, start: int, stop: int, part: np.ndarray | None = None, *, overwrite: bool = False
) -> None:
    """``out += z[:, start:stop]ᵀ z[:, start:]``: a panel's rows of the upper triangle of ``zᵀ z``, its own
    block in full (``part``: optional flat scratch of ``out.size`` in z's dtype; ``overwrite``: ``out =``
    instead; see :func:`_add_cross`)."""
    width = stop - start
    rest = out.shape[1] - width
    own = None if part is None else part[: width * width].reshape(width, width)
    later = None if part is None else part[width * width : width * width + width * rest].reshape(width, rest)
    _add_cross(out[:, :width], z[:, start:stop], z[:, start:stop], own, overwrite=overwrite)  # a is b: syrk
    if rest:
        _add_cross(out[:, width:], z[:, start:stop], z[:, stop:], later, overwrite=overwrite)


def _cross(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``aᵀ b`` in float64 for (n, p) and (n, q) arrays of the same dtype."""
    out = np.empty((a.shape[1], b.shape[1]))
    _add_cross(out, a, b, overwrite=True)
    return out


def _add_cross(
    out: np.ndarray, a: np.ndarray, b: np.ndarray, part: np.ndarray | None = None, *, overwrite: bool = False
) -> None:
    """``out += aᵀ b`` (``out = aᵀ b`` with ``overwrite``): float64 inputs in one product; float32 inputs
    in row blocks of BLOCK_ROWS, each block's float32 product added into the float64 ``out`` (``part``:
    optional scratch of ``out``'s shape in the inputs' dtype)."""
    if a.dtype == np.float64:
        if overwrite:
            np.matmul(a.T, b, out=out)
        else:
            out += a.T @ b
        return
    if part is None:
        part = np.empty(out.shape, dtype=a.dtype)
    for start in range(0, a.shape[0], BLOCK_ROWS):
        # Column slices of a C-contiguous array are strided views BLAS takes as they are (no copy);
        # with a is b NumPy runs syrk.
        np.matmul(a[start : start + BLOCK_ROWS].T, b[start : start + BLOCK_ROWS], out=part)
        if overwrite and start == 0:
            # The first block is written, not added: no separate pass to zero ``out``.
            out[...] = part
        else:
            out += part


def _block_sq_norms(block: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Squared Frobenius norm of each column block of ``block`` (blocks begin at ``starts``)."""
    # Every layer has width >= 1 (a zero-width layer is rejected as constant), so no block is empty.
    return np.add.reduceat(np.einsum("ij,ij->j", block, block), starts)


def _sq_norm(a: np.ndarray) -> float:
    return float(np.einsum("ij,ij->", a, a))


# --- streaming ---


class LinearCKAAccumulator:
    """Exact linear CKA between every pair of L layers, from the examples' rows in batches.

    For activation tables larger than memory: feed the rows of all layers batch by batch (the same
    examples in the same order in every layer), then ask for the L x L matrix. It equals
    ``cka_matrix(layers)`` on the concatenated rows (to ~1e-12 with ``precision="float64"``,
    ~1e-7 with float32 products) whatever the batch sizes, and its memory does not grow with the
    number of rows: float64 sums of the cross-products of every pair of layers (the upper triangle
    of ``Zᵀ Z`` for the stacked layers ``Z``, in panels: about ``4·(sum d)²`` bytes, 0.49 GB for 13
    layers of 768, 3.9 GB for 39) plus one block of rows; see :meth:`memory_bytes`.

    Centring needs the mean, which a single pass only knows at the end. So every row is shifted by
    the first batch's means ``s`` (float64) before its products are taken, ``u = x - s``, and the
    sums ``Σ u`` and ``Σ uᵀu`` are kept; at the end ``Zcᵀ Zc = Σ uᵀu - n ū ūᵀ``. Because ``s`` is
    already close to the mean, ``ū`` is small and the subtraction cancels few digits, where the
    textbook ``Σ xᵀx - n x̄ x̄ᵀ`` would lose them all for activations with large means.

    ::

        acc = LinearCKAAccumulator()
        for batch in table.iter_batches(4096):   # each: list of (rows, hidden) arrays, one per layer
            acc.update(batch)
        matrix = acc.matrix()

    Parameters
    ----------
    precision : "auto", "float32" or "float64" — the precision of the products, as for
        :func:`cka_matrix` (shifts and all sums are float64). "auto" (default) is float32 when the
        first batch is float32 (or narrower) and float64 otherwise: the number of rows is not known
        in advance, so unlike cka_matrix it does not look at the size.
    """

    def __init__(self, *, precision: str = "auto"):
        if precision not in PRECISIONS:
            raise unknown_name("precision", precision, PRECISIONS)
        self.precision = precision
        self.num_rows = 0
        self._dtype: type | None = None
        self._offsets: np.ndarray | None = None
        self._panels: list[tuple[int, int]] = []
        self._shift: list[np.ndarray] | None = None  # per layer, float64
        self._sums: np.ndarray | None = None  # Σ u over rows, per stacked column
        self._cross: list[np.ndarray] = []  # per panel: Σ u_panelᵀ u[:, panel start:]
        self._part: np.ndarray | None = None  # float32 scratch for the largest panel product

    @property
    def widths(self) -> list[int] | None:
        """The layers' widths, fixed by the first batch (None before it)."""
        return None if self._offsets is None else np.diff(self._offsets).tolist()

    @staticmethod
    def memory_bytes(widths: Sequence[int], batch_rows: int, precision: str = "float64") -> int:
        """About how many bytes an accumulator for layers of these widths holds while it is fed
        batches of ``batch_rows`` rows (the batches themselves not counted)."""
        offsets = np.concatenate([[0], np.cumsum(widths)]).astype(np.int64)
        sizes = [int(offsets[stop] - offsets[first]) * int(offsets[-1] - offsets[first])
                 for first, stop in _panels(offsets)]
        item = 4 if precision == "float32" else 8
        rows = min(batch_rows, LinearCKAAccumulator._block_rows(int(offsets[-1]), item))
        # The sums, one panel product before it is added, the shifted block of rows.
        return 8 * (sum(sizes) + int(offsets[-1])) + item * max(sizes) + item * rows * int(offsets[-1])

    def update(self, layers: Sequence[np.ndarray]) -> None:
        """Add a batch of rows: ``layers[k]`` is a (rows, d_k) array for layer k; every batch has the
        same layers and widths, and the same number of rows in every layer.

        Raises LayersimError for a batch that is not that, or holds NaN/inf (naming the layer).
        """
        named = [(f"layers[{k}]", a) for k, a in enumerate(as_list(layers, "layers"))]
        arrays = [a for _, a in validated(named, "CKA", min_rows=0)]
        if self._offsets is None:
            self._start(arrays)
        else:
            widths = [a.shape[1] for a in arrays]
            if widths != self.widths:
                raise LayersimError(
                    f"this batch has layers of widths {widths}, but the first batch had {self.widths}; "
                    "every batch must hold the same layers."
                )
        rows = arrays[0].shape[0]
        if rows == 0:
            return
        if self._shift is None:
            self._shift = [a.mean(axis=0, dtype=np.float64) for a in arrays]
        offsets = self._offsets
        # A block of rows at a time bounds the scratch memory, and the float32 sums (see BLOCK_ROWS).
        block = self._block_rows(int(offsets[-1]), np.dtype(self._dtype).itemsize)
        for start in range(0, rows, block):
            stop = min(start + block, rows)
            u = np.empty((stop - start, int(offsets[-1])), dtype=self._dtype)
            for k, a in enumerate(arrays):
                # Shift in float64, round to the product dtype on the way out.
                np.subtract(a[start:stop], self._shift[k], out=u[:, offsets[k] : offsets[k + 1]],
                            dtype=np.float64, casting="same_kind")
            self._sums += u.sum(axis=0, dtype=np.float64)
            for (first, last), cross in zip(self._panels, self._cross):
                _add_panel(cross, u, offsets[first], offsets[last], self._part)
            self.num_rows += stop - start

    @staticmethod
    def _block_rows(columns: int, itemsize: int) -> int:
        # At most BLOCK_ROWS rows and about SCRATCH_BYTES of shifted rows (wide stacks get fewer rows).
        return max(256, min(BLOCK_ROWS, SCRATCH_BYTES // (columns * itemsize)))

    def _start(self, arrays: list[np.ndarray]) -> None:
        widths = [a.shape[1] for a in arrays]
        self._offsets = offsets = np.concatenate([[0], np.cumsum(widths)]).astype(np.int64)
        self._panels = _panels(offsets)
        narrow = all(a.dtype.kind == "f" and a.dtype.itemsize <= 4 for a in arrays)
        float32 = self.precision == "float32" or (self.precision == "auto" and narrow)
        self._dtype = np.float32 if float32 else np.float64
        self._sums = np.zeros(int(offsets[-1]))
        self._cross = [np.zeros((offsets[stop] - offsets[first], offsets[-1] - offsets[first]))
                       for first, stop in self._panels]
        if float32:
            self._part = np.empty(max(c.size for c in self._cross), dtype=np.float32)

    def constant_layers(self) -> np.ndarray:
        """Boolean mask of the layers that are constant across the rows seen so far (CKA undefined);
        the same rule as :func:`is_constant`."""
        self._check_rows()
        return self._constant(self._centred())

    def matrix(self, *, constant: str = "raise") -> np.ndarray:
        """The L x L linear CKA matrix of the rows seen so far: symmetric, diagonal exactly 1.

        ``constant="raise"`` (default) raises a LayersimError for a layer that is constant across the
        examples, as :func:`cka_matrix` does; ``constant="nan"`` gives such layers NaN rows and
        columns (diagonal included) instead, as layersim.comparisons draws them.
        """
        if constant not in ("raise", "nan"):
            raise unknown_name("constant", constant, ("raise", "nan"))
        self._check_rows()
        centred = self._centred()
        num = len(self._offsets) - 1
        hsic = np.zeros((num, num))
        for (first, stop), panel in zip(self._panels, centred):
            _panel_hsic(hsic, panel, self._offsets, first, stop)
        is_constant = self._constant(centred)
        if constant == "raise" and is_constant.any():
            k = int(np.argmax(is_constant))
            raise LayersimError(
                f"layers[{k}] is constant across examples (zero variance after centring), so its CKA is "
                "undefined; drop that layer or check how it was extracted."
            )
        defined = np.flatnonzero(~is_constant)
        out = np.full((num, num), np.nan)
        if defined.size:
            sub = hsic[np.ix_(defined, defined)]
            self_terms = np.diag(sub).copy()
            out[np.ix_(defined, defined)] = _normalise(sub, self_terms, self_terms, symmetric=True)
        return out

    def _check_rows(self) -> None:
        if self.num_rows < 2:
            raise LayersimError(f"the accumulator has seen {self.num_rows} rows; CKA needs at least 2 rows (examples).")

    def _centred(self) -> list[np.ndarray]:
        """Each panel's centred cross-products ``Σ uᵀu - n ū ūᵀ`` (new arrays; the sums are kept)."""
        offsets, n = self._offsets, self.num_rows
        mean = self._sums / n
        return [cross - n * np.outer(mean[offsets[first] : offsets[stop]], mean[offsets[first] :])
                for (first, stop), cross in zip(self._panels, self._cross)]

    def _constant(self, centred: list[np.ndarray]) -> np.ndarray:
        """Per layer: whether its centred rows are negligible next to its raw rows (as is_constant),
        from the trace of its own block of centred cross-products."""
        offsets, n = self._offsets, self.num_rows
        mean_u = self._sums / n
        out = []
        for (first, stop), panel in zip(self._panels, centred):
            for i in range(first, stop):
                lo, hi = offsets[i] - offsets[first], offsets[i + 1] - offsets[first]
                centred_sq = max(float(np.trace(panel[lo:hi, lo:hi])), 0.0)  # rounding may leave -tiny
                mean = self._shift[i] + mean_u[offsets[i] : offsets[i + 1]]
                out.append(centred_sq <= CONSTANT_RTOL**2 * (centred_sq + n * float(mean @ mean)))
        return np.array(out)
