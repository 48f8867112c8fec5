"""layersim against the similarity packages researchers install from PyPI, on the same inputs in one run: the
13 × 13 matrix of linear, debiased and RBF CKA (and RSA, against rsatoolbox) over 13 layers × 768 float32 features,
each package's time as a multiple of layersim's measured in the same run, its peak memory, and its largest
difference from layersim's value of the quantity it computes.

Peers (each "not installed" when absent; install them with --no-deps, never through an extra, so that pip keeps the
CPU torch — see pyproject.toml's ``oracles`` and ``bench-cka`` comments)::

    pip install --no-deps repsim==0.1.5 ckatorch==1.0.3 rsatoolbox==0.3.2 torch-cka==0.21 pytorch-cka==1.1.3 \\
        cka-pytorch==1.1.3
    python -c "import torch; print(torch.__version__)"   # unchanged

How each is called, and which quantity it computes, is benchmarks/similarity.py's :class:`Peer` (ckatorch,
pytorch-cka, torch-cka, cka-pytorch: reused here) plus repsim, ckatorch's other kernels and rsatoolbox below.
layersim (the shorter of two runs) runs what the similarity stage and ``layersim.compare_models`` run: ``stacked_matrix`` with the default
options of params.yaml (RBF CKA: exact up to ``similarity.rbf_exact_max_rows`` = 10,000 rows, Nyström above).

Every case (package × measure × n) runs in a child process on the same arrays (saved once, loaded before the clock
starts), so that its peak memory is its own: the peak resident set above the loaded inputs (Linux: the high-water
mark reset after loading, /proc/self/clear_refs; torch's allocations included, which tracemalloc would miss).
Before a case runs, its n × n matrices are estimated; a case above --max-gram-gib (8 GiB: the machine is shared) or
above the memory available is skipped, with the reason printed. A per-pair peer is timed on --peer-pairs pairs and
scaled to all 169 calls of its loop (the note says so). repsim's C++ core is O(n³) per pair (63 s for 13 layers at
n = 1,000 here) and runs up to --repsim-max-n rows.

    python benchmarks/peers.py                       # n = 5,000, 20,000, 50,000 where each peer fits
    python benchmarks/peers.py --sizes 1000 5000     # smaller
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from similarity import (CkaPytorch, Ckatorch, Peer, PytorchCka, TorchCka, _submodule, _version, all_pairs,
                        available_bytes, best_of, make_layers, timed)  # benchmarks/similarity.py

from layersim.params.schema import SimilarityParams
from layersim.similarity.comparisons import stacked_matrix
from layersim.similarity.results import settings

GIB = 2**30
MEASURES = {"linear": "linear_cka", "debiased": "debiased_cka", "rbf": "rbf_cka", "rsa": "rsa"}


def off_diagonal_pairs(num: int, count: int) -> list[tuple[int, int]]:
    """`count` pairs i ≠ j spread over the L x L matrix: every pair costs a per-pair peer the same, and a diagonal
    pair (1 for any kernel) would hide a difference of definitions."""
    pairs = [(i, j) for i in range(num) for j in range(num) if i != j]
    return [pairs[k] for k in np.linspace(0, len(pairs) - 1, min(count, len(pairs))).round().astype(int)]


class CkatorchKernel(Ckatorch):
    """ckatorch's cka_base per pair, with either kernel and its unbiased HSIC (benchmarks/similarity.py's Ckatorch:
    its memory), timed on off-diagonal pairs."""

    def __init__(self, pairs: int, quantity: str):
        super().__init__(pairs)
        self.quantity = quantity
        self.options = {"linear": {"kernel": "linear"}, "debiased": {"kernel": "linear", "unbiased": True},
                        "rbf": {"kernel": "rbf"}}[quantity]
        self.how = f"core.cka_base(x, y, **{self.options}) per pair: float64 n x n Grams"
        if quantity == "rbf":
            self.how += "; σ² = median of all n² squared distances (a documented difference: docs/peers.md)"

    def run(self, layers):
        import torch

        core = _submodule("ckatorch", "core")
        tensors = [torch.from_numpy(a) for a in layers]
        pairs, total = off_diagonal_pairs(len(layers), self.pairs), len(layers) ** 2
        values, elapsed = timed(lambda: {(i, j): float(core.cka_base(tensors[i], tensors[j], **self.options))
                                         for i, j in pairs})
        return values, elapsed * total / len(pairs), f"{len(pairs)} of {total} pairs timed, scaled to {total}"


class Repsim(Peer):
    name, dist = "repsim", "repsim"

    def __init__(self, quantity: str):
        self.quantity = quantity
        self.kernel = "rbf" if quantity == "rbf" else "linear"
        self.how = f"repsim.cka(layers, {self.kernel!r}, 'gretton'): the whole matrix, float64 n x n kernels (C++)"

    def need_bytes(self, n, d, num_layers):
        return 2 * 8 * num_layers * n * n  # every layer's kernel and its centred copy

    def run(self, layers):
        import repsim

        matrix, elapsed = timed(repsim.cka, layers, self.kernel, "gretton")
        return {(i, j): float(matrix[i, j]) for i, j in all_pairs(len(layers))}, elapsed, "the whole matrix"


class Rsatoolbox(Peer):
    name, dist, quantity = "rsatoolbox", "rsatoolbox", "rsa"
    how = "compare(calc_rdm([Dataset(x) …], 'correlation'), same, 'spearman'): every layer's RDM, then all pairs"

    def need_bytes(self, n, d, num_layers):
        return 3 * 8 * num_layers * n * (n - 1) // 2  # the RDM vectors, their ranks and a copy

    def run(self, layers):
        import rsatoolbox

        def matrix():
            rdms = rsatoolbox.rdm.calc_rdm([rsatoolbox.data.Dataset(a) for a in layers], method="correlation")
            return rsatoolbox.rdm.compare(rdms, rdms, method="spearman")

        values, elapsed = timed(matrix)
        return {(i, j): float(values[i, j]) for i, j in all_pairs(len(layers))}, elapsed, "the whole matrix"


def peers(quantity: str, pairs: int) -> list[Peer]:
    """The packages that compute `quantity` ("linear", "debiased", "rbf", "rsa") or a documented variant of it."""
    return {"linear": [Repsim("linear"), CkatorchKernel(pairs, "linear")],
            "debiased": [CkatorchKernel(pairs, "debiased"), PytorchCka(), TorchCka(), CkaPytorch()],
            "rbf": [Repsim("rbf"), CkatorchKernel(pairs, "rbf")],
            "rsa": [Rsatoolbox()]}[quantity]


# --- one case, in a child process ----------------------------------------------------------------------------------


def _status(key: str) -> int:
    """VmHWM or VmRSS of this process, in bytes."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(f"{key}:"))


def run_case(folder: str, runner: str, quantity: str, pairs: int) -> dict:
    """Load the layers, reset the peak, run the case; its values, seconds, note and peak above the inputs."""
    data = np.load(Path(folder) / "layers.npz")
    layers = [data[f"layer_{k:02d}"] for k in range(len(data.files))]
    if runner == "layersim":
        measure = MEASURES[quantity]
        options = settings(SimilarityParams())[0].get(measure, {})

        def case(arrays):
            matrix, seconds = best_of(2, stacked_matrix, measure, {"layers": arrays}, **options)
            return {(i, j): float(matrix[i, j]) for i, j in all_pairs(len(arrays))}, seconds, "stacked_matrix"
    else:
        case = next(p for p in peers(quantity, pairs) if p.name == runner).run
    case([a[:64] for a in layers])  # imports, threads and first-call costs paid before the clock and the peak
    base = _status("VmRSS")
    try:
        Path("/proc/self/clear_refs").write_text("5")  # the high-water mark restarts from the inputs
        exact_peak = True
    except OSError:
        exact_peak = False
    values, seconds, note = case(layers)
    if runner == "layersim" and measure == "rbf_cka" and len(layers[0]) > options["exact_max_rows"]:
        note += f" (Nyström, {options['landmarks']} landmarks: n > similarity.rbf_exact_max_rows)"
    peak = _status("VmHWM") - base
    return {"values": [[i, j, v] for (i, j), v in values.items()], "seconds": seconds, "note": note,
            "peak": peak, "exact_peak": exact_peak}


def in_child(folder: str, runner: str, quantity: str, pairs: int, timeout: float) -> dict:
    command = [sys.executable, __file__, "--case", folder, runner, quantity, str(pairs)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"not run: over the {timeout:.0f} s limit per case (--case-timeout)"}
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["killed (out of memory?)"])[-1]
        return {"error": f"failed: {last[:120]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- the table -----------------------------------------------------------------------------------------------------


def load() -> str:
    return "load average " + ", ".join(f"{v:.1f}" for v in os.getloadavg()) + f" on {os.cpu_count()} CPUs"


def skip_reason(peer: Peer, n: int, width: int, num_layers: int, args) -> str | None:
    if _version(peer.dist) == "not installed":
        return "not installed (see the install command at the top)"
    if peer.name == "repsim" and n > args.repsim_max_n:
        return (f"not run: O(n³) per pair in its C++ core (63 s for 13 layers at n = 1,000 in the run reported; "
                f"~{(n / 1000) ** 3:.0f}x that at n = {n:,}); above --repsim-max-n {args.repsim_max_n:,}")
    need = peer.need_bytes(n, width, num_layers)
    if need > args.max_gram_gib * GIB:
        return f"not run: its n x n matrices need ~{need / GIB:.1f} GiB, above --max-gram-gib {args.max_gram_gib:g}"
    if need > 0.8 * available_bytes():
        return f"not run: needs ~{need / GIB:.1f} GiB, {available_bytes() / GIB:.1f} GiB available now"
    return None


def size_section(n: int, args) -> None:
    width, num_layers = args.width, args.layers
    print(f"\n=== n = {n:,} examples, {num_layers} layers x {width} features (float32); {load()} ===", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        layers = make_layers(n, width, num_layers, args.seed)
        np.savez(Path(folder) / "layers.npz", **{f"layer_{k:02d}": a for k, a in enumerate(layers)})
        del layers
        print(f"{'measure':<9}{'package':<22}{'time [s]':>9}{'÷ layersim':>11}{'peak MiB':>10}{'max |Δ|':>9}  how / note")
        for quantity in args.measures:
            if quantity == "rsa" and n > 5000:
                print(f"{quantity:<9}{'(all)':<22}{'—':>9}{'—':>11}{'—':>10}{'—':>9}  layersim's rsa refuses n > 5,000 "
                      "(every layer's RDM is n x n)")
                continue
            ours = in_child(folder, "layersim", quantity, args.peer_pairs, args.case_timeout)
            if "error" in ours:
                print(f"{quantity:<9}{'layersim':<22}  {ours['error']}", flush=True)
                continue
            reference = {(i, j): v for i, j, v in ours["values"]}
            print(f"{quantity:<9}{'layersim':<22}{ours['seconds']:>9.2f}{'1.0x':>11}{ours['peak'] / 2**20:>10.0f}"
                  f"{'':>9}  {ours['note']}", flush=True)
            for peer in peers(quantity, args.peer_pairs):
                label = f"{peer.name} {_version(peer.dist)}"
                reason = skip_reason(peer, n, width, num_layers, args)
                found = {"error": reason} if reason else in_child(folder, peer.name, quantity, args.peer_pairs,
                                                                  args.case_timeout)
                if "error" in found:
                    print(f"{'':<9}{label:<22}{'—':>9}{'—':>11}{'—':>10}{'—':>9}  {peer.how}\n{'':<31}{found['error']}",
                          flush=True)
                    continue
                delta = max(abs(v - reference[i, j]) for i, j, v in found["values"])
                print(f"{'':<9}{label:<22}{found['seconds']:>9.2f}{found['seconds'] / ours['seconds']:>10.1f}x"
                      f"{found['peak'] / 2**20:>10.0f}{delta:>9.1e}  {peer.how}\n{'':<31}[{found['note']}]", flush=True)
    print(f"(after n = {n:,}: {load()}; peak MiB: resident memory above the loaded inputs, "
          f"{n * width * num_layers * 4 / 2**20:.0f} MiB)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[5000, 20_000, 50_000])
    parser.add_argument("--width", type=int, default=768, help="features per layer (default 768)")
    parser.add_argument("--layers", type=int, default=13)
    parser.add_argument("--measures", nargs="+", default=list(MEASURES), choices=list(MEASURES))
    parser.add_argument("--peer-pairs", type=int, default=2, help="pairs timed for per-pair peers, scaled to all")
    parser.add_argument("--max-gram-gib", type=float, default=8.0, help="skip a case whose n x n matrices need more")
    parser.add_argument("--repsim-max-n", type=int, default=1000, help="run repsim (O(n³) per pair) up to this n")
    parser.add_argument("--case-timeout", type=float, default=900.0, help="seconds one case may take")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--case", nargs=4, metavar=("FOLDER", "RUNNER", "QUANTITY", "PAIRS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        folder, runner, quantity, pairs = args.case
        print(json.dumps(run_case(folder, runner, quantity, int(pairs))))
        return
    started = time.perf_counter()
    print(f"numpy {np.__version__}; {load()}; each case in its own process")
    for n in args.sizes:
        size_section(n, args)
    print(f"\ntotal {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
