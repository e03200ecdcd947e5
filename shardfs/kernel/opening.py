"""An open for reading as the kernel needs it: the handle, the version it reads, and the
kernel's page cache of its inode (dropped if it holds another version's pages, filled at once
if it holds none and the file is small).

``Opening.read_open`` is ``Opens.open`` (``shardfs.tree.opens``) with what the adapter's ``open``
answers from (``KernelInodes``: which pages the kernel may hold of which version); ``fill``
stores a small file's bytes into the page cache before the open is answered (FUSE's
notify-store), so a client's reads of it cost no READ request. With ``-o workers=N`` the same,
from the mount's shared table (``shardfs.kernel.sharedpages``); N workers of a supervisor that
gives none fill and drop nothing: files are opened with direct I/O (``shardfs.kernel.fuse_ops``).
"""

from __future__ import annotations

import errno
import logging
from typing import Callable

import pyfuse3
import trio

from shardfs.base.attrs import Attr
from shardfs.kernel.inodes import KernelInodes, Pages
from shardfs.kernel.invalidation import invalidate_inodes
from shardfs.kernel.stats import RequestStats
from shardfs.reads import ReadHandle
from shardfs.tree.ledger import Ledger
from shardfs.tree.opens import Opens
from shardfs.tree.tries import Tries

log = logging.getLogger("shardfs")
FILL_MAX = 1 << 20  # files up to this size are stored into the page cache when opened (see fill)
Content = bytes | bytearray | memoryview


def kernel_attr(handle: ReadHandle) -> Attr:
    """The attributes of the version ``handle`` was opened at, with the inode the kernel knows its
    file by (an alias while a rename made its name show another: ``NodeTable``); without a
    ``_replace`` when they are the same (2.5 us each, twice a chunk file)."""
    attr = handle.attr
    return attr if attr.ino == handle.ino else attr._replace(ino=handle.ino)


class Opening:
    """The opens for reading of one mount: its tree's ``opens``, what the kernel holds
    (``inodes``), the bytes stored into its pages counted in ``stats`` as read."""

    def __init__(self, opens: Opens, inodes: KernelInodes, ledger: Ledger, stats: RequestStats) -> None:
        self.opens = opens
        self._kernel = inodes
        self._ledger = ledger  # (``shared``: read at every open)
        self.stats = stats
        self._fill = True  # until the kernel says it cannot store pages (ENOSYS)

    @property
    def cached(self) -> bool:
        """True if files are read through the kernel's page cache: one worker, or N sharing what
        the pages hold (else N workers open every file with direct I/O)."""
        return self._kernel.shared_pages or not self._ledger.shared

    async def read_open(self, inode: int, tries: Tries, refused: Callable[[int, Attr], bool]
                        ) -> tuple[ReadHandle, Attr, Content | None, bool]:
        """``Opens.open(inode, tries)`` with what ``open`` answers from: the handle, its version (the
        attributes with the kernel's inode), the content to fill the pages with (or None), and
        whether the file changed while this ran (``KernelInodes.unwatch``). The kernel's pages
        of another version are dropped first (``KernelInodes.dropping``), unless the open is
        ``refused(inode, version)`` (ESTALE: the pages are the files pinning the inode's)."""
        seen = self._kernel.watch(inode)
        try:
            handle = await self.opens.open(inode, tries)
            # The pages are the kernel inode's: a chunk's name that a rename made show another inode
            # (an alias, see NodeTable) has pages of its own, maybe being written in place right now.
            version = kernel_attr(handle)
            try:
                if refused(inode, version):  # (the kernel looks the name up again: another inode)
                    raise pyfuse3.FUSEError(errno.ESTALE)
                pages = self._kernel.pages(version)
                content = await self._content_to_fill(handle, pages)
                if pages is Pages.OTHER and self.cached:
                    mark = self._kernel.dropping(handle.ino)
                    await trio.to_thread.run_sync(invalidate_inodes, [handle.ino])
                    self._kernel.dropped(version, mark)
            except BaseException:
                self.opens.release(handle)
                raise
        finally:
            stale = self._kernel.unwatch(inode, seen)
        return handle, version, content, stale

    async def _content_to_fill(self, handle: ReadHandle, pages: Pages) -> Content | None:
        """The whole content of a small file being opened whose pages the kernel has never held
        (``pages``: ``KernelInodes.pages`` of its version with the kernel's inode), to store into
        its page cache (``fill``); else None. The client's reads are then served by the
        kernel, without a READ request each."""
        size = handle.attr.size
        if not (pages is Pages.NONE and self._fill and 0 < size <= FILL_MAX and self.cached):
            return None
        content = await self.opens.read(handle, 0, size)
        return content if len(content) == size else None

    async def ask_size_again(self, ino: int) -> None:
        """The kernel drops its attributes of ``ino`` (its pages are kept): its next ``fstat`` or
        read past the size it holds asks for them (a getattr: ``Pins.frozen``)."""
        await trio.to_thread.run_sync(invalidate_inodes, [ino], True)

    def fill(self, ino: int, content: Content) -> None:
        """Store ``content`` (a view of a buffer the next read may reuse: no ``await`` since it
        was read) into the page cache of ``ino``, which holds none of it. Called before the open
        is answered, and without an ``await`` since ``opened`` said ``Pages.NONE``, so no client
        can be reading the file meanwhile (the kernel would hold its pages locked)."""
        try:
            pyfuse3.notify_store(ino, 0, content)  # type: ignore[arg-type]  # any buffer (stub: bytes); no copy
            self.stats.read_bytes += len(content)
        except OSError as e:  # what was stored is still this version's: the pages are kept
            if e.errno == errno.ENOSYS:
                self._fill = False
            log.debug("filling the page cache of inode %d: %s", ino, e.strerror)
