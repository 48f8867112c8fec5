"""similarity: for one task, layer × layer matrices of every chosen measure (Wu et al. 2020) between the
pretrained model and the fine-tuned seeds — Phang et al.'s ORIG–ORIG, FT–ORIG, FT–FT and FT[1]–FT[2] —
per pooling, each cell with its permutation null and each reported diagonal with a bootstrap interval
(layersim.similarity_report); the localization score per layer; attention-level similarities.

Memory: with linear CKA as the only measure, the matrix is streamed from the activation tables in row
batches once that takes less memory than loading them (layersim.comparisons.stream_linear_cka); the
null and intervals, which need the rows in memory, are then left out and the metrics say so."""

from pathlib import Path

from tqdm.auto import tqdm

from layersim import cli
from layersim.comparisons import (attention_maps, per_layer, stacked_matrix, stream_linear_cka, stream_rows,
                                  streamed_linear_cka)
from layersim.io import ActivationTable, AttentionTable, atomic_path, run_expectations, write_figure, write_json
from layersim.similarity import check_computable
from layersim.similarity_report import localization_report, phang_report, settings


def run_labels(seeds) -> dict[str, str]:
    """Run name in the activation folder → label in figures (FT is the first seed, as in Phang)."""
    return {"orig": "ORIG"} | {f"seed{s}": f"FT[{i}]" for i, s in enumerate(seeds, start=1)}


def layer_sources(tables: dict, labels: dict, measures, options):
    """(`matrix_of(measure)`, `layers()`) over the runs' stacked layers: linear CKA streamed from the tables in
    row batches when that takes less memory (then `layers` is None), otherwise every measure on the layers,
    read once."""
    widths = [table.hidden_size for table in tables.values() for _ in range(table.num_layers + 1)]
    num_rows = next(iter(tables.values())).num_rows
    streamed = stream_linear_cka(measures, num_rows, widths)
    models = {}

    def layers():
        if not models:
            models.update({labels[run]: table.layers() for run, table in tables.items()})
        return models

    def matrix_of(measure):
        if measure == "linear_cka" and streamed:
            rows = stream_rows(widths)
            cli.log.info("streaming linear CKA from the activation tables, %d rows at a time", rows)
            batches = zip(*(table.iter_batches(rows) for table in tables.values()))
            return streamed_linear_cka(tqdm(batches, total=-(-num_rows // rows), desc="linear CKA", mininterval=2))
        return stacked_matrix(measure, layers(), **options.get(measure, {}))

    return matrix_of, (None if streamed else layers)


def main(args, params):
    # Each output folder appears complete or not at all.
    with (atomic_path(args.plots, is_dir=True) as plots, atomic_path(args.localization, is_dir=True) as localization_dir,
          atomic_path(args.diagonals, is_dir=True) as diagonals):
        write_outputs(args, params, Path(plots), Path(localization_dir), Path(diagonals))
    cli.log.info("wrote %s, %s, %s and %s", args.plots, args.localization, args.diagonals, args.metrics)


def write_outputs(args, params, plots: Path, localization_dir: Path, diagonals: Path):
    p = params.similarity
    labels = run_labels(params.seeds)
    options, uncertainty = settings(p)
    metrics, localization_rows = {}, []
    known = run_expectations(args.checkpoints, params.seeds)  # the weights the tables must come from
    for pooling, measures in p.measures.items():
        tables = {run: ActivationTable(args.activations / f"{run}.{pooling}.parquet", expect={
                      "task": args.task, "split": "validation", "run": run, "pooling": pooling, **known[run]})
                  for run in labels}
        for table in tables.values():
            tables["orig"].check_comparable(table)
        orig = tables["orig"]
        for measure in measures:  # before any work: e.g. mixedsim needs more examples than neurons
            check_computable(measure, orig.num_rows, orig.hidden_size)
        model = orig.metadata["model"]
        cli.log.info("read %d activation tables (%s pooling, %d rows) from %s", len(tables), pooling,
                     orig.num_rows, args.activations)
        sizes = {labels[run]: table.num_layers + 1 for run, table in tables.items()}
        matrix_of, layers = layer_sources(tables, labels, measures, options)
        report = phang_report(sizes, matrix_of, measures, f"{pooling.upper()} representations — {model} on {args.task}",
                              layers=layers, options=options, uncertainty=uncertainty, groups=orig.example_id)
        metrics[pooling] = report.metrics
        if layers is None:
            metrics[pooling]["null"] = "not computed: the tables were streamed (larger than memory)"
            cli.log.warning("%s: tables streamed, so no permutation null or bootstrap interval", pooling)
        metrics[pooling]["rows"] = orig.num_rows
        write_figure(report.figure, plots / f"{pooling}.png")
        write_json(report.rows, plots / f"{pooling}.json")
        if report.diagonal_figure is not None:
            write_figure(report.diagonal_figure, diagonals / f"{pooling}.png")
        write_json(report.diagonal_rows, diagonals / f"{pooling}.json")
        found = localization_report(report.matrices, sizes, p.localization,
                                    f"{pooling.upper()} — {model} on {args.task}", pooling=pooling)
        if found is not None:
            metrics[pooling]["localization"] = {label: per_layer(values) for label, values in found.scores.items()}
            localization_rows += found.rows
            write_figure(found.figure, localization_dir / f"{pooling}.png")
    # Always written (empty without neuronsim and svcca): git cannot hold an empty output folder.
    write_json(localization_rows, localization_dir / "localization.json")
    if p.attention_measures:
        tables = {run: AttentionTable(args.activations / "attention" / f"{run}.parquet",
                                      expect={"task": args.task, "split": "validation", "run": run,
                                              "model_digest": known[run]["model_digest"]})
                  for run in labels}
        for table in tables.values():
            tables["orig"].check_comparable(table)
        models = {labels[run]: attention_maps(table) for run, table in tables.items()}
        report = phang_report({label: len(maps) for label, maps in models.items()},
                              lambda measure: stacked_matrix(measure, models, **options.get(measure, {})),
                              p.attention_measures, f"attention maps — {model} on {args.task}", first_layer=1,
                              attention=True)
        metrics["attention"] = report.metrics
        write_figure(report.figure, plots / "attention.png")
        write_json(report.rows, plots / "attention.json")
    write_json(metrics, args.metrics)


if __name__ == "__main__":
    parser = cli.parser(__doc__)
    parser.add_argument("--task", required=True)
    parser.add_argument("--activations", type=Path, required=True, help="folder written by the extract stage")
    parser.add_argument("--checkpoints", type=Path, required=True, help="folder holding seed<k>/ checkpoints")
    parser.add_argument("--metrics", type=Path, required=True, help="metrics JSON to write")
    parser.add_argument("--plots", type=Path, required=True, help="folder for heatmap PNGs and plot data")
    parser.add_argument("--localization", type=Path, required=True, help="folder for localization curves")
    parser.add_argument("--diagonals", type=Path, required=True,
                        help="folder for the per-layer diagonals with their null and intervals")
    cli.run_stage(main, parser.parse_args())
