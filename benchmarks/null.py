"""The cost of a permutation null next to the similarity matrix it belongs to.

For each measure: ``similarity_matrix(name, layers)`` (13 layers against themselves) and
``permutation_matrix(name, layers)`` (ys=None, every cell) on the same float32 layers, and their ratio.
linear_cka uses its exact RV moments (goal: null ≤ 1.5x the matrix); every other measure samples
``--permutations`` permutations (100 by default). A sampled null costs about ``permutations`` times the
per-pair work of the matrix (the per-layer statistics are computed once), so for slow measures
``--timed N`` runs 1 and 1 + N permutations and extrapolates linearly to ``--permutations``; the
table marks such rows "scaled".

Measured on the shared 2-core dev machine (other jobs running; ratios ±30%): linear_cka exact at
n = 20,000, d = 768, 13 x 13: matrix 24.4 s, null 25.4 s, **1.04x** — before the null took the exact skewness,
whose two cubic Gram invariants cost n²·d per layer: 13 x 768, +1.4 s at n = 2,000 (matrix 1.6 s) and +4.5 s at
n = 4,000 (matrix 2.6 s), growing as n² (about +110 s at n = 20,000, not yet re-measured on a quiet machine). At n = 5,000, d = 256, 100
permutations (scaled from 1 and 4): per permutation 1.2–2.7 s against a matrix of 0.9–6.5 s, i.e.
debiased_cka 85x, mean_cca 49x, mixedsim 41x, neuronsim 136x, pwcca 48x, rbf_cka 11x, svcca 92x
(the sampled nulls run in float64 over all ordered pairs; the matrices use float32 and symmetry).

    python benchmarks/null.py                                    # n = 20,000, d = 768, 13 layers, all measures
    python benchmarks/null.py --measures linear_cka              # the exact null only
    python benchmarks/null.py --n 2000 --d 256 --timed 5 --measures svcca pwcca

``--rotation``: the similarity stage's null when the tables are streamed (larger than memory), at Phang et al.'s
configuration — ORIG, FT[1], FT[2] × ``--layers`` layers, the 676 cells their comparisons report — from one pass
of moments over ``--n`` rows (the rotation null's cost does not grow with n, but for the layers' ranks): the
measure's stacked matrix and its rotation null (``--permutations`` draws), each timed.

    python benchmarks/null.py --rotation --n 3000 --measures svcca pwcca neuronsim
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from layersim.similarity import MEASURES, permutation_matrix, similarity_matrix


def make_layers(n: int, d: int, layers: int, seed: int = 0) -> list[np.ndarray]:
    """Float32 layers like a residual stream: each one the previous plus fresh noise."""
    rng = np.random.default_rng(seed)
    out, h = [], rng.normal(size=(n, d)).astype(np.float32)
    for _ in range(layers):
        h = h + 0.7 * rng.normal(size=(n, d)).astype(np.float32)
        out.append(h.copy())
    return out


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=20_000, help="examples (rows)")
    parser.add_argument("--d", type=int, default=768, help="neurons per layer")
    parser.add_argument("--layers", type=int, default=13)
    parser.add_argument("--permutations", type=int, default=100, help="sampled permutations (not linear_cka)")
    parser.add_argument("--timed", type=int, default=None,
                        help="run only 1 and 1 + TIMED permutations and extrapolate (default: run them all)")
    parser.add_argument("--measures", nargs="+", default=sorted(MEASURES), choices=sorted(MEASURES))
    parser.add_argument("--rotation", action="store_true",
                        help="instead: the streamed route's rotation null at Phang's configuration (3 models)")
    args = parser.parse_args()
    if args.rotation:
        rotation(args)
        return

    layers = make_layers(args.n, args.d, args.layers)
    print(f"n = {args.n}, d = {args.d}, {args.layers} x {args.layers} (ys=None), float32 layers; "
          f"{args.permutations} permutations for sampled nulls")
    print(f"{'measure':<14}{'method':<13}{'matrix s':>10}{'null s':>11}{'ratio':>9}  note")
    for name in args.measures:
        t_matrix, _ = timed(lambda: similarity_matrix(name, layers))
        if name == "linear_cka":
            t_null, result = timed(lambda: permutation_matrix(name, layers))
            note = ""
        elif args.timed is None or args.timed + 1 >= args.permutations:
            t_null, result = timed(lambda: permutation_matrix(name, layers, permutations=args.permutations))
            note = ""
        else:
            t_one, _ = timed(lambda: permutation_matrix(name, layers, permutations=1))
            t_more, result = timed(lambda: permutation_matrix(name, layers, permutations=1 + args.timed))
            per_permutation = max(t_more - t_one, 0.0) / args.timed
            t_null = t_one + (args.permutations - 1) * per_permutation
            note = f"scaled from 1 and {1 + args.timed} permutations ({per_permutation:.3g} s each)"
        off = np.triu_indices(args.layers, 1)
        note = (note + "; " if note else "") + (
            f"mean null {np.nanmean(result.null_mean[off]):.3f}, mean observed {np.nanmean(result.observed[off]):.3f}")
        print(f"{name:<14}{result.method:<13}{t_matrix:>10.2f}{t_null:>11.2f}{t_null / t_matrix:>8.2f}x  {note}",
              flush=True)


def rotation(args) -> None:
    from layersim.similarity.comparisons import (moments_stacked_matrix, moments_stacked_null, phang_cells,
                                                 streamed_moments)
    from layersim.similarity import MOMENT_MEASURES, LayerMoments

    models = {label: make_layers(args.n, args.d, args.layers, seed)
              for seed, label in enumerate(("ORIG", "FT[1]", "FT[2]"))}
    t_pass, sums = timed(lambda: streamed_moments([list(models.values())]))
    cells = phang_cells({label: args.layers for label in models}, "ORIG", ["FT[1]", "FT[2]"])
    print(f"n = {args.n}, d = {args.d}, 3 models x {args.layers} layers, {int(cells.sum())} cells; one pass of "
          f"moments {t_pass:.1f} s; rotation null with {args.permutations} draws")
    print(f"{'measure':<14}{'matrix s':>10}{'null s':>10}{'per draw s':>12}  p-values")
    options = {"svcca": {"variance_threshold": 0.99}, "pwcca": {"variance_threshold": 0.99}}
    for name in [m for m in args.measures if m in MOMENT_MEASURES]:
        bases = LayerMoments(sums)  # shared by the matrix and its null, as in the stage
        t_matrix, matrix = timed(lambda: moments_stacked_matrix(name, sums, moments=bases, **options.get(name, {})))
        t_null, null = timed(lambda: moments_stacked_null(name, sums, cells, permutations=args.permutations, seed=0,
                                                          observed=matrix, moments=bases, **options.get(name, {})))
        print(f"{name:<14}{t_matrix:>10.1f}{t_null:>10.1f}{t_null / args.permutations:>12.2f}  "
              f"{np.nanmin(null.p_value):.3f}–{np.nanmax(null.p_value):.3f}", flush=True)


if __name__ == "__main__":
    main()
