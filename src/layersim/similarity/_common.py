"""Input checks and per-layer preprocessing shared by the measures in this package.

Every measure takes representations of shape ``(num_examples x hidden)`` (one row per example,
the same examples in the same order on both sides; widths may differ), checks them the same way
and centres them in float64. Errors are :class:`~layersim.errors.LayersimError` with one sentence
that names the offending input (``x``, ``y``, ``xs[3]``, ...) and the measure.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import numpy as np

from layersim.errors import LayersimError
from layersim.compute.linalg import blas_on_calling_thread

Named = list[tuple[str, np.ndarray]]

# A representation counts as constant when its centred part is this small relative to the raw
# values: centring a truly constant column leaves only rounding residue of order eps·|value|.
CONSTANT_RTOL = 1e-12

# centre_into centres this many bytes of float64 rows at a time: a block that stays in cache.
CENTRE_BLOCK_BYTES = 1 << 21


def centred_and_constant(a: np.ndarray) -> tuple[np.ndarray, bool]:
    """``H a`` in float64 (a new C-contiguous array), and whether nothing is left after centring."""
    # Mean accumulated in float64 and subtracted in float64: no float32 intermediate.
    mean = a.mean(axis=0, dtype=np.float64)
    centred = np.subtract(a, mean, dtype=np.float64)
    return centred, _nothing_left(float(np.einsum("ij,ij->", centred, centred)), a.shape[0], mean)


def _nothing_left(centred_sq: float, num_rows: int, mean: np.ndarray) -> bool:
    """Whether the centred part (squared norm ``centred_sq``) is only rounding residue of the raw values."""
    # ||a||² = ||Ha||² + n·||mean||² exactly (centred columns sum to zero), so no second pass.
    total_sq = centred_sq + num_rows * float(mean @ mean)
    return centred_sq <= CONSTANT_RTOL**2 * total_sq


def as_list(layers: Sequence[np.ndarray], label: str) -> list[np.ndarray]:
    """The layers as a list, rejecting one 2-D array passed where a list of layers was meant."""
    if isinstance(layers, np.ndarray) and layers.ndim == 2:
        raise LayersimError(
            f"{label} must be a sequence of (num_examples x hidden) arrays, got a single array of shape "
            f"{layers.shape}; wrap one layer in a list."
        )
    out = list(layers)
    if not out:
        raise LayersimError(f"{label} is empty; pass at least one (num_examples x hidden) array.")
    return out


def named_lists(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray] | None) -> tuple[Named, Named | None]:
    """``xs``/``ys`` as (name, array) lists, names ``xs[i]``/``ys[j]`` for error messages."""
    x_named = [(f"xs[{i}]", a) for i, a in enumerate(as_list(xs, "xs"))]
    y_named = None if ys is None else [(f"ys[{j}]", a) for j, a in enumerate(as_list(ys, "ys"))]
    return x_named, y_named


def validated(named: Named, measure: str, min_rows: int = 2) -> Named:
    """Check dtype, shape, common row count, ``min_rows`` and finiteness; arrays returned uncopied."""
    arrays = []
    for name, a in named:
        a = np.asarray(a)
        if a.dtype.kind not in "biuf":
            raise LayersimError(f"{name} must hold real numbers, got dtype {a.dtype}.")
        if a.ndim != 2:
            raise LayersimError(f"{name} must be a 2-D (num_examples x hidden) array, got shape {a.shape}.")
        arrays.append((name, a))
    first_name, first = arrays[0]
    for name, a in arrays[1:]:
        if a.shape[0] != first.shape[0]:
            raise LayersimError(
                f"{name} has shape {a.shape} but {first_name} has shape {first.shape}; "
                "all inputs must have the same number of rows (examples)."
            )
    if first.shape[0] < min_rows:
        raise LayersimError(
            f"{first_name} has shape {first.shape}; {measure} needs at least {min_rows} rows (examples)."
        )
    for name, a in arrays:
        finite = np.isfinite(a)
        if not finite.all():
            bad = a.size - int(np.count_nonzero(finite))
            raise LayersimError(
                f"{name} contains {bad} non-finite value{'s' if bad > 1 else ''} (NaN or inf); "
                f"{measure} needs finite activations."
            )
    return arrays


def check_options(measure: str, options: dict, valid: Sequence[str]) -> None:
    """Raise for an option name the measure does not take, listing the ones it does."""
    for key in options:
        if key not in valid:
            choices = ", ".join(sorted(valid)) if valid else "none (it takes no options)"
            raise LayersimError(
                f"unknown option {key!r} for similarity measure {measure!r}; valid options are: {choices}."
            )


def centre(name: str, a: np.ndarray, measure: str) -> np.ndarray:
    """``H a`` in float64 (a new array); raises if the whole representation is constant."""
    centred, constant = centred_and_constant(a)
    if constant:
        raise _constant_error(name, measure)
    return centred


def centre_into(name: str, a: np.ndarray, out: np.ndarray, measure: str) -> None:
    """Write ``H a`` into ``out`` (same shape, any float dtype, e.g. a column slice of a stack): centred in
    float64 and only then rounded to ``out``'s dtype, exactly as :func:`centre` would give, but a cache-sized
    block of rows at a time, so no float64 copy of the whole layer is made. Raises as :func:`centre`."""
    mean = a.mean(axis=0, dtype=np.float64)
    rows = max(1, CENTRE_BLOCK_BYTES // (8 * max(1, a.shape[1])))
    centred_sq = 0.0
    for start in range(0, a.shape[0], rows):
        block = np.subtract(a[start : start + rows], mean, dtype=np.float64)
        centred_sq += float(np.einsum("ij,ij->", block, block))
        out[start : start + rows] = block
    if _nothing_left(centred_sq, a.shape[0], mean):
        raise _constant_error(name, measure)


def _constant_error(name: str, measure: str) -> LayersimError:
    return LayersimError(
        f"{name} is constant across examples (zero variance after centring), so its {measure} is "
        "undefined; drop that layer or check how it was extracted."
    )


def constant_columns(a: np.ndarray, centred: np.ndarray) -> np.ndarray:
    """Boolean mask of the neurons (columns) that are constant across examples.

    The same rule as :func:`layersim.similarity.is_constant` applied per column: a column is
    constant when what is left after centring is below ``1e-12`` of its raw size (centring a truly
    constant float column leaves only rounding residue of order eps·|value|).
    """
    centred_sq = np.einsum("ij,ij->j", centred, centred)
    mean = a.mean(axis=0, dtype=np.float64)
    total_sq = centred_sq + a.shape[0] * mean * mean
    return centred_sq <= CONSTANT_RTOL**2 * total_sq


def centre_drop_constant(name: str, a: np.ndarray, measure: str) -> tuple[np.ndarray, np.ndarray]:
    """Centred float64 copy with constant neurons set exactly to zero, and the mask of kept neurons.

    Raises if every neuron is constant (the whole representation is then constant).
    """
    centred = centre(name, a, measure)
    constant = constant_columns(a, centred)
    if constant.any():
        centred[:, constant] = 0.0
    # A second pass removes the rounding residue of the first (of order eps·|mean| per column), which
    # would otherwise survive as a spurious direction along the all-ones vector when n <= width.
    centred -= centred.mean(axis=0)
    return centred, ~constant


def check_rtol(rtol: float | None) -> None:
    if rtol is not None and not (isinstance(rtol, (int, float)) and 0.0 <= rtol < 1.0):
        raise LayersimError(f"rtol must be a number in [0, 1) or None, got {rtol!r}.")


# Below this many multiply-adds per product (rows × width²), a BLAS call is over before a second thread
# would pay off: with the other core busy, handing small QR/GEMM calls to two threads was measured 140×
# slower (a 300 × 32 QR: 28 ms instead of 0.2 ms). Loops of many small calls (permutations, bootstrap
# resamples) run on one thread below it.
SMALL_PRODUCT = 1e8


def small_products(num_rows: int, width: int) -> bool:
    """Whether products of this size are below SMALL_PRODUCT: one BLAS thread each."""
    return num_rows * width * width < SMALL_PRODUCT


def blas_threads_for(num_rows: int, width: int):
    """A context that keeps BLAS on one thread while loops of products of this size run, when they are small
    (see SMALL_PRODUCT); otherwise it changes nothing."""
    if not small_products(num_rows, width):
        return contextlib.nullcontext()
    return blas_on_calling_thread()
