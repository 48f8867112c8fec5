"""Throughput of the heavy stages' work (issue 18): today's code against the way it ran before, in one run.

Three measurements, each a ratio of times taken in this process on the same inputs:

* ``truncate_skip`` — the model passes of the truncate and skip stages for one task and seed at the
  quickstart's settings (minilm-l6, 300 validation examples of synth-negation, max_length 64, batch 32).
  Before: the full model scored once per stage, Untuned as ``exit_at(model, k)`` for every k (L + 1
  passes), every span as ``skip_span(model, i, j)`` (L(L+1)/2 passes), batches in table order. Now: one
  pass gives every exit (``untuned_scores``), one pass per batch plus the layers after each span
  (``span_scores``), batches sorted by length. The scores of both are compared.
* ``inn_step`` — one INN fit (width 768, 4 coupling blocks of width 256, batch 256): seconds per step
  before (coupling halves gathered by index, one network) and now (halves as slices), and per network
  when the 13 layers of a comparison train together (``fit_maps``).
* ``align`` — the alignment experiments of one task at the quickstart's settings on layers of the
  quickstart's shape (7 layers of width 384, 1,000 train and 300 test rows, 100 steps, INN width 128,
  MLP width 256, 20 steps per layer-matrix cell): two pairs × six methods × seven layers and the INN's
  7 × 7 matrix. Before: one map at a time with gathered halves; now: each method's layers together.
  Layer injection (8 scores) before: the target model run with its CLS state replaced; now: its head.
  Two alternating rounds, the faster of each kept. Its *ceiling* is before's time over a floor: today's linear
  maps and injection plus the neural fits' matrix products alone (``matrix_products_seconds``), which no
  float32 implementation of the same fits can go below on this machine.

The baselines reproduce the earlier code paths here (they are not in the library any more). CPU, float32,
torch's own thread count unless ``--threads``. No GPU is used; on a GPU machine run with ``--device cuda``
to time the same work there (the baselines stay on the CPU only where they always did).

    python benchmarks/throughput.py                 # all three
    python benchmarks/throughput.py --quick         # fewer INN steps and examples
    python benchmarks/throughput.py --only inn_step --steps 600
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

import argparse
import contextlib
import tempfile
import time
from pathlib import Path
from unittest import mock

import numpy as np
import torch

from layersim.align import experiments
from layersim.align.base import AlignmentMap, fit_maps
from layersim.align.maps import make_map
from layersim.align.metrics import mse, relative_error
from layersim.align.flows import AffineCoupling, learning_rate_factor
from layersim.align.neural import INNMap, NeuralMap, shrunk_whitening
from layersim.data.batching import encode_task, sequential_batches
from layersim.compute.device import resolve_device
from layersim.models.encoders import all_spans, exit_at, inject_first_token, num_layers, skip_span
from layersim.experiments.injection import injected_score
from layersim.compute.linalg import canonical_pairs, thin_svd, variance_rank
from layersim.models.registry import load_task_model, load_tokenizer, snapshot_model
from layersim.data.tasks import generated_table, get_task
from layersim.experiments.truncation import primary_score, span_scores, untuned_scores


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


# --- the earlier code paths (baselines) ---

@torch.inference_mode()
def predict_in_table_order(model, encoded, tokenizer, batch_size, device):
    """evaluate.predict as it was: batches in table order."""
    model.eval()
    return np.concatenate([model(**{k: v.to(device) for k, v in batch.items()}).logits.float().cpu().numpy()
                           for _, batch in sequential_batches(encoded, batch_size, tokenizer, with_labels=False)])


def truncate_skip_before(model, spec, encoded, tokenizer, batch_size, device):
    score = lambda: primary_score(spec, predict_in_table_order(model, encoded, tokenizer, batch_size, device),
                                  encoded.labels)
    full_truncate = score()
    untuned = []
    for k in range(num_layers(model) + 1):
        with exit_at(model, k):
            untuned.append(score())
    full_skip, spans = score(), {}
    for i, j in all_spans(num_layers(model)):
        with skip_span(model, i, j):
            spans[(i, j)] = score()
    return full_truncate, untuned, full_skip, spans


def truncate_skip_now(model, spec, encoded, tokenizer, batch_size, device):
    untuned = untuned_scores(model, spec, encoded, tokenizer, batch_size, device)
    full_skip, spans = span_scores(model, spec, encoded, tokenizer, batch_size, device)
    return untuned[-1], untuned, full_skip, spans


def gathered_forward(self, x):
    """AffineCoupling.forward as it was: the halves gathered by a permutation index, and scattered back."""
    permutation = self.permutation.to(x.device)
    u = x[:, permutation]
    u1, u2 = u[:, : self.split], u[:, self.split :]
    s, t = self._scale_shift(u1)
    return torch.cat([u1, u2 * torch.exp(s) + t], dim=1)[:, torch.argsort(permutation)]


def train_alone_gathered(fitted, xs, ys):
    """One network trained as train_networks did before: alone, a plain loop, gathered coupling halves,
    the for-loop Adam. Returns the module in float64 (as NeuralMap keeps it)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(fitted.seed)
        module = fitted._build(xs, ys)
    generator = torch.Generator().manual_seed(fitted.seed)
    xt, yt = torch.from_numpy(xs.astype(np.float32)), torch.from_numpy(ys.astype(np.float32))
    groups: dict[float, list] = {}
    for name, param in module.named_parameters():
        groups.setdefault(fitted._learning_rate_factor(name), []).append(param)
    optimizer = torch.optim.Adam([{"params": p, "lr": fitted.learning_rate * f} for f, p in groups.items()])
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: learning_rate_factor(fitted.schedule, s, fitted.steps))
    n, batch = len(xt), min(fitted.batch_size, len(xt))
    order, position = torch.randperm(n, generator=generator), 0
    with mock.patch.object(AffineCoupling, "forward", gathered_forward):
        for _ in range(fitted.steps):
            if position + batch > n:
                order, position = torch.randperm(n, generator=generator), 0
            rows = order[position:position + batch]
            position += batch
            loss = torch.mean((module(xt[rows]) - yt[rows]) ** 2)
            loss.backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
    return module.double().eval()


def fit_alone_gathered(fitted, x, y):
    """NeuralMap.fit as it was: one network (INN input whitened as now), trained by train_alone_gathered."""
    xs, ys = fitted._prepare(x, y)
    if isinstance(fitted, INNMap):
        fitted.whitening_, fitted.unwhitening_ = shrunk_whitening(xs)
        xs = xs @ fitted.whitening_
        n, d = xs.shape  # the linear layer's least-squares start, solved for every map as _build did
        fitted.linear_start_ = np.linalg.solve(xs.T @ xs / n + 1e-2 * np.eye(d), xs.T @ ys / n)
    fitted.module_, fitted.dims_ = train_alone_gathered(fitted, xs, ys), (x.shape[1], y.shape[1])
    return fitted


def canonical_directions_before(xs, ys):
    """linear.canonical_directions as it was: two thin SVDs and the canonical pairs, for every fit."""
    q_x, s_x, r_x = thin_svd(xs)
    q_y, s_y, r_y = thin_svd(ys)
    a, rho, bt = canonical_pairs(q_x, q_y)
    return (r_x / s_x) @ a, (r_y / s_y) @ bt.T, rho


def fit_linear_alone(fitted, x, y):
    """The linear maps' fits as they were (default options): each map decomposed its own rows, and SVCCA
    took five SVDs (each side's principal directions, then CCA of the reduced rows)."""
    xs, ys = fitted._prepare(x, y)
    if fitted.name == "linear":
        fitted.matrix_ = np.linalg.lstsq(xs, ys, rcond=None)[0]
    elif fitted.name == "svcca":
        p_x, p_y = (thin_svd(a)[2][:, :variance_rank(thin_svd(a)[1], fitted.variance_threshold)]
                    for a in (xs, ys))
        w_x, w_y, _ = canonical_directions_before(xs @ p_x, ys @ p_y)
        fitted.matrix_ = p_x @ w_x @ ((ys @ p_y @ w_y).T @ (ys @ p_y)) @ p_y.T
    else:  # cca, pwcca
        w_x, w_y, _ = canonical_directions_before(xs, ys)
        fitted.matrix_ = w_x @ ((ys @ w_y).T @ ys)
        if fitted.name == "pwcca":  # its projection weights, as before: only their time matters here
            np.abs((xs @ w_x).T @ xs).sum(axis=1)
    fitted.dims_ = (x.shape[1], y.shape[1])
    return fitted


def fit_and_score_one_at_a_time(maps, xs, ys, train_idx, test_idx, train_errors=True):
    """experiments._fit_and_score_all as it was: every map fitted alone, NumPy's BLAS threads left as they are,
    the training rows' errors computed whether used or not."""
    scores = []
    for fitted, x, y in zip(maps, xs, ys):
        fit = fit_alone_gathered if isinstance(fitted, NeuralMap) else fit_linear_alone
        fit(fitted, x[train_idx], y[train_idx])
        y_hat_test, y_test = fitted.transform(x[test_idx]), y[test_idx]
        y_hat_train, y_train = fitted.transform(x[train_idx]), y[train_idx]
        scores.append({"mse": mse(y_hat_test, y_test), "relative_error": relative_error(y_hat_test, y_test),
                       "train_mse": mse(y_hat_train, y_train),
                       "train_relative_error": relative_error(y_hat_train, y_train)})
    return scores


@contextlib.contextmanager
def before():
    with mock.patch.object(experiments, "_fit_and_score_all", fit_and_score_one_at_a_time), \
            mock.patch.object(NeuralMap, "transform", AlignmentMap.transform):
        yield


@torch.inference_mode()
def injected_score_before(model, spec, encoded, tokenizer, vectors, batch_size, device):
    with inject_first_token(model, torch.from_numpy(vectors)):
        return primary_score(spec, predict_in_table_order(model, encoded, tokenizer, batch_size, device),
                             encoded.labels)


# --- the measurements ---

def quickstart_task(folder: Path, examples: int):
    spec = get_task("synth-negation")
    torch.manual_seed(0)
    model = load_task_model(folder, spec).eval()
    tokenizer = load_tokenizer(folder)
    encoded = encode_task(generated_table(spec, "validation", examples, seed=0), spec, tokenizer, 64)
    return spec, model, tokenizer, encoded


def bench_truncate_skip(folder: Path, examples: int, device) -> dict:
    spec, model, tokenizer, encoded = quickstart_task(folder, examples)
    old_s, old = timed(lambda: truncate_skip_before(model, spec, encoded, tokenizer, 32, device))
    new_s, new = timed(lambda: truncate_skip_now(model, spec, encoded, tokenizer, 32, device))
    differences = [abs(a - b) for a, b in zip(old[1], new[1])] + [abs(old[3][s] - new[3][s]) for s in old[3]]
    return {"before_s": old_s, "now_s": new_s, "speedup": old_s / new_s, "largest_score_difference": max(differences),
            "passes_before": 2 + (num_layers(model) + 1) + len(all_spans(num_layers(model)))}


def bench_inn_step(steps: int, device) -> dict:
    rng = np.random.default_rng(0)
    n, d, layers = 2000, 768, 13
    x = rng.standard_normal((n, d))
    ys = [np.tanh(x @ rng.standard_normal((d, d)) / np.sqrt(d)) for _ in range(layers)]
    options = dict(depth=4, hidden=256, steps=steps, batch_size=256, device=str(device))
    warm = {**options, "steps": 3}  # first calls pay for allocations and thread start-up: not timed
    fit_alone_gathered(make_map("inn", **warm), x, ys[0])
    fit_maps([make_map("inn", **warm) for _ in ys], [(x, y) for y in ys])
    old_s = new_s = together_s = np.inf
    for _ in range(2):  # alternating rounds, the faster of each kept (a shared machine's noise only adds time)
        old_s = min(old_s, timed(lambda: fit_alone_gathered(make_map("inn", **options), x, ys[0]))[0])
        new_s = min(new_s, timed(lambda: make_map("inn", **options).fit(x, ys[0]))[0])
        together_s = min(together_s, timed(lambda: fit_maps([make_map("inn", **options) for _ in ys],
                                                            [(x, y) for y in ys]))[0])
    return {"steps": steps, "before_s_per_step": old_s / steps, "now_s_per_step": new_s / steps,
            "together_s_per_step_per_network": together_s / steps / layers, "speedup_one": old_s / new_s,
            "speedup_per_network_together": old_s / (together_s / layers)}


def matrix_products_seconds(kind: str, width: int, hidden: int, depth: int, networks: int, steps: int,
                            batch: int = 256) -> float:
    """Seconds for `steps` training steps of `networks` stacked networks with only the matrix products of `kind`'s
    layers (the adds that chain them kept, every activation, coupling, scheduler and Adam left out): a floor no
    float32 implementation of the same arithmetic goes below on this CPU."""
    torch.manual_seed(0)
    param = lambda rows, cols: (0.05 * torch.randn(networks, rows, cols)).requires_grad_()
    if kind == "inn":  # the dense linear layer, then per coupling block half the width -> hidden -> width
        first, blocks = (param(width, width), param(1, width)), [
            (param(width // 2, hidden), param(1, hidden), param(hidden, width), param(1, width)) for _ in range(depth)]
    else:  # mlp: width -> hidden (-> hidden) x (depth - 1) -> width
        sizes = [width] + [hidden] * depth + [width]
        first, blocks = None, [(param(a, b), param(1, b)) for a, b in zip(sizes, sizes[1:])]
    x, y = torch.randn(networks, batch, width), torch.randn(networks, batch, width)

    def forward():
        if kind == "mlp":
            out = x
            for weight, bias in blocks:
                out = torch.baddbmm(bias, out, weight)
            return out
        out = torch.baddbmm(first[1], x, first[0])
        for w1, b1, w2, b2 in blocks:
            out = out + torch.baddbmm(b2, torch.baddbmm(b1, out[..., : width // 2], w1), w2)
        return out

    def step():
        ((forward() - y) ** 2).mean(dim=(1, 2)).sum().backward()

    step()  # the first call pays for allocations: not timed
    return timed(lambda: [step() for _ in range(steps)])[0]


def bench_align(folder: Path, examples: int, device) -> dict:
    rng = np.random.default_rng(0)
    n_train, n_test, d, layers = 1000, 300, 384, 7
    base = [rng.standard_normal((n_train + n_test, d)) for _ in range(layers)]
    runs = {name: [b + 0.5 * rng.standard_normal(b.shape) for b in base] for name in ("ORIG", "FT1", "FT2")}
    train_idx, test_idx = np.arange(n_train), np.arange(n_train, n_train + n_test)
    network = {"steps": 100, "learning_rate": 1e-3, "batch_size": 256, "seed": 0, "device": str(device)}
    options = {"inn": {"depth": 4, "hidden": 128, **network}, "mlp": {"depth": 2, "hidden": 256, **network}}
    methods, pairs, matrix_steps = ("linear", "cca", "svcca", "pwcca", "inn", "mlp"), (("FT1", "FT2"), ("ORIG", "FT1")), 20

    def experiments_run(names=methods):
        errors = [experiments.alignment_errors(runs[source], runs[target], names, train_idx, test_idx,
                                               **{name: options[name] for name in names if name in options})
                  for source, target in pairs]
        matrix = None if "inn" not in names else experiments.layer_alignment_matrix(
            runs["FT1"], runs["FT2"], "inn", train_idx=train_idx, test_idx=test_idx,
            **{**options["inn"], "steps": matrix_steps})
        by_method = {name: np.array([[row["mse"], row["relative_error"]] for rows in errors for row in rows
                                     if row["method"] == name]) for name in names}
        return by_method, matrix

    def largest_relative_difference(names):
        return max(float(np.abs(old_errors[name] / new_errors[name] - 1).max()) for name in names)

    old_s = new_s = np.inf
    for _ in range(2):  # alternating rounds, the faster of each kept (a shared machine's noise only adds time)
        with before():
            seconds, (old_errors, old_matrix) = timed(experiments_run)
        old_s = min(old_s, seconds)
        seconds, (new_errors, new_matrix) = timed(experiments_run)
        new_s = min(new_s, seconds)
    spec, model, tokenizer, encoded = quickstart_task(folder, examples)
    vectors = [rng.standard_normal((len(encoded), model.config.hidden_size)).astype(np.float32) for _ in range(8)]
    old_inject, old_scores = timed(lambda: [injected_score_before(model, spec, encoded, tokenizer, v, 32, device)
                                            for v in vectors])
    new_inject, new_scores = timed(lambda: [injected_score(model, spec, encoded, v, 32, device) for v in vectors])
    # The ceiling: before's time over a floor made of today's linear maps and injection (SVD- and head-bound) and
    # the neural fits' matrix products alone.
    linear_s = timed(lambda: experiments_run(methods[:4]))[0]
    products_s = (len(pairs) * (matrix_products_seconds("inn", d, 128, 4, layers, network["steps"])
                                + matrix_products_seconds("mlp", d, 256, 2, layers, network["steps"]))
                  + layers * matrix_products_seconds("inn", d, 128, 4, layers, matrix_steps))
    floor_s = linear_s + products_s + new_inject
    return {"before_s": old_s + old_inject, "now_s": new_s + new_inject,
            "speedup": (old_s + old_inject) / (new_s + new_inject),
            "experiments_speedup": old_s / new_s, "injection_speedup": old_inject / new_inject,
            "floor_s": floor_s, "neural_matrix_products_s": products_s, "linear_maps_s": linear_s,
            "ceiling": (old_s + old_inject) / floor_s,
            "linear_errors_largest_relative_difference": largest_relative_difference(methods[:4]),
            "neural_errors_largest_relative_difference": largest_relative_difference(methods[4:]),
            "matrix_largest_difference": float(np.abs(old_matrix - new_matrix).max()),
            "injection_scores_equal": old_scores == new_scores}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("truncate_skip", "inn_step", "align"), nargs="*")
    parser.add_argument("--steps", type=int, default=600, help="INN steps of inn_step (the align default)")
    parser.add_argument("--examples", type=int, default=300, help="validation examples (the quickstart's)")
    parser.add_argument("--quick", action="store_true", help="50 INN steps, 100 examples")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's own choice)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, … (layersim.compute.device)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    steps, examples = (50, 100) if args.quick else (args.steps, args.examples)
    device = resolve_device(args.device)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {device}"
          + ("" if torch.cuda.is_available() else " (no GPU on this machine)"))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "minilm-l6"
        snapshot_model("minilm-l6", folder)
        benches = {"truncate_skip": lambda: bench_truncate_skip(folder, examples, device),
                   "inn_step": lambda: bench_inn_step(steps, device),
                   "align": lambda: bench_align(folder, examples, device)}
        for name in args.only or benches:
            result = benches[name]()
            shown = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in result.items())
            print(f"{name}: {shown}", flush=True)


if __name__ == "__main__":
    main()
