"""Writes through the mount (README.md "Writes"), with real v2 writers and POSIX tools.

Every test builds its own small sharded v3 source (tests/sources.py), mounts
it, writes through the mount, and after ``shardfs umount`` reads the source
natively with zarr-python 3 AND tensorstore's ``zarr3`` driver against a numpy
expectation. Sources also must be left without temp files and with an empty
journal. The tests taking the ``source`` fixture run over a local directory and
over an s3:// bucket (tests/source_kinds.py).
"""

from __future__ import annotations

import ctypes
import errno
import json
import logging
import os
import re
import signal
import subprocess
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import crc32c
import numpy as np
import pytest

from conftest import ZARR2_PYTHON, lazy_unmount, read_tensorstore, serving_pids, zarr2
from inproc import InProcess
from source_kinds import Source
from writers import WRITERS, region_json, umount
from sources import (
    Spec,
    all_chunks,
    assert_source_equals,
    build,
    chunks_touching,
    journal_bytes,
    journal_entries,
    leftovers,
)

s = slice
AT_FDCWD, RENAME_EXCHANGE = -100, 2

Z2 = Spec("z2", (20, 27), (4, 5), (8, 10), "<i4", 0, ("zstd", 3), inner_crc=False,
          index_location="end", index_crc=True,
          initial=((s(0, 8), s(0, 10)), (s(8, 16), s(10, 20))), write=(s(3, 20), s(7, 27)))
G3 = Spec("g3", (10, 12, 9), (2, 3, 3), (4, 6, 6), "<u2", 7, ("gzip", 5), inner_crc=False,
          index_location="start", index_crc=False,
          initial=((s(0, 4), s(0, 6), s(0, 6)),), write=(s(1, 10), s(2, 12), s(4, 9)))
C2 = Spec("c2", (13, 11), (3, 4), (6, 8), "<f8", -1.5, ("zstd", 1), inner_crc=True,
          index_location="start", index_crc=True,
          initial=((s(0, 6), s(0, 8)), (s(6, 12), s(8, 11))), write=(s(2, 13), s(3, 11)))
SPECS = [Z2, G3, C2]


def seed_of(*parts) -> int:
    return zlib.crc32("/".join(map(str, parts)).encode())


def refusals(cases: dict[str, tuple[Callable[[], object], int]]) -> dict[str, str]:
    """What each case did that it should not have: ``{case: "succeeded"}``, or the errno it failed
    with if not its own (``cases``: ``{name: (operation, errno)}``)."""
    wrong = {}
    for what, (op, want) in cases.items():
        try:
            op()
            wrong[what] = "succeeded"
        except OSError as e:
            if e.errno != want:
                wrong[what] = f"errno {e.errno} ({e.strerror}), expected {want} ({os.strerror(want)})"
    return wrong


def error_lines(mount, mnt) -> list[str]:
    return [line for line in mount.info(mnt).log_text().splitlines() if " ERROR " in line]


def assert_clean(src: Path | Source) -> None:
    left = src.leftovers() if isinstance(src, Source) else leftovers(src)
    assert not left, f"source left with temp files / journal entries after umount: {left}"


def cat(path) -> bytes:
    r = subprocess.run(["cat", str(path)], capture_output=True, timeout=30)
    assert r.returncode == 0, f"cat {path}: {r.stderr.decode()}"
    return r.stdout


def run(*cmd, ok=True) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], capture_output=True, timeout=60)
    if ok:
        assert r.returncode == 0, f"{cmd} -> {r.returncode}: {r.stderr.decode(errors='replace')}"
    return r


# --------------------------------------------------------------------------- 1. client writers


@pytest.mark.parametrize("spec", SPECS, ids=lambda sp: sp.name)
@pytest.mark.parametrize("writer", list(WRITERS))
def test_client_writes_reach_the_shards(writer, spec, tmp_path, mount, source):
    local = tmp_path / "src"
    expected = build(local, [spec])[spec.name]
    touched = {spec.shard_of(i) for i in chunks_touching(spec, spec.write)}
    new_shards = sorted(sh for sh in touched if not spec.shard_file(local, sh).exists())
    old_shards = sorted(sh for sh in touched if spec.shard_file(local, sh).exists())
    assert new_shards and old_shards, "the write region must cover existing and missing shards"

    src = source(local)
    mnt = src.mount(mount)
    values = spec.values(expected[spec.write].shape, seed_of(writer, spec.name))
    WRITERS[writer](mnt / spec.name, spec.write, values, tmp_path)
    expected[spec.write] = values
    stray = [n for n in os.listdir(mnt / spec.name)
             if n not in (".zarray", ".zattrs", "c") and not re.fullmatch(r"\d+(\.\d+)*", n)]
    assert not stray, f"temp files of the {writer} writer still listed in the mount: {stray}"
    np.testing.assert_array_equal(read_tensorstore(mnt / spec.name), expected,
                                  err_msg="read through the mount after the writer returned")
    umount(mount, mnt)

    src.assert_equals(spec.name, expected)
    missing = [sh for sh in new_shards if not src.exists(spec.shard_key(sh))]
    assert not missing, f"shards never created in the source: {missing}"
    assert_clean(src)


# --------------------------------------------------------------------------- cp / dd / rm


def test_cp_chunk_files(tmp_path, mount, source):
    exp = build(tmp_path / "src", [Z2, G3, C2])
    src = source(tmp_path / "src")
    mnt = src.mount(mount)
    jobs = [  # (spec, chunk index, path relative to the array in the view)
        (Z2, (1, 1), "1.1"),               # existing chunk at the array root
        (Z2, (2, 2), "c/1/1/2.2"),         # existing chunk inside its shard directory
        (Z2, (4, 5), "4.5"),               # edge chunk of a shard that does not exist yet
        (G3, (0, 1, 1), "c/0/0/0/0.1.1"),  # gzip, index at start
        (G3, (4, 3, 2), "4.3.2"),          # corner edge chunk, new shard
        (C2, (1, 0), "c/0/0/1.0"),         # inner crc32c appended by the daemon
        (C2, (4, 2), "4.2"),               # new edge shard, crc32c
    ]
    written = {}
    for k, (spec, idx, rel) in enumerate(jobs):
        block = spec.values(spec.chunk, seed_of("cp", k))
        data = spec.encode(block)
        f = tmp_path / f"chunk{k}"
        f.write_bytes(data)
        run("cp", f, mnt / spec.name / rel)
        exp[spec.name][spec.chunk_region(idx)] = block[tuple(s(0, r.stop - r.start) for r in spec.chunk_region(idx))]
        written[(spec.name, rel)] = data
    # cp from one chunk file of the mount onto another
    run("cp", mnt / "z2" / "0.0", mnt / "z2" / "0.1")
    exp["z2"][Z2.chunk_region((0, 1))] = exp["z2"][Z2.chunk_region((0, 0))]

    for (name, rel), data in written.items():
        assert cat(mnt / name / rel) == data, f"{name}/{rel}: cat after cp differs from the bytes copied"
    umount(mount, mnt)
    for spec in (Z2, G3, C2):
        src.assert_equals(spec.name, exp[spec.name])
    assert_clean(src)


def test_dd_chunk_files(tmp_path, mount):
    src = tmp_path / "src"
    exp = build(src, [Z2, C2])
    mnt = mount(src)
    # conv=notrunc onto an existing chunk: the new bytes are at least as long as the old ones,
    # so the file is then exactly the new bytes.
    old_len = len(cat(mnt / "z2" / "0.0"))

    def block_and_bytes(spec, k, min_len=0):
        for j in range(20):
            block = spec.values(spec.chunk, seed_of("dd", k, j))
            data = spec.encode(block)
            if len(data) >= min_len:
                return block, data
        raise AssertionError("could not make a long enough chunk")

    cases = [
        (Z2, (2, 3), "2.3", ["bs=1M"], 0),                    # O_TRUNC, existing shard
        (Z2, (0, 0), "0.0", ["bs=1M", "conv=notrunc"], old_len),  # in place, no truncation
        (Z2, (4, 0), "4.0", ["bs=7"], 0),                     # many small writes, new edge shard
        (C2, (0, 1), "0.1", ["bs=13", "conv=notrunc"], 0),    # crc32c chain, small writes, in place
        (C2, (3, 2), "c/1/1/3.2", ["bs=1M"], 0),              # inside a shard directory
    ]
    for k, (spec, idx, rel, opts, min_len) in enumerate(cases):
        block, data = block_and_bytes(spec, k, min_len)
        f = tmp_path / f"chunk{k}"
        f.write_bytes(data)
        run("dd", f"if={f}", f"of={mnt / spec.name / rel}", "status=none", *opts)
        assert cat(mnt / spec.name / rel) == data, f"{spec.name}/{rel} after dd {opts}: cat differs"
        exp[spec.name][spec.chunk_region(idx)] = block[tuple(s(0, r.stop - r.start) for r in spec.chunk_region(idx))]
    umount(mount, mnt)
    for spec in (Z2, C2):
        assert_source_equals(src, spec.name, exp[spec.name])
    assert_clean(src)


def test_rm_chunk_files(tmp_path, mount, source):
    exp = build(tmp_path / "src", [Z2, C2])
    src = source(tmp_path / "src")
    mnt = src.mount(mount)
    # one chunk at the array root
    run("rm", mnt / "z2" / "0.0")
    exp["z2"][Z2.chunk_region((0, 0))] = Z2.fill
    assert not os.path.exists(mnt / "z2" / "0.0"), "z2/0.0 still exists after rm"
    assert not os.path.exists(mnt / "z2" / "c" / "0" / "0" / "0.0"), "shard entry 0.0 still exists after rm"
    # every chunk of shard (1, 1), through its shard directory
    shard_dir = mnt / "z2" / "c" / "1" / "1"
    names = sorted(os.listdir(shard_dir))
    assert names == ["2.2", "2.3", "3.2", "3.3"], names
    run("rm", *[shard_dir / n for n in names])
    exp["z2"][s(8, 16), s(10, 20)] = Z2.fill
    # a crc32c-chained chunk inside a shard directory
    run("rm", mnt / "c2" / "c" / "1" / "1" / "2.2")
    exp["c2"][C2.chunk_region((2, 2))] = C2.fill
    # reads through the mount see the fill value at once
    for spec in (Z2, C2):
        got = read_tensorstore(mnt / spec.name)
        np.testing.assert_array_equal(got, exp[spec.name], err_msg=f"{spec.name} read through the mount after rm")
    r = run("rm", mnt / "z2" / "0.0", ok=False)
    assert r.returncode == 1, "rm of an already removed chunk succeeded"
    assert r.stderr.decode().rstrip().endswith(os.strerror(errno.ENOENT)), r.stderr
    # a chunk written into a new shard and removed before any fold: the shard never appears
    f = tmp_path / "chunk"
    f.write_bytes(Z2.encode(Z2.values(Z2.chunk, 3)))
    run("cp", f, mnt / "z2" / "4.5")
    run("rm", mnt / "z2" / "4.5")
    assert not os.path.exists(mnt / "z2" / "4.5")
    umount(mount, mnt)
    for spec in (Z2, C2):
        src.assert_equals(spec.name, exp[spec.name])
    if src.kind == "local":
        assert not src.exists(Z2.shard_key((1, 1))), "shard z2/c/1/1 with every chunk removed still exists"
    else:  # no conditional DELETE: an empty shard, its index alone (doc/OBJECT-STORAGE.md "Writes"; test_s3_fold_race)
        empty = b"\xff" * 16 * 4  # 2 x 2 chunks, each (offset, nbytes) = (2^64 - 1, 2^64 - 1), then the crc32c
        assert src.read(Z2.shard_key((1, 1))) == empty + crc32c.crc32c(empty).to_bytes(4, "little")
    assert src.exists(Z2.shard_key((0, 0)))
    assert not src.exists(Z2.shard_key((2, 2))), "shard z2/c/2/2 exists though its only chunk was removed"
    assert_clean(src)


def test_overwritten_pending_chunk_is_not_resurrected(tmp_path):
    """A chunk written twice before its shard is folded: the newer write wins, now and after
    the next mount (whose journal replay must not bring back the older bytes). In-process
    (``tests/inproc.py``: closing the tree folds as an unmount does; opening one replays)."""
    src = tmp_path / "src"
    exp = build(src, [Z2])["z2"]
    v1, v2 = (Z2.values(Z2.chunk, seed_of("twice", k)) for k in (1, 2))
    with InProcess(src, read_only=False) as fs:
        for block in (v1, v2):  # same chunk of an incomplete shard, well within the idle time
            with (fs / "z2" / "0.0").open("wb") as f:
                f.write(Z2.encode(block))
        assert (fs / "z2" / "0.0").read_bytes() == Z2.encode(v2)
    exp[Z2.chunk_region((0, 0))] = v2
    assert_source_equals(src, "z2", exp)
    left = journal_entries(src)
    with InProcess(src, read_only=False):  # replays whatever the journal still holds
        pass
    assert_source_equals(src, "z2", exp)
    assert not left, f"journal entries left after a clean umount: {left}"


def test_link_of_temp_file_is_an_exclusive_create(tmp_path):
    """In-process (``tests/inproc.py``)."""
    src = tmp_path / "src"
    exp = build(src, [Z2])["z2"]
    block = Z2.values(Z2.chunk, seed_of("link"))
    with InProcess(src, read_only=False) as fs:
        arr = fs / "z2"
        tmp = arr / "2.0.cafe.partial"
        tmp.write_bytes(Z2.encode(block))
        (arr / "2.0").hardlink_to(tmp)  # new chunk in a shard that does not exist yet
        with pytest.raises(FileExistsError):
            (arr / "0.0").hardlink_to(tmp)  # an existing chunk: EEXIST, unchanged
        tmp.unlink()
        assert Z2.decode((arr / "2.0").read_bytes()).tolist() == block.tolist()
    exp[Z2.chunk_region((2, 0))] = block
    assert_source_equals(src, "z2", exp)
    assert_clean(src)


# --------------------------------------------------------------------------- 2. reads see pending data

_READER = r"""
import sys, numpy as np, zarr
path, out = sys.argv[1], sys.argv[2]
zarr.open(path, mode='r')[...]          # warm up (imports, metadata)
print("ready", flush=True)
sys.stdin.readline()
np.save(out, zarr.open(path, mode='r')[...])
print("done", flush=True)
"""


def test_reads_see_pending_writes_at_once(tmp_path, mount):
    src = tmp_path / "src"
    exp = build(src, [Z2])["z2"]
    shard00 = Z2.shard_file(src, (0, 0)).read_bytes()
    assert not Z2.shard_file(src, (0, 1)).exists()
    mnt = mount(src)
    arr = mnt / "z2"
    reader = subprocess.Popen([ZARR2_PYTHON, "-c", _READER, str(arr), str(tmp_path / "read.npy")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert reader.stdout.readline().strip() == "ready", reader.stderr.read()
        old = cat(arr / "1.0")  # warm the kernel's page cache with the old bytes
        # (a) in-place write of an existing chunk of an incomplete shard
        b1 = Z2.values(Z2.chunk, seed_of("pending", 1))
        d1 = Z2.encode(b1)
        assert d1 != old
        with open(arr / "1.0", "wb") as f:
            f.write(d1)
        # (b) temp + rename into a shard that does not exist yet
        b2 = Z2.values(Z2.chunk, seed_of("pending", 2))
        d2 = Z2.encode(b2)
        tmp = arr / "0.3.0123abcd.partial"
        with open(tmp, "wb") as f:
            f.write(d2)
        os.rename(tmp, arr / "0.3")
        # (c) temp + rename onto an existing chunk whose size and pages the kernel has cached
        # under its other name (the shard directory entry: same inode)
        entry = arr / "c" / "0" / "0" / "1.1"
        old11 = cat(entry)
        assert os.stat(entry).st_size == len(old11)
        b3, d3 = next((b, d) for b, d in ((b, Z2.encode(b)) for b in (Z2.values(Z2.chunk, seed_of("pending", 3, k))
                                                                       for k in range(50))) if len(d) != len(old11))
        tmp = arr / "1.1.4567cdef.partial"
        tmp.write_bytes(d3)
        os.rename(tmp, arr / "1.1")
        t_written = time.monotonic()
        exp[Z2.chunk_region((1, 0))] = b1
        exp[Z2.chunk_region((0, 3))] = b2
        exp[Z2.chunk_region((1, 1))] = b3
        assert os.stat(entry).st_size == len(d3), "stale size after a rename onto the chunk"
        assert cat(entry) == d3, "stale bytes after a rename onto the chunk"
        assert cat(arr / "1.1") == d3

        assert cat(arr / "1.0") == d1, "cat right after the write returned stale bytes"
        assert cat(arr / "c" / "0" / "0" / "1.0") == d1, "shard-dir entry right after the write is stale"
        assert cat(arr / "0.3") == d2, "cat of a chunk of a not-yet-existing shard differs"
        reader.stdin.write("go\n")
        reader.stdin.flush()
        assert reader.stdout.readline().strip() == "done", reader.stderr.read()
        np.testing.assert_array_equal(np.load(tmp_path / "read.npy"), exp,
                                      err_msg="zarr 2.18 through the mount right after the writes")
        np.testing.assert_array_equal(read_tensorstore(arr), exp, err_msg="tensorstore right after the writes")
        elapsed = time.monotonic() - t_written
        # the reads above were served from pending (journalled, not folded) state
        assert Z2.shard_file(src, (0, 0)).read_bytes() == shard00 and not Z2.shard_file(src, (0, 1)).exists(), (
            f"shards were already rewritten {elapsed:.2f}s after the writes: the test did not read pending data")
        assert journal_bytes(src) >= len(d1) + len(d2), f"pending chunks not journalled: {journal_entries(src)}"
    finally:
        if reader.poll() is None:
            reader.kill()
        reader.wait()
    umount(mount, mnt)
    assert_source_equals(src, "z2", exp)
    assert_clean(src)


# --------------------------------------------------------------------------- 3. SIGKILL durability


def test_acknowledged_writes_survive_sigkill(tmp_path, mount, source):
    exp = build(tmp_path / "src", [Z2, G3])
    src = source(tmp_path / "src")
    mnt = src.mount(mount)
    m = mount.info(mnt)
    vz = Z2.values(exp["z2"][Z2.write].shape, seed_of("kill", "z2"))
    vg = G3.values(exp["g3"][G3.write].shape, seed_of("kill", "g3"))
    np.save(tmp_path / "vz.npy", vz)
    np.save(tmp_path / "vg.npy", vg)
    zarr2("""
        zarr.open(pz, mode='r+')[tuple(slice(a, b) for a, b in rz)] = np.load(vz)
        zarr.open(pg, mode='r+')[tuple(slice(a, b) for a, b in rg)] = np.load(vg)
        result = np.zeros(0)
        """, pz=str(mnt / "z2"), rz=region_json(Z2.write), vz=str(tmp_path / "vz.npy"),
         pg=str(mnt / "g3"), rg=region_json(G3.write), vg=str(tmp_path / "vg.npy"))
    os.kill(m.pid, signal.SIGKILL)
    m.proc.wait(timeout=10)
    lazy_unmount(mnt)
    exp["z2"][Z2.write] = vz
    exp["g3"][G3.write] = vg
    left = src.journal_entries()
    # The kill came well within the idle time: incomplete shards were still pending.
    assert left and all(n.endswith(".seg") for n in left), f"killed daemon left no journal segments: {left}"
    print(f"journal left by the killed daemon: {left}, {src.journal_bytes()} bytes")

    mnt2 = src.mount(mount)
    assert src.journal_entries() == [], "journal not replayed (and emptied) before the mount went live"
    for spec in (Z2, G3):  # the replayed source, natively, while mounted (daemon idle)
        src.assert_equals(spec.name, exp[spec.name])
    got = zarr2("result = {p: zarr.open(p, mode='r')[...] for p in paths}",
                paths=[str(mnt2 / "z2"), str(mnt2 / "g3")])
    np.testing.assert_array_equal(got[str(mnt2 / "z2")], exp["z2"], err_msg="z2 via zarr 2.18 after remount")
    np.testing.assert_array_equal(got[str(mnt2 / "g3")], exp["g3"], err_msg="g3 via zarr 2.18 after remount")
    umount(mount, mnt2)
    for spec in (Z2, G3):
        src.assert_equals(spec.name, exp[spec.name])
    assert_clean(src)


# --------------------------------------------------------------------------- 5. concurrency

P3 = Spec("p3", (8, 12, 12), (2, 3, 3), (4, 6, 6), "<i4", 0, ("zstd", 2), inner_crc=False,
          index_location="end", index_crc=True, initial=((s(0, 4), s(0, 6), s(0, 6)),),
          write=(s(0, 8), s(0, 12), s(0, 12)))


def test_concurrent_writers_to_one_shard_lose_nothing(tmp_path, mount):
    src = tmp_path / "src"
    build(src, [P3])
    first = P3.values(P3.shape, seed_of("conc", "a"))
    final = P3.values(P3.shape, seed_of("conc", "b"))
    np.save(tmp_path / "a.npy", first)
    np.save(tmp_path / "b.npy", final)
    chunks = [list(i) for i in all_chunks(P3)]
    mnt = mount(src)
    code = """
        z = zarr.open(path, mode='r+')
        for vfile in (a, b):
            v = np.load(vfile)
            for k, idx in enumerate(chunks):
                if k % 4 == me:
                    reg = tuple(slice(i * c, min((i + 1) * c, n)) for i, c, n in zip(idx, z.chunks, z.shape))
                    z[reg] = v[reg]
        result = np.zeros(0)
        """

    def one(me):
        zarr2(code, path=str(mnt / "p3"), a=str(tmp_path / "a.npy"), b=str(tmp_path / "b.npy"),
              chunks=chunks, me=me)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, range(4)))
    np.testing.assert_array_equal(read_tensorstore(mnt / "p3"), final,
                                  err_msg="through the mount after 4 concurrent writers")
    umount(mount, mnt)
    assert_source_equals(src, "p3", final)
    assert_clean(src)


# --------------------------------------------------------------------------- 6. invalid bytes


def test_invalid_chunk_bytes_are_refused(tmp_path, caplog):
    """In-process (``tests/inproc.py``: the commit itself; that ``close(2)`` reports the
    error is limits::refused_commit_shows_the_previous_size_at_once): each write as ``cp``,
    a Python ``open``/``close`` and a temporary renamed onto a chunk make it."""
    import numcodecs

    src = tmp_path / "src"
    exp = build(src, [Z2, C2])
    before = {p: p.read_bytes() for p in (Z2.shard_file(src, (0, 0)), C2.shard_file(src, (0, 0)))}
    junk = b"this is not a zstd frame"
    short = numcodecs.Zstd(level=1).encode(b"\0" * 12)  # a valid zstd frame that decodes to the wrong size
    caplog.set_level(logging.INFO, logger="shardfs")
    with InProcess(src, read_only=False) as fs:
        arr = fs / "z2"
        old = {n: (arr / n).read_bytes() for n in ("0.0", "0.1", "1.0", "1.1")}
        n_err = 0

        def expect_one_error(chunk: str, what: str) -> None:
            nonlocal n_err
            lines = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
            new = lines[n_err:]
            n_err = len(lines)
            assert len(new) == 1, f"{what}: expected one ERROR log line, got {new}"
            assert f"z2/{chunk}" in new[0] or f"c2/{chunk}" in new[0], \
                f"{what}: ERROR line does not name {chunk}: {new[0]}"

        def assert_einval(target, data: bytes, what: str) -> None:
            with pytest.raises(OSError) as e:
                target.write_bytes(data)  # open(O_TRUNC), write, close (FLUSH: the commit)
            assert e.value.errno == errno.EINVAL, f"{what}: {e.value}"

        assert_einval(arr / "0.0", junk, "cp garbage")
        expect_one_error("0.0", "cp garbage")

        assert_einval(arr / "c" / "0" / "0" / "1.1", short, "cp wrong-size frame")
        expect_one_error("1.1", "cp wrong-size frame")

        f = (arr / "0.1").open("wb")
        f.write(b"junk")
        with pytest.raises(OSError) as e:
            f.close()
        assert e.value.errno == errno.EINVAL, f"close() of a garbage chunk: {e.value}"
        expect_one_error("0.1", "python write+close")

        tmp = arr / "1.0.deadbeef.partial"
        tmp.write_bytes(b"junk junk junk")
        with pytest.raises(OSError) as e:
            tmp.replace(arr / "1.0")
        assert e.value.errno == errno.EINVAL, f"rename of a garbage temp onto a chunk: {e.value}"
        expect_one_error("1.0", "rename garbage")
        assert tmp.exists(), "the temp file vanished after its rename was refused"
        tmp.unlink()

        # crc32c chain: garbage is refused too (not wrapped in a fresh checksum)
        assert_einval(fs / "c2" / "0.0", junk, "cp garbage (c2)")
        expect_one_error("0.0", "cp garbage (c2)")

        for n, data in old.items():
            assert (arr / n).read_bytes() == data, f"z2/{n} changed after a refused write"
    for p, data in before.items():  # closed: what was pending is folded (as at an unmount)
        assert p.read_bytes() == data, f"{p} changed after refused writes"
    assert_source_equals(src, "z2", exp["z2"])
    assert_source_equals(src, "c2", exp["c2"])
    assert_clean(src)


# --------------------------------------------------------------------------- 7. read-only, unsupported ops


@pytest.mark.parametrize("flag", [("--read-only",), ("-o", "ro")], ids=["--read-only", "-o ro"])
def test_read_only_mount_refuses_every_write(flag, tmp_path, mount):
    src = tmp_path / "src"
    exp = build(src, [Z2])
    shard = Z2.shard_file(src, (0, 0)).read_bytes()
    mnt = mount(src, *flag)
    arr = mnt / "z2"
    ops = {
        "write existing chunk": lambda: open(arr / "0.0", "r+b").close(),
        "truncating open": lambda: open(arr / "0.0", "wb").close(),
        "create chunk": lambda: open(arr / "4.5", "xb").close(),
        "create temp": lambda: open(arr / "0.0.abc.partial", "wb").close(),
        "unlink": lambda: os.unlink(arr / "0.0"),
        "rename": lambda: os.rename(arr / "0.0", arr / "0.1"),
        "mkdir": lambda: os.mkdir(arr / "newdir"),
        "write .zattrs": lambda: open(arr / ".zattrs", "w").close(),
    }
    wrong = refusals({what: (op, errno.EROFS) for what, op in ops.items()})
    assert not wrong, wrong
    good = tmp_path / "good"
    good.write_bytes(Z2.encode(Z2.values(Z2.chunk, 5)))
    r = run("cp", good, arr / "0.0", ok=False)
    assert r.returncode == 1, "cp onto a chunk of a read-only mount succeeded"
    assert r.stderr.decode().rstrip().endswith(os.strerror(errno.EROFS)), r.stderr
    np.testing.assert_array_equal(read_tensorstore(arr), exp["z2"])
    umount(mount, mnt)
    assert Z2.shard_file(src, (0, 0)).read_bytes() == shard
    assert journal_entries(src) == []


def test_unsupported_operations_fail_with_eperm(tmp_path, mount):
    src = tmp_path / "src"
    exp = build(src, [Z2])
    meta_before = (src / "z2" / "zarr.json").read_bytes()
    mnt = mount(src)
    arr = mnt / "z2"
    zarray = json.loads((arr / ".zarray").read_text())
    bigger = dict(zarray, dtype="<i8")  # another dtype (a new shape is a resize)

    def rewrite_zarray_in_place():
        with open(arr / ".zarray", "w") as f:
            json.dump(bigger, f)

    def rewrite_zarray_by_rename():
        tmp = arr / ".zarray.1234.partial"
        tmp.write_text(json.dumps(bigger))
        try:
            os.replace(tmp, arr / ".zarray")
        finally:
            if tmp.exists():
                os.unlink(tmp)

    def exchange(a: Path, b: Path) -> None:
        """renameat2(RENAME_EXCHANGE), which os.rename cannot ask for."""
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.renameat2(AT_FDCWD, bytes(a), AT_FDCWD, bytes(b), RENAME_EXCHANGE) != 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))

    def exchange_temp():
        tmp = arr / "0.0.77.partial"
        tmp.write_bytes(cat(arr / "0.1"))
        try:
            exchange(tmp, arr / "0.0")
        finally:
            os.unlink(tmp)

    cases = {  # the README's table of unsupported operations
        "symlink": (lambda: os.symlink("0.0", arr / "link"), errno.EPERM),
        "mknod fifo": (lambda: os.mkfifo(arr / "fifo"), errno.EPERM),
        "setxattr": (lambda: os.setxattr(arr / "0.0", "user.x", b"1"), errno.ENOTSUP),
        "mkdir new name in array": (lambda: os.mkdir(arr / "newdir"), errno.EPERM),
        "rmdir of a shard directory that lists chunks": (lambda: os.rmdir(arr / "c" / "0" / "0"), errno.ENOTEMPTY),
        "rename chunk file": (lambda: os.rename(arr / "0.0", arr / "0.0.bak"), errno.EPERM),
        "rename with RENAME_EXCHANGE": (exchange_temp, errno.EINVAL),
        "rewrite .zarray in place (other dtype)": (rewrite_zarray_in_place, errno.EPERM),
        "rewrite .zarray by rename (other dtype)": (rewrite_zarray_by_rename, errno.EPERM),
        "truncate of a chunk not open for writing": (lambda: os.truncate(arr / "0.0", 3), errno.EPERM),
    }
    wrong = refusals(cases)
    assert json.loads((arr / ".zarray").read_text()) == zarray, ".zarray changed"
    assert os.path.exists(arr / "0.0"), "chunk 0.0 gone after a refused rename"
    assert not os.path.lexists(arr / "link") and not os.path.lexists(arr / "newdir")
    umount(mount, mnt)
    assert not wrong, wrong
    assert (src / "z2" / "zarr.json").read_bytes() == meta_before, "zarr.json changed by refused ops"
    assert_source_equals(src, "z2", exp["z2"])
    assert_clean(src)


def test_zattrs_rewrite_updates_v3_attributes(tmp_path, mount):
    import zarr

    src = tmp_path / "src"
    exp = build(src, [Z2, C2])
    mnt = mount(src)
    # zarr 2.18 (temp + rename of .zattrs)
    zarr2("z = zarr.open(path, mode='r+'); z.attrs.update({'units': 'nm', 'scale': [1, 2]}); "
          "result = np.zeros(0)", path=str(mnt / "z2"))
    assert json.loads((mnt / "z2" / ".zattrs").read_text()) == {"origin": "z2", "units": "nm", "scale": [1, 2]}
    # zarr-python 3 in v2 mode
    zarr.open_array(str(mnt / "c2"), mode="r+", zarr_format=2).attrs.update({"note": "hello"})
    assert json.loads((mnt / "c2" / ".zattrs").read_text()) == {"origin": "c2", "note": "hello"}
    umount(mount, mnt)
    z2 = json.loads((src / "z2" / "zarr.json").read_text())
    c2 = json.loads((src / "c2" / "zarr.json").read_text())
    assert z2["attributes"] == {"origin": "z2", "units": "nm", "scale": [1, 2]}
    assert c2["attributes"] == {"origin": "c2", "note": "hello"}
    assert z2["shape"] == [20, 27] and z2["codecs"] == Z2.v3_metadata()["codecs"]
    assert_source_equals(src, "z2", exp["z2"])
    assert_clean(src)


# --------------------------------------------------------------------------- 8. write amplification

AMP = Spec("amp", (64, 32, 64), (16, 16, 16), (32, 32, 32), "<f8", 0.0, ("zstd", 1), inner_crc=False,
           index_location="end", index_crc=True, initial=(), write=(s(0, 64), s(0, 32), s(0, 64)))


def _io(mnt: Path) -> dict[str, int]:
    """The I/O counters of the mount's workers, added up."""
    total: dict[str, int] = {}
    for pid in serving_pids(mnt):
        with open(f"/proc/{pid}/io") as f:
            for k, v in (line.split(": ") for line in f):
                total[k] = total.get(k, 0) + int(v)
    return total


def test_chunk_by_chunk_write_is_not_quadratic(tmp_path, mount):
    src = tmp_path / "src"
    build(src, [AMP])
    data = AMP.values(AMP.shape, seed_of("amp"))
    np.save(tmp_path / "v.npy", data)
    mnt = mount(src, "-o", "workers=1")  # (the bytes one process writes: no forwards between workers)
    m = mount.info(mnt)
    io0 = _io(mnt)
    log0 = m.log.stat().st_size
    zarr2("""
        z = zarr.open(path, mode='r+')
        v = np.load(vpath)
        import itertools
        grid = [range(n // c) for n, c in zip(z.shape, z.chunks)]
        for idx in itertools.product(*grid):     # C order: interleaves the 4 shards
            reg = tuple(slice(i * c, (i + 1) * c) for i, c in zip(idx, z.chunks))
            z[reg] = v[reg]
        result = np.zeros(0)
        """, path=str(mnt / "amp"), vpath=str(tmp_path / "v.npy"))
    deadline = time.monotonic() + 10
    while journal_entries(src) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    assert journal_entries(src) == [], "complete shards not folded within 10 s"
    io1 = _io(mnt)
    log_bytes = m.log.stat().st_size - log0
    umount(mount, mnt)
    shards = sorted((src / "amp" / "c").rglob("*"))
    shard_bytes = sum(p.stat().st_size for p in shards if p.is_file())
    n_shards = sum(p.is_file() for p in shards)
    assert n_shards == 4, [str(p) for p in shards]
    written = io1["wchar"] - io0["wchar"] - log_bytes
    ratio = written / shard_bytes
    print(f"\nwrite amplification: daemon wrote {written} B (excluding {log_bytes} B of log) "
          f"for {shard_bytes} B of shards: {ratio:.2f}x")
    assert ratio <= 2.5, f"daemon wrote {ratio:.2f}x the final shard bytes (target <= 2.5x)"
    assert_source_equals(src, "amp", data)
    assert_clean(src)


def test_a_renamed_onto_chunk_emptied_under_its_other_name_is_created_again_by_an_in_place_write(tmp_path, mount):
    """A rename onto a chunk leaves its name showing the temporary's inode in the kernel (an
    alias). Once the chunk is emptied through its other name (the shard directory entry), a
    ``stat`` of the first name says ENOENT and an ``open(O_CREAT)`` of it creates the chunk
    again, as for the chunk's own inode (found by scripts/soak: an in-place write right after
    an ``rm`` of that chunk failed with ENOENT)."""
    src = tmp_path / "src"
    build(src, [Z2])
    mnt = mount(src)
    arr = mnt / "z2"
    b1, b2 = (Z2.values(Z2.chunk, seed_of("alias", k)) for k in (1, 2))
    tmp = arr / "1.1.89abcdef.partial"
    tmp.write_bytes(Z2.encode(b1))
    os.rename(tmp, arr / "1.1")
    assert os.stat(arr / "1.1").st_size == len(Z2.encode(b1))
    os.unlink(arr / "c" / "0" / "0" / "1.1")
    with pytest.raises(FileNotFoundError):
        os.stat(arr / "1.1")
    with open(arr / "1.1", "wb") as f:
        f.write(Z2.encode(b2))
    assert (arr / "1.1").read_bytes() == Z2.encode(b2)
    assert (arr / "c" / "0" / "0" / "1.1").read_bytes() == Z2.encode(b2)


def test_a_read_only_tree_refuses_every_write_with_erofs(tmp_path):
    """The semantics of ``read_only_mount_refuses_every_write``, in-process (``tests/inproc.py``):
    every kind of write to a read-only tree is EROFS and nothing reaches the source or a
    journal (the mounted test keeps what ``cp`` and a v2 client see)."""
    src = tmp_path / "src"
    build(src, [Z2])
    shard = Z2.shard_file(src, (0, 0)).read_bytes()
    with InProcess(src, read_only=True) as fs:
        arr = fs / "z2"
        ops = {
            "write existing chunk": lambda: (arr / "0.0").open("r+b").close(),
            "truncating open": lambda: (arr / "0.0").open("wb").close(),
            "create chunk": lambda: (arr / "4.5").write_bytes(b"x"),
            "create temp": lambda: (arr / "0.0.abc.partial").write_bytes(b"x"),
            "unlink": lambda: (arr / "0.0").unlink(),
            "rename": lambda: (arr / "0.0").replace(arr / "0.1"),
            "mkdir": lambda: (arr / "newdir").mkdir(),
            "write .zattrs": lambda: (arr / ".zattrs").write_text("{}"),
            "truncate": lambda: (arr / "0.0").truncate(3),
        }
        wrong = refusals({what: (op, errno.EROFS) for what, op in ops.items()})
        assert not wrong, wrong
    assert Z2.shard_file(src, (0, 0)).read_bytes() == shard
    assert journal_entries(src) == []


def test_chunk_files_written_in_process(tmp_path):
    """The semantics of ``cp_chunk_files``, in-process: a chunk file written (at the array root,
    in its shard directory, in a shard not stored yet, gzip with the index at the start, with an
    inner crc32c the daemon appends) or copied from another chunk file reads back as written and
    lands in the source (the mounted test keeps ``cp`` and ``cat``)."""
    src = tmp_path / "src"
    exp = build(src, [Z2, G3, C2])
    jobs = [(Z2, (1, 1), "1.1"), (Z2, (2, 2), "c/1/1/2.2"), (Z2, (4, 5), "4.5"), (G3, (0, 1, 1), "c/0/0/0/0.1.1"),
            (G3, (4, 3, 2), "4.3.2"), (C2, (1, 0), "c/0/0/1.0"), (C2, (4, 2), "4.2")]
    with InProcess(src, read_only=False) as fs:
        for k, (spec, idx, rel) in enumerate(jobs):
            block = spec.values(spec.chunk, seed_of("cp", k))
            data = spec.encode(block)  # (once: gzip's header holds the second it was made)
            (fs / spec.name / rel).write_bytes(data)
            exp[spec.name][spec.chunk_region(idx)] = block[tuple(s(0, r.stop - r.start)
                                                                  for r in spec.chunk_region(idx))]
            assert (fs / spec.name / rel).read_bytes() == data, rel
        (fs / "z2" / "0.1").write_bytes((fs / "z2" / "0.0").read_bytes())  # one chunk file onto another
        exp["z2"][Z2.chunk_region((0, 1))] = exp["z2"][Z2.chunk_region((0, 0))]
    for spec in (Z2, G3, C2):
        assert_source_equals(src, spec.name, exp[spec.name])
    assert_clean(src)


def test_chunk_files_removed_in_process(tmp_path):
    """The semantics of ``rm_chunk_files``, in-process: a chunk file removed is gone from both
    of its directories and reads as the fill value; a second removal is ENOENT; a shard whose
    every chunk was removed is deleted; a chunk written into a new shard and removed before any
    fold never makes the shard (the mounted test keeps ``rm`` and tensorstore)."""
    src = tmp_path / "src"
    exp = build(src, [Z2, C2])
    with InProcess(src, read_only=False) as fs:
        (fs / "z2" / "0.0").unlink()
        exp["z2"][Z2.chunk_region((0, 0))] = Z2.fill
        assert not (fs / "z2" / "0.0").exists() and not (fs / "z2" / "c" / "0" / "0" / "0.0").exists()
        shard_dir = fs / "z2" / "c" / "1" / "1"
        names = sorted(shard_dir.iterdir())
        assert names == ["2.2", "2.3", "3.2", "3.3"], names
        for name in names:
            (shard_dir / name).unlink()
        exp["z2"][s(8, 16), s(10, 20)] = Z2.fill
        (fs / "c2" / "c" / "1" / "1" / "2.2").unlink()
        exp["c2"][C2.chunk_region((2, 2))] = C2.fill
        with pytest.raises(FileNotFoundError):
            (fs / "z2" / "0.0").unlink()
        (fs / "z2" / "4.5").write_bytes(Z2.encode(Z2.values(Z2.chunk, 3)))  # a new shard, removed before a fold
        (fs / "z2" / "4.5").unlink()
        assert not (fs / "z2" / "4.5").exists()
    for spec in (Z2, C2):
        assert_source_equals(src, spec.name, exp[spec.name])
    assert not Z2.shard_file(src, (1, 1)).exists(), "shard z2/c/1/1 with every chunk removed still exists"
    assert Z2.shard_file(src, (0, 0)).exists()
    assert not Z2.shard_file(src, (2, 2)).exists(), "shard z2/c/2/2 exists though its only chunk was removed"
    assert_clean(src)


def test_unsupported_changes_are_refused_in_process(tmp_path):
    """The daemon's part of ``unsupported_operations_fail_with_eperm``, in-process: a new name
    in an array, a chunk file renamed, a ``.zarray`` rewritten with another dtype (in place or by
    rename), a chunk truncated without being open for writing are EPERM; removing a shard
    directory that lists chunks is ENOTEMPTY; nothing changes (symlink, mknod, xattrs and
    RENAME_EXCHANGE reach the kernel's refusals: the mounted test)."""
    src = tmp_path / "src"
    exp = build(src, [Z2])
    meta_before = (src / "z2" / "zarr.json").read_bytes()
    with InProcess(src, read_only=False) as fs:
        arr = fs / "z2"
        zarray = json.loads((arr / ".zarray").read_text())
        bigger = json.dumps(dict(zarray, dtype="<i8"))

        def by_rename() -> None:
            tmp = arr / ".zarray.1234.partial"
            tmp.write_text(bigger)
            try:
                tmp.replace(arr / ".zarray")
            finally:
                if tmp.exists():
                    tmp.unlink()

        cases = {
            "mkdir new name in array": (lambda: (arr / "newdir").mkdir(), errno.EPERM),
            "rmdir of a shard directory that lists chunks": (lambda: (arr / "c" / "0" / "0").rmdir(), errno.ENOTEMPTY),
            "rename chunk file": (lambda: (arr / "0.0").replace(arr / "0.0.bak"), errno.EPERM),
            "rewrite .zarray in place (other dtype)": (lambda: (arr / ".zarray").write_text(bigger), errno.EPERM),
            "rewrite .zarray by rename (other dtype)": (by_rename, errno.EPERM),
            "truncate of a chunk not open for writing": (lambda: (arr / "0.0").truncate(3), errno.EPERM),
        }
        wrong = refusals(cases)
        assert not wrong, wrong
        assert json.loads((arr / ".zarray").read_text()) == zarray
        assert (arr / "0.0").exists() and not (arr / "newdir").exists()
    assert (src / "z2" / "zarr.json").read_bytes() == meta_before
    assert_source_equals(src, "z2", exp["z2"])
    assert_clean(src)
