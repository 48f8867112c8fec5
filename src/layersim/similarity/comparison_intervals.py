"""How sure the comparisons of :mod:`layersim.similarity.comparisons` are, beyond each cell's permutation null:
bootstrap intervals over examples (the diagonals of FT–ORIG, FT[1]–FT[2] and the compared methods' runs; FT–ORIG's
top layer minus FT–RANDOM's, paired) and spreads over the fine-tuning seeds (the FT[i]–FT[j] diagonals, and the
pairs of runs of different seeds with a jackknife interval over seeds)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence

import numpy as np

from layersim.similarity.comparisons import RANDOM, Comparison, block, compared_labels
from layersim.similarity.inference.bootstrap import BootstrapResult, bootstrap_pairs, chosen_interval, interval_of
from layersim.similarity.inference.seeds import PairSpread, over_seed_pairs, over_seeds
from layersim.similarity.registry import similarity


def diagonal_intervals(measure: str, models: dict[str, Sequence], comparisons: Sequence[Comparison], *,
                       resamples: int, seed: int, groups: np.ndarray | None = None, whole: Sequence[str] = (),
                       bootstrap: Callable[..., BootstrapResult] = bootstrap_pairs,
                       **options) -> tuple[list[Comparison], dict[str, np.ndarray]]:
    """The comparisons with a bootstrap interval (over examples, or over `groups` of rows) of the diagonal of
    FT–ORIG and FT[1]–FT[2] (and, for finetune.compare_methods' runs, e.g. LoRA–ORIG and LoRA–FT): the per-layer
    values that metrics report. Models are named as in the comparisons' titles: ORIG and FT[1] (FT), FT[2], LoRA[1]. Both diagonals come from the same resamples, each layer prepared once.

    Also, for the self-comparisons named in `whole` (orig_orig, ft_ft), the whole matrix on every resample,
    (resamples, layers, layers), from the same resamples (e.g. for the stability of blocks of layers). `bootstrap`:
    bootstrap_pairs's contract for these layers (attention maps: attention_null.attention_bootstrap_pairs)."""
    pairs = {"ft_orig": ("FT[1]", "ORIG"), "ft1_ft2": ("FT[1]", "FT[2]")} | {
        f"{method.lower()}_{other.lower()}": (runs[0], "FT[1]" if other == "FT" else other)
        for method, runs in compared_labels(models).items() for other in ("ORIG", "FT")}
    selves = {"orig_orig": "ORIG", "ft_ft": "FT[1]"}
    # No diagonal resamples for a measure no interval method covers (bootstrap.AUTO_INTERVAL): they would be dropped.
    wanted = [c.key for c in comparisons if c.key in pairs] if chosen_interval(measure, "auto") else []
    matrices = [key for key in whole if key in selves and selves[key] in models]
    if not wanted and not matrices:
        return list(comparisons), {}
    xs = [layer for key in wanted for layer in models[pairs[key][0]]]
    ys = [layer for key in wanted for layer in models[pairs[key][1]]]
    for key in matrices:
        layers = models[selves[key]]
        xs += [a for a in layers for _ in layers]
        ys += [b for _ in layers for b in layers]
    result = bootstrap(measure, xs, ys, resamples=resamples, seed=seed, groups=groups, **options)
    diagonal = sum(len(models[pairs[key][0]]) for key in wanted)
    parts = len(wanted) or 1
    bounds = dict(zip(wanted, zip(np.split(result.low[:diagonal], parts), np.split(result.high[:diagonal], parts))))
    centres = dict(zip(wanted, np.split((result.estimate if result.centre is None else result.centre)[:diagonal],
                                        parts)))
    resampled, at = {}, diagonal
    for key in matrices:
        size = len(models[selves[key]])
        resampled[key] = result.values[:, at:at + size * size].reshape(resamples, size, size)
        at += size * size
    if result.method == "none":  # no method covers for this measure (bootstrap.AUTO_INTERVAL): no interval
        return list(comparisons), resampled
    return [dataclasses.replace(c, interval=bounds[c.key], interval_method=result.method,
                                interval_centre=centres[c.key]) if c.key in bounds else c
            for c in comparisons], resampled


def above_random_interval(measure: str, models: dict[str, Sequence], *, resamples: int, seed: int,
                          groups: np.ndarray | None = None, **options) -> dict | None:
    """FT–ORIG's top layer minus FT–RANDOM's (FT[1]'s top layer against ORIG's and against the random-init
    control's: what fine-tuning kept beyond what an untrained network of the same architecture gives), with a paired
    bootstrap interval: both values on each of the same `resamples` of the examples (whole `groups` of rows), so the
    interval is of the difference, not two intervals side by side. The interval is the measure's own method
    (bootstrap.AUTO_INTERVAL; its coverage was measured for the measure, not for this difference), unclipped, since a
    difference may be negative. None without the random-init control, or for a measure no interval method covers.
    RANDOM is one draw of random weights: the interval is over examples, not over random initialisations."""
    method = chosen_interval(measure, "auto")
    if method is None or RANDOM not in models or "FT[1]" not in models:
        return None
    top = models["FT[1]"][-1]
    found = bootstrap_pairs(measure, [top, top], [models["ORIG"][-1], models[RANDOM][-1]], resamples=resamples,
                            seed=seed, groups=groups, interval=method, **options)
    estimate = float(found.estimate[0] - found.estimate[1])
    differences = found.values[:, 0] - found.values[:, 1]
    differences = differences[np.isfinite(differences)]
    if not np.isfinite(estimate) or not differences.size:
        return None
    low, high, _ = interval_of(estimate, differences, None, found.level, method)
    return {"value": estimate, "ci_low": float(low), "ci_high": float(high), "ci_method": method,
            "resamples": int(differences.size)}


def above_random_over_controls(measure: str, finetuned: np.ndarray, orig: np.ndarray, controls: dict[int, np.ndarray],
                               **options) -> dict | None:
    """FT–ORIG's top layer minus FT–RANDOM's for each of several random-init controls (`controls`: init seed → the
    control's top layer; `finetuned`, `orig`: FT[1]'s and ORIG's top layers, the same rows): the spread of the
    above-random value over draws of random weights, which the interval over examples
    (:func:`above_random_interval`, one draw) does not hold. Per control its value (``values``, by init seed); their
    ``mean``, and with three controls or more ``sd`` and the 95 % t-interval of the mean over draws
    (``ci_low``/``ci_high``: the controls taken as independent draws, layersim.similarity.inference.seeds.over_seeds),
    with two their ``range``. None with fewer than two controls, or where the measure is undefined on a control."""
    if len(controls) < 2:
        return None
    kept = similarity(measure, finetuned, orig, **options)
    values = {seed: kept - similarity(measure, finetuned, top, **options) for seed, top in controls.items()}
    if not all(np.isfinite(v) for v in [kept, *values.values()]):
        return None
    spread = over_seeds(np.array(list(values.values()))[:, None])
    found = {"controls": len(values), "values": {f"seed_{seed}": round(float(v), 6) for seed, v in values.items()},
             "mean": round(float(spread.mean[0]), 6),
             "note": spread.note.replace("seed", "control").replace(" on every layer", "")}
    if spread.sd is None:
        return found | {"range": round(float(spread.range[0]), 6)}
    return found | {key: round(float(value[0]), 6) for key, value in
                    (("sd", spread.sd), ("ci_low", spread.low), ("ci_high", spread.high))}


def seed_spread(matrix: np.ndarray, sizes: dict[str, int], finetuned: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Per layer, mean and standard deviation (ddof 1) of the FT[i]–FT[j] diagonal over every pair of seeds."""
    diagonals = np.array([np.diag(block(matrix, sizes, a, b)) for a, b in itertools.combinations(finetuned, 2)])
    return diagonals.mean(axis=0), diagonals.std(axis=0, ddof=1)


def seed_pair_spreads(matrix: np.ndarray, sizes: dict[str, int], finetuned: Sequence[str],
                      bounds: tuple[float, float] | None = None) -> dict[str, PairSpread]:
    """The layer-k-against-layer-k comparisons of runs of different seeds, each over its pairs with a jackknife
    interval over seeds (layersim.similarity.inference.seeds.over_seed_pairs): ``ft_pairs``, FT[i]–FT[j] (i < j);
    and for each method of finetune.compare_methods (e.g. LoRA), ``<method>_ft_other_seed``, LoRA[i]–FT[j] for
    j ≠ i, its difference from FT[i]–FT[j] (``<method>_ft_other_seed_minus_ft_pairs``: does the other method end as
    close to FT as FT's own seeds end to each other?) and ``<method>_ft_same_seed``, LoRA[i]–FT[i]. LoRA[i] and FT[i]
    share seed i: the head's initialisation and the order of the training data (layersim.training.train), so the
    same-seed pairs are confounded; the other-seed pairs are not."""
    def diagonal(row_model: str, column_model: str) -> np.ndarray:
        return np.diag(block(matrix, sizes, row_model, column_model))

    ft_pairs = {(i, j): diagonal(finetuned[i], finetuned[j])
                for i, j in itertools.combinations(range(len(finetuned)), 2)}
    spreads = {"ft_pairs": over_seed_pairs(ft_pairs, bounds=bounds)}
    for method, runs in compared_labels(sizes).items():
        seeds = range(min(len(runs), len(finetuned)))
        other = {(i, j): diagonal(runs[i], finetuned[j]) for i in seeds for j in seeds if i != j}
        key = f"{method.lower()}_ft"
        spreads |= {f"{key}_other_seed": over_seed_pairs(other, bounds=bounds),
                    f"{key}_other_seed_minus_ft_pairs": over_seed_pairs(other, baseline=ft_pairs),
                    f"{key}_same_seed": over_seed_pairs({(i, i): diagonal(runs[i], finetuned[i]) for i in seeds},
                                                        bounds=bounds)}
    return spreads
