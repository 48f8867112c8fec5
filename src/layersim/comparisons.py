"""Layer × layer comparisons of several models with any similarity measure.

All layers of all models are stacked into one list and compared all-pairs at once, so each layer's
statistics are computed once (:func:`stacked_matrix`); for linear CKA over activation tables larger
than memory, :func:`streamed_linear_cka` builds the same matrix from row batches. The blocks of that
matrix are the papers' comparisons:

- Phang et al. §3, Figure 1 (:func:`phang_comparisons`): ORIG–ORIG, FT–ORIG (fine-tuned layers on y,
  pretrained on x), FT–FT and FT[1]–FT[2], where FT is the first seed's model and FT[2] the second's;
- Wu et al. Figures 1 and 5: the whole stacked matrix, a block per pair of models (pretrained and
  fine-tuned on different tasks, or different encoders);
- Wu et al. §5.1 (:func:`localization`): each layer's mean neuronsim minus its mean SVCCA to all other
  layers, read off the same matrices.

Entry [i, j] is measure(layer i, layer j), so for an asymmetric measure the row layer is the side
averaged over (its neurons for neuronsim, its PWCCA weights). A layer that is the same for every
example (the CLS token's embedding-layer output always is) has no defined similarity: its row and
column are NaN, drawn grey, and null in metrics.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from layersim.similarity import (MEASURES, MOMENT_MEASURES, AttentionMaps, LayerMoments, LinearCKAAccumulator,
                                 attention_similarity_matrix, cka_matrix, is_constant, localization_scores,
                                 moments_matrix, rotation_null, similarity_matrix)
from layersim.similarity._common import blas_threads_for
from layersim.similarity.bootstrap import bootstrap_pairs
from layersim.similarity.kernels import streamed_debiased_cka
from layersim.similarity.null import NullMatrix, chance_adjusted, permutation_matrix, streamed_linear_cka_null

# Head-level attention measures: figure label and range (matrix-norm similarity is 1 − a mean
# Frobenius distance, so it has no lower bound).
_HEAD_MEASURES = {"jensen_shannon": ("Jensen–Shannon attention", (0.0, 1.0)),
                  "pearson": ("Pearson attention", (-1.0, 1.0)),
                  "matrix_norm": ("matrix-norm attention", None)}


def attention_measure_label(measure: str) -> str:
    """Figure label of an attention measure: head-level by name, an array measure over heads as features."""
    return _HEAD_MEASURES[measure][0] if measure in _HEAD_MEASURES else f"{MEASURES[measure].label} over heads"


def attention_measure_bounds(measure: str) -> tuple[float, float] | None:
    """The value range of an attention measure, or None when it has no fixed range."""
    return _HEAD_MEASURES[measure][1] if measure in _HEAD_MEASURES else MEASURES[measure].bounded


def measure_options(*, rbf_sigma_scale: float, svcca_variance: float, pwcca_variance: float | None = None,
                    rbf_exact_max_rows: int | None = None, rbf_landmarks: int | None = None,
                    seed: int = 0) -> dict[str, dict]:
    """The options each measure takes from params.yaml's similarity section, by measure name."""
    rbf = {"sigma_scale": rbf_sigma_scale}
    if rbf_exact_max_rows is not None:
        rbf |= {"exact_max_rows": rbf_exact_max_rows, "landmarks": rbf_landmarks, "seed": seed}
    options = {"rbf_cka": rbf, "svcca": {"variance_threshold": svcca_variance}}
    if pwcca_variance is not None:
        options["pwcca"] = {"variance_threshold": pwcca_variance}
    return options


# Axis label of the localization curves, by similarity.localization.
LOCALIZATION_LABELS = {"raw": "localization: mean neuronsim − mean svsim",
                       "zscore": "localization: z-scored mean neuronsim − z-scored mean svsim"}


@dataclass(frozen=True)
class Comparison:
    key: str
    title: str
    matrix: np.ndarray  # [y_layer, x_layer]
    y_label: str
    x_label: str
    null_mean: np.ndarray | None = None  # the permutation null's mean per cell, like matrix
    p_value: np.ndarray | None = None    # one-sided permutation p-value per cell
    interval: tuple[np.ndarray, np.ndarray] | None = None  # bootstrap interval of the diagonal (low, high)


def stacked_matrix(measure: str, models: dict[str, Sequence], **options) -> np.ndarray:
    """The measure between every pair of layers of every model, layers stacked in `models` order.

    Layers are (n, d) arrays on the same examples, or :class:`AttentionMaps` (then `measure` is an
    attention measure). Constant representation layers get NaN rows and columns. Linear CKA is
    computed in float64 (:data:`LINEAR_CKA_PRECISION`).
    """
    layers = [layer for model_layers in models.values() for layer in model_layers]
    attention = isinstance(layers[0], AttentionMaps)
    defined = [i for i, layer in enumerate(layers) if attention or not is_constant(layer)]
    out = np.full((len(layers), len(layers)), np.nan)
    if defined:
        chosen = [layers[i] for i in defined]
        if attention:
            values = attention_similarity_matrix(measure, chosen, **options)
        elif measure == "linear_cka" and set(options) <= set(MEASURES[measure].options):
            values = cka_matrix(chosen, precision=LINEAR_CKA_PRECISION, **options)
        else:
            values = similarity_matrix(measure, chosen, **options)
        out[np.ix_(defined, defined)] = values
    return out


# --- linear CKA over tables larger than memory ---

# Linear CKA in the stages is computed in float64, streamed or not: metrics are rounded to 6 decimals,
# and float32 products (~1e-7, layersim.similarity.cka) would flip that last digit between machines.
LINEAR_CKA_PRECISION = "float64"


def stream_rows(widths: Sequence[int]) -> int:
    """Rows per batch when streaming layers of these widths: about 256 MB of float32 per batch,
    at most 4096 rows and at least 256."""
    return max(256, min(4096, (1 << 28) // (4 * max(1, sum(widths)))))


def streamed_linear_cka(batches: Iterable[Sequence[Sequence[np.ndarray]]]) -> np.ndarray:
    """``stacked_matrix("linear_cka", models)`` from row batches, in memory independent of the number of
    examples (see :class:`layersim.similarity.LinearCKAAccumulator`).

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
    elif defined:
        out[np.ix_(defined, defined)] = moments_matrix(measure, moments or LayerMoments(accumulator), defined,
                                                       **options)
    return out


def moments_stacked_null(measure: str, accumulator: LinearCKAAccumulator, cells: np.ndarray | None = None, *,
                         permutations: int, seed: int, observed: np.ndarray | None = None,
                         moments: LayerMoments | None = None, **options) -> NullMatrix | None:
    """``stacked_null`` from the streamed moments: linear CKA's exact permutation null (its traces are sums
    over rows); the rotation null (layersim.similarity.rotation_null, `permutations` random rotations) of the
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
    return _on_layers(null, defined, len(constant), permutations, "rotation")


def _on_layers(null: NullMatrix | None, defined: list[int], size: int, permutations: int, method: str) -> NullMatrix:
    """The null of the `defined` (non-constant) layers as a NullMatrix over all `size` stacked layers, NaN
    elsewhere; `permutations` and `method` stand in when there was none."""
    full = np.full((size, size), np.nan)
    fields = {"observed": full.copy(), "null_mean": full.copy(), "null_p95": full.copy(), "p_value": full.copy()}
    if null is not None:
        for name, values in fields.items():
            values[np.ix_(defined, defined)] = getattr(null, name)
    return NullMatrix(**fields, permutations=null.permutations if null else permutations,
                      method=null.method if null else method)


STREAMABLE = ("linear_cka", "debiased_cka", *MOMENT_MEASURES)


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


def block_slices(sizes: dict[str, int], row_model: str, column_model: str) -> tuple[slice, slice]:
    """Rows and columns of a stacked matrix that compare `row_model`'s layers (rows) with `column_model`'s."""
    starts = dict(zip(sizes, np.cumsum([0, *sizes.values()])))
    return (slice(starts[row_model], starts[row_model] + sizes[row_model]),
            slice(starts[column_model], starts[column_model] + sizes[column_model]))


def block(matrix: np.ndarray, sizes: dict[str, int], row_model: str, column_model: str) -> np.ndarray:
    """The block of a stacked matrix comparing `row_model`'s layers (rows) with `column_model`'s."""
    return matrix[block_slices(sizes, row_model, column_model)]


def phang_comparisons(matrix: np.ndarray, sizes: dict[str, int], orig: str, finetuned: Sequence[str],
                      null: NullMatrix | None = None) -> list[Comparison]:
    """Phang et al.'s comparisons as blocks of a stacked matrix of the models `sizes` names, with the blocks
    of the stacked permutation null (:func:`stacked_null`) when given."""
    def pick(key, title, row_model, column_model, y_label, x_label):
        nulls = {} if null is None else {"null_mean": block(null.null_mean, sizes, row_model, column_model),
                                         "p_value": block(null.p_value, sizes, row_model, column_model)}
        return Comparison(key, title, block(matrix, sizes, row_model, column_model), y_label, x_label, **nulls)

    ft = finetuned[0]
    comparisons = [pick("orig_orig", "ORIG–ORIG", orig, orig, "ORIG layer", "ORIG layer"),
                   pick("ft_orig", "FT–ORIG", ft, orig, "FT layer", "ORIG layer"),
                   pick("ft_ft", "FT–FT", ft, ft, "FT layer", "FT layer")]
    if len(finetuned) > 1:
        comparisons.append(pick("ft1_ft2", "FT[1]–FT[2]", ft, finetuned[1], "FT[1] layer", "FT[2] layer"))
    return comparisons


def phang_cells(sizes: dict[str, int], orig: str, finetuned: Sequence[str]) -> np.ndarray:
    """Boolean mask of the stacked matrix's cells that :func:`phang_comparisons` reports."""
    chosen = np.zeros((sum(sizes.values()),) * 2, dtype=bool)
    pairs = [(orig, orig), (finetuned[0], orig), (finetuned[0], finetuned[0])] + (
        [(finetuned[0], finetuned[1])] if len(finetuned) > 1 else [])
    for row_model, column_model in pairs:
        chosen[block_slices(sizes, row_model, column_model)] = True
    return chosen


def stacked_null(measure: str, models: dict[str, Sequence], *, permutations: int, seed: int,
                 cells: np.ndarray | None = None, **options) -> NullMatrix:
    """The permutation null of :func:`stacked_matrix`'s cells (rows of the column layer shuffled), NaN
    for constant layers and for cells outside `cells`. Linear CKA uses the exact permutation moments."""
    layers = [layer for model_layers in models.values() for layer in model_layers]
    defined = [i for i, layer in enumerate(layers) if not is_constant(layer)]
    null = None
    if defined:
        chosen = None if cells is None else cells[np.ix_(defined, defined)]
        with blas_threads_for(len(layers[0]), max(layer.shape[1] for layer in layers)):
            null = permutation_matrix(measure, [layers[i] for i in defined], permutations=permutations, seed=seed,
                                      cells=chosen, **options)
    return _on_layers(null, defined, len(layers), permutations, "permutation")


def diagonal_intervals(measure: str, models: dict[str, Sequence], comparisons: Sequence[Comparison], *,
                       resamples: int, seed: int, groups: np.ndarray | None = None, whole: Sequence[str] = (),
                       **options) -> tuple[list[Comparison], dict[str, np.ndarray]]:
    """The comparisons with a bootstrap interval (over examples, or over `groups` of rows) of the diagonal of
    FT–ORIG and FT[1]–FT[2]: the per-layer values that metrics report. Models are named as in the comparisons'
    titles: ORIG and FT[1] (FT), FT[2]. Both diagonals come from the same resamples, each layer prepared once.

    Also, for the self-comparisons named in `whole` (orig_orig, ft_ft), the whole matrix on every resample,
    (resamples, layers, layers), from the same resamples (e.g. for the stability of blocks of layers)."""
    pairs = {"ft_orig": ("FT[1]", "ORIG"), "ft1_ft2": ("FT[1]", "FT[2]")}
    selves = {"orig_orig": "ORIG", "ft_ft": "FT[1]"}
    wanted = [c.key for c in comparisons if c.key in pairs]
    matrices = [key for key in whole if key in selves and selves[key] in models]
    if not wanted and not matrices:
        return list(comparisons), {}
    xs = [layer for key in wanted for layer in models[pairs[key][0]]]
    ys = [layer for key in wanted for layer in models[pairs[key][1]]]
    for key in matrices:
        layers = models[selves[key]]
        xs += [a for a in layers for _ in layers]
        ys += [b for _ in layers for b in layers]
    result = bootstrap_pairs(measure, xs, ys, resamples=resamples, seed=seed, groups=groups, **options)
    diagonal = sum(len(models[pairs[key][0]]) for key in wanted)
    bounds = dict(zip(wanted, zip(np.split(result.low[:diagonal], len(wanted) or 1),
                                  np.split(result.high[:diagonal], len(wanted) or 1))))
    resampled, at = {}, diagonal
    for key in matrices:
        size = len(models[selves[key]])
        resampled[key] = result.values[:, at:at + size * size].reshape(resamples, size, size)
        at += size * size
    return [dataclasses.replace(c, interval=bounds[c.key]) if c.key in bounds else c for c in comparisons], resampled


def seed_spread(matrix: np.ndarray, sizes: dict[str, int], finetuned: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Per layer, mean and standard deviation (ddof 1) of the FT[i]–FT[j] diagonal over every pair of seeds."""
    diagonals = np.array([np.diag(block(matrix, sizes, a, b)) for a, b in itertools.combinations(finetuned, 2)])
    return diagonals.mean(axis=0), diagonals.std(axis=0, ddof=1)


def localization(neuronsim: np.ndarray, svcca: np.ndarray, sizes: dict[str, int], *,
                 standardize: bool = False) -> dict[str, np.ndarray]:
    """Wu et al.'s localization score per layer of each model, from stacked neuronsim and SVCCA matrices.

    Each layer's mean similarity to every other layer (row mean without the diagonal, undefined layers
    left out), neuronsim minus SVCCA, the raw difference as Wu et al. §5.1 define it; NaN for an undefined
    layer. With `standardize`, each mean is first z-scored across all defined layers of all models: only
    the shape of each profile survives, relative to the models stacked together.
    """
    def row_means(matrix: np.ndarray) -> np.ndarray:
        off = np.where(np.eye(len(matrix), dtype=bool), np.nan, matrix)
        counts = np.isfinite(off).sum(axis=1)
        return np.where(counts > 0, np.nansum(off, axis=1) / np.maximum(counts, 1), np.nan)

    neuron, sv = row_means(neuronsim), row_means(svcca)
    defined = np.isfinite(neuron) & np.isfinite(sv)
    scores = np.full(len(neuron), np.nan)
    scores[defined] = localization_scores(neuron[defined], sv[defined], standardize=standardize)
    bounds = np.cumsum([0, *sizes.values()])
    return {name: scores[bounds[k]:bounds[k + 1]] for k, name in enumerate(sizes)}


def pair_summary(matrix: np.ndarray, sizes: dict[str, int], first: str, first_layer: int = 0,
                 null: NullMatrix | None = None) -> dict:
    """For each other model: per layer of it, its similarity to the same layer of `first` where the depths
    match (the diagonal, with the null's mean and p-value per layer when `null` is given), and otherwise the
    layer of `first` it is most similar to. Row/column 0 is layer `first_layer` (1 for attention maps)."""
    summary = {}
    for other in sizes:
        if other == first:
            continue
        part = block(matrix, sizes, other, first)
        if sizes[other] == sizes[first]:
            summary[other] = {"diagonal": per_layer(np.diag(part), first_layer)}
            if null is not None:
                summary[other]["null_mean"] = per_layer(np.diag(block(null.null_mean, sizes, other, first)), first_layer)
                summary[other]["p_value"] = per_layer(np.diag(block(null.p_value, sizes, other, first)), first_layer)
            continue
        best = {}
        for k, row in enumerate(part):
            j = int(np.nanargmax(row)) if np.isfinite(row).any() else None
            best[f"layer_{k + first_layer:02d}"] = (None if j is None else
                                                    {"layer": j + first_layer, "similarity": number(row[j])})
        summary[other] = {"best_match": best}
    return summary


def number(value: float | None) -> float | None:
    """A metrics-file number: rounded, or null when undefined."""
    return None if value is None or not np.isfinite(value) else round(float(value), 6)


def _nanmean(values: np.ndarray) -> float | None:
    return number(np.nanmean(values)) if np.isfinite(values).any() else None


def per_layer(values: np.ndarray, first_layer: int = 0) -> dict[str, float | None]:
    """{"layer_00": value, …} for metrics files."""
    return {f"layer_{k + first_layer:02d}": number(v) for k, v in enumerate(values)}


def summarize(comparisons: Sequence[Comparison], first_layer: int = 0, *, adjusted: bool = False) -> dict:
    """Headline numbers: the per-layer diagonal, its mean, the last layer's value, and for the
    symmetric comparisons the mean off-diagonal similarity (how blocky the matrix is). Means skip
    undefined entries; an undefined single value is null. With a null: the diagonal's null mean and
    p-value per layer (and the chance-adjusted diagonal when `adjusted`); with a bootstrap interval, its
    bounds per layer."""
    summary = {}
    for c in comparisons:
        diagonal = np.diag(c.matrix)
        entry = {"diagonal": per_layer(diagonal, first_layer),
                 "diagonal_mean": _nanmean(diagonal),
                 "last_layer": number(diagonal[-1])}
        if c.key in ("orig_orig", "ft_ft"):
            entry["offdiagonal_mean"] = _nanmean(c.matrix[~np.eye(len(c.matrix), dtype=bool)])
        if c.null_mean is not None:
            entry["null_mean"] = per_layer(np.diag(c.null_mean), first_layer)
            entry["p_value"] = per_layer(np.diag(c.p_value), first_layer)
            if adjusted:
                entry["adjusted"] = per_layer(chance_adjusted(diagonal, np.diag(c.null_mean)), first_layer)
        if c.interval is not None:
            entry["ci_low"], entry["ci_high"] = (per_layer(bound, first_layer) for bound in c.interval)
        summary[c.key] = entry
    return summary


def attention_maps(table) -> list[AttentionMaps]:
    """Every layer's attention in an :class:`layersim.io.AttentionTable`, layers 1 … L."""
    return [AttentionMaps(table.layer(k), table.row_starts, table.example_starts) for k in range(1, table.num_layers + 1)]
