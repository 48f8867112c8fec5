"""Every layer of several models stacked (Wu et al. Figures 1 and 5: the compare stage's heatmaps), with each cell's
permutation null, the p-values corrected over the heatmap and, for attention maps, the similarity stage's attention
null and the bootstrap intervals of each model's layer k against the reference's. The similarity stage's Phang et al.
comparisons are :mod:`layersim.similarity.results`; the settings, the null's reach and the kept dimensions are shared
from there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from layersim.similarity.comparisons import block_slices, stacked_matrix, stacked_null
from layersim.similarity._common import blas_threads_for
from layersim.similarity.cca import CAPPED_MEASURES
from layersim.similarity.inference.attention_null import (attention_bootstrap_pairs, attention_stacked_null,
                                                          attention_unmovable)
from layersim.similarity.inference.bootstrap import chosen_interval, no_interval_note
from layersim.similarity.inference.correction import between_model_cells
from layersim.similarity.inference.exchangeability import unmovable
from layersim.similarity.inference.null import NullMatrix
from layersim.similarity.registry import MEASURES
from layersim.similarity.results import Uncertainty, kept_dimensions_per_layer, null_unavailable


@dataclass
class StackedResult:
    """One measure over every layer of several models stacked, with every cell's null when there is one."""

    measure: str
    matrix: np.ndarray
    sizes: dict[str, int]                    # layers per model, in stacking order (the first: the reference)
    null: NullMatrix | None = None
    p_adjusted: np.ndarray | None = None     # the null's p-values corrected over the heatmap
    at_chance: np.ndarray | None = None      # cells not above chance (hatched)
    unavailable: str | None = None
    kept_dimensions: dict[str, list[int | None]] | None = None
    # Attention maps: the bootstrap interval of each model's layer k against the first model's layer k (NaN in
    # every other cell), its method, or why there is none (reference_intervals).
    interval: tuple[np.ndarray, np.ndarray] | None = None
    interval_method: str | None = None
    no_interval: str | None = None


def stacked_result(models: dict[str, list], measure: str, *, options: dict | None = None,
                   uncertainty: Uncertainty | None = None, attention: bool = False, groups: np.ndarray | None = None,
                   strata: np.ndarray | None = None) -> StackedResult:
    """All layers of `models` stacked (Wu et al. Figures 1 and 5); with `uncertainty`,
    every cell's permutation null, whole examples (`groups`) permuted within their `strata`
    (layersim.similarity.inference.exchangeability). Attention maps (`attention`) get the similarity stage's
    attention null (:func:`attention_uncertainty`). `options`: the measure's own."""
    options = options or {}
    if attention:
        result = StackedResult(measure, stacked_matrix(measure, models, **options),
                               {name: len(layers) for name, layers in models.items()})
        return result if uncertainty is None else attention_uncertainty(result, models, uncertainty, groups, options)
    num_rows = len(next(iter(models.values()))[0])
    # The observed matrix's and the kept dimensions' products and SVDs under the null's BLAS rule (stacked_null): small
    # ones on one thread, where a second BLAS thread mostly waits, and more so beside other work.
    with blas_threads_for(num_rows, max(layer.shape[1] for layers in models.values() for layer in layers)):
        result = StackedResult(measure, stacked_matrix(measure, models, **options),
                               {name: len(layers) for name, layers in models.items()})
        if measure in CAPPED_MEASURES:
            result.kept_dimensions = kept_dimensions_per_layer(models, measure, **options)
    result.unavailable = null_unavailable(measure, num_rows, options) or unmovable(num_rows, groups, strata)
    if uncertainty is not None and not result.unavailable:
        result.null = stacked_null(measure, models, permutations=uncertainty.permutations, seed=uncertainty.seed,
                                   groups=groups, strata=strata, **options)
        # One heatmap, one family: the cells between two models (a model's own block is not tested), a pair once.
        family = {"tested": between_model_cells(list(result.sizes.values())),
                  "symmetric": MEASURES[measure].symmetric}
        result.p_adjusted = uncertainty.corrected(result.null.p_value, **family)
        result.at_chance = uncertainty.at_chance(result.null.p_value, **family)
    return result


def attention_uncertainty(result: StackedResult, models: dict[str, list], uncertainty: Uncertainty,
                          clusters: np.ndarray | None, options: dict) -> StackedResult:
    """`result` (stacked attention maps) with the similarity stage's attention null and bootstrap
    (layersim.similarity.inference.attention_null: whole examples exchanged only with examples of equal length, and
    resampled, `clusters` of examples sharing a text as blocks): every cell between two models tested and corrected
    as one heatmap, and the interval of each model's layer k against the first model's layer k
    (:func:`reference_intervals`); or why there is neither (`unavailable`: no two examples of equal length)."""
    first = next(iter(models.values()))[0]
    result.unavailable = (null_unavailable(result.measure, first.num_pairs, options)
                          or attention_unmovable(first, clusters))
    if result.unavailable:
        return result
    tested = between_model_cells(list(result.sizes.values()))
    result.null = attention_stacked_null(result.measure, models, permutations=uncertainty.permutations,
                                         seed=uncertainty.seed, cells=tested, clusters=clusters, **options)
    family = {"tested": tested, "symmetric": result.measure in MEASURES and MEASURES[result.measure].symmetric}
    result.p_adjusted = uncertainty.corrected(result.null.p_value, **family)
    result.at_chance = uncertainty.at_chance(result.null.p_value, **family)
    if uncertainty.bootstrap:
        reference_intervals(result, models, uncertainty, clusters, options)
    return result


def reference_intervals(result: StackedResult, models: dict[str, list], uncertainty: Uncertainty,
                        clusters: np.ndarray | None, options: dict) -> None:
    """Into `result`: the bootstrap interval (attention_bootstrap_pairs, whole `clusters` resampled, every cell on
    the same resamples) of each model's layer k against the first model's layer k, for each model as deep as the
    first: the cells the stacked summary reports per layer (layersim.similarity.comparisons.pair_summary)."""
    if chosen_interval(result.measure, "auto") is None:
        result.no_interval = no_interval_note(result.measure)
        return
    reference, *others = result.sizes
    cells = [(row, column) for label in others if result.sizes[label] == result.sizes[reference]
             for row, column in zip(*(np.arange(part.start, part.stop)
                                      for part in block_slices(result.sizes, label, reference)))]
    if not cells:
        return
    layers = [layer for model in models.values() for layer in model]
    found = attention_bootstrap_pairs(result.measure, [layers[i] for i, _ in cells], [layers[j] for _, j in cells],
                                      resamples=uncertainty.bootstrap, seed=uncertainty.seed, groups=clusters,
                                      **options)
    if found.method == "none":
        result.no_interval = found.note or no_interval_note(result.measure)
        return
    low, high = np.full(result.matrix.shape, np.nan), np.full(result.matrix.shape, np.nan)
    rows, columns = np.array(cells).T
    low[rows, columns], high[rows, columns] = found.low, found.high
    result.interval, result.interval_method = (low, high), found.method
