"""Why rank similarity's bootstrap resamples sit above its estimate (docs/reading-the-numbers.md, "Interval coverage").

For ``--samples`` samples of each design, the sample's value and its mean over ``--resamples`` bootstrap resamples
(the stage's: copies and a cluster's other draws left out of a row's neighbours,
:class:`layersim.similarity.neighbours.Copies`) of rank similarity (k = 10) and, on the shared-premise design, of two
plain summaries of where a row's premise-mates fall in its cosine neighbour list in x: the share of rows whose nearest
neighbour is a premise-mate (``first``, a rank weight at its most convex: 1/rank is 1 at rank 1, 1/2 at rank 2) and the
share with a premise-mate among its k nearest (``among k``, membership, linear in the rows ahead). ``predicted first``
is the resamples' first-place share foretold by the sample alone: a row's mate is first in a resample when none of the
c other premises with a row ahead of it is drawn by the other 99 draws, probability (1 − c/100)^99 ≈ e^(−c), where the
sample has it first only at c = 0. Designs: ``premises`` (benchmarks/calibration.py's 100 premises × 3 hypotheses,
premise sd 1, y = 0.5·x·A + b_p + f, premises resampled whole) and ``review`` (benchmarks/bootstrap.py's population,
n = 200, rows resampled one by one).

    python benchmarks/rank_bias.py --samples 8 --resamples 40
"""

from __future__ import annotations

import argparse

import numpy as np
from bootstrap import population  # benchmarks/bootstrap.py (run as a script)
from calibration import PREMISES, WIDTH, shared_premise  # benchmarks/calibration.py

from layersim.similarity.inference.bootstrap import resample_rows, resampled_options
from layersim.similarity.knn_measures import neighbourhood, rank_similarity

K = 10


def summaries(x, y, premise, sources=None, draws=None) -> dict[str, float]:
    """Rank similarity and, with ``premise``, the premise-mates' first-place and among-k shares in x."""
    out = {"rank similarity": rank_similarity(x, y, k=K, sources=sources, draws=draws)}
    if premise is not None:
        mates = premise[neighbourhood("x", x, K, sources, draws=draws).nearest] == premise[:, None]
        out |= {"first": float(mates[:, 0].mean()), "among k": float(mates.any(axis=1).mean())}
    return out


def predicted_first(x: np.ndarray, premise: np.ndarray) -> float:
    """The resamples' expected first-place share from the sample: every premise with a row ahead of the row's
    nearest mate left undrawn by the PREMISES − 1 draws besides the row's own."""
    units = x / np.linalg.norm(x, axis=1, keepdims=True)
    cos = units @ units.T
    shares = []
    for r in range(len(x)):
        own = premise == premise[r]
        best = cos[r, own & (np.arange(len(x)) != r)].max()
        ahead = len(np.unique(premise[(cos[r] > best) & ~own]))
        shares.append((1 - ahead / PREMISES) ** (PREMISES - 1))
    return float(np.mean(shares))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--resamples", type=int, default=40)
    args = parser.parse_args()
    mixing = np.random.default_rng(7).normal(size=(WIDTH, WIDTH)) / np.sqrt(WIDTH)
    px, py = population(200_000)
    rng = {"premises": np.random.default_rng(65), "review": np.random.default_rng(1)}
    print("| design | summary | sample (mean) | resamples (mean) | resamples − sample |\n|---|---|---|---|---|")
    for design in ("premises", "review"):
        sample, resampled, predicted = [], [], []
        for s in range(args.samples):
            if design == "premises":
                x, y, premise = shared_premise(rng[design], 1.0, signal=0.5, mixing=mixing)
                groups = premise
                predicted.append(predicted_first(x, premise))
            else:
                rows = rng[design].choice(len(px), 200, replace=False)
                x, y, premise, groups = px[rows], py[rows], None, None
            sample.append(summaries(x, y, premise))
            drawn = []
            for rows in resample_rows(len(x), args.resamples, s, groups):
                options = resampled_options("rank_similarity", {}, rows, groups)
                drawn.append(summaries(x[rows], y[rows], None if premise is None else premise[rows],
                                       options["sources"], options.get("draws")))
            resampled.append({key: np.mean([d[key] for d in drawn]) for key in drawn[0]})
        for key in sample[0]:
            before, after = np.mean([d[key] for d in sample]), np.mean([d[key] for d in resampled])
            print(f"| {design} | {key} | {before:.4f} | {after:.4f} | {after - before:+.4f} |")
        if predicted:
            print(f"| {design} | predicted first | | {np.mean(predicted):.4f} | |", flush=True)


if __name__ == "__main__":
    main()
