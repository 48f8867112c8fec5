"""The layer-pruning measures as figures and plot rows: the similarity stage's Block Influence per layer and
angular distance per (start layer, span length) (ShortGPT; Gromov et al. Figures 1–2), and the skip stage's
prediction figure (each span's measured score against what a similarity rule predicts)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import MaxNLocator

# Importing layersim.reporting.plots selects the headless backend before any figure.
from layersim.reporting.plots import _rounded, layer_tick_labels
from layersim.similarity.pruning import PruningMeasures

AXIS_LABELS = {"angular_distance": "angular distance d(layer i−1, layer j)  [Gromov et al.]",
               "block_influence": "summed Block Influence of layers i..j  [ShortGPT]"}


Span = tuple[int, int]


def prediction_scatter(scores: Mapping[Span, float], predicted: Mapping[str, Mapping[Span, float | None]],
                       prediction: Mapping[str, Any], full: float, metric: str, title: str):
    """One panel per predictor: every skipped span (i, j) at its predicted value (x; lower = predicted more
    droppable) and measured score (y), coloured by its length j − i + 1; the full model's score as a red line.
    Each panel's title gives the headline, the within-length rho, beside the range random per-layer scores get,
    and the all-spans rho beside what span length alone gets (`prediction`: the skip stage's, from
    :func:`layersim.experiments.truncation.skip_predictions`)."""
    spans = sorted(scores)
    lengths = np.array([j - i + 1 for i, j in spans])
    fig, axes = plt.subplots(1, len(predicted), figsize=(4.6 * len(predicted), 4.3), squeeze=False,
                             constrained_layout=True)
    points = None
    for ax, (name, values) in zip(axes.flat, predicted.items()):
        x = np.array([np.nan if values[s] is None else values[s] for s in spans], dtype=float)
        points = ax.scatter(x, [scores[s] for s in spans], c=lengths, cmap="viridis", s=22,
                            vmin=1, vmax=max(int(lengths.max()), 2))
        ax.axhline(full, color="red", lw=1.2)
        ax.set_title(rank_caption(prediction, name), fontsize=8)
        ax.set_xlabel(AXIS_LABELS.get(name, name), fontsize=8)
        ax.set_ylabel(f"{metric} with span skipped")
    bar = fig.colorbar(points, ax=axes.ravel().tolist(), shrink=0.8, label="span length")
    bar.locator = MaxNLocator(integer=True)  # lengths are whole layers
    bar.update_ticks()
    fig.suptitle(title)
    return fig


def rank_caption(prediction: Mapping[str, Any], name: str) -> str:
    """Predictor `name`'s within-length rho with the random-layer 95 % range; the depth-alone (position-only) rho
    and the rule's rho beyond depth (partial on the span's first layer) with its random-layer range; and its
    all-spans rho with the length-only rho ("undefined" where a value is None; the first and last lines only, for
    details written before the position baseline)."""
    baselines = prediction.get("baselines") or {}
    chance = baselines.get("random_layer") or {}
    own = prediction.get(name) or {}

    def fmt(value) -> str:
        return "undefined" if value is None else f"{value:.2f}"

    lines = [f"within-length ρ = {fmt(own.get('within_length'))} (random layers 95 %: "
             f"{fmt(chance.get('within_length_low'))} to {fmt(chance.get('within_length_high'))})"]
    if "position_only" in baselines and "beyond_position" in own:
        lines.append(f"depth alone {fmt(baselines['position_only'].get('within_length'))}; beyond depth ρ = "
                     f"{fmt(own.get('beyond_position'))} (random {fmt(chance.get('beyond_position_low'))} to "
                     f"{fmt(chance.get('beyond_position_high'))})")
    lines.append(f"all spans ρ = {fmt(own.get('all_spans'))} (length alone: "
                 f"{fmt((baselines.get('length_only') or {}).get('all_spans'))})")
    return "\n".join(lines)


def angular_grid(measures: PruningMeasures) -> np.ndarray:
    """Gromov et al.'s angular distance d(l, n) as an (n, l) grid: row n − 1 for span length n = 1 … L, column l
    for start layer l = 0 … L − 1 (the span of layers l + 1 … l + n); NaN where l + n > L."""
    size = measures.num_layers
    grid = np.full((size, size), np.nan)
    for n in range(1, size + 1):
        grid[n - 1, :size - n + 1] = measures.angular_distance(n)
    return grid


def pruning_rows(measures: Mapping[str, PruningMeasures], rows: Mapping[str, str] | None = None,
                 **fields) -> tuple[list[dict], list[dict]]:
    """Plot rows of each model's (label → measures) Block Influence, one per layer k = 1 … L, and angular distance,
    one per start layer l and span length n (``layer`` = l, the span's input); None where undefined. `fields` are
    added to every row; ``rows`` (measure → the rows it averages over, in words) to that measure's rows."""
    rows = rows or {}
    influence = [{**fields, **_described(rows, "block_influence"), "series": label, "model": label, "layer": k,
                  "block_influence": _rounded(value)}
                 for label, m in measures.items() for k, value in enumerate(m.block_influence(), start=1)]
    angular = [{**fields, **_described(rows, "angular_distance"), "series": f"{label} n={n}", "model": label,
                "layer": l, "length": n,
                "angular_distance": _rounded(grid[n - 1, l])}
               for label, m in measures.items() for grid in [angular_grid(m)]
               for n in range(1, m.num_layers + 1) for l in range(m.num_layers - n + 1)]
    return influence, angular


def _described(rows: Mapping[str, str], name: str) -> dict:
    return {"rows": rows[name]} if name in rows else {}


def pruning_profile(measures: Mapping[str, PruningMeasures], title: str):
    """Left, ShortGPT's Block Influence per layer, a curve per model (label → measures); then, per model, Gromov
    et al.'s angular distance between layer l (x) and layer l + n (y: span length n) as a heatmap, on one colour
    scale (their Figures 1–2: a dark cell is a span whose output points where its input did, predicted droppable)."""
    fig, axes = plt.subplots(1, 1 + len(measures), figsize=(4.4 + 3.4 * len(measures), 3.8), squeeze=False,
                             constrained_layout=True)
    curve_ax, heat_axes = axes[0, 0], axes[0, 1:]
    grids = {label: angular_grid(m) for label, m in measures.items()}
    finite = np.concatenate([g[np.isfinite(g)] for g in grids.values()])
    top = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
    cmap = plt.get_cmap("viridis").with_extremes(bad="white")
    image = None
    for (label, m), ax in zip(measures.items(), heat_axes):
        curve_ax.plot(np.arange(1, m.num_layers + 1), m.block_influence(), marker="o", ms=3, label=label)
        image = ax.imshow(grids[label], origin="lower", cmap=cmap, vmin=0.0, vmax=top, aspect="auto",
                          extent=(-0.5, m.num_layers - 0.5, 0.5, m.num_layers + 0.5))
        ax.set_title(label, fontsize=9)
        ax.set_xticks(range(m.num_layers), layer_tick_labels(m.num_layers), fontsize=7)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("start layer l (the span's input)", fontsize=8)
        ax.set_ylabel("span length n", fontsize=8)
    curve_ax.set_xlabel("layer k", fontsize=8)
    curve_ax.set_ylabel("Block Influence 1 − mean cos(layer k−1, layer k)", fontsize=8)
    curve_ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    curve_ax.legend(fontsize=7)
    fig.colorbar(image, ax=heat_axes.tolist(), shrink=0.85, label="angular distance arccos(cos)/π")
    fig.suptitle(title)
    return fig
