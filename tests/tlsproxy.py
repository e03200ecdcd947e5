"""A TLS-terminating proxy for the tests: https on loopback in front of a plain-HTTP server.

``make_ca(directory)`` makes, with Debian's ``openssl``, a private CA (``ca.pem``) and a server
certificate it signed for ``IP:127.0.0.1`` (``server.pem``/``server.key``), as an on-premises
MinIO or SeaweedFS behind a company CA has; ``make_self_signed(directory, ca)`` a self-signed
server certificate (``CA:TRUE`` as ``openssl req -x509`` makes it, or ``CA:FALSE``).
``TlsProxy(upstream_port, certs)`` accepts TLS connections on a free loopback port (``endpoint``:
``https://127.0.0.1:PORT``) and copies bytes
both ways to ``127.0.0.1:upstream_port``, one thread pair per connection; ``close()`` stops it.
The proxy changes no byte of the requests, so SigV4 signatures (over ``Host`` as sent) still verify.
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Certs:
    ca: Path
    cert: Path
    key: Path


def make_ca(directory: Path) -> Certs:
    """A CA and a server certificate for 127.0.0.1 signed by it, in ``directory``."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"),
            "-days", "2", "-subj", "/CN=shardfs test CA")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(d / "server.key"), "-out", str(d / "server.csr"),
            "-subj", "/CN=127.0.0.1")
    (d / "ext").write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
                           "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n")
    openssl("x509", "-req", "-in", str(d / "server.csr"), "-CA", str(d / "ca.pem"), "-CAkey", str(d / "ca.key"),
            "-CAcreateserial", "-out", str(d / "server.pem"), "-days", "2", "-extfile", str(d / "ext"))
    return Certs(d / "ca.pem", d / "server.pem", d / "server.key")


def make_self_signed(directory: Path, ca: bool) -> Certs:
    """A self-signed certificate for ``IP:127.0.0.1`` made the usual way, ``openssl req -x509``
    (which marks it ``basicConstraints`` ``CA:TRUE``), or with ``ca=False`` the fix the error
    line names (``-addext basicConstraints=critical,CA:FALSE``); it is its own CA (``ca``)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    extra = [] if ca else ["-addext", "basicConstraints=critical,CA:FALSE"]
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(d / "self.key"),
                    "-out", str(d / "self.pem"), "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", *extra], check=True, capture_output=True, timeout=60)
    return Certs(d / "self.pem", d / "self.pem", d / "self.key")


class TlsProxy:
    """https://127.0.0.1:PORT -> http://127.0.0.1:upstream_port (see the module docstring)."""

    def __init__(self, upstream_port: int, certs: Certs):
        self.upstream_port = upstream_port
        self._context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._context.load_cert_chain(str(certs.cert), str(certs.key))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.endpoint = f"https://127.0.0.1:{self.port}"
        self.handshakes_failed = 0
        self._closed = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                raw, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(raw,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        try:
            client = self._context.wrap_socket(raw, server_side=True)
        except (ssl.SSLError, OSError):
            self.handshakes_failed += 1  # a client that does not trust the CA hangs up here
            raw.close()
            return
        try:
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
        except OSError:
            client.close()
            return
        threading.Thread(target=_pipe, args=(upstream, client), daemon=True).start()
        _pipe(client, upstream)

    def close(self) -> None:
        self._closed = True
        self._listener.close()


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    """Copy ``src`` to ``dst`` until either end closes, then close both."""
    try:
        while True:
            data = src.recv(1 << 16)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
