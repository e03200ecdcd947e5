"""A table of what the kernel's page cache holds, per inode, shared by the N workers of a mount.

With ``-o workers=N`` any worker may answer any open, but the kernel's pages of an inode are
one cache: whether an open may keep them (``keep_cache``) or fill them (notify-store) depends
on what every worker answered before (``shardfs.kernel.inodes.KernelInodes``, which one worker
keeps in dicts). This table holds that knowledge where every worker reads and writes it: a
``memfd`` the supervisor makes and keeps for the mount's life (``memory``: its number given to
each worker in ``SHARDFS_PAGES_FD``), mapped shared by each worker, locked with ``flock`` on an
open file of each worker's own (``/proc/self/fd``: a lock dies with its holder, whatever kills it).

Layout: a header (``HEADER`` bytes: magic, capacity, the slot being written, pins in all), then
``capacity`` entries of ``ENTRY`` bytes, open addressing keyed by inode (a chunk's consecutive
inodes land in consecutive entries: a few pages of memory for thousands of chunk files): an
``Entry``, then (at ``LOOKUPS``) the lookups the kernel holds of the inode from every worker's
replies (``shardfs.kernel.sharedpages.SharedInodes.kernel_forgot``), then (at ``PINNED_AT``) the
version its pins pin (``pinned``). An
entry is never removed (it is the memory of pages the kernel may still hold); an inode that finds
no entry within ``PROBES`` of its home is ``None`` to the callers, which then answer as if the
kernel held pages of another version (no keep, no fill, direct I/O: always correct). After the
entries, ``HANDLES`` places of open files' handles (direct-mapped on the handle's number): where
the file of each is counted (``note_handle``), so that the worker that serves its RELEASE,
whichever it is, uncounts it at once (``take_handle``); a handle whose place another holds is
uncounted by its opener, when it learns of the release (``shardfs.kernel.reopen``: up to
``FOLLOW_S`` later, opens of another version meanwhile reading with direct I/O).

A worker killed while it writes an entry or a handle's place may leave it torn: each write names
it in the header first (``dirty``), and whoever takes the lock next finds the name and *poisons*
the entry (``POISONED``: its pages are another version's and its files read with direct I/O, for
the mount's life: a few chunk files, at worst, lose the page cache) or forgets the handle (its
file stays counted, as a dead worker's).
"""

from __future__ import annotations

import fcntl
import os
import struct
from typing import NamedTuple

from shardfs.base import memtables

# "SPG4"; a worker refuses another's table (SPG3: the readers' version pinned; SPG2: no handles;
# SPG1: entries of 64 bytes)
MAGIC = 0x53504734
HEADER = 64
ENTRY = 128
CAPACITY = 1 << 20  # entries (128 MiB of address space; memory only for the pages touched)
PROBES = 64  # entries looked at from an inode's home before it counts as absent
OFFSETS = 1 << 16  # entries a worker remembers the place of (``find``)
HANDLES = 1 << 16  # places of handles whose counts any worker lets go of (``note_handle``)
_HANDLE = struct.Struct("<QII")  # fh, its entry's offset, what was counted (``READER``, ``PINNED``) | generation << 2
READER, PINNED = 1, 2  # (``note_handle``)
GEN_MASK = 0x3FFFFFFF  # the bits of a pin's generation a handle's place keeps
_HEAD = struct.Struct("<IIQQ")  # magic, capacity, dirty (offset of the entry being written, 0: none), pins
_ENTRY = struct.Struct("<QIIQqQqIIII")  # see ``Entry``
_INO = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")  # (the header's dirty, at ``_DIRTY_AT``; its pins, at ``_PINS_AT``)
_DIRTY_AT, _PINS_AT = 8, 16
_VERSION = struct.Struct("<IIQq")  # state, mark, size, mtime
_READERS = struct.Struct("<QqI")  # rsize, rmtime, readers
# offsets of an entry's fields (``Entry``): one aligned word is written whole, never torn
STATE, MARK, SIZE, RSIZE, READERS, PINS, GEN, CHANGES = 8, 12, 16, 32, 48, 52, 56, 60
LOOKUPS = 64  # (after the ``Entry``: a new entry's is 0, as the memfd's bytes start)
PINNED_AT = 72  # (``pinned``)
_PINNED = struct.Struct("<Qq")  # size, mtime

# ``Entry.state``: what the kernel's pages of the inode may hold
NONE = 0  # nothing, ever
VERSION = 1  # at most pages of version (size, mtime)
UNKNOWN = 2  # maybe pages of any version (or bytes written in place)
DROPPING = 3  # a worker drops them (``mark``: which drop)
POISONED = 4  # a torn entry: as UNKNOWN, and every file of it read with direct I/O


class Entry(NamedTuple):
    """One inode's entry: what its pages hold (``state``, ``mark``, ``size``/``mtime``) and the
    files open on it through the page cache: ``readers`` of version (``rsize``, ``rmtime``),
    ``pins``: files pinning its size (``shardfs.kernel.pins``; ``gen`` counts the forfeits),
    ``changes`` made to it (``KernelInodes.watch``)."""

    ino: int
    state: int
    mark: int
    size: int
    mtime: int
    rsize: int
    rmtime: int
    readers: int
    pins: int
    gen: int
    changes: int


def memory() -> int:
    """A new table (a memfd, close-on-exec, sized and empty): the supervisor's to keep and give."""
    return memtables.make("shardfs-pages", _HEAD.pack(MAGIC, CAPACITY, 0, 0), CAPACITY, ENTRY, HEADER,
                          HANDLES * _HANDLE.size)


class PageTable:
    """A worker's view of its mount's table (the memfd ``fd``, which it may close afterwards)."""

    def __init__(self, fd: int) -> None:
        self._lock_fd, self._map, self.capacity = memtables.attach(fd, MAGIC, ENTRY, HEADER, "page table",
                                                                   HANDLES * _HANDLE.size)
        self._mask = self.capacity - 1
        self._handles_at = HEADER + self.capacity * ENTRY
        self._depth = 0
        self._offsets: dict[int, int] = {}  # inode -> its entry (``find``)

    def close(self) -> None:
        self._map.close()
        os.close(self._lock_fd)

    def locked(self) -> "PageTable":
        """Hold the table's lock (``with table.locked():``; re-entrant within this worker: one
        ``flock`` pair for a whole open's decisions). Never across an ``await``: every worker's
        opens wait for it; never while taking the ledger's (``shardfs.tree.ledger``), which is
        held while taking this one (a ledger followed under its lock lets go of released files).
        The table is that context manager itself: ``with table:`` is the same, a call cheaper."""
        return self

    def __enter__(self) -> None:
        if self._depth:
            self._depth += 1
            return
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        self._depth = 1
        dirty = _U64.unpack_from(self._map, _DIRTY_AT)[0]
        if dirty:  # a worker died writing it
            self._poison(dirty)

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if not self._depth:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def find(self, ino: int, insert: bool = False) -> int:
        """The offset of ``ino``'s entry; with ``insert`` (under the lock) a new one if it has none;
        -1 if it has none (or none can be made: the entries near its home are taken). An inode
        without an entry costs one probe (its home is empty: entries are never removed)."""
        off = self._offsets.get(ino, -1)
        if off >= 0:
            return off
        mask, unpack, table = self._mask, _INO.unpack_from, self._map
        home = (ino + (ino >> 40) * 0x9E3779B97F4A7C15) & mask  # (a chunk's inodes: consecutive entries)
        for i in range(PROBES):
            off = HEADER + ((home + i) & mask) * ENTRY
            at = unpack(table, off)[0]
            if at == ino:
                return self._found(ino, off)
            if at == 0:
                if not insert:
                    return -1
                assert self._depth
                self.write(off, Entry(ino, NONE, 0, 0, 0, 0, 0, 0, 0, 0, 0))
                return self._found(ino, off)
        return -1

    def _found(self, ino: int, off: int) -> int:
        """Remember where ``ino``'s entry is (an entry never moves): at most ``OFFSETS`` of them."""
        if len(self._offsets) >= OFFSETS:
            self._offsets.clear()
        self._offsets[ino] = off
        return off

    def read(self, off: int) -> Entry:
        return Entry._make(_ENTRY.unpack_from(self._map, off))

    def fields(self, off: int) -> tuple[int, ...]:
        """The entry at ``off`` as a plain tuple (``Entry``'s order; cheaper than ``read``)."""
        return _ENTRY.unpack_from(self._map, off)

    def write(self, off: int, entry: Entry) -> None:
        """Replace the entry at ``off`` (under the lock)."""
        assert self._depth
        table = self._map
        _U64.pack_into(table, _DIRTY_AT, off)
        _ENTRY.pack_into(table, off, *entry)
        _U64.pack_into(table, _DIRTY_AT, 0)

    def word(self, off: int, field: int) -> int:
        """One 32-bit field of the entry at ``off`` (``STATE``, ``READERS`` ...: never torn)."""
        return int(_U32.unpack_from(self._map, off + field)[0])

    def set_word(self, off: int, field: int, value: int) -> None:
        """Set one 32-bit field (under the lock; a single aligned store: nothing to tear)."""
        assert self._depth
        _U32.pack_into(self._map, off + field, value & 0xFFFFFFFF)

    def version(self, off: int) -> tuple[int, int, int, int]:
        """(state, mark, size, mtime) of the entry at ``off``."""
        return _VERSION.unpack_from(self._map, off + STATE)

    def set_version(self, off: int, state: int, mark: int, size: int, mtime: int) -> None:
        """Set what the pages hold (under the lock; named in the header while written)."""
        assert self._depth
        table = self._map
        _U64.pack_into(table, _DIRTY_AT, off)
        _VERSION.pack_into(table, off + STATE, state, mark, size, mtime)
        _U64.pack_into(table, _DIRTY_AT, 0)

    def readers(self, off: int) -> tuple[int, int, int]:
        """(rsize, rmtime, readers) of the entry at ``off``."""
        return _READERS.unpack_from(self._map, off + RSIZE)

    def set_readers(self, off: int, rsize: int, rmtime: int, readers: int) -> None:
        """Set the version read through the pages and how many files read it (under the lock)."""
        assert self._depth
        table = self._map
        _U64.pack_into(table, _DIRTY_AT, off)
        _READERS.pack_into(table, off + RSIZE, rsize, rmtime, readers)
        _U64.pack_into(table, _DIRTY_AT, 0)

    def pinned(self, off: int) -> tuple[int, int]:
        """(size, mtime) that the pins of the entry at ``off`` pin (its first pin's since it had
        none); meaningless while it has none."""
        return _PINNED.unpack_from(self._map, off + PINNED_AT)

    def set_pinned(self, off: int, size: int, mtime: int) -> None:
        """Set the version pinned (under the lock, before the pin that makes it is counted)."""
        assert self._depth
        table = self._map
        _U64.pack_into(table, _DIRTY_AT, off)
        _PINNED.pack_into(table, off + PINNED_AT, size, mtime)
        _U64.pack_into(table, _DIRTY_AT, 0)

    def changes(self, ino: int) -> int:
        """The changes counted for ``ino`` (read without the lock: one aligned word); 0 if it has
        no entry (as a new entry starts)."""
        off = self.find(ino)
        return 0 if off < 0 else _U32.unpack_from(self._map, off + CHANGES)[0]

    def pins(self) -> int:
        """Files pinning an inode's size, in all (read without the lock)."""
        return int(_U64.unpack_from(self._map, _PINS_AT)[0])

    def add_pins(self, n: int) -> None:
        """``n`` more (or fewer) files pinning an inode's size (under the lock)."""
        assert self._depth
        pins = _U64.unpack_from(self._map, _PINS_AT)[0]
        _U64.pack_into(self._map, _PINS_AT, max(0, pins + n))

    def note_handle(self, fh: int, off: int, what: int, gen: int = 0) -> bool:
        """Note (under the lock) that the file of handle ``fh`` is counted in the entry at ``off``
        (``what``: ``READER``; or ``PINNED``, at the entry's forfeits ``gen``), so that whichever
        worker serves its release lets go of that at once (``take_handle``); False if the place
        of ``fh`` holds another handle's (the caller keeps it itself, let go of by its opener)."""
        assert self._depth
        at = self._handle_at(fh)
        held, held_off, flags = _HANDLE.unpack_from(self._map, at)
        if fh <= 0 or held not in (0, fh) or (held == fh and held_off != off):
            return False
        flags = flags | READER if what == READER else (flags & READER) | PINNED | (gen & GEN_MASK) << 2
        self._put_handle(at, fh, off, flags)
        return True

    def noted(self, fh: int, what: int) -> bool:
        """Whether handle ``fh``'s place notes ``what`` of it (read without the lock: once its
        opener noted it, only a ``take_handle`` of ``fh`` changes that place, so a False is final,
        whatever write it met; its opener's release after the worker that served it let go of
        ``what`` then takes no lock)."""
        held, _off, flags = _HANDLE.unpack_from(self._map, self._handle_at(fh))
        return fh > 0 and held == fh and bool(flags & what)

    def take_handle(self, fh: int, what: int) -> tuple[int, int] | None:
        """(Under the lock) the entry's offset and the generation ``note_handle`` noted for ``fh``
        and ``what``, which is no longer noted; None if it is not (or no longer)."""
        assert self._depth
        at = self._handle_at(fh)
        held, off, flags = _HANDLE.unpack_from(self._map, at)
        if fh <= 0 or held != fh or not flags & what:
            return None
        rest = flags & ~READER if what == READER else flags & READER
        self._put_handle(at, fh if rest else 0, off if rest else 0, rest)
        return off, flags >> 2

    def _handle_at(self, fh: int) -> int:
        """Where the place of handle ``fh`` is (direct-mapped on its number)."""
        return self._handles_at + (fh & (HANDLES - 1)) * _HANDLE.size

    def _put_handle(self, at: int, fh: int, off: int, flags: int) -> None:
        table = self._map
        _U64.pack_into(table, _DIRTY_AT, at)
        _HANDLE.pack_into(table, at, fh, off, flags)
        _U64.pack_into(table, _DIRTY_AT, 0)

    def _poison(self, off: int) -> None:
        if off >= self._handles_at:  # (a handle's place: forgotten, its counts stay, as a dead worker's)
            _HANDLE.pack_into(self._map, off, 0, 0, 0)
            _U64.pack_into(self._map, _DIRTY_AT, 0)
            return
        e = self.read(off)
        ino = e.ino if self.find(e.ino) == off else 0  # (a torn inode number: the entry is nobody's)
        _U64.pack_into(self._map, _DIRTY_AT, 0)
        if ino:
            _ENTRY.pack_into(self._map, off, ino, POISONED, 0, 0, 0, 0, 0, 1, 0, 0, e.changes + 1)
