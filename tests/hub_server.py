"""A Hugging Face hub on 127.0.0.1 for tests: olah (a self-hosted hub mirror, PyPI `olah`) serving git
repositories built in the test, offline, behind a small proxy that fixes the one answer olah gets wrong for
the code we run.

``HubServer(root)`` serves ``root/models/<owner>/<name>`` and ``root/datasets/<owner>/<name>`` (git
repositories; :func:`commit_folder` makes them) at ``HubServer.url``: point ``HF_ENDPOINT`` at it.

What olah 0.5.4 serves from a local git repository, as the hub does: ``/api/{models,datasets}/<id>/revision/
<branch, tag or commit>`` (the sha and file list), ``/api/.../refs`` (branches, tags and the ``refs/convert/*``
refs), ``/api/.../tree/<rev>/<path>``, ``/api/.../paths-info/<rev>``, and ``resolve/<rev>/<file>`` with the
hub's ``X-Repo-Commit`` and ``ETag`` headers. What it does not:
- a revision whose name holds a '/' (``refs/convert/parquet``, ``refs/pr/1``) in any URL: the client
  percent-encodes the '/' and olah's router decodes it before matching, so the request 404s. layersim never
  sends one: it resolves such a ref through the refs API (``list_repo_refs``, which olah serves) and reads by
  commit;
- ``/api/<type>/<id>`` without a revision (offline it asks huggingface.co for the head): 401. layersim always
  names a revision;
- a tree listing of a folder absent at a commit that exists: olah answers 401 "Repository not found", the hub
  404 with ``X-Error-Code: EntryNotFound``. transformers lists ``additional_chat_templates/`` when it loads a
  tokenizer and only tolerates the hub's answer, so the proxy here gives it: the one stand-in.
Both servers bind 127.0.0.1 only; olah exits by itself after `lifetime` seconds if the test never stops it.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

_TREE = re.compile(r"^/api/(models|datasets)/([^/?]+)/([^/?]+)/tree/[^/?]+/[^?]+")
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "host"}
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}


def git(folder: Path, *args: str) -> str:
    import os

    return subprocess.run(["git", *args], cwd=folder, env={**os.environ, **GIT_ENV}, capture_output=True,
                          text=True, check=True).stdout.strip()


def commit_folder(repo: Path, message: str, ref: str | None = None) -> str:
    """Commit everything in the git repository `repo` (created if needed, branch main), or with `ref`
    (e.g. ``refs/convert/parquet``) commit the folder's files onto that ref as the hub's Parquet conversion
    does (a history of its own, the branch left as it was); return the commit's sha."""
    repo.mkdir(parents=True, exist_ok=True)
    if not (repo / ".git").exists():
        git(repo, "init", "-q", "-b", "main")
    if ref is None:
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "--allow-empty", "-m", message)
        return git(repo, "rev-parse", "HEAD")
    # A commit on `ref` alone: the index is built from the folder, then restored to the branch's.
    git(repo, "add", "-A")
    tree = git(repo, "write-tree")
    parent = ["-p", git(repo, "rev-parse", ref)] if git(repo, "for-each-ref", ref) else []
    sha = git(repo, "commit-tree", tree, *parent, "-m", message)
    git(repo, "update-ref", ref, sha)
    git(repo, "read-tree", "HEAD")
    return sha


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HubServer:
    """olah on a free port of 127.0.0.1 and the proxy in front of it; a context manager that stops both."""

    def __init__(self, root: Path, lifetime: int = 600):
        self.root, self.lifetime = Path(root), lifetime
        self.olah_port = _free_port()

    def __enter__(self) -> HubServer:
        work = self.root.parent / f"{self.root.name}-olah"
        work.mkdir(exist_ok=True)
        config = work / "olah.toml"
        config.write_text(
            f'[basic]\nhost = "127.0.0.1"\nport = {self.olah_port}\nrepos-path = "{work / "cache"}"\n'
            f'mirrors-path = ["{self.root}"]\nmirror-netloc = "127.0.0.1:{self.olah_port}"\n'
            f'mirror-lfs-netloc = "127.0.0.1:{self.olah_port}"\n[accessibility]\noffline = true\n')
        # signal.alarm bounds olah's life even if this process dies without stopping it.
        launcher = (f"import signal, sys, runpy; signal.alarm({int(self.lifetime)}); "
                    f"sys.argv = ['olah', '-c', {str(config)!r}, '--log-path', {str(work / 'logs')!r}]; "
                    "runpy.run_module('olah.server', run_name='__main__')")
        self._log = open(work / "server.log", "wb")
        self._olah = subprocess.Popen([sys.executable, "-c", launcher], stdout=self._log, stderr=subprocess.STDOUT)
        self._proxy = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._proxy.serve_forever, daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._proxy.server_address[1]}"
        self._wait_ready(work / "server.log")
        return self

    def _wait_ready(self, log: Path, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._olah.poll() is not None:
                self.__exit__()
                raise RuntimeError(f"olah exited ({self._olah.returncode}):\n{log.read_text()[-3000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.olah_port), timeout=1):
                    return
            except OSError:
                time.sleep(0.2)
        self.__exit__()
        raise RuntimeError(f"olah did not start within {timeout} s:\n{log.read_text()[-3000:]}")

    def __exit__(self, *exc) -> None:
        self._proxy.shutdown()
        self._proxy.server_close()
        self._olah.terminate()
        try:
            self._olah.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._olah.kill()
            self._olah.wait()
        self._log.close()


def _handler(hub: HubServer):
    class Proxy(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet: pytest shows failures, not every request
            pass

        def _forward(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP | {"content-length"}}
            connection = http.client.HTTPConnection("127.0.0.1", hub.olah_port, timeout=60)
            connection.request(self.command, self.path, body=body or None, headers=headers)
            response = connection.getresponse()
            status, reply_headers, data = response.status, response.getheaders(), response.read()
            connection.close()
            tree = _TREE.match(self.path)
            if status == 401 and tree and (hub.root / tree[1] / tree[2] / tree[3]).is_dir():
                # The repository is here: the folder is what is missing (the hub's answer, see the docstring).
                status, data = 404, json.dumps({"error": "Entry not found"}).encode()
                reply_headers = [("Content-Type", "application/json"), ("X-Error-Code", "EntryNotFound")]
            self.send_response(status)
            length = dict((k.lower(), v) for k, v in reply_headers).get("content-length", "0")
            for key, value in reply_headers:
                if key.lower() not in _HOP_BY_HOP | {"content-length"}:
                    self.send_header(key, value)
            # A HEAD answer announces the file's size without its bytes.
            self.send_header("Content-Length", length if self.command == "HEAD" else str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_HEAD = do_POST = _forward

    return Proxy
