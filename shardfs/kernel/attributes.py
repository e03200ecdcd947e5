"""What a GETATTR answers (``Operations.getattr``, and the ``setattr`` that ends with one).

The attributes the kernel is told of an inode are the tree's (``Names.getattr``) but for:
- a file with uncommitted writes through a handle open here: its written size
  (``Writer.dirty_attr``);
- a chunk file that no longer exists: ESTALE, not ENOENT (``attr``), so the kernel looks its name
  up again; and if a file opened here (or through another worker) still reads it, that file's
  version, asked again at once (the inode remembered in ``shown_gone``: the unlink of its name
  then succeeds, as that answer said it could, ``Operations.unlink``);
- an alias inode (a temporary renamed onto a chunk, see ``NodeTable``): its own number;
- an inode that files open through the page cache hold at another size (``Pins.frozen``): that
  size, asked again as soon as those files are closed.
"""

from __future__ import annotations

import errno

import pyfuse3

from shardfs.base.attrs import Attr
from shardfs.kernel.entries import ReplyEntry
from shardfs.kernel.handles import Handles
from shardfs.kernel.inodes import ShownGone
from shardfs.kernel.opening import kernel_attr
from shardfs.kernel.pins import Pins
from shardfs.tree.names import Names
from shardfs.tree.nodes import ChunkKey
from shardfs.tree.nodetable import NodeTable
from shardfs.tree.writer import Writer



class Attributes:
    """The GETATTR answers of one mount (see the module docstring): the tree's ``names`` and
    ``nodes``, the adapter's open ``handles`` and ``pins``, the ``entry`` a reply shows, the
    ``writer`` (None on a read-only mount, or a worker that forwards its writes), and where the
    chunk inodes answered with a held file's version after their chunk was gone are kept
    (``shown_gone``, the adapter's)."""

    def __init__(self, names: Names, nodes: NodeTable, handles: Handles, pins: Pins, entry: ReplyEntry,
                 writer: Writer | None, shown_gone: ShownGone) -> None:
        self.shown_gone = shown_gone
        self.names = names
        self.nodes = nodes
        self._handles = handles
        self._pins = pins
        self._entry = entry
        self.writer = writer

    async def getattr(self, inode: int) -> pyfuse3.EntryAttributes:
        """The reply to a GETATTR of kernel inode ``inode``."""
        handle = self._handles.dirty_write(inode)
        attr = None if handle is None or self.writer is None else self.writer.dirty_attr(handle)
        if attr is not None:
            return self._entry(attr)
        try:
            attr = await self.attr(inode)
        except pyfuse3.FUSEError as err:
            if err.errno != errno.ESTALE:
                raise
            # Its chunk is gone since a file was opened on it (removed here, or by another host or
            # behind the mount's back): a local filesystem answers ``fstat`` of a file removed while
            # open, so that file's version (pyfuse3 does not say whether an ``fstat`` asks; ESTALE
            # failed Python's ``open()``, which calls it), asked again at once: the name shows the
            # removal (ESTALE, then ENOENT) as soon as no file holds it.
            opened = self._opened_version(inode)
            if opened is None:
                raise
            gone = self._entry(opened)
            gone.attr_timeout = 0
            self.shown_gone.keep(inode)
            return gone
        if attr.ino != inode and self.nodes.is_new_alias(inode):
            attr = attr._replace(ino=inode)  # as its lookup said (pyfuse3 gives an entry's inode as its number)
        shown = self._pins.frozen(inode, attr)
        e = self._entry(shown)
        if shown is not attr:  # asked again as soon as the files holding the older size are closed
            e.attr_timeout = 0
        return e

    def _opened_version(self, inode: int) -> Attr | None:
        """What a file open on chunk inode ``inode`` reads: a handle open here, or another
        worker's (``-o workers=N``: the version its ledger record names, which that worker
        serves the reads of); None if none is open."""
        opened = self._handles.reading(inode)
        if opened is not None:
            return kernel_attr(opened)
        version = self._handles.read_elsewhere(inode)
        if version is None:
            return None
        key = self.nodes.node_key(inode)  # (a chunk's: ``attr`` said ESTALE)
        return self.names.chunk_attr(key.arr, inode, *version) if isinstance(key, ChunkKey) else None

    async def attr(self, inode: int) -> Attr:
        """``Names.getattr``, except that a chunk file that no longer exists (``_shows_chunk``) is
        ESTALE, not ENOENT.

        The kernel may still hold its name (from a ``create`` whose commit was refused, or
        from the other name of a chunk emptied through one of its two names). ESTALE makes
        it look the name up again (``LOOKUP_REVAL``) and drop it, so ``stat`` says ENOENT and
        ``open(O_CREAT)`` creates the file; ENOENT would fail both until the entry expires.
        """
        try:
            return await self.names.getattr(inode)
        except FileNotFoundError:
            if self._shows_chunk(inode):
                raise pyfuse3.FUSEError(errno.ESTALE) from None
            raise

    def _shows_chunk(self, inode: int) -> bool:
        """True if ``inode`` shows a chunk file: a chunk's own, or a temporary renamed onto a
        chunk (an alias, the inode its name shows in the kernel until it forgets it: found by
        scripts/soak, an in-place write after an ``rm`` under the chunk's other name failed
        with ENOENT)."""
        try:
            return isinstance(self.nodes.node_key(inode), ChunkKey)
        except OSError:
            return False
