"""truncate: task score when the fine-tuned encoder exits after layer k, for every k (Phang et al. §4): Untuned (the
fine-tuned head as is), Tuned (the fine-tuned head trained further on the fine-tuned encoder's layer k) and TunedOrig
(the head fine-tuning starts from, on the pretrained encoder's layer k); truncate.head: fresh trains new heads."""

from pathlib import Path

import numpy as np

from layersim import cli
from layersim.training.convergence import checkpoint_note, flagged_seeds
from layersim.compute.device import resolve_device, resolve_precision
from layersim.training.heads import HeadParams
from layersim.reporting.headlines import truncate_headline, write_metrics
from layersim.data.io import ActivationTable, finetuned, read_task_table, run_expectations, write_figure, write_json
from layersim.reporting.plots import truncation_curves
from layersim.data.tasks import get_task
from layersim.params.validate import head_pooling
from layersim.models.task_heads import own_head
from layersim.experiments.truncation import (VARIANTS, head_scores, initial_head, load_for_validation, majority_score,
                                             truncation_summary, untuned_scores)


def main(args, params):
    spec = get_task(args.task)
    p = params.truncate
    device = resolve_device(params.device)
    heads = HeadParams(epochs=p.head_epochs, learning_rate=p.head_learning_rate, batch_size=p.head_batch_size,
                       weight_decay=p.head_weight_decay, holdout=p.head_holdout, patience=p.head_patience, device=device)
    own = p.head == "own"
    table = read_task_table(args.task_dir, spec, "validation", params.extract.max_examples)
    precision = resolve_precision(params.finetune.precision, device)
    runs = run_expectations(args.checkpoints, params.seeds, args.task_dir)
    pooling = head_pooling(args.pretrained)  # what the model's own head reads: cls, or last for decoders

    def cls(run: str, split: str = "validation") -> ActivationTable:
        return ActivationTable(args.activations / ("train" if split == "train" else "") / f"{run}.{pooling}.parquet",
                               expect={"task": spec.name, "split": split, "run": run, "pooling": pooling, **runs[run]})

    per_seed = {variant: [] for variant in VARIANTS}
    full = []
    for seed in params.seeds:
        run, folder = f"seed{seed}", finetuned(args.checkpoints, seed)
        model, tokenizer, encoded = load_for_validation(folder, spec, table, params.finetune.max_length, device)
        # Checked before any scoring: each table's run, weights and example order.
        tuned, tuned_orig = (cls(run, "train"), cls(run)), (cls("orig", "train"), cls("orig"))
        for validation in (tuned[1], tuned_orig[1]):
            validation.check_examples(encoded.example_id, encoded.num_choices, f"{args.task_dir}/validation.parquet")
        tuned_orig[0].check_comparable(tuned[0])
        untuned = untuned_scores(model, spec, encoded, tokenizer, params.extract.batch_size, device, precision)
        full.append(untuned[-1])  # exiting after the last layer is the full model
        per_seed["untuned"].append(untuned)
        per_seed["tuned"].append(head_scores(spec, *tuned, heads, seed, own_head(model) if own else None))
        per_seed["tuned_orig"].append(head_scores(spec, *tuned_orig, heads, seed,
                                                  initial_head(args.pretrained, spec, seed) if own else None))
        cli.log.info("seed %d: full %s %.4f, untuned by exit layer %s", seed, spec.primary_metric, full[-1],
                     np.round(per_seed["untuned"][-1], 3).tolist())
    orig, train = cls("orig"), cls("orig", "train")  # train: the rows the heads saw, as extract stored them
    baseline = majority_score(spec, train, orig)
    metrics, rows = truncation_summary(per_seed, full, baseline, params.seeds, p.tolerance, spec.primary_metric,
                                       flagged_seeds(args.checkpoints, params.seeds))  # the converged-only means
    metrics |= {"head_train_rows": train.num_rows, "table_precision": train.precision}
    title = f"truncation — {orig.metadata['model']} on {spec.name}" + checkpoint_note(args.checkpoints, params.seeds)
    write_figure(truncation_curves(per_seed, full, baseline, spec.primary_metric, title), args.plots / "truncate.png")
    write_json(rows, args.plots / "truncate.json")
    write_metrics(metrics, truncate_headline(metrics), args.metrics, args.details)
    cli.log.info("wrote %s and %s: %d top layers can be dropped within %.3g", args.metrics,
                 args.plots / "truncate.png", metrics["droppable_top_layers_untuned"], p.tolerance)


if __name__ == "__main__":
    p = cli.parser(__doc__)
    p.add_argument("--task", required=True)
    p.add_argument("--checkpoints", type=Path, required=True, help="folder holding seed<k>/ checkpoints")
    p.add_argument("--activations", type=Path, required=True, help="folder written by extract")
    p.add_argument("--task-dir", type=Path, required=True, help="folder written by download_task")
    p.add_argument("--pretrained", type=Path, required=True, help="folder written by download_model (TunedOrig's head)")
    p.add_argument("--metrics", type=Path, required=True, help="metrics JSON to write")
    p.add_argument("--details", type=Path, required=True, help="plot data JSON of every value (layersim.reporting.headlines)")
    p.add_argument("--plots", type=Path, required=True, help="folder for the PNG and the plot rows")
    cli.run_stage(main, p.parse_args())
