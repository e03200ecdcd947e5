"""A local source's shard files kept open between the chunk files read from them
(``shardfs.reads.local.ShardFiles``): at most ``KEPT_MAX`` without users, none unused for more
than ``KEPT_S``, and none once the worker is idle, so a shard file the source deleted or
replaced does not hold its disk blocks for long.

In process for the bounds (real descriptors of real files, the time given); through a real
mount for the idle worker (its ``/proc/PID/fd``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from conftest import open_files, serving_pid, wait_for
from shardfs.reads.local import ShardFiles
from shardfs.storage import Version
from sources import LE, sharding, write_v3


def _shards(tmp_path: Path, n: int) -> list[tuple[str, Version, Path]]:
    """``n`` files standing for shards: (key, version, path) each."""
    out = []
    for i in range(n):
        path = tmp_path / f"s{i}"
        path.write_bytes(bytes([i]) * 100)
        st = path.stat()
        out.append((f"s{i}", Version(st.st_ino, st.st_size, st.st_mtime_ns), path))
    return out


def _use(files: ShardFiles, key: str, version: Version, path: Path) -> int:
    """``key`` opened and kept in ``files`` (one use)."""
    fd = files.take(key, version)
    if fd is None:
        fd = os.open(path, os.O_RDONLY)
        files.add(key, version, fd)
    return fd


def test_an_unused_shard_descriptor_is_closed_after_kept_s_and_beyond_the_most_kept(tmp_path):
    shards = _shards(tmp_path, 4)
    files = ShardFiles(idle=3, kept_s=2.0)
    fds = [_use(files, *shards[0]), _use(files, *shards[1])]
    files.give(fds[0], now=10.0)
    files.give(fds[1], now=11.0)
    again = _use(files, *shards[0])  # kept: handed out again
    assert again == fds[0]
    files.give(again, now=11.5)
    fd2 = _use(files, *shards[2])
    files.give(fd2, now=13.2)  # shard 1, unused since 11.0, is closed; shard 0 (11.5) is not
    assert files.take(*shards[1][:2]) is None
    assert _use(files, *shards[0]) == fds[0]
    files.give(fds[0], now=13.3)
    fd3 = _use(files, *shards[3])
    fd1 = _use(files, *shards[1])  # (opened again)
    files.give(fd3, now=13.4)
    files.give(fd1, now=13.5)  # four unused, three kept at most: the least recently used goes
    assert files.take(*shards[2][:2]) is None
    assert [files.take(*s[:2]) is not None for s in (shards[0], shards[3], shards[1])] == [True, True, True]


def test_a_descriptor_in_use_is_kept_whatever_its_age_and_close_unused_closes_the_rest(tmp_path):
    shards = _shards(tmp_path, 2)
    files = ShardFiles(idle=8, kept_s=2.0)
    busy, idle = _use(files, *shards[0]), _use(files, *shards[1])
    files.give(idle, now=0.0)
    files.close_unused()
    assert files.take(*shards[1][:2]) is None
    assert files.take(*shards[0][:2]) == busy  # (two uses now)
    files.give(busy, now=100.0)
    assert files.take(*shards[0][:2]) == busy  # one use left: never closed under it
    files.give(busy, now=200.0)
    files.give(busy, now=200.0)
    files.close_unused()
    assert files.take(*shards[0][:2]) is None


def test_an_idle_worker_lets_go_of_a_shard_file_the_source_deleted(tmp_path, mount):
    """A chunk file read, then its shard file deleted from the source: once the mount has been
    idle a second, no descriptor of the worker holds that file (it held its disk blocks)."""
    data = np.arange(64 * 64, dtype="<u2").reshape(64, 64)
    root = tmp_path / "src"
    root.mkdir()
    (root / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}))
    write_v3(root / "x", data, (32, 64), [sharding((16, 16), [LE])])
    mnt = mount(root, "-o", "workers=1")
    assert (mnt / "x" / "0.0").read_bytes() == data[:16, :16].tobytes()
    shard = root / "x" / "c" / "0" / "0"
    pid = serving_pid(mnt)

    def held() -> list[str]:
        return [name for name in open_files(pid) if name.startswith(str(shard))]

    shard.unlink()
    wait_for(lambda: held() == [], 10, "the deleted shard file let go of")
    assert (mnt / "x" / "2.0").read_bytes() == data[32:48, :16].tobytes()  # another shard still read
