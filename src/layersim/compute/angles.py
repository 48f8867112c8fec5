"""Angles between every pair of layers, summed over row batches: the arithmetic of the layer-pruning measures
(:mod:`layersim.similarity.pruning`), here so that extraction can sum them without the similarity package.

For rows ``a`` (layer ``k``) and ``b`` (layer ``m``) of the same example: the angle ``arccos(cos(a, b))/π`` and
``1 − cos(a, b)``. Angles come from Kahan's ``2·atan2(|â − b̂|, |â + b̂|)`` on unit rows, exact at 0 and π where
``arccos`` of a rounded cosine is not (``arccos(1 − 1e-16)`` is 1.5e-8, not 0), and ``1 − cos = |â − b̂|² / 2``.
A row that is all zeros in either layer has no direction and is left out of that pair. Everything is
accumulated in float64 over row chunks, so a table larger than memory can be streamed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from layersim.errors import LayersimError

CHUNK_ROWS = 2048  # rows normalised at a time: (L + 1) float64 copies of this many rows stay small


class LayerAngleSums:
    """Sums over row batches of the angle and 1 − cos between every pair of layers: memory in the number of
    layers, not of rows."""

    def __init__(self, num_layers: int):
        if isinstance(num_layers, bool) or not isinstance(num_layers, (int, np.integer)) or num_layers < 1:
            raise LayersimError(f"num_layers must be an integer of at least 1 (layers after the embeddings), "
                                f"got {num_layers!r}.")
        size = int(num_layers) + 1
        self._angle = np.zeros((size, size))
        self._cosine = np.zeros((size, size))
        self._rows = np.zeros((size, size), dtype=np.int64)
        self._nonzero = np.zeros(size, dtype=np.int64)
        self._hidden: int | None = None

    def update(self, layers: Sequence[np.ndarray]) -> None:
        """Add a batch of rows: ``layers[k]`` holds those rows of ``layer_k``, ``k = 0 … num_layers``."""
        arrays = _checked(layers, self._angle.shape[0], self._hidden)
        self._hidden = arrays[0].shape[1]
        for start in range(0, arrays[0].shape[0], CHUNK_ROWS):
            units, nonzero = zip(*(_unit_rows(a[start:start + CHUNK_ROWS]) for a in arrays))
            self._nonzero += [int(np.count_nonzero(mask)) for mask in nonzero]
            for a in range(len(units)):
                for b in range(a + 1, len(units)):
                    both = nonzero[a] & nonzero[b]  # a zero row has no direction: weight 0 in this pair
                    diff_sq = _row_sq_norms(units[a] - units[b])  # |â − b̂|² = 2 − 2cos, no cancellation
                    plus = np.sqrt(_row_sq_norms(units[a] + units[b]))
                    self._angle[a, b] += float(np.sum(2.0 * np.arctan2(np.sqrt(diff_sq), plus), where=both)) / np.pi
                    self._cosine[a, b] += float(np.sum(diff_sq, where=both)) / 2.0
                    self._rows[a, b] += int(np.count_nonzero(both))

    @property
    def seen(self) -> bool:
        return self._hidden is not None

    def means(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Symmetric (L + 1) × (L + 1) row means of arccos(cos)/π and of 1 − cos (0 on the diagonal, NaN for a
        pair with no rows), and the rows each pair had (the diagonal: each layer's nonzero rows)."""
        with np.errstate(invalid="ignore", divide="ignore"):  # pairs with no rows: 0/0 = NaN, as documented
            angle, cosine = self._angle / self._rows, self._cosine / self._rows
        rows = np.triu(self._rows, 1) + np.triu(self._rows, 1).T + np.diag(self._nonzero)
        return _symmetric(angle), _symmetric(cosine), rows


def _checked(layers: Sequence[np.ndarray], expected: int, hidden: int | None) -> list[np.ndarray]:
    if isinstance(layers, np.ndarray) and layers.ndim == 2:
        raise LayersimError(f"layers must be a sequence of (rows x hidden) arrays, got a single array of shape "
                            f"{layers.shape}; wrap one layer in a list.")
    arrays = list(layers)
    if len(arrays) != expected:
        raise LayersimError(f"layers holds {len(arrays)} arrays but the accumulator was made for {expected} "
                            f"(layer_0 … layer_{expected - 1}); pass the embeddings and every layer's output.")
    shape = None
    for k, a in enumerate(arrays):
        a = np.asarray(a)
        if a.dtype.kind not in "biuf" or a.ndim != 2:
            raise LayersimError(f"layers[{k}] must be a 2-D (rows x hidden) array of real numbers, got "
                                f"shape {a.shape} and dtype {a.dtype}.")
        if shape is None:
            shape = a.shape
        if a.shape != shape or (hidden is not None and a.shape[1] != hidden):
            raise LayersimError(f"layers[{k}] has shape {a.shape} but layers[0] has {shape}"
                                f"{'' if hidden is None else f' and earlier batches {hidden} columns'}; a cosine "
                                "needs the same rows and width in every layer.")
        if not np.isfinite(a).all():
            raise LayersimError(f"layers[{k}] contains NaN or inf; angles need finite activations.")
        arrays[k] = a
    if shape[0] == 0 or shape[1] == 0:
        raise LayersimError(f"layers have shape {shape}; pass at least one row and one column.")
    return arrays


def _unit_rows(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows scaled to unit length in float64, and which rows are not all zero. Each row is first divided by
    its largest |value|, so squaring never underflows or overflows, whatever the scale."""
    a = np.asarray(a, dtype=np.float64)
    peak = np.max(np.abs(a), axis=1)
    nonzero = peak > 0
    scaled = a[nonzero] / peak[nonzero, None]
    units = np.zeros_like(a)
    units[nonzero] = scaled / np.linalg.norm(scaled, axis=1)[:, None]
    return units, nonzero


def _row_sq_norms(a: np.ndarray) -> np.ndarray:
    return np.einsum("ij,ij->i", a, a)


def _symmetric(upper: np.ndarray) -> np.ndarray:
    out = np.triu(upper, 1)
    out = out + out.T  # NaN pairs stay NaN on both sides: triu zeroes only the lower triangle
    np.fill_diagonal(out, 0.0)
    return out
