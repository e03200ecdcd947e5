"""``shardfs inspect``: what is inside an array or one shard, for people and scripts."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from shardfs.index import EMPTY, CorruptIndex, IndexFormat
from shardfs.mounts import source_of
from shardfs.layout import ArrayLayout, Unpresentable
from shardfs.shardfile import CORRUPT, NestedFormat, ShardFormat, Read, outermost, read_table
from shardfs.a2a import describe
from shardfs.v2 import describe_array

def _array_dir(path: str) -> str | None:
    """The nearest directory at or above ``path`` holding an array's ``zarr.json``."""
    current = path if os.path.isdir(path) else os.path.dirname(path)
    while True:
        meta = os.path.join(current, "zarr.json")
        if os.path.isfile(meta):
            with open(meta, "rb") as f:
                if json.loads(f.read()).get("node_type") == "array":
                    return current
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent


def inspect(path: str) -> dict[str, Any]:
    """A description of the array or shard at ``path`` (source or mount path).

    Raises ``ValueError`` with a one-line reason if ``path`` is neither.
    """
    src = source_of(path)
    array = _array_dir(src)
    if array is None:
        raise ValueError(f"{path}: not inside a Zarr v3 array")
    with open(os.path.join(array, "zarr.json"), "rb") as f:
        doc = json.loads(f.read())
    out: dict[str, Any] = {"array": array, "codecs": doc.get("codecs"), "shape": doc.get("shape"),
                           "data_type": doc.get("data_type")}
    try:
        info = describe_array(doc)
    except Unpresentable as e:
        out["presentable"] = False
        out["reason"] = str(e)
        return out
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
    if src == array or layout.index is None:
        return out
    rel = os.path.relpath(src, array)
    shard = layout.keys.parse(rel.replace(os.sep, "/"))
    if shard is None or not os.path.isfile(os.path.join(array, rel)):
        raise ValueError(f"{path}: not a shard of {array}")
    with open(os.path.join(array, rel), "rb") as f:
        data = f.read()
    fmt = layout.index
    entry: dict[str, Any] = {"key": rel, "coords": list(shard), "size": len(data)}
    out["shard"] = entry

    def read(offset: int, n: int) -> bytes:
        return data[offset: offset + n]

    problems: dict[int, str] = {}
    try:
        table = read_table(fmt, read, 0, len(data), problems)
    except CorruptIndex as e:
        entry["index_status"] = f"corrupt: {e}"
        return out
    entry["index_status"] = _status(outermost(fmt))
    rows = []
    for pos in range(len(table)):
        coords = layout.chunk_at(shard, pos)
        empty = table[pos, 0] == EMPTY
        row = {"pos": pos, "chunk": None if coords is None else layout.names.key(coords),
               "offset": None if empty else int(table[pos, 0]),
               "nbytes": None if empty else int(table[pos, 1]), "empty": bool(empty)}
        if empty and table[pos, 1] == CORRUPT:
            row["corrupt"] = True
        rows.append(row)
    if isinstance(fmt, NestedFormat):
        entry["inner_shards"] = _inner_shards(layout, read, len(data), shard, problems)
    entry.update(stored_chunks=int(np.sum(table[:, 0] != EMPTY)), index=rows,
                 unused_bytes=_unused(fmt, read, 0, len(data)))
    return out


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
        out.append({"inner_shard_shape": [c * n for c, n in zip(layout.chunk_shape, per)],
                    "chunks_per_inner_shard": list(per), "crc32c_after": fmt.crc32c,
                    "index": _index(outermost(fmt.inner))})
        fmt = fmt.inner
    return out


def _inner_shards(layout: ArrayLayout, read: Read, size: int, shard: tuple[int, ...],
                  problems: dict[int, str]) -> list[dict[str, Any]]:
    """One row per entry of a shard's index over its (first-level) inner shards."""
    fmt = layout.index
    table = read_table(fmt.outer, read, 0, size)
    rows = []
    for pos in range(len(table)):
        empty = table[pos, 0] == EMPTY
        row: dict[str, Any] = {"pos": pos, "inner_shard": layout.names.key(layout.inner_shard_at(shard, pos)),
                               "offset": None if empty else int(table[pos, 0]),
                               "nbytes": None if empty else int(table[pos, 1]), "empty": bool(empty)}
        if not empty:
            row["index_status"] = f"corrupt: {problems[pos]}" if pos in problems else _status(outermost(fmt.inner))
        rows.append(row)
    return rows


def _unused(fmt: ShardFormat, read: Read, base: int, size: int) -> int:
    """Bytes of a (possibly nested) shard that no index entry or index covers."""
    index = outermost(fmt)
    try:
        table = read_table(index, read, base, size)
    except CorruptIndex:
        return 0
    stored = table[table[:, 0] != EMPTY]
    unused = size - index.nbytes - int(stored[:, 1].sum())
    if isinstance(fmt, NestedFormat):
        trailer = 4 if fmt.crc32c else 0
        unused += sum(_unused(fmt.inner, read, int(o), int(n) - trailer) for o, n in stored if n >= trailer)
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
                where = ("empty", "") if row["empty"] else (row["offset"], row["nbytes"])
                lines.append(f"{row['pos']:>6} {row['chunk'] or '(past edge)':>14} {where[0]:>12} {where[1]:>10}")
    return "\n".join(lines)
