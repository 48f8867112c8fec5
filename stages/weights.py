"""weights: for one task, what fine-tuning did to every layer's weight matrices (query, key, value, attention
output, intermediate, output), each seed's checkpoint against the pretrained model: Shuttleworth et al.'s intruder
dimensions (2025, "LoRA vs Full Fine-tuning: An Illusion of Equivalence"; weights.top_k and weights.threshold),
the update's norm relative to the pretrained weights, its rank and the spectrum's change, and each adapted
matrix's intruder count against the rotated-update null (weights.null_draws: the update's singular values kept, its
singular vectors drawn at random; layersim.experiments.weights). Reads weights only: no task data, no activations."""

from pathlib import Path

from layersim import cli
from layersim.data.io import finetuned_runs, write_figure, write_json
from layersim.reporting.headlines import write_metrics
from layersim.experiments.weights import task_weights


def main(args, params):
    runs = finetuned_runs(params.finetune, params.seeds)  # finetune.method's, then compare_methods'
    out = task_weights(args.pretrained, args.checkpoints, runs, params.finetune, params.weights.top_k,
                       params.weights.threshold, cli.log.info, null_draws=params.weights.null_draws)
    write_json(out.rows, args.plots / "changes.json")
    write_figure(out.figure, args.plots / "intruders.png")
    write_metrics(out.full, out.headline, args.metrics, args.details)
    cli.log.info("wrote %s, %s and %s", args.plots, args.metrics, args.details)


if __name__ == "__main__":
    p = cli.parser(__doc__)
    p.add_argument("--task", required=True)
    p.add_argument("--pretrained", type=Path, required=True, help="folder written by download_model")
    p.add_argument("--checkpoints", type=Path, required=True, help="folder holding the seeds' checkpoints")
    p.add_argument("--metrics", type=Path, required=True, help="metrics JSON to write")
    p.add_argument("--details", type=Path, required=True, help="plot data JSON of every per-matrix value "
                   "(layersim.reporting.headlines)")
    p.add_argument("--plots", type=Path, required=True, help="folder for changes.json (rows) and intruders.png")
    cli.run_stage(main, p.parse_args())
