"""Property tests of shardfs.format.index.IndexFormat against shards written by zarr-python 3.

Each example writes a random small sharded array (random shapes, inner chain,
index location/endianness/checksum, random empty inner chunks), then decodes
every shard's index with IndexFormat and checks it against the data: an entry
is empty iff the inner chunk was all fill, and every non-empty entry's bytes
decode (independently, with numpy/zlib/crc32c) to that inner chunk.
"""

from __future__ import annotations

import dataclasses
import gzip as gzip_mod
import itertools
import tempfile
from pathlib import Path

import crc32c
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import budget
from sources import BE, CRC, LE, ArrayCase, gzip, stored_chunks, write_case
from shardfs.format.index import EMPTY, CorruptIndex, IndexFormat

CHAINS = {
    "bytes_le": (LE,),
    "bytes_be": (BE,),
    "bytes_le_gzip": (LE, gzip(1)),
    "bytes_le_crc32c": (LE, CRC),
    "bytes_be_gzip_crc32c": (BE, gzip(3), CRC),
}


@st.composite
def cases(draw) -> ArrayCase:
    ndim = draw(st.integers(1, 3))
    cps = tuple(draw(st.lists(st.integers(1, 4), min_size=ndim, max_size=ndim)))
    chunk = tuple(draw(st.lists(st.integers(1, 3), min_size=ndim, max_size=ndim)))
    shard = tuple(c * n for c, n in zip(chunk, cps))
    shape = tuple(draw(st.integers(1, 2 * s + 1)) for s in shard)
    chain = draw(st.sampled_from(sorted(CHAINS)))
    return ArrayCase(
        id=f"h{draw(st.integers(0, 2**31))}",
        shape=shape, chunk=chunk, shard=shard,
        dtype=draw(st.sampled_from(["uint8", "int16", "float32", "float64"])),
        fill=draw(st.sampled_from([0, 3])),
        inner=CHAINS[chain],
        index_location=draw(st.sampled_from(["start", "end"])),
        index_endian=draw(st.sampled_from(["little", "big"])),
        index_crc=draw(st.booleans()),
        empty_frac=draw(st.sampled_from([0.0, 0.3, 0.7, 1.0])),
    )


def fmt_of(case: ArrayCase) -> IndexFormat:
    return IndexFormat(case.chunks_per_shard, big_endian=case.index_endian == "big",
                       checksum=case.index_crc, at_start=case.index_location == "start")


def decode_inner(case: ArrayCase, blob: bytes) -> np.ndarray:
    """Decode one inner chunk's stored bytes without zarr."""
    names = [c["name"] for c in case.inner]
    if names[-1] == "crc32c":
        body, stored = blob[:-4], int.from_bytes(blob[-4:], "little")
        assert crc32c.crc32c(body) == stored, "inner crc32c mismatch"
        blob = body
    if "gzip" in names:
        blob = gzip_mod.decompress(blob)
    endian = ">" if case.inner[0]["configuration"]["endian"] == "big" else "<"
    dt = np.dtype(case.dtype).newbyteorder(endian)  # type: ignore[arg-type]  # "<" or ">", from the case
    return np.frombuffer(blob, dtype=dt).reshape(case.chunk)


def write(case: ArrayCase, root: Path) -> tuple[np.ndarray, Path]:
    data = write_case(case, root)
    return data, root / case.relpath


def shard_files(case: ArrayCase, arr: Path):
    for s in itertools.product(*map(range, case.shard_grid)):
        yield s, arr / case.source_key(s)


@settings(max_examples=budget(100))
@given(case=cases())
def test_decode_matches_what_zarr_wrote(case):
    fmt = fmt_of(case)
    assert fmt.nbytes == 16 * int(np.prod(case.chunks_per_shard)) + (4 if case.index_crc else 0)
    with tempfile.TemporaryDirectory() as d:
        data, arr = write(case, Path(d))
        stored = stored_chunks(case, data)
        seen = set()
        for s, f in shard_files(case, arr):
            local_grid = list(itertools.product(*map(range, case.chunks_per_shard)))
            globals_ = [tuple(si * c + li for si, c, li in zip(s, case.chunks_per_shard, loc)) for loc in local_grid]
            if not f.exists():
                assert not (set(globals_) & stored), f"shard {s} missing but has stored chunks"
                continue
            blob = f.read_bytes()
            off, length = fmt.index_range(len(blob))
            assert length == fmt.nbytes
            assert off == (0 if case.index_location == "start" else len(blob) - fmt.nbytes)
            raw = blob[off:off + length]
            table = fmt.decode(raw, len(blob))
            assert table.shape == (len(local_grid), 2) and table.dtype == np.uint64
            assert fmt.encode(table) == raw
            spans = []
            for row, g in zip(table, globals_):
                o, n = int(row[0]), int(row[1])
                if g not in stored:
                    assert (o, n) == (int(EMPTY), int(EMPTY)), f"chunk {g} should be empty"
                    continue
                assert o != int(EMPTY), f"chunk {g} should be stored"
                seen.add(g)
                spans.append((o, o + n))
                np.testing.assert_array_equal(decode_inner(case, blob[o:o + n]), case.padded_chunk(data, g))
            # Entries do not overlap each other or the index.
            spans.append((off, off + length))
            spans.sort()
            for (_, a1), (b0, _) in zip(spans, spans[1:]):
                assert a1 <= b0
        assert seen == stored


@st.composite
def written_shards(draw):
    """A shard file with at least one stored chunk, and its case."""
    case = draw(cases())
    return dataclasses.replace(case, empty_frac=0.0, forced_stored=((0,) * case.ndim,))


def first_shard(case: ArrayCase, root: Path) -> bytes:
    _, arr = write(case, root)
    return (arr / case.source_key((0,) * case.ndim)).read_bytes()


@settings(max_examples=budget(100))
@given(case=written_shards(), data=st.data())
def test_corrupt_indexes_are_rejected(case, data):
    fmt = fmt_of(case)
    with tempfile.TemporaryDirectory() as d:
        blob = first_shard(case, Path(d))
    size = len(blob)
    off, length = fmt.index_range(size)
    raw = blob[off:off + length]
    table = fmt.decode(raw, size)
    used = [i for i in range(len(table)) if table[i, 0] != EMPTY]
    assert used

    if fmt.checksum:
        # Any flipped byte (body or stored checksum) fails the crc32c.
        pos = data.draw(st.integers(0, len(raw) - 1), label="flipped byte")
        bad = bytearray(raw)
        bad[pos] ^= 1 << data.draw(st.integers(0, 7), label="bit")
        with pytest.raises(CorruptIndex):
            fmt.decode(bytes(bad), size)
        # A flipped bit of the stored checksum itself (the entries stay plausible).
        bad = bytearray(raw)
        bad[len(raw) - 4 + data.draw(st.integers(0, 3), label="checksum byte")] ^= 1 << data.draw(st.integers(0, 7))
        with pytest.raises(CorruptIndex):
            fmt.decode(bytes(bad), size)

    # A shard shorter than its index.
    short = data.draw(st.integers(0, fmt.nbytes - 1), label="truncated size")
    o2, l2 = fmt.index_range(short)
    assert o2 + l2 <= short
    with pytest.raises(CorruptIndex):
        fmt.decode(blob[:short][o2:o2 + l2], short)
    with pytest.raises(CorruptIndex):
        fmt.decode(raw[:-1], size)

    # An entry pointing outside the shard's data (re-encoded with a valid checksum).
    i = data.draw(st.sampled_from(used), label="entry")
    data_end = size if fmt.at_start else size - fmt.nbytes
    data_start = fmt.nbytes if fmt.at_start else 0
    how = data.draw(st.sampled_from(["offset_past_end", "length_past_end", "huge_length", "inside_index"]))
    t = table.copy()
    if how == "offset_past_end":
        t[i, 0] = data_end + data.draw(st.integers(0, 1000))
        t[i, 1] = max(1, int(t[i, 1]))
    elif how == "length_past_end":
        t[i, 1] = data_end - int(t[i, 0]) + data.draw(st.integers(1, 1000))
    elif how == "huge_length":
        t[i, 1] = 2**64 - 2
    else:
        if data_start == 0:
            t[i, 0] = data_end  # index at the end: starts inside the index
            t[i, 1] = 1
        else:
            t[i, 0] = data.draw(st.integers(0, data_start - 1))
    with pytest.raises(CorruptIndex):
        fmt.decode(fmt.encode(t), size)


@pytest.mark.parametrize("big_endian", [False, True])
def test_every_flipped_bit_fails_the_index_checksum(big_endian):
    """Not left to the examples drawn: a plausible table whose checksum is wrong is refused."""
    fmt = IndexFormat((2, 2), big_endian=big_endian, checksum=True, at_start=False)
    t = np.array([[0, 10], [10, 6], [EMPTY, EMPTY], [16, 4]], dtype=np.uint64)
    raw = fmt.encode(t)
    np.testing.assert_array_equal(fmt.decode(raw, 20 + fmt.nbytes), t)
    for bit in range(8 * len(raw)):
        bad = bytearray(raw)
        bad[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(CorruptIndex):
            fmt.decode(bytes(bad), 20 + fmt.nbytes)


def test_empty_rows_roundtrip_and_absurd_grids():
    fmt = IndexFormat((2, 3), big_endian=True, checksum=True, at_start=False)
    t = np.full((6, 2), EMPTY, dtype=np.uint64)
    t[1] = (0, 10)
    t[4] = (10, 5)
    raw = fmt.encode(t)
    assert len(raw) == fmt.nbytes == 6 * 16 + 4
    assert raw[16:24] == (0).to_bytes(8, "big") and raw[24:32] == (10).to_bytes(8, "big")
    np.testing.assert_array_equal(fmt.decode(raw, 15 + fmt.nbytes), t)
    with pytest.raises(CorruptIndex):
        fmt.decode(raw, 14 + fmt.nbytes)  # entry 4 now ends past the data
    with pytest.raises(ValueError):
        IndexFormat((2**20, 2**20))  # 2^40 inner chunks: refused before allocating anything
