"""Streaming linear CKA over activation tables: peak memory does not grow with the number of examples.

For n = 20,000 and n = 200,000 rows, writes an activation table (13 layers; 256 neurons each by default,
see below) with layersim.data.io.ActivationWriter into a temporary folder, then, in a fresh child process
per table, streams it with ``ActivationTable.iter_batches`` into
``layersim.similarity.LinearCKAAccumulator`` and takes the 13 × 13 matrix. Reported per n: the time,
the child's peak resident memory (VmHWM), its resident memory after imports (what Python, NumPy
and pyarrow take before any data), and the table's size. The peaks should be about equal although
one table is ten times the other. The n = 20,000 result is also checked against ``cka_matrix`` on the
whole table in memory, in float64.

Width: 13 layers × 768 at n = 200,000 is an 8 GB table and ~2·10¹³ flops, a quarter of an hour on a
2-core machine; the default 256 neurons (2.7 GB, ~9 times fewer flops) keeps the run to a few
minutes with the same n. ``--width 768`` runs the full size.

    python benchmarks/streaming_cka.py                 # n = 20,000 and 200,000, 13 x 256
    python benchmarks/streaming_cka.py --width 768     # 13 x 768 (8 GB on disk for n = 200,000)
    python benchmarks/streaming_cka.py --quick         # n = 2,000 and 20,000, 13 x 64
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def write_table(path: Path, num_rows: int, width: int, num_layers: int, seed: int, chunk: int = 4096) -> float:
    """An activation table of `num_layers` layers like an encoder's (each a noisy nonlinear map of the
    previous one, with an offset), written `chunk` rows at a time; returns the seconds it took."""
    import pyarrow as pa

    from layersim.data.io import ActivationWriter

    rng = np.random.default_rng(seed)
    spectrum = (np.arange(1, width + 1) ** -0.75).astype(np.float32)
    mixes = [(rng.normal(size=(width, width)) * 3 / np.sqrt(width)).astype(np.float32) for _ in range(num_layers - 1)]
    offsets = [rng.normal(size=width).astype(np.float32) for _ in range(num_layers)]
    start = time.perf_counter()
    with ActivationWriter(path, num_layers=num_layers - 1, hidden_size=width, label_type=pa.int64(),
                          metadata={"model": "synthetic", "run": "orig", "pooling": "cls", "task": "synthetic",
                                    "split": "validation"}) as writer:
        for first in range(0, num_rows, chunk):
            rows = min(chunk, num_rows - first)
            layers = [rng.standard_normal((rows, width), dtype=np.float32) * spectrum]
            for mix in mixes:
                noise = rng.standard_normal((rows, width), dtype=np.float32) * spectrum
                layers.append(np.tanh(layers[-1] @ mix) + 0.3 * noise)
            writer.write(np.arange(first, first + rows), np.zeros(rows, np.int16), np.zeros(rows, np.int64),
                         [layer + offset for layer, offset in zip(layers, offsets)])
    return time.perf_counter() - start


def rss(field: str = "VmRSS") -> int:
    """This process's resident memory now (VmRSS) or at its peak (VmHWM), in bytes.

    Not getrusage's ru_maxrss: Linux carries that across exec, so a child started by a parent that
    holds a large table would report the parent's peak."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(field + ":"))


def child(path: str, rows: int, precision: str) -> None:
    """Stream one table and print a JSON line: seconds, peak and after-import resident memory, matrix."""
    from layersim.data.io import ActivationTable
    from layersim.similarity import LinearCKAAccumulator

    table = ActivationTable(path)
    after_imports = rss()
    start = time.perf_counter()
    accumulator = LinearCKAAccumulator(precision=precision)
    for batch in table.iter_batches(rows):
        accumulator.update(batch)
    matrix = accumulator.matrix()
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "peak_rss": rss("VmHWM"), "rss_after_imports": after_imports,
                      "estimate": LinearCKAAccumulator.memory_bytes(accumulator.widths, rows, precision),
                      "matrix": matrix.tolist()}))


def run_child(path: Path, rows: int, precision: str) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", str(path), "--rows", str(rows),
                           "--precision", precision], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the streaming child failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def mb(num_bytes: float) -> str:
    return f"{num_bytes / 2**20:,.0f} MiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", help="rows per table (default 20000 200000)")
    parser.add_argument("--width", type=int, help="neurons per layer (default 256; quick 64)")
    parser.add_argument("--layers", type=int, default=13, help="layers, embeddings included (default 13)")
    parser.add_argument("--rows", type=int, default=4096, help="rows per streamed batch (default 4096)")
    parser.add_argument("--precision", default="auto", help="LinearCKAAccumulator precision (default auto)")
    parser.add_argument("--quick", action="store_true", help="n = 2,000 and 20,000, 13 x 64")
    parser.add_argument("--tmp", type=Path, help="folder for the temporary tables (default: the system's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.rows, args.precision)
        return

    sizes = args.sizes or ([2_000, 20_000] if args.quick else [20_000, 200_000])
    width = args.width or (64 if args.quick else 256)
    table_bytes = max(sizes) * width * args.layers * 4
    print(f"{os.cpu_count()} CPUs; numpy {np.__version__}, Python {platform.python_version()}; {args.layers} layers x "
          f"{width} neurons (float32), batches of {args.rows} rows, precision={args.precision}")
    folder = Path(tempfile.mkdtemp(prefix="layersim-streaming-", dir=args.tmp))
    try:
        free = shutil.disk_usage(folder).free
        if free < 1.2 * table_bytes:
            raise SystemExit(f"{folder} has {mb(free)} free; the largest table needs ~{mb(table_bytes)}")
        results = {}
        for n in sizes:
            path = folder / f"n{n}.parquet"
            seconds_write = write_table(path, n, width, args.layers, args.seed)
            result = run_child(path, args.rows, args.precision)
            result["write"] = seconds_write
            result["file"] = path.stat().st_size
            if n == min(sizes):
                from layersim.data.io import ActivationTable
                from layersim.similarity import cka_matrix

                reference = cka_matrix(ActivationTable(path).layers(), precision="float64")
                result["error"] = float(np.abs(np.array(result["matrix"]) - reference).max())
            path.unlink()
            results[n] = result
            print(f"n = {n:>9,}: table {mb(n * width * args.layers * 4)} of float32 ({mb(result['file'])} on disk, "
                  f"written in {seconds_write:.1f} s); streamed CKA {result['seconds']:.1f} s "
                  f"({n / result['seconds']:,.0f} rows/s); peak RSS {mb(result['peak_rss'])} "
                  f"(after imports {mb(result['rss_after_imports'])}, so {mb(result['peak_rss'] - result['rss_after_imports'])} "
                  f"for the computation; accumulator estimate {mb(result['estimate'])})", flush=True)
        small, large = results[min(sizes)], results[max(sizes)]
        print(f"\npeak RSS at n = {max(sizes):,} / at n = {min(sizes):,}: "
              f"{large['peak_rss'] / small['peak_rss']:.2f}x for {max(sizes) / min(sizes):.0f}x the rows "
              f"(computation only: {mb(large['peak_rss'] - large['rss_after_imports'])} vs "
              f"{mb(small['peak_rss'] - small['rss_after_imports'])})")
        print(f"time at n = {max(sizes):,} / at n = {min(sizes):,}: {large['seconds'] / small['seconds']:.1f}x")
        print(f"accuracy at n = {min(sizes):,}: max |ΔCKA| vs cka_matrix in memory, float64 = {small['error']:.1e}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
