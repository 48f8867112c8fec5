"""What every stage script shares: argument parsing, params, quiet library logs, one-line errors."""

from __future__ import annotations

import argparse
import errno
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

from layersim.errors import DiskFullError, LayersimError
from layersim.params import Params, load_params

log = logging.getLogger("layersim")


class _StageParser(argparse.ArgumentParser):
    """Fills in dvc.yaml's placeholders (@model, @task, @seed) from the validated params before parsing, so
    that no params value ever passes through a shell (layersim.params.stage_args)."""

    def parse_known_args(self, args=None, namespace=None):
        from layersim.params.stage_args import STAGE_ENV, fill_placeholders, has_placeholders

        argv = sys.argv[1:] if args is None else list(args)
        if has_placeholders(argv):
            pre = argparse.ArgumentParser(add_help=False)
            pre.add_argument("--params", type=Path, default=Path("params.yaml"))
            try:
                argv = fill_placeholders(argv, load_params(pre.parse_known_args(argv)[0].params),
                                         os.environ.get(STAGE_ENV))
            except LayersimError as err:
                self.exit(1, f"error: {err}\n")
        return super().parse_known_args(argv, namespace)


def parser(description: str) -> argparse.ArgumentParser:
    p = _StageParser(description=description)
    p.add_argument("--params", type=Path, default=Path("params.yaml"), help="params file (default: params.yaml)")
    return p


def check_separate(args: argparse.Namespace, *names: str) -> None:
    """Refuse output arguments that are the same folder or inside one another (after resolving `..` and
    links): one would overwrite or delete the other, e.g. finetune's --out and --resume."""
    given = [(name, Path(getattr(args, name)).resolve()) for name in names if getattr(args, name, None)]
    for i, (a, path_a) in enumerate(given):
        for b, path_b in given[i + 1:]:
            if path_a == path_b or path_a in path_b.parents or path_b in path_a.parents:
                raise LayersimError(f"--{a.replace('_', '-')} {getattr(args, a)} and --{b.replace('_', '-')} "
                                    f"{getattr(args, b)} are the same folder or inside one another ({path_a}, "
                                    f"{path_b}); give each its own folder, as dvc.yaml does.")


def _remove_stale_temporaries(args: argparse.Namespace) -> None:
    """Temporaries a killed run of this stage left beside its paths (their writers are dead)."""
    from layersim.data.io import remove_stale_temporaries

    for value in vars(args).values():
        if isinstance(value, Path) and value.parent.is_dir():
            for leftover in remove_stale_temporaries(value):
                log.info("removed %s, left by an interrupted run", leftover)


def run_stage(main: Callable[[argparse.Namespace, Params], None], args: argparse.Namespace, *,
              quiet_transformers: bool = True, analysis: bool = False) -> None:
    """Validate params.yaml, then run `main`; a LayersimError becomes one line on stderr and exit code 1.

    Validation comes first, before any library set-up, so that bad params fail before the stage reads
    or writes anything. `analysis`: the stage computes similarity nulls, which then run on the `device` param's
    device (layersim.compute.device.analysis_on: the GPU under `auto` when there is one)."""
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    try:
        params = load_params(args.params)
        if os.environ.get("DVC_STAGE"):  # run by DVC: no output was edited in place through its cache link
            from layersim_launch.dvc_cache import refuse_damaged

            refuse_damaged(os.environ.get("DVC_ROOT", "."), "this stage runs")
        _remove_stale_temporaries(args)
        if quiet_transformers:  # seconds of import: only for the stages that load models
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
            import transformers

            transformers.logging.set_verbosity_error()
            transformers.logging.disable_progress_bar()
        if analysis:
            from layersim.compute.device import analysis_on, resolve_device

            with analysis_on(resolve_device(params.device)):
                main(args, params)
        else:
            main(args, params)
        # After the outputs, so that the record describes a finished run (docs/outputs.md, "Environment").
        from layersim.data.run_environment import write_environment_record

        write_environment_record()
    except DiskFullError as err:
        print(f"error: {_disk_full(err.path, err.atomic)}", file=sys.stderr)
        sys.exit(1)
    except LayersimError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
    except OSError as err:
        if err.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        print(f"error: {_disk_full(err.filename, atomic=False)}", file=sys.stderr)  # not through layersim.data.io
        sys.exit(1)


def _disk_full(path, atomic: bool) -> DiskFullError:
    """The full-disk sentence, claiming only what holds: under DVC (DVC_STAGE set) DVC removed the stage's outputs
    before its command started, so none is intact, but `dvc checkout` restores those dvc.lock records; outside DVC an
    atomic write leaves earlier outputs intact, any other write perhaps a file cut short (the next run rewrites it)."""
    from layersim.data.run_environment import STAGE_ENV

    stage = os.environ.get(STAGE_ENV)
    if stage:
        return DiskFullError(path, atomic, f"and DVC had removed this stage's earlier outputs before it ran: `dvc "
                                           f"checkout {stage}` restores the ones dvc.lock records from the cache")
    return DiskFullError(path, atomic, "earlier outputs are intact" if atomic else "which running it again rewrites")
