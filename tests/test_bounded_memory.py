"""The similarity stage's linear CKA runs in bounded memory: streamed from activation tables that hold
more data than the process may allocate.

A child process imports what the stage's computation needs, warms it up on one batch (thread pools,
allocator arenas and BLAS buffers reserve address space lazily), measures its address space, and caps
it (RLIMIT_AS) at that plus MARGIN. The tables hold three times MARGIN of float32 activations. The
streamed matrix (layersim.similarity.comparisons.streamed_linear_cka over ActivationTable.iter_batches) must
finish under the cap and match the value known from how the data was built; loading the layers
instead (layersim.similarity.comparisons.stacked_matrix) must fail with MemoryError under the same cap, which
shows that the cap is real.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from threadpoolctl import threadpool_limits

from layersim.data.io import ActivationWriter

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc and RLIMIT_AS")

MARGIN = 64 * 2**20  # address space the child may add after its warm-up (streaming takes ~30 MB)
RUNS = ("orig", "seed1", "seed2")
NUM_LAYERS, HIDDEN, BASIS = 3, 16, 32  # 4 layer columns of 16 per run, each a map of a 32-wide basis
NUM_ROWS = 262_144  # 3 runs x 4 layers x 16 x 4 bytes x 262,144 = 201 MB of float32, 3 x MARGIN
CHUNK = 16_384

CHILD = r"""
import json, os, resource, sys

mode, folder, margin = sys.argv[1], sys.argv[2], int(sys.argv[3])
from layersim.similarity.comparisons import stacked_matrix, stream_rows, streamed_linear_cka
from layersim.errors import LayersimError
from layersim.data.io import ActivationTable


def vm(field):
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(field + ":"))


tables = [ActivationTable(os.path.join(folder, f"{run}.cls.parquet")) for run in ("orig", "seed1", "seed2")]
widths = [table.hidden_size for table in tables for _ in range(table.num_layers + 1)]
rows = stream_rows(widths)
streamed_linear_cka([[next(table.iter_batches(rows)) for table in tables]])  # warm-up
baseline = vm("VmSize")
resource.setrlimit(resource.RLIMIT_AS, (baseline + margin, baseline + margin))
try:
    if mode == "stream":
        matrix = streamed_linear_cka(zip(*(table.iter_batches(rows) for table in tables)))
    else:
        matrix = stacked_matrix("linear_cka", {str(k): table.layers() for k, table in enumerate(tables)})
except (MemoryError, LayersimError) as err:
    # The table reader reports a failed allocation inside pyarrow as a LayersimError caused by one.
    if not isinstance(err, MemoryError) and not isinstance(err.__cause__, MemoryError):
        raise
    print(json.dumps({"error": "MemoryError", "baseline": baseline}))
    sys.exit(0)
print(json.dumps({"matrix": matrix.tolist(), "baseline": baseline, "peak": vm("VmPeak")}))
"""


def _maps(rng: np.random.Generator) -> dict[str, list[np.ndarray | None]]:
    """Per run and layer, the (BASIS, HIDDEN) integer map from the shared basis, or None for a constant
    layer (layer 0, like the CLS token's embedding output). Some layers are shared between runs."""
    def new() -> np.ndarray:
        return rng.integers(-3, 4, size=(BASIS, HIDDEN)).astype(np.float64)

    orig = [None, new(), new(), new()]
    return {"orig": orig, "seed1": [None, orig[1], new(), new()], "seed2": [None, orig[1], orig[2], new()]}


def _write_tables(folder: Path, rng: np.random.Generator) -> tuple[dict, np.ndarray, np.ndarray]:
    """Write the three runs' tables chunk by chunk; return the maps and the basis's exact column sums
    and Bᵀ B."""
    maps = _maps(rng)
    # Large offsets, as activations have: they must not cost the streamed sums their digits.
    offsets = {run: [rng.integers(-1000, 1000, size=HIDDEN) for _ in range(NUM_LAYERS + 1)] for run in RUNS}
    # Float64 holds these sums of small integers exactly (|entries| < 2**53), and BLAS computes them fast.
    sums, gram = np.zeros(BASIS), np.zeros((BASIS, BASIS))
    with contextlib.ExitStack() as stack:
        writers = {run: stack.enter_context(ActivationWriter(
            folder / f"{run}.cls.parquet", num_layers=NUM_LAYERS, hidden_size=HIDDEN, label_type=pa.int64(),
            rows_per_group=CHUNK, metadata={"model": "synthetic", "run": run, "pooling": "cls", "task": "synth",
                                            "split": "validation"}))
                   for run in RUNS}
        for start in range(0, NUM_ROWS, CHUNK):
            rows = min(CHUNK, NUM_ROWS - start)
            basis = rng.integers(-8, 9, size=(rows, BASIS)).astype(np.float64)
            sums += basis.sum(axis=0)
            gram += basis.T @ basis
            ids = np.arange(start, start + rows)
            for run, writer in writers.items():
                # Small integers: every value is exact in float32, so the known CKA is exact too.
                layers = [np.broadcast_to(offset, (rows, HIDDEN)) if a is None else basis @ a + offset
                          for a, offset in zip(maps[run], offsets[run])]
                writer.write(ids, np.zeros(rows, np.int16), np.zeros(rows, np.int64),
                             [layer.astype(np.float32) for layer in layers])
    return maps, sums, gram


def _known_cka(maps: dict, sums: np.ndarray, gram: np.ndarray) -> np.ndarray:
    """Every layer is B·A + c for the basis B, so its centred cross-products with another are
    Aᵢᵀ S Aⱼ with S = Bᵀ B - n b̄ b̄ᵀ: the exact CKA from B's sums alone (NaN for constant layers)."""
    scatter = (gram * NUM_ROWS - np.outer(sums, sums)) / NUM_ROWS  # exact integers until this division
    layers = [a for run in RUNS for a in maps[run]]
    num = len(layers)
    hsic = np.full((num, num), np.nan)
    for i, a in enumerate(layers):
        for j, b in enumerate(layers):
            if a is not None and b is not None:
                hsic[i, j] = np.sum((a.T @ scatter @ b) ** 2)
    return hsic / np.sqrt(np.outer(np.diag(hsic), np.diag(hsic)))


def _child(mode: str, folder: Path) -> dict:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", CHILD, mode, str(folder), str(MARGIN)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_streamed_linear_cka_runs_in_bounded_memory(tmp_path):
    with threadpool_limits(1):  # tiny products: BLAS threads only cost hand-offs (seconds on a busy CPU)
        maps, sums, gram = _write_tables(tmp_path, np.random.default_rng(0))
    data_bytes = len(RUNS) * (NUM_LAYERS + 1) * HIDDEN * 4 * NUM_ROWS
    assert data_bytes >= 3 * MARGIN

    streamed = _child("stream", tmp_path)
    assert streamed["peak"] <= streamed["baseline"] + MARGIN
    want = _known_cka(maps, sums, gram)
    got = np.array(streamed["matrix"], dtype=np.float64)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-9)  # NaN where the layer is constant
    assert np.isnan(got[0]).all() and got[1, 5] == pytest.approx(1.0) and got[2, 10] == pytest.approx(1.0)
    assert np.nanmin(got) < 0.5  # not a trivial matrix

    loaded = _child("load", tmp_path)
    assert loaded["error"] == "MemoryError"
