"""The weights stage's computation: what fine-tuning did to each layer's weight matrices, in weight space
(Shuttleworth et al.'s intruder dimensions, the spectrum, the update's norm and rank; layersim.similarity.weight_space),
per layer and matrix role (layersim.models.weight_matrices)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from layersim.data.layout import as_runs, run_labels
from layersim.errors import LayersimError
from layersim.models.weight_matrices import MATRIX_TYPES, layer_matrices
from layersim.similarity.weight_space import MatrixChange, matrix_change


def weight_changes(pretrained, finetuned, k: int, threshold: float,
                   roles: tuple[str, ...] = MATRIX_TYPES) -> dict[tuple[int, str], MatrixChange]:
    """What fine-tuning did to each layer's matrices of `roles` of two models of one architecture (base or task
    models): (layer index, role) → its :class:`MatrixChange`. The update's rank is read against the fine-tuned
    weights' stored dtype (bf16 weights have a coarser rounding floor than fp32 ones)."""
    import torch

    before, after = layer_matrices(pretrained, roles), layer_matrices(finetuned, roles)
    if before.keys() != after.keys() or any(before[key].shape != after[key].shape for key in before):
        raise LayersimError("the fine-tuned model's layers do not match the pretrained model's (another depth or "
                            "width); compare a checkpoint only with the model it was fine-tuned from.")
    return {key: matrix_change(before[key].float().cpu().numpy(), after[key].float().cpu().numpy(), k, threshold,
                               eps=torch.finfo(after[key].dtype).eps) for key in before}


def adapted_roles(finetune, method: str | None = None) -> tuple[str, ...]:
    """The matrix roles fine-tuning by `method` (default finetune.method) trained: every one under full fine-tuning,
    finetune.lora's under LoRA."""
    if (method or finetune.method) != "lora":
        return MATRIX_TYPES
    from layersim.training.adapters import adapter_roles

    return adapter_roles(finetune.lora.target_modules)


def change_rows(per_run: Mapping, adapted: tuple[str, ...] | Mapping[str, tuple[str, ...]]) -> list[dict]:
    """The plot rows: one per (run, layer, matrix role), runs in `per_run`'s order (keys: seeds, or
    layersim.data.layout.FinetunedRun; labelled FT[1], FT[2], …, LoRA[1] for a compared method's); `adapted`: the
    roles trained, or per method. ``layer`` counts the transformer layers from 1 (0 is the embeddings in every other
    curve file), ``series`` names the line (run and role) that the layer_series template draws;
    ``spectrum_change`` is the top k singular values' relative change, ``||s_after − s_before|| / ||s_before||``."""
    runs, rows = as_runs(per_run), []
    for run, label, changes in zip(runs, run_labels(runs).values(), per_run.values()):
        trained = adapted.get(run.method, MATRIX_TYPES) if isinstance(adapted, Mapping) else adapted
        for (layer, role), change in sorted(changes.items(), key=lambda kv: (kv[0][0], MATRIX_TYPES.index(kv[0][1]))):
            before, after = np.asarray(change.pretrained_spectrum), np.asarray(change.finetuned_spectrum)
            norm = float(np.linalg.norm(before))
            rows.append({"seed": run.seed, **({} if run.primary else {"method": run.method}), "run": label,
                         "layer": layer + 1, "matrix": role, "series": f"{label} {role}", "adapted": role in trained,
                         "intruders": change.intruders, "update_rank": change.update_rank,
                         "relative_update_norm": _rounded(change.relative_update_norm),
                         "spectrum_change": _rounded(float(np.linalg.norm(after - before)) / norm if norm else None)})
    return rows


def weights_headline(rows: list[dict], method: str) -> dict:
    """The metrics file's scalars: the fine-tuning method; the mean intruder count per adapted matrix (and per
    matrix left frozen, under LoRA) over seeds and layers; the largest relative update norm; the largest update
    rank of an adapted matrix (LoRA: at most its rank r). Per role and layer: the plot rows. The rows of
    finetune.compare_methods' runs (with a ``method``) get the same scalars under ``compared`` → method."""
    def scalars(chosen: list[dict]) -> dict:
        adapted = [row for row in chosen if row["adapted"]]
        frozen = [row for row in chosen if not row["adapted"]]
        norms = [row["relative_update_norm"] for row in chosen if row["relative_update_norm"] is not None]
        found = {"intruders_per_adapted_matrix": _mean(row["intruders"] for row in adapted),
                 "max_relative_update_norm": max(norms, default=None),
                 "max_update_rank_adapted": max((row["update_rank"] for row in adapted), default=None)}
        return found | ({"intruders_per_frozen_matrix": _mean(row["intruders"] for row in frozen)} if frozen else {})

    headline = {"method": method} | scalars([row for row in rows if "method" not in row])
    compared = dict.fromkeys(row["method"] for row in rows if "method" in row)
    if compared:
        headline["compared"] = {other: scalars([row for row in rows if row.get("method") == other])
                                for other in compared}
    return headline


def task_weights(pretrained: Path, checkpoints: Path, runs: Sequence, finetune, k: int, threshold: float,
                 log: Callable[..., None]) -> tuple[list[dict], dict, object]:
    """The weights stage for one task: every run's checkpoint (`runs`: seeds, or layersim.data.layout.FinetunedRun,
    finetune.compare_methods' included) against the pretrained model, as plot rows, the headline and the intruder
    heatmaps (one panel per run)."""
    from layersim.models.registry import load_encoder
    from layersim.reporting.weight_plots import intruder_grids, intruder_heatmaps

    base, per_run = load_encoder(pretrained), {}
    for run in as_runs(runs):
        per_run[run] = weight_changes(base, load_encoder(run.folder(checkpoints)), k, threshold)
        log("%s: %d intruder dimensions over %d matrices", run.name,
            sum(change.intruders for change in per_run[run].values()), len(per_run[run]))
    rows = change_rows(per_run, {run.method: adapted_roles(finetune, run.method or None) for run in per_run})
    roles = tuple(dict.fromkeys(row["matrix"] for row in rows))
    methods = " and ".join(dict.fromkeys((run.method or finetune.method) for run in per_run))
    figure = intruder_heatmaps({f"{label} (seed {run.seed})": grid for run, (label, grid) in
                                zip(per_run, intruder_grids(rows, roles).items())}, roles, k,
                               f"Intruder dimensions per layer and matrix ({methods} fine-tuning; "
                               f"top {k}, |cos| < {threshold:g})")
    return rows, weights_headline(rows, finetune.method), figure


def _rounded(value: float | None) -> float | None:
    return round(float(value), 6) if value is not None and np.isfinite(value) else None


def _mean(values: Iterable[float]) -> float | None:
    values = list(values)
    return round(sum(values) / len(values), 6) if values else None
