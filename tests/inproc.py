"""The mount's filesystem driven in-process, without the kernel: the ``View`` that
``shardfs.kernel.fuse_ops`` calls, reached by path as the kernel reaches it (a ``lookup`` per
name from the root inode), for tests that only check semantics (names, attributes,
listings, metadata mapping, fill rules): no daemon, no ``/dev/fuse``, milliseconds a test.

``InProcess(root) / "raw" / ".zarray"`` is an ``InPath``: ``read_bytes``, ``read_text``,
``stat`` (``st_mode``, ``st_size``, ``st_nlink``, ``st_ino``, ``st_mtime_ns``), ``iterdir``
names and ``exists``, raising the ``OSError`` (errno) the adapter would answer with.
Each call is one ``trio.run`` over one ``View`` (read-only, like ``View``'s default).
"""

from __future__ import annotations

import os
from pathlib import PurePosixPath
from typing import Any

import trio

from shardfs.storage.local import LocalStorage
from shardfs.tree.nodetable import ROOT_INODE
from shardfs.tree.view import View


class InProcess:
    """One source directory's tree, as a mount of it shows it (``**kw``: ``View``'s options)."""

    def __init__(self, root: str | os.PathLike[str], **kw: Any) -> None:
        self.view = View(LocalStorage(os.fspath(root)), **kw)

    def __truediv__(self, rel: str | os.PathLike[str]) -> InPath:
        return InPath(self, PurePosixPath(rel))

    async def ino(self, rel: PurePosixPath) -> int:
        """The inode of ``rel``, looked up name by name from the root (ENOENT, ENOTDIR...)."""
        ino = ROOT_INODE
        for name in rel.parts:
            ino = (await self.view.lookup(ino, name)).ino
        return ino


class InPath:
    """A path below an ``InProcess`` tree."""

    def __init__(self, fs: InProcess, rel: PurePosixPath) -> None:
        self.fs, self.rel = fs, rel

    def __truediv__(self, name: str | os.PathLike[str]) -> InPath:
        return InPath(self.fs, self.rel / name)

    def __repr__(self) -> str:
        return f"InPath({str(self.rel)!r})"

    @property
    def name(self) -> str:
        return self.rel.name

    def stat(self) -> os.stat_result:
        async def run() -> os.stat_result:
            attr = await self.fs.view.getattr(await self.fs.ino(self.rel))
            return os.stat_result((attr.mode, attr.ino, 0, attr.nlink, 0, 0, attr.size, attr.mtime_ns // 10**9,
                                   attr.mtime_ns // 10**9, attr.mtime_ns // 10**9))

        return trio.run(run)

    def exists(self) -> bool:
        try:
            self.stat()
        except FileNotFoundError:
            return False
        return True

    def read_bytes(self) -> bytes:
        async def run() -> bytes:
            handle = await self.fs.view.open(await self.fs.ino(self.rel))
            try:
                out = bytearray()
                while True:
                    data = await self.fs.view.read(handle, len(out), 1 << 20)
                    if not data:
                        return bytes(out)
                    out += data
            finally:
                self.fs.view.release(handle)

        return trio.run(run)

    def read_text(self) -> str:
        return self.read_bytes().decode()

    def iterdir(self) -> list[str]:
        """The names of the directory's entries, in listing order (``os.listdir``)."""
        async def run() -> list[str]:
            return [name for name, _ in await self.fs.view.listing.listdir(await self.fs.ino(self.rel))]

        return trio.run(run)
