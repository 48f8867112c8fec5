"""Phang et al.'s four layer × layer comparisons (§3, Figure 1) of an original and fine-tuned models.

- ORIG–ORIG: the pretrained encoder against itself (symmetric);
- FT–ORIG: fine-tuned layers (y) against pretrained layers (x);
- FT–FT: the fine-tuned encoder against itself (symmetric);
- FT[1]–FT[2]: two fine-tuning seeds against each other (needs two seeds).
FT is the first seed's model and FT[2] the second's, as in the paper's figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from layersim.similarity import cka_matrix


@dataclass(frozen=True)
class Comparison:
    key: str
    title: str
    matrix: np.ndarray  # [y_layer, x_layer]
    y_label: str
    x_label: str


def phang_comparisons(orig: Sequence[np.ndarray], finetuned: Sequence[Sequence[np.ndarray]]) -> list[Comparison]:
    """The comparisons for per-layer arrays of the original model and of each fine-tuned seed."""
    ft = finetuned[0]
    comparisons = [
        Comparison("orig_orig", "ORIG–ORIG", cka_matrix(orig), "ORIG layer", "ORIG layer"),
        Comparison("ft_orig", "FT–ORIG", cka_matrix(ft, orig), "FT layer", "ORIG layer"),
        Comparison("ft_ft", "FT–FT", cka_matrix(ft), "FT layer", "FT layer"),
    ]
    if len(finetuned) > 1:
        comparisons.append(Comparison("ft1_ft2", "FT[1]–FT[2]", cka_matrix(ft, finetuned[1]),
                                      "FT[1] layer", "FT[2] layer"))
    return comparisons


def summarize(comparisons: Sequence[Comparison]) -> dict:
    """Headline numbers: the per-layer diagonal, its mean, the last layer's value, and for the
    symmetric comparisons the mean off-diagonal similarity (how blocky the matrix is)."""
    summary = {}
    for c in comparisons:
        diagonal = np.diag(c.matrix)
        entry = {"diagonal": {f"layer_{k:02d}": round(float(v), 6) for k, v in enumerate(diagonal)},
                 "diagonal_mean": round(float(diagonal.mean()), 6),
                 "last_layer": round(float(diagonal[-1]), 6)}
        if c.key in ("orig_orig", "ft_ft"):
            off = c.matrix[~np.eye(len(c.matrix), dtype=bool)]
            entry["offdiagonal_mean"] = round(float(off.mean()), 6)
        summary[c.key] = entry
    return summary
