"""The FUSE requests a close() costs: the README's "A file opened for reading costs no FLUSH
request at its close(), on a writable mount too" (the kernel is asked for none with
``FOPEN_NOFLUSH``, which the pyfuse3 that scripts/install builds can set), while a written
chunk file is still committed by the FLUSH of its close(), whose error close() reports.

The requests are the ones the real daemon reads from ``/dev/fuse``: it runs under strace, which
prints the first bytes of each read, the start of a ``fuse_in_header`` (``u32 len``, ``u32 opcode``).
"""

from __future__ import annotations

import errno
import re
import os
import shutil
import signal
import subprocess
from collections import Counter
from pathlib import Path

import pytest

import pyfuse3
from conftest import read_zarr2, traced_daemon
from sources import Spec, assert_read_equals, build

from shardfs.kernel import fuse_ops

STRACE = shutil.which("strace")
s = slice
ARR = Spec("arr", (8, 8), (2, 2), (4, 4), "<i4", 0, ("zstd", 1), inner_crc=False, index_location="end",
           index_crc=True, initial=((s(0, 8), s(0, 8)),), write=(s(0, 2), s(0, 2)))
CHUNKS = [f"{i}.{j}" for i in range(4) for j in range(4)]  # every chunk file of ARR (all stored)
OPCODES = {1: "LOOKUP", 3: "GETATTR", 4: "SETATTR", 14: "OPEN", 15: "READ", 16: "WRITE", 18: "RELEASE",
           25: "FLUSH", 26: "INIT", 27: "OPENDIR", 28: "READDIR", 29: "RELEASEDIR", 35: "CREATE",
           38: "DESTROY", 39: "IOCTL", 42: "BATCH_FORGET", 44: "READDIRPLUS"}
# A read of /dev/fuse as strace -y -xx -s 8 prints it: the path and the first 8 bytes in hex.
DEV_FUSE = "".join(f"\\x{b:02x}" for b in b"/dev/fuse")
FUSE_READ = re.compile(r'^(?:\d+ +)?read\(\d+<' + re.escape(DEV_FUSE) + r'>, "((?:\\x[0-9a-f]{2}){8})"')


def requests(trace: Path) -> Counter:
    """How many requests of each opcode (its name in ``OPCODES``, else its number) the daemon read:
    every process's (``trace.PID``, one file each: ``traced_mount``)."""
    out: Counter = Counter()
    lines = [line for each in sorted(trace.parent.glob(trace.name + ".*")) for line in each.read_text().splitlines()]
    assert lines, f"no {trace}.PID written by strace"
    for line in lines:
        m = FUSE_READ.match(line)
        if m:
            header = bytes(int(h, 16) for h in m.group(1).split("\\x")[1:])
            opcode = int.from_bytes(header[4:8], "little")
            out[OPCODES.get(opcode, opcode)] += 1
    return out


def traced_mount(mount, src: Path, trace: Path) -> Path:
    """A writable mount of ``src`` whose daemon runs under strace (``-ff``: the supervisor and the
    workers it starts, which read /dev/fuse), tracing each one's reads into ``trace.PID`` (one file
    each: in one file, the reads of two workers at once are split into an ``<unfinished ...>`` line
    and a ``<... read resumed>`` one)."""
    return mount(src, prefix=(STRACE, "-ff", "-qq", "-y", "-xx", "-s", "8", "-o", str(trace), "-e", "trace=read"))


def stop(mount, mnt: Path) -> None:
    """End the traced daemon as ``shardfs umount`` would (SIGTERM: it folds, then unmounts);
    strace ends with it, its log complete."""
    info = mount.info(mnt)
    os.kill(traced_daemon(info), signal.SIGTERM)
    assert info.proc.wait(timeout=60) == 0, info.output()[-3000:]


def test_the_installed_pyfuse3_can_ask_for_no_flush():
    """scripts/install builds pyfuse3 with FileInfo.noflush (a stock build would cost a FLUSH per
    close) and Operations.enable_parallel_dirops (a stock build looks names up one at a time)."""
    assert pyfuse3.FileInfo(noflush=True).noflush
    assert pyfuse3.Operations.enable_parallel_dirops is False
    assert fuse_ops.NOFLUSH


@pytest.mark.skipif(STRACE is None, reason="strace is not installed (scripts/install installs it)")
def test_reads_on_a_writable_mount_send_no_flush(tmp_path, mount):
    src = tmp_path / "src"
    expected = build(src, [ARR])["arr"]
    trace = tmp_path / "strace.log"
    mnt = traced_mount(mount, src, trace)
    for name in CHUNKS:
        r = subprocess.run(["cat", str(mnt / "arr" / name)], capture_output=True, timeout=30, check=True)
        i, j = map(int, name.split("."))
        assert_read_equals(ARR.decode(r.stdout), expected[2 * i:2 * i + 2, 2 * j:2 * j + 2], f"cat {name}")
    assert_read_equals(read_zarr2(mnt / "arr"), expected, "zarr 2.18 whole-array read")
    stop(mount, mnt)
    got = requests(trace)
    # each chunk file opened by cat and by zarr 2.18 (which also opens .zarray), and closed
    assert got["OPEN"] == got["RELEASE"] == 2 * len(CHUNKS) + 1, got
    assert got["FLUSH"] == 0, got


@pytest.mark.skipif(STRACE is None, reason="strace is not installed (scripts/install installs it)")
def test_a_written_chunk_is_still_flushed_at_close(tmp_path, mount):
    src = tmp_path / "src"
    build(src, [ARR])
    trace = tmp_path / "strace.log"
    mnt = traced_mount(mount, src, trace)
    values = ARR.values(ARR.chunk, 5)
    with open(mnt / "arr" / "0.0", "wb") as f:
        f.write(ARR.encode(values))
    f = open(mnt / "arr" / "0.1", "wb")
    f.write(b"junk")
    with pytest.raises(OSError) as e:
        f.close()  # the FLUSH's error: the written bytes are no chunk
    assert e.value.errno == errno.EINVAL, f"close() of a garbage chunk: {e.value}"
    assert (mnt / "arr" / "0.0").read_bytes() == ARR.encode(values)
    stop(mount, mnt)
    got = requests(trace)
    assert got["FLUSH"] == 2, got  # one per close() of a file opened for writing
