"""A bad ``zarr.json`` hides its one node (issue 12, item 5).

Deeply nested JSON, a file over the 16 MiB cap, invalid UTF-8, a directory or a
FIFO as ``zarr.json``: the node is a directory without metadata or entries, its
reason is logged once per version of the file and shown by ``shardfs inspect``,
its parent group always lists, and the FIFO is never opened. What the tree shows and logs
is checked in-process (``tests/inproc.py``: the filesystem the kernel adapter calls, no
mount); ``inspect`` through a mount and the refused mount of a bad root on real mounts.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import time
from pathlib import Path

import pytest

from conftest import assert_same_array, read_native, run_shardfs, zarr2
from inproc import InProcess
from writers import umount
from sources import Spec, build

s = slice
GOOD = Spec("good", (8, 10), (4, 5), (8, 10), "<i4", 0, ("zstd", 3), inner_crc=False,
            index_location="end", index_crc=True, initial=((s(0, 8), s(0, 10)),), write=())
DEEP = b'{"zarr_format": 3, "node_type": "group", "attributes": {"x": ' + b"[" * 5000 + b"]" * 5000 + b"}}"
DEEPISH = b'{"zarr_format": 3, "node_type": "group", "attributes": {"x": ' + b"[" * 150 + b"]" * 150 + b"}}"
GROUP = json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {"fixed": True}}).encode()
REASONS = {
    "deep": "nests deeper than the 100 levels allowed",
    "huge": "more than the 16 MiB allowed",
    "latin1": "not UTF-8",
    "dirjson": "zarr.json: not a regular file (a directory)",
    "fifo": "zarr.json: not a regular file (a FIFO)",
}


@pytest.fixture
def src(tmp_path) -> Path:
    src = tmp_path / "src"
    build(src, [GOOD])
    for name in REASONS:
        (src / name).mkdir()
    (src / "deep" / "zarr.json").write_bytes(DEEP)
    (src / "huge" / "zarr.json").write_bytes(GROUP[:-1] + b" " * (16 << 20) + b"}")
    (src / "latin1" / "zarr.json").write_bytes(GROUP.replace(b"fixed", b"fix\xe9d"))
    (src / "dirjson" / "zarr.json").mkdir()
    os.mkfifo(src / "fifo" / "zarr.json")
    return src


def hidden_lines(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if f"/{name}: not shown as v2:" in r.getMessage()]


def assert_no_reader(fifo: Path) -> None:
    """Nothing holds ``fifo`` open for reading (a non-blocking open for writing fails)."""
    with pytest.raises(OSError) as e:
        os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    assert e.value.errno == errno.ENXIO


def test_bad_zarr_json_hides_one_node(src, tmp_path, caplog):
    """In-process (``tests/inproc.py``): each round lists the root and looks up every entry
    (``ls -la``); zarr 2.18 reads a copy of the tree's files."""
    caplog.set_level(logging.INFO, logger="shardfs")
    with InProcess(src, read_only=False) as fs:
        for _ in range(5):
            listed = (fs / "").iterdir()
            for name in listed:
                (fs / name).stat()
            assert sorted(listed) == sorted([".zgroup", ".zattrs", ".zmetadata", "good", *REASONS])
            for name in REASONS:
                assert (fs / name).is_dir()
                assert (fs / name).iterdir() == []
                for meta in (".zgroup", ".zarray", ".zattrs"):
                    assert not (fs / name / meta).exists()
        for name, reason in REASONS.items():
            lines = hidden_lines(caplog, name)
            assert len(lines) == 1 and reason in lines[0], (name, lines)
        assert_no_reader(src / "fifo" / "zarr.json")
        copy = (fs / "").copy_to(tmp_path / "copy")
    # zarr 2.18 sees the good array and no other node.
    got = zarr2("""
        g = zarr.open_group(path, mode='r')
        result = {"arrays": sorted(g.array_keys()), "groups": sorted(g.group_keys()), "good": g["good"][...]}
        """, path=str(copy))
    assert got["arrays"] == ["good"] and got["groups"] == []
    assert_same_array(got["good"], read_native(src / "good"))


def test_reason_is_logged_again_only_for_a_new_version(src, caplog):
    """In-process, with no listing kept (a mount's ``-o entry_timeout=0``)."""
    caplog.set_level(logging.INFO, logger="shardfs")
    with InProcess(src, read_only=False, list_ttl=0) as fs:
        (fs / "").iterdir()
        (src / "deep" / "zarr.json").write_bytes(DEEPISH)  # another bad version
        os.utime(src / "deep" / "zarr.json", ns=(1, 1))
        time.sleep(1.2)  # the source's remembered stat expires
        for _ in range(3):
            (fs / "").iterdir()
            (fs / "deep").stat()
        lines = hidden_lines(caplog, "deep")
        assert len(lines) == 2 and "nests 152 levels deep" in lines[1], lines
        (src / "deep" / "zarr.json").write_bytes(GROUP)  # fixed: the group appears
        time.sleep(1.2)
        assert json.loads((fs / "deep" / ".zattrs").read_text()) == {"fixed": True}
        assert len(hidden_lines(caplog, "deep")) == 2


@pytest.mark.parametrize("name", sorted(REASONS))
def test_inspect_shows_the_reason(name, src, mount):
    mnt = mount(src)
    os.listdir(mnt)
    r = run_shardfs("inspect", str(mnt / name), "--json", timeout=30)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["presentable"] is False and REASONS[name] in report["reason"], report
    assert report["array"] == str(src / name)
    r = run_shardfs("inspect", str(mnt / name), timeout=30)
    assert r.returncode == 0 and "not shown: " in r.stdout and REASONS[name] in r.stdout, r.stdout
    assert_no_reader(src / "fifo" / "zarr.json")
    umount(mount, mnt)


@pytest.mark.parametrize("name", ["deep", "fifo", "dirjson"])
def test_a_bad_root_zarr_json_is_refused_in_one_line(name, src, tmp_path):
    mnt = tmp_path / "mnt"
    r = run_shardfs("mount", str(src / name), str(mnt), timeout=30)
    assert r.returncode == 1 and REASONS[name] in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    assert not os.path.ismount(mnt)
