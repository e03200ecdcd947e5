"""Bounded memory and POSIX limits of writes through the mount (issue 12, items 3 and 6).

Writers may send anything: 1 GiB into a chunk file or a temporary, a 100 GiB
truncate, names longer than 255 bytes. The daemon's peak RSS (VmHWM from
/proc/PID/status) stays under 400 MiB, temporaries beyond 8 MiB live in
unlinked spill files that ``rm`` releases, chunk files refuse to grow past the
largest valid encoded chunk (EFBIG), and errnos are the POSIX ones. The EFBIG bound
itself is checked in-process (``tests/inproc.py``), the rest through real mounts.
"""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from shardfs.app.state import spill_dir
from inproc import InProcess
from writers import umount
from sources import Spec, assert_source_equals, build

s = slice
MiB = 1 << 20
RSS_LIMIT = 400 * MiB
# zstd, 80-byte inner chunks: the largest valid chunk file is 80 + 10 + 1 + 4096 bytes.
SMALL = Spec("small", (20, 27), (4, 5), (8, 10), "<i4", 0, ("zstd", 3), inner_crc=False,
             index_location="end", index_crc=True, initial=((s(0, 8), s(0, 10)),), write=())
SMALL_BOUND = 80 + 80 // 8 + 80 // 64 + 4096
# 16 MiB inner chunks: a valid chunk file of random int32 is larger than the 8 MiB spill threshold.
BIG = Spec("big", (1024, 8192), (512, 8192), (1024, 8192), "<i4", 0, ("zstd", 1), inner_crc=True,
           index_location="end", index_crc=True, initial=(), write=())
BIG_BOUND = 16 * MiB + 2 * MiB + 256 * 1024 + 4096


def vm_hwm(pid: int) -> int:
    """The process's peak resident set size in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def spill_fds(pid: int, where: str) -> list[int]:
    """Descriptors of the daemon open on (unlinked) spill files in directory ``where``."""
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith(where + "/"):
            assert target.endswith("(deleted)"), target
            out.append(int(fd))
    return out


def dd(dst: Path, count_mib: int, src: str = "/dev/zero", extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run(["dd", f"if={src}", f"of={dst}", "bs=1M", f"count={count_mib}", *extra],
                          capture_output=True, text=True, timeout=300)


@pytest.fixture
def mounted(tmp_path, mount):
    """A mounted source with SMALL and BIG: ``(src, mnt, daemon, expected, mount factory)``."""
    src = tmp_path / "src"
    expected = build(src, [SMALL, BIG])
    mnt = mount(src, "-o", "workers=1")  # (the peak RSS and the spill files of the one process that writes)
    return src, mnt, mount.info(mnt), expected, mount


def refusals(daemon, what: str) -> list[str]:
    return [ln for ln in daemon.log_text().splitlines() if f"{what} refused" in ln]


def test_1gib_into_a_chunk_file_is_refused_with_efbig_in_bounded_memory(mounted):
    src, mnt, daemon, expected, mount = mounted
    before = (mnt / "small" / "0.0").read_bytes()
    r = dd(mnt / "small" / "0.0", 1024, extra=("conv=notrunc",))
    assert r.returncode == 1 and "File too large" in r.stderr, r.stderr
    assert (mnt / "small" / "0.0").read_bytes() == before  # nothing committed
    assert len(refusals(daemon, "write")) == 1
    assert "more than any valid chunk (at most 4187 bytes)" in refusals(daemon, "write")[0]
    # 16 MiB chunks: the first 8 MiB in memory, then a spill file; refused past the bound.
    r = dd(mnt / "big" / "0.0", 1024, src="/dev/urandom")
    assert r.returncode == 1 and "File too large" in r.stderr, r.stderr
    # One line for the EFBIG, one for close() refusing the garbage written before it (and one
    # more for the empty file: dd closes a duplicate descriptor of it before writing).
    big = [ln for ln in refusals(daemon, "write") if "/big/0.0" in ln]
    assert len([ln for ln in big if "more than any valid chunk" in ln]) == 1
    assert len(big) == 3, big
    assert not (mnt / "big" / "0.0").exists()
    assert vm_hwm(daemon.serving_pid) < RSS_LIMIT, vm_hwm(daemon.serving_pid)
    assert spill_fds(daemon.serving_pid, spill_dir(str(src))) == []
    umount(mount, mnt)
    assert_source_equals(src, "small", expected["small"])
    assert_source_equals(src, "big", expected["big"])


def test_a_valid_chunk_larger_than_the_spill_threshold_commits(mounted):
    src, mnt, daemon, expected, mount = mounted
    block = BIG.values(BIG.chunk, 7).astype("<i4")
    block[::2] = np.random.default_rng(3).integers(-2**31, 2**31 - 1, size=block[::2].shape, dtype="<i4")
    data = BIG.encode(block)
    assert 8 * MiB < len(data) <= BIG_BOUND
    with open(mnt / "big" / "1.0", "wb") as f:
        for off in range(0, len(data), MiB):
            f.write(data[off: off + MiB])
    assert (mnt / "big" / "1.0").read_bytes() == data
    expected["big"][512:1024] = block
    assert vm_hwm(daemon.serving_pid) < RSS_LIMIT, vm_hwm(daemon.serving_pid)
    umount(mount, mnt)
    assert_source_equals(src, "big", expected["big"])


def test_1gib_temporary_spills_to_disk_and_rm_frees_it(mounted):
    src, mnt, daemon, expected, mount = mounted
    spill = spill_dir(str(src))
    tmp = mnt / "small" / "0.0.cafe.partial"
    r = dd(tmp, 1024)
    assert r.returncode == 0, r.stderr
    assert os.stat(tmp).st_size == 1024 * MiB
    with open(tmp, "rb") as f:
        f.seek(1000 * MiB)
        assert f.read(MiB) == bytes(MiB)
    assert vm_hwm(daemon.serving_pid) < RSS_LIMIT, vm_hwm(daemon.serving_pid)
    (fd,) = spill_fds(daemon.serving_pid, spill)
    assert os.stat(f"/proc/{daemon.serving_pid}/fd/{fd}").st_blocks * 512 >= 1024 * MiB
    free = os.statvfs(spill).f_bfree * os.statvfs(spill).f_frsize
    os.unlink(tmp)
    assert spill_fds(daemon.serving_pid, spill) == []
    assert os.statvfs(spill).f_bfree * os.statvfs(spill).f_frsize >= free + 900 * MiB
    assert not tmp.exists()
    umount(mount, mnt)


def test_truncating_a_temporary_to_100g_allocates_nothing(mounted):
    src, mnt, daemon, expected, mount = mounted
    tmp = mnt / "small" / "0.1.beef.partial"
    tmp.write_bytes(b"abc")
    os.truncate(tmp, 100 << 30)  # by path: no open handle
    assert os.stat(tmp).st_size == 100 << 30
    (fd,) = spill_fds(daemon.serving_pid, spill_dir(str(src)))
    assert os.stat(f"/proc/{daemon.serving_pid}/fd/{fd}").st_blocks * 512 < MiB
    with open(tmp, "rb") as f:
        assert f.read(5) == b"abc\0\0"
        f.seek(77 << 30)
        assert f.read(4) == bytes(4)
    with open(tmp, "r+b") as f:
        f.truncate(2)
    assert tmp.read_bytes() == b"ab"
    assert vm_hwm(daemon.serving_pid) < RSS_LIMIT, vm_hwm(daemon.serving_pid)
    os.unlink(tmp)
    assert spill_fds(daemon.serving_pid, spill_dir(str(src))) == []
    umount(mount, mnt)


def test_truncating_a_chunk_file_past_its_bound_is_efbig(tmp_path):
    """In-process (``tests/inproc.py``): ``truncate(2)`` by path and ``ftruncate`` of a handle."""
    src = tmp_path / "src"
    expected = build(src, [SMALL])
    with InProcess(src, read_only=False) as fs:
        chunk = fs / "small" / "0.0"
        before = chunk.read_bytes()
        for size in (SMALL_BOUND + 1, 100 << 30):
            with pytest.raises(OSError) as e:
                chunk.truncate(size)
            assert e.value.errno == errno.EFBIG
            with chunk.open("r+b") as f, pytest.raises(OSError) as e:
                f.truncate(size)
            assert e.value.errno == errno.EFBIG
        with pytest.raises(OSError) as e:
            chunk.truncate(3)  # by path, within the bound: rewrite the file instead
        assert e.value.errno == errno.EPERM
        f = chunk.open("r+b")
        f.truncate(SMALL_BOUND)  # allowed while open (refused at close: not one chunk)
        with pytest.raises(OSError) as e:
            f.close()
        assert e.value.errno == errno.EINVAL
        assert chunk.read_bytes() == before
    assert_source_equals(src, "small", expected["small"])


def test_refused_commit_shows_the_previous_size_at_once(mounted):
    src, mnt, daemon, expected, mount = mounted
    chunk = mnt / "small" / "0.0"
    before = chunk.read_bytes()
    fd = os.open(chunk, os.O_WRONLY)
    os.pwrite(fd, b"x" * 3000, 0)
    assert os.stat(chunk).st_size == 3000
    with pytest.raises(OSError) as e:
        os.close(fd)  # the descriptor is closed even so
    assert e.value.errno == errno.EINVAL
    assert os.stat(chunk).st_size == len(before)
    assert chunk.read_bytes() == before
    umount(mount, mnt)


def test_names_longer_than_255_bytes(mounted):
    src, mnt, daemon, expected, mount = mounted
    arr = mnt / "small"
    long = "t" * 256
    ok = "t" * 255
    for call in (lambda: os.stat(arr / long), lambda: open(arr / long, "wb"), lambda: os.mkdir(arr / long),
                 lambda: os.rename(arr / ok, arr / long), lambda: os.link(arr / ok, arr / long),
                 lambda: os.stat(mnt / ("é" * 128))):
        if not (arr / ok).exists():
            (arr / ok).write_bytes(b"x")
        with pytest.raises(OSError) as e:
            call()
        assert e.value.errno == errno.ENAMETOOLONG
    assert (arr / ok).read_bytes() == b"x"  # 255 bytes is fine
    os.rename(arr / ok, arr / ("u" * 255))
    os.unlink(arr / ("u" * 255))
    umount(mount, mnt)
