"""The align stage's work for one task (Ren et al. 2023): maps fitted on train-split representations and
scored on validation rows — per-layer alignment error of every method for FT[1]→FT[2] (seeds) and
ORIG→FT[1]; recovery of a known random INN; injection of FT[1]'s mapped last layer into FT[2]'s head;
the INN's layer × layer error matrix — and the figures and metrics that report it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from layersim.align import alignment_errors, layer_alignment_matrix, map_representations, synthetic_recovery
from layersim.injection import injected_score, random_like
from layersim.io import ActivationTable, read_task_table, run_expectations, write_figure, write_json
from layersim.params import Params
from layersim.plots import alignment_error_curves, heatmap_grid, method_bars
from layersim.tasks import TaskSpec
from layersim.train import default_device
from layersim.truncation import full_score, load_for_validation


def method_options(p) -> dict[str, dict]:
    """Constructor options of each map that takes any, from params.yaml's align section."""
    network = {"steps": p.steps, "learning_rate": p.learning_rate, "batch_size": p.batch_size, "seed": p.seed}
    return {"linear": {"ridge": p.ridge}, "svcca": {"variance_threshold": p.svcca_variance},
            "inn": {"depth": p.inn_depth, "hidden": p.inn_hidden, **network},
            "mlp": {"depth": p.mlp_depth, "hidden": p.mlp_hidden, **network}}


def run_labels(seeds) -> dict[str, str]:
    """Figure label → run name: ORIG and FT[i] for the i-th seed."""
    return {"ORIG": "orig"} | {f"FT[{i}]": f"seed{s}" for i, s in enumerate(seeds, start=1)}


def compared_pairs(seeds) -> list[tuple[str, str]]:
    """FT[1]→FT[2] (with two seeds or more), then ORIG→FT[1]."""
    return ([("FT[1]", "FT[2]")] if len(seeds) > 1 else []) + [("ORIG", "FT[1]")]


@dataclass(frozen=True)
class AlignInputs:
    """Where the stage reads from, and what its tables must hold."""
    activations: Path
    checkpoints: Path
    task_dir: Path
    spec: TaskSpec
    params: Params

    def expect(self) -> dict[str, dict[str, Any]]:
        known = run_expectations(self.checkpoints, self.params.seeds, self.task_dir)
        return {run: {"task": self.spec.name, **known[run]} for run in run_labels(self.params.seeds).values()}

    def table(self, run: str, pooling: str, split: str, expect: dict) -> ActivationTable:
        """One run's activation table of `split`, checked against `expect` (task, weights), run, split and pooling."""
        return ActivationTable(self.activations / ("train" if split == "train" else "") / f"{run}.{pooling}.parquet",
                               expect={**expect, "split": split, "run": run, "pooling": pooling})

    def validation_task_table(self):
        return read_task_table(self.task_dir, self.spec, "validation", self.params.extract.max_examples)


def read_layers(inputs: AlignInputs, expect: dict) -> tuple[dict[str, list[np.ndarray]], int]:
    """Per run label, per layer, the train rows followed by the validation rows; and the number of train rows.
    Every run's tables must hold the same rows in the same order: maps are fitted row by row."""
    pooling, spec = inputs.params.align.pooling, inputs.spec
    tables = {label: tuple(inputs.table(run, pooling, split, expect[run]) for split in ("train", "validation"))
              for label, run in run_labels(inputs.params.seeds).items()}
    for label in tables:
        for reference, table in zip(tables["ORIG"], tables[label]):
            reference.check_comparable(table)
    ids = inputs.validation_task_table().column("example_id").to_numpy()
    tables["ORIG"][1].check_examples(ids, spec.num_choices or 1, f"{inputs.task_dir}/validation.parquet")
    layers = {label: [np.concatenate([a, b]) for a, b in zip(train.layers(), validation.layers())]
              for label, (train, validation) in tables.items()}
    return layers, tables["ORIG"][0].num_rows


def inject(inputs: AlignInputs, pair: tuple[str, str], options: dict, expect: dict) -> dict:
    """Scores of the target model's head fed the source model's mapped last-layer CLS state, per method,
    with the target's own score, the unmapped source state and random states as references (Ren §4.5)."""
    params, spec = inputs.params, inputs.spec
    runs = run_labels(params.seeds)
    source, target = (runs[label] for label in pair)
    train = {run: inputs.table(run, "cls", "train", expect[run]) for run in (source, target)}
    train[source].check_comparable(train[target])
    source_validation = inputs.table(source, "cls", "validation", expect[source])
    device = default_device()
    model, tokenizer, encoded = load_for_validation(inputs.checkpoints / target, spec, inputs.validation_task_table(),
                                                    params.finetune.max_length, device)
    source_validation.check_examples(encoded.example_id, encoded.num_choices, f"{inputs.task_dir}/validation.parquet")
    last = source_validation.num_layers
    x_train, y_train = train[source].layer(last), train[target].layer(last)
    x_validation = source_validation.layer(last)
    batch = params.extract.batch_size

    def score(vectors):
        return round(injected_score(model, spec, encoded, tokenizer, vectors, batch, device), 6)

    methods = {method: score(map_representations(x_train, y_train, x_validation, method, **options.get(method, {}))[0])
               for method in params.align.methods}
    references = {f"{pair[1]} itself": round(full_score(model, spec, encoded, tokenizer, batch, device), 6),
                  f"{pair[0]} unmapped": score(x_validation),
                  "random": score(random_like(y_train, len(x_validation), params.align.seed))}
    return {"pair": f"{pair[0]}→{pair[1]}", "metric": spec.primary_metric, "methods": methods, "references": references}


@dataclass
class AlignReport:
    rows: list[dict]                              # per pair, method and layer: relative error and MSE
    errors: dict[str, dict[str, list[float]]]     # pair → method → relative error per layer
    recovery: dict[str, float]                    # method → held-out error recovering a random INN
    matrix_pair: tuple[str, str]
    matrix: np.ndarray                            # INN error, source layer × target layer
    injection: dict
    num_train: int
    num_rows: int

    def metrics(self, pooling: str) -> dict:
        matrix, (source, target) = self.matrix, self.matrix_pair
        return {"pooling": pooling, "train_rows": int(self.num_train),
                "validation_rows": int(self.num_rows - self.num_train),
                "alignment": {pair: {method: {f"layer_{k:02d}": round(v, 6) for k, v in enumerate(values)}
                                     for method, values in per_method.items()} for pair, per_method in self.errors.items()},
                "alignment_mean": {pair: {method: round(float(np.mean(values)), 6) for method, values in per_method.items()}
                                   for pair, per_method in self.errors.items()},
                "synthetic_recovery": self.recovery,
                "layer_matrix_inn": {"pair": f"{source}→{target}", "diagonal_mean": round(float(np.diag(matrix).mean()), 6),
                                     "offdiagonal_mean": round(float(matrix[~np.eye(len(matrix), dtype=bool)].mean()), 6)},
                "injection": self.injection}

    def write_figures(self, plots: Path, title: str, task: str, metric: str) -> None:
        (source, target) = self.matrix_pair
        write_figure(alignment_error_curves(self.errors, f"alignment error per layer, {title}"), plots / "errors.png")
        write_json(self.rows, plots / "errors.json")
        write_figure(method_bars(self.recovery, f"recovering a random INN from the pretrained last layer ({task})",
                                 "held-out relative error"), plots / "synthetic.png")
        write_figure(heatmap_grid({f"{source}→{target}": (self.matrix, f"{source} layer (mapped)", f"{target} layer")},
                                  f"INN held-out relative error, layer × layer — {task}", ncols=1, vmin=0.0,
                                  vmax=max(1.0, float(self.matrix.max())), colorbar_label="relative error"),
                     plots / "layer_matrix.png")
        write_figure(method_bars(self.injection["methods"], f"{source} last layer injected into {target} ({task})",
                                 metric, self.injection["references"]), plots / "injection.png")


def align_report(inputs: AlignInputs, log=lambda *args: None) -> AlignReport:
    """Every experiment of the align stage on one task."""
    p = inputs.params.align
    pairs = compared_pairs(inputs.params.seeds)
    all_options = method_options(p)
    options = {method: values for method, values in all_options.items() if method in p.methods}
    expect = inputs.expect()
    layers, num_train = read_layers(inputs, expect)
    num_rows = len(layers["ORIG"][0])
    train_idx, test_idx = np.arange(num_train), np.arange(num_train, num_rows)
    log("read %s representations of %d runs: %d train and %d validation rows", p.pooling, len(layers),
        num_train, num_rows - num_train)

    # 1. Per-layer alignment error of every method (Ren Table 4, Figure 2).
    errors, rows = {}, []
    for source, target in pairs:
        pair = f"{source}→{target}"
        for row in alignment_errors(layers[source], layers[target], p.methods, train_idx, test_idx, **options):
            errors.setdefault(pair, {}).setdefault(row["method"], []).append(row["relative_error"])
            rows.append({"pair": pair, "method": row["method"], "layer": row["layer"],
                         "relative_error": round(row["relative_error"], 6), "mse": round(row["mse"], 6)})
        log("aligned %s at every layer with %s", pair, ", ".join(p.methods))

    # 2. Synthetic recovery (Ren §4.3, Table 3): Y = f(X) for a random INN f on the pretrained last layer.
    synthetic = synthetic_recovery(layers["ORIG"][-1], p.methods, p.seed, scale=p.synthetic_scale, **options)
    recovery = {row["method"]: round(row["relative_error"], 6) for row in synthetic["rows"]}

    # 3. The INN's layer × layer matrix (Ren Figure 3) for the first pair, fewer steps per fit.
    source, target = pairs[0]
    matrix = layer_alignment_matrix(layers[source], layers[target], "inn", train_idx=train_idx, test_idx=test_idx,
                                    **{**all_options["inn"], "steps": p.matrix_steps})

    # 4. Layer injection (Ren §4.5, Table 5): FT[1]'s last-layer CLS mapped into FT[2]'s head (with one
    # seed, ORIG's into FT[1]'s).
    injection = inject(inputs, pairs[0], options, expect)
    log("injected %s's last layer into %s's head with %s", *pairs[0], ", ".join(injection["methods"]))
    return AlignReport(rows, errors, recovery, pairs[0], matrix, injection, num_train, num_rows)
