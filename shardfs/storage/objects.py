"""Object storage (S3 and S3-compatible; GCS and Azure through the same code) behind ``Storage``.

``ObjectStorage("s3://BUCKET[/PREFIX]", endpoint=, region=, anonymous=)`` maps the interface onto
obstore (the Rust object_store bindings zarr-python 3 uses):

- ``list``: paginated, bounded memory. S3's delimiter listing is not exposed page by page by
  object_store (``list_with_delimiter`` collects every page), so the listing is the recursive
  one (pages of ``PAGE`` keys, ``start-after`` driven) and skips each sub-prefix once seen:
  one more request per sub-prefix, never more than one page in memory. An entry listed again
  is dropped, not a key before the offset: a store listing in its own order (SeaweedFS lists
  ``a/`` before ``a-/``) gives after the offset names the bytes' order puts before it.
- ``replace``: one PUT of the whole content, ``If-Match: <etag>`` (or ``If-None-Match: *`` for
  ``ABSENT``); 412, or 404 for If-Match on a vanished key, -> ``VersionMismatch``. The new
  version's mtime comes from a HEAD (0 if another writer already replaced it). A PUT whose
  connection dropped is retried by obstore; if the first attempt had landed, the retry's 412
  reports ``VersionMismatch`` for a write that happened (a fold re-reads and finds it applied).
- ``delete``: S3 DeleteObject takes no condition through object_store, so a conditional delete
  is a HEAD check, then the DELETE: a writer replacing the key between the two loses its
  write (the window is a round trip, seconds while obstore retries the DELETE). So folds never
  delete shards here (``Storage.atomic_delete``): one that empties a shard PUTs an empty shard,
  If-Match; only the metadata paths delete.


The rest (versions, reads, retries and faults, the loop thread, connections) is the request
path shared with the web kind: ``shardfs.storage.requests``.

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

import builtins
import errno
import os
import time
from typing import Any, Iterable, Iterator
from urllib.parse import urlsplit

import obstore
from obstore.store import from_url
from obstore.exceptions import PermissionDeniedError, UnauthenticatedError

from shardfs.storage.urls import env_endpoint
from shardfs.storage import ABSENT, Entry, Version, VersionMismatch, Absent
from shardfs.storage.access import Access
from shardfs.storage.listings import Listings
from shardfs.storage.versions import Versions
from shardfs.storage.loop import LoopThread
from shardfs.storage.requests import (ANSWERS, MISSING, ObjectRequests, OverRequests, Retry, StorageUnavailable,
                                      first_line, stamp_ns, status_of, tls_failure, version_of)

PAGE = 1000  # entries per listing page (S3's own page size)
_SCHEMES = {"s3": "s3", "s3a": "s3", "gs": "gs", "az": "az", "azure": "az", "abfs": "az", "abfss": "az"}
_ENDPOINT_KEY = {"s3": "endpoint", "gs": "base_url", "az": "endpoint"}


class ObjectStorage(OverRequests):
    """``Storage`` over one bucket/container and prefix of an object store (thread-safe)."""

    def __init__(self, url: str, *, endpoint: str | None = None, region: str | None = None,
                 anonymous: bool = False, retry: Retry = Retry(), loop: LoopThread | None = None,
                 stat_ttl: float = 1.0, listings: Listings | None = None, access: Access = Access(),
                 versions: Versions | None = None):
        parts = urlsplit(url)
        scheme = _SCHEMES.get(parts.scheme)
        if scheme is None or not parts.netloc:
            raise ValueError(f"{url}: not an object store URL (s3://BUCKET[/PREFIX], gs://..., az://...)")
        if region and scheme != "s3":
            raise ValueError(f"{url}: region= applies to s3:// only")
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
        client = {"allow_http": bool(endpoint and endpoint.startswith("http://")), **access.client_options()}
        super().__init__(ObjectRequests(url, scheme, self._open, client, retry=retry, loop=loop, name="objects",
                                        stat_ttl=stat_ttl, listings=listings, versions=versions))

    def _open(self, client: dict[str, Any], retry_config: dict[str, Any]) -> Any:
        """The obstore store for these client options and retry configuration."""
        provider = None if "skip_signature" in self._config else self._access.credentials
        return from_url(self._url, config=self._config or None, client_options=client, retry_config=retry_config,
                        credential_provider=provider)

    # ------------------------------------------------------------------ writes (coroutines: the loop thread)

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
            with self.stats.request("PUT", ANSWERS):
                put = await obstore.put_async(self.requests.store, key, body, mode=mode, use_multipart=False)
            self.stats.bytes_out += len(body)
        except Exception as e:
            if isinstance(e, MISSING) and isinstance(if_version, Version):
                # If-Match on a key that vanished: S3 answers 412 (obstore's PreconditionError),
                # some servers 404. A 404 to any other PUT (no bucket) stays an error.
                raise VersionMismatch(self.describe(key)) from None
            raise self.requests.error(e, key) from None
        finally:
            self.changed(key)
        etag = put.get("e_tag") or ""
        now = await self.requests.aversion(key)
        if now is not None and now.tag == etag:
            return now
        # already replaced by another writer: its own Last-Modified unknown, about now
        return Version(etag, len(body), stamp_ns(int(time.time()), etag))

    async def adelete(self, key: str, if_version: Version | Absent | None = None) -> None:
        """See ``Storage.delete`` (conditional: HEAD check then DELETE, see the module docstring)."""
        if if_version is not None:
            now = await self.requests.aversion(key)
            if if_version is ABSENT:
                if now is not None:
                    raise VersionMismatch(self.describe(key))
                return
            if now is None or now.tag != if_version.tag:  # type: ignore[union-attr]  # a Version: ABSENT handled above
                raise VersionMismatch(self.describe(key))
        try:
            with self.stats.request("DELETE", ANSWERS):
                await obstore.delete_async(self.requests.store, key)
        except MISSING:
            pass
        except Exception as e:
            raise self.requests.error(e, key) from None
        finally:
            self.changed(key)

    # ------------------------------------------------------------------ Storage (blocking)

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
        return self.requests.listings.list(prefix, self._list)

    def _list(self, prefix: str) -> Iterator[builtins.list[Entry]]:
        """One listing from the store: pages of at most ``PAGE`` entries, files and sub-prefixes in
        key order (blocking; each page is fetched when the previous one was consumed)."""
        base = prefix.strip("/")
        head = base + "/" if base else ""
        page: list[Entry] = []
        offset: str | None = None
        given: set[tuple[str, bool]] = set()  # entries listed already (one directory's: its listing keeps them all)
        while True:
            skip_to = None
            try:
                token = self.requests.versions.token()
                for chunk in self._listed(base, offset=offset, chunk_size=PAGE):
                    for meta in chunk:
                        name, sub, _ = meta["path"][len(head):].partition("/")
                        # a store that ignores the offset (Azurite 3.35) lists from the start again;
                        # one that lists in its own order, not the bytes' (SeaweedFS: ``a`` before
                        # ``a-``), may list after the offset a name the bytes put before it
                        if not name or (name, bool(sub)) in given:
                            continue
                        given.add((name, bool(sub)))
                        if not sub:
                            self.requests.versions.put(meta["path"], version_of(meta), token)
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
                raise self.requests.error(e, prefix) from None
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
            for chunk in self._listed(base, chunk_size=PAGE):
                keys.extend(meta["path"][head:] for meta in chunk)
                if len(keys) > most:
                    return None
        except Exception as e:
            raise self.requests.error(e, prefix) from None
        return keys

    def is_dir(self, key: str) -> bool:
        """True if some object lies below prefix ``key``: told by the listings remembered, else
        one listing request of one key."""
        known = self.requests.listings.is_dir(key)
        if known is not None:
            return known
        base = key.strip("/")
        try:
            return any(chunk for chunk in self._listed(base, chunk_size=1))
        except Exception as e:
            raise self.requests.error(e, key) from None

    def _listed(self, base: str, **options: Any) -> Iterator[builtins.list[dict]]:
        """The pages of a listing of the keys below ``base``, counted (``ObjectRequests.pages``)."""
        return self.requests.pages(obstore.list(self.requests.store, base or None, **options))

    # ------------------------------------------------------------------ mount-time check

    def check(self) -> None:
        """Raise ``StorageUnavailable`` (one line) unless the bucket and prefix exist and answer
        these credentials; fails fast (two attempts, 5 s each) on an unreachable endpoint."""
        retry = self.requests.retry
        quick = self.requests.build(Retry(max_retries=1, retry_timeout=5,
                                          request_timeout=min(5.0, retry.request_timeout),
                                          connect_timeout=min(3.0, retry.connect_timeout)))
        try:
            found = any(chunk for chunk in obstore.list(quick, None, chunk_size=1))
        except Exception as e:
            status = status_of(e)
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
                why = f"endpoint unreachable ({first_line(e)})"
            else:
                why = f"HTTP {status}"
            raise StorageUnavailable(f"{self.url}: {why}") from None
        if not found and urlsplit(self._url).path.strip("/"):
            raise StorageUnavailable(f"{self.url}: no such prefix (no object below it)")
