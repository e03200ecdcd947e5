"""The table of open file and directory handles, by the ``fh`` number the kernel is given.

Each handle opened and released is noted in the mount's ``Ledger`` (``shardfs.tree.ledger``):
a worker serving the connection after this one died finds every handle the kernel still holds
(``restore``) as a ``Lost`` one, which the adapter opens again at its first use, or fails with
EIO if the dead worker's memory held bytes written through it (``dirtied``).

With ``-o workers=N`` (a shared ledger) worker ``i`` gives out the numbers ``k*N + i + 1``, so
the worker that opened a handle is known from its number (``Ledger.owner``); a READ or RELEASE
may reach any worker: each follows the others' ``h`` and ``x`` records (``follow``), keeps the
handles they opened as ``Lost`` ones (opened again at their first use here, at the version the
record names) and lets go of its own handles, or of those it opened again, that another worker
released."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from typing import Any, Iterable, Iterator

from shardfs.tree.ledger import Ledger
from shardfs.tree.listing import DirStream
from shardfs.tree.nodes import Staging
from shardfs.reads import ReadHandle
from shardfs.tree.writer import WriteHandle


@dataclass
class DirHandle:
    """An open directory: its listing, made a page at a time as readdir consumes it."""

    ino: int
    stream: DirStream


@dataclass
class Lost:
    """A handle a dead worker opened (``Handles.restore``): ``kind`` ``r`` (read), ``w``
    (write) or ``d`` (directory); ``dirty``: bytes written through it were in its memory only."""

    ino: int
    kind: str
    dirty: bool = False
    version: tuple[int, int] | None = None  # (size, mtime_ns) a read handle was opened at, if noted
    elsewhere: bool = False  # its file changed since: only the worker that opened it serves it
    made_by: int = 0  # the kernel's number of the request that made it, if noted (``Handles.made_by``)


def _lost(rec: list[Any]) -> Lost:
    """The ``Lost`` handle an ``h`` record names: ``["h", fh, ino, kind]``, then the size and
    mtime of a read handle's version (a shared ledger), then the number of the request that
    made it (when known): 4 to 7 fields."""
    return Lost(rec[2], rec[3], version=(rec[4], rec[5]) if len(rec) >= 6 else None,
                made_by=rec[-1] if len(rec) in (5, 7) else 0)


Handle = ReadHandle | WriteHandle | DirHandle | Lost


def _kind(handle: Handle) -> str:
    return "d" if isinstance(handle, DirHandle) else "w" if isinstance(handle, WriteHandle) else "r"


class Handles:
    """Open handles by ``fh`` (numbers are never reused while the mount's connection lives)."""

    def __init__(self, ledger: Ledger | None = None) -> None:
        self._open: dict[int, Handle] = {}
        self._ledger = ledger or Ledger()
        self._next = self._numbers(0)
        self._frame: tuple[dict[int, int], set[int]] | None = None  # a compaction being read (``follow``)

    def _numbers(self, last: int) -> Iterator[int]:
        """The numbers this worker gives out after ``last`` (its residue: see the module docstring)."""
        n, i = self._ledger.count, self._ledger.index
        first = last + 1 + (i - last) % n
        return itertools.count(first, n)

    def add(self, handle: Handle, unique: int = 0) -> int:
        """Register ``handle``, made by the kernel's request number ``unique`` (0: not known);
        its new ``fh``."""
        fh = next(self._next)
        self._open[fh] = handle
        ledger = self._ledger
        if not ledger.kept:  # (an unsupervised mount: nothing to write)
            return fh
        ino, made = handle.ino, f",{unique}" if unique else ""
        if ledger.shared and isinstance(handle, ReadHandle):  # (ints: as json.dumps)
            ledger.note_line(f'["h",{fh},{ino},"r",{handle.attr.size},{handle.attr.mtime_ns}{made}]')
        else:  # (every open of a file: the record written as json.dumps would, 5x faster)
            ledger.note_line(f'["h",{fh},{ino},"{_kind(handle)}"{made}]')
        return fh

    def add_write(self, handle: WriteHandle, unique: int) -> int:
        """``add`` a handle open for writing, noted as holding bytes only this process keeps if it
        does (a truncating open, a staging file)."""
        fh = self.add(handle, unique)
        if handle.dirty or handle.staging is not None:
            self.dirtied(fh)
        return fh

    def dirtied(self, fh: int) -> None:
        """Handle ``fh`` holds written bytes that only this process's memory keeps."""
        self._ledger.note("w", fh)

    def committed(self) -> None:
        """Staging files were committed (renamed onto a chunk or metadata file): the handles
        still open on them hold no bytes only this process keeps (their next write is noted
        again: ``dirtied``)."""
        for fh, h in self._open.items():
            if isinstance(h, WriteHandle) and h.staging is not None and h.staging.committed is not None \
                    and not h.committed:
                h.committed, h.dirty = True, False
                self._ledger.note("c", fh)

    def reopened(self, fh: int, handle: Handle) -> None:
        """``handle`` replaces the ``Lost`` handle ``fh`` (opened again by the adapter)."""
        self._open[fh] = handle

    def restore(self, records: list[list[Any]]) -> None:
        """The handles a dead worker's ledger ``records`` leave open, as ``Lost`` ones; new
        numbers follow every one it gave out."""
        last = 0
        for rec in records:
            if rec[0] == "h" and len(rec) >= 4:
                last = max(last, rec[1])
                self._open[rec[1]] = _lost(rec)
            elif rec[0] == "x":
                last = max(last, rec[1])
                self._open.pop(rec[1], None)
            elif rec[0] in ("w", "c") and isinstance(self._open.get(rec[1]), Lost):
                self._open[rec[1]].dirty = rec[0] == "w"  # type: ignore[union-attr]  # a Lost one (checked)
        self._next = self._numbers(last)

    def follow(self, records: list[list[Any]]) -> list[tuple[int, Handle]]:
        """Take the ``h`` and ``x`` records other workers appended (a shared ledger): their
        handles become ``Lost`` ones here; the handles held here that another worker released
        are dropped and returned (to be let go of)."""
        gone: list[tuple[int, Handle]] = []
        mine = self._ledger.index
        for rec in records:
            if rec[0] == "z" and len(rec) >= 2 and isinstance(rec[1], dict):  # a compaction (``Ledger.compact``)
                self._frame = ({int(k): v for k, v in rec[1].items()}, set())
            elif rec[0] == "z." and self._frame is not None:
                gone += self._compacted(*self._frame)
                self._frame = None
            if rec[0] == "h" and len(rec) >= 4 and isinstance(rec[1], int):
                if self._frame is not None:
                    self._frame[1].add(rec[1])
                if self._ledger.owner(rec[1]) != mine and rec[1] not in self._open:
                    self._open[rec[1]] = _lost(rec)
            elif rec[0] == "x" and isinstance(rec[1], int):
                handle = self._open.pop(rec[1], None)
                if handle is not None and not isinstance(handle, Lost):
                    gone.append((rec[1], handle))
        return gone

    def _compacted(self, highest: dict[int, int], named: set[int]) -> list[tuple[int, Handle]]:
        """The handles a compaction's frame does not name though given before it (their releases
        were punched out): dropped, and those held here returned (to be let go of)."""
        gone: list[tuple[int, Handle]] = []
        for fh, handle in list(self._open.items()):
            if fh not in named and fh <= highest.get(self._ledger.owner(fh), 0):
                del self._open[fh]
                if not isinstance(handle, Lost):
                    gone.append((fh, handle))
        return gone

    def records(self) -> list[list[Any]]:
        """What ``restore`` needs of the handles open now, as ledger records."""
        out: list[list[Any]] = []
        for fh, h in self._open.items():
            out.append(["h", fh, h.ino, h.kind if isinstance(h, Lost) else _kind(h)])
            if (h.dirty if isinstance(h, (Lost, WriteHandle)) else False):
                out.append(["w", fh])
        return out

    def made_by(self, unique: int) -> tuple[bool, int] | None:
        """The handle a worker that died made for the kernel's request ``unique`` (a ``Lost`` one
        whose record names that request), as (a directory's?, ``fh``); None if there is none.
        Asked when the kernel sends that request again: that worker died before it answered
        (the kernel sends again only what no worker answered), so the kernel never learnt it."""
        return next(((h.kind == "d", fh) for fh, h in self._open.items()
                     if isinstance(h, Lost) and h.made_by == unique), None)

    def held(self) -> int:
        """Handles open here (not the ``Lost`` ones: a dead or another worker opened those)."""
        return sum(not isinstance(h, Lost) for h in self._open.values())

    def __getitem__(self, fh: int) -> Handle:
        return self._open[fh]

    def get(self, fh: int) -> Handle | None:
        return self._open.get(fh)

    def pop(self, fh: int) -> Handle | None:
        """Unregister ``fh`` (release); the handle, or None if there was none."""
        if self._ledger.kept:  # (``note("x", fh)``, faster: every release; lost with a death, harmless)
            self._ledger.note_later(f'["x",{fh}]')
        return self._open.pop(fh, None)

    def writes(self) -> list[WriteHandle]:
        """Every handle open for writing."""
        return [h for h in self._open.values() if isinstance(h, WriteHandle)]

    def spilled_bytes(self, staged: Iterable[Staging]) -> int:
        """Bytes held in spill files by the open files and the ``staged`` files (``shardfs status``)."""
        # (a handle opened for writing has no content until its first write or read: skipped)
        buffers = {id(b): b for b in (h.staging.data if h.staging is not None else h.buf
                                      for h in self.writes()) if b is not None}
        buffers.update((id(st.data), st.data) for st in staged)
        return sum(b.size for b in buffers.values() if b.spilled)

    def reading(self, ino: int) -> ReadHandle | None:
        """A handle open here for reading kernel inode ``ino``, if any."""
        return next((h for h in self._open.values() if isinstance(h, ReadHandle) and h.ino == ino), None)

    def read_elsewhere(self, ino: int) -> tuple[int, int] | None:
        """The version (size, mtime_ns) at which another worker holds a read handle of kernel
        inode ``ino`` open (its ``h`` record, followed after a catch-up of a shared ledger), if any."""
        self._ledger.catch_up()
        mine = self._ledger.index
        return next((h.version for fh, h in self._open.items() if isinstance(h, Lost) and h.kind == "r"
                     and h.ino == ino and h.version is not None and self._ledger.owner(fh) != mine), None)

    def dirty_write(self, ino: int) -> WriteHandle | None:
        """A handle with uncommitted writes to ``ino``, if any (its size is what stat shows)."""
        return next((h for h in self._open.values() if isinstance(h, WriteHandle) and h.ino == ino and h.dirty),
                    None)
