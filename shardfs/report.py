"""``shardfs inspect``: what is inside an array or one shard, for people and scripts."""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

import numpy as np

from shardfs.index import EMPTY, CorruptIndex, IndexFormat
from shardfs.metadata import BadMetadata, read_file
from shardfs.mounts import source_of
from shardfs.layout import ArrayLayout, Unpresentable
from shardfs.shardfile import CORRUPT, Indexes, NestedFormat, ShardFormat, decode, flat_table, outermost
from shardfs.a2a import describe
from shardfs.v2 import describe_array

class _Hidden(Exception):
    """A directory whose ``zarr.json`` is bad: the mount hides it (``args``: directory, reason)."""


def _array_dir(path: str) -> tuple[str, dict[str, Any]] | None:
    """The nearest directory at or above ``path`` holding an array's ``zarr.json``, and that
    document; ``_Hidden`` if a bad ``zarr.json`` comes first."""
    current = path if os.path.isdir(path) else os.path.dirname(path)
    while True:
        try:
            doc = read_file(os.path.join(current, "zarr.json"))
        except (FileNotFoundError, NotADirectoryError):
            doc = None
        except (BadMetadata, OSError) as e:
            raise _Hidden(current, str(e)) from None
        if doc is not None and doc["node_type"] == "array":
            return current, doc
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent


def inspect(path: str) -> dict[str, Any]:
    """A description of the array or shard at ``path`` (source or mount path): the array's
    summary and, for a shard (file or shard directory), its report under ``"shard"``.

    Raises ``ValueError`` with a one-line reason if ``path`` is neither.
    """
    src = source_of(path)
    try:
        found = _array_dir(src)
    except _Hidden as e:
        node, reason = e.args
        return {"array": node, "codecs": None, "shape": None, "data_type": None, "presentable": False,
                "reason": reason}
    if found is None:
        raise ValueError(f"{path}: not inside a Zarr v3 array")
    array, doc = found
    report, layout = array_summary(array, doc)
    if layout is None or src == array or layout.index is None:
        return report
    rel = os.path.relpath(src, array)
    shard = layout.keys.parse(rel.replace(os.sep, "/"))
    if shard is None or not os.path.isfile(os.path.join(array, rel)):
        raise ValueError(f"{path}: not a shard of {array}")
    with open(os.path.join(array, rel), "rb") as f:
        report["shard"] = shard_report(layout, rel, shard, f.read())
    return report


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


def format_text(report: dict[str, Any]) -> str:
    """A human-readable rendering of ``inspect``'s result."""
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
