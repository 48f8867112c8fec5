"""Permutation nulls and bootstrap intervals of attention similarities (:mod:`layersim.similarity.attention`).

An attention map belongs to one example: a ``t × t`` matrix per head over the example's ``t`` units. A null
breaks the pairing of examples between the two layers compared, so it pairs whole maps of one with whole maps
of the other, and a map can only be paired with one of the **same length** (query q and key k of one example line
up with query q and key k of another only when both have ``t`` units). Examples that share a text (a premise, a
passage: the activation tables' ``cluster_id``) share a component in every model and **move as one block**, as
in every other null of the project (:mod:`~layersim.similarity.inference.exchangeability`, Winkler et al. 2015).

So the null is that module's block permutation on the (query, key) pair rows, with each pair's cluster as its
group and the cluster's *shape* (the lengths of its examples' maps, in table order) as its stratum: clusters of one
shape are exchanged pair for pair, which takes each example onto one of equal length, query onto query and key
onto key. A cluster whose shape no other has stays in place (the test stays exact, with less power:
:attr:`~layersim.similarity.inference.exchangeability.BlockPermutations.movable` says how many pairs can move; none
movable: no null, and the stage says why). similarity.length_classes does not apply: a map cut short is no
distribution over its keys.

Head-level measures are ratios of sums over examples (:func:`layersim.similarity.attention.example_terms`), so a
permutation only re-pairs the examples' terms: the engine computes, per cell, the terms of each example with its
partner and keeps those it has met, so a null costs at most one computation per pair of examples within their
classes (``Σ k²`` over classes of ``k`` examples), whatever the number of permutations. Array measures over the
weights (heads as features, Wu et al.'s distributed attention) go through the registry's engines, with the same
blocks. p-values, null means and the draws themselves are :func:`~layersim.similarity.inference.null.drawn_null`'s.

Bootstrap intervals resample whole clusters with replacement
(:func:`~layersim.similarity.inference.bootstrap.resample_rows` over the examples, grouped by cluster); for a head
measure a resample only re-weights each example's terms with itself. The interval method is
:data:`~layersim.similarity.inference.bootstrap.AUTO_INTERVAL`'s for the measure (head measures: measured by
``benchmarks/calibration.py --attention``); array measures are intervals of :func:`bootstrap_pairs` over the
weights, whole clusters' pairs resampled.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from layersim.errors import LayersimError
from layersim.similarity._common import check_options
from layersim.similarity.attention import (HEAD_MEASURES, AttentionMaps, _head_stats, example_terms, layer_similarity,
                                           similarity_of)
from layersim.similarity.inference._device_engines import _Engine
from layersim.similarity.inference.bootstrap import (BootstrapResult, bootstrap_pairs, check_arguments, finish,
                                                     jackknife_rows, resample_rows)
from layersim.similarity.inference.exchangeability import BlockPermutations, block_permutations, null_units
from layersim.similarity.inference.null import NullMatrix, drawn_null

# The terms of pairs of examples a head-measure null keeps for its later draws, over all its cells (bytes); past it
# the terms are recomputed per draw (the same values, more time).
TERMS_CACHE_BYTES = 256 * 2**20


def example_clusters(maps: AttentionMaps, clusters: np.ndarray | None) -> np.ndarray:
    """Each example's cluster as 0-based codes (None: every example its own), checked: one label per example."""
    count = len(maps.example_row_starts())
    if clusters is None:
        return np.arange(count)
    clusters = np.asarray(clusters)
    if clusters.shape != (count,):
        raise LayersimError(f"attention clusters must hold one label per example, shape ({count},); got shape "
                            f"{clusters.shape}.")
    return np.unique(clusters, return_inverse=True)[1].ravel().astype(np.int64)


def pair_blocks(maps: AttentionMaps, clusters: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(groups, strata)`` of the (query, key) pair rows for :func:`block_permutations` (module docstring): each
    pair's cluster, and its cluster's shape (the rows and pairs of each of its examples' maps, in table order)."""
    codes = example_clusters(maps, clusters)
    _, pair_counts, row_counts = maps.example_layout()
    shapes: dict[int, list] = {}
    for cluster, rows, pairs in zip(codes.tolist(), row_counts.tolist(), pair_counts.tolist()):
        shapes.setdefault(cluster, []).append((rows, pairs))
    kinds: dict[tuple, int] = {}
    shape_of = np.array([kinds.setdefault(tuple(shapes[c]), len(kinds)) for c in range(len(shapes))], dtype=np.int64)
    return np.repeat(codes, pair_counts), np.repeat(shape_of[codes], pair_counts)


def attention_blocks(maps: AttentionMaps, clusters: np.ndarray | None = None) -> BlockPermutations:
    """The permutations of an attention null over `maps`' examples (module docstring)."""
    return block_permutations(maps.num_pairs, *pair_blocks(maps, clusters))


def attention_unmovable(maps: AttentionMaps, clusters: np.ndarray | None = None) -> str | None:
    """Why no attention null can be drawn (no two clusters of examples with maps of the same lengths), or None."""
    if attention_blocks(maps, clusters).movable > 0:
        return None
    return (f"no two of the {len(maps.example_row_starts())} attention examples (or clusters of examples sharing a "
            "text) have maps of the same lengths, so no permutation can pair an example with another; keep more "
            "examples (extract.attention_examples)")


def attention_null_units(maps: AttentionMaps, clusters: np.ndarray | None = None) -> dict:
    """What the attention null moves, for the stage's records (exchangeability.null_units on the pair rows)."""
    groups, strata = pair_blocks(maps, clusters)
    found = null_units(maps.num_pairs, groups, strata, unit="examples of equal length (a cluster's together)")
    return found | {"pairs": found.pop("rows"), "examples": len(maps.example_row_starts())}


class HeadNullEngine(_Engine):
    """A head measure between ``xs[i]`` and ``ys[j]`` with the examples of ``ys[j]`` permuted (a pair-row permutation
    of :func:`attention_blocks`, which moves whole examples onto examples of equal length): per cell the ratio of
    sums of :func:`~layersim.similarity.attention.example_terms` of each example with its partner, the terms of
    each pair of examples computed once and kept (within :data:`TERMS_CACHE_BYTES`)."""

    def __init__(self, measure: str, xs: Sequence[AttentionMaps], ys: Sequence[AttentionMaps] | None,
                 cells: np.ndarray):
        super().__init__(cells)
        self.measure = measure
        used_x = set(self.rows.tolist()) | (set(self.cols.tolist()) if ys is None else set())
        self.x_stats = {i: _head_stats(f"xs[{i}]", xs[i], measure) for i in sorted(used_x)}
        self.y_stats = self.x_stats if ys is None else {
            j: _head_stats(f"ys[{j}]", ys[j], measure) for j in self.cols.tolist()}
        first = (xs if ys is None else ys)[0]
        starts, counts, _ = first.example_layout()
        self.num_examples = len(starts)
        self.first_pairs = starts
        self.example_of_pair = np.repeat(np.arange(self.num_examples), counts)
        self.shared = ys is None  # one list of layers: cells (i, j) and (j, i) share their terms (_key)
        self.cache: dict[tuple[int, int], dict[int, tuple[np.ndarray, np.ndarray]]] = {}
        self.cached_bytes = 0

    def values(self, perm: np.ndarray | None) -> np.ndarray:
        out = np.full(self.cells.shape, np.nan)
        identity = np.arange(self.num_examples)
        partner = identity if perm is None else self.example_of_pair[np.asarray(perm)[self.first_pairs]]
        for i, j in zip(*np.nonzero(self.cells)):
            numerator, denominator = self._sums(int(i), int(j), partner, perm is None)
            out[i, j] = layer_similarity(similarity_of(self.measure, numerator, denominator))
        return out

    def _sums(self, i: int, j: int, partner: np.ndarray, observed: bool) -> tuple[np.ndarray, np.ndarray]:
        a, b = self.x_stats[i], self.y_stats[j]
        examples = np.arange(self.num_examples)
        if observed:
            terms = example_terms(a, b, self.measure)
            self._keep(i, j, examples, examples, *terms)
            return terms[0].sum(axis=0), terms[1].sum(axis=0)
        found = [self._known(i, j, e, f) for e, f in zip(examples.tolist(), partner.tolist())]
        missing = np.array([e for e, terms in enumerate(found) if terms is None], dtype=np.int64)
        if len(missing):
            numerator, denominator = example_terms(a, b, self.measure, missing, partner[missing])
            for n, e in enumerate(missing.tolist()):
                found[e] = (numerator[n], denominator[n])
            self._keep(i, j, missing, partner[missing], numerator, denominator)
        return sum(t[0] for t in found), sum(t[1] for t in found)

    def _key(self, i: int, j: int, e: int, f: int) -> tuple[tuple[int, int], int, bool]:
        """Where the terms of example e of layer i with example f of layer j are kept: (cell, pair, transposed).
        The head measures are symmetric (a JS divergence, a correlation, a distance): with one list of layers the terms
        of (j, f) with (i, e) are those of (i, e) with (j, f) transposed, bit for bit (the same sums of the same
        products in the same order), so cells (i, j) and (j, i), and the pairs (e, f) and (f, e) of a cell (i, i),
        share them: kept once, under the smaller (layer, example)."""
        if self.shared and (i, e) > (j, f):
            return (j, i), f * self.num_examples + e, True
        return (i, j), e * self.num_examples + f, False

    def _known(self, i: int, j: int, e: int, f: int) -> tuple[np.ndarray, np.ndarray] | None:
        cell, pair, transposed = self._key(i, j, e, f)
        terms = self.cache.get(cell, {}).get(pair)
        return terms if terms is None or not transposed else (terms[0].T, terms[1].T)

    def _keep(self, i: int, j: int, examples: np.ndarray, partners: np.ndarray, numerator: np.ndarray,
              denominator: np.ndarray) -> None:
        size = numerator[0].nbytes + denominator[0].nbytes
        for n, (e, f) in enumerate(zip(examples.tolist(), partners.tolist())):
            if self.cached_bytes + size > TERMS_CACHE_BYTES:
                return
            cell, pair, transposed = self._key(i, j, e, f)
            known = self.cache.setdefault(cell, {})
            if pair not in known:
                known[pair] = (numerator[n].T, denominator[n].T) if transposed else (numerator[n], denominator[n])
                self.cached_bytes += size


def _checked(measure: str, layers: Sequence[AttentionMaps], options: dict) -> None:
    for k, maps in enumerate(layers):
        if not isinstance(maps, AttentionMaps):
            raise LayersimError(f"layer {k} must be an AttentionMaps, got {type(maps).__name__}.")
        if not np.array_equal(maps.row_starts, layers[0].row_starts):
            raise LayersimError(f"layer {k} and layer 0 do not cover the same (example, query, key) pairs; compare "
                                "attention over the same examples.")
    if measure in HEAD_MEASURES:
        check_options(measure, options, ())


def attention_stacked_null(measure: str, models: dict[str, Sequence[AttentionMaps]], *, permutations: int, seed: int,
                           cells: np.ndarray | None = None, clusters: np.ndarray | None = None,
                           **options) -> NullMatrix:
    """The permutation null of every cell of the stacked attention matrix
    (:func:`layersim.similarity.comparisons.stacked_matrix` on these maps): the column layer's examples permuted
    within classes of equal length, `clusters` (each example's; None: every example its own) as blocks (module
    docstring); NaN outside `cells`. Method "block permutation". Raises LayersimError when no example can move."""
    from layersim.similarity.comparisons import stacked_null  # comparisons imports the attention measures

    layers = [maps for model in models.values() for maps in model]
    _checked(measure, layers, options)
    groups, strata = pair_blocks(layers[0], clusters)
    if measure not in HEAD_MEASURES:  # an array measure over the weights: the registry's engines
        return stacked_null(measure, {label: [m.weights for m in maps] for label, maps in models.items()},
                            permutations=permutations, seed=seed, cells=cells, groups=groups, strata=strata,
                            **options)
    if isinstance(permutations, bool) or not isinstance(permutations, (int, np.integer)) or permutations < 1:
        raise LayersimError(f"permutations must be an integer >= 1, got {permutations!r}.")
    blocks = block_permutations(layers[0].num_pairs, groups, strata)
    unmovable = attention_unmovable(layers[0], clusters)
    if unmovable:
        raise LayersimError(unmovable + ".")
    chosen = np.ones((len(layers),) * 2, dtype=bool) if cells is None else np.asarray(cells, dtype=bool)
    return drawn_null(HeadNullEngine(measure, layers, None, chosen), blocks, chosen, int(permutations), seed)


def attention_bootstrap_pairs(measure: str, xs: Sequence[AttentionMaps], ys: Sequence[AttentionMaps], *,
                              resamples: int = 200, seed: int = 0, groups: np.ndarray | None = None,
                              level: float = 0.95, interval: str = "auto", **options) -> BootstrapResult:
    """Bootstrap interval of ``attention_similarity(xs[k], ys[k], measure)`` for every pair k, whole clusters of
    examples resampled with replacement (`groups`: each example's cluster; None: each example its own), every pair
    on the same resamples (as :func:`~layersim.similarity.inference.bootstrap.bootstrap_pairs`, whose interval
    methods, level and result these are)."""
    if len(xs) != len(ys) or not len(xs):
        raise LayersimError(f"attention_bootstrap_pairs needs as many x layers as y layers (got {len(xs)} and "
                            f"{len(ys)}), at least one.")
    _checked(measure, [*xs, *ys], options)
    codes = example_clusters(xs[0], groups)
    if measure not in HEAD_MEASURES:
        _, pair_counts, _ = xs[0].example_layout()
        return bootstrap_pairs(measure, [m.weights for m in xs], [m.weights for m in ys], resamples=resamples,
                               seed=seed, groups=np.repeat(codes, pair_counts), level=level, interval=interval,
                               **options)
    _, method = check_arguments(measure, options, resamples, level, interval)
    stats: dict[int, object] = {}
    for maps in (*xs, *ys):  # each distinct layer's statistics once
        if id(maps) not in stats:
            stats[id(maps)] = _head_stats(f"layer {len(stats)}", maps, measure)
    terms = [example_terms(stats[id(x)], stats[id(y)], measure) for x, y in zip(xs, ys)]
    count = len(codes)

    def on(row_sets: list[np.ndarray]) -> np.ndarray:
        weights = np.stack([np.bincount(rows, minlength=count) for rows in row_sets]).astype(np.float64)
        out = np.empty((len(row_sets), len(terms)))
        for k, (numerator, denominator) in enumerate(terms):
            sums = np.tensordot(weights, numerator, axes=1), np.tensordot(weights, denominator, axes=1)
            out[:, k] = [layer_similarity(similarity_of(measure, n, d)) for n, d in zip(*sums)]
        return out

    estimate = on([np.arange(count)])[0]
    values = on(resample_rows(count, resamples, seed, codes))
    jackknife = on(jackknife_rows(count, seed, codes)) if method == "bca" else None
    return finish(measure, estimate, values, jackknife, level, method)
