"""The grounding stage's work for one task: which measure of similarity.measures (and of grounding.measures, computed
here on the same tables) to trust on this model and task,
by ReSi's grounding tests that the pipeline's own runs allow (layersim.similarity.grounding): layer monotonicity within
each trained model (ORIG and every seed's FT[i]; the random-init control's as a reference, not ranked) and the AUPRC of
telling seeds apart from fine-tuning (FT[i]–FT[j] against FT[i]–ORIG, layer k against layer k, two seeds or more).

The stacked layer × layer matrix of every measure comes from the activation tables exactly as the similarity stage
computes it (layersim.experiments.similarity.layer_sources: in memory, or from streamed moments), without nulls or
intervals: the similarity stage writes only Phang et al.'s blocks of it (FT[1]–FT[2], FT[1]–ORIG), and the tests need
every seed's own block and every pair of seeds. The runs of finetune.compare_methods are left out."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from layersim.data.io import finetuned_runs
from layersim.errors import LayersimError
from layersim.experiments.similarity_inputs import layer_sources, pooling_tables, run_labels, run_metadata
from layersim.params import Params
from layersim.similarity.comparisons import RANDOM, block, number
from layersim.similarity.grounding import (Ranking, monotonicity_conformity, monotonicity_correlation, rank_measures,
                                           separation_chance, separation_per_layer)
from layersim.similarity.registry import check_computable_on
from layersim.similarity.results import finetuned_labels, settings, trained_labels

OFF = "grounding.enabled is false: no test was run (set it to true to rank the measures)"


@dataclass
class GroundingOutputs:
    """What the grounding stage writes: every value (`full`, for the details file), the headline (each measure's mean
    rank per pooling), the ranking table's rows, and the figure (None when the stage is off)."""

    full: dict
    headline: dict
    rows: list[dict] = field(default_factory=list)
    figure: object = None


def _finite_mean(values) -> float | None:
    finite = [value for value in values if np.isfinite(value)]
    return number(np.mean(finite)) if finite else None


def pooling_grounding(matrix_of: Callable[[str], np.ndarray], measures, sizes: dict[str, int], resamples: int,
                      seed: int) -> tuple[dict, Ranking]:
    """The tests of each measure on one pooling's stacked matrices (`matrix_of(measure)`, models in `sizes`' order:
    ORIG, FT[1], …, RANDOM), every value for the details, and the ranking."""
    trained, finetuned = trained_labels(sizes), finetuned_labels(sizes)
    starts = dict(zip(sizes, np.cumsum([0, *sizes.values()])))
    num_layers = sizes["ORIG"]
    units = {"monotonicity": {}, "separation": {}} if len(finetuned) > 1 else {"monotonicity": {}}
    values = {}
    for measure in measures:
        matrix = matrix_of(measure)
        own = {label: block(matrix, sizes, label, label) for label in sizes}
        correlations = {label: monotonicity_correlation(own[label]) for label in trained}
        entry = values[measure] = {"monotonicity": {
            "per_run": {label: number(value) for label, value in correlations.items()},
            "conformity": _finite_mean([monotonicity_conformity(own[label]) for label in trained])}}
        if RANDOM in sizes:  # the untrained control: what depth alone gives, beside the trained models
            entry["monotonicity"]["random_control"] = number(monotonicity_correlation(own[RANDOM]))
        units["monotonicity"][measure] = list(correlations.values())
        if "separation" in units:
            per_layer, same, different = separation_per_layer(matrix, starts, num_layers, "ORIG", finetuned)
            entry["separation"] = {"per_layer": [number(v) for v in per_layer], "same_pairs": same,
                                   "different_pairs": different, "chance": number(separation_chance(same, different))}
            units["separation"][measure] = per_layer
    ranking = rank_measures(units, resamples, seed)
    for measure in measures:
        for test in ranking.tests:
            low, high = ranking.interval[test][measure]
            values[measure][test] |= {"score": number(ranking.score[test][measure]), "low": number(low),
                                      "high": number(high)}
        low, high = ranking.rank_interval[measure]
        values[measure]["rank"] = {"mean_rank": number(ranking.mean_rank[measure]), "low": number(low),
                                   "high": number(high), "top_share": number(ranking.top_share[measure])}
    if "separation" not in units:
        values["separation_unavailable"] = "needs two seeds or more: one seed gives no FT[i]–FT[j] pair"
    return values, ranking


def ranking_rows(pooling: str, values: dict, ranking: Ranking) -> list[dict]:
    """The ranking table of one pooling, best first: a row per measure with each test's score and interval."""
    order = sorted(ranking.measures, key=lambda m: ranking.mean_rank[m])
    rows = []
    for place, measure in enumerate(order, 1):
        entry = values[measure]
        row = {"pooling": pooling, "measure": measure, "place": place, **{
            f"rank_{key}" if key != "mean_rank" else key: value for key, value in entry["rank"].items()}}
        for test in ranking.tests:
            row |= {test: entry[test]["score"], f"{test}_low": entry[test]["low"], f"{test}_high": entry[test]["high"]}
        row["conformity"] = entry["monotonicity"]["conformity"]
        row["random_control_monotonicity"] = entry["monotonicity"].get("random_control")
        if "separation" in ranking.tests:
            row["separation_chance"] = entry["separation"]["chance"]
        rows.append(row)
    return rows


def computable_extras(extra, table, options) -> tuple[tuple[str, ...], dict[str, str]]:
    """Which of the measures `extra` (grounding.measures beyond a pooling's similarity.measures) can be computed on
    this pooling's tables (ORIG's `table`: rows and width), and why each other one cannot (its one-sentence error):
    a measure that needs more examples than one pooling has is left out of that pooling's ranking only."""
    computable, left_out = [], {}
    for measure in extra:
        try:
            check_computable_on(measure, table.num_rows, table.hidden_size, **options.get(measure, {}))
        except LayersimError as err:
            left_out[measure] = str(err)
        else:
            computable.append(measure)
    return tuple(computable), left_out


def task_grounding(activations, checkpoints, task: str, params: Params, log=lambda *args: None) -> GroundingOutputs:
    """Everything the stage writes for one task; with grounding.enabled false, only the record that it is off."""
    g = params.grounding
    if not g.enabled:
        return GroundingOutputs({"enabled": False, "note": OFF}, {"enabled": False})
    from layersim.reporting.grounding import ranking_figure  # matplotlib: only when there is a figure to draw

    p = params.similarity
    runs = finetuned_runs(params.finetune, params.seeds)
    labels = run_labels(runs, p.random_control)
    options, _ = settings(p)
    known = run_metadata(checkpoints, runs, p.random_control)
    full, headline, rows, rankings = {"enabled": True, "bootstrap": g.bootstrap, "seed": g.seed}, {}, [], {}
    work = {}  # pooling → (tables, sizes, measures), all checked before any measure runs
    for pooling, measures in p.measures.items():
        tables = pooling_tables(activations, task, pooling, labels, known, measures)
        sizes = {labels[run]: table.num_layers + 1 for run, table in tables.items()}
        if sizes["ORIG"] < 3:
            raise LayersimError(f"grounding needs 3 layer representations or more to test layer monotonicity; "
                                f"{params.model} has {sizes['ORIG']} (embeddings and {sizes['ORIG'] - 1} layer): set "
                                "grounding.enabled to false for it.")
        extra, left_out = computable_extras(g.ranked(measures)[len(measures):], tables["orig"], options)
        if left_out:
            full[pooling] = {"left_out": left_out}
        kept = set(trained_labels(sizes)) | ({RANDOM} & set(sizes))  # not finetune.compare_methods' runs
        work[pooling] = ({run: table for run, table in tables.items() if labels[run] in kept},
                         {label: size for label, size in sizes.items() if label in kept}, (*measures, *extra))
    nowhere = [m for m in g.measures if not any(m in measures for _, _, measures in work.values())]
    if nowhere:
        reasons = "; ".join(full[pooling]["left_out"][nowhere[0]] for pooling in work)
        raise LayersimError(f"grounding.measures has {nowhere[0]!r}, which no pooling of similarity.measures can "
                            f"compute: {reasons}")
    for pooling, (tables, sizes, measures) in work.items():
        log("grounding %s: %d measures on %d runs' layers", pooling, len(measures), len(tables))
        matrix_of, _, _ = layer_sources(tables, labels, measures, options, log)
        values, ranking = pooling_grounding(matrix_of, measures, sizes, g.bootstrap, g.seed)
        full[pooling], rankings[pooling] = full.get(pooling, {}) | values, ranking
        headline[pooling] = {m: values[m]["rank"]["mean_rank"] for m in measures}
        rows += ranking_rows(pooling, values, ranking)
    full["runs"] = {"monotonicity": "ORIG and each seed's FT[i] (RANDOM: reference only)",
                    "separation": "each layer, FT[i]–FT[j] pairs against FT[i]–ORIG"}
    model = params.model
    return GroundingOutputs(full, headline, rows, ranking_figure(rankings, f"which measure to trust — {model} on {task}"))
