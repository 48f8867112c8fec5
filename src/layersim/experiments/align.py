"""The align stage's work for one task (Ren et al. 2023): maps fitted on train-split representations and
scored on validation rows — per-layer alignment error of every method for each pair of align.pairs
(fine-tuning seeds FT[1]→FT[2], ORIG→FT[1], pretrained registry models such as MultiBERTs that differ
in their pretraining seed), as mean ± sd over the pairs of each kind; recovery of a known random INN;
injection of a mapped last layer into a fine-tuned model's head; the INN's layer × layer error matrix —
and the figures and metrics that report it."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from layersim.align.experiments import mean_sd_over_pairs
from layersim.align import (alignment_errors, layer_alignment_matrix, map_representations, synthetic_recovery,
                            train_test_split_rows)
from layersim.experiments.injection import injected_score, random_like
from layersim.data.batching import encode_task
from layersim.errors import LayersimError
from layersim.experiments.extract import extract_activations, extract_task_attention
from layersim.data.io import (ActivationTable, AttentionTable, read_task_table, run_expectations, write_figure,
                              write_json)
from layersim.data.layout import finetuned_run
from layersim.models.registry import load_encoder, load_tokenizer, model_shape, verified_info
from layersim.params import Params, aligned_pairs, pair_member
from layersim.params.model_kind import head_pooling
from layersim.reporting.align_plots import alignment_error_curves
from layersim.reporting.plots import heatmap_grid, method_bars
from layersim.data.tasks import TaskSpec
from layersim.compute.device import resolve_device, resolve_precision
from layersim.experiments.truncation import full_score, load_for_validation


def method_options(params: Params) -> dict[str, dict]:
    """Constructor options of each map that takes any, from params.yaml's align section (and the device the
    neural maps train on)."""
    p = params.align
    network = {"steps": p.steps, "learning_rate": p.learning_rate, "batch_size": p.batch_size, "seed": p.seed,
               "device": params.device}
    return {"linear": {"ridge": p.ridge}, "svcca": {"variance_threshold": p.svcca_variance},
            "inn": {"depth": p.inn_depth, "hidden": p.inn_hidden, "linear_init": p.inn_init, **network},
            "mlp": {"depth": p.mlp_depth, "hidden": p.mlp_hidden, **network}}


def run_labels(seeds) -> dict[str, str]:
    """Figure label → run name: ORIG and FT[i] for the i-th seed."""
    return {"ORIG": "orig"} | {f"FT[{i}]": f"seed{s}" for i, s in enumerate(seeds, start=1)}


# The linear maps, against which the INN's recovery of a random INN is compared (Ren Table 3).
LINEAR_FAMILY = {"linear", "cca", "svcca", "pwcca"}

# The kinds of pair, in the order the figures show them, and the question each answers.
PAIR_KINDS = {
    "finetuning_seeds": "two fine-tunings of one pretrained model that differ only in their seed",
    "finetuning": "what fine-tuning changed: the pretrained model against a fine-tuned one",
    "pretrained_models": "two pretrained models, e.g. MultiBERTs that differ only in their pretraining seed",
    "mixed": "a fine-tuned run against another pretrained model",
}


@dataclass(frozen=True)
class Pair:
    source: str  # figure label: ORIG, FT[i] or a registry model's name
    target: str
    kind: str    # a key of PAIR_KINDS

    @property
    def label(self) -> str:
        return f"{self.source}→{self.target}"


def _label(name: str) -> tuple[str, str]:
    """(figure label, member kind) of a name of align.pairs."""
    kind, value = pair_member(name)
    return (f"FT[{value}]" if kind == "finetuned" else str(value)), kind


def compared_pairs(params: Params) -> list[Pair]:
    """align.pairs (or its default) with figure labels and kinds."""
    pairs = []
    for source, target in aligned_pairs(params):
        (a, kind_a), (b, kind_b) = _label(source), _label(target)
        kinds = {kind_a, kind_b}
        kind = ("finetuning_seeds" if kinds == {"finetuned"} else "finetuning" if kinds == {"orig", "finetuned"}
                else "mixed" if "finetuned" in kinds else "pretrained_models")
        pairs.append(Pair(a, b, kind))
    return pairs


def over_pairs(errors: dict[str, dict[str, list[float]]], pairs: list[Pair]) -> dict[str, dict]:
    """Per kind of pair (in PAIR_KINDS order): its pairs, and per method the mean and sd over those pairs of
    the error at each layer and of the error averaged over layers (sd 0 for a single pair; Ren Table 4)."""
    grouped = {}
    for kind in PAIR_KINDS:
        labels = [pair.label for pair in pairs if pair.kind == kind]
        if not labels:
            continue
        grouped[kind] = {"pairs": labels, **mean_sd_over_pairs([errors[label] for label in labels])}
    return grouped


@dataclass(frozen=True)
class AlignInputs:
    """Where the stage reads from, and what its tables must hold."""
    activations: Path
    checkpoints: Path
    task_dir: Path
    spec: TaskSpec
    params: Params
    paired: Path | None = None  # folder written by download_paired: the registry models of align.pairs

    def expect(self) -> dict[str, dict[str, Any]]:
        known = run_expectations(self.checkpoints, self.params.seeds, self.task_dir)
        return {run: {"task": self.spec.name, **known[run]} for run in run_labels(self.params.seeds).values()}

    def table(self, run: str, pooling: str, split: str, expect: dict, folder: Path | None = None) -> ActivationTable:
        """One run's activation table of `split`, checked against `expect` (task, weights), run, split and pooling."""
        folder = folder or self.activations
        return ActivationTable(folder / ("train" if split == "train" else "") / f"{run}.{pooling}.parquet",
                               expect={**expect, "split": split, "run": run, "pooling": pooling})

    def validation_task_table(self):
        return read_task_table(self.task_dir, self.spec, "validation", self.params.extract.max_examples)

    def extract_models(self, names: list[str], out: Path, task_digest: str) -> dict[str, dict[str, Any]]:
        """Write train and validation tables (align.pooling) of each pretrained registry model `names` into `out`
        (and with align.attention its attention maps, into out/attention), from the same task tables and example
        caps as the extract stage; return each run's expectations."""
        p, spec = self.params, self.spec
        splits = {"validation": read_task_table(self.task_dir, spec, "validation", p.extract.max_examples),
                  "train": read_task_table(self.task_dir, spec, "train", p.extract.max_train_examples)}
        expect = {}
        for name in names:
            folder = self.paired / name
            info = verified_info(folder)
            tokenizer, encoder = load_tokenizer(folder), load_encoder(folder)
            for split, table in splits.items():
                encoded = encode_task(table, spec, tokenizer, p.finetune.max_length)
                metadata = {"model": name, "model_digest": info["digest"], "run": model_run(name), "task": spec.name,
                            "split": split, "task_digest": task_digest}
                path = out / ("train" if split == "train" else "") / f"{model_run(name)}.{p.align.pooling}.parquet"
                extract_activations(encoder, tokenizer, spec, encoded, {p.align.pooling: path}, metadata,
                                    p.extract.batch_size, resolve_device(p.device),
                                    precision=p.extract.table_precision)  # as the runs' tables: pairs alike
            if p.align.attention:  # as the extract stage keeps the runs' maps
                extract_task_attention(encoder, tokenizer, splits["validation"].slice(0, p.extract.attention_examples),
                                       spec, p, out / "attention" / f"{model_run(name)}.parquet",
                                       {**metadata, "split": "validation"}, resolve_device(p.device))
            expect[name] = {"task": spec.name, "model_digest": info["digest"], "task_digest": task_digest,
                            **model_shape(folder)}
        return expect


def read_layers(inputs: AlignInputs, sources: dict[str, tuple[str, Path, dict]]
                ) -> tuple[dict[str, list[np.ndarray]], int, str]:
    """Per run label (label → its run name, table folder and expectations; ORIG first), per layer, the train
    rows followed by the validation rows; the number of train rows; and how the tables stored their values
    (layersim.data.io.stored.ENCODINGS' keys, "; "-joined where they differ). Every run's tables must hold the
    same rows in the same order: maps are fitted row by row."""
    pooling, spec = inputs.params.align.pooling, inputs.spec
    tables = {label: tuple(inputs.table(run, pooling, split, expect, folder) for split in ("train", "validation"))
              for label, (run, folder, expect) in sources.items()}
    reference = next(iter(tables.values()))
    for label in tables:
        for first, table in zip(reference, tables[label]):
            first.check_comparable(table)
    ids = inputs.validation_task_table().column("example_id").to_numpy()
    reference[1].check_examples(ids, spec.num_choices or 1, f"{inputs.task_dir}/validation.parquet")
    layers = {label: [np.concatenate([a, b]) for a, b in zip(train.layers(), validation.layers())]
              for label, (train, validation) in tables.items()}
    precision = "; ".join(sorted({table.precision for pair in tables.values() for table in pair}))
    return layers, reference[0].num_rows, precision


def model_run(name: str) -> str:
    """The run name (and file name stem) of a registry model's tables: a hub id's '/' becomes '--'."""
    return name.replace("/", "--")


def inject(inputs: AlignInputs, pair: tuple[str, str], options: dict, expect: dict) -> dict:
    """Scores of the target model's head fed the source model's mapped last-layer state of the token that head
    reads (CLS, or the last token of a decoder), per method, with the target's own score, the unmapped source
    state and random states as references (Ren §4.5)."""
    params, spec = inputs.params, inputs.spec
    runs = run_labels(params.seeds)
    source, target = (runs[label] for label in pair)
    checkpoint = finetuned_run(inputs.checkpoints, target)
    pooling = head_pooling(checkpoint)
    train = {run: inputs.table(run, pooling, "train", expect[run]) for run in (source, target)}
    train[source].check_comparable(train[target])
    source_validation = inputs.table(source, pooling, "validation", expect[source])
    device = resolve_device(params.device)
    model, tokenizer, encoded = load_for_validation(checkpoint, spec, inputs.validation_task_table(),
                                                    params.finetune.max_length, device)
    source_validation.check_examples(encoded.example_id, encoded.num_choices, f"{inputs.task_dir}/validation.parquet")
    last = source_validation.num_layers
    x_train, y_train = train[source].layer(last), train[target].layer(last)
    x_validation = source_validation.layer(last)
    batch = params.extract.batch_size

    def score(vectors):
        return round(injected_score(model, spec, encoded, vectors, batch, device, tokenizer), 6)

    methods = {method: score(map_representations(x_train, y_train, x_validation, method, **options.get(method, {}))[0])
               for method in params.align.methods}
    references = {f"{pair[1]} itself": round(full_score(model, spec, encoded, tokenizer, batch, device,
                                                                 resolve_precision(params.finetune.precision, device)), 6),
                  f"{pair[0]} unmapped": score(x_validation),
                  "random": score(random_like(y_train, len(x_validation), params.align.seed))}
    return {"pair": f"{pair[0]}→{pair[1]}", "metric": spec.primary_metric, "methods": methods, "references": references}


def attention_errors(inputs: AlignInputs, pairs: list[Pair], sources: dict[str, tuple[str, Path, dict]],
                     options: dict, log=lambda *args: None) -> dict[str, dict[str, list[float]]]:
    """Ren et al. Fig. 4 / 5b: per layer 1 … L, the held-out error of maps from the source model's attention
    weights to the target's, for each pair (runs ORIG, FT[i] and registry models alike: `sources` gives each
    label's run name, table folder and expectations). A point is one (example, query, key) with one feature
    per head; maps are fitted on the points of a seeded 80 % of the examples and scored on the rest, so no
    example is on both sides."""
    p = inputs.params.align
    tables, layers = {}, {}  # each run's table and per-layer weights, read once however many pairs it is in
    errors: dict[str, dict[str, list[float]]] = {}
    for pair in pairs:
        for label in (pair.source, pair.target):
            if label not in tables:
                run, folder, expect = sources[label]
                tables[label] = AttentionTable(folder / "attention" / f"{run}.parquet",
                                               expect={"task": inputs.spec.name, "split": "validation", "run": run,
                                                       "model_digest": expect["model_digest"]})
                layers[label] = [tables[label].layer(k) for k in range(1, tables[label].num_layers + 1)]
        source, target = tables[pair.source], tables[pair.target]
        source.check_comparable(target)
        example_ids = np.unique(source.index[:, 0])  # choices of one example stay on one side
        train_examples, test_examples = train_test_split_rows(len(example_ids), 0.2, p.seed)
        train_idx, test_idx = (np.flatnonzero(np.isin(source.index[:, 0], example_ids[chosen]))
                               for chosen in (train_examples, test_examples))
        for row in alignment_errors(layers[pair.source], layers[pair.target], p.methods, train_idx, test_idx,
                                    **options):
            errors.setdefault(pair.label, {}).setdefault(row["method"], []).append(row["relative_error"])
        log("aligned the attention weights of %s at every layer (%d points, %d heads)", pair.label, len(source.index),
            source.num_heads)
    return errors


def injection_pair(pairs: list[Pair], seeds) -> tuple[str, str]:
    """The first pair whose target is a fine-tuned run (it has a head) and whose source is ORIG or a fine-tuned
    run (they have CLS tables); without one, FT[1]→FT[2] with two seeds or more, else ORIG→FT[1]."""
    runs = run_labels(seeds)
    for pair in pairs:
        if pair.source in runs and pair.target.startswith("FT["):
            return pair.source, pair.target
    return ("FT[1]", "FT[2]") if len(seeds) > 1 else ("ORIG", "FT[1]")


@dataclass
class AlignReport:
    rows: list[dict]                              # per pair, method and layer: relative error and MSE
    errors: dict[str, dict[str, list[float]]]     # pair label → method → relative error per layer
    recovery: dict[str, float]                    # method → held-out error recovering a random INN
    matrix_pair: tuple[str, str]
    matrix: np.ndarray                            # INN error, source layer × target layer
    injection: dict
    num_train: int
    num_rows: int
    pairs: list[Pair] = field(default_factory=list)  # in the order of align.pairs; [] → one kind per label
    attention: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # pair → method → error, layers 1…L
    recovery_rows: int = 0                        # rows the random INN was recovered from (80 % fitted)
    table_precision: str = "float32"              # how the tables stored the maps' rows (extract.table_precision)

    def grouped(self) -> dict[str, dict]:
        pairs = self.pairs or [Pair(*label.split("→"), kind=label) for label in self.errors]
        return over_pairs(self.errors, pairs)

    def metrics(self, pooling: str) -> dict:
        matrix, (source, target) = self.matrix, self.matrix_pair
        # Pairs as one string and curves per layer: the details file keeps lists for layers only.
        grouped = {kind: {"pairs": "; ".join(entry["pairs"]), "num_pairs": len(entry["pairs"]),
                          **{method: {key: _rounded(value) for key, value in stats.items()}
                             for method, stats in entry.items() if method != "pairs"}}
                   for kind, entry in self.grouped().items()}
        return {"pooling": pooling, "train_rows": int(self.num_train),
                "validation_rows": int(self.num_rows - self.num_train), "table_precision": self.table_precision,
                "alignment": {pair: {method: {f"layer_{k:02d}": round(v, 6) for k, v in enumerate(values)}
                                     for method, values in per_method.items()} for pair, per_method in self.errors.items()},
                "alignment_mean": {pair: {method: round(float(np.mean(values)), 6) for method, values in per_method.items()}
                                   for pair, per_method in self.errors.items()},
                "alignment_over_pairs": grouped,
                **({"attention_alignment": {pair: {method: {f"layer_{k:02d}": round(v, 6) for k, v in enumerate(values, 1)}
                                                   for method, values in per_method.items()}
                                            for pair, per_method in self.attention.items()}} if self.attention else {}),
                "synthetic_recovery": self.recovery, "synthetic_rows": self.recovery_rows,
                **({"synthetic_linear_over_inn": round(min(v for m, v in self.recovery.items() if m in LINEAR_FAMILY)
                                                       / self.recovery["inn"], 3)}
                   if "inn" in self.recovery and LINEAR_FAMILY & set(self.recovery) else {}),
                "layer_matrix_inn": {"pair": f"{source}→{target}", "diagonal_mean": round(float(np.diag(matrix).mean()), 6),
                                     "offdiagonal_mean": round(float(matrix[~np.eye(len(matrix), dtype=bool)].mean()), 6)},
                "injection": self.injection}

    def write_figures(self, plots: Path, title: str, task: str, metric: str) -> None:
        (source, target) = self.matrix_pair
        panels = {(entry["pairs"][0] if len(entry["pairs"]) == 1 else
                   f"{kind.replace('_', ' ')}: mean ± sd over {len(entry['pairs'])} pairs"):
                  {method: (stats["mean"], stats["sd"]) for method, stats in entry.items() if method != "pairs"}
                  for kind, entry in self.grouped().items()}
        panels |= {f"attention weights: {pair}": {method: ([np.nan] + values, None) for method, values in per_method.items()}
                   for pair, per_method in self.attention.items()}  # layer 0 (embeddings) has no attention
        write_figure(alignment_error_curves(panels, f"alignment error per layer, {title}"), plots / "errors.png")
        write_json(self.rows, plots / "errors.json")
        write_figure(method_bars(self.recovery, f"recovering a random INN from {self.recovery_rows:,} rows of the "
                                                f"pretrained last layer ({task})",
                                 "held-out relative error"), plots / "synthetic.png")
        write_figure(heatmap_grid({f"{source}→{target}": (self.matrix, f"{source} layer (mapped)", f"{target} layer")},
                                  f"INN held-out relative error, layer × layer — {task}", ncols=1, vmin=0.0,
                                  vmax=max(1.0, float(self.matrix.max())), colorbar_label="relative error"),
                     plots / "layer_matrix.png")
        injected_source, injected_target = self.injection["pair"].split("→")
        write_figure(method_bars(self.injection["methods"], f"{injected_source} last layer injected into "
                                 f"{injected_target} ({task})", metric, self.injection["references"]),
                     plots / "injection.png")


def _check_shapes(pairs: list[Pair], shapes: dict[str, dict[str, int]]) -> None:
    """Refuse, before any work, a pair whose two models differ in depth or width: maps align layer k with
    layer k, and the INN is a bijection."""
    for pair in pairs:
        a, b = shapes[pair.source], shapes[pair.target]
        if a != b:
            raise LayersimError(f"align.pairs has [{pair.source}, {pair.target}], which differ in shape ({a['num_layers']} "
                                f"layers of width {a['hidden_size']} vs {b['num_layers']} of width {b['hidden_size']}); "
                                "pair models of the same depth and width.")


def _rounded(value):
    return {f"layer_{k:02d}": round(v, 6) for k, v in enumerate(value)} if isinstance(value, list) else round(value, 6)


def align_report(inputs: AlignInputs, log=lambda *args: None) -> AlignReport:
    """Every experiment of the align stage on one task."""
    p, seeds = inputs.params.align, inputs.params.seeds
    pairs = compared_pairs(inputs.params)
    all_options = method_options(inputs.params)
    options = {method: values for method, values in all_options.items() if method in p.methods}
    expect = inputs.expect()
    runs = run_labels(seeds)
    used = ["ORIG"] + [label for pair in pairs for label in (pair.source, pair.target) if label != "ORIG"]
    models = [label for label in dict.fromkeys(used) if label not in runs]
    _check_shapes(pairs, {label: {k: expect[run][k] for k in ("num_layers", "hidden_size")} for label, run in runs.items()}
                  | {name: model_shape(inputs.paired / name) for name in models})
    with tempfile.TemporaryDirectory(prefix="layersim-align-") as tmp:
        model_expect = inputs.extract_models(models, Path(tmp), expect["orig"]["task_digest"]) if models else {}
        if models:
            log("encoded the task with %s", ", ".join(models))
        sources = {label: (runs[label], inputs.activations, expect[runs[label]]) if label in runs else
                   (model_run(label), Path(tmp), model_expect[label]) for label in dict.fromkeys(used)}
        layers, num_train, precision = read_layers(inputs, sources)
        # 4 (read here, while the registry models' maps exist). Attention weights (Ren Fig. 4 / 5b), behind
        # align.attention: they are far more alike than representations.
        attention = attention_errors(inputs, pairs, sources, options, log) if p.attention else {}
    num_rows = len(layers["ORIG"][0])
    train_idx, test_idx = np.arange(num_train), np.arange(num_train, num_rows)
    log("read %s representations of %d runs: %d train and %d validation rows", p.pooling, len(layers),
        num_train, num_rows - num_train)

    # 1. Per-layer alignment error of every method (Ren Table 4, Figure 2), per pair.
    errors, rows = {}, []
    for pair in pairs:
        for row in alignment_errors(layers[pair.source], layers[pair.target], p.methods, train_idx, test_idx,
                                    **options):
            errors.setdefault(pair.label, {}).setdefault(row["method"], []).append(row["relative_error"])
            rows.append({"series": f"{row['method']} {pair.label}", "pair": pair.label, "kind": pair.kind,
                         "method": row["method"], "layer": row["layer"],
                         "relative_error": round(row["relative_error"], 6), "mse": round(row["mse"], 6)})
        log("aligned %s at every layer with %s", pair.label, ", ".join(p.methods))

    # 2. Synthetic recovery (Ren §4.3, Table 3): Y = f(X) for a random INN f on the pretrained last layer.
    #    f is recovered with its own, longer training budget (see synthetic_recovery).
    budget = {"steps": p.synthetic_steps, "learning_rate": p.synthetic_learning_rate}
    synthetic = synthetic_recovery(layers["ORIG"][-1], p.methods, p.seed, scale=p.synthetic_scale,
                                   hidden=p.synthetic_hidden, rows=p.synthetic_rows,
                                   **{m: {**o, **budget} if m in ("inn", "mlp") else o for m, o in options.items()})
    recovery = {row["method"]: round(row["relative_error"], 6) for row in synthetic["rows"]}
    log("recovered a random INN from %d rows of the pretrained last layer", synthetic["num_rows"])

    # 3. The INN's layer × layer matrix (Ren Figure 3) for the first pair, fewer steps per fit.
    first = pairs[0]
    matrix = layer_alignment_matrix(layers[first.source], layers[first.target], "inn", train_idx=train_idx,
                                    test_idx=test_idx, **{**all_options["inn"], "steps": p.matrix_steps})

    # 5. Layer injection (Ren §4.5, Table 5): a last-layer CLS state mapped into a fine-tuned model's head.
    injected = injection_pair(pairs, seeds)
    injection = inject(inputs, injected, options, expect)
    log("injected %s's last layer into %s's head with %s", *injected, ", ".join(injection["methods"]))
    return AlignReport(rows, errors, recovery, (first.source, first.target), matrix, injection, num_train, num_rows,
                       pairs, attention, recovery_rows=synthetic["num_rows"], table_precision=precision)
