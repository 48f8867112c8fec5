"""Means over runs that tell the converged ones apart: a run the convergence check flagged
(layersim.training.convergence) stays in every all-runs mean, and this gives the mean without it beside.
Here, at the bottom of the library, because similarity, truncation, freeze and align all average over runs and
freeze must not import the similarity package to do so (its stage would rerun whenever a measure changes)."""

from __future__ import annotations

from collections.abc import Collection, Mapping

import numpy as np


def converged_mean(values: Mapping, flagged: Collection = ()) -> np.ndarray:
    """The mean over the runs (key → value or per-layer values) not in `flagged`, NaNs left out per entry:
    the converged-runs-only mean beside the all-runs one. NaN where no unflagged run has a value."""
    kept = np.array([np.asarray(v, dtype=float) for key, v in values.items() if key not in flagged], dtype=float)
    if kept.size == 0:
        shape = np.shape(next(iter(values.values()))) if values else ()
        return np.full(shape, np.nan)
    finite = np.isfinite(kept)
    count = finite.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, np.where(finite, kept, 0.0).sum(axis=0) / count, np.nan)
