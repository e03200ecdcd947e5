"""The local directory source: ``Storage`` over a directory, plus the read path's fast calls.

Every method blocks. Callers on the trio thread run those that move data through
``trio.to_thread``; ``version``, ``is_dir`` and ``open`` are cheap metadata calls made inline.
``open`` (a descriptor, for ``pread`` into the read path's buffer) and ``statvfs`` are beyond
``Storage``: only ``shardfs.reads.local`` and the ``statfs`` of a local mount use them.

Hostile sources (contracts):
- Only regular files are opened for I/O. Keys are resolved with ``openat2`` and
  ``RESOLVE_BENEATH`` from a descriptor of the root, so nothing is reached through a
  symlink that leaves SRC (``Unusable`` with EACCES), unless ``follow_symlinks``, which
  applies to reads only. A key is looked at with ``O_PATH`` (no open for I/O) before it
  is opened, and opened with ``O_NONBLOCK``: a FIFO or device never blocks an open;
  anything but a regular file is ``Unusable`` (EIO).
- Writes follow tensorstore's file kvstore protocol, so shardfs and tensorstore writers
  exclude each other: hold the lock of ``<key>.__lock`` (``shardfs.storage.kvlock``: an
  exclusive OFD lock on it, awaited at most ``kvlock.LOCK_WAIT`` seconds), check the key's version
  under the lock, write the lock file, fsync it, rename it over the key, fsync the
  directory, close (which releases the lock). A condition that fails, or a delete, unlinks
  the lock file under the lock.
- A replaced file keeps the owner, group and mode of the file it replaces; a new file
  (and any directory created for it) takes the owner and group of the nearest existing
  directory above it when the daemon may chown, and that directory's mode bits as far
  as ``rw-r--r--`` allows (``rw-`` always for the owner).
"""

from __future__ import annotations

import builtins
import ctypes
import errno
import os
import stat as stat_mod
import struct
from typing import Iterable, Iterator, Sequence

from shardfs.storage import UNKNOWN, Entry, Range, Unusable, Version, VersionMismatch, Absent
from shardfs.base.files import not_regular
from shardfs.storage.kvlock import LOCK_SUFFIX, locked
from shardfs.storage.listings import Listings
from shardfs.storage.versions import Remembered, Versions
from shardfs.storage.stats import StoreStats, counted

LIST_PAGE = 1000  # entries per page of a listing (as an S3 page)
_ANSWERS = (FileNotFoundError, NotADirectoryError, VersionMismatch)  # not failures (``StoreStats``)

_SYS_OPENAT2 = 437  # the same number on every Linux architecture
_RESOLVE_BENEATH = 0x08
_OPEN_HOW = struct.Struct("QQQ")  # struct open_how: flags, mode, resolve
_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


def _openat2(root_fd: int, rel: str, flags: int, mode: int) -> int:
    """``openat2(root_fd, rel, RESOLVE_BENEATH)``: the new descriptor, or minus the errno."""
    how = _OPEN_HOW.pack(flags, mode, _RESOLVE_BENEATH)
    name = os.fsencode(rel or ".")
    while True:
        fd = _syscall(_SYS_OPENAT2, root_fd, name, how, len(how))
        if fd >= 0:
            return fd
        err = ctypes.get_errno()
        if err != errno.EINTR:
            return -err


class LocalStorage:
    """A directory holding a Zarr v3 hierarchy (see the module docstring for the contracts).

    ``version`` results are remembered for ``stat_ttl`` seconds (every lookup, getattr and
    open asks for them), in ``versions`` if given (N workers' table); ``replace`` and ``delete``
    forget the keys they change, so only changes made behind the mount's back wait that long.
    """

    read_path = "local"  # (``shardfs.reads.factory``)
    atomic_delete = True  # the version check and the unlink, both under the key's lock

    def __init__(self, root: str, stat_ttl: float = 1.0, follow_symlinks: bool = False,
                 listings: Listings | None = None, versions: Versions | None = None) -> None:
        self.root = os.path.realpath(root)
        self.stat_ttl = stat_ttl
        self.follow_symlinks = follow_symlinks
        self._root_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._versions = versions if versions is not None else Remembered(stat_ttl)
        self._listings = listings or Listings(0.0)
        self.stats = StoreStats()  # shard file reads and replaces (chunk reads: ``shardfs.reads.local``)

    # ----- names --------------------------------------------------------------------------

    def path(self, key: str) -> str:
        """The absolute path of ``key`` (for the journal directory and log lines)."""
        return os.path.join(self.root, key) if key else self.root

    def describe(self, key: str) -> str:
        return self.path(key)

    def owner_path(self, key: str) -> str | None:
        return self.path(key)

    def _open(self, key: str, flags: int, strict: bool = True, mode: int = 0) -> int:
        """Open ``key`` below the root; a way out of it raises ``Unusable`` (EACCES).

        ``strict`` False with ``follow_symlinks``: any symlink is followed (reads only).
        """
        flags |= os.O_CLOEXEC
        if self.follow_symlinks and not strict:
            return os.open(self.path(key), flags, mode)
        fd = _openat2(self._root_fd, key, flags, mode)
        if fd >= 0:
            return fd
        err = -fd
        if err == errno.EXDEV:  # "..", or an absolute symlink: allowed only if it stays inside
            real = os.path.realpath(self.path(key))
            if real != self.root and not real.startswith(self.root + "/"):
                raise Unusable(errno.EACCES, f"a symlink leads out of the source (to {real})", self.path(key))
            fd = _openat2(self._root_fd, os.path.relpath(real, self.root), flags, mode)
            if fd >= 0:
                return fd
            err = -fd
            if err == errno.EXDEV:
                raise Unusable(errno.EACCES, "a symlink leads out of the source", self.path(key))
        if err == errno.ELOOP:
            raise Unusable(errno.EIO, "too many levels of symlinks", self.path(key))
        if err == errno.ENXIO:  # a socket
            raise Unusable(errno.EIO, "not a regular file (a socket)", self.path(key))
        raise OSError(err, os.strerror(err), self.path(key))

    # ----- versions -----------------------------------------------------------------------

    def version(self, key: str) -> Version | None:
        """The file's version; None if it does not exist; ``Unusable`` if it is not a regular
        file or lies beyond a symlink out of the source."""
        found = self._versions.get(key)
        if found is not UNKNOWN:
            return found  # type: ignore[return-value]  # not UNKNOWN (checked)
        token = self._versions.token()
        try:
            found = self._stat(key, strict=False)
        except Unusable as e:
            self._versions.put(key, e, token)
            raise
        self._versions.put(key, found, token)
        return found

    def version_now(self, key: str) -> Version | None:
        return self.version(key)

    def changed(self, key: str) -> None:
        self._versions.forget(key)
        self._listings.forget(key)

    def _stat(self, key: str, strict: bool, missing: tuple[type[OSError], ...] = (FileNotFoundError,
                                                                                  NotADirectoryError)
              ) -> Version | None:
        """The current version (never remembered); None if missing (``missing`` errors)."""
        try:
            fd = self._open(key, os.O_PATH, strict)  # O_PATH: nothing is opened for I/O
        except missing:
            return None
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        return self._regular(key, st)

    def _regular(self, key: str, st: os.stat_result) -> Version:
        """The version of ``key``, whose status is ``st``; ``Unusable`` (EIO) if it is not a
        regular file (the one check every open and version of a shard goes through)."""
        if not stat_mod.S_ISREG(st.st_mode):
            raise Unusable(errno.EIO, not_regular(st.st_mode), self.path(key))
        return Version(st.st_ino, st.st_size, st.st_mtime_ns)

    def is_dir(self, key: str) -> bool:
        """True if ``key`` is a directory that may be listed."""
        try:
            fd = self._open(key, os.O_PATH, strict=False)
        except (FileNotFoundError, NotADirectoryError, Unusable):
            return False
        try:
            return stat_mod.S_ISDIR(os.fstat(fd).st_mode)
        finally:
            os.close(fd)

    # ----- reading ------------------------------------------------------------------------

    def open(self, key: str) -> tuple[int, Version]:
        """Open a regular file read-only (the read path's fast call); its descriptor and version."""
        fd = self._open(key, os.O_RDONLY | os.O_NONBLOCK, strict=False)
        try:
            version = self._regular(key, os.fstat(fd))
        except BaseException:
            os.close(fd)
            raise
        return fd, version

    @counted("READ", _ANSWERS, bytes_in=lambda out: sum(map(len, out)))
    def read(self, key: str, ranges: Sequence[Range], if_version: Version | None = None) -> list[bytes]:
        fd, version = self.open(key)
        try:
            if if_version is not None and version != if_version:
                raise VersionMismatch(self.path(key))
            out = []
            for offset, nbytes in ranges:
                start = max(0, version.size + offset) if offset < 0 else offset
                out.append(os.pread(fd, nbytes, start))
            return out
        finally:
            os.close(fd)

    @counted("READ", _ANSWERS, bytes_in=lambda out: len(out[0]))
    def read_versioned(self, key: str, rng: Range) -> tuple[bytes, Version]:
        token = self._versions.token()
        try:
            fd, version = self.open(key)
        except (FileNotFoundError, NotADirectoryError):
            self._versions.put(key, None, token)
            raise
        self._versions.put(key, version, token)
        try:
            start = max(0, version.size + rng.offset) if rng.offset < 0 else rng.offset
            return os.pread(fd, rng.nbytes, start), version
        finally:
            os.close(fd)

    @counted("READ", _ANSWERS, bytes_in=lambda out: len(out[0]))
    def read_all(self, key: str) -> tuple[bytes, Version]:
        """The whole content of ``key`` and its version; ``FileNotFoundError`` if missing."""
        fd, version = self.open(key)
        try:
            parts = []
            while chunk := os.read(fd, max(version.size, 1 << 16)):
                parts.append(chunk)
            return b"".join(parts), version
        finally:
            os.close(fd)

    def list(self, prefix: str) -> Iterator[list[Entry]]:
        return self._listings.list(prefix, self._list)

    def _list(self, prefix: str) -> Iterator[builtins.list[Entry]]:
        try:
            fd = self._open(prefix, os.O_RDONLY | os.O_DIRECTORY, strict=False)
        except (FileNotFoundError, NotADirectoryError):
            return
        try:
            with os.scandir(fd) as it:
                page: list[Entry] = []
                for e in it:
                    page.append(Entry(e.name, e.is_dir()))
                    if len(page) == LIST_PAGE:
                        yield page
                        page = []
                if page:
                    yield page
        finally:
            os.close(fd)

    def keys_below(self, prefix: str, most: int) -> builtins.list[str] | None:
        """Every file below directory ``prefix`` at any depth, relative to it, in key order;
        None if there are more than ``most`` (symlinks are not followed)."""
        top = self.path(prefix)
        keys: list[str] = []
        for dirpath, dirs, files in os.walk(top):
            dirs.sort()
            rel = os.path.relpath(dirpath, top)
            keys.extend(name if rel == "." else f"{rel}/{name}" for name in files)
            if len(keys) > most:
                return None
        return sorted(keys)

    def statvfs(self) -> os.statvfs_result:
        return os.statvfs(self._root_fd)

    # ----- writing ------------------------------------------------------------------------

    def check_write(self, key: str) -> None:
        try:
            self._stat(key, strict=True, missing=(FileNotFoundError,))
        except NotADirectoryError:
            raise Unusable(errno.EIO, "a file is where a directory should be", self.path(key)) from None

    @counted("REPLACE", _ANSWERS, bytes_out=lambda version: version.size)
    def replace(self, key: str, data: Iterable[bytes | memoryview],
                if_version: Version | Absent | None = None) -> Version:
        parent, name = _split(key)
        dfd, owner = self._open_dir(parent, create=True)
        try:
            with locked(dfd, name, self.path(key) + LOCK_SUFFIX) as lock_fd:
                current = self._under_lock(dfd, key, if_version)
                st = current if current is not None else owner
                written = 0
                for chunk in data:
                    view = memoryview(chunk)
                    while view:
                        n = os.write(lock_fd, view)
                        view = view[n:]
                        written += n
                os.ftruncate(lock_fd, written)  # a lock file left by a killed writer may be longer
                _own(lock_fd, st, None if current is not None else (st.st_mode & 0o644) | 0o600)
                os.fsync(lock_fd)
                new = os.fstat(lock_fd)
                os.rename(name + LOCK_SUFFIX, name, src_dir_fd=dfd, dst_dir_fd=dfd)
                self.changed(key)
                os.fsync(dfd)
        finally:
            os.close(dfd)
        return Version(new.st_ino, new.st_size, new.st_mtime_ns)

    @counted("RENAME", _ANSWERS)
    def move(self, src: str, dst: str) -> None:
        """See ``Storage.move``: ``rename(2)`` below the root (never through a symlink: both
        parents are opened beneath it), then both parents fsynced."""
        (sp, sn), (dp, dn) = _split(src), _split(dst)
        sfd, _ = self._open_dir(sp, create=False)
        try:
            dfd, _ = self._open_dir(dp, create=False)
            try:
                if not stat_mod.S_ISDIR(os.stat(sn, dir_fd=sfd, follow_symlinks=False).st_mode):
                    raise Unusable(errno.EIO, "not a directory", self.path(src))
                try:
                    os.stat(dn, dir_fd=dfd, follow_symlinks=False)
                except FileNotFoundError:
                    pass
                else:
                    raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), self.path(dst))
                os.rename(sn, dn, src_dir_fd=sfd, dst_dir_fd=dfd)
                self._versions.clear()
                self._listings.clear()
                os.fsync(dfd)
                if sp != dp:
                    os.fsync(sfd)
            finally:
                os.close(dfd)
        finally:
            os.close(sfd)

    @counted("DELETE", _ANSWERS)
    def delete(self, key: str, if_version: Version | Absent | None = None) -> None:
        """Remove ``key``, then its emptied parent directories; durable in the directory that
        survives (the grandparent, when the parent went too)."""
        parent, name = _split(key)
        try:
            dfd, _ = self._open_dir(parent, create=False)
        except (FileNotFoundError, NotADirectoryError):
            if isinstance(if_version, Version):
                raise VersionMismatch(self.path(key)) from None
            return
        try:
            with locked(dfd, name, self.path(key) + LOCK_SUFFIX):
                self._under_lock(dfd, key, if_version)
                try:
                    os.unlink(name, dir_fd=dfd)
                except FileNotFoundError:
                    pass
                self.changed(key)
                os.unlink(name + LOCK_SUFFIX, dir_fd=dfd)
        finally:
            os.close(dfd)
        survivor = parent
        while survivor:
            up, base = _split(survivor)
            try:
                ufd, _ = self._open_dir(up, create=False)
            except OSError:
                break
            try:
                os.rmdir(base, dir_fd=ufd)
            except OSError as e:
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT, errno.EBUSY):
                    raise
                break
            finally:
                os.close(ufd)
            survivor = up
        self._listings.forget(key)  # again: a listing made meanwhile may show the lock or an emptied parent
        fd, _ = self._open_dir(survivor, create=False)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _under_lock(self, dfd: int, key: str, if_version: Version | Absent | None) -> os.stat_result | None:
        """Check ``if_version`` against the key (the lock is held); the key's stat, None if missing.

        On a mismatch (or an unusable key) the lock file is unlinked and the error raised."""
        name = _split(key)[1]
        try:
            version = self._stat(key, strict=True)
            if if_version is not None and version != (None if isinstance(if_version, Absent) else if_version):
                raise VersionMismatch(f"{self.path(key)}: at {version}, not {if_version}")
            return None if version is None else os.stat(name, dir_fd=dfd)
        except BaseException:
            os.unlink(name + LOCK_SUFFIX, dir_fd=dfd)
            raise

    def _open_dir(self, key: str, create: bool) -> tuple[int, os.stat_result]:
        """A descriptor of directory ``key`` (below the root, strictly) and the stat of the
        nearest directory that existed; with ``create``, missing directories are made, with
        that directory's owner, group and mode."""
        flags = os.O_RDONLY | os.O_DIRECTORY
        try:
            fd = self._open(key, flags)
            return fd, os.fstat(fd)
        except NotADirectoryError:
            if create:
                raise Unusable(errno.EIO, "a file is where a directory should be", self.path(key)) from None
            raise
        except FileNotFoundError:
            if not create or not key:
                raise
        up, base = _split(key)
        ufd, owner = self._open_dir(up, create=True)
        try:
            try:
                os.mkdir(base, stat_mod.S_IMODE(owner.st_mode), dir_fd=ufd)
            except FileExistsError:
                pass
            else:
                fd = self._open(key, flags)
                try:
                    _own(fd, owner, stat_mod.S_IMODE(owner.st_mode))
                finally:
                    os.close(fd)
                os.fsync(ufd)
        finally:
            os.close(ufd)
        return self._open(key, flags), owner


def _split(key: str) -> tuple[str, str]:
    parent, _, name = key.rpartition("/")
    return parent, name


def _own(fd: int, like: os.stat_result, mode: int | None) -> None:
    """Give ``fd`` the owner and group of ``like`` (when this process may), and ``mode`` (or
    ``like``'s mode when None)."""
    if (like.st_uid, like.st_gid) != (os.geteuid(), os.getegid()):
        try:
            os.fchown(fd, like.st_uid, like.st_gid)
        except PermissionError:
            pass
    os.fchmod(fd, stat_mod.S_IMODE(like.st_mode) if mode is None else mode)
