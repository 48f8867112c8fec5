"""similarity: for one task, layer × layer matrices of every chosen measure (Wu et al. 2020) between the
pretrained model and the fine-tuned seeds — Phang et al.'s ORIG–ORIG, FT–ORIG, FT–FT and FT[1]–FT[2] —
per pooling; the localization score per layer; attention-level similarities.

Memory: with linear CKA as the only measure, the matrix is streamed from the activation tables in row
batches once that takes less memory than loading them, so memory stays bounded however many examples
there are (layersim.comparisons.stream_linear_cka). Every other measure needs all layers in memory."""

from pathlib import Path

from tqdm.auto import tqdm

from layersim import cli
from layersim.comparisons import (attention_measure_bounds, attention_measure_label, localization,
                                  measure_options, number, phang_comparisons, stacked_matrix, stream_linear_cka,
                                  stream_rows, streamed_linear_cka, summarize)
from layersim.io import ActivationTable, AttentionTable, atomic_path, write_figure, write_json
from layersim.plots import localization_curves, matrix_rows, measure_grid
from layersim.similarity import MEASURES


def run_labels(seeds) -> dict[str, str]:
    """Run name in the activation folder → label in figures (FT is the first seed, as in Phang)."""
    return {"orig": "ORIG"} | {f"seed{s}": f"FT[{i}]" for i, s in enumerate(seeds, start=1)}


def compare(sizes: dict, matrix_of, measures, title: str, first_layer: int = 0, attention: bool = False):
    """Stacked matrices per measure, `matrix_of(measure)` (layers per model in `sizes`) → (figure, plot rows,
    metrics, matrices by measure)."""
    orig, finetuned = "ORIG", [label for label in sizes if label != "ORIG"]
    grid, rows, metrics, matrices = {}, [], {}, {}
    for measure in measures:
        matrix = matrix_of(measure)
        matrices[measure] = matrix
        comparisons = phang_comparisons(matrix, sizes, orig, finetuned)
        label = attention_measure_label(measure) if attention else MEASURES[measure].label
        bounds = attention_measure_bounds(measure) if attention else MEASURES[measure].bounded
        grid[label] = ({c.title: (c.matrix, c.y_label, c.x_label) for c in comparisons}, bounds)
        rows += [row for c in comparisons
                 for row in matrix_rows(c.matrix, "similarity", comparison=c.title, measure=label,
                                        first_layer=first_layer)]
        metrics[measure] = summarize(comparisons, first_layer)
    return measure_grid(grid, title, first_layer=first_layer), rows, metrics, matrices


def layer_matrices(tables: dict, labels: dict, measures, options):
    """`matrix_of(measure)` over the runs' stacked layers: linear CKA streamed from the tables in row batches
    when that takes less memory (see the module docstring), every other measure on the layers, read once."""
    widths = [table.hidden_size for table in tables.values() for _ in range(table.num_layers + 1)]
    streamed = stream_linear_cka(measures, next(iter(tables.values())).num_rows, widths)
    models = {}

    def matrix_of(measure):
        if measure == "linear_cka" and streamed:
            rows, num_rows = stream_rows(widths), next(iter(tables.values())).num_rows
            cli.log.info("streaming linear CKA from the activation tables, %d rows at a time", rows)
            batches = zip(*(table.iter_batches(rows) for table in tables.values()))
            return streamed_linear_cka(tqdm(batches, total=-(-num_rows // rows), desc="linear CKA", mininterval=2))
        if not models:
            models.update({labels[run]: table.layers() for run, table in tables.items()})
        return stacked_matrix(measure, models, **options.get(measure, {}))

    return matrix_of


def main(args, params):
    # Each output folder appears complete or not at all.
    with atomic_path(args.plots, is_dir=True) as plots, atomic_path(args.localization, is_dir=True) as localization_dir:
        write_outputs(args, params, Path(plots), Path(localization_dir))
    cli.log.info("wrote %s, %s and %s", args.plots, args.localization, args.metrics)


def write_outputs(args, params, plots: Path, localization_dir: Path):
    p = params.similarity
    labels = run_labels(params.seeds)
    options = measure_options(rbf_sigma_scale=p.rbf_sigma_scale, svcca_variance=p.svcca_variance)
    metrics, localization_rows = {}, []
    for pooling in p.poolings:
        tables = {run: ActivationTable(args.activations / f"{run}.{pooling}.parquet", expect={
                      "task": args.task, "split": "validation", "run": run, "pooling": pooling}) for run in labels}
        for table in tables.values():
            tables["orig"].check_comparable(table)
        model = tables["orig"].metadata["model"]
        cli.log.info("read %d activation tables (%s pooling, %d rows) from %s", len(tables), pooling,
                     tables["orig"].num_rows, args.activations)
        sizes = {labels[run]: table.num_layers + 1 for run, table in tables.items()}
        figure, rows, metrics[pooling], matrices = compare(
            sizes, layer_matrices(tables, labels, p.measures, options), p.measures,
            f"{pooling.upper()} representations — {model} on {args.task}")
        write_figure(figure, plots / f"{pooling}.png")
        write_json(rows, plots / f"{pooling}.json")
        if {"neuronsim", "svcca"} <= set(matrices):
            scores = localization(matrices["neuronsim"], matrices["svcca"], sizes)
            metrics[pooling]["localization"] = {label: {f"layer_{k:02d}": number(v) for k, v in enumerate(values)}
                                                for label, values in scores.items()}
            localization_rows += [{"pooling": pooling, "model": label, "layer": k, "localization": number(v)}
                                  for label, values in scores.items() for k, v in enumerate(values) if number(v) is not None]
            write_figure(localization_curves(scores, f"localization, {pooling.upper()} — {model} on {args.task}"),
                         localization_dir / f"{pooling}.png")
    # Always written (empty without neuronsim and svcca): git cannot hold an empty output folder.
    write_json(localization_rows, localization_dir / "localization.json")
    if p.attention_measures:
        tables = {run: AttentionTable(args.activations / "attention" / f"{run}.parquet",
                                      expect={"task": args.task, "split": "validation", "run": run})
                  for run in labels}
        for table in tables.values():
            tables["orig"].check_comparable(table)
        models = {labels[run]: table.maps() for run, table in tables.items()}
        figure, rows, metrics["attention"], _ = compare(
            {label: len(maps) for label, maps in models.items()},
            lambda measure: stacked_matrix(measure, models, **options.get(measure, {})),
            p.attention_measures, f"attention maps — {model} on {args.task}", first_layer=1, attention=True)
        write_figure(figure, plots / "attention.png")
        write_json(rows, plots / "attention.json")
    write_json(metrics, args.metrics)


if __name__ == "__main__":
    parser = cli.parser(__doc__)
    parser.add_argument("--task", required=True)
    parser.add_argument("--activations", type=Path, required=True, help="folder written by the extract stage")
    parser.add_argument("--metrics", type=Path, required=True, help="metrics JSON to write")
    parser.add_argument("--plots", type=Path, required=True, help="folder for heatmap PNGs and plot data")
    parser.add_argument("--localization", type=Path, required=True, help="folder for localization curves")
    cli.run_stage(main, parser.parse_args())
