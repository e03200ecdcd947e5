"""Which size the kernel is told for an inode that files reading through its page cache are
open on, and which inode a chunk's names show while that size is not the chunk's.

The kernel caps every read through its page cache at its inode's size (``i_size``) and pads
short pages with zeros, and takes that size from any attribute reply about the inode
(lookup, getattr, readdirplus). A file opened for reading keeps the version it opened
(``ReadHandle``), but a local filesystem also keeps the replaced inode, with its size, for a
descriptor opened before a rename onto its name: here the descriptor and the name share
the kernel inode, and an attribute reply with the new version's size cut or padded the old
descriptor's reads (found by scripts/soak: torn chunks read by zarr while zarr writers
renamed temporary files onto them). So, while such files are open on an inode (they *pin*
it) and the chunk's size is no longer theirs:

- a getattr of that inode answers their version (``frozen``), as a local filesystem's
  replaced inode does;
- an open of it is refused (``refused``: ESTALE, after which the kernel looks the name up
  again and opens what the lookup gives);
- a lookup of a name of the chunk (or a listing) gives another inode (``entry``, ``shown``: a new
  alias made by ``new_alias`` and registered with ``showing``), as a rename does on a local filesystem.

Only the size matters: a version of the same size (a fold changes only the mtime) is served
through the same inode (the page-cache bookkeeping in ``inodes.KernelInodes`` keeps each
handle's bytes apart). Files opened with direct I/O pin their inode too: the kernel does not
cap their reads, but ``fstat`` gives its inode's size, and tensorstore reads that many bytes
(unpinned, they read torn beside renames committing other sizes: found by a stress of them).
Files being rewritten in place pin nothing (``forfeit``: as on a local filesystem, a reader
of a file rewritten in place may read it torn). Runs on the trio thread.
"""

from __future__ import annotations

from typing import Callable

from shardfs.base.attrs import Attr
from shardfs.tree.nodetable import CHUNK_BASE


class Pins:
    """The versions pinned by files open through the page cache, and the inodes chunks show."""

    def __init__(self, new_alias: Callable[[int], int] | None = None) -> None:
        """``new_alias(ino)``: a new alias inode of chunk inode ``ino`` (``NodeTable.new_alias``)."""
        self._new_alias = new_alias
        self._pins: dict[int, dict[int, tuple[int, int]]] = {}  # inode -> {fh: (size, mtime) it reads}
        self._of: dict[int, int] = {}  # fh -> the inode it pins
        self._shown: dict[int, int] = {}  # chunk inode -> the alias its names show instead

    def __bool__(self) -> bool:
        """False while no file pins an inode and every chunk shows its own (``shown`` is then
        each chunk's own inode: a listing skips it)."""
        return bool(self._pins or self._shown)

    def pin(self, fh: int, version: Attr) -> None:
        """File ``fh`` reads version ``version`` (``ino``: the kernel's inode), through the page
        cache or with direct I/O. Every file pinning an inode reads one size: one of another
        version opened beside it is given direct I/O (``KernelInodes.reading``) if of that
        size, else refused (``refused``)."""
        self._pins.setdefault(version.ino, {})[fh] = (version.size, version.mtime_ns)
        self._of[fh] = version.ino

    def counts(self, fh: int) -> bool:
        """Whether ``unpin`` of file ``fh`` has a pin to let go of."""
        return fh in self._of

    def unpin(self, fh: int) -> None:
        """File ``fh`` was released (nothing if it pinned nothing)."""
        ino = self._of.pop(fh, None)
        if ino is not None:
            pins = self._pins[ino]
            del pins[fh]
            if not pins:
                del self._pins[ino]

    def released_elsewhere(self, fh: int) -> None:
        """Handle ``fh``, which another worker opened (or a dead one), was released here: its
        pin is let go of at once where that worker noted it for any worker (``SharedPins``;
        one worker: nothing)."""

    def forfeit(self, ino: int) -> None:
        """``ino`` is being rewritten in place: the files open on it no longer pin it."""
        for fh in self._pins.pop(ino, {}):
            del self._of[fh]

    def _pinned(self, ino: int, size: int) -> tuple[int, int] | None:
        """The version pinning ``ino`` if its size is not ``size``, else None."""
        pins = self._pins.get(ino)
        if not pins:
            return None
        version = next(iter(pins.values()))
        return version if version[0] != size else None

    def frozen(self, ino: int, attr: Attr) -> Attr:
        """What a getattr of kernel inode ``ino`` answers when its file is at ``attr``:
        the pinning version's size and mtime if the size differs, else ``attr``."""
        version = self._pinned(ino, attr.size)
        return attr if version is None else attr._replace(size=version[0], mtime_ns=version[1])

    def refused(self, ino: int, attr: Attr) -> bool:
        """True if an open of kernel inode ``ino`` at version ``attr`` must be refused."""
        return self._pinned(ino, attr.size) is not None

    def shown(self, attr: Attr) -> int | None:
        """The inode a name of chunk file ``attr`` (its own inode) shows: its own, or the alias
        ``showing`` registered, unless that one is pinned at another size: then None (the caller
        makes a new alias and registers it)."""
        ino = self._shown.get(attr.ino, attr.ino) if self._shown else attr.ino
        return None if self._pins and self._pinned(ino, attr.size) is not None else ino

    def entry(self, attr: Attr) -> Attr:
        """``attr`` with the inode an entry of it gives the kernel: a chunk file's own, or an
        alias while files opened on another size of it hold that one (``shown``; a new one made
        with ``new_alias`` and registered, ``showing``, when that one is pinned too)."""
        if attr.ino < CHUNK_BASE or not self:  # (every lookup: nothing pinned, nothing to look up)
            return attr
        ino = self.shown(attr)
        if ino is None:
            assert self._new_alias is not None  # (given by the adapter)
            ino = self._new_alias(attr.ino)
            self.showing(attr.ino, ino)
        return attr if ino == attr.ino else attr._replace(ino=ino)

    def showing(self, chunk: int, alias: int) -> None:
        """The names of chunk inode ``chunk`` show ``alias`` from now on (until it is forgotten)."""
        self._shown[chunk] = alias

    def forgot(self, chunk: int, alias: int) -> None:
        """The kernel forgot inode ``alias`` of chunk inode ``chunk``: if its names showed it,
        they show the chunk's own inode again."""
        if self._shown.get(chunk) == alias:
            del self._shown[chunk]
