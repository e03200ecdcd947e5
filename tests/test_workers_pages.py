"""``-o workers=N`` with the kernel's page cache (``shardfs.kernel.sharedpages``): every worker
answers opens from one table of what the kernel's pages hold, so files are filled at their
first open and kept at the next ones whichever worker answers, and never give another version's
bytes: a write through the owner, a change of the source, files of two versions open at once.

Which worker gets a request is the kernel's choice; a test makes it one worker's by stopping the
other (``test_workers.only``: SIGSTOP, SIGCONT in a ``finally``). The page-fill tests of one
worker (tests/test_page_fill.py) run here again with two (those about inodes the kernel evicted
too: the mount's count of the kernel's lookups, ``SharedInodes.kernel_forgot``), but one whose
timing two workers change (run here in a form of its own).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import test_page_fill as one
from test_page_fill import (  # noqa: F401 - run again here, with two workers (``mount`` below)
    FILE, PAGES, released, resident, src, test_a_handle_opened_before_a_rename_onto_its_chunk_reads_its_version_whole,
    test_a_renamed_onto_chunk_open_for_writing_keeps_no_pages_at_a_read_open, test_first_open_fills_the_page_cache)
from conftest import drop_caches, wait_for
import stopping
from test_workers import NO_CACHE, only, status, workers
from sources import LE, sharding, write_v3

pytestmark = pytest.mark.skipif(
    "workers" not in __import__("importlib.metadata").metadata.version("pyfuse3"),
    reason="needs the pyfuse3 scripts/pyfuse3 builds (non-blocking reads of clones)")

SKIPPED = {"test_no_fill_of_a_file_opened_for_writing_before"}  # (its timing: ``test_a_file_written_...`` below)
# every page-fill test of one worker runs here too, but those named in SKIPPED (see the docstring)
RUN = {name for name in dir(one) if name.startswith("test_")} - SKIPPED
for _name in sorted(RUN):  # (one order in every xdist worker)
    globals()[_name] = getattr(one, _name)


@pytest.fixture
def mount(mount):
    """The ``mount`` fixture, every mount with ``-o workers=2`` added."""
    def with_two(root, *args: str, **kw):
        args_ = list(args)
        if "-o" in args_:
            i = args_.index("-o") + 1
            args_[i] += ",workers=2"
        else:
            args_ += ["-o", "workers=2"]
        return mount(root, *args_, **kw)

    with_two.info = mount.info
    return with_two


@pytest.fixture
def two(tmp_path) -> Path:
    """Arrays ``x`` and ``y`` (uncompressed <u2: chunk files of 8 KiB, two pages), one shard each."""
    root = tmp_path / "src"
    root.mkdir()
    (root / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}))
    for name in ("x", "y"):
        write_v3(root / name, np.arange(128 * 128, dtype="<u2").reshape(128, 128), (128, 128),
                 [sharding((64, 64), [LE])])
    return root


def read_open(path: Path) -> int:
    fd = os.open(path, os.O_RDONLY)
    assert os.fstat(fd).st_size == FILE
    return fd


def rewrite_source(root: Path, name: str, value: int) -> bytes:
    """Chunk 0.0 of array ``name`` made ``value`` everywhere on the source, behind the mount's back
    (the same size: the kernel's inode keeps its size); its new bytes."""
    import zarr

    zarr.open_array(str(root / name), mode="r+")[:64, :64] = value
    shard = root / name / "c" / "0" / "0"
    os.utime(shard, ns=(value * 10**9, value * 10**9))  # (a new version, whatever the clock's resolution)
    time.sleep(1.2)  # a directory's stats are remembered for 1 s (``shardfs.storage.local``)
    return np.full((64, 64), value, "<u2").tobytes()


def settled(mnt: Path) -> list[int]:
    """The two workers' pids, once both served a request (a worker stopped right after the mount
    may hold one: tests/README.md)."""
    w = workers(mnt, 2)
    for name in ("x", "y"):
        (mnt / name / ".zarray").read_bytes()
    time.sleep(0.5)
    return w


def test_a_chunk_cached_through_one_worker_is_read_anew_after_a_write_and_a_source_change(two, mount):
    """Read through worker 1 (filled), opened through worker 0 (kept: resident at once),
    rewritten in place through the owner (worker 0), read again: the written bytes; a chunk of
    the other array, read through the owner, changed on the source (twice) and read through
    each worker: the new bytes. (Requests about the written array go to the owner: it is
    never stopped then.)"""
    mnt = mount(two, "-o", NO_CACHE)
    w0, w1 = settled(mnt)
    x = mnt / "x" / "0.0"
    old = np.arange(128 * 128, dtype="<u2").reshape(128, 128)[:64, :64].tobytes()
    with only(w1, [w0, w1]):
        assert x.read_bytes() == old
    with only(w0, [w0, w1]):
        fd = read_open(x)  # kept: the pages worker 1 filled
        try:
            assert resident(fd, FILE) == PAGES and os.pread(fd, FILE + 1, 0) == old
        finally:
            os.close(fd)
        new = np.full((64, 64), 7, "<u2").tobytes()
        with open(x, "r+b") as f:  # in place, through the page cache
            f.write(new)
    for _ in range(4):
        assert x.read_bytes() == new
    y = mnt / "y" / "0.0"
    with only(w0, [w0, w1]):
        assert y.read_bytes() == old
    for value in (3, 4):
        new = rewrite_source(two, "y", value)
        for w in (w1, w0):
            with only(w, [w0, w1]):
                assert y.read_bytes() == new, (value, w)
    assert status(mnt)["internal_errors"]["total"] == 0


def test_a_file_open_at_one_version_through_one_worker_and_another_version_through_the_other(two, mount):
    """A file open through worker 1 at the chunk's old version, filled; the chunk changes on the
    source (the same size); a file opened through worker 0 reads the new version, the old file
    the old one, whole, after worker 0 dropped the pages (its READ puts old bytes in the pages
    again), and files opened meanwhile through either worker the new one; once the old file is
    closed, every worker's open reads the new version, and keeps the pages."""
    mnt = mount(two, "-o", "ro," + NO_CACHE)
    w0, w1 = settled(mnt)
    y = mnt / "y" / "0.0"
    old = np.arange(128 * 128, dtype="<u2").reshape(128, 128)[:64, :64].tobytes()
    with only(w1, [w0, w1]):
        h1 = read_open(y)
    try:
        new = rewrite_source(two, "y", 5)
        with only(w0, [w0, w1]):
            h2 = read_open(y)
            try:
                assert os.pread(h2, FILE + 1, 0) == new
            finally:
                os.close(h2)
        with only(w1, [w0, w1]):
            assert os.pread(h1, FILE + 1, 0) == old
        for w in (w0, w1):
            with only(w, [w0, w1]):
                assert y.read_bytes() == new, w
    finally:
        os.close(h1)
    released(mnt)
    for w in (w1, w0, w1):
        with only(w, [w0, w1]):
            assert y.read_bytes() == new, w
            fd = read_open(y)
            try:
                assert resident(fd, FILE) == PAGES, "kept once the old file is closed"
            finally:
                os.close(fd)
    assert status(mnt)["internal_errors"]["total"] == 0


def test_a_file_written_through_the_mount_is_read_back_and_kept_at_the_next_open(src, mount):  # noqa: F811
    """``test_page_fill.test_no_fill_of_a_file_opened_for_writing_before`` with two workers: a
    chunk file written in place through the mount reads back as written, and once read the
    next open keeps its pages. Its write's RELEASE may reach the worker that does not answer
    the next open (which then still sees the file open for writing: direct I/O), and its fold
    (1 s after the write) drops the pages, which another worker's open does not fill again
    (``shardfs.kernel.sharedpages``): the test waits for both before it reads. Even then the
    kernel dropped the pages of the first read about one run in five in a full suite, between
    that read and the next open, with no invalidation sent by either worker and the table
    saying the pages hold the version read: not shardfs (0 in 30 runs of this test alone, traced).
    Pages are dropped behind the daemon's back by another test's ``drop_caches`` (the suite runs
    three files at once: test_page_fill, test_s3_requests) and by the test VM's proactive
    reclaim (DAMON ``pageout`` of cold page-cache pages: doc/ARCHITECTURE.md, "What makes the
    mount fast"): kept within three reads."""
    root, data = src
    mnt = mount(root)
    path = mnt / "x" / "0.1"
    shard = next(p for p in (root / "x" / "c").rglob("*") if p.is_file())
    before = shard.stat().st_ino
    assert path.read_bytes() == data[:64, 64:].tobytes()
    new = (data[:64, 64:] + 7).astype("<u2").tobytes()
    with open(path, "r+b") as f:
        f.write(new)
    wait_for(lambda: shard.stat().st_ino != before, 10, "the written chunk's fold")
    kept = []
    for _ in range(3):
        released(mnt)
        assert path.read_bytes() == new
        released(mnt)
        fd = os.open(path, os.O_RDONLY)
        try:
            kept.append(resident(fd, FILE))
            assert os.pread(fd, FILE + 1, 0) == new
        finally:
            os.close(fd)
        if kept[-1] == PAGES:
            break
    assert kept[-1] == PAGES, kept


def test_a_file_closed_through_the_worker_that_did_not_open_it_is_uncounted_at_once(src, mount):  # noqa: F811
    """A file opened through worker 1 and closed through the owner (which serves its RELEASE
    without asking worker 1) stops counting at once, as with one worker: worker 1 stays stopped
    (it never learns of the release), and the opens of the version written next still read
    through the page cache (a shared mapping of the file works; with the old version's reader
    still counted they got direct I/O: ENODEV). The pages themselves are not counted here:
    another test's ``drop_caches`` may take them (``test_a_file_written_...`` above)."""
    root, data = src
    mnt = mount(root)
    w0, w1 = workers(mnt, 2)
    path = mnt / "x" / "0.1"
    new = (data[:64, 64:] + 7).astype("<u2").tobytes()
    with only(w1, [w0, w1]):
        f = open(path, "rb")
        assert f.read() == data[:64, 64:].tobytes()
    with only(w0, [w0, w1]):
        f.close()
        with open(path, "r+b") as g:
            g.write(new)
        assert path.read_bytes() == new
        fd = os.open(path, os.O_RDONLY)
        try:
            assert 0 <= resident(fd, FILE) <= PAGES  # (mapped: no direct I/O)
            assert os.pread(fd, FILE + 1, 0) == new
        finally:
            os.close(fd)
    assert status(mnt)["internal_errors"]["total"] == 0


def test_a_lookup_answered_again_after_a_worker_died_is_counted_once(src, mount):  # noqa: F811
    """Worker 0 answered a LOOKUP of a chunk file the kernel holds pages of (counted as one more
    lookup of its inode) and had not sent the answer yet (stopped there: a test hook) when the
    other worker died. The RESEND moved that LOOKUP back to the kernel's queue, the next worker
    answered it (counted again), and the kernel refused worker 0's late answer, which pyfuse3 now
    gives to ``forget`` (as libfuse's high-level API does): the lookup the kernel never took is
    uncounted. So the kernel's FORGET at its eviction of the inode tells the mount that its pages
    are gone, and the next open fills them again. Counted twice, the eviction went unseen: the
    next open kept pages the kernel no longer had, and each read was a READ request."""
    root, data = src
    mnt = mount(root, "-o", NO_CACHE, env={"SHARDFS_TEST_STOP_AFTER": "lookup:1.0"})
    w0, w1 = workers(mnt, 2)
    path = mnt / "x" / "1.0"
    want = data[64:, :64].tobytes()
    with only(w1, [w0, w1]):  # (a lookup worker 0 served would fire its hook)
        assert path.read_bytes() == want  # the kernel holds its pages
    done: list[int] = []
    client = threading.Thread(target=lambda: done.append(os.stat(path).st_size), daemon=True)
    stopping.stopped(w1)  # worker 0 reads the LOOKUP, answers it, and stops before it is sent
    try:
        client.start()
        wait_for(lambda: stopping.state(w0) == "T", 30, "worker 0 stopped after the lookup")
        os.kill(w1, signal.SIGKILL)
        client.join(60)  # (the next worker of slot 1 answers the LOOKUP sent again)
        assert done == [FILE]
    finally:
        os.kill(w0, signal.SIGCONT)
    time.sleep(0.5)  # (worker 0's answer refused)
    os.sync()
    for _ in range(3):  # (a dentry looked at since the last pass is kept one pass more)
        drop_caches("3")
    time.sleep(0.5)
    one.assert_filled_at_open(path, want)
    assert status(mnt)["internal_errors"]["total"] == 0
