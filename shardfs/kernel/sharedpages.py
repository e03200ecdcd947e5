"""The page-cache bookkeeping of ``KernelInodes`` and ``Pins``, kept in the mount's shared
``PageTable`` so that N workers (``-o workers=N``) answer opens as one worker does: a file's
pages kept (``keep_cache``) or filled at its open while they hold the version opened, dropped
when they may hold another's, direct I/O while files of two versions are open on one inode.

The contracts are the one-worker classes' (``shardfs.kernel.inodes``, ``shardfs.kernel.pins``);
what changes with N workers:

- An open's decisions and its fill are made under the table's lock (``locked``): a fill is
  stored before any other worker can drop the pages or decide from them, as one worker's
  trio loop orders them.
- Only files open through the page cache are counted as readers of a version, and a drop
  (``dropped``) makes the pages that version's only while no file of another version reads
  through the cache: its READs may land in the pages after the drop (a READ is answered by
  one worker while another drops; one worker's loop never interleaves them).
- A FORGET says nothing about the kernel's pages here (this worker's lookups are not the
  kernel's): an inode evicted by the kernel is kept, not filled, at its next open.
- A worker that dies leaves its files counted: another version's open of those inodes gets
  direct I/O until the mount ends (never wrong bytes; the kernel re-sends nothing of them).
"""

from __future__ import annotations

import contextlib
from typing import Callable

from shardfs.base.attrs import Attr
from shardfs.kernel import pagetable as pt
from shardfs.kernel.inodes import KernelInodes, Pages
from shardfs.kernel.pins import Pins


class SharedInodes(KernelInodes):
    """``KernelInodes`` whose page-cache state is the mount's ``table`` (lookup counts and
    generations stay this worker's)."""

    shared_pages = True

    def __init__(self, table: pt.PageTable) -> None:
        super().__init__()
        self.table = table
        self._counted: dict[int, int] = {}  # fh -> its inode's entry: a file counted by ``reading``

    def locked(self) -> contextlib.AbstractContextManager[None]:
        return self.table.locked()

    def pages(self, attr: Attr) -> Pages:
        with self.table.locked():
            off = self.table.find(attr.ino)
            if off < 0:  # (an inode no open recorded, or a full table: ``opened`` says)
                return Pages.NONE if self.table.find(attr.ino, insert=True) >= 0 else Pages.OTHER
            return _pages(self.table.read(off), attr)

    def opened(self, attr: Attr) -> Pages:
        with self.table.locked():
            off = self.table.find(attr.ino, insert=True)
            if off < 0:
                return Pages.OTHER
            e = self.table.read(off)
            pages = _pages(e, attr)
            if pages is Pages.OTHER:
                state = e.state if e.state == pt.POISONED else pt.UNKNOWN
                self.table.write(off, e._replace(state=state))
            elif pages is Pages.NONE:
                self.table.write(off, e._replace(state=pt.VERSION, size=attr.size, mtime=attr.mtime_ns))
            return pages

    def dropping(self, ino: int) -> object:
        with self.table.locked():
            off = self.table.find(ino, insert=True)
            if off < 0:
                return None
            e = self.table.read(off)
            if e.state == pt.POISONED:
                return None
            mark = (e.mark + 1) & 0xFFFFFFFF
            self.table.write(off, e._replace(state=pt.DROPPING, mark=mark))
            return mark

    def dropped(self, attr: Attr, mark: object) -> None:
        with self.table.locked():
            off = self.table.find(attr.ino)
            if off < 0 or mark is None:
                return
            e = self.table.read(off)
            if e.state == pt.DROPPING and e.mark == mark and (not e.readers or _reads(e, attr)):
                self.table.write(off, e._replace(state=pt.VERSION, size=attr.size, mtime=attr.mtime_ns))

    def reading(self, attr: Attr, fh: int = 0) -> bool:
        with self.table.locked():
            off = self.table.find(attr.ino, insert=True)
            if off < 0:
                return True
            e = self.table.read(off)
            if e.state == pt.POISONED or (e.readers and not _reads(e, attr)):
                return True
            self.table.write(off, e._replace(readers=e.readers + 1, rsize=attr.size, rmtime=attr.mtime_ns))
            self._counted[fh] = off
            return False

    def unread(self, attr: Attr, fh: int = 0) -> None:
        off = self._counted.pop(fh, -1)
        if off < 0:  # (a file opened with direct I/O, or by another worker)
            return
        with self.table.locked():
            e = self.table.read(off)
            if e.readers and e.state != pt.POISONED:
                self.table.write(off, e._replace(readers=e.readers - 1))

    def served(self, attr: Attr) -> None:
        with self.table.locked():
            off = self.table.find(attr.ino)
            if off < 0:
                return
            e = self.table.read(off)
            if e.state not in (pt.NONE, pt.UNKNOWN, pt.POISONED) and not (
                    e.state == pt.VERSION and (e.size, e.mtime) == (attr.size, attr.mtime_ns)):
                self.table.write(off, e._replace(state=pt.UNKNOWN))

    def changed(self, ino: int) -> None:
        with self.table.locked():
            self._changed(self.table.find(ino, insert=True))

    def invalidated(self, ino: int) -> None:
        with self.table.locked():
            self._changed(self.table.find(ino))  # (an inode never opened has no pages)

    def _changed(self, off: int) -> None:
        if off >= 0:
            e = self.table.read(off)
            state = e.state if e.state == pt.POISONED else pt.UNKNOWN
            self.table.write(off, e._replace(state=state, changes=(e.changes + 1) & 0xFFFFFFFF))

    def watch(self, ino: int) -> int:
        return max(0, self.table.changes(ino))

    def unwatch(self, ino: int, seen: int) -> bool:
        return max(0, self.table.changes(ino)) != seen


def _reads(e: pt.Entry, attr: Attr) -> bool:
    """True if the files counted in ``e`` read version ``attr``."""
    return (e.rsize, e.rmtime) == (attr.size, attr.mtime_ns)


def _pages(e: pt.Entry, attr: Attr) -> Pages:
    if e.state == pt.NONE:
        return Pages.NONE
    if e.state == pt.VERSION and (e.size, e.mtime) == (attr.size, attr.mtime_ns):
        return Pages.SAME
    return Pages.OTHER


class SharedPins(Pins):
    """``Pins`` whose pins are counted in the mount's ``table`` (each inode's pinning version is
    its readers' version: a file of another version beside them reads with direct I/O and pins
    nothing); the aliases chunks show stay this worker's."""

    def __init__(self, table: pt.PageTable, new_alias: Callable[[int], int] | None = None) -> None:
        super().__init__(new_alias)
        self.table = table
        self._mine: dict[int, tuple[int, int]] = {}  # fh -> (its inode's entry, the forfeits then)

    def __bool__(self) -> bool:
        return bool(self._shown) or self.table.pins() > 0

    def pin(self, fh: int, version: Attr) -> None:
        with self.table.locked():
            off = self.table.find(version.ino, insert=True)
            if off < 0:  # (a full table: ``reading`` gave it direct I/O)
                return
            e = self.table.read(off)  # (its readers read ``version``: ``SharedInodes.reading``)
            self.table.write(off, e._replace(pins=e.pins + 1, rsize=version.size, rmtime=version.mtime_ns))
            self.table.add_pins(1)
            self._mine[fh] = (off, e.gen)

    def unpin(self, fh: int) -> None:
        off, gen = self._mine.pop(fh, (-1, 0))
        if off < 0:
            return
        with self.table.locked():
            e = self.table.read(off)
            if e.gen == gen and e.pins:
                self.table.write(off, e._replace(pins=e.pins - 1))
                self.table.add_pins(-1)

    def forfeit(self, ino: int) -> None:
        with self.table.locked():
            off = self.table.find(ino)
            if off < 0:
                return
            e = self.table.read(off)
            if e.pins:
                self.table.add_pins(-e.pins)
            self.table.write(off, e._replace(pins=0, gen=(e.gen + 1) & 0xFFFFFFFF))

    def shown(self, attr: Attr) -> int | None:
        ino = self._shown.get(attr.ino, attr.ino)
        return None if self.table.pins() and self._pinned(ino, attr.size) is not None else ino

    def _pinned(self, ino: int, size: int) -> tuple[int, int] | None:
        with self.table.locked():
            off = self.table.find(ino)
            if off < 0:
                return None
            e = self.table.read(off)
        return (e.rsize, e.rmtime) if e.pins and e.rsize != size else None
