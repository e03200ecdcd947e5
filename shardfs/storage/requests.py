"""obstore's request path to one store, shared by the source kinds reached through obstore
(``objects``: S3, GCS, Azure; ``web``: plain web servers): HEADs, ranged and suffix GETs pinned
to a version, their counters, the versions and listings remembered, errors as ``OSError``.

``ObjectRequests`` is that path (a kind's class holds one: composition); ``OverRequests`` is
the read half of ``Storage`` answered by it, which ``ObjectStorage`` and ``WebStorage`` share
(each adds its own listings, writes and mount-time check). The read path of such a source
(``shardfs.reads.objects``) awaits the coroutines of its ``requests``.

- ``version``: HEAD -> ``Version(etag, size, mtime_ns)``, the mtime Last-Modified's whole
  seconds and a part of a second drawn from the ETag (``stamp_ns``); missing -> None.
  Remembered for ``stat_ttl`` seconds, like
  ``LocalStorage``'s, from HEADs, from ``read_versioned`` and ``read_all`` (the GET's own ETag,
  size and date) and from listings (each page carries them); ``replace``, ``delete`` and ``changed`` forget it.
- ``read_versioned``: one ranged or suffix GET, its version taken from the response (no HEAD).
- ``read``: ranged GETs, one per group of ranges less than ``COALESCE_GAP`` apart (a negative
  offset is a suffix GET), all in flight at once, each conditioned on the ETag (If-Match) so
  the ranges come from one version: ``if_version``'s, or else the one the first GET saw
  (the others retried up to ``CONSISTENT_READ_TRIES`` times if the object changes meanwhile).
  412 -> ``VersionMismatch``; 404 -> ``FileNotFoundError``; a range at or past the end -> b"".

Faults: 5xx, timeouts and dropped connections are retried by obstore with exponential backoff
(``Retry``: at most ``max_retries`` retries within ``retry_timeout``; each attempt at most
``request_timeout``, the mount's ``-o timeout``: ``Retry.for_timeout``), then that one call raises
``OSError(EIO)`` with a one-line message, also logged (one line per failed call); the next
call starts afresh. 403 -> ``PermissionError``. Each kind's ``check()`` (at mount) turns bad
credentials, a missing bucket, prefix or server and an unreachable endpoint into one
``StorageUnavailable`` line.

Concurrency, measured (scripts/bench_lib/s3concurrency.py: SeaweedFS behind a DelayProxy of
100 ms each way, 200 GETs started at once from 200 trio tasks, medians of 3, four runs on 2
cores at load 7 to 16): trio's default limit of 40 threads takes 1.18-1.46 s (five rounds of
round trips); ``trio.to_thread`` with a limiter of 200 takes 0.38-0.78 s (200 threads); obstore's
async API on one asyncio loop thread, awaited from trio, takes 0.34-0.93 s (1 thread; client CPU
0.06-0.09 s either way). The last two are equal within this machine's noise, so the choice is
made on the rest: one thread however many requests are in flight, a multi-range ``read`` with all
its GETs in flight from one call, and a cancelled trio task abandoning its request. Every request
here is therefore a coroutine on one ``LoopThread``: the blocking ``Storage`` methods wait for it
(``LoopThread.run``) and trio code awaits the ``a*`` coroutines without a worker thread
(``LoopThread.trio_run``).

Connections: an idle one is kept for reuse ``POOL_IDLE`` seconds (closed by the pool's sweep
every ``POOL_IDLE`` seconds: within twice that, measured). reqwest's default, 90 s, kept the
sockets of a burst of reads or of a stall's retries for minutes: a long soak's socket count
then followed its busiest minutes.
"""

from __future__ import annotations

import asyncio
import builtins
import errno
import logging
import os
import re
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Iterator, Sequence, TypeAlias

import crc32c
import obstore
from obstore.exceptions import (AlreadyExistsError, NotFoundError, PermissionDeniedError, PreconditionError,
                                UnauthenticatedError)

from shardfs.storage import UNKNOWN, Range, Version, VersionMismatch, Unknown
from shardfs.storage.urls import DEFAULT_TIMEOUT
from shardfs.storage.stats import StoreStats
from shardfs.storage.listings import Listings
from shardfs.storage.versions import Remembered, Versions
from shardfs.storage.loop import LoopThread

log = logging.getLogger("shardfs")
COALESCE_GAP = 1 << 20  # ranges closer than this are read in one GET (object_store's default)
CONSISTENT_READ_TRIES = 3
POOL_IDLE = 10.0  # seconds an idle connection is kept (see "Connections")
STATFS_BYTES = 1 << 60  # the size statvfs reports (see ``OverRequests.statvfs``)
STATFS_BLOCK = 1 << 20
_STATUS = re.compile(r"status code: (\d{3})")
# rustls's verdict, in obstore's debug text: ``InvalidCertificate(UnknownIssuer)``, or for the
# verdicts rustls-webpki names itself ``InvalidCertificate(Other(OtherError(CaUsedAsEndEntity)))``
_TLS = re.compile(r"InvalidCertificate\(\s*(?:Other\(\s*OtherError\(\s*)?([A-Za-z]+)")
CA_AS_SERVER = "CaUsedAsEndEntity"
MISSING = (NotFoundError, FileNotFoundError)  # obstore raises either for a 404
ANSWERS = (*MISSING, PreconditionError, AlreadyExistsError)  # errors that answer a request (not failures)
Buffer: TypeAlias = bytes | obstore.Bytes  # a GET's body: a copy, or obstore's own read-only buffer (``copy=False``)
Opener = Callable[[dict[str, Any], dict[str, Any]], Any]  # (client options, retry configuration) -> obstore store


class StorageUnavailable(Exception):
    """``check()`` failed: the source cannot be used. ``str()`` is one line saying why."""


@dataclass(frozen=True)
class Retry:
    """Bounds on obstore's retries of transient faults, and on each request's duration.

    obstore retries a timed-out attempt like any other transient fault, as long as less than
    ``retry_timeout`` has passed since the first attempt (measured: a server that accepts
    connections and never answers, ``request_timeout`` 1 s: 6 attempts, EIO after 7 s with a
    ``retry_timeout`` of 20 s; 3 attempts, 3.3 s, with 2.5 s)."""

    max_retries: int = 5
    retry_timeout: float = DEFAULT_TIMEOUT  # seconds from the first attempt after which none is retried
    init_backoff: float = 0.1
    max_backoff: float = 2.0
    request_timeout: float = DEFAULT_TIMEOUT
    connect_timeout: float = 5.0

    @classmethod
    def for_timeout(cls, timeout: float) -> "Retry":
        """The bounds of a mount's ``-o timeout``: each attempt at most ``timeout`` seconds
        (connecting at most 5 of them), retried only within ``timeout`` of the first. So a hung
        server costs one attempt, EIO after ``timeout``; whatever the faults, a call fails
        within ``2 * timeout + max_backoff`` (a retry starts before ``timeout`` has passed, and
        takes at most ``timeout``), while quick faults (5xx, a refused or dropped connection)
        still get their ``max_retries`` retries."""
        return cls(retry_timeout=timeout, request_timeout=timeout, connect_timeout=min(timeout, 5.0))

    @property
    def bound(self) -> float:
        """Seconds after which a call has failed at the latest (see ``for_timeout``)."""
        return self.retry_timeout + self.max_backoff + self.request_timeout


def status_of(e: BaseException) -> int | None:
    m = _STATUS.search(str(e))
    return int(m.group(1)) if m else None


def tls_failure(e: BaseException, s3: bool = False) -> str | None:
    """The one-line reason if ``e`` is a failed verification of the server's TLS certificate.

    A server presenting a CA certificate as its own (a self-signed certificate made by
    ``openssl req -x509``, which marks it ``CA:TRUE``) is refused by rustls, obstore's TLS
    library, even when that certificate is trusted (OpenSSL, and so the AWS CLI, accept it);
    obstore has no way to verify it otherwise, so the line names that cause and the fix."""
    verdict = _TLS.search(str(e))
    if verdict is None:
        return None
    if verdict.group(1) == CA_AS_SERVER:
        return (f"TLS certificate verification failed ({CA_AS_SERVER}): the server's certificate is a CA "
                "certificate (basicConstraints CA:TRUE, as openssl req -x509 makes by default), which rustls "
                "refuses as a server's own even when trusted: give the server a certificate with CA:FALSE "
                "(openssl req -x509 -addext basicConstraints=critical,CA:FALSE ...) or one signed by a CA, "
                "and trust that")
    return (f"TLS certificate verification failed ({verdict.group(1)}): trust the server's CA with "
            "-o ca_bundle=FILE" + (" or AWS_CA_BUNDLE" if s3 else ""))


def first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def stamp_ns(seconds: int, etag: str) -> int:
    """A version's mtime: ``seconds`` (its Last-Modified, or 0 if the server sent none) and
    below the second, a number drawn from its ETag (none without one). Object stores keep
    whole seconds: two versions of an object within one second would have one mtime, and the
    kernel's pages of a chunk file (kept while its size and mtime are unchanged), or a client
    taking (ino, mtime) for a version (tensorstore), would keep the first's bytes."""
    return seconds * 1_000_000_000 + (crc32c.crc32c(etag.encode()) % 1_000_000_000 if etag else 0)


def version_of(meta: dict) -> Version:
    t, etag = meta.get("last_modified"), meta.get("e_tag") or ""
    return Version(etag, int(meta["size"]), stamp_ns(int(t.timestamp()) if t is not None else 0, etag))



class ObjectRequests:
    """The requests to one obstore store (thread-safe), each a coroutine on one ``LoopThread``."""

    def __init__(self, url: str, scheme: str, opener: Opener, client: dict[str, Any], *, retry: Retry = Retry(),
                 loop: LoopThread | None = None, name: str = "objects", stat_ttl: float = 1.0,
                 listings: Listings | None = None, versions: Versions | None = None) -> None:
        """The store of ``url`` (``scheme``: ``s3``, ``gs``, ``az`` or ``http``) made by ``opener``
        with the ``client`` options, each request bounded by ``retry``; its requests run on ``loop``
        (or on a thread ``name`` of its own); versions remembered ``stat_ttl`` seconds (in
        ``versions`` if given), listings in ``listings`` (None: none kept)."""
        self.url = url.rstrip("/")
        self.scheme = scheme
        self._opener = opener
        self._client = client
        self.retry = retry
        self.store = self.build(retry)
        self._own_loop = loop is None
        self.loop = loop or LoopThread(name=name)
        self.versions = versions if versions is not None else Remembered(stat_ttl)
        self.listings = listings or Listings(0.0)
        self.stats = StoreStats()

    def build(self, retry: Retry) -> Any:
        """The obstore store of this source, with ``retry``'s bounds on each request."""
        client = {**self._client, "timeout": timedelta(seconds=retry.request_timeout),
                  "connect_timeout": timedelta(seconds=retry.connect_timeout),
                  "pool_idle_timeout": timedelta(seconds=POOL_IDLE)}
        retry_config = {"max_retries": retry.max_retries, "retry_timeout": timedelta(seconds=retry.retry_timeout),
                        "backoff": {"init_backoff": timedelta(seconds=retry.init_backoff),
                                    "max_backoff": timedelta(seconds=retry.max_backoff), "base": 2}}
        return self._opener(client, retry_config)

    def close(self) -> None:
        """Stop the loop thread if this storage started it."""
        if self._own_loop:
            self.loop.close()

    def describe(self, key: str) -> str:
        return f"{self.url}/{key}" if key else self.url

    def version_now(self, key: str) -> Version | None | Unknown:
        return self.versions.get(key)

    def changed(self, key: str) -> None:
        self.versions.forget(key)
        self.listings.forget(key)

    def error(self, e: BaseException, key: str) -> BaseException:
        """The ``OSError`` (or ``VersionMismatch``) for an obstore failure on ``key``."""
        where = self.describe(key)
        if isinstance(e, (PreconditionError, AlreadyExistsError)):
            return VersionMismatch(where)
        if isinstance(e, MISSING):
            return FileNotFoundError(errno.ENOENT, "no such object", where)
        if isinstance(e, (PermissionDeniedError, UnauthenticatedError)) or status_of(e) in (401, 403):
            return PermissionError(errno.EACCES, f"access denied: {first_line(e)}", where)
        if isinstance(e, OSError):
            return e
        log.error("%s: %s", where, first_line(e))  # after obstore's retries: this request fails
        return OSError(errno.EIO, first_line(e), where)

    # ------------------------------------------------------------------ coroutines (the loop thread)

    async def aversion(self, key: str) -> Version | None:
        """See ``Storage.version``."""
        if not key or key.endswith("/"):
            return None
        try:
            with self.stats.request("HEAD", ANSWERS):
                return version_of(await obstore.head_async(self.store, key))
        except MISSING:
            return None
        except Exception as e:
            raise self.error(e, key) from None

    async def _get(self, key: str, rng: Range | None, etag: int | str | None, copy: bool = True
                   ) -> tuple[Buffer, Version]:
        """One GET of ``rng`` (or all), If-Match ``etag``; a range past the end reads b"".
        ``copy=False``: the body as obstore received it (a read-only ``obstore.Bytes``, no copy)."""
        options: dict[str, Any] = {}
        if rng is not None:
            options["range"] = {"suffix": -rng.offset} if rng.offset < 0 else (rng.offset, rng.offset + rng.nbytes)
        if etag:  # a web server may send no ETag (""): nothing to match
            options["if_match"] = etag

        try:
            with self.stats.request("GET", ANSWERS) as counted:
                result = await obstore.get_async(self.store, key, options=options)
                body = await result.bytes_async()
                counted.bytes_in = len(body)
            return bytes(body) if copy else body, version_of(result.meta)
        except Exception as e:
            if rng is not None and status_of(e) == 416:  # starts at or past the end
                return b"", None  # type: ignore[return-value]  # past the end: no version (callers check)
            raise self.error(e, key) from None

    async def aread(self, key: str, ranges: Sequence[Range], if_version: Version | None = None,
                    copy: bool = True) -> list[Buffer]:
        """See ``Storage.read``; ``copy=False``: each range a read-only buffer sharing the
        response's memory (``obstore.Bytes``: no copy of the body, for the read path's cache)."""
        if self.scheme == "az" and any(r.offset < 0 for r in ranges):  # Azure has no suffix GET
            if if_version is None:
                if_version = await self.aversion(key)
                if if_version is None:
                    raise FileNotFoundError(errno.ENOENT, "no such object", self.describe(key))
            size = if_version.size
            ranges = [Range(max(0, size + r.offset), r.nbytes) if r.offset < 0 else r for r in ranges]
        groups = _coalesce(ranges)
        if not groups:
            return [b"" for _ in ranges]
        for _ in range(CONSISTENT_READ_TRIES):
            etag = if_version.tag if if_version is not None else None
            fetched: list[Buffer | None] = [None] * len(groups)
            todo = list(range(len(groups)))
            if etag is None:  # the first GET fixes the version the others must match
                fetched[0], seen = await self._get(key, groups[0], None, copy)
                etag = seen.tag if seen is not None else None
                todo = todo[1:]
            try:
                results = await asyncio.gather(*(self._get(key, groups[i], etag, copy) for i in todo))
            except VersionMismatch:
                if if_version is not None:
                    raise
                self.stats.retries += 1
                continue  # replaced between our GETs: read again
            for i, (data, _) in zip(todo, results):
                fetched[i] = data
            return _slice(ranges, groups, fetched)
        raise OSError(errno.EIO, f"changed during {CONSISTENT_READ_TRIES} consecutive reads", self.describe(key))

    async def aread_versioned(self, key: str, rng: Range) -> tuple[bytes, Version]:
        """See ``Storage.read_versioned``."""
        token = self.versions.token()
        try:
            if self.scheme == "az" and rng.offset < 0:  # Azure has no suffix GET: the size from a HEAD
                version = await self.aversion(key)
                data = (await self.aread(key, [rng], version))[0] if version is not None else b""
            else:
                data, version = await self._get(key, rng, None)
            if version is None:  # an empty object (416 for any range): its version from a HEAD
                version = await self.aversion(key)
            if version is None:
                raise FileNotFoundError(errno.ENOENT, "no such object", self.describe(key))
        except FileNotFoundError:
            self.versions.put(key, None, token)
            raise
        self.versions.put(key, version, token)
        return data, version

    async def aread_all(self, key: str, copy: bool = True) -> tuple[Buffer, Version]:
        """See ``Storage.read_all``; the version is remembered as ``read_versioned``'s;
        ``copy=False`` as for ``aread``."""
        token = self.versions.token()
        try:
            data, version = await self._get(key, None, None, copy)
        except FileNotFoundError:
            self.versions.put(key, None, token)
            raise
        self.versions.put(key, version, token)
        return data, version

    def version(self, key: str) -> Version | None:
        found = self.versions.get(key)
        if found is UNKNOWN:
            token = self.versions.token()
            found = self.loop.run(self.aversion(key))
            self.versions.put(key, found, token)
        return found  # type: ignore[return-value]  # not UNKNOWN: asked just above

    def read(self, key: str, ranges: Sequence[Range], if_version: Version | None = None) -> list[bytes]:
        return self.loop.run(self.aread(key, ranges, if_version))

    def read_versioned(self, key: str, rng: Range) -> tuple[bytes, Version]:
        return self.loop.run(self.aread_versioned(key, rng))

    def read_all(self, key: str) -> tuple[bytes, Version]:
        return self.loop.run(self.aread_all(key))

    def pages(self, pages: Iterator[builtins.list[dict]]) -> Iterator[builtins.list[dict]]:
        """The pages of an obstore listing, each counted as one ``LIST`` request (a listing
        with no page made one too)."""
        first = True
        while True:
            started = time.monotonic()
            try:
                page = next(pages, None)
            except Exception as e:
                self.stats.count("LIST", time.monotonic() - started)
                self.stats.failures += not isinstance(e, ANSWERS)
                raise
            if page is not None or first:
                self.stats.count("LIST", time.monotonic() - started)
            if page is None:
                return
            first = False
            yield page


class OverRequests:
    """The read half of ``Storage`` answered by ``requests`` (an ``ObjectRequests``): what the
    kinds reached through obstore share; each adds its listings, writes and mount-time check."""

    read_path = "objects"  # (``shardfs.reads.factory``: ``shardfs.reads.objects``)
    atomic_delete = False  # no conditional DELETE: a HEAD check, then the DELETE (``Storage.atomic_delete``)

    def __init__(self, requests: ObjectRequests) -> None:
        self.requests = requests
        self.url = requests.url
        self.scheme = requests.scheme
        self.loop = requests.loop
        self.stats = requests.stats

    def close(self) -> None:
        self.requests.close()

    def describe(self, key: str) -> str:
        return self.requests.describe(key)

    def owner_path(self, key: str) -> str | None:
        return None  # objects have no owners

    def statvfs(self) -> os.statvfs_result:
        """An object store has no size or inode limit to report: like mountpoint-s3, a large
        constant (1 EiB in 1 MiB blocks, all free; 2^32 files, all free), so ``df`` and tools
        that check free space before writing see a usable filesystem."""
        blocks, files = STATFS_BYTES // STATFS_BLOCK, 1 << 32
        return os.statvfs_result((STATFS_BLOCK, STATFS_BLOCK, blocks, blocks, blocks, files, files, files, 0, 255))

    def version(self, key: str) -> Version | None:
        return self.requests.version(key)

    def version_now(self, key: str) -> Version | None | Unknown:
        return self.requests.version_now(key)

    def read(self, key: str, ranges: Sequence[Range], if_version: Version | None = None) -> list[bytes]:
        return self.requests.read(key, ranges, if_version)

    def read_versioned(self, key: str, rng: Range) -> tuple[bytes, Version]:
        return self.requests.read_versioned(key, rng)

    def read_all(self, key: str) -> tuple[bytes, Version]:
        return self.requests.read_all(key)

    def changed(self, key: str) -> None:
        self.requests.changed(key)



def _coalesce(ranges: Sequence[Range]) -> list[Range]:
    """The GETs covering ``ranges``: suffix ranges alone (the largest), the others merged when
    less than ``COALESCE_GAP`` apart. Empty ranges need no GET."""
    suffix = max((-r.offset for r in ranges if r.offset < 0 and r.nbytes > 0), default=0)
    spans = sorted((r.offset, r.offset + r.nbytes) for r in ranges if r.offset >= 0 and r.nbytes > 0)
    groups: list[Range] = []
    for start, end in spans:
        if groups and start - (groups[-1].offset + groups[-1].nbytes) < COALESCE_GAP:
            last = groups[-1]
            groups[-1] = Range(last.offset, max(end, last.offset + last.nbytes) - last.offset)
        else:
            groups.append(Range(start, end - start))
    if suffix:
        groups.append(Range(-suffix, suffix))
    return groups


def _slice(ranges: Sequence[Range], groups: list[Range], fetched: list[Buffer | None]) -> list[Buffer]:
    """Cut each requested range out of the GET that covers it."""
    out = []
    for r in ranges:
        if r.nbytes <= 0:
            out.append(b"")
            continue
        for g, data in zip(groups, fetched):
            assert data is not None
            if r.offset < 0 and g.offset < 0:
                start = len(data) - min(-r.offset, len(data))  # the suffix GET ends at the end
                out.append(data[start:start + r.nbytes])
                break
            if r.offset >= 0 and g.offset >= 0 and g.offset <= r.offset < g.offset + g.nbytes:
                start = r.offset - g.offset
                out.append(data[start:start + r.nbytes])
                break
    return out
