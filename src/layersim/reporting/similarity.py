"""What the similarity and compare stages report, from the results layersim.similarity.results computed:
Phang et al.'s comparisons (ORIG–ORIG, FT–ORIG, FT–FT, FT[1]–FT[2]) for every measure, each cell with its
permutation null, the per-layer diagonals with bootstrap intervals and the spread over seed pairs; the
stacked matrices of several models; the localization score — as figures, plot rows and metrics. Nothing here
computes a similarity, a null or an interval; the stage writes what this returns (:class:`SimilarityOutputs`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from layersim.data.io import write_figure, write_json
from layersim.reporting.plots import (Curve, block_heatmap, chance_note, diagonal_curves, localization_curves,
                                      matrix_rows, measure_grid, stacked_rows)
from layersim.similarity.blocks import Blocks
from layersim.similarity.comparisons import (LOCALIZATION_LABELS, PHANG_KEYS, Comparison, attention_measure_bounds,
                                             attention_measure_label, number, pair_summary, per_layer, summarize)
from layersim.similarity.inference.seeds import PairSpread
from layersim.similarity.registry import MEASURES
from layersim.similarity.results import MeasureResult, Uncertainty
from layersim.similarity.stacked_results import StackedResult

# What the hatching tests, by similarity.correction (the figures' note says it), and over which family: each
# heatmap's cells but a layer with itself and a model's own block in a stacked heatmap (not tested, never
# hatched), a symmetric pair once; the metrics' headline claims are corrected as a second family.
_FAMILY = ("over each heatmap's cells (a layer with itself and, stacked, a model with itself not tested; "
           "metrics' headline claims: a second family)")
TESTED = {"none": "p (uncorrected)", "fdr_bh": f"Benjamini–Hochberg q {_FAMILY}",
          "holm": f"Holm-adjusted p {_FAMILY}"}


@dataclass
class SimilarityOutputs:
    """What the similarity and compare stages write: figures and plot rows by (folder, file name), folders
    being "plots", "diagonals" and "localization"; and the metrics."""
    figures: dict[tuple[str, str], object] = field(default_factory=dict)
    rows: dict[tuple[str, str], list] = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)

    def write(self, folders: dict[str, Path]) -> None:
        """Every figure (PNG) and plot-row file (JSON) into its folder."""
        for (where, name), figure in self.figures.items():
            write_figure(figure, folders[where] / name)
        for (where, name), rows in self.rows.items():
            write_json(rows, folders[where] / name)


def null_note(uncertainty: Uncertainty, method: str, permutations: int | None = None, attention: bool = False) -> str:
    """The figure note of a null made by `method` (exact, permutation, block permutation or rotation) under
    `uncertainty`, with the `permutations` it drew (linear CKA's block null draws at least 199, more than asked);
    `attention`: of attention maps (layersim.similarity.inference.attention_null)."""
    drawn = uncertainty.permutations if not permutations else permutations
    floor = f", smallest p 1/{drawn + 1}"
    if attention:  # whole maps onto maps of equal length, a cluster's examples together
        return chance_note(uncertainty.significance, f"permutation null ({drawn} permutations of whole examples"
                           f"{floor})", "the column layer's examples exchanged with examples of equal length, "
                           "examples sharing a text together", TESTED[uncertainty.correction])
    if method == "rotation":  # tables streamed: the rows are rotated, not shuffled
        return chance_note(uncertainty.significance, f"rotation null ({drawn} random rotations"
                           f"{floor})", "rows of the column layer randomly rotated", TESTED[uncertainty.correction])
    if method == "block permutation":  # rows of one example (words, choices) move together
        return chance_note(uncertainty.significance, f"permutation null ({drawn} permutations of whole examples"
                           f"{floor})", "examples of the column layer shuffled, each example's rows together",
                           TESTED[uncertainty.correction])
    null = ("permutation null (exact moments of the RV coefficient)" if method == "exact"
            else f"permutation null ({drawn} permutations{floor})")
    return chance_note(uncertainty.significance, null, tested=TESTED[uncertainty.correction])



@dataclass
class PoolingReport:
    """One pooling's results: the grid figure and its plot rows, the diagonal curves and their rows, metrics,
    and each measure's stacked matrix (for the localization score)."""

    figure: object
    rows: list[dict]
    diagonal_figure: object | None
    diagonal_rows: list[dict]
    metrics: dict
    matrices: dict[str, np.ndarray] = field(default_factory=dict)


def phang_summary(results: Sequence[MeasureResult], sizes: dict[str, int], title: str, *,
                  uncertainty: Uncertainty | None = None, first_layer: int = 0,
                  attention: bool = False, flagged: Collection[str] = ()) -> PoolingReport:
    """Each measure's Phang et al. comparisons (layers per model in `sizes`: ORIG, then FT[1], FT[2], …) as one
    row of heatmaps (cells not above chance hatched, blocks of layers outlined), plot rows and metrics; the
    per-layer diagonals with their null, interval and spread over seed pairs as curves, for measures with a null.
    Row/column 0 is layer `first_layer` (1 for attention maps); `flagged`: labels of runs that did not converge,
    left out of the seed means' converged-only column."""
    grid, rows, metrics, curves, curve_bounds, notes = {}, [], {}, {}, {}, {}
    for result in results:
        measure, comparisons = result.measure, result.comparisons
        label = attention_measure_label(measure) if attention else MEASURES[measure].label
        bounds = attention_measure_bounds(measure) if attention else MEASURES[measure].bounded
        if result.null is not None:
            notes[result.null.method] = null_note(uncertainty, result.null.method, result.null.permutations,
                                                  attention=attention)
        grid[label] = ({c.title: _panel(c, result.blocks.get(c.key)) for c in comparisons}, bounds)
        rows += [row for c in comparisons for row in matrix_rows(
            c.matrix, "similarity", comparison=c.title, measure=label, first_layer=first_layer, cells=_cells(c),
            **({} if c.p_adjusted is None else {"correction": uncertainty.correction}))]
        entry = metrics[measure] = summarize(comparisons, first_layer, bounds=bounds, flagged=flagged,
                                             adjusted=bool(uncertainty and uncertainty.adjusted))
        if result.unavailable:
            entry["no_null"] = result.unavailable
        if result.no_interval:
            entry["no_interval"] = result.no_interval
        if result.above_random is not None:
            entry["ft_orig_above_random"] = {key: round(value, 6) if isinstance(value, float) else value
                                             for key, value in result.above_random.items()}
        entry["blocks"] = {key: blocks_metrics(found, first_layer) for key, found in result.blocks.items()
                           if found is not None}
        for key, value in result.bootstrap_stability.items():
            entry["blocks"][key]["bootstrap_stability"] = round(value, 6)
        if result.seed_stability is not None:  # Rand index, 1: the other seeds' FT–FT split the same way
            entry["blocks"]["seed_stability"] = round(result.seed_stability, 6)
        if result.null is not None:
            entry["null"] = {"method": result.null.method, "permutations": result.null.permutations}
            entry["correction"] = uncertainty.correction  # of p_adjusted, over each heatmap's cells
            if result.kept_dimensions is not None:
                entry["kept_dimensions"] = result.kept_dimensions
            curves[label], curve_bounds[label] = _diagonal_curves(comparisons, result.seed_spread), bounds
            for key, spread in result.pair_spreads.items():  # FT[i]–FT[j], LoRA[i]–FT[j ≠ i], …
                entry[key] = pair_metrics(spread, first_layer)
    figure = measure_grid(grid, title, first_layer=first_layer, note="\n".join(notes.values()) or None)
    diagonal_figure = (diagonal_curves(curves, f"per-layer similarity and chance — {title}", first_layer=first_layer,
                                       bounds=curve_bounds) if curves else None)
    diagonal_rows = [{"series": f"{measure} {name}", "measure": measure, "comparison": name,
                      "layer": k + first_layer, **{
                         key: _number(values[k]) for key, values in _curve_columns(curve).items()}}
                     for measure, by_name in curves.items() for name, curve in by_name.items()
                     for k in range(len(curve.values))]
    return PoolingReport(figure, rows, diagonal_figure, diagonal_rows, metrics,
                         {result.measure: result.matrix for result in results})


def pair_metrics(spread: PairSpread, first_layer: int = 0) -> dict:
    """A comparison over pairs of runs of different seeds (layersim.similarity.inference.seeds.over_seed_pairs) for
    the metrics: ``mean`` per layer, ``sd`` over the pairs (not for a difference), ``ci_low``/``ci_high`` (the
    jackknife interval over seeds, ≥ 3 seeds), ``pairs``, ``seeds`` and what the interval is (``interval``)."""
    entry = {"mean": per_layer(spread.mean, first_layer), "pairs": spread.pairs, "seeds": spread.seeds,
             "interval": spread.note}
    if spread.sd is not None:
        entry["sd"] = per_layer(spread.sd, first_layer)
    if spread.low is not None:
        entry["ci_low"], entry["ci_high"] = per_layer(spread.low, first_layer), per_layer(spread.high, first_layer)
    return entry


def blocks_metrics(found: Blocks, first_layer: int = 0) -> dict:
    """A segmentation for the metrics: the block of every layer, how many blocks, where the last starts,
    and the mean within- and between-block similarity and their contrast."""
    labels = {f"layer_{k + first_layer:02d}": None for k in range(found.starts[0])}
    for index, (start, end) in enumerate(found.spans):
        labels |= {f"layer_{k + first_layer:02d}": index for k in range(start, end + 1)}
    return {"block_of_layer": labels, "num_blocks": len(found.starts),
            "last_block_start": found.starts[-1] + first_layer, "within": number(found.within),
            "between": number(found.between), "contrast": number(found.contrast)}


def _panel(c: Comparison, blocks: Blocks | None = None) -> tuple:
    spans = None if blocks is None or len(blocks.starts) < 2 else blocks.spans
    return (c.matrix, c.y_label, c.x_label, c.at_chance, spans)


def _cells(c: Comparison) -> dict[str, np.ndarray]:
    if c.null_mean is None:
        return {}
    return {"null_mean": c.null_mean, "p_value": c.p_value,
            **({} if c.p_adjusted is None else {"p_adjusted": c.p_adjusted})}


def _diagonal_curves(comparisons: Sequence[Comparison],
                     seed_spread: tuple[np.ndarray, np.ndarray] | None) -> dict[str, Curve]:
    curves = {}
    for c in comparisons:
        if c.key in ("ft_orig", "ft1_ft2") or c.key not in PHANG_KEYS:  # and finetune.compare_methods' diagonals
            curves[c.title] = Curve(np.diag(c.matrix), c.interval, null_mean=np.diag(c.null_mean))
    if seed_spread is not None:
        mean, sd = seed_spread
        curves["FT[i]–FT[j]"] = Curve(mean, (mean - sd, mean + sd), band_label="± sd over seed pairs")
    return curves


def _curve_columns(curve: Curve) -> dict[str, np.ndarray]:
    columns = {"similarity": curve.values}
    if curve.null_mean is not None:
        columns["null_mean"] = curve.null_mean
    if curve.band is not None:
        columns["low"], columns["high"] = curve.band
    return columns


def _number(value) -> float | None:
    return round(float(value), 6) if np.isfinite(value) else None


@dataclass
class StackedReport:
    """Every layer of several models against every other, for one measure: the block heatmap, plot rows,
    the per-model summary against the first model, and the matrix."""

    figure: object
    rows: list[dict]
    summary: dict
    matrix: np.ndarray


def stacked_summary(result: StackedResult, title: str, *, uncertainty: Uncertainty | None = None,
                    first_layer: int = 0, attention: bool = False, **fields) -> StackedReport:
    """One stacked matrix as a block heatmap (cells not above chance hatched), plot rows and the summary
    against the first model. `fields` are added to every plot row (e.g. pooling)."""
    measure, matrix, sizes, null = result.measure, result.matrix, result.sizes, result.null
    label = attention_measure_label(measure) if attention else MEASURES[measure].label
    bounds = attention_measure_bounds(measure) if attention else MEASURES[measure].bounded
    note = None
    if null is not None:
        note = null_note(uncertainty, null.method, null.permutations, attention=attention)
        fields |= {"correction": uncertainty.correction}
    elif uncertainty is not None and result.unavailable:
        note = f"no uncertainty (no null, no interval): {result.unavailable}"
    if result.interval is not None:  # the cells the summary reports per layer
        note += (f"\n{uncertainty.bootstrap} bootstrap resamples of whole examples ({result.interval_method}): 95% "
                 f"intervals of each model's layer k against {next(iter(sizes))}'s in the plot data (ci_low, ci_high)")
    figure = block_heatmap(matrix, list(sizes.items()), title, label, bounds, first_layer=first_layer,
                           chance=result.at_chance, note=note)
    cells = {} if null is None else {"null_mean": null.null_mean, "p_value": null.p_value,
                                     "p_adjusted": result.p_adjusted}
    if result.interval is not None:
        cells |= dict(zip(("ci_low", "ci_high"), result.interval))
    rows = stacked_rows(matrix, sizes, first_layer, cells=cells, measure=label, **fields)
    summary = pair_summary(matrix, sizes, next(iter(sizes)), first_layer, null, result.interval)
    if null is not None:
        summary["correction"] = uncertainty.correction
    elif uncertainty is not None and result.unavailable:
        summary["no_null"] = result.unavailable
    if result.no_interval:
        summary["no_interval"] = result.no_interval
    if result.kept_dimensions is not None:
        summary["kept_dimensions"] = result.kept_dimensions
    return StackedReport(figure, rows, summary, matrix)


@dataclass
class LocalizationReport:
    """Wu et al.'s localization score per model and layer, its plot rows and its figure."""

    scores: dict[str, np.ndarray]
    rows: list[dict]
    figure: object


def localization_summary(scores: dict[str, np.ndarray], style: str, title: str, **fields) -> LocalizationReport:
    """The localization score (`style` "raw" or "zscore", by model) as curves and plot rows. `fields` are added
    to every plot row (e.g. pooling)."""
    rows = [{**fields, "series": " ".join(map(str, (label, *fields.values()))), "model": label, "layer": k,
             "localization": number(v)}
            for label, values in scores.items() for k, v in enumerate(values) if number(v) is not None]
    figure = localization_curves(scores, f"localization ({style}), {title}", ylabel=LOCALIZATION_LABELS[style])
    return LocalizationReport(scores, rows, figure)
