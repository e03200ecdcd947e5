"""The storage interface: what everything above it knows about where shards live.

Implementations, one per kind of source (``shardfs.storage.kinds``): a local directory
(``shardfs.storage.local``), an object store (``shardfs.storage.objects``), a plain web server
(``shardfs.storage.web``). Keys are relative, ``/``-separated names below the source
root (``raw/zarr.json``, ``raw/c/0/0/0``); ``""`` is the root itself. Every method blocks:
callers on the trio thread run the ones that move data through a worker thread.

A ``Version`` identifies one state of one key; it changes whenever the content may have.
Conditional writes (``replace``/``delete`` with ``if_version``) succeed only while the key is
still at that version (``ABSENT``: while it does not exist) and raise ``VersionMismatch``
otherwise. This is what makes folds safe against other writers: read the shard at version V,
build the new shard, ``replace(key, data, if_version=V)``; on ``VersionMismatch`` read again.

The public face (``__all__``): the interface's types below; what ``SRC`` names (``source``, and
``urls``: a URL or a path); source keys (``keys``); the store request counters (``stats``);
whether another user could read a source file (``permits``); the listings a mount remembers,
given to its storage when opened (``listings``: ``Listings``, its bound per mount); the table of
versions the N workers of a mount share, and of the shards they fetched whole, which the
supervisor makes (``sharedversions``, ``sharedshards``: ``memory``); and for the read path each
``Storage`` names (``Storage.read_path``), the storage it reads: ``local`` (``LocalStorage``) or
obstore's request path (``requests``). The kinds themselves are opened through ``source``.
"""

from __future__ import annotations

import builtins
import os
from typing import Iterable, Iterator, NamedTuple, Protocol, Sequence

from shardfs.storage.stats import StoreStats

__all__ = ["ABSENT", "UNKNOWN", "Absent", "Entry", "Range", "Storage", "Unknown", "Unusable", "Version",
           "VersionMismatch", "keys", "listings", "local", "permits", "requests", "sharedshards", "sharedversions",
           "source", "stats", "urls"]


class Version(NamedTuple):
    """Identity of one state of a stored key (a NamedTuple: it is hashed and compared per open).

    Local files: ``(st_ino, st_size, st_mtime_ns)``; objects: ``(etag, size, mtime_ns)``, the mtime
    Last-Modified's whole seconds and below them a number drawn from the ETag (``requests.stamp_ns``).
    """

    tag: int | str
    size: int
    mtime_ns: int


class Absent:
    """The ``if_version`` that means "only if the key does not exist" (If-None-Match: *)."""

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT = Absent()


class Unknown:
    """What ``Storage.version_now`` answers when only a request would tell."""

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN = Unknown()


class VersionMismatch(Exception):
    """A conditional ``read``/``replace``/``delete`` found the key at another version (or absent)."""


class Unusable(OSError):
    """The key exists but is never read or written: not a regular file (a FIFO, a directory, a
    device...), or reached through a symlink that leaves the source. ``errno`` is what a
    client gets (EIO, or EACCES for a way out of the source); ``strerror`` says why."""

    errno: int  # always given, as is ``strerror``
    strerror: str


class Range(NamedTuple):
    """``nbytes`` bytes at ``offset``; a negative ``offset`` counts from the end (a suffix range)."""

    offset: int
    nbytes: int


class Entry(NamedTuple):
    """One entry of a listing: a name below the listed prefix, and whether it is a prefix/directory."""

    name: str
    is_dir: bool


class Storage(Protocol):
    """A source of keys: a local directory or an object-store prefix."""

    stats: StoreStats  # the requests it made (``shardfs status``)
    read_path: str  # which read path serves it (``shardfs.reads.factory``): "local" (pread) or "objects"
    # ``delete`` with ``if_version`` is atomic: nothing replaces the key between the check and the
    # removal (a local directory: both under the key's lock). Not an object store's (a HEAD, then
    # the DELETE: a PUT landing between them is deleted too), so a fold empties a shard there
    # with a conditional ``replace`` instead (``shardfs.shards.shard.rewrite_sync``).
    atomic_delete: bool

    def owner_path(self, key: str) -> str | None:
        """The local file behind ``key`` whose owner and mode say whether another user may read
        it (``shardfs.storage.permits``); None where files have no owners (an object store)."""

    def describe(self, key: str) -> str:
        """A human-readable location of ``key`` for log lines (a path, or ``s3://bucket/key``)."""

    def version(self, key: str) -> Version | None:
        """The key's current version; None if it does not exist. ``Unusable`` if it exists but
        is not a regular object that may be read. Remembered for a short time (a stat or a
        HEAD per call would cost every lookup): changes made elsewhere show within it."""

    def version_now(self, key: str) -> Version | None | Unknown:
        """``version`` if it is answered at once (a version remembered and still fresh; locally a
        stat, answered from the kernel's inode cache in microseconds), else ``UNKNOWN`` (only a
        request would tell): callers on the trio thread ask this inline, ``version`` in a thread."""

    def read(self, key: str, ranges: Sequence[Range], if_version: Version | None = None) -> list[bytes]:
        """The bytes of each range (shorter at the end of the object), read as one version.

        With ``if_version`` raises ``VersionMismatch`` when the key is at another version;
        ``FileNotFoundError`` when it does not exist.
        """

    def read_versioned(self, key: str, rng: Range) -> tuple[bytes, Version]:
        """The bytes of one range (a suffix range for a negative offset) and the version they
        were read from, in one request (no separate ``version`` call): how a shard's index is
        read. The version is remembered as ``version`` remembers one. ``FileNotFoundError``
        when the key does not exist; ``Unusable`` as for ``version``."""

    def read_all(self, key: str) -> tuple[bytes, Version]:
        """The whole content of a (small) key such as ``zarr.json``, and the version read."""

    def changed(self, key: str) -> None:
        """Forget the remembered version of ``key``: a reader found it changed (``version``
        results are remembered for a short time; ``replace``/``delete`` forget them too)."""

    def list(self, prefix: str) -> Iterator[builtins.list[Entry]]:
        """The entries directly below ``prefix``, page by page (bounded memory); none if missing."""

    def keys_below(self, prefix: str, most: int) -> builtins.list[str] | None:
        """Every key below ``prefix`` at any depth, relative to it, in key order; None if there
        are more than ``most`` (what is listed stops there)."""

    def is_dir(self, key: str) -> bool:
        """True if ``key`` is a directory (locally) or a prefix holding objects: it may be listed."""

    def replace(self, key: str, data: Iterable[bytes | memoryview],
                if_version: Version | Absent | None = None) -> Version:
        """Atomically make ``data`` the content of ``key`` (readers see the old or the new object).

        ``if_version``: only if the key is still at that version (``ABSENT``: still missing);
        else ``VersionMismatch`` and nothing changed. Durable when it returns.
        """

    def delete(self, key: str, if_version: Version | Absent | None = None) -> None:
        """Remove ``key`` (missing is fine unless ``if_version`` is a Version); with
        ``if_version``, ``VersionMismatch`` if the key is at another version (atomically only
        where ``atomic_delete``)."""

    def move(self, src: str, dst: str) -> None:
        """Rename directory ``src`` (an array or group with all below it) to ``dst``, which must
        not exist and whose parent does: one atomic rename, durable when it returns. An object
        store cannot (``OSError`` EXDEV: ``mv`` then copies and deletes, as across filesystems)."""

    def statvfs(self) -> os.statvfs_result:
        """What ``statfs`` reports: the local filesystem's; a large constant for an object store."""

    def check_write(self, key: str) -> None:
        """Raise ``Unusable`` if ``replace``/``delete`` of ``key`` would be refused for what the
        source holds there (a non-regular file, a way out of the source); cheap: called per commit."""
