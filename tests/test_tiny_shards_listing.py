"""Listing an array of 30k shards of one inner chunk each: every entry exactly once, with the
attributes README promises, at least 20k entries per second of the daemon's CPU time (DESIGN's
target for ``ls -l``/``find`` over 100k chunk files is 20k entries/s; a listing's cost per shard,
not per chunk, is what this array measures).

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


def cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid`` (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def listed(mount, mnt: Path, cmd: list[str], entries: int, rates: dict[str, tuple[float, float]], what: str
           ) -> list[str]:
    """The lines of ``cmd``; ``rates[what]`` = (entries per second of wall time, entries per
    second of the daemon's CPU time)."""
    pid = mount.info(mnt).pid
    cpu, t0 = cpu_seconds(pid), time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()
    wall, cpu = time.monotonic() - t0, cpu_seconds(pid) - cpu
    rates[what] = (entries / wall, entries / max(cpu, 0.01))
    return out


def test_30k_one_chunk_shards_are_listed_exactly_at_20k_entries_per_second(tmp_path, mount):
    build_tiny(tmp_path / "src", SHARDS)
    names = [str(i) for i in range(SHARDS)]
    rates: dict[str, tuple[float, float]] = {}
    mnt = mount(tmp_path / "src", "-o", "ro")
    tiny = mnt / "tiny"

    # The chunk files (array root): each shard's index read for its one chunk.
    lines = listed(mount, mnt, ["ls", "-l", str(tiny)], SHARDS, rates, "ls -l of the chunk files")
    files = [ln.split() for ln in lines if ln.startswith("-")]  # ls -l hides .zarray, .zattrs
    assert sorted(f[-1] for f in files) == sorted(names)
    assert {(f[0], f[1], f[4]) for f in files} == {("-r--r--r--", "2", "4")}

    # The shard directories: each one's mtime is its shard file's.
    lines = listed(mount, mnt, ["ls", "-l", str(tiny / "c")], SHARDS, rates, "ls -l of the shard directories")
    dirs = [ln.split() for ln in lines if ln.startswith("d")]
    assert len(dirs) == len(lines) - 1 and sorted(d[-1] for d in dirs) == sorted(names)
    assert {(d[0], d[1]) for d in dirs} == {("dr-xr-xr-x", "2")}
    for i in (0, 1, SHARDS // 2, SHARDS - 1):
        assert os.stat(tiny / "c" / str(i)).st_mtime_ns == os.stat(tmp_path / "src" / "tiny" / "c" / str(i)).st_mtime_ns

    # find of the array (another fresh mount: nothing cached): its chunk and metadata files.
    mnt = mount(tmp_path / "src", "-o", "ro")
    tiny = mnt / "tiny"
    found = listed(mount, mnt, ["find", str(tiny)], SHARDS, rates, "find")
    base = str(tiny)
    assert sorted(found) == sorted([base, f"{base}/.zarray", f"{base}/.zattrs"] + [f"{base}/{i}" for i in names])
    assert (tiny / "c" / "7" / "7").read_bytes() == (tiny / "7").read_bytes() == bytes([8]) * 4

    print("\n" + "; ".join(f"{what} of {SHARDS}: {wall:.0f} entries/s, {cpu:.0f} per daemon CPU second"
                           for what, (wall, cpu) in rates.items()))
    # The daemon's CPU time per entry is what a shared machine hardly changes; wall time, which
    # the other tenants of a 2-core VM inflate (measured 10-28k entries/s; 2-3k before listings
    # read many indexes per thread call), is checked against gross regressions only.
    assert all(cpu >= RATE and wall >= RATE / 4 for wall, cpu in rates.values()), rates
