"""Ren et al. 2023 end to end, over models that differ only in their pretraining seed (align.pretraining_models,
e.g. the 25 MultiBERTs; offline, tiny-bert from other init seeds): for a seeded sample of their pairs
(align.num_pairs, Ren: 8 of the 300), each on align.train_rows / align.test_rows examples (Ren: 1,600 / 1,600),

* the per-layer alignment error of every map, between the pretrained models (Ren Fig. 2, Table 4) and between
  their fine-tuned versions (Fig. 5a), mean ± sd over the pairs;
* with align.attention, the same for their attention weights (Fig. 4, 5b);
* layer injection (§4.5, Table 5): the fine-tuned source's last-layer CLS state mapped into the fine-tuned target's
  head, with Ren's two baselines — "Random Embe." (the target's *pretrained* last-layer CLS state through a
  randomly initialised head: pooler as pretrained, classifier seeded) and "Random Label" (seeded uniform random
  predictions) — and two of ours: the target itself (its own state: the upper bound) and the source unmapped
  (the identity map); each mean ± sd over the pairs.

The stage passes the folders: download_paired's (pretrained) and finetune_pretrained's (fine-tuned on the task).
Every model is encoded here, once, into temporary tables of this stage's examples."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from layersim.align import alignment_errors, map_representations
from layersim.align.experiments import example_split, mean_sd_over_pairs
from layersim.compute.device import resolve_device, resolve_precision
from layersim.data.batching import encode_task
from layersim.data.io import ActivationTable, AttentionTable, read_task_table, task_tables_digest, write_figure
from layersim.data.tasks import TaskSpec, subsample
from layersim.errors import LayersimError
from layersim.experiments.extract import extract_activations, extract_task_attention
from layersim.experiments.injection import head_score, injected_score
from layersim.experiments.truncation import full_score, initial_head, load_for_validation, primary_score
from layersim.models.registry import load_encoder, load_tokenizer, model_info, model_shape, verified_info
from layersim.params import Params, pretraining_pairs
from layersim.params.model_kind import own_head_pooling
from layersim.reporting.align_plots import alignment_error_curves
from layersim.reporting.plots import method_bars
from layersim.compute.runs import converged_mean
from layersim.training.convergence import run_flags, title_note

STATES = ("pretrained", "finetuned")  # before and after fine-tuning (Ren Fig. 2/4 against Fig. 5)


def align_examples(task_dir: Path, spec: TaskSpec, params: Params) -> dict[str, object]:
    """The task tables the maps see: the examples the extract stage keeps (extract.max_train_examples /
    max_examples), cut to align.train_rows / test_rows by a draw seeded with align.seed."""
    p, a = params.extract, params.align
    return {"train": subsample(read_task_table(task_dir, spec, "train", p.max_train_examples), a.train_rows, a.seed),
            "validation": subsample(read_task_table(task_dir, spec, "validation", p.max_examples), a.test_rows, a.seed)}


@dataclass
class PretrainingSeeds:
    pairs: list[tuple[str, str]]
    errors: dict[str, list[dict[str, list[float]]]]       # state → per pair: method → error per layer (0 … L)
    attention: dict[str, list[dict[str, list[float]]]]    # state → per pair: method → error per layer (1 … L)
    injection: list[dict[str, dict[str, float]]]          # per pair: {"methods": …, "references": …}
    rows: dict[str, int] = field(default_factory=dict)    # train and test examples
    flagged: dict[str, str] = field(default_factory=dict)  # fine-tuned models that did not converge → why

    def metrics(self) -> dict:
        """Mean ± sd over the pairs (layers as layer_XX keys, the details file's form)."""
        def per_layer(values, first=0):
            return {f"layer_{k:02d}": round(float(v), 6) for k, v in enumerate(values, first)}

        def grouped(per_pair, first):
            stats = mean_sd_over_pairs(per_pair)
            return {method: {"mean": per_layer(s["mean"], first), "sd": per_layer(s["sd"], first),
                             "layer_mean": round(s["layer_mean"], 6), "layer_mean_sd": round(s["layer_mean_sd"], 6)}
                    for method, s in stats.items()}

        def scores(part):  # one score per pair: mean ± sd over pairs as for the error curves (one "layer")
            stats = mean_sd_over_pairs([{name: [v] for name, v in pair[part].items()} for pair in self.injection])
            return {name: {"mean": round(s["layer_mean"], 6), "sd": round(s["layer_mean_sd"], 6)}
                    for name, s in stats.items()}

        injection = {part: scores(part) for part in ("methods", "references")}
        # Beside the all-pairs means: over the pairs whose two fine-tuned models both converged.
        dropped = {k for k, pair in enumerate(self.pairs) if set(pair) & set(self.flagged)}
        converged = {part: {name: _number(converged_mean({k: p[part][name] for k, p in enumerate(self.injection)},
                                                         dropped)) for name in self.injection[0][part]}
                     for part in ("methods", "references")} if self.injection else {}
        return {"pairs": "; ".join(f"{a}→{b}" for a, b in self.pairs), "num_pairs": len(self.pairs), **self.rows,
                "not_converged": dict(self.flagged), "converged_pairs": len(self.pairs) - len(dropped),
                "injection_converged": converged,
                "alignment": {state: grouped(self.errors[state], 0) for state in STATES},
                **({"attention": {state: grouped(self.attention[state], 1) for state in STATES}}
                   if self.attention else {}),
                "injection": injection,
                "injection_per_pair": {f"{a}→{b}": {**pair["methods"], **pair["references"]}
                                       for (a, b), pair in zip(self.pairs, self.injection)}}

    def panels(self) -> dict[str, dict[str, tuple[list[float], list[float]]]]:
        """Figure panels (Ren Fig. 2, 4, 5): per state, and per state of the attention weights, each method's
        mean ± sd over the pairs per layer (attention from layer 1: layer 0 has none)."""
        n = f"{len(self.pairs)} pair{'s' if len(self.pairs) != 1 else ''}"
        out = {f"pretraining seeds, {state}: mean ± sd over {n}":
               {m: (s["mean"], s["sd"]) for m, s in mean_sd_over_pairs(self.errors[state]).items()} for state in STATES}
        for state in STATES if self.attention else ():
            out[f"attention weights, {state}: mean ± sd over {n}"] = {
                m: ([np.nan] + s["mean"], [np.nan] + s["sd"]) for m, s in mean_sd_over_pairs(self.attention[state]).items()}
        return out


    def write_figures(self, plots: Path, task: str, metric: str) -> None:
        """pretraining_seeds.png (Ren Fig. 2, 4, 5) and pretraining_seeds_injection.png (Table 5: mean over pairs)."""
        flagged = title_note(list(self.flagged))  # marks the fine-tuned models that did not converge
        write_figure(alignment_error_curves(self.panels(), f"alignment error per layer between pretraining seeds, "
                                                           f"before and after fine-tuning on {task}{flagged}"),
                     plots / "pretraining_seeds.png")
        injection = self.metrics()["injection"]
        write_figure(method_bars({m: s["mean"] for m, s in injection["methods"].items()},
                                 f"injection between pretraining seeds, mean over {len(self.pairs)} pairs ({task})"
                                 f"{flagged}",
                                 metric, {r: s["mean"] for r, s in injection["references"].items()}),
                     plots / "pretraining_seeds_injection.png")


@dataclass(frozen=True)
class SeedInputs:
    task_dir: Path
    spec: TaskSpec
    params: Params
    pretrained: Path   # download_paired's folder: one subfolder per model
    finetuned: Path    # finetune_pretrained's folder for this task: one subfolder per model

    def folder(self, name: str, state: str) -> Path:
        return (self.pretrained if state == "pretrained" else self.finetuned) / name


def pretraining_seeds(inputs: SeedInputs, options: dict, log=lambda *args: None) -> PretrainingSeeds:
    """Every experiment above on one task; `options`: each method's constructor options."""
    params, spec, a = inputs.params, inputs.spec, inputs.params.align
    pairs = list(pretraining_pairs(params))
    names = list(dict.fromkeys(name for pair in pairs for name in pair))
    _check_before_work(inputs, names)
    tables = align_examples(inputs.task_dir, spec, params)
    digest = task_tables_digest(inputs.task_dir)
    device = resolve_device(params.device)
    with tempfile.TemporaryDirectory(prefix="layersim-pretraining-seeds-") as tmp:
        paths = _encode(inputs, names, tables, Path(tmp), digest, device)
        log("encoded the task with %d pretrained and fine-tuned models", 2 * len(names))

        def layers(name, state, pooling):  # train rows, then validation rows
            train, validation = (ActivationTable(paths[name, state, pooling, split]) for split in ("train", "validation"))
            return [np.concatenate(pair) for pair in zip(train.layers(), validation.layers())]

        num_train = tables["train"].num_rows * (spec.num_choices or 1)
        num_rows = num_train + tables["validation"].num_rows * (spec.num_choices or 1)
        train_idx, test_idx = np.arange(num_train), np.arange(num_train, num_rows)
        errors = {state: [] for state in STATES}
        attention = {state: [] for state in STATES} if a.attention else {}
        injection = []
        for k, (source, target) in enumerate(pairs):
            for state in STATES:
                rows = alignment_errors(layers(source, state, a.pooling), layers(target, state, a.pooling), a.methods,
                                        train_idx, test_idx, **options)
                errors[state].append(_by_method(rows))
                if a.attention:
                    attention[state].append(_attention(paths[source, state, "attention"],
                                                       paths[target, state, "attention"], a, options))
            injection.append(_inject(inputs, source, target, paths, tables["validation"], options, a.seed + k, device))
            log("aligned %s→%s before and after fine-tuning, and injected it", source, target)
    flagged = run_flags({name: model_info(inputs.folder(name, "finetuned")).get("convergence") for name in names})
    return PretrainingSeeds(pairs, errors, attention, injection,
                            {"train_rows": tables["train"].num_rows, "test_rows": tables["validation"].num_rows},
                            flagged)


def _number(value) -> float | None:
    return round(float(value), 6) if np.isfinite(value) else None


def _check_before_work(inputs: SeedInputs, names: list[str]) -> None:
    """Refuse missing folders and models of different shape before any encoding."""
    for name in names:
        for state in STATES:
            if not (inputs.folder(name, state) / "config.json").is_file():
                stage = "download_paired" if state == "pretrained" else "finetune_pretrained"
                raise LayersimError(f"{inputs.folder(name, state)} holds no model; run the {stage} stage for "
                                    f"align.pretraining_models.")
    shapes = {name: model_shape(inputs.folder(name, "pretrained")) for name in names}
    first = names[0]
    for name in names[1:]:
        if shapes[name] != shapes[first]:
            raise LayersimError(f"align.pretraining_models has {first} and {name}, which differ in shape "
                                f"({shapes[first]} vs {shapes[name]}); list models of one architecture and size.")


def _encode(inputs: SeedInputs, names, tables, out: Path, digest: str, device) -> dict[tuple, Path]:
    """Each model's tables (align.pooling and the token its head reads, train and validation; attention of the
    first extract.attention_examples validation examples) in `out`; returns their paths."""
    params, spec = inputs.params, inputs.spec
    poolings = list(dict.fromkeys([params.align.pooling, *(own_head_pooling(name) for name in names)]))
    paths = {}
    for name in names:
        for state in STATES:
            folder = inputs.folder(name, state)
            tokenizer, encoder = load_tokenizer(folder), load_encoder(folder)
            run = f"{name.replace('/', '--')}.{state}"
            metadata = {"model": name, "model_digest": verified_info(folder)["digest"], "run": run, "task": spec.name,
                        "task_digest": digest}
            for split, table in tables.items():
                encoded = encode_task(table, spec, tokenizer, params.finetune.max_length)
                outputs = {q: out / f"{run}.{q}.{split}.parquet" for q in poolings}
                extract_activations(encoder, tokenizer, spec, encoded, outputs, {**metadata, "split": split},
                                    params.extract.batch_size, device)
                paths.update({(name, state, q, split): path for q, path in outputs.items()})
            if params.align.attention:
                paths[name, state, "attention"] = out / f"{run}.attention.parquet"
                examples = tables["validation"].slice(0, params.extract.attention_examples)
                extract_task_attention(encoder, tokenizer, examples, spec, params, paths[name, state, "attention"],
                                       {**metadata, "split": "validation"}, device)
    return paths


def _by_method(rows: list[dict]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for row in rows:  # layer-major
        out.setdefault(row["method"], []).append(row["relative_error"])
    return out


def _attention(source_path: Path, target_path: Path, a, options: dict) -> dict[str, list[float]]:
    """Per layer 1 … L, the held-out error of maps between two models' attention weights: a point is one
    (example, query token, key token) with one feature per head, maps fitted on a seeded 80 % of the examples."""
    source, target = AttentionTable(source_path), AttentionTable(target_path)
    source.check_comparable(target)
    train_idx, test_idx = example_split(source.index[:, 0], 0.2, a.seed)
    layers = [[table.layer(k) for k in range(1, table.num_layers + 1)] for table in (source, target)]
    return _by_method(alignment_errors(*layers, a.methods, train_idx, test_idx, **options))


def _inject(inputs: SeedInputs, source: str, target: str, paths, validation_table, options: dict, seed: int,
            device) -> dict[str, dict[str, float]]:
    """Ren Table 5 for one pair: the fine-tuned target's head fed the fine-tuned source's mapped last-layer
    state of the token its head reads (CLS; a decoder's last token), per method, and the references (see the
    module docstring)."""
    params, spec = inputs.params, inputs.spec
    pooling = own_head_pooling(target)

    def last(name, state, split):
        table = ActivationTable(paths[name, state, pooling, split])
        return table.layer(table.num_layers)

    model, tokenizer, encoded = load_for_validation(inputs.folder(target, "finetuned"), spec, validation_table,
                                                    params.finetune.max_length, device)
    batch = params.extract.batch_size
    x_train, y_train = last(source, "finetuned", "train"), last(target, "finetuned", "train")
    x_validation = last(source, "finetuned", "validation")
    methods = {method: round(injected_score(model, spec, encoded, map_representations(
        x_train, y_train, x_validation, method, **options.get(method, {}))[0], batch, device, tokenizer), 6)
        for method in params.align.methods}
    head = initial_head(inputs.folder(target, "pretrained"), spec, seed)  # pooler as pretrained, classifier seeded
    shape = (len(encoded), encoded.num_choices if encoded.num_choices > 1 else model.config.num_labels)
    random_logits = np.random.default_rng(seed).standard_normal(shape)
    references = {
        "target itself": full_score(model, spec, encoded, tokenizer, batch, device,
                                    resolve_precision(params.finetune.precision, device)),
        "source unmapped": injected_score(model, spec, encoded, x_validation, batch, device, tokenizer),
        "random embedding": head_score(head, spec, encoded, last(target, "pretrained", "validation"), batch, device),
        "random label": primary_score(spec, random_logits, encoded.labels)}
    return {"methods": methods, "references": {k: round(float(v), 6) for k, v in references.items()}}
