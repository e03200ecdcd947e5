"""Pages filled at open: a chunk file opened for reading whose inode the kernel holds no pages
of is stored into the kernel's page cache before the open is answered, so the client's reads
are served without a READ request each; pages of another version are never kept.

What the kernel holds is read with ``mincore`` on a mapping of the file (which neither reads
nor faults pages in).
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

from conftest import drop_caches, shard_locks, status, wait_for
from shardfs.app.peers import PUBLISH_S
from sources import LE, gzip, sharding, write_v3

SHAPE, CHUNK, SHARD = (128, 128), (64, 64), (128, 128)  # chunk files of 8 KiB: two pages each
FILE = CHUNK[0] * CHUNK[1] * 2
PAGES = -(-FILE // mmap.PAGESIZE)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]


def resident(fd: int, size: int) -> int:
    """How many pages of the first ``size`` bytes of open file ``fd`` the page cache holds."""
    addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap")
    try:
        vec = ctypes.create_string_buffer(-(-size // mmap.PAGESIZE))
        if _libc.mincore(addr, size, vec):
            raise OSError(ctypes.get_errno(), "mincore")
        return sum(b & 1 for b in vec.raw)
    finally:
        _libc.munmap(addr, size)


@pytest.fixture
def src(tmp_path) -> tuple[Path, np.ndarray]:
    """One uncompressed <u2 array ``x`` in one shard (its chunk files are the raw chunk bytes),
    the shard written out and read once, so it is in the source's page cache."""
    data = np.arange(np.prod(SHAPE), dtype="<u2").reshape(SHAPE)
    root = tmp_path / "src"
    root.mkdir()
    (root / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}))
    write_v3(root / "x", data, SHARD, [sharding(CHUNK, [LE])])
    os.sync()  # no page of the shard under writeback: all of it can be read without waiting
    for shard in (root / "x" / "c").rglob("*"):
        if shard.is_file():
            shard.read_bytes()
    return root, data


def test_first_open_fills_the_page_cache(src, mount):
    root, data = src
    mnt = mount(root)
    fd = os.open(mnt / "x" / "1.0", os.O_RDONLY)
    try:
        assert os.fstat(fd).st_size == FILE
        assert resident(fd, FILE) == PAGES, "the whole file is in the page cache once open"
        assert os.pread(fd, FILE + 1, 0) == data[64:, :64].tobytes()
    finally:
        os.close(fd)
    fd = os.open(mnt / "x" / "1.1", os.O_RDONLY)  # an open file reads the same whether filled or not
    try:
        assert os.pread(fd, 100, 4000) == data[64:, 64:].tobytes()[4000:4100]
    finally:
        os.close(fd)


def assert_filled_at_open(path: Path, want: bytes) -> None:
    """``path``, opened, has its ``FILE`` bytes in the page cache before any read, and reads ``want``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        assert resident(fd, FILE) == PAGES
        assert os.pread(fd, FILE + 1, 0) == want
    finally:
        os.close(fd)


def released(mnt: Path) -> None:
    """Once the mount holds no open handle (``shardfs status``). A RELEASE follows ``close()``
    (the kernel does not wait for it, and holds the inode until it is answered: pages dropped
    before then leave the inode, not evicted), and may reach another worker than the one that
    answers the next open, which then still sees the closed file open; the worker that opened it
    lets go at its next look at the shared ledger. (The other workers' counts in the status are
    up to ``PUBLISH_S`` old: 0 twice, that far apart.)"""
    def none_open() -> bool:
        if status(mnt)["open_handles"]:
            return False
        time.sleep(PUBLISH_S + 0.1)
        return status(mnt)["open_handles"] == 0

    wait_for(none_open, 15, "every handle released")


def test_a_file_the_kernel_evicted_is_filled_again_at_its_next_open(src, mount):
    """Page caches dropped after a read: the kernel evicts the inode with its pages and forgets
    it, so the next open fills the pages again (no READ request per read, as the first time).
    Also with two workers (tests/test_workers_pages.py): the FORGET may reach either."""
    root, data = src
    mnt = mount(root, "-o", "workers=1")
    path = mnt / "x" / "1.0"
    assert path.read_bytes() == data[64:, :64].tobytes()
    released(mnt)
    for _ in range(3):  # (a dentry looked at since the last pass is kept one pass more)
        drop_caches("3")
    time.sleep(0.5)  # (N workers: the FORGET served before the next LOOKUP, which another may serve)
    assert_filled_at_open(path, data[64:, :64].tobytes())


def test_a_file_listed_read_and_evicted_is_filled_again_at_its_next_open(src, mount):
    """A listing (READDIRPLUS: the kernel holds an entry of each file, and opens one without a
    LOOKUP), a file read, page caches dropped: the next open fills its pages. Also with two
    workers (tests/test_workers_pages.py), where the listing's entries must be counted as the
    kernel's lookups for its FORGET to tell the eviction (``SharedInodes.kernel_forgot``)."""
    root, data = src
    mnt = mount(root, "-o", "workers=1")
    path = mnt / "x" / "1.0"
    for _ in range(2):
        assert "1.0" in os.listdir(mnt / "x")
        assert path.read_bytes() == data[64:, :64].tobytes()
        os.sync()
        for _ in range(3):  # (a dentry looked at since the last pass is kept one pass more)
            drop_caches("3")
        time.sleep(0.5)  # (N workers: the FORGET served before the next LOOKUP, which another may serve)
    assert "1.0" in os.listdir(mnt / "x")
    assert_filled_at_open(path, data[64:, :64].tobytes())


def test_a_chunk_folded_after_the_kernel_evicted_it_is_filled_at_its_next_open(src, mount):
    """A chunk written through the mount, then evicted by the kernel (page caches dropped) before
    its shard is folded: the fold has no pages to drop in the kernel, and the next open fills
    them with the folded bytes (no READ request per read)."""
    root, data = src
    mnt = mount(root, "-o", "workers=1")  # (and two: tests/test_workers_pages.py)
    path = mnt / "x" / "0.1"
    shard = next(p for p in (root / "x" / "c").rglob("*") if p.is_file())
    before = shard.stat().st_ino
    new = (data[:64, 64:] + 7).astype("<u2").tobytes()
    with shard_locks(shard):  # (no fold until the kernel evicted the inode)
        with open(path, "r+b") as f:
            f.write(new)
        released(mnt)
        for _ in range(3):  # (a dentry looked at since the last pass is kept one pass more)
            drop_caches("3")
    wait_for(lambda: shard.stat().st_ino != before, 30, "the written chunk's fold")
    assert_filled_at_open(path, new)


def test_no_fill_of_a_file_opened_for_writing_before(src, mount):
    """A file written through the mount is read back as written: the pages written are not
    taken for a stored version's, and no stale page survives the next open for reading. The
    first open after the write drops the older version's pages itself (before it is answered),
    so its reads fill them with the new version and the next open keeps them (no READ request
    per read), as before the write."""
    root, data = src
    mnt = mount(root)
    path = mnt / "x" / "0.1"
    assert path.read_bytes() == data[:64, 64:].tobytes()
    new = (data[:64, 64:] + 7).astype("<u2").tobytes()
    with open(path, "r+b") as f:
        f.write(new)
    assert path.read_bytes() == new
    fd = os.open(path, os.O_RDONLY)
    try:
        assert resident(fd, FILE) == PAGES
        assert os.pread(fd, FILE, 0) == new
    finally:
        os.close(fd)


def test_a_renamed_onto_chunk_open_for_writing_keeps_no_pages_at_a_read_open(src, mount):
    """A rename onto a chunk key makes its name show the temporary file's inode (an alias): the
    page-cache bookkeeping of an open is the kernel inode's, not the chunk's. So while the name
    is open for writing in place, a read open keeps none of the writer's uncommitted pages (the
    reader reads the committed bytes) and never stores pages into it: a store while the writer
    held a page locked deadlocked the daemon (found by scripts/soak: SIGKILL could not end it)."""
    root, data = src
    mnt = mount(root)
    path = mnt / "x" / "0.1"
    assert path.read_bytes() == data[:64, 64:].tobytes()
    committed = (data[:64, 64:] + 1).astype("<u2").tobytes()
    tmp = mnt / "x" / "0.1.tmp.partial"
    tmp.write_bytes(committed)
    os.rename(tmp, path)
    w = os.open(path, os.O_RDWR | os.O_TRUNC)
    try:
        assert os.write(w, (data[:64, 64:] + 2).astype("<u2").tobytes()) == FILE
        r = os.open(path, os.O_RDONLY)
        try:
            assert resident(r, FILE) == 0
            assert os.pread(r, FILE, 0) == committed
        finally:
            os.close(r)
    finally:
        os.close(w)


def test_a_read_through_a_handle_of_an_older_version_is_not_kept_for_the_next_open(src, mount):
    """A handle opened before an in-place write still reads the version it opened; its READ reply
    lands in the kernel's pages of the file after the open of the new version dropped them. The
    next open must drop them again, or every reader sees the old value until the next change
    (found by scripts/soak: the previous value of a chunk, read for seconds after an in-place
    write was acknowledged)."""
    root, data = src
    mnt = mount(root)
    path = mnt / "x" / "0.1"
    old = data[:64, 64:].tobytes()
    new = (data[:64, 64:] + 5).astype("<u2").tobytes()
    assert path.read_bytes() == old  # its pages are in the kernel
    h = os.open(path, os.O_RDONLY)  # the same version: pages kept, nothing read yet
    try:
        with open(path, "r+b") as f:  # an in-place write, committed at close
            f.write(new)
        h2 = os.open(path, os.O_RDONLY)  # the new version: the kernel drops the pages
        try:
            assert os.pread(h, FILE, 0) == old  # the old handle refills them with its version
        finally:
            os.close(h2)
    finally:
        os.close(h)
    assert path.read_bytes() == new


def test_an_open_beside_a_handle_of_an_older_version_bypasses_the_pages(src, mount):
    """While a handle of an older version is open, its reads may refill the kernel's pages with
    that version at any time, also between a new open and its first read: the new handle reads
    with direct I/O, never those pages (found by scripts/soak: a read right after an
    acknowledged in-place write returned the previous value)."""
    root, data = src
    mnt = mount(root)
    path = mnt / "x" / "0.1"
    old = data[:64, 64:].tobytes()
    new = (data[:64, 64:] + 5).astype("<u2").tobytes()
    assert path.read_bytes() == old
    h = os.open(path, os.O_RDONLY)
    try:
        with open(path, "r+b") as f:
            f.write(new)
        h2 = os.open(path, os.O_RDONLY)
        try:
            assert os.pread(h, FILE, 0) == old
            assert os.pread(h2, FILE, 0) == new
        finally:
            os.close(h2)
    finally:
        os.close(h)


def _reread(path: str, acked, stop, out, total) -> None:
    """A reader process: read ``path`` whole again and again (counted in ``total`` too); a read
    that began after the write of value ``acked`` was acknowledged must not show an older value
    (an empty file is the writer's ``O_TRUNC`` in flight, as on any filesystem)."""
    stale = reads = 0
    while not stop.value:
        before = acked.value
        with open(path, "rb") as f:
            got = f.read()
        reads += 1
        with total.get_lock():
            total.value += 1
        if got and int.from_bytes(got[:2], "little") < before:
            stale += 1
    out.put((reads, stale))


def test_no_read_begun_after_an_in_place_write_was_acknowledged_sees_the_older_value(src, mount):
    """Readers in four processes read a chunk file that one writer rewrites in place over and
    over (``open(O_TRUNC)``, write, close): each read that began after a write's close returned
    shows that value or a newer one. An open answered without ``keep_cache`` drops the kernel's
    pages only when its process runs on after the reply; a second open answered meanwhile kept
    the older version's pages (found by scripts/soak: about 5 stale reads a second here)."""
    import multiprocessing as mp

    root, _ = src
    mnt = mount(root)
    path = str(mnt / "x" / "0.0")
    ctx = mp.get_context("fork")
    acked, stop, out, total = ctx.Value("q", 0), ctx.Value("b", 0), ctx.Queue(), ctx.Value("q", 0)
    readers = [ctx.Process(target=_reread, args=(path, acked, stop, out, total)) for _ in range(4)]
    for r in readers:
        r.start()
    try:
        # 4 s, and as long as it takes a loaded machine to make 50 writes and 200 reads (a hang: 120 s)
        enough, deadline = time.monotonic() + 4, time.monotonic() + 120
        value = 0
        while (time.monotonic() < enough or value <= 50 or total.value <= 200) and time.monotonic() < deadline:
            value += 1
            with open(path, "r+b") as f:
                f.truncate(0)
                f.write(np.full(CHUNK, value, "<u2").tobytes())
            acked.value = value
    finally:
        stop.value = 1
        results = [out.get(timeout=30) for _ in readers]
        for r in readers:
            r.join(timeout=30)
    reads, stale = sum(r[0] for r in results), sum(r[1] for r in results)
    assert value > 50 and reads > 200, (value, reads)
    assert stale == 0, f"{stale} of {reads} reads saw a value older than the last acknowledged write ({value} writes)"


def test_a_handle_opened_before_a_rename_onto_its_chunk_reads_its_version_whole(tmp_path, mount):
    """A file opened before a temporary file was renamed onto its chunk (as zarr writes) reads
    the version it opened, whole, and ``fstat`` gives that version's size, as on a local
    filesystem, where the old descriptor keeps the replaced inode; the chunk's names, also the
    one the kernel still resolves to that inode, open the new version. The kernel caps a
    file's reads at its inode's size (or pads them to it), and that inode was the chunk's,
    sized anew by the next lookup, listing or getattr: the old handle read its bytes cut to the
    new version's size (found by scripts/soak: torn chunks decoded by zarr). Two renames: the
    second one's lookup of its target name sized the chunk's inode too."""
    root = tmp_path / "src"
    root.mkdir()
    (root / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}))
    data = np.random.default_rng(5).integers(0, 1 << 16, CHUNK, dtype="<u2")  # incompressible: 8 KiB+
    write_v3(root / "z", data, CHUNK, [sharding(CHUNK, [LE, gzip(1)])])
    mnt = mount(root)
    path, other = mnt / "z" / "0.0", mnt / "z" / "c" / "0" / "0" / "0.0"
    old = path.read_bytes()
    assert other.stat().st_ino == path.stat().st_ino  # the kernel resolves both names to one inode
    h = os.open(path, os.O_RDONLY)
    try:
        for value in (1, 2):
            new = zlib.compress(np.full(CHUNK, value, "<u2").tobytes(), wbits=31)  # gzip: a few dozen bytes
            tmp = mnt / "z" / f"0.0.{value}.partial"
            tmp.write_bytes(new)
            os.rename(tmp, path)
            for _ in range(3):  # (the kernel may forget the renamed temporary's inode meanwhile)
                assert "0.0" in os.listdir(mnt / "z")  # a listing (READDIRPLUS) gives the kernel sizes too
                assert os.pread(h, len(old) + 1, 0) == old, value  # (before fstat: a GETATTR sizes it again)
                time.sleep(0.1)
            assert os.fstat(h).st_size == len(old), value
            assert path.read_bytes() == new and path.stat().st_size == len(new), value
            with open(other, "rb") as f:
                assert (os.fstat(f.fileno()).st_size, f.read()) == (len(new), new), value
    finally:
        os.close(h)
