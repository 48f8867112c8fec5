"""compare: every layer of several models on the same inputs, one stacked matrix per measure — the
pretrained model, its fine-tuned models for each task (first seed; Wu et al. Figures 5–7) and the
other pretrained models of `compare.models`, of any width and depth (Wu et al. Figure 1),
each with a random-init control of its architecture (similarity.random_control; Wu et al. Figures 8–9),
on a probe of every task's first compare.probe_examples validation examples, one corpus at a time: rows centred
within their task, the null permuting examples within their task; attention maps with the similarity stage's attention
null and intervals (layersim.experiments.compare)."""

from pathlib import Path

from layersim import cli
from layersim.experiments.compare import compare_models
from layersim.reporting.headlines import compare_headline, write_metrics
from layersim.data.io import atomic_path


def main(args, params):
    out = compare_models(args.pretrained, args.checkpoints, args.compared, args.tasks, params, cli.log.info,
                         cli.log.warning)
    with atomic_path(args.plots, is_dir=True) as plots, atomic_path(args.localization, is_dir=True) as localization:
        out.write({"plots": Path(plots), "localization": Path(localization)})
    pooling, measures = next(iter(params.similarity.measures.items()))  # the primary measure: listed first
    write_metrics(out.metrics, compare_headline(out.metrics, pooling, measures[0]), args.metrics, args.details)
    cli.log.info("wrote %s, %s and %s", args.plots, args.metrics, args.details)


if __name__ == "__main__":
    parser = cli.parser(__doc__)
    parser.add_argument("--pretrained", type=Path, required=True, help="folder written by download_model")
    parser.add_argument("--checkpoints", type=Path, required=True, help="folder holding <task>/seed<k>/ checkpoints")
    parser.add_argument("--compared", type=Path, required=True, help="folder written by download_compared")
    parser.add_argument("--tasks", type=Path, required=True, help="folder holding <task>/ task tables")
    parser.add_argument("--metrics", type=Path, required=True, help="metrics JSON to write")
    parser.add_argument("--details", type=Path, required=True, help="plot data JSON of every value (layersim.reporting.headlines)")
    parser.add_argument("--plots", type=Path, required=True, help="folder for figures and plot data")
    parser.add_argument("--localization", type=Path, required=True, help="folder for localization curves")
    cli.run_stage(main, parser.parse_args(), analysis=True)
