"""align: bijective alignment of representation spaces (Ren et al. 2023) for one task — maps fitted on
train-split representations, scored on validation rows: per-layer alignment error of every method
for each pair of align.pairs (fine-tuning seeds, ORIG→FT, pretrained models such as MultiBERTs), mean ± sd
over the pairs of each kind; recovery of a known random INN; injection of a mapped last layer into a
fine-tuned head; the INN's layer × layer error matrix (layersim.experiments.align)."""

from pathlib import Path

from layersim import cli
from layersim.experiments.align import AlignInputs, align_report, method_options
from layersim.experiments.pretraining_seeds import SeedInputs, pretraining_seeds
from layersim.training.convergence import checkpoint_note
from layersim.reporting.headlines import align_headline, write_metrics
from layersim.data.io import atomic_path
from layersim.data.tasks import get_task


def main(args, params):
    spec = get_task(args.task)
    inputs = AlignInputs(args.activations, args.checkpoints, args.task_dir, spec, params, args.paired)
    report = align_report(inputs, log=cli.log.info)
    seeds = None
    if params.align.pretraining_models:  # Ren end to end over pretraining seeds (layersim.experiments.pretraining_seeds)
        options = {m: o for m, o in method_options(params).items() if m in params.align.methods}
        seeds = pretraining_seeds(SeedInputs(args.task_dir, spec, params, args.paired, args.pretrained_checkpoints),
                                  options, log=cli.log.info)
    with atomic_path(args.plots, is_dir=True) as tmp:
        title = (f"{params.align.pooling} representations — {params.model} on {args.task}"
                 + checkpoint_note(args.checkpoints, params.seeds))
        report.write_figures(Path(tmp), title, args.task, spec.primary_metric)
        if seeds:
            seeds.write_figures(Path(tmp), args.task, spec.primary_metric)
    full = report.metrics(params.align.pooling) | ({"pretraining_seeds": seeds.metrics()} if seeds else {})
    write_metrics(full, align_headline(full), args.metrics, args.details)
    cli.log.info("wrote %s, %s and %s", args.plots, args.metrics, args.details)


if __name__ == "__main__":
    parser = cli.parser(__doc__)
    parser.add_argument("--task", required=True)
    parser.add_argument("--activations", type=Path, required=True, help="folder written by the extract stage")
    parser.add_argument("--checkpoints", type=Path, required=True, help="folder holding seed<k>/ checkpoints")
    parser.add_argument("--task-dir", type=Path, required=True, help="folder written by download_task")
    parser.add_argument("--paired", type=Path, required=True, help="folder written by download_paired")
    parser.add_argument("--pretrained-checkpoints", type=Path, required=True,
                        help="the task's folder written by finetune_pretrained (one checkpoint per pretraining model)")
    parser.add_argument("--metrics", type=Path, required=True, help="metrics JSON to write")
    parser.add_argument("--details", type=Path, required=True, help="plot data JSON of every value (layersim.reporting.headlines)")
    parser.add_argument("--plots", type=Path, required=True, help="folder for figures and plot data")
    cli.run_stage(main, parser.parse_args())
