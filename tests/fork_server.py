"""The integration tests' fork server is the run scripts' (layersim_launch.fork_server, which says what a forked stage
differs in): the tests import it by this name, and its SERVER is the test process's, started on first use (under
xdist by the controller, tests/conftest.py)."""

from layersim_launch.fork_server import (ANCESTORS, FORK_LOG, SERVER, SHARED_SERVER, ForkServer,  # noqa: F401
                                         environment, python)
