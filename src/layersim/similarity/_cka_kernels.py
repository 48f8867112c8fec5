"""The arithmetic of linear CKA (see :mod:`layersim.similarity.cka`): the cost model that picks the sample-
or feature-space method, float32/float64 products, stacked Gram matrices and the column panels of the
feature-space cross-products."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from layersim.similarity._common import (centre, centre_into, validated)

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
