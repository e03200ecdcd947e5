"""``-o c_order``: arrays stored with a reversed ``transpose`` (shown as ``"order": "F"``) are
served as C-order chunk files, transcoded (issue 23, item 5).

netCDF-C ignores ``"order"`` and returns each chunk transposed; with the option it reads the
mount right (the read matrix of tests/test_legacy_readers.py runs it over every reader:
``test_read[netcdf-float32_F]`` and ``[netcdf-int32_F]``). Here: what the option changes in the
view (``.zarray``, the chunk bytes, nothing for other arrays), that zarr 2.18 reads and writes
the same values through it, and that creating an F-order array through such a mount is refused
(its chunks could not be written as the writer encodes them). What the view shows and what it
refuses is checked in-process (``tests/inproc.py``: the filesystem the kernel adapter calls,
built as the daemon builds it from ``-o c_order``), zarr 2.18 through a mount.
"""

from __future__ import annotations

import errno
import json
import logging

import numpy as np
import pytest
from conftest import read_native, run_shardfs, zarr2
from inproc import InProcess, copy_chunk_file
from sources import (
    CRC,
    LE,
    ZSTD,
    array_doc,
    sharding,
    transpose,
    write_group,
    write_zarr3,
)

SHAPE, SHARD, INNER = (7, 10), (4, 8), (2, 4)
T = transpose((1, 0))
ARRAYS = {  # name -> inner codecs
    "f_raw": (T, LE),
    "f_zstd_crc": (T, LE, ZSTD, CRC),
    "c_zstd": (LE, ZSTD),
}


@pytest.fixture
def src(tmp_path):
    src = tmp_path / "src"
    write_group(src)
    rng = np.random.default_rng(5)
    for name, codecs in ARRAYS.items():
        data = rng.integers(1, 10**6, SHAPE).astype("<i4")
        data[0:2, 4:8] = 0  # an empty inner chunk
        write_zarr3(src / name, array_doc(SHAPE, "int32", SHARD, [sharding(INNER, list(codecs))], 0),
                    [((...), data)])
    return src


def _zarray(mnt, name) -> dict:
    return json.loads((mnt / name / ".zarray").read_text())


def test_c_order_serves_transposed_arrays_as_raw_c_order_chunks(src):
    """In-process: the view without the option and with it."""
    with InProcess(src) as plain_fs, InProcess(src, c_order=True) as c_fs:
        _serves_raw_c_order_chunks(src, plain_fs / "", c_fs / "")


def _serves_raw_c_order_chunks(src, plain, c_mnt) -> None:
    for name in ("f_raw", "f_zstd_crc"):
        before, after = _zarray(plain, name), _zarray(c_mnt, name)
        assert before["order"] == "F"
        assert after == {**before, "order": "C", "compressor": None}
        consolidated = json.loads((c_mnt / ".zmetadata").read_text())["metadata"]  # what GDAL reads
        assert consolidated[f"{name}/.zarray"] == after
        expected = read_native(src / name)
        for key in ("0.0", "1.2", "3.2"):  # a full chunk and the two edge chunks (past the edges: fill)
            i, j = map(int, key.split("."))
            chunk = np.zeros(INNER, "<i4")
            block = expected[i * 2:(i + 1) * 2, j * 4:(j + 1) * 4]
            chunk[:block.shape[0], :block.shape[1]] = block
            assert (c_mnt / name / key).read_bytes() == chunk.tobytes(), (name, key)
        assert not (c_mnt / name / "0.1").exists()  # the empty inner chunk stays absent
    assert _zarray(c_mnt, "c_zstd") == _zarray(plain, "c_zstd")  # C-order arrays: unchanged
    assert (c_mnt / "c_zstd" / "0.0").read_bytes() == (plain / "c_zstd" / "0.0").read_bytes()


def test_zarr2_reads_and_writes_through_c_order(src, mount):
    c_mnt = mount(src, "-o", "c_order")
    expected = {name: read_native(src / name) for name in ARRAYS}
    got = zarr2("""
        result = {}
        for name in names:
            result[name] = zarr.open_array(f"{mnt}/{name}", mode="r")[...]
        for name in names:
            a = zarr.open_array(f"{mnt}/{name}", mode="r+")
            a[1:6, 3:9] = np.arange(30, dtype="<i4").reshape(5, 6) + 7
        """, names=list(ARRAYS), mnt=str(c_mnt))
    for name in ARRAYS:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
        expected[name][1:6, 3:9] = np.arange(30, dtype="<i4").reshape(5, 6) + 7
    assert run_shardfs("umount", str(c_mnt)).returncode == 0
    for name, codecs in ARRAYS.items():
        np.testing.assert_array_equal(read_native(src / name), expected[name], err_msg=name)
        stored = json.loads((src / name / "zarr.json").read_text())["codecs"][0]["configuration"]["codecs"]
        assert [c["name"] for c in stored] == [c["name"] for c in codecs]  # still stored transposed


def test_a_chunk_file_rewritten_through_c_order_is_stored_transposed_in_process(src):
    """The daemon's part of ``zarr2_reads_and_writes_through_c_order``, in-process
    (``tests/inproc.py``): a C-order chunk file written with another chunk's bytes lands in the
    source, still stored transposed (the mounted test writes with zarr 2.18)."""
    expected = {name: read_native(src / name) for name in ARRAYS}
    with InProcess(src, read_only=False, c_order=True) as fs:
        for name in ARRAYS:
            copy_chunk_file(fs / name, expected[name])
    for name, codecs in ARRAYS.items():
        np.testing.assert_array_equal(read_native(src / name), expected[name], err_msg=name)
        stored = json.loads((src / name / "zarr.json").read_text())["codecs"][0]["configuration"]["codecs"]
        assert [c["name"] for c in stored] == [c["name"] for c in codecs]  # still stored transposed


def test_creating_an_f_order_array_through_c_order_is_refused(src, caplog):
    """The view of the new array would be C order: a v2 writer's F-order chunks would land
    transposed, so its .zarray is refused (EPERM) and the log says why. In-process (the
    commit at the kernel's FLUSH, which ``close`` of the written file sends)."""
    caplog.set_level(logging.INFO, logger="shardfs")
    with InProcess(src, read_only=False, c_order=True) as fs:
        c_mnt = fs / ""
        zarray = {"zarr_format": 2, "shape": [4, 6], "chunks": [2, 3], "dtype": "<i4", "compressor": None,
                  "fill_value": 0, "order": "F", "filters": None, "dimension_separator": "."}
        (c_mnt / "new").mkdir()
        with pytest.raises(OSError) as e:
            (c_mnt / "new" / ".zarray").write_text(json.dumps(zarray))
        assert e.value.errno == errno.EPERM
        assert not (src / "new" / "zarr.json").exists()
        assert "new/.zarray: cannot create: order differ from the array's" in caplog.text
        (c_mnt / "new" / ".zarray").write_text(json.dumps({**zarray, "order": "C"}))  # C order: created
        assert _zarray(c_mnt, "new")["order"] == "C"
