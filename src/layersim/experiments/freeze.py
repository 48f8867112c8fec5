"""Wu et al. 2020, Table 1: fine-tuning with the bottom or top k layers frozen, scored next to the
unfrozen run of the same task and seed, with the fine-tuning time saved.

Wu et al. freeze 4 or 6 of BERT's 12 layers; `freeze.layers` counts out of 12 and is scaled to the
model's depth L as ``round(k × L / 12)`` (at least 1, at most L): MiniLM's 6 layers give 2 and 3. The
runs use the finetune stage's recipe and seeds (``freeze.seeds``: a subset), without intermediate
evaluations, and save no checkpoint: only their score and training time are reported. Training times are
wall clock: :func:`freeze_timings` gives them apart from the scores, for the stage's timings file, which no
hashed output holds (a rerun gives the same dvc.lock).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from layersim.training.convergence import NOT_CONVERGED, metrics_record, run_flags
from layersim.models.freezing import FREEZE_SIDES
from layersim.params import Params
from layersim.params.schema import WU_DEPTH
from layersim.reporting.plots import method_bars
from layersim.data.tasks import TaskSpec


@dataclass(frozen=True)
class FreezeConfig:
    side: str          # "bottom" (with the embeddings) or "top"
    layers: int        # frozen layers of this model
    of_twelve: int     # as given in params, out of Wu's 12

    @property
    def label(self) -> str:
        return f"{self.side}{self.layers}"


def scaled_layers(k_of_twelve: int, num_layers: int) -> int:
    """``round(k × L / 12)``, kept within 1..L."""
    return min(num_layers, max(1, round(k_of_twelve * num_layers / WU_DEPTH)))


def freeze_configs(layers_of_twelve: Iterable[int], num_layers: int) -> list[FreezeConfig]:
    """Every (side, k) to run, bottom first, without repeats after scaling."""
    configs, seen = [], set()
    for side in FREEZE_SIDES:
        for k in layers_of_twelve:
            config = FreezeConfig(side, scaled_layers(k, num_layers), k)
            if (side, config.layers) not in seen:
                seen.add((side, config.layers))
                configs.append(config)
    return configs


def frozen_params(params: Params):
    """The finetune recipe for frozen runs: the same, without intermediate evaluations or saved states."""
    return dataclasses.replace(params.finetune, eval_every=0, checkpoint_every=0)


@dataclass(frozen=True)
class FreezeRun:
    config: FreezeConfig | None  # None: the unfrozen run of the finetune stage
    seed: int
    score: float                 # the task's primary metric
    train_seconds: float | None
    convergence: dict | None = None  # its convergence record (layersim.training.convergence), None if not checked


def freeze_report(spec: TaskSpec, num_layers: int, runs: Sequence[FreezeRun]) -> tuple[dict, list[dict], object]:
    """The full results (per config: mean score, change against unfrozen, per seed, runs not converged), the
    plot rows (one per run, with ``converged`` and the reason) and the bar chart (score per configuration, the
    unfrozen score as a line; a bar with unconverged runs says how many). No times: see freeze_timings."""
    unfrozen = {run.seed: run for run in runs if run.config is None}
    configs = list(dict.fromkeys(run.config for run in runs if run.config is not None))
    flags = {}  # (config, seed) → why the run is flagged: its own check and its seed siblings of one config
    for config in (None, *configs):
        flags |= {(config, seed): reason for seed, reason in run_flags(
            {run.seed: run.convergence or {"score": run.score} for run in runs if run.config == config}).items()}
    full = {"metric": spec.primary_metric, "num_layers": num_layers,
            "unfrozen": {"score": _mean(run.score for run in unfrozen.values()),
                         "not_converged": sum(config is None for config, _ in flags)}}
    bars = {}
    for config in configs:
        mine = [run for run in runs if run.config == config]
        changes = [run.score - unfrozen[run.seed].score for run in mine]
        entry = {"side": config.side, "layers": config.layers, "of_twelve": config.of_twelve,
                 "score": _mean(run.score for run in mine), "score_change": _mean(changes),
                 "seeds": {str(run.seed): run.score for run in mine},
                 "not_converged": sum(key[0] == config for key in flags)}
        full[config.label] = entry
        bars[_flagged_label(f"{config.side} {config.layers}", entry["not_converged"], len(mine))] = entry["score"]
    rows = [{"config": "unfrozen" if run.config is None else run.config.label, "seed": run.seed,
             "score": round(run.score, 6),
             "converged": (run.config, run.seed) not in flags, "reason": flags.get((run.config, run.seed), "")}
            for run in runs]
    unfrozen_label = _flagged_label("unfrozen", full["unfrozen"]["not_converged"], len(unfrozen))
    figure = method_bars(bars, f"{spec.name}: frozen layers during fine-tuning (Wu et al. Table 1), "
                               f"{num_layers}-layer model", spec.primary_metric,
                         {unfrozen_label: full["unfrozen"]["score"]})
    return full, rows, figure


def freeze_timings(runs: Sequence[FreezeRun]) -> dict:
    """Wall-clock training seconds per run, and per frozen configuration the time saved against the unfrozen
    run of the same seed (mean over seeds with both times; None without): for the timings file only."""
    unfrozen = {run.seed: run.train_seconds for run in runs if run.config is None}
    timings = {"unfrozen": {"train_seconds": {str(seed): t for seed, t in unfrozen.items()}}}
    for config in dict.fromkeys(run.config for run in runs if run.config is not None):
        mine = [run for run in runs if run.config == config]
        saved = [1.0 - run.train_seconds / unfrozen[run.seed] for run in mine
                 if run.train_seconds and unfrozen.get(run.seed)]
        timings[config.label] = {"train_seconds": {str(run.seed): run.train_seconds for run in mine},
                                 "time_saved": _mean(saved)}
    return timings


def _flagged_label(label: str, flagged: int, runs: int) -> str:
    """A bar's label; with unconverged runs among the seeds it averages, e.g. "top 2 (not converged: 1 of 2)"."""
    return f"{label} ({NOT_CONVERGED}: {flagged} of {runs})" if flagged else label


def freeze_headline(full: dict) -> dict:
    """Per configuration, the change in the task score against the unfrozen run (mean over seeds), and
    ``not_converged``: how many runs (frozen and unfrozen) did not converge."""
    headline = {label: entry["score_change"] for label, entry in full.items()
                if isinstance(entry, dict) and "score_change" in entry}
    return headline | {"not_converged": sum(entry.get("not_converged", 0) for entry in full.values()
                                            if isinstance(entry, dict))}


def _mean(values: Iterable[float | None]) -> float | None:
    defined = [float(v) for v in values if v is not None]
    return round(float(np.mean(defined)), 6) if defined else None


def unfrozen_run(metrics_file: Path, timings_file: Path, spec: TaskSpec, seed: int) -> FreezeRun:
    """The finetune stage's run of `seed`, from its metrics file and its timings file (train_seconds; the time
    is None when that file is missing: a stage restored from DVC's run-cache writes no timings)."""
    import json

    metrics = json.loads(Path(metrics_file).read_text(encoding="utf-8"))
    seconds = json.loads(Path(timings_file).read_text(encoding="utf-8")).get("train_seconds") \
        if Path(timings_file).is_file() else None
    return FreezeRun(None, seed, float(metrics[spec.primary_metric]), seconds,
                     metrics_record(metrics, spec.primary_metric))
