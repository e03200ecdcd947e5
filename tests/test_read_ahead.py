"""Read-ahead of a swept shard from a local source: once a client has opened three chunk files
of one shard among its last opens, the kernel is asked to read that whole shard into the source's
page cache (``POSIX_FADV_WILLNEED``), so the next chunk files of it are
served without waiting for the disk; a shard with fewer opens is not read ahead.

What the page cache holds of a shard file is read with ``mincore`` (``test_page_fill.resident``),
after the shard files were dropped from it (``POSIX_FADV_DONTNEED`` of clean pages).
"""

from __future__ import annotations

import json
import mmap
import os
from pathlib import Path

import numpy as np

from conftest import wait_for
from sources import LE, sharding, write_v3
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
