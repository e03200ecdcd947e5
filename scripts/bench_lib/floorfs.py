"""floorfs: the thinnest pyfuse3 passthrough of a directory, the bench's floor.

Usage: ``.venv/bin/python scripts/bench_lib/floorfs.py [--rw] SRC MNT`` (stays in the foreground).

It serves SRC at MNT (read-only unless ``--rw``) with nothing but the real files behind it:
each request is one system call on the real path (``os.lstat``, ``os.scandir``, ``os.open``,
``os.pread``, ``os.pwrite``, ``os.rename``, ``os.close``), inode numbers are the real ones, and it uses the same kernel
caching as shardfs (10 s entry and attribute timeouts, readdirplus, ``keep_cache``). Any
pyfuse3 filesystem costs at least what this one does, so shardfs time / floorfs time is
what shardfs adds, and floorfs time / real-directory time is the price of FUSE + pyfuse3
itself (one kernel/user round trip per request).

Contract: SRC is one directory tree on one filesystem (inode numbers must be unique) that
nothing but floorfs itself changes while mounted. MNT counts as ready once it is a mount
point. SIGTERM or SIGINT, or ``fusermount3 -u MNT``, unmounts it and ends the process with
status 0.
Imports only the standard library, pyfuse3, trio and ``shardfs.kernel.fuseloop`` (itself only those
and ``shardfs.kernel.elastic``, which floorfs leaves unused):
it runs pyfuse3's request loop as shardfs does (``fuseloop.main``, a cheaper read lock), so the
floor is the floor of shardfs's own loop.
"""

from __future__ import annotations

import errno
import functools
import itertools
import os
import signal
import sys
from typing import Any, Awaitable, Callable, TypeVar

import pyfuse3
import trio

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repo
from shardfs.kernel import fuseloop  # noqa: E402

TIMEOUT = 10.0  # entry and attribute timeouts, seconds (shardfs' defaults)
F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


def _oserror_to_fuse(fn: F) -> F:
    """Let a handler's ``OSError`` reach the kernel as its errno."""

    @functools.wraps(fn)
    async def wrapper(*args: Any) -> Any:
        try:
            return await fn(*args)
        except OSError as e:
            raise pyfuse3.FUSEError(e.errno or errno.EIO) from None

    return wrapper  # type: ignore[return-value]  # the same signature as fn, which functools.wraps cannot say


class FloorOps(pyfuse3.Operations):
    """Passthrough handlers (writes only with ``--rw``: create, write, rename, unlink,
    truncate): inode numbers are real ``st_ino`` (the root's swapped with
    ``pyfuse3.ROOT_INODE``); every inode handed to the kernel is remembered with its path
    for the life of the mount (no forget bookkeeping: the bench's trees are small)."""

    supports_dot_lookup = False
    enable_writeback_cache = False

    def __init__(self, root: str) -> None:
        super().__init__()
        self.root = os.fsencode(os.path.abspath(root))
        self.root_ino = os.lstat(self.root).st_ino
        self.paths: dict[int, bytes] = {pyfuse3.ROOT_INODE: self.root}
        self.dirs: dict[int, tuple[bytes, list[tuple[bytes, pyfuse3.EntryAttributes]] | None]] = {}
        self.next_fh = itertools.count(1)

    def _ino(self, st_ino: int) -> int:
        """The inode number the kernel sees for real inode ``st_ino``."""
        if st_ino == self.root_ino:
            return pyfuse3.ROOT_INODE
        return self.root_ino if st_ino == pyfuse3.ROOT_INODE else st_ino

    def _entry(self, st: os.stat_result, path: bytes) -> pyfuse3.EntryAttributes:
        """``st`` (of ``path``) as entry attributes; remembers the inode's path."""
        e = pyfuse3.EntryAttributes()
        e.st_ino = self._ino(st.st_ino)
        self.paths[e.st_ino] = path
        e.st_mode, e.st_nlink, e.st_uid, e.st_gid = st.st_mode, st.st_nlink, st.st_uid, st.st_gid
        e.st_size, e.st_blocks, e.st_blksize, e.st_rdev = st.st_size, st.st_blocks, st.st_blksize, st.st_rdev
        e.st_atime_ns, e.st_mtime_ns, e.st_ctime_ns = st.st_atime_ns, st.st_mtime_ns, st.st_ctime_ns
        e.entry_timeout = e.attr_timeout = TIMEOUT
        return e

    def _path(self, inode: int) -> bytes:
        try:
            return self.paths[inode]
        except KeyError:
            raise pyfuse3.FUSEError(errno.ESTALE) from None

    @_oserror_to_fuse
    async def lookup(self, parent_inode: int, name: bytes, ctx: Any = None) -> pyfuse3.EntryAttributes:
        path = os.path.join(self._path(parent_inode), name)
        return self._entry(os.lstat(path), path)

    @_oserror_to_fuse
    async def getattr(self, inode: int, ctx: Any = None) -> pyfuse3.EntryAttributes:
        path = self._path(inode)
        return self._entry(os.lstat(path), path)

    async def opendir(self, inode: int, ctx: Any) -> int:
        fh = next(self.next_fh)
        self.dirs[fh] = (self._path(inode), None)
        return fh

    @_oserror_to_fuse
    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        """readdirplus: the directory is listed (with attributes) once per handle, at offset 0."""
        path, entries = self.dirs[fh]
        if entries is None or start_id == 0:
            with os.scandir(path) as it:
                entries = [(d.name, self._entry(d.stat(follow_symlinks=False), d.path)) for d in it]
            self.dirs[fh] = (path, entries)
        for i in range(start_id, len(entries)):
            if not pyfuse3.readdir_reply(token, *entries[i], i + 1):
                break

    async def releasedir(self, fh: int) -> None:
        self.dirs.pop(fh, None)

    @_oserror_to_fuse
    async def open(self, inode: int, flags: int, ctx: Any) -> pyfuse3.FileInfo:
        """The file handle is the real file descriptor."""
        return pyfuse3.FileInfo(fh=os.open(self._path(inode), flags & ~os.O_CREAT), keep_cache=True)

    @_oserror_to_fuse
    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: Any
                     ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        path = os.path.join(self._path(parent_inode), name)
        fd = os.open(path, flags | os.O_CREAT, mode)
        return pyfuse3.FileInfo(fh=fd), self._entry(os.fstat(fd), path)

    @_oserror_to_fuse
    async def write(self, fh: int, off: int, buf: bytes) -> int:
        return os.pwrite(fh, buf, off)

    @_oserror_to_fuse
    async def rename(self, parent_inode_old: int, name_old: bytes, parent_inode_new: int, name_new: bytes,
                     flags: int, ctx: Any) -> None:
        new = os.path.join(self._path(parent_inode_new), name_new)
        os.rename(os.path.join(self._path(parent_inode_old), name_old), new)
        self.paths[self._ino(os.lstat(new).st_ino)] = new

    @_oserror_to_fuse
    async def unlink(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        os.unlink(os.path.join(self._path(parent_inode), name))

    @_oserror_to_fuse
    async def setattr(self, inode: int, attr: pyfuse3.EntryAttributes, fields: pyfuse3.SetattrFields,
                      fh: int | None, ctx: Any) -> pyfuse3.EntryAttributes:
        path = self._path(inode)
        if fields.update_size:
            os.truncate(path, attr.st_size)
        return self._entry(os.lstat(path), path)

    @_oserror_to_fuse
    async def read(self, fh: int, off: int, size: int) -> bytes:
        return os.pread(fh, size, off)

    async def flush(self, fh: int) -> None:
        """A no-op, but answered: the kernel keeps sending FLUSH on every close (a stock pyfuse3
        cannot ask for none; shardfs, with the pyfuse3 scripts/install patches, does for reads)."""

    async def release(self, fh: int) -> None:
        os.close(fh)

    @_oserror_to_fuse
    async def statfs(self, ctx: Any) -> pyfuse3.StatvfsData:
        st = os.statvfs(self.root)
        out = pyfuse3.StatvfsData()
        for name in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree",
                     "f_favail", "f_namemax"):
            setattr(out, name, getattr(st, name))
        return out


async def serve() -> None:
    """Run the FUSE loop until unmounted, or until SIGTERM/SIGINT ends it."""
    async with trio.open_nursery() as nursery:

        async def on_signal() -> None:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    pyfuse3.terminate()
                    return

        nursery.start_soon(on_signal)
        await fuseloop.main()
        nursery.cancel_scope.cancel()


def main(argv: list[str]) -> int:
    """Mount ``SRC`` on ``MNT`` (read-only unless ``--rw``) and serve it until unmounted or signalled."""
    rw = argv[:1] == ["--rw"]
    if len(argv) != 2 + rw:
        print("usage: floorfs.py [--rw] SRC MNT", file=sys.stderr)
        return 2
    src, mnt = argv[rw:]
    ops = FloorOps(src)
    options = set(pyfuse3.default_options) | {"fsname=floorfs", "subtype=floorfs"}
    pyfuse3.init(ops, mnt, options if rw else options | {"ro"})
    try:
        trio.run(serve)
    finally:
        pyfuse3.close(unmount=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
