"""Figures in the papers' layouts, and the long-form rows that `dvc plots` renders."""

from __future__ import annotations

import matplotlib
matplotlib.use("Agg")  # stages run headless

from dataclasses import dataclass  # noqa: E402

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402


def layer_tick_labels(num: int) -> list[str]:
    """Layer 0 is the embedding output; 1..L the transformer layers."""
    return ["emb"] + [str(k) for k in range(1, num)]


def heatmap_grid(panels: dict[str, tuple[np.ndarray, str, str]], title: str, *, ncols: int = 2,
                 vmin: float = 0.0, vmax: float = 1.0, colorbar_label: str = "CKA"):
    """One heatmap per panel, a shared colour scale (as in Phang et al. Figure 1).

    `panels` maps a panel title to (matrix, y-axis label, x-axis label); matrix[i, j] is drawn at
    row i (y, bottom = layer 0) and column j (x).
    """
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.9 * nrows), squeeze=False,
                             constrained_layout=True)
    cmap = plt.get_cmap("magma").with_extremes(bad="lightgrey")  # grey: undefined (constant layer)
    image = None
    for ax, (panel, (matrix, ylabel, xlabel)) in zip(axes.flat, panels.items()):
        image = ax.imshow(np.ma.masked_invalid(matrix), origin="lower", cmap=cmap, vmin=vmin, vmax=vmax,
                          aspect="equal")
        ax.set_title(panel)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        for axis, size in ((ax.xaxis, matrix.shape[1]), (ax.yaxis, matrix.shape[0])):
            axis.set_ticks(range(size))
            axis.set_ticklabels(layer_tick_labels(size), fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.8, label=colorbar_label)
    if any(np.isnan(matrix).any() for matrix, _, _ in panels.values()):
        fig.text(0.5, -0.01, "grey: undefined — that layer's representation is the same for every example "
                 "(e.g. CLS at the embedding layer)", ha="center", va="top", fontsize=8)
    fig.suptitle(title)
    return fig


def matrix_rows(matrix: np.ndarray, value_name: str, first_layer: int = 0, *,
                cells: dict[str, np.ndarray] | None = None, **fields) -> list[dict]:
    """Long-form rows {x_layer, y_layer, value, **fields} of a layer × layer matrix, for `dvc plots`;
    row/column 0 is layer `first_layer`. `cells` adds per-cell columns (e.g. null_mean, p_value: arrays
    shaped like `matrix`); a NaN there is written as null."""
    rows = []
    for y, x in np.ndindex(matrix.shape):
        value = matrix[y, x]
        if np.isfinite(value):  # undefined cells are left out: the heatmap shows them empty
            extra = {name: _rounded(values[y, x]) for name, values in (cells or {}).items()}
            rows.append({**fields, "y_layer": int(y) + first_layer, "x_layer": int(x) + first_layer,
                         value_name: round(float(value), 6), **extra})
    return rows


def _rounded(value) -> float | bool | None:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    return round(float(value), 6) if np.isfinite(value) else None


def stacked_rows(matrix: np.ndarray, sizes: dict[str, int], first_layer: int = 0, *,
                 cells: dict[str, np.ndarray] | None = None, **fields) -> list[dict]:
    """Long-form rows of a stacked several-models matrix (see layersim.similarity.comparisons), one per defined
    cell: "comparison" names the two models (row model vs column model), the layers are each model's own;
    `cells` adds per-cell columns as in :func:`matrix_rows`."""
    owners = [(label, k + first_layer) for label, size in sizes.items() for k in range(size)]
    return [{**fields, "comparison": f"{owners[i][0]} vs {owners[j][0]}", "y_layer": owners[i][1],
             "x_layer": owners[j][1], "similarity": round(float(matrix[i, j]), 6),
             **{name: _rounded(values[i, j]) for name, values in (cells or {}).items()}}
            for i, j in zip(*np.nonzero(np.isfinite(matrix)))]


VARIANT_STYLE = {  # Phang et al. Figure 3's colours
    "untuned": ("Untuned", "tab:green"),
    "tuned": ("Tuned", "tab:blue"),
    "tuned_orig": ("TunedOrig", "goldenrod"),
}


def truncation_curves(per_seed: dict[str, list[list[float]]], full: list[float], baseline: float, metric: str,
                      title: str, exported_exit: int | None = None):
    """Score (y) against exit layer (x) for each variant: the mean over seeds as a line, the range
    over seeds as a band; the full fine-tuned model as a grey line and the majority-class baseline
    as a red dotted line (Phang et al. Figure 3); `exported_exit`: the exit the export stage chose, a
    black dotted line."""
    fig, ax = plt.subplots(figsize=(5.5, 3.8), constrained_layout=True)
    for variant, runs in per_seed.items():
        label, colour = VARIANT_STYLE[variant]
        values = np.asarray(runs, dtype=float)
        layers = np.arange(values.shape[1])
        ax.plot(layers, values.mean(0), marker="o", ms=3, color=colour, label=label)
        if len(values) > 1:
            ax.fill_between(layers, values.min(0), values.max(0), color=colour, alpha=0.2, lw=0)
    ax.axhline(float(np.mean(full)), color="grey", lw=1, label="full fine-tuned model")
    ax.axhline(baseline, color="red", ls=":", lw=1.2, label="majority baseline")
    if exported_exit is not None:
        ax.axvline(exported_exit, color="black", ls=":", lw=1.2, label=f"exported: exit after layer {exported_exit}")
    num = len(next(iter(per_seed.values()))[0])
    ax.set_xticks(range(num))
    ax.set_xticklabels(layer_tick_labels(num))
    ax.set_xlabel("exit layer (layers above it discarded)")
    ax.set_ylabel(metric)
    ax.set_title(title)
    ax.legend(fontsize=8, loc="best", framealpha=0.9)
    return fig


def export_curve(curves: dict[str, dict[int, float]], full: dict[str, float], tolerance: float, chosen: int,
                 metric: str, title: str):
    """The score with n layers kept (x: n) of the choice that is best on the train examples, on each split
    (one curve per split: the train examples the choice is made on, validation), the full model's score
    minus the tolerance as a dashed line per split, and the chosen depth as a vertical line."""
    fig, ax = plt.subplots(figsize=(5.5, 3.8), constrained_layout=True)
    for (split, points), colour in zip(curves.items(), ("tab:blue", "tab:orange", "tab:green")):
        depths = sorted(points)
        ax.plot(depths, [points[n] for n in depths], marker="o", ms=3, color=colour, label=f"best on train with n layers ({split})")
        ax.axhline(full[split] - tolerance, color=colour, ls="--", lw=1, label=f"full model − {tolerance:g} ({split})")
    ax.axvline(chosen, color="black", lw=1.2, ls=":", label=f"exported: {chosen} layers")
    ax.set_xticks(sorted({n for points in curves.values() for n in points}))
    ax.set_xlabel("layers kept (exit early or skip a span)")
    ax.set_ylabel(metric)
    ax.set_title(title)
    ax.legend(fontsize=7, loc="lower right", framealpha=0.9)
    return fig


def span_heatmap(scores: np.ndarray, full: float, metric: str, title: str):
    """Score with layers i..j skipped: row i (first skipped layer), column j (last skipped layer);
    the lower triangle (j < i) is empty. The colour bar marks the full model's score."""
    fig, ax = plt.subplots(figsize=(4.8, 4.2), constrained_layout=True)
    masked = np.ma.masked_invalid(scores)
    image = ax.imshow(masked, origin="upper", cmap=plt.get_cmap("viridis").with_extremes(bad="white"))
    num = scores.shape[0]
    ax.set_xticks(range(num))
    ax.set_xticklabels(range(1, num + 1))
    ax.set_yticks(range(num))
    ax.set_yticklabels(range(1, num + 1))
    ax.set_xlabel("last skipped layer j")
    ax.set_ylabel("first skipped layer i")
    for i, j in zip(*np.nonzero(~masked.mask)):
        ax.text(j, i, f"{scores[i, j]:.2f}", ha="center", va="center", fontsize=6,
                color="white" if scores[i, j] < (masked.min() + masked.max()) / 2 else "black")
    bar = fig.colorbar(image, ax=ax, shrink=0.8, label=metric)
    bar.ax.axhline(full, color="red", lw=1.5)
    ax.set_title(title)
    return fig


def _heatmap(ax, matrix: np.ndarray, vmin: float | None, vmax: float | None, cmap, chance: np.ndarray | None = None):
    """A layer × layer heatmap; the cells where `chance` is True are greyed and hatched (not above the null)."""
    image = ax.imshow(np.ma.masked_invalid(matrix), origin="lower", cmap=cmap, vmin=vmin, vmax=vmax, aspect="equal")
    if chance is not None:
        for i, j in zip(*np.nonzero(chance & np.isfinite(matrix))):
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor=(0.83, 0.83, 0.83, 0.6), edgecolor="dimgrey",
                                   hatch="////", linewidth=0))
    return image


def chance_note(significance: float, null: str, how: str = "rows of the column layer shuffled", tested="p") -> str:
    """The figure note that explains hatched cells: the value tested (p, or a corrected one) and the null."""
    return f"hatched grey: not above chance — {tested} ≥ {significance:g}; the {null}, {how}"


# Panels side by side at most: a wider figure is shrunk below legibility on a 1,400 px page (the report, `dvc plots
# show`); more panels (comparisons of several fine-tuning methods, many measures) wrap onto further rows.
PANELS_PER_ROW = 4


def measure_grid(rows: dict[str, tuple[dict[str, tuple], tuple[float, float] | None]],
                 title: str, *, first_layer: int = 0, note: str | None = None):
    """One row of heatmaps per similarity measure, one column per comparison (Phang et al. Figure 1's
    panels side by side; Wu et al. Figure 2's one-heatmap-per-measure view); past PANELS_PER_ROW comparisons a
    measure's panels wrap onto further rows, which share its colour bar.

    `rows` maps a measure label to (panels, bounds): panels as in :func:`heatmap_grid`, each optionally with
    a fourth element, a boolean mask of the cells not above chance (greyed and hatched, explained by
    `note`, or None), and a fifth, blocks of layers as (first, last) spans, outlined on the diagonal; bounds the measure's fixed colour range, or None to scale that row to its own values.
    `first_layer` is the layer the first row/column stands for (1 for attention maps, which have no
    embedding layer).
    """
    ncols = min(PANELS_PER_ROW, max(len(panels) for panels, _ in rows.values()))
    lines = {measure: -(-len(panels) // ncols) for measure, (panels, _) in rows.items()}  # a measure's grid rows
    fig, grid = plt.subplots(sum(lines.values()), ncols, figsize=(3.4 * ncols + 0.8, 3.1 * sum(lines.values())),
                             squeeze=False, constrained_layout=True)
    cmap = plt.get_cmap("magma").with_extremes(bad="lightgrey")
    undefined = hatched = outlined = False
    starts = np.cumsum([0, *lines.values()])
    for start, (measure, (panels, bounds)) in zip(starts, rows.items()):
        row_axes = list(grid[start:start + lines[measure]].flat)
        first_column = set(grid[start:start + lines[measure], 0])
        values = np.concatenate([p[0][np.isfinite(p[0])] for p in panels.values()] or [np.zeros(1)])
        vmin, vmax = bounds if bounds is not None else (values.min(initial=0.0), values.max(initial=1.0))
        image = None
        for ax, (panel, (matrix, ylabel, xlabel, *extra)) in zip(row_axes, panels.items()):
            chance = extra[0] if extra else None
            spans = extra[1] if len(extra) > 1 else None
            image = _heatmap(ax, matrix, vmin, vmax, cmap, chance)
            for start, end in spans or ():
                ax.add_patch(Rectangle((start - 0.5, start - 0.5), end - start + 1, end - start + 1, fill=False,
                                       edgecolor="cyan", linewidth=1.6))
            outlined |= bool(spans)
            undefined |= bool(np.isnan(matrix).any())
            hatched |= chance is not None and bool((chance & np.isfinite(matrix)).any())
            ax.set_title(panel, fontsize=10)
            ax.set_xlabel(xlabel, fontsize=8)
            ax.set_ylabel(f"{measure}\n{ylabel}" if ax in first_column else ylabel, fontsize=8)
            for axis, size in ((ax.xaxis, matrix.shape[1]), (ax.yaxis, matrix.shape[0])):
                axis.set_ticks(range(size))
                labels = layer_tick_labels(size + first_layer)[first_layer:]
                axis.set_ticklabels(labels, fontsize=6)
        for ax in row_axes[len(panels):]:
            ax.axis("off")
        if image is not None:
            fig.colorbar(image, ax=row_axes, shrink=0.85, label=measure)
    notes = []
    if undefined:
        notes.append("grey: undefined — that layer's representation is the same for every example "
                     "(e.g. CLS at the embedding layer)")
    if note and hatched:
        notes.append(note)
    if outlined:
        notes.append("cyan outlines: blocks of layers more alike than the matrix's average pair "
                     "(layersim.similarity.blocks)")
    if notes:
        fig.text(0.5, -0.01, "\n".join(notes), ha="center", va="top", fontsize=8)
    fig.suptitle(title)
    return fig


def block_heatmap(matrix: np.ndarray, blocks: list[tuple[str, int]], title: str, measure: str,
                  bounds: tuple[float, float] | None = (0.0, 1.0), *, first_layer: int = 0,
                  chance: np.ndarray | None = None, note: str | None = None):
    """All layers of several models in one matrix, a block per pair of models, separated by white
    lines and labelled by model (Wu et al. Figures 1, 5 and 6).

    `blocks` lists (model label, number of layers) in the order the layers are stacked; cells where
    `chance` is True are greyed and hatched, and `note` (shown whether or not a cell is hatched) says what
    tested them, or why nothing could.
    """
    size = matrix.shape[0]
    fig, ax = plt.subplots(figsize=(min(2.0 + 0.28 * size, 14), min(1.6 + 0.28 * size, 13)), constrained_layout=True)
    vmin, vmax = bounds if bounds is not None else (np.nanmin(matrix), np.nanmax(matrix))
    image = _heatmap(ax, matrix, vmin, vmax, plt.get_cmap("magma").with_extremes(bad="lightgrey"), chance)
    edges = np.cumsum([0] + [n for _, n in blocks])
    for edge in edges[1:-1]:
        ax.axhline(edge - 0.5, color="white", lw=1.5)
        ax.axvline(edge - 0.5, color="white", lw=1.5)
    ticks, labels = [], []
    for (label, n), start in zip(blocks, edges):
        ticks += list(range(start, start + n))
        labels += layer_tick_labels(n + first_layer)[first_layer:]
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_ticks(ticks)
        axis.set_ticklabels(labels, fontsize=6)
    centres = [(start + start + n - 1) / 2 for (_, n), start in zip(blocks, edges)]
    names = [label for label, _ in blocks]
    top = ax.secondary_xaxis("top")
    top.set_xticks(centres, names, fontsize=8)
    right = ax.secondary_yaxis("right")
    right.set_yticks(centres, names, fontsize=8, rotation=90, va="center")
    fig.colorbar(image, ax=ax, shrink=0.8, label=measure, pad=0.08)
    ax.set_title(title)
    if note:
        fig.text(0.5, -0.01, note, ha="center", va="top", fontsize=8)
    return fig


def localization_curves(scores: dict[str, np.ndarray], title: str, *, first_layer: int = 0,
                        ylabel: str = "localization: mean neuronsim − mean svsim"):
    """Localization score (y) per layer (x), one line per model (Wu et al. Figures 3 and 7); higher
    means information is held more by individual neurons than spread over the layer."""
    fig, ax = plt.subplots(figsize=(5.5, 3.8), constrained_layout=True)
    for label, values in scores.items():
        layers = np.arange(first_layer, first_layer + len(values))
        ax.plot(layers, values, marker="o", ms=3, label=label)
    ax.axhline(0.0, color="grey", lw=0.8)
    num = max(len(v) for v in scores.values()) + first_layer
    ax.set_xticks(range(first_layer, num))
    ax.set_xticklabels(layer_tick_labels(num)[first_layer:])
    ax.set_xlabel("layer")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8, loc="best", framealpha=0.9)
    return fig


@dataclass(frozen=True)
class Curve:
    """One per-layer similarity curve: values, an optional band (low, high) and the null's mean."""
    values: np.ndarray
    band: tuple[np.ndarray, np.ndarray] | None = None
    band_label: str = "95% bootstrap interval"
    null_mean: np.ndarray | None = None


def diagonal_curves(panels: dict[str, dict[str, Curve]], title: str, *, first_layer: int = 0,
                    bounds: dict[str, tuple[float, float] | None] | None = None):
    """The diagonals of the comparisons (layer k against layer k), one panel per measure, one line per
    comparison with its band (bootstrap interval, or ± sd over seed pairs) and the permutation null's
    mean as a dotted line of the same colour: how far each layer's similarity is above chance; PANELS_PER_ROW
    panels to a row."""
    ncols = min(PANELS_PER_ROW, len(panels))
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.4 * ncols, 4.2 * nrows), squeeze=False, layout="constrained")
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (measure, curves) in zip(axes.flat, panels.items()):
        for n, (label, curve) in enumerate(curves.items()):
            colour = f"C{n}"
            layers = np.arange(first_layer, first_layer + len(curve.values))
            ax.plot(layers, curve.values, marker="o", ms=3, color=colour, label=label)
            if curve.band is not None:
                ax.fill_between(layers, *curve.band, color=colour, alpha=0.2, lw=0,
                                label=f"{label}: {curve.band_label}")
                # A bootstrap interval corrects the estimate's bias; when the bias it finds exceeds its
                # half-width the interval lies beside the value drawn, which the figure must say.
                with np.errstate(invalid="ignore"):
                    outside = (np.asarray(curve.values) < curve.band[0]) | (np.asarray(curve.values) > curve.band[1])
                if outside.any():
                    ax.plot(layers[outside], np.asarray(curve.values)[outside], ls="none", marker="X", ms=8,
                            color=colour, markeredgecolor="black", label=f"{label}: value outside its interval "
                            "(the resamples put its bias beyond the interval's half-width)")
            if curve.null_mean is not None:
                ax.plot(layers, curve.null_mean, ls=":", lw=1.3, color=colour, label=f"{label}: null mean")
        num = max(len(c.values) for c in curves.values()) + first_layer
        ax.set_xticks(range(first_layer, num))
        ax.set_xticklabels(layer_tick_labels(num)[first_layer:], fontsize=7)
        if bounds and bounds.get(measure) is not None:
            ax.set_ylim(*bounds[measure])
        ax.set_xlabel("layer k (vs the same layer k)")
        ax.set_ylabel(measure)
        ax.set_title(measure)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=min(3, len(labels)), fontsize=7, frameon=False)
    fig.suptitle(title)
    return fig


def method_bars(values: dict[str, float], title: str, ylabel: str, references: dict[str, float] | None = None):
    """One bar per alignment method (Ren et al. Tables 3 and 5 as a chart), reference values as lines."""
    fig, ax = plt.subplots(figsize=(1.0 + 0.8 * len(values), 3.6), constrained_layout=True)
    bars = ax.bar(list(values), list(values.values()), color="tab:blue")
    ax.bar_label(bars, fmt="%.3f", fontsize=7)
    for (label, value), style in zip((references or {}).items(), ("-", "--", ":", "-.")):
        ax.axhline(value, color="grey" if style == "-" else "red", ls=style, lw=1.2, label=f"{label} ({value:.3f})")
    if references:
        ax.legend(fontsize=7, loc="best", framealpha=0.9)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    return fig


def last_block_counts(starts: dict[str, dict[str, int | None]], labels: dict[str, str], num_layers: int, title: str):
    """How many tasks' last block of layers starts at each layer, one bar per comparison (`labels`: key →
    legend label) — Phang et al.'s "the last layers form their own block", counted."""
    fig, ax = plt.subplots(figsize=(max(5.0, 0.45 * num_layers + 2), 3.4), constrained_layout=True)
    width = 0.8 / max(1, len(labels))
    for k, (key, label) in enumerate(labels.items()):
        counts = np.bincount([s[key] for s in starts.values() if s.get(key) is not None], minlength=num_layers)
        ax.bar(np.arange(num_layers) + (k - (len(labels) - 1) / 2) * width, counts[:num_layers], width, label=label)
    ax.set_xticks(range(num_layers))
    ax.set_xticklabels(layer_tick_labels(num_layers), fontsize=7)
    ax.set_xlabel("layer where the last block starts")
    ax.set_ylabel("tasks")
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    return fig
