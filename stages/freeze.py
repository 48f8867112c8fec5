"""freeze: fine-tune one task with the bottom or top k layers frozen (Wu et al. 2020, Table 1) with freeze.recipe
(wu: Hugging Face's defaults, the unfrozen runs trained here too; finetune: the finetune section's recipe, the
unfrozen runs the finetune stage's), and report each configuration's score next to the unfrozen run's, with the
backward FLOPs it saves; the time per step, measured interleaved in this process, goes to --timings (not hashed
by DVC). See layersim.experiments.freeze."""

from pathlib import Path

from layersim import cli
from layersim.compute.device import resolve_device
from layersim.data.io import finetune_metrics, write_figure, write_json
from layersim.data.tasks import get_task
from layersim.experiments.freeze import (config_flops, finetuned_run, freeze_configs, freeze_headline, freeze_report,
                                         freeze_timings, train_runs)
from layersim.compute.flops import layer_shape
from layersim.models.registry import load_tokenizer, read_json
from layersim.reporting.headlines import write_metrics
from layersim.training.recipes import freeze_recipe, recipe_record
from layersim.training.step_timing import time_frozen_steps, time_ratios
from layersim.training.train import encoded_splits, finetune


def main(args, params):
    spec, device, settings = get_task(args.task), resolve_device(params.device), params.freeze
    seeds = settings.seeds or params.seeds
    shape = layer_shape(read_json(args.pretrained / "config.json", "model config", "re-run download_model"))
    configs = freeze_configs(settings.layers, shape.num_layers)
    # recipe finetune: the finetune stage's runs are the unfrozen ones; a missing one fails before any training
    baselines = {seed: finetuned_run(finetune_metrics(args.finetune_metrics, seed), spec, seed)
                 for seed in seeds} if settings.recipe == "finetune" else None
    train, validation = encoded_splits(args.task_dir, spec, load_tokenizer(args.pretrained), params.finetune.max_length)
    recipe = freeze_recipe(settings.recipe, params.finetune, len(train))
    cli.log.info("recipe %s: batch %d, lr %g, %d warm-up steps, %d steps", settings.recipe, recipe.batch_size,
                 recipe.learning_rate, recipe.warmup_steps, recipe.max_steps)

    def train_one(config, seed):
        checks = {}
        _, metrics = finetune(args.pretrained, spec, train, validation, recipe, seed, checks=checks, device=device,
                              freeze=None if config is None else (config.side, config.layers))
        return metrics[spec.primary_metric], checks["convergence"]

    runs = train_runs(train_one, seeds, configs, baselines=baselines, what=spec.name, finetune=recipe,
                      log=cli.log) if configs else []
    flops, timings = {}, {}
    if configs:
        seconds, lengths = time_frozen_steps(args.pretrained, spec, train, recipe, seeds[0],
                                             {c.label: (c.side, c.layers) for c in configs},
                                             block=settings.timing_steps, rounds=settings.timing_rounds, device=device)
        flops, timings = config_flops(shape, configs, lengths), freeze_timings(seconds, time_ratios(seconds),
                                                                                settings.timing_steps)
        for config in configs:
            cli.log.info("%s: %s per step (measured), %.0f %% of backward FLOPs saved", config.label,
                         timings[config.label]["time_per_step"], 100 * flops[config.label]["backward_flops_saved"])
    full, rows, figure = freeze_report(spec, shape.num_layers, runs, recipe_record(settings.recipe, recipe), flops)
    write_figure(figure, args.plots / "freeze.png")
    write_json(rows, args.plots / "freeze.json")
    write_metrics(full, freeze_headline(full), args.metrics, args.details)
    write_json(timings, args.timings)
    cli.log.info("wrote %s and %s", args.metrics, args.plots / "freeze.png")


if __name__ == "__main__":
    p = cli.parser(__doc__)
    p.add_argument("--task", required=True)
    p.add_argument("--pretrained", type=Path, required=True, help="folder written by download_model")
    p.add_argument("--task-dir", type=Path, required=True, help="folder written by download_task")
    p.add_argument("--finetune-metrics", type=Path, required=True, help="folder of the finetune stage's metrics "
                                                                         "(the unfrozen runs of recipe finetune)")
    p.add_argument("--timings", type=Path, required=True, help="JSON of the interleaved step times")
    p.add_argument("--metrics", type=Path, required=True, help="metrics JSON to write")
    p.add_argument("--details", type=Path, required=True, help="plot data JSON of every value (layersim.reporting.headlines)")
    p.add_argument("--plots", type=Path, required=True, help="folder for the bar chart and the plot rows")
    cli.run_stage(main, p.parse_args())
