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
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterable

COMPACT_BYTES = 8 << 20  # a ledger this large is rewritten with the records still in effect


class Ledger:
    """The records of one kernel connection, in the file ``path`` (None: nothing is kept)."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path
        self._fd = -1
        self._early: list[bytes] | None = None if path is None else []  # noted before ``start``
        self.size = 0

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

    def _write(self, line: bytes) -> None:
        os.write(self._fd, line)
        self.size += len(line)

    @property
    def full(self) -> bool:
        """True when the file should be rewritten (``rewrite``)."""
        return self.size > COMPACT_BYTES

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
        """The records in ``path`` (none if it does not exist; a line cut by a death is skipped)."""
        try:
            with open(path, "rb") as f:
                lines = f.read().split(b"\n")
        except FileNotFoundError:
            return []
        records = []
        for line in lines:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, list) and rec:
                records.append(rec)
        return records
