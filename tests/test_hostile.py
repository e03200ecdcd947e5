"""Hostile sources and concurrent writers, through real mounts (what non-regular shards, a file
where a key directory should be and symlinks out of SRC show and refuse: in-process,
``tests/inproc.py``).

- Non-regular files where shards should be (FIFO, directory, socket) are never opened:
  reads give EIO with one log line, writes are refused; a shard that turns into one
  after a write was acknowledged keeps that write in the journal: ``shardfs umount``
  returns in bounded time and says so, the next mount serves it and folds it once the
  shard is a file again.
- A lock held forever on a shard does not hold up ``umount`` beyond ``--timeout``.
- Symlinks that leave SRC are neither read nor written (``-o follow_symlinks``: read only).
- A rewritten shard keeps its owner, group and mode; a new one takes its directory's.
- Folds are version-checked: tensorstore writing chunks of the same shards as a mount
  loses nothing, nor does the mount.
"""

from __future__ import annotations

import errno
import hashlib
import itertools
import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import logging

import numpy as np
import pytest

from conftest import is_mounted, run_shardfs, shard_locks, wait_for
from inproc import InProcess
from shardfs.writes.journal import segments_under
from sources import Spec, assert_source_equals, build, journal_entries, leftovers
from writers import umount

pytestmark = pytest.mark.long(38)

s = slice
# 4 shards of 2x2 inner chunks, all stored.
H = Spec("h", (16, 16), (4, 4), (8, 8), "<i4", 0, ("zstd", 1), inner_crc=False, index_location="end",
         index_crc=True, initial=((s(0, 16), s(0, 16)),), write=(s(0, 16), s(0, 16)))


def lines(mount, mnt, *needles: str) -> list[str]:
    """Log lines of the daemon serving ``mnt`` that contain every needle."""
    return [ln for ln in mount.info(mnt).log_text().splitlines() if all(n in ln for n in needles)]


def chunk_bytes(k: int, spec: Spec = H) -> tuple[np.ndarray, bytes]:
    block = spec.values(spec.chunk, 1000 + k)
    return block, spec.encode(block)


def write_file(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def errno_of(fn, *args) -> int | None:
    try:
        fn(*args)
    except OSError as e:
        return e.errno
    return None


def read_bytes(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def tree_digest(root: Path) -> dict[str, tuple[str, int]]:
    """Every file below ``root``: content hash and mtime (to show nothing was touched)."""
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            p = Path(dirpath) / f
            out[str(p.relative_to(root))] = (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
    return out


def shardfs_umount(mnt: Path, *args: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    r = run_shardfs("umount", str(mnt), *args, timeout=timeout)
    return r, time.monotonic() - t0


# --------------------------------------------------------------------------- non-regular files


def test_non_regular_shards_are_never_opened(tmp_path, caplog):
    """In-process (the refused writes: at the kernel's FLUSH, which ``close`` sends; what the
    unmount folds: at the close of the tree)."""
    src = tmp_path / "src"
    exp = build(src, [H])
    fifo, directory, sock = (H.shard_file(src, ij) for ij in ((0, 0), (0, 1), (1, 0)))
    fifo.unlink()
    os.mkfifo(fifo)
    directory.unlink()
    directory.mkdir()
    (directory / "x").write_bytes(b"not a shard")
    sock.unlink()
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock))
    caplog.set_level(logging.DEBUG, logger="shardfs")

    def logged(needle: str) -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "shardfs" and needle in r.getMessage()]

    try:
        with InProcess(src, read_only=False) as fs:
            mnt = fs / ""
            for chunk, shard, kind in (("0.1", fifo, "a FIFO"), ("1.2", directory, "a directory"),
                                       ("2.1", sock, "a socket")):
                for _ in range(2):
                    assert errno_of((mnt / "h" / chunk).read_bytes) == errno.EIO, chunk
                assert len(logged(f"{shard}: not read: not a regular file ({kind})")) == 1, caplog.text[-3000:]
                # writes into such a shard are refused: a new file on the key, and a rename onto it
                assert errno_of((mnt / "h" / chunk).write_bytes, chunk_bytes(1)[1]) == errno.EIO
                (mnt / "h" / "tmp.partial").write_bytes(chunk_bytes(2)[1])
                assert errno_of((mnt / "h" / "tmp.partial").replace, mnt / "h" / chunk) == errno.EIO
                (mnt / "h" / "tmp.partial").unlink()
            good = H.decode((mnt / "h" / "2.2").read_bytes())  # the stored shard beside them serves
            np.testing.assert_array_equal(good, exp["h"][H.chunk_region((2, 2))])
        assert fifo.is_fifo() and directory.is_dir() and sock.is_socket()
        assert journal_entries(src) == []
    finally:
        server.close()


def test_shard_turned_fifo_or_directory_after_a_write_keeps_it_in_the_journal(tmp_path, mount):
    src = tmp_path / "src"
    exp = build(src, [H])
    mnt = mount(src)
    writes = {(0, 1): 1, (0, 2): 2, (2, 2): 3}  # shards (0,0) and (0,1) go bad, (1,1) stays
    data = {}
    for idx, k in writes.items():
        block, data[idx] = chunk_bytes(k)
        write_file(mnt / "h" / H.chunk_name(idx), data[idx])
        exp["h"][H.chunk_region(idx)] = block
    fifo, directory = H.shard_file(src, (0, 0)), H.shard_file(src, (0, 1))
    # well within the idle time (1 s) before the writes are folded
    os.rename(fifo, tmp_path / "shard00")
    os.mkfifo(fifo)
    os.rename(directory, tmp_path / "shard01")
    directory.mkdir()

    r, took = shardfs_umount(mnt, "--timeout", "120")
    m = mount.info(mnt)
    assert m.proc.wait(timeout=10) == 0
    assert not is_mounted(mnt)
    assert took < 60, f"umount took {took:.1f} s"  # it does not wait out --timeout for what cannot fold
    assert r.returncode == 1
    assert r.stderr.splitlines() == [
        "shardfs: 1 change to h/c/0/0 kept in the journal: not a regular file (a FIFO)",
        "shardfs: 1 change to h/c/0/1 kept in the journal: not a regular file (a directory)",
        f"shardfs: they are folded by the next mount of {src}",
    ], r.stderr
    for key in ("h/c/0/0", "h/c/0/1"):  # rate-limited: one line per shard, not one per try
        assert len(lines(mount, mnt, f"{src / key}: shard rewrite failed")) == 1, m.log_text()[-3000:]
    import zarr

    np.testing.assert_array_equal(zarr.open_array(str(src / "h"), mode="r")[8:16, 8:16], exp["h"][8:16, 8:16])

    mnt = mount(src)  # the replay keeps what it cannot fold, and the mount goes live
    assert len(lines(mount, mnt, f"{src / 'h/c/0/0'}: shard rewrite failed, next try in 1 s; "
                             "1 change to h/c/0/0 kept in the journal: not a regular file (a FIFO)")) == 1
    for idx in ((0, 1), (0, 2), (2, 2)):  # served from the journal meanwhile, and the good shard
        assert read_bytes(mnt / "h" / H.chunk_name(idx)) == data[idx]
    np.testing.assert_array_equal(H.decode(read_bytes(mnt / "h" / "3.3")), exp["h"][H.chunk_region((3, 3))])
    assert errno_of(read_bytes, mnt / "h" / "0.0") == errno.EIO  # a stored chunk of the FIFO shard
    os.unlink(fifo)
    os.rename(tmp_path / "shard00", fifo)
    directory.rmdir()
    os.rename(tmp_path / "shard01", directory)
    wait_for(lambda: len(lines(mount, mnt, "folded after")) == 2, 20, "the kept changes folded")
    umount(mount, mnt)
    assert_source_equals(src, "h", exp["h"])
    assert leftovers(src) == []


def test_a_file_where_a_key_directory_should_be_refuses_the_write(tmp_path, caplog):
    """In-process (refused at close: the kernel's FLUSH)."""
    src = tmp_path / "src"
    build(src, [H])
    os.rename(src / "h" / "c" / "1", tmp_path / "c1")
    (src / "h" / "c" / "1").write_bytes(b"not a directory")
    caplog.set_level(logging.INFO, logger="shardfs")
    with InProcess(src, read_only=False) as fs:
        chunk = fs / "h" / "2.2"
        assert errno_of(chunk.read_bytes) == errno.ENOENT  # no such shard
        assert errno_of(chunk.write_bytes, chunk_bytes(1)[1]) == errno.EIO  # refused at close
    needle = f"{src / 'h'}/2.2: write refused: a file is where a directory should be"
    assert len([r for r in caplog.records if needle in r.getMessage()]) == 1
    assert (src / "h" / "c" / "1").read_bytes() == b"not a directory"
    assert journal_entries(src) == []


def test_umount_returns_in_bounded_time_when_a_shard_is_locked_forever(tmp_path, mount):
    src = tmp_path / "src"
    exp = build(src, [H])
    with shard_locks(H.shard_file(src, (1, 1))):
        mnt = mount(src)
        block, data = chunk_bytes(7)
        write_file(mnt / "h" / "3.3", data)
        exp["h"][H.chunk_region((3, 3))] = block
        other, data = chunk_bytes(8)  # a shard beside the locked one is folded meanwhile
        write_file(mnt / "h" / "0.0", data)
        exp["h"][H.chunk_region((0, 0))] = other
        import zarr

        wait_for(lambda: np.array_equal(zarr.open_array(str(src / "h"), mode="r")[0:4, 0:4], other), 10,
                 "the unlocked shard folded")
        r, took = shardfs_umount(mnt, "--timeout", "1")
        assert took < 60, f"umount --timeout 1 took {took:.1f} s"  # a hang: the lock is held forever
        assert r.returncode == 1
        err = r.stderr.splitlines()
        assert err[0].startswith(f"shardfs: {mnt}: pending writes not folded within 1 s: stopping daemon "), err
        assert err[1].startswith("shardfs: 1 change to h/c/1/1 kept in the journal: "), err
        assert err[2:] == [f"shardfs: they are folded by the next mount of {src}"], err
        assert not is_mounted(mnt)
    mnt = mount(src)  # the lock is free: the replay folds the change
    assert journal_entries(src) == []
    umount(mount, mnt)
    assert_source_equals(src, "h", exp["h"])
    assert leftovers(src) == []


# --------------------------------------------------------------------------- symlinks out of SRC


OUT = Spec("o", (8, 8), (4, 4), (8, 8), "<u2", 0, ("gzip", 1), inner_crc=False, index_location="start",
         index_crc=False, initial=((s(0, 8), s(0, 8)),), write=(s(0, 8), s(0, 8)))


def escaping_source(tmp_path):
    """SRC with array ``h`` whose shard (0,1) is a symlink to /etc/passwd and whose ``c/1``
    (shards (1,0) and (1,1)) is a symlink to a directory outside, plus array ``o`` that is a
    symlink to an array outside."""
    src, out = tmp_path / "src", tmp_path / "outside"
    exp = build(src, [H])
    exp.update(build(out, [OUT]))
    (src / "o").symlink_to(out / "o")
    shard01 = H.shard_file(src, (0, 1))
    shard01.unlink()
    shard01.symlink_to("/etc/passwd")
    os.rename(src / "h" / "c" / "1", out / "c1")
    (src / "h" / "c" / "1").symlink_to(out / "c1")
    return src, out, exp


def test_symlinks_out_of_the_source_are_neither_read_nor_written(tmp_path, caplog):
    """In-process (the refused writes: at the kernel's FLUSH, which ``close`` sends)."""
    src, out, exp = escaping_source(tmp_path)
    before = tree_digest(out), Path("/etc/passwd").read_bytes(), os.stat("/etc/passwd").st_mtime_ns
    caplog.set_level(logging.DEBUG, logger="shardfs")

    def logged(needle: str) -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "shardfs" and needle in r.getMessage()]

    with InProcess(src, read_only=False) as fs:
        mnt = fs / ""
        assert sorted(mnt.iterdir()) == [".zattrs", ".zgroup", ".zmetadata", "h"]
        assert errno_of((mnt / "o").stat) == errno.ENOENT
        assert errno_of((mnt / "o" / "0.0").write_bytes, b"x") == errno.ENOENT
        assert len(logged(f"{src / 'o/zarr.json'}: not read: a symlink leads out of the source")) == 1
        for chunk in ("0.2", "1.3"):  # shard (0,1) -> /etc/passwd
            assert errno_of((mnt / "h" / chunk).read_bytes) == errno.EACCES
        assert len(logged(f"{src / 'h/c/0/1'}: not read: a symlink leads out of the source (to /etc/passwd)")) == 1
        assert errno_of((mnt / "h" / "2.0").read_bytes) == errno.EACCES  # shard (1,0) behind h/c/1
        assert errno_of((mnt / "h" / "0.2").write_bytes, chunk_bytes(1)[1]) == errno.EACCES
        (mnt / "h" / "tmp.partial").write_bytes(chunk_bytes(2)[1])
        assert errno_of((mnt / "h" / "tmp.partial").replace, mnt / "h" / "3.3") == errno.EACCES
        (mnt / "h" / "tmp.partial").unlink()
        np.testing.assert_array_equal(H.decode((mnt / "h" / "0.0").read_bytes()), exp["h"][H.chunk_region((0, 0))])
    assert (tree_digest(out), Path("/etc/passwd").read_bytes(), os.stat("/etc/passwd").st_mtime_ns) == before
    assert H.shard_file(src, (0, 1)).is_symlink() and (src / "h" / "c" / "1").is_symlink()


def test_follow_symlinks_reads_through_them_and_never_writes(tmp_path, mount):
    from conftest import read_zarr2

    src, out, exp = escaping_source(tmp_path)
    before = tree_digest(out)
    mnt = mount(src, "-o", "follow_symlinks")
    np.testing.assert_array_equal(read_zarr2(mnt / "o"), exp["o"])
    np.testing.assert_array_equal(H.decode(read_bytes(mnt / "h" / "2.0")), exp["h"][H.chunk_region((2, 0))])
    assert errno_of(write_file, mnt / "o" / "0.0", OUT.encode(OUT.values(OUT.chunk, 5))) == errno.EACCES  # at close
    assert len(lines(mount, mnt, f"{src / 'o'}/0.0: write refused: a symlink leads out of the source")) == 1
    assert errno_of(write_file, mnt / "h" / "2.1", chunk_bytes(3)[1]) == errno.EACCES
    umount(mount, mnt)
    assert tree_digest(out) == before


def test_follow_symlinks_reads_through_them_and_never_writes_in_process(tmp_path, caplog):
    """The daemon's part of ``follow_symlinks_reads_through_them_and_never_writes``, in-process
    (``tests/inproc.py``, ``follow_symlinks``): chunk files of a shard and an array reached
    through symlinks out of the source read as stored; a write through them is refused with
    EACCES at its close (one log line) and nothing outside changes (the mounted test reads them
    with zarr 2.18)."""
    src, out, exp = escaping_source(tmp_path)
    before = tree_digest(out)
    with InProcess(src, read_only=False, follow_symlinks=True) as fs:
        np.testing.assert_array_equal(H.decode((fs / "h" / "2.0").read_bytes()), exp["h"][H.chunk_region((2, 0))])
        np.testing.assert_array_equal(OUT.decode((fs / "o" / "0.0").read_bytes()), exp["o"][OUT.chunk_region((0, 0))])
        writes = [(fs / "o" / "0.0", OUT.encode(OUT.values(OUT.chunk, 5))), (fs / "h" / "2.1", chunk_bytes(3)[1])]
        for path, data in writes:
            with pytest.raises(PermissionError):
                path.write_bytes(data)
    assert sum("write refused: a symlink leads out of the source" in r.getMessage() for r in caplog.records) >= 2
    assert tree_digest(out) == before


# --------------------------------------------------------------------------- ownership


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_rewritten_shards_keep_owner_group_and_mode(tmp_path):
    """In-process (``tests/inproc.py``: closing the tree folds, as an unmount does)."""
    src = tmp_path / "src"
    spec = Spec("h", (16, 16), (4, 4), (8, 8), "<i4", 0, ("zstd", 1), inner_crc=False, index_location="end",
                index_crc=True, initial=((s(0, 8), s(0, 16)),), write=(s(0, 16), s(0, 16)))
    exp = build(src, [spec])
    for dirpath, _dirs, files in os.walk(src / "h"):
        os.chown(dirpath, 1234, 1234)
        os.chmod(dirpath, 0o750)
        for f in files:
            os.chown(Path(dirpath) / f, 1234, 1234)
            os.chmod(Path(dirpath) / f, 0o640)
    with InProcess(src, read_only=False) as fs:
        for k, idx in enumerate(((0, 1), (2, 2))):  # an existing shard, and a new one in a new directory
            block, data = chunk_bytes(k, spec)
            (fs / "h" / spec.chunk_name(idx)).write_bytes(data)
            exp["h"][spec.chunk_region(idx)] = block
    assert_source_equals(src, "h", exp["h"])
    got = {key: (st.st_uid, st.st_gid, oct(st.st_mode & 0o7777))
           for key in ("c/0/0", "c/1", "c/1/1") for st in [os.stat(src / "h" / key)]}
    assert got == {"c/0/0": (1234, 1234, "0o640"), "c/1": (1234, 1234, "0o750"), "c/1/1": (1234, 1234, "0o640")}


# --------------------------------------------------------------------------- version-checked folds


T = Spec("t", (16, 32), (4, 4), (8, 16), "<i4", 0, ("zstd", 1), inner_crc=False, index_location="end",
         index_crc=True, initial=((s(0, 16), s(0, 32)),), write=(s(0, 16), s(0, 32)))
ROUNDS = 4


def test_tensorstore_and_a_mount_writing_the_same_shards_lose_nothing(tmp_path, mount):
    """One tensorstore writer per shard (zarr3 driver, file kvstore) rewrites the even chunk
    columns of its shard, one chunk after the other, for 2.5 s per round, while the mount's
    writes to the odd columns are folded (after 1 s idle). Before each write, a tensorstore
    writer reads back the chunks it wrote: a fold that replaced the shard without seeing one
    of those writes would have lost it."""
    import tensorstore as ts

    src = tmp_path / "src"
    exp = build(src, [T])["t"]
    mnt = mount(src)
    grid = T.inner_grid
    mine = [(i, j) for i in range(grid[0]) for j in range(grid[1]) if j % 2]
    store = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(src / "t")}},
                    open=True, context=ts.Context()).result()
    lost: list[str] = []
    failures: list[BaseException] = []

    def tensorstore_writes(r: int, shard: tuple[int, ...]) -> None:
        theirs = [idx for idx in itertools.product(*map(range, grid))
                  if T.shard_of(idx) == shard and not idx[1] % 2]
        region = tuple(s(i * n, (i + 1) * n) for i, n in zip(shard, T.shard))
        try:
            end, n = time.monotonic() + 2.5, 0
            while time.monotonic() < end:
                got = store[region].read().result()
                for idx in theirs[: n]:  # every chunk this writer wrote this round
                    inside = tuple(s(a.start - b.start, a.stop - b.start) for a, b in zip(T.chunk_region(idx), region))
                    if not np.array_equal(got[inside], exp[T.chunk_region(idx)]):
                        lost.append(f"round {r}: chunk {idx} lost the value tensorstore wrote")
                idx = theirs[n % len(theirs)]
                block = np.full(T.chunk, 100000 * (r + 1) + n, dtype=T.dtype)
                store[T.chunk_region(idx)].write(block).result()
                exp[T.chunk_region(idx)] = block
                n += 1
        except BaseException as e:  # reported by the test thread
            failures.append(e)

    for r in range(ROUNDS):
        threads = [threading.Thread(target=tensorstore_writes, args=(r, shard))
                   for shard in itertools.product(*map(range, T.shard_grid))]
        for t in threads:
            t.start()
        for k, idx in enumerate(mine):
            block = T.values(T.chunk, r * 1000 + k)
            write_file(mnt / "t" / T.chunk_name(idx), T.encode(block))
            exp[T.chunk_region(idx)] = block
        for t in threads:
            t.join()
        assert not failures, failures
        time.sleep(1.5)  # the mount's folds are done
        assert_source_equals(src, "t", exp)
    assert lost == []
    umount(mount, mnt)
    assert_source_equals(src, "t", exp)
    assert leftovers(src) == []
    print(f"folds that found the shard changed: {len(lines(mount, mnt, 'changed by another writer'))}")


def test_two_mounts_of_one_source_writing_the_same_shards_lose_nothing(tmp_path, mount):
    """Two daemons (each with its own journal) write disjoint chunks of the same shards, round
    after round; both fold after the same idle time, so their folds of a shard race."""
    src = tmp_path / "src"
    exp = build(src, [T])["t"]
    mnts = [mount(src, "-o", f"journal_dir={tmp_path / name}") for name in ("journal-a", "journal-b")]
    grid = T.inner_grid
    for r in range(ROUNDS + 2):
        def writes(side: int, r: int = r) -> None:
            for i, j in itertools.product(*map(range, grid)):
                if j % 2 == side:
                    block = T.values(T.chunk, 10000 * r + 100 * i + j)
                    write_file(mnts[side] / "t" / T.chunk_name((i, j)), T.encode(block))
                    exp[T.chunk_region((i, j))] = block

        threads = [threading.Thread(target=writes, args=(side,)) for side in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wait_for(lambda: not any(segments_under(str(tmp_path / name)) for name in ("journal-a", "journal-b")),
                 20, "both journals folded")
        assert_source_equals(src, "t", exp)
    for mnt in mnts:
        umount(mount, mnt)
    assert_source_equals(src, "t", exp)
    assert leftovers(src) == []
    races = sum(len(lines(mount, mnt, "changed by another writer")) for mnt in mnts)
    print(f"folds that found the shard changed: {races}")


def test_a_journal_whose_array_metadata_turned_into_a_fifo_is_kept_for_a_later_mount(tmp_path, mount):
    """A killed daemon's journal, replayed while the array's zarr.json is a FIFO: the mount goes
    live (the other array is served), the changes stay in the journal, and a mount after the
    metadata is back folds them."""
    import signal

    from conftest import lazy_unmount

    src = tmp_path / "src"
    other = Spec("o", (8, 8), (4, 4), (8, 8), "<u2", 0, ("gzip", 1), inner_crc=False, index_location="start",
                 index_crc=False, initial=((s(0, 8), s(0, 8)),), write=(s(0, 8), s(0, 8)))
    exp = build(src, [H, other])
    mnt = mount(src)
    block, data = chunk_bytes(9)
    write_file(mnt / "h" / "1.1", data)
    exp["h"][H.chunk_region((1, 1))] = block
    m = mount.info(mnt)
    os.kill(m.pid, signal.SIGKILL)
    m.proc.wait(timeout=10)
    lazy_unmount(mnt)
    meta = src / "h" / "zarr.json"
    os.rename(meta, tmp_path / "zarr.json")
    os.mkfifo(meta)
    mnt = mount(src)  # does not block on the FIFO, and goes live
    assert len(lines(mount, mnt, "journal: 1 change to h shard [0, 0] kept in the journal: "
                                 "not a regular file (a FIFO)")) == 1, mount.info(mnt).log_text()[-2000:]
    from conftest import read_zarr2

    np.testing.assert_array_equal(read_zarr2(mnt / "o"), exp["o"])
    r, _ = shardfs_umount(mnt)
    assert r.returncode == 1 and r.stderr.splitlines() == [
        "shardfs: 1 change to h shard [0, 0] kept in the journal: not a regular file (a FIFO)",
        f"shardfs: they are folded by the next mount of {src}"], r.stderr
    assert sorted(Path(e).suffix for e in journal_entries(src)) == [".json", ".seg"]  # the note, the change
    meta.unlink()
    os.rename(tmp_path / "zarr.json", meta)
    mnt = mount(src)
    assert journal_entries(src) == []
    umount(mount, mnt)
    assert_source_equals(src, "h", exp["h"])
    assert leftovers(src) == []
