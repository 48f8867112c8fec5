"""similarity: for one task, layer × layer matrices of every chosen measure (Wu et al. 2020) between the
pretrained model and the fine-tuned seeds — Phang et al.'s ORIG–ORIG, FT–ORIG, FT–FT and FT[1]–FT[2] —
per pooling, each cell with its permutation null and each reported diagonal with a bootstrap interval;
the localization score per layer; attention-level similarities; each run's Block Influence per layer and
angular distance between layers l and l + n (ShortGPT; Gromov et al.) (layersim.experiments.similarity)."""

from contextlib import nullcontext
from pathlib import Path

from layersim import cli
from layersim.reporting.headlines import similarity_headline, write_metrics
from layersim.data.io import atomic_path
from layersim.experiments.similarity import task_similarity


def main(args, params):
    out = task_similarity(args.activations, args.checkpoints, args.task, params, cli.log.info, cli.log.warning,
                          pruning=args.pruning is not None)
    # Each output folder appears complete or not at all.
    with (atomic_path(args.plots, is_dir=True) as plots, atomic_path(args.localization, is_dir=True) as localization,
          atomic_path(args.diagonals, is_dir=True) as diagonals,
          atomic_path(args.pruning, is_dir=True) if args.pruning else nullcontext() as pruning):
        out.write({"plots": Path(plots), "localization": Path(localization), "diagonals": Path(diagonals)}
                  | ({"pruning": Path(pruning)} if pruning else {}))
    write_metrics(out.metrics, similarity_headline(out.metrics, params.similarity.significance), args.metrics,
                  args.details)
    cli.log.info("wrote %s, %s, %s and %s", args.plots, args.localization, args.diagonals, args.metrics)


if __name__ == "__main__":
    parser = cli.parser(__doc__)
    parser.add_argument("--task", required=True)
    parser.add_argument("--activations", type=Path, required=True, help="folder written by the extract stage")
    parser.add_argument("--checkpoints", type=Path, required=True, help="folder holding seed<k>/ checkpoints")
    parser.add_argument("--metrics", type=Path, required=True, help="metrics JSON to write")
    parser.add_argument("--details", type=Path, required=True, help="plot data JSON of every value (layersim.reporting.headlines)")
    parser.add_argument("--plots", type=Path, required=True, help="folder for heatmap PNGs and plot data")
    parser.add_argument("--localization", type=Path, required=True, help="folder for localization curves")
    parser.add_argument("--diagonals", type=Path, required=True,
                        help="folder for the per-layer diagonals with their null and intervals")
    parser.add_argument("--pruning", type=Path, help="folder for each run's Block Influence and angular distances "
                        "(layersim.similarity.pruning); not computed when left out")
    cli.run_stage(main, parser.parse_args(), quiet_transformers=False, analysis=True)  # loads no model
