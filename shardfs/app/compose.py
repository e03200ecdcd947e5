"""The composition root: a mount's layers built from its ``Config`` and handed to each other.

``compose`` is what the daemon (``shardfs.app.run``) builds before it mounts, and what the
tests' in-process harness (``tests/inproc.py``) builds to drive the filesystem without the
kernel, so both run exactly the same objects: the source's ``Storage`` (its ``storage``
slice, the kernel's timeouts as how long versions and listings are remembered), unless
read-only the ``Writeback`` after the journal's replay (``shardfs.app.replay``, the
``writes`` slice), the read path with its caches (``reads``), the tree (``tree``:
``compose_tree`` builds each part and hands it the others it uses: the hierarchy, node table,
made structure, shard indexes, read-ahead, chunks, ``Names``, ``Opens``, ``Listing``), unless
read-only the ``Commits`` and the ``Writer`` with its ``Structure`` (``writes``: the shard size
of arrays created through the mount, spilling into the source's state directory;
``compose_writer``), and the pyfuse3 ``Operations`` (``kernel``), given each of them. This is
the one place that builds a mount's objects: none builds another's parts.

Building them imports pyfuse3, trio and numpy: ``shardfs.app.run`` imports this module only
in the daemon, once it serves a mount.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass

from shardfs.app import state
from shardfs.app.replay import open_writeback
from shardfs.app.status import Counters
from shardfs.app.usage import UsageError
from shardfs.base.faults import Faults
from shardfs.config import Config, ReadConfig, TreeConfig
from shardfs.kernel.fuse_ops import Operations
from shardfs.kernel.inodes import KernelInodes
from shardfs.kernel.invalidation import Invalidation
from shardfs.kernel.pagetable import PageTable
from shardfs.kernel.sharedpages import SharedInodes, SharedPins
from shardfs.reads import Reads
from shardfs.reads.chunkcache import ChunkCache
from shardfs.reads.factory import make_reads
from shardfs.reads.prefetch import Prefetch
from shardfs.reads.rangecache import RangeCache, RangeCounts
from shardfs.shards.indexes import ShardIndexes
from shardfs.shards.shard import INDEX_CACHE_BYTES, IndexCache
from shardfs.base import private
from shardfs.base.lru import Counted
from shardfs.storage import Storage
from shardfs.storage.listings import DEFAULT_BYTES as LISTING_BYTES, Listings
from shardfs.storage.sharedshards import SharedShards, split
from shardfs.storage.source import Source
from shardfs.tree.chunks import Chunks
from shardfs.tree.commits import Commits, Invalidate
from shardfs.tree.hierarchy import Hierarchy
from shardfs.tree.ledger import Ledger
from shardfs.tree.listing import Listing
from shardfs.tree.made import Made
from shardfs.tree.names import Names, Resolved
from shardfs.tree.nodetable import NodeTable
from shardfs.tree.numbers import Numbers
from shardfs.tree.opens import Opens
from shardfs.tree.structure import Structure
from shardfs.tree.writer import Writer
from shardfs.writes.writeback import Writeback


class ReplayFailed(Exception):
    """The write journal holds something that cannot be replayed (its cause is the reason):
    nothing is mounted."""


@dataclass
class Tree:
    """A mount's tree over its storage, built by ``compose_tree``: what the kernel adapter and
    the writer call (``names``, ``opens``, ``listing``) and the parts they share."""

    hierarchy: Hierarchy
    nodes: NodeTable
    made: Made
    numbers: Numbers
    reads: Reads
    indexes: ShardIndexes
    prefetch: Prefetch
    chunks: Chunks
    names: Names
    opens: Opens
    listing: Listing


@dataclass
class Composed:
    """A mount's objects, built by ``compose``."""

    source: Source
    storage: Storage
    writeback: Writeback | None  # None: read-only
    ranges: RangeCache | None  # an object store's fetched ranges (None: a directory)
    ledger: Ledger
    tree: Tree
    commits: Commits | None  # None: read-only
    structure: Structure | None  # None: read-only
    writer: Writer | None  # None: read-only
    ops: Operations
    faults: Faults
    listings: Listings  # the listings the storage remembers (its share of them, of N workers)
    shards: SharedShards | None = None  # the shards fetched whole N workers keep (a read-only remote mount)

    def counters(self) -> Counters:
        """What ``shardfs status`` shows of this mount, layer by layer (``shardfs.app.status``)."""
        ranges: Counted | None = self.ranges
        if self.ranges is not None and self.shards is not None:
            ranges = RangeCounts(self.ranges, self.shards, self.ledger.count)
        return Counters(self.ops.stats, self.storage.stats,
                        {"index": self.tree.indexes.index_cache, "chunk": self.tree.reads.chunk_cache.lru,
                         "range": ranges, "listing": self.listings}, self.writeback, self.faults,
                        self.ops.spilled_bytes, self.ops.open_handles, self._forwarded)

    def _forwarded(self) -> dict[str, int]:
        route = self.ops.route
        return {} if route is None else route.forwarded


def compose_tree(storage: Storage, reads: Reads | None = None, writeback: Writeback | None = None,
                 tree: TreeConfig | None = None, max_chunk: int = ReadConfig.max_chunk,
                 ledger: Ledger | None = None, read_only: bool | None = None,
                 index_bytes: int = INDEX_CACHE_BYTES) -> Tree:
    """The tree of a mount of ``storage`` (read-only unless ``writeback`` is given, or as
    ``read_only`` says); ``reads`` by default ``make_reads(storage)``; ``max_chunk``: ``-o
    max_chunk``; ``ledger``: where the numbers given to the kernel are noted (none kept by default);
    ``index_bytes``: the bound of the decoded index tables kept (the shard indexes' and the
    read-ahead's one ``IndexCache``)."""
    reads = reads if reads is not None else make_reads(storage)
    tree = tree or TreeConfig()
    ledger = ledger or Ledger()
    hierarchy = Hierarchy(storage, tree.ome, tree.c_order, time.time_ns(), ledger)  # groups and arrays
    nodes = NodeTable(hierarchy.slots, ledger, hierarchy.unbound)  # inode numbers <-> node keys, staging files
    hierarchy.bound.append(nodes.slot_bound)
    made = Made(ledger)  # structure made through the mount that the source does not hold (yet)
    index_cache = IndexCache(index_bytes)
    indexes = ShardIndexes(storage, reads.indexes_per_read, hierarchy.version, hierarchy.log_unusable, index_cache)
    prefetch = Prefetch(storage, reads, indexes, index_cache)  # object sources: read-ahead
    chunks = Chunks(storage, writeback, indexes, reads, prefetch)  # stored and pending
    resolved = Resolved()
    names = Names(storage, hierarchy, nodes, made, indexes, chunks, resolved,
                  read_only=writeback is None if read_only is None else read_only)
    opens = Opens(storage, names, nodes, chunks, indexes, reads, prefetch, resolved, max_chunk)
    listing = Listing(names, storage, nodes, made, indexes, chunks, reads.index_calls)
    return Tree(hierarchy, nodes, made, Numbers(ledger, hierarchy, nodes, made), reads, indexes, prefetch, chunks,
                names, opens, listing)


def compose_writer(storage: Storage, t: Tree, writeback: Writeback, invalidate: Invalidate, tree: TreeConfig,
                   spill_dir: str, shard_bytes: int) -> tuple[Commits, Structure, Writer]:
    """The ``Commits``, the ``Structure`` and the ``Writer`` (given both) of a writable mount's tree ``t``:
    contents being written spill into ``spill_dir``; arrays created through the mount get
    shards of ``shard_bytes`` (``-o shard_size``)."""
    commits = Commits(storage, t.hierarchy, t.nodes, t.made, t.indexes, writeback, invalidate)
    structure = Structure(storage, t.names, t.nodes, t.made, t.chunks, t.indexes, t.listing, writeback, commits,
                          tree, shard_bytes)
    return commits, structure, Writer(t.names, t.opens, t.nodes, t.made, t.chunks, writeback, commits, structure,
                                      spill_dir)


def compose(cfg: Config, source: Source, cleanup: contextlib.ExitStack, ledger: Ledger | None = None,
            adopt: bool = False, writes: bool = True, pages: PageTable | None = None,
            versions_fd: int | None = None, shards_fd: int | None = None) -> Composed:
    """Build a mount of ``source`` with ``cfg`` (``cfg.read_only``: no ``Writeback``, no
    ``Writer``); what must be closed (the storage, the journal's claim) goes on ``cleanup``.
    ``UsageError`` (one line) if the journal cannot be created or ``-o cache_dir`` cannot be
    used; ``ReplayFailed`` if what killed daemons left in the journal cannot be replayed.
    ``ledger``: where a supervised worker notes the numbers it gives the kernel; ``adopt``: it
    replaces a dead worker, whose journal it takes over as pending (``open_writeback``); ``writes``
    False: a writable mount's worker that forwards every change to the owner worker
    (``shardfs.kernel.owner``): no journal, no ``Writer``, but the modes of a writable mount;
    ``pages``: the table of the kernel's page cache the N workers of a mount share
    (``shardfs.kernel.sharedpages``; None: this worker's own); ``versions_fd``: the memfd of the
    table of versions they share (``shardfs.storage.sharedversions``; None: this worker's own);
    ``shards_fd``: the memfd of the shards fetched whole they share (``shardfs.storage.sharedshards``,
    a read-only mount of a remote source: ``-o cache_size`` but the part the workers share for
    the ranges each fetched alone, ``sharedshards.split``; None: none)."""
    share = ledger.count if ledger is not None and ledger.shared else 1  # N workers: each its share of the mount's
    listings = Listings(cfg.kernel.entry_timeout, LISTING_BYTES // share)
    storage = cleanup.enter_context(source.opened(version_ttl=cfg.kernel.attr_timeout, listings=listings,
                                                  alone=share == 1, versions_fd=versions_fd))
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
            writeback = open_writeback(source, storage, cfg.writes.journal_dir, cleanup, faults, adopt)
        except UsageError:
            raise
        except Exception as e:
            raise ReplayFailed(str(e)) from e
    # the limits are the mount's: each of N workers keeps its share of every cache
    own = cfg.reads.cache_size if shards_fd is None else split(cfg.reads.cache_size)[1]  # (the ring: the rest)
    limits = dataclasses.replace(cfg.reads, chunk_cache=cfg.reads.chunk_cache // share, cache_size=own // share)
    try:
        ranges = _range_cache(source, limits)
    except ValueError as e:
        raise UsageError(f"-o {e}") from None
    shared = None if shards_fd is None else SharedShards(shards_fd)
    if shared is not None:
        cleanup.callback(shared.close)
    reads = make_reads(storage, cache=ranges, chunk_cache=ChunkCache(limits.chunk_cache), shared=shared)
    ledger = ledger or Ledger()
    t = compose_tree(storage, reads, writeback, cfg.tree, cfg.reads.max_chunk, ledger, cfg.read_only,
                     INDEX_CACHE_BYTES // share)
    inodes = KernelInodes() if pages is None else SharedInodes(pages)
    invalidation = Invalidation(inodes, t.nodes, every=ledger.shared)
    commits = structure = writer = None
    if writeback is not None:
        commits, structure, writer = compose_writer(storage, t, writeback, invalidation.invalidate, cfg.tree, spill,
                                         cfg.writes.shard_size)
    ops = Operations(storage, t.names, t.opens, t.listing, t.nodes, t.numbers, ledger, inodes, invalidation, writer,
                     structure, cfg.kernel, faults, cfg.read_only,
                     None if pages is None else SharedPins(pages, t.nodes.new_alias))
    return Composed(source, storage, writeback, ranges, ledger, t, commits, structure, writer, ops, faults, listings,
                    shared)


def _range_cache(source: Source, reads: ReadConfig) -> RangeCache | None:
    """An object store's cache of fetched ranges (``-o cache_size``, ``-o cache_dir``); None for a
    directory. ``ValueError`` (one line) if ``cache_dir`` cannot be used."""
    return RangeCache(reads.cache_size, reads.cache_dir) if source.kind.remote else None
