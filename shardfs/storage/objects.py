"""Object storage (S3 and S3-compatible; GCS and Azure through the same code) behind ``Storage``.

``ObjectStorage("s3://BUCKET[/PREFIX]", endpoint=, region=, anonymous=)`` maps the interface onto
obstore (the Rust object_store bindings zarr-python 3 uses):

- ``version``: HEAD -> ``Version(etag, size, last_modified_ns)`` (whole seconds: listings and
  HEADs may differ below that); missing -> None. Remembered for ``stat_ttl`` seconds, like
  ``LocalStorage``'s, from HEADs, from ``read_versioned`` and ``read_all`` (the GET's own ETag, size and date) and
  from listings (each page carries them); ``replace``, ``delete`` and ``changed`` forget it.
- ``read_versioned``: one ranged or suffix GET, its version taken from the response (no HEAD).
- ``read``: ranged GETs, one per group of ranges less than ``COALESCE_GAP`` apart (a negative
  offset is a suffix GET), all in flight at once, each conditioned on the ETag (If-Match) so
  the ranges come from one version: ``if_version``'s, or else the one the first GET saw
  (the others retried up to ``CONSISTENT_READ_TRIES`` times if the object changes meanwhile).
  412 -> ``VersionMismatch``; 404 -> ``FileNotFoundError``; a range at or past the end -> b"".
- ``list``: paginated, bounded memory. S3's delimiter listing is not exposed page by page by
  object_store (``list_with_delimiter`` collects every page), so the listing is the recursive
  one (pages of ``PAGE`` keys, ``start-after`` driven) and skips each sub-prefix once seen:
  one more request per sub-prefix, never more than one page in memory.
- ``replace``: one PUT of the whole content, ``If-Match: <etag>`` (or ``If-None-Match: *`` for
  ``ABSENT``); 412, or 404 for If-Match on a vanished key, -> ``VersionMismatch``. The new
  version's mtime comes from a HEAD (0 if another writer already replaced it). A PUT whose
  connection dropped is retried by obstore; if the first attempt had landed, the retry's 412
  reports ``VersionMismatch`` for a write that happened (a fold re-reads and finds it applied).
- ``delete``: S3 DeleteObject takes no condition through object_store, so a conditional delete
  is a HEAD check, then the DELETE: a writer replacing the key between the two loses its
  write (the window is one round trip; folds never delete shards, only the metadata paths do).

Faults: 5xx, timeouts and dropped connections are retried by obstore with exponential backoff
(``Retry``: at most ``max_retries`` retries within ``retry_timeout``; each attempt at most
``request_timeout``, the mount's ``-o timeout``: ``Retry.for_timeout``), then that one call raises
``OSError(EIO)`` with a one-line message, also logged (one line per failed call); the next
call starts afresh. 403 -> ``PermissionError``. ``check()`` (at mount) turns bad credentials,
a missing bucket or prefix and an unreachable endpoint into one ``StorageUnavailable`` line.

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

Configuration: ``s3://`` reads the standard AWS variables (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``/``AWS_DEFAULT_REGION``,
``AWS_ENDPOINT_URL``); an ``http://`` endpoint (option or variable) is used as given, plain HTTP.
``az://CONTAINER[/PREFIX]`` and ``gs://BUCKET[/PREFIX]`` (obstore's URL forms) go through the same
code and read the AZURE_* / GOOGLE_* variables (``AZURE_STORAGE_ACCOUNT_NAME``/``_KEY``...);
``endpoint`` maps to their base URL, ``region`` is S3 only. Azure has no suffix GET: a read with
a negative offset takes the size from ``if_version`` or a HEAD. ``az://`` passes the contract
tests against Azurite; ``gs://`` is untested (no emulator on PyPI takes object_store's
conditional XML-API PUTs: see README).
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
from typing import Any, Iterable, Iterator, Sequence, TypeAlias
from urllib.parse import urlsplit

import obstore
from obstore.store import from_url
from obstore.exceptions import (AlreadyExistsError, NotFoundError, PermissionDeniedError, PreconditionError,
                                UnauthenticatedError)

from shardfs.storage.urls import DEFAULT_TIMEOUT, env_endpoint
from shardfs.storage.stats import StoreStats
from shardfs.storage import ABSENT, UNKNOWN, Entry, Range, Version, VersionMismatch, Absent, Unknown
from shardfs.storage.access import Access
from shardfs.storage.listings import Listings
from shardfs.storage.versions import Remembered
from shardfs.storage.loop import LoopThread

log = logging.getLogger("shardfs")
PAGE = 1000  # entries per listing page (S3's own page size)
COALESCE_GAP = 1 << 20  # ranges closer than this are read in one GET (object_store's default)
CONSISTENT_READ_TRIES = 3
POOL_IDLE = 10.0  # seconds an idle connection is kept (see "Connections")
_SCHEMES = {"s3": "s3", "s3a": "s3", "gs": "gs", "az": "az", "azure": "az", "abfs": "az", "abfss": "az"}
_ENDPOINT_KEY = {"s3": "endpoint", "gs": "base_url", "az": "endpoint"}
STATFS_BYTES = 1 << 60  # the size statvfs reports (see ``ObjectStorage.statvfs``)
STATFS_BLOCK = 1 << 20
_STATUS = re.compile(r"status code: (\d{3})")
# rustls's verdict, in obstore's debug text: ``InvalidCertificate(UnknownIssuer)``, or for the
# verdicts rustls-webpki names itself ``InvalidCertificate(Other(OtherError(CaUsedAsEndEntity)))``
_TLS = re.compile(r"InvalidCertificate\(\s*(?:Other\(\s*OtherError\(\s*)?([A-Za-z]+)")
CA_AS_SERVER = "CaUsedAsEndEntity"
_MISSING = (NotFoundError, FileNotFoundError)  # obstore raises either for a 404
_ANSWERS = (*_MISSING, PreconditionError, AlreadyExistsError)  # errors that answer a request (not failures)
Buffer: TypeAlias = bytes | obstore.Bytes  # a GET's body: a copy, or obstore's own read-only buffer (``copy=False``)


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


def _status(e: BaseException) -> int | None:
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


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _ns(meta: dict) -> int:
    t = meta.get("last_modified")
    return int(t.timestamp()) * 1_000_000_000 if t is not None else 0


def _version(meta: dict) -> Version:
    return Version(meta.get("e_tag") or "", int(meta["size"]), _ns(meta))


class ObjectStorage:
    """``Storage`` over one bucket/container and prefix of an object store (thread-safe)."""

    read_path = "objects"  # (``shardfs.reads.factory``)

    def __init__(self, url: str, *, endpoint: str | None = None, region: str | None = None,
                 anonymous: bool = False, retry: Retry = Retry(), loop: LoopThread | None = None,
                 stat_ttl: float = 1.0, list_ttl: float = 0.0, access: Access = Access()):
        parts = urlsplit(url)
        scheme = _SCHEMES.get(parts.scheme)
        if scheme is None or not parts.netloc:
            raise ValueError(f"{url}: not an object store URL (s3://BUCKET[/PREFIX], gs://..., az://...)")
        if region and scheme != "s3":
            raise ValueError(f"{url}: region= applies to s3:// only")
        self.url = url.rstrip("/")
        self.scheme = scheme
        config: dict[str, Any] = {}
        if scheme == "s3":
            endpoint = endpoint or env_endpoint()
            region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
            if region:
                config["region"] = region
            config.update(access.s3_config())
            if endpoint and access.addressing == "virtual":  # obstore wants the bucket in the endpoint then
                ep = urlsplit(endpoint)
                endpoint = ep._replace(netloc=f"{parts.netloc}.{ep.netloc}").geturl()
        if endpoint:
            config[_ENDPOINT_KEY[scheme]] = endpoint
        if anonymous:
            config["skip_signature"] = True
        self._url, self._config, self._access, self._anonymous = url, config, access, anonymous
        self._client = {"allow_http": bool(endpoint and endpoint.startswith("http://")), **access.client_options()}
        self._connect(retry, loop, "objects", stat_ttl, list_ttl)

    def _connect(self, retry: Retry, loop: LoopThread | None, name: str, stat_ttl: float, list_ttl: float) -> None:
        """Open the store (``_build``), the request loop (``loop``, or a thread ``name`` of its own),
        the remembered versions and listings and the counters: the end of every ``__init__``."""
        self._retry = retry
        self._store = self._build(retry)
        self._own_loop = loop is None
        self.loop = loop or LoopThread(name=name)
        self._versions = Remembered(stat_ttl)
        self._listings = Listings(list_ttl)
        self.stats = StoreStats()

    def _build(self, retry: Retry) -> Any:
        """The obstore store of this source, with ``retry``'s bounds on each request."""
        client = {**self._client, "timeout": timedelta(seconds=retry.request_timeout),
                  "connect_timeout": timedelta(seconds=retry.connect_timeout),
                  "pool_idle_timeout": timedelta(seconds=POOL_IDLE)}
        retry_config = {"max_retries": retry.max_retries, "retry_timeout": timedelta(seconds=retry.retry_timeout),
                        "backoff": {"init_backoff": timedelta(seconds=retry.init_backoff),
                                    "max_backoff": timedelta(seconds=retry.max_backoff), "base": 2}}
        return self._open(client, retry_config)

    def _open(self, client: dict[str, Any], retry_config: dict[str, Any]) -> Any:
        """The obstore store for these client options and retry configuration."""
        provider = None if "skip_signature" in self._config else self._access.credentials
        return from_url(self._url, config=self._config or None, client_options=client, retry_config=retry_config,
                        credential_provider=provider)

    def close(self) -> None:
        """Stop the loop thread if this storage started it."""
        if self._own_loop:
            self.loop.close()

    def describe(self, key: str) -> str:
        return f"{self.url}/{key}" if key else self.url

    def owner_path(self, key: str) -> str | None:
        return None  # objects have no owners

    def statvfs(self) -> os.statvfs_result:
        """An object store has no size or inode limit to report: like mountpoint-s3, a large
        constant (1 EiB in 1 MiB blocks, all free; 2^32 files, all free), so ``df`` and tools
        that check free space before writing see a usable filesystem."""
        blocks, files = STATFS_BYTES // STATFS_BLOCK, 1 << 32
        return os.statvfs_result((STATFS_BLOCK, STATFS_BLOCK, blocks, blocks, blocks, files, files, files, 0, 255))

    # ------------------------------------------------------------------ remembered versions

    def version_now(self, key: str) -> Version | None | Unknown:
        return self._versions.get(key)

    def changed(self, key: str) -> None:
        self._versions.forget(key)
        self._listings.forget(key)

    # ------------------------------------------------------------------ errors

    def _error(self, e: BaseException, key: str) -> BaseException:
        """The ``OSError`` (or ``VersionMismatch``) for an obstore failure on ``key``."""
        where = self.describe(key)
        if isinstance(e, (PreconditionError, AlreadyExistsError)):
            return VersionMismatch(where)
        if isinstance(e, _MISSING):
            return FileNotFoundError(errno.ENOENT, "no such object", where)
        if isinstance(e, (PermissionDeniedError, UnauthenticatedError)) or _status(e) in (401, 403):
            return PermissionError(errno.EACCES, f"access denied: {_first_line(e)}", where)
        if isinstance(e, OSError):
            return e
        log.error("%s: %s", where, _first_line(e))  # after obstore's retries: this request fails
        return OSError(errno.EIO, _first_line(e), where)

    # ------------------------------------------------------------------ coroutines (the loop thread)

    async def aversion(self, key: str) -> Version | None:
        """See ``Storage.version``."""
        if not key or key.endswith("/"):
            return None
        try:
            with self.stats.request("HEAD", _ANSWERS):
                return _version(await obstore.head_async(self._store, key))
        except _MISSING:
            return None
        except Exception as e:
            raise self._error(e, key) from None

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
            with self.stats.request("GET", _ANSWERS) as counted:
                result = await obstore.get_async(self._store, key, options=options)
                body = await result.bytes_async()
                counted.bytes_in = len(body)
            return bytes(body) if copy else body, _version(result.meta)
        except Exception as e:
            if rng is not None and _status(e) == 416:  # starts at or past the end
                return b"", None  # type: ignore[return-value]  # past the end: no version (callers check)
            raise self._error(e, key) from None

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
        token = self._versions.token()
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
            self._versions.put(key, None, token)
            raise
        self._versions.put(key, version, token)
        return data, version

    async def aread_all(self, key: str, copy: bool = True) -> tuple[Buffer, Version]:
        """See ``Storage.read_all``; the version is remembered as ``read_versioned``'s;
        ``copy=False`` as for ``aread``."""
        token = self._versions.token()
        try:
            data, version = await self._get(key, None, None, copy)
        except FileNotFoundError:
            self._versions.put(key, None, token)
            raise
        self._versions.put(key, version, token)
        return data, version

    async def areplace(self, key: str, data: Iterable[bytes | memoryview],
                       if_version: Version | Absent | None = None) -> Version:
        """See ``Storage.replace``."""
        body = b"".join(data)
        if if_version is None:
            mode: Any = "overwrite"
        elif if_version is ABSENT:
            mode = "create"
        else:
            mode = {"e_tag": if_version.tag}  # type: ignore[union-attr]  # a Version: None, ABSENT handled above
        try:
            with self.stats.request("PUT", _ANSWERS):
                put = await obstore.put_async(self._store, key, body, mode=mode, use_multipart=False)
            self.stats.bytes_out += len(body)
        except Exception as e:
            if isinstance(e, _MISSING) and isinstance(if_version, Version):
                # If-Match on a key that vanished: S3 answers 412 (obstore's PreconditionError),
                # some servers 404. A 404 to any other PUT (no bucket) stays an error.
                raise VersionMismatch(self.describe(key)) from None
            raise self._error(e, key) from None
        finally:
            self.changed(key)
        etag = put.get("e_tag") or ""
        now = await self.aversion(key)
        if now is not None and now.tag == etag:
            return now
        return Version(etag, len(body), 0)  # already replaced by another writer

    async def adelete(self, key: str, if_version: Version | Absent | None = None) -> None:
        """See ``Storage.delete`` (conditional: HEAD check then DELETE, see the module docstring)."""
        if if_version is not None:
            now = await self.aversion(key)
            if if_version is ABSENT:
                if now is not None:
                    raise VersionMismatch(self.describe(key))
                return
            if now is None or now.tag != if_version.tag:  # type: ignore[union-attr]  # a Version: ABSENT handled above
                raise VersionMismatch(self.describe(key))
        try:
            with self.stats.request("DELETE", _ANSWERS):
                await obstore.delete_async(self._store, key)
        except _MISSING:
            pass
        except Exception as e:
            raise self._error(e, key) from None
        finally:
            self.changed(key)

    # ------------------------------------------------------------------ Storage (blocking)

    def version(self, key: str) -> Version | None:
        found = self._versions.get(key)
        if found is UNKNOWN:
            token = self._versions.token()
            found = self.loop.run(self.aversion(key))
            self._versions.put(key, found, token)
        return found  # type: ignore[return-value]  # not UNKNOWN: asked just above

    def read(self, key: str, ranges: Sequence[Range], if_version: Version | None = None) -> list[bytes]:
        return self.loop.run(self.aread(key, ranges, if_version))

    def read_versioned(self, key: str, rng: Range) -> tuple[bytes, Version]:
        return self.loop.run(self.aread_versioned(key, rng))

    def read_all(self, key: str) -> tuple[bytes, Version]:
        return self.loop.run(self.aread_all(key))

    def replace(self, key: str, data: Iterable[bytes | memoryview],
                if_version: Version | Absent | None = None) -> Version:
        return self.loop.run(self.areplace(key, data, if_version))

    def delete(self, key: str, if_version: Version | Absent | None = None) -> None:
        self.loop.run(self.adelete(key, if_version))

    def check_write(self, key: str) -> None:
        """Nothing to refuse: a key of an object store is an object or nothing."""

    def move(self, src: str, dst: str) -> None:
        """See ``Storage.move``: an object store has no rename of a prefix (copying every object
        would be neither atomic nor cheap), so always EXDEV."""
        raise OSError(errno.EXDEV, "an object store cannot rename a prefix", self.describe(src))

    def list(self, prefix: str) -> Iterator[list[Entry]]:
        """See ``Storage.list`` (remembered for ``list_ttl`` seconds, ``Listings``)."""
        return self._listings.list(prefix, self._list)

    def _list(self, prefix: str) -> Iterator[builtins.list[Entry]]:
        """One listing from the store: pages of at most ``PAGE`` entries, files and sub-prefixes in
        key order (blocking; each page is fetched when the previous one was consumed)."""
        base = prefix.strip("/")
        head = base + "/" if base else ""
        page: list[Entry] = []
        offset: str | None = None
        while True:
            skip_to = None
            try:
                token = self._versions.token()
                for chunk in self._pages(obstore.list(self._store, base or None, offset=offset, chunk_size=PAGE)):
                    for meta in chunk:
                        if offset is not None and meta["path"] <= offset:
                            continue  # a store that ignores the offset (Azurite 3.35) lists from the start
                        name, sub, _ = meta["path"][len(head):].partition("/")
                        if not name:
                            continue
                        if not sub:
                            self._versions.put(meta["path"], _version(meta), token)
                        page.append(Entry(name, bool(sub)))
                        if len(page) >= PAGE:
                            yield page
                            page = []
                        if sub:  # skip the rest of this sub-prefix: restart after it
                            skip_to = f"{head}{name}/\U0010ffff"
                            break
                    if skip_to:
                        break
            except Exception as e:
                raise self._error(e, prefix) from None
            if skip_to is None:
                break
            offset = skip_to
        if page:
            yield page

    def keys_below(self, prefix: str, most: int) -> builtins.list[str] | None:
        """Every key below ``prefix`` at any depth, relative to it, in key order; None if there
        are more than ``most`` (the listing stops there: at most ``most // PAGE + 1`` requests).
        Blocking; not remembered (``list`` is)."""
        base = prefix.strip("/")
        head = len(base) + 1 if base else 0
        keys: list[str] = []
        try:
            for chunk in self._pages(obstore.list(self._store, base or None, chunk_size=PAGE)):
                keys.extend(meta["path"][head:] for meta in chunk)
                if len(keys) > most:
                    return None
        except Exception as e:
            raise self._error(e, prefix) from None
        return keys

    def is_dir(self, key: str) -> bool:
        """True if some object lies below prefix ``key``: told by the listings remembered, else
        one listing request of one key."""
        known = self._listings.is_dir(key)
        if known is not None:
            return known
        base = key.strip("/")
        try:
            return any(chunk for chunk in self._pages(obstore.list(self._store, base or None, chunk_size=1)))
        except Exception as e:
            raise self._error(e, key) from None

    def _pages(self, pages: Iterator[builtins.list[dict]]) -> Iterator[builtins.list[dict]]:
        """The pages of an obstore listing, each counted as one ``LIST`` request (a listing
        with no page made one too)."""
        first = True
        while True:
            started = time.monotonic()
            try:
                page = next(pages, None)
            except Exception as e:
                self.stats.count("LIST", time.monotonic() - started)
                self.stats.failures += not isinstance(e, _ANSWERS)
                raise
            if page is not None or first:
                self.stats.count("LIST", time.monotonic() - started)
            if page is None:
                return
            first = False
            yield page

    # ------------------------------------------------------------------ mount-time check

    def check(self) -> None:
        """Raise ``StorageUnavailable`` (one line) unless the bucket and prefix exist and answer
        these credentials; fails fast (two attempts, 5 s each) on an unreachable endpoint."""
        quick = self._build(Retry(max_retries=1, retry_timeout=5, request_timeout=min(5.0, self._retry.request_timeout),
                                  connect_timeout=min(3.0, self._retry.connect_timeout)))
        try:
            found = any(chunk for chunk in obstore.list(quick, None, chunk_size=1))
        except Exception as e:
            status = _status(e)
            denied = isinstance(e, (PermissionDeniedError, UnauthenticatedError)) or status in (401, 403)
            if denied and self._anonymous:
                why = "access denied to unsigned requests (-o anonymous): not a public bucket; give credentials"
            elif denied:
                why = f"access denied (check the credentials: {self._access.hint}; a public bucket: -o anonymous)"
            elif status == 404:
                why = "no such bucket"
            elif status is None and (tls := tls_failure(e, self.scheme == "s3")):
                why = tls
            elif status is None:
                why = f"endpoint unreachable ({_first_line(e)})"
            else:
                why = f"HTTP {status}"
            raise StorageUnavailable(f"{self.url}: {why}") from None
        if not found and urlsplit(self._url).path.strip("/"):
            raise StorageUnavailable(f"{self.url}: no such prefix (no object below it)")


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
