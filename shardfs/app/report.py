"""``shardfs inspect``: what is inside an array or one shard, for people and scripts."""

from __future__ import annotations

import json
import math
import os
import posixpath
from typing import Any, Callable, Sequence

import numpy as np

from shardfs.format.index import EMPTY, CorruptIndex, IndexFormat
from shardfs.storage import UNKNOWN, Storage
from shardfs.app.survey import stored_shards, survey as survey_shards
from shardfs.app.options import Parsed
from shardfs.app.targets import exists, locate, shown_key
from shardfs.tree.hierarchy import read_metadata
from shardfs.format.layout import ArrayLayout, Unpresentable
from shardfs.format.shardfile import CORRUPT, Indexes, NestedFormat, ShardFormat, decode, flat_table, outermost
from shardfs.format.a2a import describe
from shardfs.format.gridmap import char_map, parse_slice
from shardfs.format.v2 import describe_array

MAX_NAMED = 10  # arrays of a group named by inspect's line


class _Hidden(Exception):
    """A directory whose ``zarr.json`` is bad: the mount hides it (``args``: its key, reason)."""


def _array_at(storage: Storage, key: str) -> tuple[str, dict[str, Any]] | None:
    """The nearest key at or above ``key`` holding an array's ``zarr.json``, and that document;
    ``_Hidden`` if a bad ``zarr.json`` comes first."""
    current = key
    while True:
        meta = posixpath.join(current, "zarr.json") if current else "zarr.json"
        try:
            doc, _ = read_metadata(storage, meta, UNKNOWN)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            doc = None
        except OSError as e:
            raise _Hidden(current, f"zarr.json: {e.strerror or e}") from None
        if isinstance(doc, str):
            raise _Hidden(current, doc)
        if doc is not None and doc["node_type"] == "array":
            return current, doc
        if not current:
            return None
        current = posixpath.dirname(current)


def inspect(path: str, opts: Parsed | None = None, survey: bool = True,
            progress: Callable[[int], Callable[[int], None]] | None = None, whole: bool = False) -> dict[str, Any]:
    """A description of the array or shard at ``path`` (a local path, a path in a mount, or an
    object-store URL; ``opts``: the ``-o`` options, for a URL): the array's summary, with ``survey``
    its stored shards and chunks counted (``array_survey``; for a shard too with ``whole``: what
    ``--map`` draws), and for a shard (file or shard directory) its report under ``"shard"``.
    ``progress(n)`` is called with the number of shards to read and gives the callback told of
    each one read.

    Raises ``ValueError`` with a one-line reason if ``path`` is neither: it does not exist, it is
    a group (the arrays it holds named), or it is not inside an array.
    """
    source, key, in_mount = locate(path, opts or Parsed())
    with source.opened() as storage:
        if in_mount and os.path.lexists(path):  # the view's path: the mount answers
            key = shown_key(storage, key)
        elif in_mount or key and not exists(storage, key):
            raise ValueError(f"{path}: no such file or directory")
        try:
            found = _array_at(storage, key)
        except _Hidden as e:
            node, reason = e.args
            return {"array": storage.describe(node), "codecs": None, "shape": None, "data_type": None,
                    "presentable": False, "reason": reason}
        if found is None:
            arrays = group_arrays(storage, key)
            if arrays is None:
                raise ValueError(f"{path}: not inside a Zarr v3 array")
            held = ", ".join(arrays[:MAX_NAMED]) + (f" and {len(arrays) - MAX_NAMED} more"
                                                    if len(arrays) > MAX_NAMED else "")
            raise ValueError(f"{path}: a Zarr v3 group, not an array: " + (
                f"it holds {held} (inspect one of them)" if arrays else "it holds no arrays"))
        array, doc = found
        report, layout = array_summary(storage.describe(array), doc)
        if layout is None:
            return report
        if survey and (key == array or whole):
            report["stored"] = array_survey(storage, array, layout, _itemsize(doc.get("data_type")), progress)
        if key == array:
            return report
        if layout.index is None:
            return report
        rel = key[len(array) + 1:] if array else key
        shard = layout.keys.parse(rel)
        try:
            data = storage.read_all(key)[0] if shard is not None else None
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            data = None
        if data is None or shard is None:
            raise ValueError(f"{path}: not a shard of {storage.describe(array)}")
        report["shard"] = shard_report(layout, rel, shard, data)
        return report


def group_arrays(storage: Storage, key: str) -> list[str] | None:
    """The arrays of the group at ``key`` (at any depth below it, through its groups), their
    paths relative to it, sorted; None if ``key`` holds no group's ``zarr.json``."""
    if _node_type(storage, key) != "group":
        return None
    out = []
    for page in storage.list(key):
        for entry in page:
            child = posixpath.join(key, entry.name) if key else entry.name
            kind = _node_type(storage, child) if entry.is_dir else None
            if kind == "array":
                out.append(entry.name)
            elif kind == "group":
                out += [f"{entry.name}/{name}" for name in group_arrays(storage, child) or []]
    return sorted(out)


def _node_type(storage: Storage, key: str) -> str | None:
    """``node_type`` of the Zarr v3 ``zarr.json`` at ``key`` ("array", "group"); None if none is usable."""
    try:
        doc, _ = read_metadata(storage, posixpath.join(key, "zarr.json") if key else "zarr.json", UNKNOWN)
    except OSError:
        return None
    return doc.get("node_type") if isinstance(doc, dict) else None


def array_survey(storage: Storage, array: str, layout: ArrayLayout, itemsize: int | None,
                 progress: Callable[[int], Callable[[int], None]] | None = None) -> dict[str, Any]:
    """Which shards and inner chunks of the array at ``array`` are stored (``survey.survey``),
    as ``inspect`` reports it: the figures, and one row per stored or corrupt shard."""
    shards = stored_shards(storage, array, layout)
    found = survey_shards(storage, layout, shards, progress(len(shards)) if progress else None)
    raw_chunk = itemsize * math.prod(layout.chunk_shape) if itemsize else None
    rows = [{"coords": list(c), "chunks": n, "chunks_in_bounds": found.in_bounds(c), "bytes": found.sizes[c]}
            for c, n in sorted(found.chunks.items())]
    chunks = sum(found.chunks.values())
    return {"shards_stored": len(found.chunks), "shards_total": found.shards_total, "chunks_stored": chunks,
            "chunks_total": found.chunks_total, "bytes_stored": sum(found.sizes.values()),
            "chunk_bytes": found.chunk_bytes,
            "compression_ratio": round(chunks * raw_chunk / found.chunk_bytes, 3)
            if raw_chunk and found.chunk_bytes else None,
            "corrupt_shards": len(found.corrupt),
            "corrupt": [{"coords": list(c), "reason": why} for c, why in sorted(found.corrupt.items())],
            "shard_grid": list(found.shard_grid), "shards": rows}


def _itemsize(data_type: Any) -> int | None:
    """Bytes per element of a fixed-size v3 ``data_type`` named like a numpy type (None otherwise:
    the compression ratio is then not given)."""
    try:
        dtype = np.dtype(data_type) if isinstance(data_type, str) else None
    except TypeError:
        return None
    return dtype.itemsize if dtype is not None and dtype.kind in "biufcmM" else None


def array_summary(array: str, doc: dict[str, Any]) -> tuple[dict[str, Any], ArrayLayout | None]:
    """What ``inspect`` says about the array at directory ``array`` whose ``zarr.json`` is
    ``doc``, and its layout (None if the array cannot be shown as v2: the summary says why)."""
    out: dict[str, Any] = {"array": array, "codecs": doc.get("codecs"), "shape": doc.get("shape"),
                           "data_type": doc.get("data_type")}
    try:
        info = describe_array(doc)
    except Unpresentable as e:
        out["presentable"] = False
        out["reason"] = str(e)
        return out, None
    layout = info.layout
    out.update(presentable=True, shard_shape=list(layout.shard_shape), chunk_shape=list(layout.chunk_shape),
               chunks_per_shard=list(layout.chunks_per_shard),
               v2_compressor=info.chunk.compressor, transcoded=info.chunk.transcoder is not None)
    filters = info.chunk.transcoder.filters if info.chunk.transcoder is not None else None
    if filters is not None:
        out["before_sharding"] = describe(filters.codecs)
    if layout.order is not None:
        out["index_order"] = list(layout.order)
    if doc.get("storage_transformers"):
        out["storage_transformer"] = "sharding storage-transformer draft (indexed)"
    if layout.index is not None:
        out["index"] = _index(outermost(layout.index))
    if isinstance(layout.index, NestedFormat):
        out["nested"] = _levels(layout)
    return out, layout


def shard_report(layout: ArrayLayout, key: str, shard: tuple[int, ...], data: bytes) -> dict[str, Any]:
    """What ``inspect`` says about one shard (``data``, stored under ``key`` at ``shard``):
    index status, one row per index entry, nested inner shards and unused bytes. Each index
    is decoded once."""
    fmt = layout.index
    assert fmt is not None  # the array of a shard is sharded
    entry: dict[str, Any] = {"key": key, "coords": list(shard), "size": len(data)}

    def read(offset: int, n: int) -> bytes:
        return data[offset: offset + n]

    try:
        indexes = decode(fmt, read, 0, len(data))
    except CorruptIndex as e:
        entry["index_status"] = f"corrupt: {e}"
        return entry
    entry["index_status"] = _status(outermost(fmt))
    table = flat_table(fmt, indexes)
    coords, inside = layout.chunks_at(shard, np.arange(len(table)))
    names = [name if ok else None for name, ok in zip(layout.names.keys(coords), inside.tolist())]
    rows = _rows(table, "chunk", names)
    for row in rows:
        if row["empty"] and table[row["pos"], 1] == CORRUPT:
            row["corrupt"] = True
    if isinstance(fmt, NestedFormat):
        entry["inner_shards"] = _inner_shards(layout, shard, indexes)
    entry.update(stored_chunks=int(np.sum(table[:, 0] != EMPTY)), index=rows,
                 unused_bytes=_unused(fmt, indexes, len(data)))
    return entry


def _rows(table: np.ndarray, field: str, names: Sequence[str | None]) -> list[dict[str, Any]]:
    """One row per entry of an index table: position, ``field`` (the entry's name), offset,
    nbytes, empty."""
    empty = int(EMPTY)
    return [{"pos": pos, field: name, "offset": None if offset == empty else offset,
             "nbytes": None if offset == empty else nbytes, "empty": offset == empty}
            for pos, (name, (offset, nbytes)) in enumerate(zip(names, table.tolist()))]


def _index(fmt: IndexFormat) -> dict[str, Any]:
    return {"location": "start" if fmt.at_start else "end", "endian": "big" if fmt.big_endian else "little",
            "crc32c": fmt.checksum, "nbytes": fmt.nbytes}


def _status(fmt: IndexFormat) -> str:
    return "ok (checksum verified)" if fmt.checksum else "ok (no checksum)"


def _levels(layout: ArrayLayout) -> list[dict[str, Any]]:
    """The nested inner shards of each level, outermost first."""
    out = []
    fmt = layout.index
    for per in layout.spans[1:]:  # array space (a transpose before the sharding codec permutes the index's)
        assert isinstance(fmt, NestedFormat)  # one nested level per span after the first
        out.append({"inner_shard_shape": [c * n for c, n in zip(layout.chunk_shape, per)],
                    "chunks_per_inner_shard": list(per), "crc32c_after": fmt.crc32c,
                    "index": _index(outermost(fmt.inner))})
        fmt = fmt.inner
    return out


def _inner_shards(layout: ArrayLayout, shard: tuple[int, ...], indexes: Indexes) -> list[dict[str, Any]]:
    """One row per entry of a shard's index over its (first-level) inner shards."""
    table = indexes.table
    names = [layout.names.key(layout.inner_shard_at(shard, pos)) for pos in range(len(table))]
    rows = _rows(table, "inner_shard", names)
    assert isinstance(layout.index, NestedFormat)  # the shard holds inner shards
    ok = _status(outermost(layout.index.inner))
    for row in rows:
        inner = indexes.inner.get(row["pos"])
        if not row["empty"]:
            row["index_status"] = f"corrupt: {inner}" if isinstance(inner, CorruptIndex) else ok
    return rows


def _unused(fmt: ShardFormat, indexes: Indexes, size: int) -> int:
    """Bytes of a (possibly nested) ``size``-byte shard that no index entry or index covers."""
    table = indexes.table
    unused = size - outermost(fmt).nbytes - int(table[table[:, 0] != EMPTY, 1].sum())
    if isinstance(fmt, NestedFormat):
        trailer = 4 if fmt.crc32c else 0
        unused += sum(_unused(fmt.inner, inner, int(table[pos, 1]) - trailer)
                      for pos, inner in indexes.inner.items() if isinstance(inner, Indexes))
    return unused


def format_text(report: dict[str, Any], where: Any = None) -> str:
    """A human-readable rendering of ``inspect``'s result; ``where``: the slice of the shard
    grid its character map shows (``gridmap.Slice``; default: the last two dimensions)."""
    lines = [f"array      {report['array']}", f"shape      {report['shape']}  {report['data_type']}",
             f"codecs     {json.dumps(report['codecs'])}"]
    if not report["presentable"]:
        lines.append(f"v2 view    not shown: {report['reason']}")
        return "\n".join(lines)
    lines += [f"shards     {report['shard_shape']}  inner chunks {report['chunk_shape']}"
              f"  ({report['chunks_per_shard']} per shard)",
              f"v2 view    compressor {json.dumps(report['v2_compressor'])}"
              f"{'  (transcoded)' if report['transcoded'] else ''}"]
    if "before_sharding" in report:
        order = report.get("index_order")
        lines.append(f"a2a        {', '.join(report['before_sharding'])} before the sharding codec, applied per "
                     f"inner chunk{f'; the index grid is the chunk grid transposed by {order}' if order else ''}")
    if "index" in report:
        ix = report["index"]
        lines.append(f"index      at {ix['location']}, {ix['endian']} endian, crc32c {ix['crc32c']}, "
                     f"{ix['nbytes']} bytes"
                     f"{'  (' + report['storage_transformer'] + ')' if 'storage_transformer' in report else ''}")
    for level in report.get("nested", []):
        ix = level["index"]
        lines.append(f"nested     inner shards {level['inner_shard_shape']} ({level['chunks_per_inner_shard']} "
                     f"chunks each{', crc32c after each' if level['crc32c_after'] else ''}); their index at "
                     f"{ix['location']}, {ix['endian']} endian, crc32c {ix['crc32c']}")
    stored = report.get("stored")
    if stored is not None:
        lines += _stored_lines(report, stored, where)
    shard = report.get("shard")
    if shard:
        lines.append(f"shard      {shard['key']}  {shard['size']} bytes  index {shard['index_status']}")
        if "index" in shard:
            lines.append(f"           {shard['stored_chunks']} stored chunks, {shard['unused_bytes']} unused bytes")
            for row in shard.get("inner_shards", []):
                where = "empty" if row["empty"] else (f"{row['offset']} +{row['nbytes']}  "
                                                      f"index {row['index_status']}")
                lines.append(f"           inner shard {row['inner_shard']}: {where}")
            lines.append(f"{'pos':>6} {'chunk':>14} {'offset':>12} {'nbytes':>10}")
            for row in shard["index"]:
                cells = ("empty", "") if row["empty"] else (row["offset"], row["nbytes"])
                lines.append(f"{row['pos']:>6} {row['chunk'] or '(past edge)':>14} {cells[0]:>12} {cells[1]:>10}")
    return "\n".join(lines)


def _stored_lines(report: dict[str, Any], stored: dict[str, Any], where: Any) -> list[str]:
    """The survey's figures, then its character map, then the corrupt shards."""
    ratio = stored["compression_ratio"]
    lines = [f"stored     {stored['shards_stored']:,} of {stored['shards_total']:,} shards, "
             f"{stored['chunks_stored']:,} of {stored['chunks_total']:,} inner chunks "
             f"({100 * stored['chunks_stored'] / max(1, stored['chunks_total']):.1f}%), "
             f"{stored['bytes_stored']:,} bytes" + (f", compression ratio {ratio:g}" if ratio else ""),
             f"corrupt    {stored['corrupt_shards']} shards"]
    lines += [f"           {row['coords']}: {row['reason']}" for row in stored["corrupt"]]
    if where is None:
        where = parse_slice(None, report["shape"], report["shard_shape"])
    return lines + char_map(report, where)
