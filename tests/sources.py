"""Every v3 source the tests mount, built without shardfs, and the oracles that check them.

One module for all builders:

- codec JSON (``LE``, ``BE``, ``CRC``, ``gzip``, ``zstd``, ``blosc``, ``transpose``,
  ``sharding``, ``nested_codecs``, ``key_encoding``) and ``write_group`` / ``write_zarr3``
  (metadata written as v3 JSON, data written by zarr-python 3): testkit/v3.py, shared with
  scripts/soak, named here too;
- the read matrix (``ArrayCase``, ``CASES``, ``build_matrix``): small arrays covering every
  axis (index location/endianness/checksum, 1-D..4-D, edge and empty shards, dtypes and
  fill values, key encodings, inner chains, zarr-python 3 and tensorstore writers), with
  which inner chunks are stored computed from the data (both writers skip fill-only chunks);
- the write sources (``Spec``, ``build``): arrays with data in some regions before the
  mount, the v2 bytes a client would write (numcodecs), and the checks after ``umount``
  (``assert_source_equals`` reads with zarr-python 3 AND tensorstore ``zarr3``,
  ``leftovers``, the journal);
- any-codec arrays (``write_v3``, ``hashed_array``, ``copy_array``) and the 2022 sharding
  storage-transformer draft (``write_draft``, and ``read_draft``, the reference decoder:
  no library writes or reads the draft).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import shutil
import tempfile
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np

from conftest import read_native, read_ts3_native
from shardfs.writes.journal import segments_under
from shardfs.app.state import LEGACY_DIR, journal_dir
from testkit.v3 import (  # noqa: F401  (re-exported: the tests import them from here)
    bytes_codec, gzip, zstd, blosc, transpose, LE, BE, CRC, GZIP, ZSTD, key_encoding, sharding, nested_codecs,
    chunk_key, write_group, write_zarr3, array_doc,
)

NAN, INF = float("nan"), float("inf")
EMPTY = 2**64 - 1  # an index entry's offset and length for an empty inner chunk

def write_v3(path: Path, data: np.ndarray, chunk_shape, codecs: list[dict], fill=0,
             key_encoding: dict | None = None) -> None:
    """Write ``data`` as a v3 array at ``path`` (a new directory) with zarr-python 3."""
    Path(path).mkdir(parents=True)
    write_zarr3(path, array_doc(data.shape, data.dtype.name, chunk_shape, codecs, fill, key_encoding),
                [((...), data)])


def random_data(shape, dtype, seed, fill=()) -> np.ndarray:
    """Random non-zero values, with the ``fill`` regions set to 0 (the fill value)."""
    d = np.random.default_rng(seed).integers(1, 30000, size=shape).astype(dtype)
    for region in fill:
        d[region] = 0
    return d


def hashed_array(src: Path, data: np.ndarray, chunk_shape, codecs: list[dict]) -> str:
    """Write ``data`` as a v3 array under ``src`` named by a digest of all arguments (once); its name.

    For hypothesis examples read through a module-scoped mount of ``src``: an
    example that comes again reuses the array it wrote before. The name is the same
    in every process (no ``hash()``), so a failing example names the same array.
    """
    name = digest_name(data.shape, list(chunk_shape), codecs, data.dtype.str, data.tobytes().hex())
    if not (Path(src) / name).exists():
        write_v3(Path(src) / name, data, chunk_shape, codecs)
    return name


def digest_name(*parts) -> str:
    """A short array name determined by ``parts`` (JSON-serializable)."""
    return "h" + hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def copy_array(src: Path, dst: Path) -> Path:
    """A private copy of a v3 array under a fresh root group (for tests that write)."""
    write_group(dst)
    shutil.copytree(src, Path(dst) / Path(src).name)
    return Path(dst)


# ------------------------------------------------------------------ geometry


class Geometry:
    """Chunk arithmetic of an array with ``shape``, inner ``chunk`` and ``shard`` shapes."""

    shape: tuple[int, ...]
    chunk: tuple[int, ...]
    shard: tuple[int, ...] | None
    dtype: str
    fill: Any

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def chunks_per_shard(self) -> tuple[int, ...]:
        assert self.shard is not None
        return tuple(s // c for s, c in zip(self.shard, self.chunk))

    @property
    def inner_grid(self) -> tuple[int, ...]:
        """Inner chunks that intersect the array, per dimension."""
        return tuple(math.ceil(s / c) for s, c in zip(self.shape, self.chunk))

    @property
    def shard_grid(self) -> tuple[int, ...]:
        assert self.shard is not None
        return tuple(math.ceil(s / c) for s, c in zip(self.shape, self.shard))

    def chunk_region(self, idx) -> tuple[slice, ...]:
        return tuple(slice(i * c, min((i + 1) * c, s)) for i, c, s in zip(idx, self.chunk, self.shape))

    def shard_of(self, idx) -> tuple[int, ...]:
        return tuple(i // n for i, n in zip(idx, self.chunks_per_shard))

    @staticmethod
    def chunk_name(idx) -> str:
        """Name of inner chunk ``idx`` inside its shard directory (and at the root with ".")."""
        return ".".join(map(str, idx))

    def padded_chunk(self, full: np.ndarray, idx) -> np.ndarray:
        """The v2 chunk ``idx`` of array ``full``: full chunk shape, fill beyond the edge."""
        block = np.full(self.chunk, self.fill, dtype=self.dtype)
        region = self.chunk_region(idx)
        block[tuple(slice(0, r.stop - r.start) for r in region)] = full[region]
        return block


# ------------------------------------------------------------------ the read matrix


@dataclass(frozen=True)
class ArrayCase(Geometry):
    id: str
    shape: tuple[int, ...]
    chunk: tuple[int, ...]  # inner chunk shape (the v2 view's "chunks")
    shard: tuple[int, ...] | None  # shard shape; None = unsharded v3 array
    dtype: str
    fill: Any
    inner: tuple[dict, ...]  # inner codec chain (the array's chain when unsharded)
    index_location: str = "end"
    index_endian: str = "little"
    index_crc: bool = True
    key_encoding: dict = field(default_factory=lambda: key_encoding("default", "/"))
    writer: str = "zarr"  # or "tensorstore"
    path: str | None = None  # relative to the source root; default: id
    empty_frac: float = 0.3
    forced_empty: tuple[tuple[int, ...], ...] = ()  # inner chunks forced to fill
    forced_stored: tuple[tuple[int, ...], ...] = ()  # inner chunks forced non-fill
    empty_shards: tuple[tuple[int, ...], ...] = ()  # shards whose chunks are all fill
    attrs: dict = field(default_factory=dict)
    # Expectations for .zarray
    expect_compressor: Any = None  # dict (exact), callable(dict)->bool, or None
    expect_order: str | None = "C"  # None: do not check
    expect_byteorder: str = "<"  # "<", ">" or "|"
    passthrough: bool = True  # chunk files are the stored bytes (minus a trailing crc32c)

    @property
    def relpath(self) -> str:
        return self.path or self.id

    @property
    def sharded(self) -> bool:
        return self.shard is not None

    @property
    def inner_crc(self) -> bool:
        return bool(self.inner) and self.inner[-1]["name"] == "crc32c"

    # -- key encodings -------------------------------------------------------------

    @property
    def source_separator(self) -> str:
        conf = self.key_encoding.get("configuration") or {}
        return conf.get("separator") or ("/" if self.key_encoding["name"] == "default" else ".")

    @property
    def view_separator(self) -> str:
        """The view's dimension_separator: "/" iff the source uses v2 keys with "."."""
        if self.key_encoding["name"] == "v2" and self.source_separator == ".":
            return "/"
        return "."

    def source_key(self, idx: tuple[int, ...]) -> str:
        """Key (path relative to the array) of the stored shard/chunk ``idx`` in the source."""
        return chunk_key(self.key_encoding, idx)

    def shard_dir(self, shard_idx: tuple[int, ...]) -> str:
        """Path (relative to the array) of a shard's directory in the view."""
        key = self.source_key(shard_idx)
        if self.key_encoding["name"] == "v2" and self.ndim == 1:
            key += ".shard"
        return key

    def chunk_file(self, idx: tuple[int, ...]) -> str:
        """v2 key of inner chunk ``idx`` at the array root of the view."""
        return self.view_separator.join(map(str, idx))

    def beyond_edge_chunks(self) -> list[tuple[int, ...]]:
        """Inner chunks inside some shard's grid but wholly outside the array."""
        if not self.sharded:
            return []
        full = tuple(g * c for g, c in zip(self.shard_grid, self.chunks_per_shard))
        return [i for i in itertools.product(*map(range, full))
                if any(a >= b for a, b in zip(i, self.inner_grid))]

    # -- v2 expectations -----------------------------------------------------------

    def expected_v2_dtype(self) -> str:
        dt = np.dtype(self.dtype)
        return ("|" if dt.itemsize == 1 or dt.kind == "b" else self.expect_byteorder) + dt.str[1:]

    def expected_v2_fill(self):
        return v2_fill_json(self.dtype, self.fill)


def _fill_scalar(v):
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "Infinity" if v > 0 else "-Infinity"
    return v


def v3_fill_json(dtype: str, fill):
    if np.dtype(dtype).kind == "c":
        c = complex(fill)
        return [_fill_scalar(c.real), _fill_scalar(c.imag)]
    return _fill_scalar(fill)


v2_fill_json = v3_fill_json  # same spellings ("NaN", "Infinity", [re, im])


def fill_scalar(case: ArrayCase):
    return np.array(case.fill, dtype=case.dtype)[()]


CASES: list[ArrayCase] = [
    # The "raw" array of the design doc: known layout for literal-path tests.
    ArrayCase(
        "raw", shape=(10, 13, 7), chunk=(2, 2, 2), shard=(4, 4, 4), dtype="uint16", fill=0,
        inner=(LE,), empty_frac=0.2,
        forced_stored=((0, 0, 0), (0, 0, 1), (4, 6, 3)),
        forced_empty=((0, 1, 0),), empty_shards=((1, 0, 0),),
        attrs={"description": "raw", "scale": [1.0, 0.5, 0.25]},
    ),
    ArrayCase(
        "i32_2d_end_le_crc_dotkeys", shape=(13, 19), chunk=(4, 4), shard=(8, 8), dtype="int32", fill=-7,
        inner=(LE,), key_encoding=key_encoding("default", "."),
    ),
    ArrayCase(
        "u8_3d_start_be_nocrc_gzip", shape=(9, 10, 11), chunk=(2, 2, 3), shard=(4, 4, 6), dtype="uint8",
        fill=255, inner=(bytes_codec(None), gzip(5)), index_location="start", index_endian="big",
        index_crc=False, expect_compressor={"id": "gzip", "level": 5},
    ),
    ArrayCase(
        "f64_2d_nanfill_zstd_v2dot", shape=(10, 12), chunk=(3, 4), shard=(6, 8), dtype="float64", fill=NAN,
        inner=(LE, zstd(3)), index_endian="big", key_encoding=key_encoding("v2", "."),
        expect_compressor={"id": "zstd", "level": 3},
    ),
    ArrayCase(
        "f32_1d_inffill_blosc_v2slash", shape=(50,), chunk=(4,), shard=(16,), dtype="float32", fill=INF,
        inner=(LE, blosc("lz4", 5, "shuffle", 4)), index_location="start",
        key_encoding=key_encoding("v2", "/"),
        expect_compressor=lambda c: c is not None and c.get("id") == "blosc" and c.get("cname") == "lz4"
        and c.get("clevel") == 5 and c.get("shuffle") == 1 and "typesize" not in c,
    ),
    ArrayCase(
        "f16_4d_neginffill_transposeF", shape=(3, 4, 5, 6), chunk=(1, 2, 2, 2), shard=(2, 2, 4, 4),
        dtype="float16", fill=-INF, inner=(transpose((3, 2, 1, 0)), LE), index_crc=False,
        expect_order="F",
    ),
    ArrayCase(
        "i64_2d_be_innercrc32c", shape=(7, 9), chunk=(2, 2), shard=(4, 4), dtype="int64", fill=1234567890123,
        inner=(BE, CRC), index_location="start", expect_byteorder=">",
    ),
    ArrayCase(
        "i8_1d_gzip_v2dot", shape=(100,), chunk=(8,), shard=(32,), dtype="int8", fill=-1,
        inner=(bytes_codec(None), gzip(1)), key_encoding=key_encoding("v2", "."),
        expect_compressor={"id": "gzip", "level": 1},
    ),
    ArrayCase(
        "bool_3d_noedge_indexbe", shape=(8, 8, 4), chunk=(2, 2, 2), shard=(4, 4, 4), dtype="bool", fill=False,
        inner=(bytes_codec(None),), index_endian="big", index_crc=False, empty_shards=((1, 1, 0),),
    ),
    ArrayCase(
        "c64_2d_zstd", shape=(6, 10), chunk=(2, 2), shard=(4, 4), dtype="complex64", fill=0j,
        inner=(LE, zstd(1)), expect_compressor={"id": "zstd", "level": 1},
    ),
    ArrayCase(
        "c128_2d_fill_be_gzip_v2slash", shape=(5, 7), chunk=(2, 4), shard=(4, 4), dtype="complex128",
        fill=1.5 - 2.5j, inner=(BE, gzip(6)), index_location="start", index_endian="big",
        key_encoding=key_encoding("v2", "/"), expect_byteorder=">",
        expect_compressor={"id": "gzip", "level": 6},
    ),
    ArrayCase(
        "u64_2d_bigfill_gzip_crc32c_dotkeys", shape=(9, 9), chunk=(3, 3), shard=(6, 6), dtype="uint64",
        fill=2**64 - 2, inner=(LE, gzip(4), CRC), key_encoding=key_encoding("default", "."),
        expect_compressor={"id": "gzip", "level": 4},
    ),
    # Written by tensorstore's zarr3 driver.
    ArrayCase(
        "i16_3d_ts_start_be_zstd", shape=(9, 10, 11), chunk=(2, 2, 2), shard=(4, 4, 4), dtype="int16", fill=5,
        inner=(LE, zstd(2)), index_location="start", index_endian="big", index_crc=False,
        key_encoding={"name": "default"}, writer="tensorstore", expect_compressor={"id": "zstd", "level": 2},
    ),
    ArrayCase(
        "u32_2d_ts_be_gzip_dotkeys", shape=(13, 17), chunk=(4, 4), shard=(8, 8), dtype="uint32", fill=0,
        inner=(BE, gzip(3)), key_encoding=key_encoding("default", "."), writer="tensorstore",
        expect_byteorder=">", expect_compressor={"id": "gzip", "level": 3},
    ),
    ArrayCase(
        "f32_2d_ts_nanfill_blosc_v2dot", shape=(10, 11), chunk=(2, 3), shard=(4, 6), dtype="float32", fill=NAN,
        inner=(LE, blosc("zstd", 3, "bitshuffle", 4)), key_encoding=key_encoding("v2", "."),
        writer="tensorstore",
        expect_compressor=lambda c: c is not None and c.get("id") == "blosc" and c.get("cname") == "zstd"
        and c.get("clevel") == 3 and c.get("shuffle") == 2 and "typesize" not in c,
    ),
    ArrayCase(
        "u16_1d_ts_innercrc32c_v2slash", shape=(45,), chunk=(5,), shard=(20,), dtype="uint16", fill=7,
        inner=(LE, CRC), key_encoding=key_encoding("v2", "/"), writer="tensorstore",
        index_location="start",
    ),
    # Unsharded v3 array: each chunk file maps to one stored chunk.
    ArrayCase(
        "u32_2d_unsharded_gzip", shape=(10, 10), chunk=(4, 4), shard=None, dtype="uint32", fill=9,
        inner=(LE, gzip(2)), expect_compressor={"id": "gzip", "level": 2},
    ),
    # A chain v2 cannot express (non-reversed transpose): transcoded, compressor null.
    ArrayCase(
        "u16_3d_transpose102_transcoded", shape=(6, 5, 4), chunk=(2, 2, 2), shard=(4, 4, 4), dtype="uint16",
        fill=3, inner=(transpose((1, 0, 2)), LE, gzip(1)), expect_order=None, passthrough=False,
    ),
    # Inside nested groups.
    ArrayCase(
        "f64_1d_in_nested_group", path="grp/sub/deep", shape=(20,), chunk=(4,), shard=(8,), dtype="float64",
        fill=0.25, inner=(LE,), attrs={"units": "m"},
    ),
]

CASES_BY_ID = {c.id: c for c in CASES}

ROOT_ATTRS = {"title": "shardfs read matrix", "nested": {"a": [1, 2, 3], "b": None}}
GROUP_ATTRS: dict[str, dict[str, Any]] = {"grp": {"level": 1}, "grp/sub": {"level": 2, "name": "sub"}, "grp/empty": {}}


def make_data(case: ArrayCase) -> np.ndarray:
    """Deterministic data with some inner chunks (and whole shards) left as fill."""
    rng = np.random.default_rng(zlib.crc32(case.id.encode()))
    dt = np.dtype(case.dtype)
    if dt.kind == "b":
        data = rng.random(case.shape) < 0.5
    elif dt.kind in "iu":
        info = np.iinfo(dt)
        data = rng.integers(info.min, info.max, size=case.shape, dtype=dt, endpoint=True)
    elif dt.kind == "f":
        data = (rng.standard_normal(case.shape) * 100).astype(dt)
        specials = rng.random(case.shape)
        data[specials < 0.03] = np.nan
        data[(specials >= 0.03) & (specials < 0.05)] = np.inf
        data[(specials >= 0.05) & (specials < 0.06)] = -np.inf
    elif dt.kind == "c":
        data = (rng.standard_normal(case.shape) + 1j * rng.standard_normal(case.shape)).astype(dt)
    else:
        raise AssertionError(dt)
    fill = fill_scalar(case)
    for idx in itertools.product(*map(range, case.inner_grid)):
        if rng.random() < case.empty_frac:
            data[case.chunk_region(idx)] = fill
    for idx in case.forced_empty:
        data[case.chunk_region(idx)] = fill
    for s in case.empty_shards:
        assert case.shard is not None  # empty shards: a sharded case
        region = tuple(slice(i * n, (i + 1) * n) for i, n in zip(s, case.shard))
        data[region] = fill
    for idx in case.forced_stored:
        region = case.chunk_region(idx)
        if _all_fill(data[region], fill):
            flat = data[region].reshape(-1)
            flat[0] = _not_fill(dt, fill)
            data[region] = flat.reshape(data[region].shape)
    return data


def _not_fill(dt: np.dtype, fill):
    if dt.kind == "b":
        return not fill
    return np.array(1, dtype=dt) if fill != 1 else np.array(2, dtype=dt)


def _all_fill(block: np.ndarray, fill) -> bool:
    return bool(np.array_equal(block, np.full(block.shape, fill, dtype=block.dtype),
                               equal_nan=block.dtype.kind in "fc"))


def stored_chunks(case: ArrayCase, data: np.ndarray) -> set[tuple[int, ...]]:
    """Inner chunks whose in-bounds part is not all fill: exactly the ones written."""
    fill = fill_scalar(case)
    return {idx for idx in itertools.product(*map(range, case.inner_grid))
            if not _all_fill(data[case.chunk_region(idx)], fill)}


def empty_in_bounds_chunks(case: ArrayCase, data: np.ndarray) -> list[tuple[int, ...]]:
    stored = stored_chunks(case, data)
    return [i for i in itertools.product(*map(range, case.inner_grid)) if i not in stored]


def v3_metadata(case: ArrayCase) -> dict:
    if case.sharded:
        index_codecs = [bytes_codec(case.index_endian)] + ([CRC] if case.index_crc else [])
        codecs, grid = [sharding(case.chunk, case.inner, index_codecs, case.index_location)], case.shard
    else:
        codecs, grid = list(case.inner), case.chunk
    return array_doc(case.shape, case.dtype, grid, codecs, v3_fill_json(case.dtype, case.fill),
                     case.key_encoding, case.attrs)


def write_case(case: ArrayCase, root: Path, data: np.ndarray | None = None) -> np.ndarray:
    """Write ``case`` under ``root / case.relpath``; return the data written."""
    data = make_data(case) if data is None else data
    path = Path(root) / case.relpath
    meta = v3_metadata(case)
    if case.writer == "zarr":
        write_zarr3(path, meta, [((...), data)])
    elif case.writer == "tensorstore":
        import tensorstore as ts

        ts_meta = {k: v for k, v in meta.items() if k != "attributes"}
        t = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path)},
                     "metadata": ts_meta, "create": True}).result()
        t.write(data).result()
        if case.attrs:
            m = json.loads((path / "zarr.json").read_text())
            m["attributes"] = dict(case.attrs)
            (path / "zarr.json").write_text(json.dumps(m))
    else:
        raise AssertionError(case.writer)
    return data


def build_matrix(root: Path, cases=CASES) -> dict[str, np.ndarray]:
    """The whole matrix as one hierarchy under ``root``; returns ``{case.id: data}``."""
    root = Path(root)
    write_group(root, ROOT_ATTRS)
    for g, attrs in GROUP_ATTRS.items():
        write_group(root / g, attrs)
    return {c.id: write_case(c, root) for c in cases}


def read_index(case: ArrayCase, shard_bytes: bytes) -> np.ndarray:
    """The shard's index as an ``chunks_per_shard + (2,)`` uint64 array (no checks)."""
    n = int(np.prod(case.chunks_per_shard))
    size = 16 * n + (4 if case.index_crc else 0)
    raw = shard_bytes[:size] if case.index_location == "start" else shard_bytes[len(shard_bytes) - size:]
    dt = ">u8" if case.index_endian == "big" else "<u8"
    return np.frombuffer(raw[: 16 * n], dtype=dt).astype(np.uint64).reshape(case.chunks_per_shard + (2,))


def stored_inner_bytes(case: ArrayCase, array_root: Path, idx: tuple[int, ...]) -> bytes | None:
    """The bytes of inner chunk ``idx`` as stored in its shard (None if empty/absent)."""
    shard_idx = case.shard_of(idx)
    f = Path(array_root) / case.source_key(shard_idx)
    if not f.exists():
        return None
    blob = f.read_bytes()
    local = tuple(i - s * c for i, s, c in zip(idx, shard_idx, case.chunks_per_shard))
    off, n = (int(x) for x in read_index(case, blob)[local])
    if off == EMPTY:
        return None
    return blob[off:off + n]


# ------------------------------------------------------------------ write sources

TEMP_SUFFIXES = (".partial", ".__lock", ".shardfs-tmp")
_DTYPE_NAMES = {"<i4": "int32", "<u2": "uint16", "<f8": "float64", "<i2": "int16"}


@dataclass(frozen=True)
class Spec(Geometry):
    """One sharded array for the write tests: geometry, codecs and the regions written before mounting."""

    name: str
    shape: tuple[int, ...]
    chunk: tuple[int, ...]
    shard: tuple[int, ...]
    dtype: str
    fill: float | int
    compressor: tuple[str, int]  # ("zstd", level) or ("gzip", level)
    inner_crc: bool
    index_location: str
    index_crc: bool
    initial: tuple[tuple[slice, ...], ...]  # regions holding data before the mount
    write: tuple[slice, ...]  # the region the client writers write

    def shard_key(self, shard_idx) -> str:
        """The shard's key below the source root (``name/c/i/j``)."""
        return "/".join((self.name, "c", *map(str, shard_idx)))

    def shard_file(self, src: Path, shard_idx) -> Path:
        return Path(src) / self.shard_key(shard_idx)

    def codec(self):
        kind, level = self.compressor
        return numcodecs.Zstd(level=level) if kind == "zstd" else numcodecs.GZip(level=level)

    def v3_metadata(self) -> dict:
        kind, level = self.compressor
        inner = [LE, zstd(level) if kind == "zstd" else gzip(level)] + ([CRC] if self.inner_crc else [])
        index = [LE] + ([CRC] if self.index_crc else [])
        return array_doc(self.shape, _DTYPE_NAMES[self.dtype], self.shard,
                         [sharding(self.chunk, inner, index, self.index_location)], self.fill,
                         attrs={"origin": self.name})

    def values(self, shape, seed: int) -> np.ndarray:
        """Random non-fill values of this dtype."""
        rng = np.random.default_rng(seed)
        if np.dtype(self.dtype).kind == "f":
            v = rng.standard_normal(shape) * 1000
        else:
            info = np.iinfo(np.dtype(self.dtype))
            v = rng.integers(max(info.min, -30000), min(info.max, 30000), size=shape)
        v = v.astype(self.dtype)
        v[v == self.fill] = self.fill + 1
        return v

    def encode(self, block: np.ndarray) -> bytes:
        """The bytes of a v2 chunk file holding ``block`` (the view's compressor, no crc32c)."""
        assert block.shape == self.chunk
        return bytes(self.codec().encode(np.ascontiguousarray(block, dtype=self.dtype).tobytes()))

    def decode(self, data: bytes) -> np.ndarray:
        raw = self.codec().decode(data)
        return np.frombuffer(raw, dtype=self.dtype).reshape(self.chunk)


def build(src: Path, specs, seed: int = 1) -> dict[str, np.ndarray]:
    """Write a v3 group at ``src`` with ``specs``; return name -> expected numpy array."""
    write_group(src)
    out = {}
    for k, spec in enumerate(specs):
        expected = np.full(spec.shape, spec.fill, dtype=spec.dtype)
        regions = []
        for j, region in enumerate(spec.initial):
            block = spec.values(expected[region].shape, seed * 1000 + k * 10 + j)
            expected[region] = block
            regions.append((region, block))
        write_zarr3(Path(src) / spec.name, spec.v3_metadata(), regions)
        out[spec.name] = expected
    return out


def assert_read_equals(got: np.ndarray, expected: np.ndarray, what: str) -> None:
    """``got`` (an oracle's read of a source array, ``what``) is ``expected``: shape and values."""
    assert got.shape == expected.shape, f"{what}: shape {got.shape}"
    if not np.array_equal(got, expected, equal_nan=True):
        bad = np.argwhere(~((got == expected) | (np.isnan(got) & np.isnan(expected))
                            if got.dtype.kind == "f" else got == expected))
        raise AssertionError(
            f"{what}: {len(bad)} elements differ, first at {tuple(bad[0])}: "
            f"got {got[tuple(bad[0])]!r}, expected {expected[tuple(bad[0])]!r}")


def assert_source_equals(src: Path, name: str, expected: np.ndarray) -> None:
    """zarr-python 3 and tensorstore zarr3 both read ``src/name`` as ``expected``."""
    for reader in (read_native, read_ts3_native):
        assert_read_equals(reader(Path(src) / name), expected, f"{name} via {reader.__name__}")


def is_temp_name(name: str) -> bool:
    """A writer's temporary (or lock) file name: never left in a source after ``umount``."""
    return name.endswith(TEMP_SUFFIXES) or "shardfs-tmp" in name or ".partial" in name or "__lock" in name


def leftovers(src: Path) -> list[str]:
    """Temp files anywhere in the source, anything in ``SRC/.shardfs`` (the source holds only
    Zarr data), and files in the journal directory (``journal/<name>``)."""
    src = Path(src)
    bad = []
    for dirpath, _dirs, files in os.walk(src):
        for f in files:
            if is_temp_name(f):
                bad.append(os.path.relpath(os.path.join(dirpath, f), src))
    if (src / LEGACY_DIR).exists():
        bad.append(LEGACY_DIR)
    bad += [f"journal/{n}" for n in journal_entries(src)]
    return sorted(bad)


def journal_path(src: Path | str, endpoint: str | None = None) -> Path:
    """The journal root of ``src`` (a directory, or a URL reached through ``endpoint``; in its
    state directory, under the suite's XDG_STATE_HOME): one directory per daemon, ``<start ns>-<pid>``."""
    return Path(journal_dir(str(src), endpoint=endpoint))


def journal_entries(src: Path | str, endpoint: str | None = None) -> list[str]:
    """The files in the daemons' journals, ``<daemon dir>/<segment>``: segments while changes
    are pending."""
    return segments_under(str(journal_path(src, endpoint)))


def journal_bytes(src: Path | str, endpoint: str | None = None) -> int:
    """Total size of the journal's files: at least the stored bytes of every pending chunk."""
    root = journal_path(src, endpoint)
    return sum((root / n).stat().st_size for n in journal_entries(src, endpoint))


def all_chunks(spec: Spec):
    return itertools.product(*map(range, spec.inner_grid))


def chunks_touching(spec: Spec, region) -> list[tuple[int, ...]]:
    ranges = [range(r.start // c, (r.stop - 1) // c + 1) for r, c in zip(region, spec.chunk)]
    return list(itertools.product(*ranges))


# ------------------------------------------------------------------ the draft

DRAFT_URI = "https://purl.org/zarr/spec/storage_transformers/sharding/1.0"


def _draft_geometry(doc: dict, cps) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(inner chunk grid, shard grid)`` of an array."""
    chunk = doc["chunk_grid"]["configuration"]["chunk_shape"]
    grid = tuple(math.ceil(s / c) for s, c in zip(doc["shape"], chunk))
    return grid, tuple(math.ceil(g / n) for g, n in zip(grid, cps))


def write_draft(path: Path, data: np.ndarray, chunk_shape, cps, codecs: list[dict], fill=0,
                key_encoding: dict | None = None, spec_name: str = "storage_transformer",
                order: str = "reversed") -> None:
    """Write ``data`` at ``path`` in the draft sharding format, ``cps`` chunks per shard.

    No library writes the draft: the inner chunks of an *unsharded* v3 array are
    written with zarr-python 3's own codecs and packed into shards by hand (chunks,
    then little-endian ``(offset, length)`` uint64 pairs in C order, no checksum).
    Chunks go into each shard in ``order`` ("reversed" C order or "C"), with one
    unused byte between chunks: readers must go by the index alone.
    """
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "plain"
        write_v3(plain, data, chunk_shape, codecs, fill, key_encoding)
        doc = json.loads((plain / "zarr.json").read_text())
        enc = doc["chunk_key_encoding"]
        grid, shards = _draft_geometry(doc, cps)
        path.mkdir(parents=True)
        for shard in itertools.product(*map(range, shards)):
            body, index = bytearray(), np.full((math.prod(cps), 2), EMPTY, dtype="<u8")
            local = list(itertools.product(*map(range, cps)))
            for pos in (reversed(range(len(local))) if order == "reversed" else range(len(local))):
                coords = tuple(s * n + i for s, n, i in zip(shard, cps, local[pos]))
                f = plain / chunk_key(enc, coords)
                if all(c < g for c, g in zip(coords, grid)) and f.is_file():
                    chunk = f.read_bytes()
                    index[pos] = (len(body), len(chunk))
                    body += chunk + b"\xa5"
            if body:
                target = path / chunk_key(enc, shard)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(bytes(body) + index.tobytes())
        doc["storage_transformers"] = [{spec_name: DRAFT_URI,
                                        "configuration": {"format": "indexed", "chunks_per_shard": list(cps)}}]
        (path / "zarr.json").write_text(json.dumps(doc))


def read_draft(path: Path) -> np.ndarray:
    """The reference decoder: the draft array at ``path`` unpacked into an unsharded array
    and read through zarr-python 3's codecs."""
    doc = json.loads((Path(path) / "zarr.json").read_text())
    (t,) = doc.pop("storage_transformers")
    cps = t["configuration"]["chunks_per_shard"]
    enc = doc["chunk_key_encoding"]
    grid, shards = _draft_geometry(doc, cps)
    n = math.prod(cps)
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "plain"
        write_zarr3(plain, doc)
        for shard in itertools.product(*map(range, shards)):
            f = Path(path) / chunk_key(enc, shard)
            if not f.is_file():
                continue
            raw = f.read_bytes()
            assert len(raw) >= 16 * n, f"{f}: shorter than its index"
            index = np.frombuffer(raw[-16 * n:], dtype="<u8").reshape(n, 2)
            for pos, local in enumerate(itertools.product(*map(range, cps))):
                offset, length = (int(v) for v in index[pos])
                if offset == EMPTY and length == EMPTY:
                    continue
                assert offset + length <= len(raw) - 16 * n, f"{f}: entry {pos} outside the data"
                coords = tuple(s * k + i for s, k, i in zip(shard, cps, local))
                assert all(c < g for c, g in zip(coords, grid)), f"{f}: chunk {coords} past the edge"
                out = plain / chunk_key(enc, coords)
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(raw[offset: offset + length])
        return read_native(plain)


def create_array(group, name, data, chunks, shards, fill, **kw):
    """A sharded v3 array ``group/name`` holding ``data`` (written with zarr 3)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = group.create_array(name, shape=data.shape, dtype=data.dtype, chunks=chunks, shards=shards,
                               fill_value=fill, **kw)
        a[...] = data
    return a
