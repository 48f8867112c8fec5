"""k-NN Jaccard: how much two layers agree on each example's nearest neighbours.

Klabunde, Schumacher, Strohmaier & Lemmerich 2023 ("Similarity of neural network models: a survey of functional
and representational measures", §"neighbourhood-based measures"; Schumacher et al. 2021, Hryniowski & Wong
2020): with ``N_k(x_a)`` the ``k`` nearest other examples of example ``a`` in layer ``x``,

    knn_jaccard(x, y) = mean over a of |N_k(x_a) ∩ N_k(y_a)| / |N_k(x_a) ∪ N_k(y_a)|,

in [0, 1], 1 when the two layers rank every example's neighbours alike (a layer against itself; also any
rotation, isotropic scaling or translation of a layer). ``metric``: ``"cosine"`` (default: the angle between
rows, blind to each row's norm) or ``"euclidean"``. Rows are centred on the layer's mean first, so the common
direction that transformer states share (their anisotropy) does not make every cosine near 1; Euclidean
distances do not move. An example is never its own
neighbour; two rows at the same distance from ``a`` at the ``k``-th place are a tie that the order of
``np.argpartition`` settles (exact duplicate rows of the data are each other's neighbours).

A bootstrap resample holds copies of one example, at distance 0 from each other in *both* layers: counted as
neighbours they would be agreement made by the resampling (the review of 2026-11-27 found resamples 0.05
above the estimate at n = 200). ``sources`` (which source example each row copies;
:func:`layersim.similarity.inference.bootstrap.resampled_options` passes it) removes a row's copies from its candidates,
and compares the two neighbour lists as multisets of sources: a source drawn ``w`` times fills up to ``w``
places, and its ``c``-th copy in one list matches its ``c``-th in the other, whichever copy the tie gave. That
is the measure of the resample as a weighted sample: each example's nearest ``k/n`` of the other examples'
weight. Without ``sources`` (every row its own source) the value is the plain one, unchanged.

Sizes: only the ``n × k`` neighbour indices are kept; they are found a block of :data:`BLOCK_ROWS` rows of
distances at a time, so memory is ``O(n · (k + BLOCK_ROWS))`` and 50,000 rows fit (the work is ``n² d``:
1.9·10¹² multiply-adds per layer of width 768 at n = 50,000; not timed here). There is no streamed route:
neighbours need the rows themselves, which a streamed table's second moments do not keep. A row permutation
``π`` of ``y`` maps its neighbour lists to ``π⁻¹[N[π]]``, so the null permutes index arrays only
(:func:`knn_engine`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from layersim.errors import LayersimError, unknown_name
from layersim.similarity._common import Named, centre, named_lists, validated
from layersim.similarity.inference._device_engines import _Engine
from layersim.similarity._pairs import fill_matrix

METRICS = ("cosine", "euclidean")
BLOCK_ROWS = 1024


def _check(k, metric: str, num_rows: int) -> int:
    if metric not in METRICS:
        raise unknown_name("k-NN metric", metric, METRICS)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= num_rows - 2:
        raise LayersimError(f"k must be an integer from 1 to n − 2 = {num_rows - 2} (neighbours among the other "
                            f"{num_rows - 1} examples, fewer than all of them), got {k!r}.")
    return int(k)


def neighbours(name: str, a: np.ndarray, k: int = 10, metric: str = "cosine",
               sources: np.ndarray | None = None) -> np.ndarray:
    """``(n, k)`` int64: row ``r`` holds the indices of the ``k`` examples nearest to example ``r`` (itself
    excluded), in no particular order. With ``sources``: the rows of the same source as ``r`` excluded too,
    and each neighbour given as a label of its source and its rank among that source's copies in the list."""
    k = _check(k, metric, a.shape[0])
    a = centre(name, a, "k-NN Jaccard")  # raises for a constant layer
    n = a.shape[0]
    if metric == "cosine":
        norms = np.sqrt(np.einsum("ij,ij->i", a, a))
        if (norms == 0).any():
            first = int(np.flatnonzero(norms == 0)[0])
            raise LayersimError(f"{name} has {int((norms == 0).sum())} example(s) at the layer's mean (first: row "
                                f"{first}), whose cosine to the others is undefined; use metric='euclidean'.")
        a = a / norms[:, None]
    squares = np.einsum("ij,ij->i", a, a)
    out = np.empty((n, k), dtype=np.int64)
    for start in range(0, n, BLOCK_ROWS):
        stop = min(start + BLOCK_ROWS, n)
        # Squared distance up to a per-row constant (−2⟨a_r, a_s⟩ + ‖a_s‖²): the same order within each row.
        score = squares[None, :] - 2.0 * (a[start:stop] @ a.T)
        score[np.arange(stop - start), np.arange(start, stop)] = np.inf
        if sources is not None:
            score[sources[start:stop, None] == sources[None, :]] = np.inf
        out[start:stop] = np.argpartition(score, k - 1, axis=1)[:, :k]
    return out if sources is None else _copy_labels(sources[out], k)


def _copy_labels(found: np.ndarray, k: int) -> np.ndarray:
    """Each row's source ids as distinct labels ``source · k + c``, ``c`` counting that source's earlier
    entries in the row: lists of sources compared as multisets by :func:`_shared`."""
    ordered = np.sort(found, axis=1)
    place = np.broadcast_to(np.arange(k), ordered.shape)
    starts = np.ones(ordered.shape, dtype=bool)
    starts[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    first = np.maximum.accumulate(np.where(starts, place, 0), axis=1)
    return ordered * k + (place - first)


def _too_few_candidates(sources: np.ndarray | None, k: int) -> bool:
    """Whether some row has fewer than ``k`` rows of other sources (a resample with one source drawn often)."""
    return sources is not None and len(sources) - np.unique(sources, return_counts=True)[1].max() < k


def _shared(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per row, how many indices two ``(n, k)`` neighbour lists share (each row's indices are distinct)."""
    both = np.sort(np.concatenate([a, b], axis=1), axis=1)
    return np.count_nonzero(both[:, 1:] == both[:, :-1], axis=1)


def _jaccard(a: np.ndarray, b: np.ndarray) -> float:
    shared = _shared(a, b)
    return float(np.mean(shared / (2 * a.shape[1] - shared)))


def _stats(named: Named, k: int, metric: str, sources: np.ndarray | None = None) -> list[np.ndarray] | None:
    """Every layer's neighbour lists; None when ``sources`` leave some row fewer than ``k`` candidates."""
    checked = validated(named, "k-NN Jaccard", min_rows=3)
    _check(k, metric, checked[0][1].shape[0])
    if sources is not None and not enough_candidates(sources, checked[0][1].shape[0], k):
        return None
    return [neighbours(name, a, k, metric, sources) for name, a in checked]


def enough_candidates(sources, num_rows: int, k: int) -> bool:
    """Whether every row of a bootstrap resample (`sources`: each row's source example) keeps `k` candidate neighbours
    of other sources; a `sources` that does not give one source per row is refused."""
    sources = np.asarray(sources)
    if sources.shape != (num_rows,):
        raise LayersimError(f"sources has shape {sources.shape}; expected one source id per row, ({num_rows},).")
    return not _too_few_candidates(sources, k)


def knn_jaccard(x: np.ndarray, y: np.ndarray, *, k: int = 10, metric: str = "cosine",
                sources: np.ndarray | None = None) -> float:
    """The mean Jaccard overlap of every example's ``k`` nearest neighbours in ``x`` and in ``y``; with
    ``sources``, a row's copies are not its neighbours (NaN when some row has fewer than ``k`` others)."""
    stats = _stats([("x", x), ("y", y)], k, metric, sources)
    return float("nan") if stats is None else _jaccard(*stats)


def knn_jaccard_matrix(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray] | None = None, *, k: int = 10,
                       metric: str = "cosine", sources: np.ndarray | None = None) -> np.ndarray:
    """[i, j] = :func:`knn_jaccard` ``(xs[i], ys[j])``; each layer's neighbours found once."""
    x_named, y_named = named_lists(xs, ys)
    stats = _stats(x_named + (y_named or []), k, metric, sources)
    if stats is None:
        return np.full((len(x_named), len(y_named or x_named)), np.nan)
    sx, sy = stats[: len(x_named)], (None if y_named is None else stats[len(x_named):])
    return fill_matrix(sx, sy, _jaccard, symmetric=True)


class _KnnEngine(_Engine):
    def __init__(self, cells: np.ndarray, nx: list[np.ndarray], ny: list[np.ndarray]):
        super().__init__(cells)
        self.nx, self.ny = nx, ny

    def values(self, perm: np.ndarray | None) -> np.ndarray:
        out = np.full(self.cells.shape, np.nan)
        if perm is None:
            permuted = self.ny
        else:  # neighbours of row r of y[π]: the rows s with π[s] among N(π[r])
            inverse = np.empty_like(perm)
            inverse[perm] = np.arange(len(perm))
            permuted = [inverse[b[perm]] if j in self.cols else b for j, b in enumerate(self.ny)]
        for i, j in zip(*np.nonzero(self.cells)):
            out[i, j] = _jaccard(self.nx[i], permuted[j])
        return out


def knn_engine(x_named: Named, y_named: Named | None, cells: np.ndarray, *, k: int = 10,
               metric: str = "cosine", sources: np.ndarray | None = None) -> _Engine:
    """The permutation-null engine: each layer's neighbour lists found once, y's relabelled per permutation.
    With ``sources`` (a bootstrap resample) only ``values(None)``: source labels are not row indices."""
    stats = _stats(x_named + (y_named or []), k, metric, sources)
    if stats is None:
        raise LayersimError(f"a row of this resample has fewer than k = {k} rows of other sources.")
    nx = stats[: len(x_named)]
    return _KnnEngine(cells, nx, nx if y_named is None else stats[len(x_named):])
