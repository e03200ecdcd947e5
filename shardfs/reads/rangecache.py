"""Byte ranges fetched from object storage, kept in memory and optionally on local disk.

Contract:
- ``put(where, version, offset, data)`` records that the object at ``where`` (its full
  location, ``source.describe(key)``) holds ``data`` (any read-only buffer, kept as it is, not
  copied: never modify it after) at ``offset`` in ``version``.
  ``get(where, version, offset, nbytes)`` returns the bytes ``[offset, offset + nbytes)`` of
  that version when ONE recorded range covers them, else None (ranges are never stitched
  together): the range as put when it is exactly that, else a ``memoryview`` of the part
  (no copy; it keeps the range's memory alive, even once evicted, while it is referenced).
  Past the object's end (``version.size``) the result is shorter, as ``Storage.read``
  returns it: a range that ends at the object's end covers every read past it.
  ``lacks(where, version)``: True if memory could keep the whole version but no range there
  covers it (what fetching it whole would add).
  A negative ``offset`` counts from the end (a suffix range).
- A version is identified by its ETag and size (``Version.tag``/``size``; a non-string tag,
  such as a local inode, by the whole ``Version``). A version with an empty ETag (a server
  that sends none) is never cached. Bytes of one version are never served for another.
- Memory: ranges whose sizes sum to at most ``max_bytes`` (0: no memory cache; a range larger
  than that is not kept), the least recently used evicted first, or a random one of the oldest
  while that would have kept more (``shardfs.base.eviction``: a cyclic sweep over more than
  memory holds). A range inside another of the same version is not kept
  twice. Putting a version of an object drops the ranges of its other versions.
- Disk (``disk_dir``, like mountpoint-s3's ``--cache``): every put range is also written, by a
  background thread (``put`` does not wait; ranges beyond ``QUEUE_BYTES`` waiting are not
  written; ``flush()`` waits for the writes: call it at unmount), to a file
  ``DIR/<bucket>/<sha(where)>.<sha(version)>.<offset>.<length>`` (4096 hashed buckets: fast
  with 100k entries), written to a temporary name and renamed (readers, and other daemons
  sharing the directory, see a whole file or none; no lock). A file starts with a header
  holding its key (where, version, offset, length) and a crc32c of every ``BLOCK`` bytes of
  the payload; a read checks the key, the length and the crc32c of the blocks it reads. A
  truncated, corrupted or foreign file is never served: it is removed with one log line.
  Files are not fsynced (a crash may leave a truncated file: removed when read). Putting a
  version of an object removes its files of other versions; a file inside a new one is removed.
  A hit also keeps the blocks read in memory, and sets the file's mtime: disk usage is bounded
  by ``disk_max_bytes`` (default ``DEFAULT_DISK_BYTES``, fixed so that daemons sharing a
  directory agree) by a scan in a background thread, at start and after each
  ``disk_max_bytes / 8`` written (again at its end if that much was written meanwhile), that
  removes the least recently used files (oldest mtime, so atime settings do not matter) until
  at most 7/8 of the bound remain: usage exceeds the bound only by what is written during a scan.
- The directory is this user's own (``shardfs.base.private``: made 0700 if missing, refused
  with ``ValueError`` naming it if another user owns it, others can write it or it is a
  symlink); its buckets are made 0700 and its files 0600, and a file that is not this user's
  own regular file is never served (removed, one log line). It is created if missing
  (``ValueError`` naming it if it cannot be, or if it is a non-empty directory that is not a
  cache: it gets a ``CACHEDIR.TAG``, and files are only
  ever removed from a tagged directory). Any other disk error (ENOSPC, EACCES, EROFS, EIO)
  turns the disk cache off with one log line: the cache goes on in memory alone; neither
  ``get`` nor ``put`` ever raises.
- Thread-safe. A memory hit is a dict lookup under a lock, and ``put`` never waits for the
  disk. A memory miss with a disk cache lists one bucket directory and may read a file: on
  the trio thread, ask ``get(..., disk=False)`` first, then ``get`` in a worker thread.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import struct
import threading
import time
from bisect import bisect_left, bisect_right
from collections import deque

import crc32c

from shardfs.base import private
from shardfs.base.eviction import Eviction
from shardfs.storage import Version
from shardfs.storage.sharedshards import SharedShards

log = logging.getLogger("shardfs")

DEFAULT_DISK_BYTES = 5 << 30
BLOCK = 256 << 10  # payload bytes per crc32c
QUEUE_BYTES = 256 << 20  # ranges waiting for the disk beyond this are not written
WRITER_IDLE = 2.0  # seconds the writer thread waits for more before it ends
MAGIC = b"SFR1"
HEADER = struct.Struct("<4sIQ")  # magic, key length, payload length; then key, crc32c per block, payload
TAG_NAME = "CACHEDIR.TAG"
TAG = b"Signature: 8a477f597d28d172789f06886806bc55\n# shardfs range cache (shardfs.reads.rangecache)\n"
_TMP = ".tmp."
_NAME = re.compile(r"([0-9a-f]{32})\.([0-9a-f]{16})\.(\d+)\.(\d+)")
_BUCKET = re.compile(r"[0-9a-f]{3}")
_STALE_TMP_NS = 3600 * 10**9  # a temporary file this old was left by a killed writer


Ident = tuple  # what identifies a version's content: (etag, size), or a whole local Version


def _ident(version: Version) -> Ident | None:
    """The identity of a version's content; None for an uncacheable one (no ETag)."""
    if isinstance(version.tag, str):
        return (version.tag, version.size) if version.tag else None
    return tuple(version)


def _key(where: str, ident: Ident, offset: int, length: int) -> bytes:
    """The key a disk cache file's header holds."""
    return json.dumps([where, ident, offset, length]).encode()


class _Ranges:
    """The cached ranges of one version of one object. No range contains another, so the
    starts are sorted and so are the ends: the only candidate to cover a read is the last
    range starting at or before it."""

    __slots__ = ("ident", "starts", "data")

    def __init__(self, ident: Ident) -> None:
        self.ident = ident
        self.starts: list[int] = []
        self.data: dict[int, bytes | memoryview] = {}

    def covering(self, start: int, stop: int) -> int | None:
        i = bisect_right(self.starts, start) - 1
        if i >= 0 and self.starts[i] + len(self.data[self.starts[i]]) >= stop:
            return self.starts[i]
        return None


class RangeCache:
    """Ranges of object versions in memory (``max_bytes``) and optionally on disk."""

    def __init__(self, max_bytes: int, disk_dir: str | None = None, disk_max_bytes: int | None = None) -> None:
        self.max_bytes = max_bytes
        self.used = 0  # bytes of the ranges in memory
        self.hits = 0  # chunk reads served from here (counted by the reader: ``shardfs status``)
        self.misses = 0
        self._lock = threading.Lock()
        self._objects: dict[str, _Ranges] = {}
        self._order: Eviction[tuple[str, int]] = Eviction(max_bytes)  # of the ranges in memory: (where, start)
        self.disk_dir: str | None = None
        self.disk_max_bytes = DEFAULT_DISK_BYTES if disk_max_bytes is None else disk_max_bytes
        self._written = 0  # bytes written to disk since the last scan started
        self._queue: deque[tuple[str, Ident, int, bytes | memoryview]] = deque()  # disk writes not done yet
        self._queued = 0  # their bytes, the one being written included
        self._writer = False  # a writer thread is running
        self._changed = threading.Condition(self._lock)  # the queue or ``_queued`` changed
        self._trimming = False
        self._trim_lock = threading.Lock()
        if disk_dir is not None:
            self._open_disk(os.path.abspath(disk_dir))

    # ------------------------------------------------------------------ the interface

    def get(self, where: str, version: Version, offset: int, nbytes: int,
            disk: bool = True) -> bytes | memoryview | None:
        """``[offset, offset + nbytes)`` of ``version`` of ``where`` if cached, else None.
        ``disk=False``: in memory only (never blocks: for the trio thread)."""
        ident = _ident(version)
        if ident is None:
            return None
        start = max(0, version.size + offset) if offset < 0 else offset
        stop = min(start + nbytes, version.size)
        if start >= stop:
            return b""
        with self._lock:
            obj = self._objects.get(where)
            at = obj.covering(start, stop) if obj is not None and obj.ident == ident else None
            if at is not None:
                self._order.used((where, at))
                data = obj.data[at]  # type: ignore[union-attr]  # ``at`` is None when ``obj`` is
                return data if at == start and len(data) == stop - start else memoryview(data)[start - at: stop - at]
        if not disk or self.disk_dir is None:
            return None
        found = self._disk_get(where, ident, start, stop)
        if found is None:
            return None
        at, data = found
        with self._lock:
            self._memory_put(where, ident, at, data)
        return data[start - at: stop - at]

    def lacks(self, where: str, version: Version) -> bool:
        """True if memory could keep the whole of ``version`` of ``where`` (it has an ETag and
        fits) but holds no range covering it (never blocks; the use order is left as it is)."""
        ident = _ident(version)
        if ident is None or not 0 < version.size <= self.max_bytes:
            return False
        with self._lock:
            obj = self._objects.get(where)
            return obj is None or obj.ident != ident or obj.covering(0, version.size) is None

    def put(self, where: str, version: Version, offset: int, data: bytes | memoryview) -> None:
        """Record that ``version`` of ``where`` holds ``data`` at ``offset``."""
        ident = _ident(version)
        if ident is None:
            return
        start = max(0, version.size + offset) if offset < 0 else offset
        if len(data) > version.size - start:
            data = bytes(data[: max(0, version.size - start)])
        if not len(data):
            return
        with self._lock:
            self._memory_put(where, ident, start, data)
            if self.disk_dir is None:
                return
            if self._queued + len(data) > QUEUE_BYTES:
                log.debug("%s: range at %d not written to the disk cache: %d bytes queued", where, start, self._queued)
                return
            self._queue.append((where, ident, start, data))
            self._queued += len(data)
            self._changed.notify_all()
            if self._writer:
                return
            self._writer = True
        threading.Thread(target=self._write_queued, name="rangecache-write", daemon=True).start()

    def flush(self) -> None:
        """Wait until the disk writes of every earlier ``put`` are done (call it at unmount)."""
        with self._changed:
            self._changed.wait_for(lambda: not self._queued)

    # ------------------------------------------------------------------ memory

    def _memory_put(self, where: str, ident: Ident, start: int, data: bytes | memoryview) -> None:
        """Keep ``data`` at ``start`` (caller holds the lock)."""
        obj = self._objects.get(where)
        if obj is not None and obj.ident != ident:
            self._drop(where, obj, 0, len(obj.starts))
            obj = None
        if len(data) > self.max_bytes:
            return
        stop = start + len(data)
        if obj is None:
            obj = self._objects[where] = _Ranges(ident)
        at = obj.covering(start, stop)
        if at is not None:
            self._order.used((where, at))
            return
        first = last = bisect_left(obj.starts, start)
        while last < len(obj.starts) and obj.starts[last] + len(obj.data[obj.starts[last]]) <= stop:
            last += 1
        self._drop(where, obj, first, last)  # the ranges inside the new one
        obj.starts.insert(first, start)
        obj.data[start] = data
        self._objects[where] = obj  # again: dropping the ranges inside may have removed it
        self._order.added((where, start), len(data))
        self.used += len(data)
        while self.used > self.max_bytes:
            old_where, old_start = self._order.victim()
            old = self._objects[old_where]
            i = bisect_left(old.starts, old_start)
            self._drop(old_where, old, i, i + 1)

    def _drop(self, where: str, obj: _Ranges, first: int, last: int) -> None:
        """Forget ranges ``first:last`` of ``obj`` (and ``obj`` once empty)."""
        for start in obj.starts[first:last]:
            self.used -= len(obj.data.pop(start))
            self._order.removed((where, start))
        del obj.starts[first:last]
        if not obj.starts:
            self._objects.pop(where, None)

    # ------------------------------------------------------------------ disk

    def _open_disk(self, path: str) -> None:
        try:
            private.ensure(path)
        except private.Refused as e:
            raise ValueError(f"cache_dir {e}") from None
        except OSError as e:
            raise ValueError(f"cache_dir {path}: cannot create it: {e.strerror or e}") from None
        self.disk_dir = path
        tag = os.path.join(path, TAG_NAME)
        try:
            if not os.path.exists(tag):
                if any(not name.startswith(_TMP) for name in os.listdir(path)):
                    raise ValueError(f"cache_dir {path}: not empty and not a cache directory (no {TAG_NAME})")
                self._write_atomic(tag, (TAG,))
        except OSError as e:
            self._disk_failed(e)
            return
        self._start_trim()

    @staticmethod
    def _names(root: str, where: str, ident: Ident) -> tuple[str, str, str]:
        """(bucket directory, name prefix of the object, name prefix of the version)."""
        obj = hashlib.sha256(where.encode("utf-8", "surrogateescape")).hexdigest()[:32]
        ver = hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:16]
        return os.path.join(root, obj[:3]), f"{obj}.", f"{obj}.{ver}."

    @staticmethod
    def _span(name: str, prefix: str) -> tuple[int, int] | None:
        """(offset, length) of a cache file's name that starts with ``prefix``, else None."""
        match = _NAME.fullmatch(name) if name.startswith(prefix) else None
        return (int(match[3]), int(match[4])) if match else None

    def _disk_get(self, where: str, ident: Ident, start: int, stop: int) -> tuple[int, bytes] | None:
        """The verified blocks of one file covering ``[start, stop)``: (their offset, bytes)."""
        root = self.disk_dir
        if root is None:
            return None
        bucket, _, prefix = self._names(root, where, ident)
        try:
            for entry in _scandir(bucket):
                span = self._span(entry.name, prefix)
                if span is not None and span[0] <= start and span[0] + span[1] >= stop:
                    return self._read_file(entry.path, where, ident, span[0], span[1], start, stop)
        except FileNotFoundError:  # no bucket yet, or removed by another daemon's eviction
            return None
        except OSError as e:
            self._disk_failed(e)
        return None

    def _read_file(self, path: str, where: str, ident: Ident, offset: int, length: int,
                   start: int, stop: int) -> tuple[int, bytes] | None:
        key = _key(where, ident, offset, length)
        nblocks = -(-length // BLOCK)
        body = HEADER.size + len(key) + 4 * nblocks
        first, last = (start - offset) // BLOCK, -(-(stop - offset) // BLOCK)
        try:
            fd = private.open_file(None, path, os.O_RDONLY, path)
        except private.Refused:
            _unlink(path)
            log.warning("range cache file %s: not this user's own: ignored and removed", path)
            return None
        try:
            head = os.pread(fd, body, 0)
            if (head[:HEADER.size] != HEADER.pack(MAGIC, len(key), length)
                    or head[HEADER.size: body - 4 * nblocks] != key):
                problem = "not a cache file of this range"
            elif os.fstat(fd).st_size != body + length:
                problem = "truncated"
            else:
                data = os.pread(fd, min(last * BLOCK, length) - first * BLOCK, body + first * BLOCK)
                view = memoryview(data)
                crcs = struct.unpack_from(f"<{last - first}I", head, body - 4 * (nblocks - first))
                if all(crc32c.crc32c(view[i * BLOCK: (i + 1) * BLOCK]) == crc for i, crc in enumerate(crcs)):
                    try:
                        os.utime(fd)  # the eviction's recency
                    except OSError:
                        pass  # a read-only file system: served all the same
                    return offset + first * BLOCK, data
                problem = "crc32c mismatch"
        finally:
            os.close(fd)
        try:
            os.unlink(path)
        except FileNotFoundError:
            return None  # another thread or daemon found it first (and logged it)
        log.warning("range cache file %s: %s: ignored and removed", path, problem)
        return None

    def _write_queued(self) -> None:
        """The writer thread: write the queued ranges to disk; end after ``WRITER_IDLE`` s without."""
        while True:
            with self._lock:
                if not self._queue:
                    self._changed.wait(WRITER_IDLE)
                if not self._queue or self.disk_dir is None:
                    self._queue.clear()
                    self._queued, self._writer = 0, False
                    self._changed.notify_all()
                    return
                where, ident, start, data = self._queue.popleft()
            try:
                self._disk_put(where, ident, start, data)
            except Exception as e:  # a bug: no more disk writes, but never a stuck flush()
                log.exception("%s: range at %d: writing it to the disk cache failed", where, start)
                self._disk_failed(e)
            finally:
                with self._lock:
                    self._queued -= len(data)
                    self._changed.notify_all()

    def _disk_put(self, where: str, ident: Ident, start: int, data: bytes | memoryview) -> None:
        root = self.disk_dir
        if root is None:
            return
        bucket, obj_prefix, prefix = self._names(root, where, ident)
        stop = start + len(data)
        inside, covered = [], False
        try:
            os.makedirs(bucket, mode=private.DIR_MODE, exist_ok=True)
            for entry in _scandir(bucket):
                if self._span(entry.name, obj_prefix) is None:
                    continue
                span = self._span(entry.name, prefix)
                if span is None:
                    _unlink(entry.path)  # another version of the object: never served again
                elif span[0] <= start and span[0] + span[1] >= stop:
                    covered = True
                elif span[0] >= start and span[0] + span[1] <= stop:
                    inside.append(entry.path)
            if covered:
                return
            key = _key(where, ident, start, len(data))
            view = memoryview(data)
            crcs = [crc32c.crc32c(view[i: i + BLOCK]) for i in range(0, len(data), BLOCK)]
            head = HEADER.pack(MAGIC, len(key), len(data)) + key + struct.pack(f"<{len(crcs)}I", *crcs)
            self._write_atomic(os.path.join(bucket, f"{prefix}{start}.{len(data)}"), (head, data))
            for path in inside:
                _unlink(path)
        except OSError as e:
            self._disk_failed(e)
            return
        with self._lock:
            self._written += len(head) + len(data)
            due = self._written > self.disk_max_bytes // 8
        if due:
            self._start_trim()

    def _write_atomic(self, path: str, parts: tuple[bytes | memoryview, ...]) -> None:
        directory, name = os.path.split(path)
        tmp = os.path.join(directory, f"{_TMP}{name}.{os.getpid()}.{threading.get_ident()}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, private.FILE_MODE)
            with open(fd, "wb") as f:
                for part in parts:
                    f.write(part)
            os.rename(tmp, path)
        except BaseException:
            _unlink(tmp)
            raise

    def _disk_failed(self, e: Exception) -> None:
        with self._lock:
            if self.disk_dir is None:
                return
            path, self.disk_dir = self.disk_dir, None
        log.warning("cache_dir %s: %s: caching in memory only from now on",
                    path, os.strerror(e.errno) if isinstance(e, OSError) and e.errno else e)

    # ------------------------------------------------------------------ eviction

    def _start_trim(self) -> None:
        with self._lock:
            if self._trimming or self.disk_dir is None:
                return
            self._trimming = True
            self._written = 0
        threading.Thread(target=self._trim_in_background, name="rangecache-trim", daemon=True).start()

    def _trim_in_background(self) -> None:
        """Scan again as long as more than ``disk_max_bytes / 8`` was written during a scan."""
        while True:
            try:
                self.trim_disk()
            except BaseException:
                with self._lock:
                    self._trimming = False
                raise
            with self._lock:
                if self._written <= self.disk_max_bytes // 8 or self.disk_dir is None:
                    self._trimming = False
                    return
                self._written = 0

    def trim_disk(self) -> int:
        """Remove the least recently used files until the cache holds at most 7/8 of
        ``disk_max_bytes``; the bytes it holds after. Runs in a background thread by itself
        (see the module's docstring)."""
        with self._trim_lock:
            root, files, now = self.disk_dir, [], time.time_ns()
            if root is None:
                return 0
            try:
                for bucket in os.scandir(root):
                    if not (_BUCKET.fullmatch(bucket.name) and bucket.is_dir(follow_symlinks=False)):
                        continue
                    for entry in _scandir(bucket.path):
                        try:
                            st = entry.stat(follow_symlinks=False)
                        except FileNotFoundError:
                            continue
                        if _NAME.fullmatch(entry.name):
                            files.append((st.st_mtime_ns, st.st_size, entry.path))
                        elif entry.name.startswith(_TMP) and now - st.st_mtime_ns > _STALE_TMP_NS:
                            _unlink(entry.path)
                total = sum(size for _, size, _ in files)
                files.sort()
                for _, size, path in files:
                    if total <= self.disk_max_bytes * 7 // 8:
                        break
                    _unlink(path)
                    total -= size
            except OSError as e:
                self._disk_failed(e)
                return 0
            return total


class RangeCounts:
    """What ``shardfs status`` shows of the ranges one of ``share`` workers fetched (``Counted``):
    its own ``cache``, and its share of the shards kept for every worker (``shared``), so that the
    workers' documents add up to the mount's ``-o cache_size``."""

    def __init__(self, cache: RangeCache, shared: SharedShards, share: int) -> None:
        self.cache, self.shared, self.share = cache, shared, share

    @property
    def hits(self) -> int:
        return self.cache.hits

    @property
    def misses(self) -> int:
        return self.cache.misses

    @property
    def used(self) -> int:
        return self.cache.used + self.shared.used // self.share

    @property
    def max_bytes(self) -> int:
        return self.cache.max_bytes + self.shared.ring // self.share


def _scandir(path: str) -> list[os.DirEntry[str]]:
    """The entries of ``path`` (none if another daemon removed it meanwhile)."""
    try:
        with os.scandir(path) as it:
            return list(it)
    except FileNotFoundError:
        return []


def _unlink(path: str) -> None:
    """Remove ``path``; already gone (another thread or daemon) is fine."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
