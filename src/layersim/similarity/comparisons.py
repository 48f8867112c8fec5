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
column are NaN, drawn grey, and null in metrics. Their bootstrap intervals and spreads over seeds:
:mod:`layersim.similarity.comparison_intervals`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

from layersim.errors import LayersimError
from layersim.similarity.attention import HEAD_MEASURE_BOUNDS, AttentionMaps, attention_similarity_matrix
from layersim.similarity.cka import cka_matrix, is_constant
from layersim.similarity.localization import localization_scores
from layersim.similarity.registry import MEASURES, similarity_matrix
from layersim.similarity._common import blas_threads_for
from layersim.similarity.inference.null import NullMatrix, chance_adjusted, permutation_matrix
from layersim.similarity.inference.exchangeability import LINEAR_CKA_BLOCK_PERMUTATIONS, block_permutations
# The streamed route (tables larger than memory), here for the stages and tests that import it from this module.
from layersim.similarity.stacked_moments import (LINEAR_CKA_PRECISION, STREAMABLE, moments_stacked_matrix,  # noqa: F401
                                                 moments_stacked_null, on_layers, stream_layers, stream_rows,
                                                 streamed_linear_cka, streamed_moments)
from layersim.similarity.inference.seeds import seed_metrics

RANDOM = "RANDOM"  # the label of the random-init control (layersim.models.random_control.random_encoder)

# Head-level attention measures' figure labels (their ranges: attention.HEAD_MEASURE_BOUNDS).
_HEAD_LABELS = {"jensen_shannon": "Jensen–Shannon attention", "pearson": "Pearson attention",
                "matrix_norm": "matrix-norm attention"}


def attention_measure_label(measure: str) -> str:
    """Figure label of an attention measure: head-level by name, an array measure over heads as features."""
    return _HEAD_LABELS[measure] if measure in _HEAD_LABELS else f"{MEASURES[measure].label} over heads"


def attention_measure_bounds(measure: str) -> tuple[float, float] | None:
    """The value range of an attention measure, or None when it has no fixed range."""
    return HEAD_MEASURE_BOUNDS[measure] if measure in HEAD_MEASURE_BOUNDS else MEASURES[measure].bounded


def measure_options(*, rbf_sigma_scale: float, svcca_variance: float, pwcca_variance: float | None = None,
                    rbf_exact_max_rows: int | None = None, rbf_landmarks: int | None = None,
                    seed: int = 0) -> dict[str, dict]:
    """The options each measure takes from params.yaml's similarity section, by measure name."""
    rbf = {"sigma_scale": rbf_sigma_scale}
    if rbf_exact_max_rows is not None:
        rbf |= {"exact_max_rows": rbf_exact_max_rows, "landmarks": rbf_landmarks, "landmark_seed": seed}
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
    p_adjusted: np.ndarray | None = None  # p_value corrected over this comparison's cells (similarity.correction)
    interval: tuple[np.ndarray, np.ndarray] | None = None  # bootstrap interval of the diagonal (low, high)
    interval_method: str | None = None   # how the interval was made (basic, percentile, bca)
    interval_centre: np.ndarray | None = None  # the bias-corrected diagonal the interval contains
    per_seed: dict[str, np.ndarray] | None = None  # the diagonal with each seed's model in FT's place, by label
    at_chance: np.ndarray | None = None  # cells whose corrected p-value is ≥ the significance level (hatched)


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
    of the stacked permutation null (:func:`stacked_null`) when given; FT–ORIG and FT–RANDOM with the diagonal
    of every seed's model in FT's place. ORIG–RANDOM, FT–RANDOM: with the random-init control (:data:`RANDOM`)."""
    def pick(key, title, row_model, column_model, y_label, x_label, seeds=False):
        nulls = {} if null is None else {"null_mean": block(null.null_mean, sizes, row_model, column_model),
                                         "p_value": block(null.p_value, sizes, row_model, column_model)}
        per_seed = {label: np.diag(block(matrix, sizes, label, column_model)) for label in finetuned} if seeds else None
        return Comparison(key, title, block(matrix, sizes, row_model, column_model), y_label, x_label, **nulls,
                          per_seed=per_seed)

    ft = finetuned[0]
    comparisons = [pick("orig_orig", "ORIG–ORIG", orig, orig, "ORIG layer", "ORIG layer"),
                   pick("ft_orig", "FT–ORIG", ft, orig, "FT layer", "ORIG layer", seeds=True),
                   pick("ft_ft", "FT–FT", ft, ft, "FT layer", "FT layer")]
    if len(finetuned) > 1:
        comparisons.append(pick("ft1_ft2", "FT[1]–FT[2]", ft, finetuned[1], "FT[1] layer", "FT[2] layer"))
    if RANDOM in sizes:
        comparisons += [pick("orig_random", "ORIG–RANDOM", orig, RANDOM, "ORIG layer", "RANDOM layer"),
                        pick("ft_random", "FT–RANDOM", ft, RANDOM, "FT layer", "RANDOM layer", seeds=True)]
    for method, runs in compared_labels(sizes).items():  # finetune.compare_methods: against ORIG and against FT
        per_seed = {label: np.diag(block(matrix, sizes, label, orig)) for label in runs}
        comparisons += [dataclasses.replace(pick(f"{method.lower()}_orig", f"{method}–ORIG", runs[0], orig,
                                                 f"{method} layer", "ORIG layer"), per_seed=per_seed),
                        pick(f"{method.lower()}_ft", f"{method}–FT", runs[0], ft, f"{method} layer", "FT layer")]
    return comparisons


# The comparisons of Phang et al. (and the random-init control); any other key compares a run of
# finetune.compare_methods (e.g. lora_orig, lora_ft: :func:`compared_labels`).
PHANG_KEYS = ("orig_orig", "ft_orig", "ft_ft", "ft1_ft2", "orig_random", "ft_random")


def compared_labels(sizes: dict[str, int]) -> dict[str, list[str]]:
    """Method label → its runs among the stacked models, for the runs of finetune.compare_methods (e.g. "LoRA":
    [LoRA[1], LoRA[2]]); finetune.method's FT[i], ORIG and RANDOM are not among them."""
    groups: dict[str, list[str]] = {}
    for label in sizes:
        method, bracket, _ = label.partition("[")
        if bracket and method != "FT":
            groups.setdefault(method, []).append(label)
    return groups


def phang_cells(sizes: dict[str, int], orig: str, finetuned: Sequence[str]) -> np.ndarray:
    """Boolean mask of the stacked matrix's cells that :func:`phang_comparisons` reports (per_seed aside)."""
    chosen = np.zeros((sum(sizes.values()),) * 2, dtype=bool)
    pairs = [(orig, orig), (finetuned[0], orig), (finetuned[0], finetuned[0])] + (
        [(finetuned[0], finetuned[1])] if len(finetuned) > 1 else []) + (
        [(orig, RANDOM), (finetuned[0], RANDOM)] if RANDOM in sizes else []) + [
        pair for runs in compared_labels(sizes).values() for pair in ((runs[0], orig), (runs[0], finetuned[0]))]
    for row_model, column_model in pairs:
        chosen[block_slices(sizes, row_model, column_model)] = True
    return chosen


def stacked_null(measure: str, models: dict[str, Sequence], *, permutations: int, seed: int,
                 cells: np.ndarray | None = None, groups: np.ndarray | None = None, strata: np.ndarray | None = None,
                 **options) -> NullMatrix:
    """The permutation null of :func:`stacked_matrix`'s cells (rows of the column layer shuffled; with `groups`
    and `strata`, whole examples within their stratum: layersim.similarity.inference.exchangeability), NaN for constant
    layers and for cells outside `cells`. Linear CKA uses the exact permutation moments while rows are
    exchangeable, else at least :data:`LINEAR_CKA_BLOCK_PERMUTATIONS` sampled block permutations."""
    layers = [layer for model_layers in models.values() for layer in model_layers]
    defined = [i for i, layer in enumerate(layers) if not is_constant(layer)]
    if measure == "linear_cka" and not block_permutations(len(layers[0]), groups, strata).plain:
        permutations = max(permutations, LINEAR_CKA_BLOCK_PERMUTATIONS)
    null = None
    if defined:
        chosen = None if cells is None else cells[np.ix_(defined, defined)]
        with blas_threads_for(len(layers[0]), max(layer.shape[1] for layer in layers)):
            null = permutation_matrix(measure, [layers[i] for i in defined], permutations=permutations, seed=seed,
                                      cells=chosen, groups=groups, strata=strata, **options)
    return on_layers(null, defined, len(layers), permutations, "permutation")


def localization(neuronsim: np.ndarray, svcca: np.ndarray, sizes: dict[str, int], *,
                 standardize: bool = False, trained: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """Wu et al.'s localization score per layer of each model in `trained`, from stacked neuronsim and SVCCA
    matrices of the models of `sizes`.

    Each layer's mean similarity to every other layer of the `trained` models (row mean without the diagonal,
    undefined layers left out), neuronsim minus SVCCA, the raw difference as Wu et al. §5.1 define it; NaN for an
    undefined layer. Wu et al. average over the trained models only (their Figures 3 and 7), so the random-init
    controls stay out of every mean and get no score: name the trained models in `trained` (default: all).
    With `standardize`, each mean is first z-scored across all defined layers of those models: only the shape
    of each profile survives, relative to the models compared.
    """
    chosen = list(sizes) if trained is None else list(trained)
    unknown = [label for label in chosen if label not in sizes]
    if unknown or not chosen:
        raise LayersimError(f"localization over the models {chosen}: {unknown or 'none'} not among the stacked "
                            f"models {list(sizes)}.")
    bounds = dict(zip(sizes, np.cumsum([0, *sizes.values()])))
    kept = np.concatenate([np.arange(bounds[label], bounds[label] + sizes[label]) for label in chosen])
    neuronsim, svcca = neuronsim[np.ix_(kept, kept)], svcca[np.ix_(kept, kept)]
    sizes = {label: sizes[label] for label in chosen}
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
                 null: NullMatrix | None = None, interval: tuple[np.ndarray, np.ndarray] | None = None) -> dict:
    """For each other model: per layer of it, its similarity to the same layer of `first` where the depths
    match (the diagonal, with the null's mean and p-value per layer when `null` is given, and the bounds of
    `interval`, (low, high) matrices like `matrix`, when given), and otherwise the layer of `first` it is most
    similar to. Row/column 0 is layer `first_layer` (1 for attention maps)."""
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
            for key, bound in zip(("ci_low", "ci_high"), interval or ()):
                summary[other][key] = per_layer(np.diag(block(bound, sizes, other, first)), first_layer)
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


def summarize(comparisons: Sequence[Comparison], first_layer: int = 0, *, adjusted: bool = False,
              bounds: tuple[float, float] | None = None, flagged: Collection[str] = ()) -> dict:
    """Headline numbers: the per-layer diagonal, its mean, the last layer's value, and for the
    symmetric comparisons the mean off-diagonal similarity (how blocky the matrix is). Means skip
    undefined entries; an undefined single value is null. With a null: the diagonal's null mean,
    p-value and corrected p-value per layer (and the chance-adjusted diagonal when `adjusted`); with a bootstrap interval (examples),
    its bounds per layer; with per-seed diagonals, their spread over seeds (layersim.similarity.inference.seeds: the
    t-interval clipped to the measure's range `bounds`, the mean over the runs not `flagged` by label beside)."""
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
            if c.p_adjusted is not None:
                entry["p_adjusted"] = per_layer(np.diag(c.p_adjusted), first_layer)
            if adjusted:
                entry["adjusted"] = per_layer(chance_adjusted(diagonal, np.diag(c.null_mean)), first_layer)
        if c.interval is not None:
            entry["ci_low"], entry["ci_high"] = (per_layer(bound, first_layer) for bound in c.interval)
            if c.interval_method is not None:  # which bootstrap interval, and the bias-corrected value inside it
                entry["ci_method"] = c.interval_method
                entry["ci_centre"] = per_layer(c.interval_centre, first_layer)
        if c.per_seed is not None:
            entry |= seed_metrics(c.per_seed, lambda values: per_layer(values, first_layer), flagged=flagged,
                                  bounds=bounds)
        summary[c.key] = entry
    return summary


def attention_maps(table) -> list[AttentionMaps]:
    """Every layer's attention in an :class:`layersim.data.io.AttentionTable`, layers 1 … L."""
    return [AttentionMaps(table.layer(k), table.row_starts, table.example_starts) for k in range(1, table.num_layers + 1)]
