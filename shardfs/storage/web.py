"""A plain web server (``http(s)://host/path/data.zarr``) behind ``Storage``, read-only.

Many public Zarr datasets are served by web servers that answer ranged GETs and nothing
else: no listing, no writes. ``WebStorage`` reads them with obstore's ``HTTPStore`` through
the request path it shares with the object stores (``shardfs.storage.requests``: ranged and
suffix GETs, If-Match on the ETag, retries, counters), and makes up the listings the view
needs from what the data says:

- a group lists ``zarr.json`` and the children its metadata names: the members of
  consolidated metadata (``consolidated_metadata.metadata`` in its ``zarr.json``), the
  levels of an OME-Zarr image (``multiscales[*].datasets[*].path``, 0.4 or 0.5 spelling),
  the images of a labels group (``labels``) and, for an image, its ``labels`` group when
  one answers. Any other child is found by name (a lookup GETs its ``zarr.json``): ``ls``
  does not show it, ``cd`` and ``open`` work.
- an array lists ``zarr.json`` and its chunk key space level by level (``c``, ``c/0``...),
  computed from its shape, chunk grid and key encoding: every position of the shard grid,
  made page by page as the listing is read, for grids of at most ``LISTED_MAX`` positions;
  a larger grid lists none (its chunk files are found by name), so no listing of a huge
  declared shape builds every name (or reads every shard's index).
  Which shards exist comes from their GETs (the view reads a listed shard's index; 404:
  absent), so a listing costs no request of its own.

Versions are the server's ETag (or Last-Modified) and size, as for objects; a server that
sends neither makes every key look unchanged for the life of the mount (said once in the
log at mount). ``replace``, ``delete`` and ``move`` fail with EROFS: the mount is read-only.
"""

from __future__ import annotations

import builtins
import errno
import itertools
import json
import logging
import math
import time
from typing import Any, Iterable, Iterator

import obstore
from obstore.exceptions import NotFoundError
from obstore.store import HTTPStore

from shardfs.storage import Entry, Version, Absent
from shardfs.storage.listings import Listings
from shardfs.storage.versions import Versions
from shardfs.storage.loop import LoopThread
from shardfs.storage.access import Access
from shardfs.storage.requests import (ObjectRequests, OverRequests, Retry, StorageUnavailable, first_line,
                                      status_of, tls_failure, version_of)

log = logging.getLogger("shardfs")
DOC_TTL = 1.0  # seconds a zarr.json read for a listing is remembered
DOCS_KEPT = 1024  # zarr.json documents remembered at most (all forgotten past it)
LIST_PAGE = 1000  # entries per page of a made-up listing
LISTED_MAX = 100_000  # shard positions of an array's key space listed at most (beyond: found by name)


class WebStorage(OverRequests):
    """``Storage`` over ``http(s)://host/path`` (thread-safe; read-only)."""

    def __init__(self, url: str, *, retry: Retry = Retry(), loop: LoopThread | None = None,
                 stat_ttl: float = 1.0, listings: Listings | None = None, access: Access = Access(),
                 versions: Versions | None = None):
        self._url = url = url.rstrip("/")
        client = {"allow_http": url.startswith("http://"), **access.client_options()}  # TLS trust only:
        self._docs: dict[str, tuple[float, dict[str, Any] | None]] = {}  # a web server takes no credentials
        super().__init__(ObjectRequests(url, "http", self._open, client, retry=retry, loop=loop, name="web",
                                        stat_ttl=stat_ttl, listings=listings, versions=versions))

    def _open(self, client: dict[str, Any], retry_config: dict[str, Any]) -> HTTPStore:
        return HTTPStore.from_url(self._url, client_options=client, retry_config=retry_config)

    # ------------------------------------------------------------------ no writes

    def replace(self, key: str, data: Iterable[bytes | memoryview],
                if_version: Version | Absent | None = None) -> Version:
        raise OSError(errno.EROFS, "a web server is read-only", self.describe(key))

    def delete(self, key: str, if_version: Version | Absent | None = None) -> None:
        raise OSError(errno.EROFS, "a web server is read-only", self.describe(key))

    def move(self, src: str, dst: str) -> None:
        raise OSError(errno.EROFS, "a web server is read-only", self.describe(src))

    def check_write(self, key: str) -> None:
        raise OSError(errno.EROFS, "a web server is read-only", self.describe(key))

    # ------------------------------------------------------------------ listings made up

    def list(self, prefix: str) -> Iterator[list[Entry]]:
        """See ``Storage.list``: made up from the metadata (module docstring), remembered as
        listings are."""
        return self.requests.listings.list(prefix.strip("/"), self._list)

    def _list(self, prefix: str) -> Iterator[builtins.list[Entry]]:
        entries = iter(self._entries(prefix))
        while page := builtins.list(itertools.islice(entries, LIST_PAGE)):
            yield page

    def is_dir(self, key: str) -> bool:
        """True if ``key`` is a group, an array or a prefix of an array's key space (computed,
        never by listing a key space)."""
        key = key.strip("/")
        if not key:
            return True
        parts = key.split("/")
        for cut in range(len(parts)):  # an array above ``key``: its key space says
            doc = self._doc("/".join(parts[:cut]))
            if doc is None:
                return False
            if doc.get("node_type") == "array":
                return key_level(doc, tuple(parts[cut:])) is not None
        parent, _, name = key.rpartition("/")
        return any(e.name == name and e.is_dir for page in self.list(parent) for e in page)

    def keys_below(self, prefix: str, most: int) -> builtins.list[str] | None:
        """Unknown without listing the whole key space: None (the view reads indexes as opened)."""
        return None

    def _doc(self, key: str) -> dict[str, Any] | None:
        """The parsed ``zarr.json`` at ``key`` (a prefix), or None if there is none or it is bad;
        remembered for ``DOC_TTL`` seconds (listing a deep prefix asks for every one above it)."""
        now = time.monotonic()
        kept = self._docs.get(key)
        if kept is not None and kept[0] > now:
            return kept[1]
        try:
            data, _ = self.read_all(f"{key}/zarr.json" if key else "zarr.json")
            doc = json.loads(data)
        except (FileNotFoundError, ValueError):
            doc = None
        if len(self._docs) >= DOCS_KEPT:
            self._docs.clear()
        self._docs[key] = (now + DOC_TTL, doc if isinstance(doc, dict) else None)
        return self._docs[key][1]

    def _entries(self, prefix: str) -> Iterable[Entry]:
        parts = prefix.split("/") if prefix else []
        for cut in range(len(parts) + 1):  # from the root down: the first array owns the rest
            base = "/".join(parts[:cut])
            doc = self._doc(base)
            if doc is None:
                return []
            if doc.get("node_type") == "array":
                level = key_level(doc, tuple(parts[cut:]))
                if level is None:
                    return []
                names, leaf = level
                entries = (Entry(n, not leaf) for n in names)
                return itertools.chain([Entry("zarr.json", False)], entries) if cut == len(parts) else entries
        children = set(self._children(prefix, doc))  # type: ignore[arg-type]  # the loop ran (cut 0) and returned on None
        for cut in range(len(parts)):  # consolidated metadata of the groups above names them too
            above = self._doc("/".join(parts[:cut]))
            children.update(consolidated_children(above or {}, "/".join(parts[cut:])))
        return [Entry("zarr.json", False), *(Entry(n, True) for n in sorted(children))]

    def _children(self, prefix: str, doc: dict[str, Any]) -> builtins.list[str]:
        names = group_children(doc)
        attrs = doc.get("attributes") or {}
        if _multiscales(attrs) and "labels" not in names and self._doc(f"{prefix}/labels" if prefix else "labels"):
            names.append("labels")
        return names

    # ------------------------------------------------------------------ mount-time check

    def check(self) -> None:
        """Raise ``StorageUnavailable`` (one line) unless the server answers for ``zarr.json``
        (a missing one is for the caller to explain); warn once if it sends no version."""
        quick = self.requests.build(Retry(max_retries=1, retry_timeout=5, request_timeout=5.0, connect_timeout=3.0))
        try:
            version: Version | None = version_of(obstore.head(quick, "zarr.json"))
        except (NotFoundError, FileNotFoundError):
            version = None
        except Exception as e:  # obstore raises many types
            status = status_of(e)
            why = f"HTTP {status}" if status else tls_failure(e) or f"server unreachable ({first_line(e)})"
            raise StorageUnavailable(f"{self.url}: {why}") from None
        if version is not None and not version.tag and not version.mtime_ns:
            log.warning("%s: the server sends neither ETag nor Last-Modified: the source is treated as "
                        "immutable (changes on the server are not seen while mounted)", self.url)


def group_children(doc: dict[str, Any]) -> list[str]:
    """The direct children a group's ``zarr.json`` names: members of inline consolidated
    metadata, OME-Zarr multiscale levels, and the images of an OME labels group."""
    names = consolidated_children(doc, "")
    attrs = doc.get("attributes") or {}
    for multiscale in _multiscales(attrs):
        for dataset in multiscale.get("datasets") or ():
            if isinstance(dataset, dict) and isinstance(dataset.get("path"), str):
                names.append(dataset["path"].split("/")[0])
    inner = attrs.get("ome")
    ome = inner if isinstance(inner, dict) else attrs
    labels = ome.get("labels")
    if isinstance(labels, list):
        names.extend(str(n).split("/")[0] for n in labels if isinstance(n, str))
    return [n for n in names if n and n not in (".", "..")]


def consolidated_children(doc: dict[str, Any], below: str) -> list[str]:
    """The children of the group at relative path ``below`` (``""``: the group itself) that the
    inline consolidated metadata of group ``zarr.json`` ``doc`` names."""
    consolidated = doc.get("consolidated_metadata")
    if not isinstance(consolidated, dict) or not isinstance(consolidated.get("metadata"), dict):
        return []
    head = below + "/" if below else ""
    return [str(k)[len(head):].split("/")[0] for k in consolidated["metadata"] if str(k).startswith(head)]


def _multiscales(attrs: dict[str, Any]) -> list[dict[str, Any]]:
    inner = attrs.get("ome")
    ome = inner if isinstance(inner, dict) else attrs
    found = ome.get("multiscales")
    return [m for m in found if isinstance(m, dict)] if isinstance(found, list) else []


def key_level(doc: dict[str, Any], rel: tuple[str, ...]) -> tuple[Iterator[str], bool] | None:
    """``(names, leaf)`` at ``rel`` in the chunk key space of an array ``zarr.json``: the
    names one level below, made as they are consumed (``leaf``: they are shard keys, not
    directories), or None if ``rel`` is not a prefix of a key. Regular grids and both key
    encodings only. A key space of more than ``LISTED_MAX`` shard positions has no names
    (``rel`` is still checked): its chunk files are found by name."""
    try:
        shape = [int(s) for s in doc["shape"]]
        chunks = [int(c) for c in doc["chunk_grid"]["configuration"]["chunk_shape"]]
        encoding = doc.get("chunk_key_encoding") or {"name": "default"}
        kind = encoding.get("name", "default")
        sep = (encoding.get("configuration") or {}).get("separator", "/" if kind == "default" else ".")
    except (KeyError, TypeError, ValueError):
        return None
    grid = [math.ceil(s / c) if c > 0 else 0 for s, c in zip(shape, chunks)]
    listed = math.prod(grid) <= LISTED_MAX
    lead = ["c"] if kind == "default" else []
    if sep != "/":  # every key is one name at the array root
        if rel:
            return None
        if not grid:
            return iter(["c"] if kind == "default" else ["0"]), True
        if not listed:  # (product() would make a list of each range)
            return iter(()), True
        return (sep.join([*lead, *map(str, idx)]) for idx in itertools.product(*map(range, grid))), True
    levels: list[str | int] = [*lead, *grid]  # a name, or the size of a dimension (names "0".."n-1")
    if not grid and kind != "default":
        levels = ["0"]
    depth = len(rel)
    if depth >= len(levels) or not all(_in_level(levels[i], r) for i, r in enumerate(rel)):
        return None
    level = levels[depth]
    below: Iterator[str] = iter([level]) if isinstance(level, str) else map(str, range(level)) if listed else iter(())
    return below, depth == len(levels) - 1


def _in_level(level: str | int, name: str) -> bool:
    """True if ``name`` is a name of key-space ``level`` (a name, or a dimension's size)."""
    if isinstance(level, str):
        return name == level
    return name.isascii() and name.isdigit() and str(int(name)) == name and int(name) < level
