"""pyfuse3 adapter: each FUSE request becomes a call on the tree (``Names``: names and
attributes; ``Opens``: reads; ``Listing``: readdir) or the ``Writer`` (writes), and its result a
pyfuse3 reply.

What the adapter itself keeps is what talking to the kernel needs: the open handles
(``handles.Handles``: the open directories and their listings are ``directories.Directories``'),
what a GETATTR answers (``attributes.Attributes``: written sizes, removed chunks, pinned sizes),
the lookups and cached pages the kernel holds
(``inodes.KernelInodes``, which decide what ``invalidate`` must drop, whether an
open keeps the page cache, and when the daemon may fill it at an open), and the
kernel's slice of the configuration (``KernelConfig``: entry/attribute timeouts, what nodes show).

Any exception other than ``pyfuse3.FUSEError`` escaping a handler would end
``pyfuse3.main`` and kill the mount, so every handler goes through ``_guard``:
``OSError`` becomes its errno, anything else (a bug) becomes EIO and is recorded in
``Operations.faults`` (logged with its traceback, once per place: ``shardfs.base.faults``).
``forget``, which has no reply, records its bugs the same way and answers nothing.

With ``-o workers=N`` (``shardfs.tree.ledger``: a shared ledger) any worker
may get any request: a request that fails here first learns what the other workers gave out
(``Reopen.follow``) and is tried once more if that taught anything; what the kernel's page
cache holds of each inode, and the sizes files open through it pin, are the mount's table
(``shardfs.kernel.sharedpages``: files open through the page cache as with one worker; without
a table, from a supervisor of an older package, files are opened with direct I/O); a request on
a handle another worker opened is sent to that worker (``shardfs.kernel.route``); a handle a
dead worker of this slot opened is opened again here at its first use
(``shardfs.kernel.reopen``). On a writable mount worker 0 owns the writes: the others forward to
it what they must not serve (``shardfs.kernel.owner``, ``shardfs.kernel.forward``).

Extended attributes are not implemented on purpose: pyfuse3 answers ENOSYS,
after which the kernel stops asking. Otherwise ``ls -l`` sends two getxattr
requests per file (``security.selinux``, ``system.posix_acl_access``), which
triples its cost.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
from typing import Any, Awaitable, Callable, Sequence, TypeVar

import pyfuse3

from shardfs.config import KernelConfig
from shardfs.kernel.callers import Callers
from shardfs.kernel.attributes import Attributes
from shardfs.kernel.directories import Directories
from shardfs.kernel.forward import Handed, release_handle
from shardfs.kernel.route import Route
from shardfs.kernel.entries import Entries
from shardfs.kernel.handles import Handle, Handles, Lost
from shardfs.kernel.inodes import KernelInodes, Pages, ShownGone
from shardfs.kernel.pins import Pins
from shardfs.base.attrs import Attr
from shardfs.base.faults import Faults
from shardfs.tree.nodes import Unbound
from shardfs.tree.nodetable import CHUNK_BASE
from shardfs.tree.tries import Tries
from shardfs.kernel.stats import RequestStats
from shardfs.kernel.invalidation import Invalidation
from shardfs.kernel.reopen import Elsewhere, Reopen
from shardfs.kernel.opening import Opening, kernel_attr
from shardfs.reads import ReadHandle
from shardfs.storage import Storage
from shardfs.tree.ledger import Ledger
from shardfs.tree.listing import Listing
from shardfs.tree.names import Names
from shardfs.tree.nodetable import NodeTable
from shardfs.tree.numbers import Numbers
from shardfs.tree.opens import Opens
from shardfs.tree.structure import Structure
from shardfs.tree.writer import WriteHandle, Writer

log = logging.getLogger("shardfs")
F = TypeVar("F", bound=Callable[..., Awaitable[Any]])
NAME_MAX = 255  # bytes in one name (ENAMETOOLONG beyond), as on every local Linux filesystem
# pyfuse3 built by scripts/pyfuse3 (run by scripts/install) has FileInfo.noflush: a read-only
# open then asks the kernel for no FLUSH request at its close(); stock pyfuse3 has not (each
# close of a read-only open then costs one FLUSH request, answered as a no-op).
NOFLUSH = hasattr(pyfuse3.FileInfo(), "noflush")
GUARDED: list[str] = []  # the handlers ``_guard`` wraps: the operations ``RequestStats`` counts


def _name(name: bytes) -> str:
    """A name from the kernel as ``str``; ENAMETOOLONG if it is longer than ``NAME_MAX`` bytes."""
    if len(name) > NAME_MAX:
        raise pyfuse3.FUSEError(errno.ENAMETOOLONG)
    return os.fsdecode(name)


# what a request naming a number another worker gave out, not followed here yet, fails with
UNKNOWN_NUMBER = frozenset((errno.ENOENT, errno.ESTALE, errno.EBADF))
BINDS = 4  # arrays one request may name that a restarted worker has not read yet (``Unbound``)


async def _binding(self: "Operations", fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """``fn(self, *args)``; run again after reading the array it names that a dead worker had
    read and this one has not yet (``Unbound``: a restarted worker reads each at its first use)."""
    for _ in range(BINDS):
        try:
            return await fn(self, *args)
        except Unbound as e:
            if not await self.numbers.bind(e.path):
                raise
            if self.route is not None:  # (the owner marks what the array read taught it, as below)
                self.route.link(fn.__name__, args)
    return await fn(self, *args)


def _guard(fn: F) -> F:
    """A handler that counts itself (``Operations.stats``) and never raises anything but
    ``FUSEError`` (see the module docstring)."""
    op = fn.__name__

    @functools.wraps(fn)
    async def wrapper(self: "Operations", *args: Any) -> Any:
        if self.stats.counting:  # (``-o workers=auto``, the first worker: ``shardfs.kernel.elastic``)
            self.stats.began(args)
        if self.stats.waiting is not None:  # (a background loop of an idle worker waits for a request)
            self.stats.arrived()
        if self.route is not None:  # N workers: the one that must serve it (``shardfs.kernel.route``)
            try:
                link = self.route.link(op, args)  # (OSError: a change that cannot be marked is not made)
                if link is not None and self.route.unknown(op, args) and await self.reopen.follow():
                    link = self.route.link(op, args)  # (a number another worker gave out, learnt here)
                if link is not None:
                    return await link.request(op, args)
            except pyfuse3.FUSEError:
                raise
            except Exception as e:
                self.faults.record(op, e, repr(args[:2]))
                raise pyfuse3.FUSEError(errno.EIO) from None
        stats = self.stats
        stats.requests[op] += 1
        stats.active += 1
        try:
            try:
                return await _binding(self, fn, args)
            except Elsewhere as e:  # its opener serves it (``shardfs.kernel.route``)
                assert self.route is not None
                return await self.route.opener(e.args[0]).request(op, args)
            except Exception as e:
                # another worker gave out a number it names (``follow``); a slot another request
                # of this worker was binding meanwhile fails as no OSError/FUSEError (its array unread).
                # A failure of its own (EIO of a corrupt chunk, a store's time-out) is not run again.
                unbound = not isinstance(e, (OSError, pyfuse3.FUSEError))
                unknown = unbound or getattr(e, "errno", None) in UNKNOWN_NUMBER
                if not self.reopen.shared or not unknown or not (await self.reopen.follow() or unbound):
                    raise
            if self.route is not None:  # (the owner marks what it now knows: before the change)
                link = self.route.link(op, args)
                if link is not None:
                    return await link.request(op, args)
            return await _binding(self, fn, args)
        except pyfuse3.FUSEError as e:
            self.stats.error(e.errno, op, args)
            raise
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.ENOTDIR, errno.EISDIR) and e.strerror:
                log.debug("%s%r: %s", op, args[:2], e.strerror)
            self.stats.error(e.errno or errno.EIO, op, args)
            raise pyfuse3.FUSEError(e.errno or errno.EIO) from None
        except Exception as e:
            self.faults.record(op, e, repr(args[:2]))
            self.stats.error(errno.EIO, op, args)
            raise pyfuse3.FUSEError(errno.EIO) from None
        finally:
            stats.active -= 1

    GUARDED.append(op)
    return wrapper  # type: ignore[return-value]  # functools.wraps: fn's signature


class Operations(pyfuse3.Operations):
    """The FUSE request handlers of a shardfs mount."""

    supports_dot_lookup = False
    enable_writeback_cache = False
    # The kernel then looks names up in one directory concurrently (an array's chunk files all
    # share one): with the pyfuse3 scripts/install builds; stock pyfuse3 ignores it.
    enable_parallel_dirops = True

    def __init__(self, source: Storage, names: Names, opens: Opens, listing: Listing, nodes: NodeTable,
                 numbers: Numbers, ledger: Ledger, inodes: KernelInodes, invalidation: Invalidation,
                 writer: Writer | None = None, structure: Structure | None = None,
                 kernel: KernelConfig | None = None, faults: Faults | None = None,
                 read_only: bool | None = None, pins: Pins | None = None) -> None:
        """The tree's ``names`` (lookups, attributes), ``opens`` (reads) and ``listing``
        (readdir), its node table (``nodes``: aliases, forgets, staging files) and the numbers
        given to the kernel (``numbers``: ledger compactions, follows, take-overs); the ``ledger``
        the handles are noted in; what the kernel holds (``inodes``) and drops (``invalidation``);
        ``writer`` and its ``structure`` (mkdir, rmdir): None on a read-only mount; ``kernel``:
        the entry and attribute timeouts, and the owner, group and modes
        every node shows (``-o entry_timeout,attr_timeout,uid,gid,file_mode,dir_mode``);
        ``faults``: where the handlers' bugs are recorded (the mount's, shared with its
        background tasks); ``read_only``: by default, without a ``writer`` (a writable mount's
        worker that forwards its writes to the owner worker has none); ``pins``: the sizes files
        open through the page cache pin (by default this worker's; N workers: the mount's)."""
        super().__init__()
        self.source = source
        self.names = names
        self.opens = opens
        self.nodes = nodes
        self.numbers = numbers
        self.faults = faults or Faults()
        self.writer = writer
        self.read_only = writer is None if read_only is None else read_only
        self.structure = structure
        self.invalidate = invalidation.invalidate
        self.kernel = kernel = kernel or KernelConfig()
        self._handles = Handles(ledger)
        self._kernel = inodes
        # handles another worker or a dead one opened (``-o workers=N``, a restart): opened again here
        self.reopen = Reopen(self._handles, numbers, ledger, listing, opens, inodes, self._writable, self._let_go)
        # versions that files open through the page cache hold their inode's size at
        self._pins = Pins(nodes.new_alias) if pins is None else pins
        self._shown_gone = ShownGone()  # chunk inodes a getattr showed after their chunk was gone
        self._callers = Callers(os.getuid())
        self._entry = Entries(kernel, self.read_only, inodes).entry
        self._attributes = Attributes(names, nodes, self._handles, self._pins, self._entry, writer, self._shown_gone)
        self._directories = Directories(names, listing, self._handles, self.reopen, inodes, self._pins, self._entry)
        self.stats = RequestStats()
        # ``-o workers=N``: which worker serves a request (a handle's opener; on a writable mount
        # the owner, which marks what it changes): set by the daemon
        self.route: Route | None = None
        self.handed = Handed()  # handles made for another worker's forwarded requests (``forward``)
        self._opening = Opening(opens, inodes, ledger, self.stats)
        for op in GUARDED:
            self.stats.op(op)

    async def _forgo(self, ctx: Any) -> None:
        """Before serving an open, create or opendir the kernel sent again (a worker that read it
        died): release the handle its first execution made, which the kernel never knew: here
        for another worker, which died before it answered the kernel (``forward.Handed``), or
        by a worker that died before it answered (``Handles.made_by``: its ledger record)."""
        if not getattr(ctx, "resent", False):
            return
        made = self.handed.take(ctx.unique)
        if made is None:
            await self.reopen.follow()  # (the dead worker's last records)
            made = self._handles.made_by(ctx.unique)
        if made is not None:
            await release_handle(self, *made)

    async def unanswered(self, fh: int, is_dir: bool) -> None:
        """The answer of the open, create or opendir that made handle ``fh`` could not be sent:
        another worker's FUSE_NOTIFY_RESEND moved that request back to the kernel's queue, to be
        served again, so the kernel never learnt ``fh`` and sends no RELEASE of it (pyfuse3,
        scripts/pyfuse3-unanswered.patch): ``release_handle``."""
        await release_handle(self, is_dir, fh)

    def _looked_up(self, attr: Attr) -> pyfuse3.EntryAttributes:
        """An entry reply (lookup, create, link): the kernel now holds one more lookup of the inode."""
        attr = self._pins.entry(attr)
        self._kernel.looked_up(attr.ino)
        return self._entry(attr)

    @_guard
    async def lookup(self, parent_inode: int, name: bytes, ctx: Any = None) -> pyfuse3.EntryAttributes:
        return self._looked_up(await self.names.lookup(parent_inode, _name(name)))

    @_guard
    async def getattr(self, inode: int, ctx: Any = None) -> pyfuse3.EntryAttributes:
        return await self._attributes.getattr(inode)

    @_guard
    async def opendir(self, inode: int, ctx: Any) -> int:
        await self._forgo(ctx)
        return await self._directories.open(inode, ctx.unique)

    @_guard
    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        """Entries from offset ``start_id`` on, until the kernel's buffer is full; offset 0
        lists afresh. The entries come a page at a time (``DirStream``)."""
        await self._directories.reply(fh, start_id, token)

    async def counted(self, inodes: list[int]) -> None:
        """A forwarded READDIR's entries the kernel took (``Directories.counted``)."""
        self._directories.counted(inodes)

    async def entries(self, fh: int, start_id: int, limit: int) -> list[tuple[bytes, Any]]:
        """A forwarded READDIR's entries (``Directories.entries``)."""
        return await self._directories.entries(fh, start_id, limit)

    @_guard
    async def releasedir(self, fh: int) -> None:
        self.handed.released(True, fh)
        await self._directories.release(fh)

    @_guard
    async def open(self, inode: int, flags: int, ctx: Any) -> pyfuse3.FileInfo:
        await self._forgo(ctx)
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND):
            await self._attributes.attr(inode)
            written = await self._writable(ctx).open(inode, truncate=bool(flags & os.O_TRUNC))
            self._kernel.changed(inode)
            self._pins.forfeit(inode)  # rewritten in place: its readers may read it torn, as on any filesystem
            return pyfuse3.FileInfo(fh=self._handles.add_write(written, ctx.unique), direct_io=False, keep_cache=False)
        fi = await self._open_to_read(inode, ctx)
        if inode >= CHUNK_BASE:  # once opened: an open ``_guard`` runs again (N workers) is one open
            self.stats.chunk_files += 1
        return fi

    async def _open_to_read(self, inode: int, ctx: Any) -> pyfuse3.FileInfo:
        """``open`` of a file for reading: its handle at the version it has now, its pages kept,
        filled or bypassed (``KernelInodes``)."""
        await self._callers.may_read(self.source, self.names, inode, ctx)
        tries = Tries()  # the open's one retry policy, shared with ``Opens.open``'s (``tree.tries``)
        while True:
            handle, version, content, stale = await self._opening.read_open(inode, tries, self._pins.refused)
            if not stale or tries.spent:
                break
            self.opens.release(handle)
        fi = pyfuse3.FileInfo(fh=self._handles.add(handle, ctx.unique))  # (outside the lock: the ledger's first)
        if NOFLUSH:  # nothing to commit at its close(): see flush
            fi.noflush = True
        with self._kernel.locked():  # (N workers: no other's open, drop or read comes between)
            pages = self._kernel.opened(version)
            fi.keep_cache = pages is not Pages.OTHER
            # direct I/O: an older version's reads may refill the pages; or the file changed during
            # the open (``stale``), and the kernel must not cut this version's bytes to the new size
            fi.direct_io = self._kernel.reading(version, fi.fh) or stale or not self._opening.cached
            pinned = handle.attr.ino >= CHUNK_BASE  # (a chunk file's own inode, or its alias)
            if pinned:  # with direct I/O too: fstat must give the size this file reads
                self._pins.pin(fi.fh, version)
            if pages is Pages.NONE and content is not None and not fi.direct_io:
                self._opening.fill(handle.ino, content)
        if stale and pinned:  # the kernel may have taken the new version's size meanwhile
            await self._opening.ask_size_again(handle.ino)
        return fi

    @_guard
    async def read(self, fh: int, off: int, size: int) -> bytes:
        handle = await self.reopen.live(fh)
        data: bytes | bytearray | memoryview
        if isinstance(handle, WriteHandle):
            data = await self._writable().read(handle, off, size)
        else:
            assert isinstance(handle, ReadHandle)  # the kernel sends READ with file handles only
            data = await self.opens.read(handle, off, size)
            # The reply lands in the kernel's pages of the inode: if another version was opened
            # since this handle's, they now hold an old version's bytes; the next open drops them.
            self._kernel.served(kernel_attr(handle))
        self.stats.read_bytes += len(data)
        return data  # type: ignore[return-value]  # pyfuse3 replies with any buffer

    @_guard
    async def release(self, fh: int) -> None:
        self.handed.released(False, fh)
        handle = self._handles.pop(fh)
        self.numbers.compact_if_full(self._handles.records)
        if handle is None or isinstance(handle, Lost):  # another worker's file: uncounted now, not when it follows
            with self._kernel.locked():
                self._kernel.released_elsewhere(fh)
                self._pins.released_elsewhere(fh)
        self._let_go(fh, handle)

    def _let_go(self, fh: int, handle: Handle | None) -> None:
        """What a released handle held (a read handle's version, pin and descriptor)."""
        if isinstance(handle, ReadHandle):
            # (N workers: one lock for both; none if the worker that served its release let go of both)
            if self._kernel.counts(fh) or self._pins.counts(fh):
                with self._kernel.locked():
                    self._kernel.unread(kernel_attr(handle), fh)
                    self._pins.unpin(fh)
            self.opens.release(handle)
        elif isinstance(handle, WriteHandle) and self.writer is not None:
            self.writer.release(handle)

    @_guard
    async def statfs(self, ctx: Any) -> pyfuse3.StatvfsData:
        st = self.source.statvfs()
        out = pyfuse3.StatvfsData()
        for name in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree", "f_favail",
                     "f_namemax"):
            setattr(out, name, getattr(st, name))
        return out

    def open_handles(self) -> int:
        """Handles this process holds open (``shardfs status``: ``open_handles``)."""
        return self._handles.held()

    def spilled_bytes(self) -> int:
        """Bytes held in spill files by open files and staging files (``shardfs status``)."""
        return self._handles.spilled_bytes(self.nodes.staged.values())

    def _writable(self, ctx: Any = None) -> "Writer":
        """The writer; EROFS on a read-only mount, EACCES for another user (``Callers``)."""
        self._callers.may_write(ctx)
        if self.writer is None:
            raise pyfuse3.FUSEError(errno.EROFS)
        return self.writer

    def _structure(self, ctx: Any) -> Structure:
        """The writer's structure changes (``_writable``'s checks)."""
        self._writable(ctx)
        assert self.structure is not None  # (compose gives a writer's with it)
        return self.structure

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        """The kernel's FORGET: its count of lookups of each inode; with N workers, what this one
        counted of them and what it sends the others (``Route.forget``); then ``forwarded_forget``."""
        try:
            self._kernel.kernel_forgot(inode_list)
            if self.route is not None:
                inode_list = self.route.forget(inode_list, self._kernel.lookups)
        except Exception as e:  # noqa: BLE001 - FORGET has no reply: a bug is recorded, never raised
            self.faults.record("forget", e)
            return
        await self.forwarded_forget(inode_list)

    async def forwarded_forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        """Lookups the kernel forgot that this worker counted, or another worker sends it of a
        FORGET it got (``shardfs.kernel.forward``: routed there, never again here): the inodes
        the kernel holds none of any more are freed (aliases, committed temporaries)."""
        try:
            for ino, nlookup in inode_list:
                if self._kernel.forget(ino, nlookup):
                    self._shown_gone.drop(ino)
                    chunk = self.nodes.forget(ino)
                    if chunk is not None:
                        self._pins.forgot(chunk, ino)
        except Exception as e:  # noqa: BLE001 - FORGET has no reply: a bug is recorded, never raised
            self.faults.record("forget", e)

    @_guard
    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: Any
                     ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        await self._forgo(ctx)
        attr, handle = await self._writable(ctx).create(parent_inode, _name(name))
        self._kernel.changed(attr.ino)
        return pyfuse3.FileInfo(fh=self._handles.add_write(handle, ctx.unique)), self._looked_up(attr)

    @_guard
    async def write(self, fh: int, off: int, buf: bytes) -> int:
        handle = await self.reopen.live(fh)
        if not isinstance(handle, WriteHandle):
            raise pyfuse3.FUSEError(errno.EBADF)
        self._kernel.changed(handle.ino)  # its pages now hold bytes no version has (see ``KernelInodes.dropped``)
        was = handle.dirty
        n = await self._writable().write(handle, off, buf)
        if handle.dirty and not was:
            self._handles.dirtied(fh)
        return n

    @_guard
    async def flush(self, fh: int) -> None:
        """Commit a written chunk file (its errors reach close()).

        Files opened for reading have nothing to commit: their opens set ``noflush``
        (``NOFLUSH``), so the kernel sends no FLUSH at their close(). A read-only mount
        answers ENOSYS, after which the kernel stops sending FLUSH altogether (with a
        stock pyfuse3, the first close() still sends one).
        """
        if self.read_only:
            raise pyfuse3.FUSEError(errno.ENOSYS)
        handle = await self.reopen.live(fh) if self._handles.get(fh) is not None else None
        if isinstance(handle, WriteHandle):
            await self._writable().flush(handle)

    @_guard
    async def fsync(self, fh: int, datasync: bool) -> None:
        handle = self._handles.get(fh)
        if isinstance(handle, Lost) and handle.kind == "w":  # (another worker's read handle: nothing to open)
            handle = await self.reopen.live(fh)
        if self.writer is not None:
            await self.writer.fsync(handle if isinstance(handle, WriteHandle) else None)

    @_guard
    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        if self.writer is not None:
            await self.writer.fsync(None)

    @_guard
    async def setattr(self, inode: int, attr: pyfuse3.EntryAttributes, fields: pyfuse3.SetattrFields,
                      fh: int | None, ctx: Any) -> pyfuse3.EntryAttributes:
        # Mode, owner and times are accepted and not kept (the mount shows fixed ones):
        # rsync -a and cp -a set them on every file and directory they create.
        if fields.update_mode or fields.update_uid or fields.update_gid:
            self._writable(ctx)
        if fields.update_size:
            writer = self._writable(ctx)
            handle = await self.reopen.live(fh) if fh is not None and self._handles.get(fh) is not None else None
            if not isinstance(handle, WriteHandle):
                handle = self._handles.dirty_write(inode)
            self._pins.forfeit(inode)
            if handle is None:
                await writer.truncate_closed(inode, attr.st_size)
            else:
                await writer.truncate(handle, attr.st_size)
        return await self._attributes.getattr(inode)  # (one request)

    @_guard
    async def rename(self, parent_inode_old: int, name_old: bytes, parent_inode_new: int,
                     name_new: bytes, flags: int, ctx: Any) -> None:
        if flags & pyfuse3.RENAME_EXCHANGE:
            raise pyfuse3.FUSEError(errno.EINVAL)
        await _once(ctx, self._writable(ctx).rename(parent_inode_old, _name(name_old), parent_inode_new,
                                                 _name(name_new), bool(flags & pyfuse3.RENAME_NOREPLACE)),
                    (errno.ENOENT,), _done)
        self._handles.committed()  # a temporary renamed onto its chunk while open (tensorstore's way)

    @_guard
    async def link(self, inode: int, new_parent_inode: int, new_name: bytes, ctx: Any
                   ) -> pyfuse3.EntryAttributes:
        # (its temporary file lived in the dead worker's memory: ENOENT)
        return await _once(ctx, self._link(inode, new_parent_inode, new_name, ctx), (errno.EEXIST, errno.ENOENT),
                           lambda: self._relookup(new_parent_inode, new_name))

    async def _link(self, inode: int, new_parent_inode: int, new_name: bytes, ctx: Any) -> pyfuse3.EntryAttributes:
        return self._looked_up(await self._writable(ctx).link(inode, new_parent_inode, _name(new_name)))

    async def _relookup(self, parent_inode: int, name: bytes) -> pyfuse3.EntryAttributes:
        """The entry of ``name``, which a re-sent request's first execution made."""
        return await Operations.lookup.__wrapped__(self, parent_inode, name)  # type: ignore[attr-defined]  # (one request)

    @_guard
    async def unlink(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        await _once(ctx, self._unlink(parent_inode, os.fsdecode(name), ctx), (errno.ENOENT,), _done)

    async def _unlink(self, parent_inode: int, name: str, ctx: Any) -> None:
        """``Writer.unlink``; but a chunk's name that a getattr here showed after its chunk was gone
        (``getattr``: a file open on it) is removed (success), as that ``stat`` said it could be: its
        chunk is already empty (zarr 2.18's resize ``stat``s each chunk file outside the new shape,
        which the resize emptied, and removes those it finds: found by scripts/soak, ENOENT)."""
        try:
            await self._writable(ctx).unlink(parent_inode, name)
        except FileNotFoundError:
            shown = self._shown_gone.find(lambda ino: self.names.names_chunk_inode(parent_inode, name, ino))
            if shown is None:
                raise
            self._shown_gone.drop(shown)

    @_guard
    async def rmdir(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        await _once(ctx, self._rmdir(parent_inode, name, ctx), (errno.ENOENT,), _done)

    async def _rmdir(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        self._kernel.removed_dir(await self._structure(ctx).rmdir(parent_inode, os.fsdecode(name)))

    @_guard
    async def mkdir(self, parent_inode: int, name: bytes, mode: int, ctx: Any) -> pyfuse3.EntryAttributes:
        return await _once(ctx, self._mkdir(parent_inode, name, ctx), (errno.EEXIST,),
                           lambda: self._relookup(parent_inode, name))

    async def _mkdir(self, parent_inode: int, name: bytes, ctx: Any) -> pyfuse3.EntryAttributes:
        return self._looked_up(await self._structure(ctx).mkdir(parent_inode, _name(name)))

    async def _unsupported(self, *args: Any) -> None:
        """EPERM on a writable mount, EROFS on a read-only one: answered by whichever worker reads
        it (it changes nothing; a writable mount's workers other than the owner have no writer)."""
        if self.read_only:
            raise pyfuse3.FUSEError(errno.EROFS)
        log.error("unsupported operation on the mount (symlink or mknod)")
        raise pyfuse3.FUSEError(errno.EPERM)

    symlink = mknod = _unsupported  # type: ignore[assignment]  # both always fail, whatever their arguments

    async def setxattr(self, *args: Any) -> None:
        """No extended attributes (nor ACLs): ENOTSUP, which ``cp -a`` and ``rsync -X`` expect
        from such a filesystem (they fall back to the mode, or skip); EROFS on a read-only mount.
        Answered by whichever worker reads it, as ``_unsupported``: it changes nothing (the other
        workers of a writable mount have no writer: EROFS there failed ``cp -a`` with 2 workers)."""
        if self.read_only:
            raise pyfuse3.FUSEError(errno.EROFS)
        raise pyfuse3.FUSEError(errno.ENOTSUP)

    removexattr = setxattr  # type: ignore[assignment]  # both always fail, whatever their arguments


T = TypeVar("T")


async def _once(ctx: Any, op: Awaitable[T], twice: tuple[int, ...], first: Callable[[], Awaitable[T]]) -> T:
    """Await ``op``, the request's work; if it fails with an errno of ``twice`` (what doing it a
    second time gives: EEXIST, ENOENT) and the kernel sent this request again (``ctx.resent``: a worker
    that died had read it, and may have done it), the answer of its first execution instead
    (``first()``), as if the worker had not died."""
    try:
        return await op
    except OSError as e:
        if e.errno not in twice or not getattr(ctx, "resent", False):
            raise
    log.info("a request sent again after a worker died was done by it: answered as it would have been")
    return await first()


async def _done() -> None:
    """The answer of an unlink, rmdir or rename done before: success."""
