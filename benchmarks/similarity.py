"""Layer × layer similarity matrices: the library's all-pairs functions vs a plain per-pair loop.

For each measure, times ``similarity_matrix(name, layers)`` (per-layer statistics computed once,
upper triangle only for symmetric measures) against a loop that calls the pair function on every
pair it needs — the L(L+1)/2 pairs of the upper triangle, diagonal included — recomputing
everything each time. Both run in the same process on the same synthetic layers, so the ratio is
what matters, not the absolute seconds; the max |difference| checks that they agree.

The layers are a chain like an encoder's: each is a noisy nonlinear map of the previous one, with a
decaying (power-law) variance spectrum so that SVCCA's 99 % cut keeps a realistic share of the
directions. Stored as float32, as activations are.

    python benchmarks/similarity.py            # n = 5,000 examples, 768 wide, 13 layers
    python benchmarks/similarity.py --quick    # n = 1,000, 128 wide, 5 layers
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np

from layersim.similarity import get_measure, similarity_matrix


def make_layers(num_examples: int, width: int, num_layers: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    spectrum = np.arange(1, width + 1, dtype=np.float64) ** -0.75
    layers = [(rng.normal(size=(num_examples, width)) * spectrum).astype(np.float32)]
    for _ in range(num_layers - 1):
        mix = rng.normal(size=(width, width)) / np.sqrt(width)
        nxt = np.tanh(3.0 * layers[-1] @ mix) + 0.3 * rng.normal(size=(num_examples, width)) * spectrum
        layers.append(nxt.astype(np.float32))
    return layers


def pair_loop(name: str, layers: list[np.ndarray]) -> np.ndarray:
    pair = get_measure(name).pair
    num = len(layers)
    out = np.empty((num, num))
    for i in range(num):
        for j in range(i, num):
            out[i, j] = out[j, i] = pair(layers[i], layers[j])
    return out


def timed(fn, *args):
    start = time.perf_counter()
    result = fn(*args)
    return result, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (1,000 x 128, 5 layers)")
    parser.add_argument("--examples", type=int, help="examples per layer (default 5000; quick 1000)")
    parser.add_argument("--width", type=int, help="neurons per layer (default 768; quick 128)")
    parser.add_argument("--layers", type=int, help="number of layers (default 13; quick 5)")
    parser.add_argument("--measures", nargs="+", default=["linear_cka", "svcca"],
                        help="symmetric measures to time (default: linear_cka svcca)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    n = args.examples or (1000 if args.quick else 5000)
    d = args.width or (128 if args.quick else 768)
    num_layers = args.layers or (5 if args.quick else 13)
    for name in args.measures:
        if not get_measure(name).symmetric:
            parser.error(f"{name} is asymmetric; the loop baseline here fills the upper triangle only")

    layers = make_layers(n, d, num_layers, args.seed)
    threads = os.environ.get("OMP_NUM_THREADS", "default")
    print(f"{num_layers} layers x {n} examples x {d} neurons (float32); {os.cpu_count()} CPUs, "
          f"OMP_NUM_THREADS={threads}; numpy {np.__version__}, {platform.python_version()}")
    print(f"pair loop: {num_layers * (num_layers + 1) // 2} pair-function calls (upper triangle with diagonal)\n")
    header = f"{'measure':<12} {'matrix [s]':>11} {'pair loop [s]':>14} {'speed-up':>9} {'max |diff|':>11}"
    print(header)
    print("-" * len(header))
    for name in args.measures:
        fast, t_fast = timed(similarity_matrix, name, layers)
        slow, t_slow = timed(pair_loop, name, layers)
        diff = float(np.abs(fast - slow).max())
        print(f"{name:<12} {t_fast:>11.2f} {t_slow:>14.2f} {t_slow / t_fast:>8.1f}x {diff:>11.1e}", flush=True)


if __name__ == "__main__":
    main()
