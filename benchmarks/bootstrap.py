"""Bootstrap intervals: their coverage, and the cost of a whole matrix's intervals.

``--coverage``: the statistics review's simulation (2026-11-25). A population of ``--population`` rows, X
64 wide Gaussian with a 1/k variance spectrum, Y = X·A + noise; ``--repeats`` samples of n rows, each with a
``--resamples`` bootstrap; for each measure, n and interval method: coverage of the population value, misses
below / above, mean width, and the share of intervals that exclude their own estimate. One set of resamples
per sample serves all three methods. SVCCA runs with a fixed cap (``svcca@20``: 20 dimensions per side, the
population's value with the same cap) and with the default cap ``⌊(n − 1)/10⌋`` (``svcca@auto``), whose
population value is the population's SVCCA with that same cap: the quantity the interval targets.

    python benchmarks/bootstrap.py --coverage                    # linear CKA, SVCCA@20, SVCCA@auto; n = 300, 1,000
    python benchmarks/bootstrap.py --coverage --repeats 40 --measures linear_cka

Cost (the default): ``bootstrap_matrix("linear_cka", layers)`` (13 layers, every cell) per resample, as a
multiple of one ``similarity_matrix``, and the old route (``bootstrap_pairs`` over all L² cells, the matrix
recomputed on the resampled rows) for comparison; ``--timed`` resamples each, after one warm-up call.

    python benchmarks/bootstrap.py --n 2000 20000 --d 384 768
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from null import make_layers  # benchmarks/null.py: run as `python benchmarks/bootstrap.py`

from layersim.similarity import similarity, similarity_matrix
from layersim.similarity.bootstrap import bootstrap_pairs, finish
from layersim.similarity.bootstrap_matrix import bootstrap_matrix
from layersim.similarity._cca_core import dimension_cap

WIDTH = 64


def population(rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, WIDTH)) / np.sqrt(np.arange(1, WIDTH + 1))
    mixing = rng.normal(size=(WIDTH, WIDTH)) / np.sqrt(WIDTH)
    return x, x @ mixing + 0.3 * rng.normal(size=(rows, WIDTH))


def measure_options(label: str, n: int) -> tuple[str, dict]:
    if label == "svcca@20":
        return "svcca", {"max_dims": 20}
    if label == "svcca@auto":
        return "svcca", {"max_dims": dimension_cap(n)}  # what "auto" is on n rows (the bootstrap pins it)
    return label, {}


def coverage(args) -> None:
    px, py = population(args.population)
    rng = np.random.default_rng(1)
    print("| measure | n | population | mean estimate | method | coverage | below / above | mean width "
          "| excludes its estimate |\n|---|---|---|---|---|---|---|---|---|")
    for label in args.measures:
        for n in args.n_coverage:
            name, options = measure_options(label, n)
            truth = similarity(name, px, py, **options)
            rows = {m: [] for m in ("basic", "percentile", "bca")}
            estimates = []
            for _ in range(args.repeats):
                pick = rng.choice(len(px), n, replace=False)
                seed = int(rng.integers(1 << 30))
                bca = bootstrap_pairs(name, [px[pick]], [py[pick]], resamples=args.resamples, seed=seed,
                                      interval="bca", **({} if label == "svcca@auto" else options))
                estimates.append(bca.estimate[0])
                for method in rows:
                    r = bca if method == "bca" else finish(name, bca.estimate, bca.values, None, 0.95, method)
                    rows[method].append((r.low[0], r.high[0], r.estimate[0]))
            for method, got in rows.items():
                low, high, est = np.array(got).T
                print(f"| {label} | {n:,} | {truth:.4f} | {np.mean(estimates):.4f} | {method} | "
                      f"{np.mean((low <= truth) & (truth <= high)):.2f} | {np.mean(truth < low):.2f} / "
                      f"{np.mean(truth > high):.2f} | {np.mean(high - low):.3f} | "
                      f"{np.mean((est < low) | (est > high)):.2f} |", flush=True)


def cost(args) -> None:
    """Seconds per resample over seconds per matrix; the BCa jackknife adds JACKKNIFE_BLOCKS / resamples."""
    print("| n | layers × d | one matrix (s) | bootstrap_matrix per resample | × matrix | pairs route per resample "
          "| × matrix |\n|---|---|---|---|---|---|---|")
    for n in args.n:
        for d in args.d:
            layers = make_layers(n, d, args.layers)
            start = time.perf_counter()
            similarity_matrix("linear_cka", layers)
            matrix = time.perf_counter() - start
            timings = []
            for run in (lambda r: bootstrap_matrix("linear_cka", layers, resamples=r, interval="basic"),
                        lambda r: bootstrap_pairs("linear_cka", [a for a in layers for _ in layers],
                                                  [b for _ in layers for b in layers], resamples=r,
                                                  interval="basic")):
                start = time.perf_counter()
                run(2)  # the full-sample estimate and set-up, and two resamples
                short = time.perf_counter() - start
                start = time.perf_counter()
                run(2 + args.timed)
                timings.append((time.perf_counter() - start - short) / args.timed)
            print(f"| {n:,} | {args.layers} × {d} | {matrix:.2f} | {timings[0]:.3f} s | {timings[0] / matrix:.2f} | "
                  f"{timings[1]:.3f} s | {timings[1] / matrix:.2f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--coverage", action="store_true", help="the coverage simulation instead of the cost")
    parser.add_argument("--measures", nargs="+", default=["linear_cka", "svcca@20", "svcca@auto"])
    parser.add_argument("--n-coverage", type=int, nargs="+", default=[300, 1000])
    parser.add_argument("--population", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--resamples", type=int, default=200)
    parser.add_argument("--n", type=int, nargs="+", default=[2000, 20_000], help="rows, for the cost")
    parser.add_argument("--d", type=int, nargs="+", default=[384, 768], help="neurons per layer, for the cost")
    parser.add_argument("--layers", type=int, default=13)
    parser.add_argument("--timed", type=int, default=3, help="resamples timed (beyond two of warm-up)")
    args = parser.parse_args()
    if args.coverage:
        coverage(args)
    else:
        cost(args)


if __name__ == "__main__":
    main()
