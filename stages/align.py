"""align: bijective alignment of representation spaces (Ren et al. 2023) for one task — maps fitted on
train-split representations, scored on validation rows: per-layer alignment error of every method
for FT[1]→FT[2] (seeds) and ORIG→FT[1]; recovery of a known random INN; injection of FT[1]'s mapped
last layer into FT[2]'s head; the INN's layer × layer error matrix."""

from pathlib import Path

import numpy as np

from layersim import cli
from layersim.align import alignment_errors, layer_alignment_matrix, map_representations, synthetic_recovery
from layersim.injection import injected_score, random_like
from layersim.io import ActivationTable, atomic_path, read_task_table, run_expectations, write_figure, write_json
from layersim.plots import alignment_error_curves, heatmap_grid, method_bars
from layersim.tasks import get_task
from layersim.train import default_device
from layersim.truncation import full_score, load_for_validation


def method_options(p) -> dict[str, dict]:
    """Constructor options of each map that takes any, from params.yaml's align section."""
    network = {"steps": p.steps, "learning_rate": p.learning_rate, "batch_size": p.batch_size, "seed": p.seed}
    options = {"linear": {"ridge": p.ridge}, "svcca": {"variance_threshold": p.svcca_variance},
               "inn": {"depth": p.inn_depth, "hidden": p.inn_hidden, **network},
               "mlp": {"depth": p.mlp_depth, "hidden": p.mlp_hidden, **network}}
    return options


def open_table(folder: Path, run: str, pooling: str, split: str, expect: dict) -> ActivationTable:
    """One run's activation table of `split`, checked against `expect` (task, weights), run, split and pooling."""
    return ActivationTable(folder / ("train" if split == "train" else "") / f"{run}.{pooling}.parquet",
                           expect={**expect, "split": split, "run": run, "pooling": pooling})


def split_layers(tables: tuple[ActivationTable, ActivationTable]) -> tuple[list[np.ndarray], int]:
    """Per layer, the train rows followed by the validation rows of one run; and the number of train rows."""
    train, validation = tables
    return [np.concatenate([a, b]) for a, b in zip(train.layers(), validation.layers())], train.num_rows


def main(args, params):
    p = params.align
    spec = get_task(args.task)
    runs = {"ORIG": "orig"} | {f"FT[{i}]": f"seed{s}" for i, s in enumerate(params.seeds, start=1)}
    pairs = [("FT[1]", "FT[2]")] if len(params.seeds) > 1 else []
    pairs.append(("ORIG", "FT[1]"))
    all_options = method_options(p)
    options = {method: values for method, values in all_options.items() if method in p.methods}
    known = run_expectations(args.checkpoints, params.seeds, args.task_dir)
    expect = {run: {"task": spec.name, **known[run]} for run in runs.values()}
    # Every run's tables must hold the same rows in the same order: maps are fitted row by row.
    tables = {label: tuple(open_table(args.activations, run, p.pooling, split, expect[run])
                           for split in ("train", "validation")) for label, run in runs.items()}
    for label in tables:
        for reference, table in zip(tables["ORIG"], tables[label]):
            reference.check_comparable(table)
    task_table = read_task_table(args.task_dir, spec, "validation", params.extract.max_examples)
    tables["ORIG"][1].check_examples(task_table.column("example_id").to_numpy(), spec.num_choices or 1,
                                     f"{args.task_dir}/validation.parquet")
    layers, num_train = {}, None
    for label in runs:
        layers[label], num_train = split_layers(tables[label])
    num_rows = len(layers["ORIG"][0])
    train_idx, test_idx = np.arange(num_train), np.arange(num_train, num_rows)
    cli.log.info("read %s representations of %d runs: %d train and %d validation rows", p.pooling, len(runs),
                 num_train, num_rows - num_train)

    # 1. Per-layer alignment error of every method (Ren Table 4, Figure 2).
    errors, rows = {}, []
    for source, target in pairs:
        pair = f"{source}→{target}"
        for row in alignment_errors(layers[source], layers[target], p.methods, train_idx, test_idx, **options):
            errors.setdefault(pair, {}).setdefault(row["method"], []).append(row["relative_error"])
            rows.append({"pair": pair, "method": row["method"], "layer": row["layer"],
                         "relative_error": round(row["relative_error"], 6), "mse": round(row["mse"], 6)})
        cli.log.info("aligned %s at every layer with %s", pair, ", ".join(p.methods))

    # 2. Synthetic recovery (Ren §4.3, Table 3): Y = f(X) for a random INN f on the pretrained last layer.
    synthetic = synthetic_recovery(layers["ORIG"][-1], p.methods, p.seed, scale=p.synthetic_scale, **options)
    recovery = {row["method"]: round(row["relative_error"], 6) for row in synthetic["rows"]}

    # 3. The INN's layer × layer matrix (Ren Figure 3) for the first pair, fewer steps per fit.
    source, target = pairs[0]
    matrix = layer_alignment_matrix(layers[source], layers[target], "inn", train_idx=train_idx, test_idx=test_idx,
                                    **{**all_options["inn"], "steps": p.matrix_steps})

    # 4. Layer injection (Ren §4.5, Table 5): FT[1]'s last-layer CLS mapped into FT[2]'s head (with one
    # seed, ORIG's into FT[1]'s).
    injection = inject(args, params, spec, pairs[0], runs, options, expect)

    with atomic_path(args.plots, is_dir=True) as tmp:
        plots = Path(tmp)
        title = f"{p.pooling} representations — {params.model} on {args.task}"
        write_figure(alignment_error_curves(errors, f"alignment error per layer, {title}"), plots / "errors.png")
        write_json(rows, plots / "errors.json")
        write_figure(method_bars(recovery, f"recovering a random INN from the pretrained last layer ({args.task})",
                                 "held-out relative error"), plots / "synthetic.png")
        write_figure(heatmap_grid({f"{source}→{target}": (matrix, f"{source} layer (mapped)", f"{target} layer")},
                                  f"INN held-out relative error, layer × layer — {args.task}", ncols=1, vmin=0.0,
                                  vmax=max(1.0, float(matrix.max())), colorbar_label="relative error"),
                     plots / "layer_matrix.png")
        write_figure(method_bars(injection["methods"], f"{source} last layer injected into {target} ({args.task})",
                                 spec.primary_metric, injection["references"]), plots / "injection.png")
    write_json({"pooling": p.pooling, "train_rows": int(num_train), "validation_rows": int(num_rows - num_train),
                "alignment": {pair: {method: {f"layer_{k:02d}": round(v, 6) for k, v in enumerate(values)}
                                     for method, values in per_method.items()} for pair, per_method in errors.items()},
                "alignment_mean": {pair: {method: round(float(np.mean(values)), 6) for method, values in per_method.items()}
                                   for pair, per_method in errors.items()},
                "synthetic_recovery": recovery,
                "layer_matrix_inn": {"pair": f"{source}→{target}", "diagonal_mean": round(float(np.diag(matrix).mean()), 6),
                                     "offdiagonal_mean": round(float(matrix[~np.eye(len(matrix), dtype=bool)].mean()), 6)},
                "injection": injection}, args.metrics)
    cli.log.info("wrote %s and %s", args.plots, args.metrics)


def inject(args, params, spec, pair, runs, options, expect) -> dict:
    """Scores of the target model's head fed the source model's mapped last-layer CLS state, per method,
    with the target's own score, the unmapped source state and random states as references."""
    source, target = (runs[label] for label in pair)
    train = {run: open_table(args.activations, run, "cls", "train", expect[run]) for run in (source, target)}
    train[source].check_comparable(train[target])
    source_validation = open_table(args.activations, source, "cls", "validation", expect[source])
    device = default_device()
    table = read_task_table(args.task_dir, spec, "validation", params.extract.max_examples)
    model, tokenizer, encoded = load_for_validation(args.checkpoints / target, spec, table, params.finetune.max_length,
                                                    device)
    source_validation.check_examples(encoded.example_id, encoded.num_choices, f"{args.task_dir}/validation.parquet")
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
    cli.log.info("injected %s's last layer into %s's head with %s", *pair, ", ".join(methods))
    return {"pair": f"{pair[0]}→{pair[1]}", "metric": spec.primary_metric, "methods": methods, "references": references}


if __name__ == "__main__":
    parser = cli.parser(__doc__)
    parser.add_argument("--task", required=True)
    parser.add_argument("--activations", type=Path, required=True, help="folder written by the extract stage")
    parser.add_argument("--checkpoints", type=Path, required=True, help="folder holding seed<k>/ checkpoints")
    parser.add_argument("--task-dir", type=Path, required=True, help="folder written by download_task")
    parser.add_argument("--metrics", type=Path, required=True, help="metrics JSON to write")
    parser.add_argument("--plots", type=Path, required=True, help="folder for figures and plot data")
    cli.run_stage(main, parser.parse_args())
