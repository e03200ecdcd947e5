"""Handles this worker did not open: a dead worker's (its successor in the slot: the ledger it
left), or with ``-o workers=N`` (a shared ledger) another worker's (a request on a handle goes
to the worker that opened it, ``shardfs.kernel.route``: what reaches here of another worker's
is a request that is not routed, or one on a handle of a dead slot).

Contract: ``live(fh)`` is the handle a request names, ready to serve it here. A handle this
worker opened is returned as it is. A ``Lost`` one (``handles.Handles``: restored from a dead
worker's ledger, or followed from another worker's records) is opened again at its first use:
a directory lists afresh; a file opened for writing is opened again unless bytes written
through it lived only in the dead worker's memory (EIO, at every use); a read handle another
(live) worker opened is opened again at the version its record names, and if its chunk changed
or is gone since, ``Elsewhere`` (its opener serves it: never another version's bytes); one the
dead worker of this slot opened, at the current version (as a restarted worker's: a pending
chunk taken over from the journal has a new mtime). No handle number is known here: EBADF.

``follow`` reads what the other workers appended to the shared ledger (numbers they gave the
kernel, handles they opened and released) and lets go of the handles released elsewhere
(``let_go``, the adapter's); ``following`` does so every ``FOLLOW_S`` seconds; ``restore``
takes over the numbers a dead worker gave the kernel.
"""

from __future__ import annotations

import errno
import logging
from typing import Any, Awaitable, Callable

import pyfuse3
import trio

from shardfs.kernel.handles import DirHandle, Handle, Handles, Lost
from shardfs.kernel.inodes import KernelInodes
from shardfs.reads import ReadHandle
from shardfs.tree.ledger import Ledger
from shardfs.tree.listing import DirStream, Listing
from shardfs.tree.numbers import Numbers
from shardfs.tree.opens import Opens
from shardfs.tree.writer import Writer

log = logging.getLogger("shardfs")
FOLLOW_S = 0.5  # seconds between looks at what other workers appended to a shared ledger


class Elsewhere(Exception):
    """A read handle another (live) worker opened whose file changed since: that worker serves
    it (``shardfs.kernel.route``)."""


class Reopen:
    """The handles of ``handles`` made live in this worker (see the module docstring)."""

    def __init__(self, handles: Handles, numbers: Numbers, ledger: Ledger, listing: Listing, opens: Opens,
                 inodes: KernelInodes, writable: Callable[[], Writer],
                 let_go: Callable[[int, Handle | None], None]) -> None:
        """``writable()``: the writer a write handle is opened again with (EROFS without one);
        ``let_go(fh, handle)``: what a handle released by another worker held is let go of."""
        self._handles = handles
        self.numbers = numbers
        self._ledger = ledger
        self._listing = listing
        self._opens = opens
        self._kernel = inodes
        self._writable = writable
        self._let_go = let_go
        ledger.followers.append(self._follow_handles)

    @property
    def shared(self) -> bool:
        """True when other workers serve the same connection (``-o workers=N``)."""
        return self._ledger.shared

    async def follow(self) -> bool:
        """``Numbers.follow``: what the other workers gave out; True if that taught a number."""
        return await self.numbers.follow()

    async def following(self, next_request: Callable[[], Awaitable[None]] | None = None) -> None:
        """Follow the shared ledger every ``FOLLOW_S`` seconds (handles released elsewhere are
        let go of even when no request here names anything new) while this worker holds handles;
        holding none (nothing of its own another worker could release), it waits for its next
        request (``next_request``) instead: no timer wakes a worker of an idle mount."""
        while True:
            await trio.sleep(FOLLOW_S)
            await self.follow()
            if next_request is not None and not self._handles.held():
                await next_request()

    def _follow_handles(self, records: list[list[Any]]) -> None:
        for fh, handle in self._handles.follow(records):
            self._let_go(fh, handle)

    def here(self, fh: int) -> int | None:
        """The inode of read handle ``fh`` of another (live) worker if a request on it may be
        served here: it was opened again here, or can be at the version it was opened at
        (``live``); else None."""
        handle = self._handles.get(fh)
        if handle is None and self.shared:
            self._ledger.catch_up()  # opened by another worker a moment ago
            handle = self._handles.get(fh)
        if isinstance(handle, ReadHandle):
            return handle.ino
        if isinstance(handle, Lost) and handle.kind == "r" and handle.version is not None and not handle.elsewhere:
            return handle.ino
        return None

    async def live(self, fh: int) -> Handle:
        """Handle ``fh``, opened again here first if it is a ``Lost`` one (the module docstring)."""
        handle = self._handles.get(fh)
        if handle is None and self.shared:
            await self.follow()  # opened by another worker a moment ago
            handle = self._handles.get(fh)
        if handle is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        if not isinstance(handle, Lost):
            return handle
        new: Handle
        if handle.kind == "d":
            new = DirHandle(handle.ino, DirStream(self._listing, handle.ino))
        elif handle.dirty:
            log.error("file handle %d (inode %d): bytes written through it were lost with a worker: EIO", fh,
                      handle.ino)
            raise pyfuse3.FUSEError(errno.EIO)
        else:
            try:
                new = await (self._opens.open(handle.ino) if handle.kind == "r"
                             else self._writable().open(handle.ino, truncate=False))
            except OSError as e:  # its file is gone (a staging file lived in the dead worker's memory)
                if self._kept_elsewhere(fh, handle):  # (its chunk removed since: its opener still reads it)
                    handle.elsewhere = True
                    raise Elsewhere(fh) from None
                log.error("file handle %d (inode %d): cannot open it again: %s: EIO", fh, handle.ino, e.strerror)
                raise pyfuse3.FUSEError(errno.EIO) from None
            # (a handle this slot's dead worker opened is opened again as a restarted worker's is,
            # at the current version: a pending chunk taken over from the journal has a new mtime)
            if isinstance(new, ReadHandle) and self._kept_elsewhere(fh, handle) \
                    and (new.attr.size, new.attr.mtime_ns) != handle.version:
                self._opens.release(new)
                handle.elsewhere = True  # (never another version's bytes: its opener serves it)
                raise Elsewhere(fh)
        self._handles.reopened(fh, new)
        return new

    def _kept_elsewhere(self, fh: int, handle: Lost) -> bool:
        """True if ``handle`` (``fh``) is a read handle another live worker opened at a version it
        noted: that worker still reads that version, whatever the chunk became since."""
        return handle.kind == "r" and handle.version is not None and not self._ledger.mine(fh)

    async def restore(self, records: list[list[Any]]) -> None:
        """Take over the numbers a dead worker gave the kernel (its ledger's ``records``: see
        ``shardfs.tree.ledger``): the arrays' slots, the inodes, the open handles. A worker of
        a shared ledger takes what every worker gave out so far (``records``: its ``tail``)."""
        await self.numbers.restore(records)
        self._handles.restore(records)
        if not self.shared:  # (N workers: the pages are the mount's table, kept by the supervisor)
            self._kernel.restored()
