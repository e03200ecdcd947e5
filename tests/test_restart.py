"""A supervised mount (``shardfs.app.supervisor``): a worker killed at any moment is replaced on
the same kernel connection, and no client notices.

Each test mounts for real; the worker is the supervisor's (the mount's pid) only child. Kills
are SIGKILL by PID. Readers are zarr 2.18 processes (which take a failed ``stat`` of a chunk
for a missing chunk and return its fill value): every value they read is checked.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import ZARR2_PYTHON, bounded, daemon_pids, open_files, run_shardfs, shard_locks, status, wait_for

pytestmark = [
    pytest.mark.long(57),
    pytest.mark.skipif(
        "takeover" not in __import__("importlib.metadata").metadata.version("pyfuse3"),
        reason="needs the pyfuse3 scripts/pyfuse3 builds (pyfuse3.takeover)"),
]

SHAPE, CHUNKS, SHARDS = (64, 64), (4, 4), (16, 16)
EXPECTED = np.arange(1, SHAPE[0] * SHAPE[1] + 1, dtype="<i4").reshape(SHAPE)  # no 0: the fill value

READER = textwrap.dedent(r"""
    import json, os, random, sys, time
    import numpy as np, zarr
    path, stop, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    expected = np.arange(1, 64 * 64 + 1, dtype="<i4").reshape(64, 64)
    rng = random.Random(seed)
    counts = {"reads": 0, "wrong": 0, "fill": 0, "errors": []}
    while not os.path.exists(stop):
        r, c = rng.randrange(0, 64, 4), rng.randrange(0, 64, 4)
        try:
            z = zarr.open(path, mode="r")  # .zarray read again each time
            got = z[r:r + 8, c:c + 8]
        except Exception as e:
            counts["errors"].append("%s: %s" % (type(e).__name__, e))
            continue
        counts["reads"] += 1
        want = expected[r:r + 8, c:c + 8]
        if not np.array_equal(got, want):
            counts["wrong"] += 1
            counts["fill"] += int((got == 0).sum())
    print(json.dumps(counts))
""")


def two_arrays(root: Path, shards: tuple[int, int] = SHARDS) -> Path:
    """A group at ``root`` of two sharded arrays ``a`` and ``b``, each ``EXPECTED`` (written by zarr 3)."""
    import zarr

    g = zarr.open_group(str(root), mode="w")
    for name in ("a", "b"):
        a = g.create_array(name, shape=SHAPE, chunks=CHUNKS, shards=shards, dtype="<i4", fill_value=0)
        a[...] = EXPECTED
    return root


@pytest.fixture
def src(tmp_path) -> Path:
    return two_arrays(tmp_path / "src")


class OneWorker:
    """``conftest.MountFactory`` mounting with ``-o workers=1`` first (options given after it add to it)."""

    def __init__(self, factory) -> None:
        self._factory = factory

    def __call__(self, src, *extra_args: str, **kwargs) -> Path:
        return self._factory(src, "-o", "workers=1", *extra_args, **kwargs)

    def info(self, mnt: Path):
        return self._factory.info(mnt)


@pytest.fixture
def mount(mount) -> OneWorker:
    """These tests are about one worker's restart (its supervisor, RESEND, takeover, zygote): one
    serving process. N workers' kills and handovers are tests/test_workers.py's."""
    return OneWorker(mount)


def assert_clean_reads(outs: list[tuple[str, str]]) -> None:
    """The outputs of ``READER`` processes: each read something, none failed, none read a wrong
    value or the fill value."""
    counts = [json.loads(out.strip().splitlines()[-1]) for out, _err in outs]
    assert all(c["reads"] > 0 for c in counts), counts
    assert [c["errors"] for c in counts] == [[]] * len(counts)
    assert [(c["wrong"], c["fill"]) for c in counts] == [(0, 0)] * len(counts)


def worker_of(m) -> int:
    """The pid of the supervisor's worker (its only one)."""
    from shardfs.app.zygote import workers_of

    (pid,) = workers_of(m.pid)
    return pid


def kill_worker(m, mnt: Path, seconds: float = 30) -> int:
    """SIGKILL the worker; wait until another serves (its status answers); the new pid."""
    old = worker_of(m)
    os.kill(old, signal.SIGKILL)
    found: list[int] = []

    def served() -> bool:
        try:
            doc = status(mnt)
        except AssertionError:
            return False
        pid = doc.get("worker", {}).get("pid")  # (no "worker" while none answers)
        found[:] = [pid]
        return pid is not None and pid != old

    wait_for(served, seconds, "a new worker serving")
    return found[0]


def test_the_pyfuse3_build_is_read_from_its_dist_info_as_importlib_metadata_reads_it(tmp_path):
    """``shardfs.app.run.pyfuse3_version`` (what ``supervised`` and ``workers_refused`` decide
    from) is the version ``importlib.metadata`` gives, patches' label included; a pyfuse3 built
    as one module file has its version read beside it (a stock one: not supervised); "" for one
    without a dist-info (``python -c`` with a path that puts each first)."""
    import importlib.metadata

    from shardfs.app.run import pyfuse3_version

    assert pyfuse3_version() == importlib.metadata.version("pyfuse3")
    assert "takeover" in pyfuse3_version() and "workers" in pyfuse3_version()
    code = "from shardfs.app.run import pyfuse3_version, supervised; print(repr(pyfuse3_version()), supervised())"
    for name, dist, want in [("none", None, "'' False\n"), ("stock", "pyfuse3-3.2.0.dist-info", "'3.2.0' False\n")]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "pyfuse3.py").write_text("raise ImportError('not this one')\n")  # found, never imported
        if dist:
            (tmp_path / name / dist).mkdir()
        env = {**os.environ, "PYTHONPATH": f"{tmp_path / name}:{os.environ.get('PYTHONPATH', '')}"}
        assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              env=env).stdout == want


def test_sigkill_of_the_worker_under_concurrent_zarr2_readers(mount, src, tmp_path):
    mnt = mount(src)
    m = mount.info(mnt)
    stop = tmp_path / "stop"
    readers = [subprocess.Popen([ZARR2_PYTHON, "-c", READER, str(mnt / "a"), str(stop), str(i)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(3)]
    try:
        time.sleep(1.0)
        pids = {worker_of(m)}
        for _ in range(3):
            pids.add(kill_worker(m, mnt))
            time.sleep(0.5)
    finally:
        stop.touch()
        outs = [r.communicate(timeout=120) for r in readers]
    assert_clean_reads(outs)
    assert len(pids) == 4
    doc = status(mnt)
    assert doc["pid"] == m.pid
    assert doc["worker"]["pid"] == worker_of(m)
    assert doc["worker"]["restarts"] == 3
    assert doc["worker"]["last_reason"] == "signal 9"
    assert doc["worker"]["started"] <= time.time()
    assert m.log_text().count("ended (signal 9): starting another on the same connection") == 3


def _inodes(mnt: Path, names: list[str]) -> dict[str, int]:
    return {n: os.stat(mnt / n).st_ino for n in names}


def _read_rest(fd: int) -> bytes:
    parts = []
    while part := os.read(fd, 1 << 16):
        parts.append(part)
    return b"".join(parts)


def _scan(fd: int) -> list[str]:
    with os.scandir(fd) as entries:
        return sorted(e.name for e in entries)


def test_inodes_and_open_handles_keep_their_meaning(mount, src):
    """Every call on the mount is ``bounded`` (a forked child with a deadline): a worker that
    never answers (e.g. one that cannot take the connection over) fails the test in seconds
    instead of hanging it (and scripts/mutants with it)."""
    mnt = mount(src)
    m = mount.info(mnt)
    names = ["b/0.0", "a", "a/.zarray", "a/.zattrs", "a/3.5", ".zgroup"]  # b: slot 0, a: slot 1
    before = bounded(_inodes, mnt, names)
    names.reverse()  # a first: a worker that numbered anew would give it slot 0
    f = bounded(os.open, mnt / "a" / "2.7", os.O_RDONLY, fd=True)  # (read-only: no FLUSH at a child's exit)
    head = bounded(os.read, f, 5)
    d = bounded(os.open, mnt / "a", os.O_RDONLY | os.O_DIRECTORY, fd=True)
    listing = sorted(bounded(os.listdir, mnt / "a"))
    bounded(os.mkdir, mnt / "made")  # held by the worker (no array in it yet)
    kill_worker(m, mnt)
    assert bounded(os.path.isdir, mnt / "made") and "made" in bounded(os.listdir, mnt)
    assert bounded(_inodes, mnt, names) == before
    assert before["a/3.5"] != bounded(_inodes, mnt, ["b/3.5"])["b/3.5"]
    os.posix_fadvise(f, 0, 0, os.POSIX_FADV_DONTNEED)  # no pages: a READ request
    rest = bounded(_read_rest, f)  # through the handle opened before the kill
    whole = bounded(Path.read_bytes, mnt / "a" / "2.7")
    assert (head, rest) == (whole[:5], whole[5:])
    assert bounded(_scan, d) == listing  # READDIR through the directory handle of the dead worker
    os.close(f)  # (noflush, RELEASE and RELEASEDIR are not waited for)
    os.close(d)


def test_a_request_the_dead_worker_read_is_sent_again(mount, src):
    """The first worker never answers a lookup of ``a`` (a test hook): the ``stat`` waiting for
    it is answered by the next worker, with what it should be."""
    mnt = mount(src, env={"SHARDFS_TEST_HANG": "a"})
    m = mount.info(mnt)
    result: list = []
    t = threading.Thread(target=lambda: result.append(os.stat(mnt / "a")), daemon=True)
    t.start()
    time.sleep(1.0)
    assert t.is_alive() and not result  # the worker read the lookup and did not answer
    kill_worker(m, mnt)
    t.join(30)
    assert not t.is_alive()
    assert len(result) == 1 and result[0].st_ino == os.stat(mnt / "a").st_ino
    assert result[0].st_mode & 0o170000 == 0o040000


def test_without_resend_what_the_dead_worker_read_fails_at_once(mount, src):
    """A kernel without FUSE_NOTIFY_RESEND (simulated): each worker gets a clone of the
    connection, and its death fails (ECONNABORTED) what it had read: never a hang."""
    mnt = mount(src, env={"SHARDFS_TEST_HANG": "a", "SHARDFS_NO_RESEND": "1"})
    m = mount.info(mnt)
    result: list = []

    def stat() -> None:
        try:
            os.stat(mnt / "a")
            result.append(0)
        except OSError as e:
            result.append(e.errno)

    t = threading.Thread(target=stat, daemon=True)
    t.start()
    time.sleep(1.0)
    assert t.is_alive()
    os.kill(worker_of(m), signal.SIGKILL)
    t.join(10)
    assert not t.is_alive()
    assert result == [errno.ECONNABORTED]
    wait_for(lambda: (mnt / "a" / ".zarray").exists(), 30, "the next worker serving")
    assert "no FUSE_NOTIFY_RESEND" in m.log_text()


def test_killing_the_supervisor_ends_the_mount_and_its_worker(mount, src):
    mnt = mount(src)
    m = mount.info(mnt)
    worker = worker_of(m)
    os.kill(m.pid, signal.SIGKILL)
    m.proc.wait(10)
    wait_for(lambda: not Path(f"/proc/{worker}").exists() or
             Path(f"/proc/{worker}/stat").read_text().split(") ", 1)[1][0] == "Z", 10, "the worker gone")
    with pytest.raises(OSError) as e:
        os.stat(mnt / "a")
    assert e.value.errno in (errno.ENOTCONN, errno.ECONNABORTED)  # (the connection ended)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


# --------------------------------------------------------------------------- writes


def chunk(mnt: Path, name: str) -> bytes:
    return (mnt / "a" / name).read_bytes()


@pytest.mark.parametrize("op", ["mkdir", "rmdir", "unlink", "rename"])
def test_a_resent_request_gives_the_answer_of_its_first_execution(mount, src, op):
    """The first worker does the request, then dies before answering (a test hook); the next
    one gets it again (bit 63 of unique) and answers what the first would have: no EEXIST or
    ENOENT from the first execution having happened."""
    target = {"mkdir": "newdir", "rmdir": "gone", "unlink": "1.1", "rename": "tmp.bin"}[op]
    mnt = mount(src, env={"SHARDFS_TEST_DIE_AFTER": f"{op}:{target}"})
    m = mount.info(mnt)
    if op == "rmdir":
        os.mkdir(mnt / "gone")
    moved = chunk(mnt, "3.3")
    if op == "rename":  # zarr's way: a temporary file renamed onto the chunk
        (mnt / "a" / "tmp.bin").write_bytes(moved)
    {"mkdir": lambda: os.mkdir(mnt / "newdir"), "rmdir": lambda: os.rmdir(mnt / "gone"),
     "unlink": lambda: os.unlink(mnt / "a" / "1.1"),
     "rename": lambda: os.rename(mnt / "a" / "tmp.bin", mnt / "a" / "1.2")}[op]()
    assert "ended (signal 9)" in m.log_text()
    assert "a request sent again after a worker died was done by it" in m.log_text()
    names = set(os.listdir(mnt)) | {f"a/{n}" for n in os.listdir(mnt / "a")}
    if op == "mkdir":
        assert (mnt / "newdir").is_dir() and "newdir" in names
    elif op == "rmdir":
        assert not (mnt / "gone").exists() and "gone" not in names
    elif op == "unlink":
        assert "a/1.1" not in names and not (mnt / "a" / "1.1").exists()
    else:
        assert "a/tmp.bin" not in names and chunk(mnt, "1.2") == moved


def held_when_killed(mnt: Path, data: bytes) -> tuple[int, int, int]:
    """What a worker holds when it is killed: ``a/2.2`` written with ``data`` and closed
    (committed: in the journal); descriptors of a temporary ``a/tmp.bin`` written and not
    committed, of ``a/5.5`` rewritten in place (its first 10 bytes) and not committed, and of
    ``a/4.4`` opened for writing with nothing written yet."""
    with open(mnt / "a" / "2.2", "wb") as f:
        f.write(data)
    tmp = os.open(mnt / "a" / "tmp.bin", os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(tmp, b"x" * 100)
    dirty = os.open(mnt / "a" / "5.5", os.O_WRONLY)
    os.write(dirty, data[:10])
    return tmp, dirty, os.open(mnt / "a" / "4.4", os.O_WRONLY)


def test_bytes_only_the_dead_worker_held_fail_with_eio(mount, src):
    """A temporary file (held in the worker's memory) written and not committed: its next
    write and its close fail with EIO; a file opened for writing with nothing written yet goes
    on; what was committed (closed) before the death is there."""
    mnt = mount(src)
    m = mount.info(mnt)
    data = chunk(mnt, "3.3")
    tmp, dirty, clean = held_when_killed(mnt, data)
    kill_worker(m, mnt)
    for fd, rest in ((tmp, b"y" * 100), (dirty, data[10:])):
        with pytest.raises(OSError) as e:
            os.write(fd, rest)
        assert e.value.errno == errno.EIO
        with pytest.raises(OSError) as e:
            os.close(fd)
        assert e.value.errno == errno.EIO
    assert chunk(mnt, "5.5") == (mnt / "b" / "5.5").read_bytes()  # as before: nothing half written
    os.write(clean, data)
    os.close(clean)
    assert chunk(mnt, "2.2") == data and chunk(mnt, "4.4") == data
    assert "bytes written through it were lost with a worker: EIO" in m.log_text()


def test_a_resent_write_of_bytes_the_dead_worker_held_fails_with_eio(mount, src):
    """The first worker applies a WRITE to a temporary file and dies before answering: the
    re-sent WRITE fails with EIO (its bytes died with the worker), never silently."""
    mnt = mount(src, env={"SHARDFS_TEST_DIE_AFTER": "write:*"})
    tmp = os.open(mnt / "a" / "tmp.bin", os.O_WRONLY | os.O_CREAT, 0o644)
    with pytest.raises(OSError) as e:
        os.write(tmp, b"x" * 100)
    assert e.value.errno == errno.EIO
    with pytest.raises(OSError):
        os.close(tmp)


def test_a_crash_loop_ends_the_mount_with_one_log_line(mount, src, mnt_dir):
    """5 worker deaths within 60 s: no sixth worker; the mount is detached, the supervisor
    exits 1 with one log line saying why, and the source mounts again."""
    mnt = mount(src)
    m = mount.info(mnt)
    for _ in range(4):
        kill_worker(m, mnt)
    os.kill(worker_of(m), signal.SIGKILL)
    assert m.proc.wait(30) == 1
    assert not os.path.ismount(mnt)
    lines = [line for line in m.log_text().splitlines() if "times within" in line]
    assert len(lines) == 1 and lines[0].endswith(
        f"{mnt}: the worker died 5 times within 60 s (last: signal 9): unmounting"), lines
    r = run_shardfs("umount", str(mnt))
    assert r.returncode == 1 and r.stderr.strip() == f"shardfs: error: {mnt}: not mounted"
    assert run_shardfs("mount", str(src), str(mnt_dir)).returncode == 0
    assert (mnt_dir / "a" / ".zarray").exists()
    assert run_shardfs("umount", str(mnt_dir)).returncode == 0


# --------------------------------------------------------------------------- upgrades


def test_mount_on_the_live_mount_hands_it_to_a_new_worker_under_load(mount, src, tmp_path):
    """``shardfs mount SRC MNT -o ...`` on the live mount of SRC: a new worker (the package
    installed now) with the new options serves the same connection, the old one having folded
    and stopped; 3 zarr 2.18 readers see no error and no wrong value; twice."""
    mnt = mount(src)
    m = mount.info(mnt)
    stop = tmp_path / "stop"
    readers = [subprocess.Popen([ZARR2_PYTHON, "-c", READER, str(mnt / "a"), str(stop), str(i)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(3)]
    try:
        time.sleep(1.0)
        old = worker_of(m)
        for cache in ("32M", "16M"):
            r = run_shardfs("mount", str(src), str(mnt), "-o", f"chunk_cache={cache}")
            assert (r.returncode, r.stderr) == (0, ""), r.stderr
            doc = status(mnt)
            assert doc["options"] == {"chunk_cache": cache}
            time.sleep(0.5)
    finally:
        stop.touch()
        outs = [r.communicate(timeout=120) for r in readers]
    assert_clean_reads(outs)
    assert doc["pid"] == m.pid and doc["worker"]["pid"] == worker_of(m) != old
    assert (doc["worker"]["takeovers"], doc["worker"]["restarts"]) == (2, 0)
    assert m.log_text().count("handed") == 2 and "ended (" not in m.log_text()


@pytest.mark.parametrize("option", ["ro", "allow_other", "max_read=65536"])
def test_an_option_fixed_at_connection_time_cannot_change_on_the_live_mount(mount, src, option):
    mnt = mount(src)
    m = mount.info(mnt)
    old = worker_of(m)
    r = run_shardfs("mount", str(src), str(mnt), "-o", option)
    name = option.partition("=")[0]
    assert (r.returncode, r.stderr) == (1, f"shardfs: error: {mnt}: -o {name} cannot change on a live mount "
                                           f"(fixed when the kernel connection was made): unmount it first "
                                           f"(shardfs umount {mnt})\n")
    assert worker_of(m) == old and status(mnt)["worker"]["takeovers"] == 0


# --------------------------------------------------------------------------- found by the soak's worker kills


@pytest.mark.parametrize("how", ["rename", "inplace", "cp"])
def test_a_chunk_written_before_the_kill_reads_as_written_right_after(mount, src, how):
    """A chunk written through the mount (in the journal, not yet folded) and looked up since:
    right after a worker kill, before the kernel looks its name up again, the new worker
    serves it as written (found by scripts/soak's worker kills: fill reads and ENOENT)."""
    mnt = mount(src)
    m = mount.info(mnt)
    data = chunk(mnt, "3.3")
    target = mnt / "a" / "1.1"
    if how == "rename":
        tmp = mnt / "a" / "1.1.partial"
        tmp.write_bytes(data)
        os.rename(tmp, target)
    elif how == "inplace":
        target.write_bytes(data)
    else:
        subprocess.run(["cp", str(mnt / "a" / "3.3"), str(target)], check=True)
    assert target.read_bytes() == data and os.stat(target).st_size == len(data)
    kill_worker(m, mnt)
    assert os.stat(target).st_size == len(data)
    assert target.read_bytes() == data


@pytest.mark.parametrize("how", ["rename", "inplace"])
def test_pages_of_a_version_before_the_kill_are_not_served_after_it(mount, src, how):
    """The kernel holds pages of a chunk read before its rewrite; the worker dies before
    anything dropped them: the next worker, which does not know what the kernel caches,
    serves the new version, never those pages."""
    mnt = mount(src)
    m = mount.info(mnt)
    target = mnt / "a" / "1.1"
    old, new = target.read_bytes(), chunk(mnt, "3.3")
    assert old != new
    with open(target, "rb") as f:  # the pages of the old version, held by the kernel
        assert f.read() == old
    if how == "rename":
        (mnt / "a" / "1.1.partial").write_bytes(new)
        os.rename(mnt / "a" / "1.1.partial", target)
    else:
        target.write_bytes(new)
    os.stat(target)  # the kernel has the new version's attributes
    kill_worker(m, mnt)
    assert target.read_bytes() == new


def test_a_temporary_closed_before_the_kill_fails_with_eio_not_enoent(mount, src):
    """A temporary written and closed (its bytes in the worker's memory), then the worker dies:
    renaming it onto its chunk fails with EIO, as does looking it up, never ENOENT (its
    writer must not take it for a file someone removed), the chunk keeps its value, and the
    name can be removed (found by scripts/soak's worker kills: zarr's and tensorstore's renames)."""
    mnt = mount(src)
    m = mount.info(mnt)
    before = chunk(mnt, "1.1")
    tmp = mnt / "a" / "1.1.partial"
    tmp.write_bytes(chunk(mnt, "3.3"))
    kill_worker(m, mnt)
    with pytest.raises(OSError) as e:
        os.rename(tmp, mnt / "a" / "1.1")
    assert e.value.errno == errno.EIO
    with pytest.raises(OSError) as e:
        os.stat(mnt / "a" / "1.1.partial.other-name")  # (a name never made: ENOENT as ever)
    assert e.value.errno == errno.ENOENT
    with pytest.raises(OSError) as e:
        open(tmp, "rb")
    assert e.value.errno == errno.EIO
    assert chunk(mnt, "1.1") == before
    os.unlink(tmp)
    assert not tmp.exists() and "1.1.partial" not in os.listdir(mnt / "a")
    tmp.write_bytes(before)  # the name is free again
    os.rename(tmp, mnt / "a" / "1.2")
    assert chunk(mnt, "1.2") == before


def test_a_temporary_renamed_onto_its_chunk_while_open_closes_cleanly_after_a_kill(mount, src):
    """tensorstore's way: write a temporary, rename it onto the chunk with the file still
    open, close it. A worker kill between the rename and the close: the bytes were committed
    by the rename, so the close succeeds (no false EIO) and the chunk holds them."""
    mnt = mount(src)
    m = mount.info(mnt)
    data = chunk(mnt, "3.3")
    fd = os.open(mnt / "a" / "1.1.__lock", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, data)
    os.rename(mnt / "a" / "1.1.__lock", mnt / "a" / "1.1")
    kill_worker(m, mnt)
    os.close(fd)
    assert chunk(mnt, "1.1") == data


# --------------------------------------------------------------------------- time to serve after a death

def test_the_dead_workers_journal_is_served_before_it_is_folded(mount, src):
    """Chunks written (journalled, not folded) when the worker is killed: the next one serves
    first and folds after, in the background, like any pending chunk (it used to fold the dead
    one's journal before serving: seconds on a loaded machine, more on S3). The shards are
    locked (tensorstore's lock file) so no fold can happen meanwhile: the chunk is read back
    as written from the pending state; the new worker's first fold attempt comes after its
    first served request, in its log."""
    mnt = mount(src)
    m = mount.info(mnt)
    shards = [src / "a" / "c" / "0" / "0", src / "a" / "c" / "1" / "1"]
    before = [s.read_bytes() for s in shards]
    with shard_locks(*shards):
        data = {"1.1": chunk(mnt, "3.3"), "5.6": chunk(mnt, "2.2")}  # one chunk in each locked shard
        for name, value in data.items():
            (mnt / "a" / name).write_bytes(value)
        new = kill_worker(m, mnt)
        for name, value in data.items():
            assert chunk(mnt, name) == value
        assert [s.read_bytes() for s in shards] == before  # not folded: read from the pending state
        doc = status(mnt)
        assert doc["pending"]["chunks"] == 2, doc["pending"]
        log = m.log_text()
        serves = log.index(f"worker {new} serves")
        folds = [i for i in (log.find(f"shardfs[{new}] ERROR {s}: shard rewrite failed") for s in shards) if i >= 0]
        assert all(serves < i for i in folds), f"the new worker tried a fold before it served: {log[-2000:]}"
        assert "took over 2 journalled chunk changes of a dead worker, pending" in log, log[-2000:]
        assert f"shardfs[{new}] INFO replayed" not in log
    wait_for(lambda: status(mnt)["pending"]["chunks"] == 0, 60, "the adopted chunks folded once unlocked")
    import zarr

    got = zarr.open_array(str(src / "a"), mode="r")
    assert np.array_equal(got[4:8, 4:8], EXPECTED[12:16, 12:16])  # 1.1 <- 3.3
    assert np.array_equal(got[20:24, 24:28], EXPECTED[8:12, 8:12])  # 5.6 <- 2.2


_RESIZER = textwrap.dedent(r"""
    import json, sys
    import numpy as np, zarr
    path = sys.argv[1]
    z = zarr.open_array(path, mode="r+")
    z[0:8, 0:8] = z[0:8, 0:8]  # chunks 0.0 .. 1.1 written again: temporaries renamed onto them (aliases)
    before = np.asarray(z[...])  # every other chunk looked up: the kernel holds its inode
    z.resize(60, 60)  # a new layout: a new slot for the array
    print("resized", flush=True)
    sys.stdin.readline()  # (the worker is killed meanwhile)
    after = np.asarray(zarr.open_array(path, mode="r")[...])
    print(json.dumps({"shape": list(after.shape), "equal": bool(np.array_equal(after, before[:60, :60])),
                      "zeros": int((after == 0).sum())}))
""")


def test_a_resize_just_before_the_kill_costs_the_readers_nothing(mount, src):
    """zarr 2.18 rewrites chunks (temporaries renamed onto them), reads the array, resizes it (a
    new layout: a new slot), and the worker is killed at once: the same process reads it back
    right after, through the names the kernel still holds: each the inode of a chunk in the
    old slot, or of an alias of one, which the new worker cannot map (the old slot has no
    array there). ESTALE makes the kernel look those names up again (found by scripts/soak:
    the kept chunks read as the fill value, ENOENT for the aliases and EIO for the others)."""
    mnt = mount(src)
    m = mount.info(mnt)
    p = subprocess.Popen([ZARR2_PYTHON, "-c", _RESIZER, str(mnt / "a")], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "resized\n", p.stderr.read()
        os.kill(worker_of(m), signal.SIGKILL)
        p.stdin.write("\n")
        p.stdin.flush()
        out, err = p.communicate(timeout=120)
    finally:
        p.kill()
        p.wait()
    assert json.loads(out) == {"shape": [60, 60], "equal": True, "zeros": 0}, err[-3000:]
    assert "Traceback" not in m.log_text()


def _journal_dirs(pid: int) -> list[str]:
    """The journal directories process ``pid`` holds (locked: its own and those it adopted)."""
    import re

    return sorted(p for p in open_files(pid) if re.search(r"/journal/\d{20}-\d+$", p))


def test_worker_kills_leave_no_descriptor_behind(mount, src):
    """Four worker kills (one fewer than a crash loop), the first with a chunk pending: the
    supervisor holds as many descriptors after each as before the first, and each new worker
    as many as the one before it, holding only its own journal directory once the dead
    one's was folded (it used to keep every dead worker's directory locked, one fd each, for
    its life: the soak's fds grew by one per worker kill); the journal root holds one."""
    mnt = mount(src)
    m = mount.info(mnt)
    supervisor = sorted(open_files(m.pid))
    (mnt / "a" / "1.1").write_bytes(chunk(mnt, "3.3"))  # journalled, pending at the kill
    counts = []
    for kill in range(4):
        new = kill_worker(m, mnt)
        wait_for(lambda: status(mnt)["pending"]["chunks"] == 0, 60, "the adopted chunk folded")
        wait_for(lambda pid=new: len(_journal_dirs(pid)) == 1, 30,
                 f"kill {kill}: the new worker holds only its own journal directory (holds {_journal_dirs(new)})")
        (own,) = _journal_dirs(new)
        assert os.listdir(os.path.dirname(own)) == [os.path.basename(own)]
        assert len(open_files(m.pid)) == len(supervisor), (kill, sorted(open_files(m.pid)), supervisor)
        counts.append(len(open_files(new)))
    assert counts == [counts[0]] * 4, counts
    assert chunk(mnt, "1.1") == chunk(mnt, "3.3")


def zygotes(m) -> list[int]:
    """The supervisor's children named ``shardfs-zygote``."""
    found = []
    for pid in map(int, Path(f"/proc/{m.pid}/task/{m.pid}/children").read_text().split()):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "shardfs-zygote":
                found.append(pid)
        except OSError:
            pass
    return found


def zygote_of(m) -> int:
    (pid,) = zygotes(m)
    return pid


def test_a_new_worker_is_forked_by_the_zygote_and_an_upgrade_starts_a_new_zygote(mount, src):
    """A worker is forked by the supervisor's zygote (imported, nothing of the source open), not
    started afresh: the same zygote forks the next one after a kill (the worker's command line
    is the zygote's). ``shardfs mount`` on the live mount runs the package installed now: a
    new zygote (a fresh process) forks the new worker, and the old zygote ends."""
    mnt = mount(src)
    m = mount.info(mnt)
    zygote = zygote_of(m)
    argv = Path(f"/proc/{zygote}/cmdline").read_bytes().split(b"\0")
    assert b"--zygote" in argv
    opened = [os.readlink(f"/proc/{zygote}/fd/{fd}") for fd in os.listdir(f"/proc/{zygote}/fd")]
    assert not [p for p in opened if p.startswith(str(src)) or p == "/dev/fuse"], opened
    first = worker_of(m)
    assert Path(f"/proc/{first}/cmdline").read_bytes().split(b"\0") == argv
    new = kill_worker(m, mnt)
    assert zygote_of(m) == zygote
    assert Path(f"/proc/{new}/cmdline").read_bytes().split(b"\0") == argv
    assert chunk(mnt, "1.1") == (mnt / "b" / "1.1").read_bytes()
    r = run_shardfs("mount", str(src), str(mnt), "-o", "chunk_cache=16M")
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    upgraded = zygote_of(m)
    assert upgraded != zygote and not Path(f"/proc/{zygote}").exists()
    assert b"chunk_cache=16M" in Path(f"/proc/{worker_of(m)}/cmdline").read_bytes().split(b"\0")
    assert status(mnt)["options"] == {"chunk_cache": "16M"}


def test_a_spawned_daemon_starts_its_zygote_before_its_own_imports(src, tmp_path):
    """``shardfs mount`` (no -f) names the zygote's command line in the daemon's environment and
    ``python -m shardfs`` starts it first thing (``shardfs.app.early``): the zygote imports while
    the supervisor imports and checks, instead of after (mount to live). The supervisor uses
    that zygote (a fresh ``--zygote`` process, its child, which forks the worker); the variable
    reaches neither the zygote nor the worker (a worker started afresh would start another)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    log = tmp_path / "daemon.log"
    r = run_shardfs("mount", str(src), str(mnt), "-o", "workers=1", "--debug", "--log-file", str(log),
                    timeout=120)  # (one worker: see ``mount`` above)
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    try:
        (supervisor,) = [p for p in daemon_pids(mnt) if b"--ready-fd" in Path(f"/proc/{p}/cmdline").read_bytes()]

        class M:
            pid = supervisor

        zygote = zygote_of(M)
        assert f"zygote {zygote} started before this daemon's imports" in log.read_text(), log.read_text()[-2000:]
        assert b"--zygote" in Path(f"/proc/{zygote}/cmdline").read_bytes().split(b"\0")
        worker = worker_of(M)
        for pid in (zygote, worker):
            assert b"SHARDFS_EARLY_ZYGOTE" not in Path(f"/proc/{pid}/environ").read_bytes()
        assert chunk(mnt, "1.1") == (mnt / "b" / "1.1").read_bytes()
    finally:
        r = run_shardfs("umount", str(mnt), timeout=120)
        assert r.returncode == 0, r.stderr


def test_a_dead_zygote_costs_a_fresh_start_once_then_a_new_zygote_forks(mount, src):
    """The zygote killed (the OOM killer may pick it: it is not protected): the mount goes on;
    the next worker is started afresh (its own command line, ``--worker``), a new zygote is
    started beside it and forks the one after."""
    mnt = mount(src)
    m = mount.info(mnt)
    old = zygote_of(m)
    os.kill(old, signal.SIGKILL)
    wait_for(lambda: not Path(f"/proc/{old}").exists(), 30, "the zygote reaped by the supervisor")
    assert chunk(mnt, "1.1") == (mnt / "b" / "1.1").read_bytes()
    fresh = kill_worker(m, mnt, 120)  # (a fresh interpreter's imports: seconds on a loaded machine)
    assert b"--worker" in Path(f"/proc/{fresh}/cmdline").read_bytes().split(b"\0")
    # it imported zarr-python before it went live, as a zygote does (no request needed it yet)
    maps = Path(f"/proc/{fresh}/maps").read_text().splitlines()
    assert "numcodecs" in {Path(line.split()[-1]).parent.name for line in maps if line.endswith(".so")}
    assert "no worker from the zygote" in m.log_text()
    wait_for(lambda: len(zygotes(m)) == 1 and zygote_of(m) != old, 60, "a new zygote")
    forked = kill_worker(m, mnt, 120)
    assert b"--zygote" in Path(f"/proc/{forked}/cmdline").read_bytes().split(b"\0")
    assert chunk(mnt, "1.1") == (mnt / "b" / "1.1").read_bytes()


def test_a_new_worker_reads_no_array_before_it_serves_and_each_at_its_first_use(mount, tmp_path):
    """The dead worker had read 24 arrays: the next one serves before it reads any of them (on an
    object store that was one ``zarr.json`` GET each, one after the other, before the first
    request), and reads each at its first use: a file of every array opened before the kill
    reads on through its handle, and the inode numbers stay."""
    import zarr

    src = tmp_path / "many"
    g = zarr.open_group(str(src), mode="w")
    names = [f"a{i}" for i in range(24)]
    for i, name in enumerate(names):
        g.create_array(name, shape=(8, 8), chunks=(4, 4), shards=(8, 8), dtype="<i4", fill_value=0)[...] = i + 1
    mnt = mount(src)
    m = mount.info(mnt)
    files = [f"{name}/1.1" for name in names]
    fds = [bounded(os.open, mnt / f, os.O_RDONLY, fd=True) for f in files]
    data = [bounded(os.pread, fd, 1 << 16, 0) for fd in fds]
    inos = bounded(_inodes, mnt, files)
    kill_worker(m, mnt)
    read = status(mnt)["store"]["requests"]
    assert read.get("READ", 0) <= 1, read  # (the root group's zarr.json, for status's probe of the mount)
    try:
        for fd, want in zip(fds, data):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # no pages: a READ on the dead worker's handle
            assert bounded(os.pread, fd, 1 << 16, 0) == want
    finally:
        for fd in fds:
            os.close(fd)
    assert bounded(_inodes, mnt, files) == inos
