"""tensorstore's file kvstore lock, which the directory source's writes take too
(``shardfs.storage.local``), so that shardfs and tensorstore writers exclude each other.

The lock file of key ``K`` is ``K`` + ``LOCK_SUFFIX`` in ``K``'s directory. ``locked`` opens
(creates) it, takes an exclusive OFD lock on it and checks that the file it locked still has
that name (the same device and inode when opened again: a holder renames it over ``K``, or
unlinks it, before it closes it); it yields that descriptor, locked, and closes it at the end,
which releases the lock. The lock is awaited at most ``LOCK_WAIT`` seconds: a lock held forever
fails the write (EAGAIN: the fold retries). A lock file that is not a regular file is
``Unusable`` (EIO), never written.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat as stat_mod
import struct
import time
from contextlib import contextmanager
from typing import Iterator

from shardfs.base.files import not_regular
from shardfs.storage import Unusable

LOCK_SUFFIX = ".__lock"  # tensorstore's file kvstore: the lock file of key K is K + ".__lock"
LOCK_WAIT = 2.0  # seconds a write waits for another writer's lock before it fails
_FLOCK = struct.Struct("hhqqi4x")  # struct flock (l_type, l_whence, l_start, l_len, l_pid)
_WRITE_LOCK = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)


@contextmanager
def locked(dfd: int, name: str, where: str) -> Iterator[int]:
    """Hold tensorstore's write lock on key ``name`` of directory ``dfd`` (its lock file, whose
    path errors name as ``where``): the lock file's descriptor."""
    lock = name + LOCK_SUFFIX
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    deadline = time.monotonic() + LOCK_WAIT
    fd = _open_lock(dfd, lock, flags, where)
    try:
        while True:
            try:
                fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _WRITE_LOCK)
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() > deadline:
                    raise OSError(errno.EAGAIN, f"locked by another writer for {LOCK_WAIT:g} s", where) from None
                time.sleep(0.005)
                continue
            again = _open_lock(dfd, lock, flags, where)
            a, b = os.fstat(fd), os.fstat(again)
            if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino):
                os.close(again)
                break
            os.close(fd)  # the holder renamed or unlinked it: lock the file that has the name now
            fd = again
        yield fd
    finally:
        os.close(fd)


def _open_lock(dfd: int, lock: str, flags: int, where: str) -> int:
    fd = os.open(lock, flags, 0o666, dir_fd=dfd)
    st = os.fstat(fd)
    if not stat_mod.S_ISREG(st.st_mode):
        os.close(fd)
        raise Unusable(errno.EIO, f"lock file {not_regular(st.st_mode)}", where)
    return fd
