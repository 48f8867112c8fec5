"""Where the pipeline keeps each task's and run's files, in one place.

Every path that holds a task, model or seed name ends in a fixed leaf after that name: `data/tasks/<task>/splits`,
`data/checkpoints/<model>/<task>/seed<k>/model`, `metrics/<stage>/<task>/metrics.json`. DVC removes a stage's
outputs before its command (or the params gate) runs, at the paths it makes from the params values, and a value
such as `../../user_data` would otherwise name a user's own folder; with a fixed leaf it can only name a path of
one of these names (docs/params-safety.md).
"""

from __future__ import annotations

from pathlib import Path

TASK_TABLES = "splits"          # data/tasks/<task>/splits/{train,validation}.parquet
CHECKPOINT = "model"            # data/checkpoints/<model>/<task>/seed<k>/model/, data/export/<model>/<task>/model/
STATES = "states"               # data/checkpoints/<model>/<task>/seed<k>/states/ (finetune.keep_states)
METRICS = "metrics.json"        # metrics/<stage>/<task>/metrics.json (finetune: metrics/finetune/<task>/seed<k>/)
DETAILS = "values.json"         # plots/details/<stage>/<task>/values.json


def task_tables(tasks_dir: Path | str, task: str) -> Path:
    """The folder of a task's split tables, in the folder of every task (data/tasks)."""
    return Path(tasks_dir) / task / TASK_TABLES


def finetuned(checkpoints: Path | str, seed: int) -> Path:
    """A seed's fine-tuned checkpoint, in the folder of one task's checkpoints (data/checkpoints/<model>/<task>)."""
    return Path(checkpoints) / f"seed{seed}" / CHECKPOINT


def finetune_states(checkpoints: Path | str, seed: int) -> Path:
    """A seed's kept intermediate states (finetune.keep_states: one ``step<N>`` folder each, and their index), in the
    folder of one task's checkpoints, beside its final checkpoint (:func:`finetuned`)."""
    return Path(checkpoints) / f"seed{seed}" / STATES


def finetuned_run(checkpoints: Path | str, run: str) -> Path:
    """A fine-tuned run's checkpoint by the name its activation tables carry (``seed<k>``)."""
    if not run.startswith("seed") or not run[4:].isdigit():
        raise ValueError(f"{run!r} is not a fine-tuned run (seed<k>)")
    return finetuned(checkpoints, int(run[4:]))


def finetune_metrics(task_metrics: Path | str, seed: int) -> Path:
    """A seed's finetune metrics file, in the folder of one task's (metrics/finetune/<task>)."""
    return Path(task_metrics) / f"seed{seed}" / METRICS


def finetune_curves(task_live: Path | str, seed: int) -> Path:
    """A seed's dvclive curves (one ``<name>.tsv`` per logged value: train/loss.tsv, eval/<metric>.tsv), in the
    folder of one task's (dvclive/finetune/<task>)."""
    return Path(task_live) / f"seed{seed}" / "plots" / "metrics"


def stage_metrics(metrics_dir: Path | str, stage: str, task: str) -> Path:
    """A matrix stage's metrics file for one task (finetune's are per seed: :func:`finetune_metrics`)."""
    return Path(metrics_dir) / stage / task / METRICS


def stage_details(details_dir: Path | str, stage: str, task: str) -> Path:
    """A matrix stage's plot data of every value for one task."""
    return Path(details_dir) / stage / task / DETAILS
