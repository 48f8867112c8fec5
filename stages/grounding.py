"""grounding: for one task, which measure of similarity.measures to trust on this model — ReSi's grounding tests that
the pipeline's own runs allow (layer monotonicity within each trained model, the random-init control beside it; the
AUPRC of telling fine-tuning seeds apart from the pretrained model, layer by layer), each measure ranked with a paired
bootstrap over runs and layers (layersim.experiments.grounding). Opt-in: with grounding.enabled false it only records
that it is off."""

from pathlib import Path

from layersim import cli
from layersim.data.io import atomic_path, write_figure, write_json
from layersim.experiments.grounding import task_grounding
from layersim.reporting.headlines import write_metrics


def main(args, params):
    out = task_grounding(args.activations, args.checkpoints, args.task, params, cli.log.info)
    with atomic_path(args.plots, is_dir=True) as plots:  # the folder appears complete or not at all
        write_json(out.rows, Path(plots) / "ranking.json")
        if out.figure is not None:
            write_figure(out.figure, Path(plots) / "grounding.png")
    write_metrics(out.full, out.headline, args.metrics, args.details)
    cli.log.info("wrote %s, %s and %s", args.plots, args.metrics, args.details)


if __name__ == "__main__":
    p = cli.parser(__doc__)
    p.add_argument("--task", required=True)
    p.add_argument("--activations", type=Path, required=True, help="folder written by the extract stage")
    p.add_argument("--checkpoints", type=Path, required=True, help="folder of the task's checkpoints")
    p.add_argument("--metrics", type=Path, required=True, help="metrics JSON to write")
    p.add_argument("--details", type=Path, required=True, help="plot data JSON of every value (layersim.reporting.headlines)")
    p.add_argument("--plots", type=Path, required=True, help="folder for ranking.json (the table) and grounding.png")
    cli.run_stage(main, p.parse_args(), quiet_transformers=False)  # loads no model
