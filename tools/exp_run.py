"""`dvc exp run` with the arguments given (quickstart.sh and smallest.sh run their experiment through it), less DVC's
warning for each output that no run has made yet.

Before reproducing, `dvc exp run` checks out every cached output of the pipeline from the cache; an output with no
entry in dvc.lock (all of them in a fresh clone, which ships no dvc.lock; a stage added since the last run) has no
hash to check out, and DVC says so, once per output and with its absolute path: "WARNING: No file hash info found for
'<path>'. It won't be created." The stage that makes the output runs next, so the message asks nothing of the user.
Every other message, and the stages' own output, passes as `dvc exp run` prints it.

The stages start warm: a server that has imported the third-party stack (torch, transformers, SciPy, ...) forks a
process for each stage DVC starts (layersim_launch.fork_server), which saves each stage the seconds of imports a
fresh interpreter pays (about 6 s of one core per model stage on a 2-core machine). What the stages compute is the
same either way; LAYERSIM_FORK_SERVER=0 starts each afresh.

Usage: python tools/exp_run.py [dvc exp run arguments]
"""

from __future__ import annotations

import logging
import os
import sys

# The logger and the message of dvc_data.index.checkout._create_files (dvc-data 3.x).
CHECKOUT_LOGGER = "dvc_data.index.checkout"
NEVER_MADE = "No file hash info found for "


class NeverMadeOutputs(logging.Filter):
    """Drops the checkout's warning about an output that has no hash (no run has made it yet)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(NEVER_MADE)


def main(argv: list[str]) -> int:
    from dvc.cli import main as dvc_main

    from layersim_launch.fork_client import ForkServer

    logging.getLogger(CHECKOUT_LOGGER).addFilter(NeverMadeOutputs())
    server = ForkServer()
    os.environ.update(server.environment(dict(os.environ)))  # its `python` first on PATH: DVC's stages use it
    try:
        return dvc_main(["exp", "run", *argv])
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
