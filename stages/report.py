"""report: one self-contained HTML page for the experiment (figures inside it, renders offline): per task the
similarity heatmaps with their blocks and chance marks, the truncation curve with the exported exit, the
exported model's score and speed-up, and every similarity with its null and interval."""

from pathlib import Path

from layersim import cli
from layersim.data.io import atomic_path
from layersim.params.model_kind import own_head_pooling
from layersim.reporting.page import Layout, build_report


def main(args, params):
    measures = params.similarity.measures
    head = own_head_pooling(params.model)  # cls, or last for a decoder: the token the model's own head reads
    pooling = head if head in measures else next(iter(measures))
    layout = Layout(metrics=args.metrics_dir, details=args.details_dir, plots=args.plots_dir)
    page = build_report(params.model, params.tasks, params.seeds, params.similarity.significance,
                        (pooling, measures[pooling][0]), layout, params.finetune.compare_methods)
    with atomic_path(args.out) as tmp:
        tmp.write_text(page, encoding="utf-8")
    cli.log.info("wrote %s (%d kB): open it in a browser", args.out, len(page.encode()) // 1024)


if __name__ == "__main__":
    p = cli.parser(__doc__)
    p.add_argument("--metrics-dir", type=Path, required=True, help="the pipeline's metrics/ folder")
    p.add_argument("--details-dir", type=Path, required=True, help="the pipeline's plots/details/ folder")
    p.add_argument("--plots-dir", type=Path, required=True, help="the pipeline's plots/ folder")
    p.add_argument("--out", type=Path, required=True, help="the HTML file to write")
    cli.run_stage(main, p.parse_args(), quiet_transformers=False)
