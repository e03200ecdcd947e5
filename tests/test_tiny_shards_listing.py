"""Listing an array of 30k shards of one inner chunk each: every entry exactly once, with the
attributes README promises; the listing reads many shards' indexes in one worker thread call (a
thread hop per shard made it 2-3k entries/s where DESIGN's target for ``ls -l``/``find`` over
100k chunk files is 20k entries/s: a listing's cost per shard, not per chunk, is what this array
measures). The rate itself is ``scripts/bench``'s row "ls -l over 30k one-chunk shards",
measured beside a real copy: a wall-clock rate flakes on a loaded machine.

The array is written directly (zarr 3 writes the metadata; each shard file is its 4 bytes of
data and the index with its crc32c, as zarr 3 writes it: the first two shards read back).
"""

from __future__ import annotations

import os
import subprocess

from inproc import InProcess
from shardfs.shards import indexes
from testkit.datasets import build_tiny

SHARDS = 30_000


def test_30k_one_chunk_shards_are_listed_exactly(tmp_path, mount):
    build_tiny(tmp_path / "src", SHARDS)
    names = [str(i) for i in range(SHARDS)]
    mnt = mount(tmp_path / "src", "-o", "ro")
    tiny = mnt / "tiny"

    # The chunk files (array root): each shard's index read for its one chunk.
    lines = listed(["ls", "-l", str(tiny)])
    files = [ln.split() for ln in lines if ln.startswith("-")]  # ls -l hides .zarray, .zattrs
    assert sorted(f[-1] for f in files) == sorted(names)
    assert {(f[0], f[1], f[4]) for f in files} == {("-r--r--r--", "2", "4")}

    # The shard directories: each one's mtime is its shard file's.
    lines = listed(["ls", "-l", str(tiny / "c")])
    dirs = [ln.split() for ln in lines if ln.startswith("d")]
    assert len(dirs) == len(lines) - 1 and sorted(d[-1] for d in dirs) == sorted(names)
    assert {(d[0], d[1]) for d in dirs} == {("dr-xr-xr-x", "2")}
    for i in (0, 1, SHARDS // 2, SHARDS - 1):
        assert os.stat(tiny / "c" / str(i)).st_mtime_ns == os.stat(tmp_path / "src" / "tiny" / "c" / str(i)).st_mtime_ns

    # find of the array (another fresh mount: nothing cached): its chunk and metadata files.
    mnt = mount(tmp_path / "src", "-o", "ro")
    tiny = mnt / "tiny"
    found = listed(["find", str(tiny)])
    base = str(tiny)
    assert sorted(found) == sorted([base, f"{base}/.zarray", f"{base}/.zattrs"] + [f"{base}/{i}" for i in names])
    assert (tiny / "c" / "7" / "7").read_bytes() == (tiny / "7").read_bytes() == bytes([8]) * 4


def listed(cmd: list[str]) -> list[str]:
    """The lines ``cmd`` prints."""
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()


def test_a_listing_reads_many_shards_indexes_in_one_worker_thread_call(tmp_path, monkeypatch):
    """Listing the chunk files of 3000 one-chunk shards of a local source reads their indexes
    in a few worker thread calls (a page of the listing's shards each), not one per shard."""
    n = 3000
    build_tiny(tmp_path / "src", n)
    calls: list[object] = []
    hop = indexes.blocking_read

    async def counted(fn, *args):
        calls.append(fn)
        return await hop(fn, *args)

    monkeypatch.setattr(indexes, "blocking_read", counted)
    with InProcess(tmp_path / "src") as fs:
        names = [name for name in (fs / "tiny").iterdir() if not name.startswith(".")]
        assert sorted(names, key=int) == [str(i) for i in range(n)]
        assert [(fs / "tiny" / "7").read_bytes(), (fs / "tiny" / "c" / "7" / "7").read_bytes()] == [bytes([8]) * 4] * 2
    print(f"\n{len(calls)} worker thread calls of the shards' indexes for {n} shards")
    assert 1 <= len(calls) <= n // 100, len(calls)
