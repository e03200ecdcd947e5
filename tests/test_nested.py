"""Nested sharding (a ``sharding_indexed`` codec inside one): reads, directories, writes.

The v2 view shows the innermost chunks; a shard directory holds its inner
shards as directories (named by their index in the inner-shard grid of the
whole array, joined with "."), each holding its innermost chunk files.
Sources are written by zarr-python 3 and tensorstore's ``zarr3`` driver; the
oracle is zarr-python 3's native read. An array the view cannot show is checked in-process
(``tests/inproc.py``).
"""

from __future__ import annotations

import errno
import itertools
import json
import logging
import math
import os
from pathlib import Path

import numcodecs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import (
    assert_same_array,
    budget,
    read_native,
    read_tensorstore,
    read_zarr2_many,
    read_zarr3_v2,
    run_shardfs,
)
from inproc import InProcess, copy_chunk_file
from sources import (
    BE,
    CRC,
    GZIP,
    LE,
    ZSTD,
    assert_source_equals,
    copy_array,
    hashed_array,
    nested_codecs,
    random_data,
    sharding,
    write_v3,
)
from writers import WRITERS, umount


# name -> (data, outer shard shape, codecs, innermost chunk shape, inner shard shape, v2 compressor)
ARRAYS = {
    # zstd innermost chunks; crc32c around each inner shard; two fill-only chunks
    "zs": (random_data((10, 9), "int32", 1, [np.s_[0:2, 0:2], np.s_[8:10, 8:9]]), (8, 8),
           nested_codecs((4, 4), (2, 2), [LE, ZSTD]), (2, 2), (4, 4), {"id": "zstd", "level": 1}),
    # 3-D, outer index at the start, big-endian inner index without crc, crc32c on each chunk
    "gz3": (random_data((7, 9, 5), ">u2", 2, [np.s_[0:4, 0:6, 0:4]]), (4, 6, 4),
            nested_codecs((2, 3, 4), (1, 3, 2), [BE, GZIP, CRC], crc_around=False, inner_index=(BE,),
                          outer_location="start"), (1, 3, 2), (2, 3, 4), {"id": "gzip", "level": 3}),
    # a transpose v2 cannot spell: innermost chunks are transcoded
    "tr": (random_data((6, 8, 5), "int16", 3), (6, 8, 4),
           nested_codecs((3, 4, 4), (3, 2, 2), [{"name": "transpose", "configuration": {"order": [1, 0, 2]}}, LE]),
           (3, 2, 2), (3, 4, 4), None),
    # three levels: shards of 32 hold inner shards of 16, holding inner shards of 8, of chunks of 2
    "deep": (random_data((50,), "uint8", 4, [np.s_[16:24]]), (32,),
             [sharding((16,), [sharding((8,), [sharding((2,), [LE, ZSTD])])])], (2,), (16,),
             {"id": "zstd", "level": 1}),
}
TS_REFUSES = {"zs", "tr"}  # tensorstore refuses crc32c after a nested sharding codec
TS_ARRAY = "ts"  # written by tensorstore: gzip chunks, outer index at the start, inner index big-endian


def write_tensorstore_nested(path: Path) -> np.ndarray:
    import tensorstore as ts

    data = random_data((12, 10), "uint16", 5, [np.s_[4:6, 0:2]])
    inner = sharding((2, 2), [LE, GZIP], index_codecs=(BE,))
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path)}, "create": True,
            "metadata": {"shape": [12, 10], "data_type": "uint16", "fill_value": 0,
                         "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [8, 8]}},
                         "codecs": [sharding((4, 4), [inner], index_location="start")]}}
    ts.open(spec).result()[...].write(data).result()
    return data


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("nested") / "src"
    root.mkdir()
    (root / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}))
    for name, (data, shard, codecs, *_rest) in ARRAYS.items():
        write_v3(root / name, data, shard, codecs)
    write_tensorstore_nested(root / TS_ARRAY)
    return root


NAMES = [*ARRAYS, TS_ARRAY]


def test_nested_arrays_read_like_native_with_every_v2_client(mnt, src):
    native = {n: read_native(src / n) for n in NAMES}
    for name, (data, *_rest) in ARRAYS.items():
        assert_same_array(native[name], data, f"zarr 3 native read of {name} (the writer's data)")
    via_zarr2 = read_zarr2_many([mnt / n for n in NAMES])
    for name in NAMES:
        assert_same_array(via_zarr2[str(mnt / name)], native[name], f"zarr 2.18 read of {name}")
        assert_same_array(read_zarr3_v2(mnt / name), native[name], f"zarr 3 v2 read of {name}")
        assert_same_array(read_tensorstore(mnt / name), native[name], f"tensorstore read of {name}")


@pytest.mark.parametrize("name", list(ARRAYS))
def test_zarray_shows_innermost_chunks(tree, name):
    """In-process."""
    _data, _shard, _codecs, chunk, _inner, compressor = ARRAYS[name]
    zarray = json.loads((tree / name / ".zarray").read_text())
    assert zarray["chunks"] == list(chunk)
    assert zarray["compressor"] == compressor
    assert zarray["filters"] is None


def stored_chunks(native: np.ndarray, chunk) -> set[tuple[int, ...]]:
    grid = [math.ceil(s / c) for s, c in zip(native.shape, chunk)]
    out = set()
    for idx in itertools.product(*map(range, grid)):
        region = tuple(slice(i * c, (i + 1) * c) for i, c in zip(idx, chunk))
        if np.any(native[region]):
            out.add(idx)
    return out


def name_of(idx) -> str:
    return ".".join(map(str, idx))


def test_shard_dir_holds_inner_shard_dirs_of_chunk_files(tree):
    """In-process."""
    mnt = tree
    data, _shard, _codecs, chunk, inner, _comp = ARRAYS["zs"]
    stored = stored_chunks(data, chunk)
    per_inner = tuple(i // c for i, c in zip(inner, chunk))
    for shard in [(0, 0), (0, 1), (1, 0), (1, 1)]:
        shard_dir = mnt / "zs" / "c" / str(shard[0]) / str(shard[1])
        in_shard = {c for c in stored if tuple(i // 4 for i in c) == shard}
        boxes = {tuple(i // n for i, n in zip(c, per_inner)) for c in in_shard}
        if not boxes:  # shard 1.1 holds only the fill-only chunk 4.4: not stored
            assert not shard_dir.exists()
            continue
        assert sorted(shard_dir.iterdir()) == sorted(map(name_of, boxes)), shard_dir
        for box in boxes:
            d = shard_dir / name_of(box)
            assert d.is_dir()
            chunks = {c for c in in_shard if tuple(i // n for i, n in zip(c, per_inner)) == box}
            assert sorted(d.iterdir()) == sorted(map(name_of, chunks)), d
            for c in chunks:
                inside, top = (d / name_of(c)).stat(), (mnt / "zs" / name_of(c)).stat()
                assert (inside.st_ino, inside.st_size) == (top.st_ino, top.st_size), c
                region = tuple(slice(i * k, (i + 1) * k) for i, k in zip(c, chunk))
                block = np.zeros(chunk, dtype="<i4")
                part = data[region]
                block[tuple(slice(0, n) for n in part.shape)] = part
                raw = numcodecs.Zstd().decode((d / name_of(c)).read_bytes())
                assert raw == block.tobytes(), f"chunk {c}: not the stored zstd bytes"
        # names that are not inner shards of this shard do not exist
        assert not (shard_dir / "9.9").exists()
        assert not (shard_dir / name_of(tuple(2 * s + 2 for s in shard))).exists()


def test_three_levels_of_inner_shard_dirs(tree):
    """In-process."""
    mnt = tree
    data = ARRAYS["deep"][0]
    # shard 0 covers chunks 0..15; level-1 inner shards of 8 chunks; level-2 of 4 chunks
    level1 = sorted((mnt / "deep" / "c" / "0").iterdir())
    assert level1 == ["0", "1"]
    assert sorted((mnt / "deep" / "c" / "0" / "0").iterdir()) == ["0", "1"]
    assert sorted((mnt / "deep" / "c" / "0" / "1").iterdir()) == ["3"], "chunks 8..11 are fill-only"
    assert sorted((mnt / "deep" / "c" / "0" / "1" / "3").iterdir()) == ["12", "13", "14", "15"]
    assert sorted((mnt / "deep" / "c" / "1").iterdir()) == ["2", "3"]
    leaf = mnt / "deep" / "c" / "1" / "3" / "6" / "24"
    assert leaf.stat().st_ino == (mnt / "deep" / "24").stat().st_ino
    assert np.frombuffer(numcodecs.Zstd().decode(leaf.read_bytes()), "u1").tolist() == data[48:50].tolist()


def outer_index(raw: bytes, n: int) -> np.ndarray:
    """The (offset, nbytes) table of a shard with its index (LE + crc32c) at the end."""
    return np.frombuffer(raw[-(16 * n + 4): -4], dtype="<u8").reshape(n, 2)


def test_corrupt_inner_shard_gives_eio_on_its_chunks_only(src, tmp_path, caplog):
    """In-process (the refused write: at the kernel's FLUSH, which ``close`` sends)."""
    own = copy_array(src / "zs", tmp_path / "src")
    shard = own / "zs" / "c" / "0" / "0"
    raw = bytearray(shard.read_bytes())
    offset, nbytes = (int(v) for v in outer_index(bytes(raw), 4)[0])  # inner shard 0.0
    raw[offset + nbytes - 4 - 8] ^= 0xFF  # inside the inner shard's index, before its crc32c
    shard.write_bytes(bytes(raw))

    caplog.set_level(logging.DEBUG, logger="shardfs")
    with InProcess(own, read_only=False) as fs:
        mnt = fs / ""
        for c in ["0.1", "1.0", "1.1"]:  # the stored chunks of inner shard 0.0
            with pytest.raises(OSError) as e:
                (mnt / "zs" / c).read_bytes()
            assert e.value.errno == errno.EIO, c
        data, *_rest = ARRAYS["zs"]
        other = np.frombuffer(numcodecs.Zstd().decode((mnt / "zs" / "2.2").read_bytes()), "<i4").reshape(2, 2)
        np.testing.assert_array_equal(other, data[4:6, 4:6], "a chunk of another inner shard of that shard")
        # the corrupt inner shard 0.0 is not listed; its three sound neighbours are
        assert sorted((mnt / "zs" / "c" / "0" / "0").iterdir()) == ["0.1", "1.0", "1.1"]
        lines = [r.getMessage() for r in caplog.records if r.name == "shardfs" and r.levelno == logging.ERROR]
        assert len(lines) == 1, lines
        assert str(shard) in lines[0] and "inner shard" in lines[0] and "checksum" in lines[0], lines[0]
        # writes into that shard are refused rather than dropping the corrupt inner shard's chunks
        with pytest.raises(OSError) as e:
            (mnt / "zs" / "2.2").write_bytes((mnt / "zs" / "2.3").read_bytes())
        assert e.value.errno == errno.EIO


@pytest.mark.parametrize("name,writer", [("zs", "zarr2"), ("gz3", "zarr3"), ("tr", "zarr2"),
                                         (TS_ARRAY, "zarr3")])
def test_writes_rebuild_inner_shards_readable_natively(name, writer, src, tmp_path, mount):
    own = copy_array(src / name, tmp_path / "src")
    expected = read_native(own / name)
    region = tuple(slice(1, max(2, s - 1)) for s in expected.shape)
    values = (np.arange(math.prod(expected[region].shape)) % 250 + 3).reshape(expected[region].shape)
    values = values.astype(expected.dtype)
    expected[region] = values
    mnt = mount(own)
    WRITERS[writer](mnt / name, region, values, tmp_path)
    assert_same_array(read_zarr3_v2(mnt / name), expected, "read-back through the mount")
    umount(mount, mnt)
    if name in TS_REFUSES:
        assert_same_array(read_native(own / name), expected, f"zarr 3 native read of {name}")
    else:
        assert_source_equals(own, name, expected)  # zarr 3 and tensorstore zarr3


@pytest.mark.parametrize("name", ["zs", "gz3", "tr", TS_ARRAY])
def test_a_chunk_file_rewritten_rebuilds_its_inner_shards_in_process(name, src, tmp_path):
    """The daemon's part of ``writes_rebuild_inner_shards_readable_natively``, in-process: a chunk
    file written with another chunk's bytes is folded into its inner shard, readable natively
    (the mounted test writes with zarr 2.18 and 3)."""
    own = copy_array(src / name, tmp_path / "src")
    expected = read_native(own / name)
    with InProcess(own, read_only=False) as fs:
        copy_chunk_file(fs / name, expected)
    if name in TS_REFUSES:
        assert_same_array(read_native(own / name), expected, f"zarr 3 native read of {name}")
    else:
        assert_source_equals(own, name, expected)  # zarr 3 and tensorstore zarr3


# ------------------------------------------------------------------ property: any nested geometry


@st.composite
def nested_arrays(draw):
    ndim = draw(st.integers(1, 3))
    chunk = [draw(st.integers(1, 3)) for _ in range(ndim)]
    inner = [c * draw(st.integers(1, 3)) for c in chunk]
    outer = [i * draw(st.integers(1, 2)) for i in inner]
    shape = [draw(st.integers(1, 2 * o + 1)) for o in outer]
    innermost = draw(st.sampled_from([[LE], [BE, ZSTD], [LE, GZIP, CRC],
                                      [{"name": "transpose", "configuration": {"order": list(range(ndim))[::-1]}},
                                       LE]]))
    codecs = nested_codecs(inner, chunk, innermost, crc_around=draw(st.booleans()),
                           outer_index=draw(st.sampled_from([(LE, CRC), (BE,)])),
                           inner_index=draw(st.sampled_from([(LE, CRC), (LE,)])),
                           outer_location=draw(st.sampled_from(["end", "start"])),
                           inner_location=draw(st.sampled_from(["end", "start"])))
    seed = draw(st.integers(0, 2**16))
    data = np.random.default_rng(seed).integers(0, 4, size=shape).astype("int16")
    data[data == 1] = 0  # more fill: empty chunks and inner shards
    return data, outer, codecs


@settings(max_examples=budget(100))
@given(case=nested_arrays())
def test_property_nested_reads_match_zarr3(case, tree, src):
    """In-process (``tests/inproc.py``); zarr 3 (v2 mode) reads a copy of the files shown."""
    data, outer, codecs = case
    name = hashed_array(src, data, outer, codecs)
    native = read_native(src / name)
    assert_same_array(native, data, "zarr 3 native")
    shown = (tree / name).copy_to(src.parent / "shown" / name)
    assert_same_array(read_zarr3_v2(shown), native, f"zarr 3 v2 read of {codecs}")


def test_inspect_nested_shard(mnt, src):
    out = run_shardfs("inspect", "--json", str(mnt / "zs" / "c" / "0" / "0"))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["chunk_shape"] == [2, 2] and report["shard_shape"] == [8, 8]
    assert report["nested"] == [{"inner_shard_shape": [4, 4], "chunks_per_inner_shard": [2, 2],
                                 "crc32c_after": True,
                                 "index": {"location": "end", "endian": "little", "crc32c": True, "nbytes": 68}}]
    shard = report["shard"]
    assert shard["index_status"].startswith("ok")
    inner = shard["inner_shards"]
    assert [r["inner_shard"] for r in inner if not r["empty"]] == ["0.0", "0.1", "1.0", "1.1"]
    assert all(r["index_status"].startswith("ok") for r in inner if not r["empty"])
    stored = {row["chunk"] for row in shard["index"] if not row["empty"]}
    listed = {c for d in os.listdir(mnt / "zs" / "c" / "0" / "0") for c in os.listdir(mnt / "zs" / "c" / "0" / "0" / d)}
    assert stored == listed
    text = run_shardfs("inspect", str(src / "zs" / "c" / "0" / "0"))
    assert text.returncode == 0 and "nested" in text.stdout and "inner shard" in text.stdout, text.stdout


def test_nested_sharding_with_other_codecs_around_is_explained(tmp_path):
    """In-process (``tests/inproc.py``); ``inspect`` of the source."""
    root = tmp_path / "src"
    data = random_data((4, 4), "int32", 9)
    codecs = [sharding((4, 4), [sharding((2, 2), [LE]), GZIP])]
    root.mkdir()
    (root / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}))
    write_v3(root / "a", data, (4, 4), codecs)
    with InProcess(root) as fs:
        assert (fs / "a").iterdir() == []
    out = run_shardfs("inspect", str(root / "a"))
    assert "nested sharding codec" in out.stdout, out.stdout
