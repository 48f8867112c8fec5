"""Where the pipeline keeps each task's and run's files, in one place.

Every path that holds a task, model or seed name ends in a fixed leaf after that name: `data/tasks/<task>/splits`,
`data/checkpoints/<task>/seed<k>/model` (a run of finetune.compare_methods: `<task>/<method>/seed<k>/model`),
`metrics/<stage>/<task>/metrics.json`. DVC removes a stage's
outputs before its command (or the params gate) runs, at the paths it makes from the params values: with a fixed
leaf a value such as `../../user_data` can only name a path of one of these names, and dvc.yaml's path guard stops
DVC for a value that climbs out of its folder at all (docs/params-safety.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

TASK_TABLES = "splits"          # data/tasks/<task>/splits/{train,validation}.parquet
CHECKPOINT = "model"            # data/checkpoints/<task>/seed<k>/model/, data/export/<task>/model/
STATES = "states"               # data/states/<task>/seed<k>/states/ (finetune.keep_states)
METRICS = "metrics.json"        # metrics/<stage>/<task>/metrics.json (finetune: metrics/finetune/<task>/seed<k>/)
DETAILS = "values.json"         # plots/details/<stage>/<task>/values.json


def task_tables(tasks_dir: Path | str, task: str) -> Path:
    """The folder of a task's split tables, in the folder of every task (data/tasks)."""
    return Path(tasks_dir) / task / TASK_TABLES


# Figure labels of the runs of finetune.compare_methods (finetune.method's runs are Phang et al.'s FT[i]).
METHOD_LABELS = {"full": "Full", "lora": "LoRA"}


@dataclass(frozen=True)
class FinetunedRun:
    """One fine-tuning run of a task: finetune.method's with a seed (``primary``, Phang et al.'s FT), or a run of
    finetune.compare_methods with the same seed, which only similarity and weights compare."""

    method: str
    seed: int
    primary: bool = True

    @property
    def name(self) -> str:
        """The run's name in activation tables: ``seed<k>``, or ``<method>-seed<k>`` for a compared method."""
        return f"seed{self.seed}" if self.primary else f"{self.method}-seed{self.seed}"

    def folder(self, checkpoints: Path | str) -> Path:
        """Its checkpoint in one task's folder: ``seed<k>/model``, or ``<method>/seed<k>/model`` if compared."""
        return (Path(checkpoints) if self.primary else Path(checkpoints) / self.method) / f"seed{self.seed}" / CHECKPOINT

    def states(self, states: Path | str) -> Path:
        """Its kept states in one task's folder of states: ``seed<k>/states``, or ``<method>/seed<k>/states``."""
        return finetune_states(Path(states) if self.primary else Path(states) / self.method, self.seed)

    def curves(self, task_live: Path | str) -> Path:
        """Its dvclive curves in one task's folder (:func:`finetune_curves`)."""
        return finetune_curves(task_live, self.seed, None if self.primary else self.method)

    def label(self, position: int) -> str:
        """Figure label of the run of the `position`-th seed (from 1): FT[i], or e.g. LoRA[i] if compared."""
        return f"{'FT' if self.primary else METHOD_LABELS[self.method]}[{position}]"


def finetuned_runs(finetune, seeds, compared: bool = True) -> list[FinetunedRun]:
    """Every fine-tuning run of a task (FinetuneParams `finetune`, params.yaml's `seeds`): finetune.method's, then,
    unless `compared` is False, each of finetune.compare_methods' with the same seeds."""
    return ([FinetunedRun(finetune.method, seed) for seed in seeds]
            + [FinetunedRun(method, seed, primary=False) for method in (finetune.compare_methods if compared else ())
               for seed in seeds])


def as_runs(entries) -> list[FinetunedRun]:
    """`entries` as runs: each a FinetunedRun, or a seed (an int: finetune.method's run of that seed)."""
    return [entry if isinstance(entry, FinetunedRun) else FinetunedRun("", int(entry)) for entry in entries]


def run_labels(entries) -> dict[str, str]:
    """Run name → figure label of each run of `entries` (:func:`as_runs`), numbered by seed within its method:
    seed0, seed1, lora-seed0 → FT[1], FT[2], LoRA[1]."""
    counts: dict[tuple[bool, str], int] = {}
    labels = {}
    for run in as_runs(entries):
        key = (run.primary, run.method if not run.primary else "")
        counts[key] = counts.get(key, 0) + 1
        labels[run.name] = run.label(counts[key])
    return labels


def finetuned(checkpoints: Path | str, seed: int) -> Path:
    """A seed's checkpoint of finetune.method, in the folder of one task's (data/checkpoints/<task>)."""
    return Path(checkpoints) / f"seed{seed}" / CHECKPOINT


def finetune_states(states: Path | str, seed: int) -> Path:
    """A seed's kept intermediate states (finetune.keep_states: one ``step<N>`` folder each, and their index), in the
    folder of one task's states (data/states/<task>): outside its checkpoints, so that keeping other states
    changes no dependency of the stages that read the final models."""
    return Path(states) / f"seed{seed}" / STATES


def finetuned_run(checkpoints: Path | str, run: str) -> Path:
    """A fine-tuned run's checkpoint by the name its activation tables carry (``seed<k>``, ``<method>-seed<k>``)."""
    method, _, seed = run.rpartition("-")
    if not seed.startswith("seed") or not seed[4:].isdigit() or (method and method not in METHOD_LABELS):
        raise ValueError(f"{run!r} is not a fine-tuned run (seed<k> or <method>-seed<k>)")
    return FinetunedRun(method, int(seed[4:]), primary=not method).folder(checkpoints)


def finetune_metrics(task_metrics: Path | str, seed: int, method: str | None = None) -> Path:
    """A seed's finetune metrics file, in the folder of one task's (metrics/finetune/<task>); with `method`, that
    of a run of finetune.compare_methods (metrics/finetune/<task>/<method>/seed<k>)."""
    return Path(task_metrics) / (method or "") / f"seed{seed}" / METRICS


def finetune_curves(task_live: Path | str, seed: int, method: str | None = None) -> Path:
    """A seed's dvclive curves (one ``<name>.tsv`` per logged value: train/loss.tsv, eval/<metric>.tsv), in the
    folder of one task's (dvclive/finetune/<task>); with `method`, a run of finetune.compare_methods'."""
    return Path(task_live) / (method or "") / f"seed{seed}" / "plots" / "metrics"


def stage_metrics(metrics_dir: Path | str, stage: str, task: str) -> Path:
    """A matrix stage's metrics file for one task (finetune's are per seed: :func:`finetune_metrics`)."""
    return Path(metrics_dir) / stage / task / METRICS


def stage_details(details_dir: Path | str, stage: str, task: str) -> Path:
    """A matrix stage's plot data of every value for one task."""
    return Path(details_dir) / stage / task / DETAILS
