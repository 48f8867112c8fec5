"""The dynamics stage's figure: per seed, a layer × step heatmap of each layer's linear CKA to ORIG and its curves
(to ORIG, solid; to the final model, dashed; the null's mean, dotted), on one step axis with the run's evaluations
(its validation score at each evaluation step, grey lines and squares) and its convergence verdict in the title."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from layersim.reporting.plots import plt
from layersim.training.convergence import NOT_CONVERGED


def _edges(steps) -> np.ndarray:
    """Cell edges on the step axis: half-way between points, the ends as far out as their neighbours."""
    steps = np.asarray(steps, dtype=float)
    if len(steps) == 1:
        return np.array([steps[0] - 0.5, steps[0] + 0.5])
    middle = (steps[1:] + steps[:-1]) / 2
    return np.concatenate([[steps[0] - (middle[0] - steps[0])], middle, [steps[-1] + (steps[-1] - middle[-1])]])


def dynamics_figure(runs: Mapping[str, Mapping], pooling: str, metric: str, title: str):
    """One row per run: its heatmap (layer on y, step on x, CKA to ORIG) and its curves per layer. `runs`: name →
    ``label``, ``seed``, ``steps`` (ascending, 0 = ORIG, the last the final model), ``values`` (step → reference → measure →
    per-layer array), ``flag`` (why the run is flagged, or None) and ``evaluations`` ((step, score) pairs)."""
    fig, axes = plt.subplots(len(runs), 2, figsize=(11, 3.2 * len(runs)), squeeze=False, constrained_layout=True)
    image = None
    for run, (heat, curves) in zip(runs.values(), axes):
        steps = run["steps"]
        grid = np.array([run["values"][step]["ORIG"]["linear_cka"] for step in steps]).T  # layers × points
        layers = grid.shape[0]
        image = heat.pcolormesh(_edges(steps), np.arange(layers + 1) - 0.5, np.ma.masked_invalid(grid),
                                cmap=plt.get_cmap("viridis").with_extremes(bad="lightgrey"), vmin=0, vmax=1)
        heat.set_yticks(range(layers))
        heat.set_ylabel("layer (0 = embeddings)")
        note = f" — {NOT_CONVERGED}" if run.get("flag") else ""  # the reason: the report's facts, the checkpoint's info
        heat.set_title(f"{run['label']} (seed {run['seed']}){note}: CKA to ORIG", fontsize=9)
        colours = plt.get_cmap("plasma")(np.linspace(0, 0.85, layers))
        for layer in range(layers):
            for reference, style in (("ORIG", "-"), ("final", "--")):
                values = [run["values"][step][reference]["linear_cka"][layer] for step in steps]
                curves.plot(steps, values, style, color=colours[layer], marker="o", markersize=3,
                            label=f"layer {layer}" if reference == "ORIG" else None)
            nulls = [run["values"][step]["ORIG"]["null_mean"][layer] for step in steps]
            curves.plot(steps, nulls, ":", color=colours[layer], linewidth=0.8)
        curves.set_ylim(-0.02, 1.02)
        curves.set_ylabel("linear CKA")
        curves.set_title("solid: to ORIG; dashed: to the final model; dotted: chance", fontsize=9)
        evaluations = run.get("evaluations") or []
        for ax in (heat, curves):
            ax.set_xlabel("fine-tuning step")
            ax.set_xlim(_edges(steps)[0], _edges(steps)[-1])
            for step, _ in evaluations:
                ax.axvline(step, color="grey", linewidth=0.6, alpha=0.5)
        if evaluations:
            score = curves.twinx()
            score.plot(*zip(*evaluations), color="grey", marker="s", markersize=3, linewidth=1)
            score.set_ylabel(f"validation {metric}", color="grey")
        curves.legend(fontsize=7, loc="lower left", ncol=2)
    if image is not None:
        fig.colorbar(image, ax=axes[:, 0], shrink=0.8, label=f"linear CKA to ORIG ({pooling})")
    fig.suptitle(title)
    return fig
