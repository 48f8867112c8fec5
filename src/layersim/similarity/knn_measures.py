"""Neighbourhood measures of ReSi and of the platonic-representation work, on cosine nearest neighbours.

Every measure here finds, in each layer, the ``k`` nearest other examples of each example ``a`` by the cosine of
their rows *as given* (not centred: ReSi's ``top_k_neighbors(inner="cosine")`` and Huh et al.'s normalised
features do not centre; :mod:`~layersim.similarity.neighbours`' k-NN Jaccard does), nearest first, ties to the
lower row index, and then compares the two layers' neighbourhoods (Klabunde et al. 2023's survey, §"neighbourhood
measures"; ReSi, Klabunde et al. ICLR 2025):

* ``mutual_knn`` (Huh, Cheung, Wang & Isola 2024, "The platonic representation hypothesis", their ``mutual_knn``):
  ``mean_a |N_k^x(a) ∩ N_k^y(a)| / k``, in [0, 1];
* ``rank_similarity`` (Wang et al. 2020, "Towards understanding learning representations: to what extent do
  different neural networks learn the same representation", as ReSi's ``rank_similarity``): for the shared
  neighbours ``j`` of ``a``, with ranks ``r_x, r_y`` (1 = nearest) in the two lists,
  ``v_a = Σ_j 2 / ((1 + |r_x − r_y|)(r_x + r_y)) / Σ_{m=1}^{|shared|} 1/m`` (0 when none is shared), averaged over
  ``a``; in [0, 1] (each term is at most ``1/max(r_x, r_y)``);
* ``second_order_cosine`` (Hamilton, Leskovec & Jurafsky 2016, "Cultural shift or linguistic drift?", eq. 2; ReSi's
  paper): over the union ``U_a = N_k^x(a) ∪ N_k^y(a)``, the cosine between the vectors of cosine *similarities*
  ``(cos(x_a, x_j))_{j∈U_a}`` and ``(cos(y_a, y_j))_{j∈U_a}``, averaged over ``a``; in [−1, 1]. ReSi's code fills
  these vectors with cosine *distances* ``1 − cos`` instead, which changes the value (docs/peers.md);
* ``cknna`` (Huh et al. 2024, appendix A, "CKNNA"): CKA restricted to mutual neighbours,
  ``Align(K, L) = Σ_a Σ_j α_aj (K_aj − k̄_a)(L_aj − l̄_a)`` with ``K``, ``L`` the cosine kernels, ``k̄_a`` the mean
  of ``K_al`` over the other examples ``l ≠ a``, ``α_aj = 1`` when ``j`` is among ``a``'s ``k`` nearest in both
  layers, and ``cknna = Align(K, L) / sqrt(Align(K, K) Align(L, L))`` (``Align(K, K)`` over ``a``'s own
  neighbours), in [−1, 1] by Cauchy–Schwarz. This is the paper's formula; the platonic code computes the unbiased
  HSIC of the masked kernels instead (and adds 1e-6 to the denominator), another number (docs/peers.md).

All four are 1 for a layer against itself and unchanged by a rotation or reflection of either side's neurons
(permutations included) and by isotropic scaling; *not* by a translation, which moves every cosine (that is their
nature, and the common direction of anisotropic transformer states weighs on them: knn_jaccard centres first).

Bootstrap resamples hold copies of one example, which would be each other's neighbours at cosine 1 in every
layer: with ``sources`` (the source row of each row; :func:`layersim.similarity.inference.bootstrap.resampled_options`)
a row's copies are not its candidates (nor in CKNNA's row mean), the cosines to the copies of another example are
computed once per source (so they tie exactly) and ties go to the lower row index in every layer, so a list holding
``c`` copies of an example holds its first ``c``: comparing row indices is comparing multisets of sources, as
:mod:`~layersim.similarity.neighbours` does. With ``draws`` too (a cluster bootstrap), a row's cluster drawn in
another draw is no candidate either (nor in the row mean): :class:`~layersim.similarity.neighbours.Copies`, the rule
k-NN Jaccard's neighbours follow, says which rows. A row with fewer than ``k`` candidates makes the value NaN.

Cost: the neighbours of a layer are found a block of :data:`BLOCK_ROWS` rows of cosines at a time (fewer above
16,384 rows: :data:`BLOCK_VALUES`), ``n² d`` multiply-adds and ``O(n k + BLOCK_VALUES)`` memory, kept as ``n × k`` indices and cosines (plus the unit rows,
``n × d``, for second_order_cosine); a pair is ``O(n k log k)`` (second_order_cosine: ``O(n k d)``). No ``n × n``
matrix is kept, so 50,000 rows fit; no streamed route (neighbours need the rows). A row permutation ``π`` of ``y``
maps its lists to ``π⁻¹[N[π]]`` and reorders the rest, so the null engine relabels the prepared statistics
(:class:`~layersim.similarity.inference._host_engines.RowsEngine`; equal to the measure on ``y[π]`` up to
the order of exact ties).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from layersim.errors import LayersimError
from layersim.similarity._common import Named, _constant_error, centred_and_constant, named_lists, validated
from layersim.similarity._pairs import fill_matrix
from layersim.similarity.inference._host_engines import RowsEngine
from layersim.similarity.neighbours import Copies, _check, enough_candidates

BLOCK_ROWS = 1024
BLOCK_VALUES = 1 << 24  # and at most this many cosines per block: ~35 bytes each while a block is scored (590 MB)
PAIR_BLOCK_VALUES = 1 << 22  # gathered unit rows per block of second_order_cosine's pair work (32 MB)


@dataclass(frozen=True)
class Neighbourhood:
    """One layer's cosine neighbourhoods, what every measure of this module needs of it."""

    units: np.ndarray      # (n, d): the rows scaled to unit norm
    nearest: np.ndarray    # (n, k) int64: each row's k nearest other rows, nearest first
    cosines: np.ndarray    # (n, k): their cosines to the row
    row_means: np.ndarray  # (n,): each row's mean cosine to the other examples (CKNNA's k̄)
    self_align: float      # CKNNA's Align(K, K) = Σ_a Σ_{j ∈ N(a)} (K_aj − k̄_a)²


def _unit_rows(name: str, a: np.ndarray, label: str) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    if centred_and_constant(a)[1]:  # every example the same: every cosine 1, no neighbourhood to compare
        raise _constant_error(name, label)
    norms = np.sqrt(np.einsum("ij,ij->i", a, a))
    zero = np.flatnonzero(norms == 0)
    if zero.size:
        raise LayersimError(f"{name} has {zero.size} example(s) whose row is 0 (first: row {zero[0]}), whose cosine "
                            f"to the others is undefined, so its {label} is too; drop them, or use knn_jaccard (which "
                            "centres the rows first).")
    return a / norms[:, None]


def _nearest(score: np.ndarray, k: int) -> np.ndarray:
    """Per row the ``k`` columns of smallest ``score``, smallest first, ties to the lower column: the same choice
    in every layer whose scores tie alike (a partition, then a stable sort of the ``k`` chosen)."""
    kth = np.partition(score, k - 1, axis=1)[:, k - 1 : k]
    below = score < kth
    ties = score == kth
    need = k - np.count_nonzero(below, axis=1)[:, None]
    chosen = below | (ties & (np.cumsum(ties, axis=1) <= need))
    columns = np.nonzero(chosen)[1].reshape(len(score), k)
    order = np.argsort(np.take_along_axis(score, columns, axis=1), axis=1, kind="stable")
    return np.take_along_axis(columns, order, axis=1)


def neighbourhood(name: str, a: np.ndarray, k: int = 10, sources: np.ndarray | None = None,
                  label: str = "neighbourhood measure", draws: np.ndarray | None = None) -> Neighbourhood:
    """The :class:`Neighbourhood` of one ``(n, d)`` layer (see the module docstring for ``sources`` and ``draws``)."""
    units = _unit_rows(name, a, label)
    n = len(units)
    copies = None if sources is None else Copies.of(sources, draws, n)
    if copies is None:
        distinct, expand, own_copies = units, None, np.ones(n)
    else:  # cosines to each source computed once, so that copies tie exactly
        _, first, expand, counts = np.unique(copies.sources, return_index=True, return_inverse=True,
                                             return_counts=True)
        distinct, own_copies = units[first], counts[expand].astype(np.float64)
    nearest = np.empty((n, k), dtype=np.int64)
    cosines = np.empty((n, k))
    # Cosines to the rows of a row's cluster in other draws that are not its copies (0 without draws): out of its
    # row mean, as its copies are.
    mates, mate_sums = np.zeros(n), np.zeros(n)
    block = max(1, min(BLOCK_ROWS, BLOCK_VALUES // n))
    for start in range(0, n, block):
        stop = min(start + block, n)
        sims = units[start:stop] @ distinct.T
        if expand is not None:
            sims = sims[:, expand]
        score = -sims
        if copies is None:
            score[np.arange(stop - start), np.arange(start, stop)] = np.inf
        else:
            excluded = copies.excluded(start, stop)
            score[excluded] = np.inf
            other_mates = excluded & (copies.sources[start:stop, None] != copies.sources[None, :])
            mates[start:stop] = other_mates.sum(axis=1)
            mate_sums[start:stop] = np.where(other_mates, sims, 0.0).sum(axis=1)
        nearest[start:stop] = _nearest(score, k)
        cosines[start:stop] = np.take_along_axis(sims, nearest[start:stop], axis=1)
    own = np.einsum("ij,ij->i", units, units)  # 1 up to rounding
    row_means = (units @ units.sum(axis=0) - own_copies * own - mate_sums) / (n - own_copies - mates)
    self_align = float(np.sum((cosines - row_means[:, None]) ** 2))
    return Neighbourhood(units, nearest, cosines, row_means, self_align)


def _stats(named: Named, k: int, label: str, sources: np.ndarray | None,
           draws: np.ndarray | None = None) -> list[Neighbourhood] | None:
    """Every layer's neighbourhood; None when ``sources`` (and ``draws``) leave some row fewer than ``k``
    candidates."""
    checked = validated(named, label, min_rows=3)
    k = _check(k, "cosine", checked[0][1].shape[0])
    if sources is not None and not enough_candidates(sources, checked[0][1].shape[0], k, draws):
        return None
    return [neighbourhood(name, a, k, sources, label, draws) for name, a in checked]


def _permuted(h: Neighbourhood, perm: np.ndarray, inverse: np.ndarray) -> Neighbourhood:
    """The neighbourhood of the layer's rows in the order ``perm``: row r is old row perm[r], old row s is now
    inverse[s]."""
    return Neighbourhood(h.units[perm], inverse[h.nearest[perm]], h.cosines[perm], h.row_means[perm], h.self_align)


def _shared(a: Neighbourhood, b: Neighbourhood):
    """The neighbours both lists of a row hold, flattened over rows: (row, rank in a, rank in b, cosine in a,
    cosine in b), ranks from 1."""
    n, k = a.nearest.shape
    order_a, order_b = np.argsort(a.nearest, axis=1), np.argsort(b.nearest, axis=1)
    index = np.concatenate([np.take_along_axis(a.nearest, order_a, 1), np.take_along_axis(b.nearest, order_b, 1)], 1)
    rank = np.concatenate([order_a, order_b], axis=1) + 1
    cos = np.concatenate([np.take_along_axis(a.cosines, order_a, 1), np.take_along_axis(b.cosines, order_b, 1)], 1)
    merged = np.argsort(index, axis=1, kind="stable")  # an index in both lists: a's entry, then b's
    index, rank, cos = (np.take_along_axis(v, merged, axis=1) for v in (index, rank, cos))
    rows, pos = np.nonzero(index[:, 1:] == index[:, :-1])  # each list's indices are distinct
    return rows, rank[rows, pos], rank[rows, pos + 1], cos[rows, pos], cos[rows, pos + 1]


def _mutual(a: Neighbourhood, b: Neighbourhood) -> float:
    return len(_shared(a, b)[0]) / a.nearest.size


def _rank(a: Neighbourhood, b: Neighbourhood) -> float:
    n, k = a.nearest.shape
    rows, ra, rb, _, _ = _shared(a, b)
    terms = 2.0 / ((1.0 + np.abs(ra - rb)) * (ra + rb))
    count = np.bincount(rows, minlength=n)
    harmonic = np.concatenate([[1.0], np.cumsum(1.0 / np.arange(1, k + 1))])  # [0] unused: rows sharing none give 0
    return float(np.clip(np.mean(np.bincount(rows, terms, minlength=n) / harmonic[count]), 0.0, 1.0))


def _cknna(a: Neighbourhood, b: Neighbourhood) -> float:
    rows, _, _, ca, cb = _shared(a, b)
    align = np.sum((ca - a.row_means[rows]) * (cb - b.row_means[rows]))
    if not (a.self_align > 0 and b.self_align > 0):
        raise LayersimError("a layer's cosines to its neighbours all equal its mean cosine, so CKNNA is undefined "
                            "(a degenerate layer); drop that layer or use another measure.")
    return float(np.clip(align / np.sqrt(a.self_align * b.self_align), -1.0, 1.0))


def _second_order(a: Neighbourhood, b: Neighbourhood) -> float:
    n, k = a.nearest.shape
    union = np.sort(np.concatenate([a.nearest, b.nearest], axis=1), axis=1)
    keep = np.ones(union.shape)
    keep[:, 1:] = union[:, 1:] != union[:, :-1]  # an index in both lists counts once
    step = max(1, PAIR_BLOCK_VALUES // (2 * k * max(a.units.shape[1], b.units.shape[1])))
    out = np.empty(n)
    for start in range(0, n, step):
        rows = slice(start, min(start + step, n))
        va = np.einsum("rd,rjd->rj", a.units[rows], a.units[union[rows]]) * keep[rows]
        vb = np.einsum("rd,rjd->rj", b.units[rows], b.units[union[rows]]) * keep[rows]
        norms = np.sqrt(np.einsum("rj,rj->r", va, va) * np.einsum("rj,rj->r", vb, vb))
        if not (norms > 0).all():
            first = start + int(np.flatnonzero(~(norms > 0))[0])
            raise LayersimError(f"example {first} has cosine 0 to every neighbour in a layer, so its second-order "
                                "cosine is undefined; use another measure.")
        out[rows] = np.einsum("rj,rj->r", va, vb) / norms
    return float(np.clip(out.mean(), -1.0, 1.0))


@dataclass(frozen=True)
class _Functions:
    pair: Callable[..., float]
    matrix: Callable[..., np.ndarray]
    engine: Callable[..., RowsEngine]


def _functions(reduce: Callable[[Neighbourhood, Neighbourhood], float], name: str, label: str) -> _Functions:
    """The pair, matrix and null-engine functions of the measure whose per-pair work is ``reduce``."""

    def pair(x: np.ndarray, y: np.ndarray, *, k: int = 10, sources: np.ndarray | None = None,
             draws: np.ndarray | None = None) -> float:
        stats = _stats([("x", x), ("y", y)], k, label, sources, draws)
        return float("nan") if stats is None else reduce(*stats)

    def matrix(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray] | None = None, *, k: int = 10,
               sources: np.ndarray | None = None, draws: np.ndarray | None = None) -> np.ndarray:
        x_named, y_named = named_lists(xs, ys)
        stats = _stats(x_named + (y_named or []), k, label, sources, draws)
        if stats is None:
            return np.full((len(x_named), len(y_named or x_named)), np.nan)
        sx, sy = stats[: len(x_named)], (None if y_named is None else stats[len(x_named):])
        return fill_matrix(sx, sy, reduce, symmetric=True)

    def engine(x_named: Named, y_named: Named | None, cells: np.ndarray, *, k: int = 10,
               sources: np.ndarray | None = None, draws: np.ndarray | None = None) -> RowsEngine:
        stats = _stats(x_named + (y_named or []), k, label, sources, draws)
        if stats is None:
            raise LayersimError(f"a row of this resample has fewer than k = {k} rows of other sources.")
        sx = stats[: len(x_named)]
        return RowsEngine(cells, sx, sx if y_named is None else stats[len(x_named):], reduce, _permuted)

    pair.__name__, matrix.__name__, engine.__name__ = name, f"{name}_matrix", f"{name}_engine"
    pair.__doc__ = f"The {label} of two ``(n, d)`` layers on their ``k`` cosine nearest neighbours (module docstring)."
    matrix.__doc__ = f"[i, j] = {name}(xs[i], ys[j]); each layer's neighbourhoods found once."
    engine.__doc__ = (f"The permutation-null engine of {name}: neighbourhoods found once, y's relabelled per "
                      "permutation. With ``sources`` (a bootstrap resample) only ``values(None)``.")
    return _Functions(pair, matrix, engine)


MUTUAL_KNN = _functions(_mutual, "mutual_knn", "mutual k-NN")
RANK_SIMILARITY = _functions(_rank, "rank_similarity", "rank similarity")
SECOND_ORDER_COSINE = _functions(_second_order, "second_order_cosine", "second-order cosine similarity")
CKNNA = _functions(_cknna, "cknna", "CKNNA")

mutual_knn, rank_similarity, second_order_cosine, cknna = (f.pair for f in (MUTUAL_KNN, RANK_SIMILARITY,
                                                                           SECOND_ORDER_COSINE, CKNNA))
