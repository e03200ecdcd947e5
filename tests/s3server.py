"""The ``s3`` fixture: one real SeaweedFS S3 server for the test session.

The server itself (``SeaweedS3``: ``weed mini`` on loopback, every port explicit, credentials
enforced, stopped by PID) lives in scripts/bench_lib/seaweed.py, shared with scripts/bench; its
names are re-exported here. Tests needing their own server (to stop it) build a ``SeaweedS3``
under ``tmp_path`` and stop it in a ``finally``. Registered in conftest.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from bench_lib.seaweed import ACCESS_KEY, BUCKET, REGION, SECRET_KEY, SeaweedS3  # noqa: E402

__all__ = ["ACCESS_KEY", "BUCKET", "REGION", "SECRET_KEY", "SeaweedS3", "s3"]


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    """One SeaweedFS S3 server for the whole session (stopped by PID at the end)."""
    server = SeaweedS3(tmp_path_factory.mktemp("seaweed"))
    try:
        yield server.start()
    finally:
        server.stop()
