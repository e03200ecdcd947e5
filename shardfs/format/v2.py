"""Zarr v3 metadata -> the v2 view: ``.zarray``/``.zattrs``/``.zgroup`` and chunk formats.

``describe_array`` parses a v3 ``zarr.json`` with zarr-python's own metadata
classes and decides how each inner chunk is shown to v2 clients: the stored
bytes unchanged when the inner codec chain has a v2 spelling, minus a trailing
``crc32c`` when there is one; otherwise transcoded (raw C-order bytes), which
is also how array→array codecs before the sharding codec (``a2a``) are shown.
"""

from __future__ import annotations

import functools
import json
import logging
import math
from dataclasses import dataclass, replace
from typing import Any

import crc32c
import numcodecs
import numpy as np
from numcodecs.compat import ensure_contiguous_ndarray
from zarr.codecs import (
    BloscCodec,
    BytesCodec,
    Crc32cCodec,
    GzipCodec,
    ShardingCodec,
    TransposeCodec,
    ZstdCodec,
)
from zarr.abc.codec import ArrayArrayCodec, BytesBytesCodec
from zarr.core.array_spec import ArrayConfig, ArraySpec
from zarr.core.buffer import default_buffer_prototype
from zarr.core.chunk_key_encodings import V2ChunkKeyEncoding
from zarr.core.codec_pipeline import BatchedCodecPipeline
from zarr.core.sync import sync as zarr_sync
from zarr.core.metadata.v3 import ArrayV3Metadata

from shardfs.format import bombs
from shardfs.format.a2a import Filters, index_order, split_sharding
from shardfs.format.draft import draft_index
from shardfs.format.dtypes import MAX_VLEN_CHUNK, view_dtype, vlen_codec_id
from shardfs.format.fill import map_fill, remembered, remembered_null_fill
from shardfs.format.index import IndexFormat
from shardfs.format.layout import ArrayLayout, KeyScheme, Unpresentable, permuted, unpermuted
from shardfs.format.shardfile import NestedFormat, ShardFormat

log = logging.getLogger("shardfs")
_BLOSC_SHUFFLE = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}


class CorruptChunk(ValueError):
    """Inner-chunk bytes that do not decode, or refuse to encode (the message says why)."""


@dataclass(frozen=True)
class Transcoder:
    """zarr-python's own codecs for an inner chain that v2 cannot express.

    ``pipeline`` codes one stored inner chunk of ``spec``; ``filters`` (the
    array→array codecs before the sharding codec, if any) sit between it and
    the array-space chunk.
    """

    pipeline: Any
    spec: Any
    filters: Filters | None = None

    @functools.cached_property
    def outer(self) -> tuple[str | None, int, int]:
        """``(kind, crc, limit)``: the outermost compressor of the chain as ``bombs`` names it
        (None: none, or one ``bombs`` cannot size), the bytes of the ``crc32c`` checksums
        after it, and the most it may decode to: one encoded inner chunk's raw bytes (with a
        compressor's worst-case growth when another compressor lies below it)."""
        outside = list(getattr(self.pipeline, "bytes_bytes_codecs", ()))
        crc = 0
        while outside and isinstance(outside[-1], Crc32cCodec):
            outside.pop()
            crc += 4
        dtype = np.dtype(self.spec.dtype.to_native_dtype())
        n = MAX_VLEN_CHUNK if dtype.hasobject else math.prod(self.spec.shape) * dtype.itemsize
        limit = n if len(outside) <= 1 else n + n // 8 + n // 64 + 4096
        if not outside:
            return None, crc, limit
        codec = outside[-1]
        kind = ("zstd" if isinstance(codec, ZstdCodec) else "gzip" if isinstance(codec, GzipCodec)
                else "blosc" if isinstance(codec, BloscCodec)
                else "zlib" if getattr(codec, "codec_name", None) == "numcodecs.zlib" else None)
        return kind, crc, limit

    def check_size(self, stored: bytes) -> None:
        """``CorruptChunk`` if the outermost compressor's frame in ``stored`` says, or turns out
        while counting in bounded memory (``shardfs.format.bombs``), that it decodes to more
        than one inner chunk: refused before anything is decoded."""
        kind, crc, limit = self.outer
        if kind is None:
            return
        frame = stored[:len(stored) - crc] if crc else stored
        size = bombs.decoded_size(kind, frame, limit)
        if size is not None and size > limit:
            if bombs.said_size(kind, frame) is not None:
                raise CorruptChunk(f"inner chunk says it decodes to {size} bytes, not {limit}")
            raise CorruptChunk(f"inner chunk decodes to more than {limit} bytes")

    def decode(self, stored: bytes, dtype: np.dtype) -> bytes:
        """The raw C-order bytes, as ``dtype``, of a stored inner chunk (its size checked
        first: ``check_size``)."""
        self.check_size(stored)
        buf = default_buffer_prototype().buffer.from_bytes(stored)
        (out,) = zarr_sync(self.pipeline.decode([(buf, self.spec)]))
        if out is None:
            raise CorruptChunk("inner chunk decodes to nothing")
        array = out.as_numpy_array()
        if self.filters is not None:
            array = self.filters.decode(array)
        return np.ascontiguousarray(array, dtype=dtype).tobytes()

    def encode(self, raw: bytes, dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
        """The stored form of raw C-order bytes of an inner chunk of ``shape`` and ``dtype``."""
        array = np.frombuffer(raw, dtype=dtype).reshape(shape)
        if self.filters is not None:
            array = self.filters.encode(array)
        nd = default_buffer_prototype().nd_buffer.from_numpy_array(array)
        (out,) = zarr_sync(self.pipeline.encode([(nd, self.spec)]))
        return out.to_bytes()


@dataclass(frozen=True)
class ChunkFormat:
    """How a stored inner chunk becomes the bytes of its chunk file.

    ``crc32c``: the stored bytes end with a crc32c of the rest, verified and
    stripped on read, appended on write. ``transcoder``: the chain has no v2
    spelling; chunk files hold the raw C-order array bytes (``compressor``
    null), decoded and encoded with zarr's codecs.
    """

    dtype: np.dtype
    order: str
    compressor: dict[str, Any] | None
    crc32c: bool
    nbytes: int  # decoded size of one inner chunk (elements x itemsize; for "|O", elements x 8)
    shape: tuple[int, ...] = ()
    transcoder: Transcoder | None = None
    filters: tuple[dict[str, Any], ...] | None = None  # v2 filters (numcodecs configurations)

    @property
    def items(self) -> int:
        """Elements in one inner chunk."""
        return self.nbytes // self.dtype.itemsize

    @property
    def variable(self) -> bool:
        """True for a variable-length type (``|O``): its chunks have no fixed decoded size."""
        return self.dtype.hasobject

    @property
    def decodes(self) -> bool:
        """True if serving a chunk needs its whole stored bytes (checksum or transcoding)."""
        return self.crc32c or self.transcoder is not None

    def file_size(self, stored_nbytes: int | np.ndarray) -> int | np.ndarray:
        """``st_size`` of a chunk file whose stored form is ``stored_nbytes`` long
        (elementwise for an int64 array of stored sizes)."""
        many = isinstance(stored_nbytes, np.ndarray)
        if self.transcoder is not None:
            return np.full_like(stored_nbytes, self.nbytes) if many else self.nbytes
        trimmed = stored_nbytes - (4 if self.crc32c else 0)
        return np.maximum(trimmed, 0) if many else max(0, trimmed)

    @property
    def max_file_size(self) -> int:
        """The largest chunk file that can be one valid inner chunk: writes and truncates past
        it are refused with EFBIG (see README "Limits").

        Without a compressor (raw or transcoded chunk files) a valid file is exactly
        ``nbytes`` long. With one it is at most ``nbytes + nbytes/8 + nbytes/64 + 4 KiB``,
        above the worst-case expansion of every v2 compressor shown: deflate's stored
        blocks plus the gzip wrapper (zlib's ``deflateBound`` is ``n + n/8 + n/64 + 23``),
        zstd's ``ZSTD_compressBound`` (``n + n/256 + 64``) and blosc's 16-byte header.
        A variable-length chunk has no such size: its bound is ``MAX_VLEN_CHUNK``.
        """
        if self.variable:
            return MAX_VLEN_CHUNK
        n = self.nbytes
        return n if self.compressor is None else n + n // 8 + n // 64 + 4096

    @property
    def max_stored(self) -> int:
        """The most bytes a stored inner chunk may take when serving it decodes it (``decodes``):
        one inner chunk grown by a compressor's worst case (see ``max_file_size``) and its
        checksums. A longer one is corrupt and never read (an index may point at a sparse
        terabyte)."""
        if self.transcoder is not None:
            kind, crc, limit = self.transcoder.outer
            return limit + limit // 8 + limit // 64 + 4096 + crc
        return self.max_file_size + (4 if self.crc32c else 0)

    def to_file(self, stored: bytes) -> bytes:
        """The chunk file's bytes for a stored inner chunk; ``CorruptChunk`` if it does not decode,
        or decodes (or says it decodes, or is found to while it is counted before decoding:
        ``Transcoder.check_size``) to more than one inner chunk's bytes."""
        if self.transcoder is not None:
            try:
                raw = self.transcoder.decode(stored, self.dtype)
            except CorruptChunk:
                raise
            except Exception as e:
                raise CorruptChunk(f"inner chunk does not decode: {e}") from None
            if len(raw) != self.nbytes:
                raise CorruptChunk(f"inner chunk decodes to {len(raw)} bytes, not {self.nbytes}")
            return raw
        if not self.crc32c:
            return stored
        if len(stored) < 4 or crc32c.crc32c(stored[:-4]) != int.from_bytes(stored[-4:], "little"):
            raise CorruptChunk("crc32c of the inner chunk does not match")
        return stored[:-4]

    def prepare(self, data: bytes) -> bytes:
        """The stored form of chunk-file bytes ``data``; ``CorruptChunk`` (saying why) if they
        are not exactly one inner chunk. CPU-bound (a full decode): the writeback runs it
        off the trio thread unless ``data`` is small."""
        reason = self.check(data)
        if reason is not None:
            raise CorruptChunk(reason)
        return self.stored(data)

    def check(self, data: bytes) -> str | None:
        """Why ``data`` is not exactly one inner chunk in this format (None if it is).

        Decodes with the v2 compressor and filters (numcodecs), as a v2 reader would; a
        variable-length chunk must decode to one element per element of an inner chunk.
        """
        buf: Any = data
        for config in ([self.compressor] if self.compressor else []) + list(reversed(self.filters or ())):
            try:
                buf = numcodecs.get_codec(dict(config)).decode(buf)
            except Exception as e:
                return f"does not decode with {config['id']}: {e}"
        if self.variable:
            count = np.asarray(buf).size
            return None if count == self.items else f"decodes to {count} elements; one inner chunk has {self.items}"
        raw_size = ensure_contiguous_ndarray(buf).nbytes
        if raw_size != self.nbytes:
            return f"decodes to {raw_size} bytes; one inner chunk is {self.nbytes} bytes"
        return None

    def constant_file(self, value: Any) -> bytes:
        """The chunk file of an inner chunk whose every element is ``value`` (a fill chunk): the
        same bytes whenever, and by whichever worker, it is made (a gzip stream's header time,
        which numcodecs sets to the time of encoding, is 0: none given, RFC 1952)."""
        buf: Any = np.full(self.items, value, dtype=self.dtype)
        for config in list(self.filters or ()) + ([self.compressor] if self.compressor else []):
            buf = numcodecs.get_codec(dict(config)).encode(buf)
        out = bytes(ensure_contiguous_ndarray(buf))
        if self.compressor is not None and self.compressor["id"] == "gzip":
            out = out[:4] + bytes(4) + out[8:]  # MTIME, bytes 4-7 of the header
        return out

    def stored(self, data: bytes) -> bytes:
        """The bytes to store in the shard for chunk-file bytes ``data`` (already checked);
        ``CorruptChunk`` if zarr's codecs cannot encode them."""
        if self.transcoder is not None:
            try:
                return self.transcoder.encode(data, self.dtype, self.shape)
            except Exception as e:  # numcodecs raises many types
                raise CorruptChunk(f"does not encode with the array's codecs: {e}") from None
        return data + crc32c.crc32c(data).to_bytes(4, "little") if self.crc32c else data


@dataclass(frozen=True)
class ArrayInfo:
    """Everything the view needs to present one v3 array.

    ``serve_missing``: the v2 ``fill_value`` is not the v3 fill (see ``shardfs.format.fill``), so
    an empty in-bounds inner chunk is served as ``fill_file()`` instead of being absent.
    """

    layout: ArrayLayout
    chunk: ChunkFormat
    zarray: bytes
    zattrs: bytes
    fill: Any = None  # the v3 fill value, a numpy scalar
    serve_missing: bool = False

    def fill_file(self) -> bytes:
        """The chunk file of an empty inner chunk (CPU-bound: call it off the trio thread)."""
        return self.chunk.constant_file(self.fill)


def describe_array(doc: dict[str, Any], ome: bool = True, image: bool = False, c_order: bool = False) -> ArrayInfo:
    """Present a parsed v3 array ``zarr.json`` as a v2 array; raises ``Unpresentable``.

    Handles the ``sharding_indexed`` codec (nested too: the view shows the
    innermost chunks) and the draft sharding storage transformer. ``ome``:
    translate OME-Zarr 0.5 attributes to 0.4; ``image``: the array is a level
    of an OME-Zarr image or label (its group has ``multiscales``), so its v2
    keys use "/" (``KeyScheme.view_separator``); ``c_order`` (``-o c_order``): inner chunks
    stored transposed, which v2 spells ``"order": "F"``, are transcoded to C order instead,
    for readers that ignore ``order`` (netCDF-C).
    """
    shape_doc = doc.get("shape")
    draft = draft_index(doc.get("storage_transformers"), len(shape_doc) if isinstance(shape_doc, list) else 0)
    try:
        meta = ArrayV3Metadata.from_dict({k: v for k, v in doc.items() if k != "storage_transformers"})
    except Exception as e:  # zarr raises many types for bad metadata
        raise Unpresentable(f"invalid array metadata: {e}") from e
    if meta.chunk_grid.__class__.__name__ != "RegularChunkGrid":
        raise Unpresentable("only the regular chunk grid is supported")
    dtype, vlen = view_dtype(meta.data_type)
    shape = tuple(meta.shape)
    outer_chunks = tuple(meta.chunk_grid.chunk_shape)  # type: ignore[attr-defined]  # zarr's one grid: regular
    enc = meta.chunk_key_encoding
    keys = KeyScheme("v2" if isinstance(enc, V2ChunkKeyEncoding) else "default", enc.separator,  # type: ignore[attr-defined]  # both encodings have one
                     len(shape), image)
    codecs = tuple(meta.codecs)
    before: tuple[Any, ...] = ()  # array→array codecs before the sharding codec
    if draft is not None:
        if any(isinstance(c, ShardingCodec) for c in codecs):
            raise Unpresentable("the sharding codec inside the sharding storage transformer is not supported")
        shard_shape = tuple(c * n for c, n in zip(outer_chunks, draft.chunks_per_shard))
        layout = ArrayLayout(shape, outer_chunks, shard_shape, draft, keys)
        inner = codecs
    elif any(isinstance(c, ShardingCodec) for c in codecs):
        before, sharding_codec = split_sharding(codecs)
        layout, inner = _sharded_layout(sharding_codec, index_order(before), shape, outer_chunks, keys)
    else:
        layout = ArrayLayout(shape, outer_chunks, outer_chunks, None, keys)
        inner = codecs
    chunk = _presented(before, inner, meta, layout, vlen, c_order)
    attrs = ome_04(dict(meta.attributes)) if ome else dict(meta.attributes)
    written = remembered(doc)  # an array created through the mount: its .zarray spelled as written
    names = meta.dimension_names
    if names is None and not shape and "v2_dimension_names" not in written:
        names = ()  # xarray: 0-D has dims () (a v3 writer leaves them out; a .zattrs without them did not)
    if names is not None and all(isinstance(n, str) for n in names):
        attrs.setdefault("_ARRAY_DIMENSIONS", list(names))
    fill = map_fill(attrs, meta.fill_value, dtype, "_ARRAY_DIMENSIONS" in attrs, remembered_null_fill(doc))
    zarray = {
        "zarr_format": 2,
        "shape": list(shape),
        "chunks": list(layout.chunk_shape),
        "dtype": chunk.dtype.descr if chunk.dtype.fields else chunk.dtype.str,  # structured: v2's list
        "compressor": chunk.compressor,
        "fill_value": fill.fill_value,
        "order": chunk.order,
        "filters": list(chunk.filters) if chunk.filters else None,
        "dimension_separator": keys.view_separator,
    }
    if "v2_dimension_separator" in written and (keys.view_separator == "." or not shape):
        if written["v2_dimension_separator"] in (".", "/"):  # a 0-d array has the one key "0" either way
            zarray["dimension_separator"] = written["v2_dimension_separator"]
        elif written["v2_dimension_separator"] is None:  # none written: "." is v2's default
            del zarray["dimension_separator"]
    return ArrayInfo(layout, chunk, to_json(zarray), to_json(fill.attrs), meta.fill_value, fill.serve_missing)


def group_files(doc: dict[str, Any], ome: bool = True) -> tuple[bytes, bytes]:
    """``(.zgroup, .zattrs)`` for a parsed v3 group ``zarr.json``."""
    attrs = doc.get("attributes") or {}
    return to_json({"zarr_format": 2}), to_json(ome_04(attrs) if ome else attrs)


def is_ome_image(attrs: dict[str, Any]) -> bool:
    """True if group attributes describe an OME-Zarr multiscale image or label image
    (0.5: ``ome.multiscales``; 0.4 and earlier: ``multiscales``): its arrays are the levels."""
    ome = attrs.get("ome")
    return "multiscales" in attrs or (isinstance(ome, dict) and "multiscales" in ome)


def ome_04(attrs: dict[str, Any]) -> dict[str, Any]:
    """OME-Zarr 0.5 attributes (``{"ome": {"version": "0.5", ...}}``) spelled as OME-Zarr 0.4.

    0.4 keeps ``multiscales``, ``omero``, ``labels``, ``image-label``, ``plate``
    and ``well`` at the top level, with the version inside each versioned object.
    Attributes without 0.5 OME metadata are returned unchanged.
    """
    ome = attrs.get("ome")
    if not isinstance(ome, dict) or not str(ome.get("version", "")).startswith("0.5"):
        return attrs
    out = {k: v for k, v in attrs.items() if k != "ome"}
    for key, value in ome.items():
        if key == "version":
            continue
        if key == "multiscales" and isinstance(value, list):
            value = [{**m, "version": "0.4"} if isinstance(m, dict) else m for m in value]
        elif key in ("image-label", "plate", "well") and isinstance(value, dict):
            value = {**value, "version": "0.4"}
        out[key] = value
    return out


def to_json(obj: Any) -> bytes:
    """A v2 metadata file, spelled as zarr 2 writes them (so a file written through the mount
    reads back byte for byte): 4 spaces, sorted keys, ASCII, no newline at the end, and a NaN
    or infinite attribute as the JSON extension ``NaN``/``Infinity`` that zarr 2 and 3 write
    and read (a ``.zarray``'s fill value is spelled as a string: ``encode_fill_value``)."""
    return json.dumps(obj, indent=4, sort_keys=True).encode()


def _shard_format(sharding: ShardingCodec, shard_shape: tuple[int, ...]
                  ) -> tuple[ShardFormat, tuple[int, ...], tuple[Any, ...]]:
    """``(format, innermost chunk shape, innermost codecs)`` of shards of ``shard_shape``.

    An inner chain that is a sharding codec, optionally followed by ``crc32c``,
    is nested sharding; other codecs around a nested sharding codec are not supported.
    """
    chunk_shape = tuple(sharding.chunk_shape)
    if len(chunk_shape) != len(shard_shape) or any(c <= 0 or s % c for s, c in zip(shard_shape, chunk_shape)):
        raise Unpresentable(f"inner chunk shape {chunk_shape} does not divide shard shape {shard_shape}")
    index = _index_format(sharding, shard_shape)
    inner = tuple(sharding.codecs)
    if not any(isinstance(c, ShardingCodec) for c in inner):
        return index, chunk_shape, inner
    if not isinstance(inner[0], ShardingCodec) or not all(isinstance(c, Crc32cCodec) for c in inner[1:2]) \
            or len(inner) > 2:
        raise Unpresentable("codecs around a nested sharding codec other than a trailing crc32c are not supported")
    fmt, innermost, codecs = _shard_format(inner[0], chunk_shape)
    try:
        return NestedFormat(index, fmt, len(inner) == 2), innermost, codecs
    except ValueError as e:
        raise Unpresentable(str(e)) from e


def _sharded_layout(sharding: ShardingCodec, order: tuple[int, ...] | None, shape: tuple[int, ...],
                    shard_shape: tuple[int, ...], keys: KeyScheme) -> tuple[ArrayLayout, tuple[Any, ...]]:
    """``(layout, innermost codecs)`` of an array whose shards of ``shard_shape`` are coded by
    ``sharding``, after a transpose by ``order`` (None: no transpose before the sharding codec)."""
    if order is None:
        index, chunk_shape, inner = _shard_format(sharding, shard_shape)
        return ArrayLayout(shape, chunk_shape, shard_shape, index, keys), inner
    if sorted(order) != list(range(len(shape))):  # zarr validates it too
        raise Unpresentable(f"transpose order {order} is not a permutation of {len(shape)} dimensions")
    index, chunk_shape, inner = _shard_format(sharding, permuted(shard_shape, order))
    return ArrayLayout(shape, unpermuted(chunk_shape, order), shard_shape, index, keys, order), inner


def _presented(before: tuple[Any, ...], inner: tuple[Any, ...], meta: ArrayV3Metadata,
               layout: ArrayLayout, vlen: str | None, c_order: bool = False) -> ChunkFormat:
    """How an inner chunk coded by ``before`` (array→array codecs before the sharding codec)
    and then ``inner`` is shown: with its v2 spelling if it has one (unless that spelling is
    ``"order": "F"`` and ``c_order`` is set), else transcoded.

    With codecs ``before`` it is always transcoded, and ``Unpresentable`` unless
    an empty inner chunk decodes to the fill value (``Filters.check_empty_chunk``).
    A variable-length type (object codec ``vlen``) is never transcoded: its chunks
    have no raw form, so a chain without a v2 spelling is ``Unpresentable`` (and an F-order
    one stays F order under ``c_order``).
    """
    spec = _chunk_spec(meta, layout.chunk_shape)
    if vlen is not None:
        if before:
            raise Unpresentable(f"codecs before the sharding codec of a {vlen} array have no v2 equivalent")
        return _chunk_format(inner, np.dtype(object), layout.ndim, math.prod(layout.chunk_shape) * 8, vlen)
    if before:
        try:
            filters = Filters.over(before, spec)
        except Exception as e:  # zarr and numcodecs raise many types
            raise Unpresentable(f"codecs before the sharding codec do not apply: {e}") from e
        filters.check_empty_chunk()
        return _transcoded(inner, spec, filters)
    dtype = np.dtype(meta.data_type.to_native_dtype())
    try:
        chunk = _chunk_format(inner, dtype, layout.ndim, math.prod(layout.chunk_shape) * dtype.itemsize)
    except Unpresentable as e:
        log.info("array: transcoding inner chunks (%s)", e)
        return _transcoded(inner, spec)
    if c_order and chunk.order == "F":  # of one dimension or none: the bytes are C order already
        return _transcoded(inner, spec) if layout.ndim > 1 else replace(chunk, order="C")
    return chunk


def _index_format(sharding: ShardingCodec, shard_shape: tuple[int, ...]) -> IndexFormat:
    cps = tuple(s // c for s, c in zip(shard_shape, sharding.chunk_shape))
    index_codecs = tuple(sharding.index_codecs)
    if not index_codecs or not isinstance(index_codecs[0], BytesCodec):
        raise Unpresentable(f"unsupported index codecs {index_codecs}")
    rest = index_codecs[1:]
    if rest and not (len(rest) == 1 and isinstance(rest[0], Crc32cCodec)):
        raise Unpresentable(f"unsupported index codecs {index_codecs}")
    try:
        return IndexFormat(
            chunks_per_shard=cps,
            big_endian=_endian(index_codecs[0]) == "big",
            checksum=bool(rest),
            at_start=str(getattr(sharding.index_location, "value", sharding.index_location)) == "start",
        )
    except ValueError as e:
        raise Unpresentable(str(e)) from e


def _endian(codec: BytesCodec) -> str | None:
    return None if codec.endian is None else str(getattr(codec.endian, "value", codec.endian))


def _chunk_format(codecs: tuple[Any, ...], dtype: np.dtype, ndim: int, nbytes: int,
                  vlen: str | None = None) -> ChunkFormat:
    """Map an inner codec chain to its v2 spelling; ``Unpresentable`` if it has none.

    ``vlen``: the object codec of a variable-length type, whose array→bytes codec becomes
    the last v2 filter (numcodecs writes the bytes zarr's ``vlen-*`` codecs store)."""
    chain = list(codecs)
    crc = bool(chain) and isinstance(chain[-1], Crc32cCodec)
    if crc:
        chain.pop()
    order = "C"
    if chain and isinstance(chain[0], TransposeCodec):
        if tuple(chain[0].order) != tuple(reversed(range(ndim))):
            raise Unpresentable(f"transpose order {tuple(chain[0].order)} has no v2 equivalent")
        order = "F"  # also of a 1-d or 0-d array (the same bytes as C), as zarr 2 wrote it
        chain.pop(0)
    filters: list[Any] = []  # numcodecs configurations (the loop checks each)
    while chain and isinstance(chain[0], ArrayArrayCodec) and _numcodecs_config(chain[0]) is not None:
        if order == "F" and ndim > 1:  # the filter would see the transposed chunk, a v2 one the F-ordered one
            raise Unpresentable("numcodecs filters after a transpose have no v2 equivalent")
        filters.append(_numcodecs_config(chain.pop(0)))
    if vlen is not None:
        if not chain or vlen_codec_id(chain[0]) != vlen:
            raise Unpresentable(f"inner codecs {codecs} of a {vlen} array have no v2 equivalent")
        chain.pop(0)
        filters.append({"id": vlen})
        v2dtype = dtype
    else:
        if not chain or not isinstance(chain[0], BytesCodec):
            raise Unpresentable(f"inner codecs {codecs} have no v2 equivalent")
        endian = _endian(chain.pop(0))
        if filters and endian == "big":  # the filters' own dtypes say their byte order, not the bytes codec
            raise Unpresentable("numcodecs filters before big-endian bytes have no v2 equivalent")
        v2dtype = dtype.newbyteorder(">" if endian == "big" else "<") if dtype.itemsize > 1 else dtype
    if len(chain) > 1:
        raise Unpresentable(f"inner codecs {codecs} have no v2 equivalent")
    compressor = _compressor(chain[0]) if chain else None
    return ChunkFormat(v2dtype, order, compressor, crc, nbytes, filters=tuple(filters) or None)


def _numcodecs_config(codec: Any) -> dict[str, Any] | None:
    """The v2 (numcodecs) configuration of one of zarr's ``numcodecs.*`` codecs, else None:
    the stored bytes of such a codec are those of the numcodecs codec itself."""
    name = getattr(codec, "codec_name", None)
    if not isinstance(name, str) or not name.startswith("numcodecs."):
        return None
    config = {k: v for k, v in getattr(codec, "codec_config", {}).items() if k != "id"}
    try:
        return numcodecs.get_codec({"id": name.removeprefix("numcodecs."), **config}).get_config()
    except Exception:  # numcodecs raises many types for a bad configuration
        return None


def _chunk_spec(meta: ArrayV3Metadata, shape: tuple[int, ...]) -> ArraySpec:
    """zarr's spec of one (array-space, C-order) inner chunk of ``shape``."""
    return ArraySpec(shape=shape, dtype=meta.data_type, fill_value=meta.fill_value,
                     config=ArrayConfig(order="C", write_empty_chunks=True),
                     prototype=default_buffer_prototype())


def _transcoded(codecs: tuple[Any, ...], spec: ArraySpec, filters: Filters | None = None) -> ChunkFormat:
    """A format serving raw little-endian C-order chunks of ``spec``, coded with zarr's own
    codecs: ``filters`` (if any), then the inner chain ``codecs``."""
    inner_spec = spec if filters is None else filters.encoded
    try:
        pipeline = BatchedCodecPipeline.from_codecs([c.evolve_from_array_spec(inner_spec) for c in codecs])
    except Exception as e:
        raise Unpresentable(f"inner codecs {codecs} cannot be decoded: {e}") from e
    dtype = np.dtype(spec.dtype.to_native_dtype())
    dtype = dtype.newbyteorder("<") if dtype.itemsize > 1 else dtype
    return ChunkFormat(dtype, "C", None, False, math.prod(spec.shape) * dtype.itemsize, spec.shape,
                       Transcoder(pipeline, inner_spec, filters))


def _compressor(codec: Any) -> dict[str, Any]:
    if isinstance(codec, GzipCodec):
        return {"id": "gzip", "level": codec.level}
    if isinstance(codec, ZstdCodec):
        return {"id": "zstd", "level": codec.level}
    if isinstance(codec, BloscCodec):
        return {
            "id": "blosc",
            "cname": str(getattr(codec.cname, "value", codec.cname)),
            "clevel": codec.clevel,
            "shuffle": _BLOSC_SHUFFLE[str(getattr(codec.shuffle, "value", codec.shuffle))],
            "blocksize": codec.blocksize,
        }
    config = _numcodecs_config(codec) if isinstance(codec, BytesBytesCodec) else None
    if config is not None:
        return config
    raise Unpresentable(f"codec {codec} has no v2 equivalent")
