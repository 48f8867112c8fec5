"""`python -m layersim.plan [-S key=value ...] [--device cpu|h100|h200] [--device-flops F] [-- <dvc exp run args>]`:
what params.yaml (with DVC's -S overrides applied, as `dvc exp run -S` would) will cost, per stage, before anything
runs. After `--`, the arguments a recipe script passes on to `dvc exp run`: their -S apply too, after the others."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path

from layersim.errors import LayersimError
from layersim.params import parse_params
from layersim.params.overrides import overridden
from layersim.plan import (GPUS, copies, device, dvc_seconds, human, known_seconds, makespan, plan_items, seconds, total,
                           total_of, where)

COLUMNS = ("stage", "runs on", "rows", "workspace", "DVC cache", "FLOPs", "time")


def exp_run_overrides(words: list[str]) -> list[str]:
    """The -S (--set-param) values among `dvc exp run`'s arguments, in order; its other arguments are its own. A value
    DVC would apply to params.yaml named explicitly (params.yaml:key=value) loses the file's name."""
    picker = argparse.ArgumentParser(prog="dvc exp run", add_help=False, allow_abbrev=False)
    picker.add_argument("-S", "--set-param", dest="overrides", action="append", default=[])
    overrides = picker.parse_known_args(words)[0].overrides
    return [item.removeprefix("params.yaml:") for item in overrides]


def duration(s: float) -> str:
    return f"{s / 3600:.1f} h" if s >= 3600 else f"{s / 60:.1f} min" if s >= 60 else f"{s:.1f} s"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m layersim.plan", description=__doc__)
    p.add_argument("-S", "--set-param", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--params", type=Path, default=Path("params.yaml"))
    p.add_argument("--root", type=Path, default=Path("."), help="the project (its .dvc/config, data/)")
    p.add_argument("--device", default="cpu", choices=("cpu", *GPUS),
                   help="cpu: this machine, its throughput measured now by a torch float32 2048² matmul (torch's "
                        "threads); h200: the figures benchmarks/gpu_check.py measured on one "
                        "(src/layersim/plan/gpu_figures.json, each dated; unmeasured ones printed so); h100: the "
                        "H200's")
    p.add_argument("--gpus", type=int, default=1,
                   help="devices `layersim launch` spreads each stage's tasks over (a column of times on that many)")
    p.add_argument("--device-flops", type=float, help="effective FLOP/s of the device, instead of its default")
    p.add_argument("--pass-seconds", type=float,
                   help="fixed seconds per batch and layer (dispatch; GPU launches), instead of the device's default")
    p.add_argument("--reflinks", action="store_true", help="the volume has reflinks (XFS, Btrfs): no cache copy")
    p.add_argument("--warm-starts", action="store_true",
                   help="stages start warm, forked by tools/exp_run.py's server (the run scripts; unless "
                        "LAYERSIM_FORK_SERVER=0)")
    argv = sys.argv[1:] if argv is None else argv
    own, exp_run = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    args = p.parse_args(own)
    args.overrides += exp_run_overrides(exp_run)
    try:
        if args.gpus < 1:
            raise LayersimError(f"--gpus {args.gpus}: the number of devices must be at least 1.")
        params = parse_params(overridden(args.params, args.overrides))  # a bad value first: before the timings
        items = plan_items(params, args.root)
        on = device(args.device, args.device_flops, args.pass_seconds)
        on = replace(on, warm_starts=args.warm_starts and os.environ.get("LAYERSIM_FORK_SERVER") != "0")
    except LayersimError as err:
        print(f"layersim plan: {err}", file=sys.stderr)
        return 1
    n = copies(args.root, args.reflinks)
    costs = [total_of(name, stage_items) for name, stage_items in items.items()]
    columns = COLUMNS + ((f"on {args.gpus} devices",) if args.gpus > 1 else ())
    rows, known, spread, unmeasured = [], 0.0, 0.0, []
    for c in costs:
        time_of = seconds(c, on)
        known += known_seconds(c, on)
        if time_of is None:
            unmeasured.append(c.stage)
        row = (c.stage, where(c, on), f"{c.rows:,}", human(c.bytes), human(c.bytes * (n - 1)), human(c.flops, "FLOP"),
               "unmeasured" if time_of is None else duration(time_of))
        if args.gpus > 1:
            times = [seconds(item, on) for item in items[c.stage]]
            wall = None if None in times else makespan(times, args.gpus)
            spread += makespan([known_seconds(item, on) for item in items[c.stage]], args.gpus)
            row += ("unmeasured" if wall is None else duration(wall),)
        rows.append(row)
    between = dvc_seconds(costs, on)  # DVC's own work between the stages, on the host
    known += between
    spread += between
    rows.append(("dvc", "host", "", "", "", "", duration(between)) + ((duration(between),) if args.gpus > 1 else ()))
    whole = total(costs)
    bound = "≥ " if unmeasured else ""
    last = ("total", "", "", human(whole.bytes), human(whole.bytes * (n - 1)), human(whole.flops, "FLOP"),
            bound + duration(known))
    rows.append(last + ((bound + duration(spread),) if args.gpus > 1 else ()))
    widths = [max(len(r[i]) for r in [columns, *rows]) for i in range(len(columns))]
    print(f"layersim plan: {params.model}, {len(params.tasks)} task(s), {len(params.seeds)} seed(s), "
          f"{params.finetune.max_steps} steps")
    for row in [columns, *rows]:
        print("  " + "  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))))
    print(f"  on disk in all: {human(whole.bytes * n)} (DVC cache {'copies' if n > 1 else 'links'} each output; "
          f"cache.type {cache_note(args.root)}); metrics and plots, a few MB a task, not counted")
    print(f"  time: {device_note(on)}")
    if args.gpus > 1:
        print(f"  on {args.gpus} devices: each stage's tasks spread over them (longest first), stages one after another "
              "(layersim launch starts a stage's task as soon as its inputs exist, so this is an upper bound)")
    if unmeasured:
        print(f"  unmeasured: {', '.join(unmeasured)} rest on figures never measured on {on.name} (the total counts "
              "only what is measured: a lower bound); run benchmarks/gpu_check.py on one, which writes them into "
              "src/layersim/plan/gpu_figures.json")
    for c in costs:
        for note in c.notes:
            print(f"  {c.stage}: {note}")
    return 0


WARM_NOTE = "warm (forked by the run script's server) "


def device_note(on) -> str:
    """The device the times assume, and each term's figure (layersim.plan.timing)."""
    from layersim.plan.timing import EVALUATION_SECONDS, FIRST_LOAD_SECONDS, START_SECONDS, WARM_START_SECONDS

    shares = (f" × {on.train_efficiency:.0%} in training steps, × {on.forward_efficiency:.0%} in forward passes"
              if on.train_efficiency != 1 or on.forward_efficiency != 1 else "")
    starts = ", ".join(f"{k} {v * on.python_scale:.1f} s" for k, v in
                       (WARM_START_SECONDS if on.warm_starts else START_SECONDS).items())
    analysis = ("" if on.analysis_flops is None else
                f"; the similarity nulls' engines (torch float64) on the device at "
                f"{on.analysis_flops.note('FLOP/s')} + {on.analysis_cell_seconds.note('s')} a cell")
    return (f"{on.name} at {human(on.flops, 'FLOP/s')} ({on.basis}){shares}, + {on.pass_seconds * 1e3:.1f} ms a "
            f"layer pass{analysis}; numpy (similarity measures, SVDs) on the host CPU at {human(on.cpu_flops, 'FLOP/s')} "
            f"(small products on one thread: {human(on.cpu_thread_flops, 'FLOP/s')}) "
            f"+ {EVALUATION_SECONDS * on.python_scale * 1e3:.2f} ms a similarity cell; a stage process starts "
            f"{WARM_NOTE if on.warm_starts else ''}in "
            f"{starts} (+ "
            f"{FIRST_LOAD_SECONDS * on.python_scale:.1f} s at its first model load); models read at "
            f"{human(on.bandwidth, 'B/s')}")


def cache_note(root: Path) -> str:
    from layersim.plan import cache_types

    return cache_types(root) or "unset: DVC's default reflink,copy"


if __name__ == "__main__":
    sys.exit(main())
