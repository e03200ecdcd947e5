"""Moves and overwrites through the mount, as a v2 store allows them (issue 35).

- ``rename(2)`` of an array or group directory (``mv``, zarr 2.18 ``Group.move``): on a
  local source one atomic rename in the source (pending chunks folded first); on an object
  store EXDEV, so ``mv`` copies and deletes, as across filesystems.
- replacing an array (``g["foo"] = data``: ``rm -r``, then a new ``.zarray`` at the same path)
  with another shape, dtype, chunks or ``dimension_separator``: works at once, and nothing of
  the old array is visible in the new one.

Each compares with zarr-python 3 (and tensorstore) reading the source natively after
``shardfs umount`` (or, in-process with ``tests/inproc.py``, after the tree is closed).
"""

from __future__ import annotations

import errno
import json
import os
import subprocess

import numpy as np
import pytest

from conftest import zarr2
from inproc import InProcess
from sources import build
from test_structure import rm_r
from writers import umount


def errors(mount, mnt) -> list[str]:
    return [line for line in mount.info(mnt).log_text().splitlines() if " ERROR " in line]


MAKE = """
g = zarr.open_group(root, mode='a')
a = g.create_dataset('a', shape=(6, 8), chunks=(2, 4), dtype='<i4', fill_value=0)
a[...] = np.arange(48).reshape(6, 8)
h = g.create_group('g')
h.attrs['k'] = 1
h.create_dataset('b', shape=(5,), chunks=(2,), dtype='<f8')[...] = np.arange(5) / 2
result = {'a': a[...]}
"""


def test_mv_of_an_array_and_group_move(tmp_path, mount, source):
    """``mv`` of an array into a group and zarr 2.18 ``Group.move`` of a group: the data is at
    the new paths at once (also through names the kernel looked up before the move), the old
    paths are gone; on a local source each is one rename in the source (the shard files keep
    their inodes), on an object store rename(2) is EXDEV and ``mv`` copies and deletes."""
    build(tmp_path / "src", [])
    src = source(tmp_path / "src")
    mnt = src.mount(mount)
    zarr2(MAKE, root=str(mnt))
    before = os.stat(mnt / "a" / "0.0")  # the kernel holds this name (and its inode) now
    a = np.arange(48, dtype="<i4").reshape(6, 8)
    if src.kind == "local":
        shard_ino = os.stat(tmp_path / "src" / "a" / "c" / "0" / "0").st_ino
    else:
        with pytest.raises(OSError) as e:
            os.rename(mnt / "a", mnt / "g" / "moved")
        assert e.value.errno == errno.EXDEV
    r = subprocess.run(["mv", str(mnt / "a"), str(mnt / "g" / "moved")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert not (mnt / "a").exists()
    assert {".zarray", "0.0", "2.1"} <= set(os.listdir(mnt / "g" / "moved"))
    assert os.stat(mnt / "g" / "moved" / "0.0").st_size == before.st_size
    if src.kind == "local":
        assert os.stat(tmp_path / "src" / "g" / "moved" / "c" / "0" / "0").st_ino == shard_ino  # renamed, not copied
    got = zarr2("""
        g = zarr.open_group(root, mode='a')
        out = {'moved': g['g/moved'][...]}
        try:
            g.move('g', 'h')
            out['h/b'] = g['h/b'][...]
            out['h/moved'] = g['h/moved'][...]
            out['keys'] = sorted(g.group_keys())
            out['attrs'] = dict(g['h'].attrs)
        except OSError as e:
            out['move'] = e.errno
        result = out
        """, root=str(mnt))
    np.testing.assert_array_equal(got["moved"], a)
    if src.kind == "local":
        np.testing.assert_array_equal(got["h/b"], np.arange(5) / 2)
        np.testing.assert_array_equal(got["h/moved"], a)
        assert got["keys"] == ["h"] and got["attrs"] == {"k": 1}
        assert errors(mount, mnt) == []
    else:
        assert got["move"] == errno.EXDEV  # os.renames of the group: an object store cannot
    umount(mount, mnt)
    group = "h" if src.kind == "local" else "g"
    src.assert_equals(f"{group}/moved", a)
    src.assert_equals(f"{group}/b", np.arange(5) / 2)
    assert not src.exists("a/zarr.json")
    assert src.leftovers() == []


def test_a_move_folds_pending_chunks_first(tmp_path):
    """Chunks written just before the move (still pending) land in the moved array's shards,
    and nothing is written at the old path afterwards. In-process (``tests/inproc.py``): the
    array made and written as zarr 2.18 does, without a compressor."""
    src = tmp_path / "src"
    build(src, [])
    zarray = {"zarr_format": 2, "shape": [8], "chunks": [2], "dtype": "<u2", "order": "C", "compressor": None,
              "filters": None, "fill_value": 0}
    with InProcess(src, read_only=False) as fs:
        (fs / "a").mkdir()
        (fs / "a" / ".zarray").write_text(json.dumps(zarray))
        for i in range(2):  # half of the array's one shard: pending until the mount is idle
            (fs / "a" / str(i)).write_bytes((np.arange(2 * i, 2 * i + 2, dtype="<u2") + 1).tobytes())
        (fs / "a").replace(fs / "b")
        (fs / "b" / "3").write_bytes(np.array([0, 100], "<u2").tobytes())
        got = b"".join((fs / "b" / str(i)).read_bytes() if (fs / "b" / str(i)).exists() else bytes(4)
                       for i in range(4))
        assert not (fs / "a").exists()
    np.testing.assert_array_equal(np.frombuffer(got, "<u2"), [1, 2, 3, 4, 0, 0, 0, 100])
    from conftest import read_native

    np.testing.assert_array_equal(read_native(src / "b"), [1, 2, 3, 4, 0, 0, 0, 100])
    assert not (src / "a").exists()


OVERWRITE = """
import os
out = {}
first = zarr.storage.NestedDirectoryStore(root) if first_sep == '/' else zarr.storage.DirectoryStore(root)
then = zarr.storage.NestedDirectoryStore(root) if first_sep == '.' else zarr.storage.DirectoryStore(root)
g = zarr.open_group(first, mode='a')
g.create_dataset('foo', shape=(6, 6), chunks=(3, 3), dtype='<i4', fill_value=-1)[...] = 7
out['before'] = sorted(os.listdir(root + '/foo'))
g = zarr.open_group(then, mode='a')
g['foo'] = np.arange(10, dtype='>f8')  # rm -r, then a new .zarray at the same path
out['after'] = g['foo'][...]
out['listed'] = sorted(os.listdir(root + '/foo'))
out['zarray'] = json.load(open(root + '/foo/.zarray'))
result = out
"""


@pytest.mark.parametrize("first_sep", ["/", "."])
def test_overwrite_with_another_separator_shape_dtype_and_chunks(first_sep, tmp_path, mount, source):
    """``g["foo"] = data`` over an array of another separator, shape, dtype and chunks: the new
    array at once, nothing of the old one (no old chunk file or key directory listed)."""
    build(tmp_path / "src", [])
    src = source(tmp_path / "src")
    mnt = src.mount(mount)
    got = zarr2(OVERWRITE, root=str(mnt), first_sep=first_sep)
    assert got["before"] == ([".zarray", "0", "1"] if first_sep == "/" else [".zarray", "0.0", "0.1", "1.0", "1.1"])
    np.testing.assert_array_equal(got["after"], np.arange(10, dtype=">f8"))
    assert got["listed"] == [".zarray", "0"]
    z = got["zarray"]
    assert (z["shape"], z["chunks"], z["dtype"], z.get("dimension_separator")) == \
        ([10], [10], ">f8", None if first_sep == "/" else "/")  # DirectoryStore writes none: shown as written
    assert errors(mount, mnt) == []
    umount(mount, mnt)
    src.assert_equals("foo", np.arange(10, dtype=">f8"))
    assert src.leftovers() == []


def test_overwrite_by_rm_r_and_a_new_zarray_in_place(tmp_path):
    """The shell's way: ``rm -r`` of an array, ``mkdir``, then a ``.zarray`` of another dtype
    written in place: a new array, with none of the old chunks. In-process (``tests/inproc.py``)."""
    src = tmp_path / "src"
    build(src, [])
    with InProcess(src, read_only=False) as fs:
        (fs / "x").mkdir()
        (fs / "x" / ".zarray").write_text(json.dumps(
            {"zarr_format": 2, "shape": [4], "chunks": [2], "dtype": "<i8", "order": "C", "compressor": None,
             "filters": None, "fill_value": 0}))
        for i in range(2):
            (fs / "x" / str(i)).write_bytes(np.full(2, 5, "<i8").tobytes())
        rm_r(fs / "x")
        (fs / "x").mkdir()
        zarray = {"zarr_format": 2, "shape": [3], "chunks": [3], "dtype": "|u1", "order": "C", "compressor": None,
                  "filters": None, "fill_value": 9, "dimension_separator": "/"}
        (fs / "x" / ".zarray").write_text(json.dumps(zarray))
        assert sorted((fs / "x").iterdir()) == [".zarray"]
        assert not (fs / "x" / "0").exists()  # a fill-only chunk: not stored, not shown
    from conftest import read_native

    np.testing.assert_array_equal(read_native(src / "x"), [9, 9, 9])
