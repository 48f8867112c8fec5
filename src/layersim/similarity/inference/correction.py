"""Multiple-comparison corrections over the cells of one heatmap, and what a sampled null lets them declare.

A heatmap tests every cell at once, so its hatching is corrected over its cells: Benjamini–Hochberg
(``fdr_bh``, the false discovery rate), Holm (``holm``, the family-wise error rate) or ``none``. Only
finite p-values are tests: a NaN cell (an undefined layer, a cell without a null) is left out, and out of
the count m. A cell is above chance when its adjusted p-value is *below* the significance level α, the
rule raw p-values follow elsewhere (p = α is at chance), so ``none`` is the uncorrected reading.

A sampled null (permutations, or rotations) of B draws gives p-values no smaller than 1/(B + 1). Holm's
first step compares the smallest p with α/m, so it declares nothing unless m/(B + 1) < α, however strong
the signal. Benjamini–Hochberg declares the k cells at that floor together when m/(k·(B + 1)) < α: every
cell at the floor needs only 1/(B + 1) < α (as uncorrected), a lone cell among chance ones m/(B + 1) < α
(as Holm). :func:`permutations_needed` gives the fewest draws for each case.

Which cells make a family. BH is adaptive: many trivially non-null cells among the tests raise its step-up
threshold towards α for the cells in doubt (150 cells at p = 1e-9 beside one at 0.04 and 18 at 0.5 give the
0.04 cell q = 0.045; among the 19 others alone, q = 0.50). So a heatmap's family holds only its *tested* cells
(`tested`): a layer compared with itself (the diagonal of ORIG–ORIG and FT–FT, :func:`self_comparison_cells`)
and, in a stacked matrix, the layers of one model among themselves (:func:`between_model_cells`) are no
question anyone asks; they keep their p-values and get no adjusted one (NaN: not tested). For a symmetric
measure cells [i, j] and [j, i] of a self-comparison are one test, counted once (the upper triangle, with the
larger of the two p-values, which a sampled null draws separately; the lower cell given its mirror's adjusted
value), which leaves BH nearly unchanged but halves Holm's m. The claims a
stage states in its metrics are a second family, corrected together across measures and poolings
(layersim.reporting.headlines).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from layersim.errors import LayersimError, unknown_name

CORRECTIONS = ("fdr_bh", "holm", "none")
LABELS = {"fdr_bh": "Benjamini–Hochberg FDR", "holm": "Holm", "none": "uncorrected"}


def _check(method: str) -> None:
    if method not in CORRECTIONS:
        raise unknown_name("correction", method, CORRECTIONS)


def adjusted_p_values(p_values: np.ndarray, method: str, tested: np.ndarray | None = None,
                      symmetric: bool = False) -> np.ndarray:
    """The adjusted p-values of the finite entries of `p_values` (any shape) as one family, NaN elsewhere:
    BH's q-values (``p_(i)·m/i``, made monotone from the largest down), Holm's step-down adjusted p-values
    (``p_(i)·(m − i + 1)``, made monotone from the smallest up), or the p-values themselves; at most 1.
    `tested`: boolean mask of the cells in the family (default all), NaN outside it; `symmetric`: a square
    matrix whose [i, j] and [j, i] are one test, counted once (see the module docstring)."""
    _check(method)
    p = np.asarray(p_values, dtype=float)
    family = np.ones(p.shape, dtype=bool) if tested is None else np.asarray(tested, dtype=bool)
    if family.shape != p.shape:
        raise LayersimError(f"tested has shape {family.shape}, but the p-values have shape {p.shape}.")
    mirrored = np.zeros(p.shape, dtype=bool)
    if symmetric:
        if p.ndim != 2 or p.shape[0] != p.shape[1]:
            raise LayersimError(f"symmetric needs a square matrix of p-values, got shape {p.shape}.")
        mirrored = np.tril(family & family.T, k=-1)  # the lower cell of a pair tested both ways
        family = family & ~mirrored
        # The pair's p-value: the larger of its cells' (equal for an exact null; two draws of a sampled one).
        p = p.copy()
        p[mirrored.T] = np.fmax(p[mirrored.T], p.T[mirrored.T])
    out = np.full(p.shape, np.nan)
    finite = np.isfinite(p) & family
    values = p[finite]
    m = values.size
    if m == 0 or method == "none":
        out[finite] = values
    else:
        order = np.argsort(values, kind="stable")
        ranked = values[order]
        rank = np.arange(1, m + 1)
        if method == "fdr_bh":
            ranked = np.minimum.accumulate((ranked * m / rank)[::-1])[::-1]
        else:
            ranked = np.maximum.accumulate(ranked * (m - rank + 1))
        adjusted = np.empty(m)
        adjusted[order] = np.minimum(ranked, 1.0)
        out[finite] = adjusted
    if symmetric:
        out[mirrored] = out.T[mirrored]
    return out


def self_comparison_cells(size: int) -> np.ndarray:
    """The tested cells of a model's layers against themselves (size × size): all but the diagonal."""
    return ~np.eye(size, dtype=bool)


def between_model_cells(sizes: Sequence[int]) -> np.ndarray:
    """The tested cells of a stacked matrix of models with `sizes` layers each: those comparing layers of two
    different models (the within-model blocks, a model's layers among themselves, are not tested)."""
    owner = np.repeat(np.arange(len(sizes)), list(sizes))
    return owner[:, None] != owner[None, :]


def family_size(tested: np.ndarray, symmetric: bool = False) -> int:
    """How many tests a family of the `tested` cells holds (a symmetric pair counted once)."""
    tested = np.asarray(tested, dtype=bool)
    return int(tested.sum() - (np.tril(tested & tested.T, k=-1).sum() if symmetric else 0))


def at_chance(p_values: np.ndarray, method: str, significance: float, tested: np.ndarray | None = None,
              symmetric: bool = False) -> np.ndarray:
    """Boolean mask of the cells not above chance (the hatched ones): adjusted p-value ≥ `significance`;
    False where the p-value is NaN or the cell is not tested (`tested`, `symmetric`: as
    :func:`adjusted_p_values`)."""
    adjusted = adjusted_p_values(p_values, method, tested, symmetric)
    with np.errstate(invalid="ignore"):
        return np.isfinite(adjusted) & (adjusted >= significance)


def smallest_p(permutations: int) -> float:
    """The smallest p-value a null of `permutations` sampled draws gives: 1/(permutations + 1)."""
    return 1.0 / (permutations + 1)


def declares(method: str, significance: float, permutations: int, cells: int, at_floor: int = 1) -> bool:
    """Whether `method` declares any cell above chance among `cells` tests when `at_floor` of them have
    the smallest p-value of `permutations` draws and the others p = 1 (computed by the correction itself)."""
    p = np.ones(cells)
    p[:at_floor] = smallest_p(permutations)
    return bool((adjusted_p_values(p, method) < significance).any())


def permutations_needed(method: str, significance: float, cells: int, at_floor: int = 1) -> int:
    """The fewest draws with which `method` can declare a cell above chance among `cells` tests when
    `at_floor` of them reach the smallest p-value (see the module docstring)."""
    _check(method)
    if not 1 <= at_floor <= cells:
        raise LayersimError(f"at_floor = {at_floor} must be between 1 and cells = {cells}.")
    factor = {"none": 1.0, "holm": float(cells), "fdr_bh": cells / at_floor}[method]
    draws = max(1, math.floor(factor / significance) - 2)  # the exact bound, less float slack
    while not declares(method, significance, draws, cells, at_floor):
        draws += 1
    return draws


def cells_needed(method: str, significance: float, permutations: int, cells: int) -> int | None:
    """The fewest cells at the smallest p-value with which `method` declares any (1: a lone cell can be
    declared), or None when none can be with `permutations` draws."""
    if not declares(method, significance, permutations, cells, cells):
        return None
    low, high = 1, cells  # declaring is monotone in the cells at the floor: bisect
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if declares(method, significance, permutations, cells, middle) else (middle + 1, high)
    return low
