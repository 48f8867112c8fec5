"""The skip stage's prediction figure: each span's measured score against what a similarity rule predicts."""

from __future__ import annotations

from collections.abc import Mapping

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import MaxNLocator

import layersim.reporting.plots  # noqa: F401  (selects the headless backend before any figure)

AXIS_LABELS = {"angular_distance": "angular distance d(layer i−1, layer j)  [Gromov et al.]",
               "block_influence": "summed Block Influence of layers i..j  [ShortGPT]"}


Span = tuple[int, int]


def prediction_scatter(scores: Mapping[Span, float], predicted: Mapping[str, Mapping[Span, float | None]],
                       spearman: Mapping[str, float | None], full: float, metric: str, title: str):
    """One panel per predictor: every skipped span (i, j) at its predicted value (x; lower = predicted more
    droppable) and measured score (y), coloured by its length j − i + 1; the full model's score as a red line."""
    spans = sorted(scores)
    lengths = np.array([j - i + 1 for i, j in spans])
    fig, axes = plt.subplots(1, len(predicted), figsize=(4.6 * len(predicted), 4.0), squeeze=False,
                             constrained_layout=True)
    points = None
    for ax, (name, values) in zip(axes.flat, predicted.items()):
        x = np.array([np.nan if values[s] is None else values[s] for s in spans], dtype=float)
        points = ax.scatter(x, [scores[s] for s in spans], c=lengths, cmap="viridis", s=22,
                            vmin=1, vmax=max(int(lengths.max()), 2))
        ax.axhline(full, color="red", lw=1.2)
        rho = spearman.get(name)
        ax.set_title(f"Spearman ρ = {rho:.2f}" if rho is not None else "Spearman ρ undefined", fontsize=9)
        ax.set_xlabel(AXIS_LABELS.get(name, name), fontsize=8)
        ax.set_ylabel(f"{metric} with span skipped")
    bar = fig.colorbar(points, ax=axes.ravel().tolist(), shrink=0.8, label="span length")
    bar.locator = MaxNLocator(integer=True)  # lengths are whole layers
    bar.update_ticks()
    fig.suptitle(title)
    return fig
