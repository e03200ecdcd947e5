"""Builders of small sharded Zarr v3 sources, and what their v2 view must look like.

Each ``ArrayCase`` is one array (a few KB). ``build_matrix(root)`` writes them all
into one hierarchy (root group, nested groups with attributes) so a single mount
serves the whole read matrix. The cases cover each axis with a handful of
combined cases rather than the cartesian product:

- index at ``end``/``start``; index ``bytes`` little/big endian, with/without ``crc32c``;
- 1-D .. 4-D; edge shards past the array end; empty inner chunks and whole empty shards;
- dtypes bool, (u)int8..64, float16/32/64, complex64/128; fill NaN, +-Infinity, nonzero;
- chunk key encodings default "/" and "." and v2 "/" and ".";
- inner chains bytes le/be, transpose(reversed)+bytes, gzip, zstd, blosc, trailing crc32c,
  one transcoded chain (non-reversed transpose), and one unsharded array;
- writers: zarr-python 3 and tensorstore's ``zarr3`` driver.

Which inner chunks are stored is computed from the data written (an inner chunk
is stored iff its in-bounds part is not all fill value; both writers skip
fill-only chunks), independently of any zarr reader.
"""

from __future__ import annotations

import itertools
import json
import math
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

NAN, INF = float("nan"), float("inf")

# ------------------------------------------------------------------ v3 codec JSON


def bytes_codec(endian: str | None = "little") -> dict:
    return {"name": "bytes", "configuration": {"endian": endian}} if endian else {"name": "bytes"}


def gzip(level: int) -> dict:
    return {"name": "gzip", "configuration": {"level": level}}


def zstd(level: int) -> dict:
    return {"name": "zstd", "configuration": {"level": level, "checksum": False}}


def blosc(cname: str, clevel: int, shuffle: str, typesize: int) -> dict:
    return {"name": "blosc", "configuration": {"cname": cname, "clevel": clevel, "shuffle": shuffle,
                                               "typesize": typesize, "blocksize": 0}}


def transpose(order) -> dict:
    return {"name": "transpose", "configuration": {"order": list(order)}}


CRC32C = {"name": "crc32c"}


def key_encoding(name: str, sep: str | None = None) -> dict:
    return {"name": name, "configuration": {"separator": sep}} if sep else {"name": name}


# ------------------------------------------------------------------ cases


@dataclass(frozen=True)
class ArrayCase:
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
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def sharded(self) -> bool:
        return self.shard is not None

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
        sep = self.source_separator
        if self.key_encoding["name"] == "default":
            return sep.join(["c", *map(str, idx)])
        return sep.join(map(str, idx)) if idx else "0"

    def shard_dir(self, shard_idx: tuple[int, ...]) -> str:
        """Path (relative to the array) of a shard's directory in the view."""
        key = self.source_key(shard_idx)
        if self.key_encoding["name"] == "v2" and self.ndim == 1:
            key += ".shard"
        return key

    def chunk_file(self, idx: tuple[int, ...]) -> str:
        """v2 key of inner chunk ``idx`` at the array root of the view."""
        return self.view_separator.join(map(str, idx))

    @staticmethod
    def entry_name(idx: tuple[int, ...]) -> str:
        """Name of inner chunk ``idx`` inside its shard directory."""
        return ".".join(map(str, idx))

    def shard_of(self, idx: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(i // c for i, c in zip(idx, self.chunks_per_shard))

    def chunk_region(self, idx: tuple[int, ...]) -> tuple[slice, ...]:
        return tuple(slice(i * c, min((i + 1) * c, s)) for i, c, s in zip(idx, self.chunk, self.shape))

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


BYTES_LE, BYTES_BE = bytes_codec("little"), bytes_codec("big")

CASES: list[ArrayCase] = [
    # The "raw" array of the design doc: known layout for literal-path tests.
    ArrayCase(
        "raw", shape=(10, 13, 7), chunk=(2, 2, 2), shard=(4, 4, 4), dtype="uint16", fill=0,
        inner=(BYTES_LE,), empty_frac=0.2,
        forced_stored=((0, 0, 0), (0, 0, 1), (4, 6, 3)),
        forced_empty=((0, 1, 0),), empty_shards=((1, 0, 0),),
        attrs={"description": "raw", "scale": [1.0, 0.5, 0.25]},
    ),
    ArrayCase(
        "i32_2d_end_le_crc_dotkeys", shape=(13, 19), chunk=(4, 4), shard=(8, 8), dtype="int32", fill=-7,
        inner=(BYTES_LE,), key_encoding=key_encoding("default", "."),
    ),
    ArrayCase(
        "u8_3d_start_be_nocrc_gzip", shape=(9, 10, 11), chunk=(2, 2, 3), shard=(4, 4, 6), dtype="uint8",
        fill=255, inner=(bytes_codec(None), gzip(5)), index_location="start", index_endian="big",
        index_crc=False, expect_compressor={"id": "gzip", "level": 5},
    ),
    ArrayCase(
        "f64_2d_nanfill_zstd_v2dot", shape=(10, 12), chunk=(3, 4), shard=(6, 8), dtype="float64", fill=NAN,
        inner=(BYTES_LE, zstd(3)), index_endian="big", key_encoding=key_encoding("v2", "."),
        expect_compressor={"id": "zstd", "level": 3},
    ),
    ArrayCase(
        "f32_1d_inffill_blosc_v2slash", shape=(50,), chunk=(4,), shard=(16,), dtype="float32", fill=INF,
        inner=(BYTES_LE, blosc("lz4", 5, "shuffle", 4)), index_location="start",
        key_encoding=key_encoding("v2", "/"),
        expect_compressor=lambda c: c is not None and c.get("id") == "blosc" and c.get("cname") == "lz4"
        and c.get("clevel") == 5 and c.get("shuffle") == 1 and "typesize" not in c,
    ),
    ArrayCase(
        "f16_4d_neginffill_transposeF", shape=(3, 4, 5, 6), chunk=(1, 2, 2, 2), shard=(2, 2, 4, 4),
        dtype="float16", fill=-INF, inner=(transpose((3, 2, 1, 0)), BYTES_LE), index_crc=False,
        expect_order="F",
    ),
    ArrayCase(
        "i64_2d_be_innercrc32c", shape=(7, 9), chunk=(2, 2), shard=(4, 4), dtype="int64", fill=1234567890123,
        inner=(BYTES_BE, CRC32C), index_location="start", expect_byteorder=">",
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
        inner=(BYTES_LE, zstd(1)), expect_compressor={"id": "zstd", "level": 1},
    ),
    ArrayCase(
        "c128_2d_fill_be_gzip_v2slash", shape=(5, 7), chunk=(2, 4), shard=(4, 4), dtype="complex128",
        fill=1.5 - 2.5j, inner=(BYTES_BE, gzip(6)), index_location="start", index_endian="big",
        key_encoding=key_encoding("v2", "/"), expect_byteorder=">",
        expect_compressor={"id": "gzip", "level": 6},
    ),
    ArrayCase(
        "u64_2d_bigfill_gzip_crc32c_dotkeys", shape=(9, 9), chunk=(3, 3), shard=(6, 6), dtype="uint64",
        fill=2**64 - 2, inner=(BYTES_LE, gzip(4), CRC32C), key_encoding=key_encoding("default", "."),
        expect_compressor={"id": "gzip", "level": 4},
    ),
    # Written by tensorstore's zarr3 driver.
    ArrayCase(
        "i16_3d_ts_start_be_zstd", shape=(9, 10, 11), chunk=(2, 2, 2), shard=(4, 4, 4), dtype="int16", fill=5,
        inner=(BYTES_LE, zstd(2)), index_location="start", index_endian="big", index_crc=False,
        key_encoding={"name": "default"}, writer="tensorstore", expect_compressor={"id": "zstd", "level": 2},
    ),
    ArrayCase(
        "u32_2d_ts_be_gzip_dotkeys", shape=(13, 17), chunk=(4, 4), shard=(8, 8), dtype="uint32", fill=0,
        inner=(BYTES_BE, gzip(3)), key_encoding=key_encoding("default", "."), writer="tensorstore",
        expect_byteorder=">", expect_compressor={"id": "gzip", "level": 3},
    ),
    ArrayCase(
        "f32_2d_ts_nanfill_blosc_v2dot", shape=(10, 11), chunk=(2, 3), shard=(4, 6), dtype="float32", fill=NAN,
        inner=(BYTES_LE, blosc("zstd", 3, "bitshuffle", 4)), key_encoding=key_encoding("v2", "."),
        writer="tensorstore",
        expect_compressor=lambda c: c is not None and c.get("id") == "blosc" and c.get("cname") == "zstd"
        and c.get("clevel") == 3 and c.get("shuffle") == 2 and "typesize" not in c,
    ),
    ArrayCase(
        "u16_1d_ts_innercrc32c_v2slash", shape=(45,), chunk=(5,), shard=(20,), dtype="uint16", fill=7,
        inner=(BYTES_LE, CRC32C), key_encoding=key_encoding("v2", "/"), writer="tensorstore",
        index_location="start",
    ),
    # Unsharded v3 array: each chunk file maps to one stored chunk.
    ArrayCase(
        "u32_2d_unsharded_gzip", shape=(10, 10), chunk=(4, 4), shard=None, dtype="uint32", fill=9,
        inner=(BYTES_LE, gzip(2)), expect_compressor={"id": "gzip", "level": 2},
    ),
    # A chain v2 cannot express (non-reversed transpose): transcoded, compressor null.
    ArrayCase(
        "u16_3d_transpose102_transcoded", shape=(6, 5, 4), chunk=(2, 2, 2), shard=(4, 4, 4), dtype="uint16",
        fill=3, inner=(transpose((1, 0, 2)), BYTES_LE, gzip(1)), expect_order=None, passthrough=False,
    ),
    # Inside nested groups.
    ArrayCase(
        "f64_1d_in_nested_group", path="grp/sub/deep", shape=(20,), chunk=(4,), shard=(8,), dtype="float64",
        fill=0.25, inner=(BYTES_LE,), attrs={"units": "m"},
    ),
]

CASES_BY_ID = {c.id: c for c in CASES}

ROOT_ATTRS = {"title": "shardfs read matrix", "nested": {"a": [1, 2, 3], "b": None}}
GROUP_ATTRS = {"grp": {"level": 1}, "grp/sub": {"level": 2, "name": "sub"}, "grp/empty": {}}


# ------------------------------------------------------------------ data


def _seed(name: str) -> int:
    return zlib.crc32(name.encode())


def make_data(case: ArrayCase) -> np.ndarray:
    """Deterministic data with some inner chunks (and whole shards) left as fill."""
    rng = np.random.default_rng(_seed(case.id))
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
    return bool(np.array_equal(block, np.full(block.shape, fill, dtype=block.dtype), equal_nan=block.dtype.kind in "fc"))


def stored_chunks(case: ArrayCase, data: np.ndarray) -> set[tuple[int, ...]]:
    """Inner chunks whose in-bounds part is not all fill: exactly the ones written."""
    fill = fill_scalar(case)
    return {idx for idx in itertools.product(*map(range, case.inner_grid))
            if not _all_fill(data[case.chunk_region(idx)], fill)}


def empty_in_bounds_chunks(case: ArrayCase, data: np.ndarray) -> list[tuple[int, ...]]:
    stored = stored_chunks(case, data)
    return [i for i in itertools.product(*map(range, case.inner_grid)) if i not in stored]


# ------------------------------------------------------------------ writers


def v3_metadata(case: ArrayCase) -> dict:
    if case.sharded:
        index_codecs = [bytes_codec(case.index_endian)] + ([CRC32C] if case.index_crc else [])
        codecs = [{
            "name": "sharding_indexed",
            "configuration": {
                "chunk_shape": list(case.chunk),
                "codecs": list(case.inner),
                "index_codecs": index_codecs,
                "index_location": case.index_location,
            },
        }]
        grid = case.shard
    else:
        codecs, grid = list(case.inner), case.chunk
    return {
        "zarr_format": 3,
        "node_type": "array",
        "shape": list(case.shape),
        "data_type": case.dtype,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(grid)}},
        "chunk_key_encoding": case.key_encoding,
        "fill_value": v3_fill_json(case.dtype, case.fill),
        "codecs": codecs,
        "attributes": dict(case.attrs),
    }


def write_group(path: Path, attrs: dict) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group", "attributes": attrs}))


def write_case(case: ArrayCase, root: Path, data: np.ndarray | None = None) -> np.ndarray:
    """Write ``case`` under ``root / case.relpath``; return the data written."""
    import warnings

    data = make_data(case) if data is None else data
    path = Path(root) / case.relpath
    meta = v3_metadata(case)
    if case.writer == "zarr":
        import zarr

        path.mkdir(parents=True, exist_ok=True)
        (path / "zarr.json").write_text(json.dumps(meta))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            zarr.open_array(str(path), mode="r+")[...] = data
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


# ------------------------------------------------------------------ independent shard reading


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
    if off == 2**64 - 1:
        return None
    return blob[off:off + n]
