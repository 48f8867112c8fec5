"""export: per task, the fine-tuned model (first seed) with the fewest layers whose score stays within
truncate.tolerance of the full model's (an exit after layer k, or a skipped span), chosen on train examples,
written as a plain Hugging Face checkpoint, re-scored from its files on validation and timed against the
full model at batch 1 and 32 (the times go to --timings, outside every hashed output: docs/architecture.md)."""

from pathlib import Path

from layersim import cli
from layersim.data.batching import encode_task
from layersim.compute.device import resolve_device, resolve_precision
from layersim.experiments.export import (TIMED_BATCH_SIZES, choice_logits, choose_layers, exact_rescore, export_report,
                                         export_timings, time_models, write_checkpoint)
from layersim.reporting.headlines import export_headline, write_metrics
from layersim.data.io import finetuned, read_task_table, run_expectations, write_figure, write_json
from layersim.models.registry import verified_info
from layersim.data.tasks import get_task
from layersim.experiments.truncation import load_for_validation, primary_score


def main(args, params):
    spec = get_task(args.task)
    p = params.export
    device = resolve_device(params.device)
    precision = resolve_precision(params.finetune.precision, device)
    run_expectations(args.checkpoints, params.seeds, args.task_dir)  # checkpoints verified, on these tables
    seed = params.seeds[0]
    source = finetuned(args.checkpoints, seed)
    validation = read_task_table(args.task_dir, spec, "validation", params.extract.max_examples)
    model, tokenizer, encoded = load_for_validation(source, spec, validation, params.finetune.max_length, device)
    held = encode_task(read_task_table(args.task_dir, spec, "train", p.selection_examples), spec, tokenizer,
                       params.finetune.max_length)
    batch_size = params.extract.batch_size

    scores, logits = {}, {}
    for split, data in (("train", held), ("validation", encoded)):
        logits[split] = choice_logits(model, data, tokenizer, batch_size, device, precision)
        scores[split] = {c: primary_score(spec, out, data.labels) for c, out in logits[split].items()}
    tolerance = params.truncate.tolerance
    chosen = choose_layers(scores["train"], tolerance)
    full = max(scores["train"], key=lambda c: c.depth)
    cli.log.info("chosen on %d train examples: %s (%.4f, full model %.4f)", len(held), chosen.describe(),
                 scores["train"][chosen], scores["train"][full])

    def rescored(reloaded) -> float:
        return exact_rescore(reloaded, logits["validation"][chosen], spec, encoded, tokenizer, batch_size, device,
                             precision)

    provenance = {"source": str(source), "source_digest": verified_info(source)["digest"], "seed": seed,
                  "tolerance": tolerance, "selected_on": f"{len(held)} train examples"}
    exported, exported_score = write_checkpoint(model, tokenizer, chosen, args.out, spec, provenance, rescored,
                                                max_length=params.finetune.max_length)
    timed = encoded.head(p.timing_examples)
    timings = {size: time_models({"full": model, "exported": exported}, timed, tokenizer, size, device, precision,
                                 p.timing_repeats) for size in TIMED_BATCH_SIZES}

    metrics, rows, figure = export_report(spec, scores, chosen, exported, exported_score, model, seed=seed,
                                          tolerance=tolerance, examples=(len(held), len(encoded)))
    measured = export_timings(timings)
    write_json(measured, args.timings)
    write_figure(figure, args.plots / "export.png")
    write_json(rows, args.plots / "export.json")
    write_metrics(metrics, export_headline(metrics), args.metrics, args.details)
    cli.log.info("wrote %s: %d of %d layers, validation %.4f (full %.4f), speed-up %.2fx at batch 1, %.2fx at 32",
                 args.out, chosen.depth, full.depth, exported_score, scores["validation"][full],
                 measured["speedup"]["batch_1"], measured["speedup"]["batch_32"])


if __name__ == "__main__":
    p = cli.parser(__doc__)
    p.add_argument("--task", required=True)
    p.add_argument("--checkpoints", type=Path, required=True, help="folder holding seed<k>/ checkpoints")
    p.add_argument("--task-dir", type=Path, required=True, help="folder written by download_task")
    p.add_argument("--out", type=Path, required=True, help="folder of the exported checkpoint")
    p.add_argument("--metrics", type=Path, required=True, help="metrics JSON to write")
    p.add_argument("--details", type=Path, required=True, help="plot data JSON of every value (layersim.reporting.headlines)")
    p.add_argument("--plots", type=Path, required=True, help="folder for the PNG and the plot rows")
    p.add_argument("--timings", type=Path, required=True, help="JSON of the measured times and speed-ups")
    cli.run_stage(main, p.parse_args())
