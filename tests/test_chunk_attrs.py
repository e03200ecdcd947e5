"""What ``stat`` shows for chunk files (README "What the mount shows"): a regular file with
mode 0644 (0444 on a read-only mount) and ``st_nlink`` the number of directories that list
it: 2 for a sharded array (the array root and the shard directory), 1 for an unsharded
array; the same while the file is open for writing, just created, or committed.
"""

from __future__ import annotations

import json
import os
import stat

import numpy as np
import pytest
import zarr

REGULAR_RW = stat.S_IFREG | 0o644
REGULAR_RO = stat.S_IFREG | 0o444
# array name -> (chunk file names at the array root, their names in a shard directory, nlink)
ARRAYS = {
    "sharded": ({"0.0"}, {"c/0/0/0.0"}, 2),
    "unsharded": ({"0.0"}, set(), 1),
}


@pytest.fixture
def source(tmp_path):
    """A group with one sharded and one unsharded (8, 8) int32 array; only chunk (0, 0) stored."""
    src = tmp_path / "src"
    group = zarr.open_group(str(src), mode="w", zarr_format=3)
    data = np.zeros((8, 8), dtype="<i4")
    data[:4, :4] = np.arange(16, dtype="<i4").reshape(4, 4) + 1
    for name in ARRAYS:
        shards = (8, 8) if name == "sharded" else None
        arr = group.create_array(name, shape=(8, 8), chunks=(4, 4), shards=shards, dtype="<i4", fill_value=0)
        arr[...] = data
    return src


def assert_chunk_attrs(st: os.stat_result, mode: int, nlink: int, size: int | None = None) -> None:
    assert (st.st_mode, st.st_nlink) == (mode, nlink)
    if size is not None:
        assert st.st_size == size


@pytest.mark.parametrize("name", sorted(ARRAYS))
def test_chunk_file_mode_and_nlink_read_write_mount(name, source, mount):
    mnt = mount(source)
    root_names, shard_names, nlink = ARRAYS[name]
    arr = mnt / name
    listed = {n for n in os.listdir(arr) if not n.startswith(".")}
    assert listed == root_names  # shard directories are not listed at the array root (copies)
    if shard_names:
        assert os.listdir(arr / "c" / "0" / "0") == ["0.0"]
    stored = (arr / "0.0").read_bytes()
    for n in root_names | shard_names:
        assert_chunk_attrs(os.stat(arr / n), REGULAR_RW, nlink, len(stored))
    if shard_names:
        assert os.stat(arr / "c/0/0/0.0").st_ino == os.stat(arr / "0.0").st_ino

    # an existing chunk open for writing, before and after a (dirty, uncommitted) write
    with open(arr / "0.0", "r+b") as f:
        assert_chunk_attrs(os.fstat(f.fileno()), REGULAR_RW, nlink, len(stored))
        f.write(stored)
        f.flush()
        assert_chunk_attrs(os.fstat(f.fileno()), REGULAR_RW, nlink, len(stored))

    # a new chunk: just created (empty), written but not committed, committed
    with open(arr / "0.1", "wb") as f:
        assert_chunk_attrs(os.fstat(f.fileno()), REGULAR_RW, nlink, 0)
        f.write(stored)
        f.flush()
        assert_chunk_attrs(os.fstat(f.fileno()), REGULAR_RW, nlink, len(stored))
    assert_chunk_attrs(os.stat(arr / "0.1"), REGULAR_RW, nlink, len(stored))
    if shard_names:
        assert_chunk_attrs(os.stat(arr / "c/0/0/0.1"), REGULAR_RW, nlink, len(stored))
    assert (arr / "0.1").read_bytes() == stored


@pytest.mark.parametrize("name", sorted(ARRAYS))
def test_chunk_file_mode_and_nlink_read_only_mount(name, source, mount):
    mnt = mount(source, "--read-only")
    root_names, shard_names, nlink = ARRAYS[name]
    size = len((mnt / name / "0.0").read_bytes())
    if name == "unsharded":
        assert size == os.stat(source / name / "c/0/0").st_size
    for n in root_names | shard_names:
        assert_chunk_attrs(os.stat(mnt / name / n), REGULAR_RO, nlink, size)


@pytest.mark.parametrize("name", sorted(ARRAYS))
def test_names_with_non_ascii_digits_do_not_exist(name, source, mount):
    """Only ASCII decimal coordinates name chunks: "0.²" ("²".isdigit() is true, int("²")
    raises) and "0.٣" (int("٣") == 3) are ENOENT, not EIO, and leave no traceback in the log."""
    mnt = mount(source)
    names = ["0.²", "0.٣", "٠.0"] + (["c/0/0/0.²", "c/0/0/0.٣"] if name == "sharded" else [])
    for n in names:
        with pytest.raises(FileNotFoundError):
            os.stat(mnt / name / n)


def test_mkdir_with_non_ascii_digit_names_is_eperm(tmp_path, mount):
    """In an array whose v2 keys nest ("/"), ``mkdir`` of a key directory takes only ASCII
    decimal coordinates: "²" and "٣" are EPERM with one log line, not EIO with a traceback."""
    src = tmp_path / "src"
    group = zarr.open_group(str(src), mode="w", zarr_format=3)
    arr = group.create_array("v2dot", shape=(8, 8), chunks=(4, 4), shards=(8, 8), dtype="<i4", fill_value=0,
                             chunk_key_encoding={"name": "v2", "separator": "."})
    arr[:4, :4] = 1
    mnt = mount(src)
    assert json.loads((mnt / "v2dot" / ".zarray").read_bytes())["dimension_separator"] == "/"
    for name in ("²", "٣"):
        with pytest.raises(PermissionError):
            os.mkdir(mnt / "v2dot" / name)
    assert sorted(os.listdir(mnt / "v2dot")) == [".zarray", ".zattrs", "0"]
