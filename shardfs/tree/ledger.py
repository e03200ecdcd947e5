"""What a worker's successor must find again to keep the kernel's numbers meaning the same:
the numbers that cannot be computed, written down as they are given out.

A supervised mount (``shardfs.app.supervisor``) replaces a worker that died on the same kernel
connection; the kernel still holds the inode numbers, file handles and directory handles the
dead worker gave it. Chunk inodes are computed from an array's slot, but the slots themselves,
directory and metadata inodes, and the open handles are given out in the order requests came:
each is appended here as one line when given out (``note``: one ``write`` to a file opened
``O_APPEND``, no fsync: only the worker's death must be survived, not the machine's), and the
next worker reads them back (``load``) before it serves the connection.

The records live in memory, not on a disk: a ``memfd`` the supervisor makes and keeps for the
connection's life, given to each worker (``Ledger(fd=...)``). A file on the source's disk (the
state directory, as before) cost each open a ``write`` that a journaling filesystem busy with
other work could hold for milliseconds (measured: 136 ms at worst, 0.5 s in a 3072-chunk read
of a supervised mount, and 1.2x the daemon CPU per chunk of an unsupervised one); only a worker's
death must be survived, which memory the supervisor holds does. ``Ledger(path)`` (a file) is
kept for a supervisor of an older package that gives no memfd.

Records (JSON arrays; the first item says which): ``["a", slot, path]`` an array's slot,
``["k", ino, kind, ...]`` a node key's inode (``NodeTable``), ``["t", ino, parent, name]`` a
staging file's inode and name (again when renamed), ``["v", ino]`` removed, ``["u", ino, kind,
...]`` committed onto a node (renamed onto a chunk or metadata file: the kernel's dentry of that
name holds its inode), ``["h", fh, ino, kind]`` a handle opened (then, a read handle of a shared ledger, its version's
size and mtime; then the kernel's number of the request that made it) and ``["x", fh]`` released
(``kernel.handles``; ``note_later``: written with the next record, so a death may lose it, and the
successor then keeps a handle the kernel never names), ``["w", fh]`` a handle open for writing
got bytes that only the worker's memory held, ``["c", fh]`` none any more (its staging file was
committed). When the file outgrows ``COMPACT_BYTES`` its holder rewrites it with the records still in effect
(``rewrite``: a file is replaced by a rename; a memfd gets the records in effect appended, then
what came before them is punched out, so a death at any point leaves records that say the same).
A ledger without a path or memfd keeps nothing (an unsupervised mount, the in-process tests).

Shared by ``-o workers=N`` (``share``): every worker appends to the one file and follows what
the others append (``catch_up``: the records since it last looked, given to each ``follower``).
A number whose meaning every worker must agree on (an array's slot, a node key's inode) is
given out under an exclusive ``flock`` of the file after a catch-up (``locked``), so the first
worker to note a key gives it its number and every other one finds that number; handle numbers
need no lock: each worker gives out its own residue (``owner``). A shared memfd is compacted
in place (``compact``: offsets never move, the others follow it by offset); a shared file (a
supervisor of an older package) is never rewritten.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import re
from typing import Any, Callable, Iterable, Iterator

from shardfs.base.libc import LIBC

COMPACT_BYTES = 8 << 20  # a ledger this large is rewritten with the records still in effect
FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 1, 2
_HANDLE = re.compile(rb'\["([hxwc])",(\d+)')  # a handle's record, and its number (read without JSON)
_ALIAS = re.compile(rb'\["([tukf])",(\d+)')  # an inode's record ("f": the kernel forgot an alias: ``NodeTable.forget``)
_OPENED = re.compile(rb'\["h",(\d+),(\d+),"([rwd])"(?:,(\d+),(-?\d+))?(?:,(\d+))?\]')  # ``Handles.add``'s record


def memory() -> int:
    """A new memfd for a connection's records (close-on-exec): the supervisor's to keep and give."""
    return os.memfd_create("shardfs-ledger", os.MFD_CLOEXEC)


class Ledger:
    """The records of one kernel connection, in the file ``path`` (None: nothing is kept)."""

    def __init__(self, path: str | None = None, fd: int | None = None) -> None:
        """``path``: a file; ``fd``: a memfd the supervisor keeps (``memory``; opened again here
        at ``start``, so each worker has an open file of its own: ``flock`` is per open file)."""
        self.path = path
        self._given = fd
        self.in_memory = fd is not None
        self._fd = -1
        self._early: list[bytes] | None = None if path is None and fd is None else []  # noted before ``start``
        self.size = 0  # bytes of the records in effect (since ``_base``)
        self._base = 0  # where they start (a memfd: after the last ``rewrite``)
        self.index, self.count = 0, 1  # this worker's slot of ``count`` sharing the file (``share``)
        self.kept = path is not None or fd is not None  # the records are kept (a file or a memfd)
        self.shared = False  # other workers append too (``share``: count > 1)
        self.followers: list[Callable[[list[list[Any]]], None]] = []
        self._read = 0  # bytes of the file followed so far (``catch_up``)
        self._partial = b""  # a line another worker is still writing
        self._later = b""  # records written with the next one (``note_later``)
        self._locks = 0

    def share(self, index: int, count: int) -> None:
        """This ledger is worker ``index``'s of ``count`` serving one connection."""
        self.index, self.count = index, count
        self.shared = count > 1 and self.kept

    def owner(self, number: int) -> int:
        """The worker that gave out handle ``number`` (``Handles``: residue ``number - 1`` mod count)."""
        return (number - 1) % self.count

    def mine(self, number: int) -> bool:
        """True if this worker gave out ``number``."""
        return self.owner(number) == self.index

    def tail(self) -> list[list[Any]]:
        """The complete records appended since the last look (by every worker, this one too)."""
        return _parse(self._new_lines())

    def _new_lines(self) -> list[bytes]:
        """The complete lines appended since the last look (``tail``, ``records``), which then
        includes them."""
        if self.in_memory:
            if self._fd < 0:
                return []
            start = _data_start(self._fd)
            if self._read < start:  # another worker compacted what this one had not read (``compact``)
                self._read, self._partial = start, b""
            chunks = self._pread_from(self._fd)
        elif self.path is None:
            return []
        else:
            try:
                fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return []
            try:
                chunks = self._pread_from(fd)
            finally:
                os.close(fd)
        if not chunks:
            return []
        lines = (self._partial + b"".join(chunks)).split(b"\n")
        self._partial = lines.pop()
        return lines

    def _pread_from(self, fd: int) -> list[bytes]:
        """What ``fd`` holds past the bytes followed so far (which then include it)."""
        chunks: list[bytes] = []
        while True:
            data = os.pread(fd, 1 << 20, self._read)
            if data:
                chunks.append(data)
                self._read += len(data)
            if len(data) < 1 << 20:  # (the end: a second ``pread`` would find nothing more)
                return chunks

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
        """Open the file (creating its directory, mode 0700) or the memfd, with what was noted
        before; ``OSError`` if it cannot be made."""
        if not self.kept or self._early is None:
            return
        if self._given is not None:
            self._fd = os.open(f"/proc/self/fd/{self._given}", os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
            os.close(self._given)
            self._given = None
            self._base = _data_start(self._fd)
            self.size = os.fstat(self._fd).st_size - self._base
        else:
            assert self.path is not None
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

    def note_later(self, text: str) -> None:
        """``note_line`` of a record a worker's successor may do without (a handle released: lost,
        the successor keeps a handle the kernel never names again): written with the next record
        noted (one ``write`` for both, one a chunk file read instead of two), at once in a shared
        ledger (the other workers let go of what they hold for it)."""
        if self.shared or self._fd < 0:
            self.note_line(text)
        else:
            self._later += text.encode() + b"\n"

    def _write(self, line: bytes) -> None:
        if self._later:
            line, self._later = self._later + line, b""
        if self.shared and not self._locks:  # (never while another worker compacts: ``compact``)
            fcntl.flock(self._fd, fcntl.LOCK_SH)
            try:
                os.write(self._fd, line)
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        else:
            os.write(self._fd, line)
        self.size += len(line)

    @property
    def full(self) -> bool:
        """True when the file should be rewritten (``rewrite``; a shared memfd: ``compact``; never a
        shared file)."""
        return self.size > COMPACT_BYTES and (not self.shared or self.in_memory)

    def compact(self) -> None:
        """A shared memfd (``-o workers=N``): append the records in effect of every worker
        (``in_effect`` of what it holds), framed by ``["z", {slot: highest handle number given}]``
        and ``["z."]``, then punch out what came before. Done under the exclusive lock, which
        every append to a shared ledger takes shared (``_write``), so nothing is appended
        meanwhile. A worker that had not read the punched records finds every record in effect
        in the frame, and lets go of the handles it holds that the frame does not name and that
        were given before it (``Handles.follow``): their releases were punched out."""
        if not (self.shared and self.in_memory) or self._fd < 0:
            return
        with self.locked():
            start, base = os.fstat(self._fd).st_size, _data_start(self._fd)
            data = b"".join(_read_range(self._fd, base, start))
            lines = data.split(b"\n")
            highest: dict[int, int] = {}
            for line in lines:
                m = _HANDLE.match(line)
                if m is not None and m[1] == b"h":
                    fh = int(m[2])
                    highest[self.owner(fh)] = max(highest.get(self.owner(fh), 0), fh)
            framed = [["z", {str(k): v for k, v in highest.items()}], *in_effect(lines), ["z."]]
            block = b"\n" + b"".join(json.dumps(r, separators=(",", ":")).encode() + b"\n" for r in framed)
            self._later = b""
            os.write(self._fd, block)
            _punch(self._fd, length=start)
            self._base, self.size = start, len(block)
            self._read, self._partial = start + len(block), b""  # (this worker knows what it says)

    def rewrite(self, records: Iterable[Iterable[Any]]) -> None:
        """Replace the file by ``records`` (atomically: a rename; a memfd: see the module docstring)."""
        data = b"".join(json.dumps(list(r), separators=(",", ":")).encode() + b"\n" for r in records)
        self._later = b""  # (``records`` say what is in effect)
        if self.in_memory:
            if self._fd < 0:
                return
            start = os.fstat(self._fd).st_size  # where the appended records begin (one writer)
            os.write(self._fd, b"\n" + data)  # the newline ends the line the punched bytes make
            _punch(self._fd, start)
            self._base, self.size = start, len(data) + 1
            return
        if self.path is None:
            return
        tmp = f"{self.path}.new"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        self.size = len(data)

    def records(self) -> list[list[Any]]:
        """Every record in effect (from the last ``rewrite`` on): what a worker taking over the
        connection restores (after ``start``); ``in_effect`` says which. Of a shared ledger, what
        every worker gave out so far (a dead one's too), followed from there on (``catch_up``):
        parsing all of them cost the worker that replaced a dead one 47 MiB of PSS more than the
        one it replaced (the soak's S3 mount at two workers; its ledger up to ``COMPACT_BYTES``)."""
        if self.in_memory or self.shared:
            return in_effect(self._new_lines())
        return self.load(self.path) if self.path is not None else []

    @staticmethod
    def load(path: str) -> list[list[Any]]:
        """The records in effect in file ``path`` (none if it does not exist): ``in_effect``."""
        try:
            with open(path, "rb") as f:
                lines = f.read().split(b"\n")
        except FileNotFoundError:
            return []
        return in_effect(lines)


def in_effect(lines: list[bytes]) -> list[list[Any]]:
    """The records of ``lines`` (a line cut by a death is skipped), without those of the handles
    opened and released since (most of a long-lived ledger: two records per file opened, up to
    ``COMPACT_BYTES``; parsing them all cost the next worker 77 MiB of memory for 8 MiB of them,
    most of which stayed, and 1.4 s): of those, only the release of the highest number is kept
    (new numbers follow it: ``Handles.restore``). Likewise the records of the inodes the kernel
    forgot that only showed another node (a temporary committed onto a chunk: every write of zarr's
    or tensorstore's), but for the last forget of the highest (inode numbers follow it): a new
    worker kept each of them as a live alias, its RSS growing with the writes since the last
    compaction (the soak's RSS steps at worker kills)."""
    kept: list[bytes | None] = []
    by_handle: dict[int, list[int]] = {}  # an open handle -> its records' indexes in ``kept``
    highest, at = -1, -1  # the highest released handle, and the index of its release in ``kept``
    by_ino: dict[int, list[int]] = {}  # an inode's "t", "u", "k" records' indexes in ``kept``
    top, top_at = -1, -1  # the highest forgotten inode, and the index of its forget
    for line in lines:
        a = _ALIAS.match(line)
        if a is not None:
            ino = int(a[2])
            if a[1] != b"f":
                by_ino.setdefault(ino, []).append(len(kept))
            else:
                for i in by_ino.pop(ino, ()):
                    kept[i] = None
                if ino < top:
                    continue
                if top_at >= 0:
                    kept[top_at] = None
                top, top_at = ino, len(kept)
            kept.append(line)
            continue
        m = _HANDLE.match(line)
        if m is not None:
            fh = int(m[2])
            if m[1] == b"x" and fh in by_handle:
                for i in by_handle.pop(fh):
                    kept[i] = None
                if fh < highest:
                    continue
                if at >= 0:
                    kept[at] = None
                highest, at = fh, len(kept)
            else:
                by_handle.setdefault(fh, []).append(len(kept))
        kept.append(line)
    return _parse([line for line in kept if line is not None])


def _read_range(fd: int, start: int, end: int) -> list[bytes]:
    """The bytes of ``fd`` from ``start`` to ``end``."""
    out = []
    while start < end:
        chunk = os.pread(fd, min(1 << 20, end - start), start)
        if not chunk:
            break
        out.append(chunk)
        start += len(chunk)
    return out


def _data_start(fd: int) -> int:
    """The first offset of ``fd`` that is not a hole (what ``rewrite`` punched out)."""
    try:
        return os.lseek(fd, 0, os.SEEK_DATA)
    except OSError:  # ENXIO: no data at all
        return os.fstat(fd).st_size


def _punch(fd: int, length: int) -> None:
    """Free the first ``length`` bytes of ``fd`` (they read as zeros; the size stays)."""
    if length <= 0:
        return
    libc = LIBC
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    if libc.fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, length) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _parse(lines: list[bytes]) -> list[list[Any]]:
    records: list[list[Any]] = []
    for line in lines:
        # the records of every open and release (two a chunk file read, parsed by every worker of
        # a shared ledger) without ``json.loads``: 3x faster, the same lists
        if line.startswith(b'["x",') and line.endswith(b"]") and line[5:-1].isdigit():
            records.append(["x", int(line[5:-1])])
            continue
        if line.startswith(b'["h",'):
            m = _OPENED.fullmatch(line)
            if m is not None:
                fh, ino, kind, size, mtime, made = m.groups()
                rec = ["h", int(fh), int(ino), kind.decode()]
                if size is not None:
                    rec += [int(size), int(mtime)]
                if made is not None:
                    rec.append(int(made))
                records.append(rec)
                continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, list) and rec:
            records.append(rec)
    return records
