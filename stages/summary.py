"""summary: one metrics file across tasks — the mean over tasks of each stage's main headline value
(layersim.headlines.summary_headline), so `dvc exp show` compares experiments in a few columns."""

import json
from pathlib import Path

from layersim import cli
from layersim.headlines import read_stage_metrics, summary_headline
from layersim.io import write_json
from layersim.tasks import get_task


def main(args, params):
    per_stage = read_stage_metrics(args.metrics_dir, params.tasks, params.seeds)
    pooling, measures = next(iter(params.similarity.measures.items()))  # the primary measure: listed first
    task_metrics = {task: get_task(task).primary_metric for task in params.tasks}
    summary = summary_headline(per_stage, task_metrics, (pooling, measures[0]))
    write_json(summary, args.out)
    cli.log.info("wrote %s: %s", args.out, json.dumps(summary))


if __name__ == "__main__":
    p = cli.parser(__doc__)
    p.add_argument("--metrics-dir", type=Path, required=True, help="folder of the stages' metrics files")
    p.add_argument("--out", type=Path, required=True, help="summary metrics JSON to write")
    cli.run_stage(main, p.parse_args())
