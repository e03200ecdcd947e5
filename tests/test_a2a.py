"""Array→array codecs before the sharding codec: ``transpose`` and elementwise numcodecs filters.

Sources are written by zarr-python 3 (``shardbuild.write_v3``: codecs JSON by
hand, data by zarr). The v2 view transcodes: chunk files hold the array-space
inner chunks as raw C-order bytes. Oracles: zarr-python 3's native read of the
source, and after writes through the mount, zarr-python 3 writing the same
region natively into a copy of the source.
"""

from __future__ import annotations

import json
import logging
import math
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from conftest import (
    assert_same_array,
    budget,
    read_native,
    read_tensorstore,
    read_ts3_native,
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
    copy_array,
    hashed_array,
    nested_codecs,
    random_data,
    sharding,
    write_v3,
)
from shardfs.format.layout import ArrayLayout, KeyScheme, permuted, unpermuted
from writers import WRITERS, cache_stats as stats, umount


def transpose(order) -> dict:
    return {"name": "transpose", "configuration": {"order": list(order)}}


ASTYPE = {"name": "numcodecs.astype", "configuration": {"encode_dtype": "<f4", "decode_dtype": "<f8"}}
QUANTIZE = {"name": "numcodecs.quantize", "configuration": {"digits": 3, "dtype": "<f8"}}


def floats(shape, seed, fill=()) -> np.ndarray:
    """Non-zero eighths (exact in float32), with the ``fill`` regions set to 0."""
    return random_data(shape, "int32", seed, fill).astype("float64") / 8


# name -> (data, shard shape (array space), codecs, v2 "chunks" (inner chunks in array space))
ARRAYS = {
    # 3-D, edge shards on every axis, index grid = array dims (2, 0, 1)
    "t3": (random_data((5, 7, 9), "int32", 1, [np.s_[0:2, 0:3, 0:3], np.s_[4:5]]), (4, 6, 6),
           [transpose((2, 0, 1)), sharding((2, 2, 3), [LE, ZSTD])], (2, 3, 2)),
    # 2-D, reversed order, inner chain that keeps its own transpose, index at the start
    "t2": (random_data((9, 11), "uint16", 2, [np.s_[0:4, 0:6]]), (4, 6),
           [transpose((1, 0)), sharding((2, 2), [LE, GZIP], (BE,), "start")], (2, 2)),
    # 3-D, big-endian chunks with crc32c
    "t3b": (random_data((6, 5, 4), "float32", 3), (4, 4, 4),
            [transpose((1, 2, 0)), sharding((4, 2, 2), [BE, GZIP, CRC])], (2, 4, 2)),
    # nested sharding in the transposed space: inner shards (4, 4), innermost chunks (2, 4) -> (4, 2)
    "tn": (random_data((10, 13), "int16", 6, [np.s_[0:4, 0:4]]), (8, 12),
           [transpose((1, 0)), *nested_codecs((4, 4), (2, 4), [LE, ZSTD], crc_around=False)], (4, 2)),
    # elementwise: float64 stored as float32
    "astype": (floats((10, 7), 4, [np.s_[0:4, 0:4]]), (4, 4), [ASTYPE, sharding((2, 2), [LE, ZSTD])], (2, 2)),
    # a transpose and an elementwise filter together
    "quant": (floats((6, 7), 5) / 3, (6, 6),
              [transpose((1, 0)), QUANTIZE, sharding((2, 3), [BE, GZIP])], (3, 2)),
}
# array→array codecs that cannot be shown per inner chunk -> the reason ``inspect`` gives
UNPRESENTABLE = {
    "delta": ({"name": "numcodecs.delta", "configuration": {"dtype": "<f8"}}, "neither a transpose nor elementwise"),
    "offset": ({"name": "numcodecs.fixedscaleoffset",
                "configuration": {"offset": 1000, "scale": 10, "dtype": "<f8", "astype": "<i4"}},
               "an empty inner chunk decodes to 1000.0, not the fill value 0.0"),
}


def tensorstore_reads(name: str) -> bool:
    """True if tensorstore's ``zarr3`` driver reads the array (it has no numcodecs filters)."""
    return not any(c["name"].startswith("numcodecs.") for c in ARRAYS[name][2])


def write_metadata_only(path: Path, before: dict) -> None:
    """A float64 array sharded after ``before`` (zarr-python 3 cannot write these: no data)."""
    path.mkdir(parents=True)
    doc = {"zarr_format": 3, "node_type": "array", "shape": [8, 8], "data_type": "float64", "fill_value": 0,
           "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4, 4]}},
           "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
           "codecs": [before, sharding((2, 2), [LE])], "attributes": {}}
    (path / "zarr.json").write_text(json.dumps(doc))


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("a2a") / "src"
    root.mkdir()
    (root / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}))
    for name, (data, shard, codecs, _chunks) in ARRAYS.items():
        write_v3(root / name, data, shard, codecs)
    for name, (before, _reason) in UNPRESENTABLE.items():
        write_metadata_only(root / name, before)
    return root


# ------------------------------------------------------------------ geometry


@st.composite
def transposed_layouts(draw) -> tuple[ArrayLayout, tuple[int, ...]]:
    ndim = draw(st.integers(1, 4))
    order = tuple(draw(st.permutations(range(ndim))))
    cps = tuple(draw(st.lists(st.integers(1, 4), min_size=ndim, max_size=ndim)))
    chunk = tuple(draw(st.lists(st.integers(1, 3), min_size=ndim, max_size=ndim)))
    shard = tuple(c * n for c, n in zip(chunk, cps))
    shape = tuple(draw(st.integers(1, 2 * s + 1)) for s in shard)
    return ArrayLayout(shape, chunk, shard, None, KeyScheme("default", "/", ndim), order), cps


@settings(max_examples=budget(300))
@given(case=transposed_layouts())
def test_property_transposed_index_positions(case):
    """Position p of a shard's index holds the chunk numpy's ``transpose(order)`` puts at C-order p."""
    layout, cps = case
    assert permuted(cps, layout.order) == layout.index_grid
    assert unpermuted(layout.index_grid, layout.order) == cps
    local_ids = np.arange(math.prod(cps)).reshape(cps).transpose(layout.order).ravel()
    for shard in np.ndindex(*layout.shard_grid):
        for pos, local_id in enumerate(local_ids):
            local = np.unravel_index(local_id, cps)
            coords = tuple(s * n + int(i) for s, n, i in zip(shard, cps, local))
            assert layout.chunk_at(shard, pos) == (coords if layout.in_grid(coords) else None)
            if layout.in_grid(coords):
                assert layout.locate(coords) == (shard, pos)


# ------------------------------------------------------------------ reads


def test_zarray_is_raw_array_space_chunks(tree):
    """In-process."""
    for name, (data, _shard, _codecs, chunks) in ARRAYS.items():
        zarray = json.loads((tree / name / ".zarray").read_text())
        assert zarray["chunks"] == list(chunks), name
        assert (zarray["compressor"], zarray["filters"], zarray["order"]) == (None, None, "C"), name
        assert np.dtype(zarray["dtype"]) == data.dtype.newbyteorder("<"), name


def test_reads_match_native_with_every_v2_client(mnt, src):
    via_zarr2 = read_zarr2_many([mnt / n for n in ARRAYS])
    for name, (data, *_rest) in ARRAYS.items():
        native = read_native(src / name)
        if name != "quant":  # quantize is lossy: native decodes are the reference
            assert_same_array(native, data, f"native read of {name}")
        if tensorstore_reads(name):
            assert_same_array(read_ts3_native(src / name), native, f"tensorstore zarr3 read of {name}")
        assert_same_array(via_zarr2[str(mnt / name)], native, f"zarr 2.18 read of {name}")
        assert_same_array(read_zarr3_v2(mnt / name), native, f"zarr 3 v2 read of {name}")
        assert_same_array(read_tensorstore(mnt / name), native, f"tensorstore read of {name}")


def test_shard_directories_list_stored_chunks_in_array_space(tree):
    """In-process."""
    data, shard, _codecs, chunks = ARRAYS["t3"]
    for shard_idx in np.ndindex(*(math.ceil(s / c) for s, c in zip(data.shape, shard))):
        expected = set()
        for idx in np.ndindex(*(s // c for s, c in zip(shard, chunks))):
            coords = tuple(b * (s // c) + i for b, s, c, i in zip(shard_idx, shard, chunks, idx))
            region = tuple(slice(i * c, (i + 1) * c) for i, c in zip(coords, chunks))
            if data[region].size and np.any(data[region]):
                expected.add(".".join(map(str, coords)))
        listing = (tree / "t3" / "c" / Path(*map(str, shard_idx))).iterdir() if expected else []
        assert set(listing) == expected, shard_idx


def test_transcoded_chunks_are_cached(src, mount):
    native = read_native(src / "t3")
    mnt = mount(src, "-o", "workers=1")  # its own mount: nothing decoded yet (one worker's cache)
    for _ in range(3):
        got = np.frombuffer((mnt / "t3" / "1.2.4").read_bytes(), "<i4").reshape(2, 3, 2)
        assert_same_array(got[:, :1, :1], native[2:4, 6:7, 8:9], "chunk file 1.2.4 (array part of an edge chunk)")
    # decoded once, then served from the cache
    assert stats(mount, mnt) == {"decodes": 1, "hits": 2}


def test_a_transcoded_chunk_is_decoded_once_then_served_from_the_chunk_cache_in_process(src):
    """The daemon's part of ``transcoded_chunks_are_cached``, in-process (``tests/inproc.py``):
    three opens and reads of a transcoded chunk file decode it once (a chunk-cache miss) and
    serve it twice from the chunk cache, the same bytes each time."""
    native = read_native(src / "t3")
    with InProcess(src) as fs:
        lru = fs.tree.reads.chunk_cache.lru
        for _ in range(3):
            got = np.frombuffer((fs / "t3" / "1.2.4").read_bytes(), "<i4").reshape(2, 3, 2)
            assert_same_array(got[:, :1, :1], native[2:4, 6:7, 8:9], "chunk file 1.2.4 (array part of an edge chunk)")
        assert (lru.misses, lru.hits, len(lru)) == (1, 2, 1)


@st.composite
def transposed_arrays(draw):
    ndim = draw(st.integers(2, 3))
    order = tuple(draw(st.permutations(range(ndim))))
    chunk_t = [draw(st.integers(1, 2)) for _ in range(ndim)]  # inner chunk, index space
    shard_t = [c * draw(st.integers(1, 3)) for c in chunk_t]
    shard = unpermuted(tuple(shard_t), order)
    assume(all(s % c == 0 for s, c in zip(shard, chunk_t)))  # zarr-python checks it in array space too
    shape = [draw(st.integers(1, 2 * s + 1)) for s in shard]
    elementwise = draw(st.sampled_from([[], [ASTYPE], [QUANTIZE]]))
    before = draw(st.permutations([transpose(order), *elementwise]))
    inner = draw(st.sampled_from([[LE], [BE, ZSTD], [LE, GZIP, CRC]]))
    seed = draw(st.integers(0, 2**16))
    data = np.random.default_rng(seed).integers(0, 3, size=shape).astype("float64" if elementwise else "int16")
    return data, shard, [*before, sharding(chunk_t, inner)]


@settings(max_examples=budget(80))
@given(case=transposed_arrays())
def test_property_reads_match_zarr3(case, tree, src):
    """In-process (``tests/inproc.py``); zarr 3 (v2 mode) reads a copy of the files shown."""
    data, shard, codecs = case
    name = hashed_array(src, data, shard, codecs)
    shown = (tree / name).copy_to(src.parent / "shown" / name)
    assert_same_array(read_zarr3_v2(shown), read_native(src / name), f"zarr 3 v2 read of {shard} {codecs}")


# ------------------------------------------------------------------ writes


@pytest.mark.parametrize("name,writer", [("t3", "zarr2"), ("t2", "zarr3"), ("t3b", "zarr3"), ("tn", "zarr2"),
                                         ("astype", "zarr2"), ("quant", "zarr3")])
def test_writes_read_back_natively(name, writer, src, tmp_path, mount):
    import zarr

    own = copy_array(src / name, tmp_path / "src")
    oracle = copy_array(src / name, tmp_path / "oracle")
    data = ARRAYS[name][0]
    region = tuple(slice(1, s) for s in data.shape)  # every edge chunk, most shards
    values = ((np.arange(math.prod(data[region].shape)) % 97 + 3) / 4).astype(data.dtype).reshape(data[region].shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        zarr.open_array(str(oracle / name), mode="r+")[region] = values
    expected = read_native(oracle / name)
    mnt = mount(own)
    WRITERS[writer](mnt / name, region, values, tmp_path)
    assert_same_array(read_zarr3_v2(mnt / name), expected, "read-back through the mount")
    umount(mount, mnt)
    assert_same_array(read_native(own / name), expected, f"native read of {name} after the writes")
    if tensorstore_reads(name):  # an independent decoder of the folded shards
        assert_same_array(read_ts3_native(own / name), expected, f"tensorstore zarr3 read of {name} after the writes")


@pytest.mark.parametrize("name", ["t3", "t2", "t3b", "tn", "astype", "quant"])
def test_a_chunk_file_rewritten_reads_back_natively_in_process(name, src, tmp_path):
    """The daemon's part of ``writes_read_back_natively``, in-process: a chunk file of an array
    with array->array codecs written with another chunk's bytes is folded through the codecs
    and read back natively (the mounted test writes with zarr 2.18 and 3)."""
    own = copy_array(src / name, tmp_path / "src")
    expected = read_native(own / name)
    with InProcess(own, read_only=False) as fs:
        copy_chunk_file(fs / name, expected)
    assert_same_array(read_native(own / name), expected, f"native read of {name} after the write")


# ------------------------------------------------------------------ inspect and what stays hidden


def test_inspect_shows_the_chain(mnt, src):
    out = run_shardfs("inspect", "--json", str(mnt / "quant" / "c" / "0" / "1"))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["before_sharding"] == ["transpose", "numcodecs.quantize"]
    assert report["index_order"] == [1, 0] and report["transcoded"] is True
    assert report["chunk_shape"] == [3, 2] and report["shard_shape"] == [6, 6]
    stored = {row["chunk"] for row in report["shard"]["index"] if not row["empty"]}
    assert stored == set(os.listdir(mnt / "quant" / "c" / "0" / "1"))
    text = run_shardfs("inspect", str(src / "t3")).stdout
    assert "a2a        transpose before the sharding codec" in text and "transposed by [2, 0, 1]" in text, text


def test_unpresentable_codecs_are_explained(src, caplog):
    """In-process (``tests/inproc.py``); ``inspect`` of the source."""
    caplog.set_level(logging.INFO, logger="shardfs")
    with InProcess(src) as fs:
        for name, (_before, reason) in UNPRESENTABLE.items():
            assert (fs / name).iterdir() == [], name
            out = run_shardfs("inspect", "--json", str(src / name))
            report = json.loads(out.stdout)
            assert report["presentable"] is False and reason in report["reason"], report
            assert reason in caplog.text, f"{name}: the log does not say why:\n{caplog.text[-2000:]}"
