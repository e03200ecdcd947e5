"""Pending chunk changes of a mount, and folding them into shard rewrites.

A commit validates/encodes the chunk (``prepare``), appends it to the journal
(``shardfs.writes.journal``: a record in the journal directory, by default in the
source's state directory outside the source (``shardfs.app.state``), which survives a
SIGKILL of the daemon; ``sync`` makes it durable for power loss) and keeps it
in memory so reads see it at once. A background task folds each shard's
pending chunks into one atomic rewrite of the shard when the shard is
complete, once the mount has seen no writes for ``idle`` seconds, or when
pending bytes exceed ``budget``; ``flush`` folds everything (unmount,
SIGTERM). A journal record is released only after its shard was replaced with
it or with a newer value of its chunk, and the next mount replays whatever is
left, so every acknowledged chunk reaches its shard exactly as committed.
Released records are marked folded in the journal, so the replay skips them and never
writes an old value over one another writer stored since (but for a fold the crash
interrupted between the shard's replace and the marker: ``shardfs.writes.journal``).

Folds are version-checked (``shard.rewrite_sync``): a shard changed by another
writer is read again and the pending chunks applied on top. A fold that fails
(the shard is not a regular file, is corrupt, is locked by another writer...)
keeps its changes pending and in the journal, and is retried with exponential
backoff (``BACKOFF_FIRST`` doubling up to ``BACKOFF_MAX`` seconds) without
holding up other shards; it is logged at most once per ``LOG_EVERY`` seconds
per shard. ``flush`` tries each shard once more and never loops on a failing
one, and the replay of the next mount keeps the changes it cannot fold pending
(and journalled) instead of failing the mount. The journal's ``kept.json``
says which shards' changes are kept and why.
"""

from __future__ import annotations

import errno
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Iterator, NotRequired, TypedDict

import trio

from shardfs.shards import shard as shard_mod
from shardfs.writes.journal import Change, Journal, Record, kept_line
from shardfs.format.index import CorruptIndex
from shardfs.format.shardfile import ShardFormat
from shardfs.storage import Storage, Version
from shardfs.base.faults import Faults

log = logging.getLogger("shardfs")
ShardId = tuple[str, tuple[int, ...]]  # (array path, shard coords)
# Told of a fold: the shard, the positions of the chunks folded, the shard's new version.
OnFolded = Callable[[ShardId, list[int], "Version | None"], Awaitable[None]]
# ``prepare`` runs on the trio thread up to this input size: a worker-thread trip
# costs ~0.5 ms, more than validating a small chunk (~0.2 ms for 64 KiB of zstd).
INLINE_PREPARE_BYTES = 256 << 10
BACKOFF_FIRST = 1.0  # seconds before a failed fold is retried; doubles per failure
BACKOFF_MAX = 300.0
LOG_EVERY = 60.0  # a shard whose folds keep failing is logged at most this often
FOLDS_AT_ONCE = 4  # shards the background task folds at the same time


@dataclass
class Pending:
    """One committed, not yet folded inner chunk (``data`` None: it was deleted)."""

    record: Record  # its journal record
    data: bytes | None
    mtime_ns: int


@dataclass
class ShardTarget:
    """What folding needs to know about a shard: its key, index format and size in chunks."""

    key: str
    fmt: ShardFormat | None
    n_in_grid: int  # inner chunks of this shard inside the array


@dataclass
class _Dirty:
    target: ShardTarget
    chunks: dict[int, Pending] = field(default_factory=dict)
    superseded: list[Record] = field(default_factory=list)  # records replaced before folding
    stored: int = 0  # pending chunks with data (the shard is complete when it reaches n_in_grid)
    lock: trio.Lock = field(default_factory=trio.Lock)
    failures: int = 0  # folds failed in a row
    reason: str = ""  # why the last fold failed
    retry_at: float = 0.0  # monotonic time before which the fold is not retried
    logged_at: float = -math.inf
    unlogged: int = 0  # failures since the last log line

    def put(self, pos: int, entry: Pending) -> Pending | None:
        """Make ``entry`` the pending state of ``pos``; returns the entry it replaces."""
        old = self.chunks.get(pos)
        self.chunks[pos] = entry
        self.stored += (entry.data is not None) - (old is not None and old.data is not None)
        return old

    def drop(self, pos: int) -> Pending:
        entry = self.chunks.pop(pos)
        self.stored -= entry.data is not None
        return entry


class ArrayPending(TypedDict):
    chunks: int
    bytes: int
    shards: int


class JournalError(TypedDict):
    errno: str
    reason: str
    seconds_ago: float
    directory: str


class PendingCounts(TypedDict):
    """Changes written through the mount, not folded yet (``pending`` of the status document)."""

    chunks: int
    bytes: int
    shards: int
    arrays: dict[str, ArrayPending]
    journal_bytes: int
    journal_error: JournalError | None
    spill_bytes: NotRequired[int]  # (the kernel adapter's open files: added by ``shardfs.app.status``)


class BackingOff(TypedDict):
    shard: str
    reason: str
    failures: int
    chunks: int
    retry_in_s: float


class FoldCounts(TypedDict):
    """The folds so far (``folds`` of the status document)."""

    done: int
    failed: int
    backing_off: list[BackingOff]
    current: str | None


class WritebackCounts(TypedDict):
    pending: PendingCounts
    folds: FoldCounts


def nothing_pending() -> WritebackCounts:
    """``Writeback.snapshot`` of a mount that has none (read-only): nothing pending, no folds."""
    return {"pending": {"chunks": 0, "bytes": 0, "shards": 0, "arrays": {}, "journal_bytes": 0, "journal_error": None},
            "folds": {"done": 0, "failed": 0, "backing_off": [], "current": None}}


class Writeback:
    """Pending chunk changes of one mount and the journal that makes them durable."""

    def __init__(self, source: Storage, journal_dir: str, idle: float = 1.0, budget: int = 256 << 20,
                 faults: Faults | None = None) -> None:
        """``faults``: where bugs met while folding are recorded (the mount's)."""
        self.source = source
        self.faults = faults or Faults()
        self.idle = idle
        self.budget = budget
        self._dirty: dict[ShardId, _Dirty] = {}
        self._bytes = 0
        self._last_write = 0.0
        self._wake = trio.Event()
        self._flushing = False
        self._stranded: dict[str, tuple[int, str]] = {}  # replayed changes of arrays unreadable now
        self.folds_done = 0  # shard rewrites that succeeded / failed (``shardfs status``)
        self.folds_failed = 0
        self.flushing: str | None = None  # the shard ``flush`` is folding
        self.journal = Journal(journal_dir)

    # ----- reading pending state ----------------------------------------------------------

    def pending(self, shard: ShardId, pos: int) -> Pending | None:
        dirty = self._dirty.get(shard)
        return None if dirty is None else dirty.chunks.get(pos)

    def pending_in(self, shard: ShardId) -> dict[int, Pending]:
        dirty = self._dirty.get(shard)
        return {} if dirty is None else dict(dirty.chunks)

    def dirty_arrays(self) -> set[str]:
        """The paths of the arrays with pending changes."""
        return {path for path, _ in self._dirty}

    def dirty_shards(self, array: str) -> list[tuple[int, ...]]:
        return [coords for (path, coords) in self._dirty if path == array]

    # ----- committing ---------------------------------------------------------------------

    async def commit(self, shard: ShardId, target: ShardTarget, pos: int, data: bytes | None,
                     prepare: Callable[[bytes], bytes] | None = None) -> Pending:
        """Journal and record a new stored form of one inner chunk (None: empty it).

        ``prepare`` turns ``data`` into that stored form first (its exceptions
        propagate; nothing is recorded); a failed journal append raises ``OSError``.
        """
        if data is not None and prepare is not None:
            if len(data) <= INLINE_PREPARE_BYTES:
                data = prepare(data)
            else:
                data = await trio.to_thread.run_sync(prepare, data)
        # No await from here on: the journal and the pending state see commits of one
        # chunk in the same order. The append is a buffered write to the page cache,
        # cheap enough (~25 us for 64 KiB) for the trio thread.
        record = self.journal.append(Change(shard[0], shard[1], pos, data))
        entry = Pending(record, data, time.time_ns())
        self._record(shard, target, pos, entry)
        return entry

    def _record(self, shard: ShardId, target: ShardTarget, pos: int, entry: Pending) -> None:
        dirty = self._dirty.setdefault(shard, _Dirty(target))
        old = dirty.put(pos, entry)
        if old is not None:
            dirty.superseded.append(old.record)
        self._bytes += len(entry.data or b"") - len(old.data or b"") if old else len(entry.data or b"")
        self._last_write = time.monotonic()
        self._wake.set()

    async def sync(self) -> None:
        """Make every chunk committed so far durable (journal fsync)."""
        await self.journal.sync()

    # ----- folding ------------------------------------------------------------------------

    async def fold(self, shard: ShardId, on_folded: OnFolded | None = None) -> bool:
        """Rewrite one shard with its pending chunks, then ``await on_folded(shard, positions,
        version)``; False if that failed: they stay pending, and the shard is retried after a
        backoff (logged at most every ``LOG_EVERY`` s)."""
        dirty = self._dirty.get(shard)
        if dirty is None:
            return True
        async with dirty.lock:
            snapshot = dict(dirty.chunks)
            superseded = list(dirty.superseded)
            if not snapshot:
                return True
            changes = {pos: p.data for pos, p in snapshot.items()}
            try:
                version = await trio.to_thread.run_sync(
                    shard_mod.rewrite_sync, self.source, dirty.target.key, dirty.target.fmt, changes)
            except Exception as e:
                self._bug("fold", e, dirty.target.key)
                self._failed(dirty, failure_reason(e))
                return False
            # A record replaced before this fold must go too, or a replay would resurrect it.
            # One replaced during the rewrite is in ``superseded`` now: the next fold releases it.
            del dirty.superseded[: len(superseded)]
            self.folds_done += 1
            for pos, p in snapshot.items():
                if dirty.chunks.get(pos) is p:
                    dirty.drop(pos)
                    self._bytes -= len(p.data or b"")
                    superseded.append(p.record)
            if not dirty.chunks and self._dirty.get(shard) is dirty:
                del self._dirty[shard]
            self.journal.release(superseded)
            log.debug("%s: folded %d chunk changes", self.source.describe(dirty.target.key), len(snapshot))
            if dirty.failures:
                log.info("%s: folded after %d failed attempts", self.source.describe(dirty.target.key), dirty.failures)
                dirty.failures, dirty.reason, dirty.unlogged, dirty.logged_at = 0, "", 0, -math.inf
                self.note_kept()
            if on_folded is not None:
                try:
                    await on_folded(shard, list(snapshot), version)
                except Exception as e:  # noqa: BLE001 - the shard is folded: only caches stay stale
                    self.faults.record("fold callback", e, f" of {self.source.describe(dirty.target.key)}")
            return True

    def _bug(self, where: str, e: Exception, key: str) -> None:
        """Record ``e`` in ``faults`` (logged with its traceback) unless it is one of the
        failures a source may cause: ``OSError``, a corrupt shard or index."""
        if not isinstance(e, (OSError, shard_mod.CorruptShard, CorruptIndex)):
            self.faults.record(where, e, f" of {self.source.describe(key)}")

    def _failed(self, dirty: _Dirty, reason: str) -> None:
        self.folds_failed += 1
        dirty.failures += 1
        dirty.reason = reason
        delay = min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** (dirty.failures - 1))
        now = time.monotonic()
        dirty.retry_at = now + delay
        if now - dirty.logged_at < LOG_EVERY:
            dirty.unlogged += 1
            return
        again = f" (and {dirty.unlogged} more times)" if dirty.unlogged else ""
        log.error("%s: shard rewrite failed%s, next try in %g s; %s", self.source.describe(dirty.target.key),
                  again, delay, kept_line(dirty.target.key, len(dirty.chunks), reason))
        dirty.logged_at, dirty.unlogged = now, 0
        self.note_kept()

    def snapshot(self) -> WritebackCounts:
        """What ``shardfs status`` shows of the pending changes and folds (see ``shardfs.app.status``)."""
        now = time.monotonic()
        arrays: dict[str, ArrayPending] = {}
        for (array, _), dirty in self._dirty.items():
            per = arrays.setdefault(array, {"chunks": 0, "bytes": 0, "shards": 0})
            per["chunks"] += len(dirty.chunks)
            per["bytes"] += sum(len(p.data or b"") for p in dirty.chunks.values())
            per["shards"] += 1
        backing_off: list[BackingOff] = [
            {"shard": self.source.describe(d.target.key), "reason": d.reason, "failures": d.failures,
             "chunks": len(d.chunks), "retry_in_s": round(max(0.0, d.retry_at - now), 1)}
            for d in self._dirty.values() if d.failures]
        failed = self.journal.failed
        journal_error: JournalError | None = None if failed is None else {
            "errno": errno.errorcode.get(failed[0], str(failed[0])), "reason": failed[1],
            "seconds_ago": round(now - failed[2], 1), "directory": self.journal.directory}
        return {"pending": {"chunks": sum(a["chunks"] for a in arrays.values()), "bytes": self._bytes,
                            "shards": len(self._dirty), "arrays": arrays, "journal_bytes": self.journal.bytes,
                            "journal_error": journal_error},
                "folds": {"done": self.folds_done, "failed": self.folds_failed, "backing_off": backing_off,
                          "current": self.flushing}}

    def kept(self) -> dict[str, tuple[int, str]]:
        """Shards whose changes could not be folded: ``{key: (pending changes, reason)}``;
        during ``flush``, every shard not folded yet."""
        kept = {d.target.key: (len(d.chunks), d.reason or "not folded before the daemon stopped")
                for d in self._dirty.values() if d.failures or self._flushing}
        return {**self._stranded, **kept}

    def note_kept(self) -> None:
        """Write (or remove) the journal's note of the shards whose changes are kept, and why."""
        try:
            self.journal.note_kept(self.kept())
        except OSError as e:
            log.error("%s: cannot write the note of kept changes: %s", self.journal.directory, e)

    def dirty_below(self, path: str) -> list[ShardId]:
        """The shards with pending changes of the arrays at ``path`` or below it."""
        return [s for s in self._dirty if s[0] == path or s[0].startswith(path + "/") or not path]

    async def fold_below(self, path: str, on_folded: OnFolded | None = None) -> bool:
        """Fold the pending changes of the arrays at ``path`` or below it (before they move),
        each shard once; True if none is left pending."""
        for shard in self.dirty_below(path):
            await self.fold(shard, on_folded)
        return not self.dirty_below(path)

    async def discard(self, array: str) -> None:
        """Forget every pending change of ``array`` (it is being deleted): waits for a fold
        in progress, then releases their journal records, so a replay does not bring them back."""
        for shard in [s for s in self._dirty if s[0] == array]:
            dirty = self._dirty.get(shard)
            if dirty is None:
                continue
            async with dirty.lock:
                if self._dirty.get(shard) is not dirty:
                    continue
                del self._dirty[shard]
                self._bytes -= sum(len(p.data or b"") for p in dirty.chunks.values())
                self.journal.release([p.record for p in dirty.chunks.values()] + dirty.superseded)

    def _due(self, now: float) -> Iterator[ShardId]:
        # Idle is measured over the whole mount, not per shard: a writer sweeping the
        # array in C order returns to each shard only after it crossed the others.
        everything = self._bytes > self.budget or now - self._last_write >= self.idle
        for shard, dirty in list(self._dirty.items()):
            if now >= dirty.retry_at and (everything or dirty.stored >= dirty.target.n_in_grid):
                yield shard

    async def run(self, on_folded: OnFolded | None = None) -> None:
        """Background task: fold shards as they become due, forever, up to ``FOLDS_AT_ONCE``
        at a time, so a slow fold (a shard locked by another writer) holds up no other shard;
        ``on_folded`` as for ``fold``: given here, not to the constructor, which runs (and replays
        the journal) before the tree and the kernel adapter that ``on_folded`` needs exist."""
        limiter = trio.CapacityLimiter(FOLDS_AT_ONCE)
        folding: set[ShardId] = set()

        async def fold_one(shard: ShardId) -> None:
            try:
                async with limiter:
                    await self.fold(shard, on_folded)
            except Exception as e:  # noqa: BLE001 - a bug in one fold never ends the others (nor the mount)
                self.faults.record("fold task", e)
                dirty = self._dirty.get(shard)
                if dirty is not None:
                    self._failed(dirty, failure_reason(e))
            finally:
                folding.discard(shard)

        async with trio.open_nursery() as nursery:
            while True:
                if self._dirty:  # idle is measured: look again at least every idle / 4 s
                    with trio.move_on_after(self.idle / 4):
                        await self._wake.wait()
                else:  # nothing pending: no timer wakes an idle daemon
                    await self._wake.wait()
                self._wake = trio.Event()
                for shard in list(self._due(time.monotonic())):
                    if shard not in folding:
                        folding.add(shard)
                        nursery.start_soon(fold_one, shard)

    async def flush(self, on_folded: OnFolded | None = None) -> dict[str, tuple[int, str]]:
        """Fold every pending change into its shard (unmount, SIGTERM), trying each failing
        shard once more (``on_folded`` as for ``fold``); returns (and notes in the journal) the
        shards left: ``kept()``."""
        failed: set[ShardId] = set()
        self._flushing = True  # the note names every shard still pending, should the daemon be killed
        try:
            self.note_kept()
            while todo := [shard for shard in self._dirty if shard not in failed]:
                for shard in todo:
                    dirty = self._dirty.get(shard)
                    self.flushing = self.source.describe(dirty.target.key) if dirty is not None else None
                    if not await self.fold(shard, on_folded):
                        failed.add(shard)
                    self.note_kept()
        finally:
            self._flushing = False
            self.flushing = None
        kept = self.kept()
        for key, (n, reason) in sorted(kept.items()):
            log.error("%s", kept_line(key, n, reason))
        self.note_kept()
        return kept

    # ----- recovery -----------------------------------------------------------------------

    def replay_sync(self, resolve: Callable[[str, tuple[int, ...]], ShardTarget | None],
                    older: tuple[str, ...] = ()) -> int:
        """Fold the journal left by an earlier daemon into the shards (before mounting).

        ``older`` are journal directories written before this one (an earlier
        version's ``SRC/.shardfs/journal``): their records are applied first. ``resolve``
        gives the target of a shard (None if its array is gone; ``OSError`` if its metadata
        cannot be read now, or any other exception, a bug, recorded in ``faults``: its changes are
        appended again, for a later mount). The last
        record of a chunk wins. The changes of a shard that cannot be folded now are kept:
        appended again to this mount's journal and pending (served, retried with backoff).
        Returns the number of records read; raises ``JournalError`` if a journal directory
        holds anything else.
        """
        journals = [Journal(d) for d in older] + [self.journal]
        changes = [change for journal in journals for change in journal.recover()]
        by_shard: dict[ShardId, dict[int, bytes | None]] = {}
        for change in changes:
            by_shard.setdefault((change.array, change.shard), {})[change.pos] = change.data
        for (array, coords), chunks in by_shard.items():
            try:
                target = resolve(array, coords)
            except Exception as e:  # the array's metadata is there but cannot be read now (or a bug)
                self._bug("replay", e, array)
                for pos, data in chunks.items():
                    self.journal.append(Change(array, coords, pos, data))  # live: a later mount replays it
                name = f"{array} shard {list(coords)}"
                self._stranded[name] = (len(chunks), failure_reason(e))
                log.error("journal: %s", kept_line(name, *self._stranded[name]))
                continue
            if target is None:
                log.error("journal: array %r no longer presentable; dropping %d changes", array, len(chunks))
                continue
            try:
                shard_mod.rewrite_sync(self.source, target.key, target.fmt, chunks)
            except Exception as e:
                self._bug("replay", e, target.key)
                for pos, data in chunks.items():
                    record = self.journal.append(Change(array, coords, pos, data))
                    self._record((array, coords), target, pos, Pending(record, data, time.time_ns()))
                self._failed(self._dirty[(array, coords)], failure_reason(e))
        self.journal.sync_blocking()  # the kept changes are durable before the old segments go
        for journal in journals:
            journal.discard_recovered()
        self.note_kept()
        return len(changes)


    def adopt(self, resolve: Callable[[str, tuple[int, ...]], ShardTarget | None], directories: list[str],
              emptied: Callable[[str], None] | None = None) -> int:
        """Take over as pending the journals a dead worker of this mount left in
        ``directories`` (oldest first), without folding them: read at once, folded in the
        background like any pending chunk (``run``). Their records stay where they are until
        folded (``Journal.adopt``). ``resolve`` as for ``replay_sync``: the changes of an array
        gone are released; those of a shard whose target cannot be resolved now stay in the
        journal, not pending, for a later mount. ``emptied``: called with each directory once its
        folds emptied it (``Journal.adopt``). Returns the number of changes taken over."""
        adopted = [pair for d in directories for pair in self.journal.adopt(d, emptied)]
        targets: dict[ShardId, ShardTarget | Exception | None] = {}
        dropped = []
        for change, record in adopted:
            shard = (change.array, change.shard)
            if shard not in targets:
                try:
                    targets[shard] = resolve(*shard)
                except Exception as e:  # the array's metadata is there but cannot be read now (or a bug)
                    self._bug("adoption", e, change.array)
                    targets[shard] = e
            target = targets[shard]
            if isinstance(target, ShardTarget):
                self._record(shard, target, change.pos, Pending(record, change.data, time.time_ns()))
            elif target is None:
                dropped.append(record)
        for (array, coords), target in targets.items():
            if target is None:
                log.error("journal: array %r no longer presentable; dropping its changes", array)
            elif isinstance(target, Exception):  # the record stays live: a later mount replays it
                name = f"{array} shard {list(coords)}"
                n = sum(1 for change, _ in adopted if (change.array, change.shard) == (array, coords))
                self._stranded[name] = (n, failure_reason(target))
                log.error("journal: %s", kept_line(name, *self._stranded[name]))
        self.journal.release(dropped)
        self.note_kept()
        return len(adopted)


def failure_reason(e: Exception) -> str:
    """What a log line or ``shardfs umount`` says about a failed fold."""
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e) or type(e).__name__


def chunks_in_shard(grid: tuple[int, ...], per_shard: tuple[int, ...], shard: tuple[int, ...]) -> int:
    """How many inner chunks of ``shard`` lie inside an array of ``grid`` chunks."""
    return math.prod(max(0, min(n, g - s * n)) for g, n, s in zip(grid, per_shard, shard))
