"""Wu et al. 2020, Table 1: fine-tuning with the bottom or top k layers frozen, scored next to the unfrozen
run of the same recipe and seed, with what freezing saves.

Wu et al. freeze 4 or 6 of BERT's 12 layers; `freeze.layers` counts out of 12 and is scaled to the
model's depth L as ``round(k × L / 12)`` (at least 1, at most L): MiniLM's 6 layers give 2 and 3.

The recipe (`freeze.recipe`, :mod:`layersim.training.recipes`): ``wu``, Hugging Face's defaults as Wu ran
them, with the unfrozen run of each seed trained here with it; or ``finetune``, the finetune section's
recipe, whose unfrozen run of each seed is the finetune stage's run (the same recipe and seed: training it
again would give the same run), read from its metrics file. Either way frozen and unfrozen runs differ only
in freezing. No checkpoint is kept: only scores and convergence verdicts.

The cost, two ways: the share of backward (and training) FLOPs saved, counted from the model's shape
(:func:`layersim.compute.flops.training_flops`), which goes into the hashed outputs; and the time per
training step measured interleaved in one process (:mod:`layersim.training.step_timing`), a wall-clock
number that goes only to the stage's timings file (a rerun gives the same dvc.lock).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from layersim.data.tasks import TaskSpec
from layersim.compute.flops import FREEZE_SIDES, LayerShape, flops_saved
from layersim.models.registry import read_json
from layersim.params.schema import WU_DEPTH
from layersim.reporting.freeze_plots import change_label, freeze_bars
from layersim.compute.runs import converged_mean
from layersim.training.convergence import NOT_CONVERGED, enforce, metrics_record, run_flags


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


@dataclass(frozen=True)
class FreezeRun:
    config: FreezeConfig | None  # None: the unfrozen run
    seed: int
    score: float                 # the task's primary metric
    convergence: dict | None = None  # its convergence record (layersim.training.convergence), None if not checked


BASELINES = {"wu": "trained in the freeze stage with the same recipe",
             "finetune": "the finetune stage's run of the same recipe and seed"}


def train_runs(train_one: Callable[[FreezeConfig | None, int], tuple[float, object]], seeds: Sequence[int],
               configs: Sequence[FreezeConfig], *, baselines: Mapping[int, FreezeRun] | None, what: str,
               finetune, log) -> list[FreezeRun]:
    """The unfrozen run of every seed (`baselines`, the finetune stage's; or, when None, trained by
    `train_one(None, seed)`), then every frozen configuration's. ``train_one(config, seed)`` fine-tunes and
    returns (score, convergence check); a run that did not converge warns, or with
    ``finetune.require_convergence`` fails here, before any output is written."""
    runs = []
    for seed in seeds:
        for config in ([] if baselines else [None]) + list(configs):
            score, check = train_one(config, seed)
            frozen = "nothing" if config is None else f"the {config.side} {config.layers} layers"
            enforce(check, f"fine-tuning {what} seed {seed} with {frozen} frozen", finetune, log)
            runs.append(FreezeRun(config, seed, float(score), check.record()))
            log.info("seed %d, %s frozen: %.4f", seed, frozen, score)
    return ([baselines[seed] for seed in seeds] if baselines else []) + runs


def freeze_report(spec: TaskSpec, num_layers: int, runs: Sequence[FreezeRun], recipe: dict,
                  flops: Mapping[str, Mapping[str, float]]) -> tuple[dict, list[dict], object]:
    """The full results, the plot rows and the bar chart.

    Full: the recipe; the unfrozen runs (mean score, how many did not converge, where they come from); per
    configuration its mean score (``score_converged``: over converged runs only, as for the unfrozen), the change against the unfrozen runs of the same seeds, the unfrozen mean
    and unconverged count beside it, per seed, runs not converged, and `flops` (label → the shares of backward
    and training FLOPs saved). Rows: one per run, frozen ones with their seed's unfrozen score and verdict
    beside them. The chart: score per configuration with its backward FLOPs saved, the unfrozen score as a
    line; a bar or line with unconverged runs says how many. No measured time: see freeze_timings."""
    unfrozen = {run.seed: run for run in runs if run.config is None}
    configs = list(dict.fromkeys(run.config for run in runs if run.config is not None))
    flags = {}  # (config, seed) → why the run is flagged: its own check and its seed siblings of one config
    for config in (None, *configs):
        flags |= {(config, seed): reason for seed, reason in run_flags(
            {run.seed: run.convergence or {"score": run.score} for run in runs if run.config == config}).items()}
    full = {"metric": spec.primary_metric, "num_layers": num_layers, "recipe": recipe,
            "unfrozen": {"score": _mean(run.score for run in unfrozen.values()),
                         "score_converged": _converged_mean(unfrozen.values(), flags),
                         "not_converged": sum(config is None for config, _ in flags),
                         "baseline": BASELINES[recipe["name"]]}}
    bars = {}
    for config in configs:
        mine = [run for run in runs if run.config == config]
        entry = {"side": config.side, "layers": config.layers, "of_twelve": config.of_twelve,
                 "score": _mean(run.score for run in mine), "score_converged": _converged_mean(mine, flags),
                 "score_change": _mean(run.score - unfrozen[run.seed].score for run in mine),
                 "unfrozen_score": _mean(unfrozen[run.seed].score for run in mine),
                 "unfrozen_not_converged": sum((None, run.seed) in flags for run in mine),
                 "seeds": {str(run.seed): run.score for run in mine},
                 "not_converged": sum(key[0] == config for key in flags)}
        entry |= {key: round(value, 6) for key, value in flops.get(config.label, {}).items()}
        full[config.label] = entry
        label = _flagged_label(f"{config.side} {config.layers}", entry["not_converged"], len(mine))
        bars[label] = (entry["score"], entry.get("backward_flops_saved"))
    rows = [{"config": "unfrozen" if run.config is None else run.config.label, "seed": run.seed,
             "score": round(run.score, 6),
             "converged": (run.config, run.seed) not in flags, "reason": flags.get((run.config, run.seed), "")}
            # Every row the same fields (the unfrozen run's own comparison null): DVC cannot plot rows whose keys differ.
            | ({"unfrozen_score": None, "unfrozen_converged": None} if run.config is None else
               {"unfrozen_score": round(unfrozen[run.seed].score, 6),
                "unfrozen_converged": (None, run.seed) not in flags})
            for run in runs]
    unfrozen_label = _flagged_label("unfrozen", full["unfrozen"]["not_converged"], len(unfrozen))
    figure = freeze_bars(bars, (unfrozen_label, full["unfrozen"]["score"]),
                         f"{spec.name}: frozen layers during fine-tuning (Wu et al. Table 1)\n{num_layers}-layer "
                         f"model, recipe {recipe['name']}", spec.primary_metric)
    return full, rows, figure


def config_flops(shape: LayerShape, configs: Sequence[FreezeConfig], seq_lens: Sequence[int]) -> dict[str, dict]:
    """Per configuration, the shares of backward and training FLOPs saved on sequences of these padded lengths."""
    return {config.label: flops_saved(shape, config.side, config.layers, seq_lens) for config in configs}


def freeze_timings(seconds: Mapping[str, Sequence[float]], ratios: Mapping[str, Mapping[str, float]],
                   block: int) -> dict:
    """The timings file: each configuration's block seconds (interleaved, :mod:`layersim.training.step_timing`)
    and, for the frozen ones, ``time_ratio``, ``steps_per_second_ratio`` and ``time_per_step``, the change in
    time per step as a label ("−24 % time": 24 % less). Wall clock: in no hashed output."""
    timings = {"block_steps": block, "unfrozen": {"block_seconds": [round(t, 4) for t in seconds["unfrozen"]]}}
    for label, ratio in ratios.items():
        timings[label] = dict(ratio) | {"time_per_step": change_label(ratio["time_ratio"] - 1, "time"),
                                        "block_seconds": [round(t, 4) for t in seconds[label]]}
    return timings


def _flagged_label(label: str, flagged: int, runs: int) -> str:
    """A bar's label; with unconverged runs among the seeds it averages, e.g. "top 2 (not converged: 1 of 2)"."""
    return f"{label} ({NOT_CONVERGED}: {flagged} of {runs})" if flagged else label


def freeze_headline(full: dict) -> dict:
    """Per configuration ``score_change`` (the task score against the unfrozen runs of the same recipe and seeds,
    mean over seeds) and ``backward_flops_saved`` (a share, counted); ``not_converged``: how many runs (frozen
    and unfrozen) did not converge. The measured time per step is in the timings file."""
    headline = {label: {key: entry[key] for key in ("score_change", "backward_flops_saved") if key in entry}
                for label, entry in full.items() if isinstance(entry, dict) and "score_change" in entry}
    return headline | {"not_converged": sum(entry.get("not_converged", 0) for entry in full.values()
                                            if isinstance(entry, dict))}


def _converged_mean(runs: Iterable[FreezeRun], flags: Mapping) -> float | None:
    """The mean score of the runs not flagged (layersim.compute.runs.converged_mean), beside the all-runs mean."""
    value = converged_mean({(run.config, run.seed): run.score for run in runs}, flags)
    return round(float(value), 6) if np.isfinite(value) else None


def _mean(values: Iterable[float | None]) -> float | None:
    defined = [float(v) for v in values if v is not None]
    return round(float(np.mean(defined)), 6) if defined else None


def finetuned_run(metrics_file: Path, spec: TaskSpec, seed: int) -> FreezeRun:
    """The finetune stage's run of `seed`, from its metrics file: the unfrozen run of recipe ``finetune``."""
    metrics = read_json(Path(metrics_file), "the finetune stage's metrics file", "re-run the finetune stage")
    return FreezeRun(None, seed, float(metrics[spec.primary_metric]), metrics_record(metrics, spec.primary_metric))
