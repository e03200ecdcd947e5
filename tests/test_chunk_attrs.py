"""What ``stat`` shows for chunk files (SEMANTICS "attributes"): a regular file with mode
0644 (0444 on a read-only mount) and ``st_nlink`` the number of directories that list it:
2 for a sharded array (the array root and the shard directory), 1 for an unsharded array;
the same while the file is open for writing, just created, or committed.

In-process (``tests/inproc.py``: the tree and ``Writer`` the kernel adapter calls, no
mount): these are the filesystem's answers, not the kernel's.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import numpy as np
import pytest
import zarr

from inproc import InProcess

REGULAR_RW = stat.S_IFREG | 0o644
REGULAR_RO = stat.S_IFREG | 0o444
# array name -> (chunk file names at the array root, their names in a shard directory, nlink)
ARRAYS = {
    "sharded": ({"0.0"}, {"c/0/0/0.0"}, 2),
    "unsharded": ({"0.0"}, set(), 1),
}


@pytest.fixture
def source(tmp_path) -> Path:
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


def assert_chunk_attrs(st, mode: int, nlink: int, size: int | None = None) -> None:
    assert (st.st_mode, st.st_nlink) == (mode, nlink)
    if size is not None:
        assert st.st_size == size


@pytest.mark.parametrize("name", sorted(ARRAYS))
def test_chunk_file_mode_and_nlink_read_write_mount(name, source):
    with InProcess(source, read_only=False) as fs:
        root_names, shard_names, nlink = ARRAYS[name]
        arr = fs / name
        listed = {n for n in arr.iterdir() if not n.startswith(".")}
        assert listed == root_names  # shard directories are not listed at the array root (copies)
        if shard_names:
            assert (arr / "c" / "0" / "0").iterdir() == ["0.0"]
        stored = (arr / "0.0").read_bytes()
        for n in root_names | shard_names:
            assert_chunk_attrs((arr / n).stat(), REGULAR_RW, nlink, len(stored))
        if shard_names:
            assert (arr / "c/0/0/0.0").stat().st_ino == (arr / "0.0").stat().st_ino

        # an existing chunk open for writing, before and after a (dirty, uncommitted) write
        with (arr / "0.0").open("r+b") as f:
            assert_chunk_attrs(f.stat(), REGULAR_RW, nlink, len(stored))
            f.write(stored)
            assert_chunk_attrs(f.stat(), REGULAR_RW, nlink, len(stored))

        # a new chunk: just created (empty), written but not committed, committed
        with (arr / "0.1").open("wb") as f:
            assert_chunk_attrs(f.stat(), REGULAR_RW, nlink, 0)
            f.write(stored)
            assert_chunk_attrs(f.stat(), REGULAR_RW, nlink, len(stored))
        assert_chunk_attrs((arr / "0.1").stat(), REGULAR_RW, nlink, len(stored))
        if shard_names:
            assert_chunk_attrs((arr / "c/0/0/0.1").stat(), REGULAR_RW, nlink, len(stored))
        assert (arr / "0.1").read_bytes() == stored


@pytest.mark.parametrize("name", sorted(ARRAYS))
def test_chunk_file_mode_and_nlink_read_only_mount(name, source):
    with InProcess(source) as fs:
        root_names, shard_names, nlink = ARRAYS[name]
        size = len((fs / name / "0.0").read_bytes())
        if name == "unsharded":
            assert size == (source / name / "c/0/0").stat().st_size
        for n in root_names | shard_names:
            assert_chunk_attrs((fs / name / n).stat(), REGULAR_RO, nlink, size)


@pytest.mark.parametrize("name", sorted(ARRAYS))
def test_names_with_non_ascii_digits_do_not_exist(name, source):
    """Only ASCII decimal coordinates name chunks: "0.²" ("²".isdigit() is true, int("²")
    raises) and "0.٣" (int("٣") == 3) are ENOENT, not EIO (any other exception fails here)."""
    with InProcess(source, read_only=False) as fs:
        names = ["0.²", "0.٣", "٠.0"] + (["c/0/0/0.²", "c/0/0/0.٣"] if name == "sharded" else [])
        for n in names:
            with pytest.raises(FileNotFoundError):
                (fs / name / n).stat()


def test_mkdir_with_non_ascii_digit_names_is_eperm(tmp_path):
    """In an array whose v2 keys nest ("/"), ``mkdir`` of a key directory takes only ASCII
    decimal coordinates: "²" and "٣" are EPERM, not EIO (any other exception fails here)."""
    src = tmp_path / "src"
    group = zarr.open_group(str(src), mode="w", zarr_format=3)
    arr = group.create_array("v2dot", shape=(8, 8), chunks=(4, 4), shards=(8, 8), dtype="<i4", fill_value=0,
                             chunk_key_encoding={"name": "v2", "separator": "."})
    arr[:4, :4] = 1
    with InProcess(src, read_only=False) as fs:
        assert json.loads((fs / "v2dot" / ".zarray").read_bytes())["dimension_separator"] == "/"
        for name in ("²", "٣"):
            with pytest.raises(PermissionError):
                (fs / "v2dot" / name).mkdir()
        assert sorted((fs / "v2dot").iterdir()) == [".zarray", ".zattrs", "0"]
