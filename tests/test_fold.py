"""What a fold writes: the README's "A shard is always replaced whole" (its lock file in the
same directory written, fsynced, renamed over the shard, then the directory fsynced: observed
with strace on the real daemon) and "Rewritten shards store inner chunks in Morton (Z) order, as zarr-python 3 does"
(zarr-python 3 writing the same data is the oracle)."""

from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import serving_pid, traced_daemon
from inproc import InProcess
from sources import Spec, assert_source_equals, build, journal_entries, leftovers, write_zarr3
from writers import WRITERS, umount

s = slice
EMPTY = 2**64 - 1


# --------------------------------------------------------------------------- durability

STRACE = shutil.which("strace")
DUR = Spec("dur", (8, 8), (2, 2), (4, 4), "<i4", 0, ("zstd", 1), inner_crc=False, index_location="end",
           index_crc=True, initial=((s(0, 4), s(0, 4)),), write=(s(0, 2), s(0, 2)))
# One syscall of the strace log: pid, name, the raw arguments (unfinished calls included).
SYSCALL = re.compile(r"^(\d+)\s+(fsync|fdatasync|rename|renameat|renameat2)\((.*)")


def syscalls(log: str) -> list[tuple[str, str]]:
    """``(name, args)`` of each traced call, in the order the calls started."""
    out = []
    for line in log.splitlines():
        m = SYSCALL.match(line)
        if m:
            out.append((m.group(2), m.group(3)))
    return out


def fd_path(args: str) -> str:
    """The path strace ``-y`` prints for an fsync's descriptor: ``5</a/b>`` -> ``/a/b``."""
    m = re.match(r"\d+<(.*?)>", args)
    assert m, args
    return m.group(1)


def rename_paths(name: str, args: str) -> tuple[str, str]:
    """Both paths of a rename; ``renameat``'s are joined to the directory strace ``-y`` prints
    for their descriptor (``5</a/b>, "x"`` -> ``/a/b/x``)."""
    parts = re.findall(r'(?:(\d+<[^>]*>|AT_FDCWD),\s*)?"((?:[^"\\]|\\.)*)"', args)
    assert len(parts) == 2, (name, args)
    old, new = (os.path.join(fd_path(d), p) if d and d != "AT_FDCWD" else p for d, p in parts)
    return old, new


@pytest.mark.skipif(STRACE is None, reason="strace is not installed (scripts/install installs it)")
def test_fold_fsyncs_the_shard_before_the_rename_and_the_directory_after(tmp_path, mount):
    src = tmp_path / "src"
    expected = build(src, [DUR])["dur"]
    shard = DUR.shard_file(src, (0, 0))
    trace = tmp_path / "strace.log"
    # (one worker: the calls of one process, none split by another's in the trace)
    mnt = mount(src, "-o", "workers=1", prefix=(STRACE, "-f", "-qq", "-y", "-s", "4096", "-o", str(trace),
                                                "-e", "trace=fsync,fdatasync,rename,renameat,renameat2"))
    values = DUR.values(DUR.chunk, 7)
    with open(mnt / "dur" / "0.0", "wb") as f:
        f.write(DUR.encode(values))
    expected[DUR.chunk_region((0, 0))] = values
    info = mount.info(mnt)
    os.kill(traced_daemon(info), signal.SIGTERM)  # folds, then unmounts; strace ends with it
    assert info.proc.wait(timeout=60) == 0, info.output()[-3000:]

    calls = syscalls(trace.read_text())
    renames = [(i, *rename_paths(n, a)) for i, (n, a) in enumerate(calls) if n.startswith("rename")]
    onto = [(i, old) for i, old, new in renames if new == str(shard)]
    assert len(onto) == 1, f"want one rename onto {shard}, got {renames}"
    at, tmp = onto[0]
    assert os.path.dirname(tmp) == os.path.dirname(str(shard)), tmp
    fsyncs = [(i, fd_path(a)) for i, (n, a) in enumerate(calls) if n in ("fsync", "fdatasync")]
    assert [i for i, p in fsyncs if p == tmp and i < at], f"no fsync of {tmp} before its rename: {calls}"
    assert [i for i, p in fsyncs if p == os.path.dirname(str(shard)) and i > at], (
        f"no fsync of {os.path.dirname(str(shard))} after the rename: {calls}")
    assert_source_equals(src, "dur", expected)
    assert leftovers(src) == []


# --------------------------------------------------------------------------- Morton order

MORTON = [
    Spec("sq", (8, 16), (2, 2), (8, 8), "<i4", 0, ("zstd", 1), inner_crc=False, index_location="end",
         index_crc=True, initial=((s(0, 2), s(0, 2)), (s(6, 8), s(10, 14))), write=(s(0, 8), s(0, 16))),
    Spec("odd", (4, 8, 6), (1, 2, 2), (2, 8, 6), "<u2", 0, ("gzip", 1), inner_crc=True,
         index_location="start", index_crc=False, initial=(), write=(s(0, 4), s(1, 8), s(0, 6))),
]


def index_table(spec: Spec, blob: bytes) -> np.ndarray:
    """The ``(n, 2)`` little-endian index of a shard (checksum skipped)."""
    n = int(np.prod(spec.chunks_per_shard))
    raw = blob[: 16 * n] if spec.index_location == "start" else blob[len(blob) - 16 * n - 4 * spec.index_crc:]
    return np.frombuffer(raw[: 16 * n], dtype="<u8").reshape(n, 2)


@pytest.mark.parametrize("spec", MORTON, ids=lambda sp: sp.name)
def test_folded_shards_store_chunks_in_morton_order(spec, tmp_path, mount):
    src = tmp_path / "src"
    expected = build(src, [spec])[spec.name]
    mnt = mount(src)
    values = spec.values(expected[spec.write].shape, 11)
    WRITERS["tensorstore"](mnt / spec.name, spec.write, values, tmp_path)
    expected[spec.write] = values
    umount(mount, mnt)
    assert_source_equals(src, spec.name, expected)
    write_zarr3(tmp_path / "ref" / spec.name, spec.v3_metadata(), [((...), expected)])  # zarr-python 3 in one go

    shards = sorted(p for p in (src / spec.name / "c").rglob("*") if p.is_file())
    assert len(shards) == int(np.prod(spec.shard_grid)), shards
    for f in shards:
        rel = f.relative_to(src / spec.name)
        got = index_table(spec, f.read_bytes())
        ref = index_table(spec, (tmp_path / "ref" / spec.name / rel).read_bytes())
        stored = got[:, 0] != EMPTY
        assert (stored == (ref[:, 0] != EMPTY)).all(), f"{rel}: other chunks stored than zarr-python 3 stores"
        assert stored.sum() >= 2, rel
        order = np.argsort(got[stored, 0], kind="stable")
        ref_order = np.argsort(ref[stored, 0], kind="stable")
        assert order.tolist() == ref_order.tolist(), f"{rel}: chunks not in zarr-python 3's (Morton) order"
        offsets = got[stored, 0][ref_order]
        assert (np.diff(offsets.astype(np.int64)) > 0).all(), f"{rel}: offsets not increasing: {offsets}"


@pytest.mark.parametrize("spec", MORTON, ids=lambda sp: sp.name)
def test_folded_shards_store_chunks_in_morton_order_in_process(spec, tmp_path):
    """The daemon's part of ``folded_shards_store_chunks_in_morton_order``, in-process
    (``tests/inproc.py``): chunk files written one by one are folded with their shards' chunks
    in zarr-python 3's (Morton) order, offsets increasing (the mounted test writes with
    tensorstore)."""
    src = tmp_path / "src"
    expected = build(src, [spec])[spec.name]
    expected[spec.write] = spec.values(expected[spec.write].shape, 11)
    touched = [range(r.start // c, -(-r.stop // c)) for r, c in zip(spec.write, spec.chunk)]
    with InProcess(src, read_only=False) as fs:
        for idx in itertools.product(*touched):
            (fs / spec.name / spec.chunk_name(idx)).write_bytes(spec.encode(expected[spec.chunk_region(idx)]))
    assert_source_equals(src, spec.name, expected)
    write_zarr3(tmp_path / "ref" / spec.name, spec.v3_metadata(), [((...), expected)])  # zarr-python 3 in one go
    for f in sorted(p for p in (src / spec.name / "c").rglob("*") if p.is_file()):
        rel = f.relative_to(src / spec.name)
        got = index_table(spec, f.read_bytes())
        ref = index_table(spec, (tmp_path / "ref" / spec.name / rel).read_bytes())
        stored = got[:, 0] != EMPTY
        assert (stored == (ref[:, 0] != EMPTY)).all(), f"{rel}: other chunks stored than zarr-python 3 stores"
        ref_order = np.argsort(ref[stored, 0], kind="stable")
        assert np.argsort(got[stored, 0], kind="stable").tolist() == ref_order.tolist(), f"{rel}: not Morton order"
        assert (np.diff(got[stored, 0][ref_order].astype(np.int64)) > 0).all(), f"{rel}: offsets not increasing"


# --------------------------------------------------------------------------- when a shard is folded

COMPLETE = Spec("full", (8, 8), (2, 2), (4, 4), "<i4", 0, ("zstd", 1), inner_crc=False, index_location="end",
                index_crc=True, initial=((s(0, 4), s(0, 4)),), write=(s(0, 4), s(0, 4)))


def test_a_complete_shard_is_folded_while_writes_go_on(tmp_path):
    """Once every chunk of a shard is pending it is folded at once, without waiting for the
    mount to be idle: here another shard is written to without pause the whole time.
    In-process (``tests/inproc.py``: the write-back's folds run on the tree's loop)."""
    src = tmp_path / "src"
    expected = build(src, [COMPLETE])["full"]
    shard = COMPLETE.shard_file(src, (0, 0))
    before = shard.stat().st_ino
    with InProcess(src, read_only=False) as fs:
        arr = fs / "full"
        for k, idx in enumerate(all_chunks_of(COMPLETE, (0, 0))):
            values = COMPLETE.values(COMPLETE.chunk, 100 + k)
            (arr / COMPLETE.chunk_name(idx)).write_bytes(COMPLETE.encode(values))
            expected[COMPLETE.chunk_region(idx)] = values
        other = COMPLETE.encode(COMPLETE.values(COMPLETE.chunk, 99))
        deadline = time.monotonic() + 30  # a hang: waiting for an idle mount, it is never folded
        while True:  # at least once: the complete shard may be folded before the first look
            (arr / "3.3").write_bytes(other)  # shard (1, 1): never complete, and the mount never idle
            if shard.stat().st_ino != before:
                break
            assert time.monotonic() < deadline, "the complete shard was not folded within 30 s of busy writing"
    expected[COMPLETE.chunk_region((3, 3))] = COMPLETE.decode(other)
    assert_source_equals(src, "full", expected)


def main_thread_wakeups(pid: int) -> int:
    """Voluntary context switches of the main thread of process ``pid`` so far."""
    status = Path(f"/proc/{pid}/task/{pid}/status").read_text()
    found = re.search(r"^voluntary_ctxt_switches:\s*(\d+)", status, re.M)
    assert found is not None, status
    return int(found.group(1))


def settled(pids: tuple[int, ...], quiet: float = 1.5, most: float = 15) -> list[int]:
    """The main threads' wakeups of ``pids`` once none woke for ``quiet`` seconds (or after
    ``most`` seconds, whatever they are then)."""
    deadline = time.monotonic() + most
    last = [main_thread_wakeups(pid) for pid in pids]
    while True:
        time.sleep(quiet)
        now = [main_thread_wakeups(pid) for pid in pids]
        if now == last or time.monotonic() > deadline:
            return now
        last = now


def test_an_idle_daemon_sleeps_and_a_write_is_still_folded_once_idle(tmp_path, mount):
    """With nothing pending the main threads of the supervisor and of its worker never wake (no
    timer runs: 0 wakeups in 2 s, once the worker's looks for a second without requests are
    over, the idle trim of its heap); a write to an incomplete shard then wakes the worker, and is
    folded once the mount is idle."""
    src = tmp_path / "src"
    expected = build(src, [COMPLETE])["full"]
    shard = COMPLETE.shard_file(src, (0, 0))
    before = shard.stat().st_ino
    mnt = mount(src, "-o", "workers=1")  # (N idle workers: test_workers.py::test_an_idle_mount_wakes_no_worker)
    pids = (mount.info(mnt).pid, serving_pid(mnt))
    woken = settled(pids)  # (the worker's looks for a second without requests: ``app.idle``)
    time.sleep(2)
    assert [main_thread_wakeups(pid) for pid in pids] == woken
    values = COMPLETE.values(COMPLETE.chunk, 7)
    (mnt / "full" / "0.0").write_bytes(COMPLETE.encode(values))
    expected[COMPLETE.chunk_region((0, 0))] = values
    deadline = time.monotonic() + 30
    while shard.stat().st_ino == before:
        assert time.monotonic() < deadline, "the idle mount's pending chunk was not folded within 30 s"
        time.sleep(0.05)
    umount(mount, mnt)
    assert_source_equals(src, "full", expected)


def all_chunks_of(spec: Spec, shard) -> list[tuple[int, ...]]:
    """The inner chunks of ``shard`` (all inside the array here)."""
    return [tuple(s * n + i for s, n, i in zip(shard, spec.chunks_per_shard, local))
            for local in np.ndindex(*spec.chunks_per_shard)]


def test_fusermount_unmount_folds_pending_writes(tmp_path, mount):
    """An unmount that does not go through ``shardfs umount`` (no signal) still folds every
    pending chunk before the daemon exits, leaving the journal empty."""
    src = tmp_path / "src"
    expected = build(src, [COMPLETE])["full"]
    mnt = mount(src)
    values = COMPLETE.values(COMPLETE.chunk, 5)
    (mnt / "full" / "0.0").write_bytes(COMPLETE.encode(values))  # an incomplete shard, folded only when idle
    expected[COMPLETE.chunk_region((0, 0))] = values
    info = mount.info(mnt)
    r = subprocess.run(["fusermount3", "-u", str(mnt)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert info.proc.wait(timeout=60) == 0, info.output()[-3000:]
    assert leftovers(src) == []
    assert_source_equals(src, "full", expected)


def test_after_a_fold_the_written_chunk_shows_the_new_shards_mtime(tmp_path, mount):
    """A chunk file's st_mtime is its shard's: the kernel's cached attributes of the chunks a
    fold wrote are dropped when it replaces the shard (well within the 10 s attribute timeout).
    (The shard's other chunk files keep their cached mtime until the timeout: not checked.)"""
    src = tmp_path / "src"
    build(src, [COMPLETE])
    shard = COMPLETE.shard_file(src, (0, 0))
    mnt = mount(src)
    arr = mnt / "full"
    assert os.stat(arr / "0.0").st_mtime_ns == os.stat(arr / "0.1").st_mtime_ns == shard.stat().st_mtime_ns
    (arr / "0.0").write_bytes(COMPLETE.encode(COMPLETE.values(COMPLETE.chunk, 8)))
    pending = os.stat(arr / "0.0").st_mtime_ns  # cached by the kernel
    deadline = time.monotonic() + 30
    while journal_entries(src):  # folded once the mount is idle for 1 s
        assert time.monotonic() < deadline, "not folded within 30 s"
        time.sleep(0.05)
    folded = shard.stat().st_mtime_ns
    assert folded != pending
    # the journal is released just before the invalidation; the kernel's attribute timeout (10 s)
    # would show the new mtime without one, so the wait stays below it
    deadline = time.monotonic() + 8
    while os.stat(arr / "0.0").st_mtime_ns != folded:
        assert time.monotonic() < deadline, "the written chunk still shows its pending mtime 8 s after the fold"
        time.sleep(0.05)


def test_after_a_fold_a_written_chunk_shows_its_new_shards_mtime_in_process(tmp_path):
    """The daemon's part of ``after_a_fold_the_written_chunk_shows_the_new_shards_mtime``,
    in-process (``tests/inproc.py``): a chunk file's mtime is its shard's, a written one shows
    its write's until the fold, then the new shard's (the kernel's cached attributes: the
    mounted test)."""
    src = tmp_path / "src"
    build(src, [COMPLETE])
    shard = COMPLETE.shard_file(src, (0, 0))
    with InProcess(src, read_only=False) as fs:
        arr = fs / "full"
        assert (arr / "0.0").stat().st_mtime_ns == (arr / "0.1").stat().st_mtime_ns == shard.stat().st_mtime_ns
        (arr / "0.0").write_bytes(COMPLETE.encode(COMPLETE.values(COMPLETE.chunk, 8)))
        pending = (arr / "0.0").stat().st_mtime_ns
        fs.fold()
        folded = shard.stat().st_mtime_ns
        assert folded != pending and not journal_entries(src)
        assert (arr / "0.0").stat().st_mtime_ns == (arr / "0.1").stat().st_mtime_ns == folded


GONE = Spec("gone", (8, 8), (2, 2), (4, 4), "<i4", 0, ("zstd", 1), inner_crc=False, index_location="end",
            index_crc=True, initial=((s(4, 8), s(4, 8)),), write=(s(0, 8), s(0, 8)))
UNLINK = re.compile(r"^\d+\s+(fsync|unlinkat)\((.*)")


@pytest.mark.skipif(STRACE is None, reason="strace is not installed (scripts/install installs it)")
def test_a_deleted_shard_is_durable_in_the_directory_that_survives(tmp_path, mount):
    """Removing every chunk of the only shard deletes it and its emptied key directories
    (``c/1``, ``c``); the removal is then fsynced in the array directory, the one that is
    left, after the last directory went (not in a directory that no longer exists)."""
    src = tmp_path / "src"
    expected = build(src, [GONE])["gone"]
    trace = tmp_path / "strace.log"
    # (one worker: the calls of one process, none split by another's in the trace)
    mnt = mount(src, "-o", "workers=1", prefix=(STRACE, "-f", "-qq", "-y", "-s", "4096", "-o", str(trace),
                                                "-e", "trace=fsync,unlinkat"))
    for i, j in itertools.product((2, 3), (2, 3)):
        os.unlink(mnt / "gone" / f"{i}.{j}")
    expected[4:8, 4:8] = 0
    info = mount.info(mnt)
    os.kill(traced_daemon(info), signal.SIGTERM)
    assert info.proc.wait(timeout=60) == 0, info.output()[-3000:]
    assert sorted(os.listdir(src / "gone")) == ["zarr.json"]
    calls = [m.groups() for m in map(UNLINK.match, trace.read_text().splitlines()) if m]
    rmdirs = [(i, fd_path(a), re.findall(r'"([^"]*)"', a)[0]) for i, (n, a) in enumerate(calls)
              if n == "unlinkat" and "AT_REMOVEDIR" in a and a.endswith(") = 0")]  # the ones that removed
    assert [(d, name) for _, d, name in rmdirs] == [(str(src / "gone" / "c"), "1"), (str(src / "gone"), "c")], calls
    last = rmdirs[-1][0]
    assert [i for i, (n, a) in enumerate(calls) if n == "fsync" and fd_path(a) == str(src / "gone") and i > last], \
        f"no fsync of {src / 'gone'} after the rmdir of its key directory: {calls}"
    assert_source_equals(src, "gone", expected)


def test_a_shard_folded_while_its_array_is_listed_is_listed(tmp_path):
    """A listing takes the pending chunks before it lists the source: a fold that ends while the
    source is being listed (the shard not in the source yet when listed, no longer pending once
    listed) is then in one or the other. (Taken after, the array listed none of the chunks just
    written: zarr 2.18's suite through the mount saw ``nchunks_initialized`` 0 after ``z[:] = 42``,
    twice in a few runs.) In-process, the fold is run inside the source's listing of the array."""
    import json

    import zarr

    src = tmp_path / "src"
    zarr.open_group(str(src), mode="w", zarr_format=3)
    with InProcess(src, read_only=False) as fs:
        (fs / "z").mkdir()
        (fs / "z" / ".zarray").write_text(json.dumps(
            {"chunks": [10], "compressor": None, "dtype": "<f8", "fill_value": 0.0, "filters": None,
             "order": "C", "shape": [100], "zarr_format": 2}))
        for i in range(9):  # (9 of its shard's 10 chunks: no fold before the listing)
            (fs / "z" / str(i)).write_bytes(np.full(10, i, "<f8").tobytes())
        real, folds = fs.source.list, []

        def listed_while_folding(key: str, *args, **kwargs):
            pages = list(real(key, *args, **kwargs))
            if key == "z/" and not folds:
                folds.append(key)
                fs.fold()  # (the listing's worker thread: the fold runs on the tree's loop meanwhile)
            return iter(pages)

        fs.source.list = listed_while_folding
        names = list((fs / "z").iterdir())
        assert folds == ["z/"]
        assert sorted(n for n in names if not n.startswith(".")) == [str(i) for i in range(9)]
        assert (src / "z" / "c" / "0").is_file()
