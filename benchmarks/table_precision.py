"""What storing activation tables in float16 (extract.table_precision) changes: every similarity measure, the
truncation heads' scores and align's maps' errors, computed from the same activations written as float32 and as
float16 tables and read back through ActivationTable (which upcasts to float32), max |Δ| over every cell.

The activations are a real pretrained encoder's (minilm-l6, packaged, offline) on a built-in task: its CLS and
word ("tokens") rows of the validation examples for the measures (every pair of its layers, as the similarity
stage's stacked matrix holds them), its CLS rows of the train examples for truncate's heads (a fresh head and the
model's own, TunedOrig's start) and its mean rows for align's maps (each layer mapped to the next). Options are
params.yaml's defaults. The figures are in docs/paper-configuration.md.

    python benchmarks/table_precision.py                     # minilm-l6, synth-negation, 2000 train / 500 validation
    python benchmarks/table_precision.py --task synth-similarity --train 1000
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch

from layersim.align.experiments import alignment_errors, example_split
from layersim.data.batching import encode_task
from layersim.data.io import ActivationTable
from layersim.data.tasks import generated_table, get_task
from layersim.experiments.align import method_options
from layersim.experiments.extract import extract_activations
from layersim.experiments.truncation import head_scores, initial_head
from layersim.models.registry import load_encoder, load_tokenizer, snapshot_model
from layersim.params import parse_params
from layersim.similarity.comparisons import measure_options
from layersim.similarity.registry import MEASURES, similarity_matrix
from layersim.training.heads import HeadParams

CPU = torch.device("cpu")


def tables(folder: Path, model: Path, spec, split: str, examples: int, poolings: list[str], precision: str):
    """The split's tables in `precision`, extracted from `model` (the extract stage's writer)."""
    tokenizer, encoder = load_tokenizer(model), load_encoder(model).eval()
    table = generated_table(spec, split, examples, seed=0)
    encoded = encode_task(table, spec, tokenizer, 128, words="tokens" in poolings)
    outputs = {q: folder / f"{split}.{precision}.{q}.parquet" for q in poolings}
    metadata = {"model": "bench", "run": "orig", "task": spec.name, "split": split}
    extract_activations(encoder, tokenizer, spec, encoded, outputs, metadata, 32, CPU, max_tokens=20000,
                        precision=precision)
    return {q: ActivationTable(path) for q, path in outputs.items()}


def measures(full: dict, half: dict, params) -> dict[str, float]:
    s = params.similarity
    options = measure_options(rbf_sigma_scale=s.rbf_sigma_scale, svcca_variance=s.svcca_variance,
                              pwcca_variance=s.pwcca_variance, rbf_exact_max_rows=s.rbf_exact_max_rows,
                              rbf_landmarks=s.rbf_landmarks, seed=s.seed)
    options["shape_metric"] = {"alpha": s.shape_alpha}
    options["rsa"] = {"rdm": s.rsa_rdm, "compare": s.rsa_compare}
    options["knn_jaccard"] = {"k": s.knn_k, "metric": s.knn_metric}
    found = {}
    for pooling in full:
        a, b = full[pooling].layers(), half[pooling].layers()
        varying = [k for k, x in enumerate(a) if np.ptp(x, axis=0).max() > 0]  # CLS's embedding row is one vector
        a, b = [a[k] for k in varying], [b[k] for k in varying]
        for name in MEASURES:
            delta = similarity_matrix(name, a, **options.get(name, {})) - \
                similarity_matrix(name, b, **options.get(name, {}))
            found[f"{name} ({pooling}, {len(a[0])} rows)"] = float(np.nanmax(np.abs(delta)))
    return found


def heads(spec, model: Path, train: dict, validation: dict, params) -> dict[str, float]:
    t = params.truncate
    head = HeadParams(epochs=t.head_epochs, learning_rate=t.head_learning_rate, batch_size=t.head_batch_size,
                      weight_decay=t.head_weight_decay, holdout=t.head_holdout, patience=t.head_patience)
    found = {}
    for kind in ("fresh", "own"):
        scores = [np.array(head_scores(spec, train[p]["cls"], validation[p]["cls"], head, seed=1,
                                       start=None if kind == "fresh" else initial_head(model, spec, 1)))
                  for p in ("float32", "float16")]
        found[f"truncate head, {kind} (score per layer)"] = float(np.abs(scores[0] - scores[1]).max())
    # For scale: what another seed of the fresh head changes on the same float32 table (training noise).
    other = np.array(head_scores(spec, train["float32"]["cls"], validation["float32"]["cls"], head, seed=2))
    found["  for scale: fresh head, seed 1 vs 2 (float32)"] = float(np.abs(other - scores[0]).max())
    return found


def maps(train: dict, params) -> dict[str, float]:
    layers = {p: train[p]["mean"].layers() for p in ("float32", "float16")}
    ids = train["float32"]["mean"].example_id
    fit, test = example_split(ids, 0.2, seed=0)
    errors = {p: alignment_errors(x[:-1], x[1:], params.align.methods, fit, test, **method_options(params))
              for p, x in layers.items()}
    found = {}
    for a, b in zip(errors["float32"], errors["float16"]):
        key = f"align map {a['method']} (relative error, layer k → k+1)"
        found[key] = max(found.get(key, 0.0), abs(a["relative_error"] - b["relative_error"]))
    # For scale: what another draw of the fit/test split changes on the float32 tables (sampling noise).
    fit2, test2 = example_split(ids, 0.2, seed=1)
    resampled = alignment_errors(layers["float32"][:-1], layers["float32"][1:], params.align.methods, fit2, test2,
                                 **method_options(params))
    for a, b in zip(errors["float32"], resampled):
        key = f"  for scale: align map {a['method']}, split seed 0 vs 1 (float32)"
        found[key] = max(found.get(key, 0.0), abs(a["relative_error"] - b["relative_error"]))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="synth-negation")
    parser.add_argument("--train", type=int, default=2000)
    parser.add_argument("--validation", type=int, default=500)
    parser.add_argument("--skip-measures", action="store_true", help="only the heads and the maps")
    args = parser.parse_args()
    torch.set_num_threads(1)
    spec = get_task(args.task)
    params = parse_params({"model": "minilm-l6", "tasks": [spec.name], "seeds": [1], "device": "cpu"})
    with tempfile.TemporaryDirectory(prefix="layersim-precision-") as tmp:
        folder = Path(tmp)
        snapshot_model("minilm-l6", folder / "model")
        validation = {p: tables(folder, folder / "model", spec, "validation", args.validation, ["cls", "tokens"], p)
                      for p in ("float32", "float16")}
        train = {p: tables(folder, folder / "model", spec, "train", args.train, ["cls", "mean"], p)
                 for p in ("float32", "float16")}
        stored = {p: sum(t.path.stat().st_size for t in validation[p].values()) for p in validation}
        print(f"minilm-l6 on {spec.name}: validation tables {stored['float32'] / 1e6:.1f} MB as float32, "
              f"{stored['float16'] / 1e6:.1f} MB as float16")
        found = {} if args.skip_measures else measures(validation["float32"], validation["float16"], params)
        found |= heads(spec, folder / "model", train, validation, params)
        found |= maps(train, params)
    width = max(map(len, found))
    print(f"{'max |float32 − float16|':<{width}}  value")
    for key, value in found.items():
        print(f"{key:<{width}}  {value:.2e}")


if __name__ == "__main__":
    main()
