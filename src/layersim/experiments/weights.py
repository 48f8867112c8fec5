"""The weights stage's computation: what fine-tuning did to each layer's weight matrices, in weight space
(Shuttleworth et al.'s intruder dimensions, the spectrum, the update's norm and rank; layersim.similarity.weight_space),
per layer and matrix role (layersim.models.weight_matrices)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from layersim.data.layout import finetuned
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


def adapted_roles(finetune) -> tuple[str, ...]:
    """The matrix roles fine-tuning trained: every one under full fine-tuning, finetune.lora's under LoRA."""
    if finetune.method != "lora":
        return MATRIX_TYPES
    from layersim.training.adapters import adapter_roles

    return adapter_roles(finetune.lora.target_modules)


def change_rows(per_run: Mapping[int, Mapping[tuple[int, str], MatrixChange]],
                adapted: tuple[str, ...]) -> list[dict]:
    """The plot rows: one per (seed, layer, matrix role), seeds in `per_run`'s order as FT[1], FT[2], …; ``layer``
    counts the transformer layers from 1 (0 is the embeddings in every other curve file), ``series`` names the
    line (run and role) that the layer_series template draws; ``spectrum_change`` is the top k singular values'
    relative change, ``||s_after − s_before|| / ||s_before||``."""
    rows = []
    for position, (seed, changes) in enumerate(per_run.items(), start=1):
        for (layer, role), change in sorted(changes.items(), key=lambda kv: (kv[0][0], MATRIX_TYPES.index(kv[0][1]))):
            before, after = np.asarray(change.pretrained_spectrum), np.asarray(change.finetuned_spectrum)
            norm = float(np.linalg.norm(before))
            rows.append({"seed": seed, "run": f"FT[{position}]", "layer": layer + 1, "matrix": role,
                         "series": f"FT[{position}] {role}", "adapted": role in adapted,
                         "intruders": change.intruders, "update_rank": change.update_rank,
                         "relative_update_norm": _rounded(change.relative_update_norm),
                         "spectrum_change": _rounded(float(np.linalg.norm(after - before)) / norm if norm else None)})
    return rows


def weights_headline(rows: list[dict], method: str) -> dict:
    """The metrics file's scalars: the fine-tuning method; the mean intruder count per adapted matrix (and per
    matrix left frozen, under LoRA) over seeds and layers; the largest relative update norm; the largest update
    rank of an adapted matrix (LoRA: at most its rank r). Per role and layer: the plot rows."""
    adapted = [row for row in rows if row["adapted"]]
    frozen = [row for row in rows if not row["adapted"]]
    norms = [row["relative_update_norm"] for row in rows if row["relative_update_norm"] is not None]
    headline = {"method": method, "intruders_per_adapted_matrix": _mean(row["intruders"] for row in adapted),
                "max_relative_update_norm": max(norms, default=None),
                "max_update_rank_adapted": max((row["update_rank"] for row in adapted), default=None)}
    if frozen:
        headline["intruders_per_frozen_matrix"] = _mean(row["intruders"] for row in frozen)
    return headline


def task_weights(pretrained: Path, checkpoints: Path, seeds: Sequence[int], finetune, k: int, threshold: float,
                 log: Callable[..., None]) -> tuple[list[dict], dict, object]:
    """The weights stage for one task: every seed's checkpoint (layersim.data.layout.finetuned) against the
    pretrained model, as plot rows, the headline and the intruder heatmaps (one panel per seed)."""
    from layersim.models.registry import load_encoder
    from layersim.reporting.weight_plots import intruder_grids, intruder_heatmaps

    base, per_run = load_encoder(pretrained), {}
    for seed in seeds:
        per_run[seed] = weight_changes(base, load_encoder(finetuned(checkpoints, seed)), k, threshold)
        log("seed %d: %d intruder dimensions over %d matrices", seed,
            sum(change.intruders for change in per_run[seed].values()), len(per_run[seed]))
    rows = change_rows(per_run, adapted_roles(finetune))
    roles = tuple(dict.fromkeys(row["matrix"] for row in rows))
    figure = intruder_heatmaps({f"{run} (seed {seed})": grid for seed, (run, grid) in
                                zip(seeds, intruder_grids(rows, roles).items())}, roles, k,
                               f"Intruder dimensions per layer and matrix ({finetune.method} fine-tuning; "
                               f"top {k}, |cos| < {threshold:g})")
    return rows, weights_headline(rows, finetune.method), figure


def _rounded(value: float | None) -> float | None:
    return round(float(value), 6) if value is not None and np.isfinite(value) else None


def _mean(values: Iterable[float]) -> float | None:
    values = list(values)
    return round(sum(values) / len(values), 6) if values else None
