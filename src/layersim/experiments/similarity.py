"""The similarity stage's work for one task, walking down the layers: read the activation tables of the
pretrained model and the fine-tuned seeds (layersim.data.io, checked against the checkpoints they came from);
compute, per pooling, every measure's layer × layer matrices with their nulls, corrected p-values, intervals
and blocks (layersim.similarity.comparisons and .results), the localization score, attention-level
similarities and each run's layer-pruning measures (read from extract's records,
layersim.experiments.pruning_states); summarise them as figures, plot rows and metrics
(layersim.reporting.similarity). The stage writes what this returns.

Memory: when every measure can be computed from second moments (linear CKA, the CCA family, neuronsim,
mixedsim), the matrices come from one pass over the activation tables in row batches once that takes less
memory than loading them (layersim.similarity.comparisons.stream_layers); linear CKA's exact permutation null and the other
measures' rotation null (layersim.similarity.inference.rotation_null) come from the same moments, while debiased CKA's
permutation null and every bootstrap interval, which need the rows in memory, are then left out and the
metrics say so."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Executor, Future
from pathlib import Path

import numpy as np

from layersim.compute.threads import thread_pool
from layersim.data.io import ActivationTable, finetuned_runs
from layersim.experiments.similarity_inputs import (attention_inputs, layer_sources, pooling_tables, run_labels,
                                                   run_metadata)
from layersim.models.random_control import control_runs, random_run_metadata
from layersim.params import Params
from layersim.reporting.pruning_plots import pruning_profile, pruning_rows
from layersim.reporting.similarity import PoolingReport, SimilarityOutputs, localization_summary, phang_summary
from layersim.similarity.comparisons import RANDOM, attention_maps, per_layer, phang_cells, stacked_matrix
from layersim.similarity.cca import bases_reused
from layersim.similarity.comparison_intervals import above_random_over_controls
from layersim.similarity.inference.attention_null import attention_null_units
from layersim.similarity.inference.exchangeability import (STREAMED_SAMPLE_ROWS, block_permutations,
                                                           length_class_rows, null_units)
from layersim.similarity.inference.null import NullMatrix
from layersim.experiments.pruning_states import measured_rows, read_pruning_record
from layersim.similarity.pruning import measures_from_record
from layersim.similarity.results import (MeasureResult, Uncertainty, correct_claims, finetuned_labels,
                                         localization_of, phang_result, reach_warning, settings, trained_labels)
from layersim.training.convergence import checkpoint_flags, title_note


def measure_results(sizes: dict[str, int], matrix_of: Callable[[str], np.ndarray], measures: Sequence[str], *,
                    layers: Callable[[], dict[str, list]] | None = None, options: dict[str, dict] | None = None,
                    uncertainty: Uncertainty | None = None, groups: np.ndarray | None = None,
                    streamed_null: Callable[[str, np.ndarray, int, int], NullMatrix | None] | None = None,
                    null_rows: np.ndarray | None = None, pool: Executor | None = None) -> list[Future]:
    """Each measure's numbers (layersim.similarity.results.phang_result), as futures in the order of `measures`:
    computed on `pool`'s threads (layersim.compute.threads.thread_pool) when the layers are in memory, one measure
    per thread; here, one after the other, without a pool or when the tables are streamed (their moments are
    gathered once, on first use). Arguments as for :func:`phang_report`."""
    options = options or {}
    tested = uncertainty is not None
    models = layers() if tested and layers is not None else None  # read here, once, before any thread uses them

    def result(measure: str) -> MeasureResult:
        with bases_reused():  # the observed matrix's per-layer SVDs serve the null and the intervals too
            matrix = matrix_of(measure)
            null = None
            if tested and models is None and streamed_null is not None:
                null = streamed_null(measure, phang_cells(sizes, "ORIG", finetuned_labels(sizes)),
                                     uncertainty.permutations, uncertainty.seed)
            return phang_result(measure, matrix, sizes, models=models, null=null, uncertainty=uncertainty,
                                groups=groups, options=options.get(measure, {}), null_rows=null_rows)

    if pool is None or (layers is None and streamed_null is not None):
        return [_done(result(measure)) for measure in measures]
    return [pool.submit(result, measure) for measure in measures]


def _done(value) -> Future:
    future = Future()
    future.set_result(value)
    return future


def phang_report(sizes: dict[str, int], matrix_of: Callable[[str], np.ndarray], measures: Sequence[str],
                 title: str, *, layers: Callable[[], dict[str, list]] | None = None,
                 options: dict[str, dict] | None = None, uncertainty: Uncertainty | None = None,
                 groups: np.ndarray | None = None, first_layer: int = 0, attention: bool = False,
                 streamed_null: Callable[[str, np.ndarray, int, int], NullMatrix | None] | None = None,
                 flagged: Collection[str] = (), null_rows: np.ndarray | None = None,
                 pool: Executor | None = None, pending: Sequence[Future] | None = None) -> PoolingReport:
    """Stacked matrices per measure (`matrix_of(measure)`, layers per model in `sizes`: ORIG, then FT[1], FT[2], …)
    as Phang et al.'s comparisons: each measure's numbers computed (layersim.similarity.results), then reported
    (layersim.reporting.similarity.phang_summary).

    With `uncertainty` and `layers()` (the models' layer arrays, by the labels of `sizes`), each reported cell
    gets its permutation null and the FT–ORIG and FT[1]–FT[2] diagonals a bootstrap interval over examples
    (over `groups` of rows: the words of one example are resampled together); with more than two seeds,
    the FT[i]–FT[j] diagonals' mean ± sd over all pairs. Attention maps (`attention`) get theirs from
    layersim.similarity.inference.attention_null: whole examples exchanged only with examples of equal length,
    `groups` then each example's cluster. Without `layers` (tables streamed),
    `streamed_null(measure, cells, permutations, seed)` gives the nulls it can from the streamed moments (None
    otherwise), and there are no bootstrap intervals. `null_rows`: the rows the in-memory nulls are computed on
    (similarity.length_classes; layersim.similarity.results.phang_result). `pool`: the measures computed on its
    threads (:func:`measure_results`); `pending`: the futures :func:`measure_results` already gave for these
    measures (then nothing is computed here but the summary, on this thread: figures are not thread-safe).
    """
    if pending is None:
        pending = measure_results(sizes, matrix_of, measures, layers=layers, options=options,
                                  uncertainty=uncertainty, groups=groups, streamed_null=streamed_null,
                                  null_rows=null_rows, pool=pool)
    return phang_summary([future.result() for future in pending], sizes, title, uncertainty=uncertainty,
                         first_layer=first_layer, attention=attention, flagged=flagged)


def _above_random_controls(metrics: dict, measures: Sequence[str], tables: dict[str, ActivationTable],
                           labels: dict[str, str], controls: dict[str, int], activations: Path, expect: dict,
                           known: dict[str, dict], options: dict) -> None:
    """Each measure's above-random value over every random-init control (similarity.random_controls), under
    ``ft_orig_above_random_controls`` (layersim.similarity.comparison_intervals.above_random_over_controls): the top
    layers of FT[1], ORIG and each control, one layer each read from the tables (the further controls' tables
    checked against their init seed)."""
    first = next(run for run, label in labels.items() if label == "FT[1]")
    top = tables["orig"].num_layers
    orig, finetuned = tables["orig"].layer(top), tables[first].layer(top)
    tops = {}
    for run, seed in controls.items():
        table = tables.get(run) or ActivationTable(activations / f"{run}.{expect['pooling']}.parquet", expect={
            **expect, "run": run, **random_run_metadata(known["orig"], seed)})
        tables["orig"].check_comparable(table)
        tops[seed] = table.layer(top)
    for measure in measures:
        found = above_random_over_controls(measure, finetuned, orig, tops, **options.get(measure, {}))
        if found is not None:
            metrics[measure]["ft_orig_above_random_controls"] = found


def task_similarity(activations: Path, checkpoints: Path, task: str, params: Params,
                    log=lambda *args: None, warn=lambda *args: None, pruning: bool = False) -> SimilarityOutputs:
    """Everything the stage writes (figures and rows by folder: "plots", "diagonals", "localization" and, with
    `pruning`, "pruning": Block Influence and angular distances per run, as extract wrote them beside the tables:
    layersim.experiments.pruning_states)."""
    p = params.similarity
    runs = finetuned_runs(params.finetune, params.seeds)  # finetune.method's, then compare_methods'
    labels = run_labels(runs, p.random_control)
    options, uncertainty = settings(p)
    out, localization_rows = SimilarityOutputs(), []
    known = run_metadata(checkpoints, runs, p.random_control)
    if pruning:  # ShortGPT's BI over every token, Gromov et al.'s angles on the head's token: read before any work
        pruned = {labels[run]: read_pruning_record(activations / f"{run}.pruning.json", {
            "task": task, "split": "validation", "run": run, **known[run]}) for run in labels}
    flags = checkpoint_flags(checkpoints, runs)  # runs that did not converge, by label
    flagged = title_note(list(flags))
    model = params.model
    attention = None  # once started: the attention maps by label, and their measures' futures
    if p.attention_measures:  # its tables and clusters checked before any work
        attention_tables, attention_clusters = attention_inputs(activations, task, labels, known, list(p.measures))

        def attention_results(pool: Executor) -> tuple[dict, list[Future]]:
            models = {labels[run]: attention_maps(table) for run, table in attention_tables.items()}
            return models, measure_results(
                {label: len(maps) for label, maps in models.items()},
                lambda measure: stacked_matrix(measure, models, **options.get(measure, {})), p.attention_measures,
                layers=lambda: models, options=options, uncertainty=uncertainty, groups=attention_clusters,
                pool=pool)
    # The measures of each pooling, and the attention section beside them, on threads (layersim.compute.threads);
    # what each writes is summarised here, in this order, so the outputs do not depend on which finished first.
    with thread_pool() as pool:
        for pooling, measures in p.measures.items():
            tables = pooling_tables(activations, task, pooling, labels, known, measures)
            orig = tables["orig"]
            model = orig.metadata["model"]
            log("read %d activation tables (%s pooling, %d rows) from %s", len(tables), pooling, orig.num_rows,
                activations)
            sizes = {labels[run]: table.num_layers + 1 for run, table in tables.items()}
            matrix_of, layers, streamed_null = layer_sources(tables, labels, measures, options, log)
            # Before any permutation: can the correction declare a cell of a heatmap with this many draws?
            shortfall = reach_warning(uncertainty, measures, orig.num_rows, options, max(sizes.values()) ** 2,
                                      f"similarity ({pooling})", streamed=layers is None)
            if shortfall:
                warn("%s", shortfall)
            # Rows of one cluster (the words and choices of an example, and every example sharing its premise,
            # question or context) move together in the nulls and are resampled together in the intervals.
            clusters = orig.cluster_id
            blocks = block_permutations(orig.num_rows, clusters)
            # Coarser length classes (similarity.length_classes): each cluster cut to a multiple of rows for the null.
            coarse = p.length_classes > 1 and not blocks.plain and layers is not None
            null_rows = length_class_rows(clusters, p.length_classes) if coarse else None
            tested = blocks if null_rows is None else block_permutations(len(null_rows), clusters[null_rows])
            note = tested.note(uncertainty.significance) if tested.movable > 0 else None  # none movable: metrics say
            if note:
                warn("similarity (%s): %s%s", pooling, note, "" if coarse or blocks.plain else
                     "; similarity.length_classes (e.g. 5) lets clusters of nearly equal length move "
                     "(docs/reading-the-numbers.md)")
            pending = measure_results(sizes, matrix_of, measures, layers=layers, options=options,
                                      uncertainty=uncertainty, groups=clusters, streamed_null=streamed_null,
                                      null_rows=null_rows, pool=pool)
            if p.attention_measures and attention is None:  # after the first pooling's checks, before its results
                attention = attention_results(pool)
            report = phang_report(sizes, matrix_of, measures,
                                  f"{pooling.upper()} representations — {model} on {task}{flagged}",
                                  uncertainty=uncertainty, flagged=set(flags), pending=pending)
            metrics = out.metrics[pooling] = report.metrics
            metrics["null_unit"] = null_units(orig.num_rows, clusters, unit=orig.null_unit(),
                                              length_classes=p.length_classes if coarse else 1)
            for measure in measures:
                if metrics[measure].get("no_null"):
                    warn("%s: no null and no bootstrap interval for %s: %s", pooling, measure,
                         metrics[measure]["no_null"])
            if layers is None:
                without = [m for m in measures if "null" not in metrics[m]]
                rotated = [m for m in measures if metrics[m].get("null", {}).get("method") == "rotation"]
                blocked = [m for m in measures if metrics[m].get("null", {}).get("method") == "block permutation"]
                metrics["null"] = ("tables streamed (larger than memory): no bootstrap intervals"
                                   + (f"; a rotation null (rows rotated, not shuffled) for {', '.join(rotated)}"
                                      if rotated else "")
                                   + (f"; block nulls (whole examples permuted) from a random sample of whole "
                                      f"examples of at most {STREAMED_SAMPLE_ROWS} rows, their observed values "
                                      f"computed on it, for {', '.join(blocked)}" if blocked else "")
                                   + (f"; no permutation null for {', '.join(without)}" if without else ""))
                warn("%s: tables streamed, so no bootstrap interval%s", pooling,
                     f" and no permutation null for {', '.join(without)}" if without else "")
            metrics["rows"] = orig.num_rows
            if p.random_control is not None and p.random_controls > 1:
                controls = control_runs(p.random_control, p.random_controls)
                _above_random_controls(metrics, measures, tables, labels, controls, activations,
                                       {"task": task, "split": "validation", "pooling": pooling}, known, options)
            # How the tables stored these rows (extract.table_precision: word rows and example rows may differ).
            metrics["table_precision"] = "; ".join(sorted({table.precision for table in tables.values()}))
            out.figures["plots", f"{pooling}.png"] = report.figure
            out.rows["plots", f"{pooling}.json"] = report.rows
            if report.diagonal_figure is not None:
                out.figures["diagonals", f"{pooling}.png"] = report.diagonal_figure
            out.rows["diagonals", f"{pooling}.json"] = report.diagonal_rows
            scores = localization_of(report.matrices, sizes, p.localization, trained_labels(sizes))  # RANDOM left out
            if scores is not None:
                found = localization_summary(scores, p.localization, f"{pooling.upper()} — {model} on {task}",
                                             pooling=pooling)
                metrics["localization"] = {label: per_layer(values) for label, values in found.scores.items()}
                localization_rows += found.rows
                out.figures["localization", f"{pooling}.png"] = found.figure
        if pruning:
            measures = {label: measures_from_record(record) for label, record in pruned.items()}
            out.rows["pruning", "block_influence.json"], out.rows["pruning", "angular_distance.json"] = pruning_rows(
                measures, rows=measured_rows(pruned["ORIG"]))  # what each measure averages over: the same for every run
            out.figures["pruning", "pruning.png"] = pruning_profile(
                measures,
                f"Block Influence (every token), angular distance (the head's token) — {model} on {task}{flagged}")
        # Always written (empty without neuronsim and svcca): git cannot hold an empty output folder.
        out.rows["localization", "localization.json"] = localization_rows
        if p.attention_measures:
            models, pending = attention or attention_results(pool)
            report = phang_report({label: len(maps) for label, maps in models.items()}, None, p.attention_measures,
                                  f"attention maps — {model} on {task}{flagged}", uncertainty=uncertainty,
                                  first_layer=1, attention=True, flagged=set(flags), pending=pending)
            metrics = out.metrics["attention"] = report.metrics
            metrics["null_unit"] = attention_null_units(models["ORIG"][0], attention_clusters)
            for measure in p.attention_measures:
                if metrics[measure].get("no_null"):
                    warn("attention: no null and no bootstrap interval for %s: %s", measure,
                         metrics[measure]["no_null"])
            out.figures["plots", "attention.png"] = report.figure
            out.rows["plots", "attention.json"] = report.rows
            if report.diagonal_figure is not None:
                out.figures["diagonals", "attention.png"] = report.diagonal_figure
            out.rows["diagonals", "attention.json"] = report.diagonal_rows
        correct_claims(out.metrics, p.correction)  # the headline claims of every measure and pooling: one family
        return out
