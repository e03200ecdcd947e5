"""Property test of ``shardfs.format.create`` against zarr-python 3 as the oracle (no mount).

For random v2 array metadata (dtype and byte order, order C/F, compressor,
filters, fill value), the v3 array that ``array_doc`` makes must:
- be shown by the view (``describe_array``) with the same ``.zarray`` (a rewrite
  of the written one is "same");
- store inner chunks that a v2 reader decodes with that ``.zarray``: zarr-python
  3 writes random data natively into the v3 array, and each stored inner chunk,
  turned into its chunk file (``ChunkFormat.to_file``) and decoded with numcodecs
  as zarr 2 would, equals the data;
- accept chunk files encoded as zarr 2 encodes them (``ChunkFormat.check``).
"""

from __future__ import annotations

import itertools
import json
import math
import warnings
from typing import Any
from pathlib import Path

import numcodecs
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardfs.shards import shard as shard_mod
from shardfs.format.create import array_doc, rewrite_kind, shard_counts
from shardfs.storage.local import LocalStorage
from shardfs.format.v2 import describe_array

DTYPES = ["<i2", ">i4", "<u1", "|b1", "<f4", ">f8", "<u8"]
COMPRESSORS = [None, {"id": "zstd", "level": 1}, {"id": "gzip", "level": 2}, {"id": "zlib", "level": 1},
               {"id": "blosc", "cname": "lz4", "clevel": 3, "shuffle": 1, "blocksize": 0}]


@st.composite
def v2_arrays(draw):
    ndim = draw(st.integers(1, 3))
    chunks = [draw(st.integers(1, 4)) for _ in range(ndim)]
    shape = [draw(st.integers(1, 9)) for _ in range(ndim)]
    dtype = draw(st.sampled_from(DTYPES))
    kind = np.dtype(dtype).kind
    order = draw(st.sampled_from(["C", "F"]))
    filters = None
    if kind in "iu" and order == "C" and dtype[0] != ">" and draw(st.booleans()):
        filters = [{"id": "delta", "dtype": dtype}]
    fill = draw(st.sampled_from([None, 0, 1])) if kind != "b" else draw(st.sampled_from([None, False, True]))
    return {"zarr_format": 2, "shape": shape, "chunks": chunks, "dtype": dtype, "order": order,
            "compressor": draw(st.sampled_from(COMPRESSORS)), "filters": filters, "fill_value": fill,
            "dimension_separator": draw(st.sampled_from([".", "/"]))}


def v2_decode(zarray: dict, data: bytes) -> np.ndarray:
    """A chunk file decoded as zarr 2.18 decodes it."""
    buf = data
    if zarray["compressor"]:
        buf = numcodecs.get_codec(zarray["compressor"]).decode(buf)
    for f in reversed(zarray["filters"] or []):
        buf = numcodecs.get_codec(f).decode(buf)
    flat = np.frombuffer(bytes(np.ascontiguousarray(buf)), dtype=zarray["dtype"])
    return flat.reshape(zarray["chunks"], order=zarray["order"])


def v2_encode(zarray: dict, chunk: np.ndarray) -> bytes:
    """A chunk as zarr 2.18 encodes it."""
    buf: Any = np.asarray(chunk, dtype=zarray["dtype"], order=zarray["order"])
    for f in zarray["filters"] or []:
        buf = numcodecs.get_codec(f).encode(buf)
    buf = np.ascontiguousarray(buf).reshape(-1, order="A") if isinstance(buf, np.ndarray) else buf
    if zarray["compressor"]:
        buf = numcodecs.get_codec(zarray["compressor"]).encode(buf)
    return bytes(np.ascontiguousarray(np.frombuffer(bytes(memoryview(buf)), "u1")))


def random_data(rng: np.random.Generator, shape, dtype: str) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dt.kind == "f":
        return rng.standard_normal(shape).astype(dt)
    info = np.iinfo(dt)
    return rng.integers(max(info.min, -1000), min(info.max, 1000), size=shape, endpoint=True).astype(dt)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(zarray=v2_arrays(), seed=st.integers(0, 2**32 - 1), shard_bytes=st.sampled_from([1, 64, 4096]))
def test_created_arrays_are_shown_as_written_and_store_what_zarr2_reads(zarray, seed, shard_bytes, tmp_path_factory):
    import zarr

    doc = array_doc(zarray, {}, shard_bytes)
    info = describe_array(doc)
    shown = json.loads(info.zarray)
    assert rewrite_kind(zarray, shown, (shown["fill_value"], doc["fill_value"])) == "same", shown
    assert info.chunk.transcoder is None, "created arrays are never transcoded"
    grid = [math.ceil(s / c) for s, c in zip(zarray["shape"], zarray["chunks"])]
    itemsize = np.dtype(zarray["dtype"]).itemsize
    assert tuple(info.layout.chunks_per_shard) == shard_counts(math.prod(zarray["chunks"]) * itemsize, tuple(grid),
                                                                 shard_bytes)

    root = tmp_path_factory.mktemp("create")
    (root / "a").mkdir()
    (root / "a" / "zarr.json").write_text(json.dumps(doc))
    data = random_data(np.random.default_rng(seed), zarray["shape"], zarray["dtype"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        zarr.open_array(str(root / "a"), mode="r+")[...] = data
    source = LocalStorage(str(root))
    layout = info.layout
    for coords in itertools.product(*map(range, grid)):
        shard, pos = layout.locate(coords)
        key = "a/" + layout.keys.key(shard)
        found = shard_mod.read_index_sync(source, key, layout.index)
        ext = None if found is None else shard_mod.extent(key, found[0], found[1], pos)
        region = tuple(slice(c * n, min((c + 1) * n, s)) for c, n, s in zip(coords, zarray["chunks"], zarray["shape"]))
        block = data[region]
        if ext is None:  # zarr 3 skips chunks equal to the fill value
            assert np.all(block == np.asarray(doc["fill_value"], dtype=block.dtype) if doc["fill_value"] not in
                          ("NaN",) else np.isnan(block))
            continue
        with open(Path(source.path(key)), "rb") as f:
            f.seek(ext.offset)
            stored = f.read(ext.nbytes)
        file = info.chunk.to_file(stored)
        decoded = v2_decode(shown, file)
        np.testing.assert_array_equal(decoded[tuple(slice(0, b.stop - b.start) for b in region)], block)
        assert info.chunk.check(v2_encode(shown, decoded)) is None
        assert info.chunk.check(file) is None


@pytest.mark.parametrize("grid,target,want", [
    ((5, 3), 512 // 48, (2, 3)),      # doubling last dim first, capped at the grid
    ((100, 100), 64, (8, 8)),         # 64 chunks: 1x2, 2x2, 2x4, 4x4, 4x8, 8x8
    ((0,), 10, (1,)),                 # an empty dimension still gets one chunk per shard
    ((), 1, ()),
])
def test_shard_counts_rule(grid, target, want):
    assert shard_counts(1, grid, target) == want
