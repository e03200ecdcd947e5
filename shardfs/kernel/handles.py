"""The table of open file and directory handles, by the ``fh`` number the kernel is given."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from shardfs.tree.listing import DirStream
from shardfs.reads import ReadHandle
from shardfs.tree.writer import WriteHandle


@dataclass
class DirHandle:
    """An open directory: its listing, made a page at a time as readdir consumes it."""

    ino: int
    stream: DirStream


Handle = ReadHandle | WriteHandle | DirHandle


class Handles:
    """Open handles by ``fh`` (numbers are never reused while the mount lives)."""

    def __init__(self) -> None:
        self._open: dict[int, Handle] = {}
        self._next = itertools.count(1)

    def add(self, handle: Handle) -> int:
        """Register ``handle``; its new ``fh``."""
        fh = next(self._next)
        self._open[fh] = handle
        return fh

    def __getitem__(self, fh: int) -> Handle:
        return self._open[fh]

    def get(self, fh: int) -> Handle | None:
        return self._open.get(fh)

    def pop(self, fh: int) -> Handle | None:
        """Unregister ``fh`` (release); the handle, or None if there was none."""
        return self._open.pop(fh, None)

    def writes(self) -> list[WriteHandle]:
        """Every handle open for writing."""
        return [h for h in self._open.values() if isinstance(h, WriteHandle)]

    def dirty_write(self, ino: int) -> WriteHandle | None:
        """A handle with uncommitted writes to ``ino``, if any (its size is what stat shows)."""
        return next((h for h in self._open.values() if isinstance(h, WriteHandle) and h.ino == ino and h.dirty),
                    None)
