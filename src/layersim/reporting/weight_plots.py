"""The weights stage's figure: intruder dimensions (Shuttleworth et al. 2025) per layer and weight matrix, one
panel per fine-tuned run, on one colour scale from 0 to k."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from layersim.reporting.plots import plt

SHORT = {"attention_output": "attn out"}  # the roles' names on the x axis


def intruder_grids(rows: Iterable[Mapping], roles: Sequence[str]) -> dict[str, np.ndarray]:
    """Run label → (layers × roles) matrix of intruder counts from the stage's plot rows (``run``, ``layer`` from
    1, ``matrix``, ``intruders``); a cell with no row is NaN."""
    rows = list(rows)
    layers = max((row["layer"] for row in rows), default=0)
    grids: dict[str, np.ndarray] = {}
    for row in rows:
        grid = grids.setdefault(row["run"], np.full((layers, len(roles)), np.nan))
        grid[row["layer"] - 1, roles.index(row["matrix"])] = row["intruders"]
    return grids


def intruder_heatmaps(grids: Mapping[str, np.ndarray], roles: Sequence[str], top_k: int, title: str, *,
                      ncols: int = 2):
    """One heatmap per run: transformer layer (y, bottom = layer 1) × matrix role (x), each cell's intruder count
    written in it; the colour scale runs from 0 to `top_k` (every top singular vector an intruder)."""
    ncols = max(1, min(ncols, len(grids)))
    nrows = max(1, -(-len(grids) // ncols))
    height = max(2.4, 0.45 * max((g.shape[0] for g in grids.values()), default=1) + 1.6)
    width = (0.65 * len(roles) + 1.0) * ncols + 1.0
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, height * nrows), squeeze=False, constrained_layout=True)
    cmap = plt.get_cmap("viridis").with_extremes(bad="lightgrey")
    image = None
    for ax, (run, grid) in zip(axes.flat, grids.items()):
        image = ax.imshow(np.ma.masked_invalid(grid), origin="lower", cmap=cmap, vmin=0, vmax=top_k, aspect="auto")
        for (y, x), value in np.ndenumerate(grid):
            if np.isfinite(value):
                ax.text(x, y, str(int(value)), ha="center", va="center", fontsize=7,
                        color="black" if value > top_k / 2 else "white")
        ax.set_title(run)
        ax.set_xticks(range(len(roles)))
        ax.set_xticklabels([SHORT.get(role, role) for role in roles], rotation=45, ha="right", fontsize=7)
        ax.set_yticks(range(grid.shape[0]))
        ax.set_yticklabels([str(k + 1) for k in range(grid.shape[0])], fontsize=7)
        ax.set_ylabel("transformer layer")
    for ax in list(axes.flat)[len(grids):]:
        ax.axis("off")
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.8, label=f"intruder dimensions (of the top {top_k})")
    fig.suptitle(title)
    return fig
