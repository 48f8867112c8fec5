"""Phang et al.'s four layer × layer comparisons (§3, Figure 1) of an original and fine-tuned models.

- ORIG–ORIG: the pretrained encoder against itself (symmetric);
- FT–ORIG: fine-tuned layers (y) against pretrained layers (x);
- FT–FT: the fine-tuned encoder against itself (symmetric);
- FT[1]–FT[2]: two fine-tuning seeds against each other (needs two seeds).
FT is the first seed's model and FT[2] the second's, as in the paper's figures.

A layer that is the same for every example (the CLS token's embedding-layer output always is) has
no defined CKA: its row or column is NaN in the matrices, drawn blank, and null in metrics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from layersim.similarity import cka_matrix, is_constant


@dataclass(frozen=True)
class Comparison:
    key: str
    title: str
    matrix: np.ndarray  # [y_layer, x_layer]
    y_label: str
    x_label: str


def defined_cka_matrix(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray] | None = None) -> np.ndarray:
    """cka_matrix over the layers where CKA is defined, NaN in the rows/columns of constant layers."""
    x_ok = [i for i, x in enumerate(xs) if not is_constant(x)]
    y_ok = x_ok if ys is None else [j for j, y in enumerate(ys) if not is_constant(y)]
    out = np.full((len(xs), len(xs) if ys is None else len(ys)), np.nan)
    if x_ok and y_ok:
        sub = cka_matrix([xs[i] for i in x_ok], None if ys is None else [ys[j] for j in y_ok])
        out[np.ix_(x_ok, y_ok)] = sub
    return out


def phang_comparisons(orig: Sequence[np.ndarray], finetuned: Sequence[Sequence[np.ndarray]]) -> list[Comparison]:
    """The comparisons for per-layer arrays of the original model and of each fine-tuned seed."""
    ft = finetuned[0]
    comparisons = [
        Comparison("orig_orig", "ORIG–ORIG", defined_cka_matrix(orig), "ORIG layer", "ORIG layer"),
        Comparison("ft_orig", "FT–ORIG", defined_cka_matrix(ft, orig), "FT layer", "ORIG layer"),
        Comparison("ft_ft", "FT–FT", defined_cka_matrix(ft), "FT layer", "FT layer"),
    ]
    if len(finetuned) > 1:
        comparisons.append(Comparison("ft1_ft2", "FT[1]–FT[2]", defined_cka_matrix(ft, finetuned[1]),
                                      "FT[1] layer", "FT[2] layer"))
    return comparisons


def _number(value: float) -> float | None:
    return None if np.isnan(value) else round(float(value), 6)


def summarize(comparisons: Sequence[Comparison]) -> dict:
    """Headline numbers: the per-layer diagonal, its mean, the last layer's value, and for the
    symmetric comparisons the mean off-diagonal similarity (how blocky the matrix is). Means skip
    undefined entries; an undefined single value is null."""
    summary = {}
    for c in comparisons:
        diagonal = np.diag(c.matrix)
        entry = {"diagonal": {f"layer_{k:02d}": _number(v) for k, v in enumerate(diagonal)},
                 "diagonal_mean": _number(np.nanmean(diagonal)) if np.isfinite(diagonal).any() else None,
                 "last_layer": _number(diagonal[-1])}
        if c.key in ("orig_orig", "ft_ft"):
            off = c.matrix[~np.eye(len(c.matrix), dtype=bool)]
            entry["offdiagonal_mean"] = _number(np.nanmean(off)) if np.isfinite(off).any() else None
        summary[c.key] = entry
    return summary
