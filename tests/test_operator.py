"""What an operator expects of the command line (issue 34): a dead mount (its daemon gone) is
listed as dead by ``shardfs status``, detached by ``shardfs umount`` and cleared by ``shardfs
mount``; a non-empty mountpoint is refused unless ``-o nonempty``; each refusal names its fix.

The mounts are real (``shardfs mount`` daemonizes); a dead mount is made by SIGKILLing the
daemon this test started (by PID), after which the kernel answers ENOTCONN.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest

from conftest import daemon_pids, is_mounted, read_zarr2, run_shardfs, serving_pid, wait_for
from sources import build
from test_fuse_cli import S, env, wait_daemon_gone


@pytest.fixture
def src(tmp_path) -> Path:
    build(tmp_path / "src", [S])
    return tmp_path / "src"


def shardfs(*argv: str):
    return run_shardfs(*argv, env=env())


def expected(src: Path) -> np.ndarray:
    import zarr

    return np.asarray(zarr.open_array(str(src / "s"), mode="r")[...])


def enotconn(mnt: Path) -> bool:
    try:
        os.stat(mnt)
    except OSError as e:
        return e.errno == errno.ENOTCONN
    return False


def kill_daemon(mnt: Path) -> None:
    """SIGKILL the daemon this test started for ``mnt``: the mount is left dead (ENOTCONN)."""
    pids = daemon_pids(mnt)
    assert pids, f"no daemon serves {mnt}"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: enotconn(mnt), 10, f"{mnt} answers ENOTCONN")


def test_dead_mount_is_listed_cleared_by_mount_and_detached_by_umount(src, mnt_dir):
    assert shardfs("mount", str(src), str(mnt_dir)).returncode == 0
    kill_daemon(mnt_dir)
    assert is_mounted(mnt_dir)

    r = shardfs("status", str(mnt_dir))
    assert r.returncode == 0 and r.stdout == (
        f"{mnt_dir}  <-  {src}\n  dead: its daemon is gone (Transport endpoint is not connected); "
        f"shardfs umount {mnt_dir} detaches it, the next mount of the source folds its pending writes\n"), r
    r = shardfs("status", "--json")
    assert r.returncode == 0, r.stderr
    assert {"mountpoint": str(mnt_dir), "source": str(src), "dead": True} in json.loads(r.stdout)

    r = shardfs("mount", str(src), str(mnt_dir))
    assert r.returncode == 0, r.stderr
    assert r.stderr == (f"shardfs: {mnt_dir}: detached a dead shardfs mount of {src} (its daemon was gone); "
                        "its pending writes, if any, are folded by the next mount of that source\n")
    assert os.path.ismount(mnt_dir)
    np.testing.assert_array_equal(read_zarr2(mnt_dir / "s"), expected(src))

    kill_daemon(mnt_dir)
    r = shardfs("umount", str(mnt_dir))
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith(f"shardfs: {mnt_dir}: detached a dead shardfs mount of {src}"), r.stderr
    assert not is_mounted(mnt_dir)
    r = shardfs("umount", str(mnt_dir))
    assert r.returncode == 1 and r.stderr == f"shardfs: error: {mnt_dir}: not mounted\n", r


def test_a_stopped_daemon_is_listed_as_stuck_and_status_returns(src, mnt_dir):
    """A worker that stopped after reading a request leaves every access to its mount in
    uninterruptible sleep: ``status`` says so within its time-outs instead of joining them."""
    assert shardfs("mount", str(src), str(mnt_dir), "-o", "workers=1").returncode == 0  # (N: another one answers)
    worker = serving_pid(mnt_dir)
    os.kill(worker, signal.SIGSTOP)
    try:
        r = shardfs("status", str(mnt_dir))
        assert r.returncode == 0 and r.stdout == (
            f"{mnt_dir}  <-  {src}\n  stuck: its daemon has not answered a request for 2 s (stopped, or stuck: "
            "its log may say why); every access to the mount waits until it answers (kill -CONT a stopped one); "
            f"fusermount3 -u -z {mnt_dir} detaches it\n"), r
        r = shardfs("status", "--json")
        assert r.returncode == 0, r.stderr
        assert {"mountpoint": str(mnt_dir), "source": str(src), "stuck": True} in json.loads(r.stdout)
    finally:
        os.kill(worker, signal.SIGCONT)
    assert json.loads(shardfs("status", str(mnt_dir), "--json").stdout)["worker"]["pid"] == worker
    assert shardfs("umount", str(mnt_dir)).returncode == 0


def test_the_status_probe_of_a_served_mount_counts_no_error(src, mnt_dir):
    """``shardfs status`` looks up a name never asked before in each mount whose status socket is
    silent for a moment (``mounts.unserved``: any other test's ``status`` may probe this mount):
    a mount that answers it counts no error for it; a lookup of another missing name is counted."""
    from shardfs.app.mounts import unserved

    assert shardfs("mount", str(src), str(mnt_dir)).returncode == 0
    assert unserved(str(mnt_dir)) is None and unserved(str(mnt_dir)) is None
    assert not (mnt_dir / "missing").exists()
    assert json.loads(shardfs("status", str(mnt_dir), "--json").stdout)["errors"] == {"ENOENT": {"lookup": 1}}
    assert shardfs("umount", str(mnt_dir)).returncode == 0


def test_non_empty_mountpoint_is_refused_unless_nonempty(src, mnt_dir):
    (mnt_dir / "kept.txt").write_text("mine")
    r = shardfs("mount", str(src), str(mnt_dir))
    assert r.returncode == 1 and r.stderr == (
        f"shardfs: error: {mnt_dir}: mountpoint is not empty (the mount would hide its files): "
        "empty it, or mount over it with -o nonempty\n"), r
    assert not is_mounted(mnt_dir) and daemon_pids(mnt_dir) == []

    r = shardfs("mount", str(src), str(mnt_dir), "-o", "nonempty")
    assert r.returncode == 0, r.stderr
    assert os.path.ismount(mnt_dir) and not (mnt_dir / "kept.txt").exists()
    np.testing.assert_array_equal(read_zarr2(mnt_dir / "s"), expected(src))

    other = src.parent / "other"  # the same source again would hand the mount over (SEMANTICS, "Restarts")
    shutil.copytree(src, other)
    r = shardfs("mount", str(other), str(mnt_dir), "-o", "nonempty")
    assert r.returncode == 1 and r.stderr == (
        f"shardfs: error: {mnt_dir}: already a mountpoint: unmount it first (shardfs umount {mnt_dir})\n"), r
    assert shardfs("umount", str(mnt_dir)).returncode == 0
    wait_daemon_gone(mnt_dir)
    assert (mnt_dir / "kept.txt").read_text() == "mine"


def test_status_says_rates_and_singulars(src, mount):
    """``status`` labels cache hit rates as rates and counts in the singular when one."""
    mnt = mount(src)
    with open(mnt / "s" / "0.0", "rb") as f:
        data = f.read()
    lines: list[str] = []

    def counted() -> bool:  # (another worker's counts are those of up to a second before: SEMANTICS#workers)
        r = shardfs("status", str(mnt))
        assert r.returncode == 0, r.stderr
        lines[:] = r.stdout.splitlines()
        return f"  reads     1 chunk file opened, {len(data)} B read" in lines

    wait_for(counted, 10, "the read counted by shardfs status")
    caches = next(line for line in lines if line.startswith("  caches    "))
    assert caches.startswith("  caches    index hit rate ") and " lookup" in caches and " of 64.0 MiB" in caches, caches
    assert "; chunk " in caches
