"""The plan's estimates against a measured run (issue 53): `python -m layersim.plan`'s time and bytes per stage for a
configuration, and the same stages run by `dvc repro` in a temporary copy of this repository.

The configuration is the `-S` list of a launcher script, read from it: `--config tiny` is smallest.sh's (tiny-bert,
two seeds, six steps), `--config quickstart` quickstart.sh's (MiniLM-L6 on synth-similarity, three seeds, 200
steps; about 8 minutes on a quiet 2-core machine). The copy is this repository's git-tracked files (as the
integration tests copy it, tests/dvc_project.py) with those params in params.yaml and its own DVC cache (cache.type
as .dvc/config says: hardlink,symlink), committed to a fresh git repository, and `dvc repro` runs every stage in a
fresh interpreter, as a user's run does.

Measured per stage: each stage process's wall-clock seconds and CPU seconds (user + system, its children included),
from a `python` shim first on PATH that times the command DVC runs (DVC_STAGE names it) and then hands it to this
interpreter; matrix items (finetune@task-seed, ...) are summed per stage, the download_* stages are the plan's
"download". Bytes: each stage's outputs as dvc.lock records them (a folder's size is its files'). DVC's own time
between stages (hashing, locking, the lock file) is the repro's wall time minus the stage processes', shown as its
own row. Predicted: layersim.plan for the same params and project, on the device it states (this CPU, its
throughput measured by a matmul at start).

Each row prints predicted, measured, predicted/measured and whether that is within ±30 % (0.77 ≤ ratio ≤ 1.30 is
"ok": predicted within 30 % of measured). Wall-clock is what the plan estimates; on a loaded machine (other jobs on
the cores) the CPU-seconds column is the steadier figure: a stage that runs on one core while others compete gets
less wall-clock progress per CPU-second. The machine is printed first: the CPU model (lscpu), torch's float32
2048 x 2048 matmul in GFLOP/s on one thread and on all, and the load average before and after.

    python benchmarks/plan_accuracy.py --config tiny        # about 2 minutes
    python benchmarks/plan_accuracy.py --config quickstart  # about 15 minutes
    python benchmarks/plan_accuracy.py --config quickstart --warm-starts   # as quickstart.sh runs: stages forked
    python benchmarks/plan_accuracy.py --config tiny --keep /tmp/plan-run   # keep the project to look at
    python benchmarks/plan_accuracy.py --config tiny --threads 1   # on a loaded machine: compare the CPU seconds
    python benchmarks/plan_accuracy.py --measured /tmp/plan-run/project --device-flops 2.1e11 --python-scale 0.95
                                                                     # that run, planned again

On a shared machine (other jobs on the cores), compare the CPU seconds: with `--threads 1` every stage runs on one
thread, so its CPU seconds are what its wall clock would be alone on the machine, and the plan is made for that quiet
machine: its matmul's FLOP/s from CPU seconds (the product's best over the process's CPU time), its Python-level
probe from the best of short repeats in CPU time (layersim.plan.machine.python_probe_seconds), both of which other
jobs barely change. Other jobs still cost some CPU seconds (caches shared, context switches): the load is printed
before and after.

A slower CPU (the issue's: 88 GFLOP/s on one thread, this one 103), emulated by a CPU quota: `--cpu-quota 0.85`
puts this process and every stage under a cgroup whose quota is 0.85 of a core per 10 ms period (cgroup v2:
`cpu.max` = "8500 10000" in a child of /sys/fs/cgroup; v1: cpu.cfs_quota_us 8500, cpu.cfs_period_us 10000 in
/sys/fs/cgroup/cpu/<child>; root, or a delegated cgroup, is needed: a container that mounts the cgroup file system
read-only refuses, in one sentence). Every thread's wall clock then stretches by 1/0.85 over long work (the matmul
measures about 88 GFLOP/s on one thread here), which is the wall clock to compare; the CPU seconds do not change.
The probe counts CPU time, so the plan's Python-level terms are not slowed with it (up to 15 % low where they
dominate: the process starts); a CPU slower by its clock slows both.

    python benchmarks/plan_accuracy.py --config quickstart --cpu-quota 0.85   # a ≤ 90 GFLOP/s machine, alone

With `--warm-starts` the stages start as quickstart.sh and smallest.sh start them (tools/exp_run.py): forked by a
server that has imported the stack (layersim_launch.fork_server), each forked stage's wall and CPU seconds from the
server's log (LAYERSIM_FORK_LOG, which names the DVC stage); the plan is the one those scripts print
(`python -m layersim.plan --warm-starts`).

`--measured` reads a kept project's stage log and dvc.lock instead of running (the plan's model changed, the run did
not); give the throughput the run had (`--device-flops`, the matmul line it printed) and its Python-level probe's
factor (`--python-scale`, the probe line), or each is measured now.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "src"))

from dvc_project import copy_repository, run  # noqa: E402
from layersim_launch.fork_client import ForkServer  # noqa: E402
from layersim_launch.dvc_cache import from_root  # noqa: E402 - dvc.lock paths are relative to each stage's wdir

CONFIGS = {"tiny": "smallest.sh", "quickstart": "quickstart.sh"}
FORK_LOG_NAME = "fork.log"  # in .plan-bench/: the fork server's log under --warm-starts
TOLERANCE = 0.30
# The stage processes' wall and CPU seconds: DVC runs each stage's `python ...` through the shell, which finds
# this first on PATH.
SHIM = """#!/usr/bin/env bash
start=$(date +%s.%N)
{python} "$@"
code=$?
end=$(date +%s.%N)
if [ -n "${{DVC_STAGE:-}}" ]; then
  times > {log}.times  # the builtin in this shell (in a pipe it would time a subshell): its children's CPU last
  echo "$DVC_STAGE $start $end $(tail -n 1 {log}.times)" >> {log}
fi
exit $code
"""


def launcher_overrides(script: str) -> list[str]:
    """The `-S key=value` arguments of a launcher script's `params=( ... )` array, as bash reads them."""
    text = (REPO / script).read_text()
    start = text.index("params=(")
    array = text[start:text.index("\n)", start) + 2]
    listed = subprocess.run(["bash", "-c", f'{array}\nprintf "%s\\0" "${{params[@]}}"'], capture_output=True,
                            text=True, check=True).stdout.split("\0")
    return [item for item in listed[:-1] if item != "-S"]


def matmul_gflops(threads: int) -> float:
    """torch's float32 2048² matmul on `threads` threads, GFLOP/s (the plan's own measure)."""
    from layersim.plan.machine import measured_cpu_flops

    return measured_cpu_flops(threads, repeats=5) / 1e9


def matmul_gflops_per_cpu_second() -> float:
    """The 2048² product on one thread over the CPU seconds it took (the plan's own measurement, best of 5): what one
    thread does alone, when other jobs share the cores and stretch its wall clock."""
    from layersim.plan.machine import measured_cpu_flops

    return measured_cpu_flops(1, repeats=5, clock=time.thread_time) / 1e9


def held_to(cores: float) -> str:
    """Move this process (and so every process it starts) into a cgroup with a quota of `cores` per 10 ms period;
    how, for the record."""
    period = 10_000
    quota = round(cores * period)
    v2 = Path("/sys/fs/cgroup/cgroup.controllers")
    group = Path("/sys/fs/cgroup" if v2.exists() else "/sys/fs/cgroup/cpu") / f"plan-accuracy-{os.getpid()}"
    try:
        group.mkdir(exist_ok=True)
        if v2.exists():
            (group / "cpu.max").write_text(f"{quota} {period}")
        else:
            (group / "cpu.cfs_period_us").write_text(str(period))
            (group / "cpu.cfs_quota_us").write_text(str(quota))
        (group / "cgroup.procs").write_text(str(os.getpid()))
    except OSError as err:
        raise SystemExit(f"--cpu-quota {cores}: this machine refuses a cgroup with a CPU quota at {group} ({err}); "
                         "run as root where the cgroup file system is writable, or under "
                         f"`systemd-run --scope -p CPUQuota={cores:.0%} ...` where systemd runs.") from None
    kind = f'cpu.max "{quota} {period}"' if v2.exists() else f"cpu.cfs_quota_us {quota}, cpu.cfs_period_us {period}"
    return f"CPU quota: {cores} of a core per 10 ms ({group}: {kind})"


def machine(quiet_gflops: float) -> list[str]:
    import torch

    from layersim.plan.machine import REFERENCE_PROBE_SECONDS, python_probe_seconds

    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines() if line.startswith("Model name")), "?")
    cores = os.cpu_count()
    probe = python_probe_seconds()
    return [f"CPU: {model}, {cores} logical cores; torch {torch.__version__}, {torch.get_num_threads()} threads",
            f"torch float32 2048² matmul: {matmul_gflops(1):.1f} GFLOP/s on 1 thread, "
            f"{matmul_gflops(cores):.1f} GFLOP/s on {cores} (wall clock); {quiet_gflops:.1f} GFLOP/s on 1 thread "
            "per CPU second",
            f"Python-level probe: {probe * 1e3:.2f} ms ({probe / REFERENCE_PROBE_SECONDS:.2f}× the reference CPU's)",
            f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {busy()}"]


def busy() -> str:
    """Other processes on the CPU now (ps: the share of a core each used over its life, 10 % or more), so that a
    table measured beside other work says so."""
    listed = subprocess.run(["ps", "-eo", "pid,pcpu,args", "--no-headers"], capture_output=True, text=True).stdout
    others = [(float(cpu), name[:60]) for pid, cpu, name in (line.split(None, 2) for line in listed.splitlines())
              if int(pid) != os.getpid() and float(cpu) >= 10]
    if not others:
        return "no other process busy"
    return f"{len(others)} other process(es) busy: " + ", ".join(f"{n} {c:.0f}%" for c, n in sorted(others)[::-1][:5])


def make_copy(root: Path, overrides: list[str]) -> dict:
    """This repository's files in `root` with the launcher's params, a git repository of its own, DVC's cache
    inside it, and the timing shim first on PATH."""
    import yaml

    from layersim.plan.__main__ import overridden

    copy_repository(root)
    doc = overridden(root / "params.yaml", overrides)
    (root / "params.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    shim = root / ".plan-bench"
    shim.mkdir()
    (shim / "python").write_text(SHIM.format(python=shlex.quote(sys.executable),
                                             log=shlex.quote(str(shim / "stages.log"))))
    (shim / "python").chmod(0o755)
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "DVC_NO_ANALYTICS": "1", "PATH": f"{shim}{os.pathsep}{os.environ['PATH']}",
           "GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@localhost", "GIT_COMMITTER_NAME": "bench",
           "GIT_COMMITTER_EMAIL": "bench@localhost"}
    for name in ("DVC_ROOT", "DVC_STAGE"):
        env.pop(name, None)
    (root / ".gitignore").write_text((root / ".gitignore").read_text() + "/.plan-bench/\n")
    for argv in (["git", "init", "-q", "-b", "main"], ["git", "add", "-A"], ["git", "commit", "-qm", "copy"]):
        run(argv, root, env)
    return env


def plan_name(stage: str) -> str:
    name = stage.split("@", 1)[0]
    return "download" if name.startswith("download_") else name


def seconds_of(clock: str) -> float:
    """`1m2.500s` (bash's `times`) in seconds."""
    minutes, rest = clock.split("m")
    return 60 * float(minutes) + float(rest.rstrip("s"))


def measured_times(log: Path) -> dict[str, dict[str, float]]:
    """Per plan stage: wall and CPU seconds and processes, from the timing shim's log or (warm starts) the fork
    server's."""
    found: dict[str, dict[str, float]] = defaultdict(lambda: {"wall": 0.0, "cpu": 0.0, "processes": 0})
    if log.name == FORK_LOG_NAME:
        for line in log.read_text().splitlines():
            entry = json.loads(line)
            if entry.get("stage"):
                row = found[plan_name(entry["stage"])]
                row["wall"], row["cpu"], row["processes"] = (row["wall"] + entry["wall"], row["cpu"] + entry["cpu"],
                                                             row["processes"] + 1)
        return dict(found)
    for line in log.read_text().splitlines():
        stage, start, end, user, system = line.split()
        row = found[plan_name(stage)]
        row["wall"] += float(end) - float(start)
        row["cpu"] += seconds_of(user) + seconds_of(system)
        row["processes"] += 1
    return dict(found)


def measured_bytes(root: Path) -> dict[str, int]:
    import yaml

    lock = yaml.safe_load((root / "dvc.lock").read_text())
    found: dict[str, int] = defaultdict(int)
    for stage, entry in lock["stages"].items():
        found[plan_name(stage)] += sum(out.get("size", 0) for out in entry.get("outs", [])
                                       if from_root(out["path"]).startswith("data/"))  # metrics and plots are not DVC-cached
    return dict(found)


def within(predicted: float, measured: float) -> str:
    if measured <= 0.01 and predicted <= 0.01:  # nothing to compare (a stage that writes no cached output)
        return "-"
    if measured <= 0:
        return "-"
    ratio = predicted / measured
    return f"{ratio:5.2f} {'ok' if 1 - TOLERANCE <= ratio <= 1 + TOLERANCE else 'OFF'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=CONFIGS, default="tiny")
    parser.add_argument("--keep", type=Path, help="run in this folder (created) and keep it")
    parser.add_argument("--measured", type=Path, help="a kept project (…/project) to plan again without running")
    parser.add_argument("--device-flops", type=float, help="the CPU's effective FLOP/s for the plan (default: measured)")
    parser.add_argument("--python-scale", type=float, help="the CPU's Python-level work against the reference CPU's "
                        "(the 'Python-level probe' line a run printed; default: the probe measured now)")
    parser.add_argument("--threads", type=int, help="torch threads for the stages and the plan's matmul (default: "
                        "torch's, one per core); 1 on a loaded machine, where CPU seconds then stand for a quiet run "
                        "(and the plan takes the matmul's FLOP/s per CPU second)")
    parser.add_argument("--warm-starts", action="store_true",
                        help="stages forked by a warm server, as quickstart.sh and smallest.sh run them")
    parser.add_argument("--cpu-quota", type=float, metavar="CORES",
                        help="run under a cgroup CPU quota of this many cores (0.85: a slower CPU, see above)")
    args = parser.parse_args()
    if args.cpu_quota is not None:
        if not 0.1 <= args.cpu_quota <= (os.cpu_count() or 1):
            parser.error(f"--cpu-quota {args.cpu_quota}: give the cores the run may use, 0.1 to {os.cpu_count()}")
        print(held_to(args.cpu_quota), flush=True)
    if args.threads:
        import torch

        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(args.threads)
        torch.set_num_threads(args.threads)

    from layersim.params import parse_params
    from layersim.plan import device, plan, seconds, terms
    from layersim.plan.__main__ import overridden
    from layersim.plan.machine import REFERENCE_PROBE_SECONDS, python_probe_seconds

    scale = args.python_scale or python_probe_seconds() / REFERENCE_PROBE_SECONDS
    if args.measured:
        warm = (args.measured / ".plan-bench" / FORK_LOG_NAME).exists()
        return replan(args.measured, replace(device("cpu", args.device_flops, python_scale=scale), warm_starts=warm))
    quiet = matmul_gflops_per_cpu_second()
    print("\n".join(machine(quiet)), flush=True)
    if args.threads == 1 and args.device_flops is None:  # the plan of the quiet machine, whose CPU seconds are measured
        args.device_flops = quiet * 1e9
    overrides = launcher_overrides(CONFIGS[args.config])
    scratch = args.keep or Path(tempfile.mkdtemp(prefix="plan-accuracy-"))
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        root = scratch / "project"
        env = make_copy(root, overrides)
        params = parse_params(overridden(root / "params.yaml", []))
        on = replace(device("cpu", args.device_flops, python_scale=scale), warm_starts=args.warm_starts)
        costs = plan(params, root)
        print(f"{args.config} ({CONFIGS[args.config]}): {params.model}, {len(params.tasks)} task(s), "
              f"{len(params.seeds)} seed(s), {params.finetune.max_steps} steps; plan on {on.name} at "
              f"{on.flops / 1e9:.0f} GFLOP/s ({on.basis})", flush=True)
        log = root / ".plan-bench" / (FORK_LOG_NAME if args.warm_starts else "stages.log")
        server = ForkServer(log=log) if args.warm_starts else None
        if server:
            env = server.environment(env)  # its `python` before the timing shim: the stages are forked
        start = time.perf_counter()
        try:
            run([sys.executable, "-m", "dvc", "repro"], root, env)
        finally:
            if server:
                server.stop()
        wall = time.perf_counter() - start
        times, sizes = measured_times(log), measured_bytes(root)
        report(costs, on, seconds, terms, times, sizes, wall)
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {busy()}")
    finally:
        if args.keep is None:
            shutil.rmtree(scratch, ignore_errors=True)


def replan(root: Path, on) -> None:
    from layersim.params import parse_params
    from layersim.plan import plan, seconds, terms
    from layersim.plan.__main__ import overridden

    # What the plan knew before the run: the project's own params, and no data/ (a downloaded model is read as the
    # registry describes it, as before the run).
    params = parse_params(overridden(root / "params.yaml", []))
    with tempfile.TemporaryDirectory() as before:
        costs = plan(params, Path(before))
    log = root / ".plan-bench" / (FORK_LOG_NAME if on.warm_starts else "stages.log")
    print(f"{root}: {params.model}, {len(params.seeds)} seed(s), {params.finetune.max_steps} steps (measured earlier)")
    report(costs, on, seconds, terms, measured_times(log), measured_bytes(root), float("nan"))


def report(costs, on, seconds, terms, times, sizes, wall) -> None:
    from layersim.plan import dvc_seconds

    header = (f"{'stage':<20} {'proc':>4} {'pred s':>8} {'wall s':>8} {'ratio':>8} {'cpu s':>8} {'ratio':>8} "
              f"{'pred MB':>9} {'meas MB':>9} {'ratio':>8}  predicted: its terms")
    print(header + "\n" + "-" * len(header))
    predicted = {c.stage: c for c in costs}
    names = list(predicted) + [name for name in times if name not in predicted]
    pred_total = meas_cpu = meas_wall = 0.0
    for name in names:
        cost, got = predicted.get(name), times.get(name, {"wall": 0.0, "cpu": 0.0, "processes": 0})
        p = seconds(cost, on) if cost else 0.0
        pb, mb = (cost.bytes if cost else 0) / 1e6, sizes.get(name, 0) / 1e6
        pred_total, meas_wall, meas_cpu = pred_total + p, meas_wall + got["wall"], meas_cpu + got["cpu"]
        print(f"{name:<20} {got['processes']:>4} {p:>8.1f} {got['wall']:>8.1f} {within(p, got['wall']):>8} "
              f"{got['cpu']:>8.1f} {within(p, got['cpu']):>8} {pb:>9.2f} {mb:>9.2f} {within(pb, mb):>8}  "
              + (" ".join(f"{k} {v:.1f}" for k, v in terms(cost, on).items() if v >= 0.05) if cost else ""))
    print(f"{'stages':<20} {'':>4} {pred_total:>8.1f} {meas_wall:>8.1f} {within(pred_total, meas_wall):>8} "
          f"{meas_cpu:>8.1f} {within(pred_total, meas_cpu):>8}")
    between = dvc_seconds(costs, on)
    print(f"{'dvc repro (all)':<20} {'':>4} {pred_total + between:>8.1f} {wall:>8.1f} "
          f"{within(pred_total + between, wall):>8}   (DVC's own time between stages: {wall - meas_wall:.1f} s, "
          f"planned {between:.1f})")
    print(f"plan's device: {on.name} at {on.flops / 1e9:.0f} GFLOP/s ({on.basis}); ratio: predicted / measured, "
          f"ok within ±{TOLERANCE:.0%}; cpu s: user + system of the stage processes")


if __name__ == "__main__":
    main()
