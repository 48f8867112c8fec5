"""`layersim launch` (the stale nodes as Ray tasks), `layersim push` (`dvc push`, the remote's verify and DVC's cache
checked first) and `layersim install-hook` (git's pre-push hook runs that cache check).

launch: see layersim_launch.runner; push: layersim_launch.dvc_cache and layersim_launch.sharing."""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

from layersim_launch.runner import (PARAMS, WORKSPACES, NodeFailed, Resources, RestoreFailed, committed_head,
                                    dvc_command, launch)

PROBE_SECONDS = 5.0   # a TCP connection to a live head opens in milliseconds
INIT_SECONDS = 30.0   # ray.init retries an unreachable GCS for ever: together under 45 s, then one error line
RAY_PORT = 6379       # Ray's default GCS port, for an address without one
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # + an empty SETTINGS


def unreachable(address: str, timeout: float | None = None) -> str | None:
    """Why no TCP connection opens to the Ray cluster at `address` (`host[:port]` or `ray://host:port`), or None
    when one does; `auto` (this host's cluster, which Ray finds itself) is not probed."""
    if address == "auto":
        return None
    timeout = PROBE_SECONDS if timeout is None else timeout
    where = address.split("://", 1)[-1].rstrip("/")
    host, colon, port = where.rpartition(":")
    if not colon or "]" in port:  # no port given (an IPv6 literal's colons are inside brackets)
        host, port = where, str(RAY_PORT)
    if not port.isdigit() or not 0 < int(port) < 65536:
        return f"{port!r} is not a port number"
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as connection:
            # A Ray head (GCS or Ray Client server) speaks gRPC, i.e. HTTP/2: its first frame is SETTINGS (type 4).
            # A proxy or firewall that accepts every connection, or another service, sends no such frame.
            connection.sendall(HTTP2_PREFACE)
            header = b""
            while len(header) < 9:
                chunk = connection.recv(9 - len(header))
                if not chunk:
                    return "the connection closed without an answer from a Ray head"
                header += chunk
            return None if header[3] == 4 else "what answers there is not a Ray head (no gRPC)"
    except socket.timeout:
        return f"no answer within {timeout:g} s"
    except OSError as error:  # refused, unknown host, network unreachable
        return error.strerror or str(error)


def _within(seconds: float, message: str, call):
    """`call()`, or `message` on stderr and exit status 2 once `seconds` pass: Ray's connection retries cannot
    be interrupted from Python, so the whole process ends."""
    stderr = os.dup(2)  # the terminal's, even while `call` sends file descriptor 2 elsewhere

    def expire():
        os.write(stderr, f"{message}\n".encode())
        os._exit(2)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    try:
        return call()
    finally:
        timer.cancel()
        os.close(stderr)


@contextlib.contextmanager
def _quiet_stderr():
    """File descriptor 2 into a discarded file: Ray's C++ client logs its connection attempts there, which would
    add lines around the one error line (Ray's exception, which the error names, says what failed)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _connect(args):
    """Ray, connected to the cluster at --address or to a new local one; None after one error line."""
    where = f"the Ray cluster at {args.address}" if args.address else "a local Ray cluster"
    remedy = ("start it with `ray start --head` there, check the address (`ray status` on the head prints it), or "
              "leave --address out to start a local cluster")
    why = unreachable(args.address) if args.address else None
    if why:
        print(f"error: cannot reach {where} ({why}); {remedy}.", file=sys.stderr)
        return None

    def connect():
        import ray

        if args.address:
            with _quiet_stderr():
                ray.init(address=args.address, log_to_driver=False)
        else:
            ray.init(num_gpus=args.gpus, num_cpus=args.cpus, log_to_driver=False)
        return ray

    try:
        if not args.address:
            return connect()
        return _within(INIT_SECONDS, f"error: {where} did not answer within {INIT_SECONDS:g} s (an open port that "
                       f"is not a Ray head?); {remedy}.", connect)
    except ImportError:
        print("error: layersim launch needs Ray; install it with `pip install -e .[ray]`.", file=sys.stderr)
    except Exception as error:  # noqa: BLE001 - Ray raises ConnectionError and others
        if args.address and os.environ.get("RAY_AUTH_MODE") != "token":  # Ray's own message may not say so
            remedy += ("; a cluster with token authentication (Ray's default where its head found a token) needs "
                       "RAY_AUTH_MODE=token and the token here too (docs/scale-out.md, several machines)")
        print(f"error: could not start or reach {where}: {str(error).strip()}{'; ' + remedy if args.address else ''}.",
              file=sys.stderr)
    return None


def _shutdown(ray) -> None:
    if ray is not None:
        ray.shutdown()


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
    p.add_argument("--dry", action="store_true", help="list the nodes that would run, with their resources, and say "
                                                      "which would wait for ever on this cluster")
    p.add_argument("-S", "--set-param", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="set a params.yaml value first, as `dvc exp run -S` does (Hydra override syntax, e.g. "
                        "-S model=tiny-gpt2 -S 'seeds=[1,2]'); --dry leaves the file as it was")
    p.add_argument("targets", nargs="*", help="only these nodes (e.g. finetune@rte-1) and what they read from")
    p = commands.add_parser("push", help="`dvc push` once the remote is known to verify pulls (verify true in "
                                         ".dvc/config) and DVC's cache is checked against dvc.lock (no output was "
                                         "edited in place through its link into the cache); other arguments go to "
                                         "dvc push")
    p.add_argument("--root", default=".", help="the DVC workspace (default: here)")
    p = commands.add_parser("install-hook", help="git's pre-push hook runs the check of `layersim push` first, so "
                                                 "that `git push` stops at an output edited in place")
    p.add_argument("--root", default=".", help="the git checkout (default: here)")
    return top


def push(root: Path, dvc_args: list[str]) -> int:
    """`dvc push` with `dvc_args`, refused in one sentence when the remote does not verify a colleague's pulls, or a
    cache object dvc.lock names holds other bytes than its name (layersim_launch.dvc_cache): DVC would upload them
    as they are."""
    import subprocess

    from layersim_launch.dvc_cache import refuse_damaged
    from layersim_launch.sharing import refuse_unverified_remote
    from layersim.errors import LayersimError

    try:
        refuse_unverified_remote(root, dvc_args)
        refuse_damaged(root, "dvc push")
    except LayersimError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return subprocess.run([*dvc_command(), "push", *dvc_args], cwd=root).returncode


def install_hook(root: Path) -> int:
    """`layersim install-hook`: git's pre-push hook of the checkout at `root` (layersim_launch.sharing)."""
    from layersim_launch.sharing import install_hook as write_hook
    from layersim.errors import LayersimError

    try:
        hook = write_hook(root)
    except LayersimError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"layersim install-hook: git push now checks DVC's cache against dvc.lock first ({hook})")
    return 0


def _cluster_gpus(args) -> float:
    """GPUs of the cluster a launch would use: --address's (asked of it), --gpus, or what this machine has."""
    if args.address:
        ray = _connect(args)
        if ray is not None:
            try:
                return ray.cluster_resources().get("GPU", 0)
            finally:
                ray.shutdown()
    if args.gpus is not None:
        return args.gpus
    import torch

    return torch.cuda.device_count()


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    root = Path(args.root).resolve()
    if args.command == "push":
        return push(root, extra)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "install-hook":
        return install_hook(root)
    from layersim.errors import LayersimError

    try:
        commit = committed_head(root) if args.workspace == "clone" and not args.dry else None  # before any -S
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        before = set_params(root / PARAMS, args.overrides)
    except LayersimError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        return _launch(args, root, commit)
    finally:
        if args.dry and before is not None:
            (root / PARAMS).write_text(before, encoding="utf-8")


def set_params(path: Path, overrides: list[str]) -> str | None:
    """Apply `-S` overrides to params.yaml as `dvc exp run -S` does (DVC's own Hydra code), checked like every
    stage checks params; returns the file as it was (None without overrides). A value params refuse leaves the
    file as it was, and is one sentence."""
    from layersim.errors import LayersimError
    from layersim.params import load_params

    if not overrides:
        return None
    from dvc.utils.hydra import apply_overrides

    before = path.read_text(encoding="utf-8")
    try:
        apply_overrides(path, list(overrides))
        load_params(path)
    except LayersimError:
        path.write_text(before, encoding="utf-8")
        raise
    except Exception as error:  # noqa: BLE001 - Hydra's grammar and DVC's errors: the override is what is wrong
        path.write_text(before, encoding="utf-8")
        from layersim.params.overrides import refused_override

        explained = refused_override(path, list(overrides))  # an unknown key's did-you-mean, a key to add with +
        if explained is not None:
            raise explained from None
        raise LayersimError(f"-S {' -S '.join(overrides)} cannot be applied to {path.name}: "
                            f"{str(error).strip().splitlines()[0]}; write KEY=VALUE as for `dvc exp run -S`.") from None
    return before


def _launch(args, root: Path, commit: str | None) -> int:
    from layersim.errors import LayersimError
    from layersim.params import load_params
    from layersim_launch.graph import pipeline, stale, upstream_of

    from layersim_launch.dvc_cache import refuse_damaged

    try:
        settings = load_params(root / args.params).launch
        # Nodes DVC restores from the run-cache run no stage code, so none of them would check DVC's cache.
        refuse_damaged(root, "layersim launch")
        for flag, value in (("--gpus", args.gpus), ("--cpus", args.cpus)):
            if value is not None and not value >= 0:
                raise LayersimError(f"{flag} must be a non-negative number, got {value}.")
    except LayersimError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    resources = Resources(settings.gpu_stages, settings.num_gpus, settings.num_cpus, settings.retries)
    # A cluster given by address is reached first (nothing runs without it): within PROBE_SECONDS + INIT_SECONDS,
    # whatever the size of the pipeline that `dvc status` reads next.
    ray = _connect(args) if args.address and not args.dry else None
    if args.address and not args.dry and ray is None:
        return 2
    try:
        graph = pipeline(root)
    except Exception as error:  # noqa: BLE001 - DVC's errors (not a DVC repository, a broken dvc.yaml)
        _shutdown(ray)
        print(f"error: cannot read the DVC pipeline in {root}: {error}", file=sys.stderr)
        return 2
    try:
        nodes = stale(root, upstream_of(graph, args.targets) if args.targets else graph, dvc_command())
    except ValueError as error:
        _shutdown(ray)
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not nodes:
        _shutdown(ray)
        print("layersim launch: every stage is up to date")
        return 0
    if args.dry:
        for node in nodes:
            print(f"{node.address}  {resources.of(node)}")
        gpus = _cluster_gpus(args)
        waiting = [node.address for node in nodes if resources.of(node).get("num_gpus", 0) > gpus]
        if waiting:
            print(f"warning: {len(waiting)} of these nodes ({', '.join(waiting[:3])}{' …' if len(waiting) > 3 else ''}) "
                  f"ask for {resources.num_gpus:g} GPU each (launch.gpu_stages), but the cluster has {gpus:g}, so "
                  "`layersim launch` would refuse to start; give the cluster GPUs (--gpus N on one machine) or set "
                  "launch.gpu_stages: [] to run every stage on CPUs.", file=sys.stderr)
        return 0
    start = time.perf_counter()
    ray = ray or _connect(args)
    if ray is None:
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
                         report=lambda line: print(line, flush=True), commit=commit)
    except NodeFailed as error:
        print(f"error: {error}. The nodes that did not need it finished; run `layersim launch` again to "
              "continue from there.", file=sys.stderr)
        return 1
    except RestoreFailed as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    finally:
        ray.shutdown()
    print(f"\n{'node':<40} {'seconds':>8}  Ray node")
    for result in sorted((r for r in results if r.status == "done"), key=lambda r: -r.seconds):
        print(f"{result.address:<40} {result.seconds:>8.1f}  {(result.node or '')[:12]}")
    print(f"{len(results)} nodes in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
