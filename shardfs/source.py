"""Where shards live: a local directory.

Every function here is a blocking syscall wrapper. Callers on the trio
thread run those that read or write data through ``trio.to_thread``;
``version``, ``is_dir`` and ``open`` are cheap metadata calls made inline.
Paths are relative, ``/``-separated keys below the source root.
"""

from __future__ import annotations

import errno
import os
import stat as stat_mod
import threading
import time
import uuid
from typing import NamedTuple


TMP_SUFFIX = ".shardfs-tmp"


class Version(NamedTuple):
    """Identity of one state of a file: changes whenever its content may have.

    A NamedTuple, not a dataclass: it is built, hashed and compared on every open."""

    ino: int
    size: int
    mtime_ns: int


class Source:
    """A directory holding a Zarr v3 hierarchy.

    ``version`` results are remembered for ``stat_ttl`` seconds (every lookup,
    getattr and open asks for them); ``replace`` and ``remove`` forget the keys
    they change, so only changes made behind the mount's back wait that long.
    """

    def __init__(self, root: str, stat_ttl: float = 1.0) -> None:
        self.root = os.path.abspath(root)
        self.stat_ttl = stat_ttl
        self._versions: dict[str, tuple[float, Version | None]] = {}
        self._lock = threading.Lock()  # replace/remove run in worker threads
        self._changes = 0

    def path(self, key: str) -> str:
        return os.path.join(self.root, key) if key else self.root

    def version(self, key: str) -> Version | None:
        """The file's version, or None if it does not exist or is not a regular file."""
        now = time.monotonic()
        hit = self._versions.get(key)
        if hit is not None and now < hit[0]:
            return hit[1]
        with self._lock:
            changes = self._changes
        version = self._stat(key)
        with self._lock:
            if changes == self._changes:  # else a change may have raced the stat: don't keep it
                if len(self._versions) >= 65536:
                    self._versions.clear()
                self._versions[key] = (now + self.stat_ttl, version)
        return version

    def changed(self, key: str) -> None:
        """Forget the remembered version of ``key``: it changed (here or, seen by a reader, outside)."""
        with self._lock:
            self._changes += 1
            self._versions.pop(key, None)

    def _stat(self, key: str) -> Version | None:
        try:
            st = os.stat(self.path(key))
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not stat_mod.S_ISREG(st.st_mode):
            return None
        return Version(st.st_ino, st.st_size, st.st_mtime_ns)

    def mode(self, key: str) -> int | None:
        """``st_mode`` of whatever is at ``key`` (a directory, a FIFO, ...), None if nothing is."""
        try:
            return os.stat(self.path(key)).st_mode
        except (FileNotFoundError, NotADirectoryError):
            return None

    def is_dir(self, key: str) -> bool:
        return os.path.isdir(self.path(key))

    def read(self, key: str) -> bytes:
        """The whole content of a (small) file such as ``zarr.json``."""
        with open(self.path(key), "rb") as f:
            return f.read()

    def listdir(self, key: str) -> list[tuple[str, bool]]:
        """``(name, is_dir)`` of the entries of a directory; [] if it is missing."""
        try:
            with os.scandir(self.path(key)) as it:
                return [(e.name, e.is_dir()) for e in it]
        except (FileNotFoundError, NotADirectoryError):
            return []

    def open(self, key: str) -> tuple[int, Version]:
        """Open a file read-only; returns the descriptor and its version."""
        fd = os.open(self.path(key), os.O_RDONLY | os.O_CLOEXEC)
        st = os.fstat(fd)
        return fd, Version(st.st_ino, st.st_size, st.st_mtime_ns)

    def replace(self, key: str, data: list[bytes | memoryview], sync: bool = True) -> Version:
        """Atomically replace (or create) ``key`` with the concatenation of ``data``.

        Writes a temporary file in the same directory, fsyncs it, renames it over
        the key and fsyncs the directory, so a crash leaves the old or the new
        file, never a torn one.
        """
        path = self.path(key)
        directory = os.path.dirname(path)
        os.makedirs(directory, exist_ok=True)
        tmp = os.path.join(directory, f".{os.path.basename(path)}.{uuid.uuid4().hex}{TMP_SUFFIX}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            for chunk in data:
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view):]
            if sync:
                os.fsync(fd)
            st = os.fstat(fd)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(fd)
        os.rename(tmp, path)
        self.changed(key)
        if sync:
            fsync_dir(directory)
        return Version(st.st_ino, st.st_size, st.st_mtime_ns)

    def remove(self, key: str) -> None:
        """Delete ``key`` (missing is fine) and then its emptied parent directories."""
        try:
            os.unlink(self.path(key))
        except FileNotFoundError:
            pass
        self.changed(key)
        parent = os.path.dirname(key)
        while parent:
            try:
                os.rmdir(self.path(parent))
            except OSError as e:
                if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
                    break
                raise
            parent = os.path.dirname(parent)
        fsync_dir(self.path(os.path.dirname(key)) if os.path.dirname(key) else self.root)

    def remove_temporaries(self, key: str) -> None:
        """Delete the temporaries ``replace`` left in directory ``key`` when a daemon was killed."""
        for name, is_dir in self.listdir(key):
            if not is_dir and name.endswith(TMP_SUFFIX):
                os.unlink(os.path.join(self.path(key), name))

    def statvfs(self) -> os.statvfs_result:
        return os.statvfs(self.root)


def fsync_dir(path: str) -> None:
    """fsync a directory so a rename or unlink in it is durable (missing is fine)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
