"""What the kernel holds of the mount's inodes, as far as the daemon must track it.

The inode numbers, the node each one shows and the aliases of committed staging
files belong to ``shardfs.tree.nodetable.NodeTable`` (``node_key``, ``aliases``, ``forget``).
This module keeps the kernel's side of the table: how many lookups of each inode
it holds (an inode it does not hold has nothing cached, so needs no invalidation,
and once it holds none the view may free it), the version of each file whose
pages it may have cached, so an open can tell it whether to keep them, and the
generation of each inode number whose directory was removed, and the chunk inodes whose
``stat`` still showed a file after their chunk was gone (``ShownGone``).
"""

from __future__ import annotations

import contextlib
import enum
from typing import Callable, Sequence

from shardfs.base.attrs import Attr


class Pages(enum.Enum):
    """What the kernel's page cache holds of a file being opened for reading."""

    NONE = "none"  # nothing, ever: keep the (empty) cache, and the daemon may fill it
    SAME = "same"  # at most pages of the version being opened: keep them
    OTHER = "other"  # maybe pages of another version: the kernel must drop them


class LookupCounts:
    """How many lookups the kernel holds of each inode, compactly: the counts of 16 consecutive
    inode numbers share one int (4 bits each), so a listing of 1M chunk files (consecutive
    chunk inodes) costs about 7 bytes an inode instead of a dict entry's 70-80. A count of 15
    or more lives in a dict of its own (its 4 bits say so)."""

    def __init__(self) -> None:
        self._packed: dict[int, int] = {}  # ino >> 4 -> 16 counts of 4 bits (15: see _big)
        self._big: dict[int, int] = {}  # ino -> its count, when 15 or more

    def add(self, ino: int) -> None:
        """One more lookup of ``ino``."""
        key, shift = ino >> 4, (ino & 15) << 2
        packed = self._packed.get(key, 0)
        nibble = (packed >> shift) & 15
        if nibble == 15:
            self._big[ino] += 1
            return
        if nibble == 14:
            self._big[ino] = 15
        self._packed[key] = packed + (1 << shift)

    def drop(self, ino: int, n: int) -> int:
        """``n`` lookups of ``ino`` fewer; the count left (0 when none: ``ino`` is not held)."""
        key, shift = ino >> 4, (ino & 15) << 2
        packed = self._packed.get(key, 0)
        nibble = (packed >> shift) & 15
        left = max(0, (self._big.pop(ino) if nibble == 15 else nibble) - n)
        if left >= 15:
            self._big[ino] = left
        packed += (min(left, 15) - nibble) << shift
        if packed:
            self._packed[key] = packed
        else:
            self._packed.pop(key, None)
        return left

    def count(self, ino: int) -> int:
        """The lookups of ``ino`` held."""
        nibble = (self._packed.get(ino >> 4, 0) >> ((ino & 15) << 2)) & 15
        return self._big[ino] if nibble == 15 else nibble

    def __contains__(self, ino: int) -> bool:
        return bool((self._packed.get(ino >> 4, 0) >> ((ino & 15) << 2)) & 15)


class KernelInodes:
    """Lookup counts and page-cache versions of the inodes the kernel knows (one worker's: with
    ``-o workers=N`` the page-cache versions are the mount's, ``shardfs.kernel.sharedpages``)."""

    shared_pages = False  # the page-cache state is every worker's (``SharedInodes``)

    def __init__(self) -> None:
        self._lookups = LookupCounts()  # lookups the kernel holds of each inode (until it forgets them)
        # inode -> (size, mtime) of the version last opened for reading; None once opened for
        # writing or changed (pages of unknown content); a ``dropping`` mark while the daemon
        # drops its pages. An inode not here was never opened.
        self._cached: dict[int, tuple[int, int] | object | None] = {}
        self._generations: dict[int, int] = {}  # inode -> directories removed under its number
        self._readers: dict[int, dict[tuple[int, int], int]] = {}  # inode -> open read handles by version
        self._watched: dict[int, list[int]] = {}  # inode being opened -> [opens watching it, changes seen]
        self._unknown = False  # ``restored``: the kernel may hold any inode, with pages of any version

    def restored(self) -> None:
        """This worker replaces a dead one: the kernel may hold lookups of any inode the dead one
        gave out and pages of any version of any file (neither is in the ledger). From now on
        every inode counts as held (a change invalidates it in the kernel), and a file's pages
        as another version's until this worker dropped them itself (``opened`` says
        ``Pages.OTHER``: no ``keep_cache``, no page fill; the daemon drops them first, then
        the next open of that version keeps them)."""
        self._unknown = True

    def looked_up(self, ino: int) -> None:
        """The kernel got an entry for ``ino`` (lookup, create, link, readdirplus): one more lookup."""
        self._lookups.add(ino)

    def looked_up_all(self, inos: Sequence[int]) -> None:
        """``looked_up`` of each of ``inos`` (a READDIR's entries)."""
        for ino in inos:
            self._lookups.add(ino)

    def forget(self, ino: int, n: int) -> bool:
        """The kernel dropped ``n`` lookups of ``ino``; True if it holds none any more: then it
        evicted the inode with its pages, so the next open finds none (``Pages.NONE``)."""
        if self._lookups.drop(ino, n):
            return False
        self._cached.pop(ino, None)
        return True

    def kernel_forgot(self, forgets: Sequence[tuple[int, int]]) -> None:
        """A FORGET as the kernel sent it, to this worker (``forget`` follows for the lookups this
        worker counted): with N workers, the mount's count of each inode's lookups
        (``SharedInodes``); one worker's is ``forget``'s alone."""

    def lookups(self, ino: int) -> int:
        """How many lookups of ``ino`` the kernel holds from this process's replies."""
        return self._lookups.count(ino)

    def holds(self, ino: int) -> bool:
        """True while the kernel holds a lookup of ``ino`` (and so may cache its attributes or
        pages); after ``restored``, always: this worker cannot know (a forget says the kernel
        evicted the inode, but remembering every one would cost memory without bound; an
        invalidation of an inode the kernel does not hold costs one failed write)."""
        return self._unknown or ino in self._lookups

    def pages(self, attr: Attr) -> Pages:
        """What ``opened(attr)`` would say now, without remembering anything."""
        before = self._cached.get(attr.ino, None if self._unknown else Pages.NONE)
        if before is Pages.NONE:
            return Pages.NONE
        return Pages.SAME if before == (attr.size, attr.mtime_ns) else Pages.OTHER

    def opened(self, attr: Attr) -> Pages:
        """A file is being opened for reading at version ``attr``: what the kernel may have
        cached of it (it keeps the cache unless ``Pages.OTHER``). Remembers the version for
        the next open, but not after ``Pages.OTHER``: the kernel drops the pages of an open
        without ``keep_cache`` only once the opening process runs on after the reply, and
        other opens may be answered before that (found by scripts/soak: readers saw the
        previous value of a chunk for milliseconds after its in-place write was
        acknowledged). The daemon drops them itself first (``dropping``/``dropped``).

        Pages of an inode only come from files opened on it (or from the daemon filling them
        at such an open), so an inode never opened before has none."""
        pages = self.pages(attr)
        self._cached[attr.ino] = None if pages is Pages.OTHER else (attr.size, attr.mtime_ns)
        return pages

    def dropping(self, ino: int) -> object:
        """The daemon is about to drop the kernel's pages of ``ino`` (``invalidate_inode``); the
        mark to give ``dropped`` once it did."""
        mark = object()
        self._cached[ino] = mark
        return mark

    def dropped(self, attr: Attr, mark: object) -> None:
        """The pages of ``attr.ino`` were dropped since ``dropping`` gave ``mark``. Unless a
        change or a read of another version (``changed``, ``served``) came meanwhile, the
        kernel now holds no pages but those of version ``attr``'s reads: the next open of
        that version keeps them (``Pages.SAME``)."""
        if self._cached.get(attr.ino) is mark:
            self._cached[attr.ino] = (attr.size, attr.mtime_ns)

    def locked(self) -> contextlib.AbstractContextManager[None]:
        """Hold while an open decides from and records what the kernel's pages hold, and fills
        them (no other worker's open, drop or read may come between; one worker: nothing to hold)."""
        return contextlib.nullcontext()

    def reading(self, attr: Attr, fh: int = 0) -> bool:
        """A file is opened for reading at version ``attr`` (``unread`` it at its release). True
        if a handle of another version of it is open: the kernel's pages may get that version's
        bytes from its reads at any time, so this handle must bypass them (direct I/O)."""
        versions = self._readers.setdefault(attr.ino, {})
        key = (attr.size, attr.mtime_ns)
        mixed = any(v != key for v in versions)
        versions[key] = versions.get(key, 0) + 1
        return mixed

    def counts(self, fh: int) -> bool:
        """Whether ``unread`` of handle ``fh`` has something to uncount (one worker: always; N
        workers: not once the worker that served its release did, ``SharedInodes``)."""
        return True

    def unread(self, attr: Attr, fh: int = 0) -> None:
        """A handle that ``reading(attr, fh)`` counted was released."""
        versions = self._readers.get(attr.ino, {})
        key = (attr.size, attr.mtime_ns)
        if versions.get(key, 0) <= 1:
            versions.pop(key, None)
            if not versions:
                self._readers.pop(attr.ino, None)
        else:
            versions[key] -= 1

    def released_elsewhere(self, fh: int) -> None:
        """Handle ``fh``, which another worker opened (or a dead one), was released here: what
        ``reading`` counted of it is uncounted at once where that worker noted it for any worker
        (``SharedInodes``; one worker: nothing)."""

    def served(self, attr: Attr) -> None:
        """Bytes of version ``attr`` are being read into the kernel's pages of ``attr.ino`` (a
        READ of a handle opened at that version). If another version was opened since, those
        pages now hold an old version's bytes (the kernel dropped its pages at that open, before
        this reply): the next open must not keep them (found by scripts/soak: readers saw the
        previous value of a chunk for seconds after an in-place write was acknowledged)."""
        before = self._cached.get(attr.ino, None if self._unknown else Pages.NONE)
        if before is not Pages.NONE and before != (attr.size, attr.mtime_ns):
            self._cached[attr.ino] = None

    def changed(self, ino: int) -> None:
        """The content of ``ino`` changed, or may change (it is open for writing): the next
        open for reading must not keep its cached pages."""
        self._cached[ino] = None
        watched = self._watched.get(ino)
        if watched is not None:
            watched[1] += 1

    def invalidated(self, ino: int) -> None:
        """The daemon drops the kernel's cached pages of ``ino`` because its content changed
        (``Invalidation``): ``changed`` if the kernel holds it (an inode it does not hold has
        nothing cached, and is not remembered)."""
        if self.holds(ino):
            self.changed(ino)

    def watch(self, ino: int) -> int:
        """An open for reading of ``ino`` begins; give what it returns to ``unwatch``."""
        watched = self._watched.setdefault(ino, [0, 0])
        watched[0] += 1
        return watched[1]

    def unwatch(self, ino: int, seen: int) -> bool:
        """The open that ``watch(ino)`` returned ``seen`` to is about to be answered: True if
        ``ino`` changed meanwhile. Its handle may then hold the older version while the kernel
        takes the new one's size, cutting or padding what it reads (found by scripts/soak:
        torn chunks read through a name renamed onto during the open)."""
        watched = self._watched[ino]
        watched[0] -= 1
        if not watched[0]:
            del self._watched[ino]
        return watched[1] != seen

    def generation(self, ino: int) -> int:
        """The generation every entry of ``ino`` carries (0 until ``removed_dir(ino)``)."""
        return self._generations.get(ino, 0)

    def removed_dir(self, ino: int) -> None:
        """Directory ``ino`` was removed. A name shows the same inode number whenever it exists,
        so a directory made again under the removed one's name comes back with ``ino``; the
        kernel may still hold the removed directory's inode (a process has it open or as its
        working directory), which it marked dead, and would take that one for the new
        directory (creating anything in it: ENOENT). A new generation makes it a new inode to
        the kernel (the dead one gives EIO to whoever still holds it, as a removed directory
        should)."""
        self._generations[ino] = self.generation(ino) + 1


class ShownGone:
    """Chunk inodes a getattr answered with the version a file open on them reads after their
    chunk was gone (``Operations.getattr``): a ``stat`` of such a name said it is there, so its
    ``unlink`` removes it (``Operations.unlink``) instead of failing. At most ``KEPT``, the
    oldest let go first; one is let go of once its name is removed or the kernel forgets it."""

    KEPT = 256

    def __init__(self) -> None:
        self._inos: dict[int, None] = {}  # (insertion order: the oldest first)

    def keep(self, ino: int) -> None:
        self._inos.pop(ino, None)
        if len(self._inos) >= self.KEPT:
            del self._inos[next(iter(self._inos))]
        self._inos[ino] = None

    def find(self, names: Callable[[int], bool]) -> int | None:
        """The inode kept for which ``names(ino)`` is true, if any."""
        return next((ino for ino in self._inos if names(ino)), None)

    def drop(self, ino: int) -> None:
        self._inos.pop(ino, None)
