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

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from layersim.similarity import (MEASURES, AttentionMaps, LinearCKAAccumulator, attention_similarity_matrix, cka_matrix,
                                 is_constant, localization_scores, similarity_matrix)

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


def measure_options(*, rbf_sigma_scale: float, svcca_variance: float) -> dict[str, dict]:
    """The options each measure takes from params.yaml's similarity section, by measure name."""
    return {"rbf_cka": {"sigma_scale": rbf_sigma_scale}, "svcca": {"variance_threshold": svcca_variance}}


@dataclass(frozen=True)
class Comparison:
    key: str
    title: str
    matrix: np.ndarray  # [y_layer, x_layer]
    y_label: str
    x_label: str


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
    accumulator = LinearCKAAccumulator(precision=LINEAR_CKA_PRECISION)
    for per_model in batches:
        accumulator.update([layer for model_layers in per_model for layer in model_layers])
    return accumulator.matrix(constant="nan")


def stream_linear_cka(measures: Sequence[str], num_rows: int, widths: Sequence[int]) -> bool:
    """Whether linear CKA over layers of these widths (all models stacked) should be streamed from the
    tables rather than computed on the loaded layers.

    Only when no other measure needs the layers in memory anyway (the other measures do: they are
    computed on whole layers), and loading (the float32 layers plus cka_matrix's float64 centred copy)
    would take more memory than streaming's float64 cross-product sums and one batch, which do not grow
    with the number of rows. Few examples are faster and smaller in memory (sample space).
    """
    if "linear_cka" not in measures or set(measures) - {"linear_cka"}:
        return False
    rows = stream_rows(widths)
    streaming = LinearCKAAccumulator.memory_bytes(widths, rows, LINEAR_CKA_PRECISION) + 4 * rows * sum(widths)
    return 12 * num_rows * sum(widths) > streaming


def block(matrix: np.ndarray, sizes: dict[str, int], row_model: str, column_model: str) -> np.ndarray:
    """The block of a stacked matrix comparing `row_model`'s layers (rows) with `column_model`'s."""
    starts = dict(zip(sizes, np.cumsum([0, *sizes.values()])))
    rows = slice(starts[row_model], starts[row_model] + sizes[row_model])
    columns = slice(starts[column_model], starts[column_model] + sizes[column_model])
    return matrix[rows, columns]


def phang_comparisons(matrix: np.ndarray, sizes: dict[str, int], orig: str, finetuned: Sequence[str]) -> list[Comparison]:
    """Phang et al.'s comparisons as blocks of a stacked matrix of the models `sizes` names."""
    ft = finetuned[0]
    comparisons = [
        Comparison("orig_orig", "ORIG–ORIG", block(matrix, sizes, orig, orig), "ORIG layer", "ORIG layer"),
        Comparison("ft_orig", "FT–ORIG", block(matrix, sizes, ft, orig), "FT layer", "ORIG layer"),
        Comparison("ft_ft", "FT–FT", block(matrix, sizes, ft, ft), "FT layer", "FT layer"),
    ]
    if len(finetuned) > 1:
        comparisons.append(Comparison("ft1_ft2", "FT[1]–FT[2]", block(matrix, sizes, ft, finetuned[1]),
                                      "FT[1] layer", "FT[2] layer"))
    return comparisons


def localization(neuronsim: np.ndarray, svcca: np.ndarray, sizes: dict[str, int]) -> dict[str, np.ndarray]:
    """Wu et al.'s localization score per layer of each model, from stacked neuronsim and SVCCA matrices.

    Each layer's mean similarity to every other layer (row mean without the diagonal, undefined layers
    left out), z-scored across all defined layers of all models, neuronsim minus SVCCA; NaN for an
    undefined layer. z-scoring keeps the profiles comparable across models.
    """
    def row_means(matrix: np.ndarray) -> np.ndarray:
        off = np.where(np.eye(len(matrix), dtype=bool), np.nan, matrix)
        counts = np.isfinite(off).sum(axis=1)
        return np.where(counts > 0, np.nansum(off, axis=1) / np.maximum(counts, 1), np.nan)

    neuron, sv = row_means(neuronsim), row_means(svcca)
    defined = np.isfinite(neuron) & np.isfinite(sv)
    scores = np.full(len(neuron), np.nan)
    scores[defined] = localization_scores(neuron[defined], sv[defined], standardize=True)
    bounds = np.cumsum([0, *sizes.values()])
    return {name: scores[bounds[k]:bounds[k + 1]] for k, name in enumerate(sizes)}


def pair_summary(matrix: np.ndarray, sizes: dict[str, int], first: str, first_layer: int = 0) -> dict:
    """For each other model: per layer of it, its similarity to the same layer of `first` where the depths
    match (the diagonal), and otherwise the layer of `first` it is most similar to. Row/column 0 is
    layer `first_layer` (1 for attention maps)."""
    summary = {}
    for other in sizes:
        if other == first:
            continue
        part = block(matrix, sizes, other, first)
        if sizes[other] == sizes[first]:
            summary[other] = {"diagonal": {f"layer_{k + first_layer:02d}": number(v)
                                           for k, v in enumerate(np.diag(part))}}
            continue
        best = {}
        for k, row in enumerate(part):
            j = int(np.nanargmax(row)) if np.isfinite(row).any() else None
            best[f"layer_{k + first_layer:02d}"] = (None if j is None else
                                                    {"layer": j + first_layer, "similarity": number(row[j])})
        summary[other] = {"best_match": best}
    return summary


def number(value: float) -> float | None:
    """A metrics-file number: rounded, or null when undefined."""
    return None if not np.isfinite(value) else round(float(value), 6)


def _nanmean(values: np.ndarray) -> float | None:
    return number(np.nanmean(values)) if np.isfinite(values).any() else None


def summarize(comparisons: Sequence[Comparison], first_layer: int = 0) -> dict:
    """Headline numbers: the per-layer diagonal, its mean, the last layer's value, and for the
    symmetric comparisons the mean off-diagonal similarity (how blocky the matrix is). Means skip
    undefined entries; an undefined single value is null."""
    summary = {}
    for c in comparisons:
        diagonal = np.diag(c.matrix)
        entry = {"diagonal": {f"layer_{k + first_layer:02d}": number(v) for k, v in enumerate(diagonal)},
                 "diagonal_mean": _nanmean(diagonal),
                 "last_layer": number(diagonal[-1])}
        if c.key in ("orig_orig", "ft_ft"):
            entry["offdiagonal_mean"] = _nanmean(c.matrix[~np.eye(len(c.matrix), dtype=bool)])
        summary[c.key] = entry
    return summary
