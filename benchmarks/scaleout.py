"""Scale-out: a pipeline of this project's shape, serial `dvc repro` against `layersim launch` with 2 and 4 workers.

The project (tests/launch_project.py) has one download, N fine-tune items that wait `--seconds` each (standing
in for GPU time, so 4 workers fit on 2 cores), an extract per item and one compare. Each run starts from a
fresh copy. Reported: end-to-end wall time, the fine-tune phase (first fine-tune start to last fine-tune end,
from the items' own records), their speed-ups over serial, and the fixed overhead per node
(wall − ideal, where ideal = waits / workers, divided by the nodes).

    python benchmarks/scaleout.py                       # 8 fine-tunes of 15 s, workers 2 and 4
    python benchmarks/scaleout.py --items 4 --seconds 5 # quicker
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from dvc_project import dvc, run  # noqa: E402
from launch_project import make_launch_project, parsed_lock  # noqa: E402


def finetune_phase(root: Path, items: list[str]) -> float:
    runs = [json.loads((root / "logs" / f"train-{item}.json").read_text()) for item in items]
    return max(r["end"] for r in runs) - min(r["start"] for r in runs)


def one_run(scratch: Path, items: list[str], seconds: float, workers: int | None, workspace: str) -> dict:
    root = scratch / f"{'serial' if workers is None else f'ray{workers}-{workspace}'}"
    env = make_launch_project(root, items, seconds)
    if workers is None:
        argv = dvc("repro")
    else:
        argv = [sys.executable, "-m", "layersim_launch.cli", "launch", "--gpus", str(workers),
                "--cpus", str(max(workers, 2)), "--workspace", workspace]
    start = time.perf_counter()
    run(argv, root, env)
    wall = time.perf_counter() - start
    clean = json.loads(run(dvc("status", "--json"), root, env).stdout or "{}") == {}
    return {"root": root, "wall": wall, "finetune": finetune_phase(root, items), "clean": clean}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=8, help="fine-tune items (default 8)")
    parser.add_argument("--seconds", type=float, default=15.0, help="each fine-tune's wait (default 15)")
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4], help="fake GPUs (default 2 4)")
    parser.add_argument("--workspace", choices=("shared", "clone"), default="shared")
    args = parser.parse_args()
    items = [f"t{k}" for k in range(args.items)]
    nodes = 1 + 2 * args.items + 1
    with tempfile.TemporaryDirectory(prefix="scaleout-") as scratch:
        serial = one_run(Path(scratch), items, args.seconds, None, args.workspace)
        print(f"{nodes} nodes, {args.items} fine-tunes of {args.seconds:.0f} s ({args.workspace} workspace)\n")
        header = f"{'run':<10} {'wall [s]':>9} {'speed-up':>9} {'fine-tune phase [s]':>20} {'speed-up':>9} " \
                 f"{'overhead/node [s]':>18} {'status':>7} {'dvc.lock':>9}"
        print(header + "\n" + "-" * len(header))
        rows = [("serial", serial, 1)] + [(f"{k} workers", one_run(Path(scratch), items, args.seconds, k,
                                                                     args.workspace), k) for k in args.workers]
        for name, result, workers in rows:
            ideal = args.items * args.seconds / workers
            same = parsed_lock(result["root"]) == parsed_lock(serial["root"])
            print(f"{name:<10} {result['wall']:>9.1f} {serial['wall'] / result['wall']:>8.2f}x "
                  f"{result['finetune']:>20.1f} {serial['finetune'] / result['finetune']:>8.2f}x "
                  f"{(result['wall'] - ideal) / nodes:>18.2f} {'clean' if result['clean'] else 'DIRTY':>7} "
                  f"{'same' if same else 'DIFFERS':>9}", flush=True)
        print("\noverhead/node: (wall − fine-tunes × seconds / workers) / nodes; goals: fine-tune phase ≥ 0.8 × "
              "workers, end to end ≥ 1.8× at 4 workers")


if __name__ == "__main__":
    main()
