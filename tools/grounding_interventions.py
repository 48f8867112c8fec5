"""ReSi's label-randomization test of which similarity measure to trust (layersim.experiments.interventions): for each
task of params.yaml, the model fine-tuned at each level of label noise (the labels of that share of the train examples
shuffled) with each seed, and every measure of similarity.measures on the model's own head token ranked by how well it
groups the runs of one level together, layer by layer (AUPRC), with a paired bootstrap over layers.

Not a pipeline stage (it fine-tunes levels × seeds models per task). It reads the model and the task the pipeline
downloaded (`dvc repro download_model download_task` first) and writes, per task, <out>/<task>/ranking.json (the
table), values.json (every layer's AUPRC) and interventions.png.

Usage: python tools/grounding_interventions.py [-S key=value ...] [--levels 0 0.5 1] [--out plots/interventions]
(-S as for `dvc exp run`, e.g. the quickstart's settings: docs/outputs.md, "Which measure to trust")."""

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
    p.add_argument("--levels", type=float, nargs="+", default=[0.0, 0.5, 1.0],
                   help="shares of the train labels shuffled, one group of runs each (ReSi: 0, 0.25, 0.5, 0.75, 1)")
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
    from layersim.params import parse_params
    from layersim.params.overrides import overridden

    params = parse_params(overridden(args.params, args.overrides))
    if len(set(args.levels)) < 2 or any(not 0 <= level <= 1 for level in args.levels):
        raise LayersimError(f"--levels must be two or more distinct shares from 0 to 1, got {args.levels}.")
    if len(params.seeds) < 2:
        raise LayersimError(f"seeds has {len(params.seeds)} seed; the test groups runs of one level, so it needs two "
                            "seeds or more.")
    from layersim.data.io import write_figure, write_json
    from layersim.experiments.interventions import TEST, label_noise_runs, rank_on_groups, run_label
    from layersim.params.model_kind import own_head_pooling
    from layersim.reporting.grounding import ranking_figure
    from layersim.reporting.headlines import metrics_to_details
    from layersim.similarity.results import settings

    pooling = own_head_pooling(params.model)
    measures = params.similarity.measures.get(pooling) or params.similarity.measures[next(iter(params.similarity.measures))]
    options, _ = settings(params.similarity)
    for task in params.tasks:
        pretrained, task_dir = Path("data/models") / params.model / "pretrained", Path("data/tasks") / task / "splits"
        for folder, stage in ((pretrained, "download_model"), (task_dir, f"download_task@{task}")):
            if not folder.is_dir():
                raise LayersimError(f"{folder} does not exist; run `dvc repro {stage}` first.")
        runs = label_noise_runs(pretrained, task_dir, task, params, args.levels, log.info)
        groups = {run_label(level, seed): level for level in args.levels for seed in params.seeds}
        out = rank_on_groups(runs, groups, measures, options, params.grounding.bootstrap, params.grounding.seed)
        folder = args.out / task
        write_json(out.rows, folder / "ranking.json")
        write_json(metrics_to_details({"levels": list(args.levels), "seeds": list(params.seeds), **out.full}),
                   folder / "values.json")
        write_figure(ranking_figure({pooling: out.ranking}, f"label randomization — {params.model} on {task}"),
                     folder / "interventions.png")
        for row in out.rows:
            log.info("%d. %s: AUPRC %.3f [%.3f, %.3f] (chance %.3f)", row["place"], row["measure"], row[TEST],
                     row[f"{TEST}_low"], row[f"{TEST}_high"], row[f"{TEST}_chance"])
        log.info("wrote %s", folder)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
