"""The similarity stage's work for one task: read the activation tables of the pretrained model and the
fine-tuned seeds (checked against the checkpoints they came from) and report, per pooling, every
measure's layer × layer matrices with their nulls and intervals (layersim.reporting.similarity), the
localization score, and attention-level similarities. Returns figures, plot rows and metrics; the
stage writes them.

Memory: when every measure can be computed from second moments (linear CKA, the CCA family, neuronsim,
mixedsim), the matrices come from one pass over the activation tables in row batches once that takes less
memory than loading them (layersim.similarity.comparisons.stream_layers); linear CKA's exact permutation null and the other
measures' rotation null (layersim.similarity.rotation_null) come from the same moments, while debiased CKA's
permutation null and every bootstrap interval, which need the rows in memory, are then left out and the
metrics say so."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from layersim.similarity.comparisons import (RANDOM, attention_maps, moments_stacked_matrix, moments_stacked_null,
                                             per_layer, stacked_matrix, stream_layers, stream_rows, streamed_moments)
from layersim.training.convergence import checkpoint_note
from layersim.data.io import ActivationTable, AttentionTable, run_expectations, write_figure, write_json
from layersim.models.random_control import RANDOM_RUN, random_run_metadata
from layersim.params import Params
from layersim.similarity import LayerMoments, check_computable
from layersim.reporting.similarity import localization_report, phang_report, sampled_null_measures, settings


def run_labels(seeds, random_control: int | None = None) -> dict[str, str]:
    """Run name in the activation folder → label in figures (FT is the first seed, as in Phang); with
    `random_control` (its init seed), the random-init control last."""
    labels = {"orig": "ORIG"} | {f"seed{s}": f"FT[{i}]" for i, s in enumerate(seeds, start=1)}
    return labels if random_control is None else labels | {RANDOM_RUN: RANDOM}


def run_metadata(checkpoints: Path, seeds, random_control: int | None = None) -> dict[str, dict]:
    """Run name → the metadata its activation tables must hold (layersim.data.io.run_expectations), the random-init
    control's (layersim.models.registry.random_run_metadata) included when `random_control` is its seed."""
    known = run_expectations(checkpoints, seeds)  # the weights the tables must come from
    if random_control is not None:
        known[RANDOM_RUN] = random_run_metadata(known["orig"], random_control)
    return known


def layer_sources(tables: dict, labels: dict, measures, options, log=lambda *args: None):
    """(`matrix_of(measure)`, `layers()`, `streamed_null(measure, cells, permutations, seed)`) over the runs'
    stacked layers: every measure from moments streamed from the tables in row batches (one pass for all) when
    that takes less memory (then `layers` is None and `streamed_null` gives the nulls the moments determine),
    otherwise every measure on the layers, read once (and `streamed_null` is None)."""
    widths = [table.hidden_size for table in tables.values() for _ in range(table.num_layers + 1)]
    num_rows = next(iter(tables.values())).num_rows
    streamed = stream_layers(measures, num_rows, widths)
    models, moments, matrices = {}, [], {}

    def layers():
        if not models:
            models.update({labels[run]: table.layers() for run, table in tables.items()})
        return models

    def accumulated():
        if not moments:
            rows = stream_rows(widths)
            log("streaming the layers' moments from the activation tables, %d rows at a time", rows)
            batches = zip(*(table.iter_batches(rows) for table in tables.values()))
            gathered = streamed_moments(tqdm(batches, total=-(-num_rows // rows), desc="moments", mininterval=2))
            moments.extend([gathered, LayerMoments(gathered)])  # the second keeps each layer's basis for reuse
        return moments

    def matrix_of(measure):
        if not streamed:
            return stacked_matrix(measure, layers(), **options.get(measure, {}))
        if measure not in matrices:
            sums, bases = accumulated()
            matrices[measure] = moments_stacked_matrix(measure, sums, moments=bases, **options.get(measure, {}))
        return matrices[measure]

    def streamed_null(measure, cells, permutations, seed):
        sums, bases = accumulated()
        return moments_stacked_null(measure, sums, cells, permutations=permutations, seed=seed,
                                    observed=matrix_of(measure), moments=bases, **options.get(measure, {}))

    return (matrix_of, layers, None) if not streamed else (matrix_of, None, streamed_null)


@dataclass
class SimilarityOutputs:
    """What the stage writes: figures and plot rows by (folder, file name), folders being "plots",
    "diagonals" and "localization"; and the metrics."""
    figures: dict[tuple[str, str], object] = field(default_factory=dict)
    rows: dict[tuple[str, str], list] = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)

    def write(self, folders: dict[str, Path]) -> None:
        """Every figure (PNG) and plot-row file (JSON) into its folder."""
        for (where, name), figure in self.figures.items():
            write_figure(figure, folders[where] / name)
        for (where, name), rows in self.rows.items():
            write_json(rows, folders[where] / name)


def task_similarity(activations: Path, checkpoints: Path, task: str, params: Params,
                    log=lambda *args: None, warn=lambda *args: None) -> SimilarityOutputs:
    p = params.similarity
    labels = run_labels(params.seeds, p.random_control)
    options, uncertainty = settings(p)
    out, localization_rows = SimilarityOutputs(), []
    known = run_metadata(checkpoints, params.seeds, p.random_control)
    flagged = checkpoint_note(checkpoints, params.seeds)  # runs that did not converge
    model = params.model
    for pooling, measures in p.measures.items():
        tables = {run: ActivationTable(activations / f"{run}.{pooling}.parquet", expect={
                      "task": task, "split": "validation", "run": run, "pooling": pooling, **known[run]})
                  for run in labels}
        for table in tables.values():
            tables["orig"].check_comparable(table)
        orig = tables["orig"]
        for measure in measures:  # before any work: e.g. mixedsim needs more examples than neurons
            check_computable(measure, orig.num_rows, orig.hidden_size)
        model = orig.metadata["model"]
        log("read %d activation tables (%s pooling, %d rows) from %s", len(tables), pooling, orig.num_rows, activations)
        sizes = {labels[run]: table.num_layers + 1 for run, table in tables.items()}
        matrix_of, layers, streamed_null = layer_sources(tables, labels, measures, options, log)
        # Before any permutation: can the correction declare a cell of a heatmap with this many draws?
        sampled = sampled_null_measures(measures, orig.num_rows, options, streamed=layers is None)
        shortfall = uncertainty.check_reach(max(sizes.values()) ** 2, sampled, f"similarity ({pooling})")
        if shortfall:
            warn("%s", shortfall)
        report = phang_report(sizes, matrix_of, measures, f"{pooling.upper()} representations — {model} on {task}{flagged}",
                              layers=layers, options=options, uncertainty=uncertainty, groups=orig.example_id,
                              streamed_null=streamed_null)
        metrics = out.metrics[pooling] = report.metrics
        for measure in measures:
            if metrics[measure].get("no_null"):
                warn("%s: no null and no bootstrap interval for %s: %s", pooling, measure, metrics[measure]["no_null"])
        if layers is None:
            without = [m for m in measures if "null" not in metrics[m]]
            rotated = [m for m in measures if metrics[m].get("null", {}).get("method") == "rotation"]
            metrics["null"] = ("tables streamed (larger than memory): no bootstrap intervals"
                               + (f"; a rotation null (rows rotated, not shuffled) for {', '.join(rotated)}"
                                  if rotated else "")
                               + (f"; no permutation null for {', '.join(without)}" if without else ""))
            warn("%s: tables streamed, so no bootstrap interval%s", pooling,
                 f" and no permutation null for {', '.join(without)}" if without else "")
        metrics["rows"] = orig.num_rows
        out.figures["plots", f"{pooling}.png"] = report.figure
        out.rows["plots", f"{pooling}.json"] = report.rows
        if report.diagonal_figure is not None:
            out.figures["diagonals", f"{pooling}.png"] = report.diagonal_figure
        out.rows["diagonals", f"{pooling}.json"] = report.diagonal_rows
        found = localization_report(report.matrices, sizes, p.localization, f"{pooling.upper()} — {model} on {task}",
                                    pooling=pooling)
        if found is not None:
            metrics["localization"] = {label: per_layer(values) for label, values in found.scores.items()}
            localization_rows += found.rows
            out.figures["localization", f"{pooling}.png"] = found.figure
    # Always written (empty without neuronsim and svcca): git cannot hold an empty output folder.
    out.rows["localization", "localization.json"] = localization_rows
    if p.attention_measures:
        tables = {run: AttentionTable(activations / "attention" / f"{run}.parquet",
                                      expect={"task": task, "split": "validation", "run": run,
                                              "model_digest": known[run]["model_digest"]})
                  for run in labels}
        for table in tables.values():
            tables["orig"].check_comparable(table)
        models = {labels[run]: attention_maps(table) for run, table in tables.items()}
        report = phang_report({label: len(maps) for label, maps in models.items()},
                              lambda measure: stacked_matrix(measure, models, **options.get(measure, {})),
                              p.attention_measures, f"attention maps — {model} on {task}{flagged}", first_layer=1,
                              attention=True)
        out.metrics["attention"] = report.metrics
        out.figures["plots", "attention.png"] = report.figure
        out.rows["plots", "attention.json"] = report.rows
    return out
