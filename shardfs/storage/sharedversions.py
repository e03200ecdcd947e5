"""The versions of keys remembered by the N workers of a mount together (``-o workers=N``).

Each worker remembering versions of its own (``shardfs.storage.versions.Remembered``) would
answer, for up to ``ttl`` seconds after a change behind the mount's back, another version than
the worker beside it: a client alternating between them would see the key go back and forth
between its old and new versions. A local directory's workers remembered nothing for that reason,
a ``stat`` per open; an object store's each asked for their own HEADs. This table holds what
every worker remembers in one place: a ``memfd`` the supervisor makes and keeps for the mount's
life (``memory``: its number given to each worker in ``SHARDFS_VERSIONS_FD``), mapped shared by
each worker. A key's version, once one worker saw it, is every worker's until it expires; a
worker's ``forget`` (it changed the key) is every worker's at once.

Layout: a header (``HEADER`` bytes: magic, capacity, ``changes``: bumped by every ``forget``
and ``clear``, ``epoch``: bumped by every ``clear``), then ``capacity`` entries of ``ENTRY``
bytes, open addressing on a 64-bit BLAKE2 hash of the key, ``PROBES`` entries from its home. An
entry holds its key's hash, its expiry (``time.monotonic``: CLOCK_MONOTONIC, one clock for every
process of the machine), the epoch it was written in, and the answer (a version, or missing);
an ``Unusable`` answer or a version whose tag does not fit is not remembered (asked again each
time: rare). Writers (``put``, ``forget``, ``clear``) hold an ``flock`` on an open file of their
own (``/proc/self/fd``: a lock dies with its holder) and a thread lock; readers take no lock: an
entry's ``seq`` is odd while it is written and changes with each write, and a reader that finds
it odd or changed meanwhile counts a miss (a torn entry of a killed writer stays odd until the
next write of its place: a miss, never a wrong answer). Stores and loads are ordered as x86-64
orders them (``mmap`` copies: no reordering of stores with stores or loads with loads). A
worker remembers each answer it read with where and at which ``seq`` it found it (``_seen``):
while that entry's ``seq``, the epoch and the expiry are those it saw, the answer is the same
(every write of an entry changes its ``seq``), so an open's three asks cost a word read each
instead of a probe (12 of the 50 µs more a chunk file the daemon spent with 2 workers than one).
"""

from __future__ import annotations

import contextlib
import os
import struct
import threading
import time

from shardfs.base import memtables
from shardfs.base.memtables import key_hash
from shardfs.storage import UNKNOWN, Unknown, Unusable, Version

MAGIC = 0x53565431  # "SVT1"
HEADER = 64
ENTRY = 96
CAPACITY = 1 << 16  # entries (6 MiB of address space; memory only for the pages touched)
PROBES = 8  # entries looked at from a key's home
SEEN = 1 << 14  # answers a worker remembers where it read (``get``)
TAG_BYTES = 48  # a string tag (an ETag) longer than this, in UTF-8, is not remembered
_HEAD = struct.Struct("<IIQQ")  # magic, capacity, changes, epoch
_CHANGES_AT, _EPOCH_AT = 8, 16
_SEQ = struct.Struct("<I")
# seq, kind, tag length, hash, expires, epoch, size, mtime; then the tag (int: 8 bytes; str: UTF-8)
_BODY = struct.Struct("<IBBxxQdQQq")
_INT = struct.Struct("<q")
_U64 = struct.Struct("<Q")
EMPTY, VERSION_INT, VERSION_STR, MISSING = 0, 1, 2, 3


def memory() -> int:
    """A new table (a memfd, close-on-exec, sized and empty): the supervisor's to keep and give."""
    return memtables.make("shardfs-versions", _HEAD.pack(MAGIC, CAPACITY, 0, 0), CAPACITY, ENTRY, HEADER)


class SharedVersions:
    """``Remembered``'s contract (``get``, ``token``, ``put``, ``forget``, ``clear``: see
    ``shardfs.storage.versions``) over the mount's table in the memfd ``fd`` (which the caller
    may close afterwards), answers kept ``ttl`` seconds (thread-safe)."""

    def __init__(self, fd: int, ttl: float) -> None:
        self.ttl = ttl
        self._lock_fd, self._map, capacity = memtables.attach(fd, MAGIC, ENTRY, HEADER, "table of versions")
        self._mask = capacity - 1
        self._thread_lock = threading.Lock()
        # key -> (answer, epoch, expires, off, seq): what ``get`` read, and where
        self._seen: dict[str, tuple[Version | None, int, float, int, int]] = {}

    def close(self) -> None:
        self._map.close()
        os.close(self._lock_fd)

    def _place(self, h: int, i: int) -> int:
        return HEADER + ((h + i) & self._mask) * ENTRY

    def get(self, key: str) -> Version | None | Unknown:
        """What any worker remembered for ``key`` within the last ``ttl`` seconds, else ``UNKNOWN``."""
        table = self._map
        epoch = _U64.unpack_from(table, _EPOCH_AT)[0]
        now = time.monotonic()
        seen = self._seen.get(key)
        if seen is not None and seen[1] == epoch and now < seen[2] and _SEQ.unpack_from(table, seen[3])[0] == seen[4]:
            return seen[0]
        h, mask = key_hash(key), self._mask
        for i in range(PROBES):
            off = HEADER + ((h + i) & mask) * ENTRY  # (``_place``, inline: every open asks)
            seq, kind, n, at, expires, written, size, mtime = _BODY.unpack_from(table, off)
            if kind == EMPTY and not seq:
                return UNKNOWN  # (never written: the key is not further on)
            if at != h:
                continue
            if seq & 1 or kind == EMPTY or written != epoch or now >= expires:
                return UNKNOWN
            if kind == MISSING:
                found: Version | None = None
            elif kind == VERSION_INT:
                found = Version(_INT.unpack_from(table, off + _BODY.size)[0], size, mtime)
            else:
                found = Version(bytes(table[off + _BODY.size:off + _BODY.size + n]).decode(), size, mtime)
            if _SEQ.unpack_from(table, off)[0] != seq:
                return UNKNOWN
            if len(self._seen) >= SEEN:
                self._seen.clear()
            self._seen[key] = (found, epoch, expires, off, seq)
            return found
        return UNKNOWN

    def token(self) -> int:
        """Take before asking the store; give to ``put`` with the answer."""
        return int(_U64.unpack_from(self._map, _CHANGES_AT)[0])

    def put(self, key: str, found: Version | Unusable | None, token: int) -> None:
        """Remember ``found`` for every worker unless some key was forgotten (by any worker) since
        ``token`` was taken."""
        if isinstance(found, Unusable):
            return
        if found is None:
            kind, tag = MISSING, b""
        elif isinstance(found.tag, int):
            kind, tag = VERSION_INT, _INT.pack(found.tag)
        else:
            kind, tag = VERSION_STR, found.tag.encode()
            if len(tag) > TAG_BYTES:
                return
        h = key_hash(key)
        with self._locked():
            table = self._map
            if _U64.unpack_from(table, _CHANGES_AT)[0] != token:
                return
            epoch = _U64.unpack_from(table, _EPOCH_AT)[0]
            off = self._find(h, free=True)
            size, mtime = (found.size, found.mtime_ns) if found is not None else (0, 0)
            self._write(off, kind, h, time.monotonic() + self.ttl, epoch, size, mtime, tag)

    def forget(self, key: str) -> None:
        """Forget ``key`` for every worker, and every answer being fetched now (``token``)."""
        h = key_hash(key)
        with self._locked():
            self._bump(_CHANGES_AT)
            off = self._find(h, free=False)
            if off >= 0:
                self._write(off, EMPTY, h, 0.0, 0, 0, 0, b"")

    def clear(self) -> None:
        """Forget every key, for every worker (a directory was renamed: every key below it changed)."""
        with self._locked():
            self._bump(_CHANGES_AT)
            self._bump(_EPOCH_AT)

    def _find(self, h: int, free: bool) -> int:
        """The entry of hash ``h``; with ``free``, else the first one empty or expired near its
        home, else its home (evicted); without, -1 if it has none. Under the lock."""
        table, now, epoch = self._map, time.monotonic(), _U64.unpack_from(self._map, _EPOCH_AT)[0]
        spare = -1
        for i in range(PROBES):
            off = self._place(h, i)
            seq, kind, _n, at, expires, written, _size, _mtime = _BODY.unpack_from(table, off)
            if at == h:
                return off
            if spare < 0 and (kind == EMPTY or now >= expires or written != epoch):
                spare = off
            if kind == EMPTY and not seq:
                break  # (never written: the key is not further on)
        if not free:
            return -1
        return spare if spare >= 0 else self._place(h, 0)

    def _write(self, off: int, kind: int, h: int, expires: float, epoch: int, size: int, mtime: int,
               tag: bytes) -> None:
        table = self._map
        seq = _SEQ.unpack_from(table, off)[0]
        _SEQ.pack_into(table, off, seq | 1)  # odd: being written (readers count a miss)
        table[off + _BODY.size:off + _BODY.size + len(tag)] = tag
        _BODY.pack_into(table, off, seq | 1, kind, len(tag), h, expires, epoch, size, mtime)
        _SEQ.pack_into(table, off, ((seq | 1) + 1) & 0xFFFFFFFF or 2)

    def _bump(self, at: int) -> None:
        _U64.pack_into(self._map, at, _U64.unpack_from(self._map, at)[0] + 1)

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        """The writers' lock (``memtables.locked``)."""
        return memtables.locked(self._thread_lock, self._lock_fd)
