"""What the similarity stage reports for one task and one kind of points: Phang et al.'s comparisons
(ORIG–ORIG, FT–ORIG, FT–FT, FT[1]–FT[2]) for every measure, each cell with its permutation null, the
per-layer diagonals with bootstrap intervals and the spread over seed pairs, as figures, plot rows and
metrics. No files and no DVC here: the stage reads the tables and writes what this returns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from layersim.similarity.comparisons import (LOCALIZATION_LABELS, Comparison, attention_measure_bounds,
                                             attention_measure_label, block, diagonal_intervals, localization,
                                             measure_options, number, pair_summary, per_layer, phang_cells,
                                             phang_comparisons, seed_spread, stacked_matrix, stacked_null, summarize)
from layersim.similarity.comparisons import RANDOM
from layersim.reporting.plots import (Curve, block_heatmap, chance_note, diagonal_curves, localization_curves,
                                      matrix_rows, measure_grid, stacked_rows)
from layersim.errors import LayersimError
from layersim.similarity import MEASURES, MOMENT_MEASURES, NullMatrix, is_constant
from layersim.similarity.correction import adjusted_p_values, at_chance, cells_needed, declares, permutations_needed
from layersim.similarity.blocks import Blocks, find_blocks, stability
from layersim.similarity.cca import CAPPED_MEASURES, kept_dimensions
from layersim.similarity.kernels import RBF_EXACT_MAX_ROWS

# The comparisons whose matrices are segmented into blocks of layers (Phang et al.'s block-diagonal
# structure): one model's layers against themselves, and the two seeds' (symmetrised).
BLOCK_COMPARISONS = ("orig_orig", "ft_ft", "ft1_ft2")


# What the hatching tests, by similarity.correction (the figures' note says it).
TESTED = {"none": "p (uncorrected)", "fdr_bh": "Benjamini–Hochberg q over each heatmap's cells",
          "holm": "Holm-adjusted p over each heatmap's cells"}


@dataclass(frozen=True)
class Uncertainty:
    """How every reported value is qualified: its permutation null, and a bootstrap interval for diagonals."""

    permutations: int = 100      # sampled permutations per cell (linear CKA uses exact moments instead)
    bootstrap: int = 200         # resamples of the examples; 0 computes no interval
    seed: int = 0
    significance: float = 0.05   # cells with a corrected p ≥ this are drawn hatched: not above chance
    adjusted: bool = False       # also report the chance-adjusted diagonal
    correction: str = "fdr_bh"   # over each heatmap's cells (layersim.similarity.correction)

    def note(self, method: str) -> str:
        floor = f", smallest p 1/{self.permutations + 1}"
        if method == "rotation":  # tables streamed: the rows are rotated, not shuffled
            return chance_note(self.significance, f"rotation null ({self.permutations} random rotations{floor})",
                               "rows of the column layer randomly rotated", TESTED[self.correction])
        null = ("permutation null (exact moments of the RV coefficient)" if method == "exact"
                else f"permutation null ({self.permutations} permutations{floor})")
        return chance_note(self.significance, null, tested=TESTED[self.correction])

    def corrected(self, p_values: np.ndarray) -> np.ndarray:
        """`p_values` of one heatmap's cells, corrected over them."""
        return adjusted_p_values(p_values, self.correction)

    def check_reach(self, cells: int, measures: Sequence[str], what: str) -> str | None:
        """Before any permutation: refuse when the correction can declare no cell of a heatmap of `cells` cells
        with this many draws (Holm, whose first step needs 1/(permutations + 1) < significance/cells), and
        return a warning when only many cells at the smallest p-value together can be (BH); `measures`: those
        with a sampled null (permutations or rotations; linear CKA's exact null gives continuous p-values)."""
        draws, level, method = self.permutations, self.significance, self.correction
        if not measures or declares(method, level, draws, cells):
            return None
        if not declares(method, level, draws, cells, cells):
            raise LayersimError(
                f"{what}: similarity.correction = {method} over the {cells} cells of a heatmap needs "
                f"similarity.permutations ≥ {permutations_needed(method, level, cells, cells)} for any cell of "
                f"{', '.join(measures)} to be above chance (their smallest p-value is 1/(permutations + 1)), but "
                f"it is {draws}; raise it, or use fdr_bh.")
        return (f"{what}: with {method} over the {cells} cells of a heatmap and {draws} permutations, a cell of "
                f"{', '.join(measures)} is above chance only together with at least "
                f"{cells_needed(method, level, draws, cells) - 1} others at the smallest p-value 1/{draws + 1}; a "
                f"lone cell needs {permutations_needed(method, level, cells)} permutations")


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


def phang_report(sizes: dict[str, int], matrix_of: Callable[[str], np.ndarray], measures: Sequence[str],
                 title: str, *, layers: Callable[[], dict[str, list]] | None = None,
                 options: dict[str, dict] | None = None, uncertainty: Uncertainty | None = None,
                 groups: np.ndarray | None = None, first_layer: int = 0, attention: bool = False,
                 streamed_null: Callable[[str, np.ndarray, int, int], NullMatrix | None] | None = None
                 ) -> PoolingReport:
    """Stacked matrices per measure (`matrix_of(measure)`, layers per model in `sizes`: ORIG, then FT[1], FT[2], …)
    as Phang et al.'s comparisons.

    With `uncertainty` and `layers()` (the models' layer arrays, by the labels of `sizes`), each reported cell
    gets its permutation null and the FT–ORIG and FT[1]–FT[2] diagonals a bootstrap interval over examples
    (over `groups` of rows: the words of one example are resampled together); with more than two seeds,
    the FT[i]–FT[j] diagonals' mean ± sd over all pairs. Attention maps get no null (a permutation of
    examples has no meaning for per-token maps of different lengths). Without `layers` (tables streamed),
    `streamed_null(measure, cells, permutations, seed)` gives the nulls it can from the streamed moments (None
    otherwise), and there are no bootstrap intervals.
    """
    options = options or {}
    orig, finetuned = "ORIG", [label for label in sizes if label not in ("ORIG", RANDOM)]
    grid, rows, metrics, matrices, curves, curve_bounds = {}, [], {}, {}, {}, {}
    notes = {}
    for measure in measures:
        matrix = matrices[measure] = matrix_of(measure)
        label = attention_measure_label(measure) if attention else MEASURES[measure].label
        bounds = attention_measure_bounds(measure) if attention else MEASURES[measure].bounded
        null = None
        qualified = uncertainty is not None and layers is not None and not attention
        unavailable = qualified and null_unavailable(measure, len(next(iter(layers().values()))[0]),
                                                     options.get(measure, {}))
        qualified = qualified and not unavailable
        if qualified:
            null = stacked_null(measure, layers(), permutations=uncertainty.permutations, seed=uncertainty.seed,
                                cells=phang_cells(sizes, orig, finetuned), **options.get(measure, {}))
        elif uncertainty is not None and streamed_null is not None and not attention:
            null = streamed_null(measure, phang_cells(sizes, orig, finetuned), uncertainty.permutations,
                                 uncertainty.seed)
        if null is not None:
            notes[null.method] = uncertainty.note(null.method)
        comparisons = [_corrected(c, uncertainty) for c in phang_comparisons(matrix, sizes, orig, finetuned, null)]
        resampled = {}
        if qualified and uncertainty.bootstrap:
            comparisons, resampled = diagonal_intervals(
                measure, layers(), comparisons, resamples=uncertainty.bootstrap, seed=uncertainty.seed, groups=groups,
                whole=("orig_orig", "ft_ft"), **options.get(measure, {}))
        blocks = {c.key: layer_blocks(c.matrix) for c in comparisons if c.key in BLOCK_COMPARISONS}
        grid[label] = ({c.title: _panel(c, uncertainty, blocks.get(c.key)) for c in comparisons}, bounds)
        rows += [row for c in comparisons for row in matrix_rows(
            c.matrix, "similarity", comparison=c.title, measure=label, first_layer=first_layer, cells=_cells(c),
            **_correction_field(c, uncertainty))]
        metrics[measure] = summarize(comparisons, first_layer, adjusted=bool(uncertainty and uncertainty.adjusted))
        if unavailable:
            metrics[measure]["no_null"] = unavailable
        metrics[measure]["blocks"] = {key: blocks_metrics(found, first_layer) for key, found in blocks.items()
                                      if found is not None}
        for key, per_resample in resampled.items():
            if blocks.get(key) is not None:
                # How far bootstrap resamples of the examples split the layers the same way (Rand index).
                again = [layer_blocks(m) for m in per_resample]
                again = [b for b in again if b is not None and b.num_layers == blocks[key].num_layers]
                if again:
                    metrics[measure]["blocks"][key]["bootstrap_stability"] = round(stability(blocks[key], again), 6)
        if len(finetuned) > 1 and blocks.get("ft_ft") is not None:
            others = [layer_blocks(block(matrix, sizes, label, label)) for label in finetuned[1:]]
            if all(other is not None for other in others):
                # Do the other seeds' FT–FT matrices split into the same blocks? (Rand index, 1: the same)
                metrics[measure]["blocks"]["seed_stability"] = round(stability(blocks["ft_ft"], others), 6)
        if null is not None:
            metrics[measure]["null"] = {"method": null.method, "permutations": null.permutations}
            metrics[measure]["correction"] = uncertainty.correction  # of p_adjusted, over each heatmap's cells
            if measure in CAPPED_MEASURES and layers is not None:
                metrics[measure]["kept_dimensions"] = kept_dimensions_per_layer(layers(), measure,
                                                                                **options.get(measure, {}))
            curves[label], curve_bounds[label] = _diagonal_curves(comparisons, matrix, sizes, finetuned), bounds
            if len(finetuned) > 2:
                mean, sd = seed_spread(matrix, sizes, finetuned)
                metrics[measure]["ft_pairs"] = {"mean": per_layer(mean, first_layer), "sd": per_layer(sd, first_layer),
                                                "pairs": len(finetuned) * (len(finetuned) - 1) // 2}
    figure = measure_grid(grid, title, first_layer=first_layer, note="\n".join(notes.values()) or None)
    diagonal_figure = (diagonal_curves(curves, f"per-layer similarity and chance — {title}", first_layer=first_layer,
                                       bounds=curve_bounds) if curves else None)
    diagonal_rows = [{"measure": measure, "comparison": name, "layer": k + first_layer, **{
                         key: _number(values[k]) for key, values in _curve_columns(curve).items()}}
                     for measure, by_name in curves.items() for name, curve in by_name.items()
                     for k in range(len(curve.values))]
    return PoolingReport(figure, rows, diagonal_figure, diagonal_rows, metrics, matrices)


def kept_dimensions_per_layer(models: dict[str, list], measure: str, **options) -> dict[str, list[int | None]]:
    """How many dimensions a CCA measure compared, per model and layer (None for a constant layer): after the
    rank, variance and `max_dims` cuts, what each value is computed from."""
    return {label: [None if is_constant(layer) else kept_dimensions(layer, measure, **options) for layer in layers]
            for label, layers in models.items()}


def layer_blocks(matrix: np.ndarray) -> Blocks | None:
    """The blocks of a layer × layer matrix (layersim.similarity.blocks) over its defined layers (a layer
    that is constant for every example, e.g. CLS at the embeddings, has no similarity and joins no block),
    in the matrix's layer numbering; None when fewer than two layers are defined."""
    kept = np.flatnonzero(np.isfinite(np.diag(matrix)))
    sub = matrix[np.ix_(kept, kept)]
    if len(kept) < 2 or not np.isfinite(sub).all():
        return None
    found = find_blocks(sub)
    return Blocks(tuple(int(kept[start]) for start in found.starts), int(kept[-1]) + 1, found.within, found.between)


def blocks_metrics(found: Blocks, first_layer: int = 0) -> dict:
    """A segmentation for the metrics: the block of every layer, how many blocks, where the last starts,
    and the mean within- and between-block similarity and their contrast."""
    labels = {f"layer_{k + first_layer:02d}": None for k in range(found.starts[0])}
    for index, (start, end) in enumerate(found.spans):
        labels |= {f"layer_{k + first_layer:02d}": index for k in range(start, end + 1)}
    return {"block_of_layer": labels, "num_blocks": len(found.starts),
            "last_block_start": found.starts[-1] + first_layer, "within": number(found.within),
            "between": number(found.between), "contrast": number(found.contrast)}


def null_unavailable(measure: str, num_rows: int, options: dict) -> str | None:
    """Why `measure` gets neither a null nor bootstrap intervals on `num_rows` examples, or None: above its
    exact_max_rows RBF CKA is Nyström-approximated, and its null engine holds exact n x n kernels."""
    limit = options.get("exact_max_rows", RBF_EXACT_MAX_ROWS)
    if measure != "rbf_cka" or num_rows <= limit:
        return None
    return (f"RBF CKA on {num_rows} rows is Nyström-approximated (above similarity.rbf_exact_max_rows = {limit}); "
            "a null or interval would need the exact n x n kernels or the approximation redone for every draw")


def sampled_null_measures(measures: Sequence[str], num_rows: int, options: dict[str, dict],
                          streamed: bool = False) -> list[str]:
    """The measures whose null is sampled, so that their p-values are at least 1/(permutations + 1): not linear
    CKA (exact moments), nor those without a null (debiased CKA streamed, RBF CKA above its exact_max_rows);
    streamed, the rotation null of the measures computed from moments."""
    if streamed:
        return [m for m in measures if m in MOMENT_MEASURES]
    return [m for m in measures if m != "linear_cka" and not null_unavailable(m, num_rows, options.get(m, {}))]


def _corrected(c: Comparison, uncertainty: Uncertainty | None) -> Comparison:
    """The comparison with its p-values corrected over its cells: one heatmap, one family of tests."""
    if c.p_value is None or uncertainty is None:
        return c
    return dataclasses.replace(c, p_adjusted=uncertainty.corrected(c.p_value))


def _correction_field(c: Comparison, uncertainty: Uncertainty | None) -> dict[str, str]:
    return {} if c.p_adjusted is None or uncertainty is None else {"correction": uncertainty.correction}


def _panel(c: Comparison, uncertainty: Uncertainty | None, blocks: Blocks | None = None) -> tuple:
    spans = None if blocks is None or len(blocks.starts) < 2 else blocks.spans
    if c.p_value is None or uncertainty is None:
        return (c.matrix, c.y_label, c.x_label, None, spans)
    chance = at_chance(c.p_value, uncertainty.correction, uncertainty.significance)
    return (c.matrix, c.y_label, c.x_label, chance, spans)


def _cells(c: Comparison) -> dict[str, np.ndarray]:
    if c.null_mean is None:
        return {}
    return {"null_mean": c.null_mean, "p_value": c.p_value,
            **({} if c.p_adjusted is None else {"p_adjusted": c.p_adjusted})}


def _diagonal_curves(comparisons: Sequence[Comparison], matrix: np.ndarray, sizes: dict[str, int],
                     finetuned: Sequence[str]) -> dict[str, Curve]:
    curves = {}
    for c in comparisons:
        if c.key in ("ft_orig", "ft1_ft2"):
            curves[c.title] = Curve(np.diag(c.matrix), c.interval, null_mean=np.diag(c.null_mean))
    if len(finetuned) > 2:
        mean, sd = seed_spread(matrix, sizes, finetuned)
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


def stacked_report(models: dict[str, list], measure: str, title: str, *, options: dict | None = None,
                   uncertainty: Uncertainty | None = None, first_layer: int = 0, attention: bool = False,
                   **fields) -> StackedReport:
    """All layers of `models` stacked (Wu et al. Figures 1 and 5, Phang et al. Figure 7), the first model being
    the reference of the summary; with `uncertainty`, every cell's permutation null (not for attention maps),
    cells not above it hatched. `fields` are added to every plot row (e.g. pooling)."""
    options = (options or {}).get(measure, {})
    matrix = stacked_matrix(measure, models, **options)
    label = attention_measure_label(measure) if attention else MEASURES[measure].label
    bounds = attention_measure_bounds(measure) if attention else MEASURES[measure].bounded
    sizes = {name: len(layers) for name, layers in models.items()}
    null = chance = note = None
    unavailable = null_unavailable(measure, len(next(iter(models.values()))[0]), options) if not attention else None
    if uncertainty is not None and not attention and not unavailable:
        null = stacked_null(measure, models, permutations=uncertainty.permutations, seed=uncertainty.seed, **options)
        chance = at_chance(null.p_value, uncertainty.correction, uncertainty.significance)  # one heatmap, one family
        note = uncertainty.note(null.method)
        fields |= {"correction": uncertainty.correction}
    figure = block_heatmap(matrix, list(sizes.items()), title, label, bounds, first_layer=first_layer, chance=chance,
                           note=note)
    cells = {} if null is None else {"null_mean": null.null_mean, "p_value": null.p_value,
                                     "p_adjusted": uncertainty.corrected(null.p_value)}
    rows = stacked_rows(matrix, sizes, first_layer, cells=cells, measure=label, **fields)
    summary = pair_summary(matrix, sizes, next(iter(sizes)), first_layer, null)
    if null is not None:
        summary["correction"] = uncertainty.correction
    elif uncertainty is not None and unavailable:
        summary["no_null"] = unavailable
    if measure in CAPPED_MEASURES and not attention:
        summary["kept_dimensions"] = kept_dimensions_per_layer(models, measure, **options)
    return StackedReport(figure, rows, summary, matrix)


def settings(p) -> tuple[dict[str, dict], Uncertainty]:
    """The measures' options and the Uncertainty from params.yaml's similarity section (SimilarityParams)."""
    options = measure_options(rbf_sigma_scale=p.rbf_sigma_scale, svcca_variance=p.svcca_variance,
                              pwcca_variance=p.pwcca_variance, rbf_exact_max_rows=p.rbf_exact_max_rows,
                              rbf_landmarks=p.rbf_landmarks, seed=p.seed)
    return options, Uncertainty(p.permutations, p.bootstrap, p.seed, p.significance, p.chance_adjusted, p.correction)


@dataclass
class LocalizationReport:
    """Wu et al.'s localization score per model and layer, its plot rows and its figure."""

    scores: dict[str, np.ndarray]
    rows: list[dict]
    figure: object


def localization_report(matrices: dict[str, np.ndarray], sizes: dict[str, int], style: str, title: str,
                        **fields) -> LocalizationReport | None:
    """The localization score (`style` "raw" or "zscore") from stacked neuronsim and SVCCA matrices, or None
    when either measure was not computed. `fields` are added to every plot row (e.g. pooling)."""
    if not {"neuronsim", "svcca"} <= set(matrices):
        return None
    scores = localization(matrices["neuronsim"], matrices["svcca"], sizes, standardize=style == "zscore")
    rows = [{**fields, "model": label, "layer": k, "localization": number(v)}
            for label, values in scores.items() for k, v in enumerate(values) if number(v) is not None]
    figure = localization_curves(scores, f"localization ({style}), {title}", ylabel=LOCALIZATION_LABELS[style])
    return LocalizationReport(scores, rows, figure)
