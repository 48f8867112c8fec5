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
