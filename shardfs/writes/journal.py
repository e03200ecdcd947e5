"""The write journal: committed chunk changes on disk until their shards are rewritten.

The journal is a directory of append-only segment files, ``<segno:020d>.seg``,
numbered in the order they were started (a new one once the current one is
``SEGMENT_BYTES`` long). Each committed chunk change is one record, appended
with a single ``os.write`` to the current segment::

    header  struct "<4sIQI": MAGIC, meta length, data length, crc32c(meta + data)
    meta    JSON: {"array": path, "shard": [coords], "pos": n, "deleted": bool}
    data    the chunk's stored bytes (empty for a deleted chunk)

A second kind of record, the fold marker (meta ``{"kind": "folded", "offsets": [n, ...]}``,
no data), names records earlier in the same segment, by their offset in it, that
were released: their chunks reached their shards (or were discarded). ``recover``
skips them, so a replay never writes an old value over a newer one that another
writer (a second mount, tensorstore, zarr-python) stored after the fold.

Contracts:
- ``append`` returns once the record is in the page cache: it survives a
  SIGKILL of the daemon. ``sync`` makes every record appended before it was
  called durable (power loss). A short write is continued; if an append
  fails (a write error, or a write that makes no progress), the caller's
  commit fails with ``OSError`` and that segment is abandoned: no record
  follows a torn one, so a torn record is only ever at the end of a segment.
- A record stays on disk while it is live: until the caller ``release``s its
  handle (its shard was rewritten with it or with a newer value of its chunk).
  A segment with no live records is closed and unlinked, the current one
  included: once everything is released the directory is empty. Releasing records
  of a segment that stays appends a fold marker naming them to that segment (opened
  again if it is no longer the current one). The marker is a buffered write (it
  survives a SIGKILL, not a power loss unless a later ``sync`` covered its segment).
  A segment a write failed on (a full disk) takes no more markers: its records are
  then released in place, their magic overwritten with ``RELEASED`` (no new space
  needed), and ``recover`` skips them too.
  Window: a crash between a shard's replace and its marker (or a marker that could
  not be written either way: logged) leaves those records unmarked, and the next
  mount replays them as before markers existed, writing their chunks' folded values
  again over whatever came since.
- ``recover`` reads what an earlier daemon left: segments in name order,
  records in file order, each segment up to its first incomplete or damaged
  record (never acknowledged: the append did not return), without the records a
  fold marker names (journals without markers are read as before). ``discard_recovered``
  deletes those segments (after their changes reached their shards or were appended
  again to a new segment).
- ``KEPT`` (``kept.json``), when present, says which shards' changes could not be
  folded and why: ``{shard key: [pending chunk changes, reason]}``, written by
  ``note_kept``; ``shardfs umount`` reports it.

Several daemons may write one source at once (two mounts), so a source's
journal root holds one journal directory per daemon,
``<start time ns:020d>-<pid>``, which that daemon keeps ``flock``ed while it
runs. ``claim`` makes this daemon's directory and hands over the directories
no live daemon holds (their daemon was killed): the mount replays them, then
removes them. A live daemon's journal is never touched by another.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
import struct
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import crc32c
import trio

from shardfs.base import private
from shardfs.base.files import fsync_dir

log = logging.getLogger("shardfs")

MAGIC = b"SFJ1"
RELEASED = b"SFJ0"  # the magic of a record released in place (when no fold marker could be appended)
HEADER = struct.Struct("<4sIQI")  # magic, meta length, data length, crc32c over meta + data
SEGMENT_BYTES = 64 << 20  # a segment is rotated once it is this long
SEGMENT_NAME = re.compile(r"\d{20}\.seg")
KEPT = "kept.json"
DAEMON_DIR = re.compile(r"\d{20}-\d+")


class JournalError(Exception):
    """The journal directory holds something this version cannot replay."""


@dataclass(frozen=True)
class Change:
    """One committed chunk change: the stored bytes of inner chunk ``pos`` of a shard (None: deleted)."""

    array: str
    shard: tuple[int, ...]
    pos: int
    data: bytes | None


def encode_record(change: Change) -> bytes:
    """The bytes of one journal record holding ``change``."""
    meta = {"array": change.array, "shard": list(change.shard), "pos": change.pos, "deleted": change.data is None}
    return _frame(meta, change.data or b"")


def encode_marker(offsets: Iterable[int]) -> bytes:
    """The bytes of a fold marker naming the records at ``offsets`` of its segment."""
    return _frame({"kind": "folded", "offsets": sorted(offsets)}, b"")


def _frame(meta_doc: dict, data: bytes) -> bytes:
    meta = json.dumps(meta_doc).encode()
    header = HEADER.pack(MAGIC, len(meta), len(data), crc32c.crc32c(data, crc32c.crc32c(meta)))
    return b"".join((header, meta, data))


def decode_records(buf: bytes) -> tuple[list[Change], int]:
    """The changes of the complete, intact records at the start of ``buf`` that no fold
    marker among them names, and the number of bytes those records span.

    Decoding stops at the first record that is incomplete or whose magic or
    crc32c does not match; a record with a matching crc32c but unreadable meta
    raises ``JournalError``.
    """
    live, end = _decode(buf)
    return list(live.values()), end


def _decode(buf: bytes) -> tuple[dict[int, Change], int]:
    """``decode_records`` with each live change's offset in ``buf``."""
    changes: dict[int, Change] = {}  # offset -> change
    folded: set[int] = set()
    view = memoryview(buf)
    end = 0
    while end + HEADER.size <= len(buf):
        magic, meta_len, data_len, crc = HEADER.unpack_from(buf, end)
        start = end + HEADER.size
        stop = start + meta_len + data_len
        if magic not in (MAGIC, RELEASED) or stop > len(buf) or crc32c.crc32c(view[start:stop]) != crc:
            break
        if magic == RELEASED:
            end = stop
            continue
        try:
            meta = json.loads(bytes(view[start: start + meta_len]))
            if meta.get("kind") == "folded":
                folded.update(int(offset) for offset in meta["offsets"])
            else:
                data = None if meta["deleted"] else bytes(view[start + meta_len: stop])
                changes[end] = Change(meta["array"], tuple(meta["shard"]), meta["pos"], data)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise JournalError(f"record at offset {end}: unreadable meta: {e}") from None
        end = stop
    return {offset: change for offset, change in changes.items() if offset not in folded}, end


@dataclass(eq=False)
class _Segment:
    path: str
    fd: int | None  # open for appending while this is the current segment
    size: int = 0
    live: int = 0  # appended records not yet released
    torn: bool = False  # a write to it failed: nothing more is appended to it (no fold markers either)


@dataclass(eq=False, frozen=True)
class Record:
    """Handle of one appended record: pass it to ``Journal.release`` exactly once."""

    segment: _Segment
    offset: int  # where the record starts in its segment (a fold marker names it so)


class Journal:
    """The segments of one mount. ``append`` and ``release`` are called from the trio
    thread only; ``sync`` is async (its fsyncs run in a worker thread)."""

    def __init__(self, directory: str, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self._current: _Segment | None = None
        self._next = 0  # number of the next segment
        self._unsynced: set[str] = set()  # segments appended to since the last sync
        self._new_dirs: list[str] = []  # directories with entries created since the last sync
        self._sync_lock = trio.Lock()
        self._recovered: list[str] = []  # segments read by ``recover``
        self.bytes = 0  # bytes in this mount's segments on disk (``shardfs status``)
        self.failed: tuple[int, str, float] | None = None  # the last append's failure: errno, why, when
        # adopted directory -> (its segments still on disk, called once there are none)
        self._adopted: dict[str, tuple[int, Callable[[str], None]]] = {}

    # ----- appending ----------------------------------------------------------------------

    def append(self, change: Change) -> Record:
        """Append one record; raises ``OSError`` if it could not be written whole."""
        record = encode_record(change)
        seg = self._current
        try:
            if seg is None or seg.size >= self.segment_bytes:
                seg = self._start_segment()
            assert seg.fd is not None  # the current segment is open
            try:
                _write_all(seg.fd, seg.path, record)
            except OSError:
                seg.torn = True
                self._close(seg)  # a torn record ends this segment
                raise
        except OSError as e:
            self.failed = (e.errno or errno.EIO, e.strerror or str(e), time.monotonic())
            raise
        self.failed = None
        offset = seg.size
        seg.size += len(record)
        self.bytes += len(record)
        seg.live += 1
        self._unsynced.add(seg.path)
        return Record(seg, offset)

    def _start_segment(self) -> _Segment:
        if self._current is not None:
            self._close(self._current)
        missing = []  # the journal directory and its ancestors that do not exist yet
        d = self.directory
        while not os.path.isdir(d):
            missing.append(d)
            d = os.path.dirname(d)
        if missing:
            os.makedirs(self.directory, mode=0o700)  # it holds chunk data: private, as XDG asks
            self._new_dirs += [os.path.dirname(m) for m in reversed(missing)]
        path = os.path.join(self.directory, f"{self._next:020d}.seg")
        self._next += 1
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        self._new_dirs.append(self.directory)
        self._current = _Segment(path, fd)
        return self._current

    def _close(self, seg: _Segment) -> None:
        """Stop appending to ``seg``; unlink it if no record in it is live."""
        if seg is self._current:
            self._current = None
        if seg.fd is not None:
            os.close(seg.fd)
            seg.fd = None
        if seg.live == 0:
            self._unsynced.discard(seg.path)
            try:
                os.unlink(seg.path)
                self.bytes -= seg.size
            except OSError as e:
                log.error("%s: cannot delete a folded journal segment: %s", seg.path, e)
                return
            self._segment_gone(os.path.dirname(seg.path))

    def _segment_gone(self, directory: str) -> None:
        if directory not in self._adopted:
            return
        left, emptied = self._adopted.pop(directory)
        if left > 1:
            self._adopted[directory] = (left - 1, emptied)
        else:
            emptied(directory)  # every record of that dead worker's journal was released

    # ----- releasing ----------------------------------------------------------------------

    def release(self, records: Iterable[Record]) -> None:
        """Records whose changes reached their shards (durably) or are discarded: their
        segments may go; a segment that stays gets a fold marker naming them."""
        by_segment: dict[_Segment, list[int]] = {}
        for record in records:
            record.segment.live -= 1
            by_segment.setdefault(record.segment, []).append(record.offset)
        for seg, offsets in by_segment.items():
            if seg.live == 0:
                self._close(seg)
            elif seg.torn or not self._mark_folded(seg, offsets):
                self._mark_in_place(seg, offsets)

    def _mark_folded(self, seg: _Segment, offsets: list[int]) -> bool:
        """Append a fold marker naming ``offsets`` to ``seg``; False if it could not be written
        (that ends markers in ``seg``: a torn marker ends its segment)."""
        marker = encode_marker(offsets)
        fd = seg.fd
        try:
            if fd is None:
                fd = os.open(seg.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
            try:
                _write_all(fd, seg.path, marker)
            finally:
                if seg.fd is None:
                    os.close(fd)
        except OSError:
            seg.torn = True
            if seg is self._current:
                self._close(seg)
            return False
        seg.size += len(marker)
        self.bytes += len(marker)
        return True

    def _mark_in_place(self, seg: _Segment, offsets: list[int]) -> None:
        """Release the records at ``offsets`` of a segment that takes no more markers (a write
        to it failed: a full disk) by overwriting their magic with ``RELEASED``: that needs no
        new space. Without it a replay would write their old values over newer ones folded
        since, this mount's own acknowledged writes included (scripts/soak fills the journal's
        disk, then SIGKILLs the daemon). A failure is logged: the window of the module docstring."""
        try:
            fd = os.open(seg.path, os.O_WRONLY | os.O_CLOEXEC)
            try:
                for offset in offsets:
                    if os.pwrite(fd, RELEASED, offset) != len(RELEASED):
                        raise OSError(errno.EIO, "short write")
            finally:
                os.close(fd)
        except OSError as e:
            log.error("%s: cannot mark %d folded records: a replay would write them again: %s",
                      seg.path, len(offsets), e)

    # ----- durability ---------------------------------------------------------------------

    async def sync(self) -> None:
        """Make every record appended so far durable: fsync the segments appended to and the
        directories that gained entries since the last sync. Concurrent callers wait for
        the sync in progress, then do their own."""
        async with self._sync_lock:
            paths, self._unsynced = self._unsynced, set()
            dirs, self._new_dirs = self._new_dirs, []
            if not (paths or dirs):
                return
            await trio.to_thread.run_sync(self._sync_now, paths, dirs)

    def sync_blocking(self) -> None:
        """``sync`` for callers outside trio (the replay before mounting)."""
        paths, self._unsynced = self._unsynced, set()
        dirs, self._new_dirs = self._new_dirs, []
        self._sync_now(paths, dirs)

    def _sync_now(self, paths: set[str], dirs: list[str]) -> None:
        try:
            _fsync_all(paths, dirs)
        except BaseException:
            self._unsynced |= paths  # not durable: the next sync tries again
            self._new_dirs += dirs
            raise

    # ----- recovery -----------------------------------------------------------------------

    def recover(self) -> list[Change]:
        """Every change in the segments an earlier daemon left, in commit order (call before
        the first ``append``). Raises ``JournalError`` if the directory holds anything but
        segments; logs one warning per segment whose tail is ignored."""
        try:
            names = sorted(os.listdir(self.directory))
        except FileNotFoundError:
            return []
        strange = [n for n in names if not SEGMENT_NAME.fullmatch(n) and n != KEPT]
        if strange:
            raise JournalError(f"{self.directory}: not journal segments: {', '.join(strange[:5])}"
                               f"{' ...' if len(strange) > 5 else ''}")
        self._recovered = names  # the note of kept changes goes with the segments
        names = [n for n in names if n != KEPT]
        changes: list[Change] = []
        for name in names:
            changes += _read_segment(os.path.join(self.directory, name))[0].values()
        if names:
            self._next = int(names[-1][:20]) + 1
        return changes

    def adopt(self, directory: str, emptied: Callable[[str], None] | None = None) -> list[tuple[Change, Record]]:
        """Take over the segments a dead worker of this mount left in ``directory`` as if this
        journal had appended them: each live change (commit order) with its ``Record``, to
        ``release`` once folded (a fold marker then goes into that segment, which is unlinked
        once none of its records is live, as one of this journal's own). A segment with a torn
        tail takes no markers (its records are released in place: ``_mark_in_place``). The
        dead worker's note of kept changes goes (this mount notes its own). ``emptied(directory)``
        is called once no segment is left in it: at once if nothing in it was live, else when
        the release of its last live record unlinked its last segment (``Claim.drop_adopted``:
        a worker that replaced many dead ones holds none of their directories). ``JournalError``
        as for ``recover``."""
        try:
            names = sorted(os.listdir(directory))
        except FileNotFoundError:  # removed by a claim that held it before this one
            if emptied is not None:
                emptied(directory)
            return []
        strange = [n for n in names if not SEGMENT_NAME.fullmatch(n) and n != KEPT]
        if strange:
            raise JournalError(f"{directory}: not journal segments: {', '.join(strange[:5])}"
                               f"{' ...' if len(strange) > 5 else ''}")
        adopted = []
        left = 0  # its segments that stay (with live records)
        for name in names:
            path = os.path.join(directory, name)
            if name == KEPT:
                os.unlink(path)
                continue
            live, end, size = _read_segment(path)
            seg = _Segment(path, None, size, len(live), torn=end < size)
            self.bytes += seg.size
            if not live:
                self._close(seg)  # every record in it was folded
            else:
                left += 1
            adopted += [(change, Record(seg, offset)) for offset, change in live.items()]
        if emptied is not None:
            if left:
                self._adopted[directory] = (left, emptied)
            else:
                emptied(directory)
        return adopted

    def discard_recovered(self) -> None:
        """Delete the segments ``recover`` read (and the note of kept changes), durably: their
        changes reached their shards, or were appended again."""
        for name in self._recovered:
            os.unlink(os.path.join(self.directory, name))
        if self._recovered:
            fsync_dir(self.directory)
        self._recovered = []

    # ----- why records are kept -----------------------------------------------------------

    def note_kept(self, reasons: dict[str, tuple[int, str]]) -> None:
        """Record which shards' changes cannot be folded: ``{key: (changes, reason)}``
        (``{}``: remove the note)."""
        path = os.path.join(self.directory, KEPT)
        if not reasons:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            return
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with open(fd, "w") as f:  # small, rewritten whole; a torn note is only a worse message
            json.dump(reasons, f, indent=1, sort_keys=True)


def kept_line(key: str, changes: int, reason: str) -> str:
    """How a log line and ``shardfs umount`` say that a shard's changes stay in the journal."""
    return f"{changes} change{'s' if changes != 1 else ''} to {key} kept in the journal: {reason}"


def read_kept(directory: str) -> tuple[dict[tuple[str, tuple[int, ...]], set[int]], dict[str, tuple[int, str]]]:
    """What a journal directory holds, without changing it: the chunk positions with records
    per ``(array, shard)`` (records a fold marker names left out), and the ``kept.json`` note."""
    pending: dict[tuple[str, tuple[int, ...]], set[int]] = {}
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return {}, {}
    reasons: dict[str, tuple[int, str]] = {}
    for name in names:
        path = os.path.join(directory, name)
        if name == KEPT:
            try:
                with open(path) as f:
                    reasons = {k: (int(n), str(r)) for k, (n, r) in json.load(f).items()}
            except (OSError, ValueError, TypeError):
                pass
        elif SEGMENT_NAME.fullmatch(name):
            for change in decode_records(_read_own(path))[0]:
                pending.setdefault((change.array, change.shard), set()).add(change.pos)
    return pending, reasons


def _read_segment(path: str) -> tuple[dict[int, Change], int, int]:
    """The live changes of segment ``path`` by offset, where its intact records end, its size;
    a torn tail is logged (a warning)."""
    buf = _read_own(path)
    live, end = _decode(buf)
    if end < len(buf):
        log.warning("%s: ignoring the last %d bytes (from offset %d): an incomplete or damaged "
                    "record, never acknowledged", path, len(buf) - end, end)
    return live, end, len(buf)


def _read_own(path: str) -> bytes:
    """The content of segment ``path``: a regular file of this user's own, opened without
    following a symlink (``JournalError`` otherwise: never replayed)."""
    try:
        fd = private.open_file(None, path, os.O_RDONLY, path)
    except private.Refused as e:
        raise JournalError(str(e)) from None
    with open(fd, "rb") as f:
        return f.read()


def _write_all(fd: int, path: str, data: bytes) -> None:
    """Write ``data`` at the end of segment ``fd``; a short write (e.g. interrupted by a
    signal) goes on where it stopped. Raises ``OSError``."""
    rest = memoryview(data)
    while rest:
        n = os.write(fd, rest)
        if n == 0:
            raise OSError(errno.EIO, f"{path}: write returned 0")
        rest = rest[n:]


def _fsync_all(paths: set[str], dirs: list[str]) -> None:
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue  # every record in it was released: its shards were fsynced
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    for d in dict.fromkeys(dirs):
        fsync_dir(d)


# ----- one journal per daemon under a source's journal root -------------------------------


@dataclass
class Claim:
    """This daemon's journal directory (``directory``, created and locked) and the journals
    of daemons that are gone (``orphans``, oldest first, locked by this daemon until
    ``drop_orphans``)."""

    directory: str
    orphans: list[str]
    _locks: dict[str, int] = field(default_factory=dict)  # directory -> its open, flocked fd
    adopted: list[str] = field(default_factory=list)  # orphans whose records this daemon took over

    def adopt_orphans(self) -> list[str]:
        """The orphans, now adopted: kept locked (their records were taken over:
        ``Journal.adopt``) until ``drop_adopted`` (their folds emptied them) or ``release``."""
        orphans, self.orphans = self.orphans, []
        self.adopted += orphans
        return orphans

    def drop_adopted(self, path: str) -> None:
        """Remove adopted directory ``path``, which holds no segment any more, and unlock it
        (kept locked until ``release`` if anything is left in it). Without it each worker of a
        mount would keep the directories of every worker that died before it, one descriptor
        each, for the mount's life (the soak's fds grew by one per worker kill)."""
        try:
            os.rmdir(path)
        except FileNotFoundError:
            pass
        except OSError:
            return
        self.adopted.remove(path)
        os.close(self._locks.pop(path))

    def drop_orphans(self) -> None:
        """Remove the orphan directories (after their changes were replayed and cleared)."""
        for path in self.orphans:
            try:
                os.rmdir(path)
            except FileNotFoundError:
                pass
            os.close(self._locks.pop(path))
        if self.orphans:
            fsync_dir(os.path.dirname(self.directory))
        self.orphans = []

    def release(self) -> None:
        """At exit: remove this daemon's directory (and those it adopted) if nothing is left in
        it, and unlock it."""
        for path in (self.directory, *self.adopted):
            try:
                os.rmdir(path)
            except OSError:
                pass  # changes not folded: the next mount replays them
        for fd in self._locks.values():
            os.close(fd)
        self._locks.clear()


def claim(root: str, top: str | None = None, shared_top: bool = False) -> Claim:
    """Create and lock a new journal directory for this daemon under ``root`` (made, mode
    0700, durably, this user's own from ``top`` down: ``shardfs.base.private``, which
    raises ``Refused``; ``shared_top``: ``top`` may be a sticky directory others write);
    lock and return the directories of daemons that are gone. Raises
    ``JournalError`` if ``root`` holds anything but daemon directories of this user's."""
    created = []
    d = root
    while not os.path.isdir(d):
        created.append(d)
        d = os.path.dirname(d)
    os.close(private.open_dir(root, top, shared_top=shared_top))
    for path in reversed(created):
        fsync_dir(os.path.dirname(path))
    names = sorted(os.listdir(root))
    strange = [n for n in names if not (DAEMON_DIR.fullmatch(n) and _own_dir(os.path.join(root, n)))]
    if strange:
        raise JournalError(f"{root}: not journal directories: {', '.join(strange[:5])}"
                           f"{' ...' if len(strange) > 5 else ''}")
    locks: dict[str, int] = {}
    for name in names:
        path = os.path.join(root, name)
        fd = _lock(path)
        if fd is not None:
            locks[path] = fd
    own = os.path.join(root, f"{time.time_ns():020d}-{os.getpid()}")
    os.mkdir(own, 0o700)
    fsync_dir(root)
    fd = _lock(own)
    assert fd is not None, "a directory nobody else knows is locked"
    orphans = list(locks)
    locks[own] = fd
    return Claim(own, orphans, locks)


def _own_dir(path: str) -> bool:
    """True if ``path`` is a directory (not a symlink) of this user's own (``private``)."""
    try:
        return private.problem(os.lstat(path)) is None
    except FileNotFoundError:
        return False


def _lock(path: str) -> int | None:
    """An open fd of directory ``path`` holding its exclusive flock; None if a live daemon
    holds it or it is gone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def segments_under(root: str) -> list[str]:
    """Paths (relative to ``root``) of every segment in the daemon journals under ``root``:
    the changes not yet folded (for tools and tests that wait for folds)."""
    out = []
    for dirpath, _dirs, files in os.walk(root):
        out += [os.path.relpath(os.path.join(dirpath, f), root) for f in files]
    return sorted(out)
