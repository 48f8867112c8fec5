"""Bootstrap confidence intervals over examples for a measure's values on pairs of layers.

A similarity computed on n examples is an estimate: another draw of n examples from the same task would
give another value. Resampling the examples with replacement (Efron & Tibshirani 1993, ch. 13) and
recomputing the measure gives its sampling distribution. Rows that are
not independent (the words of one sentence) are resampled together: pass their example id as ``groups``
and whole examples are drawn (a cluster bootstrap), so the interval is not too narrow.

The interval (``interval=``): ``"basic"`` (pivotal), ``[2θ̂ − q_hi, 2θ̂ − q_lo]`` with ``q`` the resampled
values' quantiles (Davison & Hinkley 1997, §5.2); ``"percentile"``, ``[q_lo, q_hi]``; ``"bca"``, bias-corrected
and accelerated (Efron 1987), the quantiles at levels moved by ``z0`` (where the estimate sits among the
resamples) and ``a`` (their skewness, from a delete-block jackknife of :data:`JACKKNIFE_BLOCKS` blocks of whole
groups: a block's influence sums its rows', so ``a`` is the delete-one formula's at ~10% of 200 resamples).
``"auto"`` (the default) is the method :data:`AUTO_INTERVAL` names for the measure, from a measured coverage
of the population value (``benchmarks/bootstrap.py --coverage``; a measure's value on 200,000 rows of the
review's population, 64 wide, 1/k spectrum, Y = X·A + 0.3·noise; n = 300, 200 resamples, 95%; the table with
every measure is in docs/reading-the-numbers.md, "Interval coverage"). Where no method covered within
:data:`COVERED` (0.85–0.99), "auto" gives no interval: NaN bounds, ``method`` "none" and ``note`` saying why
(the resamples are still drawn). Linear CKA, 1,000 repeats: basic 0.885 ± 0.010 (the resamples' upward bias,
~63% distinct rows, about matches the estimate's, which basic subtracts), percentile 0.50, BCa 0.74: the
0.95 once claimed here was wrong, the statistics review's 0.87 / 0.89 right. The CCA measures with their
default cap ``⌊(n − 1)/10⌋`` (29 at n = 300): the estimate is biased *down* (0.587 against SVCCA's 0.597) while
resamples come out ~0.03 *higher* (CCA overfits the fewer distinct rows), five times the resamples' spread,
so no method covers (SVCCA: basic 0.01, percentile 0.03, BCa 0.01; PWCCA 0.00 / 0.00 / 0.01).
``BootstrapResult.method`` says which made each result.

k-NN Jaccard, RSA and the neighbourhood measures of :mod:`~layersim.similarity.knn_measures` compare pairs of
rows, and a resample's copies of one example agree in every layer (distance 0): :func:`resampled_options` tells
them which source row each resampled row copies (whole examples' rows, with ``groups``), and they leave copies out
(:mod:`~layersim.similarity.neighbours`, :mod:`~layersim.similarity.rsa`); their values on all rows are
unchanged. With ``groups`` a drawn cluster's rows meet its cluster-mates once per draw: the neighbourhood measures
are also told each row's draw (:func:`resample_draws`) and leave the cluster's other draws out of its neighbours
(:class:`~layersim.similarity.neighbours.Copies`).

Every interval contains ``centre``, the bias-corrected value it is built around (basic: ``2θ̂ − median``;
percentile: the median; BCa: the quantile at ``Φ(z0 + z0/(1 − a·z0))``); report it beside the interval. The
estimate itself lies inside unless nearly all resamples fall on one side of it (for every method: the estimate
beyond the resamples' ``(1 ± level)/2`` quantiles), i.e. the bootstrap finds a bias larger than the spread;
``excludes_estimate`` flags it (RBF CKA at n = 300: 87% of basic intervals), and ``plots.diagonal_curves``
marks it.

The CCA measures cap their dimensions at ``⌊(n − 1)/10⌋`` by default (``max_dims="auto"``), a cap that moves
with the row count; the bootstrap pins it at the full sample's value, so every resample (a cluster
bootstrap's resamples have other row counts) and jackknife subsample estimates the same quantity. An SVCCA
interval therefore targets the population's SVCCA *with that cap* (k = ⌊(n − 1)/10⌋ top principal components
per side), not its uncapped SVCCA, which a different n would move.

The interval says how sure the value is, not whether it beats chance: that is the permutation null's job
(:mod:`layersim.similarity.inference.null`). :func:`bootstrap_matrix` (:mod:`~layersim.similarity.inference.bootstrap_matrix`)
gives every cell of a layer × layer matrix its interval.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr, ndtri

from layersim.errors import LayersimError, unknown_name
from layersim.similarity._cca_core import CAPPED_MEASURES, dimension_cap
from layersim.compute.threads import on_threads
from layersim.similarity._common import blas_threads_for, check_options, small_products
from layersim.similarity.attention import HEAD_MEASURE_BOUNDS, HEAD_MEASURES
from layersim.similarity.inference._null_engines import ENGINES
from layersim.similarity.cka import is_constant
from layersim.similarity.registry import get_measure
from layersim.similarity.inference.interval_choice import (  # noqa: F401  (re-exported: auto's table, read here)
    AUTO_INTERVAL, CLAIM_DRAWS, COVERED, MEASURED_COVERAGE, NOMINAL, NOT_MEASURED, chosen_interval, covering_method,
    no_interval_note)

INTERVALS = ("auto", "basic", "percentile", "bca")

# Delete-block jackknife for BCa's acceleration: 20 recomputations (10% of 200 resamples) estimate the
# skewness about as well as n would for the size of correction it makes (a is ~0.01–0.05 here).
JACKKNIFE_BLOCKS = 20


@dataclass(frozen=True)
class BootstrapResult:
    """Per pair k (per cell [i, j] from :func:`bootstrap_matrix`): the value on all rows, and its ``level``
    bootstrap interval made by ``method`` (one of :data:`INTERVALS`), built around ``centre``."""

    estimate: np.ndarray  # (pairs,) or (x layers, y layers)
    low: np.ndarray
    high: np.ndarray
    resamples: int
    level: float
    values: np.ndarray | None = None  # (resamples, ...): the measure on each resample (NaN: undefined)
    method: str = "basic"  # "none": "auto" has no measured method for this measure (see `note`)
    centre: np.ndarray | None = None  # the bias-corrected value the interval contains (see the module doc)
    note: str | None = None  # why there is no interval (low, high and centre NaN), when there is none

    @property
    def excludes_estimate(self) -> np.ndarray:
        """Where the interval lies beside the estimate (nearly all resamples on one side of it)."""
        with np.errstate(invalid="ignore"):
            return (self.estimate < self.low) | (self.estimate > self.high)


def resample_rows(num_rows: int, resamples: int, seed: int, groups: np.ndarray | None = None) -> list[np.ndarray]:
    """Row indices of each bootstrap resample: rows drawn with replacement, or whole groups of rows (all
    rows sharing a ``groups`` value) drawn with replacement. Drawn from ``np.random.default_rng(seed)``."""
    rng = np.random.default_rng(seed)
    if groups is None:
        return [rng.integers(0, num_rows, num_rows) for _ in range(resamples)]
    members = _group_members(num_rows, groups)
    return [np.concatenate([members[g] for g in rng.integers(0, len(members), len(members))])
            for _ in range(resamples)]


def jackknife_rows(num_rows: int, seed: int, groups: np.ndarray | None = None,
                   blocks: int = JACKKNIFE_BLOCKS) -> list[np.ndarray]:
    """Row indices of each delete-block jackknife subsample: the groups (or rows) dealt at random into
    ``blocks`` blocks of near-equal size, each subsample all rows but one block's. A stream of its own
    (``seed`` with a tag), so the bootstrap resamples stay those of :func:`resample_rows`."""
    members = [np.array([r]) for r in range(num_rows)] if groups is None else _group_members(num_rows, groups)
    order = np.random.default_rng([seed, 0x4A4B]).permutation(len(members))
    dealt = np.array_split(order, min(blocks, len(members)))
    block_of_row = np.empty(num_rows, dtype=np.int64)
    for b, chosen in enumerate(dealt):
        for g in chosen:
            block_of_row[members[g]] = b
    return [np.flatnonzero(block_of_row != b) for b in range(len(dealt))]


def _group_members(num_rows: int, groups: np.ndarray) -> list[np.ndarray]:
    groups = np.asarray(groups)
    if groups.shape != (num_rows,):
        raise LayersimError(f"bootstrap groups have shape {groups.shape}; expected one group id per row, ({num_rows},).")
    _, inverse = np.unique(groups, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    return np.split(order, np.cumsum(np.bincount(inverse))[:-1])


def check_arguments(name: str, options: dict, resamples: int, level: float,
                    interval: str) -> tuple[dict, str | None]:
    """Validate before any work; return the measure's options and the interval method "auto" resolves to
    (None: no interval; the resamples are still drawn, for callers that use their values)."""
    check_options(name, options, () if name in HEAD_MEASURES else get_measure(name).options)
    if not (isinstance(resamples, (int, np.integer)) and resamples >= 2):
        raise LayersimError(f"resamples = {resamples!r} is invalid; it must be an integer of at least 2.")
    if not (isinstance(level, (int, float)) and 0 < level < 1):
        raise LayersimError(f"level = {level!r} is invalid; it must be a number in (0, 1).")
    if interval not in INTERVALS:
        raise unknown_name("bootstrap interval", interval, INTERVALS)
    return dict(options), chosen_interval(name, interval)


def fixed_cap(name: str, options: dict, num_rows: int) -> dict:
    """The options with a CCA measure's ``max_dims="auto"`` replaced by its value on all ``num_rows`` rows,
    so resamples and jackknife subsamples (other row counts) keep the full sample's cap."""
    if name in CAPPED_MEASURES and options.get("max_dims", "auto") == "auto":
        return {**options, "max_dims": dimension_cap(num_rows)}
    return options


def bootstrap_pairs(name: str, xs: Sequence[np.ndarray], ys: Sequence[np.ndarray], *, resamples: int = 200,
                    seed: int = 0, groups: np.ndarray | None = None, level: float = 0.95, interval: str = "auto",
                    **options) -> BootstrapResult:
    """Bootstrap interval (``interval``: "auto", "basic", "percentile" or "bca") of ``similarity(name, xs[k], ys[k])``
    for every pair k.

    Every pair is computed on the same resamples, so intervals of different layers are comparable. Each
    distinct layer (the same array object may appear in several pairs) is prepared once per resample,
    as the measure's matrix does (:mod:`layersim.similarity.inference._null_engines`). A resample on which the
    measure is undefined (e.g. a layer left constant) counts as NaN and is left out of the percentiles;
    a pair undefined on all rows gets NaN throughout. BCa also computes the pairs on
    :data:`JACKKNIFE_BLOCKS` jackknife subsamples.
    """
    options, interval = check_arguments(name, options, resamples, level, interval)
    if len(xs) != len(ys) or not len(xs):
        raise LayersimError(f"bootstrap_pairs needs as many x layers as y layers (got {len(xs)} and {len(ys)}), "
                            "at least one.")
    num_rows = len(xs[0])
    if any(len(a) != num_rows for a in (*xs, *ys)):
        raise LayersimError("bootstrap_pairs needs every layer on the same examples (the same number of rows).")
    if groups is not None:
        _group_members(num_rows, groups)  # refused before any work
    options = fixed_cap(name, options, num_rows)
    layers, pairs = _distinct_layers(xs, ys)
    defined = [k for k, (i, j) in enumerate(pairs) if not (is_constant(layers[i]) or is_constant(layers[j]))]
    chosen = [pairs[k] for k in defined]

    def on_rows(row_sets: list[np.ndarray]) -> np.ndarray:
        def values(r: int) -> np.ndarray:
            return _pair_values(name, resampled(name, layers, row_sets[r]), chosen,
                                resampled_options(name, options, row_sets[r], groups))

        # Small products: the resamples side by side, each on one thread (layersim.compute.threads), as one BLAS
        # thread would compute them in turn; large ones: in turn, on BLAS's threads.
        found = (on_threads(values, range(len(row_sets))) if small else
                 {r: values(r) for r in range(len(row_sets))})
        out = np.full((len(row_sets), len(pairs)), np.nan)
        for r, found_values in found.items():
            out[r, defined] = found_values
        return out

    estimate = np.full(len(pairs), np.nan)
    estimate[defined] = _pair_values(name, layers, chosen, options)
    small = small_products(num_rows, max(a.shape[1] for a in layers))
    with blas_threads_for(num_rows, max(a.shape[1] for a in layers)):
        values = on_rows(resample_rows(num_rows, resamples, seed, groups))
        jackknife = on_rows(jackknife_rows(num_rows, seed, groups)) if interval == "bca" else None
    return finish(name, estimate, values, jackknife, level, interval)


# Measures of inner products of centred columns, unchanged by an orthogonal map of the rows.
ROW_ROTATION_INVARIANT = frozenset({"linear_cka", "svcca", "pwcca", "mean_cca", "neuronsim"})


# Measures that compare pairs of rows: a row and its copy (distance 0 in every layer) would agree by construction,
# so on a resample they are told which source row each row copies (``sources``) and leave copies out.
COPY_AWARE = frozenset({"knn_jaccard", "rsa", "mutual_knn", "rank_similarity", "second_order_cosine", "cknna"})


# Of those, the neighbourhood measures: a cluster drawn twice would give each of its rows its cluster-mates twice
# among its nearest, in both layers, so they are also told each row's draw (``draws``) and leave the cluster's other
# draws out (layersim.similarity.neighbours.Copies). Issue 63's "clusters above the example".
DRAW_AWARE = frozenset({"knn_jaccard", "mutual_knn", "rank_similarity", "second_order_cosine", "cknna"})


def resampled_options(name: str, options: dict, rows: np.ndarray, groups: np.ndarray | None = None) -> dict:
    """The measure's options on the resample of ``rows`` (row indices into the sample, repeated for copies;
    whole groups' rows when resampled by ``groups``): for :data:`COPY_AWARE` measures ``sources=rows``, so
    copies of one row, in one drawn group or in two copies of it, are never compared with each other; for
    :data:`DRAW_AWARE` ones with ``groups``, also ``draws`` (:func:`resample_draws`)."""
    if name not in COPY_AWARE:
        return options
    out = {**options, "sources": np.asarray(rows)}
    if name in DRAW_AWARE and groups is not None:
        out["draws"] = resample_draws(rows, groups)
    return out


def resample_draws(rows: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Which draw of a cluster bootstrap each resampled row came from: the ``c``-th copies of a group's rows are its
    ``c``-th draw (a whole copy of the group, whatever the rows' order: :func:`resample_rows` keeps draws together,
    a matrix's resample, rebuilt from counts, sorts the rows)."""
    rows = np.asarray(rows)
    order = np.argsort(rows, kind="stable")
    ordered = rows[order]
    starts = np.ones(len(rows), dtype=bool)
    starts[1:] = ordered[1:] != ordered[:-1]
    place = np.arange(len(rows))
    copy = np.empty(len(rows), dtype=np.int64)
    copy[order] = place - np.maximum.accumulate(np.where(starts, place, 0))
    codes = np.unique(np.asarray(groups), return_inverse=True)[1].reshape(-1)
    return codes[rows] * (int(copy.max(initial=0)) + 1) + copy


def resampled(name: str, layers: Sequence[np.ndarray], rows: np.ndarray) -> list[np.ndarray]:
    """The layers on the resampled ``rows``: ``a[rows]``, or for a measure in :data:`ROW_ROTATION_INVARIANT`
    the same measure on ~63% as many rows. Row ``a`` drawn ``w_a`` times adds ``w_a x_a x_aᵀ`` to every
    centred cross-product, as the row ``√w_a (x_a − μ_w)`` does once; those rows are orthogonal to ``√w``, so
    the Householder reflection taking ``√w/‖√w‖`` to ``1/√m`` makes their column means 0 (the measure's own
    centring then changes nothing) and keeps every cross-product. SVCCA's whitening SVDs shrink with the rows."""
    if name not in ROW_ROTATION_INVARIANT:
        return [a[rows] for a in layers]
    drawn, counts = np.unique(rows, return_counts=True)
    roots = np.sqrt(counts.astype(np.float64))
    v = roots / np.linalg.norm(roots) - 1 / np.sqrt(len(drawn))
    norm = v @ v
    out = []
    for a in layers:
        part = np.asarray(a[drawn], dtype=np.float64)
        b = (part - counts @ part / len(rows)) * roots[:, None]
        out.append(b if norm < 1e-24 else b - np.outer(v, (2 / norm) * (v @ b)))
    return out


def finish(name: str, estimate: np.ndarray, values: np.ndarray, jackknife: np.ndarray | None, level: float,
           interval: str | None) -> BootstrapResult:
    """The result from the estimates, the resamples' values (resamples, ...) and, for BCa, the jackknife's;
    ``interval`` None: NaN bounds and the note saying why."""
    shape = estimate.shape
    if interval is None:
        nan = np.full(shape, np.nan)
        return BootstrapResult(estimate, nan, nan.copy(), len(values), level, values, "none", nan.copy(),
                               no_interval_note(name))
    flat = values.reshape(len(values), -1)
    jack = None if jackknife is None else jackknife.reshape(len(jackknife), -1)
    low, high, centre = (np.full(flat.shape[1], np.nan) for _ in range(3))
    for k in range(flat.shape[1]):
        finite = flat[np.isfinite(flat[:, k]), k]
        if len(finite) and np.isfinite(estimate.flat[k]):
            low[k], high[k], centre[k] = interval_of(estimate.flat[k], finite, None if jack is None else jack[:, k],
                                                     level, interval)
    bounded = HEAD_MEASURE_BOUNDS[name] if name in HEAD_MEASURES else get_measure(name).bounded
    if bounded is not None:
        low, high, centre = (np.clip(v, *bounded) for v in (low, high, centre))
    return BootstrapResult(estimate, low.reshape(shape), high.reshape(shape), len(values), level, values, interval,
                           centre.reshape(shape))


def interval_of(estimate: float, values: np.ndarray, jackknife: np.ndarray | None, level: float,
                interval: str) -> tuple[float, float, float]:
    """(low, high, centre) of one value from its finite resampled values (see the module docstring)."""
    tail = (1 - level) / 2
    if interval == "percentile":
        low, high, centre = np.quantile(values, [tail, 1 - tail, 0.5])
        return low, high, centre
    if interval == "basic":
        q_low, q_high, median = np.quantile(values, [tail, 1 - tail, 0.5])
        return 2 * estimate - q_high, 2 * estimate - q_low, 2 * estimate - median
    # Ties count half, so a measure exact on every resample (all equal) gets z0 = 0; the share is kept
    # off 0 and 1 so z0 stays finite when the estimate is beyond every resample.
    share = (np.sum(values < estimate) + 0.5 * np.sum(values == estimate)) / len(values)
    z0 = ndtri(np.clip(share, 0.5 / len(values), 1 - 0.5 / len(values)))
    z = np.array([ndtri(tail), ndtri(1 - tail), 0.0])
    shifted = z0 + z
    denominator = 1 - acceleration(jackknife) * shifted
    # A denominator ≤ 0 (|a| ≳ 0.3, far beyond these measures') would wrap the level around: take the end.
    levels = np.where(denominator > 0, ndtr(z0 + shifted / np.maximum(denominator, 1e-12)), (z > 0) * 1.0)
    low, high, centre = np.quantile(values, levels)
    return low, high, centre


def acceleration(jackknife: np.ndarray | None) -> float:
    """BCa's ``a`` from jackknife values: ``Σ d³ / (6 (Σ d²)^1.5)``, ``d`` each value's distance below their
    mean (0 when fewer than 3 are defined or they are all equal)."""
    if jackknife is None:
        return 0.0
    finite = jackknife[np.isfinite(jackknife)]
    d = finite.mean() - finite if len(finite) >= 3 else np.zeros(1)
    spread = np.sum(d * d)
    return float(np.sum(d ** 3) / (6 * spread ** 1.5)) if spread > 0 else 0.0


def _distinct_layers(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray]) -> tuple[list[np.ndarray], list[tuple]]:
    """The distinct layer arrays (by identity) and each pair as (index of x, index of y) among them."""
    layers, index = [], {}
    for a in (*xs, *ys):
        if id(a) not in index:
            index[id(a)] = len(layers)
            layers.append(a)
    return layers, [(index[id(x)], index[id(y)]) for x, y in zip(xs, ys)]


def _pair_values(name: str, layers: list[np.ndarray], pairs: list[tuple[int, int]], options: dict) -> np.ndarray:
    """The measure on each pair of `layers`, every layer's statistics computed once; NaN for every pair
    when some layer is undefined on these rows (then pair by pair, so only its own pairs are NaN)."""
    if not pairs:
        return np.zeros(0)
    used = sorted({i for pair in pairs for i in pair})
    position = {i: k for k, i in enumerate(used)}
    cells = np.zeros((len(used), len(used)), dtype=bool)
    for i, j in pairs:
        cells[position[i], position[j]] = True
    named = [(f"layer {i}", layers[i]) for i in used]
    try:
        matrix = ENGINES[name](named, None, cells, **options).values(None)
    except LayersimError:
        return np.array([_value(name, layers[i], layers[j], options) for i, j in pairs])
    return np.array([matrix[position[i], position[j]] for i, j in pairs])


def _value(name: str, x: np.ndarray, y: np.ndarray, options: dict) -> float:
    """The measure, or NaN where it is undefined: a layer that is the same on every (resampled) row. The
    options were checked by :func:`check_arguments`; ``sources`` (:func:`resampled_options`) is not a user's."""
    if is_constant(x) or is_constant(y):
        return float("nan")
    return float(get_measure(name).pair(x, y, **options))
