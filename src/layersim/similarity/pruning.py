"""Layer-pruning measures: which layers a similarity measure predicts can be dropped.

Two published rules, both Phang et al.'s skip experiment predicted from similarity alone:

* **Block Influence** (ShortGPT; Men et al. 2024): ``BI_k = 1 − E[cos(x_{k−1}, x_k)]`` for layer ``k``
  (1-based), where ``x_{k−1}`` is the layer's input (``layer_{k−1}``, embeddings for ``k = 1``) and ``x_k``
  its output, averaged over rows (tokens or examples). ShortGPT drops the ``n`` layers with the lowest BI,
  contiguous or not.
* **Angular distance** (Gromov et al. 2024): ``d(l, n) = arccos(cos(x_l, x_{l+n})) / π`` averaged over rows,
  for ``l = 0 … L − n``; they drop the ``n`` consecutive layers ``l+1 … l+n`` with the smallest ``d(l, n)``.

Inputs are the layers ``[layer_0 (embeddings), layer_1, …, layer_L]`` of one model as ``(rows x hidden)``
arrays with the same rows in the same order. Spans are 1-based and inclusive, ``(first, last)``, as in
:func:`layersim.models.encoders.all_spans` and the skip stage: skipping span ``(i, j)`` feeds
``layer_{i−1}`` into layer ``j + 1``, so its angular distance is ``d`` between ``layer_{i−1}`` and
``layer_j`` and its Block Influence sum is ``BI_i + … + BI_j``.

Which rows: whatever rows are passed. The stages read what the extract stage wrote as the papers define them
(:func:`measures_from_record`; layersim.experiments.pruning_states): Block Influence over every non-pad token,
special tokens included, and angles on the one token per sequence the head reads, each layer at its block's
output; ``influence`` then holds BI beside the per-sequence pairs.

Rows without an angle: a row that is all zeros in either of two layers has no direction, so it is left out
of that pair's means (the other pairs keep it); a pair left with no rows is NaN. Non-finite inputs are
refused. Angles come from Kahan's ``2·atan2(|â − b̂|, |â + b̂|)`` on unit rows, exact at 0 and π where
``arccos`` of a rounded cosine is not (``arccos(1 − 1e-16)`` is 1.5e-8, not 0), and
``1 − cos = |â − b̂|² / 2``. Everything is accumulated in float64 over row chunks
(:class:`PruningAccumulator`), so a word-point table larger than memory can be streamed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from layersim.compute.angles import LayerAngleSums
from layersim.errors import LayersimError
from layersim.similarity._common import as_list

MIN_SPANS_FOR_RANK = 3  # Spearman over 2 points is ±1 whatever the data: fewer than 3 spans give NaN
RANDOM_LAYER_DRAWS = 1000  # draws of the random-layer baseline: its mean to about ±0.005, its 95 % range to ±0.02

Span = tuple[int, int]


@dataclass(frozen=True)
class PruningMeasures:
    """Row means between every pair of layers ``a, b`` in ``0 … num_layers`` (symmetric matrices).

    ``angular``: mean ``arccos(cos)/π``; ``cosine_distance``: mean ``1 − cos``; ``rows``: how many rows
    had an angle (neither vector zero). Diagonals are 0 (a layer against itself). ``influence``: Block
    Influence of layers 1 … L averaged over other rows than the pairs' (the extract stage's: every token, where
    the pairs have one row per sequence, :func:`measures_from_record`); None: from ``cosine_distance``."""

    angular: np.ndarray
    cosine_distance: np.ndarray
    rows: np.ndarray
    influence: np.ndarray | None = None

    @property
    def num_layers(self) -> int:
        return self.angular.shape[0] - 1

    def block_influence(self) -> np.ndarray:
        """``BI`` of layers 1 … L: entry ``k − 1`` is layer ``k``'s (input layer_{k−1}, output layer_k)."""
        if self.influence is not None:
            return np.asarray(self.influence, dtype=float)
        return np.array([self.cosine_distance[k - 1, k] for k in range(1, self.num_layers + 1)])

    def angular_distance(self, n: int) -> np.ndarray:
        """``d(l, n)`` for ``l = 0 … L − n``: entry ``l`` belongs to the span of layers ``l + 1 … l + n``."""
        n = check_length(n, self.num_layers)
        return np.array([self.angular[l, l + n] for l in range(self.num_layers - n + 1)])


class PruningAccumulator(LayerAngleSums):
    """Sums over row batches of :class:`PruningMeasures`: memory in the number of layers, not of rows
    (the arithmetic: :class:`layersim.compute.angles.LayerAngleSums`)."""

    def result(self) -> PruningMeasures:
        if not self.seen:
            raise LayersimError("the pruning accumulator has seen no rows; call update() with at least one batch.")
        return PruningMeasures(*self.means())


def pruning_measures(layers: Sequence[np.ndarray]) -> PruningMeasures:
    """The measures of ``layers = [layer_0, …, layer_L]`` (all rows at once)."""
    arrays = _layer_list(layers)
    accumulator = PruningAccumulator(len(arrays) - 1)
    accumulator.update(arrays)
    return accumulator.result()


def streamed_pruning_measures(batches: Iterable[Sequence[np.ndarray]], num_layers: int) -> PruningMeasures:
    """The measures over row batches, each ``[layer_0, …, layer_{num_layers}]`` of the same rows (e.g. an
    activation table's ``iter_batches``): memory in the number of layers and one batch, not the rows."""
    accumulator = PruningAccumulator(num_layers)
    for batch in batches:
        accumulator.update(batch)
    return accumulator.result()


def block_influence(layers: Sequence[np.ndarray]) -> np.ndarray:
    """ShortGPT's Block Influence of layers 1 … L (entry ``k − 1`` is layer ``k``'s), from
    ``layers = [layer_0, …, layer_L]``: one minus the mean cosine between each layer's input and output."""
    return pruning_measures(layers).block_influence()


def angular_distance(layers: Sequence[np.ndarray], n: int) -> np.ndarray:
    """Gromov et al.'s mean angular distance between ``layer_l`` and ``layer_{l+n}`` for ``l = 0 … L − n``."""
    arrays = _layer_list(layers)
    check_length(n, len(arrays) - 1)  # before any work
    return pruning_measures(arrays).angular_distance(n)


def mean_measures(measures: Sequence[PruningMeasures]) -> PruningMeasures:
    """The element-wise mean of several runs' measures (e.g. seeds); ``rows``: the fewest any run had."""
    influence = [m.influence for m in measures]
    return PruningMeasures(angular=np.mean([m.angular for m in measures], axis=0),
                           cosine_distance=np.mean([m.cosine_distance for m in measures], axis=0),
                           rows=np.min([m.rows for m in measures], axis=0),
                           influence=None if any(i is None for i in influence) else np.mean(influence, axis=0))


def measures_from_record(record: Mapping, num_layers: int | None = None) -> PruningMeasures:
    """The measures the extract stage wrote (``<run>.pruning.json``, layersim.experiments.pruning_states):
    angular and cosine distances between every pair of layers over ``angular_distance``'s rows, Block Influence
    over ``block_influence``'s rows; a None entry (no rows) is NaN. With `num_layers`, a record of another
    depth is refused."""
    try:
        pairs, influence = record["angular_distance"], record["block_influence"]
        measures = PruningMeasures(angular=_floats(pairs["angular"]), cosine_distance=_floats(pairs["cosine_distance"]),
                                   rows=np.asarray(pairs["rows_per_pair"], dtype=np.int64),
                                   influence=_floats(influence["values"]))
    except (KeyError, TypeError) as error:
        raise LayersimError(f"a pruning record lacks {error}; re-run the extract stage to write it.") from None
    if num_layers is not None and measures.num_layers != num_layers:
        raise LayersimError(f"the pruning record holds {measures.num_layers} layers but the model has {num_layers}; "
                            "re-run the extract stage on this checkpoint.")
    return measures


def check_length(n: int, num_layers: int) -> int:
    """`n` as an int if it is a span length the model has (1 … `num_layers`); otherwise one sentence."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= num_layers:
        raise LayersimError(f"span length n must be an integer from 1 to {num_layers} (the number of layers), "
                            f"got {n!r}.")
    return int(n)


# --- predictions ---


def gromov_span(measures: PruningMeasures, n: int) -> Span | None:
    """The ``n`` consecutive layers ``(l + 1, l + n)`` with the smallest angular distance (the shallowest on
    a tie); None when no start has a defined distance."""
    distances = measures.angular_distance(n)
    if np.isnan(distances).all():
        return None
    start = int(np.nanargmin(distances))
    return start + 1, start + n


def shortgpt_layers(measures: PruningMeasures, n: int) -> tuple[int, ...] | None:
    """The ``n`` layers (1-based, ascending) with the lowest Block Influence, not necessarily contiguous (the
    lower layer on a tie); None when fewer than ``n`` layers have a defined BI."""
    n = check_length(n, measures.num_layers)
    influence = measures.block_influence()
    defined = np.flatnonzero(~np.isnan(influence))
    if defined.size < n:
        return None
    order = defined[np.argsort(influence[defined], kind="stable")]
    return tuple(sorted(int(k) + 1 for k in order[:n]))


def shortgpt_span(measures: PruningMeasures, n: int) -> Span | None:
    """The contiguous span of ``n`` layers with the lowest summed Block Influence (the shallowest on a tie):
    ShortGPT's rule restricted to what the skip stage measures; None when no span's sum is defined."""
    sums = np.array([np.sum(measures.block_influence()[l:l + n])
                     for l in range(measures.num_layers - check_length(n, measures.num_layers) + 1)])
    if np.isnan(sums).all():
        return None
    start = int(np.nanargmin(sums))
    return start + 1, start + n


def span_droppability(measures: PruningMeasures) -> dict[str, dict[Span, float]]:
    """Per measure, every span ``(i, j)`` mapped to how droppable the measure predicts it (higher: more):
    ``angular_distance``: ``−d(layer_{i−1}, layer_j)``; ``block_influence``: ``−(BI_i + … + BI_j)``."""
    influence = measures.block_influence()
    spans = [(i, j) for i in range(1, measures.num_layers + 1) for j in range(i, measures.num_layers + 1)]
    return {"angular_distance": {(i, j): -float(measures.angular[i - 1, j]) for i, j in spans},
            "block_influence": {(i, j): -float(np.sum(influence[i - 1:j])) for i, j in spans}}


def predicted_spans(measures: PruningMeasures) -> list[dict]:
    """For each span length ``n = 1 … L``: the span Gromov's rule picks (``angular_distance``), the contiguous
    span and the possibly scattered layers ShortGPT's picks (``block_influence_span``,
    ``block_influence_layers``); None where undefined."""
    return [{"length": n, "angular_distance": gromov_span(measures, n),
             "block_influence_span": shortgpt_span(measures, n),
             "block_influence_layers": shortgpt_layers(measures, n)}
            for n in range(1, measures.num_layers + 1)]


def prediction_rank_correlation(measured: Mapping[Span, float], predicted: Mapping[Span, float]) -> dict:
    """How well `predicted` droppability ranks the `measured` skip scores (same spans on both sides).

    ``by_length`` (keyed by n): Spearman's rho among the spans of length n, each ``{"spearman", "spans"}``;
    ``within_length``: their mean weighted by ``spans − 1`` (the headline, :func:`within_length`);
    ``beyond_position``: the same mean of the per-length rho partial on the span's position (its first layer),
    each weighted by ``spans − 2``: what the rule knows beyond "deeper spans are more (or less) droppable", which a
    predictor of depth alone also knows (:func:`position_only_baseline`); ``all``:
    rho over all spans at once, which mostly measures span length (longer spans score worse and are farther
    apart for any model: compare :func:`length_only_baseline`). Positive: spans predicted droppable keep more
    of the score. Spans with a NaN on either side are left out; fewer than ``MIN_SPANS_FOR_RANK`` spans, or a
    side that is constant, give NaN. No p-value: overlapping spans share layers, so they are not independent
    draws (:func:`random_layer_baseline` gives what a predictor without information gets instead)."""
    spans = _checked_spans(measured, predicted)
    groups = _by_length(spans)
    by_length = {n: _spearman(group, measured, predicted) for n, group in groups.items()}
    beyond = {n: _partial_spearman(group, measured, predicted) for n, group in groups.items()}
    return {"within_length": within_length(by_length), "beyond_position": within_length(beyond, fitted=2),
            "all": _spearman(spans, measured, predicted), "by_length": by_length}


def within_length(by_length: Mapping[int, Mapping[str, float]], fitted: int = 1) -> float:
    """The mean of the per-length rho, each weighted by its ``spans − fitted`` (lengths with rho undefined left out;
    NaN when none is defined). Spearman's rho over m pairs without association has variance 1/(m − 1), and partial
    on one covariate 1/(m − 2) (``fitted`` = 2), so these are the inverse-variance weights: the least noisy mean,
    in which a length of 3 spans (rho can only be ±1 or ±0.5) counts a sixth as much as one of 13."""
    pairs = [(r["spearman"], r["spans"] - fitted) for r in by_length.values() if np.isfinite(r["spearman"])]
    if not pairs:
        return float("nan")
    rho, weight = np.array(pairs, dtype=float).T
    return float(np.sum(rho * weight) / np.sum(weight))


def length_only_baseline(measured: Mapping[Span, float]) -> float:
    """Rho over all spans of a predictor that knows only the length (shorter: more droppable): what ``all``
    gets with no knowledge of the layers. Its within-length rho is undefined (a constant in each length)."""
    return prediction_rank_correlation(measured, {(i, j): float(i - j) for i, j in measured})["all"]["spearman"]


def position_only_baseline(measured: Mapping[Span, float]) -> float:
    """Within-length rho of a predictor that knows only where a span sits (its first layer; deeper: more
    droppable): what any rule that has learnt "deeper layers matter less" gets without knowing this model's layers.
    A rule's ``within_length`` at this level says no more than depth does; its ``beyond_position`` says what it
    adds (the fidelity review 2026-11-28 §3: a generic depth trend scored 0.87 within length, position alone 0.874)."""
    return prediction_rank_correlation(measured, {(i, j): float(i) for i, j in measured})["within_length"]


def random_layer_baseline(measured: Mapping[Span, float], draws: int = RANDOM_LAYER_DRAWS, seed: int = 0) -> dict:
    """What a predictor without information gets: per draw, a score for each layer from U(0, 1), summed over
    each span (as Block Influence is) and negated as droppability, ranked against `measured`. Returns the mean
    over `draws` seeded draws of ``within_length`` (≈ 0 whatever the length effect) with its 2.5 % and 97.5 %
    quantiles (``within_length_low`` / ``_high``: the range chance gives), and the mean rho over all spans
    (``all_spans``: the length effect alone, high when longer spans score worse); and the same mean and quantiles of
    ``beyond_position`` (``beyond_position``, ``beyond_position_low`` / ``_high``): the null of the rho partial on
    position."""
    if isinstance(draws, bool) or not isinstance(draws, (int, np.integer)) or draws < 1:
        raise LayersimError(f"draws must be a positive integer, got {draws!r}.")
    spans = [s for s in _checked_spans(measured, measured) if np.isfinite(measured[s])]
    keys = [f"{name}{suffix}" for name in ("within_length", "beyond_position") for suffix in ("", "_low", "_high")]
    if not spans:
        return {**dict.fromkeys(keys, float("nan")), "all_spans": float("nan")}
    layers = np.random.default_rng(seed).uniform(size=(draws, max(j for _, j in spans)))
    cumulative = np.concatenate([np.zeros((draws, 1)), np.cumsum(layers, axis=1)], axis=1)

    def rho(group: list[Span], partial: bool = False) -> np.ndarray:
        first, last = np.array(group).T
        x, y = np.array([measured[s] for s in group]), cumulative[:, first - 1] - cumulative[:, last]
        return _partial_spearman_rows(x, y, first) if partial else _spearman_rows(x, y)

    groups = _by_length(spans)
    result = {}
    for name, partial, lost in (("within_length", False, 1), ("beyond_position", True, 2)):
        weighted = [(r, len(group) - lost) for group in groups.values() for r in [rho(group, partial)]
                    if np.isfinite(r).all()]
        per_draw = (sum(r * w for r, w in weighted) / sum(w for _, w in weighted) if weighted
                    else np.full(draws, np.nan))
        low, high = np.quantile(per_draw, [0.025, 0.975])
        result |= {name: float(np.mean(per_draw)), f"{name}_low": float(low), f"{name}_high": float(high)}
    return {**{key: result[key] for key in keys[:3]}, "all_spans": float(np.mean(rho(spans))),
            **{key: result[key] for key in keys[3:]}}


def _by_length(spans: list[Span]) -> dict[int, list[Span]]:
    groups: dict[int, list[Span]] = {}
    for i, j in spans:
        groups.setdefault(j - i + 1, []).append((i, j))
    return dict(sorted(groups.items()))


def _spearman(spans: list[Span], measured: Mapping[Span, float], predicted: Mapping[Span, float]) -> dict:
    x = np.array([float(measured[s]) for s in spans])
    y = np.array([float(predicted[s]) for s in spans])
    keep = ~(np.isnan(x) | np.isnan(y))
    return {"spearman": float(_spearman_rows(x[keep], y[keep][None])[0]), "spans": int(np.count_nonzero(keep))}


def _partial_spearman(spans: list[Span], measured: Mapping[Span, float], predicted: Mapping[Span, float]) -> dict:
    """Spearman's rho of the spans' measured and predicted values partial on their first layer (NaN pairs left
    out), as ``{"spearman", "spans"}``."""
    keep = [s for s in spans if not (np.isnan(float(measured[s])) or np.isnan(float(predicted[s])))]
    x = np.array([float(measured[s]) for s in keep])
    y = np.array([float(predicted[s]) for s in keep])
    first = np.array([s[0] for s in keep])
    return {"spearman": float(_partial_spearman_rows(x, y[None], first)[0]) if keep else float("nan"),
            "spans": len(keep)}


def _partial_spearman_rows(x: np.ndarray, y: np.ndarray, position: np.ndarray) -> np.ndarray:
    """Spearman's rho of `x` (m,) with each row of `y` (draws, m) partial on `position` (m,): Pearson's r of the
    ranks after each rank vector's least-squares line on the ranks of `position` is taken out. NaN with fewer than
    ``MIN_SPANS_FOR_RANK`` + 1 pairs (three points leave one degree of freedom: ±1 whatever the data) or measured
    ranks that position explains entirely; 0 for a row that position explains entirely (it ranks the spans as
    depth does, so it knows nothing beyond it: a predictor of depth alone)."""
    if x.size < MIN_SPANS_FOR_RANK + 1:
        return np.full(y.shape[0], np.nan)
    centre = (x.size + 1) / 2
    z = stats.rankdata(position) - centre
    if not np.any(z):
        return _spearman_rows(x, y)

    def residual(ranks: np.ndarray) -> np.ndarray:
        ranks = ranks - centre
        return ranks - np.outer(ranks @ z / (z @ z), z) if ranks.ndim == 2 else ranks - (ranks @ z / (z @ z)) * z

    rx, ry = residual(stats.rankdata(x)), residual(stats.rankdata(y, axis=1))
    scale = x.size ** 2 * 1e-12  # residuals this small are rounding: position explained the ranks
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = (ry @ rx) / np.sqrt(np.sum(ry ** 2, axis=1) * np.sum(rx ** 2))
    if not np.sum(rx ** 2) > scale:
        return np.full(y.shape[0], np.nan)
    return np.where(np.sum(ry ** 2, axis=1) > scale, rho, 0.0)


def _spearman_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman's rho of `x` (m,) with each row of `y` (draws, m): Pearson's r of the ranks (ties: mean
    ranks). NaN with fewer than ``MIN_SPANS_FOR_RANK`` pairs or a constant side."""
    if x.size < MIN_SPANS_FOR_RANK or np.ptp(x) == 0:
        return np.full(y.shape[0], np.nan)
    rx = stats.rankdata(x) - (x.size + 1) / 2
    ry = stats.rankdata(y, axis=1) - (x.size + 1) / 2
    with np.errstate(invalid="ignore", divide="ignore"):  # a constant row: 0/0 = NaN
        return (ry @ rx) / np.sqrt(np.sum(ry ** 2, axis=1) * np.sum(rx ** 2))


def _checked_spans(measured: Mapping[Span, float], predicted: Mapping[Span, float]) -> list[Span]:
    if not measured:
        raise LayersimError("measured holds no spans; pass the skip scores as {(first, last): score}.")
    for span in measured:
        if not (isinstance(span, tuple) and len(span) == 2 and all(isinstance(v, (int, np.integer)) for v in span)
                and 1 <= span[0] <= span[1]):
            raise LayersimError(f"span {span!r} is not a (first, last) pair of 1-based layers with first <= last.")
    missing = sorted(set(measured) ^ set(predicted))
    if missing:
        side = "predicted" if missing[0] in measured else "measured"
        raise LayersimError(f"span {missing[0]} is missing from {side}; measured and predicted must cover the "
                            "same spans.")
    return sorted(measured)


# --- helpers ---


def _layer_list(layers: Sequence[np.ndarray]) -> list[np.ndarray]:
    arrays = as_list(layers, "layers")
    if len(arrays) < 2:
        raise LayersimError(f"layers holds {len(arrays)} array; pass layer_0 (the embeddings) and the output of "
                            "every layer, at least 2 arrays.")
    return arrays


def _floats(values) -> np.ndarray:
    return np.array(values, dtype=object).astype(float)  # None → NaN
