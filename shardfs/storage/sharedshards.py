"""Shards fetched whole by one of the N workers of a read-only mount of a remote source, kept
where every worker reads them (``-o workers=N``).

Each shard of such a mount has a home worker that fetches it (``shardfs.kernel.homes``); a chunk
file of it opened through another worker was sent to the home, a socket round trip through two
trio loops that cost more CPU than the chunk's own serving (doc/BENCHMARKING.md). The home puts
every shard it fetched whole here; another worker that finds the shard here serves the chunk's
lookup, getattr and open itself (its index parsed from these bytes, its bytes copied out),
without a GET and without a round trip.

Layout: a memfd the supervisor makes and keeps for the mount's life (``memory``; its number
given to each worker in ``SHARDFS_SHARDS_FD``), mapped shared by each worker: a header
(``HEADER`` bytes: magic, capacity, the ring's size, ``head``: the bytes ever written to the
ring), ``capacity`` entries of ``ENTRY`` bytes (two-way: a 64-bit BLAKE2 hash of the object's
location names its own entry and the other of its pair, ``_places``; a shard put takes the one
that holds its location, else one that holds no shard still in the ring, else the one put
first), then the ring. A shard's bytes are
written after the last one's (at the ring's start again when they would cross its end); an
entry names where (``pos``, counted in bytes ever written) and which version (ETag, size,
mtime: ``Version``) it holds, and is valid while no later shard's bytes overwrote its own
(``pos >= head - ring``): first in, first out, the mount's memory bounded by the ring, but for
a shard read while in the ring's oldest quarter, which moves to its head (``_renew``). Bytes of
one version are never served for another.

Writers (``put``, ``_renew``) hold an ``flock`` on an open file of this process's own
(exclusive: a lock dies with its holder) and a thread lock while they write: one writer at a
time. A writer killed halfway left an entry naming the old bytes or none (an entry's ``seq``
is odd while it is written), and its bytes beyond ``head``'s old value, which no entry names.
A shard's bytes are written with ``pwrite`` on the memfd, not through the mapping: memory the
kernel refuses for the ring's pages is then an error (the shard not held: ``put``), not a
SIGBUS that ends the worker. Readers of a range (``get``, ``holds``: every open of a chunk
another worker fetched) take no lock, so none waits while a shard is written (a writer holds
its lock about 1 ms for a shard of 2.5 MB; the CPU a chunk did not change measurably:
doc/BENCHMARKING.md). A reader copies the bytes its entry names (``pread``: a worker's
mapping of pages it never touched costs a fault each), then looks again: if the entry's
``seq`` changed, or ``head`` moved so far that a later shard's place reached those bytes (a
writer moves ``head`` before it writes), the copy may be torn and counts a miss, never a
wrong answer. Stores and loads are ordered as x86-64 orders them (the writer's stores to
``head``, then to the bytes; the reader's loads of the bytes, then of ``head``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import struct
import threading
from typing import Callable, TypeVar

from shardfs.base import memtables
from shardfs.base.memtables import key_hash
from shardfs.storage import Version

MAGIC = 0x53534832  # "SSH2"
HEADER = 64
ENTRY = 96
CAPACITY = 1 << 12  # entries (shards held at most)
TAG_BYTES = 48  # an ETag longer than this, in UTF-8, is not held
_HEAD = struct.Struct("<IIQQ")  # magic, capacity, ring bytes, head
_HEAD_AT = 16
_U64 = struct.Struct("<Q")
_SEQ = struct.Struct("<I")
_BODY = struct.Struct("<IxxxxQQQqB")  # seq, location hash, pos, size, mtime, tag length; then the tag
OWN_PART = 32  # of ``-o cache_size``, the part the workers' own range caches share (``split``)
T = TypeVar("T")


def split(cache_size: int) -> tuple[int, int]:
    """The bytes of ``-o cache_size`` kept in the ring, and in the range caches of the N workers
    together: those hold the ranges each fetched alone (a scattered read's chunks), the ring the
    shards fetched whole, nearly all the bytes of a sweep. A mount whose sweeps come back to more
    shards than its cache holds fetches them again: measured with four readers sweeping 124 MB of
    shards, a ring of 7/8 of 96 MiB fetched 1.5-2x the bytes one worker's 96 MiB did, and one
    worker given 84 MiB as many as the ring."""
    own = cache_size // OWN_PART
    return cache_size - own, own


def memory(ring: int) -> int:
    """A new table with a ring of ``ring`` bytes (a memfd, close-on-exec; pages are memory once
    written): the supervisor's to keep and give."""
    return memtables.make("shardfs-shards", _HEAD.pack(MAGIC, CAPACITY, ring, 0), CAPACITY, ENTRY, HEADER, ring)


class SharedShards:
    """Whole objects in the table of the memfd ``fd`` (which the caller may close afterwards);
    thread-safe. ``put`` a shard fetched whole; ``get`` a range of it, ``whole`` a look at all
    of it and its version; ``holds`` whether it is here."""

    def __init__(self, fd: int) -> None:
        ring = _HEAD.unpack(os.pread(fd, _HEAD.size, 0))[2]
        self._lock_fd, self._map, capacity = memtables.attach(fd, MAGIC, ENTRY, HEADER, "table of shards", ring)
        self.ring = ring
        self._mask = capacity - 1
        self._start = HEADER + capacity * ENTRY  # of the ring
        self._thread_lock = threading.Lock()

    def close(self) -> None:
        self._map.close()
        os.close(self._lock_fd)

    @property
    def used(self) -> int:
        """Bytes of the ring written so far (all of it, once it went round)."""
        return min(int(_U64.unpack_from(self._map, _HEAD_AT)[0]), self.ring)

    def put(self, where: str, version: Version, data: bytes | memoryview) -> bool:
        """Hold ``data``, all of ``version`` of ``where``; False if it is not held (larger than a
        quarter of the ring, or an ETag that is not a string that fits). ``OSError`` if the kernel
        refused to write it (no memory for the ring's pages: ENOSPC, ENOMEM; a file size limit:
        EFBIG): then it is not held, nor are the oldest shards whose place it took (as with a
        put that succeeds)."""
        tag = version.tag.encode() if isinstance(version.tag, str) else b""
        n = len(data)
        if not tag or len(tag) > TAG_BYTES or not 0 < n <= self.ring // 4 or n != version.size:
            return False
        view = memoryview(data).cast("B")
        with self._locked(fcntl.LOCK_EX):  # (held while writing: a later put may reuse the place)
            pos = self._reserve(n)
            at, done = self._start + pos % self.ring, 0
            while done < n:  # (a short write, then the next one says why)
                written = os.pwrite(self._lock_fd, view[done:], at + done)
                if not written:  # (never seen: no write would ever end the loop)
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                done += written
            self._note(where, version, pos)
        return True

    def get(self, where: str, version: Version, start: int, stop: int) -> bytes | None:
        """Bytes ``[start, stop)`` of ``version`` of ``where`` if held, else None; takes no lock
        (a copy torn by a writer is a miss: the module docstring). A shard read in the ring's
        oldest quarter moves to its head (``_renew``)."""
        found = self._find(where, version)
        if found is None:
            return None
        off, seq, pos = found
        at = self._start + pos % self.ring + start
        data = os.pread(self._lock_fd, max(0, min(stop, version.size) - start), at)
        head = self._head()
        if _SEQ.unpack_from(self._map, off)[0] != seq or head - pos > self.ring:
            return None
        if head - pos > self.ring * 3 // 4:
            self._renew(where, version)
        return data

    def holds(self, where: str, version: Version) -> bool:
        """Whether ``version`` of ``where`` is held (no lock: an answer of a moment, as any)."""
        return self._find(where, version) is not None

    def whole(self, where: str, use: Callable[[Version, memoryview], T]) -> T | None:
        """``use(version, data)`` of the version of ``where`` held and all its bytes, else None.
        ``data`` is valid during the call alone: ``use`` keeps nothing that refers to it. Holds
        the lock, shared: no writer writes meanwhile."""
        with self._locked(fcntl.LOCK_SH):
            h = key_hash(where)
            for off in self._places(h):
                _seq, at, _pos, size, mtime, n = _BODY.unpack_from(self._map, off)
                if at != h:
                    continue
                version = Version(bytes(self._map[off + _BODY.size:off + _BODY.size + n]).decode(), size, mtime)
                found = self._find(where, version)
                if found is None:
                    return None
                at = self._start + found[2] % self.ring
                return use(version, memoryview(self._map)[at:at + size])
            return None

    def _renew(self, where: str, version: Version) -> None:
        """Move the bytes of ``version`` of ``where``, still in the ring's oldest quarter, to its
        head, as a put of them would (first in, first out alone would drop a shard still being
        read: a sweep coming back to the shards of a plane of chunks)."""
        with self._locked(fcntl.LOCK_EX):
            found = self._find(where, version)
            if found is None or self._head() - found[2] <= self.ring * 3 // 4:
                return
            _off, _seq, pos = found
            new = self._reserve(version.size)
            self._map.move(self._start + new % self.ring, self._start + pos % self.ring, version.size)
            self._note(where, version, new)

    def _head(self) -> int:
        return int(_U64.unpack_from(self._map, _HEAD_AT)[0])

    def _reserve(self, n: int) -> int:
        """Where the next ``n`` bytes go (counted in bytes ever written). Under the exclusive lock."""
        pos = self._head()
        if pos % self.ring + n > self.ring:
            pos += self.ring - pos % self.ring  # (a shard's bytes are never split)
        _U64.pack_into(self._map, _HEAD_AT, pos + n)
        return pos

    def _note(self, where: str, version: Version, pos: int) -> None:
        """The entry of ``where``: ``version``, its bytes at ``pos``; its ``seq`` odd while it is
        written, then even again. Under the exclusive lock."""
        h, tag = key_hash(where), str(version.tag).encode()
        off = self._place(h)
        seq = _SEQ.unpack_from(self._map, off)[0]
        odd = ((seq + 1) | 1) & 0xFFFFFFFF  # (odd even if a killed writer left it odd)
        _BODY.pack_into(self._map, off, odd, h, pos, version.size, version.mtime_ns, len(tag))
        self._map[off + _BODY.size:off + _BODY.size + len(tag)] = tag
        _SEQ.pack_into(self._map, off, (odd + 1) & 0xFFFFFFFF)

    def _places(self, h: int) -> tuple[int, int]:
        """The offsets of the two entries the location of hash ``h`` may be held in: its own
        (``h``'s low bits), then the other of its pair."""
        own = h & self._mask
        return HEADER + own * ENTRY, HEADER + (own ^ 1) * ENTRY

    def _place(self, h: int) -> int:
        """The entry a put of the location of hash ``h`` writes (under the exclusive lock, after
        ``_reserve``): of its two, the one that holds it, else one whose shard is no longer in the
        ring (its own first), else the one whose shard was put first."""
        head, table = self._head(), self._map
        places = [(off, *_BODY.unpack_from(table, off)[1:3]) for off in self._places(h)]
        held = [off for off, at, _pos in places if at == h]
        if held:
            return held[0]
        free = [off for off, at, pos in places if not at or head - pos > self.ring]
        return free[0] if free else min(places, key=lambda place: place[2])[0]

    def _find(self, where: str, version: Version) -> tuple[int, int, int] | None:
        """The entry of ``version`` of ``where``: its offset, its ``seq`` as read, and where its
        bytes are (counted in bytes ever written); None if not held (or overwritten since, or
        being written now)."""
        h, table = key_hash(where), self._map
        for off in self._places(h):
            seq, at, pos, size, mtime, n = _BODY.unpack_from(table, off)
            if seq & 1 or at != h or size != version.size or mtime != version.mtime_ns \
                    or self._head() - pos > self.ring:  # (overwritten since)
                continue
            if table[off + _BODY.size:off + _BODY.size + n] == str(version.tag).encode():
                return off, seq, pos
        return None

    def _locked(self, how: int) -> contextlib.AbstractContextManager[None]:
        """Shared (``fcntl.LOCK_SH``) or exclusive (``memtables.locked``)."""
        return memtables.locked(self._thread_lock, self._lock_fd, how)
