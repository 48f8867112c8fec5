"""summary: one metrics file across tasks — the mean over tasks of each stage's main headline value
(layersim.reporting.headlines.summary_headline), so `dvc exp show` compares experiments in a few columns — and
where the last block of layers starts, task by task (a bar chart and its rows)."""

import json
from pathlib import Path

from layersim import cli
from layersim.reporting.headlines import (BLOCK_KEYS, last_block_starts, read_metrics_file, read_stage_metrics,
                                          summary_headline)
from layersim.data.io import stage_details, write_figure, write_json
from layersim.reporting.plots import last_block_counts
from layersim.data.tasks import get_task


def main(args, params):
    per_stage = read_stage_metrics(args.metrics_dir, params.tasks, params.seeds)
    pooling, measures = next(iter(params.similarity.measures.items()))  # the primary measure: listed first
    task_metrics = {task: get_task(task).primary_metric for task in params.tasks}
    primary = (pooling, measures[0])
    details = {task: read_metrics_file(stage_details(args.details_dir, "similarity", task)) for task in params.tasks}
    starts, num_layers = last_block_starts(details, primary)
    summary = summary_headline(per_stage, task_metrics, primary)
    title = f"where the last block of layers starts ({pooling} {measures[0]}, {len(params.tasks)} tasks)"
    write_figure(last_block_counts(starts, BLOCK_KEYS, num_layers, title), args.plots / "last_block.png")
    write_json([{"task": task, "comparison": BLOCK_KEYS[key], "last_block_start": start}
                for task, by_key in starts.items() for key, start in by_key.items()], args.plots / "last_block.json")
    write_json(summary, args.out)
    cli.log.info("wrote %s: %s", args.out, json.dumps(summary))


if __name__ == "__main__":
    p = cli.parser(__doc__)
    p.add_argument("--metrics-dir", type=Path, required=True, help="folder of the stages' metrics files")
    p.add_argument("--details-dir", type=Path, required=True, help="folder of the stages' details files")
    p.add_argument("--plots", type=Path, required=True, help="folder for the last-block chart and its rows")
    p.add_argument("--out", type=Path, required=True, help="summary metrics JSON to write")
    cli.run_stage(main, p.parse_args(), quiet_transformers=False)  # loads no model
