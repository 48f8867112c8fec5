"""Fine-tuning seeds as the unit of uncertainty.

A bootstrap interval over examples (layersim.similarity.inference.bootstrap) says how one fine-tuned model's value
would move on other examples of the task; it says nothing of where another fine-tuning run would land,
and with two seeds the seed-to-seed spread can exceed every effect reported. Here each seed's value is one
observation: their mean, their sample standard deviation (ddof 1) and a two-sided Student t-interval for
the mean over seeds, mean ± t(1 − α/2, n − 1)·sd/√n, which treats the n per-seed values as independent
draws from a normal distribution. The interval is given for n ≥ 3 seeds only: with 2, t(0.975, 1) = 12.7
and the sd rests on one difference, so the two values and their range are reported instead. n counts the
seeds whose value is defined on each layer (a layer where only 2 are defined gets no interval). A measure with
a range (CKA in [0, 1]) has its interval clipped to it: CKA values 0.97, 0.99, 0.999 give mean + t·sd/√3 = 1.023.

The interval is conditional on the evaluation examples, on ORIG and on the one RANDOM draw (the bootstrap over
examples is the other half); with 2 df the sd's relative error is about 50 % (1/√(2·df)), so one narrow interval
over 3 seeds says little.

Runs flagged by the convergence check (layersim.training.convergence) stay in every mean; :func:`converged_mean`,
the mean over the others, is reported beside it (``seed_mean_converged``) by every stage that averages runs.
"""

from __future__ import annotations

import warnings
from collections.abc import Collection, Mapping
from dataclasses import dataclass

import numpy as np

from layersim.compute.runs import converged_mean

MIN_SEEDS_FOR_INTERVAL = 3


@dataclass(frozen=True)
class SeedSpread:
    """Per layer, over the seeds (NaN where fewer seeds have a defined value than a statistic needs)."""

    seeds: int
    mean: np.ndarray
    sd: np.ndarray | None          # None with fewer than MIN_SEEDS_FOR_INTERVAL seeds
    low: np.ndarray | None         # the t-interval's bounds, likewise
    high: np.ndarray | None
    range: np.ndarray              # max − min
    note: str                      # what the interval is, or why there is none


def over_seeds(values: np.ndarray, confidence: float = 0.95,
               bounds: tuple[float, float] | None = None) -> SeedSpread:
    """Mean, sd, `confidence` t-interval and range over the rows of `values` (seeds, layers): one row per
    fine-tuning seed. Undefined (NaN) values are left out per layer; the interval is clipped to `bounds`,
    the measure's range, when it has one."""
    from scipy.stats import t as student_t

    values = np.atleast_2d(np.asarray(values, dtype=float))
    seeds = len(values)
    finite = np.isfinite(values)
    count = finite.sum(axis=0)
    mean = converged_mean(dict(enumerate(values)))
    with np.errstate(invalid="ignore", divide="ignore"):
        spread = np.where(count > 0, np.nanmax(np.where(finite, values, np.nan), axis=0, initial=-np.inf)
                          - np.nanmin(np.where(finite, values, np.nan), axis=0, initial=np.inf), np.nan)
    if seeds < MIN_SEEDS_FOR_INTERVAL:
        note = (f"{seeds} seed{'s' if seeds != 1 else ''}: "
                + ("their values and range; " if seeds == 2 else "no spread over seeds; ")
                + f"an interval over seeds needs at least {MIN_SEEDS_FOR_INTERVAL} seeds")
        return SeedSpread(seeds, mean, None, None, None, spread, note)
    squares = np.where(finite, (values - mean) ** 2, 0.0).sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        sd = np.where(count >= 2, np.sqrt(squares / (count - 1)), np.nan)
        quantile = np.where(count >= 2, student_t.ppf(0.5 + confidence / 2, np.maximum(count - 1, 1)), np.nan)
        half = np.where(count >= MIN_SEEDS_FOR_INTERVAL, quantile * sd / np.sqrt(count), np.nan)
    low, high = mean - half, mean + half
    if bounds is not None:
        low, high = np.clip(low, *bounds), np.clip(high, *bounds)
    note = (f"{confidence:.0%} t-interval over the seeds: mean ± t({0.5 + confidence / 2:g}, n − 1 df)·sd/√n, "
            f"the seeds' values taken as independent normal draws, {_counted(count, seeds)}"
            + (f"; clipped to the measure's range [{bounds[0]:g}, {bounds[1]:g}]" if bounds is not None else ""))
    return SeedSpread(seeds, mean, sd, low, high, spread, note)


def _counted(count: np.ndarray, seeds: int) -> str:
    """Which n each layer's interval rests on: the seeds defined there."""
    full = int((count == seeds).sum())
    if full == len(count):
        return f"n = {seeds} ({seeds - 1} df) on every layer"
    fewer = ", ".join(f"{int((count == k).sum())} with n = {k}" for k in range(seeds - 1, -1, -1) if (count == k).any())
    return (f"n = {seeds} ({seeds - 1} df) on {full} of {len(count)} layers; {fewer} "
            f"(no interval below n = {MIN_SEEDS_FOR_INTERVAL})")


def seed_metrics(per_seed: dict[str, np.ndarray], layer_values, *, flagged: Collection = (),
                 bounds: tuple[float, float] | None = None) -> dict:
    """The metrics entries of one comparison's per-seed diagonals (seed label → per-layer values): ``seeds``,
    ``seed_interval`` (what the interval is, or why there is none), ``seed_values`` by label, ``seed_mean``,
    ``seed_mean_converged`` (over the labels not in `flagged`, :func:`converged_mean`) with ``seeds_converged``,
    and ``seed_sd``, ``seed_ci_low``, ``seed_ci_high`` (≥ 3 seeds; clipped to `bounds`) or ``seed_range``
    (2 seeds); with one seed only the first two. `layer_values` turns a per-layer array into its metrics form."""
    spread = over_seeds(np.array(list(per_seed.values())), bounds=bounds)
    entry = {"seeds": spread.seeds, "seed_interval": spread.note}
    if spread.seeds < 2:
        return entry
    entry |= {"seed_values": {label: layer_values(values) for label, values in per_seed.items()},
              "seed_mean": layer_values(spread.mean),
              "seed_mean_converged": layer_values(converged_mean(per_seed, flagged)),
              "seeds_converged": sum(label not in flagged for label in per_seed)}
    if spread.low is None:
        return entry | {"seed_range": layer_values(spread.range)}
    return entry | {"seed_sd": layer_values(spread.sd), "seed_ci_low": layer_values(spread.low),
                    "seed_ci_high": layer_values(spread.high)}


@dataclass(frozen=True)
class PairSpread:
    """Per layer, over pairs of runs of different seeds (NaN where undefined)."""

    seeds: int                     # the seeds the pairs draw on
    pairs: int
    mean: np.ndarray               # the mean over the pairs (or the difference of two such means)
    sd: np.ndarray | None          # the pairs' sample sd (descriptive: the pairs share seeds); None for a difference
    low: np.ndarray | None         # the jackknife t-interval over seeds; None with fewer than 3 seeds
    high: np.ndarray | None
    note: str


def over_seed_pairs(pairs: Mapping[tuple[int, int], np.ndarray], confidence: float = 0.95,
                    bounds: tuple[float, float] | None = None,
                    baseline: Mapping[tuple[int, int], np.ndarray] | None = None) -> PairSpread:
    """The mean of per-layer values over pairs of runs, `pairs`: (seed a, seed b) → the values of a run of seed a
    against a run of seed b, a ≠ b (e.g. FT[i]–FT[j], or LoRA[i]–FT[j]); with `baseline` (pairs of the same form),
    the difference mean(pairs) − mean(baseline). Pairs that share a seed are not independent, so the interval is
    the jackknife over seeds: each seed left out in turn with every pair that uses it, the mean recomputed,
    se² = (n − 1)/n · Σ (θ₍ₛ₎ − θ̄)², and mean ± t(1 − α/2, n − 1)·se (n seeds ≥ 3; clipped to `bounds` for a mean,
    not for a difference)."""
    from scipy.stats import t as student_t

    def mean_of(chosen: Mapping[tuple[int, int], np.ndarray], without=None) -> np.ndarray:
        kept = [np.asarray(v, dtype=float) for key, v in chosen.items() if without not in key]
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a layer undefined in every pair: NaN
            return np.nanmean(kept, axis=0) if kept else np.full(len(next(iter(chosen.values()))), np.nan)

    def statistic(without=None) -> np.ndarray:
        found = mean_of(pairs, without)
        return found if baseline is None else found - mean_of(baseline, without)

    seeds = sorted({seed for key in (*pairs, *(baseline or {})) for seed in key})
    values = np.array([np.asarray(v, dtype=float) for v in pairs.values()])
    mean = statistic()
    sd = None if baseline is not None or len(values) < 2 else np.nanstd(values, axis=0, ddof=1)
    if len(seeds) < MIN_SEEDS_FOR_INTERVAL:
        return PairSpread(len(seeds), len(pairs), mean, sd, None, None,
                          f"{len(seeds)} seeds: no interval over seeds (the jackknife over seeds needs at least "
                          f"{MIN_SEEDS_FOR_INTERVAL})")
    left_out = np.array([statistic(seed) for seed in seeds])
    n = len(seeds)
    se = np.sqrt((n - 1) / n * np.sum((left_out - left_out.mean(axis=0)) ** 2, axis=0))
    half = student_t.ppf(0.5 + confidence / 2, n - 1) * se
    low, high = mean - half, mean + half
    if bounds is not None and baseline is None:
        low, high = np.clip(low, *bounds), np.clip(high, *bounds)
    return PairSpread(n, len(pairs), mean, sd, low, high,
                      f"{confidence:.0%} jackknife t-interval over the {n} seeds (each left out with every pair that "
                      f"uses it; t with {n - 1} df): the pairs share seeds, so they are not independent draws")
