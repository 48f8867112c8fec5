"""`layersim launch --address` never hangs: a refused, unroutable or silent cluster ends with one error line
naming the address (layersim_launch.cli)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

import layersim_launch.cli as launch_cli
from dvc_project import repository_params, tiny_params


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(tiny_params(repository_params()), sort_keys=False))
    return tmp_path  # no DVC project: the address is probed before the pipeline is read


@pytest.fixture(scope="module")
def silent() -> str:
    """A port that accepts connections and never answers: what an unroutable address behind a proxy looks like."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield f"127.0.0.1:{server.getsockname()[1]}"


@pytest.mark.parametrize("address, why", [
    ("127.0.0.1:1", "refused"),
    ("ray://127.0.0.1:1", "refused"),
    ("SILENT", "no answer within 0.5 s"),
    ("127.0.0.1:http", "'http' is not a port number"),
    ("no-such-host.invalid:6379", ""),
])
def test_an_unreachable_cluster_is_one_error_line(root: Path, silent: str, address: str, why: str, monkeypatch,
                                                  capsys) -> None:
    address = address.replace("SILENT", silent)
    monkeypatch.setattr(launch_cli, "PROBE_SECONDS", 0.5)
    assert launch_cli.main(["launch", "--address", address, "--root", str(root)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and captured.out == "", captured
    assert lines[0].startswith(f"error: cannot reach the Ray cluster at {address} (") and why in lines[0].lower()
    assert "ray start --head" in lines[0]


def test_a_grpc_server_is_reachable_and_anything_else_is_not() -> None:
    """A Ray head answers the HTTP/2 preface with a SETTINGS frame (type 4), as this fake one does."""
    def serve(server: socket.socket, answer: bytes) -> None:
        connection, _ = server.accept()
        with connection:
            connection.recv(len(launch_cli.HTTP2_PREFACE))
            connection.sendall(answer)

    for answer, expected in [(bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]), None),
                             (b"HTTP/1.1 400 Bad Request\r\n", "what answers there is not a Ray head (no gRPC)"),
                             (b"", "the connection closed without an answer from a Ray head")]:
        with socket.socket() as server:
            server.bind(("127.0.0.1", 0))
            server.listen()
            thread = threading.Thread(target=serve, args=(server, answer))
            thread.start()
            assert launch_cli.unreachable(f"127.0.0.1:{server.getsockname()[1]}", timeout=5) == expected
            thread.join()
    assert launch_cli.unreachable("auto") is None  # Ray finds this host's cluster itself


# ray.init never returning (an intercepting proxy answered the probe): main ends within INIT_SECONDS, one line.
HANGING_RAY = """
import sys, time, types
import layersim_launch.cli as c, layersim_launch.graph as g
sys.modules["ray"] = types.SimpleNamespace(init=lambda **kwargs: time.sleep(60))
c.INIT_SECONDS, c.unreachable = 1, lambda address: None
g.pipeline, g.stale = (lambda root: None), (lambda root, graph, dvc: ["a node"])
sys.exit(c.main(["launch", "--address", "10.255.255.1:6379", "--root", sys.argv[1]]))
"""


def test_a_cluster_that_never_answers_ends_with_one_line(root: Path) -> None:
    result = subprocess.run([sys.executable, "-c", HANGING_RAY, str(root)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stdout == "", result
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: the Ray cluster at 10.255.255.1:6379 did not answer "
                                                   "within 1 s"), result.stderr
    assert launch_cli._within(5, "unused", lambda: 7) == 7  # a call that returns in time returns its value
