"""similarity: layer × layer linear CKA matrices ORIG–ORIG, FT–ORIG, FT–FT and FT[1]–FT[2] for one
task (Phang et al. §3, Figure 1)."""

from pathlib import Path

from layersim import cli
from layersim.comparisons import phang_comparisons, summarize
from layersim.io import ActivationTable, write_figure, write_json
from layersim.plots import heatmap_grid, matrix_rows


def main(args, params):
    pooling = params.similarity.pooling
    runs = ["orig"] + [f"seed{s}" for s in params.seeds]
    tables = {run: ActivationTable(args.activations / f"{run}.{pooling}.parquet") for run in runs}
    for run in runs[1:]:
        tables["orig"].check_comparable(tables[run])
    cli.log.info("read %d activation tables (%s pooling, %d rows) from %s", len(tables), pooling,
                 tables["orig"].num_rows, args.activations)

    layers = {run: table.layers() for run, table in tables.items()}
    comparisons = phang_comparisons(layers["orig"], [layers[run] for run in runs[1:]])

    title = f"linear CKA of {pooling.upper()} representations — {tables['orig'].metadata['model']} on {args.task}"
    panels = {c.title: (c.matrix, c.y_label, c.x_label) for c in comparisons}
    write_figure(heatmap_grid(panels, title), args.plots / f"{args.task}.png")
    rows = [row for c in comparisons for row in matrix_rows(c.matrix, "similarity", comparison=c.title, measure="linear CKA")]
    write_json(rows, args.plots / f"{args.task}.json")
    write_json(summarize(comparisons), args.metrics)
    cli.log.info("wrote %s and %s", args.plots / f"{args.task}.png", args.metrics)


if __name__ == "__main__":
    p = cli.parser(__doc__)
    p.add_argument("--task", required=True)
    p.add_argument("--activations", type=Path, required=True, help="folder written by extract")
    p.add_argument("--metrics", type=Path, required=True, help="metrics JSON to write")
    p.add_argument("--plots", type=Path, required=True, help="folder for the PNG and the plot rows")
    cli.run_stage(main, p.parse_args())
