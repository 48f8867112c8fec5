"""Attention-level similarities (Wu et al. 2020, §3.4–3.5 and Appendix A.4).

One layer's attention over a corpus is an :class:`AttentionMaps`: for every example and every query
unit a distribution over the example's key units, per head. Units are words, as Wu et al. compare them
(the extract stage's default, ``extract.attention_unit: words``: attention to a word summed over its
sub-words, attention from a word averaged over them, following Clark et al. 2019; each special token a unit
of its own; :func:`layersim.data.words.word_attention`), or the model's tokens. They are stored flat:

* ``weights`` — float array ``(num_pairs, heads)``, one row per (example, query, key) pair;
* ``row_starts`` — int64 ``(num_rows,)``, the index into ``weights`` where each *attention row*
  (one (example, query) distribution over keys) begins; rows are contiguous, in order, and a row
  runs to the next row's start (the last to ``num_pairs``). Each row sums to 1 for every head;
* ``example_starts`` — optional int64 ``(num_examples,)``, the row where each example begins.
  When absent, examples are taken to be square maps: an example whose rows have ``t`` keys has
  ``t`` rows (what :meth:`AttentionMaps.from_maps` builds always records it explicitly).

**Head-level measures** (localised, like neuronsim): a similarity ``Sim(h, h')`` between every head
``h`` of layer A and head ``h'`` of layer B, then ``sim(A, B) = mean_h max_h' Sim(h, h')``, averaged
over A's heads — asymmetric, and invariant to permuting either layer's heads. ``Sim`` is one of:

* ``"matrix_norm"``: ``1 - mean over examples of ||A_e[h] - B_e[h']||_F``, the Frobenius norm of
  the difference of the two heads' ``t x t`` attention matrices of example ``e`` (Wu et al.'s
  matrix-norm measure; "1 -" turns the distance into a similarity as their code does). At most 1
  (identical heads); unbounded below — each row contributes at most ``√2`` to the norm, so an
  example of length ``t`` can reach ``√(2t)``;
* ``"pearson"``: the mean over attention rows of the Pearson correlation of the two distributions
  over keys. A row where either head is constant (uniform, or a single key) has no correlation and
  is left out of that head pair's mean (Wu et al.'s code counts rows of one key as 0 and lets
  uniform rows produce NaN); in [-1, 1];
* ``"jensen_shannon"``: ``1 - mean over rows of JS(p, q)``, with ``JS = ½ KL(p‖m) + ½ KL(q‖m)``, ``m = (p + q)/2``,
  in **bits** (log base 2), so JS and the similarity are in [0, 1] (Wu et al.'s natural logs give [1 - ln 2, 1]).

Each is a ratio of sums over examples (:func:`example_terms`; JS one pass per head of B using ``JS = H(m) - ½H(p) -
½H(q)``), so a null or a bootstrap over whole examples re-pairs or re-weights them (layersim.similarity.inference).

**Distributed measures** (§3.5): the ``(num_pairs, heads)`` weights are a representation with (query, key) pairs as
points and heads as features, compared with any measure of :data:`layersim.similarity.MEASURES` (Wu et al. use
``linear_cka``, ``svcca``, ``pwcca``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import entr

from layersim.errors import LayersimError, unknown_name
from layersim.similarity._common import CONSTANT_RTOL, as_list, check_options
from layersim.similarity._pairs import fill_matrix

HEAD_MEASURES = ("jensen_shannon", "matrix_norm", "pearson")
# Each head measure's range (the matrix norm's similarity is 1 − a mean Frobenius distance: no lower bound).
HEAD_MEASURE_BOUNDS = {"jensen_shannon": (0.0, 1.0), "matrix_norm": None, "pearson": (-1.0, 1.0)}

ROW_SUM_ATOL = 1e-3  # tolerance on each attention row's sum (float32 softmax rows are within ~1e-6 of 1)


@dataclass(frozen=True, eq=False)
class AttentionMaps:
    """One layer's attention over a corpus, flattened to (example, query, key) pairs; see the module
    docstring. Validated on construction: weights finite and ≥ 0, rows contiguous, every row of
    every head summing to 1 within ``ROW_SUM_ATOL``."""

    weights: np.ndarray
    row_starts: np.ndarray
    example_starts: np.ndarray | None = None

    def __post_init__(self) -> None:
        weights = np.asarray(self.weights)
        if weights.dtype.kind != "f" or weights.ndim != 2 or weights.shape[0] == 0 or weights.shape[1] == 0:
            raise LayersimError(
                f"attention weights must be a non-empty 2-D float (num_pairs x heads) array, "
                f"got dtype {weights.dtype} and shape {weights.shape}."
            )
        if not np.isfinite(weights).all() or (weights < 0).any():
            raise LayersimError("attention weights must be finite and non-negative.")
        row_starts = _starts(self.row_starts, weights.shape[0], "row_starts", "pairs")
        sums = np.add.reduceat(weights, row_starts, axis=0, dtype=np.float64)
        off = np.abs(sums - 1.0)
        if (off > ROW_SUM_ATOL).any():
            row, head = np.unravel_index(int(off.argmax()), off.shape)
            raise LayersimError(
                f"attention row {row} of head {head} sums to {sums[row, head]:.6g}, not 1; each (example, "
                "query) row of weights must be a distribution over keys (renormalise after dropping tokens)."
            )
        example_starts = None
        if self.example_starts is not None:
            example_starts = _starts(self.example_starts, len(row_starts), "example_starts", "rows")
        object.__setattr__(self, "weights", weights)
        object.__setattr__(self, "row_starts", row_starts)
        object.__setattr__(self, "example_starts", example_starts)

    @classmethod
    def from_maps(cls, maps: Sequence[np.ndarray]) -> AttentionMaps:
        """Flatten per-example attention arrays of shape ``(heads, len, len)`` (query x key, each query
        row summing to 1), all with the same number of heads; lengths may differ between examples.

        Raises
        ------
        LayersimError
            If ``maps`` is empty, an entry is not a square 3-D float array, the head counts differ, or
            a row does not sum to 1 (the message names the entry).
        """
        maps = list(maps)
        if not maps:
            raise LayersimError("maps is empty; pass one (heads x len x len) array per example.")
        heads = None
        blocks, row_starts, example_starts = [], [], []
        offset = rows = 0
        for k, m in enumerate(maps):
            m = np.asarray(m)
            if m.ndim != 3 or m.shape[1] != m.shape[2] or m.shape[1] == 0 or m.dtype.kind != "f":
                raise LayersimError(
                    f"maps[{k}] must be a float (heads x len x len) array with len >= 1, "
                    f"got dtype {m.dtype} and shape {m.shape}."
                )
            if heads is None:
                heads = m.shape[0]
            elif m.shape[0] != heads:
                raise LayersimError(f"maps[{k}] has {m.shape[0]} heads but maps[0] has {heads}; all must match.")
            t = m.shape[1]
            sums = m.sum(axis=2, dtype=np.float64)
            if (np.abs(sums - 1.0) > ROW_SUM_ATOL).any():
                head, query = np.unravel_index(int(np.abs(sums - 1.0).argmax()), sums.shape)
                raise LayersimError(
                    f"maps[{k}] head {head} query {query} sums to {sums[head, query]:.6g}, not 1; "
                    "each query row must be a distribution over keys."
                )
            blocks.append(m.transpose(1, 2, 0).reshape(t * t, heads))
            row_starts.append(offset + t * np.arange(t, dtype=np.int64))
            example_starts.append(rows)
            offset += t * t
            rows += t
        return cls(
            np.concatenate(blocks),
            np.concatenate(row_starts),
            np.asarray(example_starts, dtype=np.int64),
        )

    @property
    def num_heads(self) -> int:
        return self.weights.shape[1]

    @property
    def num_rows(self) -> int:
        return len(self.row_starts)

    @property
    def num_pairs(self) -> int:
        return self.weights.shape[0]

    def example_layout(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per example: the pair where it begins, its pair count and its attention-row count (its map's length)."""
        rows = self.example_row_starts()
        pairs = self.row_starts[rows]
        return pairs, np.diff(np.append(pairs, self.num_pairs)), np.diff(np.append(rows, self.num_rows))

    def example_row_starts(self) -> np.ndarray:
        """The row where each example begins: ``example_starts``, or inferred from square maps."""
        if self.example_starts is not None:
            return self.example_starts
        lengths = np.diff(np.append(self.row_starts, self.num_pairs))
        starts, row = [], 0
        while row < len(lengths):
            t = int(lengths[row])
            if row + t > len(lengths) or (lengths[row : row + t] != t).any():
                raise LayersimError(
                    f"attention row {row} has {t} keys but the next {t} rows do not all have {t} keys, so the "
                    "examples cannot be inferred as square maps; pass example_starts."
                )
            starts.append(row)
            row += t
        return np.asarray(starts, dtype=np.int64)


def _starts(values, end: int, label: str, unit: str) -> np.ndarray:
    starts = np.asarray(values)
    if starts.ndim != 1 or starts.dtype.kind not in "iu" or len(starts) == 0:
        raise LayersimError(
            f"{label} must be a non-empty 1-D integer array, got dtype {starts.dtype} and shape {starts.shape}."
        )
    starts = starts.astype(np.int64, copy=False)
    if starts[0] != 0 or (np.diff(starts) <= 0).any() or starts[-1] >= end:
        raise LayersimError(
            f"{label} must start at 0 and increase strictly, each entry below the number of {unit} ({end}); "
            "empty or out-of-order segments are not allowed."
        )
    return starts


# --- per-layer statistics and head-by-head similarity ---


@dataclass(frozen=True)
class _HeadStats:
    name: str
    maps: AttentionMaps
    weights: np.ndarray  # float64 (num_pairs, heads)
    example_pairs: np.ndarray  # the pair where each example begins
    example_rows: np.ndarray  # the attention row where each example begins
    standardised: np.ndarray | None = None  # pearson: per row centred, unit norm; 0 on constant rows
    varies: np.ndarray | None = None  # pearson: (num_rows, heads), row not constant
    entropy: np.ndarray | None = None  # jensen_shannon: per example, Σ over its pairs of -w log2 w, (examples, heads)


def _head_stats(name: str, maps: AttentionMaps, measure: str) -> _HeadStats:
    if not isinstance(maps, AttentionMaps):
        raise LayersimError(f"{name} must be an AttentionMaps, got {type(maps).__name__}.")
    w = maps.weights.astype(np.float64)
    base = {"example_pairs": maps.example_layout()[0], "example_rows": maps.example_row_starts()}
    if measure == "pearson":
        lengths = np.diff(np.append(maps.row_starts, maps.num_pairs))
        means = np.add.reduceat(w, maps.row_starts, axis=0) / lengths[:, None]
        centred = w - np.repeat(means, lengths, axis=0)
        sq = np.add.reduceat(centred * centred, maps.row_starts, axis=0)
        raw = np.add.reduceat(w * w, maps.row_starts, axis=0)
        varies = sq > CONSTANT_RTOL**2 * raw
        scale = np.where(varies, 1.0 / np.sqrt(np.where(varies, sq, 1.0)), 0.0)
        centred *= np.repeat(scale, lengths, axis=0)
        never = np.flatnonzero(~varies.any(axis=0))
        if len(never):
            raise LayersimError(
                f"head {never[0]} of {name} is uniform (or has a single key) in every attention row, so its "
                "Pearson correlation with other heads is undefined."
            )
        return _HeadStats(name, maps, w, **base, standardised=centred, varies=varies)
    if measure == "jensen_shannon":
        entropy = np.add.reduceat(entr(w), base["example_pairs"], axis=0) / np.log(2.0)
        return _HeadStats(name, maps, w, **base, entropy=entropy)
    return _HeadStats(name, maps, w, **base)


def _spans(starts: np.ndarray, counts: np.ndarray, examples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The indices of `examples`' entries (``counts`` from ``starts`` each), in order, and where each run begins."""
    sizes = counts[examples]
    begins = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    return np.arange(int(sizes.sum())) + np.repeat(starts[examples] - begins, sizes), begins


def example_terms(a: _HeadStats, b: _HeadStats, measure: str, examples_a: np.ndarray | None = None,
                  examples_b: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Each head measure as a ratio of sums over examples: per example ``e`` of ``a`` paired with example ``f`` of
    ``b`` (``examples_a``/``examples_b``, of equal lengths; None: every example with itself) its numerator
    ``(heads_a, heads_b)`` and denominator, stacked over the pairs (``(k, heads_a, heads_b)`` and ``(k, 1, 1)`` or
    like the numerator). :func:`similarity_of` turns (weighted) sums of them into ``Sim``: Jensen–Shannon's
    per-pair divergences over the attention rows, Pearson's correlations over the rows where both heads vary,
    the matrix norm's distances over the examples. So a permutation of whole examples, or a bootstrap resample of
    them, only re-pairs or re-weights these terms (layersim.similarity.inference.attention_null)."""
    ha, hb = a.weights.shape[1], b.weights.shape[1]
    if examples_a is None:
        examples_a = examples_b = np.arange(len(a.example_rows))
    _, pair_counts, row_counts = a.maps.example_layout()  # a's and b's: the same examples
    (pairs_a, segments), (pairs_b, _) = (_spans(a.example_pairs, pair_counts, e) for e in (examples_a, examples_b))
    (rows_a, row_segments), (rows_b, _) = (_spans(a.example_rows, row_counts, e) for e in (examples_a, examples_b))
    k = len(examples_a)
    numerator = np.empty((k, ha, hb))
    if measure == "pearson":
        denominator = np.empty((k, ha, hb))
        sa, sb = a.standardised[pairs_a], b.standardised[pairs_b]
        va, vb = a.varies[rows_a].astype(np.float64), b.varies[rows_b].astype(np.float64)
        for g in range(hb):
            numerator[:, :, g] = np.add.reduceat(sa * sb[:, g : g + 1], segments, axis=0)
            denominator[:, :, g] = np.add.reduceat(va * vb[:, g : g + 1], row_segments, axis=0)
        return numerator, denominator
    wa, wb = a.weights[pairs_a], b.weights[pairs_b]
    if measure == "jensen_shannon":
        mixture = np.empty_like(wa)  # one buffer for every head of b: the same values as entr(0.5 * (wa + wb_g))
        for g in range(hb):
            np.multiply(np.add(wa, wb[:, g : g + 1], out=mixture), 0.5, out=mixture)
            numerator[:, :, g] = np.add.reduceat(entr(mixture, out=mixture), segments, axis=0)
        numerator /= np.log(2.0)
        numerator -= 0.5 * a.entropy[examples_a][:, :, None] + 0.5 * b.entropy[examples_b][:, None, :]
        return numerator, row_counts[examples_a].astype(np.float64)[:, None, None]
    for g in range(hb):
        diff = wa - wb[:, g : g + 1]
        numerator[:, :, g] = np.sqrt(np.add.reduceat(diff * diff, segments, axis=0))
    return numerator, np.ones((k, 1, 1))


def similarity_of(measure: str, numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """``Sim(h, h')`` from the sums of :func:`example_terms` (NaN where Pearson has no row with both heads varying)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = numerator / denominator
    if measure == "pearson":
        return np.clip(np.where(denominator > 0, ratio, np.nan), -1.0, 1.0)
    if measure == "jensen_shannon":
        return 1.0 - np.clip(ratio, 0.0, 1.0)
    return 1.0 - ratio


def layer_similarity(sim: np.ndarray) -> float:
    """``mean over a's heads of the max over b's heads`` of a head-by-head ``Sim`` (an undefined pair left out)."""
    return float(np.fmax.reduce(sim, axis=1).mean())


def _head_matrix(a: _HeadStats, b: _HeadStats, measure: str) -> np.ndarray:
    """Sim(h, h') for every head h of a and h' of b, (heads_a, heads_b)."""
    if not np.array_equal(a.maps.row_starts, b.maps.row_starts):
        raise LayersimError(
            f"{a.name} and {b.name} do not cover the same (example, query, key) pairs (their row_starts differ); "
            "compare attention over the same examples."
        )
    if not np.array_equal(a.example_rows, b.example_rows):
        raise LayersimError(f"{a.name} and {b.name} split the attention rows into different examples.")
    numerator, denominator = example_terms(a, b, measure)
    sim = similarity_of(measure, numerator.sum(axis=0), denominator.sum(axis=0))
    if measure == "pearson" and np.isnan(sim).any():
        h, g = np.argwhere(np.isnan(sim))[0]
        raise LayersimError(
            f"head {h} of {a.name} and head {g} of {b.name} are never both non-uniform in the same row, so "
            "their Pearson correlation is undefined."
        )
    return sim


def _check_measure(measure: str) -> None:
    if measure not in HEAD_MEASURES:
        raise unknown_name("head similarity measure", measure, HEAD_MEASURES)


def head_similarities(a: AttentionMaps, b: AttentionMaps, measure: str = "jensen_shannon") -> np.ndarray:
    """``Sim(h, h')`` for every head ``h`` of ``a`` and ``h'`` of ``b``: a ``(heads_a, heads_b)`` array.

    Parameters
    ----------
    a, b : attention of two layers over the same examples (identical ``row_starts``).
    measure : ``"jensen_shannon"``, ``"pearson"`` or ``"matrix_norm"`` (see the module docstring).

    Raises
    ------
    LayersimError
        For an unknown measure, maps over different pairs, or (Pearson) a head that is uniform in
        every row.
    """
    _check_measure(measure)
    return _head_matrix(_head_stats("a", a, measure), _head_stats("b", b, measure), measure)


def attention_similarity(a: AttentionMaps, b: AttentionMaps, measure: str = "jensen_shannon", **options) -> float:
    """Similarity of layer ``a``'s attention to layer ``b``'s.

    ``measure`` is a head-level measure (:data:`HEAD_MEASURES`): ``mean over a's heads of the max over
    b's heads of Sim`` — asymmetric, invariant to permuting heads, 1 when every head of ``a`` has an
    identical head in ``b`` (0 for Jensen–Shannon identical distributions means distance 0, similarity 1);
    or the name of an array measure (:data:`layersim.similarity.MEASURES`), applied to the
    ``(num_pairs, heads)`` weights with heads as features (distributed attention similarity).
    """
    return float(attention_similarity_matrix(measure, [a], [b], **options)[0, 0])


def attention_similarity_matrix(
    measure: str, xs: Sequence[AttentionMaps], ys: Sequence[AttentionMaps] | None = None, **options
) -> np.ndarray:
    """All-pairs attention similarity: [i, j] = ``attention_similarity(xs[i], ys[j], measure)``.

    ys=None compares ``xs`` with itself (diagonal exactly 1). Head-level measures build each layer's
    statistics once and get both directions of a pair from one head-by-head matrix; array measures
    go through :func:`layersim.similarity.similarity_matrix` on the weights (options passed on).

    Raises
    ------
    LayersimError
        For an unknown measure or option, layers over different (example, query, key) pairs, and the
        errors of the chosen measure.
    """
    from layersim.similarity.registry import MEASURES, similarity_matrix

    for name, given in (("xs", xs), ("ys", ys)):
        if isinstance(given, AttentionMaps):  # one layer's maps where the layers' list was meant
            raise LayersimError(f"{name} must be a sequence of AttentionMaps, one per layer, got one AttentionMaps; "
                                "wrap it in a list.")
    xs = as_list(xs, "xs")
    ys = None if ys is None else as_list(ys, "ys")
    x_named = [(f"xs[{i}]", m) for i, m in enumerate(xs)]
    y_named = None if ys is None else [(f"ys[{j}]", m) for j, m in enumerate(ys)]
    for name, m in x_named + (y_named or []):
        if not isinstance(m, AttentionMaps):
            raise LayersimError(f"{name} must be an AttentionMaps, got {type(m).__name__}.")
        if not np.array_equal(m.row_starts, x_named[0][1].row_starts):
            raise LayersimError(
                f"{name} and xs[0] do not cover the same (example, query, key) pairs (their row_starts differ); "
                "compare attention over the same examples."
            )
    if measure in MEASURES:
        return similarity_matrix(
            measure, [m.weights for m in xs], None if ys is None else [m.weights for m in ys], **options
        )
    if measure not in HEAD_MEASURES:
        raise unknown_name("attention similarity measure", measure, HEAD_MEASURES + tuple(MEASURES))
    check_options(measure, options, ())
    sx = [_head_stats(name, m, measure) for name, m in x_named]
    sy = None if y_named is None else [_head_stats(name, m, measure) for name, m in y_named]

    def both(a: _HeadStats, b: _HeadStats) -> tuple[float, float]:
        sim = _head_matrix(a, b, measure)
        return layer_similarity(sim), layer_similarity(sim.T)

    return fill_matrix(sx, sy, lambda a, b: both(a, b)[0], symmetric=False, pair_both=both)
