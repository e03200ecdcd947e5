"""The benchmark's own sharded Zarr v3 sources, written from scratch each run (the tests build
``many`` and ``tiny`` too).

- ``big/vol``    uint16 3-D, zstd, 32^3 inner chunks in 128^3 shards (the main array);
- ``big/large``  uint16 3-D, uncompressed 4 MiB inner chunks (streaming throughput);
- ``meta/many``  uint8 2-D, 4x4 uncompressed inner chunks of random bytes, about 75 %
                 of them stored: >100k chunk files in a few hundred shards (listing,
                 mount time, daemon memory). Its shards are written directly (the
                 sharding binary format is simple), which is ~30x faster than
                 zarr-python's per-chunk codec pipeline; zarr 3 then checks one shard.
- ``small/tiny`` one shard of one array (mount time baseline).
- ``shards/tiny`` uint8 1-D, shards of one 4-byte chunk: 30k shard files (a listing's cost per
                 shard, not per chunk). Written directly too.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import crc32c
import numpy as np


@dataclass(frozen=True)
class Sizes:
    vol_shape: tuple[int, int, int]
    vol_shard: tuple[int, int, int]
    vol_chunk: tuple[int, int, int]
    large_shape: tuple[int, int, int]
    large_shard: tuple[int, int, int]
    large_chunk: tuple[int, int, int]
    many_shape: tuple[int, int]
    many_shard: tuple[int, int]
    many_chunk: tuple[int, int]
    many_fill: float
    tiny_shards: int


FULL = Sizes(vol_shape=(512, 512, 384), vol_shard=(128, 128, 128), vol_chunk=(32, 32, 32),
             large_shape=(512, 512, 1024), large_shard=(256, 256, 256), large_chunk=(128, 128, 128),
             many_shape=(1536, 1536), many_shard=(64, 64), many_chunk=(4, 4), many_fill=0.75,
             tiny_shards=30_000)
SMOKE = Sizes(vol_shape=(128, 128, 96), vol_shard=(64, 64, 64), vol_chunk=(32, 32, 32),
              large_shape=(128, 128, 128), large_shard=(128, 128, 128), large_chunk=(64, 64, 64),
              many_shape=(128, 128), many_shard=(32, 32), many_chunk=(4, 4), many_fill=0.75,
              tiny_shards=2_000)


def vol_data(shape: tuple[int, ...], seed: int = 1) -> np.ndarray:
    """Microscopy-like uint16 volume: smooth structure plus 6 bits of noise (zstd ~1.7x)."""
    rng = np.random.default_rng(seed)
    z, y, x = np.ogrid[: shape[0], : shape[1], : shape[2]]
    base = ((z * 7 + y * 3 + x) % 4000).astype(np.uint16)
    return base + rng.integers(0, 64, size=shape, dtype=np.uint16)


def build_big(root: Path, sizes: Sizes) -> np.ndarray:
    """``root`` = group with ``vol`` and ``large``; returns vol's data (for the write figure)."""
    import zarr
    from zarr.codecs import ZstdCodec

    g = zarr.open_group(str(root), mode="w")
    vol = g.create_array("vol", shape=sizes.vol_shape, chunks=sizes.vol_chunk, shards=sizes.vol_shard,
                         dtype="uint16", compressors=[ZstdCodec(level=3)], fill_value=0)
    data = vol_data(sizes.vol_shape)
    vol[...] = data
    large = g.create_array("large", shape=sizes.large_shape, chunks=sizes.large_chunk,
                           shards=sizes.large_shard, dtype="uint16", compressors=None, fill_value=0)
    n = math.prod(sizes.large_shape)
    large[...] = (np.arange(n, dtype=np.uint32) % 65521 + 1).astype(np.uint16).reshape(sizes.large_shape)
    return data


def empty_like_vol(src_root: Path, dst_root: Path) -> None:
    """A group holding an empty ``vol`` with the same metadata (for write figures)."""
    if dst_root.exists():
        shutil.rmtree(dst_root)
    (dst_root / "vol").mkdir(parents=True)
    shutil.copyfile(src_root / "zarr.json", dst_root / "zarr.json")
    shutil.copyfile(src_root / "vol" / "zarr.json", dst_root / "vol" / "zarr.json")


def build_many(root: Path, sizes: Sizes, seed: int = 2) -> dict:
    """``root`` = group with ``many``. Returns {"stored": n, "shards": n, "slots": n}."""
    import crc32c
    import zarr

    g = zarr.open_group(str(root), mode="w")
    arr = g.create_array("many", shape=sizes.many_shape, chunks=sizes.many_chunk, shards=sizes.many_shard,
                         dtype="uint8", compressors=None, fill_value=0)
    doc = json.loads((root / "many" / "zarr.json").read_text())
    cfg = doc["codecs"][0]["configuration"]
    assert doc["codecs"][0]["name"] == "sharding_indexed" and cfg["index_location"] == "end"
    assert [c["name"] for c in cfg["codecs"]] == ["bytes"]
    assert [c["name"] for c in cfg["index_codecs"]] == ["bytes", "crc32c"]
    assert cfg["index_codecs"][0].get("configuration", {}).get("endian", "little") == "little"
    sep = doc["chunk_key_encoding"]["configuration"]["separator"]
    assert all(s % c == 0 for s, c in zip(sizes.many_shape, sizes.many_shard))

    rng = np.random.default_rng(seed)
    cps = tuple(s // c for s, c in zip(sizes.many_shard, sizes.many_chunk))
    per_shard = math.prod(cps)
    nbytes = math.prod(sizes.many_chunk)
    grid = tuple(s // c for s, c in zip(sizes.many_shape, sizes.many_shard))
    stored = 0
    first_expected: np.ndarray | None = None
    for si in range(grid[0]):
        for sj in range(grid[1]):
            present = rng.random(per_shard) < sizes.many_fill
            k = int(present.sum())
            body = rng.integers(1, 256, size=(k, nbytes), dtype=np.uint8)
            index = np.full((per_shard, 2), np.iinfo(np.uint64).max, dtype="<u8")
            index[present, 0] = np.arange(k, dtype=np.uint64) * nbytes
            index[present, 1] = nbytes
            ib = index.tobytes()
            blob = body.tobytes() + ib + np.array([crc32c.crc32c(ib)], dtype="<u4").tobytes()
            path = root / "many" / "c" / str(si) / str(sj)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(blob)
            stored += k
            if first_expected is None:
                full = np.zeros((per_shard, nbytes), dtype=np.uint8)
                full[present] = body
                # inner chunk (ci, cj) of the shard holds rows ci*4.., cols cj*4..
                first_expected = (full.reshape(cps + sizes.many_chunk).transpose(0, 2, 1, 3)
                                  .reshape(sizes.many_shard))
    got = np.asarray(arr[: sizes.many_shard[0], : sizes.many_shard[1]])
    if first_expected is None or not np.array_equal(got, first_expected):
        raise RuntimeError("hand-written shard of meta/many does not read back with zarr 3")
    return {"stored": stored, "shards": math.prod(grid), "slots": per_shard * math.prod(grid), "sep": sep}


def build_small(root: Path) -> None:
    import zarr

    g = zarr.open_group(str(root), mode="w")
    a = g.create_array("tiny", shape=(8, 8), chunks=(4, 4), shards=(8, 8), dtype="uint8", compressors=None)
    a[...] = np.arange(64, dtype=np.uint8).reshape(8, 8) + 1


def build_tiny(root: Path, n: int) -> None:
    """``root`` = group with ``tiny``: shape (4n,) uint8, shards (4,) of one (4,) chunk; shard
    ``i`` holds ``i % 255 + 1`` four times (``tiny_value``). zarr 3 writes the metadata and
    reads the first two shards back; each shard file is its 4 bytes and the index with its
    crc32c, as zarr 3 writes it."""
    import zarr

    g = zarr.open_group(str(root), mode="w")
    arr = g.create_array("tiny", shape=(4 * n,), chunks=(4,), shards=(4,), dtype="uint8", compressors=None,
                         fill_value=0)
    index = np.array([[0, 4]], dtype="<u8").tobytes()
    tail = index + np.array([crc32c.crc32c(index)], dtype="<u4").tobytes()
    shards = root / "tiny" / "c"
    shards.mkdir(parents=True)
    fd = os.open(shards, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(n):
            f = os.open(str(i), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=fd)
            try:
                os.write(f, tiny_value(i) + tail)
            finally:
                os.close(f)
    finally:
        os.close(fd)
    first = np.asarray(arr[:8]).tolist()
    if first != [1] * 4 + [2] * 4:
        raise RuntimeError(f"{root}/tiny: zarr 3 reads {first} from the first two shards")


def tiny_value(i: int) -> bytes:
    """The 4 bytes of chunk ``i`` of ``tiny`` (``build_tiny``): its v2 chunk file."""
    return bytes([i % 255 + 1]) * 4


def v2_copy_from_source(src_array: Path, mnt_array: Path, dst: Path, sizes: Sizes) -> int:
    """The real v2 copy of ``meta/many`` without reading 100k files through the mount.

    The inner chunks are uncompressed, so a v2 chunk file is exactly the stored
    inner-chunk bytes; they are cut out of the shards here (same bytes, same
    names as the mount shows) and ``.zarray``/``.zattrs`` are plain copies from
    the mount. The caller checks names and a sample of contents against the mount.
    """
    dst.mkdir(parents=True, exist_ok=True)
    for meta in (".zarray", ".zattrs"):
        if (mnt_array / meta).exists():
            shutil.copyfile(mnt_array / meta, dst / meta)
    zarray = json.loads((dst / ".zarray").read_text())
    sep = zarray.get("dimension_separator", ".")
    if sep != ".":
        raise RuntimeError(f"unexpected dimension_separator {sep!r} in the view of meta/many")
    cps = tuple(s // c for s, c in zip(sizes.many_shard, sizes.many_chunk))
    per_shard = math.prod(cps)
    n = 0
    for shard_file in sorted((src_array / "c").glob("*/*")):
        si, sj = int(shard_file.parent.name), int(shard_file.name)
        blob = shard_file.read_bytes()
        index = np.frombuffer(blob[-(per_shard * 16 + 4): -4], dtype="<u8").reshape(per_shard, 2)
        for pos in np.nonzero(index[:, 0] != np.iinfo(np.uint64).max)[0]:
            off, nb = int(index[pos, 0]), int(index[pos, 1])
            ci, cj = divmod(int(pos), cps[1])
            name = f"{si * cps[0] + ci}{sep}{sj * cps[1] + cj}"
            with open(dst / name, "wb") as f:
                f.write(blob[off: off + nb])
            n += 1
    return n
