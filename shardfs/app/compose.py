"""The composition root: a mount's layers built from its ``Config`` and handed to each other.

``compose`` is what the daemon (``shardfs.app.run``) builds before it mounts, and what the
tests' in-process harness (``tests/inproc.py``) builds to drive the filesystem without the
kernel, so both run exactly the same objects: the source's ``Storage`` (its ``storage``
slice, the kernel's timeouts as how long versions and listings are remembered), unless
read-only the ``Writeback`` after the journal's replay (``shardfs.app.replay``, the
``writes`` slice), the read path with its caches (``reads``), the ``View`` (``tree``) and
the pyfuse3 ``Operations`` (``kernel``) with its ``Writer`` (``writes``: the shard size of
arrays created through the mount, spilling into the source's state directory).

Building them imports pyfuse3, trio and numpy: ``shardfs.app.run`` imports this module only
in the daemon, once it serves a mount.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from shardfs.app import state
from shardfs.app.replay import open_writeback
from shardfs.app.usage import UsageError
from shardfs.config import Config, ReadConfig
from shardfs.kernel.fuse_ops import Operations
from shardfs.reads.chunkcache import ChunkCache
from shardfs.reads.factory import make_reads
from shardfs.reads.rangecache import RangeCache
from shardfs.storage import Storage, private
from shardfs.base.faults import Faults
from shardfs.storage.source import Source
from shardfs.tree.ledger import Ledger
from shardfs.tree.view import View
from shardfs.tree.writer import Writer
from shardfs.writes.writeback import Writeback


class ReplayFailed(Exception):
    """The write journal holds something that cannot be replayed (its cause is the reason):
    nothing is mounted."""


@dataclass
class Composed:
    """A mount's objects, built by ``compose``."""

    source: Source
    storage: Storage
    writeback: Writeback | None  # None: read-only
    ranges: RangeCache | None  # an object store's fetched ranges (None: a directory)
    view: View
    ops: Operations

    @property
    def writer(self) -> Writer | None:
        return self.ops.writer


def compose(cfg: Config, source: Source, cleanup: contextlib.ExitStack, ledger: Ledger | None = None,
            writes: bool = True) -> Composed:
    """Build a mount of ``source`` with ``cfg`` (``cfg.read_only``: no ``Writeback``, no
    ``Writer``); what must be closed (the storage, the journal's claim) goes on ``cleanup``.
    ``UsageError`` (one line) if the journal cannot be created or ``-o cache_dir`` cannot be
    used; ``ReplayFailed`` if what killed daemons left in the journal cannot be replayed.
    ``ledger``: where a supervised worker notes the numbers it gives the kernel; ``writes``
    False: a writable mount's worker that forwards every change to the owner worker
    (``shardfs.kernel.owner``): no journal, no ``Writer``, but the modes of a writable mount."""
    storage = cleanup.enter_context(source.opened(version_ttl=cfg.kernel.attr_timeout,
                                                  list_ttl=cfg.kernel.entry_timeout))
    writeback = None
    faults = Faults()  # the mount's bugs, from requests and background tasks alike
    spill = state.spill_dir(source.name, source.endpoint)
    if not cfg.read_only and writes:
        try:
            state.private_dir(spill)
        except private.Refused as e:
            raise UsageError(str(e)) from None
        except OSError as e:
            raise UsageError(f"{spill}: cannot create the spill directory: {e.strerror}") from None
        try:
            writeback = open_writeback(source, storage, cfg.writes.journal_dir, cleanup, faults)
        except UsageError:
            raise
        except Exception as e:
            raise ReplayFailed(str(e)) from e
    try:
        ranges = _range_cache(source, cfg.reads)
    except ValueError as e:
        raise UsageError(f"-o {e}") from None
    reads = make_reads(storage, cache=ranges, chunk_cache=ChunkCache(cfg.reads.chunk_cache))
    view = View(storage, read_only=cfg.read_only, writeback=writeback, ome=cfg.tree.ome,
                max_chunk=cfg.reads.max_chunk,
                c_order=cfg.tree.c_order, reads=reads, ledger=ledger)
    ops = Operations(view, cfg.kernel, writeback, spill_dir=spill, shard_bytes=cfg.writes.shard_size, faults=faults)
    return Composed(source, storage, writeback, ranges, view, ops)


def _range_cache(source: Source, reads: ReadConfig) -> RangeCache | None:
    """An object store's cache of fetched ranges (``-o cache_size``, ``-o cache_dir``); None for a
    directory. ``ValueError`` (one line) if ``cache_dir`` cannot be used."""
    return RangeCache(reads.cache_size, reads.cache_dir) if source.url else None
