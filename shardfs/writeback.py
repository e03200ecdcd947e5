"""Dirty inner chunks: the recovery journal, and folding them into shard rewrites.

A committed chunk (``put``/``delete``) is first written to the journal
(``SRC/.shardfs/journal/<seq>.j``, made visible by a rename, so it survives a
SIGKILL of the daemon; ``sync`` fsyncs it for power loss) and kept in memory
so reads see it at once. A background task folds each shard's pending chunks
into one atomic rewrite of the shard when the shard is complete, once the
mount has seen no writes for ``idle`` seconds, or when pending bytes exceed
``budget``; ``flush`` folds everything (unmount, SIGTERM). Journal entries are
deleted only after their shard was replaced, and the next mount replays
whatever is left, so every acknowledged chunk reaches its shard exactly as
committed (replaying an already folded entry rewrites the same bytes).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Iterator

import trio

from shardfs import shard as shard_mod
from shardfs.shardfile import ShardFormat
from shardfs.source import Source, Version, fsync_dir

log = logging.getLogger("shardfs")
JOURNAL_DIR = ".shardfs/journal"
ShardId = tuple[str, tuple[int, ...]]  # (array path, shard coords)


@dataclass
class Pending:
    """One committed, not yet folded inner chunk (``data`` None: it was deleted)."""

    seq: int
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
    superseded: list[int] = field(default_factory=list)  # journal seqs replaced before folding
    stored: int = 0  # pending chunks with data (the shard is complete when it reaches n_in_grid)
    lock: trio.Lock = field(default_factory=trio.Lock)

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


class Writeback:
    """Pending chunk changes of one mount and the journal that makes them durable."""

    def __init__(self, source: Source, idle: float = 1.0, budget: int = 256 << 20,
                 on_folded: Callable[[ShardId, list[int], Version | None], Awaitable[None]] | None = None
                 ) -> None:
        self.source = source
        self.idle = idle
        self.budget = budget
        self.on_folded = on_folded
        self._dirty: dict[ShardId, _Dirty] = {}
        self._bytes = 0
        self._seq = 0
        self._last_write = 0.0
        self._unsynced: set[str] = set()
        self._wake = trio.Event()
        self.journal = source.path(JOURNAL_DIR)

    # ----- reading pending state ----------------------------------------------------------

    def pending(self, shard: ShardId, pos: int) -> Pending | None:
        dirty = self._dirty.get(shard)
        return None if dirty is None else dirty.chunks.get(pos)

    def pending_in(self, shard: ShardId) -> dict[int, Pending]:
        dirty = self._dirty.get(shard)
        return {} if dirty is None else dict(dirty.chunks)

    def dirty_shards(self, array: str) -> list[tuple[int, ...]]:
        return [coords for (path, coords) in self._dirty if path == array]

    # ----- committing ---------------------------------------------------------------------

    async def commit(self, shard: ShardId, target: ShardTarget, pos: int, data: bytes | None,
                     prepare: Callable[[bytes], bytes] | None = None) -> Pending:
        """Journal and record a new stored form of one inner chunk (None: empty it).

        ``prepare`` turns ``data`` into that stored form first, in the same worker
        thread as the journal write (its exceptions propagate; nothing is recorded).
        """
        self._seq += 1
        seq = self._seq
        data, name = await trio.to_thread.run_sync(self._journal_write, seq, shard, pos, data, prepare)
        self._unsynced.add(name)
        entry = Pending(seq, data, time.time_ns())
        self._record(shard, target, pos, entry)
        return entry

    def _record(self, shard: ShardId, target: ShardTarget, pos: int, entry: Pending) -> None:
        dirty = self._dirty.setdefault(shard, _Dirty(target))
        old = dirty.put(pos, entry)
        if old is not None:
            dirty.superseded.append(old.seq)
        self._bytes += len(entry.data or b"") - len(old.data or b"") if old else len(entry.data or b"")
        self._last_write = time.monotonic()
        self._wake.set()

    def _journal_write(self, seq: int, shard: ShardId, pos: int, data: bytes | None,
                       prepare: Callable[[bytes], bytes] | None) -> tuple[bytes | None, str]:
        if data is not None and prepare is not None:
            data = prepare(data)
        os.makedirs(self.journal, exist_ok=True)
        header = json.dumps({"array": shard[0], "shard": list(shard[1]), "pos": pos,
                             "deleted": data is None}).encode()
        name = f"{seq:020d}.j"
        tmp = os.path.join(self.journal, name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(header + b"\n" + (data or b""))
        os.rename(tmp, os.path.join(self.journal, name))
        return data, name

    async def sync(self) -> None:
        """Make every journal entry written so far durable (fsync)."""
        names, self._unsynced = self._unsynced, set()
        if names:
            await trio.to_thread.run_sync(self._sync_files, names)

    def _sync_files(self, names: set[str]) -> None:
        for name in names:
            try:
                fd = os.open(os.path.join(self.journal, name), os.O_RDONLY)
            except FileNotFoundError:
                continue  # already folded into a shard, which was fsynced
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(self.journal)

    # ----- folding ------------------------------------------------------------------------

    async def fold(self, shard: ShardId) -> None:
        """Rewrite one shard with its pending chunks; on failure they stay pending (logged)."""
        dirty = self._dirty.get(shard)
        if dirty is None:
            return
        async with dirty.lock:
            snapshot = dict(dirty.chunks)
            superseded = list(dirty.superseded)
            if not snapshot:
                return
            changes = {pos: p.data for pos, p in snapshot.items()}
            try:
                version = await trio.to_thread.run_sync(
                    shard_mod.rewrite_sync, self.source, dirty.target.key, dirty.target.fmt, changes)
            except Exception as e:
                log.error("%s: shard rewrite failed, changes kept in the journal: %s",
                          self.source.path(dirty.target.key), e)
                self._last_write = time.monotonic()  # retried after the next idle time
                return
            # An entry replaced before this fold must go too, or a replay would resurrect it.
            done = [f"{seq:020d}.j" for seq in superseded]
            del dirty.superseded[: len(superseded)]
            for pos, p in snapshot.items():
                if dirty.chunks.get(pos) is p:
                    dirty.drop(pos)
                    self._bytes -= len(p.data or b"")
                done.append(f"{p.seq:020d}.j")
            if not dirty.chunks and self._dirty.get(shard) is dirty:
                del self._dirty[shard]
            await trio.to_thread.run_sync(self._journal_remove, done)
            if self.on_folded is not None:
                await self.on_folded(shard, list(snapshot), version)

    def _journal_remove(self, names: list[str]) -> None:
        for name in names:
            self._unsynced.discard(name)
            try:
                os.unlink(os.path.join(self.journal, name))
            except FileNotFoundError:
                pass

    def _due(self, now: float) -> Iterator[ShardId]:
        # Idle is measured over the whole mount, not per shard: a writer sweeping the
        # array in C order returns to each shard only after it crossed the others.
        everything = self._bytes > self.budget or now - self._last_write >= self.idle
        for shard, dirty in list(self._dirty.items()):
            if everything or dirty.stored >= dirty.target.n_in_grid:
                yield shard

    async def run(self) -> None:
        """Background task: fold shards as they become due, forever."""
        while True:
            with trio.move_on_after(self.idle / 4):
                await self._wake.wait()
            self._wake = trio.Event()
            for shard in list(self._due(time.monotonic())):
                await self.fold(shard)

    async def flush(self) -> None:
        """Fold every pending change into its shard (unmount, SIGTERM)."""
        while self._dirty:
            for shard in list(self._dirty):
                await self.fold(shard)

    # ----- recovery -----------------------------------------------------------------------

    def replay_sync(self, resolve: Callable[[str, tuple[int, ...]], ShardTarget | None]) -> int:
        """Fold the journal left by an earlier daemon into the shards (before mounting).

        ``resolve`` gives the target of a shard (None if its array is gone).
        Returns the number of entries applied.
        """
        try:
            names = sorted(n for n in os.listdir(self.journal) if n.endswith(".j"))
        except FileNotFoundError:
            return 0
        by_shard: dict[ShardId, dict[int, bytes | None]] = {}
        for name in names:
            with open(os.path.join(self.journal, name), "rb") as f:
                header, _, data = f.read().partition(b"\n")
            meta = json.loads(header)
            shard = (meta["array"], tuple(meta["shard"]))
            by_shard.setdefault(shard, {})[meta["pos"]] = None if meta["deleted"] else data
        for (array, coords), changes in by_shard.items():
            target = resolve(array, coords)
            if target is None:
                log.error("journal: array %r no longer presentable; dropping %d changes", array, len(changes))
                continue
            shard_mod.rewrite_sync(self.source, target.key, target.fmt, changes)
            self.source.remove_temporaries(os.path.dirname(target.key))
        for name in os.listdir(self.journal):
            os.unlink(os.path.join(self.journal, name))
        fsync_dir(self.journal)
        self._seq = 0
        return len(names)


def chunks_in_shard(grid: tuple[int, ...], per_shard: tuple[int, ...], shard: tuple[int, ...]) -> int:
    """How many inner chunks of ``shard`` lie inside an array of ``grid`` chunks."""
    return math.prod(max(0, min(n, g - s * n)) for g, n, s in zip(grid, per_shard, shard))
