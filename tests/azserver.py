"""Azurite (the Azure Blob Storage emulator, ``npm install -g azurite``) for the ``az://`` tests.

``Azurite(base_dir).start()`` runs ``azurite-blob`` on a free loopback port with its data under
``base_dir``, creates ``CONTAINER`` (a Shared Key signed Create Container request: obstore
cannot create containers) and returns once it answered; ``stop()`` ends it by PID. Credentials
are Azurite's well-known development account. Fixture ``azure`` (session-scoped, registered in
conftest.py) skips the test when ``azurite-blob`` is not installed.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from email.utils import formatdate
from pathlib import Path

import pytest

ACCOUNT = "devstoreaccount1"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
CONTAINER = "shardfs-test"
START_TIMEOUT = 30.0


class Azurite:
    """One ``azurite-blob`` process; ``endpoint`` is its account URL."""

    def __init__(self, base: Path):
        self.base = Path(base)
        self.base.mkdir(parents=True, exist_ok=True)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}/{ACCOUNT}"
        self.proc: subprocess.Popen | None = None

    @property
    def env(self) -> dict[str, str]:
        """The variables obstore reads for ``az://`` URLs."""
        return {"AZURE_STORAGE_ACCOUNT_NAME": ACCOUNT, "AZURE_STORAGE_ACCOUNT_KEY": KEY}

    def start(self) -> "Azurite":
        cmd = [shutil.which("azurite-blob") or "azurite-blob", "--blobHost", "127.0.0.1",
               "--blobPort", str(self.port), "--location", str(self.base), "--silent",
               "--skipApiVersionCheck", "--disableTelemetry"]
        with open(self.base / "azurite.log", "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                self._create_container()
                return self
            except (OSError, urllib.error.URLError) as e:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"azurite not ready: {e}") from None
                time.sleep(0.2)

    def _create_container(self) -> None:
        date = formatdate(usegmt=True)
        version = "2021-08-06"
        # Shared Key: VERB, 11 standard headers (only Content-Length "0"... empty when 0), headers, resource
        to_sign = "\n".join(["PUT", "", "", "", "", "", "", "", "", "", "", "",
                             f"x-ms-date:{date}", f"x-ms-version:{version}",
                             f"/{ACCOUNT}/{ACCOUNT}/{CONTAINER}\nrestype:container"])
        sig = base64.b64encode(hmac.new(base64.b64decode(KEY), to_sign.encode(), hashlib.sha256).digest()).decode()
        req = urllib.request.Request(f"{self.endpoint}/{CONTAINER}?restype=container", method="PUT",
                                     headers={"x-ms-date": date, "x-ms-version": version,
                                              "Authorization": f"SharedKey {ACCOUNT}:{sig}"})
        try:
            urllib.request.urlopen(req, timeout=5).close()
        except urllib.error.HTTPError as e:
            if e.code != 409:  # 409: it exists already
                raise RuntimeError(f"create container: HTTP {e.code}: {e.read()[:300]!r}") from None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)


@pytest.fixture(scope="session")
def azure(tmp_path_factory):
    """One Azurite for the whole session; skips when azurite is not installed."""
    if shutil.which("azurite-blob") is None:
        pytest.skip("azurite-blob not installed (npm install -g azurite)")
    server = Azurite(tmp_path_factory.mktemp("azurite"))
    try:
        yield server.start()
    finally:
        server.stop()
