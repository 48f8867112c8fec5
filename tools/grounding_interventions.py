"""ReSi's training-intervention tests of which similarity measure to trust (layersim.experiments.interventions): for
each task of params.yaml, the model fine-tuned at each level of each intervention with each seed — label noise (the
labels of that share of the train examples shuffled), a shortcut (a label-revealing token in front of that share of
the train examples), augmentation (EDA's word deletion and swap at that strength) — and every measure of
similarity.measures and grounding.measures on the model's own head token ranked by how well it groups the runs of
one level together (AUPRC) and orders them by level (Spearman), layer by layer, with a paired bootstrap over layers.

Not a pipeline stage (it fine-tunes interventions × levels × seeds models per task; level 0 is one plain run per seed
for every intervention). It reads the model and the task the pipeline downloaded (`dvc repro download_model
download_task` first) and writes, per task, <out>/<task>/ranking.json (the table: every test's score and interval,
the mean rank over all tests and each intervention's own), values.json (every layer's score), runs.json (each run's
validation metrics on the clean examples) and interventions.png.

Usage: python tools/grounding_interventions.py [-S key=value ...] [--interventions label_noise shortcut augmentation]
       [--levels 0 0.5 1] [--out plots/interventions]
(-S as for `dvc exp run`; the documented MiniLM-L6 command: docs/outputs.md, "Which measure to trust")."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from layersim.errors import LayersimError

log = logging.getLogger("layersim")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python tools/grounding_interventions.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-S", "--set-param", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--params", type=Path, default=Path("params.yaml"))
    p.add_argument("--interventions", nargs="+", default=["label_noise", "shortcut", "augmentation"],
                   help="which of ReSi's interventions to run (default: all three)")
    p.add_argument("--levels", type=float, nargs="+", default=None,
                   help="the levels of every intervention run, shares or strengths from 0 to 1 (default: 0 0.5 1 "
                        "for label noise and the shortcut, 0 0.25 0.5 for augmentation)")
    p.add_argument("--out", type=Path, default=Path("plots/interventions"))
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    import transformers  # as the stages quiet it (layersim.cli.run_stage): no notice of the fresh task head per run

    transformers.logging.set_verbosity_error()
    try:
        run(args)
    except LayersimError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


def run(args) -> None:
    from layersim.experiments.interventions import intervention
    from layersim.params import parse_params
    from layersim.params.overrides import overridden

    params = parse_params(overridden(args.params, args.overrides))
    items = [intervention(name) for name in dict.fromkeys(args.interventions)]
    if args.levels is not None and (len(set(args.levels)) < 2 or any(not 0 <= v <= 1 for v in args.levels)):
        raise LayersimError(f"--levels must be two or more distinct levels from 0 to 1, got {args.levels}.")
    if len(params.seeds) < 2:
        raise LayersimError(f"seeds has {len(params.seeds)} seed; the tests group runs of one level, so they need two "
                            "seeds or more.")
    from layersim.data.io import write_figure, write_json
    from layersim.experiments.interventions import (intervention_runs, intervention_tests, rank_tests, run_label,
                                                    figure_labels)
    from layersim.params.model_kind import own_head_pooling
    from layersim.reporting.grounding import ranking_figure
    from layersim.reporting.headlines import metrics_to_details
    from layersim.similarity.results import settings

    pooling = own_head_pooling(params.model)
    by_pooling = params.similarity.measures
    measures = params.grounding.ranked(by_pooling.get(pooling) or by_pooling[next(iter(by_pooling))])
    options, _ = settings(params.similarity)
    plan = {item.name: tuple(args.levels) if args.levels is not None else item.levels for item in items}
    g = params.grounding
    for task in params.tasks:
        pretrained, task_dir = Path("data/models") / params.model / "pretrained", Path("data/tasks") / task / "splits"
        for folder, stage in ((pretrained, "download_model"), (task_dir, f"download_task@{task}")):
            if not folder.is_dir():
                raise LayersimError(f"{folder} does not exist; run `dvc repro {stage}` first.")
        runs, metrics = intervention_runs(pretrained, task_dir, task, params, plan, measures, options, log.info)
        units, full, rankings = {}, {measure: {} for measure in measures}, {}
        for item in items:
            levels = {run_label(item.name, level, seed): level for level in plan[item.name] for seed in params.seeds}
            tests, values = intervention_tests(runs, levels, item, measures, options)
            rankings[item.name] = rank_tests(tests, values, measures, g.bootstrap, g.seed).ranking
            units |= tests
            for measure in measures:
                full[measure] |= values[measure]
        out = rank_tests(units, full, measures, g.bootstrap, g.seed)
        for row in out.rows:
            row |= {f"{name}_mean_rank": ranking.mean_rank[row["measure"]] for name, ranking in rankings.items()}
        folder = args.out / task
        write_json(out.rows, folder / "ranking.json")
        write_json(metrics_to_details({"levels": plan, "seeds": list(params.seeds), "pooling": pooling, **out.full}),
                   folder / "values.json")
        write_json([{"intervention": name, "level": level, "seed": seed, "run": run_label(name, level, seed),
                     **metrics[run_label(name, level, seed)]} for name, levels in plan.items() for level in levels
                    for seed in params.seeds], folder / "runs.json")
        panels = (rankings | {"all": out.ranking}) if len(items) > 1 else rankings
        title = f"training interventions — {params.model} on {task}"
        write_figure(ranking_figure(panels, title, figure_labels(items)), folder / "interventions.png")
        for row in out.rows:
            log.info("%d. %s: mean rank %.2f [%.2f, %.2f]; %s", row["place"], row["measure"], row["mean_rank"],
                     row["mean_rank_low"], row["mean_rank_high"],
                     ", ".join(f"{test} {row[test]:.3f}" for test in out.ranking.tests))
        log.info("wrote %s", folder)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
