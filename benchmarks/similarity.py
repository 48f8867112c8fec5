"""Layer × layer similarity matrices: layersim against a notebook's per-pair loop, CKA packages from PyPI,
and the roofline.

Install the CKA packages compared with, with --no-deps and never plainly (cka-pytorch requires torchvision
and lightning, which make pip replace the installed CPU torch with a multi-GB CUDA build)::

    pip install --no-deps torch-cka==0.21 ckatorch==1.0.3 pytorch-cka==1.1.3 cka-pytorch==1.1.3

(pyproject.toml's ``bench-cka`` extra lists the same pins, for reference only.) A package that is not
installed is reported as "not run".

Linear CKA (the default run). For n = 10,000 and 50,000 examples of 13 layers × 768 neurons
(float32, as activations are), the full 13 × 13 linear-CKA matrix from ``cka_matrix(layers)`` is
timed against, on the same arrays:

* the per-pair loops a notebook would write, each called on every (i, j) of the 13 × 13 matrix and
  recomputing everything per pair (:func:`notebook_loops`), all re-written here from Kornblith et al.'s
  colab: ``feature_space_linear_cka`` on float64 copies (centre, ``||Yᵀ X||_F² / (||Xᵀ X||_F ||Yᵀ Y||_F)``;
  :func:`notebook_linear_cka`), the strongest loop and the one the ≥ 10x goal is read against; the same
  function on the float32 arrays as given (twice as fast, ~1e-5 off: centring in float32); and the colab's
  sample-space form ``cka(gram_linear(x), gram_linear(y))`` with float64 n x n Grams
  (:func:`notebook_gram_cka`). Every call costs the same, so above ``--full-loop-max`` examples
  (6,000: the default sizes, not ``--quick``'s) 13 pairs spread over the matrix are timed and scaled to
  all 169 (the Gram form: 2 pairs, always), and the output says so;
* CKA packages from PyPI, each called through the function that does its math (see
  :func:`peers`); a peer that would not fit in the memory available is reported as "not run";
* the roofline: the one product that cannot be avoided, ``Zᵀ Z`` for the stacked centred
  activations ``Z`` (n × 13·768), in the precision layersim uses (NumPy → BLAS syrk).

layersim and the roofline are each timed twice and the shorter time kept (:func:`best_of`), unless one
call takes over 20 s.

The "ceiling" line is loop / roofline: the float64 feature-space loop does 4x the multiply-adds of
``Zᵀ Z`` (169 pairs x (one GEMM + two half-size syrks) against 169/2 blocks of one syrk) at half the
float32 speed, so no exact method that forms ``Zᵀ Z`` can gain more than that ratio over it.

It also reports the accuracy of the default (float32 products, float64 sums) against the same
matrix computed in float64, and, for each peer, against layersim's value of the quantity that peer
computes (biased linear CKA, or the debiased/unbiased-HSIC CKA).

ckatorch's and cka-pytorch's package ``__init__`` import plotting/training extras that --no-deps leaves
out (seaborn, lightning), so their math modules are imported without it (:func:`_submodule`).

Other measures (``--measures svcca pwcca ...``): ``similarity_matrix(name, layers)`` against a loop
that calls the pair function on the upper triangle, recomputing everything per pair (n = 5,000).

    python benchmarks/similarity.py                  # linear CKA, n = 10,000 and 50,000, 13 x 768
    python benchmarks/similarity.py --quick          # n = 2,000 and 6,000, 13 x 256, a few minutes
    python benchmarks/similarity.py --measures svcca # other measures vs their pair loop
    python benchmarks/similarity.py --moments        # the CCA family, neuronsim, mixedsim from streamed moments
    python benchmarks/similarity.py --rbf            # RBF CKA: Nyström features against the exact kernels

``--moments`` (n = 5,000 and 50,000 by default): one float64 pass over row batches gathers the centred
cross-products of the 13 stacked layers and their rows' squared norms (what the similarity stage streams,
:func:`layersim.similarity.comparisons.moments_stacked_matrix`), then each measure's 13 x 13 matrix comes from those
sums (the CCA family, neuronsim and mixedsim from the d x d blocks, debiased CKA also from the norms), and
linear CKA's exact permutation null from the same pass; timed (the pass included in every measure's time, though one pass
serves them all) against today's in-memory matrix (per-layer bases of n rows, the float64 reference for the
error) and the per-pair loop (3 pairs timed, scaled to all 78); peak memory as traced allocations. Then each
measure's rotation null from the same moments (``--draws`` per cell, 100 by default, as the stage draws
``similarity.permutations``), timed, and up to ``--null-check-max`` examples (5,000) checked against the
permutation null of 3 of the layers computed in memory (:func:`null_table`).

``--rbf`` (``--landmarks 1000 1500`` by default): RBF CKA's 13 x 13 matrix through Nyström features with
the diagonal restored (the similarity stage's route above ``similarity.rbf_exact_max_rows``), timed, with its
largest error against the exact n x n kernels where those fit (n ≤ 10,000).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import platform
import sys
import time
import types
from collections.abc import Callable, Sequence

import numpy as np

from layersim.similarity import cka_matrix, get_measure, similarity_matrix
from layersim.similarity.kernels import debiased_cka


def make_layers(num_examples: int, width: int, num_layers: int, seed: int) -> list[np.ndarray]:
    """A chain like an encoder's: each layer a noisy nonlinear map of the previous one, with a decaying
    (power-law) variance spectrum so that SVCCA's 99 % cut keeps a realistic share of the directions,
    and an offset (activations are not centred). Stored as float32, as activations are."""
    rng = np.random.default_rng(seed)
    spectrum = np.arange(1, width + 1, dtype=np.float64) ** -0.75
    offset = rng.normal(size=width)
    layers = [(rng.normal(size=(num_examples, width)) * spectrum).astype(np.float32)]
    for _ in range(num_layers - 1):
        mix = (rng.normal(size=(width, width)) / np.sqrt(width)).astype(np.float32)
        nxt = np.tanh(3.0 * (layers[-1] @ mix)) + 0.3 * rng.normal(size=(num_examples, width)) * spectrum
        layers.append(nxt.astype(np.float32))
    return [layer + offset.astype(np.float32) for layer in layers]


def timed(fn: Callable, *args, **kwargs):
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - start


# best_of repeats only calls shorter than this: longer ones amortise their start-up cost themselves.
REPEAT_BELOW_SECONDS = 20.0


def best_of(repeats: int, fn: Callable, *args, **kwargs):
    """The result and the shortest of up to ``repeats`` timings (fewer when a call takes over
    REPEAT_BELOW_SECONDS): a first call also pays for starting BLAS threads and page-faulting its
    buffers, which the loops amortise over their many calls."""
    result, best = timed(fn, *args, **kwargs)
    for _ in range(repeats - 1):
        if best > REPEAT_BELOW_SECONDS:
            break
        result, seconds = timed(fn, *args, **kwargs)
        best = min(best, seconds)
    return result, best


def available_bytes() -> int:
    """Memory the OS could give this process now (MemAvailable)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import psutil

    return int(psutil.virtual_memory().available)


def gb(num_bytes: float) -> str:
    return f"{num_bytes / 1e9:.1f} GB"


def too_big(need: int) -> str | None:
    """The "not run" note when ``need`` bytes would not fit in the memory available now, else None."""
    free = available_bytes()
    if need > 0.8 * free:
        return f"not run: needs ~{gb(need)} (n x n Gram matrices), {gb(free)} available"
    return None


def max_error(values: dict, reference: np.ndarray) -> float:
    """Largest |value - reference[i, j]| over the timed pairs."""
    return max(abs(v - reference[i, j]) for (i, j), v in values.items())


# --- the notebook baseline -----------------------------------------------------------------------


def notebook_linear_cka(x: np.ndarray, y: np.ndarray, dtype=np.float64) -> float:
    """One pair, the way Kornblith et al.'s colab ``feature_space_linear_cka`` does it: centre both, then
    ||yᵀx||_F² / (||xᵀx||_F · ||yᵀy||_F). Nothing is shared between calls. ``dtype`` None keeps the
    input's dtype, as the colab function does when handed float32 activations."""
    if dtype is not None:
        x = np.asarray(x, dtype=dtype)
        y = np.asarray(y, dtype=dtype)
    x = x - x.mean(axis=0, keepdims=True)
    y = y - y.mean(axis=0, keepdims=True)
    return float(np.linalg.norm(y.T @ x) ** 2 / (np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y)))


def notebook_gram_cka(x: np.ndarray, y: np.ndarray) -> float:
    """One pair in the colab's sample-space form, ``cka(gram_linear(x), gram_linear(y))``: two float64 n x n
    Grams, each centred through its row and column means, then <Kc, Lc>_F / (||Kc||_F ||Lc||_F)."""

    def centred_gram(a: np.ndarray) -> np.ndarray:
        a = np.asarray(a, dtype=np.float64)
        gram = a @ a.T
        means = gram.mean(axis=0)
        means -= means.mean() / 2  # H K H = K - m 1ᵀ - 1 mᵀ + mean(m)
        gram -= means[:, None]
        gram -= means[None, :]
        return gram

    gram_x, gram_y = centred_gram(x), centred_gram(y)
    return float(gram_x.ravel() @ gram_y.ravel() / (np.linalg.norm(gram_x) * np.linalg.norm(gram_y)))


def all_pairs(num_layers: int) -> list[tuple[int, int]]:
    return [(i, j) for i in range(num_layers) for j in range(num_layers)]


def sample_pairs(num_layers: int, count: int) -> list[tuple[int, int]]:
    """`count` pairs spread over the L x L matrix (diagonal and off-diagonal alike cost the same)."""
    pairs = all_pairs(num_layers)
    if count >= len(pairs):
        return pairs
    picks = np.linspace(0, len(pairs) - 1, count).round().astype(int)
    return [pairs[k] for k in picks]


def time_pairs(pair: Callable, layers: Sequence, count: int) -> tuple[dict, float, str]:
    """``pair(layers[i], layers[j])`` on ``count`` pairs spread over the L x L matrix: (values by (i, j),
    seconds scaled to all L² pairs, a note on what was timed). Every pair costs the same."""
    pairs = sample_pairs(len(layers), count)
    values, start = {}, time.perf_counter()
    for i, j in pairs:
        values[i, j] = pair(layers[i], layers[j])
    elapsed = time.perf_counter() - start
    total = len(layers) ** 2
    note = "all pairs" if len(pairs) == total else f"{len(pairs)} of {total} pairs timed, scaled to {total}"
    return values, elapsed * total / len(pairs), note


class NotebookLoop:
    """A per-pair loop a notebook would write: ``pair(layers[i], layers[j])`` for every (i, j) of the L x L
    matrix, ``pairs`` of them timed (see :func:`time_pairs`)."""

    def __init__(self, label: str, pair: Callable, pairs: int, need_bytes: Callable[[int], int] = lambda n: 0):
        self.label, self.pair, self.pairs, self.need_bytes = label, pair, pairs, need_bytes

    def run(self, layers: list[np.ndarray]) -> tuple[dict, float, str]:
        return time_pairs(self.pair, layers, self.pairs)


def notebook_loops(n: int, num_layers: int, args) -> list[NotebookLoop]:
    """The strongest loop first: it is the one the ≥ 10x goal is read against."""
    pairs = num_layers**2 if n <= args.full_loop_max else args.loop_pairs
    return [
        NotebookLoop("per-pair loop: colab feature_space_linear_cka on float64 copies, every (i, j)",
                     notebook_linear_cka, pairs),
        NotebookLoop("per-pair loop: colab feature_space_linear_cka on the float32 arrays as given",
                     lambda x, y: notebook_linear_cka(x, y, dtype=None), pairs),
        NotebookLoop("per-pair loop: colab cka(gram_linear(x), gram_linear(y)), float64 n x n Grams",
                     notebook_gram_cka, args.gram_pairs, need_bytes=lambda n: 3 * 8 * n * n),
    ]


# --- peers ---------------------------------------------------------------------------------------


def _submodule(package: str, module: str) -> types.ModuleType:
    """``package.module`` imported without executing ``package/__init__.py``: a bare package object
    with the real ``__path__`` stands in for it, so the module's relative imports still resolve."""
    if package not in sys.modules:
        spec = importlib.util.find_spec(package)
        if spec is None:
            raise ImportError(f"{package} is not installed")
        stub = types.ModuleType(package)
        stub.__path__ = list(spec.submodule_search_locations)
        sys.modules[package] = stub
    return importlib.import_module(f"{package}.{module}")


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


class Peer:
    """A CKA package: how to time its L x L matrix on the arrays, and which quantity it computes."""

    name: str
    dist: str
    quantity: str  # "linear" (biased linear CKA, as layersim) or "debiased" (unbiased HSIC)
    how: str

    def need_bytes(self, n: int, d: int, num_layers: int) -> int:
        raise NotImplementedError

    def run(self, layers: list[np.ndarray]) -> tuple[dict, float, str]:
        """Returns (values by (i, j) for the pairs it computed, seconds for the whole L x L matrix,
        a note on what was timed)."""
        raise NotImplementedError


class Ckatorch(Peer):
    name, dist, quantity = "ckatorch", "ckatorch", "linear"
    how = "core.cka_base(x, y) per pair: float64 n x n Grams, centred (the biased linear CKA)"

    def __init__(self, pairs: int):
        self.pairs = pairs

    def need_bytes(self, n, d, num_layers):
        # Two float64 Grams, their centred clones, and allclose(G, Gᵀ)'s temporaries.
        return 6 * 8 * n * n

    def run(self, layers):
        import torch

        core = _submodule("ckatorch", "core")
        tensors = [torch.from_numpy(a) for a in layers]
        return time_pairs(lambda x, y: float(core.cka_base(x, y, kernel="linear")), tensors, self.pairs)


class PytorchCka(Peer):
    name, dist, quantity = "pytorch-cka", "pytorch-cka", "debiased"
    how = "cka.cka_from_features(X, X), X the (L, n, d) stack: all L Grams at once, unbiased HSIC, float32"

    def need_bytes(self, n, d, num_layers):
        # Grams of both sides (it forms them twice) and one (L, n, n) temporary in hsic().
        return 3 * 4 * num_layers * n * n + 4 * num_layers * n * d

    def run(self, layers):
        import torch

        cka = importlib.import_module("cka")
        stack = torch.from_numpy(np.stack(layers))
        matrix, elapsed = timed(cka.cka_from_features, stack, stack)
        matrix = matrix.numpy()
        return {(i, j): float(matrix[i, j]) for i, j in all_pairs(len(layers))}, elapsed, "the whole matrix"


class TorchCka(Peer):
    name, dist, quantity = "torch-cka", "torch-cka", "debiased"
    how = ("CKA._HSIC on Grams built as CKA.compare builds them (float32, zeroed diagonal); its compare() "
           "re-forms layer j's Gram for every (i, j) and calls _HSIC 2L² + L times, each an n x n x n product")

    def need_bytes(self, n, d, num_layers):
        return 5 * 4 * n * n  # K, L, K @ L and the products inside _HSIC

    def run(self, layers):
        import torch
        from torch import nn

        torch_cka = importlib.import_module("torch_cka")
        # CKA wants two models to hook; identity modules stand in (no forward pass is run).
        peer = torch_cka.CKA(nn.Sequential(nn.Identity()), nn.Sequential(nn.Identity()), "x", "y",
                             model1_layers=["0"], model2_layers=["0"], device="cpu")

        def gram(a):
            x = torch.from_numpy(a)
            k = x @ x.t()
            k.fill_diagonal_(0.0)
            return k

        i, j = 0, len(layers) - 1
        (k, l), t_gram = timed(lambda: (gram(layers[i]), gram(layers[j])))
        t_gram /= 2
        hsic_kl, t_hsic = timed(peer._HSIC, k, l)
        hsic_kk, hsic_ll = peer._HSIC(k, k), peer._HSIC(l, l)
        value = hsic_kl / np.sqrt(hsic_kk * hsic_ll)
        num = len(layers)
        total = (num + num * num) * t_gram + (num + 2 * num * num) * t_hsic
        return {(i, j): float(value)}, total, (f"one Gram {t_gram:.1f} s and one _HSIC {t_hsic:.1f} s timed, "
                                               f"scaled to its loop's {num + num * num} Grams and "
                                               f"{num + 2 * num * num} _HSIC calls")


class CkaPytorch(Peer):
    name, dist, quantity = "cka-pytorch", "cka-pytorch", "debiased"
    how = ("hsic.hsic1 on utils.gram Grams (float32, unbiased HSIC, an n x n x n bmm per pair), as "
           "CKACalculator does for L² + 2L pairs")

    def need_bytes(self, n, d, num_layers):
        return 6 * 4 * n * n  # two Grams, their clones, K @ L

    def run(self, layers):
        import torch

        hsic = _submodule("cka_pytorch", "hsic")
        utils = _submodule("cka_pytorch", "utils")
        i, j = 0, len(layers) - 1
        (k, l), t_gram = timed(lambda: (utils.gram(torch.from_numpy(layers[i])), utils.gram(torch.from_numpy(layers[j]))))
        t_gram /= 2
        cross, t_hsic = timed(hsic.hsic1, k[None], l[None])
        value = cross / torch.sqrt(hsic.hsic1(k[None], k[None]) * hsic.hsic1(l[None], l[None]))
        num = len(layers)
        total = 2 * num * t_gram + (num * num + 2 * num) * t_hsic
        note = (f"one Gram {t_gram:.1f} s and one hsic1 pair {t_hsic:.1f} s timed, scaled to {2 * num} Grams and "
                f"{num * num + 2 * num} hsic1 pairs (its default batching of 64 pairs per bmm needs 64 n x n Grams "
                "at once and is not used)")
        return {(i, j): float(value)}, total, note


def peers(args) -> list[Peer]:
    return [Ckatorch(args.peer_pairs), PytorchCka(), TorchCka(), CkaPytorch()]


# --- the linear-CKA comparison -------------------------------------------------------------------


def stacked_centred(layers: list[np.ndarray], dtype) -> np.ndarray:
    """Z = [X_1 - mean … X_L - mean] (centred in float64, then rounded to `dtype`)."""
    n = layers[0].shape[0]
    widths = [a.shape[1] for a in layers]
    z = np.empty((n, sum(widths)), dtype=dtype)
    start = 0
    for a, d in zip(layers, widths):
        z[:, start : start + d] = a - a.mean(axis=0, dtype=np.float64)
        start += d
    return z


def linear_cka_section(n: int, width: int, num_layers: int, args) -> None:
    layers = make_layers(n, width, num_layers, args.seed)
    total_pairs = num_layers * num_layers
    print(f"\n=== n = {n:,} examples, {num_layers} layers x {width} neurons (float32), "
          f"{total_pairs} pairs in the L x L matrix ===", flush=True)

    ours, t_ours = best_of(args.repeats, cka_matrix, layers)
    reference, t_ref = timed(cka_matrix, layers, precision="float64")
    accuracy = float(np.abs(ours - reference).max())
    rows = [("layersim cka_matrix(layers)  [precision=auto: float32 products, float64 sums]", t_ours, "")]

    z = stacked_centred(layers, np.float32)
    _, t_roof = best_of(args.repeats, np.matmul, z.T, z)
    del z
    rows.append((f"roofline: Zᵀ Z alone, Z = centred stack {n} x {num_layers * width}, float32 syrk", t_roof, ""))
    rows.append(("layersim cka_matrix(layers, precision='float64')", t_ref, ""))

    loop_rows = []
    for loop in notebook_loops(n, num_layers, args):
        skip = too_big(loop.need_bytes(n))
        if skip:
            loop_rows.append((loop.label, None, skip))
            continue
        values, seconds, note = loop.run(layers)
        loop_rows.append((loop.label, seconds, f"[{note}] max |Δ| vs layersim float64 {max_error(values, reference):.1e}"))
    t_loop = loop_rows[0][1]  # the strongest loop: float64 feature space
    rows += loop_rows

    peer_rows = []
    for peer in peers(args):
        label = f"{peer.name} {_version(peer.dist)}: {peer.how}"
        if _version(peer.dist) == "not installed":
            peer_rows.append((label, None, "not run: not installed (see the install command at the top)"))
            continue
        skip = too_big(peer.need_bytes(n, width, num_layers))
        if skip:
            peer_rows.append((label, None, skip))
            continue
        try:
            values, t_peer, note = peer.run(layers)
        except (MemoryError, RuntimeError) as err:  # torch reports allocation failures as RuntimeError
            peer_rows.append((label, None, f"not run: {type(err).__name__}: {str(err).splitlines()[0][:80]}"))
            continue
        if peer.quantity == "linear":
            error = max_error(values, reference)
            what = "max |Δ| vs layersim float64 linear CKA"
        else:
            pairs_seen = sorted(values)
            error = max(abs(v - debiased_cka(layers[i], layers[j])) for (i, j), v in
                        ((p, values[p]) for p in sample_pairs_of(pairs_seen, 4)))
            what = "it computes debiased CKA; max |Δ| vs layersim debiased_cka"
        peer_rows.append((label, t_peer, f"[{note}] {what} {error:.1e}"))

    print(f"accuracy of the default: max |ΔCKA| vs the float64 matrix = {accuracy:.1e}")
    print(f"{'':<4}{'time [s]':>10}  {'÷ layersim':>10}  what")
    for label, seconds, extra in rows + peer_rows:
        if seconds is None:
            print(f"{'':<4}{'—':>10}  {'—':>10}  {label}\n{'':<28}{extra}")
            continue
        print(f"{'':<4}{seconds:>10.2f}  {seconds / t_ours:>9.2f}x  {label}" + (f"\n{'':<28}{extra}" if extra else ""))
    print(f"ratios: loop / layersim = {t_loop / t_ours:.1f}x (float64 feature-space loop);  "
          f"layersim / roofline = {t_ours / t_roof:.2f}x;  float64 / layersim = {t_ref / t_ours:.2f}x", flush=True)
    # Why this bounds every exact method: see the module docstring.
    print(f"ceiling: loop / roofline = {t_loop / t_roof:.1f}x, the most any method that computes Zᵀ Z "
          "could gain over that loop here", flush=True)
    for label, seconds, extra in loop_rows[1:]:
        print(f"        {label.split(': ', 1)[1]} / layersim = "
              + ("not run" if seconds is None else f"{seconds / t_ours:.1f}x"))
    for label, seconds, extra in peer_rows:
        name = label.split(":")[0]
        print(f"        {name} / layersim = " + ("not run" if seconds is None else f"{seconds / t_ours:.1f}x"))


def sample_pairs_of(pairs: list[tuple[int, int]], count: int) -> list[tuple[int, int]]:
    """At most `count` of `pairs`, spread out (the debiased reference costs a little per pair)."""
    if len(pairs) <= count:
        return pairs
    picks = np.linspace(0, len(pairs) - 1, count).round().astype(int)
    return [pairs[k] for k in picks]


# --- other measures vs their pair loop -----------------------------------------------------------


def pair_loop(name: str, layers: list[np.ndarray]) -> np.ndarray:
    pair = get_measure(name).pair
    num = len(layers)
    out = np.empty((num, num))
    for i in range(num):
        for j in range(i, num):
            out[i, j] = out[j, i] = pair(layers[i], layers[j])
    return out


def measures_section(names: list[str], n: int, width: int, num_layers: int, seed: int) -> None:
    layers = make_layers(n, width, num_layers, seed)
    print(f"\n{num_layers} layers x {n} examples x {width} neurons (float32); pair loop: "
          f"{num_layers * (num_layers + 1) // 2} pair-function calls (upper triangle with diagonal)\n")
    header = f"{'measure':<12} {'matrix [s]':>11} {'pair loop [s]':>14} {'speed-up':>9} {'max |diff|':>11}"
    print(header)
    print("-" * len(header))
    for name in names:
        fast, t_fast = timed(similarity_matrix, name, layers)
        slow, t_slow = timed(pair_loop, name, layers)
        diff = float(np.abs(fast - slow).max())
        print(f"{name:<12} {t_fast:>11.2f} {t_slow:>14.2f} {t_slow / t_fast:>8.1f}x {diff:>11.1e}", flush=True)


MOMENT_OPTIONS = {"svcca": {"variance_threshold": 0.99}, "pwcca": {"variance_threshold": 0.99}, "mean_cca": {},
                  "neuronsim": {}, "mixedsim": {}, "debiased_cka": {}}


def _peak_mb(fn: Callable, *args, **kwargs):
    """fn's result, seconds, and the peak of memory it allocated through NumPy/Python (tracemalloc), in MB."""
    import tracemalloc

    tracemalloc.start()
    try:
        result, seconds = timed(fn, *args, **kwargs)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return result, seconds, peak / 1e6


def moments_section(names: list[str], n: int, width: int, num_layers: int, seed: int, memory_max: int,
                    loop_pairs: int, draws: int, null_check_max: int, batch_rows: int = 8192) -> None:
    """The streamed-moments route (one pass over row batches, then every measure from the d x d blocks)
    against today's in-memory matrix (per-layer bases of n rows) and the per-pair loop; then each measure's
    rotation null (:func:`null_table`)."""
    from layersim.similarity.comparisons import moments_stacked_matrix, moments_stacked_null
    from layersim.similarity import LayerMoments
    from layersim.similarity.moments import MOMENT_MEASURES
    from layersim.similarity import permutation_matrix, streamed_linear_cka_null
    from layersim.similarity.cka_streaming import LinearCKAAccumulator

    layers = make_layers(n, width, num_layers, seed)
    print(f"\n{num_layers} layers x {n} examples x {width} neurons (float32), rows streamed in batches of {batch_rows}")

    def gather():
        acc = LinearCKAAccumulator(precision="float64")
        for start in range(0, n, batch_rows):
            acc.update([a[start:start + batch_rows] for a in layers])
        return acc

    moments, t_pass, mb_pass = _peak_mb(gather)
    print(f"one pass over the rows (float64 products, shared by every measure): {t_pass:.1f} s, peak {mb_pass:.0f} MB")
    null, t_null, _ = _peak_mb(streamed_linear_cka_null, moments)
    line = f"linear CKA's exact permutation null from that pass: {t_null:.1f} s"
    if n <= memory_max:
        loaded, t_loaded, mb_loaded = _peak_mb(permutation_matrix, "linear_cka", layers, exact=True)
        line += (f" (in memory {t_loaded:.1f} s, peak {mb_loaded:.0f} MB; max |diff| of the null mean "
                 f"{float(np.nanmax(np.abs(null.null_mean - loaded.null_mean))):.1e}, of the p-value "
                 f"{float(np.nanmax(np.abs(null.p_value - loaded.p_value))):.1e})")
    print(line + "\n")
    header = (f"{'measure':<12} {'moments [s]':>11} {'peak MB':>8} {'in memory [s]':>13} {'peak MB':>8} "
              f"{'pair loop [s]':>13} {'vs memory':>9} {'vs loop':>8} {'max |diff|':>10}")
    print(header)
    print("-" * len(header))
    nulls = []
    for name in names:
        options = MOMENT_OPTIONS[name]
        bases = LayerMoments(moments)  # per measure, so that no measure's time includes another's bases
        fast, t_fast, mb_fast = _peak_mb(moments_stacked_matrix, name, moments, moments=bases, **options)
        if name in MOMENT_MEASURES and draws:
            nulls.append((name, _peak_mb(moments_stacked_null, name, moments, permutations=draws, seed=seed,
                                         observed=fast, moments=bases, **options)))
        t_total = t_pass + t_fast
        if n <= memory_max:
            exact, t_mem, mb_mem = _peak_mb(similarity_matrix, name, layers, **options)
            diff = f"{float(np.abs(fast - exact).max()):.1e}"
            memory = f"{t_mem:>13.1f} {mb_mem:>8.0f}"
            ratio = f"{t_mem / t_total:>8.1f}x"
        else:
            diff, memory, ratio = "not run", f"{'not run':>13} {'':>8}", f"{'':>9}"
        pairs = sample_pairs(num_layers, loop_pairs)
        pair = get_measure(name).pair
        _, t_some = timed(lambda: [pair(layers[i], layers[j], **options) for i, j in pairs])
        t_loop = t_some * (num_layers * (num_layers - 1) // 2) / len(pairs)
        print(f"{name:<12} {t_total:>11.1f} {mb_fast + mb_pass:>8.0f} {memory} {t_loop:>13.0f} {ratio} "
              f"{t_loop / t_total:>7.0f}x {diff:>10}", flush=True)
    print(f"\nmoments [s]: the pass plus the measure's matrix; pair loop: {len(pairs)} pairs timed, scaled to all "
          f"{num_layers * (num_layers - 1) // 2}; peak MB: allocations traced beyond the input layers "
          f"({sum(a.nbytes for a in layers) / 1e6:.0f} MB)")
    if nulls:
        null_table(nulls, layers, draws, seed, n <= null_check_max)


def null_table(nulls: list, layers: list[np.ndarray], draws: int, seed: int, check: bool) -> None:
    """The rotation null of each measure's matrix from the same moments (every cell, `draws` draws) and, with
    `check`, the permutation null of 3 of the layers (all 9 cells, `draws` permutations of the rows in memory)
    against the rotation null of the same cells: the largest difference of null mean and 95th percentile, in
    units of the null's standard deviation (estimated as (p95 − mean) / 1.645)."""
    from layersim.similarity import permutation_matrix

    picked = [0, len(layers) // 2, len(layers) - 1]
    print(f"\nrotation null, {draws} draws per cell, every cell of the {len(layers)} x {len(layers)} matrix"
          + (f"; against the permutation null of layers {picked} ({draws} permutations, in memory)" if check else ""))
    header = (f"{'measure':<12} {'null [s]':>8} {'per draw [s]':>12} {'peak MB':>8}"
              + (f" {'permutation [s]':>15} {'max |Δ mean|/sd':>15} {'max |Δ p95|/sd':>14}" if check else ""))
    print(header)
    print("-" * len(header))
    for name, (null, seconds, mb) in nulls:
        line = f"{name:<12} {seconds:>8.1f} {seconds / draws:>12.2f} {mb:>8.0f}"
        if check:
            permuted, t_perm = timed(permutation_matrix, name, [layers[i] for i in picked], permutations=draws,
                                     seed=seed, **MOMENT_OPTIONS[name])
            cells = np.ix_(picked, picked)
            sd = (permuted.null_p95 - permuted.null_mean) / 1.645
            line += (f" {t_perm:>15.1f} {np.nanmax(np.abs(null.null_mean[cells] - permuted.null_mean) / sd):>15.2f}"
                     f" {np.nanmax(np.abs(null.null_p95[cells] - permuted.null_p95) / sd):>14.2f}")
        print(line, flush=True)


def rbf_section(n: int, width: int, num_layers: int, seed: int, landmarks: list[int], exact_max: int) -> None:
    """RBF CKA's Nyström route (landmarks per layer) against the exact n x n kernels where they fit."""
    layers = make_layers(n, width, num_layers, seed)
    print(f"\nRBF CKA, {num_layers} layers x {n} examples x {width} neurons (float32)")
    exact = None
    if n <= exact_max:
        exact, t_exact, mb_exact = _peak_mb(similarity_matrix, "rbf_cka", layers)
        print(f"exact (n x n kernels): {t_exact:.1f} s, peak {mb_exact:.0f} MB")
    for m in landmarks:
        approx, t_approx, mb_approx = _peak_mb(similarity_matrix, "rbf_cka", layers, exact_max_rows=2, landmarks=m)
        error = "exact not run" if exact is None else f"max |error| {float(np.abs(approx - exact).max()):.4f}"
        print(f"Nyström, {m} landmarks: {t_approx:.1f} s, peak {mb_approx:.0f} MB, {error}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: n = 2,000 and 6,000, 13 x 256")
    parser.add_argument("--sizes", type=int, nargs="+", help="numbers of examples (default 10000 50000)")
    parser.add_argument("--width", type=int, help="neurons per layer (default 768; quick 256)")
    parser.add_argument("--layers", type=int, default=13, help="number of layers (default 13)")
    parser.add_argument("--full-loop-max", type=int, default=6000,
                        help="run the per-pair loop over all pairs up to this n; above it time --loop-pairs pairs")
    parser.add_argument("--loop-pairs", type=int, default=13, help="pairs the loop times above --full-loop-max")
    parser.add_argument("--repeats", type=int, default=2,
                        help="time layersim and the roofline up to this many times, keep the shortest (default 2)")
    parser.add_argument("--gram-pairs", type=int, default=2, help="pairs timed for the colab's Gram-form loop")
    parser.add_argument("--peer-pairs", type=int, default=2, help="pairs timed for per-pair peers (ckatorch)")
    parser.add_argument("--measures", nargs="+",
                        help="instead: time these symmetric measures' matrices against their pair loop (n = 5,000)")
    parser.add_argument("--moments", action="store_true",
                        help="instead: the streamed-moments route of the CCA family, neuronsim and mixedsim at "
                             "--sizes (default 5000 50000) against the in-memory matrix and the pair loop")
    parser.add_argument("--memory-max", type=int, default=50_000,
                        help="--moments: run the in-memory matrix (the reference for the error) up to this n")
    parser.add_argument("--draws", type=int, default=100,
                        help="--moments: rotation-null draws per cell (params' similarity.permutations; 0: no null)")
    parser.add_argument("--null-check-max", type=int, default=5000,
                        help="--moments: check the rotation null against the permutation null up to this n")
    parser.add_argument("--rbf", action="store_true",
                        help="instead: RBF CKA's Nyström route at --sizes (default 5000 50000) against the exact kernels "
                             "(up to n = 10,000)")
    parser.add_argument("--landmarks", type=int, nargs="+", default=[1000, 1500], help="--rbf: landmarks per layer")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    width = args.width or (256 if args.quick else 768)
    threads = {k: os.environ.get(k, "default") for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    print(f"{os.cpu_count()} CPUs, {threads}; numpy {np.__version__}, Python {platform.python_version()}")
    if args.rbf:
        for n in args.sizes or [5000, 50_000]:
            rbf_section(n, width, args.layers, args.seed, args.landmarks, exact_max=10_000)
        return
    if args.moments:
        names = args.measures or list(MOMENT_OPTIONS)
        for n in args.sizes or [5000, 50_000]:
            moments_section(names, n, width, args.layers, args.seed, args.memory_max, min(args.loop_pairs, 3),
                            args.draws, args.null_check_max)
        return
    if args.measures:
        for name in args.measures:
            if not get_measure(name).symmetric:
                parser.error(f"{name} is asymmetric; the loop baseline here fills the upper triangle only")
        measures_section(args.measures, (args.sizes or [1000 if args.quick else 5000])[0], width, args.layers, args.seed)
        return
    for n in args.sizes or ([2000, 6000] if args.quick else [10_000, 50_000]):
        linear_cka_section(n, width, args.layers, args)


if __name__ == "__main__":
    main()
