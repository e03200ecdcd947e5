"""Source kinds: the same test over a local directory and over an ``s3://`` bucket.

A test builds its v3 source in a local directory with tests/sources.py, as always, then the
``source`` fixture (parametrized over ``SOURCE_KINDS``) turns that directory into a ``Source``:

- ``local``: the directory itself, mounted as ``shardfs mount DIR MNT``;
- ``s3``: its files uploaded (``s3server.upload``) to a fresh prefix of the session's SeaweedFS bucket,
  mounted as ``shardfs mount s3://BUCKET/PREFIX MNT -o endpoint=http://127.0.0.1:PORT`` with the
  credentials and region in the daemon's ``AWS_*`` environment (nothing else in it names the server).

A ``Source`` mounts itself (``source.mount(mount_factory, *extra)``) and is the oracle after writes:
``assert_equals`` reads an array natively with zarr-python 3 AND tensorstore's ``zarr3`` driver
(on the directory, or on the bucket through ``zarr.storage.ObjectStore`` and tensorstore's ``s3``
kvstore), ``exists`` says whether a key is stored, ``leftovers`` lists temporaries and journal
segments. ``local`` keeps the built directory untouched for an ``s3`` source: it is what was uploaded.
"""

from __future__ import annotations

import functools
import os
import re
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pytest

from conftest import read_native, read_ts3_native
from s3server import ACCESS_KEY, REGION, SECRET_KEY, S3Source, SeaweedS3, upload
from sources import LEGACY_DIR, assert_read_equals, is_temp_name, journal_bytes, journal_entries, leftovers

# The daemon's AWS variables: the endpoint is given as ``-o endpoint=`` (a proxy's, or the server's).
CREDENTIALS = {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": REGION}
SOURCE_KINDS = ("local", "s3")


class Source:
    """Where one test's v3 source is served from (see the module docstring)."""

    kind: str
    url: str  # what ``shardfs mount`` is given
    options: tuple[str, ...] = ()  # mount arguments the kind needs
    env: dict[str, str] | None = None  # added to the daemon's environment
    endpoint: str | None = None  # the server the daemon reaches (the state directory is keyed on it)

    def __init__(self, local: Path):
        self.local = Path(local)

    def mount(self, factory, *extra: str, **kw) -> Path:
        """Mount this source with ``factory`` (the ``mount`` fixture): the live mountpoint (``env``
        in ``kw``: added to the source's own)."""
        return factory(self.url, *self.options, *extra, env={**(self.env or {}), **kw.pop("env", {})}, **kw)

    def exists(self, key: str) -> bool:
        raise NotImplementedError

    def read(self, key: str) -> bytes:
        """The bytes stored at ``key`` in the source."""
        raise NotImplementedError

    def readers(self, name: str) -> dict[str, Callable[[], np.ndarray]]:
        """The native oracles of array ``name``: reader name -> read."""
        raise NotImplementedError

    def assert_equals(self, name: str, expected: np.ndarray) -> None:
        """zarr-python 3 and tensorstore zarr3 both read ``name`` in the source as ``expected``."""
        for what, read in self.readers(name).items():
            assert_read_equals(read(), expected, f"{name} via {what} ({self.kind})")

    def leftovers(self) -> list[str]:
        """Temporaries and ``.shardfs`` in the source, segments in its journal (after ``umount``: none)."""
        raise NotImplementedError

    def journal_entries(self) -> list[str]:
        """The segments in the journal of this source's daemons (see ``sources.journal_entries``)."""
        return journal_entries(self.url, self.endpoint)

    def journal_bytes(self) -> int:
        return journal_bytes(self.url, self.endpoint)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url})"


class LocalSource(Source):
    kind = "local"

    def __init__(self, local: Path):
        super().__init__(local)
        self.url = str(self.local)

    def exists(self, key: str) -> bool:
        return (self.local / key).is_file()

    def read(self, key: str) -> bytes:
        return (self.local / key).read_bytes()

    def readers(self, name: str) -> dict[str, Callable[[], np.ndarray]]:
        return {f.__name__: functools.partial(f, self.local / name) for f in (read_native, read_ts3_native)}

    def leftovers(self) -> list[str]:
        return leftovers(self.local)


class BucketSource(Source):
    kind = "s3"

    def __init__(self, local: Path, server: SeaweedS3, prefix: str, endpoint: str | None = None):
        """Upload ``local`` to ``server`` below ``prefix``; the daemon reaches the server at
        ``endpoint`` (default: directly; a proxy's URL to watch or delay its requests)."""
        super().__init__(local)
        self.objects: S3Source = upload(server, self.local, prefix)
        self.server, self.prefix, self.url = server, prefix, self.objects.url
        self.endpoint = endpoint or server.endpoint
        self.options = ("-o", f"endpoint={self.endpoint}")
        self.env = dict(CREDENTIALS)

    def exists(self, key: str) -> bool:
        import obstore

        try:
            obstore.head(self.objects.store(), key)
        except FileNotFoundError:
            return False
        return True

    def read(self, key: str) -> bytes:
        import obstore

        return bytes(obstore.get(self.objects.store(), key).bytes())

    def readers(self, name: str) -> dict[str, Callable[[], np.ndarray]]:
        return {"zarr 3 ObjectStore": lambda: self._read_zarr3(name),
                "tensorstore zarr3 s3": lambda: self._read_ts3(name)}

    def _read_zarr3(self, name: str) -> np.ndarray:
        import zarr

        return np.asarray(zarr.open_array(self.objects.zarr_store(), path=name, mode="r")[...])

    def _read_ts3(self, name: str) -> np.ndarray:
        import tensorstore as ts

        spec = {"driver": "zarr3", "kvstore": {
            "driver": "s3", "bucket": self.server.bucket, "path": f"{self.prefix}/{name}/",
            "endpoint": self.server.endpoint, "aws_region": REGION, "aws_credentials": {"type": "environment"}}}
        with _environment(CREDENTIALS):  # tensorstore takes the keys from the environment only
            return ts.open(spec, read=True, context=ts.Context()).result().read().result()

    def leftovers(self) -> list[str]:
        keys = self.objects.keys()
        bad = [k for k in keys if is_temp_name(k.rsplit("/", 1)[-1])]
        bad += [LEGACY_DIR] if any(k.startswith(LEGACY_DIR + "/") for k in keys) else []
        return sorted(bad + [f"journal/{n}" for n in self.journal_entries()])


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """``values`` in ``os.environ`` for the duration (the previous values back afterwards)."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def unique_prefix(request) -> str:
    """A fresh key prefix named after the test (readable in the server's log)."""
    name = re.sub(r"[^A-Za-z0-9_-]+", "-", request.node.name).strip("-")[:60]
    return f"{name}-{uuid.uuid4().hex[:8]}"


def make_source(kind: str, request) -> Callable[[Path], Source]:
    """``publish(local_dir) -> Source`` of ``kind`` (the session's SeaweedFS for ``s3``)."""
    if kind == "local":
        return LocalSource
    server = request.getfixturevalue("s3")
    return lambda local: BucketSource(local, server, unique_prefix(request))


@pytest.fixture(params=SOURCE_KINDS)
def source(request) -> Callable[[Path], Source]:
    """Parametrizes a test over the source kinds: ``source(local_dir) -> Source``."""
    return make_source(request.param, request)
