"""`python -m layersim.plan [-S key=value ...] [--device cpu|h100|h200] [--device-flops F]`: what params.yaml (with
DVC's -S overrides applied, as `dvc exp run -S` would) will cost, per stage, before anything runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from layersim.errors import LayersimError
from layersim.params import parse_params
from layersim.params.overrides import overridden
from layersim.plan import GPUS, copies, device, human, plan, seconds, total

COLUMNS = ("stage", "rows", "workspace", "DVC cache", "FLOPs", "time")


def duration(s: float) -> str:
    return f"{s / 3600:.1f} h" if s >= 3600 else f"{s / 60:.1f} min" if s >= 60 else f"{s:.1f} s"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m layersim.plan", description=__doc__)
    p.add_argument("-S", "--set-param", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--params", type=Path, default=Path("params.yaml"))
    p.add_argument("--root", type=Path, default=Path("."), help="the project (its .dvc/config, data/)")
    p.add_argument("--device", default="cpu", choices=("cpu", *GPUS),
                   help="cpu: this machine, its throughput measured now by a torch float32 2048² matmul (torch's "
                        "threads); h200: measured figures, h100: the same (docs)")
    p.add_argument("--device-flops", type=float, help="effective FLOP/s of the device, instead of its default")
    p.add_argument("--pass-seconds", type=float,
                   help="fixed seconds per batch and layer (dispatch; GPU launches), instead of the device's default")
    p.add_argument("--reflinks", action="store_true", help="the volume has reflinks (XFS, Btrfs): no cache copy")
    args = p.parse_args(argv)
    try:
        on = device(args.device, args.device_flops, args.pass_seconds)
        params = parse_params(overridden(args.params, args.overrides))
        costs = plan(params, args.root)
    except LayersimError as err:
        print(f"layersim plan: {err}", file=sys.stderr)
        return 1
    n = copies(args.root, args.reflinks)
    rows = [(c.stage, f"{c.rows:,}", human(c.bytes), human(c.bytes * (n - 1)), human(c.flops, "FLOP"),
             duration(seconds(c, on))) for c in costs]
    whole = total(costs)
    rows.append(("total", "", human(whole.bytes), human(whole.bytes * (n - 1)), human(whole.flops, "FLOP"),
                 duration(sum(seconds(c, on) for c in costs))))
    widths = [max(len(r[i]) for r in [COLUMNS, *rows]) for i in range(len(COLUMNS))]
    print(f"layersim plan: {params.model}, {len(params.tasks)} task(s), {len(params.seeds)} seed(s), "
          f"{params.finetune.max_steps} steps")
    for row in [COLUMNS, *rows]:
        print("  " + "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))))
    print(f"  on disk in all: {human(whole.bytes * n)} (DVC cache {'copies' if n > 1 else 'links'} each output; "
          f"cache.type {cache_note(args.root)}); metrics and plots, a few MB a task, not counted")
    print(f"  time: {device_note(on)}")
    for c in costs:
        for note in c.notes:
            print(f"  {c.stage}: {note}")
    return 0


def device_note(on) -> str:
    """The device the times assume, and each term's figure (layersim.plan.timing)."""
    from layersim.plan.timing import EVALUATION_SECONDS, FIRST_LOAD_SECONDS, START_SECONDS

    shares = (f" × {on.train_efficiency:.0%} in training steps, × {on.forward_efficiency:.0%} in forward passes"
              if on.train_efficiency != 1 or on.forward_efficiency != 1 else "")
    starts = ", ".join(f"{k} {v * on.start_scale:.1f} s" for k, v in START_SECONDS.items())
    return (f"{on.name} at {human(on.flops, 'FLOP/s')} ({on.basis}){shares}, + {on.pass_seconds * 1e3:.1f} ms a "
            f"layer pass; numpy (similarity measures, SVDs) on the host CPU at {human(on.cpu_flops, 'FLOP/s')} "
            f"(small products on one thread: {human(on.cpu_thread_flops, 'FLOP/s')}) "
            f"+ {EVALUATION_SECONDS * 1e3:.2f} ms a similarity cell; a stage process starts in {starts} (+ "
            f"{FIRST_LOAD_SECONDS * on.start_scale:.1f} s at its first model load); models read at "
            f"{human(on.bandwidth, 'B/s')}")


def cache_note(root: Path) -> str:
    from layersim.plan import cache_types

    return cache_types(root) or "unset: DVC's default reflink,copy"


if __name__ == "__main__":
    sys.exit(main())
