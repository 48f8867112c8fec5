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

A cluster bootstrap (rows sharing a premise, question or context drawn together) draws a cluster ``w`` times, so
each of its rows meets its cluster-mates ``w`` times, a row of a cluster drawn twice its two premise-mates in four
of its ``k`` places where the sample gives them two, in both layers: agreement made by the resampling again
(mutual k-NN 0.21 on resamples of samples at 0.145; coverage 0 of 25). ``draws`` (which draw of the resample each
row came from; :func:`~layersim.similarity.inference.bootstrap.resampled_options`) leaves out, besides a row's
copies, the rows of its cluster drawn in another draw: a row meets its cluster-mates once, in its own draw, as a
fresh sample's row meets its own premise's, and other clusters' rows as the weighted sample's. :class:`Copies` is
that rule, the one place every neighbourhood measure (:mod:`~layersim.similarity.knn_measures` too) reads it from;
without ``draws`` (each row its own draw, the example bootstrap) it leaves out a row's copies only, as before.

Sizes: only the ``n × k`` neighbour indices are kept; they are found a block of :data:`BLOCK_ROWS` rows of
distances at a time, so memory is ``O(n · (k + BLOCK_ROWS))`` and 50,000 rows fit (the work is ``n² d``:
1.9·10¹² multiply-adds per layer of width 768 at n = 50,000; not timed here). There is no streamed route:
neighbours need the rows themselves, which a streamed table's second moments do not keep. A row permutation
``π`` of ``y`` maps its neighbour lists to ``π⁻¹[N[π]]``, so the null permutes index arrays only
(:func:`knn_engine`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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


@dataclass(frozen=True)
class Copies:
    """Which rows of a bootstrap resample are no candidate neighbours of which (module docstring): of row ``r``,
    every row of ``r``'s cluster drawn in another draw than ``r``'s (``r``'s own copies among them) and ``r``."""

    sources: np.ndarray   # (n,): the sample row each row copies
    draws: np.ndarray     # (n,): the draw each row came from (the rows of one drawn cluster share it)
    clusters: np.ndarray  # (n,): each row's cluster, named by the smallest source its draw holds

    @classmethod
    def of(cls, sources, draws=None, num_rows: int | None = None) -> Copies:
        """``draws`` None: each row its own draw (rows resampled one by one). Refuses arrays of the wrong shape."""
        sources = np.asarray(sources)
        shape = (len(sources) if num_rows is None else num_rows,)
        if sources.shape != shape:
            raise LayersimError(f"sources has shape {sources.shape}; expected one source id per row, {shape}.")
        if draws is None:
            return cls(sources, np.arange(len(sources)), sources)
        draws = np.asarray(draws)
        if draws.shape != shape:
            raise LayersimError(f"draws has shape {draws.shape}; expected one draw id per row, {shape}.")
        # The draws of one cluster hold the same sources, those of two clusters none in common: a draw's smallest
        # source names its cluster.
        draw_ids, draw_of_row = np.unique(draws, return_inverse=True)
        smallest = np.full(len(draw_ids), np.iinfo(np.int64).max)
        np.minimum.at(smallest, draw_of_row, sources.astype(np.int64))
        return cls(sources, draws, smallest[draw_of_row])

    def excluded(self, start: int, stop: int) -> np.ndarray:
        """``(stop − start, n)`` bool: True where column ``s`` is no candidate of row ``start + i``."""
        rows = slice(start, stop)
        same_source = self.sources[rows, None] == self.sources[None, :]
        other_draw = self.draws[rows, None] != self.draws[None, :]
        return same_source | (other_draw & (self.clusters[rows, None] == self.clusters[None, :]))

    def fewest_candidates(self) -> int:
        """The fewest candidate neighbours a row has: ``n`` less its cluster's rows in other draws, less itself."""
        _, cluster_of_row, cluster_rows = np.unique(self.clusters, return_inverse=True, return_counts=True)
        _, draw_of_row, draw_rows = np.unique(self.draws, return_inverse=True, return_counts=True)
        return int(len(self.sources) - 1 - np.max(cluster_rows[cluster_of_row] - draw_rows[draw_of_row]))


def neighbours(name: str, a: np.ndarray, k: int = 10, metric: str = "cosine",
               sources: np.ndarray | None = None, draws: np.ndarray | None = None) -> np.ndarray:
    """``(n, k)`` int64: row ``r`` holds the indices of the ``k`` examples nearest to example ``r`` (itself
    excluded), in no particular order. With ``sources`` (and ``draws``): the rows :class:`Copies` excludes
    excluded too, and each neighbour given as a label of its source and its rank among that source's copies in
    the list."""
    k = _check(k, metric, a.shape[0])
    copies = None if sources is None else Copies.of(sources, draws, a.shape[0])
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
        if copies is not None:
            score[copies.excluded(start, stop)] = np.inf
        out[start:stop] = np.argpartition(score, k - 1, axis=1)[:, :k]
    return out if copies is None else _copy_labels(copies.sources[out], k)


def _copy_labels(found: np.ndarray, k: int) -> np.ndarray:
    """Each row's source ids as distinct labels ``source · k + c``, ``c`` counting that source's earlier
    entries in the row: lists of sources compared as multisets by :func:`_shared`."""
    ordered = np.sort(found, axis=1)
    place = np.broadcast_to(np.arange(k), ordered.shape)
    starts = np.ones(ordered.shape, dtype=bool)
    starts[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    first = np.maximum.accumulate(np.where(starts, place, 0), axis=1)
    return ordered * k + (place - first)


def _shared(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per row, how many indices two ``(n, k)`` neighbour lists share (each row's indices are distinct)."""
    both = np.sort(np.concatenate([a, b], axis=1), axis=1)
    return np.count_nonzero(both[:, 1:] == both[:, :-1], axis=1)


def _jaccard(a: np.ndarray, b: np.ndarray) -> float:
    shared = _shared(a, b)
    return float(np.mean(shared / (2 * a.shape[1] - shared)))


def _stats(named: Named, k: int, metric: str, sources: np.ndarray | None = None,
           draws: np.ndarray | None = None) -> list[np.ndarray] | None:
    """Every layer's neighbour lists; None when ``sources`` (and ``draws``) leave some row fewer than ``k``
    candidates."""
    checked = validated(named, "k-NN Jaccard", min_rows=3)
    _check(k, metric, checked[0][1].shape[0])
    if sources is not None and not enough_candidates(sources, checked[0][1].shape[0], k, draws):
        return None
    return [neighbours(name, a, k, metric, sources, draws) for name, a in checked]


def enough_candidates(sources, num_rows: int, k: int, draws=None) -> bool:
    """Whether every row of a bootstrap resample (`sources`: each row's source example; `draws`: its draw) keeps `k`
    candidate neighbours (:class:`Copies`); a `sources` or `draws` that does not give one id per row is refused."""
    return Copies.of(sources, draws, num_rows).fewest_candidates() >= k


def knn_jaccard(x: np.ndarray, y: np.ndarray, *, k: int = 10, metric: str = "cosine",
                sources: np.ndarray | None = None, draws: np.ndarray | None = None) -> float:
    """The mean Jaccard overlap of every example's ``k`` nearest neighbours in ``x`` and in ``y``; with
    ``sources`` (and ``draws``), a row's copies (and its cluster's other draws) are not its neighbours (NaN when
    some row has fewer than ``k`` others)."""
    stats = _stats([("x", x), ("y", y)], k, metric, sources, draws)
    return float("nan") if stats is None else _jaccard(*stats)


def knn_jaccard_matrix(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray] | None = None, *, k: int = 10,
                       metric: str = "cosine", sources: np.ndarray | None = None,
                       draws: np.ndarray | None = None) -> np.ndarray:
    """[i, j] = :func:`knn_jaccard` ``(xs[i], ys[j])``; each layer's neighbours found once."""
    x_named, y_named = named_lists(xs, ys)
    stats = _stats(x_named + (y_named or []), k, metric, sources, draws)
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
               metric: str = "cosine", sources: np.ndarray | None = None,
               draws: np.ndarray | None = None) -> _Engine:
    """The permutation-null engine: each layer's neighbour lists found once, y's relabelled per permutation.
    With ``sources`` (a bootstrap resample) only ``values(None)``: source labels are not row indices."""
    stats = _stats(x_named + (y_named or []), k, metric, sources, draws)
    if stats is None:
        raise LayersimError(f"a row of this resample has fewer than k = {k} rows of other sources.")
    nx = stats[: len(x_named)]
    return _KnnEngine(cells, nx, nx if y_named is None else stats[len(x_named):])
