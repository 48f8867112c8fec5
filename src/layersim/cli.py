"""What every stage script shares: argument parsing, params, quiet library logs, one-line errors."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

from layersim.errors import LayersimError
from layersim.params import Params, load_params

log = logging.getLogger("layersim")


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--params", type=Path, default=Path("params.yaml"), help="params file (default: params.yaml)")
    return p


def run_stage(main: Callable[[argparse.Namespace, Params], None], args: argparse.Namespace, *,
              quiet_transformers: bool = True) -> None:
    """Validate params.yaml, then run `main`; a LayersimError becomes one line on stderr and exit code 1.

    Validation comes first, before any library set-up, so that bad params fail before the stage reads
    or writes anything."""
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    try:
        params = load_params(args.params)
        if quiet_transformers:  # seconds of import: only for the stages that load models
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
            import transformers

            transformers.logging.set_verbosity_error()
            transformers.logging.disable_progress_bar()
        main(args, params)
    except LayersimError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
