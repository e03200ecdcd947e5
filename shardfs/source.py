"""What a ``SRC`` argument names: a local directory or an object-store URL, and its options.

``Source.parse(src, own)`` sorts the ``-o`` options that belong to one kind of source
(``follow_symlinks`` for a directory; ``endpoint``, ``region``, ``anonymous``,
``cache_size``, ``cache_dir``, ``timeout`` for a URL; of these, a plain web server,
``http(s)://``, takes the last three) and refuses the ones given to the other kind
(``ValueError``, one line). A URL is normalized (scheme in lower case, no empty path
segments, no trailing "/"), and its endpoint is the one in effect: ``-o endpoint`` or,
for ``s3://``, ``AWS_ENDPOINT_URL``. ``(name, endpoint)`` identifies the source: the state
directory (``shardfs.state``) is keyed on it, so the next mount of the same URL through the
same server finds its journal.

This module imports no client library: ``opened()`` imports obstore only for a URL.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://([^/]*)(.*)$")
LOCAL_ONLY = ("follow_symlinks",)
URL_ONLY = ("endpoint", "region", "anonymous", "cache_size", "cache_dir", "timeout")
OBJECT_STORE_ONLY = ("endpoint", "region", "anonymous")  # not for a web server (http(s)://)
WEB_SCHEMES = ("http", "https")
# Seconds one object-store request may take, connecting and the whole answer included (``-o
# timeout``): obstore's own default, under which a whole shard (up to 64 MiB, one GET or one PUT)
# still passes at about 2.2 MB/s. s3fs waits 120 s for a stalled transfer, mountpoint-s3 has no
# request timeout at all; a hung server costs a read this long before EIO (see ``Retry.for_timeout``).
DEFAULT_TIMEOUT = 30.0


def is_url(src: str) -> bool:
    """True if ``src`` is ``scheme://...`` (an object store), not a path."""
    return _URL.match(src) is not None


def normalize_url(url: str) -> str:
    """``url`` with its scheme in lower case and its path without empty segments or a final "/"."""
    m = _URL.match(url)
    if m is None:
        raise ValueError(f"{url}: not a URL")
    scheme, host, path = m.groups()
    parts = [p for p in path.split("/") if p]
    return f"{scheme.lower()}://{host}" + "".join("/" + p for p in parts)


def is_web(url: str) -> bool:
    """True if ``url`` names a plain web server (``http://``, ``https://``)."""
    return url.split("://", 1)[0].lower() in WEB_SCHEMES


def env_endpoint(url: str, environ: Mapping[str, str] = os.environ) -> str | None:
    """The endpoint an ``s3://`` URL reaches without ``-o endpoint``: ``AWS_ENDPOINT_URL``
    (or ``AWS_ENDPOINT``); None for other schemes and for the service's default."""
    if normalize_url(url).split("://", 1)[0] not in ("s3", "s3a"):
        return None
    return environ.get("AWS_ENDPOINT_URL") or environ.get("AWS_ENDPOINT") or None


@dataclass(frozen=True)
class Source:
    """A source as the mount uses it. ``name``: the absolute path of a directory, or the
    normalized URL; ``endpoint``: a URL's endpoint in effect (None: the service's default)."""

    name: str
    url: bool
    endpoint: str | None = None
    region: str | None = None
    anonymous: bool = False
    follow_symlinks: bool = False
    timeout: float = DEFAULT_TIMEOUT  # seconds per object-store request (``-o timeout``)

    @classmethod
    def parse(cls, src: str, own: Mapping[str, str], environ: Mapping[str, str] = os.environ) -> "Source":
        """The source named by ``src`` with the ``-o`` options ``own``; ``ValueError`` (one line)
        for an option that does not apply to this kind of source."""
        url = is_url(src)
        wrong = [n for n in (LOCAL_ONLY if url else URL_ONLY) if n in own]
        if wrong:
            raise ValueError(f"-o {wrong[0]}: applies to a local directory, not to an object-store URL" if url
                             else f"-o {wrong[0]}: applies to an object-store URL (s3://...), not to a local directory")
        if not url:
            return cls(os.path.abspath(src), False, follow_symlinks="follow_symlinks" in own)
        name = normalize_url(src)
        web = [n for n in OBJECT_STORE_ONLY if n in own] if is_web(name) else []
        if web:
            raise ValueError(f"-o {web[0]}: applies to an object store (s3://...), not to a web server")
        if "region" in own and not name.startswith(("s3://", "s3a://")):
            raise ValueError("-o region: applies to s3:// URLs only")
        endpoint = own.get("endpoint") or env_endpoint(name, environ)
        return cls(name, True, endpoint=endpoint, region=own.get("region") or None,
                   anonymous="anonymous" in own, timeout=float(own.get("timeout", DEFAULT_TIMEOUT)))

    @property
    def web(self) -> bool:
        """True for a plain web server (``http(s)://``): read-only, no listing."""
        return self.url and is_web(self.name)

    @contextlib.contextmanager
    def opened(self, version_ttl: float = 1.0, list_ttl: float = 0.0) -> Iterator[Any]:
        """The ``Storage`` of this source, open for the ``with`` block (an object store's
        request loop thread runs only inside it: start it after any fork, never before).
        ``version_ttl``: how long an object store remembers a key's version (the mount passes
        its ``attr_timeout``: the lag it promises for changes behind its back); a local
        directory remembers stats for 1 s whatever it is. ``list_ttl``: how long either
        remembers a listing (the mount passes its ``entry_timeout``)."""
        if not self.url:
            from shardfs.storage.local import LocalStorage

            yield LocalStorage(self.name, follow_symlinks=self.follow_symlinks, list_ttl=list_ttl)
            return
        from shardfs.storage.objects import ObjectStorage, Retry

        retry = Retry.for_timeout(self.timeout)
        if self.web:
            from shardfs.storage.web import WebStorage

            storage: Any = WebStorage(self.name, retry=retry, stat_ttl=version_ttl, list_ttl=list_ttl)
        else:
            storage = ObjectStorage(self.name, endpoint=self.endpoint, region=self.region, anonymous=self.anonymous,
                                    retry=retry, stat_ttl=version_ttl, list_ttl=list_ttl)
        try:
            yield storage
        finally:
            storage.close()
