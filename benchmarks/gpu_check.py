"""The GPU path, checked and timed on a machine with a CUDA device (no GPU is lent to CI).

1. layersim's own fine-tuning loop on the GPU (fp32 and bf16) against the CPU, on a tiny random-init BERT and a
   built-in task: the fp32 losses must match the CPU's (same data order, same init) to float rounding, bf16 must
   train (finite, falling loss); and extraction on the GPU must give the CPU's activation tables.
2. The throughput the plan (`python -m layersim.plan --device h100|h200`) assumes: a RoBERTa-base-sized encoder
   (random init: the arithmetic is the weights' shape, not their values) trained at batch 4 and run forward at
   the evaluation batch with every layer's hidden states copied back, fp32 and bf16, per sequence length;
   effective TFLOP/s = 6 · parameters · tokens / step time (training), 2 · parameters · tokens (forward).

3. The similarity nulls' engines on the GPU (`layersim.compute.device.analysis_on`): every engine measure's null on
   small layers equal to the CPU's for the same permutations (same p-values), and a cell with its null at paper size
   (10,000 rows × 768, ORIG and FT stacked: 26 layers, 100 permutations) timed per measure: the float64 FLOP/s the
   plan's `analysis_flops` is, and, from a null on tiny layers, the seconds a cell costs besides its FLOPs
   (`analysis_cell_seconds`). With `--figures` the measured figures go into src/layersim/plan/gpu_figures.json under
   `--name` (e.g. h200), dated, which `python -m layersim.plan --device h200` then reads: commit that file.

In all it takes about 4 minutes on an H200 (`--only analysis`: about one).

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
    local-folder route): seconds a step at batch 4, eager and compiled (finetune.compile: CUDA graphs), against the
    plan's 3 × 12 layer passes × 0.8 ms; and, with
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
        # Each setting twice: the second run meets only input lengths the first has seen (per-shape set-up costs,
        # a compile and its CUDA graphs' capture, paid), so it is the steady state a 10,000-step run sees.
        for run, (precision, compile) in enumerate((("fp32", "off"), ("bf16", "off"), ("bf16", "off"),
                                                    ("bf16", "on"), ("bf16", "on"))):
            timing: dict = {}
            params = FinetuneParams(max_steps=300, warmup_steps=30, eval_every=0, checkpoint_every=0, max_length=128,
                                    precision=precision, compile=compile)
            finetune(Path(tmp) / "gpu-check-base", spec, *splits, params, seed=1, device=torch.device("cuda"),
                     timing=timing)
            report[f"base_{precision}_compile_{compile}_run{run}_ms_per_step"] = round(timing["train_seconds"] / 300 * 1e3, 2)
        report["plan_ms_per_step"] = 3 * 12 * 0.8
        losses = {}
        for device in ("cpu", "cuda"):  # the GPU's run compiled (finetune.compile auto), the CPU's eager
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


ANALYSIS_MEASURES = ("linear_cka", "svcca", "pwcca", "neuronsim", "mean_cca", "debiased_cka")


def analysis_on_gpu(device: str = "cuda", n: int = 10_000, d: int = 768) -> dict:
    """The nulls' engines on the GPU: parity with the CPU on small layers, then timings at paper size (`device`, `n`,
    `d`: for a smoke test of this function on a CPU)."""
    import numpy as np
    import torch

    from layersim.compute.device import analysis_batch, analysis_on
    from layersim.plan.measure_costs import measure_flops
    from layersim.similarity import permutation_matrix
    from layersim.similarity.inference._null_engines import ENGINES

    cuda, report = torch.device(device), {"parity": {}, "paper_size": {}}
    sync = torch.cuda.synchronize if cuda.type == "cuda" else (lambda: None)
    rng = np.random.default_rng(0)
    small = [rng.normal(size=(300, 48)) for _ in range(4)]
    for name in ANALYSIS_MEASURES:
        options = {"exact": False} if name == "linear_cka" else {}
        cpu = permutation_matrix(name, small, permutations=50, seed=3, **options)
        with analysis_on(cuda):
            gpu = permutation_matrix(name, small, permutations=50, seed=3, **options)
        report["parity"][name] = {"null_mean_max_abs_diff": float(np.nanmax(np.abs(cpu.null_mean - gpu.null_mean))),
                                  "same_p_values": bool(np.array_equal(cpu.p_value, gpu.p_value))}
    layers, permutations = 26, 100
    base = rng.normal(size=(n, d)).astype(np.float32)
    stacked = [(base + 0.3 * k * rng.normal(size=(n, d))).astype(np.float32) for k in range(layers)]
    cells = np.zeros((layers, layers), dtype=bool)
    cells[13:, :13] = True  # FT's layers against ORIG's: the cells Phang et al.'s FT–ORIG reports
    rates = []
    named = [(f"layers[{k}]", a) for k, a in enumerate(stacked)]
    for name in ("linear_cka", "svcca", "pwcca", "neuronsim"):  # the default measures (the others share their code)
        options = {"method": "feature"} if name == "linear_cka" else {}
        with analysis_on(cuda):
            start = time.perf_counter()
            engine = ENGINES[name](named, None, cells, **options)  # each layer's statistics: numpy on the host
            prepared = time.perf_counter() - start
            perms = np.stack([rng.permutation(n) for _ in range(permutations)])
            batch = analysis_batch(engine.bytes_per_permutation(), permutations)
            sync()
            start = time.perf_counter()
            for first in range(0, permutations, batch):
                engine.values_batch(perms[first : first + batch])
            sync()
            seconds = time.perf_counter() - start
        flops = measure_flops(name, n, d) * cells.sum() * permutations
        rates.append(flops / seconds)
        report["paper_size"][name] = {"host_prepare_seconds": round(prepared, 2), "permutations_seconds": round(seconds, 2),
                                      "batch": batch, "tflops": round(flops / seconds / 1e12, 2)}
    # The per-cell cost besides FLOPs: the permutations of tiny layers, whose arithmetic is nothing.
    tiny = [(f"tiny[{k}]", rng.normal(size=(64, 8))) for k in range(layers)]
    with analysis_on(cuda):
        engine = ENGINES["svcca"](tiny, None, cells)
        perms = np.stack([rng.permutation(64) for _ in range(permutations)])
        sync()
        start = time.perf_counter()
        engine.values_batch(perms)
        sync()
        per_cell = (time.perf_counter() - start) / (cells.sum() * permutations)
    report["analysis_flops"] = statistics.median(rates)
    report["analysis_cell_seconds"] = per_cell
    return report


def write_figures(path: Path, name: str, report: dict) -> None:
    """The measured figures of this run into the plan's figures file, under `name`, dated today."""
    import datetime

    figures = json.loads(path.read_text(encoding="utf-8"))
    entry = figures.setdefault(name, {})
    today = datetime.date.today().isoformat()
    analysis = report.get("analysis", {})
    for key in ("analysis_flops", "analysis_cell_seconds"):
        if isinstance(analysis, dict) and key in analysis:
            entry.setdefault(key, {})
            entry[key] |= {"value": analysis[key], "measured": today}
    base = report.get("layersim_base", {})
    compiled_ms = base.get("base_bf16_compile_on_run4_ms_per_step") if isinstance(base, dict) else None
    if compiled_ms is not None:  # BERT-base: a training step is 3 × 12 layer passes
        entry.setdefault("compiled_pass_seconds", {})
        entry["compiled_pass_seconds"] |= {"value": compiled_ms / 1e3 / 36, "measured": today}
    entry["machine"] = f"{report['device']}, torch {report['torch']}"
    path.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prepare", type=Path, help="write the inputs into this folder and stop")
    p.add_argument("--inputs", type=Path)
    p.add_argument("--out", type=Path)
    p.add_argument("--only", nargs="*", help="run only these checks (layersim, layersim_base, throughput, analysis)")
    p.add_argument("--figures", type=Path, help="write the measured figures into this plan figures file "
                   "(src/layersim/plan/gpu_figures.json)")
    p.add_argument("--name", default="h200", help="the GPU's name in the figures file")
    args = p.parse_args()
    if args.prepare:
        prepare(args.prepare)
        return 0
    import torch
    import transformers

    report = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "transformers": transformers.__version__, "python": platform.python_version()}
    checks = {"layersim": lambda: layersim_on_gpu(args.inputs), "layersim_base": lambda: layersim_base_size(args.inputs),
              "throughput": throughput, "analysis": analysis_on_gpu}
    for name in args.only or list(checks):
        check = checks[name]
        try:
            report[name] = check()
        except Exception:  # report what failed and go on: device time is scarce
            report[name] = {"error": traceback.format_exc()}
        print(json.dumps({name: report[name]}, indent=1), flush=True)
    args.out.write_text(json.dumps(report, indent=1))
    if args.figures:
        write_figures(args.figures, args.name, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
