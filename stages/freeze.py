"""freeze: fine-tune one task with the bottom or top k layers frozen (Wu et al. 2020, Table 1), with the
finetune stage's recipe and seeds, and report each configuration's score and training time next to
the unfrozen run (layersim.experiments.freeze); training times and time saved go to --timings (not hashed by DVC)."""

from pathlib import Path

from layersim import cli
from layersim.training.convergence import enforce
from layersim.compute.device import resolve_device
from layersim.experiments.freeze import (FreezeRun, freeze_configs, freeze_headline, freeze_report, freeze_timings,
                                         frozen_params, unfrozen_run)
from layersim.reporting.headlines import write_metrics
from layersim.data.io import write_figure, write_json
from layersim.models.registry import load_tokenizer, model_info, model_shape
from layersim.data.tasks import get_task
from layersim.training.train import encoded_splits, finetune


def main(args, params):
    spec = get_task(args.task)
    seeds = params.freeze.seeds or params.seeds
    num_layers = model_shape(args.pretrained)["num_layers"]
    configs = freeze_configs(params.freeze.layers, num_layers)
    for seed in seeds:  # a missing unfrozen run fails before any training
        model_info(args.checkpoints / f"seed{seed}")
    runs = [unfrozen_run(args.finetune_metrics / f"seed{seed}.json", args.finetune_timings / f"seed{seed}.json",
                         spec, seed) for seed in seeds]
    train, validation = encoded_splits(args.task_dir, spec, load_tokenizer(args.pretrained), params.finetune.max_length)
    for seed in seeds:
        for config in configs:
            timing, checks = {}, {}
            _, metrics = finetune(args.pretrained, spec, train, validation, frozen_params(params), seed,
                                  freeze=(config.side, config.layers), timing=timing, checks=checks,
                                  device=resolve_device(params.device))
            # finetune.require_convergence: fails here, before any output is written
            enforce(checks["convergence"], f"fine-tuning {spec.name} seed {seed} with the {config.side} "
                                           f"{config.layers} layers frozen", params.finetune, cli.log)
            runs.append(FreezeRun(config, seed, metrics[spec.primary_metric], timing["train_seconds"],
                                  checks["convergence"].record()))
            cli.log.info("seed %d, %s %d of %d layers frozen: %s %.4f in %.1f s of training", seed, config.side,
                         config.layers, num_layers, spec.primary_metric, runs[-1].score, timing["train_seconds"])
    full, rows, figure = freeze_report(spec, num_layers, runs)
    write_figure(figure, args.plots / f"{spec.name}.png")
    write_json(rows, args.plots / f"{spec.name}.json")
    write_metrics(full, freeze_headline(full), args.metrics, args.details)
    write_json(freeze_timings(runs), args.timings)
    cli.log.info("wrote %s and %s", args.metrics, args.plots / f"{spec.name}.png")


if __name__ == "__main__":
    p = cli.parser(__doc__)
    p.add_argument("--task", required=True)
    p.add_argument("--pretrained", type=Path, required=True, help="folder written by download_model")
    p.add_argument("--task-dir", type=Path, required=True, help="folder written by download_task")
    p.add_argument("--checkpoints", type=Path, required=True, help="folder holding the unfrozen seed<k>/ checkpoints")
    p.add_argument("--finetune-metrics", type=Path, required=True, help="folder of the unfrozen runs' metrics")
    p.add_argument("--finetune-timings", type=Path, required=True, help="folder of the unfrozen runs' timings")
    p.add_argument("--timings", type=Path, required=True, help="JSON of the training times and time saved")
    p.add_argument("--metrics", type=Path, required=True, help="metrics JSON to write")
    p.add_argument("--details", type=Path, required=True, help="plot data JSON of every value (layersim.reporting.headlines)")
    p.add_argument("--plots", type=Path, required=True, help="folder for the bar chart and the plot rows")
    cli.run_stage(main, p.parse_args())
