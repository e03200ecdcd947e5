"""Sources for nested sharding and the 2022 sharding storage-transformer draft.

Nested-sharded arrays are written by zarr-python 3 (``nested_codecs`` builds
the codec JSON) or tensorstore's ``zarr3`` driver. No library writes the
draft, so ``write_draft`` writes the inner chunks of an *unsharded* v3 array
with zarr-python 3's own codecs and packs them into draft shards by hand
(chunks, then little-endian ``(offset, length)`` uint64 pairs in C order,
no checksum). ``read_draft`` is the reference decoder: it unpacks the shards
back into an unsharded array and reads that with zarr-python 3.
"""

from __future__ import annotations

import itertools
import json
import math
import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np

DRAFT_URI = "https://purl.org/zarr/spec/storage_transformers/sharding/1.0"
EMPTY = 2**64 - 1
LE = {"name": "bytes", "configuration": {"endian": "little"}}
BE = {"name": "bytes", "configuration": {"endian": "big"}}
CRC = {"name": "crc32c"}
GZIP = {"name": "gzip", "configuration": {"level": 3}}
ZSTD = {"name": "zstd", "configuration": {"level": 1, "checksum": False}}


def random_data(shape, dtype, seed, fill=()) -> np.ndarray:
    """Random non-zero values, with the ``fill`` regions set to 0 (the fill value)."""
    d = np.random.default_rng(seed).integers(1, 30000, size=shape).astype(dtype)
    for region in fill:
        d[region] = 0
    return d


def sharding(chunk_shape, codecs, index_codecs=(LE, CRC), index_location="end") -> dict:
    return {"name": "sharding_indexed", "configuration": {
        "chunk_shape": list(chunk_shape), "codecs": list(codecs), "index_codecs": list(index_codecs),
        "index_location": index_location}}


def nested_codecs(inner_shard, chunk, innermost, crc_around=True, outer_index=(LE, CRC),
                  inner_index=(LE, CRC), outer_location="end", inner_location="end") -> list[dict]:
    """The ``codecs`` of an array whose shards hold inner shards of ``inner_shard`` elements."""
    inner = sharding(chunk, innermost, inner_index, inner_location)
    return [sharding(inner_shard, [inner, CRC] if crc_around else [inner], outer_index, outer_location)]


def write_v3(path: Path, data: np.ndarray, chunk_shape, codecs: list[dict], fill=0,
             key_encoding: dict | None = None) -> None:
    """Write ``data`` as a v3 array at ``path`` with zarr-python 3 (metadata written by hand)."""
    import zarr

    path.mkdir(parents=True)
    doc = {
        "zarr_format": 3, "node_type": "array", "shape": list(data.shape),
        "data_type": data.dtype.name, "fill_value": fill,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(chunk_shape)}},
        "chunk_key_encoding": key_encoding or {"name": "default", "configuration": {"separator": "/"}},
        "codecs": codecs, "attributes": {},
    }
    (path / "zarr.json").write_text(json.dumps(doc))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        zarr.open_array(str(path), mode="r+")[...] = data


def hashed_array(src: Path, data: np.ndarray, chunk_shape, codecs: list[dict]) -> str:
    """Write ``data`` as a v3 array under ``src`` named by a hash of all arguments (once); its name.

    For hypothesis examples read through a module-scoped mount of ``src``: an
    example that comes again reuses the array it wrote before.
    """
    name = f"h{abs(hash(json.dumps([data.shape, list(chunk_shape), codecs, data.dtype.str, data.tobytes().hex()])))}"
    if not (Path(src) / name).exists():
        write_v3(Path(src) / name, data, chunk_shape, codecs)
    return name


# ------------------------------------------------------------------ the draft


def _key(doc: dict, coords) -> str:
    enc = doc["chunk_key_encoding"]
    sep = (enc.get("configuration") or {}).get("separator") or ("/" if enc["name"] == "default" else ".")
    parts = [str(c) for c in coords] or ["0"]
    return sep.join(["c", *map(str, coords)]) if enc["name"] == "default" else sep.join(parts)


def _geometry(doc: dict, cps) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(inner chunk grid, shard grid)`` of an array."""
    chunk = doc["chunk_grid"]["configuration"]["chunk_shape"]
    grid = tuple(math.ceil(s / c) for s, c in zip(doc["shape"], chunk))
    return grid, tuple(math.ceil(g / n) for g, n in zip(grid, cps))


def write_draft(path: Path, data: np.ndarray, chunk_shape, cps, codecs: list[dict], fill=0,
                key_encoding: dict | None = None, spec_name: str = "storage_transformer",
                order: str = "reversed") -> None:
    """Write ``data`` at ``path`` in the draft sharding format, ``cps`` chunks per shard.

    Chunks go into each shard in ``order`` ("reversed" C order or "C"), with
    one unused byte between chunks: readers must go by the index alone.
    """
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "plain"
        write_v3(plain, data, chunk_shape, codecs, fill, key_encoding)
        doc = json.loads((plain / "zarr.json").read_text())
        grid, shards = _geometry(doc, cps)
        path.mkdir(parents=True)
        for shard in itertools.product(*map(range, shards)):
            body, index = bytearray(), np.full((math.prod(cps), 2), EMPTY, dtype="<u8")
            local = list(itertools.product(*map(range, cps)))
            for pos in (reversed(range(len(local))) if order == "reversed" else range(len(local))):
                coords = tuple(s * n + i for s, n, i in zip(shard, cps, local[pos]))
                f = plain / _key(doc, coords)
                if all(c < g for c, g in zip(coords, grid)) and f.is_file():
                    chunk = f.read_bytes()
                    index[pos] = (len(body), len(chunk))
                    body += chunk + b"\xa5"
            if body:
                target = path / _key(doc, shard)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(bytes(body) + index.tobytes())
        doc["storage_transformers"] = [{spec_name: DRAFT_URI,
                                        "configuration": {"format": "indexed", "chunks_per_shard": list(cps)}}]
        (path / "zarr.json").write_text(json.dumps(doc))


def read_draft(path: Path) -> np.ndarray:
    """The reference decoder: the draft array at ``path`` read through zarr-python 3's codecs."""
    import zarr

    doc = json.loads((Path(path) / "zarr.json").read_text())
    (t,) = doc.pop("storage_transformers")
    cps = t["configuration"]["chunks_per_shard"]
    grid, shards = _geometry(doc, cps)
    n = math.prod(cps)
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "plain"
        plain.mkdir()
        (plain / "zarr.json").write_text(json.dumps(doc))
        for shard in itertools.product(*map(range, shards)):
            f = Path(path) / _key(doc, shard)
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
                out = plain / _key(doc, coords)
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(raw[offset: offset + length])
        return zarr.open_array(str(plain), mode="r")[...]


def copy_array(src: Path, dst: Path) -> Path:
    """A private copy of a v3 array under a fresh root group (for tests that write)."""
    dst.mkdir(parents=True)
    (dst / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}))
    shutil.copytree(src, dst / src.name)
    return dst
