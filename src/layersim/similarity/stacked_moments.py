"""The stacked layer × layer matrices of layersim.similarity.comparisons from second moments streamed from row batches,
for activation tables larger than memory: linear CKA, debiased CKA and the measures of
:data:`layersim.similarity.moments.MOMENT_MEASURES`, with the nulls the moments determine (linear CKA's exact
permutation null, the others' rotation null). Layers of every model are stacked in order, as in
:func:`layersim.similarity.comparisons.stacked_matrix`; a constant layer's row and column are NaN.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from layersim.similarity.cka import LinearCKAAccumulator
from layersim.similarity.kernels import streamed_debiased_cka
from layersim.similarity.moments import MOMENT_MEASURES, LayerMoments, moments_matrix
from layersim.similarity.inference.null import NullMatrix, streamed_linear_cka_null
from layersim.similarity.inference.rotation_null import rotation_null
from layersim.similarity.shape import shape_moments_matrix

# Linear CKA in the stages is computed in float64, streamed or not: metrics are rounded to 6 decimals,
# and float32 products (~1e-7, layersim.similarity.cka) would flip that last digit between machines.
LINEAR_CKA_PRECISION = "float64"


def stream_rows(widths: Sequence[int]) -> int:
    """Rows per batch when streaming layers of these widths: about 256 MB of float32 per batch,
    at most 4096 rows and at least 256."""
    return max(256, min(4096, (1 << 28) // (4 * max(1, sum(widths)))))


def streamed_linear_cka(batches: Iterable[Sequence[Sequence[np.ndarray]]]) -> np.ndarray:
    """``layersim.similarity.comparisons.stacked_matrix("linear_cka", models)`` from row batches, in memory independent of
    the number of examples (see :class:`layersim.similarity.LinearCKAAccumulator`).

    Each item of `batches` holds, for one block of rows, every model's list of (rows, d) layer arrays
    in the models' order, e.g. ``zip(*(table.iter_batches(rows) for table in tables))``. The result
    equals stacked_matrix's to ~1e-12, constant layers' rows and columns NaN included.
    """
    return streamed_moments(batches).matrix(constant="nan")


def streamed_moments(batches: Iterable[Sequence[Sequence[np.ndarray]]]) -> LinearCKAAccumulator:
    """One pass over row batches (as :func:`streamed_linear_cka` takes them): the float64 centred
    cross-products of every pair of stacked layers, from which :func:`moments_stacked_matrix` gives linear
    CKA and every measure of :data:`layersim.similarity.moments.MOMENT_MEASURES`."""
    accumulator = LinearCKAAccumulator(precision=LINEAR_CKA_PRECISION)
    for per_model in batches:
        accumulator.update([layer for model_layers in per_model for layer in model_layers])
    return accumulator


def moments_stacked_matrix(measure: str, accumulator: LinearCKAAccumulator, *, moments: LayerMoments | None = None,
                           **options) -> np.ndarray:
    """``stacked_matrix(measure, models)`` from the streamed moments of the stacked layers: the same matrix
    (layersim.similarity.moments states the accuracy), constant layers' rows and columns NaN. `moments`: the
    accumulator's :class:`LayerMoments`, to reuse its layers' bases across measures and with the null."""
    if measure == "linear_cka":
        return accumulator.matrix(constant="nan")
    constant = accumulator.constant_layers()
    defined = np.flatnonzero(~constant).tolist()
    out = np.full((len(constant), len(constant)), np.nan)
    if defined and measure == "debiased_cka":  # its `method` picks how products are taken in memory: moot here
        out[np.ix_(defined, defined)] = streamed_debiased_cka(accumulator, defined)
    elif defined and measure in SHAPE_MEASURES:  # its null needs the rows (no rotation null yet): none streamed
        out[np.ix_(defined, defined)] = shape_moments_matrix(moments or LayerMoments(accumulator), defined, **options)
    elif defined:
        out[np.ix_(defined, defined)] = moments_matrix(measure, moments or LayerMoments(accumulator), defined,
                                                       **options)
    return out


def moments_stacked_null(measure: str, accumulator: LinearCKAAccumulator, cells: np.ndarray | None = None, *,
                         permutations: int, seed: int, observed: np.ndarray | None = None,
                         moments: LayerMoments | None = None, **options) -> NullMatrix | None:
    """``stacked_null`` from the streamed moments: linear CKA's exact permutation null (its traces are sums
    over rows); the rotation null (layersim.similarity.inference.rotation_null, `permutations` random rotations) of the
    measures computed from moments; None for debiased CKA, whose permutations need the rows. `observed`: the
    measure's stacked matrix, when already computed."""
    if measure == "linear_cka":
        return streamed_linear_cka_null(accumulator, cells)
    if measure not in MOMENT_MEASURES:
        return None
    constant = accumulator.constant_layers()
    defined = np.flatnonzero(~constant).tolist()
    null = None
    if defined:
        inside = np.ix_(defined, defined)
        null = rotation_null(measure, moments or LayerMoments(accumulator), defined, draws=permutations, seed=seed,
                             cells=None if cells is None else cells[inside],
                             observed=None if observed is None else observed[inside], **options)
    return on_layers(null, defined, len(constant), permutations, "rotation")


def on_layers(null: NullMatrix | None, defined: list[int], size: int, permutations: int, method: str) -> NullMatrix:
    """The null of the `defined` (non-constant) layers as a NullMatrix over all `size` stacked layers, NaN
    elsewhere; `permutations` and `method` stand in when there was none."""
    full = np.full((size, size), np.nan)
    fields = {"observed": full.copy(), "null_mean": full.copy(), "null_p95": full.copy(), "p_value": full.copy()}
    if null is not None:
        for name, values in fields.items():
            values[np.ix_(defined, defined)] = getattr(null, name)
    return NullMatrix(**fields, permutations=null.permutations if null else permutations,
                      method=null.method if null else method)


SHAPE_MEASURES = ("procrustes", "shape_metric")  # layersim.similarity.shape, from the same moments
STREAMABLE = ("linear_cka", "debiased_cka", *MOMENT_MEASURES, *SHAPE_MEASURES)


def stream_layers(measures: Sequence[str], num_rows: int, widths: Sequence[int]) -> bool:
    """Whether the measures over layers of these widths (all models stacked) should come from moments
    streamed from the tables rather than from the loaded layers.

    Only when every measure can (linear and debiased CKA, the CCA family, neuronsim, mixedsim; not RBF CKA,
    whose kernels need the rows), and loading (the float32 layers plus a float64 centred copy) would take more
    memory than streaming's float64 cross-product sums and one batch, which do not grow with the number of
    rows. Few examples are faster and smaller in memory in sample space.
    """
    if not measures or set(measures) - set(STREAMABLE):
        return False
    rows = stream_rows(widths)
    streaming = LinearCKAAccumulator.memory_bytes(widths, rows, LINEAR_CKA_PRECISION) + 4 * rows * sum(widths)
    return 12 * num_rows * sum(widths) > streaming
