"""Calibration of the nulls: the false-positive rate of each measure's null on independent data.

For each measure, regime n × d (n < d: 40 × 100, n ≈ d: 60 × 55, n > d: 150 × 15) and distribution
(Gaussian, Student t with 3 degrees of freedom), ``--draws`` independent pairs x, y (n × d each): the share
of p-values ≤ 0.05 and ≤ 0.01 (expected: 0.05 and 0.01; binomial SE ``sqrt(α(1−α)/draws)``) for

* **memory**: ``permutation_test`` — linear CKA's exact moments (Pearson III with the exact mean, variance
  and skewness), ``--permutations`` sampled permutations for the other measures;
* **streamed**: the moments route of a table too large for memory (``LayerMoments`` / ``rotation_null``,
  ``streamed_linear_cka_null``) with its row sample cut to ``--sample-share`` of the rows (default 0.5, so
  the route is the one a 50,000-row table takes: rotations, neuronsim's tails from the sample, linear CKA's
  skewness estimated from the sample). With the default 1,024-row sample these small tables would be
  permuted exactly (= memory).

mixedsim needs more examples than neurons and is skipped where n ≤ d. ``--quick``: 100 draws (α = .01 is then
±0.01).

    python benchmarks/calibration.py --quick        # ~2 min on 2 cores
    python benchmarks/calibration.py                # 400 draws, 99 permutations
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from layersim.similarity import (LayerMoments, LinearCKAAccumulator, permutation_test, rotation_null,
                                 streamed_linear_cka_null)

REGIMES = [(40, 100), (60, 55), (150, 15)]
MEASURES = ["linear_cka", "svcca", "pwcca", "mean_cca", "neuronsim", "mixedsim"]


def _options(name: str) -> dict:
    return {"variance_threshold": 0.99} if name == "svcca" else {}


def _streamed(name: str, x, y, draws: int, seed: int, sample_rows: int) -> float:
    acc = LinearCKAAccumulator(precision="float64", sample_rows=sample_rows, seed=seed)
    acc.update([x, y])
    if name == "linear_cka":
        return float(streamed_linear_cka_null(acc).p_value[0, 1])
    null = rotation_null(name, LayerMoments(acc), [0], [1], draws=draws, seed=seed, **_options(name))
    return float(null.p_value[0, 0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--draws", type=int, default=None)
    parser.add_argument("--permutations", type=int, default=None)
    parser.add_argument("--sample-share", type=float, default=0.5)
    parser.add_argument("--measures", nargs="+", default=MEASURES, choices=MEASURES)
    args = parser.parse_args()
    draws = args.draws or (100 if args.quick else 400)
    permutations = args.permutations or 99
    print(f"{draws} draws per cell, {permutations} permutations / rotations; "
          f"streamed sample {args.sample_share:.0%} of the rows")
    print("| measure | data | n × d | memory α=.05 | memory α=.01 | streamed α=.05 | streamed α=.01 | s |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.measures:
        for dist in ("gaussian", "t3"):
            for n, d in REGIMES:
                if name == "mixedsim" and n <= d:
                    continue
                start = time.perf_counter()
                rng = np.random.default_rng(1000 * n + d)
                memory, streamed = [], []
                for k in range(draws):
                    x, y = ((rng.standard_t(3, size=(n, d)), rng.standard_t(3, size=(n, d))) if dist == "t3"
                            else (rng.normal(size=(n, d)), rng.normal(size=(n, d))))
                    memory.append(permutation_test(name, x, y, permutations=permutations, seed=k,
                                                   **_options(name)).p_value)
                    streamed.append(_streamed(name, x, y, permutations, k, int(args.sample_share * n)))
                memory, streamed = np.array(memory), np.array(streamed)
                cells = [f"{np.mean(p <= a):.3f}" for p in (memory, streamed) for a in (0.05, 0.01)]
                print(f"| {name} | {dist} | {n} × {d} | " + " | ".join(cells)
                      + f" | {time.perf_counter() - start:.0f} |", flush=True)


if __name__ == "__main__":
    main()
