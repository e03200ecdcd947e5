"""Tables in shared memory that a mount's supervisor makes and keeps, and each of its workers
maps (``-o workers=N``: ``shardfs.kernel.pagetable``, ``shardfs.storage.sharedversions``,
``shardfs.storage.sharedshards``): a memfd of a header, which starts with a magic number and the
table's capacity (entries, a power of two), then the entries, each of a fixed size, then
optionally more bytes (``tail``)."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import mmap
import os
import struct
import threading
from typing import Iterator

_START = struct.Struct("<II")  # magic, capacity: the start of every table's header


@functools.lru_cache(maxsize=1 << 16)
def key_hash(key: str) -> int:
    """The 64-bit BLAKE2 hash of ``key`` (its UTF-8 bytes, a lone surrogate as the byte it
    stands for), never 0 (an empty entry's): the same in every process. Remembered for the
    last 65536 keys (a chunk's open asks for its shard's several times)."""
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8", "surrogateescape"), digest_size=8).digest(),
                          "little") or 1


def make(name: str, header: bytes, capacity: int, entry: int, size_of_header: int, tail: int = 0) -> int:
    """A new table ``name`` (a memfd, close-on-exec): ``header`` (magic and capacity first), then
    ``capacity`` entries of ``entry`` bytes, then ``tail`` bytes, zeroed; the supervisor's to keep
    and give."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, size_of_header + capacity * entry + tail)
        os.pwrite(fd, header, 0)
    except OSError:
        os.close(fd)
        raise
    return fd


def attach(fd: int, magic: int, entry: int, size_of_header: int, what: str, tail: int = 0
           ) -> tuple[int, mmap.mmap, int]:
    """Map the table in memfd ``fd`` (and its ``tail`` bytes; the caller may close ``fd``
    afterwards): an open file of this
    process's own on it (for ``flock``: a lock is per open file, and dies with its holder), the
    shared mapping, and its capacity. ``ValueError`` (``not a WHAT``) if its header is not one."""
    lock_fd = os.open(f"/proc/self/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
    try:
        found, capacity = _START.unpack(os.pread(lock_fd, _START.size, 0))
        if found != magic or capacity & (capacity - 1):
            raise ValueError(f"not a {what}")
        return lock_fd, mmap.mmap(lock_fd, size_of_header + capacity * entry + tail, mmap.MAP_SHARED), capacity
    except BaseException:
        os.close(lock_fd)
        raise


@contextlib.contextmanager
def locked(thread_lock: threading.Lock, lock_fd: int, how: int = fcntl.LOCK_EX) -> Iterator[None]:
    """A table's lock: this process's threads (``thread_lock``), then the workers' (``flock`` on
    ``lock_fd``, the open file ``attach`` gave, ``how``: exclusive or shared)."""
    with thread_lock:
        fcntl.flock(lock_fd, how)
        try:
            yield
        finally:
            fcntl.flock(lock_fd, fcntl.LOCK_UN)
