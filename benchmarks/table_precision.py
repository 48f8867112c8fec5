"""What the stored precision of the tables (extract.table_precision) changes, against what seeds change: every measure
the similarity stage runs (the attention measures included), truncate's heads and align's maps, computed from tables
stored as float32 and as each lossy encoding of layersim.data.io.stored (scaled float16 residuals, scaled 24-bit
integer residuals) and read back through the stages' readers, beside the sd over fine-tuning seeds of the same numbers
on the float32 tables; and the rule `auto` (int24 for word rows, float16 for the rest), per pooling.

The reference: float32 tables hold the encoder's activations exactly as its forward pass computed them (float32), and
every measure computes in float64 from them, so Δ against them is what the storage alone adds (float32 storage:
Δ = 0).

The runs are the quickstart's (quickstart.sh's params: all-MiniLM-L6-v2, packaged, offline; synth-similarity; three
seeds of 200 steps), fine-tuned here; `--wide` runs the same on a random-init BERT of width 768 (4 layers, 12 heads)
with more rows and 60 steps (random-init activations are not a trained model's: no outlier dimensions, no LayerNorm
gains near zero; they test the width, not a trained model's ranges); align's maps are the closed-form ones (linear,
CCA, SVCCA, PWCCA; `--neural` adds INN and MLP). For each measure and pooling: the FT[i]–ORIG layer blocks (i = 1, 2,
3, as the similarity stage's stacked matrix holds them); Δ = |value on the stored tables − value on float32 tables|
per cell and seed; sd = the sd over the three seeds of the cell's float32 value. The verdict: max over cells of Δ / sd
≤ 0.1 (cells whose seed sd is below 1e-6 are left out of the ratio and their Δ shown on its own). Maps: each pair
ORIG → FT[i], every layer to itself (layers 1 …), fitted on 80 % of the train rows and scored on the rest; heads: a
fresh head per layer of FT[i]'s train rows, scored on its validation rows. At the end: the paper configuration's
bytes at three seeds under each setting (`python -m layersim.plan`). The figures are in docs/paper-configuration.md.

    python benchmarks/table_precision.py            # the quickstart's model, task and recipe (about 15 min, 2 cores)
    python benchmarks/table_precision.py --wide     # a random-init BERT of width 768
    python benchmarks/table_precision.py --steps 20 # fewer fine-tuning steps: what a loaded 2-core CPU allows
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

import argparse
import json
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import yaml

from plan_accuracy import REPO, launcher_overrides, machine, matmul_gflops_per_cpu_second
from layersim.align.experiments import alignment_errors, example_split
from layersim.data.batching import encode_task
from layersim.data.io import ActivationTable, ActivationWriter, AttentionTable
from layersim.data.io.stored import AUTO, table_encoding
from layersim.data.tasks import generated_table, get_task
from layersim.errors import LayersimError
from layersim.experiments.align import method_options
from layersim.experiments.extract import extract_activations, extract_attention
from layersim.experiments.truncation import head_scores
from layersim.models.registry import MODEL_INFO_FILE, load_encoder, load_tokenizer, snapshot_model, weights_digest
from layersim.params import parse_params
from layersim.plan import plan, total
from layersim.plan.__main__ import overridden
from layersim.similarity.comparisons import attention_maps, measure_options, stacked_matrix
from layersim.similarity.attention import HEAD_MEASURES
from layersim.similarity.registry import MEASURES
from layersim.training.heads import HeadParams
from layersim.training.train import finetune

CPU = torch.device("cpu")
SEEDS = (1, 2, 3)
ENCODED = ("float16", "int24")  # the lossy encodings, each compared with float32
STORED = (*ENCODED, AUTO)  # …and the rule: per table, the encoding table_encoding(AUTO, pooling) picks
# --ulp: the float32 values each moved by float32's own rounding (× (1 + 2^-24 · a standard normal)), which a
# different BLAS, batch size or GPU changes too; what a measure moves by then, no storage can hold it within. An upper
# bound: the noise also separates rows that are exactly equal (one word at one position, at the embeddings), which a
# recomputation keeps equal (kNN Jaccard's ties).
NOISE = "float32 ± ulp"
WIDE_STEPS = 60  # the wide model's fine-tuning steps: its seeds' spread, not a converged run, is what is measured
FLAT_SD = 1e-6  # a cell the seeds do not move (the embeddings): its Δ is shown, not divided


def quickstart_params(wide: bool, neural: bool, steps: int | None):
    raw = overridden(REPO / "params.yaml", launcher_overrides("quickstart.sh"))
    if steps:  # fewer steps: the seeds have moved less apart, so Δ / sd errs high (a stricter test), not low
        raw["finetune"].update(max_steps=steps, eval_every=0)
    if not neural:  # INN and MLP train a network per layer and pair: minutes more on a laptop CPU
        raw["align"]["methods"] = [m for m in raw["align"]["methods"] if m not in ("inn", "mlp")]
    if wide:  # the task of the quickstart, more rows (width 768 needs more points than dimensions), fewer steps
        raw["download"]["generated_validation_examples"] = 1000
        raw["extract"]["max_tokens"] = 3000
        raw["extract"]["max_train_examples"] = 3000
        raw["finetune"].update(max_steps=steps or WIDE_STEPS, eval_every=0)
    f = raw["finetune"]
    f["warmup_steps"] = min(f["warmup_steps"], f["max_steps"] // 2)
    return parse_params(raw)


def wide_model(folder: Path) -> None:
    """A random-init BERT of width 768, 4 layers, 12 heads, MiniLM's WordPiece tokenizer."""
    from transformers import AutoConfig, AutoModel

    snapshot_model("tiny-bert", folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(hidden_size=768, num_hidden_layers=4, num_attention_heads=12, intermediate_size=1536)
    (folder / "config.json").write_text(json.dumps(config))
    torch.manual_seed(0)
    AutoModel.from_config(AutoConfig.from_pretrained(folder)).save_pretrained(folder)
    info = json.loads((folder / MODEL_INFO_FILE).read_text())  # the weights are new: so is their digest
    (folder / MODEL_INFO_FILE).write_text(json.dumps({**info, "digest": weights_digest(folder),
                                                      "revision": "random-init seed 0, width 768"}))


def stored_copy(table: ActivationTable, path: Path, precision: str) -> ActivationTable:
    """`table` (float32) written again through the extract stage's writer in `precision` and read back (or the copy
    a former run left at `path`)."""
    if path.exists():
        return ActivationTable(path)
    with ActivationWriter(path, num_layers=table.num_layers, hidden_size=table.hidden_size,
                          label_type=table._reader.schema.field("label").type, metadata=table.metadata,
                          precision=precision) as writer:
        for start, layers in zip(range(0, table.num_rows, 4096), table.iter_batches(4096)):
            rows = slice(start, start + len(layers[0]))
            words = {"segment": table.segment[rows], "word": table.word[rows]} if table.words else {}
            writer.write(table.example_id[rows], table.choice[rows], table.labels()[rows], layers, **words)
    return ActivationTable(path)


class Runs:
    """ORIG and the fine-tuned seeds' tables, float32 and stored, in one folder: the train tables only for `parts`
    that read them (heads, maps), the attention tables only for attention."""

    def __init__(self, folder: Path, model: Path, params, spec, parts=("measures", "attention", "heads", "maps")):
        self.folder, self.params, self.spec = folder, params, spec
        e, f = params.extract, params.finetune
        tokenizer = load_tokenizer(model)
        validation = generated_table(spec, "validation", params.download.generated_validation_examples, seed=1)
        train = generated_table(spec, "train", e.max_train_examples, seed=0)
        splits = {"validation": encode_task(validation, spec, tokenizer, f.max_length, words=True),
                  "train": encode_task(train, spec, tokenizer, f.max_length)}
        attention = encode_task(validation.slice(0, e.attention_examples), spec, tokenizer, f.max_length,
                                words=e.attention_unit == "words")
        encoders = {"orig": load_encoder(model)}
        self.train_seconds = 0.0
        for seed in SEEDS:
            kept = folder / f"seed{seed}.encoder.pt"  # a rerun with the same --work folder trains no seed again
            if kept.exists():
                encoders[f"seed{seed}"] = load_encoder(model)
                encoders[f"seed{seed}"].load_state_dict(torch.load(kept))
                continue
            start = time.perf_counter()
            trained, metrics = finetune(model, spec, splits["train"], splits["validation"], f, seed, device=CPU)
            self.train_seconds += time.perf_counter() - start
            print(f"  seed {seed}: {json.dumps(metrics)}", flush=True)
            encoders[f"seed{seed}"] = trained.base_model
            torch.save(trained.base_model.state_dict(), kept)
        self.tables: dict[tuple[str, str, str, str], ActivationTable] = {}
        self.attention: dict[tuple[str, str], AttentionTable] = {}
        for run, encoder in encoders.items():
            for split, poolings in (("validation", ["cls", "tokens"]), ("train", ["cls", "mean"])):
                if split == "train" and not {"heads", "maps"} & set(parts):
                    continue
                out = {q: folder / f"{run}.{split}.{q}.parquet" for q in poolings}
                if not all(path.exists() for path in out.values()):  # a rerun reads the tables kept in --work
                    extract_activations(encoder, tokenizer, spec, splits[split], out,
                                        {"run": run, "task": spec.name, "split": split}, e.batch_size, CPU,
                                        max_tokens=e.max_tokens)
                for q, path in out.items():
                    full = self.tables[run, split, q, "float32"] = ActivationTable(path)
                    for encoding in ENCODED:
                        copy = path.with_suffix(f".{encoding}.parquet")
                        self.tables[run, split, q, encoding] = stored_copy(full, copy, encoding)
            for precision in ("float32", table_encoding(AUTO, "attention")) if "attention" in parts else ():
                path = folder / f"{run}.attention.{precision}.parquet"
                if not path.exists():
                    extract_attention(encoder, tokenizer, attention, path, {"run": run, "task": spec.name},
                                      e.batch_size, CPU, e.attention_unit, precision)
                self.attention[run, precision] = AttentionTable(path)

    def layers(self, run: str, split: str, pooling: str, variant: str) -> list[np.ndarray]:
        return self.table(run, split, pooling, variant).layers()

    def table(self, run: str, split: str, pooling: str, variant: str) -> ActivationTable:
        """The table of `variant`: float32, an encoding, or AUTO (the encoding the rule picks for `pooling`)."""
        return self.tables[run, split, pooling, table_encoding(AUTO, pooling) if variant == AUTO else variant]


def verdict(values: dict[str, np.ndarray], kind: str) -> dict:
    """Per stored variant: max Δ, the seeds' sd, max Δ / sd over the cells the seeds move; `values[variant]` is
    (seeds, cells) for float32 and the encodings measured; the rule's (AUTO) are those of the encoding it picks for
    `kind` (a pooling, or "attention")."""
    values = {**values, AUTO: values[table_encoding(AUTO, kind)]}
    sd = np.nanstd(values["float32"], axis=0, ddof=1)
    moved = sd >= FLAT_SD
    found = {"seed sd (min over cells)": float(np.nanmin(np.where(moved, sd, np.nan))) if moved.any() else None}
    for variant in (*STORED, NOISE):
        if variant not in values:
            continue
        delta = np.abs(values[variant] - values["float32"])
        ratio = np.nanmax(delta[:, moved] / sd[moved]) if moved.any() else np.nan
        found[variant] = {"max delta": float(np.nanmax(delta)), "max delta/sd": float(ratio),
                          "max delta, unmoved cells": float(np.nanmax(delta[:, ~moved])) if (~moved).any() else None}
    return found


def measures(runs: Runs, poolings=("cls", "tokens"), ulp: bool = False, names=tuple(MEASURES)) -> dict[str, dict]:
    s = runs.params.similarity
    options = measure_options(rbf_sigma_scale=s.rbf_sigma_scale, svcca_variance=s.svcca_variance,
                              pwcca_variance=s.pwcca_variance, rbf_exact_max_rows=s.rbf_exact_max_rows,
                              rbf_landmarks=s.rbf_landmarks, seed=s.seed)
    options["shape_metric"] = {"alpha": s.shape_alpha}
    options["rsa"] = {"rdm": s.rsa_rdm, "compare": s.rsa_compare}
    options["knn_jaccard"] = {"k": s.knn_k, "metric": s.knn_metric}
    found = {}
    for pooling in poolings:
        layers = {v: {run: runs.layers(run, "validation", pooling, v) for run in ("orig", *map("seed{}".format, SEEDS))}
                  for v in ("float32", *ENCODED)}
        rows, width = layers["float32"]["orig"][0].shape
        if ulp:
            rng = np.random.default_rng(0)
            layers[NOISE] = {run: [(x * (1 + 2.0 ** -24 * rng.standard_normal(x.shape))).astype(np.float32)
                                   for x in models] for run, models in layers["float32"].items()}
        for name in names:
            start, values = time.perf_counter(), {}
            try:
                for v, models in layers.items():
                    values[v] = np.stack([_block(stacked_matrix(name, {"orig": models["orig"], "ft": models[f"seed{i}"]},
                                                                **options.get(name, {}))) for i in SEEDS])
            except LayersimError as err:
                found[f"{name} ({pooling}, {rows} × {width})"] = {"not computable": str(err)}
                continue
            found[f"{name} ({pooling}, {rows} × {width})"] = verdict(values, pooling) | {
                "seconds": time.perf_counter() - start}
            print(f"  {name} {pooling}: {found[f'{name} ({pooling}, {rows} × {width})']}", flush=True)
    return found


def attention(runs: Runs) -> dict[str, dict]:
    found = {}
    maps = {v: {run: attention_maps(runs.attention[run, v]) for run in ("orig", *map("seed{}".format, SEEDS))}
            for v in ("float32", table_encoding(AUTO, "attention"))}
    for name in HEAD_MEASURES:
        values = {v: np.stack([_block(stacked_matrix(name, {"orig": m["orig"], "ft": m[f"seed{i}"]}))
                               for i in SEEDS]) for v, m in maps.items()}
        found[f"attention {name} ({runs.params.extract.attention_examples} examples)"] = verdict(values, "attention")
    return found


def _block(matrix: np.ndarray) -> np.ndarray:
    """The FT–ORIG block (FT's layers as rows) of a two-model stacked matrix, flattened."""
    half = len(matrix) // 2
    return matrix[half:, :half].reshape(-1)


def heads(runs: Runs) -> dict:
    t = runs.params.truncate
    head = HeadParams(epochs=t.head_epochs, learning_rate=t.head_learning_rate, batch_size=t.head_batch_size,
                      weight_decay=t.head_weight_decay, holdout=t.head_holdout, patience=t.head_patience)
    values = {}
    for v in ("float32", *ENCODED):
        values[v] = np.array([head_scores(runs.spec, runs.table(f"seed{i}", "train", "cls", v),
                                          runs.table(f"seed{i}", "validation", "cls", v), head, seed=1)
                              for i in SEEDS])
    return {"truncate head, fresh (score per layer)": verdict(values, "cls")}


def maps(runs: Runs) -> dict:
    p = runs.params
    ids = runs.tables["orig", "train", "mean", "float32"].example_id
    fit, test = example_split(ids, 0.2, seed=p.align.seed)
    found = {}
    values: dict[str, dict[str, list]] = {}
    for v in ("float32", *ENCODED):
        source = runs.layers("orig", "train", "mean", v)[1:]  # the layers: embeddings barely move (a loss of 0)
        for i in SEEDS:
            target = runs.layers(f"seed{i}", "train", "mean", v)[1:]
            for method in p.align.methods:
                try:
                    options = {m: o for m, o in method_options(p).items() if m == method}
                    rows = alignment_errors(source, target, [method], fit, test, **options)
                except LayersimError as err:
                    found[f"align map {method}"] = {"not computable": str(err)}
                    continue
                values.setdefault(method, {}).setdefault(v, []).extend(r["relative_error"] for r in rows)
    for method, by_variant in values.items():
        if f"align map {method}" in found or len(by_variant) < 1 + len(ENCODED):
            continue
        arrays = {v: np.array(x).reshape(len(SEEDS), -1) for v, x in by_variant.items()}
        found[f"align map {method} (relative error, ORIG → FT[i] per layer)"] = verdict(arrays, p.align.pooling)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wide", action="store_true", help="a random-init BERT of width 768 instead of MiniLM")
    parser.add_argument("--steps", type=int, help="fine-tuning steps per seed (default: the quickstart's 200; "
                        "--wide: 60)")
    parser.add_argument("--neural", action="store_true", help="align's INN and MLP maps too (slow on a CPU)")
    parser.add_argument("--out", type=Path, help="write the figures here as JSON too")
    parser.add_argument("--parts", nargs="+", default=["measures", "attention", "heads", "maps"],
                        choices=["measures", "attention", "heads", "maps"], help="what to measure (default: all)")
    parser.add_argument("--ulp", action="store_true", help="the measures on float32 values moved by float32's own "
                        "rounding too: the floor no storage gets below")
    parser.add_argument("--measures", nargs="+", default=list(MEASURES), choices=list(MEASURES),
                        help="the measures to run (default: every one; at width 768 a measure takes minutes)")
    parser.add_argument("--poolings", nargs="+", default=["cls", "tokens"], choices=["cls", "tokens"],
                        help="the points the measures run on, in this order (default: cls tokens)")
    parser.add_argument("--work", type=Path, help="keep the model, the seeds' weights and the tables here (a rerun "
                        "reuses them: empty the folder after changing the encodings or the recipe)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    params = quickstart_params(args.wide, args.neural, args.steps)
    print(f"{params.model if not args.wide else 'random-init BERT, width 768'}: {params.finetune.max_steps} steps a "
          f"seed", flush=True)
    spec = get_task(params.tasks[0])
    print("\n".join(machine(matmul_gflops_per_cpu_second())), flush=True)
    with tempfile.TemporaryDirectory(prefix="layersim-precision-") as tmp:
        folder = args.work or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        if (folder / "model").exists():
            pass
        elif args.wide:
            wide_model(folder / "model")
        else:
            snapshot_model(params.model, folder / "model")
        runs = Runs(folder, folder / "model", params, spec, args.parts)
        sizes = {v: sum(runs.table(*k[:3], v).path.stat().st_size for k in runs.tables if k[3] == "float32")
                 for v in ("float32", *STORED)}
        print(f"fine-tuning: {runs.train_seconds:.0f} s; activation tables "
              + ", ".join(f"{v} {size / 1e6:.1f} MB" for v, size in sizes.items()), flush=True)
        parts = {"measures": lambda r: measures(r, args.poolings, args.ulp, args.measures), "attention": attention, "heads": heads, "maps": maps}
        found = {}
        for name in args.parts:
            found |= parts[name](runs)
    if args.out:
        args.out.write_text(json.dumps(found, indent=1) + "\n")
    shown = [v for v in (*STORED, NOISE) if any(v in row for row in found.values())]
    print(f"{'':<60} {'seed sd':>8}  " + "  ".join(f"{v + ': Δ, Δ/sd':>26}" for v in shown))
    for key, row in found.items():
        if "not computable" in row:
            print(f"{key:<60} not computable: {row['not computable'][:60]}")
            continue
        cells = [f"{row[v]['max delta']:>10.1e} {row[v]['max delta/sd']:>8.3f}" if v in row else f"{'':>19}"
                 for v in shown]
        sd = row["seed sd (min over cells)"]
        print(f"{key:<60} {sd if sd is None else format(sd, '8.1e'):>8}  " + "  ".join(f"{c:>26}" for c in cells))
    worst = {v: max((row[v]["max delta/sd"] for row in found.values() if v in row), default=np.nan) for v in shown}
    print("largest Δ / sd over every row: " + ", ".join(f"{v} {x:.3f}" + (" (holds)" if x <= 0.1 else " (fails)")
                                                      for v, x in worst.items()))
    print("the paper configuration at three seeds (python -m layersim.plan -S 'seeds=[1,2,3]'): "
          + ", ".join(f"{v} {paper_bytes(v) / 1e9:.1f} GB" for v in ("float32", *STORED)))


def paper_bytes(precision: str) -> float:
    """What the plan says the paper configuration (params.yaml, three seeds) writes with `precision`."""
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["seeds"] = [1, 2, 3]
    raw["extract"]["table_precision"] = precision
    return total(plan(parse_params(raw), REPO)).bytes


if __name__ == "__main__":
    main()
