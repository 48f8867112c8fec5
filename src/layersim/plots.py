"""Figures in the papers' layouts, and the long-form rows that `dvc plots` renders."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # stages run headless

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


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


def matrix_rows(matrix: np.ndarray, value_name: str, **fields) -> list[dict]:
    """Long-form rows {x_layer, y_layer, value, **fields} of a layer × layer matrix, for `dvc plots`."""
    rows = []
    for y, x in np.ndindex(matrix.shape):
        value = matrix[y, x]
        if np.isfinite(value):  # undefined cells are left out: the heatmap shows them empty
            rows.append({**fields, "y_layer": int(y), "x_layer": int(x), value_name: round(float(value), 6)})
    return rows


VARIANT_STYLE = {  # Phang et al. Figure 3's colours
    "untuned": ("Untuned", "tab:green"),
    "tuned": ("Tuned", "tab:blue"),
    "tuned_orig": ("TunedOrig", "goldenrod"),
}


def truncation_curves(per_seed: dict[str, list[list[float]]], full: list[float], baseline: float, metric: str,
                      title: str):
    """Score (y) against exit layer (x) for each variant: the mean over seeds as a line, the range
    over seeds as a band; the full fine-tuned model as a grey line and the majority-class baseline
    as a red dotted line (Phang et al. Figure 3)."""
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
    num = len(next(iter(per_seed.values()))[0])
    ax.set_xticks(range(num))
    ax.set_xticklabels(layer_tick_labels(num))
    ax.set_xlabel("exit layer (layers above it discarded)")
    ax.set_ylabel(metric)
    ax.set_title(title)
    ax.legend(fontsize=8, loc="best", framealpha=0.9)
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
