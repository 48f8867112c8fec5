"""`layersim launch`: the pipeline's stale nodes as Ray tasks (see layersim_launch.runner)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from layersim_launch.runner import WORKSPACES, NodeFailed, Resources, dvc_command, launch


def _parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="layersim", description=__doc__.splitlines()[0])
    commands = top.add_subparsers(dest="command", required=True)
    p = commands.add_parser("launch", help="run the pipeline's stale stages and matrix items as Ray tasks")
    p.add_argument("--address", help="a running Ray cluster (`auto` for the one this host belongs to); "
                                     "default: start a local one")
    p.add_argument("--gpus", type=float, help="GPUs of the local cluster (default: what Ray detects)")
    p.add_argument("--cpus", type=float, help="CPUs of the local cluster (default: what Ray detects)")
    p.add_argument("--workspace", choices=WORKSPACES, default="shared",
                   help="shared: every task in this workspace (one host); clone: each task in its own clone of "
                        "HEAD sharing the DVC cache (several hosts)")
    p.add_argument("--params", default="params.yaml", help="params file whose `launch` section sets resources")
    p.add_argument("--root", default=".", help="the DVC workspace (default: here)")
    p.add_argument("--dry", action="store_true", help="list the nodes that would run, with their resources")
    p.add_argument("targets", nargs="*", help="only these nodes (e.g. finetune@rte-1) and what they read from")
    return top


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from layersim.errors import LayersimError
    from layersim.params import load_params
    from layersim_launch.graph import pipeline, stale, upstream_of

    root = Path(args.root).resolve()
    try:
        settings = load_params(root / args.params).launch
        for flag, value in (("--gpus", args.gpus), ("--cpus", args.cpus)):
            if value is not None and not value >= 0:
                raise LayersimError(f"{flag} must be a non-negative number, got {value}.")
    except LayersimError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    resources = Resources(settings.gpu_stages, settings.num_gpus, settings.num_cpus, settings.retries)
    try:
        graph = pipeline(root)
    except Exception as error:  # noqa: BLE001 - DVC's errors (not a DVC repository, a broken dvc.yaml)
        print(f"error: cannot read the DVC pipeline in {root}: {error}", file=sys.stderr)
        return 2
    try:
        nodes = stale(root, upstream_of(graph, args.targets) if args.targets else graph, dvc_command())
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not nodes:
        print("layersim launch: every stage is up to date")
        return 0
    if args.dry:
        for node in nodes:
            print(f"{node.address}  {resources.of(node)}")
        return 0
    try:
        import ray
    except ImportError:
        print("error: layersim launch needs Ray; install it with `pip install -e .[ray]`.", file=sys.stderr)
        return 2
    start = time.perf_counter()
    try:
        if args.address:
            ray.init(address=args.address, log_to_driver=False)
        else:
            ray.init(num_gpus=args.gpus, num_cpus=args.cpus, log_to_driver=False)
    except Exception as error:  # noqa: BLE001 - Ray raises ConnectionError and others
        where = f"the Ray cluster at {args.address}" if args.address else "a local Ray cluster"
        print(f"error: could not start or reach {where}: {error}", file=sys.stderr)
        return 2
    print(f"layersim launch: {len(nodes)} nodes on {ray.cluster_resources()} ({args.workspace} workspace)", flush=True)
    gpus = ray.cluster_resources().get("GPU", 0)
    wanted = max((resources.of(node).get("num_gpus", 0) for node in nodes), default=0)
    if wanted > gpus:
        ray.shutdown()
        print(f"error: the stages in launch.gpu_stages ask for {wanted:g} GPU per task, but the Ray cluster has "
              f"{gpus:g}, so they would wait for ever; give the cluster GPUs (--gpus N on one machine) or set "
              "launch.gpu_stages: [] to run every stage on CPUs.", file=sys.stderr)
        return 2
    try:
        results = launch(root, nodes, resources, workspace=args.workspace,
                         report=lambda line: print(line, flush=True))
    except NodeFailed as error:
        print(f"error: {error}. The nodes that did not need it finished; run `layersim launch` again to "
              "continue from there.", file=sys.stderr)
        return 1
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    finally:
        ray.shutdown()
    print(f"\n{'node':<40} {'seconds':>8}")
    for result in sorted((r for r in results if r.status == "done"), key=lambda r: -r.seconds):
        print(f"{result.address:<40} {result.seconds:>8.1f}")
    print(f"{len(results)} nodes in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
