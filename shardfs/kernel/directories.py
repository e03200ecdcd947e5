"""Open directories and their listings as the kernel takes them: OPENDIR, READDIR and
RELEASEDIR (``Operations``' handlers), and with ``-o workers=N`` a READDIR another worker
forwards here (``entries``, then ``counted``: ``shardfs.kernel.forward.PeerLink.request``).

A listing comes a page at a time (``shardfs.tree.listing.DirStream``); offset 0 lists afresh.
Each entry shows the inode ``Pins.entry`` says (an alias while files opened on another size of
a chunk hold its own), and each one the kernel takes is one lookup of that inode
(``KernelInodes.looked_up``), counted by the worker that listed it.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

import pyfuse3

from shardfs.kernel.entries import ReplyEntry
from shardfs.kernel.forward import encode
from shardfs.kernel.handles import DirHandle, Handles
from shardfs.kernel.inodes import KernelInodes
from shardfs.kernel.pins import Pins
from shardfs.kernel.reopen import Reopen
from shardfs.tree.listing import DirStream, Listing
from shardfs.tree.names import Names



class Directories:
    """The open directories of one mount (see the module docstring): the tree's ``names`` and
    ``listing``, the adapter's ``handles`` (made live by ``reopen``: a handle another or a dead
    worker opened), what the kernel holds (``inodes``), the ``pins`` and the ``entry`` a reply
    shows."""

    def __init__(self, names: Names, listing: Listing, handles: Handles, reopen: Reopen, inodes: KernelInodes,
                 pins: Pins, entry: ReplyEntry) -> None:
        self.names = names
        self.listing = listing
        self._handles = handles
        self.reopen = reopen
        self._kernel = inodes
        self._pins = pins
        self._entry = entry

    async def open(self, inode: int, unique: int) -> int:
        """OPENDIR (the kernel's request number ``unique``): the ``fh`` of directory ``inode``,
        listed as READDIR asks."""
        await self.names.getattr(inode)
        return self._handles.add(DirHandle(inode, DirStream(self.listing, inode)), unique)

    async def reply(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        """READDIR: entries from offset ``start_id`` on, until the kernel's buffer is full; each
        a lookup the kernel holds once it takes the reply (counted before it is sent)."""
        stream = await self._listing_of(fh, start_id)
        taken: list[int] = []
        await self._fill(stream, start_id, token, taken)
        self._kernel.looked_up_all(taken)

    async def _fill(self, stream: DirStream, offset: int, token: pyfuse3.ReaddirToken, taken: list[int]) -> None:
        """Add the entries from ``offset`` on to the reply until the kernel's buffer is full,
        their inodes to ``taken``."""
        e = None
        while True:
            page, i = await stream.at(offset)
            if not page:
                return
            pinned = bool(self._pins)
            for name, attr in itertools.islice(page, i, None):
                if pinned:
                    attr = self._pins.entry(attr)
                e = self._entry(attr, e)
                if not pyfuse3.readdir_reply(token, os.fsencode(name), e, offset + 1):
                    return
                taken.append(attr.ino)
                offset += 1

    def counted(self, inodes: list[int]) -> None:
        """The kernel took these entries this worker listed for another (a READDIR it forwarded):
        one lookup each, counted here as a forwarded LOOKUP's is."""
        self._kernel.looked_up_all(inodes)

    async def entries(self, fh: int, start_id: int, limit: int) -> list[tuple[bytes, Any]]:
        """Up to ``limit`` entries of directory handle ``fh`` from offset ``start_id`` (0: afresh),
        as (name, the entry's fields): what a worker forwarding a READDIR replies with."""
        stream = await self._listing_of(fh, start_id)
        out: list[tuple[bytes, Any]] = []
        while len(out) < limit:
            page, i = await stream.at(start_id + len(out))
            if not page:
                break
            for name, attr in itertools.islice(page, i, i + limit - len(out)):
                out.append((os.fsencode(name), encode(self._entry(self._pins.entry(attr)))[1]))
        return out

    async def release(self, fh: int) -> None:
        """RELEASEDIR."""
        handle = self._handles.pop(fh)
        if isinstance(handle, DirHandle):
            await handle.stream.aclose()

    async def _listing_of(self, fh: int, start_id: int) -> DirStream:
        """Directory handle ``fh``'s listing, rewound if ``start_id`` is 0 (listed afresh)."""
        handle = await self.reopen.live(fh)
        assert isinstance(handle, DirHandle)  # the kernel sends READDIR with directory handles only
        if start_id == 0:
            await handle.stream.rewind()
        return handle.stream
