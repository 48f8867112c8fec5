"""Blocks of layers in a layer × layer similarity matrix: Phang et al.'s block-diagonal structure, stated.

A segmentation splits the layers 0 … L−1 into contiguous blocks. :func:`find_blocks` returns the one
that maximises

    Σ over blocks Σ over cells (i, j), i ≠ j, both in the block, of (S_ij − m)

where ``m`` is the mean off-diagonal similarity of the matrix: a pair of layers counts for a block
when it is more similar than the matrix's typical pair (modularity against a uniform null). It is
found exactly by dynamic programming over split points (O(L³) for L layers, nothing to tune; the
diagonal, always 1 for the self-similar measures, never counts). The number of blocks follows from
the matrix; a segmentation whose contrast (mean within-block minus mean between-block similarity,
off-diagonal cells only) is below ``min_contrast`` is reported as one block.

Noise: if every within-block cell of a noise-free matrix is more than ``2η`` above its mean off-diagonal
similarity and every between-block cell more than ``2η`` below it, symmetric noise of at most ``η`` per
cell leaves the found segmentation unchanged: noise moves each cell and the mean by at most ``η``, so
every within cell still counts for its block and every between cell against merging, and that
segmentation stays the unique optimum (as long as its contrast stays above ``min_contrast``).
``tests/test_blocks.py`` checks this on random planted matrices.

Pure NumPy; symmetric matrices (a cross-model matrix such as FT[1]–FT[2] is symmetrised first).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np

from layersim.errors import LayersimError

# Segmentations whose within − between contrast is below this are one block: with similarities on a
# 0–1 scale, smaller differences are within the bootstrap spread of the quickstart's matrices.
MIN_CONTRAST = 0.05


@dataclass(frozen=True)
class Blocks:
    """A segmentation: ``starts`` (the first layer of each block, 0-based layer indices of the matrix,
    increasing, starting at 0), the number of layers, and the mean within- and between-block
    similarity (off-diagonal cells; None where there are no such cells)."""

    starts: tuple[int, ...]
    num_layers: int
    within: float | None
    between: float | None

    @property
    def contrast(self) -> float | None:
        """Mean within-block minus mean between-block similarity (None for one block or all singletons)."""
        return None if self.within is None or self.between is None else self.within - self.between

    @property
    def spans(self) -> list[tuple[int, int]]:
        """Each block as (first layer, last layer), inclusive."""
        ends = [*self.starts[1:], self.num_layers]
        return [(start, end - 1) for start, end in zip(self.starts, ends)]

    @property
    def labels(self) -> np.ndarray:
        """The block index of every layer; −1 for layers before the first block (left out: e.g. a layer
        whose representation is the same for every example has no similarity to segment)."""
        labels = np.full(self.num_layers, -1)
        for index, (first, last) in enumerate(self.spans):
            labels[first:last + 1] = index
        return labels


def find_blocks(matrix: np.ndarray, min_contrast: float = MIN_CONTRAST) -> Blocks:
    """The contiguous blocks of layers that best explain `matrix` (see the module docstring)."""
    s = _checked(matrix)
    n = len(s)
    off = ~np.eye(n, dtype=bool)
    if n < 3:
        return _described(s, (0,))
    centred = np.where(off, s - s[off].mean(), 0.0)
    # gain[a, b]: the summed centred cells of a block from layer a to layer b − 1.
    prefix = np.zeros((n + 1, n + 1))
    prefix[1:, 1:] = centred.cumsum(0).cumsum(1)
    best, cut = np.full(n + 1, -np.inf), np.zeros(n + 1, dtype=int)
    best[0] = 0.0
    for end in range(1, n + 1):
        for start in range(end):
            gain = prefix[end, end] - prefix[start, end] - prefix[end, start] + prefix[start, start]
            # ">" keeps the earliest start among equal scores: fewer, longer blocks on ties.
            if best[start] + gain > best[end] + 1e-12:
                best[end], cut[end] = best[start] + gain, start
    starts, end = [], n
    while end > 0:
        starts.append(int(cut[end]))
        end = cut[end]
    found = _described(s, tuple(sorted(starts)))
    if len(found.starts) > 1 and (found.contrast is None or found.contrast < min_contrast):
        return _described(s, (0,))
    return found


def agreement(a: Blocks, b: Blocks) -> float:
    """Rand index of two segmentations of the same layers: the share of layer pairs that both put in one
    block or both in different blocks (1: identical), over the layers both segment."""
    if a.num_layers != b.num_layers:
        raise LayersimError(f"segmentations of {a.num_layers} and {b.num_layers} layers cannot be compared; "
                            "compare segmentations of the same matrix size.")
    la, lb = a.labels, b.labels
    pairs = list(combinations(np.flatnonzero((la >= 0) & (lb >= 0)), 2))
    if not pairs:
        return 1.0
    return float(np.mean([(la[i] == la[j]) == (lb[i] == lb[j]) for i, j in pairs]))


def stability(reference: Blocks, others: Sequence[Blocks]) -> float:
    """Mean agreement of `reference` with each of `others` (e.g. other seeds or bootstrap resamples)."""
    if not others:
        raise LayersimError("stability needs at least one other segmentation to compare with.")
    return float(np.mean([agreement(reference, other) for other in others]))


def _described(s: np.ndarray, starts: tuple[int, ...]) -> Blocks:
    n = len(s)
    labels = np.repeat(np.arange(len(starts)), np.diff([*starts, n]))
    same = labels[:, None] == labels[None, :]
    off = ~np.eye(n, dtype=bool)
    within, between = s[same & off], s[~same]
    return Blocks(starts, n, float(within.mean()) if within.size else None,
                  float(between.mean()) if between.size else None)


def _checked(matrix: np.ndarray) -> np.ndarray:
    s = np.asarray(matrix, dtype=float)
    if s.ndim != 2 or s.shape[0] != s.shape[1] or not s.size:
        raise LayersimError(f"blocks need a square layer × layer matrix, got shape {s.shape}.")
    if not np.isfinite(s).all():
        raise LayersimError("the similarity matrix has NaN or infinite cells; blocks need every cell.")
    return (s + s.T) / 2
