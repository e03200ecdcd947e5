"""Zarr v3 sources written without shardfs: codec JSON (``LE``, ``BE``, ``CRC``, ``gzip``, ``zstd``,
``blosc``, ``transpose``, ``sharding``, ``nested_codecs``, ``key_encoding``, ``chunk_key``) and
``write_group`` / ``write_zarr3`` / ``array_doc`` (metadata written as v3 JSON, data written by
zarr-python 3). The tests' sources (tests/sources.py) and the soak's dataset build on them.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

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


LE, BE = bytes_codec("little"), bytes_codec("big")
CRC = {"name": "crc32c"}
GZIP, ZSTD = gzip(3), zstd(1)


def key_encoding(name: str, sep: str | None = None) -> dict:
    return {"name": name, "configuration": {"separator": sep}} if sep else {"name": name}


def sharding(chunk_shape, codecs, index_codecs=(LE, CRC), index_location="end") -> dict:
    return {"name": "sharding_indexed", "configuration": {
        "chunk_shape": list(chunk_shape), "codecs": list(codecs), "index_codecs": list(index_codecs),
        "index_location": index_location}}


def nested_codecs(inner_shard, chunk, innermost, crc_around=True, outer_index=(LE, CRC),
                  inner_index=(LE, CRC), outer_location="end", inner_location="end") -> list[dict]:
    """The ``codecs`` of an array whose shards hold inner shards of ``inner_shard`` elements."""
    inner = sharding(chunk, innermost, inner_index, inner_location)
    return [sharding(inner_shard, [inner, CRC] if crc_around else [inner], outer_index, outer_location)]


def chunk_key(encoding: dict, coords) -> str:
    """The key (path relative to the array) of chunk or shard ``coords`` under a v3
    ``chunk_key_encoding``."""
    conf = encoding.get("configuration") or {}
    sep = conf.get("separator") or ("/" if encoding["name"] == "default" else ".")
    if encoding["name"] == "default":
        return sep.join(["c", *map(str, coords)])
    return sep.join(map(str, coords)) if len(coords) else "0"


# ------------------------------------------------------------------ writing


def write_group(path: Path, attrs: dict | None = None) -> None:
    """A v3 group ``zarr.json`` at ``path`` (created)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group",
                                                "attributes": attrs or {}}))


def write_zarr3(path: Path, doc: dict, regions=()) -> None:
    """A v3 array at ``path``: ``doc`` as its ``zarr.json``, then each ``(region, values)``
    of ``regions`` written by zarr-python 3 in turn."""
    import zarr

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "zarr.json").write_text(json.dumps(doc))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        arr = zarr.open_array(str(path), mode="r+")
        for region, values in regions:
            arr[region] = values


def array_doc(shape, dtype: str, grid, codecs, fill=0, key_enc: dict | None = None, attrs=None) -> dict:
    """A v3 array ``zarr.json`` with a regular chunk grid of ``grid``."""
    return {
        "zarr_format": 3, "node_type": "array", "shape": list(shape), "data_type": dtype,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(grid)}},
        "chunk_key_encoding": key_enc or key_encoding("default", "/"),
        "fill_value": fill, "codecs": list(codecs), "attributes": dict(attrs or {}),
    }
