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
from layersim.similarity.inference.bootstrap import bootstrap_pairs, finish
from layersim.similarity.inference.bootstrap_matrix import bootstrap_matrix
from layersim.similarity._cca_core import CAPPED_MEASURES, dimension_cap

WIDTH = 64
# Where the measure on the whole population is out of reach, the population is a subsample of this many rows:
# RBF CKA's exact kernels (Nyström above 10,000 rows), RSA's RDMs (n² pairs), k-NN's n² distances, the n × n
# distance matrices of distance correlation and the RSM norm.
NEIGHBOURHOOD = ("knn_jaccard", "mutual_knn", "cknna", "second_order_cosine", "rank_similarity")
POPULATION_ROWS = {"rbf_cka": 5_000, "rsa": 3_000, "distance_correlation": 5_000, "rsm_norm": 5_000,
                   **{name: 20_000 for name in NEIGHBOURHOOD}}
# Rank similarity weighs a shared neighbour by its ranks (1/((1 + |r_x − r_y|)(r_x + r_y))), which do not scale with
# the rows as a neighbourhood's share does: its population value is its mean over this many fresh samples of n rows,
# the value at its k on n examples that another draw would give on average.
SAMPLE_MEAN_SAMPLES = {"rank_similarity": 1_000}


def population(rows: int, seed: int = 0, design: str = "review") -> tuple[np.ndarray, np.ndarray]:
    """``review``: X 64 wide with a 1/k variance spectrum, Y = X·A + 0.3·noise (the statistics review's);
    ``knn``: X 20 wide, Y = X + 1.5·noise (the 2026-11-27 review's §3 k-NN check); ``independent``: X and Y
    30 wide, independent (§3's RSA check, population value 0 for every centred measure)."""
    rng = np.random.default_rng(seed)
    if design == "knn":
        x = rng.normal(size=(rows, 20))
        return x, x + 1.5 * rng.normal(size=(rows, 20))
    if design == "independent":
        return rng.normal(size=(rows, 30)), rng.normal(size=(rows, 30))
    x = rng.normal(size=(rows, WIDTH)) / np.sqrt(np.arange(1, WIDTH + 1))
    mixing = rng.normal(size=(WIDTH, WIDTH)) / np.sqrt(WIDTH)
    return x, x @ mixing + 0.3 * rng.normal(size=(rows, WIDTH))


# (label, design, n, repeats): every measure at its default options on the review's population, linear CKA
# with 1,000 repeats (§13), k-NN Jaccard and RSA also on §3's designs; small n where a resample is costly.
CASES = [("linear_cka", "review", 300, 1000), ("rbf_cka", "review", 300, 200), ("debiased_cka", "review", 300, 200),
         ("svcca", "review", 300, 200), ("pwcca", "review", 300, 200), ("mean_cca", "review", 300, 200),
         ("neuronsim", "review", 300, 200), ("mixedsim", "review", 300, 200), ("procrustes", "review", 300, 200),
         ("shape_metric", "review", 300, 200), ("rsa", "review", 150, 200), ("rsa", "independent", 150, 200),
         ("knn_jaccard", "knn", 200, 200), ("knn_jaccard", "review", 200, 200),
         # ReSi's measures and the platonic-representation work's (issue 65): n = 200 where the measure holds n × n
         # distances or neighbour lists (as k-NN Jaccard), 300 otherwise.
         *[(name, "review", 200, 200) for name in ("mutual_knn", "cknna", "rank_similarity", "second_order_cosine",
                                                   "distance_correlation", "rsm_norm")],
         *[(name, "review", 300, 200) for name in ("linear_regression", "size_and_shape", "aligned_cosine",
                                                   "hard_correlation_match", "soft_correlation_match", "gulp",
                                                   "eigenspace_overlap")]]


def measure_options(label: str, n: int) -> tuple[str, dict]:
    """The measure and the options its population value takes: a CCA measure's cap pinned at ⌊(n − 1)/10⌋
    (what "auto" is on n rows, and what the bootstrap pins), unless fixed by the label (``svcca@20``)."""
    name, _, cap = label.partition("@")
    if cap:
        return name, {"max_dims": int(cap)}
    return name, ({"max_dims": dimension_cap(n)} if name in CAPPED_MEASURES else {})


def population_value(name: str, options: dict, px: np.ndarray, py: np.ndarray, n: int) -> float:
    """The measure on the population (or :data:`POPULATION_ROWS` of it). A neighbourhood measure with k = 10 is a
    neighbourhood of 10/(n − 1) of the other examples; on N rows the same share is k·(N − 1)/(n − 1). Rank
    similarity: its :func:`sample_mean` over samples of n rows of the population."""
    if name in SAMPLE_MEAN_SAMPLES:
        def draw(rng):
            pick = rng.choice(len(px), n, replace=False)
            return px[pick], py[pick]
        return sample_mean(name, options, draw, SAMPLE_MEAN_SAMPLES[name])
    rows = POPULATION_ROWS.get(name, len(px))
    if name in NEIGHBOURHOOD:
        options = {**options, "k": round(10 * (rows - 1) / (n - 1))}
    return similarity(name, px[:rows], py[:rows], **options)


def sample_mean(name: str, options: dict, draw, samples: int) -> float:
    """The measure's mean over ``samples`` fresh samples ``draw(rng) -> (x, y)`` (a stream of its own): the value
    another sample of the same size gives on average, the target where the measure has no large-sample limit."""
    rng = np.random.default_rng(2)
    return float(np.mean([similarity(name, *draw(rng), **options) for _ in range(samples)]))


def coverage(args) -> None:
    print("| measure | design | n | repeats | population | mean estimate | method | coverage ± SE | below / above "
          "| mean width | excludes its estimate |\n|---|---|---|---|---|---|---|---|---|---|---|")
    cases = [c for c in CASES if c[0] in args.measures and (args.design is None or c[1] == args.design)] + [(m, "review", 300, 100) for m in args.measures
                                                              if m not in {c[0] for c in CASES}]
    for label, design, n_case, repeats in cases:
        px, py = population(args.population, design=design)
        rng = np.random.default_rng(1)
        for n in args.n_coverage or [n_case]:
            name, options = measure_options(label, n)
            truth = population_value(name, options, px, py, n)
            rows = {m: [] for m in args.methods}
            first = "bca" if "bca" in rows else "basic"  # BCa's jackknife only where BCa is asked for
            estimates = []
            total = args.repeats or repeats
            for done in range(1, total + 1):
                pick = rng.choice(len(px), n, replace=False)
                seed = int(rng.integers(1 << 30))
                drawn = bootstrap_pairs(name, [px[pick]], [py[pick]], resamples=args.resamples, seed=seed,
                                        interval=first, **({} if "@" not in label else options))
                estimates.append(drawn.estimate[0])
                for method in rows:
                    r = drawn if method == first else finish(name, drawn.estimate, drawn.values, None, 0.95, method)
                    rows[method].append((r.low[0], r.high[0], r.estimate[0]))
                if done == total or done % args.report_every == 0:  # a tally so far (a run cut short keeps it)
                    for method, got in rows.items():
                        low, high, est = np.array(got).T
                        covered = np.mean((low <= truth) & (truth <= high))
                        print(f"| {label} | {design} | {n:,} | {len(low)} | {truth:.4f} | {np.mean(estimates):.4f} | "
                              f"{method} | {covered:.3f} ± {np.sqrt(covered * (1 - covered) / len(low)):.3f} | "
                              f"{np.mean(truth < low):.3f} / {np.mean(truth > high):.3f} | "
                              f"{np.mean(high - low):.3f} | {np.mean((est < low) | (est > high)):.3f} |", flush=True)


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
    parser.add_argument("--measures", nargs="+", default=list(dict.fromkeys(c[0] for c in CASES)),
                        help="measures (svcca@20: a fixed cap) for --coverage; each runs its CASES")
    parser.add_argument("--methods", nargs="+", default=["basic", "percentile", "bca"],
                        choices=["basic", "percentile", "bca"], help="interval methods for --coverage")
    parser.add_argument("--design", choices=["review", "knn", "independent"], default=None,
                        help="only the CASES on this population (default: all of the measures')")
    parser.add_argument("--report-every", type=int, default=50, help="with --coverage: print the tally so far "
                        "every this many repeats")
    parser.add_argument("--n-coverage", type=int, nargs="+", default=None, help="rows per sample (default: CASES')")
    parser.add_argument("--population", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=None, help="samples per case (default: CASES')")
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
