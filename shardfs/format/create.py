"""v2 metadata written through the mount -> v3 nodes: new arrays and groups, ``.zarray`` rewrites.

A ``.zarray`` written in a new directory becomes a sharded v3 array
(``array_doc``): the ``sharding_indexed`` codec's inner chunks are the v2
chunks, its inner chain is zarr-python's own translation of the v2 ``order``,
dtype byte order, ``filters`` and ``compressor`` (``zarr.metadata.migrate_v3``),
and the shard shape follows ``shard_counts``. ``_ARRAY_DIMENSIONS`` in the
attributes become ``dimension_names``. An object array (``|O`` with a
``vlen-utf8``/``vlen-bytes`` filter) becomes a v3 ``string``/``variable_length_bytes``
array whose array→bytes codec is that filter. A ``fill_value`` of null is remembered
(``shardfs.format.fill.remember``), and so is a ``.zarray`` without ``dimension_separator``
(zarr 2's ``DirectoryStore`` writes none) or a 0-d array's: the ``.zarray`` shown is then
spelled as written. A rewritten ``.zarray`` is compared with
the one shown (``rewrite_kind``): only a new shape is a change the mount applies.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

from typing import TYPE_CHECKING

import numpy as np

from shardfs.config import WriteConfig
from shardfs.format.dtypes import VLEN_CODECS
from shardfs.format.fill import XARRAY_FILL, encode_xarray_fill, remember

if TYPE_CHECKING:
    from zarr.core.metadata.v2 import ArrayV2Metadata

DEFAULT_SHARD_BYTES = WriteConfig.shard_size  # uncompressed bytes of one shard of a new array (-o shard_size)


class Refused(ValueError):
    """The metadata cannot be applied (the message says why)."""


def shard_counts(chunk_nbytes: int, grid: tuple[int, ...], target: int) -> tuple[int, ...]:
    """Inner chunks per shard, per dimension, for a new array.

    Starting from one inner chunk, each dimension in turn (the last first, C order)
    doubles its count, capped at the array's chunk grid (at least 1), as long as the
    shard's uncompressed size stays within ``target`` bytes; repeated until nothing grows.
    """
    counts = [1] * len(grid)
    grown = True
    while grown:
        grown = False
        for d in reversed(range(len(grid))):
            bigger = min(counts[d] * 2, max(1, grid[d]))
            if bigger > counts[d] and math.prod(counts) // counts[d] * bigger * chunk_nbytes <= target:
                counts[d] = bigger
                grown = True
    return tuple(counts)


def _v2_metadata(zarray: Any) -> ArrayV2Metadata:
    from zarr.core.metadata.v2 import ArrayV2Metadata  # zarr on first use: it doubles the mount time

    if not isinstance(zarray, dict) or zarray.get("zarr_format") != 2:
        raise Refused("not Zarr v2 array metadata")
    try:
        dtype = zarray.get("dtype")
        if isinstance(dtype, str):  # "<u1" and "|u1" are one dtype; zarr 3 knows only the latter
            dtype = np.dtype(dtype).str
        if dtype == "|O" and not isinstance(zarray.get("fill_value"), str):  # zarr 2 gives them 0
            zarray = {**zarray, "fill_value": None}

        return ArrayV2Metadata.from_dict({**zarray, "dtype": dtype, "attributes": {}})
    except Exception as e:  # zarr raises many types for bad metadata
        raise Refused(f"invalid .zarray: {e}") from None


def dimension_names(attrs: dict[str, Any], ndim: int) -> list[str] | None:
    """``_ARRAY_DIMENSIONS`` (removed from ``attrs``) if it names every dimension."""
    names = attrs.get("_ARRAY_DIMENSIONS")
    if isinstance(names, list) and len(names) == ndim and all(isinstance(n, str) for n in names):
        del attrs["_ARRAY_DIMENSIONS"]
        return names
    return None


def array_doc(zarray: Any, attrs: dict[str, Any], shard_bytes: int = DEFAULT_SHARD_BYTES) -> dict[str, Any]:
    """The v3 ``zarr.json`` of a new sharded array described by a v2 ``.zarray`` and ``.zattrs``.

    Keys use the default encoding (``c/0/1``), whose v2 view has ``dimension_separator``
    "."; a ``.zarray`` asking for "/" gets the v2 encoding with "." (shown with "/").
    Raises ``Refused`` if the metadata is invalid or zarr has no v3 codec for it.
    """
    from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.dtype import UInt8
    from zarr.core.metadata.v3 import ArrayV3Metadata
    from zarr.metadata.migrate_v3 import _convert_array_metadata

    v2meta = _v2_metadata(zarray)
    vlen = getattr(v2meta.dtype, "object_codec_id", None)
    if v2meta.fill_value is None:  # v3 needs one: the dtype's default, as zarr 3 writes it
        v2meta = replace(v2meta, fill_value=_default_fill(v2meta))
    try:
        if vlen is None:
            inner = list(_convert_array_metadata(v2meta).codecs)
        else:  # zarr converts the other codecs of a stand-in byte array; the object codec is
            # v3's array→bytes codec, not a filter
            rest = tuple(f for f in v2meta.filters or () if f.codec_id != vlen) or None
            stand_in = replace(v2meta, dtype=UInt8(), fill_value=0, filters=rest)
            inner = [VLEN_CODECS[vlen]() if isinstance(c, BytesCodec) else c
                     for c in _convert_array_metadata(stand_in).codecs]
    except Exception as e:  # no zarr.codecs.numcodecs codec for a filter or compressor
        raise Refused(f"no v3 codec for the .zarray codecs: {e}") from None
    shape, chunks = tuple(v2meta.shape), tuple(v2meta.chunks)
    itemsize = np.dtype(v2meta.dtype.to_native_dtype()).itemsize
    grid = tuple(math.ceil(s / c) for s, c in zip(shape, chunks))
    counts = shard_counts(math.prod(chunks) * itemsize, grid, shard_bytes)
    sharding = ShardingCodec(chunk_shape=chunks, codecs=inner,
                             index_codecs=[BytesCodec(endian="little"), Crc32cCodec()], index_location="end")
    separator = zarray.get("dimension_separator") or "."
    encoding: dict[str, Any] = {"name": "v2", "configuration": {"separator": "."}} if separator == "/" else \
        {"name": "default", "configuration": {"separator": "/"}}
    attrs = dict(attrs)
    names = dimension_names(attrs, len(shape))
    # A v2 fill_value is also xarray's mask; on v3 data xarray reads the mask from this
    # attribute (the view shows it as the v2 fill_value again, not in .zattrs).
    mask = None if zarray.get("fill_value") is None else \
        encode_xarray_fill(v2meta.fill_value, np.dtype(v2meta.dtype.to_native_dtype()))
    if mask is not None:
        attrs.setdefault(XARRAY_FILL, mask)
    try:
        meta = ArrayV3Metadata(
            shape=shape, data_type=v2meta.dtype,
            chunk_grid={"name": "regular", "configuration": {"chunk_shape": [c * n for c, n in zip(chunks, counts)]}},
            chunk_key_encoding=encoding, fill_value=v2meta.fill_value, codecs=[sharding],
            attributes=attrs, dimension_names=names, storage_transformers=None)
        doc = json.loads(meta.to_buffer_dict(default_buffer_prototype())["zarr.json"].to_bytes())
    except Exception as e:
        raise Refused(f"cannot make v3 metadata: {e}") from None
    spelling: dict[str, Any] = {} if "dimension_separator" in zarray and shape else \
        {"v2_dimension_separator": zarray.get("dimension_separator")}  # none written, or a 0-d array's
    if zarray.get("fill_value") is None:
        spelling["v2_fill_value"] = None
    if not shape and names is None:  # a 0-d array shows _ARRAY_DIMENSIONS [] unless made without them
        spelling["v2_dimension_names"] = None
    return remember(doc, **spelling) if spelling else doc


def _default_fill(v2meta: ArrayV2Metadata) -> Any:
    """The fill value zarr 3 gives a new array of ``v2meta``'s data type (zero, False, "")."""
    try:
        return v2meta.dtype.default_scalar()
    except Exception:  # zarr 3.1's structured types have no default: zero bytes are one
        return np.zeros((), dtype=v2meta.dtype.to_native_dtype())[()]


def group_doc(zgroup: Any, attrs: dict[str, Any]) -> dict[str, Any]:
    """The v3 ``zarr.json`` of a new group from its ``.zgroup`` and ``.zattrs``."""
    if not isinstance(zgroup, dict) or zgroup.get("zarr_format") != 2:
        raise Refused("not Zarr v2 group metadata")
    return {"zarr_format": 3, "node_type": "group", "attributes": attrs}


def _normal(zarray: dict[str, Any]) -> dict[str, Any]:
    """The fields of a ``.zarray`` that define its chunk format, spelled one way."""
    import numcodecs

    def codec(config: Any) -> Any:
        return None if config is None else numcodecs.get_codec(dict(config)).get_config()

    filters = zarray.get("filters") or None
    return {
        "chunks": list(zarray.get("chunks", [])),
        "dtype": np.dtype(zarray["dtype"]).str if isinstance(zarray.get("dtype"), str) else zarray.get("dtype"),
        "compressor": codec(zarray.get("compressor")),
        "filters": None if filters is None else [codec(f) for f in filters],
        "order": zarray.get("order", "C") if len(zarray.get("shape", [])) > 1 else "C",
        # a 0-d array has one chunk, "0", whatever its separator
        "dimension_separator": (zarray.get("dimension_separator") or ".") if zarray.get("shape") else ".",
    }


def rewrite_kind(new: Any, shown: dict[str, Any], fills: tuple[Any, ...]) -> str:
    """What a rewrite of ``.zarray`` to ``new`` asks, given the ``.zarray`` ``shown``:
    ``"same"``, ``"resize"`` (only the shape differs), or raises ``Refused`` saying what
    else changed. ``fills`` are the fill values that count as unchanged (JSON); null always does,
    and so does any fill of an object array (shown as null: ``shardfs.format.fill.map_fill``)."""

    _v2_metadata(new)
    try:
        a, b = _normal(new), _normal(shown)
    except Exception as e:
        raise Refused(f"invalid .zarray: {e}") from None
    changed = [k for k in a if a[k] != b[k]]
    if new.get("fill_value") is not None and new.get("fill_value") not in fills and a["dtype"] != "|O":
        changed.append("fill_value")
    if changed:
        raise Refused(", ".join(changed) + " differ from the array's")
    return "same" if list(new["shape"]) == list(shown["shape"]) else "resize"
