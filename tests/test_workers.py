"""``-o workers=N``: N worker processes serve one read-only mount, each on its own clone of the
kernel connection (doc/ARCHITECTURE.md, "Workers").

Which worker gets a request is the kernel's choice; a test makes it one worker's by stopping the
others (SIGSTOP: a stopped process reads nothing, so the running one gets every request) and
resumes them afterwards. Kills are SIGKILL by PID.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from conftest import ZARR2_PYTHON, run_shardfs, wait_for
from test_restart import CHUNKS, EXPECTED, READER, SHAPE, SHARDS, status

pytestmark = pytest.mark.skipif(
    "workers" not in __import__("importlib.metadata").metadata.version("pyfuse3"),
    reason="needs the pyfuse3 scripts/pyfuse3 builds (non-blocking reads of clones)")

NO_CACHE = "entry_timeout=0,attr_timeout=0"  # every stat is a LOOKUP: it reaches a worker


@pytest.fixture
def src(tmp_path) -> Path:
    import zarr

    root = tmp_path / "src"
    g = zarr.open_group(str(root), mode="w")
    for name in ("a", "b"):
        a = g.create_array(name, shape=SHAPE, chunks=CHUNKS, shards=SHARDS, dtype="<i4", fill_value=0)
        a[...] = EXPECTED
    return root


def workers(mnt: Path, n: int) -> list[int]:
    """The pids of the mount's ``n`` workers, by slot, once all serve."""
    found: list[int] = []

    def listed() -> bool:
        doc = status(mnt)
        found[:] = [w["pid"] for w in sorted(doc.get("workers", []), key=lambda w: w["index"])]
        return len(found) == n and all(w["cpu_s"] > 0 for w in doc["workers"])

    wait_for(listed, 30, f"{n} workers listed by shardfs status")
    return found


@contextlib.contextmanager
def only(pid: int, all_pids: list[int]) -> Iterator[None]:
    """Every request meanwhile reaches worker ``pid``: the others are stopped."""
    others = [p for p in all_pids if p != pid]
    for p in others:
        os.kill(p, signal.SIGSTOP)
    try:
        yield
    finally:
        for p in others:
            os.kill(p, signal.SIGCONT)


def zarr2_read_all(mnt: Path) -> None:
    code = ("import sys, zarr, numpy as np\n"
            "want = np.arange(1, 64 * 64 + 1, dtype='<i4').reshape(64, 64)\n"
            "for name in 'ab':\n"
            "    assert np.array_equal(zarr.open(sys.argv[1] + '/' + name, mode='r')[...], want), name\n")
    r = subprocess.run([ZARR2_PYTHON, "-c", code, str(mnt)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_n_workers_serve_one_mount_and_status_shows_each(mount, src):
    mnt = mount(src, "-o", "ro,workers=2")
    pids = workers(mnt, 2)
    assert len(set(pids)) == 2
    zarr2_read_all(mnt)
    doc = status(mnt)
    assert doc["internal_errors"]["total"] == 0
    assert doc["rss_bytes"] == sum(w["rss_bytes"] for w in doc["workers"])
    text = run_shardfs("status", str(mnt)).stdout
    assert f"0: pid {pids[0]}" in text and f"1: pid {pids[1]}" in text


def test_a_writable_mount_refuses_more_than_one_worker(tmp_path, src):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = run_shardfs("mount", str(src), str(mnt), "-o", "workers=2")
    assert r.returncode != 0
    assert r.stderr.strip().splitlines() == [
        "shardfs: error: -o workers=2: more than one worker serves read-only mounts only for now (-o ro): a writable "
        "mount is served by one worker"]
    assert not os.path.ismount(mnt)


def test_a_handle_is_read_and_released_by_another_worker_than_the_one_that_opened_it(mount, src):
    mnt = mount(src, "-o", "ro,workers=2")
    w0, w1 = workers(mnt, 2)
    with only(w1, [w0, w1]):
        want = (mnt / "a" / "1.2").read_bytes()
    time.sleep(1.0)  # (w0 follows w1's release meanwhile)

    def held(pid: int) -> int:
        with only(pid, [w0, w1]):  # (the status socket is answered by the running worker)
            doc = status(mnt)
        assert doc["workers"][[w["pid"] for w in doc["workers"]].index(pid)]["this"]
        return doc["open_handles"]

    assert held(w0) == held(w1) == 0
    with only(w0, [w0, w1]):
        f = open(mnt / "a" / "1.2", "rb")  # w0 opens it ...
    assert held(w0) == 1
    with only(w1, [w0, w1]):
        got = f.read()  # ... w1 reads it (opening it again at the same version) ...
        assert held(w1) == 1
        f.close()  # ... and releases it
        assert held(w1) == 0
    assert got == want and len(want) > 0
    # w0 lets go of the handle once it sees the release in the shared ledger
    wait_for(lambda: held(w0) == 0, 10, "the opening worker letting go of a handle another released")
    assert status(mnt)["internal_errors"]["total"] == 0


def test_a_handle_of_another_worker_never_reads_another_version(mount, src):
    import zarr

    mnt = mount(src, "-o", "ro,workers=2," + NO_CACHE)
    w0, w1 = workers(mnt, 2)
    with only(w0, [w0, w1]):
        f = open(mnt / "a" / "0.0", "rb")
    old = (src / "a" / "c" / "0" / "0").read_bytes()
    zarr.open_array(str(src / "a"), mode="r+")[0:16, 0:16] = -np.ones((16, 16), dtype="<i4")
    os.utime(src / "a" / "c" / "0" / "0", ns=(1, 1))  # (a new version, whatever the clock's resolution)
    assert (src / "a" / "c" / "0" / "0").read_bytes() != old
    with only(w1, [w0, w1]):
        try:
            got = f.read()
        except OSError as e:
            assert e.errno == errno.EIO  # another version's bytes: never served
        else:
            pytest.fail(f"a handle opened by another worker read the file's next version: {got!r}")
        finally:
            f.close()


def test_numbers_mean_the_same_in_every_worker(mount, src):
    mnt = mount(src, "-o", "ro,workers=2," + NO_CACHE)
    w0, w1 = workers(mnt, 2)
    names = ["a", "a/.zarray", "a/0.0", "a/3.15", "b", "b/.zattrs", "b/7.7"]
    with only(w0, [w0, w1]):
        first = {n: os.stat(mnt / n).st_ino for n in names[:4]}
    with only(w1, [w0, w1]):
        first.update({n: os.stat(mnt / n).st_ino for n in names[4:]})  # b: w1 gives its numbers first
        again = {n: os.stat(mnt / n).st_ino for n in names}
    with only(w0, [w0, w1]):
        third = {n: os.stat(mnt / n).st_ino for n in names}
    assert first == again == third
    assert len(set(first.values())) == len(names)
    zarr2_read_all(mnt)


def test_numbers_given_at_once_by_two_workers_never_collide(mount, tmp_path):
    """Both workers running, 8 threads look up the metadata files and chunks of 24 arrays at once
    (each lookup a new number, given by whichever worker gets it): every name keeps one inode
    whichever worker answers later, and no two names share one."""
    import concurrent.futures

    import zarr

    root = tmp_path / "many"
    g = zarr.open_group(str(root), mode="w")
    for i in range(24):
        a = g.create_array(f"x{i}", shape=(4, 4), chunks=(2, 2), shards=(4, 4), dtype="<i4", fill_value=0)
        a[...] = i + 1
    mnt = mount(root, "-o", "ro,workers=2," + NO_CACHE)
    workers(mnt, 2)
    dirs = [f"x{i}" for i in range(24)]
    names = [f"x{i}/{leaf}" for i in range(24) for leaf in (".zarray", ".zattrs", "0.0", "1.1")]
    first = {n: os.stat(mnt / n).st_ino for n in dirs}  # (the arrays' slots given out first)
    time.sleep(1.5)  # (both workers followed them)
    names += dirs
    with concurrent.futures.ThreadPoolExecutor(8) as pool:  # metadata inodes given out at once by both
        first.update(zip(names, pool.map(lambda n: os.stat(mnt / n).st_ino, names)))
        for _ in range(3):
            again = dict(zip(names, pool.map(lambda n: os.stat(mnt / n).st_ino, names)))
            assert again == first
    assert len(set(first.values())) == len(names)


def test_a_forget_on_another_worker(mount, src):
    mnt = mount(src, "-o", "ro,workers=2")
    w0, w1 = workers(mnt, 2)
    names = ["a", "a/.zarray", "a/0.0", "a/5.5", "b", "b/.zarray"]
    with only(w0, [w0, w1]):
        inos = {n: os.stat(mnt / n).st_ino for n in names}
        files = [open(mnt / n, "rb") for n in ("a/5.5", "b/.zarray")]  # the kernel keeps these inodes
    with only(w1, [w0, w1]):
        for _ in range(3):  # (a dentry looked at since the last pass is kept one pass more)
            Path("/proc/sys/vm/drop_caches").write_text("2")  # the kernel forgets the others: FORGET reaches w1
        time.sleep(0.5)
        assert [f.read() for f in files] == [(mnt / n).read_bytes() for n in ("a/5.5", "b/.zarray")]
        assert {n: os.stat(mnt / n).st_ino for n in names} == inos
    for f in files:
        f.close()
    with only(w0, [w0, w1]):
        assert {n: os.stat(mnt / n).st_ino for n in names} == inos
    zarr2_read_all(mnt)
    assert status(mnt)["internal_errors"]["total"] == 0


def test_a_request_a_dead_worker_read_is_answered_by_another(mount, src):
    """Slot 0's first worker never answers a lookup of ``.zattrs`` (a test hook): killed with that
    request read, its slot's device file (kept by the supervisor) still holds the request, which
    the kernel sends again (RESEND) to a live worker: the client's stat succeeds."""
    import threading

    mnt = mount(src, "-o", "ro,workers=2," + NO_CACHE, env={"SHARDFS_TEST_HANG": ".zattrs"})
    w0, w1 = workers(mnt, 2)
    got: list[object] = []
    os.kill(w1, signal.SIGSTOP)
    try:
        def client() -> None:
            try:
                got.append(os.stat(mnt / "a" / ".zattrs").st_size)
            except OSError as e:
                got.append(e)

        t = threading.Thread(target=client, daemon=True)
        t.start()
        time.sleep(1.0)
        assert t.is_alive() and not got  # w0 read the lookup and does not answer it
        os.kill(w0, signal.SIGKILL)
    finally:
        os.kill(w1, signal.SIGCONT)
    t.join(30)
    assert len(got) == 1 and isinstance(got[0], int) and got[0] > 0, got


def test_a_worker_killed_under_load_costs_no_reader_anything(mount, src, tmp_path):
    """Three zarr 2.18 readers; each worker is SIGKILLed in turn: the dead one's requests and
    (FUSE_NOTIFY_RESEND resends every worker's) the live one's are answered again, twice for
    some: no error, no fill value, no wrong byte."""
    mnt = mount(src, "-o", "ro,workers=2")
    pids = workers(mnt, 2)
    stop = tmp_path / "stop"
    readers = [subprocess.Popen([ZARR2_PYTHON, "-c", READER, str(mnt / "a"), str(stop), str(i)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(3)]
    seen = set(pids)

    def replaced() -> bool:
        doc = status(mnt)
        now = [w["pid"] for w in sorted(doc.get("workers", []), key=lambda w: w["index"])]
        if len(now) != 2 or len(set(now) - seen) != 1 or not all(w["cpu_s"] > 0 for w in doc["workers"]):
            return False
        pids[:] = now
        return True

    try:
        time.sleep(1.0)
        for slot in (0, 1, 0):
            os.kill(pids[slot], signal.SIGKILL)
            wait_for(replaced, 30, "a new worker in the slot")
            seen.update(pids)
            time.sleep(0.7)
    finally:
        stop.touch()
        outs = [r.communicate(timeout=120) for r in readers]
    counts = [json.loads(out.strip().splitlines()[-1]) for out, _err in outs]
    assert all(c["reads"] > 0 for c in counts), counts
    assert [c["errors"] for c in counts] == [[], [], []]
    assert [(c["wrong"], c["fill"]) for c in counts] == [(0, 0)] * 3
    assert len(seen) == 5
    assert mount.info(mnt).log_text().count("starting another on the same connection") == 3
    assert status(mnt)["internal_errors"]["total"] == 0
