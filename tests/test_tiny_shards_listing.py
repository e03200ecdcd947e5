"""Listing an array of 30k shards of one inner chunk each: every entry exactly once, with the
attributes README promises, at least 20k entries/s (DESIGN's target for ``ls -l``/``find`` over
100k chunk files; a listing's cost per shard, not per chunk, is what this array measures).

The array is written directly (zarr 3 writes the metadata; each shard file is its 4 bytes of
data and the index with its crc32c, as zarr 3 writes it: the first two shards read back).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import crc32c
import numpy as np
import zarr

SHARDS = 30_000
RATE = 20_000  # entries/s (DESIGN: ls -l / find over 100k chunk files)


def build_tiny(root: Path, n: int) -> None:
    """``root`` = group with ``tiny``: shape (4n,) uint8, shards (4,) of one (4,) chunk; shard
    ``i`` holds ``i % 255 + 1`` four times."""
    g = zarr.open_group(str(root), mode="w")
    arr = g.create_array("tiny", shape=(4 * n,), chunks=(4,), shards=(4,), dtype="uint8", compressors=None,
                         fill_value=0)
    index = np.array([[0, 4]], dtype="<u8").tobytes()
    tail = index + np.array([crc32c.crc32c(index)], dtype="<u4").tobytes()
    shards = root / "tiny" / "c"
    shards.mkdir(parents=True)
    fd = os.open(shards, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(n):
            f = os.open(str(i), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=fd)
            try:
                os.write(f, bytes([i % 255 + 1]) * 4 + tail)
            finally:
                os.close(f)
    finally:
        os.close(fd)
    assert arr[:8].tolist() == [1] * 4 + [2] * 4


def timed(cmd: list[str]) -> tuple[list[str], float]:
    t0 = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()
    return out, time.monotonic() - t0


def test_30k_one_chunk_shards_are_listed_exactly_at_20k_entries_per_second(tmp_path, mount):
    build_tiny(tmp_path / "src", SHARDS)
    mnt = mount(tmp_path / "src", "-o", "ro")
    tiny = mnt / "tiny"
    names = [str(i) for i in range(SHARDS)]

    # The chunk files (array root): each shard's index read for its one chunk.
    lines, chunks_s = timed(["ls", "-l", "--time-style=+%s", str(tiny)])
    files = [ln.split() for ln in lines if ln.startswith("-")]  # ls -l hides .zarray, .zattrs
    assert sorted(f[-1] for f in files) == sorted(names)
    assert {(f[0], f[1], f[4]) for f in files} == {("-r--r--r--", "2", "4")}

    # The shard directories: each one's mtime is its shard file's.
    lines, dirs_s = timed(["ls", "-l", "--time-style=+%s", str(tiny / "c")])
    dirs = [ln.split() for ln in lines if ln.startswith("d")]
    assert len(dirs) == len(lines) - 1 and sorted(d[-1] for d in dirs) == sorted(names)
    assert {(d[0], d[1]) for d in dirs} == {("dr-xr-xr-x", "2")}
    for i in (0, 1, SHARDS // 2, SHARDS - 1):
        assert os.stat(tiny / "c" / str(i)).st_mtime_ns == os.stat(tmp_path / "src" / "tiny" / "c" / str(i)).st_mtime_ns

    # find of the array (a fresh mount: nothing cached): the chunk files and metadata files.
    mnt2 = mount(tmp_path / "src", "-o", "ro")
    found, find_s = timed(["find", str(mnt2 / "tiny")])
    base = str(mnt2 / "tiny")
    assert sorted(found) == sorted([base, f"{base}/.zarray", f"{base}/.zattrs"] + [f"{base}/{i}" for i in names])
    assert (mnt2 / "tiny" / "c" / "7" / "7").read_bytes() == (mnt2 / "tiny" / "7").read_bytes() == bytes([8]) * 4

    print(f"\nls -l of {SHARDS} chunk files {SHARDS / chunks_s:.0f} entries/s, of {SHARDS} shard directories "
          f"{SHARDS / dirs_s:.0f}/s; find {SHARDS / find_s:.0f}/s")
    assert SHARDS / chunks_s >= RATE and SHARDS / dirs_s >= RATE and SHARDS / find_s >= RATE
