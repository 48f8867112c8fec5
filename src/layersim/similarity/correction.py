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
"""

from __future__ import annotations

import math

import numpy as np

from layersim.errors import LayersimError, unknown_name

CORRECTIONS = ("fdr_bh", "holm", "none")
LABELS = {"fdr_bh": "Benjamini–Hochberg FDR", "holm": "Holm", "none": "uncorrected"}


def _check(method: str) -> None:
    if method not in CORRECTIONS:
        raise unknown_name("correction", method, CORRECTIONS)


def adjusted_p_values(p_values: np.ndarray, method: str) -> np.ndarray:
    """The adjusted p-values of the finite entries of `p_values` (any shape) as one family, NaN elsewhere:
    BH's q-values (``p_(i)·m/i``, made monotone from the largest down), Holm's step-down adjusted p-values
    (``p_(i)·(m − i + 1)``, made monotone from the smallest up), or the p-values themselves; at most 1."""
    _check(method)
    p = np.asarray(p_values, dtype=float)
    out = np.full(p.shape, np.nan)
    finite = np.isfinite(p)
    values = p[finite]
    m = values.size
    if m == 0 or method == "none":
        out[finite] = values
        return out
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
    return out


def at_chance(p_values: np.ndarray, method: str, significance: float) -> np.ndarray:
    """Boolean mask of the cells not above chance (the hatched ones): adjusted p-value ≥ `significance`;
    False where the p-value is NaN (no test)."""
    adjusted = adjusted_p_values(p_values, method)
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
