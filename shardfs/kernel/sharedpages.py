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
- The kernel's lookups of an inode are counted in the table, from every worker's replies
  (``looked_up``): a FORGET (whichever worker it reaches) that takes that count to 0 is the
  kernel's eviction of the inode, with its pages (``kernel_forgot``), so its next open fills
  them, as with one worker. A count that lost no lookup is never too low (a worker counts
  before it replies, and the table outlives every worker), so a FORGET that leaves more is no
  eviction: a lookup answered since already made the kernel a new inode, whose pages the table
  tracks from its opens on (it is then kept, not filled).
- A file's reader and pin are noted by its handle (``PageTable.note_handle``): the worker that
  serves its RELEASE uncounts them at once, whichever it is, also after its opener died. A
  handle whose place another holds is counted in its opener alone (``_counted``, ``_mine``):
  uncounted when the opener learns of the release, or never if it died (another version's open
  of that inode then gets direct I/O until the mount ends: never wrong bytes).
"""

from __future__ import annotations

import contextlib
from typing import Callable, Sequence

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
        return self.table  # (``PageTable.locked``)

    def looked_up(self, ino: int) -> None:
        self.looked_up_all((ino,))

    def looked_up_all(self, inos: Sequence[int]) -> None:
        """(All under one hold of the table's lock: a READDIR's entries.)"""
        super().looked_up_all(inos)
        t = self.table
        with t:
            for ino in inos:
                off = t.find(ino, insert=True)
                if off >= 0:
                    t.set_word(off, pt.LOOKUPS, t.word(off, pt.LOOKUPS) + 1)

    def kernel_forgot(self, forgets: Sequence[tuple[int, int]]) -> None:
        """Each inode whose count of lookups the FORGET takes to 0 holds no pages (module
        docstring); the table's entry of a torn write stays poisoned."""
        t = self.table
        with t:
            for ino, n in forgets:
                off = t.find(ino)
                if off < 0:
                    continue
                held = t.word(off, pt.LOOKUPS)
                t.set_word(off, pt.LOOKUPS, max(0, held - n))
                if held == n and t.word(off, pt.STATE) != pt.POISONED:
                    t.set_version(off, pt.NONE, t.word(off, pt.MARK), 0, 0)

    def pages(self, attr: Attr) -> Pages:
        """(Without the lock: what it answers only chooses whether to read the content for a fill
        and whether to drop the pages first; ``opened`` decides under the lock.)"""
        off = self.table.find(attr.ino)
        return Pages.NONE if off < 0 else _pages(self.table.version(off), attr)

    def opened(self, attr: Attr) -> Pages:
        t = self.table
        with t:
            off = t.find(attr.ino, insert=True)
            if off < 0:
                return Pages.OTHER
            state, mark, size, mtime = t.version(off)
            pages = _pages((state, mark, size, mtime), attr)
            if pages is Pages.OTHER:
                if state != pt.POISONED:
                    t.set_word(off, pt.STATE, pt.UNKNOWN)
            elif pages is Pages.NONE:
                t.set_version(off, pt.VERSION, mark, attr.size, attr.mtime_ns)
            return pages

    def dropping(self, ino: int) -> object:
        t = self.table
        with t:
            off = t.find(ino, insert=True)
            if off < 0:
                return None
            state, mark, size, mtime = t.version(off)
            if state == pt.POISONED:
                return None
            mark = (mark + 1) & 0xFFFFFFFF
            t.set_version(off, pt.DROPPING, mark, size, mtime)
            return mark

    def dropped(self, attr: Attr, mark: object) -> None:
        t = self.table
        with t:
            off = t.find(attr.ino)
            if off < 0 or mark is None:
                return
            state, now, _size, _mtime = t.version(off)
            rsize, rmtime, readers = t.readers(off)
            if state == pt.DROPPING and now == mark and (not readers or (rsize, rmtime) == (attr.size, attr.mtime_ns)):
                t.set_version(off, pt.VERSION, now, attr.size, attr.mtime_ns)

    def reading(self, attr: Attr, fh: int = 0) -> bool:
        t = self.table
        with t:
            off = t.find(attr.ino, insert=True)
            if off < 0:
                return True
            e = t.fields(off)
            readers = e[_READERS]
            if e[_STATE] == pt.POISONED or (readers and (e[_RSIZE], e[_RMTIME]) != (attr.size, attr.mtime_ns)):
                return True
            if readers:
                t.set_word(off, pt.READERS, readers + 1)
            else:
                t.set_readers(off, attr.size, attr.mtime_ns, 1)
            if not t.note_handle(fh, off, pt.READER):
                self._counted[fh] = off
            return False

    def counts(self, fh: int) -> bool:
        """(Without the lock: see ``PageTable.noted``.)"""
        return fh in self._counted or self.table.noted(fh, pt.READER)

    def unread(self, attr: Attr, fh: int = 0) -> None:
        off = self._counted.pop(fh, -1)
        with self.table:
            self._uncount(fh, off)

    def released_elsewhere(self, fh: int) -> None:
        with self.table:
            self._uncount(fh, -1)

    def _uncount(self, fh: int, off: int) -> None:
        """One reader fewer in the entry at ``off``, or if < 0 in the one noted for handle ``fh``
        (none: a file opened with direct I/O, or already uncounted by another worker)."""
        t = self.table
        if off < 0:
            noted = t.take_handle(fh, pt.READER)
            if noted is None:
                return
            off = noted[0]
        e = t.fields(off)
        if e[_READERS] and e[_STATE] != pt.POISONED:
            t.set_word(off, pt.READERS, e[_READERS] - 1)

    def served(self, attr: Attr) -> None:
        t = self.table
        with t:
            off = t.find(attr.ino)
            if off < 0:
                return
            state, _mark, size, mtime = t.version(off)
            if state not in (pt.NONE, pt.UNKNOWN, pt.POISONED) and not (
                    state == pt.VERSION and (size, mtime) == (attr.size, attr.mtime_ns)):
                t.set_word(off, pt.STATE, pt.UNKNOWN)

    def changed(self, ino: int) -> None:
        with self.table:
            self._changed(self.table.find(ino, insert=True))

    def invalidated(self, ino: int) -> None:
        t = self.table
        with t:
            off = t.find(ino)  # (an inode never opened has no pages; nor one the kernel evicted)
            if off >= 0 and t.word(off, pt.LOOKUPS):
                self._changed(off)

    def _changed(self, off: int) -> None:
        t = self.table
        if off >= 0:
            if t.word(off, pt.STATE) != pt.POISONED:
                t.set_word(off, pt.STATE, pt.UNKNOWN)
            t.set_word(off, pt.CHANGES, t.word(off, pt.CHANGES) + 1)

    def watch(self, ino: int) -> int:
        return self.table.changes(ino)

    def unwatch(self, ino: int, seen: int) -> bool:
        return self.table.changes(ino) != seen


# indexes of ``PageTable.fields``' tuple (``pagetable.Entry``'s order)
_STATE, _RSIZE, _RMTIME, _READERS, _PINS, _GEN = 1, 5, 6, 7, 8, 9


def _pages(version: tuple[int, int, int, int], attr: Attr) -> Pages:
    """What the pages of an entry at ``version`` (state, mark, size, mtime) hold for ``attr``."""
    state, _mark, size, mtime = version
    if state == pt.NONE:
        return Pages.NONE
    if state == pt.VERSION and (size, mtime) == (attr.size, attr.mtime_ns):
        return Pages.SAME
    return Pages.OTHER


class SharedPins(Pins):
    """``Pins`` whose pins are counted in the mount's ``table`` (each inode's pinning version is
    its first pin's since it had none: not its readers', who no longer pin it once it was
    rewritten in place, ``forfeit``); the aliases chunks show stay this worker's."""

    def __init__(self, table: pt.PageTable, new_alias: Callable[[int], int] | None = None) -> None:
        super().__init__(new_alias)
        self.table = table
        self._mine: dict[int, tuple[int, int]] = {}  # fh -> (its inode's entry, the forfeits then)

    def __bool__(self) -> bool:
        return bool(self._shown) or self.table.pins() > 0

    def pin(self, fh: int, version: Attr) -> None:
        t = self.table
        with t:
            off = t.find(version.ino, insert=True)
            if off < 0:  # (a full table: ``reading`` gave it direct I/O)
                return
            e = t.fields(off)
            if not e[_PINS]:  # (the others are of its size: ``refused``)
                t.set_pinned(off, version.size, version.mtime_ns)
            t.set_word(off, pt.PINS, e[_PINS] + 1)
            t.add_pins(1)
            if not t.note_handle(fh, off, pt.PINNED, e[_GEN]):
                self._mine[fh] = (off, e[_GEN])

    def counts(self, fh: int) -> bool:
        """(Without the lock: see ``PageTable.noted``.)"""
        return fh in self._mine or self.table.noted(fh, pt.PINNED)

    def unpin(self, fh: int) -> None:
        off, gen = self._mine.pop(fh, (-1, 0))
        with self.table:
            self._unpin(fh, off, gen)

    def released_elsewhere(self, fh: int) -> None:
        with self.table:
            self._unpin(fh, -1, 0)

    def _unpin(self, fh: int, off: int, gen: int) -> None:
        """One pin fewer in the entry at ``off`` unless forfeited since ``gen``; if ``off`` < 0,
        the pin noted for handle ``fh`` (none: a file that pinned nothing, or already unpinned
        by another worker)."""
        t = self.table
        if off < 0:
            noted = t.take_handle(fh, pt.PINNED)
            if noted is None:
                return
            off, gen = noted
        e = t.fields(off)
        if (e[_GEN] & pt.GEN_MASK) == (gen & pt.GEN_MASK) and e[_PINS]:
            t.set_word(off, pt.PINS, e[_PINS] - 1)
            t.add_pins(-1)

    def forfeit(self, ino: int) -> None:
        t = self.table
        with t:
            off = t.find(ino)
            if off < 0:
                return
            pins = t.word(off, pt.PINS)
            if pins:
                t.add_pins(-pins)
            t.set_word(off, pt.PINS, 0)
            t.set_word(off, pt.GEN, t.word(off, pt.GEN) + 1)

    def shown(self, attr: Attr) -> int | None:
        ino = self._shown.get(attr.ino, attr.ino)
        return None if self.table.pins() and self._pinned(ino, attr.size) is not None else ino

    def _pinned(self, ino: int, size: int) -> tuple[int, int] | None:
        """(Without the lock: a pin and its version are written before the open that makes it is
        answered, and read here by a lookup or getattr that came after, or raced with it anyway.)"""
        t = self.table
        off = t.find(ino)
        if off < 0:
            return None
        if not t.word(off, pt.PINS):
            return None
        version = t.pinned(off)
        return version if version[0] != size else None
