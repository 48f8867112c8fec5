"""The align stage's figure (Ren et al. Figure 2): alignment error per layer, one line per map."""

from __future__ import annotations

import numpy as np

from layersim.reporting.plots import layer_tick_labels, plt


def alignment_error_curves(errors: dict[str, dict[str, list[float] | tuple[list[float], list[float]]]], title: str,
                           ylabel: str = "held-out relative error"):
    """Alignment error (y) per layer (x), one line per method, one panel per model pair or kind of pair
    (Ren et al. Figure 2); a (mean, sd) value draws the mean with a ± sd band over pairs."""
    ncols = min(len(errors), 3)
    nrows = -(-len(errors) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.8 * ncols, 3.8 * nrows), squeeze=False, sharey=True,
                             constrained_layout=True)
    for ax in axes.flat[len(errors):]:
        ax.set_visible(False)
    # As Ren's Table 4 is echoed: pwcca is layersim's rule; least squares is CCA's correlation-scaled map (ω = ρ).
    legend = {"linear": "linear (= CCA with ω = ρ)", "pwcca": "pwcca (layersim's map, not Ren's)"}
    for ax, (pair, per_method) in zip(axes.flat, errors.items()):
        # Distinct line styles and markers keep coinciding methods visible (pwcca coincides with cca when its weights are equal).
        for n, (method, values) in enumerate(per_method.items()):
            values, sd = values if isinstance(values, tuple) else (values, None)
            line, = ax.plot(range(len(values)), values, marker="os^vDx"[n % 6], ms=4, ls=("-", "--", ":", "-.")[n % 4],
                            label=legend.get(method, method))
            if sd is not None and any(sd):
                low, high = np.asarray(values) - np.asarray(sd), np.asarray(values) + np.asarray(sd)
                ax.fill_between(range(len(values)), low, high, color=line.get_color(), alpha=0.15, lw=0)
        # Relative error 1 is what predicting every row as Y's mean gives: a map above it learnt nothing.
        ax.axhline(1.0, color="grey", ls=":", lw=1.0, label="chance (Y's mean)" if ax is axes.flat[0] else None)
        num = max(len(v[0] if isinstance(v, tuple) else v) for v in per_method.values())
        ax.set_xticks(range(num))
        ax.set_xticklabels(layer_tick_labels(num))
        ax.set_xlabel("layer")
        ax.set_title(pair)
    for row in axes:
        row[0].set_ylabel(ylabel)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    axes.flat[len(errors) - 1].legend(handles, labels, fontsize=8, loc="best", framealpha=0.9)
    fig.suptitle(title)
    return fig
