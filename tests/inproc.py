"""The mount's filesystem driven in-process, without the kernel: the tree (``Names``,
``Opens``, ``Listing``) and the ``Writer`` that ``shardfs.kernel.fuse_ops`` calls, reached by
path as the kernel reaches them (a ``lookup`` per name from the root inode), for tests that only check semantics (names,
attributes, listings, metadata mapping, fill rules, commit validation): no daemon, no
``/dev/fuse``, milliseconds a call.

``InProcess(SRC)`` is built by the daemon's composition root (``shardfs.app.compose``) for a
local source, from a ``Config`` of its arguments: the storage, the tree with its reads and,
unless ``read_only``, the write-back (after replaying the journal) journalling into a
directory of its own under the source's journal root, and the ``Writer`` spilling into the
source's spill directory (the suite's ``XDG_STATE_HOME``).
Every call runs on one trio loop of its own (in a thread), which also runs the write-back's
idle folds, as the daemon's one ``trio.run`` does; ``close`` (or leaving a ``with`` block)
folds what is pending into the shards, as an unmount does.

``fs / "raw" / ".zarray"`` is an ``InPath`` with the ``pathlib`` calls tests use: ``stat``,
``exists``, ``is_dir``, ``is_file``, ``iterdir`` (names, in listing order), ``entries`` (names
with the attributes the listing gives), ``read_bytes``/``read_text``,
``write_bytes``/``write_text``, ``open`` (an ``InFile``: ``read``, ``write``, ``stat`` as
``fstat``, ``close`` as the kernel's FLUSH and RELEASE), ``mkdir``, ``unlink``, ``rmdir``,
``replace``, ``hardlink_to``, ``truncate``; ``files`` and ``copy_to`` give its files' bytes to clients. Each
raises the ``OSError`` (errno) the adapter answers with; any other exception (which the
adapter would log and answer EIO) fails the test. What needs the kernel (page cache, entry
and attribute caches, FLUSH at ``close(2)``, ENAMETOOLONG, the errno a client sees) is
tested on real mounts.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
from pathlib import Path, PurePosixPath
from typing import Any, Awaitable, Callable, TypeVar

import trio

from shardfs.app.compose import compose
from shardfs.config import Config, KernelConfig, StorageConfig, TreeConfig, WriteConfig
from shardfs.base.attrs import Attr
from shardfs.storage.source import Source
from shardfs.tree.nodetable import ROOT_INODE
from shardfs.reads import ReadHandle
from shardfs.tree.structure import Structure
from shardfs.tree.writer import WriteHandle, Writer

T = TypeVar("T")


def stat_result(attr: Attr) -> os.stat_result:
    """``attr`` as ``os.stat`` shows it through a mount (the daemon's uid and gid)."""
    sec, ns = attr.mtime_ns // 10**9, attr.mtime_ns
    return os.stat_result((attr.mode, attr.ino, 0, attr.nlink, os.getuid(), os.getgid(), attr.size,
                           sec, sec, sec, ns / 10**9, ns / 10**9, ns / 10**9),
                          {"st_atime_ns": ns, "st_mtime_ns": ns, "st_ctime_ns": ns})


class InProcess:
    """One source directory's tree as a mount of it shows it.

    ``read_only``: no ``Writer`` (every write is EROFS, as on a read-only mount);
    ``shard_bytes``: ``-o shard_size`` for arrays created here; ``list_ttl``: how long
    listings of the source are kept (a mount's entry timeout); ``follow_symlinks``: ``-o
    follow_symlinks``; ``**tree``: the tree's options (``ome``, ``c_order``). ``root`` may be
    a URL (``s3://``, ``http(s)://``: the source's settings from the environment)."""

    def __init__(self, root: str | os.PathLike[str], read_only: bool = True, shard_bytes: int = WriteConfig.shard_size,
                 list_ttl: float = KernelConfig.entry_timeout, follow_symlinks: bool = False, **tree: Any) -> None:
        self.root = Path(root)
        cfg = Config(read_only=read_only, kernel=KernelConfig(entry_timeout=list_ttl), tree=TreeConfig(**tree),
                     writes=WriteConfig(shard_size=shard_bytes), storage=StorageConfig(follow_symlinks=follow_symlinks))
        self._cleanup = contextlib.ExitStack()
        try:
            given = ["follow_symlinks"] if follow_symlinks else []
            mount = compose(cfg, Source.parse(os.fspath(root), cfg.storage, given), self._cleanup)
        except BaseException:
            self._cleanup.close()
            raise
        self.mount = mount  # every object ``compose`` built (``Composed``: its counters too)
        self.source, self.writeback, self.writer = mount.storage, mount.writeback, mount.writer
        self.structure = mount.structure
        self.tree, self.names, self.opens = mount.tree, mount.tree.names, mount.tree.opens
        self.folded = mount.commits.folded if mount.commits is not None else None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._thread: threading.Thread | None = None

    # ----- the loop -----------------------------------------------------------------------

    def run(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``await fn(*args)`` on this tree's trio loop (started at the first call): its
        result, or its exception."""
        if self._token is None:
            started = threading.Event()
            self._thread = threading.Thread(target=trio.run, args=(self._serve, started), daemon=True,
                                            name="inproc-trio")
            self._thread.start()
            started.wait()
        return trio.from_thread.run(fn, *args, trio_token=self._token)

    async def _serve(self, started: threading.Event) -> None:
        """The loop's main task: the write-back's folds (``Writeback.run``) until ``close``."""
        self._token, self._stop = trio.lowlevel.current_trio_token(), trio.Event()
        async with trio.open_nursery() as nursery:
            if self.writeback is not None:
                nursery.start_soon(self.writeback.run, self.folded)
            started.set()
            await self._stop.wait()
            nursery.cancel_scope.cancel()

    def fold(self) -> None:
        """Fold every pending chunk into its shard now (what an unmount does)."""
        if self.writeback is not None:
            self.run(self.writeback.flush, self.folded)

    def close(self) -> None:
        """Fold what is pending, end the loop, release the journal (removed when empty)."""
        try:
            self.fold()
        finally:
            if self._token is not None:
                assert self._stop is not None and self._thread is not None
                trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
                self._thread.join()
                self._token = None
            self._cleanup.close()

    def __enter__(self) -> InProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----- paths --------------------------------------------------------------------------

    def __truediv__(self, rel: str | os.PathLike[str]) -> InPath:
        return InPath(self, PurePosixPath(rel))

    async def ino(self, rel: PurePosixPath) -> int:
        """The inode of ``rel``, looked up name by name from the root (ENOENT, ENOTDIR...)."""
        ino = ROOT_INODE
        for name in rel.parts:
            ino = (await self.names.lookup(ino, name)).ino
        return ino

    def writable(self) -> Writer:
        """The ``Writer``; EROFS on a read-only tree (as the adapter answers)."""
        if self.writer is None:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        return self.writer

    def restructurable(self) -> Structure:
        """The writer's ``Structure`` (mkdir, rmdir); EROFS on a read-only tree (as the adapter answers)."""
        if self.structure is None:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        return self.structure


class InPath:
    """A path below an ``InProcess`` tree (``pathlib``-like; see the module docstring)."""

    def __init__(self, fs: InProcess, rel: PurePosixPath) -> None:
        self.fs, self.rel = fs, rel

    def __truediv__(self, name: str | os.PathLike[str]) -> InPath:
        return InPath(self.fs, self.rel / name)

    def __repr__(self) -> str:
        return f"InPath({str(self.rel)!r})"

    @property
    def name(self) -> str:
        return self.rel.name

    def _call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``fn(parent inode, name, *args)`` on the loop (a call naming an entry of a directory)."""
        async def run() -> T:
            return await fn(await self.fs.ino(self.rel.parent), self.rel.name, *args)

        return self.fs.run(run)

    # ----- reading ------------------------------------------------------------------------

    def stat(self) -> os.stat_result:
        async def run() -> Attr:
            return await self.fs.names.getattr(await self.fs.ino(self.rel))

        return stat_result(self.fs.run(run))

    def exists(self) -> bool:
        try:
            self.stat()
        except FileNotFoundError:
            return False
        return True

    def is_dir(self) -> bool:
        return self.exists() and stat.S_ISDIR(self.stat().st_mode)

    def is_file(self) -> bool:
        return self.exists() and stat.S_ISREG(self.stat().st_mode)

    def iterdir(self) -> list[str]:
        """The names of the directory's entries, in listing order (``os.listdir``)."""
        return [name for name, _ in self.entries()]

    def entries(self) -> list[tuple[str, os.stat_result]]:
        """The directory's entries with the attributes its listing gives (``readdir``)."""
        async def run() -> list[tuple[str, Attr]]:
            return list(await self.fs.tree.listing.listdir(await self.fs.ino(self.rel)))

        return [(name, stat_result(attr)) for name, attr in self.fs.run(run)]

    def files(self) -> dict[str, bytes]:
        """``{path: content}`` of every file below this directory (paths relative to it;
        directories as ``path/`` with ``b""``), as a client walks it (list, open, read)."""
        out: dict[str, bytes] = {}
        for name, st in self.entries():
            if stat.S_ISDIR(st.st_mode):
                out[name + "/"] = b""
                out.update({f"{name}/{key}": data for key, data in (self / name).files().items()})
            else:
                out[name] = (self / name).read_bytes()
        return out

    def copy_to(self, dest: str | os.PathLike[str]) -> Path:
        """``cp -r`` of this directory into ``dest`` (made): a real directory of the bytes the
        mount shows, for clients to read without the kernel."""
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        for key, data in self.files().items():
            if key.endswith("/"):
                (dest / key).mkdir(parents=True, exist_ok=True)
            else:
                (dest / key).write_bytes(data)
        return dest

    def read_bytes(self) -> bytes:
        with self.open("rb") as f:
            return f.read()

    def read_text(self) -> str:
        return self.read_bytes().decode()

    def open(self, mode: str = "rb") -> InFile:
        """``open(2)`` as the adapter answers it: ``rb`` reads; ``wb`` creates or truncates;
        ``r+b`` writes in place."""
        if mode not in ("rb", "wb", "r+b"):
            raise ValueError(f"mode {mode!r}: rb, wb or r+b")
        return InFile(self.fs, self.fs.run(self._open, mode))

    async def _open(self, mode: str) -> ReadHandle | WriteHandle:
        names = self.fs.names
        if mode == "rb":
            return await self.fs.opens.open(await self.fs.ino(self.rel))
        writer = self.fs.writable()
        parent = await self.fs.ino(self.rel.parent)
        try:
            ino = (await names.lookup(parent, self.rel.name)).ino
        except FileNotFoundError:
            if mode != "wb":
                raise
            return (await writer.create(parent, self.rel.name))[1]
        await names.getattr(ino)
        return await writer.open(ino, truncate=mode == "wb")

    # ----- writing ------------------------------------------------------------------------

    def write_bytes(self, data: bytes) -> int:
        with self.open("wb") as f:
            return f.write(data)

    def write_text(self, text: str) -> int:
        return self.write_bytes(text.encode())

    def mkdir(self) -> None:
        self._call(self.fs.restructurable().mkdir)

    def unlink(self) -> None:
        self._call(self.fs.writable().unlink)

    def rmdir(self) -> None:
        self._call(self.fs.restructurable().rmdir)

    def replace(self, target: InPath) -> InPath:
        """``rename(2)`` onto ``target`` (replacing it)."""
        async def run() -> None:
            await self.fs.writable().rename(await self.fs.ino(self.rel.parent), self.rel.name,
                                            await self.fs.ino(target.rel.parent), target.rel.name, False)

        self.fs.run(run)
        return target

    def hardlink_to(self, target: InPath) -> None:
        """``link(2)``: this path made a new name of ``target``'s file (as ``pathlib``)."""
        async def run() -> None:
            await self.fs.writable().link(await self.fs.ino(target.rel), await self.fs.ino(self.rel.parent),
                                          self.rel.name)

        self.fs.run(run)

    def truncate(self, size: int) -> None:
        """``truncate(2)`` by path (no handle open)."""
        async def run() -> None:
            await self.fs.writable().truncate_closed(await self.fs.ino(self.rel), size)

        self.fs.run(run)


class InFile:
    """An open file (an ``Opens`` read handle or a ``Writer`` write handle), read and written
    at its position as a client does."""

    def __init__(self, fs: InProcess, handle: ReadHandle | WriteHandle) -> None:
        self.fs, self.handle, self.pos, self.closed = fs, handle, 0, False

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes (all the rest if negative) from the position on."""
        async def run() -> bytes:
            out = bytearray()
            while size < 0 or len(out) < size:
                want = 1 << 20 if size < 0 else min(1 << 20, size - len(out))
                if isinstance(self.handle, WriteHandle):
                    data: Any = await self.fs.writable().read(self.handle, self.pos, want)
                else:
                    data = await self.fs.opens.read(self.handle, self.pos, want)
                if not data:
                    break
                out += data
                self.pos += len(data)
            return bytes(out)

        return self.fs.run(run)

    def write(self, data: bytes) -> int:
        """``data`` written at the position (EBADF on a file opened for reading)."""
        if not isinstance(self.handle, WriteHandle):
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        handle = self.handle

        async def run() -> int:
            n = await self.fs.writable().write(handle, self.pos, bytes(data))
            self.pos += n
            return n

        return self.fs.run(run)

    def truncate(self, size: int) -> None:
        """``ftruncate`` (EBADF on a file opened for reading)."""
        if not isinstance(self.handle, WriteHandle):
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        self.fs.run(self.fs.writable().truncate, self.handle, size)

    def stat(self) -> os.stat_result:
        """``fstat``: a file with writes not yet committed shows their size (``Writer.dirty_attr``)."""
        async def run() -> Attr:
            if isinstance(self.handle, WriteHandle):
                attr = self.fs.writable().dirty_attr(self.handle)
                if attr is not None:
                    return attr
            return await self.fs.names.getattr(self.handle.ino)

        return stat_result(self.fs.run(run))

    def close(self) -> None:
        """The kernel's FLUSH (a written file is committed: its error is raised here), then RELEASE."""
        if self.closed:
            return
        self.closed = True
        handle = self.handle

        async def run() -> None:
            if isinstance(handle, WriteHandle):
                writer = self.fs.writable()
                try:
                    await writer.flush(handle)
                finally:
                    writer.release(handle)
            else:
                self.fs.opens.release(handle)

        self.fs.run(run)

    def __enter__(self) -> InFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def copy_chunk_file(arr: InPath, expected: Any) -> None:
    """Write one chunk file of array ``arr`` with the bytes of another of the same shape, as a
    client rewriting a chunk does, and make ``expected`` (the array's values, a numpy array) say
    so: the first stored chunk with a whole chunk after it along some dimension is copied onto
    that one. AssertionError if the array has no such pair."""
    import json

    zarray = json.loads((arr / ".zarray").read_text())
    chunks, shape, sep = zarray["chunks"], zarray["shape"], zarray.get("dimension_separator") or "."
    grid = [s // c for s, c in zip(shape, chunks)]  # whole chunks only
    import itertools

    for src in itertools.product(*(range(n) for n in grid)):
        for d in range(len(grid)):
            dst = tuple(i + (k == d) for k, i in enumerate(src))
            if dst[d] >= grid[d]:
                continue
            try:
                data = (arr / sep.join(map(str, src))).read_bytes()
            except FileNotFoundError:  # not stored (an empty chunk)
                break
            (arr / sep.join(map(str, dst))).write_bytes(data)
            region = [tuple(slice(i * c, (i + 1) * c) for i, c in zip(idx, chunks)) for idx in (src, dst)]
            expected[region[1]] = expected[region[0]]
            return
    raise AssertionError(f"{arr}: no stored whole chunk with a whole chunk after it")
