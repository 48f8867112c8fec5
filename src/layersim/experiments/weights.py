"""The weights stage's computation: what fine-tuning did to each layer's weight matrices, in weight space
(Shuttleworth et al.'s intruder dimensions, the spectrum, the update's norm and rank; layersim.similarity.weight_space),
per layer and matrix role (layersim.models.weight_matrices)."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from layersim.compute.threads import on_threads
from layersim.data.layout import as_runs, run_labels
from layersim.errors import LayersimError
from layersim.models.matrix_roles import adapter_roles
from layersim.models.weight_matrices import MATRIX_TYPES, layer_matrices
from layersim.similarity.weight_space import MatrixChange, Pretrained, matrix_change, null_p_value


def weight_changes(pretrained, finetuned, k: int, threshold: float,
                   roles: tuple[str, ...] = MATRIX_TYPES, null_draws: int = 0, seed: int = 0,
                   nulled: tuple[str, ...] | None = None) -> dict[tuple[int, str], MatrixChange]:
    """What fine-tuning did to each layer's matrices of `roles` of two models of one architecture (base or task
    models; `pretrained` also as :func:`pretrained_matrices` of the base, whose SVDs every run then shares):
    (layer index, role) → its :class:`MatrixChange`. The update's rank is read against the fine-tuned weights'
    stored dtype (bf16 weights have a coarser rounding floor than fp32 ones). With `null_draws`, the matrices of
    the roles `nulled` (default all) get the rotated-update null of their intruder count
    (layersim.similarity.weight_space.rotated_update_counts), each from its own stream of `seed` (so the results do
    not depend on the order :func:`layersim.compute.threads.on_threads` computes them in)."""
    import torch

    before = ({key: value for key, value in pretrained.items() if key[1] in roles} if isinstance(pretrained, Mapping)
              else pretrained_matrices(pretrained, roles))
    after = layer_matrices(finetuned, roles)
    if before.keys() != after.keys() or any(before[key].matrix.shape != after[key].shape for key in before):
        raise LayersimError("the fine-tuned model's layers do not match the pretrained model's (another depth or "
                            "width); compare a checkpoint only with the model it was fine-tuned from.")
    nulled = roles if nulled is None else nulled

    def change(key: tuple[int, str]) -> MatrixChange:
        return matrix_change(before[key], after[key].float().cpu().numpy(), k, threshold,
                             eps=torch.finfo(after[key].dtype).eps, null_draws=null_draws if key[1] in nulled else 0,
                             rng=np.random.default_rng([seed, key[0], MATRIX_TYPES.index(key[1])]))

    return on_threads(change, before)


def pretrained_matrices(model, roles: tuple[str, ...] = MATRIX_TYPES) -> dict[tuple[int, str], Pretrained]:
    """Each layer's matrices of `roles` of the pretrained model with their SVDs (weight_space.Pretrained), taken once
    for every run compared with them."""
    matrices = layer_matrices(model, roles)
    return on_threads(lambda key: Pretrained.of(matrices[key].float().cpu().numpy()), matrices)


def adapted_roles(finetune, method: str | None = None) -> tuple[str, ...]:
    """The matrix roles fine-tuning by `method` (default finetune.method) trained: every one under full fine-tuning,
    finetune.lora's under LoRA."""
    if (method or finetune.method) != "lora":
        return MATRIX_TYPES
    return adapter_roles(finetune.lora.target_modules)


def change_rows(per_run: Mapping, adapted: tuple[str, ...] | Mapping[str, tuple[str, ...]]) -> list[dict]:
    """The plot rows: one per (run, layer, matrix role), runs in `per_run`'s order (keys: seeds, or
    layersim.data.layout.FinetunedRun; labelled FT[1], FT[2], …, LoRA[1] for a compared method's); `adapted`: the
    roles trained, or per method. ``layer`` counts the transformer layers from 1 (0 is the embeddings in every other
    curve file), ``series`` names the line (run and role) that the layer_series template draws;
    ``spectrum_change`` is the top k singular values' relative change, ``||s_after − s_before|| / ||s_before||``;
    with the null, ``intruders_null_mean`` (the count it expects) and ``intruders_p_value``."""
    runs, rows = as_runs(per_run), []
    for run, label, changes in zip(runs, run_labels(runs).values(), per_run.values()):
        trained = adapted.get(run.method, MATRIX_TYPES) if isinstance(adapted, Mapping) else adapted
        for (layer, role), change in sorted(changes.items(), key=lambda kv: (kv[0][0], MATRIX_TYPES.index(kv[0][1]))):
            before, after = np.asarray(change.pretrained_spectrum), np.asarray(change.finetuned_spectrum)
            norm = float(np.linalg.norm(before))
            nulls = ({"intruders_null_mean": _rounded(change.null_mean), "intruders_p_value": _rounded(change.p_value)}
                     if change.null_intruders else {})
            rows.append({"seed": run.seed, **({} if run.primary else {"method": run.method}), "run": label,
                         "layer": layer + 1, "matrix": role, "series": f"{label} {role}", "adapted": role in trained,
                         "intruders": change.intruders, **nulls, "update_rank": change.update_rank,
                         "relative_update_norm": _rounded(change.relative_update_norm),
                         "spectrum_change": _rounded(float(np.linalg.norm(after - before)) / norm if norm else None)})
    return rows


def intruder_test(rows: Sequence[Mapping], draws: Mapping[tuple[str, int, str], Sequence[int]]) -> dict:
    """The intruder count of the matrices of `rows` against the rotated-update null: ``intruders_per_matrix``,
    ``null_per_matrix`` (what the null expects) and ``p_value`` of their total, whose null adds the matrices' draws
    index by index (the draws are independent across matrices, so each sum is a draw of the total's null).
    `draws`: (run label, layer, role) → that matrix's null counts. Without draws for every matrix, the count alone."""
    found = {"matrices": len(rows), "intruders_per_matrix": _mean(row["intruders"] for row in rows)}
    chosen = [draws.get((row["run"], row["layer"], row["matrix"])) for row in rows]
    if not rows or not all(chosen):
        return found
    total, null = sum(row["intruders"] for row in rows), np.sum(chosen, axis=0)
    return found | {"null_per_matrix": _rounded(null.mean() / len(rows)),
                    "p_value": _rounded(null_p_value(total, null))}


def weights_headline(rows: list[dict], method: str,
                     draws: Mapping[tuple[str, int, str], Sequence[int]] | None = None) -> dict:
    """The metrics file's scalars: the fine-tuning method; the mean intruder count per adapted matrix (and per
    matrix left frozen, under LoRA) over seeds and layers; the largest relative update norm; the largest update
    rank of an adapted matrix (LoRA: at most its rank r). With the null's `draws` (:func:`intruder_test`):
    ``intruders_per_adapted_matrix_null`` (its expected count per matrix) and ``intruders_p_value``, and
    ``by_role``: each adapted role's count, expectation and p. Per role and layer: the plot rows. The rows of
    finetune.compare_methods' runs (with a ``method``) get the same scalars under ``compared`` → method; and, as
    the methods adapt different roles (LoRA: query and value; full fine-tuning: all six), ``shared_roles`` names
    the roles every method adapted and each method gets ``intruders_per_shared_role_matrix`` (with its null and
    p): the like-for-like comparison."""
    draws = draws or {}

    def tested(chosen: list[dict], count: str, p_value: str) -> dict:
        found = intruder_test(chosen, draws)
        return {count: found["intruders_per_matrix"]} | (
            {f"{count}_null": found["null_per_matrix"], p_value: found["p_value"]} if "p_value" in found else {})

    def scalars(chosen: list[dict], shared: tuple[str, ...] | None) -> dict:
        adapted = [row for row in chosen if row["adapted"]]
        frozen = [row for row in chosen if not row["adapted"]]
        norms = [row["relative_update_norm"] for row in chosen if row["relative_update_norm"] is not None]
        found = tested(adapted, "intruders_per_adapted_matrix", "intruders_p_value") | {
            "max_relative_update_norm": max(norms, default=None),
            "max_update_rank_adapted": max((row["update_rank"] for row in adapted), default=None)}
        found |= {"intruders_per_frozen_matrix": _mean(row["intruders"] for row in frozen)} if frozen else {}
        if shared is not None:
            found |= tested([row for row in adapted if row["matrix"] in shared], "intruders_per_shared_role_matrix",
                            "intruders_shared_roles_p_value")
        roles = dict.fromkeys(row["matrix"] for row in adapted)
        if draws and roles:
            found["by_role"] = {role: intruder_test([row for row in adapted if row["matrix"] == role], draws)
                                for role in roles}
        return found

    by_method: dict[str | None, list[dict]] = {}  # finetune.method's rows under None
    for row in rows:
        by_method.setdefault(row.get("method"), []).append(row)
    shared = None
    if len(by_method) > 1:
        roles = [{row["matrix"] for row in chosen if row["adapted"]} for chosen in by_method.values()]
        shared = tuple(role for role in MATRIX_TYPES if all(role in found for found in roles))
    headline = {"method": method} | ({"shared_roles": list(shared)} if shared is not None else {}) | scalars(
        by_method.get(None, []), shared)
    compared = [other for other in by_method if other is not None]
    if compared:
        headline["compared"] = {other: scalars(by_method[other], shared) for other in compared}
    return headline


def weights_details(rows: Sequence[Mapping]) -> dict:
    """Every per-matrix value of the stage, nested for the details file
    (layersim.reporting.headlines.metrics_to_details): per run label and role, each row's numbers by ``layer_NN``
    (transformer layers from 1, as the rows)."""
    full: dict = {}
    for row in rows:
        entry = full.setdefault(row["run"], {}).setdefault(row["matrix"], {})
        for key in ("intruders", "intruders_null_mean", "intruders_p_value", "update_rank", "relative_update_norm",
                    "spectrum_change"):
            if key in row:
                entry.setdefault(key, {})[f"layer_{row['layer']:02d}"] = row[key]
    return full


@dataclass
class WeightsOutputs:
    """What the weights stage writes: the plot rows, every value nested (the details), the headline, the figure."""
    rows: list[dict]
    full: dict
    headline: dict
    figure: object


def task_weights(pretrained: Path, checkpoints: Path, runs: Sequence, finetune, k: int, threshold: float,
                 log: Callable[..., None], null_draws: int = 0) -> WeightsOutputs:
    """The weights stage for one task: every run's checkpoint (`runs`: seeds, or layersim.data.layout.FinetunedRun,
    finetune.compare_methods' included) against the pretrained model, as plot rows, the headline and the intruder
    heatmaps (one panel per run); with `null_draws`, each adapted matrix's intruder count against the
    rotated-update null (layersim.similarity.weight_space.rotated_update_counts), each run's draws from a stream of
    its own (its name's checksum)."""
    from layersim.models.registry import load_encoder
    from layersim.reporting.weight_plots import intruder_grids, intruder_heatmaps

    base, per_run = pretrained_matrices(load_encoder(pretrained)), {}
    adapted = {}
    for run in as_runs(runs):
        adapted[run.method] = adapted_roles(finetune, run.method or None)
        per_run[run] = weight_changes(base, load_encoder(run.folder(checkpoints)), k, threshold,
                                      null_draws=null_draws, seed=zlib.crc32(run.name.encode()),
                                      nulled=adapted[run.method])
        changes = per_run[run].values()
        log("%s: %d intruder dimensions over %d matrices%s", run.name, sum(change.intruders for change in changes),
            len(changes), f" (the null expects {sum(c.null_mean or 0 for c in changes):.2f})" if null_draws else "")
    rows = change_rows(per_run, adapted)
    labels = run_labels(per_run)
    draws = {(labels[run.name], layer + 1, role): change.null_intruders
             for run, changes in per_run.items() for (layer, role), change in changes.items() if change.null_intruders}
    roles = tuple(dict.fromkeys(row["matrix"] for row in rows))
    methods = " and ".join(dict.fromkeys((run.method or finetune.method) for run in per_run))
    figure = intruder_heatmaps({f"{label} (seed {run.seed})": grid for run, (label, grid) in
                                zip(per_run, intruder_grids(rows, roles).items())}, roles, k,
                               f"Intruder dimensions per layer and matrix ({methods} fine-tuning; "
                               f"top {k}, |cos| < {threshold:g})")
    headline = weights_headline(rows, finetune.method, draws)
    return WeightsOutputs(rows, weights_details(rows), headline, figure)


def _rounded(value: float | None) -> float | None:
    return round(float(value), 6) if value is not None and np.isfinite(value) else None


def _mean(values: Iterable[float]) -> float | None:
    values = list(values)
    return round(sum(values) / len(values), 6) if values else None
