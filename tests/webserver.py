"""A plain web server for ``http://`` sources: nginx (Debian's ``nginx-light``) serving one
directory on loopback, with Range, ETag and Last-Modified as web servers send them, and
nothing else (no listing, no writes).

``WebServer(root)`` starts it (one process: ``master_process off``, ``daemon off``) on a free
port of 127.0.0.1 and ``stop()`` ends it by PID; the ``web_server`` fixture gives a factory
whose servers are stopped at the end of the test, even when it fails.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
_CONF = """
daemon off;
master_process off;
user root;
pid {state}/nginx.pid;
error_log {state}/error.log warn;
events {{ worker_connections 256; }}
http {{
    access_log {state}/access.log;
    client_body_temp_path {state}/body;
    proxy_temp_path {state}/proxy;
    fastcgi_temp_path {state}/fastcgi;
    uwsgi_temp_path {state}/uwsgi;
    scgi_temp_path {state}/scgi;
    types {{ application/json json; }}
    default_type application/octet-stream;
    server {{
        listen 127.0.0.1:{port};
        root {root};
        autoindex off;
        etag {etag};
    }}
}}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WebServer:
    """nginx serving ``root`` at ``self.url`` (``http://127.0.0.1:PORT``)."""

    def __init__(self, root: Path, etag: bool = True) -> None:
        self.state = Path(tempfile.mkdtemp(prefix="shardfs-nginx-"))
        self.port = _free_port()
        conf = self.state / "nginx.conf"
        conf.write_text(_CONF.format(state=self.state, port=self.port, root=root, etag="on" if etag else "off"))
        self.proc = subprocess.Popen([NGINX, "-c", str(conf), "-p", str(self.state)], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nginx exited: {self.proc.stderr.read().decode() if self.proc.stderr else ''}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("nginx did not start listening")

    def requests(self) -> list[str]:
        """The request lines of the access log so far (``GET /path HTTP/1.1``)."""
        try:
            lines = (self.state / "access.log").read_text().splitlines()
        except FileNotFoundError:
            return []
        return [line.split('"')[1] for line in lines if line.count('"') >= 2]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        shutil.rmtree(self.state, ignore_errors=True)


@pytest.fixture
def web_server():
    """``web_server(root, etag=True) -> WebServer``; every server stopped at teardown."""
    started: list[WebServer] = []

    def start(root: Path, etag: bool = True) -> WebServer:
        server = WebServer(root, etag)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
