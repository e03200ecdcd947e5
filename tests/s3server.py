"""The object-store fixtures: one real SeaweedFS S3 server for the test session, and uploads to it.

The server itself (``SeaweedS3``: ``weed mini`` on loopback, every port explicit, credentials
enforced, stopped by PID) and ``upload``/``S3Source`` live in testkit/seaweed.py, shared
with scripts/bench and scripts/soak; their names are re-exported here. Fixtures (registered in conftest.py):
``s3`` (session-scoped) gives one running server; tests needing their own (to stop it) build a
``SeaweedS3`` under ``tmp_path`` and stop it in a ``finally``. ``s3_upload`` (function-scoped)
copies a local source directory to a fresh prefix of that server's bucket: ``s3_upload(src) ->
S3Source`` (its ``url``, the ``env`` a client or daemon needs, a zarr-python 3 ``zarr_store()``
reading it natively, ``keys()``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from testkit.seaweed import ACCESS_KEY, BUCKET, REGION, SECRET_KEY, S3Source, SeaweedS3, upload

__all__ = ["ACCESS_KEY", "BUCKET", "REGION", "SECRET_KEY", "S3Source", "SeaweedS3", "upload", "s3", "s3_upload"]


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    """One SeaweedFS S3 server for the whole session (stopped by PID at the end)."""
    server = SeaweedS3(tmp_path_factory.mktemp("seaweed"))
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture
def s3_upload(s3):
    """``s3_upload(src) -> S3Source``: ``src`` (a local source directory) copied to a fresh
    prefix of the session server's bucket."""
    return lambda src, prefix=None: upload(s3, Path(src), prefix)
