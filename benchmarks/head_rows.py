"""What extract.max_train_examples (the cap on the train rows truncate's heads see, 20,000 in the paper
configuration) changes in Tuned and TunedOrig: the same heads trained as the truncate stage trains them (the
fine-tuned model's own head on its layer k; the head fine-tuning starts from on the pretrained model's layer k),
on the first `cap` rows of one large generated train table, for several caps, scored on the same validation rows.

The run is the quickstart's recipe (quickstart.sh's params: all-MiniLM-L6-v2, packaged, offline), one fine-tuning
seed, on a generated task with more train rows than the largest cap; heads for each of `--head-seeds`. Printed:
per variant and cap the score per layer (mean over head seeds), and per variant the largest change over layers
between each cap and the largest one beside the head seeds' sd. The figures are in docs/paper-configuration.md.

    python benchmarks/head_rows.py                              # synth-roles, caps 500 / 1,000 / 2,000 / 4,000
    python benchmarks/head_rows.py --task synth-similarity --caps 500 2000
    python benchmarks/head_rows.py --task synth-similarity --caps 5000 10000 20000 --layers 6 --tuned-head fresh
                                                                # the cap, half of it and every row, top layer only
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

from plan_accuracy import REPO, launcher_overrides, machine, matmul_gflops_per_cpu_second
from layersim.data.batching import encode_task
from layersim.data.io import ActivationTable, ActivationWriter
from layersim.data.tasks import generated_table, get_task
from layersim.experiments.extract import extract_activations
from layersim.experiments.truncation import head_scores, initial_head
from layersim.models.registry import snapshot_model
from layersim.models.task_heads import own_head
from layersim.params import parse_params
from layersim.plan.__main__ import overridden
from layersim.training.heads import HeadParams
from layersim.training.train import finetune

CPU = torch.device("cpu")


def first_rows(table: ActivationTable, rows: int, path: Path) -> ActivationTable:
    """The first `rows` rows of `table` (generated rows are independent draws: the first `rows` are a random
    sample), written again through the extract stage's writer and read back."""
    with ActivationWriter(path, num_layers=table.num_layers, hidden_size=table.hidden_size,
                          label_type=table._reader.schema.field("label").type, metadata=table.metadata,
                          precision=table.precision) as writer:
        layers = [layer[:rows] for layer in table.layers()]
        writer.write(table.example_id[:rows], table.choice[:rows], table.labels()[:rows], layers)
    return ActivationTable(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="synth-roles", help="a generated task (default: synth-roles)")
    parser.add_argument("--caps", type=int, nargs="+", default=[500, 1000, 2000, 4000], help="train rows the heads see")
    parser.add_argument("--validation", type=int, default=1000, help="validation examples")
    parser.add_argument("--steps", type=int, default=200, help="fine-tuning steps (the quickstart's 200; 0: no "
                        "fine-tuning, TunedOrig only)")
    parser.add_argument("--head-seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--layers", type=int, nargs="+", help="train heads on these layers only (default: every "
                        "layer, 0 the embeddings)")
    parser.add_argument("--tuned-head", choices=("own", "fresh"), default="own", help="Tuned's head: the fine-tuned "
                        "model's own (the truncate stage's default) or a fresh one (truncate.head: fresh)")
    parser.add_argument("--out", type=Path, help="write the scores here as JSON too")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    import transformers
    transformers.logging.set_verbosity_error()  # the head's LOAD REPORT at every TunedOrig head
    raw = overridden(REPO / "params.yaml", launcher_overrides("quickstart.sh"))
    raw["tasks"] = [args.task]
    if args.steps:
        raw["finetune"].update(max_steps=args.steps, eval_every=0)
        raw["finetune"]["warmup_steps"] = min(raw["finetune"]["warmup_steps"], args.steps // 2)
    params = parse_params(raw)
    spec, f, t = get_task(args.task), params.finetune, params.truncate
    heads = HeadParams(epochs=t.head_epochs, learning_rate=t.head_learning_rate, batch_size=t.head_batch_size,
                       weight_decay=t.head_weight_decay, holdout=t.head_holdout, patience=t.head_patience)
    print(f"{params.model} on {args.task}: {args.steps} steps, caps {args.caps}, head seeds {args.head_seeds}; "
          f"heads: {t.head_epochs} epochs", flush=True)
    print("\n".join(machine(matmul_gflops_per_cpu_second())), flush=True)
    caps = sorted(args.caps)
    found: dict = {"task": args.task, "caps": caps, "layers": args.layers, "tuned_head": args.tuned_head,
                   "scores": {}}
    with tempfile.TemporaryDirectory(prefix="layersim-head-rows-") as tmp:
        folder = Path(tmp)
        snapshot_model(params.model, folder / "model")
        from layersim.models.registry import load_encoder, load_tokenizer
        tokenizer = load_tokenizer(folder / "model")
        train = encode_task(generated_table(spec, "train", caps[-1], seed=0), spec, tokenizer, f.max_length)
        validation = encode_task(generated_table(spec, "validation", args.validation, seed=1), spec, tokenizer,
                                 f.max_length)
        encoders = {"orig": load_encoder(folder / "model")}
        if args.steps:
            start = time.perf_counter()
            model, metrics = finetune(folder / "model", spec, train, validation, f, 1, device=CPU)
            print(f"fine-tuned in {time.perf_counter() - start:.0f} s: {json.dumps(metrics)}", flush=True)
            found["finetuned"], encoders["seed1"] = metrics, model.base_model
        tables = {}
        start = time.perf_counter()
        for run, encoder in encoders.items():
            for split, encoded in (("train", train), ("validation", validation)):
                path = folder / f"{run}.{split}.cls.parquet"
                extract_activations(encoder, tokenizer, spec, encoded, {"cls": path},
                                    {"run": run, "task": spec.name, "split": split}, params.extract.batch_size, CPU,
                                    precision=params.extract.table_precision)
                tables[run, split] = ActivationTable(path)
        print(f"extracted in {time.perf_counter() - start:.0f} s", flush=True)
        tuned = (lambda seed: own_head(model)) if args.tuned_head == "own" else (lambda seed: None)
        variants = [("tuned", "seed1", tuned)] if args.steps else []
        variants.append(("tuned_orig", "orig", lambda seed: initial_head(folder / "model", spec, seed)))
        for variant, run, head in variants:
            for cap in caps:
                rows = tables[run, "train"] if cap == caps[-1] else first_rows(
                    tables[run, "train"], cap, folder / f"{run}.train.{cap}.parquet")
                start = time.perf_counter()
                scores = [head_scores(spec, rows, tables[run, "validation"], heads, seed, head(seed), args.layers)
                          for seed in args.head_seeds]
                found["scores"][f"{variant}.{cap}"] = scores
                print(f"{variant:>10} {cap:>6} rows: " + " ".join(f"{v:.3f}" for v in np.mean(scores, axis=0))
                      + f"  ({time.perf_counter() - start:.0f} s)", flush=True)
    print(f"\nper variant: largest |score(cap) − score({caps[-1]})| over layers (means over head seeds), and the "
          "head seeds' largest sd at that cap")
    for variant in [name for name, *_ in variants]:
        largest = np.mean(found["scores"][f"{variant}.{caps[-1]}"], axis=0)
        for cap in caps[:-1]:
            scores = np.array(found["scores"][f"{variant}.{cap}"])
            change = np.abs(scores.mean(axis=0) - largest)
            sd = scores.std(axis=0, ddof=1).max() if len(scores) > 1 else float("nan")
            layer = change.argmax() if args.layers is None else args.layers[change.argmax()]
            print(f"{variant:>10} {cap:>6} vs {caps[-1]}: max change {change.max():.3f} (layer {layer}), "
                  f"mean change {change.mean():.3f}; head-seed sd up to {sd:.3f}")
    if args.out:
        args.out.write_text(json.dumps(found, indent=1) + "\n")


if __name__ == "__main__":
    main()
