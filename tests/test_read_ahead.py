"""Read-ahead of a swept shard from a local source: once a client has opened three chunk files
of one shard among its last opens, the kernel is asked to read that whole shard into the source's
page cache (``POSIX_FADV_WILLNEED``), so the next chunk files of it are
served without waiting for the disk; a shard with fewer opens is not read ahead.

A lookup that needs a never-read shard index reads it with those of the next shards in C order
of the shard grid, in one worker thread call (in-process: ``tests/inproc.py``).

What the page cache holds of a shard file is read with ``mincore`` (``test_page_fill.resident``),
after the shard files were dropped from it (``POSIX_FADV_DONTNEED`` of clean pages).
"""

from __future__ import annotations

import errno
import json
import logging
import mmap
import os
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import wait_for
from inproc import InProcess
from sources import LE, array_doc, sharding, write_v3, write_zarr3
from test_page_fill import resident

SHAPE, CHUNK, SHARD = (1024, 1024), (64, 128), (512, 1024)  # chunk files of 16 KiB, 64 in a 1 MiB shard


def _evict(path: Path) -> int:
    """Drop ``path`` from the page cache; its size."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        assert resident(fd, size) == 0, f"{path} stays in the page cache"
        return size
    finally:
        os.close(fd)


def _resident(path: Path) -> int:
    fd = os.open(path, os.O_RDONLY)
    try:
        return resident(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)


def test_a_swept_shard_is_read_ahead_whole_and_a_touched_one_is_not(tmp_path, mount):
    data = np.random.default_rng(5).integers(0, 60000, size=SHAPE, dtype="<u2")
    root = tmp_path / "src"
    root.mkdir()
    (root / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}))
    write_v3(root / "x", data, SHARD, [sharding(CHUNK, [LE])])
    mnt = mount(root)
    swept, touched = root / "x" / "c" / "0" / "0", root / "x" / "c" / "1" / "0"
    assert (mnt / "x" / ".zarray").read_bytes()  # the array's metadata is read before the shards are dropped
    os.sync()  # clean pages: all of them can be dropped
    size = _evict(swept)
    assert _evict(touched) == size
    pages = -(-size // mmap.PAGESIZE)
    assert pages >= 256 + 1  # 1 MiB of chunks and the index: 8 times the kernel's own read-ahead of a read

    def chunk(i: int, j: int) -> bytes:
        return (mnt / "x" / f"{i}.{j}").read_bytes()

    # two chunk files of each shard, far apart in it: no shard is swept yet
    for i, j in ((0, 0), (8, 0), (7, 7), (15, 7)):
        assert chunk(i, j) == data[i * 64:(i + 1) * 64, j * 128:(j + 1) * 128].tobytes()
    assert _resident(swept) < pages // 2
    assert _resident(touched) < pages // 2
    assert chunk(3, 4) == data[192:256, 512:640].tobytes()  # the third of shard (0, 0): swept
    wait_for(lambda: _resident(swept) == pages, 10, "the swept shard read ahead whole")
    assert _resident(touched) < pages // 2, "a shard with two chunk files opened is not read ahead"


def test_a_shard_swept_again_soon_is_not_read_ahead_again_and_is_once_that_time_has_passed(tmp_path, monkeypatch):
    """A shard read ahead is not read ahead again at a later visit of a sweep within
    ``ADVISED_S`` (each advice a worker-thread trip; readers sweeping side by side come back to
    a shard again and again, its pages still there), and is at a visit after that. The shard is
    dropped from the page cache between the visits: what the kernel reads again shows whether
    it was asked. In-process (``tests/inproc.py``)."""
    from shardfs.reads import local

    data = np.random.default_rng(7).integers(0, 60000, size=SHAPE, dtype="<u2")
    root = tmp_path / "src"
    root.mkdir()
    (root / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}))
    write_v3(root / "x", data, SHARD, [sharding(CHUNK, [LE])])
    swept = root / "x" / "c" / "0" / "0"
    monkeypatch.setattr(local, "ADVISED_S", 3600.0)
    with InProcess(root) as mnt:
        assert (mnt / "x" / ".zarray").read_bytes()
        os.sync()
        size = _evict(swept)
        pages = -(-size // mmap.PAGESIZE)

        def visit(row: int) -> None:
            """Three chunk files of row ``row`` of shard (0, 0) (a sweep), after sixteen of
            shard (1, 0) (the visit before is over)."""
            for i, j in [*((i, j) for i in range(8, 10) for j in range(8)), *((row, j) for j in range(3))]:
                expected = data[i * 64:(i + 1) * 64, j * 128:(j + 1) * 128].tobytes()
                assert (mnt / "x" / f"{i}.{j}").read_bytes() == expected

        visit(0)
        wait_for(lambda: _resident(swept) == pages, 10, "the swept shard read ahead whole")
        _evict(swept)
        visit(1)
        time.sleep(0.5)
        assert _resident(swept) < pages // 2, "read ahead again at the next visit"
        monkeypatch.setattr(local, "ADVISED_S", 0.0)
        visit(2)
        wait_for(lambda: _resident(swept) == pages, 10, "the swept shard read ahead again once ADVISED_S had passed")


GRID_SHAPE, GRID_CHUNK, GRID_SHARD = (64, 64), (8, 8), (16, 16)  # 4 x 4 shards of 2 x 2 chunk files


def _shard_grid(tmp_path: Path) -> tuple[Path, list[Path]]:
    """A source with array ``x`` of 4 x 4 shards; its shard files in C order of the shard grid."""
    data = np.arange(64 * 64, dtype="<u2").reshape(GRID_SHAPE)
    root = tmp_path / "src"
    root.mkdir()
    (root / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}))
    write_v3(root / "x", data, GRID_SHARD, [sharding(GRID_CHUNK, [LE])])
    return root, [root / "x" / "c" / str(i) / str(j) for i in range(4) for j in range(4)]


def _index_read(shards: list[Path]) -> set[int]:
    """The positions (C order) of the shard files of which the page cache holds something."""
    return {at for at, path in enumerate(shards) if _resident(path)}


def test_a_cold_lookup_reads_the_index_of_its_shard_with_those_of_the_next_seven(tmp_path):
    """A lookup that needs a never-read index reads it together with those of the next shards in
    C order of the shard grid (never read before, and not past the grid's end), 8 in all, in one
    worker thread call: what the page cache holds of the shard files shows which were read.
    In-process (``tests/inproc.py``)."""
    root, shards = _shard_grid(tmp_path)
    with InProcess(root) as mnt:
        assert (mnt / "x" / ".zarray").read_bytes()  # the array's metadata is read before the shards are dropped
        os.sync()
        for path in shards:
            _evict(path)
        assert (mnt / "x" / "2.2").stat().st_size == 128  # shard (1, 1): position 5
        assert _index_read(shards) == set(range(5, 13))
        assert (mnt / "x" / "6.6").stat().st_size == 128  # shard (3, 3): the last one
        assert _index_read(shards) == set(range(5, 13)) | {15}
        assert (mnt / "x" / "6.2").stat().st_size == 128  # shard (3, 1): 15 was read already
        assert _index_read(shards) == set(range(5, 16))
        assert (mnt / "x" / "0.0").stat().st_size == 128
        assert _index_read(shards) == set(range(16))


def test_a_corrupt_shard_read_with_the_one_looked_up_is_neither_refused_nor_logged_before_asked(tmp_path, caplog):
    """The shards read along with a looked-up one (above) keep only their good tables: a corrupt
    one among them fails (EIO) and is logged when a client asks for it, not before. In-process
    (``tests/inproc.py``)."""
    root, shards = _shard_grid(tmp_path)
    with open(shards[6], "r+b") as f:  # shard (1, 2): its index's checksum no longer matches
        f.seek(-8, os.SEEK_END)
        f.write(b"\xff" * 4)
    caplog.set_level(logging.INFO, logger="shardfs")

    def errors() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]

    with InProcess(root) as mnt:
        assert (mnt / "x" / "2.2").stat().st_size == 128  # shard (1, 1), read with shards (1, 2) to (3, 0)
        assert (mnt / "x" / "2.6").stat().st_size == 128  # shard (1, 3): read with it
        assert errors() == []
        with pytest.raises(OSError) as e:
            (mnt / "x" / "2.4").stat()  # shard (1, 2)
        assert e.value.errno == errno.EIO
        found = errors()
        assert len(found) == 1 and "corrupt shard" in found[0] and "x/c/1/2" in found[0], found


def test_fewer_indexes_are_read_with_a_cold_one_when_their_tables_are_large(tmp_path):
    """Indexes read along with a cold one stay within 1 MiB of tables: with 16384 chunks per
    shard (256 KiB tables), 4 in all. The shard files are built here (a uint8 chunk at position
    0 of each, the index after it with its crc32c), as zarr-python 3 would write them.
    In-process (``tests/inproc.py``)."""
    import crc32c

    cps = 16384  # (128, 128) one-byte chunks per shard
    root = tmp_path / "src"
    root.mkdir()
    (root / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}))
    write_zarr3(root / "x", array_doc((512, 512), "uint8", (128, 128), [sharding((1, 1), [LE])]))
    shards = []
    for at in range(16):
        table = np.full((cps, 2), np.iinfo(np.uint64).max, dtype="<u8")
        table[0] = (0, 1)
        index = table.tobytes()
        path = root / "x" / "c" / str(at // 4) / str(at % 4)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes([at + 1]) + index + crc32c.crc32c(index).to_bytes(4, "little"))
        shards.append(path)
    with InProcess(root) as mnt:
        assert (mnt / "x" / ".zarray").read_bytes()
        os.sync()
        for path in shards:
            _evict(path)
        assert (mnt / "x" / "128.0").read_bytes() == bytes([5])  # shard (1, 0): position 4
        assert _index_read(shards) == set(range(4, 8))
