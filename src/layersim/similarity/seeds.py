"""Fine-tuning seeds as the unit of uncertainty.

A bootstrap interval over examples (layersim.similarity.bootstrap) says how one fine-tuned model's value
would move on other examples of the task; it says nothing of where another fine-tuning run would land,
and with two seeds the seed-to-seed spread can exceed every effect reported. Here each seed's value is one
observation: their mean, their sample standard deviation (ddof 1) and a two-sided Student t-interval for
the mean over seeds, mean ± t(1 − α/2, n − 1)·sd/√n, which treats the n per-seed values as independent
draws from a normal distribution. The interval is given for n ≥ 3 seeds only: with 2, t(0.975, 1) = 12.7
and the sd rests on one difference, so the two values and their range are reported instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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


def over_seeds(values: np.ndarray, confidence: float = 0.95) -> SeedSpread:
    """Mean, sd, `confidence` t-interval and range over the rows of `values` (seeds, layers): one row per
    fine-tuning seed. Undefined (NaN) values are left out per layer."""
    from scipy.stats import t as student_t

    values = np.atleast_2d(np.asarray(values, dtype=float))
    seeds = len(values)
    finite = np.isfinite(values)
    count = finite.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(count > 0, np.where(finite, values, 0.0).sum(axis=0) / count, np.nan)
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
    note = (f"{confidence:.0%} t-interval over {seeds} seeds: mean ± t({0.5 + confidence / 2:g}, {seeds - 1} df)"
            f"·sd/√{seeds}, the seeds' values taken as independent normal draws")
    return SeedSpread(seeds, mean, sd, mean - half, mean + half, spread, note)


def seed_metrics(per_seed: dict[str, np.ndarray], layer_values) -> dict:
    """The metrics entries of one comparison's per-seed diagonals (seed label → per-layer values): ``seeds``,
    ``seed_interval`` (what the interval is, or why there is none), ``seed_values`` by label, ``seed_mean``,
    and ``seed_sd``, ``seed_ci_low``, ``seed_ci_high`` (≥ 3 seeds) or ``seed_range`` (2 seeds); with one seed
    only the first two. `layer_values` turns a per-layer array into its metrics form."""
    spread = over_seeds(np.array(list(per_seed.values())))
    entry = {"seeds": spread.seeds, "seed_interval": spread.note}
    if spread.seeds < 2:
        return entry
    entry |= {"seed_values": {label: layer_values(values) for label, values in per_seed.items()},
              "seed_mean": layer_values(spread.mean)}
    if spread.low is None:
        return entry | {"seed_range": layer_values(spread.range)}
    return entry | {"seed_sd": layer_values(spread.sd), "seed_ci_low": layer_values(spread.low),
                    "seed_ci_high": layer_values(spread.high)}
