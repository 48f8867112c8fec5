"""skip: task score of the fine-tuned model with every contiguous span of layers [i, j] skipped, with
no further training (Phang et al. §4.1), against the spans that layer similarity predicts droppable
(ShortGPT's Block Influence over every token, Gromov et al.'s angular distance on the head's token), which the
extract stage wrote beside the seeds' activation tables (<run>.pruning.json)."""

from pathlib import Path

import numpy as np

from layersim import cli
from layersim.compute.device import resolve_device, resolve_precision
from layersim.reporting.headlines import skip_headline, write_metrics
from layersim.data.io import finetuned, read_task_table, run_expectations, write_figure, write_json
from layersim.reporting.plots import span_heatmap
from layersim.reporting.pruning_plots import prediction_scatter
from layersim.data.tasks import get_task
from layersim.experiments.pruning_states import measured_rows, read_pruning_record
from layersim.similarity.pruning import measures_from_record
from layersim.experiments.truncation import load_for_validation, skip_predictions, span_scores, span_summary


def main(args, params):
    spec = get_task(args.task)
    table = read_task_table(args.task_dir, spec, "validation", params.extract.max_examples)
    runs = run_expectations(args.checkpoints, params.seeds, args.task_dir)  # checkpoints verified, on these tables
    records = {seed: read_pruning_record(args.activations / f"seed{seed}.pruning.json", {  # before any scoring
        "task": spec.name, "split": "validation", "run": f"seed{seed}", **runs[f"seed{seed}"]})
        for seed in params.seeds}
    batch_size = params.extract.batch_size
    device = resolve_device(params.device)
    precision = resolve_precision(params.finetune.precision, device)
    full, per_seed, measures = [], [], []
    for seed in params.seeds:
        folder = finetuned(args.checkpoints, seed)
        model, tokenizer, encoded = load_for_validation(folder, spec, table, params.finetune.max_length, device)
        full_model, spans = span_scores(model, spec, encoded, tokenizer, batch_size, device, precision)
        full.append(full_model)
        per_seed.append(spans)
        measures.append(measures_from_record(records[seed], max(j for _, j in spans)))
        cli.log.info("seed %d: %d spans scored from %s", seed, len(per_seed[-1]), folder)

    spans = list(per_seed[0])
    mean = {span: float(np.mean([scores[span] for scores in per_seed])) for span in spans}
    num_layers = max(j for _, j in spans)
    matrix = np.full((num_layers, num_layers), np.nan)
    for (i, j), value in mean.items():
        matrix[i - 1, j - 1] = value
    full_mean = float(np.mean(full))
    rows = measured_rows(records[params.seeds[0]])  # what each measure averages over
    prediction, predicted, predicted_mean = skip_predictions(measures, per_seed, rows)
    metrics = {"metric": spec.primary_metric, "full": round(full_mean, 6), "tolerance": params.skip.tolerance,
               "spans": {f"{i}-{j}": round(v, 6) for (i, j), v in mean.items()},
               **span_summary(mean, full_mean, params.skip.tolerance), "prediction": prediction}
    rows = [{"seed": seed, "first": i, "last": j, "score": round(scores[(i, j)], 6), **values[(i, j)]}
            for seed, scores, values in zip(params.seeds, per_seed, predicted) for i, j in spans]
    title = f"skipped layers — {spec.name} (full model {full_mean:.3f})"
    write_figure(span_heatmap(matrix, full_mean, spec.primary_metric, title), args.plots / "skip.png")
    write_figure(prediction_scatter(mean, predicted_mean, prediction, full_mean, spec.primary_metric,
                                    f"skip predicted from similarity — {spec.name}"),
                 args.plots / "prediction.png")
    write_json(rows, args.plots / "skip.json")
    write_metrics(metrics, skip_headline(metrics), args.metrics, args.details)
    cli.log.info("wrote %s and %s", args.metrics, args.plots / "skip.png")


if __name__ == "__main__":
    p = cli.parser(__doc__)
    p.add_argument("--task", required=True)
    p.add_argument("--checkpoints", type=Path, required=True, help="folder holding seed<k>/ checkpoints")
    p.add_argument("--activations", type=Path, required=True, help="folder written by extract (the seeds' tables)")
    p.add_argument("--task-dir", type=Path, required=True, help="folder written by download_task")
    p.add_argument("--metrics", type=Path, required=True, help="metrics JSON to write")
    p.add_argument("--details", type=Path, required=True, help="plot data JSON of every value (layersim.reporting.headlines)")
    p.add_argument("--plots", type=Path, required=True, help="folder for the PNG and the plot rows")
    cli.run_stage(main, p.parse_args())
