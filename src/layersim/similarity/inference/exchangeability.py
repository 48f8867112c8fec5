"""Exchangeability blocks: which rows a permutation null may move, and how (Winkler et al. 2015).

A permutation null is exact when, under H0, the joint law of the data is unchanged by every permutation it
draws. Shuffling single rows needs the rows to be exchangeable: independent draws, one per example. That holds
for ``cls``/``mean``/``last`` on single-input tasks (one row per example). It fails when one example gives
several rows: the words of a sentence (``tokens`` pooling) share the sentence, and the 4 choice rows of a
multiple-choice example share its context, in every layer of every model. Two representations that share
nothing but that grouping then look related to a row null (50 sentences × 10 words, d = 20, sentence sd 1:
p < 0.05 in 100 % of draws under H0), whose spread scales with the rows where it should scale with the examples.

The rule here (Winkler, Webster, Vidaurre, Nichols & Smith 2015, "Multi-level block permutation", NeuroImage,
whole-block exchangeability): every row carries its example (``groups``) and a stratum (``strata``, e.g. the
task; one stratum by default). Examples of one stratum with the same number of rows form a *class*; a draw
permutes the examples of each class uniformly at random (``σ``), **position by position**: row t of example e
(rows in table order) takes the place of row t of example σ(e). An example's rows move together and keep their
order, and examples never leave their stratum. The null is exact when the examples of a class are exchangeable
under H0 (independent examples drawn alike given stratum and size), whatever the dependence within an example.

Unequal sizes: an example whose size no other example of its stratum shares has no partner and **stays in
place**. The permutations drawn are then a subgroup of the whole-block ones, and a test over a subgroup is still
exact; it loses power (a fixed example is paired with itself in every draw, which also raises the null mean).
:attr:`BlockPermutations.movable` is the share of rows that can move and :meth:`BlockPermutations.note` says
when too few can for a p-value to reach a significance level. When no row can move, the null is a point mass at
the observed value: :meth:`BlockPermutations.check` refuses it.

Streamed tables (larger than memory): a block permutation needs the rows, which the streamed moments no longer
hold, and the rotation null of the moments treats rows as exchangeable too. So with blocks, a streamed table's
null comes from a random sample of whole examples held in memory (:func:`example_sample`, at most
:data:`STREAMED_SAMPLE_ROWS` rows): its block null *and the observed value its p-value is compared with* are both
computed on the sample, so the p-value is exact for the sample (a test of the same H0 on fewer examples, less
power); the value reported stays the whole table's, and the null mean is the sample's (at fewer rows, so a
measure's upward bias is larger there: the chance-adjusted value is conservative).

Clusters above the example: examples that share a text (MNLI's premise with several hypotheses, QNLI's question,
BoolQ's passage, a context with several questions, a user task's ``group``) share a component in every model, like
the words of one sentence, so they are not exchangeable one by one either: 100 premises × 3 hypotheses, d = 20,
nothing shared but the premise (sd 0.5 / 1), gave p < 0.05 in 19–27 % / 100 % of draws with the example as the
unit, 3.0–6.5 % with the premise (the stage's default measures, 200 draws: benchmarks/calibration.py --structured
--premises; docs/reading-the-numbers.md). So the stages pass each row's *cluster*
(the activation tables' ``cluster_id``: all rows of all examples sharing a text; an example alone by default) as
`groups`: a cluster moves as one block, the words of each of its examples with it, and the bootstrap resamples
whole clusters (layersim.similarity.inference.bootstrap). :func:`null_units` records what moved.

When every example has one row and there is one stratum, a draw is ``rng.permutation(n)``: today's row
permutation, the same draws for a seed, and linear CKA keeps its exact moments (layersim.similarity.inference._rv, which
are moments of the row-permutation distribution; with blocks it falls back to sampled block permutations).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from layersim.errors import LayersimError


# Linear CKA's block null is sampled (its exact moments are the row permutation's) but cheap from the Grams, so
# the stages draw at least this many block permutations for it: the smallest p-value 1/200 instead of the
# 1/(permutations + 1) of e.g. the quickstart's 20 (measured cost: benchmarks/calibration.py --cost).
LINEAR_CKA_BLOCK_PERMUTATIONS = 199
# A streamed table (too large for memory) gets its block null from a random sample of whole examples of at most
# this many rows, held in memory (:func:`example_sample`).
STREAMED_SAMPLE_ROWS = 2048


@dataclass(frozen=True)
class BlockPermutations:
    """The permutation group of a null: whole examples exchanged within classes of equal stratum and size."""

    num_rows: int
    classes: tuple[np.ndarray, ...]  # per class of >= 2 interchangeable examples: (examples, size) row indices
    plain: bool                      # one row per example, one stratum: every row exchangeable

    def draw(self, rng: np.random.Generator) -> np.ndarray:
        """One permutation of the rows (``y[perm]`` is the permuted table), drawn from `rng`."""
        if self.plain:
            return rng.permutation(self.num_rows)
        perm = np.arange(self.num_rows)
        for rows in self.classes:
            perm[rows] = rows[rng.permutation(len(rows))]  # row t of example e <- row t of example σ(e)
        return perm

    @property
    def movable(self) -> float:
        """Share of rows that a draw can move (those of examples with a partner of equal size and stratum)."""
        return 1.0 if self.plain else sum(rows.size for rows in self.classes) / max(self.num_rows, 1)

    @property
    def log10_arrangements(self) -> float:
        """log10 of the number of distinct draws: Π over classes of (examples in the class)!."""
        sizes = [self.num_rows] if self.plain else [len(rows) for rows in self.classes]
        return sum(math.lgamma(k + 1) for k in sizes) / math.log(10)

    def check(self) -> None:
        """Refuse a null in which no row can move (a point mass at the observed value: every p-value 1)."""
        if self.movable == 0:
            raise LayersimError(f"no two examples of one stratum have the same number of rows ({self.num_rows} rows), "
                                "so a permutation of whole examples can move none of them; use more examples or "
                                "fewer strata.")

    def note(self, significance: float) -> str | None:
        """Why a p-value may not reach `significance`, or None: fewer distinct draws than ``1/significance``, or
        fewer than half the rows movable (examples whose size is unique in their stratum stay in place)."""
        if self.plain:
            return None
        share = (f"{self.movable:.0%} of the rows can move (examples, or clusters of examples sharing a text, whose "
                 "size is unique in their stratum stay put)")
        if self.log10_arrangements < math.log10(1.0 / significance):
            return (f"the block null has only {10 ** self.log10_arrangements:.0f} distinct permutations of whole "
                    f"examples, so no p-value can be below {significance}; {share}")
        return None if self.movable >= 0.5 else f"the block null has little power: only {share}"


def block_permutations(num_rows: int, groups: np.ndarray | None = None,
                       strata: np.ndarray | None = None) -> BlockPermutations:
    """The exchangeability blocks of `num_rows` rows (module docstring): `groups` the example of each row (rows
    of one example move together), `strata` the stratum of each row (examples move only within it); None: one
    example per row, one stratum.

    Raises LayersimError when either is not one value per row or when an example spans two strata."""
    group_codes = _codes(groups, num_rows, "groups")
    strata_codes = _codes(strata, num_rows, "strata")
    if group_codes is None:
        group_codes = np.arange(num_rows)
    if strata_codes is None:
        strata_codes = np.zeros(num_rows, dtype=np.int64)
    order = np.argsort(group_codes, kind="stable")  # rows of each example together, in table order
    sizes = np.bincount(group_codes)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    stratum = strata_codes[order]
    if num_rows and (np.minimum.reduceat(stratum, starts) != np.maximum.reduceat(stratum, starts)).any():
        bad = int(np.flatnonzero(np.minimum.reduceat(stratum, starts) != np.maximum.reduceat(stratum, starts))[0])
        raise LayersimError(f"example {np.unique(groups)[bad]!r} has rows in more than one stratum; an example's "
                            "rows must share one stratum (strata label examples, e.g. by task).")
    if (sizes == 1).all() and (strata_codes == strata_codes[:1]).all():
        return BlockPermutations(num_rows, (), True)
    example_stratum = stratum[starts]
    classes = []
    keys = np.stack([example_stratum, sizes], axis=1)
    unique, inverse, counts = np.unique(keys, axis=0, return_inverse=True, return_counts=True)
    for k in np.flatnonzero(counts >= 2):
        size = int(unique[k, 1])
        members = starts[np.flatnonzero(inverse.ravel() == k)]
        classes.append(order[members[:, None] + np.arange(size)[None, :]])
    return BlockPermutations(num_rows, tuple(classes), False)


def null_units(num_rows: int, groups: np.ndarray | None = None, strata: np.ndarray | None = None,
               unit: str = "example", length_classes: int = 1) -> dict:
    """What a null over these blocks moves, for the stage's records: the `unit` ("row" when every row is its own),
    how many blocks (distinct `groups`) there are, the rows, and the share of rows that can move; with coarser
    `length_classes` (> 1, :func:`length_class_rows`), the multiple, the rows the null keeps (``rows_in_null``) and
    the share of all rows that can move (``movable``) beside the share with exact lengths (``movable_exact``)."""
    blocks = block_permutations(num_rows, groups, strata)
    count = num_rows if groups is None else len(np.unique(groups))
    found = {"unit": "row" if blocks.plain else unit, "blocks": int(count), "rows": int(num_rows),
             "movable": round(float(blocks.movable), 4)}
    if length_classes == 1 or blocks.plain:
        return found
    kept = length_class_rows(groups, length_classes)
    coarse = block_permutations(len(kept), np.asarray(groups)[kept],
                                None if strata is None else np.asarray(strata)[kept])
    return found | {"length_classes": int(length_classes), "rows_in_null": int(len(kept)),
                    "movable_exact": found["movable"],
                    "movable": round(float(coarse.movable * len(kept) / max(num_rows, 1)), 4)}


def length_class_rows(groups: np.ndarray, multiple: int) -> np.ndarray:
    """Rows (in table order) kept when each block of `groups` is cut to a multiple of `multiple` rows, its first rows
    kept (a block shorter than `multiple` leaves entirely): coarser length classes. Blocks whose lengths differ by
    less than `multiple` then share a class and can be exchanged (similarity.length_classes).

    What this assumes: a block null exchanges blocks of equal size, row t for row t. Cut to a common length, a block
    of 23 words and one of 27 are exchanged on their first 20, which is exact when, under H0, the first rows of a block
    are drawn alike whatever its full length; the words near a sentence's end (which a longer one has further on)
    make that an approximation. The rows left out are out of the null *and* of the value its p-value is compared
    with (computed on the kept rows, as for a streamed table's sample), so the test is of the kept rows."""
    codes = _codes(groups, len(groups), "groups")
    if multiple < 1:
        raise LayersimError(f"length classes need a positive multiple of rows, got {multiple}.")
    order = np.argsort(codes, kind="stable")
    sizes = np.bincount(codes)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    position = np.empty(len(codes), dtype=np.int64)  # each row's place within its block, in table order
    position[order] = np.arange(len(codes)) - np.repeat(starts, sizes)
    return np.flatnonzero(position < (sizes // multiple * multiple)[codes])


def example_sample(groups: np.ndarray, max_rows: int, seed: int) -> np.ndarray:
    """Rows (in table order) of whole examples drawn uniformly at random without replacement
    (``np.random.default_rng(seed)``) while their rows add up to at most `max_rows`: the in-memory sample a
    streamed table's block null is computed on (its observed values too, so its p-values are exact)."""
    codes = _codes(groups, len(groups), "groups")
    sizes = np.bincount(codes)
    order = np.random.default_rng(seed).permutation(len(sizes))
    return np.flatnonzero(np.isin(codes, order[np.cumsum(sizes[order]) <= max_rows]))


def unmovable(num_rows: int, groups: np.ndarray | None = None, strata: np.ndarray | None = None) -> str | None:
    """Why these blocks give no null (no row can move), or None; for stages, which report it instead of failing."""
    try:
        block_permutations(num_rows, groups, strata).check()
    except LayersimError as error:
        return str(error).rstrip(".")
    return None


def _codes(labels, num_rows: int, what: str) -> np.ndarray | None:
    """0-based integer codes of one label per row, or None."""
    if labels is None:
        return None
    labels = np.asarray(labels)
    if labels.shape != (num_rows,):
        raise LayersimError(f"{what} must hold one label per row, shape ({num_rows},); got shape {labels.shape}.")
    return np.unique(labels, return_inverse=True)[1].ravel().astype(np.int64)
