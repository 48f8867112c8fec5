"""Synthetic recovery (Ren et al. 2023 §4.3, Table 3; issue 16 part 5): how well each map recovers a known
random invertible network ``f`` from ``Y = f(X)``, held out, with the settings before and after issue 16.

``X`` is either real representations — all-MiniLM-L6-v2's mean-pooled last layer (width 384) over the
built-in tasks' generated training sentences, encoded here offline — or Gaussian rows with a decaying
spectrum at RoBERTa's width 768. Two settings are fitted on the same rows:

* ``before`` — ``f`` with 256 units per coupling block, the maps' own budget (600 steps at 1e-3), the INN
  trained on the standardised X;
* ``after`` — params.yaml's align section: ``f`` with ``synthetic_hidden`` units, ``synthetic_steps`` at
  ``synthetic_learning_rate``, the INN on the whitened X (``INNMap(whiten=True)``).

Prints one table row per setting: each method's held-out relative error and the best linear map's error
over the INN's. The goal of issue 16: that ratio ≥ 10 at the paper configuration's setting.

    python benchmarks/synthetic_recovery.py                          # MiniLM, 20,000 rows
    python benchmarks/synthetic_recovery.py --data gaussian --width 768
    python benchmarks/synthetic_recovery.py --rows 1300 --steps 300  # the quickstart's rows and budget
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

import argparse
import time

import numpy as np
import torch

from layersim.align import synthetic_recovery
from layersim.experiments.align import LINEAR_FAMILY
from layersim.params.schema import AlignParams


def minilm_rows(rows: int) -> np.ndarray:
    """Mean-pooled last-layer vectors of all-MiniLM-L6-v2 over generated training sentences."""
    from transformers import AutoModel, AutoTokenizer

    from layersim.models.registry import packaged_minilm_dir
    from layersim.data.tasks.generated import generate

    folder = packaged_minilm_dir()
    tokenizer, model = AutoTokenizer.from_pretrained(folder), AutoModel.from_pretrained(folder).eval()
    texts: list[str] = []
    for task in ("synth-negation", "synth-similarity"):
        columns = generate(task, "train", (rows + 1) // 2, 0)
        texts += next(values for values in columns.values() if isinstance(values[0], str))
    pooled = []
    with torch.no_grad():
        for start in range(0, rows, 256):
            batch = tokenizer(texts[start:start + 256], padding=True, truncation=True, max_length=64,
                              return_tensors="pt")
            mask = batch["attention_mask"].unsqueeze(-1).float()
            pooled.append(((model(**batch).last_hidden_state * mask).sum(1) / mask.sum(1)).numpy())
    return np.concatenate(pooled)[:rows].astype(np.float64)


def gaussian_rows(rows: int, width: int, seed: int = 0) -> np.ndarray:
    """Gaussian rows whose covariance has a 1/k spectrum in a random basis (and a non-zero mean)."""
    rng = np.random.default_rng(seed)
    basis, _ = np.linalg.qr(rng.standard_normal((width, width)))
    return (rng.standard_normal((rows, width)) / np.sqrt(1.0 + np.arange(width))) @ basis.T + 3.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", choices=("minilm", "gaussian"), default="minilm")
    parser.add_argument("--rows", type=int, default=AlignParams().synthetic_rows)
    parser.add_argument("--width", type=int, default=768, help="gaussian only (MiniLM is 384 wide)")
    parser.add_argument("--steps", type=int, default=AlignParams().synthetic_steps, help="the after setting's steps")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    p = AlignParams()
    x = minilm_rows(args.rows) if args.data == "minilm" else gaussian_rows(args.rows, args.width)
    network = {"inn": {"depth": p.inn_depth, "hidden": p.inn_hidden}, "mlp": {"depth": p.mlp_depth, "hidden": p.mlp_hidden}}
    settings = {
        "before": (256, {"steps": 600, "learning_rate": 1e-3}, {"whiten": False}),
        "after": (p.synthetic_hidden, {"steps": args.steps, "learning_rate": p.synthetic_learning_rate}, {}),
    }
    print(f"{args.data}: {x.shape[0]:,} rows x {x.shape[1]} ({int(0.8 * x.shape[0]):,} fitted), f scale {p.synthetic_scale}")
    print("| setting | f units | steps, lr | " + " | ".join(p.methods) + " | best linear / INN | seconds |")
    for name, (hidden, budget, inn_only) in settings.items():
        start = time.perf_counter()
        result = synthetic_recovery(x, p.methods, p.seed, scale=p.synthetic_scale, hidden=hidden,
                                    inn={**network["inn"], **budget, **inn_only}, mlp={**network["mlp"], **budget},
                                    svcca={"variance_threshold": p.svcca_variance})
        errors = {row["method"]: row["relative_error"] for row in result["rows"]}
        ratio = min(errors[m] for m in LINEAR_FAMILY) / errors["inn"]
        print(f"| {name} | {hidden} | {budget['steps']}, {budget['learning_rate']:g} | "
              + " | ".join(f"{errors[m]:.4f}" for m in p.methods) + f" | {ratio:.1f}× | {time.perf_counter() - start:.0f} |",
              flush=True)


if __name__ == "__main__":
    main()
