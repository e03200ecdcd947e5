"""Small sharded Zarr v3 sources for the write tests, and the oracles that check them.

Independent of the daemon: metadata is written as v3 JSON, initial data with
zarr-python 3; expected arrays are plain numpy; v2 chunk bytes are encoded
with numcodecs. After ``shardfs umount`` the source is read natively with
zarr-python 3 AND tensorstore's ``zarr3`` driver (strict about corrupt shards).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import numcodecs
import numpy as np

from shardfs.state import LEGACY_DIR, journal_dir

TEMP_SUFFIXES = (".partial", ".__lock", ".shardfs-tmp")

_DTYPE_NAMES = {"<i4": "int32", "<u2": "uint16", "<f8": "float64", "<i2": "int16"}


@dataclass(frozen=True)
class Spec:
    """One sharded array: geometry, codecs and the regions written before mounting."""

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

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def per_shard(self) -> tuple[int, ...]:
        return tuple(s // c for s, c in zip(self.shard, self.chunk))

    @property
    def inner_grid(self) -> tuple[int, ...]:
        return tuple(math.ceil(s / c) for s, c in zip(self.shape, self.chunk))

    @property
    def shard_grid(self) -> tuple[int, ...]:
        return tuple(math.ceil(s / c) for s, c in zip(self.shape, self.shard))

    def chunk_region(self, idx) -> tuple[slice, ...]:
        return tuple(slice(i * c, min((i + 1) * c, s)) for i, c, s in zip(idx, self.chunk, self.shape))

    def shard_of(self, idx) -> tuple[int, ...]:
        return tuple(i // n for i, n in zip(idx, self.per_shard))

    def shard_file(self, src: Path, shard_idx) -> Path:
        return Path(src) / self.name / "c" / Path(*map(str, shard_idx))

    def shard_dir_in_view(self, mnt: Path, shard_idx) -> Path:
        return Path(mnt) / self.name / "c" / Path(*map(str, shard_idx))

    def chunk_name(self, idx) -> str:
        return ".".join(map(str, idx))

    def codec(self):
        kind, level = self.compressor
        return numcodecs.Zstd(level=level) if kind == "zstd" else numcodecs.GZip(level=level)

    def v3_metadata(self) -> dict:
        kind, level = self.compressor
        comp = ({"name": "zstd", "configuration": {"level": level, "checksum": False}} if kind == "zstd"
                else {"name": "gzip", "configuration": {"level": level}})
        le = {"name": "bytes", "configuration": {"endian": "little"}}
        inner = [le, comp] + ([{"name": "crc32c"}] if self.inner_crc else [])
        index = [le] + ([{"name": "crc32c"}] if self.index_crc else [])
        return {
            "zarr_format": 3,
            "node_type": "array",
            "shape": list(self.shape),
            "data_type": _DTYPE_NAMES[self.dtype],
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(self.shard)}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": self.fill,
            "codecs": [{"name": "sharding_indexed", "configuration": {
                "chunk_shape": list(self.chunk), "codecs": inner, "index_codecs": index,
                "index_location": self.index_location}}],
            "attributes": {"origin": self.name},
        }

    # ----- data --------------------------------------------------------------------

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

    def padded_chunk(self, full: np.ndarray, idx) -> np.ndarray:
        """The v2 chunk ``idx`` of array ``full``: full chunk shape, fill beyond the edge."""
        block = np.full(self.chunk, self.fill, dtype=self.dtype)
        region = self.chunk_region(idx)
        block[tuple(slice(0, r.stop - r.start) for r in region)] = full[region]
        return block

    def encode(self, block: np.ndarray) -> bytes:
        """The bytes of a v2 chunk file holding ``block`` (the view's compressor, no crc32c)."""
        assert block.shape == self.chunk
        return bytes(self.codec().encode(np.ascontiguousarray(block, dtype=self.dtype).tobytes()))

    def decode(self, data: bytes) -> np.ndarray:
        raw = self.codec().decode(data)
        return np.frombuffer(raw, dtype=self.dtype).reshape(self.chunk)


def build(src: Path, specs, seed: int = 1) -> dict[str, np.ndarray]:
    """Write a v3 group at ``src`` with ``specs``; return name -> expected numpy array."""
    import zarr

    src = Path(src)
    src.mkdir(parents=True, exist_ok=True)
    (src / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}))
    out = {}
    for k, spec in enumerate(specs):
        path = src / spec.name
        path.mkdir()
        (path / "zarr.json").write_text(json.dumps(spec.v3_metadata()))
        expected = np.full(spec.shape, spec.fill, dtype=spec.dtype)
        arr = zarr.open_array(str(path), mode="r+")
        for j, region in enumerate(spec.initial):
            block = spec.values(expected[region].shape, seed * 1000 + k * 10 + j)
            expected[region] = block
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                arr[region] = block
        out[spec.name] = expected
    return out


# ----- oracles ------------------------------------------------------------------------


def read_zarr3_native(path) -> np.ndarray:
    import zarr

    return zarr.open_array(str(path), mode="r")[...]


def read_ts3_native(path) -> np.ndarray:
    import tensorstore as ts

    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path)}}
    return ts.open(spec, read=True, context=ts.Context()).result().read().result()


def assert_source_equals(src: Path, name: str, expected: np.ndarray) -> None:
    """zarr-python 3 and tensorstore zarr3 both read ``src/name`` as ``expected``."""
    for reader in (read_zarr3_native, read_ts3_native):
        got = reader(Path(src) / name)
        assert got.shape == expected.shape, f"{name} via {reader.__name__}: shape {got.shape}"
        if not np.array_equal(got, expected, equal_nan=True):
            bad = np.argwhere(~((got == expected) | (np.isnan(got) & np.isnan(expected))
                                if got.dtype.kind == "f" else got == expected))
            raise AssertionError(
                f"{name} via {reader.__name__}: {len(bad)} elements differ, first at {tuple(bad[0])}: "
                f"got {got[tuple(bad[0])]!r}, expected {expected[tuple(bad[0])]!r}")


def leftovers(src: Path) -> list[str]:
    """Temp files anywhere in the source, anything in ``SRC/.shardfs`` (the source holds only
    Zarr data), and files in the journal directory (``journal/<name>``)."""
    src = Path(src)
    bad = []
    for dirpath, _dirs, files in os.walk(src):
        for f in files:
            if f.endswith(TEMP_SUFFIXES) or "shardfs-tmp" in f or ".partial" in f or "__lock" in f:
                bad.append(os.path.relpath(os.path.join(dirpath, f), src))
    if (src / LEGACY_DIR).exists():
        bad.append(LEGACY_DIR)
    bad += [f"journal/{n}" for n in journal_entries(src)]
    return sorted(bad)


def journal_path(src: Path) -> Path:
    """The write journal of a mount of ``src`` (in its state directory, under the suite's
    XDG_STATE_HOME)."""
    return Path(journal_dir(str(src)))


def journal_entries(src: Path) -> list[str]:
    """Names of the files in the journal directory: segments (``*.seg``) while changes are pending."""
    j = journal_path(src)
    return sorted(os.listdir(j)) if j.is_dir() else []


def journal_bytes(src: Path) -> int:
    """Total size of the journal's files: at least the stored bytes of every pending chunk."""
    return sum((journal_path(src) / n).stat().st_size for n in journal_entries(src))


def all_chunks(spec: Spec):
    return itertools.product(*map(range, spec.inner_grid))


def chunks_touching(spec: Spec, region) -> list[tuple[int, ...]]:
    ranges = [range(r.start // c, (r.stop - 1) // c + 1) for r, c in zip(region, spec.chunk)]
    return list(itertools.product(*ranges))
