"""The integration tests' fork server is the run scripts' (layersim_launch.fork_server, which says what a forked stage
differs in; layersim_launch.fork_client starts it): the tests import it by this name, and its SERVER is the test
process's, started on first use (under xdist by the controller, tests/conftest.py)."""

from layersim_launch.fork_client import ANCESTORS, SERVER, ForkServer, environment, python  # noqa: F401
from layersim_launch.fork_server import FORK_LOG, SHARED_SERVER  # noqa: F401
