"""Which measure to trust on this model: ReSi's grounding tests (Klabunde et al., ICLR 2025) that need no run beyond
the pipeline's own, computed from layer × layer similarity matrices, and a ranking of measures over them with a paired
bootstrap.

- Layer monotonicity (ReSi's test 6): within one model, a layer should be more like its neighbours than like layers
  further away. :func:`monotonicity_correlation` is ReSi's statistic: for each source layer, the Spearman correlation
  of its similarities to the later layers with their distance, and the same for the earlier layers, sign-flipped so
  that 1 is a perfectly monotone decrease, averaged over sources and directions; :func:`monotonicity_conformity` is
  1 − ReSi's violation rate, the share of (source, nearer, further) triples ordered as expected.
- Seeds against fine-tuning (ReSi's grouping tests, AUPRC): models fine-tuned from the same checkpoint with different
  seeds should be more alike, layer k against layer k, than each of them is to the pretrained model.
  :func:`separation_auprc` is the average precision of telling the same-kind pairs (FT[i]–FT[j]) from the
  different-kind ones (FT[i]–ORIG) by their similarity.
- Training interventions (ReSi's tests 3–5; layersim.experiments.interventions): runs trained at several levels of an
  intervention, grouped by level (:func:`grouping_auprc`, AUPRC) and ordered by it (:func:`ordering_spearman`,
  Spearman of similarity against the distance of the levels), layer by layer.

Every measure is a similarity (larger: more alike; layersim.similarity.registry.Measure), so no sign is chosen per
measure. A score that is undefined (a constant row, NaN similarities) is NaN, and ranks last.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np
from scipy.stats import rankdata, spearmanr
from sklearn.metrics import average_precision_score

from layersim.errors import LayersimError

TESTS = ("monotonicity", "separation")  # the tests a measure is ranked on, equally weighted


def _directions(matrix: np.ndarray):
    """Each source layer's similarities to the layers after it and before it, nearest first, as (values, distances)."""
    matrix = _square(matrix)
    n = len(matrix)
    for i in range(n):
        forward = matrix[i, i + 1:]
        backward = matrix[i, :i][::-1]
        for values in (forward, backward):
            yield values, np.arange(1, len(values) + 1)


def _square(matrix) -> np.ndarray:
    matrix = np.asarray(matrix, dtype=float)
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1] or len(matrix) < 3:
        raise LayersimError(f"layer monotonicity needs a square layer × layer matrix of at least 3 layers, got shape "
                            f"{matrix.shape}.")
    return matrix


def monotonicity_correlation(matrix) -> float:
    """ReSi's layer-monotonicity correlation of one model's layer × layer similarity matrix (rows: source layers):
    the mean, over source layers and both directions with at least two other layers, of −Spearman(similarity,
    distance); 1: similarity falls strictly with distance everywhere; NaN when no direction is defined."""
    values = []
    for sims, distances in _directions(matrix):
        if len(sims) < 2 or not np.isfinite(sims).all() or np.ptp(sims) == 0:
            continue  # Spearman is undefined (ReSi's NaN, left out of its nanmean)
        values.append(-spearmanr(sims, distances).statistic)
    return float(np.mean(values)) if values else float("nan")


def monotonicity_conformity(matrix) -> float:
    """1 − ReSi's violation rate: the share of (source, nearer, further) layer triples, in both directions, whose
    nearer layer is at least as similar to the source as the further one; a direction with a missing similarity (a
    constant layer's NaN) is left out, as in :func:`monotonicity_correlation`; NaN when none is left."""
    kept = total = 0
    for sims, _ in _directions(matrix):
        if len(sims) < 2 or not np.isfinite(sims).all():
            continue
        nearer, further = np.triu_indices(len(sims), k=1)
        kept += int(np.sum(sims[nearer] >= sims[further]))
        total += len(nearer)
    return kept / total if total else float("nan")


def separation_auprc(same: Sequence[float], different: Sequence[float]) -> float:
    """Average precision (scikit-learn's, the area under the precision-recall curve as ReSi computes it) of ranking
    the `same`-kind pairs' similarities above the `different`-kind ones'; 1: every same-kind pair is more alike than
    every different-kind pair. NaN when a similarity is missing or either kind has no pair."""
    same, different = np.asarray(same, dtype=float), np.asarray(different, dtype=float)
    if not len(same) or not len(different) or not (np.isfinite(same).all() and np.isfinite(different).all()):
        return float("nan")
    labels = np.r_[np.ones(len(same)), np.zeros(len(different))]
    return float(average_precision_score(labels, np.r_[same, different]))


def separation_chance(num_same: int, num_different: int) -> float:
    """The expected AUPRC of a measure that orders the pairs at random (no ties): the same-kind pair at rank r (each
    rank equally likely) has itself and on average (r − 1)(P − 1)/(N − 1) same-kind pairs at or above it, so
    E = (1/N) Σ_r (1 + (r − 1)(P − 1)/(N − 1)) / r for P same-kind pairs of N. Above the share P/N, which it
    approaches only with many pairs: 0.61 for one seed pair against two FT–ORIG pairs, whose share is 1/3."""
    total = num_same + num_different
    if total == 1:
        return 1.0
    ranks = np.arange(1, total + 1)
    return float(np.mean((1 + (ranks - 1) * (num_same - 1) / (total - 1)) / ranks))


def _symmetric(matrix: np.ndarray, a: int, b: int) -> float:
    """One pair's similarity with no order: the mean of both orders (they differ for neuronsim and PWCCA)."""
    return 0.5 * (matrix[a, b] + matrix[b, a])


def grouping_auprc(matrix: np.ndarray, groups: Sequence) -> tuple[float, int, int]:
    """ReSi's grouping test on one layer: the AUPRC of ranking the pairs of models in the same group (`groups[i]`,
    model i's) above the pairs in different groups, by the models' similarity (`matrix`, models × models, the mean of
    both orders); and how many pairs of each kind there are."""
    same, different = [], []
    for a, b in combinations(range(len(groups)), 2):
        (same if groups[a] == groups[b] else different).append(_symmetric(matrix, a, b))
    return separation_auprc(same, different), len(same), len(different)


def grouping_per_layer(matrix: np.ndarray, starts: Mapping[str, int], num_layers: int,
                       groups: Mapping[str, object]) -> tuple[np.ndarray, int, int]:
    """Per layer k of a stacked matrix (each model's first row at `starts[label]`): :func:`grouping_auprc` of the
    models `groups` names (label → its group), layer k against layer k; and how many pairs of each kind there are."""
    labels = list(groups)
    scores, counts = np.full(num_layers, np.nan), (0, 0)
    for k in range(num_layers):
        rows = [starts[label] + k for label in labels]
        scores[k], *counts = grouping_auprc(matrix[np.ix_(rows, rows)], [groups[label] for label in labels])
    return scores, *counts


def ordering_spearman(matrix: np.ndarray, levels: Sequence[float]) -> float:
    """ReSi-style ordering on one layer: the Spearman correlation, over every pair of models, of their similarity
    (`matrix`, models × models, the mean of both orders) with minus the distance of their levels (`levels[i]`, model
    i's intervention level); 1: the further apart two models' levels, the less alike, without exception. NaN when a
    similarity is missing or every pair is equally alike or equally far apart."""
    pairs = list(combinations(range(len(levels)), 2))
    sims = np.array([_symmetric(matrix, a, b) for a, b in pairs], dtype=float)
    gaps = np.array([abs(levels[a] - levels[b]) for a, b in pairs], dtype=float)
    if not np.isfinite(sims).all() or np.ptp(sims) == 0 or np.ptp(gaps) == 0:
        return float("nan")
    return float(-spearmanr(sims, gaps).statistic)


def separation_per_layer(matrix: np.ndarray, starts: Mapping[str, int], num_layers: int, orig: str,
                         finetuned: Sequence[str]) -> tuple[np.ndarray, int, int]:
    """Per layer: the AUPRC of the FT[i]–FT[j] pairs against the FT[i]–ORIG pairs (:func:`grouping_per_layer`, ORIG
    alone in its group, the seeds together)."""
    return grouping_per_layer(matrix, starts, num_layers, {orig: "pretrained"} | dict.fromkeys(finetuned, "seeds"))


@dataclass(frozen=True)
class Ranking:
    """Measures ranked on the tests (1: best). Per measure: each test's score, its 95 % percentile interval, the mean
    rank over the tests with its interval, and `top_share`, the share of bootstrap draws in which it ranked best
    (ties shared). Test scores are means over units (runs for monotonicity, layers for separation) that every
    measure shares, so each draw resamples the units once for all measures (a paired bootstrap)."""

    measures: tuple[str, ...]
    score: dict[str, dict[str, float]]       # test → measure → score
    interval: dict[str, dict[str, tuple[float, float]]]
    mean_rank: dict[str, float]
    rank_interval: dict[str, tuple[float, float]]
    top_share: dict[str, float]
    tests: tuple[str, ...]


def _ranks(scores: np.ndarray) -> np.ndarray:
    """Ranks of scores per row of a (draws, measures) array, 1 for the largest; NaN (undefined) ties last."""
    filled = np.where(np.isfinite(scores), scores, -np.inf)
    return rankdata(-filled, axis=-1, method="average")


def _quiet(reduce, *args, **kwargs):
    """A nan-reduction without the "Mean of empty slice" warning: an all-NaN draw is NaN, which ranks last."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return reduce(*args, **kwargs)


def _mean_over(units: np.ndarray, picks: np.ndarray) -> np.ndarray:
    """(draws, measures) means of (measures, units) values over each draw's units (`picks`: draws × units), NaN
    units left out."""
    return _quiet(np.nanmean, units[:, picks], axis=-1).T


def rank_measures(units: Mapping[str, Mapping[str, Sequence[float]]], resamples: int, seed: int) -> Ranking:
    """Rank the measures on each test's per-unit scores (`units[test][measure]`: the same number of units for every
    measure of a test; a test absent or with no unit is left out), best first, with a paired bootstrap of
    `resamples` draws (`seed`)."""
    tests = tuple(test for test, by_measure in units.items()
                  if by_measure and len(next(iter(by_measure.values()))) > 0)
    if not tests:
        raise LayersimError("no grounding test has a value to rank the measures on.")
    measures = tuple(units[tests[0]])
    rng = np.random.default_rng(seed)
    score, interval, draws_ranks = {}, {}, []
    for test in tests:
        values = np.array([np.asarray(units[test][m], dtype=float) for m in measures])  # (measures, units)
        observed = _mean_over(values, np.arange(values.shape[1])[None, :])[0]
        picks = rng.integers(0, values.shape[1], size=(resamples, values.shape[1]))
        drawn = _mean_over(values, picks)  # (draws, measures)
        low, high = _quiet(np.nanpercentile, drawn, [2.5, 97.5], axis=0)
        score[test] = dict(zip(measures, map(float, observed)))
        interval[test] = {m: (float(lo), float(hi)) for m, lo, hi in zip(measures, low, high)}
        draws_ranks.append((_ranks(observed[None, :])[0], _ranks(drawn)))
    observed_rank = np.mean([observed for observed, _ in draws_ranks], axis=0)
    drawn_rank = np.mean([drawn for _, drawn in draws_ranks], axis=0)  # (draws, measures)
    low, high = np.percentile(drawn_rank, [2.5, 97.5], axis=0)
    best = drawn_rank == drawn_rank.min(axis=1, keepdims=True)
    top_share = (best / best.sum(axis=1, keepdims=True)).mean(axis=0)
    return Ranking(measures, score, interval, dict(zip(measures, map(float, observed_rank))),
                   {m: (float(lo), float(hi)) for m, lo, hi in zip(measures, low, high)},
                   dict(zip(measures, map(float, top_share))), tests)
