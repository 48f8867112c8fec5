"""The dynamics stage's work for one task: how far each layer has moved over fine-tuning (Merchant et al. 2020; Zhou
& Srikumar 2022). For each seed, every point of its run — step 0 (ORIG), the states the finetune stage kept
(finetune.keep_states, layersim.training.states) and the final checkpoint — is compared layer by layer with ORIG and
with the final model: linear CKA of layer k against layer k, on the validation rows and the pooling of the similarity
stage's CKA headline (the model's own head token), each value with its permutation null (whole examples permuted where an example gives several
rows: layersim.similarity.inference.exchangeability) and a bootstrap interval over examples
(layersim.similarity.comparisons.stacked_null, layersim.similarity.inference.bootstrap.bootstrap_pairs).

ORIG's and the final model's layers are read from the extract stage's tables; a kept state's come from running the
final checkpoint's encoder with the state's weights through extract's own pooling (layersim.experiments.extract),
rounded to the tables' precision (extract.table_precision) so that every point is measured alike.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from layersim.data.io import ActivationTable, read_task_table, run_expectations
from layersim.data.io.stored import round_trip, table_encoding
from layersim.data.layout import finetuned_runs, run_labels
from layersim.errors import LayersimError
from layersim.params.model_kind import own_head_pooling
from layersim.similarity.comparisons import block_slices, stacked_null
from layersim.similarity.inference.bootstrap import bootstrap_pairs
from layersim.similarity.inference.exchangeability import null_units
from layersim.similarity.inference.correction import adjusted_p_values
from layersim.similarity.results import Uncertainty, settings
from layersim.training.convergence import checkpoint_flags
from layersim.training.states import read_index, step_folder

MEASURE = "linear_cka"


def dynamics_pooling(model: str, extracted: Sequence[str]) -> str:
    """The points the dynamics are measured on: the token the model's own head reads (cls, or last for decoders and
    XLNet), those of the similarity stage's CKA headline (Phang et al.), as the extract stage wrote them."""
    head = own_head_pooling(model)
    if head not in extracted:
        raise LayersimError(f"the dynamics stage compares {head} points (the token model {model!r}'s head reads), but "
                            f"extract.poolings ({', '.join(extracted)}) does not extract them; add head to it.")
    return head


def layer_cka(point: list[np.ndarray], references: dict[str, list[np.ndarray]], uncertainty: Uncertainty,
              groups: np.ndarray | None) -> dict[str, dict[str, np.ndarray]]:
    """Reference label → per layer (layer k of `point` against layer k of the reference): ``linear_cka`` with its
    null's ``null_mean`` and ``p_value`` and, with bootstrap resamples, its 95% interval ``ci_low``/``ci_high``.
    Rows of one example (`groups`) are permuted and resampled together; a constant layer gives NaN."""
    models = {"POINT": point, **references}
    sizes = {label: len(layers) for label, layers in models.items()}
    cells = np.zeros((sum(sizes.values()),) * 2, dtype=bool)
    for label in references:
        rows, columns = block_slices(sizes, "POINT", label)
        cells[rows, columns] = np.eye(len(point), dtype=bool)
    null = stacked_null(MEASURE, models, permutations=uncertainty.permutations, seed=uncertainty.seed, cells=cells,
                        groups=groups)
    out = {}
    for label in references:
        rows, columns = block_slices(sizes, "POINT", label)
        out[label] = {"linear_cka": np.diag(null.observed[rows, columns]).copy(),
                      "null_mean": np.diag(null.null_mean[rows, columns]).copy(),
                      "p_value": np.diag(null.p_value[rows, columns]).copy()}
    if uncertainty.bootstrap:
        ys = [layer for layers in references.values() for layer in layers]
        found = bootstrap_pairs(MEASURE, point * len(references), ys, resamples=uncertainty.bootstrap,
                                seed=uncertainty.seed, groups=groups)
        for label, low, high in zip(references, np.split(found.low, len(references)),
                                    np.split(found.high, len(references))):
            out[label] |= {"ci_low": low, "ci_high": high}
    return out


def half_way_step(steps: Sequence[int], to_orig: Sequence[float]) -> float | None:
    """The step at which a layer has moved half of its final distance from ORIG (1 − CKA to ORIG), on the run's
    points (`steps` ascending, the first ORIG, the last the final model): the first point at or past half the final
    distance, interpolated linearly from the point before it, so that it is not snapped up to the grid of kept states
    (on the fidelity review's grid 0, 40, …, 200 a true half-way step of 53 read as 80 in 98 % of noise draws). None
    when no state was kept between ORIG and the end (the value would be fixed by the grid: the end point, or half of
    it interpolated), or when the final model has not moved (or is undefined)."""
    distance = 1.0 - np.asarray(to_orig, dtype=float)
    final = distance[-1]
    if len(steps) < 3 or not np.isfinite(final) or final <= 0:
        return None
    points = [(step, d) for step, d in zip(steps, distance) if np.isfinite(d)]
    past = next(k for k, (_, d) in enumerate(points) if d >= final / 2)  # the final point is, at the latest
    if past == 0:
        return float(points[0][0])
    (before, moved), (step, d) = points[past - 1], points[past]
    return float(before + (final / 2 - moved) / (d - moved) * (step - before))


@dataclass
class DynamicsOutputs:
    """What the stage writes: plot rows per layer file, every value nested (the details), headline, figure."""
    curves: dict[str, list[dict]] = field(default_factory=dict)
    full: dict = field(default_factory=dict)
    headline: dict = field(default_factory=dict)
    figure: object = None


def eval_curve(curves: Path | None, metric: str) -> list[tuple[int, float]]:
    """The run's validation score at each evaluation step, from its dvclive `curves` (eval/<metric>.tsv), if any."""
    import csv

    path = Path(curves) / "eval" / f"{metric}.tsv" if curves else None
    if path is None or not path.is_file():
        return []
    with path.open(newline="") as handle:
        return [(int(row["step"]), float(row[metric])) for row in csv.DictReader(handle, delimiter="\t")]


def task_dynamics(activations: Path, checkpoints: Path, states: Path, task_dir: Path, live: Path | None, task: str,
                  params, log: Callable[..., None] = lambda *args: None) -> DynamicsOutputs:
    """Every run's points (ORIG, its kept states in `states`, its final model) against ORIG and the final model, per
    layer: finetune.method's seeds, then finetune.compare_methods' (layersim.data.layout.finetuned_runs)."""
    from layersim.data.tasks import get_task
    from layersim.reporting.dynamics_plots import dynamics_figure

    spec, (_, uncertainty) = get_task(task), settings(params.similarity)
    pooling = dynamics_pooling(params.model, params.extract.poolings)
    finetuned = finetuned_runs(params.finetune, params.seeds)
    known = run_expectations(checkpoints, finetuned)

    def table(run: str) -> ActivationTable:
        return ActivationTable(activations / f"{run}.{pooling}.parquet", expect={
            "task": task, "split": "validation", "run": run, "pooling": pooling, **known[run]})

    # Every run's kept states checked (digests, steps, the run they belong to) before any of them is measured.
    indexes = {run.name: read_index(run.states(states), known[run.name]["model_digest"]) for run in finetuned}
    orig = table("orig")
    orig_layers, groups = orig.layers(), orig.cluster_id  # clusters of examples sharing a text move as one
    flags = checkpoint_flags(checkpoints, finetuned)
    out, encoded = DynamicsOutputs(), None  # (tokenizer, validation rows), once a kept state needs them
    out.full = {"pooling": pooling, "rows": orig.num_rows, "measure": MEASURE,
                "null_unit": null_units(orig.num_rows, groups, unit=orig.null_unit())}
    runs = {}
    for run, label in zip(finetuned, run_labels(finetuned).values()):
        final_table = table(run.name)
        orig.check_comparable(final_table)
        final = final_table.layers()
        index = indexes[run.name]
        steps = [0, *index["steps"], index["max_steps"]]
        points = {0: orig_layers, index["max_steps"]: final}
        if index["steps"]:
            encoded = encoded or _encoded(task_dir, spec, run.folder(checkpoints), params, orig)
            points |= _state_layers(run.folder(checkpoints), run.states(states), index["steps"], encoded, pooling,
                                    params, log)
        per_step = {}
        for step in steps:
            per_step[step] = layer_cka(points.pop(step), {"ORIG": orig_layers, "final": final}, uncertainty, groups)
            log("%s step %d: linear CKA to ORIG %s", label, step,
                " ".join(f"{v:.3f}" for v in per_step[step]["ORIG"]["linear_cka"]))
        runs[run.name] = {"label": label, "seed": run.seed, "method": None if run.primary else run.method,
                          "steps": steps, "values": per_step,
                          "flag": flags.get(label), "evaluations": eval_curve(live and run.curves(live),
                                                                              spec.primary_metric)}
    _summarise(out, runs, len(orig_layers), uncertainty.correction)
    out.figure = dynamics_figure(runs, pooling, spec.primary_metric,
                                 f"How far each layer moved over fine-tuning — {params.model} on {task} "
                                 f"({pooling} points, linear CKA)")
    return out


def _encoded(task_dir: Path, spec, checkpoint: Path, params, orig: ActivationTable):
    """The validation rows the extract stage encoded (extract.max_examples), checked against its tables' rows."""
    from layersim.data.batching import encode_task
    from layersim.models.registry import load_tokenizer

    tokenizer = load_tokenizer(checkpoint)
    encoded = encode_task(read_task_table(task_dir, spec, "validation", params.extract.max_examples), spec, tokenizer,
                          params.finetune.max_length)
    orig.check_examples(encoded.example_id, encoded.num_choices)
    return tokenizer, encoded


def _state_layers(checkpoint: Path, states: Path, steps: Sequence[int], encoded, pooling: str, params,
                  log) -> dict[int, list[np.ndarray]]:
    """Each kept state's pooled layers: the checkpoint's encoder with the state's weights, run as extract runs it."""
    from layersim.compute.device import resolve_device
    from layersim.experiments.extract import pooled_layers
    from layersim.models.registry import load_encoder
    from layersim.training.states import load_state

    tokenizer, rows = encoded
    encoder, device, found = load_encoder(checkpoint), resolve_device(params.device), {}
    for step in steps:
        load_state(encoder, step_folder(states, step))
        layers = pooled_layers(encoder, tokenizer, rows, [pooling], params.extract.batch_size, device).layers[pooling]
        stored_as = table_encoding(params.extract.table_precision, pooling)  # as extract stores them
        layers = [round_trip(layer, stored_as) for layer in layers]
        found[step] = layers
        log("ran the state of step %d from %s", step, states)
    return found


TRIVIAL = {"ORIG": 0, "final": -1}  # reference → the point (first or last step) that is the reference itself


def _corrected(runs: dict, correction: str) -> dict:
    """Adjust every per-point p-value of the stage as one family (`correction`, the similarity stage's: Benjamini–
    Hochberg by default), in place (``p_adjusted`` beside each ``p_value``); the points that are their reference
    (step 0 against ORIG, the final model against itself) are no test and get NaN. Returns the family's note."""
    cells = [(numbers, np.full(len(numbers["p_value"]), step != run["steps"][TRIVIAL[reference]]))
             for run in runs.values() for step, values in run["values"].items()
             for reference, numbers in values.items() if "p_value" in numbers]
    if not cells:
        return {}
    flat = adjusted_p_values(np.concatenate([numbers["p_value"] for numbers, _ in cells]), correction,
                             tested=np.concatenate([tested for _, tested in cells]))
    for (numbers, _), adjusted in zip(cells, np.split(flat, np.cumsum([len(n["p_value"]) for n, _ in cells])[:-1])):
        numbers["p_adjusted"] = adjusted
    return {"correction": correction, "tests": int(np.isfinite(flat).sum())}


def _summarise(out: DynamicsOutputs, runs: dict, num_layers: int, correction: str = "fdr_bh") -> None:
    """The plot rows (one file per layer: a line per run and reference over the steps), the details (the per-point
    p-values adjusted as one family: :func:`_corrected`) and the headline (:func:`half_way_headline`: over
    finetune.method's runs, and per method of finetune.compare_methods under ``compared``)."""
    top, half_way = num_layers - 1, {}
    out.full["family"] = _corrected(runs, correction)
    for name, run in runs.items():
        seed, entry = run["seed"], out.full.setdefault(name, {})
        for step, values in run["values"].items():
            for reference, numbers in values.items():
                entry.setdefault(f"to_{reference.lower()}", {})[f"step{step}"] = {
                    key: [_number(v) for v in array] for key, array in numbers.items()}
                for layer in range(num_layers):
                    row = {"seed": seed, "run": run["label"], "step": step, "reference": reference, "layer": layer,
                           "series": f"{run['label']} (seed {seed}) to {reference}"}
                    row |= {key: _number(array[layer]) for key, array in numbers.items()}
                    out.curves.setdefault(f"layer_{layer:02d}.json", []).append(row)
        to_orig = [run["values"][step]["ORIG"]["linear_cka"] for step in run["steps"]]
        halves = [half_way_step(run["steps"], [values[layer] for values in to_orig]) for layer in range(num_layers)]
        entry["half_way_step"] = [None if h is None else _number(h) for h in halves]
        entry["max_steps"] = run["steps"][-1]
        half_way.setdefault(run["method"], []).append((halves[top], run["steps"]))

    out.headline = {"pooling": out.full["pooling"], "points": len(next(iter(runs.values()))["steps"]),
                    **half_way_headline(half_way.get(None, []))}
    if any(method is not None for method in half_way):
        out.headline["compared"] = {method: half_way_headline(found) for method, found in half_way.items() if method}
    _move_sizes(out.headline, runs, top)


def _move_sizes(headline: dict, runs: dict, top: int) -> None:
    """Beside each method's half-way step, the size of the move it is half of: ``top_layer_final_distance``, the top
    layer's 1 − CKA to ORIG at the run's last point, mean over the method's runs (a LoRA run can reach half of a far
    smaller move at the same step as full fine-tuning)."""
    distances: dict = {}
    for run in runs.values():
        value = run["values"][run["steps"][-1]]["ORIG"]["linear_cka"][top]
        if np.isfinite(value):
            distances.setdefault(run["method"], []).append(1.0 - float(value))
    for method, found in distances.items():
        entry = headline if method is None else headline.setdefault("compared", {}).setdefault(method, {})
        entry["top_layer_final_distance"] = _number(np.mean(found))



def half_way_headline(runs: Sequence[tuple[float | None, Sequence[int]]]) -> dict:
    """From each run's (top layer's half-way step, its points' steps): ``top_layer_half_way_step``, the mean over
    the runs that have one, with ``…_share`` (of the run's length), ``…_sd`` over those runs (two or more) and
    ``…_grid`` (the widest gap between kept points, the resolution the interpolation works at). Absent, all of
    them, when no run kept states (:func:`half_way_step`): the value would be fixed by the grid, not by the run."""
    found = [(step, steps) for step, steps in runs if step is not None]
    if not found:
        return {}
    values = np.array([step for step, _ in found])
    headline = {"top_layer_half_way_step": _number(np.mean(values)),
                "top_layer_half_way_share": _number(np.mean([step / steps[-1] for step, steps in found]))}
    if len(values) >= 2:
        headline["top_layer_half_way_step_sd"] = _number(np.std(values, ddof=1))
    headline["top_layer_half_way_grid"] = int(max(np.diff(steps).max() for _, steps in found))
    return headline


def _number(value) -> float | None:
    value = float(value)
    return round(value, 6) if np.isfinite(value) else None
