"""The table of open file and directory handles, by the ``fh`` number the kernel is given.

Each handle opened and released is noted in the mount's ``Ledger`` (``shardfs.tree.ledger``):
a worker serving the connection after this one died finds every handle the kernel still holds
(``restore``) as a ``Lost`` one, which the adapter opens again at its first use, or fails with
EIO if the dead worker's memory held bytes written through it (``dirtied``)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from typing import Any

from shardfs.tree.ledger import Ledger
from shardfs.tree.listing import DirStream
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


Handle = ReadHandle | WriteHandle | DirHandle | Lost


def _kind(handle: Handle) -> str:
    return "d" if isinstance(handle, DirHandle) else "w" if isinstance(handle, WriteHandle) else "r"


class Handles:
    """Open handles by ``fh`` (numbers are never reused while the mount's connection lives)."""

    def __init__(self, ledger: Ledger | None = None) -> None:
        self._open: dict[int, Handle] = {}
        self._next = itertools.count(1)
        self._ledger = ledger or Ledger()

    def add(self, handle: Handle) -> int:
        """Register ``handle``; its new ``fh``."""
        fh = next(self._next)
        self._open[fh] = handle
        ino = handle.ino
        self._ledger.note("h", fh, ino, _kind(handle))
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
            if rec[0] == "h" and len(rec) == 4:
                last = max(last, rec[1])
                self._open[rec[1]] = Lost(rec[2], rec[3])
            elif rec[0] == "x":
                self._open.pop(rec[1], None)
            elif rec[0] in ("w", "c") and isinstance(self._open.get(rec[1]), Lost):
                self._open[rec[1]].dirty = rec[0] == "w"  # type: ignore[union-attr]  # a Lost one (checked)
        self._next = itertools.count(last + 1)

    def records(self) -> list[list[Any]]:
        """What ``restore`` needs of the handles open now, as ledger records."""
        out: list[list[Any]] = []
        for fh, h in self._open.items():
            out.append(["h", fh, h.ino, h.kind if isinstance(h, Lost) else _kind(h)])
            if (h.dirty if isinstance(h, (Lost, WriteHandle)) else False):
                out.append(["w", fh])
        return out

    def __getitem__(self, fh: int) -> Handle:
        return self._open[fh]

    def get(self, fh: int) -> Handle | None:
        return self._open.get(fh)

    def pop(self, fh: int) -> Handle | None:
        """Unregister ``fh`` (release); the handle, or None if there was none."""
        self._ledger.note("x", fh)
        return self._open.pop(fh, None)

    def writes(self) -> list[WriteHandle]:
        """Every handle open for writing."""
        return [h for h in self._open.values() if isinstance(h, WriteHandle)]

    def dirty_write(self, ino: int) -> WriteHandle | None:
        """A handle with uncommitted writes to ``ino``, if any (its size is what stat shows)."""
        return next((h for h in self._open.values() if isinstance(h, WriteHandle) and h.ino == ino and h.dirty),
                    None)
