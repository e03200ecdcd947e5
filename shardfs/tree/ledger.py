"""What a worker's successor must find again to keep the kernel's numbers meaning the same:
the numbers that cannot be computed, written down as they are given out.

A supervised mount (``shardfs.app.supervisor``) replaces a worker that died on the same kernel
connection; the kernel still holds the inode numbers, file handles and directory handles the
dead worker gave it. Chunk inodes are computed from an array's slot, but the slots themselves,
directory and metadata inodes, and the open handles are given out in the order requests came:
each is appended here as one line when given out (``note``: one ``write`` to a file opened
``O_APPEND``, no fsync: only the worker's death must be survived, not the machine's), and the
next worker reads them back (``load``) before it serves the connection.

Records (JSON arrays; the first item says which): ``["a", slot, path]`` an array's slot,
``["k", ino, kind, ...]`` a node key's inode (``NodeTable``), ``["t", ino, parent, name]`` a
staging file's inode and name (again when renamed), ``["v", ino]`` removed, ``["u", ino, kind,
...]`` committed onto a node (renamed onto a chunk or metadata file: the kernel's dentry of that
name holds its inode), ``["h", fh, ino, kind]`` a handle opened and ``["x", fh]`` released
(``kernel.handles``), ``["w", fh]`` a handle open for writing got bytes that only the worker's
memory held, ``["c", fh]`` none any more (its staging file was committed). When the file
outgrows ``COMPACT_BYTES`` its holder rewrites it with the records still in effect
(``rewrite``). A ledger without a path keeps nothing (an unsupervised mount, the in-process
tests).

Shared by ``-o workers=N`` (``share``): every worker appends to the one file and follows what
the others append (``catch_up``: the records since it last looked, given to each ``follower``).
A number whose meaning every worker must agree on (an array's slot, a node key's inode) is
given out under an exclusive ``flock`` of the file after a catch-up (``locked``), so the first
worker to note a key gives it its number and every other one finds that number; handle numbers
need no lock: each worker gives out its own residue (``owner``). A shared ledger is never
rewritten (the others hold it open and follow it by offset).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from typing import Any, Callable, Iterable, Iterator

COMPACT_BYTES = 8 << 20  # a ledger this large is rewritten with the records still in effect
_HANDLE = re.compile(rb'\["([hxwc])",(\d+)')  # a handle's record, and its number (read without JSON)


class Ledger:
    """The records of one kernel connection, in the file ``path`` (None: nothing is kept)."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path
        self._fd = -1
        self._early: list[bytes] | None = None if path is None else []  # noted before ``start``
        self.size = 0
        self.index, self.count = 0, 1  # this worker's slot of ``count`` sharing the file (``share``)
        self.followers: list[Callable[[list[list[Any]]], None]] = []
        self._read = 0  # bytes of the file followed so far (``catch_up``)
        self._partial = b""  # a line another worker is still writing
        self._locks = 0

    def share(self, index: int, count: int) -> None:
        """This ledger is worker ``index``'s of ``count`` serving one connection."""
        self.index, self.count = index, count

    @property
    def shared(self) -> bool:
        return self.count > 1 and self.path is not None

    def owner(self, number: int) -> int:
        """The worker that gave out handle ``number`` (``Handles``: residue ``number - 1`` mod count)."""
        return (number - 1) % self.count

    def tail(self) -> list[list[Any]]:
        """The complete records appended since the last ``tail`` (by every worker, this one too)."""
        if self.path is None:
            return []
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return []
        try:
            chunks = []
            while True:
                data = os.pread(fd, 1 << 20, self._read)
                if not data:
                    break
                chunks.append(data)
                self._read += len(data)
        finally:
            os.close(fd)
        if not chunks:
            return []
        lines = (self._partial + b"".join(chunks)).split(b"\n")
        self._partial = lines.pop()
        return _parse(lines)

    def catch_up(self) -> list[list[Any]]:
        """Give the records appended since the last look to every follower (a shared ledger
        only); the records."""
        if not self.shared or self._fd < 0:
            return []
        records = self.tail()
        if records:
            for follow in self.followers:
                follow(records)
        return records

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the file's exclusive lock, caught up (a shared ledger; else nothing): give out a
        number inside, after checking the followers did not learn one for the same key."""
        if not self.shared or self._fd < 0 or self._locks:
            yield
            return
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        self._locks += 1
        try:
            self.catch_up()
            yield
        finally:
            self._locks -= 1
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def start(self) -> None:
        """Open the file (creating its directory, mode 0700), with what was noted before;
        ``OSError`` if it cannot be made."""
        if self.path is None or self._early is None:
            return
        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self.size = os.fstat(self._fd).st_size
        early, self._early = self._early, None
        for line in early:
            self._write(line)

    def note(self, *record: Any) -> None:
        """Append one record (nothing without a path; kept in memory until ``start``)."""
        if self._fd >= 0:
            self._write(json.dumps(record, separators=(",", ":")).encode() + b"\n")
        elif self._early is not None:
            self._early.append(json.dumps(record, separators=(",", ":")).encode() + b"\n")

    def note_line(self, text: str) -> None:
        """``note`` of a record already written as its JSON array (ASCII), for the records of
        every open and release, where ``json.dumps`` would cost more than the ``write``."""
        if self._fd >= 0:
            self._write(text.encode() + b"\n")
        elif self._early is not None:
            self._early.append(text.encode() + b"\n")

    def _write(self, line: bytes) -> None:
        os.write(self._fd, line)
        self.size += len(line)

    @property
    def full(self) -> bool:
        """True when the file should be rewritten (``rewrite``; never a shared one)."""
        return self.size > COMPACT_BYTES and not self.shared

    def rewrite(self, records: Iterable[Iterable[Any]]) -> None:
        """Replace the file by ``records`` (atomically: a rename)."""
        if self.path is None:
            return
        tmp = f"{self.path}.new"
        data = b"".join(json.dumps(list(r), separators=(",", ":")).encode() + b"\n" for r in records)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        self.size = len(data)

    @staticmethod
    def load(path: str) -> list[list[Any]]:
        """The records in ``path`` (none if it does not exist; a line cut by a death is skipped),
        without those of the handles opened and released since (most of a long-lived ledger:
        two records per file opened, up to ``COMPACT_BYTES``; parsing them all cost the next
        worker 77 MiB of memory for 8 MiB of them, and most of it stayed): of those, only the
        release of the highest number is kept (new numbers follow it: ``Handles.restore``)."""
        try:
            with open(path, "rb") as f:
                lines = f.read().split(b"\n")
        except FileNotFoundError:
            return []
        kept: list[bytes | None] = []
        by_handle: dict[int, list[int]] = {}  # an open handle -> its records' indexes in ``kept``
        released, highest = None, -1
        for line in lines:
            m = _HANDLE.match(line)
            if m is not None:
                fh = int(m[2])
                if m[1] == b"x" and fh in by_handle:
                    for i in by_handle.pop(fh):
                        kept[i] = None
                    if fh > highest:
                        released, highest = line, fh
                    continue
                by_handle.setdefault(fh, []).append(len(kept))
            kept.append(line)
        return _parse([line for line in kept if line is not None] + ([released] if released else []))


def _parse(lines: list[bytes]) -> list[list[Any]]:
    records = []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, list) and rec:
            records.append(rec)
    return records
