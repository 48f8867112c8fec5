"""The GPU path, checked and timed on a machine with a CUDA device (no GPU is lent to CI).

1. layersim's own fine-tuning loop on the GPU (fp32 and bf16) against the CPU, on a tiny random-init BERT and a
   built-in task: the fp32 losses must match the CPU's (same data order, same init) to float rounding, bf16 must
   train (finite, falling loss); and extraction on the GPU must give the CPU's activation tables.
2. The throughput the plan (`python -m layersim.plan --device h100|h200`) assumes: a RoBERTa-base-sized encoder
   (random init: the arithmetic is the weights' shape, not their values) trained at batch 4 and run forward at
   the evaluation batch with every layer's hidden states copied back, fp32 and bf16, per sequence length;
   effective TFLOP/s = 6 · parameters · tokens / step time (training), 2 · parameters · tokens (forward).

Inputs are made on a machine with layersim installed (`--prepare DIR`: a tiny-bert snapshot and the task's
tables), then `python benchmarks/gpu_check.py --inputs DIR --out OUT.json` on the GPU machine, with
PYTHONPATH=src (layersim's code only: torch, transformers, pyarrow and numpy of that machine).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

TASK = "synth-negation"


def prepare(folder: Path) -> None:
    from layersim.data.io import task_tables, write_parquet
    from layersim.data.tasks import generated_table, get_task
    from layersim.models.registry import snapshot_model

    snapshot_model("tiny-bert", folder / "tiny-bert")
    spec = get_task(TASK)
    tables = task_tables(folder / "tasks", TASK)
    tables.mkdir(parents=True, exist_ok=True)
    for split, rows in (("train", 400), ("validation", 128)):
        write_parquet(generated_table(spec, split, rows, 0), tables / f"{split}.parquet")


def layersim_on_gpu(inputs: Path) -> dict:
    import numpy as np
    import torch
    from transformers import AutoModel

    from layersim.data.io import ActivationTable
    from layersim.data.tasks import get_task
    from layersim.experiments.extract import extract_activations
    from layersim.models.registry import load_tokenizer
    from layersim.params import FinetuneParams
    from layersim.training.train import encoded_splits, finetune

    spec, model_dir = get_task(TASK), inputs / "tiny-bert"
    tokenizer = load_tokenizer(model_dir)
    train, validation = encoded_splits(inputs / "tasks" / TASK / "splits", spec, tokenizer, 64)
    runs, losses, models = {}, {}, {}
    for name, device, precision in (("cpu-fp32", "cpu", "fp32"), ("cuda-fp32", "cuda", "fp32"),
                                    ("cuda-bf16", "cuda", "bf16")):
        params = FinetuneParams(max_steps=150, warmup_steps=15, learning_rate=1e-3, eval_every=0,
                                checkpoint_every=0, max_length=64, precision=precision)
        logged: list[tuple[int, dict]] = []
        start = time.perf_counter()
        model, metrics = finetune(model_dir, spec, train, validation, params, seed=1, device=torch.device(device),
                                  log=lambda step, values: logged.append((step, values)))
        seconds = time.perf_counter() - start
        losses[name] = [values["train/loss"] for _, values in logged if "train/loss" in values]
        runs[name] = {"metrics": metrics, "seconds": round(seconds, 2), "first_loss": losses[name][0],
                      "last_loss": losses[name][-1]}
        models[name] = model
    runs["fp32_loss_max_abs_diff_cuda_vs_cpu"] = float(np.max(np.abs(np.subtract(losses["cpu-fp32"],
                                                                                 losses["cuda-fp32"]))))
    runs["bf16_finite_and_falling"] = bool(np.isfinite(losses["cuda-bf16"]).all()
                                           and losses["cuda-bf16"][-1] < losses["cuda-bf16"][0])
    # Extraction of the CPU-trained model's encoder, on each device: the tables must agree to float rounding.
    with tempfile.TemporaryDirectory() as tmp:
        models["cpu-fp32"].save_pretrained(tmp)
        tables = {}
        for device in ("cpu", "cuda"):
            encoder = AutoModel.from_pretrained(tmp)  # the bare encoder of the fine-tuned model
            out = Path(tempfile.mkdtemp(dir=tmp))
            metadata = {"run": "seed1", "task": TASK, "split": "validation", "model_digest": "-", "task_digest": "-"}
            extract_activations(encoder, tokenizer, spec, validation, {"cls": out / "cls.parquet"}, metadata,
                                batch_size=32, device=torch.device(device))
            tables[device] = ActivationTable(out / "cls.parquet").layers()
        runs["extract_max_abs_diff_cuda_vs_cpu"] = float(max(np.max(np.abs(a - b))
                                                             for a, b in zip(tables["cpu"], tables["cuda"])))
    return runs


def layersim_base_size(inputs: Path) -> dict:
    """layersim's own fine-tuning loop on a BERT-base-sized encoder (random init, tiny-bert's tokenizer, through the
    local-folder route): seconds a step at batch 4, against the plan's 3 × 12 layer passes × 0.8 ms; and, with
    dropout off (the CPU and CUDA generators draw different masks), the fp32 losses on the GPU against the CPU's."""
    import numpy as np
    import torch
    from transformers import AutoModel, AutoTokenizer, BertConfig

    from layersim.data.tasks import get_task
    from layersim.models.registry import load_tokenizer, snapshot_model
    from layersim.params import FinetuneParams
    from layersim.training.train import encoded_splits, finetune

    spec, report = get_task(TASK), {}
    tokenizer = AutoTokenizer.from_pretrained(inputs / "tiny-bert")
    base = Path("models/gpu-check-base")
    AutoModel.from_config(BertConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)).save_pretrained(base)
    tokenizer.save_pretrained(base)
    nodrop = Path("models/gpu-check-nodrop")
    AutoModel.from_pretrained(inputs / "tiny-bert", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
                              ).save_pretrained(nodrop)
    tokenizer.save_pretrained(nodrop)
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("gpu-check-base", "gpu-check-nodrop"):
            snapshot_model(f"local/{name}", Path(tmp) / name)
        splits = encoded_splits(inputs / "tasks" / TASK / "splits", spec, load_tokenizer(Path(tmp) / "gpu-check-base"), 128)
        # bf16 twice: the second run meets only input lengths the first has seen (per-shape set-up costs paid).
        for run, precision in enumerate(("fp32", "bf16", "bf16", "fp32")):
            timing: dict = {}
            params = FinetuneParams(max_steps=300, warmup_steps=30, eval_every=0, checkpoint_every=0, max_length=128,
                                    precision=precision)
            finetune(Path(tmp) / "gpu-check-base", spec, *splits, params, seed=1, device=torch.device("cuda"),
                     timing=timing)
            report[f"base_{precision}_run{run}_ms_per_step"] = round(timing["train_seconds"] / 300 * 1e3, 2)
        report["plan_ms_per_step"] = 3 * 12 * 0.8
        losses = {}
        for device in ("cpu", "cuda"):
            logged: list = []
            params = FinetuneParams(max_steps=100, warmup_steps=10, learning_rate=1e-3, eval_every=0,
                                    checkpoint_every=0, max_length=64, precision="fp32")
            finetune(Path(tmp) / "gpu-check-nodrop", spec, *splits, params, seed=1, device=torch.device(device),
                     log=lambda step, values: logged.append(values["train/loss"]) if "train/loss" in values else None)
            losses[device] = logged
        report["nodrop_fp32_loss_max_abs_diff_cuda_vs_cpu"] = float(np.max(np.abs(np.subtract(losses["cpu"], losses["cuda"]))))
        report["nodrop_last_losses"] = {device: values[-1] for device, values in losses.items()}
    return report


def _median_seconds(step, repeats: int) -> float:
    import torch

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def throughput() -> list[dict]:
    from transformers import RobertaConfig

    large = RobertaConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)
    return _throughput_of("base", RobertaConfig(num_labels=2)) + _throughput_of("large", large)


def _throughput_of(size: str, config) -> list[dict]:
    import torch
    from transformers import RobertaForSequenceClassification

    config.num_labels = 2
    model = RobertaForSequenceClassification(config).cuda()
    parameters = sum(p.numel() for p in model.roberta.encoder.parameters())  # the per-token matmul weights
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    rows = []
    for precision in ("fp32", "bf16"):
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        for length in (128, 256):
            ids = torch.randint(5, config.vocab_size - 1, (4, length), device="cuda")
            labels = torch.randint(0, 2, (4,), device="cuda")
            batch = torch.randint(5, config.vocab_size - 1, (32, length), device="cuda")

            def train_step():
                with torch.autocast("cuda", dtype=dtype, enabled=precision == "bf16"):
                    loss = model(input_ids=ids, labels=labels).loss
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

            @torch.no_grad()
            def forward():
                with torch.autocast("cuda", dtype=dtype, enabled=precision == "bf16"):
                    states = model.roberta(input_ids=batch, output_hidden_states=True).hidden_states
                return [s[:, 0].float().cpu() for s in states]  # the CLS row of every layer, as extract keeps

            model.train()
            seconds = _median_seconds(train_step, 20)
            rows.append({"model": size, "what": "train batch 4", "precision": precision, "length": length,
                         "ms": round(seconds * 1e3, 2), "tflops": round(6 * parameters * 4 * length / seconds / 1e12, 1)})
            model.eval()
            seconds = _median_seconds(forward, 10)
            rows.append({"model": size, "what": "forward batch 32, every layer back", "precision": precision,
                         "length": length, "ms": round(seconds * 1e3, 2),
                         "tflops": round(2 * parameters * 32 * length / seconds / 1e12, 1)})
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prepare", type=Path, help="write the inputs into this folder and stop")
    p.add_argument("--inputs", type=Path)
    p.add_argument("--out", type=Path)
    p.add_argument("--only", nargs="*", help="run only these checks (layersim, layersim_base, throughput)")
    args = p.parse_args()
    if args.prepare:
        prepare(args.prepare)
        return 0
    import torch
    import transformers

    report = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "transformers": transformers.__version__, "python": platform.python_version()}
    checks = {"layersim": lambda: layersim_on_gpu(args.inputs), "layersim_base": lambda: layersim_base_size(args.inputs),
              "throughput": throughput}
    for name in args.only or list(checks):
        check = checks[name]
        try:
            report[name] = check()
        except Exception:  # report what failed and go on: device time is scarce
            report[name] = {"error": traceback.format_exc()}
        print(json.dumps({name: report[name]}, indent=1), flush=True)
    args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
